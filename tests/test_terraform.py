"""Static checks of the Terraform modules under terraform/, parsed with python-hcl2.

There is no cloud to apply them against, so these tests check what a typo or a drifting
contract would break: references to undeclared variables/locals/resources, the IAM
policy against the calls spotring's AWS provider makes, the spot settings of the group,
the bootstrap template's variables, and the `spotring_command` output against the CLI.

python-hcl2's output shape differs between releases (8.x keeps the quotes of string
literals and block labels and adds ``__is_block__``/``__comments__`` keys; older releases
strip quotes). ``_clean`` normalizes both to plain values: string literals unquoted,
expressions as ``${...}``.

When the `terraform` binary and a local provider mirror are present, and
SPOTRING_TERRAFORM_TESTS=1, ``test_terraform_cli`` also runs `terraform validate` and the
module's own `terraform test` (mocked AWS provider, no API calls); that takes 20 s or
more, so it is opt-in.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

hcl2 = pytest.importorskip("hcl2", reason="python-hcl2 is not installed (pip install python-hcl2)")

REPO = Path(__file__).resolve().parents[1]
TERRAFORM = REPO / "terraform"
AWS = TERRAFORM / "aws"

# What spotring's AWS provider calls, until providers/aws.py exports IAM_ACTIONS.
ASSUMED_IAM_ACTIONS = frozenset(
    {
        "autoscaling:DescribeAutoScalingGroups",
        "autoscaling:SetDesiredCapacity",
        "autoscaling:SetInstanceHealth",
        "autoscaling:DetachInstances",
        "autoscaling:TerminateInstanceInAutoScalingGroup",
        "ec2:DescribeInstances",
        "ec2:DescribeInstanceTypes",
    }
)

_META_KEYS = {
    "__is_block__",
    "__comments__",
    "__inline_comments__",
    "__start_line__",
    "__end_line__",
}
_IDENT = r"[A-Za-z_][A-Za-z0-9_-]*"


# ------------------------------------------------------------------ parsing


def _unquote(text: str) -> str:
    if len(text) >= 2 and text[0] == '"' and text[-1] == '"':
        try:
            return json.loads(text)
        except ValueError:
            return text[1:-1]
    return text


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        return {_unquote(k): _clean(v) for k, v in value.items() if k not in _META_KEYS}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    if isinstance(value, str):
        return _unquote(value)
    return value


def _tf_files(directory: Path = TERRAFORM) -> list[Path]:
    return sorted(p for p in directory.rglob("*.tf") if ".terraform" not in p.parts)


@functools.cache
def _parse(path: Path) -> dict[str, Any]:
    with path.open(encoding="utf-8") as handle:
        return _clean(hcl2.load(handle))


class Module:
    """The blocks of one Terraform module directory, keyed by name."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.variables: dict[str, dict] = {}
        self.outputs: dict[str, dict] = {}
        self.locals: dict[str, Any] = {}
        self.resources: dict[tuple[str, str], dict] = {}
        self.data: dict[tuple[str, str], dict] = {}
        self.providers: list[dict[str, Any]] = []  # provider blocks, bodies included
        self.required_providers: set[str] = set()
        for path in sorted(directory.glob("*.tf")):
            doc = _parse(path)
            for entry in doc.get("variable", []):
                self.variables.update(entry)
            for entry in doc.get("output", []):
                self.outputs.update(entry)
            for entry in doc.get("locals", []):
                self.locals.update(entry)
            for kind, target in (("resource", self.resources), ("data", self.data)):
                for entry in doc.get(kind, []):
                    for rtype, named in entry.items():
                        for rname, body in named.items():
                            target[(rtype, rname)] = body
            for entry in doc.get("provider", []):
                self.providers.append(entry)
            for block in doc.get("terraform", []):
                for req in block.get("required_providers", []):
                    self.required_providers.update(req)

    def resource(self, rtype: str, name: str) -> dict:
        assert (rtype, name) in self.resources, f"{self.directory.name}: no {rtype}.{name}"
        return self.resources[(rtype, name)]


@pytest.fixture(scope="module")
def aws() -> Module:
    return Module(AWS)


