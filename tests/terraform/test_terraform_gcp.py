"""Static checks of terraform/gcp, the spot worker group + driver module for GCP.

No GCP project and no `hashicorp/google` provider are at hand, so these tests parse
the module with python-hcl2 (the helpers of tests/terraform/test_terraform.py) and check what a
typo or a drifting contract would break: the spot scheduling of the workers, no
external address on them, the driver's custom roles against the permissions spotring's
GCP provider uses (``spotring.providers.gcp.IAM_PERMISSIONS``), the firewall rules, the
bootstrap template's variables, and ``spotring_command`` against the CLI.

Where a `terraform` binary is on PATH, a few checks need no provider and run for real:
`terraform fmt -check`, the variables' validations (``terraform plan`` of a copy of
variables.tf) and the ``spotring_command`` output (evaluated from a copy of its
expression). With SPOTRING_TERRAFORM_TESTS=1 and a provider mirror that holds
hashicorp/google, ``test_terraform_cli`` also runs the module's own `terraform test`.
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
    VALID_INPUTS as EVERY_VALID_INPUT,
)
from tests.terraform.support import (
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

GCP = TERRAFORM / "gcp"

# What spotring's GCP provider calls (providers/gcp.py's IAM_PERMISSIONS, checked to be
# the same: a change there comes with the roles in iam.tf): get (also
# listManagedInstances, listErrors) and update (resize, recreateInstances,
# deleteInstances) on the group, instances.list for the members' addresses, spot-ness
# and accelerators, and instanceTemplates.get for whether the group launches spot VMs.
ASSUMED_IAM_PERMISSIONS = frozenset(
    {
        "compute.instanceGroupManagers.get",
        "compute.instanceGroupManagers.update",
        "compute.instanceTemplates.get",
        "compute.instances.list",
        "compute.machineTypes.get",
    }
)
# Roles the hosts' service accounts may hold besides the driver's custom roles.
HOST_ROLES = frozenset({"roles/logging.logWriter", "roles/monitoring.metricWriter"})
SLOTS_LABEL = "spotring-slots"

WORKER_SA = "${google_service_account.worker.email}"
DRIVER_SA = "${google_service_account.driver.email}"

VALID_INPUTS = EVERY_VALID_INPUT["gcp"]


@pytest.fixture(scope="module")
def gcp() -> Module:
    return Module(GCP)


# ------------------------------------------------------------------ the module as a whole


def test_google_provider_is_pinned_to_5_or_newer(gcp: Module) -> None:
    assert gcp.required_providers == {"google"}, gcp.required_providers
    doc = generic._parse(GCP / "versions.tf")
    (block,) = doc["terraform"]
    (providers,) = block["required_providers"]
    google = providers["google"]
    assert google["source"] == "hashicorp/google"
    bounds = [b.strip() for b in google["version"].split(",")]
    lower = [b for b in bounds if b.startswith(">=")]
    assert lower and int(lower[0][2:].strip().split(".")[0]) >= 5, google["version"]


def test_no_autoscaler(gcp: Module) -> None:
    """spotring sizes the group itself; an autoscaler would fight it over the size."""
    kinds = {kind for kind, _ in gcp.resources}
    assert not kinds & {"google_compute_autoscaler", "google_compute_region_autoscaler"}
    text = (GCP / "workers.tf").read_text(encoding="utf-8")
    assert "No autoscaler" in text, "say why there is no autoscaler next to the group"


# ------------------------------------------------------------------ workers


def test_workers_are_spot_vms_deleted_when_reclaimed(gcp: Module) -> None:
    template = gcp.resource("google_compute_instance_template", "workers")
    (scheduling,) = template["scheduling"]
    assert scheduling == {
        "provisioning_model": "SPOT",
        "preemptible": True,
        "automatic_restart": False,
        "on_host_maintenance": "TERMINATE",
        "instance_termination_action": "DELETE",
    }


def test_workers_have_no_external_address(gcp: Module) -> None:
    template = gcp.resource("google_compute_instance_template", "workers")
    (nic,) = template["network_interface"]
    assert "access_config" not in nic and "dynamic" not in nic, nic
    assert nic["subnetwork"] == "${google_compute_subnetwork.cluster.id}"
    assert template.get("can_ip_forward", False) is False


def test_workers_are_shielded_and_use_their_own_account(gcp: Module) -> None:
    template = gcp.resource("google_compute_instance_template", "workers")
    (shielded,) = template["shielded_instance_config"]
    assert shielded["enable_vtpm"] is True and shielded["enable_integrity_monitoring"] is True
    assert shielded["enable_secure_boot"] in (True, "${var.enable_secure_boot}")
    assert gcp.variables["enable_secure_boot"]["default"] is True
    (account,) = template["service_account"]
    assert account["email"] == WORKER_SA
    assert "https://www.googleapis.com/auth/cloud-platform" not in account["scopes"]


def test_gpus_are_optional(gcp: Module) -> None:
    template = gcp.resource("google_compute_instance_template", "workers")
    assert "guest_accelerator" not in template, "GPUs must be optional (a dynamic block)"
    (dynamic,) = [d["guest_accelerator"] for d in template["dynamic"] if "guest_accelerator" in d]
    assert re.fullmatch(
        r"\$\{var\.gpu_count > 0 \? \[var\.gpu_type\] : \[\]\}", dynamic["for_each"]
    )
    (content,) = dynamic["content"]
    assert content["count"] == "${var.gpu_count}"
    assert gcp.variables["gpu_count"]["default"] == 0


def test_slots_label_is_set_on_the_workers(gcp: Module) -> None:
    template = gcp.resource("google_compute_instance_template", "workers")
    assert template["labels"][SLOTS_LABEL] == "${tostring(local.slots_per_host)}"
    assert "var.slots_per_host" in gcp.locals["slots_per_host"]
    assert "var.gpu_count" in gcp.locals["slots_per_host"]
    label = getattr(provider_class("gcp"), "default_slots_label", SLOTS_LABEL)
    assert label == SLOTS_LABEL, f"the provider reads {label!r}, the module writes {SLOTS_LABEL}"


def test_group_uses_the_template_and_never_rolls_running_workers(gcp: Module) -> None:
    group = gcp.resource("google_compute_region_instance_group_manager", "workers")
    assert group["name"] == "${var.name}" and group["region"] == "${var.region}"
    (version,) = group["version"]
    assert re.fullmatch(
        r"\$\{google_compute_instance_template\.workers\.(self_link_unique|self_link|id)\}",
        version["instance_template"],
    )
    (policy,) = group["update_policy"]
    assert policy["type"] == "OPPORTUNISTIC"
    assert policy["instance_redistribution_type"] == "NONE"
    assert group["target_size"] == "${var.worker_count}"
    assert group.get("wait_for_instances", False) is False
    (lifecycle,) = group["lifecycle"]
    assert "target_size" in lifecycle["ignore_changes"]
    (template_lifecycle,) = gcp.resource("google_compute_instance_template", "workers")["lifecycle"]
    assert template_lifecycle["create_before_destroy"] is True


def _metadata(gcp: Module, rtype: str, name: str) -> dict[str, Any]:
    metadata = gcp.resource(rtype, name)["metadata"]
    assert isinstance(metadata, dict), f"{rtype}.{name}: metadata must be a literal map"
    return metadata


@pytest.mark.parametrize(
    ("rtype", "name"),
    [("google_compute_instance_template", "workers"), ("google_compute_instance", "driver")],
)
def test_ssh_keys_only(gcp: Module, rtype: str, name: str) -> None:
    metadata = _metadata(gcp, rtype, name)
    assert metadata["block-project-ssh-keys"] == "TRUE"
    assert metadata["serial-port-enable"] == "FALSE"
    assert metadata["ssh-keys"] == "${local.ssh_keys_metadata}"
    assert metadata.get("enable-oslogin") in ("FALSE", "TRUE")
    keys = gcp.locals["ssh_keys_metadata"]
    loop = r"\[for (\w+) in var\.ssh_public_keys : \"\$\{var\.ssh_user\}:\$\{\1\}\"\]"
    assert re.fullmatch(rf'\$\{{join\("\\n", {loop}\)\}}', keys), keys
    text = " ".join(_strings(gcp.resource(rtype, name)))
    assert "password" not in text.lower()


# ------------------------------------------------------------------ driver and IAM


def _expected_permissions() -> tuple[frozenset[str], str]:
    return provider_iam("gcp", "IAM_PERMISSIONS")


def test_permissions_match_the_provider_module() -> None:
    permissions, _ = _expected_permissions()
    assert permissions == ASSUMED_IAM_PERMISSIONS, (
        "the provider's IAM_PERMISSIONS changed: update ASSUMED_IAM_PERMISSIONS, iam.tf and "
        "the README"
    )


def _bindings(gcp: Module, member: str) -> list[tuple[str, dict]]:
    return [
        (name, body)
        for name, body in only(gcp, "google_project_iam_member")
        if body["member"] == f"serviceAccount:{member}"
    ]


def _custom_role(gcp: Module, role: str) -> tuple[str, dict] | None:
    match = re.fullmatch(rf"\$\{{google_project_iam_custom_role\.({_IDENT})\.(name|id)\}}", role)
    if not match:
        return None
    return match.group(1), gcp.resource("google_project_iam_custom_role", match.group(1))


def test_custom_roles_grant_exactly_the_provider_permissions(gcp: Module) -> None:
    expected, source = _expected_permissions()
    granted: set[str] = set()
    for _, binding in _bindings(gcp, DRIVER_SA):
        custom = _custom_role(gcp, binding["role"])
        if custom is not None:
            granted.update(custom[1]["permissions"])
    assert granted == expected, (
        f"driver custom roles vs {source}: missing {sorted(expected - granted)}, "
        f"extra {sorted(granted - expected)}"
    )
    # Every custom role is bound to the driver, and nothing waits on operations.
    bound = {
        _custom_role(gcp, b["role"])[0]
        for _, b in _bindings(gcp, DRIVER_SA)
        if _custom_role(gcp, b["role"])
    }
    provider_roles = {
        name
        for name, _ in only(gcp, "google_project_iam_custom_role")
        if name not in CHECKPOINT_ROLES
    }
    assert bound == provider_roles
    assert not {"compute.regionOperations.get", "compute.zoneOperations.get"} & granted


def test_permissions_on_the_group_are_limited_to_it(gcp: Module) -> None:
    """Everything but list calls is bound with a condition: on the group's name, or for
    the template on the worker templates' name prefix."""
    assert gcp.locals["group_resource_name"] == (
        "projects/${var.project}/regions/${var.region}/instanceGroupManagers/${var.name}"
    )
    group = gcp.resource("google_compute_region_instance_group_manager", "workers")
    assert group["name"] == "${var.name}" and group["region"] == "${var.region}"
    checked = templates = 0
    for name, binding in _bindings(gcp, DRIVER_SA):
        custom = _custom_role(gcp, binding["role"])
        if custom is None:
            continue
        permissions = custom[1]["permissions"]
        if all(p.endswith(".list") for p in permissions):
            continue  # authorized on a collection: a resource.name condition cannot narrow it
        (condition,) = binding.get("condition", [None])
        assert condition, f"google_project_iam_member.{name} grants {permissions} unconditionally"
        if permissions == ["compute.instanceTemplates.get"]:
            assert condition["expression"] == (
                "resource.name.startsWith('${local.template_resource_prefix}')"
            )
            templates += 1
            continue
        if permissions == ["compute.machineTypes.get"]:
            assert condition["expression"] == (
                "resource.name.startsWith('${local.machine_type_resource_prefix}')"
            )
            continue
        assert condition["expression"] == "resource.name == '${local.group_resource_name}'"
        checked += 1
        assert "compute.instanceGroupManagers.update" in permissions
    assert checked, "no conditioned binding for the group's permissions"
    assert templates == 1, "no conditioned binding for the template permission"
    template = gcp.resource("google_compute_instance_template", "workers")
    assert template["name_prefix"] == "${var.name}-worker-"
    assert gcp.locals["template_resource_prefix"] == (
        "projects/${var.project}/global/instanceTemplates/${var.name}-worker-"
    )
    iam = (GCP / "iam.tf").read_text(encoding="utf-8")
    assert "list call" in iam, "say next to the list role why it cannot be scoped"


