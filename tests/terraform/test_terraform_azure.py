"""Static checks of terraform/azure, the spot scale set + driver module for Azure.

No Azure subscription and no `hashicorp/azurerm` provider are at hand, so these tests
parse the module with python-hcl2 (the helpers of tests/terraform/test_terraform.py) and check
what a typo or a drifting contract would break: the spot settings and the Flexible
orchestration of the scale set, no public IP on the workers, ssh keys only, the
driver's custom roles against the actions spotring's Azure provider performs
(``spotring.providers.azure.IAM_ACTIONS``) and the scopes they are assigned at, the
network security group's rules, the bootstrap template's variables, and
``spotring_command`` against the CLI.

Where a `terraform` binary is on PATH, a few checks need no provider and run for real:
`terraform fmt -check`, the variables' validations (``terraform plan`` of a copy of
variables.tf) and the ``spotring_command`` output (evaluated from a copy of its
expression). With SPOTRING_TERRAFORM_TESTS=1 and a provider mirror that holds
hashicorp/azurerm, ``test_terraform_cli`` also runs the module's own `terraform test`.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.terraform import test_terraform as generic
from tests.terraform.support import (
    CHECKPOINT_URIS,
    evaluate,
    evaluate_output,
    needs_terraform,
    only,
    parse_run,
    parse_run_with_checkpoint,
    plan_variables,
    provider_class,
    provider_iam,
    spotring_argv,
    variables_only_copy,
)
from tests.terraform.support import (
    VALID_INPUTS as EVERY_VALID_INPUT,
)
from tests.terraform.test_terraform import (
    _IDENT,
    REPO,
    TERRAFORM,
    Module,
    _function_args,
    _object_keys,
    _resolve_template_path,
    _strings,
    _template_variables,
    _templatefile_calls,
    assert_driver_runs_the_job_unit,
    assert_plan_outcome,
)

AZURE = TERRAFORM / "azure"
BOOTSTRAP = REPO / "worker_image" / "bootstrap.sh.tftpl"

# What spotring's Azure provider calls (providers/azure.py's IAM_ACTIONS, checked to be
# the same: a change there comes with the roles in iam.tf):
# the set's get, update (capacity) and deleteInstances, a Uniform set's VM and NIC lists,
# a Flexible set's members as ordinary VMs (list, delete) and NICs (list), the
# resource SKU list (GPU counts of VM sizes) and a scale-out's operation status.
ASSUMED_IAM_ACTIONS = frozenset(
    {
        "Microsoft.Compute/virtualMachineScaleSets/read",
        "Microsoft.Compute/virtualMachineScaleSets/write",
        "Microsoft.Compute/virtualMachineScaleSets/delete/action",
        "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read",
        "Microsoft.Compute/virtualMachineScaleSets/networkInterfaces/read",
        "Microsoft.Compute/virtualMachines/read",
        "Microsoft.Compute/virtualMachines/delete",
        "Microsoft.Network/networkInterfaces/read",
        "Microsoft.Compute/skus/read",
        "Microsoft.Compute/locations/operations/read",
    }
)
SLOTS_TAG = "spotring-slots"

SET = "azurerm_orchestrated_virtual_machine_scale_set"
SET_ID = f"${{{SET}.workers.id}}"
RG_ID = "${azurerm_resource_group.cluster.id}"
SUBSCRIPTION_SCOPE = "${local.subscription_scope}"
DRIVER_PRINCIPAL = "${local.driver_principal}"
# Where each custom role is assigned, and which actions may sit in it.
ROLE_SCOPES = {"driver_set": SET_ID, "driver_members": RG_ID, "driver_sizes": SUBSCRIPTION_SCOPE}
# Any source that means "everywhere" in an Azure security rule.
EVERYWHERE = {"*", "internet", "any", "0.0.0.0/0", "0.0.0.0", "::/0"}

VALID_INPUTS = EVERY_VALID_INPUT["azure"]
SUBSCRIPTION = VALID_INPUTS["subscription_id"]


@pytest.fixture(scope="module")
def azure() -> Module:
    return Module(AZURE)


# ------------------------------------------------------------------ the module as a whole


def test_every_variable_has_a_validation_or_is_free_form(azure: Module) -> None:
    """Inputs that reach names, the network or the bootstrap are validated."""
    free_form = {
        "accelerated_networking_enabled",  # bool
        "encryption_at_host_enabled",  # bool
        "driver_trusted_launch",  # bool
        "driver_public_ip",  # bool
        "image",  # typed object; Azure refuses unknown images
        "train_command",  # only printed in spotring_command
    }
    for name, body in azure.variables.items():
        if name in free_form:
            continue
        assert body.get("validation"), f"variable {name} has no validation"


def test_azurerm_provider_is_pinned_to_4(azure: Module) -> None:
    assert azure.required_providers == {"azurerm"}, azure.required_providers
    doc = generic._parse(AZURE / "versions.tf")
    (block,) = doc["terraform"]
    (providers,) = block["required_providers"]
    azurerm = providers["azurerm"]
    assert azurerm["source"] == "hashicorp/azurerm"
    bounds = [b.strip() for b in azurerm["version"].split(",")]
    lower = [b for b in bounds if b.startswith(">=")]
    upper = [b for b in bounds if b.startswith("<")]
    # The attribute names in the module are 4.x's (accelerated_networking_enabled, ...).
    assert lower and int(lower[0][2:].strip().split(".")[0]) == 4, azurerm["version"]
    assert upper and upper[0].replace(" ", "") == "<5.0", azurerm["version"]
    (provider,) = [p["azurerm"] for p in azure.providers if "azurerm" in p]
    assert provider["subscription_id"] == "${var.subscription_id}"
    assert "features" in provider


def test_no_autoscale_setting(azure: Module) -> None:
    """spotring sizes the set itself; an autoscale setting would fight it over the size."""
    kinds = {kind for kind, _ in azure.resources}
    assert "azurerm_monitor_autoscale_setting" not in kinds
    text = (AZURE / "workers.tf").read_text(encoding="utf-8")
    assert "No autoscale setting" in text, "say why there is none next to the scale set"


# ------------------------------------------------------------------ workers


def test_workers_are_spot_vms_deleted_when_evicted(azure: Module) -> None:
    workers = azure.resource(SET, "workers")
    assert workers["priority"] == "Spot"
    assert workers["eviction_policy"] == "Delete"
    assert workers["max_bid_price"] == -1
    assert "priority_mix" not in workers, "every worker is spot"


def test_flexible_orchestration_sized_by_spotring(azure: Module) -> None:
    kinds = {kind for kind, _ in azure.resources}
    # The uniform-mode resources are not used; azurerm's orchestrated set is Flexible.
    assert not kinds & {
        "azurerm_linux_virtual_machine_scale_set",
        "azurerm_windows_virtual_machine_scale_set",
        "azurerm_virtual_machine_scale_set",
    }, kinds
    workers = azure.resource(SET, "workers")
    assert workers["platform_fault_domain_count"] == 1
    assert workers["name"] == "${var.name}"
    assert workers["resource_group_name"] == "${azurerm_resource_group.cluster.name}"
    assert workers["instances"] == "${var.worker_count}"
    (lifecycle,) = workers["lifecycle"]
    assert "instances" in lifecycle["ignore_changes"], "a later apply would undo spotring's size"
    conditions = [p["condition"] for p in lifecycle.get("precondition", [])]
    assert any("var.max_worker_count" in c and "var.min_worker_count" in c for c in conditions)
    assert workers["sku_name"] == "${var.vm_size}"


def test_workers_have_no_public_ip(azure: Module) -> None:
    workers = azure.resource(SET, "workers")
    (nic,) = workers["network_interface"]
    assert nic.get("ip_forwarding_enabled", False) is False
    (ip,) = nic["ip_configuration"]
    assert "public_ip_address" not in ip and "dynamic" not in ip, ip
    assert ip["subnet_id"] == "${azurerm_subnet.cluster.id}"
    text = " ".join(_strings(workers))
    assert "azurerm_public_ip" not in text


def test_workers_have_no_identity_without_checkpoints(azure: Module) -> None:
    """Workers make no Azure API call but the checkpoints' (checkpoint_uri): no managed
    identity without them, and then one that holds only the container's role."""
    workers = azure.resource(SET, "workers")
    assert "identity" not in workers
    (identity,) = [d["identity"] for d in workers["dynamic"] if "identity" in d]
    assert identity["for_each"] == (
        "${local.checkpoints ? [azurerm_user_assigned_identity.workers[0].id] : []}"
    )
    assert identity["content"] == [{"type": "UserAssigned", "identity_ids": ["${identity.value}"]}]
    assert azure.resource("azurerm_user_assigned_identity", "workers")["count"] == CHECKPOINTS_ONLY
    principal = "${azurerm_user_assigned_identity.workers[0].principal_id}"
    assigned = [
        a for _, a in only(azure, "azurerm_role_assignment") if a["principal_id"] == principal
    ]
    assert assigned == [azure.resource("azurerm_role_assignment", "workers_checkpoints")]


