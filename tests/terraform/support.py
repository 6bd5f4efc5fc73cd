"""What the GCP and Azure module tests (tests/terraform/test_terraform_gcp.py,
tests/terraform/test_terraform_azure.py) share: the provider's contract (its IAM list, its CLI
options), the `terraform` runs (fmt, the variables' validations, an output's expression,
the module's own `terraform test`) and small lookups. The parsing helpers and the URL
cases stay in tests/terraform/test_terraform.py, beside the AWS module's checks that use them.
"""

from __future__ import annotations

import argparse
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

from tests.terraform.test_terraform import (
    AWS_REQUIRED,
    PLUGIN_DIR,
    REPO,
    TERRAFORM,
    Module,
    _terraform_cli_available,
)

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


def cli_takes(cloud: str, option: str) -> bool:
    """Whether `spotring run` (with ``cloud``'s options) takes ``option``."""
    cli = importlib.import_module("spotring.autoscaler.cli")
    pm, _ = _registry()
    parser = cli.build_parser(pm, provider_class(cloud))
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return option in action.choices["run"]._option_string_actions
    return option in parser._option_string_actions


def parse_run_with_checkpoint(cloud: str, argv: list[str]) -> Any:
    """parse_run for a command that passes --checkpoint URI. Until the CLI takes that
    option (it comes with the storage layer, issue #24), the rest of it is parsed."""
    if "--checkpoint" in argv and not cli_takes(cloud, "--checkpoint"):
        at = argv.index("--checkpoint")
        argv = argv[:at] + argv[at + 2 :]
    return parse_run(cloud, argv)


def spotring_argv(module: Module) -> list[str]:
    """The ``spotring_command`` output with every interpolation "2" (a valid name, region,
    project, subscription and count), without checkpoint_uri (its --checkpoint option)."""
    command = module.outputs["spotring_command"]["value"]
    assert CHECKPOINT_OPTION in command, "spotring_command does not pass checkpoint_uri"
    command = command.replace(CHECKPOINT_OPTION, "")
    return shlex.split(re.sub(r"\$\{[^}]*\}", "2", command))


# How every module appends `--checkpoint URI` to spotring_command (empty without one).
CHECKPOINT_OPTION = "${local.checkpoint_option}"


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
    shutil.copytree(TERRAFORM / "modules", tmp_path / "terraform" / "modules")
    shutil.copytree(REPO / "worker_image", tmp_path / "worker_image")
    workdir = tmp_path / "terraform" / directory.name
    for args in (
        ("init", "-backend=false", "-input=false", f"-plugin-dir={PLUGIN_DIR}"),
        ("test",),
    ):
        done = terraform(workdir, *args)
        assert done.returncode == 0, f"terraform {args[0]}:\n{done.stdout}\n{done.stderr}"
    assert "0 failed" in done.stdout, done.stdout


# ------------------------------------------------------------------ expressions, evaluated
# Locals and module calls contain no resource: Terraform evaluates them without a
# provider, from a copy of the module's variables.tf and the expressions as parsed.

DRIVER_JOB = TERRAFORM / "modules" / "driver-job"


def hcl_expression(value: Any) -> str:
    """``value`` as python-hcl2 parsed it, written back as an HCL expression."""
    if isinstance(value, list):
        return "[" + ", ".join(hcl_expression(item) for item in value) + "]"
    if isinstance(value, dict):
        return (
            "{"
            + ", ".join(f"{json.dumps(k)} = {hcl_expression(v)}" for k, v in value.items())
            + "}"
        )
    if not isinstance(value, str):
        return json.dumps(value)
    if value.startswith("<<"):  # a heredoc, as written (the caller ends its line)
        return value
    if value.startswith("${") and _closing_brace(value, 1) == len(value) - 1:
        # One interpolation: the expression as written (quoting it would escape the
        # quotes of its own string literals).
        return value[2:-1]
    return json.dumps(value)  # a template; quotes outside interpolations only


def _closing_brace(text: str, start: int) -> int:
    depth, quote, i = 0, False, start
    while i < len(text):
        char = text[i]
        if quote:
            if char == "\\":
                i += 1
            elif char == '"':
                quote = False
        elif char == '"':
            quote = True
        elif char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def _local_closure(module: Module, texts: list[str]) -> list[str]:
    wanted: list[str] = []
    pending = list(texts)
    while pending:
        for name in re.findall(r"\blocal\.([A-Za-z_][\w-]*)", pending.pop()):
            if name not in wanted:
                assert name in module.locals, f"no local {name} in {module.directory.name}"
                wanted.append(name)
                pending.append(json.dumps(module.locals[name]))
    return wanted


