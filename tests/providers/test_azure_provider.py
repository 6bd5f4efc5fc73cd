"""The Azure provider against the fake ARM server (tests/fakes/azure.py).

The real azure-mgmt-compute and azure-mgmt-network clients make every call over HTTP;
the fake records what it received, so the tests assert the requests as Azure would
have seen them. Each listing test runs in both orchestration modes.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("azure.mgmt.compute", reason="the azure extra is not installed")

from spotring.autoscaler.controller import Controller
from spotring.autoscaler.policy import JobShape
from spotring.providers.azure import IAM_ACTIONS, AzureProvider, client_options, member_state
from spotring.providers.base import (
    ConfigurationError,
    InstanceState,
    InterruptionNotice,
    Lifecycle,
    ProviderError,
)
from spotring.providers.conformance import ProviderContract
from tests.fakes.azure import PERMISSIONS, FakeArm, FakeScaleSet, Member

RG = "rg"
MODES = ["Uniform", "Flexible"]
VM_LIST = {"Uniform": "virtualMachineScaleSetVMs.list", "Flexible": "virtualMachines.list"}


@pytest.fixture
def fake() -> Iterator[FakeArm]:
    with FakeArm() as server:
        yield server


def make_provider(fake: FakeArm, group: str = "workers", **options: Any) -> AzureProvider:
    return AzureProvider(
        group,
        resource_group=options.pop("resource_group", RG),
        subscription=fake.subscription,
        endpoint=fake.url,
        **options,
    )


def states(provider: AzureProvider) -> dict[str, InstanceState]:
    return {i.id: i.state for i in provider.list_instances()}


def members(vmss: FakeScaleSet) -> dict[str, Member]:
    """The set's members by VM name (spotring's instance id in both modes)."""
    return {m.name: m for m in vmss.members}


def ip_of(fake: FakeArm, group: str, name: str) -> str:
    return members(fake.scale_set(group))[name].private_ip


def steer(provider: AzureProvider, times: int = 1) -> None:
    """What the controller asks of a provider on each refresh while it steers a job
    and no host failed: list the group, then keep its size."""
    for _ in range(times):
        provider.list_instances()
        provider.keep_size()


def controller_for(provider: AzureProvider, replace: bool = True) -> Controller:
    """A controller steering a 2-host job (``--no-replace`` when not ``replace``)."""
    shape = JobShape(num_proc=2, min_num_proc=1, max_num_proc=2, replace_failed=replace)
    return Controller(provider, job=shape, replace_grace=0.0)


def steps(controller: Controller, times: int) -> None:
    for _ in range(times):
        refreshed, _ = controller.step()
        assert refreshed, controller.last_error


# ------------------------------------------------------------------------ listing


@pytest.mark.parametrize("mode", MODES)
def test_lists_members_with_addresses_spot_and_size(fake: FakeArm, mode: str) -> None:
    vmss = fake.add_scale_set("workers", mode=mode, capacity=2, vm_size="Standard_D4s_v5")
    provider = make_provider(fake)

    instances = provider.list_instances()

    assert sorted(i.id for i in instances) == sorted(members(vmss))
    for instance in instances:
        assert instance.address == ip_of(fake, "workers", instance.id)
        assert instance.is_ready and instance.lifecycle is Lifecycle.SPOT
        assert (instance.instance_type, instance.slots) == ("Standard_D4s_v5", 1)
        created = members(vmss)[instance.id].time_created.timestamp()
        assert instance.launch_time == pytest.approx(created, abs=1e-5)


@pytest.mark.parametrize("mode", MODES)
def test_a_steady_set_costs_two_calls_per_refresh(fake: FakeArm, mode: str) -> None:
    fake.add_scale_set("workers", mode=mode, capacity=3, vm_size="Standard_D4s_v5")
    provider = make_provider(fake)
    provider.list_instances()
    fake.clear_requests()

    for _ in range(3):
        provider.list_instances()
        assert provider.last_refresh_calls == 2

    assert [r.api for r in fake.requests] == ["virtualMachineScaleSets.get", VM_LIST[mode]] * 3


@pytest.mark.parametrize("mode", MODES)
def test_pages_through_a_thousand_vms(fake: FakeArm, mode: str) -> None:
    vmss = fake.add_scale_set("big", mode=mode, capacity=1050, vm_size="Standard_D4s_v5")
    provider = make_provider(fake, "big")

    first = provider.list_instances()
    second = provider.list_instances()

    assert len(first) == len(second) == 1050 and all(i.is_ready for i in first)
    assert sorted(i.address for i in first) == sorted(m.private_ip for m in vmss.members)
    assert len(fake.calls(VM_LIST[mode])) > 2  # several pages per listing
    nic_calls = [r for r in fake.requests if r.api and r.api.startswith("networkInterfaces.")]
    first_nic_pages = len(nic_calls)
    provider.list_instances()
    assert first_nic_pages >= 1
    assert len([r for r in fake.requests if r.api and r.api.startswith("networkInterfaces.")]) == (
        first_nic_pages
    ), "addresses are fetched only for members not seen before"


@pytest.mark.parametrize("mode", MODES)
def test_joins_go_creating_to_running(fake: FakeArm, mode: str) -> None:
    vmss = fake.add_scale_set("workers", mode=mode, capacity=2, vm_size="Standard_D4s_v5")
    vmss.auto_advance = False
    provider = make_provider(fake)
    provider.list_instances()

    provider.set_target_size(3)
    vmss.advance()  # the update finished: a new VM, Creating
    (newcomer,) = set(members(vmss)) - {i.id for i in provider.list_instances() if i.is_ready}
    assert states(provider)[newcomer] is InstanceState.PENDING
    vmss.advance(3)
    joined = {i.id: i for i in provider.list_instances()}[newcomer]
    assert joined.is_ready and joined.address == ip_of(fake, "workers", newcomer)


def test_member_state_table() -> None:
    assert member_state("Succeeded", "running") is InstanceState.READY
    assert member_state("Succeeded", "running", "unknown") is InstanceState.READY
    assert member_state("Creating", "") is InstanceState.PENDING
    assert member_state("Succeeded", "") is InstanceState.PENDING
    assert member_state("Succeeded", "starting") is InstanceState.PENDING
    assert member_state("Succeeded", "running", "unhealthy") is InstanceState.DRAINING
    assert member_state("Failed", "running") is InstanceState.DRAINING
    assert member_state("Deleting", "running") is InstanceState.TERMINATING
    assert member_state("Succeeded", "stopped") is InstanceState.TERMINATING
    assert member_state("Succeeded", "deallocated") is InstanceState.GONE
    assert member_state("SomethingNew", "running") is InstanceState.PENDING


def test_spot_only_and_priority(fake: FakeArm) -> None:
    fake.add_scale_set("regular", mode="Uniform", capacity=2, priority="Regular")
    fake.add_scale_set("spot", mode="Flexible", capacity=2)

    regular = make_provider(fake, "regular").list_instances()
    assert [i.lifecycle for i in regular] == [Lifecycle.ON_DEMAND] * 2
    assert make_provider(fake, "regular", spot_only=True).list_instances() == []
    assert len(make_provider(fake, "spot", spot_only=True).list_instances()) == 2


def test_slots_from_option_tag_and_gpu_count(fake: FakeArm) -> None:
    fake.add_scale_set("gpus", capacity=1, vm_size="Standard_NC64as_T4_v3")
    fake.add_scale_set("tagged", capacity=1, vm_size="Standard_NC64as_T4_v3", vm_tags={"g": "2"})

    provider = make_provider(fake, "gpus")
    assert [i.slots for i in provider.list_instances()] == [4]
    provider.list_instances()
    assert len(fake.calls("resourceSkus.list")) >= 1
    skus_asked = len(fake.calls("resourceSkus.list"))
    provider.list_instances()
    assert len(fake.calls("resourceSkus.list")) == skus_asked, "the SKU list is asked once"
    assert [i.slots for i in make_provider(fake, "tagged", slots_label="g").list_instances()] == [2]
    assert [i.slots for i in make_provider(fake, "gpus", slots_per_host=3).list_instances()] == [3]
    # The slots tag on the set (where terraform/azure puts it) counts for its VMs; a
    # VM's own tag wins.
    fake.add_scale_set("set-tagged", capacity=1, tags={"spotring-slots": "3"})
    assert [i.slots for i in make_provider(fake, "set-tagged").list_instances()] == [3]
    fake.add_scale_set("both", capacity=1, tags={"g": "3"}, vm_tags={"g": "5"})
    assert [i.slots for i in make_provider(fake, "both", slots_label="g").list_instances()] == [5]


# ----------------------------------------------------------------------- steering


@pytest.mark.parametrize("mode", MODES)
def test_capacity_is_set_once_and_only_when_it_changes(fake: FakeArm, mode: str) -> None:
    vmss = fake.add_scale_set("workers", mode=mode, capacity=2)
    provider = make_provider(fake)
    provider.list_instances()

    provider.set_target_size(2)
    provider.set_target_size(3)
    provider.set_target_size(3)

    updates = fake.calls("virtualMachineScaleSets.update")
    assert [u.body for u in updates] == [{"sku": {"capacity": 3}}]
    provider.list_instances()
    assert vmss.capacity == 3


@pytest.mark.parametrize("mode", MODES)
def test_replace_deletes_the_vm_and_keeps_the_capacity(fake: FakeArm, mode: str) -> None:
    vmss = fake.add_scale_set("workers", mode=mode, capacity=3)
    provider = make_provider(fake)
    victim = provider.list_instances()[0].id

    provider.replace_instance(victim)
    provider.replace_instance(victim)  # idempotent
    provider.replace_instance("not-a-member")
    steer(provider, 6)

    if mode == "Uniform":
        deletes = fake.calls("virtualMachineScaleSets.deleteInstances")
        assert [d.body for d in deletes] == [{"instanceIds": [victim.rsplit("_", 1)[1]]}]
    else:
        deletes = fake.calls("virtualMachines.delete")
        assert [d.path.rsplit("/", 1)[-1] for d in deletes] == [victim]
    assert victim not in members(vmss)
    assert vmss.capacity == 3 and len(vmss.members) == 3
    assert all(i.is_ready for i in provider.list_instances())


@pytest.mark.parametrize("policy", ["Deallocate", "Delete"])
def test_an_evicted_vm_is_replaced_by_the_controller(fake: FakeArm, policy: str) -> None:
    vmss = fake.add_scale_set("workers", mode="Flexible", capacity=2, eviction_policy=policy)
    provider = make_provider(fake)
    controller = controller_for(provider)
    steps(controller, 1)
    victim = provider.list_instances()[0].id

    vmss.evict(members(vmss)[victim].key)
    listed = {i.id: i for i in provider.list_instances()}
    if policy == "Deallocate":  # still listed: a failed host, not yet touched
        assert listed[victim].state is InstanceState.GONE
        assert listed[victim].failure == "spot VM evicted (deallocated)"
        assert victim in members(vmss)
    steps(controller, 6)

    assert victim not in members(vmss) and vmss.capacity == 2
    assert sum(i.is_ready for i in provider.list_instances()) == 2


def test_no_replace_leaves_an_evicted_vm_alone(fake: FakeArm) -> None:
    vmss = fake.add_scale_set("workers", mode="Flexible", capacity=2, eviction_policy="Deallocate")
    provider = make_provider(fake)
    controller = controller_for(provider, replace=False)
    steps(controller, 1)
    victim = provider.list_instances()[0].id

    vmss.evict(members(vmss)[victim].key)
    steps(controller, 4)

    assert victim in members(vmss) and vmss.capacity == 2
    assert not fake.calls("virtualMachines.delete")
    assert states(provider)[victim] is InstanceState.GONE


def test_a_plugin_decides_the_evicted_vms_replacement(fake: FakeArm) -> None:
    from spotring.autoscaler.hookspecs import hookimpl
    from spotring.autoscaler.plugins import get_plugin_manager

    asked: list[tuple[str, str]] = []

    class KeepEvicted:
        @hookimpl
        def spotring_replace_host(self, instance: Any, reason: str, job: JobShape) -> bool:
            asked.append((instance.id, reason))
            return False

    vmss = fake.add_scale_set("workers", mode="Flexible", capacity=2, eviction_policy="Deallocate")
    provider = make_provider(fake)
    pm = get_plugin_manager(load_entry_points=False)
    pm.register(KeepEvicted())
    shape = JobShape(num_proc=2, min_num_proc=1, max_num_proc=2)
    controller = Controller(provider, pm.hook, job=shape, replace_grace=0.0)
    steps(controller, 1)
    victim = provider.list_instances()[0].id

    vmss.evict(members(vmss)[victim].key)
    steps(controller, 4)

    assert asked == [(victim, "spot VM evicted (deallocated)")], "asked once"
    assert victim in members(vmss) and not fake.calls("virtualMachines.delete")


@pytest.mark.parametrize("policy", ["Deallocate", "Delete"])
def test_an_eviction_notice_starts_the_replacement_at_once(fake: FakeArm, policy: str) -> None:
    vmss = fake.add_scale_set("workers", capacity=2, eviction_policy=policy)
    provider = make_provider(fake)
    provider.set_target_size(2)
    victim = provider.list_instances()[0]

    provider.host_noticed(victim, InterruptionNotice("rebalance"))  # Azure has none; ignored
    provider.host_noticed(victim, InterruptionNotice("preempt", time.time() + 30))
    assert [u.body for u in fake.calls("virtualMachineScaleSets.update")] == [
        {"sku": {"capacity": 3}}
    ]
    steer(provider, 3)
    assert sum(i.is_ready for i in provider.list_instances()) == 3  # still training on it

    vmss.evict(members(vmss)[victim.id].key)  # the eviction comes
    if policy == "Deallocate":  # the controller decides to replace the evicted VM
        provider.list_instances()
        provider.replace_instance(victim.id)
    steer(provider, 6)
    assert victim.id not in members(vmss) and vmss.capacity == 2
    assert sum(i.is_ready for i in provider.list_instances()) == 2


def test_keep_evicted_leaves_a_deallocated_vm(fake: FakeArm) -> None:
    vmss = fake.add_scale_set("workers", capacity=2, eviction_policy="Deallocate")
    provider = make_provider(fake, keep_evicted=True)
    victim = provider.list_instances()[0].id
    vmss.evict(members(vmss)[victim].key)

    for _ in range(3):
        assert states(provider)[victim] is InstanceState.GONE
    assert not fake.calls("virtualMachines.delete")


@pytest.mark.parametrize("mode", MODES)
def test_capacity_shortage_warns_once_and_retries_the_failed_vms(
    fake: FakeArm, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    vmss = fake.add_scale_set("workers", mode=mode, capacity=1)
    provider = make_provider(fake)
    provider.list_instances()
    vmss.capacity_error("AllocationFailed")
    provider.set_target_size(3)

    caplog.set_level(logging.INFO, logger="spotring.providers")
    controller = Controller(provider, job=JobShape(3, 1, 3), replace_grace=0.0)
    steps(controller, 6)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "cannot create VMs in eastus: AllocationFailed: Allocation failed" in warnings[0]
    # The controller had the failed VMs deleted so the set tries again; the capacity
    # stays at 3.
    delete_api = (
        "virtualMachines.delete"
        if mode == "Flexible"
        else ("virtualMachineScaleSets.deleteInstances")
    )
    assert fake.calls(delete_api)
    assert vmss.capacity == 3

    vmss.clear_capacity_error()
    steps(controller, 8)
    assert sum(i.is_ready for i in provider.list_instances()) == 3
    assert any(r.getMessage().endswith("AllocationFailed: resolved") for r in caplog.records)


def test_a_quota_refusal_is_retryable_and_not_retried_at_once(fake: FakeArm) -> None:
    vmss = fake.add_scale_set("workers", capacity=1)
    provider = make_provider(fake)
    provider.list_instances()
    vmss.capacity_error("OperationNotAllowed")

    with pytest.raises(
        ProviderError, match="cannot grow: Operation could not be completed"
    ) as info:
        provider.set_target_size(4)
    assert info.value.retryable and not isinstance(info.value, ConfigurationError)
    assert len(fake.calls("virtualMachineScaleSets.update")) == 1
    assert vmss.capacity == 1


def test_scale_down_on_exit_sets_capacity_zero(fake: FakeArm) -> None:
    vmss = fake.add_scale_set("workers", capacity=2)
    provider = make_provider(fake, scale_down_on_exit=True)
    provider.list_instances()

    provider.job_finished()

    assert fake.calls("virtualMachineScaleSets.update")[-1].body == {"sku": {"capacity": 0}}
    provider.list_instances()
    assert vmss.capacity == 0


# ------------------------------------------------------------------------- errors


def test_throttling_is_retried_honouring_retry_after(fake: FakeArm) -> None:
    fake.add_scale_set("workers", capacity=2)
    provider = make_provider(fake)
    fake.fail_next(1, 429, retry_after=1)
    fake.fail_next(1, 503)

    assert len(provider.list_instances()) == 2
    assert provider.api_retries == 2


def test_persistent_failure_is_retryable_and_never_an_empty_group(fake: FakeArm) -> None:
    fake.add_scale_set("workers", capacity=2)
    provider = make_provider(fake, max_api_attempts=2)
    assert len(provider.list_instances()) == 2
    fake.fail_next(2, 500)

    with pytest.raises(ProviderError) as caught:
        provider.list_instances()

    assert caught.value.retryable
    assert len(provider.list_instances()) == 2


def test_unknown_scale_set_and_resource_group_are_one_line(fake: FakeArm) -> None:
    fake.add_scale_set("workers", capacity=1)
    with pytest.raises(ConfigurationError) as missing_set:
        make_provider(fake, "nope").list_instances()
    with pytest.raises(ConfigurationError) as missing_rg:
        make_provider(fake, resource_group="nope-rg").list_instances()

    assert str(missing_set.value) == "scale set 'nope' not found in resource group 'rg'"
    assert str(missing_rg.value) == (
        f"resource group 'nope-rg' not found in subscription {fake.subscription}"
    )


def test_authorization_failed_names_the_action(fake: FakeArm) -> None:
    fake.add_scale_set("workers", mode="Uniform", capacity=2)
    fake.deny("Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read")

    with pytest.raises(ConfigurationError) as caught:
        make_provider(fake).list_instances()

    assert str(caught.value).startswith(
        "Azure denied Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read"
        " (AuthorizationFailed)"
    )


@pytest.mark.parametrize("mode", MODES)
def test_iam_actions_cover_the_calls_made(fake: FakeArm, mode: str) -> None:
    fake.add_scale_set("workers", mode=mode, capacity=2, vm_size="Standard_NC4as_T4_v3")
    provider = make_provider(fake)
    provider.set_target_size(3)
    provider.list_instances()
    provider.replace_instance(provider.list_instances()[0].id)

    used = {PERMISSIONS[r.api] for r in fake.requests if r.api in PERMISSIONS}
    assert used <= set(IAM_ACTIONS)
    assert len(used) == 6  # get, update, VM list, NIC list, delete, SKUs


def test_options_are_checked_before_any_call(
    fake: FakeArm, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AZURE_SUBSCRIPTION_ID", raising=False)
    with pytest.raises(ConfigurationError, match="--resource-group is required"):
        AzureProvider("g", resource_group="", subscription="s", endpoint=fake.url)
    with pytest.raises(ConfigurationError, match="no Azure subscription"):
        AzureProvider("g", resource_group=RG, endpoint=fake.url)
    with pytest.raises(ConfigurationError, match="only for a test server on loopback"):
        AzureProvider("g", resource_group=RG, subscription="s", endpoint="http://example.com")
    assert not fake.requests


def test_a_sovereign_cloud_endpoint_gets_its_own_token_scope() -> None:
    from azure.mgmt.compute import ComputeManagementClient

    options = client_options("https://management.chinacloudapi.cn/")
    assert options["base_url"] == "https://management.chinacloudapi.cn"
    client = ComputeManagementClient(object(), "s", **options)
    # Left alone, the client would ask for a public-cloud token and China's ARM would
    # refuse it.
    assert client._config.credential_scopes == ["https://management.chinacloudapi.cn/.default"]
    assert "credential_scopes" not in client_options(None)


def test_import_loads_no_azure_sdk() -> None:
    """``spotring --help`` does not pay for the Azure SDKs: each room of the package
    imports them on first use."""
    code = (
        "import sys, spotring.providers.azure; "
        "loaded = sorted(m for m in sys.modules if m.split('.')[0] == 'azure'); "
        "sys.exit(f'loaded: {loaded}' if loaded else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# -------------------------------------------------------------------- conformance


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TestAzureContract(ProviderContract):
    @pytest.fixture(params=MODES)
    def mode(self, request: pytest.FixtureRequest) -> str:
        return str(request.param)

    @pytest.fixture
    def provider(self, fake: FakeArm, mode: str) -> AzureProvider:
        fake.add_scale_set("workers", mode=mode, capacity=2)
        return make_provider(fake)

    @pytest.fixture
    def failing_provider(self) -> AzureProvider:
        return AzureProvider(
            "workers",
            resource_group=RG,
            subscription="00000000-0000-0000-0000-000000000000",
            endpoint=f"http://127.0.0.1:{_closed_port()}",
            max_api_attempts=1,
        )


logging.getLogger("azure").setLevel(logging.WARNING)  # a line per request otherwise