def _linux_settings(azure: Module, site: str) -> dict[str, Any]:
    if site == "workers":
        (profile,) = azure.resource(SET, "workers")["os_profile"]
        (linux,) = profile["linux_configuration"]
        return linux
    return azure.resource("azurerm_linux_virtual_machine", "driver")


@pytest.mark.parametrize("site", ["workers", "driver"])
def test_ssh_keys_only(azure: Module, site: str) -> None:
    settings = _linux_settings(azure, site)
    assert settings["disable_password_authentication"] is True
    assert "admin_password" not in settings
    assert settings["admin_username"] == "${var.ssh_user}"
    assert "admin_ssh_key" not in settings, "keys come from ssh_public_keys (a dynamic block)"
    (keys,) = [d["admin_ssh_key"] for d in settings["dynamic"] if "admin_ssh_key" in d]
    assert keys["for_each"] in ("${var.ssh_public_keys}", "${toset(var.ssh_public_keys)}")
    (content,) = keys["content"]
    assert content == {"username": "${var.ssh_user}", "public_key": "${admin_ssh_key.value}"}
    assert "default" not in azure.variables["ssh_public_keys"]


def test_no_vm_extensions(azure: Module) -> None:
    workers = azure.resource(SET, "workers")
    assert workers["extension_operations_enabled"] is False and "extension" not in workers
    driver = azure.resource("azurerm_linux_virtual_machine", "driver")
    assert driver["allow_extension_operations"] is False
    kinds = {kind for kind, _ in azure.resources}
    assert not {k for k in kinds if "extension" in k}, kinds


def test_slots_tag_is_set_on_the_scale_set(azure: Module) -> None:
    workers = azure.resource(SET, "workers")
    tags = workers["tags"]
    slots = rf'"{SLOTS_TAG}" = tostring\(var\.slots_per_host\)'
    assert re.fullmatch(rf"\$\{{merge\(local\.tags, \{{\s*{slots}\s*\}}\)\}}", tags), tags
    assert azure.variables["slots_per_host"]["default"] == 1
    label = getattr(provider_class("azure"), "default_slots_label", SLOTS_TAG)
    assert label == SLOTS_TAG, f"the provider reads {label!r}, the module writes {SLOTS_TAG}"