def test_service_accounts_hold_nothing_else(gcp: Module) -> None:
    for member in (WORKER_SA, DRIVER_SA):
        for name, binding in _bindings(gcp, member):
            if member == DRIVER_SA and _custom_role(gcp, binding["role"]):
                continue
            if binding["role"] == "${each.value}":
                assert binding["for_each"] == "${local.host_roles}", binding
                roles = set(re.findall(r'"(roles/[^"]+)"', gcp.locals["host_roles"]))
            else:
                roles = {binding["role"]}
            assert roles <= HOST_ROLES, f"google_project_iam_member.{name}: {roles}"
    for name, binding in _bindings(gcp, WORKER_SA):
        assert _custom_role(gcp, binding["role"]) is None, f"{name}: a custom role on the workers"
    other_iam = {
        kind
        for kind, _ in gcp.resources
        if "_iam_" in kind
        and kind
        not in {
            "google_project_iam_member",
            "google_project_iam_custom_role",
            "google_storage_bucket_iam_member",  # checkpoint_uri only: see below
        }
    }
    assert not other_iam, f"unexpected IAM resources: {other_iam}"
    members = {body["member"] for _, body in only(gcp, "google_project_iam_member")}
    assert members <= {f"serviceAccount:{WORKER_SA}", f"serviceAccount:{DRIVER_SA}"}, members