def _strings(value: Any, skip_keys: frozenset[str] = frozenset()) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            if key not in skip_keys:
                yield key
                yield from _strings(item, skip_keys)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item, skip_keys)
    elif isinstance(value, str):
        yield value


def _module_strings(module: Module, *, validations: bool = True) -> list[str]:
    """Every string of the module except descriptions (prose may name anything)."""
    skip = frozenset({"description"})
    blocks: list[Any] = [
        module.outputs,
        module.locals,
        list(module.resources.values()),
        list(module.data.values()),
        module.providers,
    ]
    if validations:  # a variable's validation refers to the variable; that is no use of it
        blocks.extend(body.get("validation", []) for body in module.variables.values())
    return [s for block in blocks for s in _strings(block, skip)]


def _refs(pattern: str, strings: list[str]) -> set[str]:
    return {m.group(1) for s in strings for m in re.finditer(pattern, s)}


def _function_args(expression: str, function: str) -> list[list[str]]:
    """The top-level arguments of every call of ``function`` in ``expression``."""
    calls = []
    for match in re.finditer(rf"\b{function}\(", expression):
        args, depth, start, quote = [], 0, match.end(), False
        i = start
        while i < len(expression):
            char = expression[i]
            if quote:
                if char == "\\":
                    i += 1
                elif char == '"':
                    quote = False
            elif char == '"':
                quote = True
            elif char in "([{":
                depth += 1
            elif char in ")]}":
                if depth == 0:
                    args.append(expression[start:i].strip())
                    break
                depth -= 1
            elif char == "," and depth == 0:
                args.append(expression[start:i].strip())
                start = i + 1
            i += 1
        calls.append(args)
    return calls


def _object_keys(literal: str) -> set[str]:
    """Keys of an HCL object literal ``{a = 1, b = "x"}`` (also ``{"a": 1}``)."""
    literal = literal.strip()
    assert literal.startswith("{") and literal.endswith("}"), literal
    parts, current, depth, quote, escaped = [], [], 0, False, False
    for char in literal[1:-1]:
        if quote:
            quote = escaped or char != '"'
            escaped = not escaped and char == "\\"
        elif char == '"':
            quote = True
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            depth -= 1
        elif char in ",\n" and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        current.append(char)
    parts.append("".join(current))
    key = re.compile(r'\s*("(?:[^"\\]|\\.)*"|[A-Za-z_][\w-]*)\s*[=:]')
    keys = set()
    for part in filter(str.strip, parts):
        match = key.match(part)
        assert match, f"cannot read the key of {part!r} in {literal}"
        keys.add(_unquote(match.group(1)))
    return keys