def test_gpus_are_a_matter_of_size_and_image(azure: Module) -> None:
    """GPU sizes need only vm_size, slots_per_host and an image with the driver."""
    workers = azure.resource(SET, "workers")
    assert workers["source_image_id"] == "${var.source_image_id}"
    (image,) = [
        d["source_image_reference"] for d in workers["dynamic"] if "source_image_reference" in d
    ]
    assert image["for_each"] == "${var.source_image_id == null ? [var.image] : []}"
    assert azure.variables["source_image_id"]["default"] is None
    assert azure.variables["horovod_gpu_operations"]["default"] == ""


# ------------------------------------------------------------------ driver and IAM


def _expected_actions() -> tuple[frozenset[str], str]:
    return provider_iam("azure", "IAM_ACTIONS")


def _roles(azure: Module) -> dict[str, list[str]]:
    """The driver's custom roles (not the checkpoints' data role)."""
    roles = {}
    for name, body in only(azure, "azurerm_role_definition"):
        if name == "checkpoints":
            continue
        (permissions,) = body["permissions"]
        assert not permissions.get("not_actions"), f"{name}: use actions, not not_actions"
        assert not permissions.get("data_actions"), f"{name}: no data actions"
        roles[name] = permissions["actions"]
    return roles


def _assignments(azure: Module) -> dict[str, dict]:
    """The driver's custom roles' assignments (not the checkpoints' built-in role)."""
    return {
        name: body
        for name, body in only(azure, "azurerm_role_assignment")
        if name not in CHECKPOINT_ASSIGNMENTS
    }


def _assigned_role(assignment: dict) -> str:
    match = re.fullmatch(
        rf"\$\{{azurerm_role_definition\.({_IDENT})\.role_definition_resource_id\}}",
        assignment.get("role_definition_id", ""),
    )
    assert match, f"assign a custom role of the module, not {assignment}"
    return match.group(1)


def test_custom_roles_grant_exactly_the_provider_actions(azure: Module) -> None:
    expected, source = _expected_actions()
    roles = _roles(azure)
    granted = [action for actions in roles.values() for action in actions]
    assert len(granted) == len(set(granted)), f"an action sits in two roles: {granted}"
    assert set(granted) == expected, (
        f"driver custom roles vs {source}: missing {sorted(expected - set(granted))}, "
        f"extra {sorted(set(granted) - expected)}"
    )
    for action in granted:
        assert "*" not in action, f"wildcard action {action!r}"
        assert re.fullmatch(r"Microsoft\.[A-Za-z]+(/[A-Za-z]+)+", action), action


def test_role_actions_match_the_provider_module(azure: Module) -> None:
    """The roles against the provider's own list, and that list against ours."""
    actions, _ = _expected_actions()
    assert frozenset(a for r in _roles(azure).values() for a in r) == actions
    assert actions == ASSUMED_IAM_ACTIONS, (
        "the provider's IAM_ACTIONS changed: update ASSUMED_IAM_ACTIONS, iam.tf and the "
        "module's README.md"
    )


def test_roles_are_assigned_at_the_narrowest_scope(azure: Module) -> None:
    roles = _roles(azure)
    assignments = _assignments(azure)
    assert set(roles) == set(ROLE_SCOPES), set(roles)
    assigned = {}
    for name, assignment in assignments.items():
        role = _assigned_role(assignment)
        assert assignment["principal_id"] == DRIVER_PRINCIPAL, name
        assert assignment.get("principal_type") == "ServicePrincipal", name
        assert "role_definition_name" not in assignment, f"{name}: a built-in role"
        assigned[role] = assignment["scope"]
    assert assigned == ROLE_SCOPES, assigned
    # The set's own actions act on the set; the members' on the group's VMs and NICs;
    # the SKU list is a subscription-level call.
    set_prefix = "Microsoft.Compute/virtualMachineScaleSets/"
    assert all(a.startswith(set_prefix) for a in roles["driver_set"])
    assert not any("virtualMachineScaleSets" in a for a in roles["driver_members"])
    assert roles["driver_sizes"] == [
        "Microsoft.Compute/skus/read",
        "Microsoft.Compute/locations/operations/read",
    ]
    for name, body in only(azure, "azurerm_role_definition"):
        if name == "checkpoints":
            continue
        scope = SUBSCRIPTION_SCOPE if name == "driver_sizes" else RG_ID
        assert body["scope"] == scope and body["assignable_scopes"] == [scope], name
    assert azure.locals["subscription_scope"] == "/subscriptions/${var.subscription_id}"
    assert azure.locals["driver_principal"] == (
        "${azurerm_linux_virtual_machine.driver.identity[0].principal_id}"
    )
    iam = (AZURE / "iam.tf").read_text(encoding="utf-8")
    assert "narrowest scope" in iam and "subscription-level call" in iam, (
        "say next to the roles why each is assigned where it is"
    )


def test_resource_group_is_the_modules_own(azure: Module) -> None:
    """The members' role covers every VM in the group: the group must be a new one."""
    group = azure.resource("azurerm_resource_group", "cluster")
    assert group["name"] == "${local.resource_group_name}"
    assert not azure.data, f"no existing resources are looked up: {list(azure.data)}"
    for (kind, name), body in azure.resources.items():
        if "resource_group_name" in body:
            assert body["resource_group_name"] == "${azurerm_resource_group.cluster.name}", (
                kind,
                name,
            )