def test_driver_is_on_demand_with_its_own_account(gcp: Module) -> None:
    driver = gcp.resource("google_compute_instance", "driver")
    (account,) = driver["service_account"]
    assert account["email"] == DRIVER_SA
    assert "https://www.googleapis.com/auth/cloud-platform" not in account["scopes"]
    (scheduling,) = driver["scheduling"]
    assert scheduling["provisioning_model"] == "STANDARD" and scheduling["preemptible"] is False
    (shielded,) = driver["shielded_instance_config"]
    assert all(
        shielded[k] is True
        for k in ("enable_secure_boot", "enable_vtpm", "enable_integrity_monitoring")
    )
    (nic,) = driver["network_interface"]
    assert "access_config" not in nic, "the driver's external address must be optional"
    (dynamic,) = [d["access_config"] for d in nic["dynamic"] if "access_config" in d]
    assert "var.driver_external_ip" in dynamic["for_each"]
    assert gcp.variables["driver_external_ip"]["type"] in ("bool", "${bool}")


# ------------------------------------------------------------------ network


def test_firewall_opens_the_cluster_to_itself_and_ssh_to_the_driver_only(gcp: Module) -> None:
    rules = dict(only(gcp, "google_compute_firewall"))
    assert set(rules) == {"cluster_internal", "driver_ssh"}, set(rules)
    for rule in rules.values():
        assert rule["direction"] == "INGRESS" and "deny" not in rule
        assert rule["network"] == "${google_compute_network.cluster.id}"
        assert "source_tags" not in rule and "target_tags" not in rule

    internal = rules["cluster_internal"]
    assert "source_ranges" not in internal, "cluster traffic must come from members only"
    assert internal["source_service_accounts"] == "${local.cluster_service_accounts}"
    assert internal["target_service_accounts"] == "${local.cluster_service_accounts}"
    assert sorted(gcp.locals["cluster_service_accounts"]) == sorted([WORKER_SA, DRIVER_SA])
    assert sorted(a["protocol"] for a in internal["allow"]) == ["tcp", "udp"]
    assert all("ports" not in a for a in internal["allow"])

    ssh = rules["driver_ssh"]
    assert ssh["source_ranges"] == "${var.admin_cidrs}"
    assert ssh["target_service_accounts"] == [DRIVER_SA]
    assert ssh["allow"] == [{"protocol": "tcp", "ports": ["22"]}]
    # No rule at all without admin_cidrs: a rule without source ranges matches 0.0.0.0/0.
    assert ssh["count"] == "${length(var.admin_cidrs) > 0 ? 1 : 0}"
    assert "default" not in gcp.variables["admin_cidrs"], "admin_cidrs must have no default"
    assert 'split("/", c)[1]) >= 8' in gcp.variables["admin_cidrs"]["validation"][0]["condition"]