def _template_variables(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8").replace("$${", "").replace("%%{", "")
    assert "%{" not in text, (
        f"{path.name}: template directives (%{{...}}) are not supported by these tests "
        "or by the renderer in test_worker_image.py; pass computed strings instead"
    )
    names = set()
    for match in re.finditer(r"\$\{([^}]*)\}", text):
        inner = match.group(1).strip()
        assert re.fullmatch(r"[A-Za-z_]\w*", inner), (
            f"{path.name}: only plain ${{name}} placeholders are supported, found ${{{inner}}}"
        )
        names.add(inner)
    return names


# ------------------------------------------------------------------ every module


@pytest.mark.parametrize("path", _tf_files(), ids=lambda p: str(p.relative_to(TERRAFORM)))
def test_every_tf_file_parses(path: Path) -> None:
    doc = _parse(path)
    assert doc, f"{path} parsed to nothing"


def test_modules_exist() -> None:
    assert _tf_files(AWS), "terraform/aws has no .tf files"


@pytest.mark.parametrize(
    "directory",
    sorted({p.parent for p in _tf_files()}),
    ids=lambda p: str(p.relative_to(TERRAFORM)),
)
def test_references_resolve(directory: Path) -> None:
    module = Module(directory)
    strings = _module_strings(module)

    referenced = _refs(rf"\bvar\.({_IDENT})", strings)
    used = _refs(rf"\bvar\.({_IDENT})", _module_strings(module, validations=False))
    declared = set(module.variables)
    assert not referenced - declared, f"undeclared variables: {sorted(referenced - declared)}"
    assert not declared - used, f"variables never used: {sorted(declared - used)}"

    used_locals = _refs(rf"\blocal\.({_IDENT})", strings)
    assert not used_locals - set(module.locals), (
        f"undefined locals: {sorted(used_locals - set(module.locals))}"
    )
    assert not set(module.locals) - used_locals, (
        f"locals never used: {sorted(set(module.locals) - used_locals)}"
    )

    used_data = {
        (m.group(1), m.group(2))
        for s in strings
        for m in re.finditer(rf"\bdata\.({_IDENT})\.({_IDENT})", s)
    }
    assert not used_data - set(module.data), (
        f"undefined data sources: {used_data - set(module.data)}"
    )

    prefixes = "|".join(sorted(module.required_providers)) or "aws"
    used_resources = {
        (m.group(1), m.group(2))
        for s in strings
        for m in re.finditer(rf"(?<![\w.])((?:{prefixes})_\w+)\.({_IDENT})", s)
    }
    assert not used_resources - set(module.resources), (
        f"undefined resources: {sorted(used_resources - set(module.resources))}"
    )


@pytest.mark.parametrize(
    "directory",
    sorted({p.parent for p in _tf_files()}),
    ids=lambda p: str(p.relative_to(TERRAFORM)),
)
def test_variables_and_outputs_are_documented(directory: Path) -> None:
    module = Module(directory)
    for name, body in module.variables.items():
        assert body.get("description"), f"variable {name} has no description"
        assert body.get("type"), f"variable {name} has no type"
    for name, body in module.outputs.items():
        assert body.get("description"), f"output {name} has no description"


# ------------------------------------------------------------------ the AWS module


def test_aws_outputs(aws: Module) -> None:
    wanted = {"group_name", "region", "driver_public_ip", "driver_private_ip", "spotring_command"}
    assert wanted <= set(aws.outputs), f"missing outputs: {wanted - set(aws.outputs)}"
    assert aws.outputs["group_name"]["value"] == "${aws_autoscaling_group.workers.name}"
    assert aws.outputs["region"]["value"] == "${var.region}"
    assert aws.outputs["driver_public_ip"]["value"] == "${aws_instance.driver.public_ip}"
    assert aws.outputs["driver_private_ip"]["value"] == "${aws_instance.driver.private_ip}"
    for name, body in aws.outputs.items():
        for rtype, rname in re.findall(rf"(?<![\w.])(aws_\w+)\.({_IDENT})", str(body["value"])):
            assert (rtype, rname) in aws.resources, f"output {name} references {rtype}.{rname}"


def _expected_iam_actions() -> tuple[frozenset[str], str]:
    if importlib.util.find_spec("spotring.providers.aws") is None:
        return ASSUMED_IAM_ACTIONS, "assumed list (providers/aws.py does not exist yet)"
    module = importlib.import_module("spotring.providers.aws")
    actions = getattr(module, "IAM_ACTIONS", None)
    if actions is None:
        pytest.fail(
            "spotring.providers.aws exists but exports no IAM_ACTIONS; the driver's IAM "
            "policy in terraform/aws/driver.tf is checked against it"
        )
    return frozenset(actions), "spotring.providers.aws.IAM_ACTIONS"


def _statements(aws: Module, name: str) -> list[dict]:
    return aws.data[("aws_iam_policy_document", name)]["statement"]


def test_driver_policy_grants_exactly_the_provider_calls(aws: Module) -> None:
    expected, source = _expected_iam_actions()
    statements = _statements(aws, "driver")
    granted = {action for st in statements for action in st["actions"]}
    assert all(st.get("effect", "Allow") == "Allow" for st in statements)
    assert granted == expected, (
        f"driver IAM policy vs {source}: missing {sorted(expected - granted)}, "
        f"extra {sorted(granted - expected)}"
    )
    for action in granted:
        assert re.fullmatch(r"[a-z0-9-]+:[A-Za-z]+", action), f"malformed IAM action {action!r}"


def test_driver_policy_scopes_mutations_to_the_group(aws: Module) -> None:
    statements = _statements(aws, "driver")
    if importlib.util.find_spec("spotring.providers.aws") is not None:
        steering = getattr(
            importlib.import_module("spotring.providers.aws"), "IAM_STEERING_ACTIONS", None
        )
        if steering is not None:
            scoped = {a for st in statements if st["resources"] != ["*"] for a in st["actions"]}
            assert scoped == set(steering), (
                f"actions scoped to the group {sorted(scoped)} != "
                f"spotring.providers.aws.IAM_STEERING_ACTIONS {sorted(steering)}"
            )
    for st in statements:
        if st["resources"] == ["*"]:
            # Describe/List/Get calls support no resource-level permissions.
            mutating = [a for a in st["actions"] if not re.match(r"\w+:(Describe|List|Get)", a)]
            assert not mutating, f"{mutating} granted on '*'; scope them to the group"
        else:
            assert st["resources"] == ["${aws_autoscaling_group.workers.arn}"], st
            assert all(a.startswith("autoscaling:") for a in st["actions"]), st


def test_driver_policy_is_the_only_one_on_the_driver_role(aws: Module) -> None:
    driver = aws.resource("aws_instance", "driver")
    profile_ref = re.fullmatch(
        r"\$\{aws_iam_instance_profile\.(\w+)\.name\}", driver["iam_instance_profile"]
    )
    assert profile_ref, driver["iam_instance_profile"]
    profile = aws.resource("aws_iam_instance_profile", profile_ref.group(1))
    assert profile["role"] == "${aws_iam_role.driver.name}"

    role_ref = re.compile(r"\baws_iam_role\.driver\.(id|name|arn)\b")
    attached = [
        (rtype, name)
        for (rtype, name), body in aws.resources.items()
        if rtype != "aws_iam_instance_profile" and any(role_ref.search(s) for s in _strings(body))
    ]
    assert attached == [("aws_iam_role_policy", "driver")], attached
    role = aws.resource("aws_iam_role", "driver")
    assert "managed_policy_arns" not in role and "inline_policy" not in role
    policy = aws.resource("aws_iam_role_policy", "driver")
    assert policy["policy"] == "${data.aws_iam_policy_document.driver.json}"


def test_group_is_spot_with_capacity_rebalance(aws: Module) -> None:
    asg = aws.resource("aws_autoscaling_group", "workers")
    assert asg["capacity_rebalance"] is True
    assert asg.get("health_check_grace_period") is not None
    (policy,) = asg["mixed_instances_policy"]
    (dist,) = policy["instances_distribution"]
    strategy = dist["spot_allocation_strategy"]
    assert strategy == "${var.spot_allocation_strategy}"
    assert aws.variables["spot_allocation_strategy"]["default"] == "price-capacity-optimized"
    assert dist["on_demand_base_capacity"] == "${var.on_demand_base_capacity}"
    assert aws.variables["on_demand_base_capacity"]["default"] == 0
    pct = dist["on_demand_percentage_above_base_capacity"]
    assert pct == "${var.on_demand_percentage_above_base_capacity}"
    assert aws.variables["on_demand_percentage_above_base_capacity"]["default"] == 0, "not spot"

    (template,) = policy["launch_template"]
    (spec,) = template["launch_template_specification"]
    assert spec["launch_template_id"] == "${aws_launch_template.workers.id}"
    overrides = [d["override"] for d in template.get("dynamic", []) if "override" in d]
    assert overrides and overrides[0]["for_each"] == "${var.instance_types}"

    # spotring steers the size; a later apply must not reset it.
    (lifecycle,) = asg["lifecycle"]
    assert "desired_capacity" in lifecycle["ignore_changes"]


def test_slots_tag_propagates_at_launch(aws: Module) -> None:
    asg = aws.resource("aws_autoscaling_group", "workers")
    tags = {tag["key"]: tag for tag in asg["tag"]}
    assert "spotring:slots" in tags, "the ASG does not set the spotring:slots tag"
    slots = tags["spotring:slots"]
    assert slots["propagate_at_launch"] is True
    assert "var.slots_per_host" in slots["value"]
    assert aws.variables["slots_per_host"]["default"] >= 1
    if importlib.util.find_spec("spotring.providers.aws") is not None:
        provider_tag = getattr(
            importlib.import_module("spotring.providers.aws"), "DEFAULT_SLOTS_TAG", "spotring:slots"
        )
        assert provider_tag == "spotring:slots", (
            f"the AWS provider reads slots from {provider_tag!r}, the module writes spotring:slots"
        )


def test_imdsv2_is_required(aws: Module) -> None:
    for rtype, name in (("aws_launch_template", "workers"), ("aws_instance", "driver")):
        (options,) = aws.resource(rtype, name)["metadata_options"]
        assert options["http_tokens"] == "required", f"{rtype}.{name} allows IMDSv1"
        assert options.get("http_endpoint", "enabled") == "enabled"


def test_cluster_security_group_allows_traffic_between_members(aws: Module) -> None:
    rules = [
        body
        for (rtype, _), body in aws.resources.items()
        if rtype == "aws_vpc_security_group_ingress_rule"
        and body["security_group_id"] == "${aws_security_group.cluster.id}"
    ]
    assert any(
        r.get("referenced_security_group_id") == "${aws_security_group.cluster.id}"
        and r["ip_protocol"] == "-1"
        for r in rules
    ), "no all-traffic rule between members of the cluster security group"
    template = aws.resource("aws_launch_template", "workers")
    assert "${aws_security_group.cluster.id}" in template["vpc_security_group_ids"]
    driver = aws.resource("aws_instance", "driver")
    assert "${aws_security_group.cluster.id}" in driver["vpc_security_group_ids"]


def _templatefile_calls(aws: Module) -> list[tuple[str, list[str]]]:
    calls = []
    for (rtype, name), body in aws.resources.items():
        for text in _strings(body):
            for args in _function_args(text, "templatefile"):
                calls.append((f"{rtype}.{name}", args))
    return calls


def _resolve_template_path(aws: Module, expression: str) -> Path:
    local = re.fullmatch(rf"\$?\{{?local\.({_IDENT})\}}?", expression)
    if local:
        expression = aws.locals[local.group(1)]
    text = _unquote(expression).replace("${path.module}", str(aws.directory))
    assert "${" not in text, f"template path is not static: {expression}"
    return Path(text)


def test_templatefile_paths_exist_and_get_every_variable(aws: Module) -> None:
    calls = _templatefile_calls(aws)
    assert {where for where, _ in calls} >= {"aws_launch_template.workers", "aws_instance.driver"}
    for where, args in calls:
        assert len(args) == 2, f"{where}: templatefile({args})"
        path = _resolve_template_path(aws, args[0])
        assert path.is_file(), f"{where}: template {path} does not exist"
        wanted = _template_variables(path)
        passed = _object_keys(args[1])
        assert not wanted - passed, f"{where}: template variables not passed: {wanted - passed}"
        assert not passed - wanted, f"{where}: passed but unused by the template: {passed - wanted}"


def test_worker_user_data_finishes_the_launch_hook(aws: Module) -> None:
    """The worker's bootstrap must name the hook the group holds new instances in."""
    asg = aws.resource("aws_autoscaling_group", "workers")
    (hook,) = asg["initial_lifecycle_hook"]
    assert hook["lifecycle_transition"] == "autoscaling:EC2_INSTANCE_LAUNCHING"
    assert hook["default_result"] == "ABANDON"
    user_data = aws.resource("aws_launch_template", "workers")["user_data"]
    assert user_data.startswith("${base64encode(templatefile("), "launch templates need base64"
    (args,) = _function_args(user_data, "templatefile")
    assert re.search(rf"lifecycle_hook_name\s*[=:]\s*{re.escape(hook['name'][2:-1])}\b", args[1])
    assert re.search(r"group_name\s*[=:]\s*var\.name\b", args[1])
    assert asg["name"] == "${var.name}"


def test_software_versions_match_the_setup_script(aws: Module) -> None:
    """The hosts get the torch and Horovod that scripts/setup.sh tests against."""
    setup = (REPO / "scripts" / "setup.sh").read_text(encoding="utf-8")
    for variable, shell_name in (
        ("torch_version", "torch_version"),
        ("horovod_version", "horovod_version"),
    ):
        pinned = re.search(rf"^{shell_name}=(\S+)$", setup, re.MULTILINE)
        assert pinned, f"scripts/setup.sh sets no {shell_name}"
        assert aws.variables[variable]["default"] == pinned.group(1), variable


# ------------------------------------------------------------------ spotring_command


def _spotring_argv(aws: Module) -> list[str]:
    command = aws.outputs["spotring_command"]["value"]
    # Interpolations become "2": a valid group name, region string and process count.
    return shlex.split(re.sub(r"\$\{[^}]*\}", "2", command))


def test_spotring_command_shape(aws: Module) -> None:
    argv = _spotring_argv(aws)
    assert argv[:2] == ["spotring", "run"]
    assert "--" in argv and argv[argv.index("--") + 1 :], "no training command after --"
    command = aws.outputs["spotring_command"]["value"]
    for flag, ref in (
        ("--group", "aws_autoscaling_group.workers.name"),
        ("--region", "var.region"),
        ("-np", "var.desired_capacity"),
        ("--min-np", "var.min_size"),
        ("--max-np", "var.max_size"),
    ):
        assert re.search(rf"{re.escape(flag)} \$\{{[^}}]*{re.escape(ref)}", command), (
            flag,
            command,
        )
    assert "--provider aws" in command


def test_spotring_command_parses_with_the_cli(aws: Module) -> None:
    cli = importlib.import_module("spotring.autoscaler.cli")
    if not hasattr(cli, "build_parser"):
        pytest.skip("spotring.autoscaler.cli has no build_parser() yet")
    if importlib.util.find_spec("spotring.providers.aws") is None:
        pytest.skip("providers/aws.py does not exist yet; --group/--region are its options")
    plugins = importlib.import_module("spotring.autoscaler.plugins")
    pm = plugins.get_plugin_manager(load_entry_points=False)
    registry = plugins.provider_registry(pm)
    assert "aws" in registry, "no provider named 'aws' is registered"
    parser = cli.build_parser(pm, registry.get("aws"))

    argv = _spotring_argv(aws)[1:]
    dashes = argv.index("--")
    try:
        options = parser.parse_args(argv[:dashes])
    except (SystemExit, Exception) as error:  # the CLI's parser raises UsageError
        pytest.fail(f"spotring_command does not parse: {shlex.join(argv)}: {error}")
    assert options.command == "run"
    assert options.provider == "aws"
    assert options.num_proc == 2 and options.min_num_proc == 2 and options.max_num_proc == 2


# ------------------------------------------------------------------ terraform itself


PLUGIN_DIR = Path(os.environ.get("SPOTRING_TF_PLUGIN_DIR", "/opt/tf-plugins"))


def _terraform_cli_available() -> str | None:
    if os.environ.get("SPOTRING_TERRAFORM_TESTS") != "1":
        return "set SPOTRING_TERRAFORM_TESTS=1 to run terraform validate/test (~20 s)"
    if shutil.which("terraform") is None:
        return "no terraform binary on PATH"
    if not PLUGIN_DIR.is_dir():
        return f"no local provider mirror at {PLUGIN_DIR} (set SPOTRING_TF_PLUGIN_DIR)"
    return None


def test_terraform_cli(tmp_path: Path) -> None:
    reason = _terraform_cli_available()
    if reason:
        pytest.skip(reason)
    # A copy keeps .terraform/ and the lock file out of the repository.
    shutil.copytree(AWS, tmp_path / "terraform" / "aws")
    shutil.copytree(REPO / "worker_image", tmp_path / "worker_image")
    workdir = tmp_path / "terraform" / "aws"
    env = {**os.environ, "TF_IN_AUTOMATION": "1", "CHECKPOINT_DISABLE": "1"}

    def terraform(*args: str) -> str:
        done = subprocess.run(
            ["terraform", *args, "-no-color"],
            cwd=workdir,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, f"terraform {args[0]}:\n{done.stdout}\n{done.stderr}"
        return done.stdout

    terraform("init", "-backend=false", "-input=false", f"-plugin-dir={PLUGIN_DIR}")
    # `terraform test` validates the configuration first, then runs tests/*.tftest.hcl.
    out = terraform("test")
    assert "0 failed" in out, out
