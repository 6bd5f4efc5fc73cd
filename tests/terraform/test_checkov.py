"""checkov (static security analysis) on every Terraform module under terraform/.

A module passes when checkov reports no failed check and no parsing error, and every
check it skips was skipped next to the code with a reason
(``#checkov:skip=CKV_...:why``) rather than by a configuration file or without one.

checkov pins older boto3/botocore than the project's dev tools, so it is not a dev
extra: scripts/setup.sh installs it into its own venv at .venv/tools/checkov. These
tests use that one, else ``$SPOTRING_CHECKOV``, else a ``checkov`` on PATH, and skip
when there is none. ``--skip-download`` keeps checkov off the network.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
TERRAFORM = REPO / "terraform"
TOOL_VENV_CHECKOV = REPO / ".venv" / "tools" / "checkov" / "bin" / "checkov"
MODULES = sorted(
    {p.parent for p in TERRAFORM.rglob("*.tf") if ".terraform" not in p.parts},
)
# Child modules the root modules call (terraform/modules/*): checkov has nothing to say
# of those that declare no resource (it reports no terraform check type at all then).
CHILD_MODULES = [m for m in MODULES if m.parent == TERRAFORM / "modules"]
MODULES = [m for m in MODULES if m not in CHILD_MODULES]
NO_REASON = "No comment provided"  # what checkov records for a skip without a reason


def _checkov() -> tuple[str | None, str]:
    """The checkov to run, or None and why there is none."""
    explicit = os.environ.get("SPOTRING_CHECKOV")
    if explicit:
        found = shutil.which(explicit)
        return found, f"SPOTRING_CHECKOV={explicit} is not an executable"
    if TOOL_VENV_CHECKOV.is_file() and os.access(TOOL_VENV_CHECKOV, os.X_OK):
        return str(TOOL_VENV_CHECKOV), ""
    return shutil.which("checkov"), (
        "checkov is not installed (scripts/setup.sh puts it in .venv/tools/checkov; "
        "or set SPOTRING_CHECKOV)"
    )


CHECKOV, WHY_NOT = _checkov()


def _scan(module: Path) -> dict[str, Any]:
    assert CHECKOV is not None
    done = subprocess.run(
        [
            CHECKOV,
            "-d",
            str(module.relative_to(REPO)),
            "--framework",
            "terraform",
            "--skip-download",
            "--compact",
            "-o",
            "json",
        ],
        cwd=REPO,
        env={**os.environ, "LOG_LEVEL": "WARNING"},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    # checkov exits 1 when a check fails; the report says which.
    assert done.returncode in (0, 1), f"checkov failed to run:\n{done.stderr[-4000:]}"
    report = json.loads(done.stdout)
    reports = report if isinstance(report, list) else [report]
    (terraform,) = [r for r in reports if r.get("check_type") == "terraform"]
    return terraform


def test_every_module_is_scanned() -> None:
    assert {m.name for m in MODULES} >= {"aws", "gcp", "azure"}, MODULES


@pytest.mark.parametrize("module", CHILD_MODULES, ids=lambda p: str(p.relative_to(TERRAFORM)))
def test_child_modules_hold_nothing_to_scan(module: Path) -> None:
    """A child module left out of the scans must declare no resource or data source."""
    for path in module.glob("*.tf"):
        text = path.read_text(encoding="utf-8")
        assert not re.search(r'^\s*(resource|data)\s+"', text, re.MULTILINE), (
            f"{path.relative_to(REPO)} declares resources: scan it with checkov"
        )


def test_no_configuration_file_skips_checks() -> None:
    """Skips belong next to the code they excuse, with the reason."""
    for directory in (REPO, *MODULES):
        for name in (".checkov.yaml", ".checkov.yml"):
            config = directory / name
            if config.is_file():
                text = config.read_text(encoding="utf-8")
                assert "skip-check" not in text and "skip_check" not in text, config


@pytest.mark.skipif(CHECKOV is None, reason=WHY_NOT)
@pytest.mark.parametrize("module", MODULES, ids=lambda p: str(p.relative_to(TERRAFORM)))
def test_checkov_finds_nothing_unexplained(module: Path) -> None:
    report = _scan(module)
    summary = report["summary"]
    results = report["results"]
    assert summary["resource_count"] > 0, f"checkov saw no resources in {module}"
    assert summary["parsing_errors"] == 0, results.get("parsing_errors")

    failed = [
        f"{c['check_id']} {c['resource']} ({c['file_path']}:{c['file_line_range'][0]}): "
        f"{c['check_name']}"
        for c in results.get("failed_checks", [])
    ]
    assert not failed, (
        "checkov findings: fix them, or skip each next to the code with "
        "#checkov:skip=ID:reason\n  " + "\n  ".join(failed)
    )

    readme = module / "README.md"
    documented = readme.read_text(encoding="utf-8") if readme.is_file() else ""
    for check in results.get("skipped_checks", []):
        reason = (check.get("check_result") or {}).get("suppress_comment") or ""
        assert reason.strip() and reason != NO_REASON, (
            f"{check['check_id']} on {check['resource']} is skipped without a reason"
        )
        # The module's README lists its skips with their reasons, for the reader who
        # never runs checkov.
        assert check["check_id"] in documented, (
            f"{check['check_id']} on {check['resource']} is skipped but not listed in "
            f"{readme.relative_to(REPO)}"
        )