def test_private_network_with_flow_logs_and_nat(gcp: Module) -> None:
    network = gcp.resource("google_compute_network", "cluster")
    assert network["auto_create_subnetworks"] is False
    subnet = gcp.resource("google_compute_subnetwork", "cluster")
    assert subnet["network"] == "${google_compute_network.cluster.id}"
    assert subnet["private_ip_google_access"] is True
    (flow_logs,) = subnet["log_config"]
    assert flow_logs["flow_sampling"] == "${var.flow_log_sampling}"
    router = gcp.resource("google_compute_router", "nat")
    assert router["network"] == "${google_compute_network.cluster.id}"
    nat = gcp.resource("google_compute_router_nat", "nat")
    assert nat["router"] == "${google_compute_router.nat.name}"
    (nat_subnet,) = nat["subnetwork"]
    assert nat_subnet["name"] == "${google_compute_subnetwork.cluster.id}"
    driver = gcp.resource("google_compute_instance", "driver")
    assert driver["network_interface"][0]["subnetwork"] == "${google_compute_subnetwork.cluster.id}"


# ------------------------------------------------------------------ the bootstrap


def _startup_scripts(gcp: Module) -> dict[str, str]:
    template = gcp.resource("google_compute_instance_template", "workers")
    driver = gcp.resource("google_compute_instance", "driver")
    return {
        "workers": template.get("metadata_startup_script")
        or template["metadata"]["startup-script"],
        "driver": driver.get("metadata_startup_script") or driver["metadata"]["startup-script"],
    }