def test_driver_is_on_demand_with_a_managed_identity(azure: Module) -> None:
    driver = azure.resource("azurerm_linux_virtual_machine", "driver")
    (identity,) = driver["identity"]
    assert identity["type"] == "SystemAssigned"
    assert driver.get("priority", "Regular") == "Regular" and "eviction_policy" not in driver
    assert driver["network_interface_ids"] == ["${azurerm_network_interface.driver.id}"]
    nic = azure.resource("azurerm_network_interface", "driver")
    (ip,) = nic["ip_configuration"]
    assert ip["public_ip_address_id"] == (
        "${var.driver_public_ip ? azurerm_public_ip.driver[0].id : null}"
    )
    assert azure.resource("azurerm_public_ip", "driver")["count"] == (
        "${var.driver_public_ip ? 1 : 0}"
    )
    assert azure.variables["driver_public_ip"]["default"] is False
    # A changed bootstrap must not replace a running driver (custom_data forces one).
    (lifecycle,) = driver["lifecycle"]
    assert "custom_data" in lifecycle["ignore_changes"]


# ------------------------------------------------------------------ network


def _everywhere(prefix: Any) -> bool:
    values = prefix if isinstance(prefix, list) else [prefix]
    return any(str(v).lower() in EVERYWHERE or str(v).endswith("/0") for v in values)


def test_security_group_allows_the_network_and_ssh_to_the_driver_only(azure: Module) -> None:
    nsg = azure.resource("azurerm_network_security_group", "cluster")
    assert "security_rule" not in nsg and "dynamic" not in nsg, "rules are separate resources"
    association = azure.resource("azurerm_subnet_network_security_group_association", "cluster")
    assert association == {
        "subnet_id": "${azurerm_subnet.cluster.id}",
        "network_security_group_id": "${azurerm_network_security_group.cluster.id}",
    }
    rules = dict(only(azure, "azurerm_network_security_rule"))
    assert set(rules) == {"cluster_internal", "driver_ssh", "deny_other_inbound"}, set(rules)
    for name, rule in rules.items():
        assert rule["network_security_group_name"] == (
            "${azurerm_network_security_group.cluster.name}"
        ), name
        assert rule["direction"] == "Inbound", name
        if rule["access"] == "Allow":
            sources = rule.get("source_address_prefix", rule.get("source_address_prefixes"))
            assert sources is not None and not _everywhere(sources), (name, sources)
            assert "source_application_security_group_ids" not in rule, name

    internal = rules["cluster_internal"]
    assert internal["source_address_prefix"] == "${var.address_space}"
    assert internal["destination_address_prefix"] == "${var.address_space}"
    vnet = azure.resource("azurerm_virtual_network", "cluster")
    subnet = azure.resource("azurerm_subnet", "cluster")
    assert vnet["address_space"] == ["${var.address_space}"]
    assert subnet["address_prefixes"] == ["${var.address_space}"]

    ssh = rules["driver_ssh"]
    assert ssh["source_address_prefixes"] == "${var.admin_cidrs}"
    assert (ssh["protocol"], ssh["destination_port_range"]) == ("Tcp", "22")
    assert ssh["destination_application_security_group_ids"] == [
        "${azurerm_application_security_group.driver.id}"
    ]
    # No rule at all without admin_cidrs.
    assert ssh["count"] == "${length(var.admin_cidrs) > 0 ? 1 : 0}"
    (member,) = only(azure, "azurerm_network_interface_application_security_group_association")
    assert member[1]["network_interface_id"] == "${azurerm_network_interface.driver.id}"
    assert "default" not in azure.variables["admin_cidrs"], "admin_cidrs must have no default"
    condition = azure.variables["admin_cidrs"]["validation"][0]["condition"]
    assert 'split("/", c)[1]) >= 8' in condition and "internet" in condition.lower()

    deny = rules["deny_other_inbound"]
    assert (deny["access"], deny["source_address_prefix"], deny["protocol"]) == ("Deny", "*", "*")
    allows = [r["priority"] for r in rules.values() if r["access"] == "Allow"]
    assert deny["priority"] > max(allows), "the deny rule must come after the allow rules"
    assert deny["priority"] < 65000, "it must come before Azure's default AllowVnetInBound"


def test_private_subnet_with_a_nat_gateway(azure: Module) -> None:
    subnet = azure.resource("azurerm_subnet", "cluster")
    assert subnet["default_outbound_access_enabled"] is False
    nat = azure.resource("azurerm_subnet_nat_gateway_association", "cluster")
    assert nat == {
        "subnet_id": "${azurerm_subnet.cluster.id}",
        "nat_gateway_id": "${azurerm_nat_gateway.nat.id}",
    }
    ip = azure.resource("azurerm_nat_gateway_public_ip_association", "nat")
    assert ip["public_ip_address_id"] == "${azurerm_public_ip.nat.id}"
    # The bootstrap downloads at first boot: no VM before the subnet can get out.
    for rtype, name in ((SET, "workers"), ("azurerm_linux_virtual_machine", "driver")):
        depends = azure.resource(rtype, name).get("depends_on", [])
        assert "${azurerm_subnet_nat_gateway_association.cluster}" in depends, (rtype, depends)


# ------------------------------------------------------------------ the bootstrap


def _custom_data(azure: Module) -> dict[str, str]:
    (profile,) = azure.resource(SET, "workers")["os_profile"]
    return {
        "workers": profile["custom_data"],
        "driver": azure.resource("azurerm_linux_virtual_machine", "driver")["custom_data"],
    }


