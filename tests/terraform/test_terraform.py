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

REPO = Path(__file__).resolve().parents[2]
TERRAFORM = REPO / "terraform"
AWS = TERRAFORM / "aws"

needs_terraform_binary = pytest.mark.skipif(
    shutil.which("terraform") is None, reason="no terraform binary on PATH"
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
        self.modules: dict[str, dict] = {}  # module calls, by name
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
            for entry in doc.get("module", []):
                self.modules.update(entry)
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
        list(module.modules.values()),
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
    # The provider's calls, and with checkpoint_uri the checkpoints' (checkpoints.tf).
    assert sorted(attached) == [
        ("aws_iam_role_policy", "driver"),
        ("aws_iam_role_policy", "driver_checkpoints"),
    ], attached
    assert aws.resource("aws_iam_role_policy", "driver_checkpoints")["count"] == CHECKPOINTS_ONLY
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


def test_zone_rebalancing_is_suspended(aws: Module) -> None:
    """A hand-back (TerminateInstanceInAutoScalingGroup with a decrement) may unbalance
    the zones, and AZRebalance would then terminate training hosts in other zones."""
    asg = aws.resource("aws_autoscaling_group", "workers")
    assert "AZRebalance" in asg.get("suspended_processes", [])


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
    (interface,) = template["network_interfaces"]
    assert "${aws_security_group.cluster.id}" in interface["security_groups"]
    driver = aws.resource("aws_instance", "driver")
    assert "${aws_security_group.cluster.id}" in driver["vpc_security_group_ids"]


def test_workers_never_get_a_public_ip(aws: Module) -> None:
    template = aws.resource("aws_launch_template", "workers")
    (interface,) = template["network_interfaces"]
    assert interface["associate_public_ip_address"] is False
    assert interface["device_index"] == 0
    # Security groups go on the interface; the template-level list would conflict.
    assert "vpc_security_group_ids" not in template


def test_driver_has_no_public_ip_by_default(aws: Module) -> None:
    driver = aws.resource("aws_instance", "driver")
    assert driver["associate_public_ip_address"] == "${var.driver_associate_public_ip}"
    assert aws.variables["driver_associate_public_ip"]["default"] is False
    # ssh goes to whichever address the driver has.
    address = aws.outputs["driver_address"]["value"]
    assert address == ("${coalesce(aws_instance.driver.public_ip, aws_instance.driver.private_ip)}")


def _validation(module: Module, variable: str) -> str:
    (validation,) = module.variables[variable]["validation"]
    return validation["condition"] + "\n" + validation["error_message"]


def test_ssh_from_the_whole_internet_is_refused(aws: Module) -> None:
    text = _validation(aws, "ssh_ingress_cidrs")
    # Any block wider than /8, not just /0 (0.0.0.0/1 + 128.0.0.0/1 is everyone too).
    assert 'split("/", c)[1]) >= 8' in text and '!strcontains(c, ":")' in text
    assert "0.0.0.0/0" in text and "::/0" in text and "0.0.0.0/1" in text  # named


def assert_https_only_validations(module: Module) -> None:
    """Index and wheel URLs https only, Horovod's wheel with its hash (every module)."""
    assert "^https://" in _validation(module, "torch_index_url")
    assert "https?" not in _validation(module, "torch_index_url")
    wheel = _validation(module, "horovod_wheel_url")
    assert "^https://" in wheel and "#sha256=[0-9a-f]{64}$" in wheel
    assert "https?" not in wheel
    spotring = _validation(module, "spotring_package")
    assert "https://" in spotring and "#sha256=[0-9a-f]{64}$" in spotring
    assert "https?" not in spotring and "git" not in spotring.split("\n")[0]


# The validations themselves, by Terraform: a copy of variables.tf alone needs no
# provider, so `terraform plan` runs offline.
AWS_REQUIRED = {
    "name": "spot-train",
    "region": "us-east-1",
    "vpc_id": "vpc-0abc",
    "subnet_ids": ["subnet-0a"],
    "instance_types": ["g5.xlarge"],
    "min_size": 1,
    "max_size": 2,
    "desired_capacity": 1,
    "ssh_public_keys": ["ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample driver"],
    "spotring_package": "spotring[aws] @ https://example.com/spotring-0.1.0-py3-none-any.whl#sha256="
    + "b" * 64,
}
GOOD_WHEEL = "https://example.com/horovod-0.28.1-cp312-cp312-linux_x86_64.whl#sha256=" + "a" * 64


def https_url_cases(extra: str) -> list[tuple[dict[str, Any], str | None]]:
    """URL inputs every module takes (None) or refuses (the variable), at plan time;
    ``extra`` is the module's spotring extra (its spotring_package needs it)."""
    wheel = "example.com/spotring-0.1.0-py3-none-any.whl#sha256=" + "b" * 64
    return [
        ({"torch_index_url": "http://download.pytorch.org/whl/cpu"}, "torch_index_url"),
        ({"torch_index_url": "https://download.pytorch.org/whl/cu128"}, None),
        ({"torch_index_url": ""}, None),
        ({"horovod_wheel_url": GOOD_WHEEL}, None),
        ({"horovod_wheel_url": GOOD_WHEEL.replace("https", "http")}, "horovod_wheel_url"),
        ({"horovod_wheel_url": GOOD_WHEEL.split("#")[0]}, "horovod_wheel_url"),
        ({"horovod_wheel_url": GOOD_WHEEL[:-1]}, "horovod_wheel_url"),
        ({"spotring_package": f"spotring[{extra}] @ https://{wheel}"}, None),
        ({"spotring_package": f"spotring[{extra}] @ http://{wheel}"}, "spotring_package"),
        ({"spotring_package": f"spotring[{extra}] @ HTTP://{wheel}"}, "spotring_package"),
        ({"spotring_package": f"https://{wheel}"}, None),
        ({"spotring_package": f"spotring[{extra}] @ https://{wheel[:-1]}"}, "spotring_package"),
        (
            {"spotring_package": f"spotring[{extra}] @ https://{wheel.split('#')[0]}"},
            "spotring_package",
        ),
        (
            {"spotring_package": f"spotring[{extra}] @ git+http://example.com/spotring.git"},
            "spotring_package",
        ),
        (
            {"spotring_package": f"spotring[{extra}] @ git://example.com/spotring.git"},
            "spotring_package",
        ),
        (
            {"spotring_package": f"spotring[{extra}] @ git+https://example.com/spotring.git"},
            "spotring_package",
        ),
        ({"spotring_package": f"spotring[{extra}]==0.1.0"}, "spotring_package"),
        (
            {"spotring_package": f"spotring[{extra}]' ; rm -rf / ' @ https://{wheel}"},
            "spotring_package",
        ),
    ]


def job_input_cases() -> list[tuple[dict[str, Any], str | None]]:
    """The job's unit inputs every module takes (None) or refuses (the variable)."""
    return [
        ({"job_command": ["python", "/opt/train/train.py", "--tag", 'it\'s "a b" 100%']}, None),
        ({"job_command": ["python", "train.py\nrm -rf /"]}, "job_command"),
        ({"job_command": ["python", ""]}, "job_command"),
        ({"job_args": ["--checkpoint-every", "300"]}, None),
        ({"job_args": ["--", "python"]}, "job_args"),
        ({"job_working_directory": "/opt/train"}, None),
        ({"job_working_directory": "train"}, "job_working_directory"),
        ({"job_working_directory": "/opt/my train"}, "job_working_directory"),
        ({"job_ssh_identity_file": "/home/ubuntu/.ssh/spotring"}, None),
        ({"job_ssh_identity_file": "~/.ssh/id_ed25519"}, "job_ssh_identity_file"),
    ]


def assert_plan_outcome(done: subprocess.CompletedProcess[str], refused: str | None) -> None:
    """`terraform plan` of a variables-only copy passed, or refused exactly ``refused``."""
    output = done.stdout + done.stderr
    if refused is None:
        assert done.returncode == 0, output
    else:
        assert done.returncode != 0, output
        assert "Invalid value for variable" in output and f"var.{refused}" in output, output


@pytest.fixture(scope="module")
def aws_variables_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("terraform") is None:
        pytest.skip("no terraform binary on PATH")
    workdir = tmp_path_factory.mktemp("aws-variables")
    shutil.copy(AWS / "variables.tf", workdir)
    done = subprocess.run(
        ["terraform", "init", "-input=false", "-no-color"],
        cwd=workdir, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    return workdir


@pytest.mark.parametrize(
    ("overrides", "refused"),
    [
        ({"ssh_ingress_cidrs": ["203.0.113.7/32"]}, None),
        ({"ssh_ingress_cidrs": ["0.0.0.0/0"]}, "ssh_ingress_cidrs"),
        ({"ssh_ingress_cidrs": ["::/0"]}, "ssh_ingress_cidrs"),
        ({"ssh_ingress_cidrs": ["10.0.0.0/8", "0.0.0.0/0"]}, "ssh_ingress_cidrs"),
        ({"ssh_ingress_cidrs": ["10.0.0.0/8", "35.235.240.0/20"]}, None),
        ({"ssh_ingress_cidrs": ["0.0.0.0/1", "128.0.0.0/1"]}, "ssh_ingress_cidrs"),
        ({"ssh_ingress_cidrs": ["10.0.0.0/7"]}, "ssh_ingress_cidrs"),
        ({"checkpoint_uri": "s3://ckpt-bucket/runs/spot-train"}, None),
        ({"checkpoint_uri": "s3://ckpt.bucket-1/a/"}, None),
        ({"checkpoint_uri": "s3://ckpt-bucket"}, "checkpoint_uri"),  # no prefix
        ({"checkpoint_uri": "s3://ckpt-bucket/"}, "checkpoint_uri"),
        ({"checkpoint_uri": "s3://ckpt-bucket/runs/*"}, "checkpoint_uri"),  # IAM wildcard
        ({"checkpoint_uri": "s3://ckpt-bucket/${aws:username}"}, "checkpoint_uri"),
        ({"checkpoint_uri": "s3://ckpt-bucket//runs"}, "checkpoint_uri"),
        ({"checkpoint_uri": "s3://Ckpt/runs"}, "checkpoint_uri"),
        ({"checkpoint_uri": "gs://ckpt-bucket/runs"}, "checkpoint_uri"),
        ({"checkpoint_uri": "/mnt/checkpoints"}, "checkpoint_uri"),
    ],
)
def test_terraform_validations(
    aws_variables_only: Path, tmp_path: Path, overrides: dict, refused: str | None
) -> None:
    var_file = tmp_path / "test.tfvars.json"
    var_file.write_text(json.dumps({**AWS_REQUIRED, **overrides}))
    done = subprocess.run(
        ["terraform", "plan", "-input=false", "-no-color", "-lock=false", "-refresh=false",
         f"-var-file={var_file}", f"-state={tmp_path / 'state'}"],
        cwd=aws_variables_only, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert_plan_outcome(done, refused)


def _templatefile_calls(aws: Module) -> list[tuple[str, list[str]]]:
    """Every templatefile() call, in a resource ("type.name") or a local ("local.name")."""
    calls = []
    for (rtype, name), body in aws.resources.items():
        for text in _strings(body):
            for args in _function_args(text, "templatefile"):
                calls.append((f"{rtype}.{name}", args))
    for name, value in aws.locals.items():
        for text in _strings(value):
            for args in _function_args(text, "templatefile"):
                calls.append((f"local.{name}", args))
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
    assert {where for where, _ in calls} == {"local.worker_bootstrap", "local.driver_bootstrap"}
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
    (args,) = _function_args(aws.locals["worker_bootstrap"], "templatefile")
    assert re.search(rf"lifecycle_hook_name\s*[=:]\s*{re.escape(hook['name'][2:-1])}\b", args[1])
    assert re.search(r"group_name\s*[=:]\s*var\.name\b", args[1])
    assert asg["name"] == "${var.name}"


# EC2 takes at most 16 KiB of user data (before base64): at most 21,844 base64 characters.
USER_DATA_BASE64_LIMIT = 16 * 1024 // 3 * 4


def test_user_data_is_the_gzipped_bootstrap_within_ec2s_limit(aws: Module) -> None:
    """The bootstrap with its lock is close to 16 KiB as text: the modules send it
    gzipped (cloud-init unpacks it), and refuse at plan time what would not fit."""
    template = aws.resource("aws_launch_template", "workers")
    assert template["user_data"] == "${base64gzip(local.worker_bootstrap)}"
    driver = aws.resource("aws_instance", "driver")
    # user_data would take the gzip as a (corrupted) string; user_data_base64 as bytes.
    assert driver["user_data_base64"] == "${base64gzip(local.driver_bootstrap)}"
    assert "user_data" not in driver
    for body, local in ((template, "worker_bootstrap"), (driver, "driver_bootstrap")):
        conditions = [
            condition["condition"]
            for lifecycle in body["lifecycle"]
            for condition in lifecycle.get("precondition", [])
        ]
        wanted = f"${{length(base64gzip(local.{local})) <= {USER_DATA_BASE64_LIMIT}}}"
        assert wanted in conditions, conditions


# ------------------------------------------------------------------ durable checkpoints

CHECKPOINTS_ONLY = "${local.checkpoints ? 1 : 0}"
BUCKET_ARN = "${local.checkpoint_bucket_arn}"
UNDER_PREFIX = "${local.checkpoint_bucket_arn}/${local.checkpoint_prefix}/*"
LOCK_OBJECT = "${local.checkpoint_bucket_arn}/${local.checkpoint_prefix}/lock.json"
PREFIX_CONDITION = {
    "test": "StringLike",
    "variable": "s3:prefix",
    "values": ["${local.checkpoint_prefix}/", "${local.checkpoint_prefix}/*"],
}


def _grants(statements: list[dict]) -> dict[str, set[str]]:
    """action -> the resources it is granted on."""
    grants: dict[str, set[str]] = {}
    for statement in statements:
        assert statement.get("effect", "Allow") == "Allow", statement
        for action in statement["actions"]:
            grants.setdefault(action, set()).update(statement["resources"])
    return grants


def test_checkpoint_permissions_exist_only_with_checkpoint_uri(aws: Module) -> None:
    assert aws.locals["checkpoints"] == '${var.checkpoint_uri != ""}'
    assert aws.variables["checkpoint_uri"]["default"] == ""
    for who in ("worker", "driver"):
        document = aws.data[("aws_iam_policy_document", f"{who}_checkpoints")]
        assert document["count"] == CHECKPOINTS_ONLY, who
        policy = aws.resource("aws_iam_role_policy", f"{who}_checkpoints")
        assert policy["count"] == CHECKPOINTS_ONLY, who
        assert policy["role"] == f"${{aws_iam_role.{who}.id}}"
        assert policy["policy"] == f"${{data.aws_iam_policy_document.{who}_checkpoints[0].json}}"
    # Nothing else in the provider's or the hook's policies touches S3.
    for name in ("driver", "worker"):
        for statement in _statements(aws, name):
            assert not [a for a in statement["actions"] if a.startswith("s3:")], statement


def test_checkpoint_permissions_are_scoped_to_the_prefix(aws: Module) -> None:
    """Exactly the calls of the storage layer, on PREFIX/ of the one bucket: no wildcard
    action, no other bucket, listing only under the prefix, the driver writing only the
    lock."""
    workers = _statements(aws, "worker_checkpoints")
    driver = _statements(aws, "driver_checkpoints")
    assert _grants(workers) == {
        "s3:ListBucket": {BUCKET_ARN},
        "s3:GetObject": {UNDER_PREFIX},
        "s3:PutObject": {UNDER_PREFIX},
        "s3:DeleteObject": {UNDER_PREFIX},
        "s3:AbortMultipartUpload": {UNDER_PREFIX},
    }
    assert _grants(driver) == {
        "s3:ListBucket": {BUCKET_ARN},
        "s3:GetObject": {UNDER_PREFIX},
        "s3:PutObject": {LOCK_OBJECT},
        "s3:DeleteObject": {LOCK_OBJECT},
    }
    for statement in workers + driver:
        assert all("*" not in action for action in statement["actions"]), statement
        assert all(r != "*" and not r.endswith(":::*") for r in statement["resources"])
        if statement["actions"] == ["s3:ListBucket"]:
            assert statement["condition"] == [PREFIX_CONDITION], statement
        else:
            assert "condition" not in statement
    assert aws.locals["checkpoint_bucket_arn"] == (
        "arn:${data.aws_partition.current.partition}:s3:::${local.checkpoint_location[0]}"
    )


@needs_terraform_binary
@pytest.mark.parametrize(
    ("uri", "bucket_arn", "prefix"),
    [
        ("s3://ckpt-bucket/runs/spot-train", "arn:aws:s3:::ckpt-bucket", "runs/spot-train"),
        ("s3://ckpt.bucket-1/a/", "arn:aws:s3:::ckpt.bucket-1", "a"),
    ],
)
def test_checkpoint_uri_splits_into_bucket_and_prefix(
    aws: Module, tmp_path: Path, uri: str, bucket_arn: str, prefix: str
) -> None:
    from tests.terraform.support import evaluate

    values = evaluate(
        aws,
        tmp_path,
        {**AWS_REQUIRED, "checkpoint_uri": uri},
        {"arn": "local.checkpoint_bucket_arn", "prefix": "local.checkpoint_prefix",
         "option": "local.checkpoint_option"},
        replace={"data.aws_partition.current.partition": '"aws"'},
    )  # fmt: skip
    assert values == {"arn": bucket_arn, "prefix": prefix, "option": f" --checkpoint {uri}"}


# ------------------------------------------------------------------ the job under systemd


def assert_driver_runs_the_job_unit(module: Module, cloud: str, driver_script: str) -> None:
    """The module calls ../modules/driver-job with its job variables, and the driver's
    boot script (``driver_script``, as written) is its bootstrap followed by the unit's
    installer, which is "" without job_command: compact() then leaves the bootstrap
    alone, as it was before the unit existed."""
    call = module.modules["driver_job"]
    assert call["source"] == "../modules/driver-job"
    assert (module.directory / call["source"]).is_dir()
    assert call["group_name"] == "${var.name}"
    assert call["provider_args"][:4] == ["--provider", cloud, "--group", "${var.name}"]
    for argument, variable in (
        ("ssh_user", "ssh_user"),
        ("job_command", "job_command"),
        ("job_args", "job_args"),
        ("working_directory", "job_working_directory"),
        ("ssh_identity_file", "job_ssh_identity_file"),
        ("checkpoint_uri", "checkpoint_uri"),
    ):
        assert call[argument] == f"${{var.{variable}}}", argument
    assert module.variables["job_command"]["default"] == []
    script = driver_script.removeprefix("${base64encode(").removeprefix("${")
    assert script.startswith('join("\\n", compact([templatefile(local.bootstrap_template, {'), (
        script[:80]
    )
    assert script.rstrip(")}").endswith("}), module.driver_job.installer]"), script[-80:]
    (args,) = _function_args(driver_script, "templatefile")
    assert re.search(r'role\s*[=:]\s*"driver"', args[1])
    journal = module.outputs["driver_journal_command"]["value"]
    assert journal.startswith("${module.driver_job.enabled ? ") and journal.endswith(" : null}")
    assert "sudo journalctl -u spotring-job -f" in journal


def test_aws_driver_runs_the_job_unit(aws: Module) -> None:
    assert_driver_runs_the_job_unit(aws, "aws", aws.locals["driver_bootstrap"])
    (lifecycle,) = aws.resource("aws_instance", "driver")["lifecycle"]
    conditions = [c["condition"] for c in lifecycle["precondition"]]
    assert '${length(var.job_command) == 0 || var.ssh_user != "root"}' in conditions


JOB_COMMAND = [
    "python", "/opt/train/train.py", "--tag", "it's \"a b\"", "100%", "$HOME", "${x}",
    "back\\slash", ";", "--",
]  # fmt: skip


def _driver_job(tmp_path: Path, **inputs: Any) -> dict[str, Any]:
    """The driver-job module's outputs for ``inputs`` (no provider needed)."""
    from tests.terraform.support import DRIVER_JOB, terraform

    arguments = {
        "group_name": "spot-train",
        "provider_args": ["--provider", "aws", "--group", "spot-train", "--region", "us-east-1"],
        "ssh_user": "ubuntu",
        **inputs,
    }
    body = "".join(f"  {k} = {json.dumps(v).replace('${', '$${')}\n" for k, v in arguments.items())
    main_tf = f'module "job" {{\n  source = {json.dumps(str(DRIVER_JOB))}\n{body}}}\n'
    for name in ("enabled", "argv", "unit", "installer"):
        main_tf += f'output "{name}" {{\n  value = module.job.{name}\n}}\n'
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "main.tf").write_text(main_tf, encoding="utf-8")
    for args in (("init", "-input=false", "-backend=false"), ("apply", "-auto-approve")):
        done = terraform(tmp_path, *args)
        assert done.returncode == 0, main_tf + done.stdout + done.stderr
    done = terraform(tmp_path, "output", "-json")
    assert done.returncode == 0, done.stderr
    return {name: body["value"] for name, body in json.loads(done.stdout).items()}


@needs_terraform_binary
def test_driver_job_unit_runs_the_command_as_given(tmp_path: Path) -> None:
    """Every argument reaches spotring as it is, spaces, quotes, %, $, backslashes and
    semicolons included (systemd's quoting, checked by a parser of its rules and, where
    there is one, by systemd-analyze)."""
    from tests.terraform.support import systemd_command_line, unit_settings

    uri = "s3://ckpt-bucket/runs/spot-train"
    out = _driver_job(
        tmp_path / "tf",
        job_command=JOB_COMMAND,
        job_args=["--checkpoint-every", "300"],
        checkpoint_uri=uri,
        working_directory="/opt/train",
    )
    assert out["enabled"] is True
    assert out["argv"] == [
        "/opt/spotring/venv/bin/spotring", "run",
        "--provider", "aws", "--group", "spot-train", "--region", "us-east-1",
        "--checkpoint-every", "300", "--checkpoint", uri, "--", *JOB_COMMAND,
    ]  # fmt: skip
    settings = unit_settings(out["unit"])
    (exec_start,) = settings["Service.ExecStart"]
    assert systemd_command_line(exec_start) == out["argv"]
    expected = {
        "Unit.Wants": ["network-online.target"],
        "Unit.After": ["network-online.target"],
        "Unit.StartLimitIntervalSec": ["0"],
        "Unit.ConditionPathExists": ["!/var/lib/spotring/job-done"],
        "Service.Type": ["simple"],
        "Service.User": ["ubuntu"],
        "Service.WorkingDirectory": ["/opt/train"],
        "Service.Restart": ["on-failure"],
        "Service.RestartSec": ["10"],
        "Service.KillMode": ["mixed"],
        "Service.SuccessExitStatus": ["130"],
        "Install.WantedBy": ["multi-user.target"],
    }
    assert {k: settings.get(k) for k in expected} == expected
    # No secret on the command line or in the environment: PATH and unbuffered output.
    assert settings["Service.Environment"] == [
        "PATH=/opt/spotring/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "PYTHONUNBUFFERED=1",
    ]
    assert not {"Service.EnvironmentFile", "Service.Group"} & set(settings)

    analyze = shutil.which("systemd-analyze")
    if analyze:
        # verify wants the executable to exist; the arguments are what it checks here.
        unit = out["unit"].replace(
            "ExecStart=/opt/spotring/venv/bin/spotring ", "ExecStart=/bin/true "
        )
        (tmp_path / "spotring-job.service").write_text(unit, encoding="utf-8")
        done = subprocess.run(
            [analyze, "verify", str(tmp_path / "spotring-job.service")],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr


@needs_terraform_binary
@pytest.mark.skipif(shutil.which("sh") is None, reason="needs sh")
@pytest.mark.parametrize("identity", ["", "/srv/keys/spotring"])
def test_driver_job_waits_for_an_ssh_key(tmp_path: Path, identity: str) -> None:
    """Without an agent under systemd, a missing key would fail every worker (and have
    the group replace them all): ExecStartPre fails until a key is readable."""
    from tests.terraform.support import systemd_command_line, unit_settings

    out = _driver_job(
        tmp_path / "tf", job_command=["python", "train.py"], ssh_identity_file=identity
    )
    (pre,) = unit_settings(out["unit"])["Service.ExecStartPre"]
    argv = systemd_command_line(pre)
    assert argv[:2] == ["/bin/sh", "-c"] and len(argv) == 3
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    script = argv[2]
    if identity:
        assert out["argv"][out["argv"].index("--ssh-identity-file") + 1] == identity
        key = tmp_path / "spotring-key"
        script = script.replace(identity, str(key))
    else:
        assert "--ssh-identity-file" not in out["argv"]
        key = home / ".ssh" / "id_ecdsa"
    env = {"HOME": str(home), "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    done = subprocess.run(
        ["sh", "-c", script], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 1 and "no readable ssh key" in done.stderr, done.stderr
    key.write_text("key", encoding="utf-8")
    done = subprocess.run(
        ["sh", "-c", script], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


@needs_terraform_binary
@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_driver_job_installer_installs_enables_and_restarts_once(tmp_path: Path) -> None:
    out = _driver_job(tmp_path / "tf", job_command=["python", "train.py"])
    changed = _driver_job(tmp_path / "tf2", job_command=["python", "train.py", "--epochs", "2"])
    bin_dir, units, state = tmp_path / "bin", tmp_path / "units", tmp_path / "state"
    for directory in (bin_dir, units, state):
        directory.mkdir()
    calls = tmp_path / "calls"
    (bin_dir / "systemctl").write_text(f'#!/bin/sh\necho "$*" >>{calls}\n', encoding="utf-8")
    (bin_dir / "systemctl").chmod(0o755)
    env = {
        "PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "SPOTRING_SYSTEMD_DIR": str(units),
        "SPOTRING_STATE_DIR": str(state),
    }

    def install(installer: str) -> list[str]:
        calls.unlink(missing_ok=True)
        script = f"set -euo pipefail\nlog() {{ :; }}\n{installer}"
        done = subprocess.run(
            ["bash", "-c", script], env=env, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr
        return calls.read_text().splitlines() if calls.exists() else []

    (state / "job-done").touch()  # a finished job of an earlier unit
    started = [
        "daemon-reload",
        "enable spotring-job.service",
        "restart --no-block spotring-job.service",
    ]
    assert install(out["installer"]) == started
    unit = units / "spotring-job.service"
    assert unit.read_text() == out["unit"] and unit.stat().st_mode & 0o777 == 0o644
    assert not (state / "job-done").exists(), "a new unit must forget an earlier job's end"
    # A later boot (GCP runs the startup script at each): an unchanged unit is left alone.
    (state / "job-done").touch()
    assert install(out["installer"]) == []
    assert (state / "job-done").exists()
    assert install(changed["installer"]) == started
    assert unit.read_text() == changed["unit"]
    # What the driver runs: the bootstrap, then the installer (after main: a failed
    # bootstrap exits first, set -e), is one valid bash script.
    script = "\n".join([_render({"role": "driver", "lifecycle_hook_name": ""}), out["installer"]])
    assert script.index('\n  main "$@"\nfi\n') < script.index("install_spotring_job()")
    done = subprocess.run(["bash", "-n"], input=script, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


@needs_terraform_binary
def test_driver_job_without_a_command_is_nothing(tmp_path: Path) -> None:
    out = _driver_job(tmp_path, checkpoint_uri="s3://ckpt-bucket/runs")
    assert out == {"enabled": False, "argv": [], "unit": "", "installer": ""}


# ------------------------------------------------------------------ spotring_command


def _spotring_argv(aws: Module) -> list[str]:
    command = aws.outputs["spotring_command"]["value"]
    # Without checkpoint_uri (its option is "" then); the other interpolations become
    # "2": a valid group name, region string and process count.
    assert "${local.checkpoint_option}" in command
    command = command.replace("${local.checkpoint_option}", "")
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


# ------------------------------------------------------------------ the hosts' bootstrap

CLOUDS = ("aws", "gcp", "azure")
LOCKS = {cloud: REPO / "worker_image" / f"requirements-worker-{cloud}.txt" for cloud in CLOUDS}
LOCK = LOCKS["aws"]  # the AWS module's: the bootstrap tests below render with it
BOOTSTRAP = REPO / "worker_image" / "bootstrap.sh.tftpl"
LOCK_LINE = re.compile(r"[a-z0-9][a-z0-9._-]*==[^\s=]+( --hash=sha256:[0-9a-f]{64})+")


def _lock_lines(lock: Path = LOCK) -> list[str]:
    lines = lock.read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line and not line.startswith("#")]


def _declared(extra: str | None = None) -> set[str]:
    """Canonical names of spotring's dependencies in pyproject.toml, or of ``extra``'s."""
    tomllib = pytest.importorskip("tomllib")
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    with (REPO / "pyproject.toml").open("rb") as handle:
        project = tomllib.load(handle)["project"]
    declared = project["optional-dependencies"][extra] if extra else project["dependencies"]
    return {canonicalize_name(Requirement(line).name) for line in declared}


@pytest.mark.parametrize("cloud", CLOUDS)
def test_worker_lock_pins_every_package_with_hashes(cloud: str) -> None:
    """Each module's lock pins, by version and hash, spotring's dependencies and its
    cloud's extra (spotring's wheel goes in with --no-deps), and no other cloud's."""
    lock = LOCKS[cloud]
    lines = _lock_lines(lock)
    assert lines, f"{lock} pins nothing"
    for line in lines:
        assert LOCK_LINE.fullmatch(line), f"not pinned with == and a sha256 hash: {line!r}"
    names = [line.split("==")[0] for line in lines]
    assert len(names) == len(set(names)), "a package is pinned twice"
    assert f"\n# extra: {cloud}\n" in lock.read_text(encoding="utf-8")
    setup = (REPO / "scripts" / "setup.sh").read_text(encoding="utf-8")
    horovod = re.search(r"^horovod_version=(\S+)$", setup, re.MULTILINE).group(1)
    assert any(line.startswith(f"horovod=={horovod} --hash=") for line in lines)
    # Horovod's build tools, spotring's dependencies and the cloud's extra.
    missing = ({"pip", "setuptools", "wheel"} | _declared() | _declared(cloud)) - set(names)
    assert not missing, f"{lock.name} lacks {sorted(missing)}: run the lock script"
    others = set().union(*(_declared(c) for c in CLOUDS if c != cloud)) - _declared(cloud)
    assert not others & set(names), f"another cloud's extra in {lock.name}"


@pytest.mark.parametrize("cloud", CLOUDS)
def test_torch_is_locked_or_the_lock_says_it_is_not(cloud: str) -> None:
    """torch pinned by hash like the rest, or the lock's header says it is not (the
    bootstrap then installs it by version only, with a warning)."""
    text = LOCKS[cloud].read_text(encoding="utf-8")
    torch = [line for line in _lock_lines(LOCKS[cloud]) if line.startswith("torch==")]
    if torch:
        setup = (REPO / "scripts" / "setup.sh").read_text(encoding="utf-8")
        version = re.search(r"^torch_version=(\S+)$", setup, re.MULTILINE).group(1)
        assert torch[0].split()[0].split("+")[0] == f"torch=={version}"
        assert "# torch: not locked" not in text
    else:
        assert "\n# torch: not locked" in text
        # Its own dependencies are, so only torch's wheel goes in unchecked.
        names = {line.split("==")[0] for line in _lock_lines(LOCKS[cloud])}
        assert {"filelock", "typing-extensions", "sympy", "networkx", "jinja2", "fsspec"} <= names


@pytest.mark.parametrize("name", CLOUDS)
def test_every_module_passes_the_lock_file_to_the_bootstrap(name: str) -> None:
    """One copy of each lock: each module reads its cloud's with file() into
    requirements_lock, and the template has none of its own."""
    module = Module(TERRAFORM / name)
    calls = _templatefile_calls(module)
    assert len(calls) == 2, calls  # the workers' and the driver's
    for where, args in calls:
        passed = re.search(
            r"\brequirements_lock\s*[=:]\s*chomp\(file\(([^()]+)\)\)\s*[,}\n]", args[1]
        )
        assert passed, f"{where}: requirements_lock is not chomp(file(...)) of the lock"
        assert _resolve_template_path(module, passed.group(1)).resolve() == LOCKS[name]
    text = BOOTSTRAP.read_text(encoding="utf-8")
    assert "--hash=sha256:" not in text and "BEGIN requirements-worker.txt" not in text
    assert "<<'SPOTRING_REQUIREMENTS'\n${requirements_lock}\nSPOTRING_REQUIREMENTS\n" in text
    # The lock script writes the lock only (it used to copy it into the template).
    script = (REPO / "scripts" / "lock-worker-requirements.sh").read_text(encoding="utf-8")
    code = [line for line in script.splitlines() if not line.lstrip().startswith("#")]
    assert not [line for line in code if "bootstrap.sh.tftpl" in line or "BEGIN" in line]


def test_bootstrap_installs_with_require_hashes_only() -> None:
    text = BOOTSTRAP.read_text(encoding="utf-8")
    installs = re.findall(r"pip_install (.*)", text)
    hashed = [args for args in installs if "--require-hashes" in args]
    assert any('-r "$dir/requirements.txt"' in args for args in hashed), installs
    assert any('"$HOROVOD_WHEEL_URL"' in args for args in hashed), installs
    assert '--require-hashes --no-deps "$SPOTRING_PACKAGE"' in installs
    assert re.search(r"pip download [^\n]*\\\n\s*--no-build-isolation --require-hashes -r", text)
    # No name installed unchecked but these: the local Horovod tree (--no-deps), and
    # torch where the lock has none (from its index --no-deps; from PyPI with its CUDA
    # tree), each under a warning that says so.
    unchecked = [args for args in installs if "--require-hashes" not in args]
    assert unchecked == [
        '--no-deps --index-url "$TORCH_INDEX_URL" "torch==$TORCH_VERSION"',
        '"torch==$TORCH_VERSION"',
        '--no-build-isolation --no-deps "$src"',
    ], unchecked
    assert text.count("WARNING: the lock has no torch") == 2
    assert "--upgrade" not in text


def _render(overrides: dict[str, str] | None = None) -> str:
    """templatefile() for the plain ${name} placeholders the template uses."""
    values = {
        "role": "worker",
        "ssh_user": "ubuntu",
        "ssh_authorized_keys": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExample driver",
        "torch_version": "2.13.0",
        "torch_index_url": "https://download.pytorch.org/whl/cpu",
        "horovod_version": "0.28.1",
        "horovod_wheel_url": "",
        "horovod_gpu_operations": "",
        "spotring_package": "spotring[aws] @ https://example.com/spotring-0.1.0-py3-none-any.whl#sha256="
        + "b" * 64,
        "region": "us-east-1",
        "group_name": "spot-train",
        "lifecycle_hook_name": "spot-train-bootstrap",
        "job_setup_commands": "true",
        "requirements_lock": LOCK.read_text(encoding="utf-8").rstrip("\r\n"),  # chomp(file())
        **(overrides or {}),
    }
    text = BOOTSTRAP.read_text(encoding="utf-8").replace("$${", "\0")
    text = re.sub(r"\$\{([A-Za-z_]\w*)\}", lambda m: values[m.group(1)], text)
    return text.replace("\0", "${")


def _source(tmp_path: Path, script: str, commands: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "bootstrap.sh"
    path.write_text(script, encoding="utf-8")
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "SPOTRING_VENV": str(tmp_path / "venv"),
        "SPOTRING_BOOTSTRAP_LOG": str(tmp_path / "log" / "bootstrap.log"),
        "SPOTRING_STATE_DIR": str(tmp_path / "state"),
        "CALLS": str(tmp_path / "calls"),
    }
    return subprocess.run(
        ["bash", "-c", f"source {shlex.quote(str(path))}\n{commands}"],
        env=env, capture_output=True, text=True, timeout=30, check=False, cwd=tmp_path,
    )  # fmt: skip


@pytest.mark.parametrize(
    "overrides",
    [
        {"torch_index_url": "http://download.pytorch.org/whl/cpu"},
        {"horovod_wheel_url": "http://example.com/horovod-0.28.1-cp312-cp312-linux_x86_64.whl"},
        {"spotring_package": "spotring[aws] @ http://example.com/spotring-0.1.0.whl"},
        {"spotring_package": "spotring[aws] @ git://example.com/spotring.git"},
        {"spotring_package": "spotring[aws] @ git+https://example.com/spotring.git"},
        {"spotring_package": "spotring[aws]==0.1.0"},
        {"spotring_package": "spotring[aws] @ https://example.com/spotring-0.1.0.whl"},
        {"spotring_package": "https://example.com/spotring-0.1.0.whl#sha256=" + "b" * 63},
    ],
)
def test_bootstrap_refuses_http_urls(tmp_path: Path, overrides: dict[str, str]) -> None:
    """Indexes and wheels over https only, and spotring only as a wheel pip can check
    (its #sha256=): git URLs and index names could not be hash-checked."""
    done = _source(tmp_path, _render(overrides), "require_https")
    assert done.returncode != 0
    assert "http" in done.stderr and "https://" in done.stderr, done.stderr
    assert _source(tmp_path, _render(), "require_https").returncode == 0
    bare = {"spotring_package": "https://example.com/s-0.1.0-py3-none-any.whl#sha256=" + "c" * 64}
    assert _source(tmp_path, _render(bare), "require_https").returncode == 0


def _fake_python(tmp_path: Path, version: str) -> None:
    python = tmp_path / "venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(
        "#!/usr/bin/env bash\n"
        f'if [ "$1" = -c ]; then echo {version}; exit 0; fi\n'
        'echo "$*" >>"$CALLS"\n'
        'for a in "$@"; do [ "$prev" = -r ] && cp "$a" "$CALLS.req"; prev=$a; done\n'
    )
    python.chmod(0o755)


def test_bootstrap_installs_the_lock_with_hash_checking(tmp_path: Path) -> None:
    python = re.search(r"^# python: (\S+)", LOCK.read_text(), re.MULTILINE).group(1)
    _fake_python(tmp_path, python)
    done = _source(tmp_path, _render(), "install_torch")
    assert done.returncode == 0, done.stderr
    first = (tmp_path / "calls").read_text().splitlines()[0]
    assert (
        "-m pip install" in first and "--require-hashes" in first and "--only-binary=:all:" in first
    )
    installed = (tmp_path / "calls.req").read_text().splitlines()
    assert installed == [
        line for line in LOCK.read_text().splitlines() if not line.startswith("horovod==")
    ]


def test_bootstrap_stops_on_a_python_the_lock_does_not_cover(tmp_path: Path) -> None:
    _fake_python(tmp_path, "3.9")
    done = _source(tmp_path, _render(), "install_torch")
    assert done.returncode != 0 and "not 3.9" in done.stderr, done.stderr
    assert not (tmp_path / "calls").exists()


def test_bootstrap_log_is_root_only(tmp_path: Path) -> None:
    steps = (
        "require_https authorize_keys install_system_packages create_venv install_torch "
        "install_spotring install_horovod expose_venv verify run_job_setup complete_lifecycle"
    )
    stubs = "\n".join(f"{step}() {{ :; }}" for step in steps.split())
    done = _source(tmp_path, _render(), f"umask 022\n{stubs}\nmain\numask")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "log" / "bootstrap.log").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "state").stat().st_mode & 0o777 == 0o700
    assert done.stdout.strip().endswith("0022"), "the venv must stay readable by ssh_user"