def test_startup_scripts_render_the_bootstrap_with_every_variable(gcp: Module) -> None:
    calls = _templatefile_calls(gcp)
    where = {w for w, _ in calls}
    assert where == {"google_compute_instance_template.workers", "google_compute_instance.driver"}
    for site, args in calls:
        assert len(args) == 2, f"{site}: templatefile({args})"
        path = _resolve_template_path(gcp, args[0])
        assert path.resolve() == (REPO / "worker_image" / "bootstrap.sh.tftpl").resolve()
        wanted = _template_variables(path)
        passed = _object_keys(args[1])
        assert not wanted - passed, f"{site}: template variables not passed: {wanted - passed}"
        assert not passed - wanted, f"{site}: passed but unused by the template: {passed - wanted}"
        # No launch lifecycle hook on GCP: the template's AWS-only step must be a no-op.
        assert re.search(r'lifecycle_hook_name\s*[=:]\s*""', args[1]), args[1]
        assert re.search(r"group_name\s*[=:]\s*var\.name\b", args[1])
    for site, script in _startup_scripts(gcp).items():
        (args,) = _function_args(script, "templatefile")
        role = "worker" if site == "workers" else "driver"
        assert re.search(rf'role\s*[=:]\s*"{role}"', args[1]), (site, args[1])


def test_bootstrap_skips_the_aws_steps_without_a_hook_name() -> None:
    """With lifecycle_hook_name = "", nothing calls IMDS or the Auto Scaling API."""
    text = (REPO / "worker_image" / "bootstrap.sh.tftpl").read_text(encoding="utf-8")

    def function(name: str) -> tuple[int, int]:
        start = text.index(f"\n{name}() {{\n") + 1
        return start, text.index("\n}\n", start)

    hook_start, hook_end = function("complete_lifecycle")
    first = text[hook_start:hook_end].splitlines()[1:3]
    assert '[ -n "$LIFECYCLE_HOOK_NAME" ] || return 0' in [line.strip() for line in first], first
    # The AWS-only calls (IMDS, boto3) happen inside complete_lifecycle alone.
    imds_start, imds_end = function("imds_get")
    for pattern in (r"\bimds_get\b", r"\bimport boto3\b", r"\$IMDS\b"):
        for match in re.finditer(pattern, text):
            inside = hook_start < match.start() < hook_end or imds_start <= match.start() < imds_end
            comment = text.rfind("#", text.rfind("\n", 0, match.start()), match.start()) != -1
            assert inside or comment, f"{pattern} used outside complete_lifecycle: {match.start()}"


worker_image = pytest.importorskip("tests.unit.test_worker_image")
GCP_VARS = {**worker_image.WORKER_VARS, "region": "us-central1", "lifecycle_hook_name": ""}


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_rendered_bootstrap_never_touches_aws(tmp_path: Path) -> None:
    path = tmp_path / "bootstrap.sh"
    path.write_text(worker_image.render(GCP_VARS), encoding="utf-8")
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
    done = worker_image.run_sourced(path, "complete_lifecycle ABANDON", tmp_path, env)
    assert done.returncode == 0, done.stderr
    assert worker_image.calls(tmp_path) == worker_image.STEPS


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bootstrap_is_a_no_op_at_later_boots(tmp_path: Path) -> None:
    """GCP runs startup scripts at every boot; a finished bootstrap does not run again."""
    path = tmp_path / "bootstrap.sh"
    path.write_text(worker_image.render(GCP_VARS), encoding="utf-8")
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "bootstrap-done").touch()
    done = worker_image.run_sourced(path, worker_image._stub_steps() + "\nmain", tmp_path)
    assert done.returncode == 0, done.stderr
    assert worker_image.calls(tmp_path) == []
    assert "already bootstrapped" in (tmp_path / "bootstrap.log").read_text()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bootstrap_creates_a_missing_login_user(tmp_path: Path) -> None:
    """GCE images have no default user; the guest agent may not have created it yet."""
    path = tmp_path / "bootstrap.sh"
    path.write_text(worker_image.render(GCP_VARS), encoding="utf-8")
    home = tmp_path / "home"
    user = subprocess.run(["id", "-un"], capture_output=True, text=True, check=True).stdout.strip()
    created = tmp_path / "created"
    commands = (
        f"SSH_USER={shlex.quote(user)}\n"
        f"getent() {{ [ -e {created} ] && echo '{user}:x:0:0::{home}:/bin/bash'; }}\n"
        "sleep() { :; }\n"
        f'useradd() {{ echo "useradd $*" >>"$CALLS"; mkdir -p {home}; touch {created}; }}\n'
        "authorize_keys\n"
    )
    done = worker_image.run_sourced(path, commands, tmp_path)
    assert done.returncode == 0, done.stderr
    assert worker_image.calls(tmp_path) == [f"useradd --create-home --shell /bin/bash {user}"]
    keys = (home / ".ssh" / "authorized_keys").read_text().splitlines()
    assert keys == GCP_VARS["ssh_authorized_keys"].split("\n")