def test_custom_data_renders_the_bootstrap_with_every_variable(azure: Module) -> None:
    calls = _templatefile_calls(azure)
    assert {w for w, _ in calls} == {f"{SET}.workers", "azurerm_linux_virtual_machine.driver"}
    for site, args in calls:
        assert len(args) == 2, f"{site}: templatefile({args})"
        path = _resolve_template_path(azure, args[0])
        assert path.resolve() == BOOTSTRAP.resolve()
        wanted = _template_variables(path)
        passed = _object_keys(args[1])
        assert not wanted - passed, f"{site}: template variables not passed: {wanted - passed}"
        assert not passed - wanted, f"{site}: passed but unused by the template: {passed - wanted}"
        # No launch lifecycle hook on Azure: the template's AWS-only step must be a no-op.
        assert re.search(r'lifecycle_hook_name\s*[=:]\s*""', args[1]), args[1]
        assert re.search(r"group_name\s*[=:]\s*var\.name\b", args[1])
        assert re.search(r"region\s*[=:]\s*var\.location\b", args[1])
    for site, data in _custom_data(azure).items():
        # Custom data is base64 (the API takes nothing else); the driver's bootstrap is
        # followed by the job unit's installer (test_driver_runs_the_job_unit).
        start = "${base64encode(templatefile(" if site == "workers" else "${base64encode(join("
        assert data.startswith(start), (site, data[:60])
        (args,) = _function_args(data, "templatefile")
        role = "worker" if site == "workers" else "driver"
        assert re.search(rf'role\s*[=:]\s*"{role}"', args[1]), (site, args[1])


worker_image = pytest.importorskip("tests.unit.test_worker_image")
AZURE_VARS = {
    **worker_image.WORKER_VARS,
    "region": "eastus",
    "lifecycle_hook_name": "",
    "spotring_package": "spotring[azure] @ https://example.com/spotring-0.1.0-py3-none-any.whl#sha256="
    + "b" * 64,
}


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_rendered_bootstrap_is_valid_bash_and_never_touches_aws(tmp_path: Path) -> None:
    path = tmp_path / "bootstrap.sh"
    path.write_text(worker_image.render(AZURE_VARS), encoding="utf-8")
    done = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    bin_dir = tmp_path / "bin"
    worker_image._executable(bin_dir / "curl", 'echo "curl $*" >>"$CALLS"\nexit 22\n')
    worker_image._executable(tmp_path / "venv" / "bin" / "python", 'echo "python $*" >>"$CALLS"\n')
    env = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    stubs = worker_image._stub_steps().replace(
        'complete_lifecycle() { echo "complete_lifecycle $1" >>"$CALLS"; }', ""
    )
    done = worker_image.run_sourced(path, stubs + "\nmain", tmp_path, env)
    assert done.returncode == 0, done.stderr
    assert worker_image.calls(tmp_path) == worker_image.STEPS  # no curl, no boto3


def test_apt_waits_for_the_first_boot_updates() -> None:
    """cloud-init runs custom data while the image's own apt jobs may hold the lock."""
    text = BOOTSTRAP.read_text(encoding="utf-8")
    for line in (ln.strip() for ln in text.splitlines()):
        if line.startswith("apt-get ") and ("update" in line or "install" in line):
            assert "DPkg::Lock::Timeout=" in line, line


# ------------------------------------------------------------------ spotring_command


def test_outputs(azure: Module) -> None:
    outputs = azure.outputs
    assert outputs["scale_set_name"]["value"] == f"${{{SET}.workers.name}}"
    assert outputs["resource_group_name"]["value"] == "${azurerm_resource_group.cluster.name}"
    assert outputs["subscription_id"]["value"] == "${var.subscription_id}"
    assert {"driver_private_ip", "driver_public_ip", "spotring_command"} <= set(outputs)
    assert outputs["worker_identity_client_id"]["value"] == (
        "${local.checkpoints ? azurerm_user_assigned_identity.workers[0].client_id : null}"
    )


def test_spotring_command_shape(azure: Module) -> None:
    argv = spotring_argv(azure)
    assert argv[:4] == ["spotring", "run", "--provider", "azure"]
    assert "--" in argv and argv[argv.index("--") + 1 :], "no training command after --"
    command = azure.outputs["spotring_command"]["value"]
    for flag, ref in (
        ("--group", f"{SET}.workers.name"),
        ("--resource-group", "azurerm_resource_group.cluster.name"),
        ("--subscription", "var.subscription_id"),
        ("-np", "var.worker_count"),
        ("--min-np", "var.min_worker_count"),
        ("--max-np", "var.max_worker_count"),
    ):
        assert re.search(rf"{re.escape(flag)} \$\{{[^}}]*{re.escape(ref)}", command), (
            flag,
            command,
        )


def _parse_run(argv: list[str]) -> Any:
    return parse_run("azure", argv)


def test_spotring_command_parses_with_the_cli(azure: Module) -> None:
    options = _parse_run(spotring_argv(azure)[1:])
    assert options.command == "run"
    assert options.provider == "azure"
    assert options.num_proc == 2 and options.min_num_proc == 2 and options.max_num_proc == 2
    values = vars(options)
    for what in ("group", "resource_group", "subscription"):
        assert values.get(f"azure_{what}") == "2" or any(
            key.endswith(what) and value == "2" for key, value in values.items()
        ), (what, values)


# ------------------------------------------------------------------ durable checkpoints

CHECKPOINTS_ONLY = "${local.checkpoints ? 1 : 0}"
CHECKPOINT_ASSIGNMENTS = {
    "workers_checkpoints": "${azurerm_user_assigned_identity.workers[0].principal_id}",
    "driver_checkpoints": DRIVER_PRINCIPAL,
}
STORAGE_ACCOUNT_ID = (
    "/subscriptions/11111111-1111-1111-1111-111111111111/resourceGroups/rg-data/providers/"
    "Microsoft.Storage/storageAccounts/ckptaccount"
)


