"""``spotring check``: one line per item, credentials found but never printed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SPOTRING = str(Path(sys.executable).with_name("spotring"))


def run_check(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return subprocess.run(
        [SPOTRING, "check", *args],
        env={**base, "AWS_EC2_METADATA_DISABLED": "true", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def lines(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    return {line[:24].strip(): line[25:] for line in result.stdout.splitlines()}


def test_reports_the_build_and_finds_credentials_without_printing_them(tmp_path: Path) -> None:
    result = run_check(
        AWS_ACCESS_KEY_ID="AKIAEXAMPLEKEY",
        AWS_SECRET_ACCESS_KEY="sekrit-never-shown",
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    found = lines(result)
    assert found["torch"].startswith("ok")
    assert found["horovod"].startswith("ok") and "Gloo" in found["horovod"]
    assert found["horovod internals"].startswith("ok")
    assert found["provider aws"].startswith("ok")
    assert found["aws credentials"].split() == ["ok", "found", "(env)"]
    assert "sekrit-never-shown" not in result.stdout + result.stderr
    assert "AKIAEXAMPLEKEY" not in result.stdout + result.stderr


def test_a_provider_without_credentials_fails_only_when_asked_for(tmp_path: Path) -> None:
    isolated = {
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
    }
    general = run_check(**isolated)
    assert general.returncode == 0
    assert lines(general)["aws credentials"].startswith("missing not found")
    strict = run_check("--provider", "aws", **isolated)
    assert strict.returncode == 1
    assert lines(strict)["aws credentials"].startswith("FAILED  not found")
    assert "provider local" not in strict.stdout