# ------------------------------------------------------------------ spotring_command


def test_spotring_command_shape(gcp: Module) -> None:
    argv = spotring_argv(gcp)
    assert argv[:4] == ["spotring", "run", "--provider", "gcp"]
    assert "--" in argv and argv[argv.index("--") + 1 :], "no training command after --"
    command = gcp.outputs["spotring_command"]["value"]
    for flag, ref in (
        ("--group", "google_compute_region_instance_group_manager.workers.name"),
        ("--region", "var.region"),
        ("--project", "var.project"),
        ("-np", "var.worker_count"),
        ("--min-np", "var.min_worker_count"),
        ("--max-np", "var.max_worker_count"),
    ):
        assert re.search(rf"{re.escape(flag)} \$\{{[^}}]*{re.escape(ref)}", command), (
            flag,
            command,
        )
    assert "--zone" not in command, "the group is regional"


def _parse_run(argv: list[str]) -> Any:
    return parse_run("gcp", argv)


def test_spotring_command_parses_with_the_cli(gcp: Module) -> None:
    options = _parse_run(spotring_argv(gcp)[1:])
    assert options.command == "run"
    assert options.provider == "gcp"
    assert options.num_proc == 2 and options.min_num_proc == 2 and options.max_num_proc == 2
    values = vars(options)
    for what in ("group", "region", "project"):
        # --group may be given more than once: it parses to a list.
        assert any(what in key and value in ("2", ["2"]) for key, value in values.items()), (
            what,
            values,
        )


# ------------------------------------------------------------------ durable checkpoints

CHECKPOINTS_ONLY = "${local.checkpoints ? 1 : 0}"
CHECKPOINT_ROLES = {"checkpoint_read", "checkpoint_write"}
# binding -> (member, role, condition local)
CHECKPOINT_BINDINGS = {
    "worker_checkpoint_read": (WORKER_SA, "checkpoint_read", "checkpoint_read_condition"),
    "worker_checkpoint_write": (WORKER_SA, "checkpoint_write", "checkpoint_write_condition"),
    "driver_checkpoint_read": (DRIVER_SA, "checkpoint_read", "checkpoint_read_condition"),
    "driver_checkpoint_lock": (DRIVER_SA, "checkpoint_write", "checkpoint_lock_condition"),
}


def test_checkpoint_roles_grant_exactly_the_object_calls(gcp: Module) -> None:
    roles = dict(only(gcp, "google_project_iam_custom_role"))
    read, write = roles["checkpoint_read"], roles["checkpoint_write"]
    assert read["permissions"] == ["storage.objects.get", "storage.objects.list"]
    assert write["permissions"] == ["storage.objects.create", "storage.objects.delete"]
    for role in (read, write):
        assert role["count"] == CHECKPOINTS_ONLY
        assert role["project"] == "${local.checkpoint_bucket_project}"
    assert gcp.locals["checkpoint_bucket_project"] == (
        "${coalesce(var.checkpoint_bucket_project, var.project)}"
    )