BLOBS = "Microsoft.Storage/storageAccounts/blobServices/containers/blobs"
CHECKPOINT_DATA_ACTIONS = {f"{BLOBS}/{a}" for a in ("read", "write", "add/action", "delete")}


def test_checkpoint_roles_are_on_the_container_only_with_checkpoint_uri(azure: Module) -> None:
    role = azure.resource("azurerm_role_definition", "checkpoints")
    assert role["count"] == CHECKPOINTS_ONLY
    (permissions,) = role["permissions"]
    assert permissions["actions"] == [] and not permissions.get("not_data_actions")
    granted = {
        a.replace("${local.blobs}", azure.locals["blobs"]) for a in permissions["data_actions"]
    }
    assert granted == CHECKPOINT_DATA_ACTIONS
    (lifecycle,) = role["lifecycle"]
    conditions = " ".join(c["condition"] for c in lifecycle["precondition"])
    assert "var.checkpoint_storage_account_id != null" in conditions
    assert "/storageAccounts/${local.checkpoint_location[0]}" in conditions
    for name, principal in CHECKPOINT_ASSIGNMENTS.items():
        assignment = azure.resource("azurerm_role_assignment", name)
        assert assignment["count"] == CHECKPOINTS_ONLY, name
        assert assignment["principal_id"] == principal, name
        assert assignment["principal_type"] == "ServicePrincipal", name
        assert "role_definition_name" not in assignment, f"{name}: a built-in role"
        assert assignment["role_definition_id"] == (
            "${azurerm_role_definition.checkpoints[0].role_definition_resource_id}"
        ), name
        assert assignment["scope"] == "${local.checkpoint_container_scope}", name
        assert assignment["condition_version"] == "2.0", name
        who = name.split("_")[0]
        assert assignment["condition"] == f"${{local.{who}_checkpoint_condition}}", name
    assert azure.locals["checkpoint_container_scope"] == (
        "${local.checkpoint_account_id}/blobServices/default/containers/"
        "${local.checkpoint_location[1]}"
    )
    # No storage action in the driver's own roles.
    for name, body in only(azure, "azurerm_role_definition"):
        (permissions,) = body["permissions"]
        assert not [a for a in permissions["actions"] if "Storage" in a], name


_ABAC_TOKEN = re.compile(
    r"\s*(?:(?P<paren>[()])|(?P<word>AND|OR|NOT)\b|(?P<bang>!)"
    r"|(?P<match>ActionMatches|SubOperationMatches)\{'(?P<matched>[^']*)'\}"
    r"|@(?P<source>Resource|Request)\[(?P<attribute>[^\]]+)\]\s+"
    r"(?P<operator>StringStartsWith|StringEquals)\s+'(?P<value>[^']*)')"
)


def abac_allows(condition: str, request: dict[str, str]) -> bool:
    """Whether an Azure role assignment condition (the subset the module writes:
    ActionMatches, SubOperationMatches, StringStartsWith and StringEquals on @Resource
    and @Request attributes, !, NOT, AND, OR, parentheses) lets ``request`` through.
    ``request``: its action, its suboperation if any, and the attributes it carries
    ("path" for a blob's operations, "prefix" for List Blobs). An attribute a request
    does not carry fails its test, as Azure's "Actions and attributes for Azure role
    assignment conditions for Azure Blob Storage" says of List Blobs and the path."""
    tokens = []
    at = 0
    while condition[at:].strip():
        token = _ABAC_TOKEN.match(condition, at)
        assert token, f"cannot read the condition at {condition[at : at + 60]!r}"
        tokens.append(token)
        at = token.end()
    position = 0

    def peek() -> str:
        if position == len(tokens):
            return ""
        token = tokens[position]
        return token["paren"] or token["word"] or token["bang"] or ""

    def either() -> bool:
        nonlocal position
        value = both()
        while peek() == "OR":
            position += 1
            value = both() or value
        return value

    def both() -> bool:
        nonlocal position
        value = single()
        while peek() == "AND":
            position += 1
            value = single() and value
        return value

    def single() -> bool:
        nonlocal position
        token = tokens[position]
        position += 1
        if token["bang"] or token["word"] == "NOT":
            return not single()
        if token["paren"] == "(":
            value = either()
            assert peek() == ")", "unbalanced parentheses"
            position += 1
            return value
        if token["match"] == "ActionMatches":
            return request["action"] == token["matched"]
        if token["match"] == "SubOperationMatches":
            return request.get("suboperation") == token["matched"]
        assert token["source"], f"unexpected {token.group(0)!r}"
        name = token["attribute"].rpartition(":")[2]
        assert token["attribute"] == f"{BLOBS}:{name}", token["attribute"]
        assert (token["source"], name) in {("Resource", "path"), ("Request", "prefix")}
        value = request.get(name)
        if value is None:
            return False
        if token["operator"] == "StringEquals":
            return value == token["value"]
        return value.startswith(token["value"])

    allowed = either()
    assert position == len(tokens), "trailing tokens"
    return allowed


def _blob_request(operation: str, name: str) -> dict[str, str]:
    """What the storage layer's calls are to Azure RBAC: action, suboperation and
    attributes (Azure's "Permissions for Blob service operations")."""
    if operation == "list":
        return {"action": f"{BLOBS}/read", "suboperation": "Blob.List", "prefix": name}
    action = {"get": "read", "put": "write", "create": "add/action", "delete": "delete"}
    return {"action": f"{BLOBS}/{action[operation]}", "path": name}