def evaluate(
    module: Module,
    workdir: Path,
    inputs: dict[str, Any],
    outputs: dict[str, str],
    *,
    module_call: str | None = None,
    replace: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The values of ``outputs`` (name: HCL expression) in a configuration of the
    module's variables.tf, the locals they need (as parsed, after ``replace`` of the
    references to resources and data sources), and the module call ``module_call``
    (pointed at its source's absolute path), applied with ``inputs``."""
    replace = replace or {}

    def fix(expression: str) -> str:
        for old, new in replace.items():
            expression = expression.replace(old, new)
        return expression

    texts = [fix(expression) for expression in outputs.values()]
    call = ""
    if module_call is not None:
        body = module.modules[module_call]
        source = (module.directory / body["source"]).resolve()
        lines = [f"  source = {json.dumps(str(source))}"]
        for key, value in body.items():
            if key != "source":
                lines.append(f"  {key} = {fix(hcl_expression(value))}")
        call = f'module "{module_call}" {{\n' + "\n".join(lines) + "\n}\n"
        texts.append(call)
    names = _local_closure(module, texts)
    main_tf = "locals {\n"
    for name in names:
        main_tf += f"  {name} = {fix(hcl_expression(module.locals[name]))}\n"
    main_tf += "}\n" + call
    for name, expression in outputs.items():
        main_tf += f'output "{name}" {{\n  value = {fix(expression)}\n}}\n'
    workdir.mkdir(parents=True, exist_ok=True)
    shutil.copy(module.directory / "variables.tf", workdir / "variables.tf")
    (workdir / "main.tf").write_text(main_tf, encoding="utf-8")
    (workdir / "terraform.tfvars.json").write_text(json.dumps(inputs), encoding="utf-8")
    for args in (
        ("init", "-input=false", "-backend=false"),
        ("apply", "-auto-approve", "-input=false"),
    ):
        done = terraform(workdir, *args)
        assert done.returncode == 0, main_tf + done.stdout + done.stderr
    done = terraform(workdir, "output", "-json")
    assert done.returncode == 0, done.stderr
    return {name: body["value"] for name, body in json.loads(done.stdout).items()}


# ------------------------------------------------------------------ systemd units


def unit_settings(unit: str) -> dict[str, list[str]]:
    """``Section.Key`` -> its values, in order, of a unit file's text."""
    settings: dict[str, list[str]] = {}
    section = ""
    for line in unit.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, _, value = line.partition("=")
        settings.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return settings


_C_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v",
              "\\": "\\", '"': '"', "'": "'", "s": " "}  # fmt: skip


def systemd_command_line(line: str) -> list[str]:
    """The argv systemd runs for an ExecStart= value (systemd.service(5), "Command
    lines"): words split on whitespace, double or single quotes, C-style backslash escapes,
    then "%%" for a percent sign (any other specifier refused) and "$$" for a dollar sign
    (any variable substitution refused: the units set none)."""
    words: list[str] = []
    word: list[str] | None = None
    quote = ""
    i = 0
    while i < len(line):
        char = line[i]
        if char == "\\":
            escaped = line[i + 1]
            assert escaped in _C_ESCAPES, f"escape \\{escaped} in {line!r}"
            word = (word or []) + [_C_ESCAPES[escaped]]
            i += 2
            continue
        if quote:
            if char == quote:
                quote = ""
            else:
                word.append(char)  # type: ignore[union-attr]
        elif char in "\"'":
            quote = char
            word = word or []
        elif char.isspace():
            if word is not None:
                words.append("".join(word))
                word = None
        else:
            assert not (char == ";" and word is None and line[i + 1 : i + 2].strip() == ""), (
                f"an unquoted ; separates commands: {line!r}"
            )
            word = (word or []) + [char]
        i += 1
    assert not quote, f"unbalanced quoting: {line!r}"
    if word is not None:
        words.append("".join(word))
    resolved = []
    for word in words:
        assert not re.search(r"%[^%]", word.replace("%%", "")), f"a specifier in {word!r}"
        word = word.replace("%%", "%")
        assert not re.search(r"\$[^$]", word.replace("$$", "")), f"a substitution in {word!r}"
        resolved.append(word.replace("$$", "$"))
    return resolved


# ------------------------------------------------------------------ the job under systemd

CHECKPOINT_URIS = {
    "aws": "s3://ckpt-bucket/runs/spot-train",
    "gcp": "gs://ckpt-bucket/runs/spot-train",
    "azure": "https://ckptaccount.blob.core.windows.net/checkpoints/runs/spot-train",
}


# Inputs each module takes as they are (every validation passes): the base of its plans.
VALID_INPUTS: dict[str, dict[str, Any]] = {
    "aws": AWS_REQUIRED,
    "gcp": {
        "project": "my-project",
        "region": "us-central1",
        "name": "spot-train",
        "worker_count": 2,
        "max_worker_count": 4,
        "admin_cidrs": ["35.235.240.0/20"],
        "ssh_public_keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample driver@spotring"],
        "spotring_package": "spotring[gcp] @ https://example.com/spotring-0.1.0-py3-none-any.whl"
        "#sha256=" + "b" * 64,
    },
    "azure": {
        "subscription_id": "00000000-0000-0000-0000-000000000000",
        "location": "eastus",
        "name": "spot-train",
        "worker_count": 2,
        "max_worker_count": 4,
        "admin_cidrs": ["203.0.113.7/32"],
        "ssh_public_keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample driver@spotring"],
        "spotring_package": "spotring[azure] @ https://example.com/spotring-0.1.0-py3-none-any.whl"
        "#sha256=" + "b" * 64,
    },
}


def assert_unit_runs_spotring_command(
    module: Module, workdir: Path, inputs: dict[str, Any], replace: dict[str, str]
) -> None:
    """The driver's unit runs what spotring_command says (--checkpoint included), with
    job_command after `--`: both evaluated by Terraform from the module's expressions
    (``replace`` names the resources they refer to by the variables they are made of)."""
    cloud = module.directory.name
    inputs = {
        **inputs,
        "checkpoint_uri": CHECKPOINT_URIS[cloud],
        "job_command": ["python", "/opt/train/train.py", "--epochs", "90"],
        "train_command": "python /opt/train/train.py --epochs 90",
    }
    values = evaluate(
        module,
        workdir,
        inputs,
        {
            "command": hcl_expression(module.outputs["spotring_command"]["value"]),
            "argv": "module.driver_job.argv",
        },
        module_call="driver_job",
        replace=replace,
    )
    command = shlex.split(values["command"])
    assert f"--checkpoint {CHECKPOINT_URIS[cloud]} --" in values["command"]
    assert values["argv"] == ["/opt/spotring/venv/bin/spotring", *command[1:]], values
    options = parse_run_with_checkpoint(cloud, command[1:])
    assert options.command == "run" and options.provider == cloud