def test_checkpoint_bindings_are_on_the_bucket_with_conditions(gcp: Module) -> None:
    """Only with checkpoint_uri, on the checkpoint bucket (never the project), each with
    its condition: the workers under PREFIX/, the driver reading there and writing the
    lock alone."""
    bindings = dict(only(gcp, "google_storage_bucket_iam_member"))
    assert set(bindings) == set(CHECKPOINT_BINDINGS)
    for name, (member, role, condition) in CHECKPOINT_BINDINGS.items():
        binding = bindings[name]
        assert binding["count"] == CHECKPOINTS_ONLY, name
        assert binding["bucket"] == "${local.checkpoint_bucket}", name
        assert binding["member"] == f"serviceAccount:{member}", name
        assert binding["role"] == f"${{google_project_iam_custom_role.{role}[0].name}}", name
        (cond,) = binding["condition"]
        assert cond["expression"] == f"${{local.{condition}}}", name
    # Nothing project-wide touches Cloud Storage.
    for _, binding in only(gcp, "google_project_iam_member"):
        assert "storage" not in str(binding.get("role", "")), binding
    for _, role in only(gcp, "google_project_iam_custom_role"):
        if _ not in CHECKPOINT_ROLES:
            assert not [p for p in role["permissions"] if p.startswith("storage.")], role


def test_checkpoint_scope_only_with_checkpoint_uri(gcp: Module) -> None:
    assert gcp.locals["checkpoint_scopes"] == (
        '${local.checkpoints ? ["https://www.googleapis.com/auth/devstorage.read_write"] : []}'
    )
    template = gcp.resource("google_compute_instance_template", "workers")
    driver = gcp.resource("google_compute_instance", "driver")
    for body in (template, driver):
        (account,) = body["service_account"]
        assert account["scopes"].endswith(", local.checkpoint_scopes)}"), account["scopes"]
        assert "devstorage" not in account["scopes"]


@needs_terraform
@pytest.mark.parametrize(
    "uri", ["gs://ckpt-bucket/runs/spot-train", "gs://ckpt-bucket/runs/spot-train/"]
)
def test_checkpoint_conditions_name_the_prefix(gcp: Module, tmp_path: Path, uri: str) -> None:
    values = evaluate(
        gcp,
        tmp_path,
        {**VALID_INPUTS, "checkpoint_uri": uri},
        {name: f"local.{name}" for name in (
            "checkpoint_bucket", "checkpoint_read_condition", "checkpoint_write_condition",
            "checkpoint_lock_condition", "checkpoint_scopes", "checkpoint_bucket_project",
        )},
    )  # fmt: skip
    objects = "projects/_/buckets/ckpt-bucket/objects/runs/spot-train/"
    assert values == {
        "checkpoint_bucket": "ckpt-bucket",
        "checkpoint_read_condition": f'resource.name.startsWith("{objects}") || api.getAttribute('
        '"storage.googleapis.com/objectListPrefix", "").startsWith("runs/spot-train/")',
        "checkpoint_write_condition": f'resource.name.startsWith("{objects}")',
        "checkpoint_lock_condition": f'resource.name == "{objects}lock.json"',
        "checkpoint_scopes": ["https://www.googleapis.com/auth/devstorage.read_write"],
        "checkpoint_bucket_project": "my-project",
    }


# ------------------------------------------------------------------ the job under systemd


def test_driver_runs_the_job_unit(gcp: Module) -> None:
    driver = gcp.resource("google_compute_instance", "driver")
    assert_driver_runs_the_job_unit(gcp, "gcp", driver["metadata"]["startup-script"])
    journal = gcp.outputs["driver_journal_command"]["value"]
    assert "gcloud compute ssh ${var.ssh_user}@${google_compute_instance.driver.name}" in journal
    assert '${var.driver_external_ip ? "" : " --tunnel-through-iap"}' in journal


# ------------------------------------------------------------------ terraform itself
# These need the binary but no provider: they run wherever `terraform` is on PATH.