# Who may do what: the storage layer's calls under PREFIX (runs/spot-train), and what
# lies next to it.
CHECKPOINT_ACCESS = [
    # (operation, blob name or list prefix, workers allowed, driver allowed)
    ("get", "runs/spot-train/step-48/manifest.json", True, True),
    ("list", "runs/spot-train/", True, True),
    ("list", "runs/spot-train/step-", True, True),
    ("put", "runs/spot-train/step-48/shard-0", True, False),
    ("create", "runs/spot-train/step-48/shard-0", True, False),
    ("delete", "runs/spot-train/step-47/shard-0", True, False),
    ("put", "runs/spot-train/lock.json", True, True),
    ("create", "runs/spot-train/lock.json", True, True),
    ("delete", "runs/spot-train/lock.json", True, True),
    ("get", "runs/other-job/manifest.json", False, False),
    ("get", "runs/spot-train2/manifest.json", False, False),  # a sibling prefix
    ("list", "", False, False),
    ("list", "runs/", False, False),
    ("put", "runs/other-job/lock.json", False, False),
    ("delete", "runs/spot-train2/x", False, False),
    ("put", "lock.json", False, False),
]


@needs_terraform
def test_checkpoint_conditions_confine_each_identity_to_the_prefix(
    azure: Module, tmp_path: Path
) -> None:
    """The conditions, evaluated by Terraform for a checkpoint_uri, let the workers read,
    list, write and delete under PREFIX/ and the driver read and list there but write
    only PREFIX/lock.json; nothing outside PREFIX/ (a sibling prefix included)."""
    values = evaluate(
        azure,
        tmp_path,
        {
            **VALID_INPUTS,
            "checkpoint_uri": CHECKPOINT_URIS["azure"] + "/",
            "checkpoint_storage_account_id": STORAGE_ACCOUNT_ID,
        },
        {
            "workers": "local.workers_checkpoint_condition",
            "driver": "local.driver_checkpoint_condition",
            "group": "local.checkpoint_account_group",
        },
    )
    assert values["group"] == STORAGE_ACCOUNT_ID.split("/providers/")[0]
    for operation, name, workers, driver in CHECKPOINT_ACCESS:
        request = _blob_request(operation, name)
        assert request["action"] in CHECKPOINT_DATA_ACTIONS
        allowed = {who: abac_allows(values[who], request) for who in ("workers", "driver")}
        assert allowed == {"workers": workers, "driver": driver}, (operation, name)


@needs_terraform
@pytest.mark.parametrize("suffix", ["", "/"])
def test_checkpoint_scope_is_the_container(azure: Module, tmp_path: Path, suffix: str) -> None:
    values = evaluate(
        azure,
        tmp_path,
        {
            **VALID_INPUTS,
            "checkpoint_uri": CHECKPOINT_URIS["azure"] + suffix,
            "checkpoint_storage_account_id": STORAGE_ACCOUNT_ID,
        },
        {"scope": "local.checkpoint_container_scope", "account": "local.checkpoint_location[0]"},
    )
    assert values == {
        "scope": f"{STORAGE_ACCOUNT_ID}/blobServices/default/containers/checkpoints",
        "account": "ckptaccount",
    }


# ------------------------------------------------------------------ the job under systemd


def test_driver_runs_the_job_unit(azure: Module) -> None:
    driver = azure.resource("azurerm_linux_virtual_machine", "driver")
    assert_driver_runs_the_job_unit(azure, "azure", driver["custom_data"])
    journal = azure.outputs["driver_journal_command"]["value"]
    assert "ssh -t ${var.ssh_user}@${coalesce(" in journal


# ------------------------------------------------------------------ terraform itself
# These need the binary but no provider: they run wherever `terraform` is on PATH.


