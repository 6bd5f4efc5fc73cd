"""What the GCP and Azure module tests (tests/test_terraform_gcp.py,
tests/test_terraform_azure.py) share: the provider's contract (its IAM list, its CLI
options), the `terraform` runs (fmt, the variables' validations, an output's expression,
the module's own `terraform test`) and small lookups. The parsing helpers and the URL
cases stay in tests/test_terraform.py, beside the AWS module's checks that use them.
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.test_terraform import PLUGIN_DIR, REPO, Module, _terraform_cli_available

needs_terraform = pytest.mark.skipif(
    shutil.which("terraform") is None, reason="no terraform binary on PATH"
)
TF_ENV = {**os.environ, "TF_IN_AUTOMATION": "1", "CHECKPOINT_DISABLE": "1"}


def terraform(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["terraform", *args, "-no-color"],
        cwd=workdir,
        env=TF_ENV,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def only(module: Module, rtype: str) -> list[tuple[str, dict]]:
    """(name, body) of every resource of type ``rtype``."""
    return [(name, body) for (kind, name), body in module.resources.items() if kind == rtype]


# ------------------------------------------------------------------ the provider's contract


def provider_module(cloud: str) -> Any:
    """``spotring.providers.<cloud>``."""
    return importlib.import_module(f"spotring.providers.{cloud}")


def provider_iam(cloud: str, attribute: str) -> tuple[frozenset[str], str]:
    """The provider module's IAM list (``IAM_PERMISSIONS``, ``IAM_ACTIONS``) and where it
    comes from; the driver's roles in the module are checked against it."""
    values = getattr(provider_module(cloud), attribute, None)
    if values is None:
        pytest.fail(
            f"spotring.providers.{cloud} exports no {attribute}; the driver's roles in "
            f"terraform/{cloud} are checked against it"
        )
    assert isinstance(values, tuple) and all(isinstance(v, str) for v in values)
    return frozenset(values), f"spotring.providers.{cloud}.{attribute}"


def _registry() -> tuple[Any, Any]:
    plugins = importlib.import_module("spotring.autoscaler.plugins")
    pm = plugins.get_plugin_manager(load_entry_points=False)
    return pm, plugins.provider_registry(pm)


def provider_class(cloud: str) -> Any:
    """The provider registered as ``cloud`` (a test fails when none is)."""
    _, registry = _registry()
    assert cloud in registry, f"no provider named {cloud!r} is registered"
    return registry.get(cloud)


def parse_run(cloud: str, argv: list[str]) -> Any:
    """``argv`` (``run ... -- command``) parsed by the CLI with ``cloud``'s options."""
    cli = importlib.import_module("spotring.autoscaler.cli")
    pm, _ = _registry()
    parser = cli.build_parser(pm, provider_class(cloud))
    dashes = argv.index("--")
    try:
        return parser.parse_args(argv[:dashes])
    except (SystemExit, Exception) as error:  # the CLI's parser raises UsageError
        pytest.fail(f"spotring_command does not parse: {shlex.join(argv)}: {error}")


def spotring_argv(module: Module) -> list[str]:
    """The ``spotring_command`` output with every interpolation "2" (a valid name, region,
    project, subscription and count)."""
    command = module.outputs["spotring_command"]["value"]
    return shlex.split(re.sub(r"\$\{[^}]*\}", "2", command))


def assert_software_versions_match_the_setup_script(module: Module) -> None:
    setup = (REPO / "scripts" / "setup.sh").read_text(encoding="utf-8")
    for variable in ("torch_version", "horovod_version"):
        pinned = re.search(rf"^{variable}=(\S+)$", setup, re.MULTILINE)
        assert pinned, f"scripts/setup.sh sets no {variable}"
        assert module.variables[variable]["default"] == pinned.group(1), variable


# ------------------------------------------------------------------ terraform itself


def assert_formatted(directory: Path) -> None:
    done = subprocess.run(
        ["terraform", "fmt", "-check", "-recursive", "-diff", str(directory)],
        env=TF_ENV,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, f"terraform fmt would change:\n{done.stdout}"


def variables_only_copy(tmp_path_factory: pytest.TempPathFactory, directory: Path) -> Path:
    """A copy of ``directory``'s variables.tf alone: `terraform plan` there checks the
    validations (skips without a terraform binary)."""
    if shutil.which("terraform") is None:
        pytest.skip("no terraform binary on PATH")
    workdir = tmp_path_factory.mktemp(f"{directory.name}-variables")
    shutil.copy(directory / "variables.tf", workdir / "variables.tf")
    done = terraform(workdir, "init", "-input=false", "-backend=false")
    assert done.returncode == 0, done.stdout + done.stderr
    return workdir


def plan_variables(workdir: Path, inputs: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    (workdir / "inputs.tfvars.json").write_text(json.dumps(inputs), encoding="utf-8")
    return terraform(workdir, "plan", "-input=false", "-var-file=inputs.tfvars.json")


def evaluate_output(
    directory: Path, workdir: Path, main_tf: str, inputs: dict[str, Any], output: str
) -> str:
    """``output`` of a configuration of ``directory``'s variables.tf and ``main_tf``
    (applied with ``inputs``; no provider needed)."""
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copy(directory / "variables.tf", workdir / "variables.tf")
    (workdir / "main.tf").write_text(main_tf, encoding="utf-8")
    (workdir / "terraform.tfvars.json").write_text(json.dumps(inputs), encoding="utf-8")
    for args in (
        ("init", "-input=false", "-backend=false"),
        ("apply", "-auto-approve", "-input=false"),
    ):
        done = terraform(workdir, *args)
        assert done.returncode == 0, done.stdout + done.stderr
    done = terraform(workdir, "output", "-raw", output)
    assert done.returncode == 0, done.stderr
    return done.stdout


def run_module_tests(directory: Path, provider: str, tmp_path: Path) -> None:
    """`terraform test` of the module in ``directory`` (its tests/*.tftest.hcl, with the
    ``hashicorp/<provider>`` provider mocked from the local mirror); skips where the
    binary, SPOTRING_TERRAFORM_TESTS=1 or the provider is missing."""
    reason = _terraform_cli_available()
    if reason:
        pytest.skip(reason)
    if not (PLUGIN_DIR / "registry.terraform.io" / "hashicorp" / provider).is_dir():
        pytest.skip(f"no hashicorp/{provider} provider in the mirror at {PLUGIN_DIR}")
    shutil.copytree(directory, tmp_path / "terraform" / directory.name)
    shutil.copytree(REPO / "worker_image", tmp_path / "worker_image")
    workdir = tmp_path / "terraform" / directory.name
    for args in (
        ("init", "-backend=false", "-input=false", f"-plugin-dir={PLUGIN_DIR}"),
        ("test",),
    ):
        done = terraform(workdir, *args)
        assert done.returncode == 0, f"terraform {args[0]}:\n{done.stdout}\n{done.stderr}"
    assert "0 failed" in done.stdout, done.stdout