@pytest.fixture(scope="module")
def variables_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of variables.tf alone: `terraform plan` there checks the validations."""
    return variables_only_copy(tmp_path_factory, GCP)


def test_valid_inputs_pass_the_validations(variables_only: Path) -> None:
    done = plan_variables(variables_only, VALID_INPUTS)
    assert done.returncode == 0, done.stdout + done.stderr
    done = plan_variables(
        variables_only,
        {**VALID_INPUTS, "admin_cidrs": [], "zones": ["us-central1-a"], "gpu_count": 4},
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("admin_cidrs", ["0.0.0.0/0"]),
        ("admin_cidrs", ["203.0.113.7/32", "10.0.0.0/0"]),
        ("admin_cidrs", ["0.0.0.0/1", "128.0.0.0/1"]),  # the internet without a /0
        ("admin_cidrs", ["10.0.0.0/7"]),
        ("admin_cidrs", ["2001:db8::/32"]),
        ("spotring_package", "spotring @ https://example.com/spotring-0.1.0-py3-none-any.whl"),
        ("spotring_package", "spotring[gcp]' ; rm -rf / '"),
        ("name", "Spot_Train"),
        ("name", "a-name-that-is-too-long-for-ids"),
        ("project", "p"),
        ("region", "us-central1-a"),
        ("zones", ["us-central1"]),
        ("gpu_count", 3),
        ("slots_per_host", 0),
        ("ssh_public_keys", ["-----BEGIN OPENSSH PRIVATE KEY-----"]),
        ("ssh_user", "root"),
        ("distribution_target_shape", "RANDOM"),
        ("labels", {"spotring-slots": "8"}),
        ("checkpoint_uri", "gs://ckpt-bucket"),
        ("checkpoint_uri", "gs://ckpt-bucket/runs/*"),
        ("checkpoint_uri", 'gs://ckpt-bucket/a") || true || ("'),  # into a CEL condition
        ("checkpoint_uri", "s3://ckpt-bucket/runs"),
        ("checkpoint_bucket_project", "P"),
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
        ({"checkpoint_uri": "gs://ckpt-bucket/runs/spot-train"}, None),
        (
            {
                "checkpoint_uri": "gs://ckpt_bucket.1/a/",
                "checkpoint_bucket_project": "other-project",
            },
            None,
        ),
    ],
)
def test_job_and_checkpoint_validations(
    variables_only: Path, overrides: dict[str, Any], refused: str | None
) -> None:
    done = plan_variables(variables_only, {**VALID_INPUTS, **overrides})
    assert_plan_outcome(done, refused)


def _evaluate_spotring_command(gcp: Module, workdir: Path, inputs: dict[str, Any]) -> str:
    """The output's own expression, with the group's name (var.name) for the resource."""
    value = gcp.outputs["spotring_command"]["value"].replace(
        "google_compute_region_instance_group_manager.workers.name", "var.name"
    )
    main_tf = (
        "locals {\n"
        f"  slots_per_host = {json.dumps(gcp.locals['slots_per_host'])}\n"
        f"  checkpoints = {gcp.locals['checkpoints'][2:-1]}\n"
        f"  checkpoint_option = {gcp.locals['checkpoint_option'][2:-1]}\n"
        "}\n"
        f'output "spotring_command" {{\n  value = {json.dumps(value)}\n}}\n'
    )
    return evaluate_output(GCP, workdir, main_tf, inputs, "spotring_command")


@needs_terraform
@pytest.mark.parametrize(
    ("inputs", "expected"),
    [
        (
            {},
            "spotring run --provider gcp --group spot-train --region us-central1 "
            "--project my-project -np 2 --min-np 1 --max-np 4 -- python train.py",
        ),
        (
            {"gpu_count": 4, "min_worker_count": 0, "train_command": "python /opt/job/train.py"},
            "spotring run --provider gcp --group spot-train --region us-central1 "
            "--project my-project -np 8 --min-np 4 --max-np 16 -- python /opt/job/train.py",
        ),
        (
            {"gpu_count": 4, "slots_per_host": 2, "worker_count": 0},
            "spotring run --provider gcp --group spot-train --region us-central1 "
            "--project my-project -np 2 --min-np 2 --max-np 8 -- python train.py",
        ),
        (
            {"checkpoint_uri": "gs://ckpt-bucket/runs/spot-train"},
            "spotring run --provider gcp --group spot-train --region us-central1 "
            "--project my-project -np 2 --min-np 1 --max-np 4 "
            "--checkpoint gs://ckpt-bucket/runs/spot-train -- python train.py",
        ),
    ],
    ids=["defaults", "gpus", "slots", "checkpoints"],
)
def test_spotring_command_renders(
    gcp: Module, tmp_path: Path, inputs: dict[str, Any], expected: str
) -> None:
    command = _evaluate_spotring_command(gcp, tmp_path, {**VALID_INPUTS, **inputs})
    assert command == expected
    parse_run_with_checkpoint("gcp", shlex.split(command)[1:])