@pytest.fixture(scope="module")
def variables_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of variables.tf alone: `terraform plan` there checks the validations."""
    return variables_only_copy(tmp_path_factory, AZURE)


def test_valid_inputs_pass_the_validations(variables_only: Path) -> None:
    done = plan_variables(variables_only, VALID_INPUTS)
    assert done.returncode == 0, done.stdout + done.stderr
    done = plan_variables(
        variables_only,
        {
            **VALID_INPUTS,
            "admin_cidrs": [],
            "zones": ["1", "3"],
            "vm_size": "Standard_NC4as_T4_v3",
            "slots_per_host": 1,
            "resource_group_name": "rg-spot_train.1",
            "source_image_id": "/subscriptions/x/resourceGroups/y/providers/"
            "Microsoft.Compute/galleries/g/images/cuda/versions/1.0.0",
            "ssh_public_keys": ["ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAABAQExample admin@laptop"],
        },
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("admin_cidrs", ["0.0.0.0/0"]),
        ("admin_cidrs", ["203.0.113.7/32", "10.0.0.0/0"]),
        ("admin_cidrs", ["0.0.0.0/1", "128.0.0.0/1"]),  # the internet without a /0
        ("admin_cidrs", ["10.0.0.0/7"]),
        ("admin_cidrs", ["*"]),
        ("admin_cidrs", ["Internet"]),
        ("admin_cidrs", ["2001:db8::/32"]),
        ("spotring_package", "spotring @ https://example.com/spotring-0.1.0-py3-none-any.whl"),
        ("spotring_package", "spotring[gcp] @ https://example.com/x.whl"),
        ("spotring_package", "spotring[azure]' ; rm -rf / '"),
        ("subscription_id", "my-subscription"),
        ("location", "East US"),
        ("name", "Spot_Train"),
        ("name", "a-name-that-is-too-long-for-it"),
        ("resource_group_name", "ends-with-a-period."),
        ("zones", ["us-east-1a"]),
        ("zones", ["1", "1"]),
        ("vm_size", "n2-standard-8"),
        ("slots_per_host", 0),
        ("max_worker_count", 1001),
        ("os_disk_type", "pd-ssd"),
        ("address_space", "10.42.0.0"),
        ("ssh_public_keys", ["-----BEGIN OPENSSH PRIVATE KEY-----"]),
        ("ssh_public_keys", ["ecdsa-sha2-nistp256 AAAAE2VjZHNhExample x@y"]),
        ("ssh_public_keys", []),
        ("ssh_user", "root"),
        ("ssh_user", "admin"),
        ("source_image_id", "ubuntu-24_04-lts"),
        ("tags", {"spotring-slots": "8"}),
        ("checkpoint_uri", "https://ckptaccount.blob.core.windows.net/checkpoints"),
        ("checkpoint_uri", "https://ckptaccount.blob.core.windows.net/check--points/runs"),
        ("checkpoint_uri", "https://CkptAccount.blob.core.windows.net/checkpoints/runs"),
        ("checkpoint_uri", "https://ckptaccount.blob.core.windows.net.evil.example/ckpt/runs"),
        ("checkpoint_uri", "http://ckptaccount.blob.core.windows.net/checkpoints/runs"),
        ("checkpoint_uri", "s3://ckpt-bucket/runs"),
        ("checkpoint_storage_account_id", "ckptaccount"),
        ("checkpoint_storage_account_id", STORAGE_ACCOUNT_ID + "/blobServices/default"),
        ("job_command", ["python", "train.py\n"]),
        ("job_args", ["--"]),
        ("job_working_directory", "train"),
    ],
)
def test_bad_inputs_are_refused(variables_only: Path, variable: str, value: Any) -> None:
    done = plan_variables(variables_only, {**VALID_INPUTS, variable: value})
    assert done.returncode != 0, f"{variable} = {value!r} passed the validations"
    assert f"var.{variable}" in done.stderr, done.stderr


@pytest.mark.parametrize(
    ("overrides", "refused"),
    [
        (
            {
                "checkpoint_uri": CHECKPOINT_URIS["azure"],
                "checkpoint_storage_account_id": STORAGE_ACCOUNT_ID,
            },
            None,
        ),
        ({"checkpoint_uri": CHECKPOINT_URIS["azure"] + "/"}, None),
    ],
)
def test_job_and_checkpoint_validations(
    variables_only: Path, overrides: dict[str, Any], refused: str | None
) -> None:
    done = plan_variables(variables_only, {**VALID_INPUTS, **overrides})
    assert_plan_outcome(done, refused)


def _evaluate_spotring_command(azure: Module, workdir: Path, inputs: dict[str, Any]) -> str:
    """The output's own expression, with the names the resources are given for them."""
    assert azure.resource(SET, "workers")["name"] == "${var.name}"
    group = azure.resource("azurerm_resource_group", "cluster")["name"]
    assert group == "${local.resource_group_name}"
    value = (
        azure.outputs["spotring_command"]["value"]
        .replace(f"{SET}.workers.name", "var.name")
        .replace("azurerm_resource_group.cluster.name", "local.resource_group_name")
    )
    local = azure.locals["resource_group_name"]
    assert local.startswith("${") and local.endswith("}"), local
    main_tf = (
        # The locals' expressions as written (a quoted copy would escape their quotes).
        f"locals {{\n  resource_group_name = {local[2:-1]}\n"
        f"  checkpoints = {azure.locals['checkpoints'][2:-1]}\n"
        f"  checkpoint_option = {azure.locals['checkpoint_option'][2:-1]}\n}}\n"
        f'output "spotring_command" {{\n  value = {json.dumps(value)}\n}}\n'
    )
    return evaluate_output(AZURE, workdir, main_tf, inputs, "spotring_command")


@needs_terraform
@pytest.mark.parametrize(
    ("inputs", "expected"),
    [
        (
            {},
            "spotring run --provider azure --group spot-train --resource-group "
            f"spotring-spot-train --subscription {SUBSCRIPTION} -np 2 --min-np 1 --max-np 4 "
            "-- python train.py",
        ),
        (
            {
                "slots_per_host": 4,
                "min_worker_count": 0,
                "resource_group_name": "rg-train",
                "train_command": "python /opt/job/train.py",
            },
            f"spotring run --provider azure --group spot-train --resource-group rg-train "
            f"--subscription {SUBSCRIPTION} -np 8 --min-np 4 --max-np 16 "
            "-- python /opt/job/train.py",
        ),
        (
            {"slots_per_host": 2, "worker_count": 0},
            "spotring run --provider azure --group spot-train --resource-group "
            f"spotring-spot-train --subscription {SUBSCRIPTION} -np 2 --min-np 2 --max-np 8 "
            "-- python train.py",
        ),
        (
            {"checkpoint_uri": CHECKPOINT_URIS["azure"]},
            "spotring run --provider azure --group spot-train --resource-group "
            f"spotring-spot-train --subscription {SUBSCRIPTION} -np 2 --min-np 1 --max-np 4 "
            f"--checkpoint {CHECKPOINT_URIS['azure']} -- python train.py",
        ),
    ],
    ids=["defaults", "gpus", "empty", "checkpoints"],
)
def test_spotring_command_renders(
    azure: Module, tmp_path: Path, inputs: dict[str, Any], expected: str
) -> None:
    command = _evaluate_spotring_command(azure, tmp_path, {**VALID_INPUTS, **inputs})
    assert command == expected
    options = parse_run_with_checkpoint("azure", shlex.split(command)[1:])
    assert options.azure_subscription == SUBSCRIPTION
