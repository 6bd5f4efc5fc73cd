"""The fake ARM API (tests/fakes/azure.py) against the real azure-mgmt-compute/-network clients."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("azure.mgmt.compute")
pytest.importorskip("azure.mgmt.network")

from azure.core.exceptions import (
    HttpResponseError,
    ResourceExistsError,
    ResourceNotFoundError,
    ServiceRequestError,
    ServiceResponseError,
)
from azure.core.pipeline.policies import SansIOHTTPPolicy
from azure.mgmt.compute import ComputeManagementClient
from azure.mgmt.network import NetworkManagementClient

from tests.fakes.azure import PERMISSIONS, SUBSCRIPTION, FakeArm, _route

RG = "rg"


class NoCredential:
    """Never asked: SansIOHTTPPolicy replaces the bearer-token policy."""

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        raise AssertionError("the fake needs no token")


def client_kwargs(fake: FakeArm, **extra: Any) -> dict[str, Any]:
    """Keyword arguments for either management client talking to ``fake``."""
    return {
        "credential": NoCredential(),
        "subscription_id": fake.subscription,
        "base_url": fake.url,
        "authentication_policy": SansIOHTTPPolicy(),
        "polling_interval": 0,  # the LRO poller's default sleep between polls is 30 s
        **extra,
    }


@pytest.fixture
def fake() -> Iterator[FakeArm]:
    with FakeArm() as server:
        yield server


@pytest.fixture
def compute(fake: FakeArm) -> ComputeManagementClient:
    return ComputeManagementClient(**client_kwargs(fake))


@pytest.fixture
def network(fake: FakeArm) -> NetworkManagementClient:
    return NetworkManagementClient(**client_kwargs(fake))


def statuses(vm: Any) -> list[str]:
    return [s.code for s in vm.instance_view.statuses]


def flexible_filter(scale_set: Any) -> str:
    return f"'virtualMachineScaleSet/id' eq '{scale_set.id}'"


# ----------------------------------------------------------------------------- scale sets


def test_get_uniform_and_flexible_scale_sets(fake: FakeArm, compute: Any) -> None:
    uni = fake.add_scale_set(
        "uni", mode="Uniform", capacity=3, tags={"role": "workers"}, zones=["1", "2"]
    )
    flex = fake.add_scale_set(
        "flex", mode="Flexible", capacity=2, eviction_policy="Deallocate", vm_size="Standard_D4s_v5"
    )
    fake.add_scale_set("regular", mode="Uniform", priority="Regular")

    s = compute.virtual_machine_scale_sets.get(RG, "uni")
    assert s.id == uni.id
    assert s.id == (
        f"/subscriptions/{SUBSCRIPTION}/resourceGroups/rg/providers/"
        "Microsoft.Compute/virtualMachineScaleSets/uni"
    )
    assert (s.name, s.location, s.tags, s.zones) == (
        "uni",
        "eastus",
        {"role": "workers"},
        ["1", "2"],
    )
    assert (s.sku.name, s.sku.capacity) == ("Standard_NC4as_T4_v3", 3)
    assert s.orchestration_mode == "Uniform"
    assert s.provisioning_state == "Succeeded"
    profile = s.virtual_machine_profile
    assert (profile.priority, profile.eviction_policy) == ("Spot", "Delete")
    assert profile.billing_profile.max_price == -1
    assert s.as_dict() == uni.record()  # what the fake sends is what the SDK reads

    f = compute.virtual_machine_scale_sets.get(RG, "flex")
    assert f.orchestration_mode == "Flexible"
    assert (f.sku.name, f.sku.capacity) == ("Standard_D4s_v5", 2)
    assert f.virtual_machine_profile.eviction_policy == "Deallocate"
    assert f.tags is None  # no tags: no tags key, as ARM does
    assert f.as_dict() == flex.record()

    r = compute.virtual_machine_scale_sets.get(RG, "REGULAR")  # ARM names are case-insensitive
    assert r.virtual_machine_profile.priority == "Regular"
    assert r.virtual_machine_profile.eviction_policy is None
    assert r.virtual_machine_profile.billing_profile is None

    assert [c.api_version for c in fake.calls("virtualMachineScaleSets.get")] == ["2026-04-01"] * 3


# ----------------------------------------------------------------------------- VM lists


def test_uniform_vms_with_instance_view_and_paging(fake: FakeArm, compute: Any) -> None:
    workers = fake.add_scale_set("workers", mode="Uniform", capacity=1050, vm_tags={"r": "w"})
    workers.set_member("0", health="healthy")
    workers.set_member("1", health="HealthState/unhealthy", power_state="PowerState/deallocated")

    started = time.monotonic()
    vms = list(compute.virtual_machine_scale_set_vms.list(RG, "workers", expand="instanceView"))
    assert time.monotonic() - started < 5
    assert [vm.instance_id for vm in vms] == [str(i) for i in range(1050)]
    pages = fake.calls("virtualMachineScaleSetVMs.list")
    assert len(pages) == 11  # 100 a page
    assert "$skiptoken" not in pages[0].query
    assert all("$skiptoken" in p.query for p in pages[1:])
    # The SDK follows nextLink verbatim: it carries the first request's query.
    assert all(p.query["$expand"] == "instanceView" for p in pages)
    assert {p.api_version for p in pages} == {"2026-04-01"}

    first = vms[0]
    assert first.name == "workers_0"
    assert first.id == f"{workers.id}/virtualMachines/0"
    assert first.sku.name == "Standard_NC4as_T4_v3"
    assert first.tags == {"r": "w"}
    assert first.provisioning_state == "Succeeded"
    assert statuses(first) == ["ProvisioningState/succeeded", "PowerState/running"]
    assert first.instance_view.vm_health.status.code == "HealthState/healthy"
    assert first.network_profile.network_interfaces[0].id == (
        f"{workers.id}/virtualMachines/0/networkInterfaces/nic0"
    )
    assert statuses(vms[1])[1] == "PowerState/deallocated"
    assert vms[1].instance_view.vm_health.status.code == "HealthState/unhealthy"
    assert vms[2].instance_view.vm_health is None
    assert first.as_dict() == workers.vm(workers.member("0"), instance_view=True)

    # Without $expand there is no instance view.
    fake.page_size = 500
    fake.clear_requests()
    plain = list(compute.virtual_machine_scale_set_vms.list(RG, "workers"))
    assert len(plain) == 1050 and plain[0].instance_view is None
    assert len(fake.calls("virtualMachineScaleSetVMs.list")) == 3


def test_uniform_instance_ids_are_never_reused(fake: FakeArm, compute: Any) -> None:
    workers = fake.add_scale_set("workers", mode="Uniform", capacity=2)
    workers.remove_member("1")
    assert workers.add_member().instance_id == "2"
    assert workers.capacity == 2
    assert workers.member("workers_2") is workers.member("2")
    vm = compute.virtual_machine_scale_set_vms.get(RG, "workers", "2", expand="instanceView")
    assert vm.name == "workers_2" and statuses(vm)[-1] == "PowerState/running"
    with pytest.raises(ResourceNotFoundError):
        compute.virtual_machine_scale_set_vms.get(RG, "workers", "1")


def test_flexible_vm_list_with_scale_set_filter(fake: FakeArm, compute: Any) -> None:
    a = fake.add_scale_set("a", capacity=3, vm_tags={"set": "a"})
    b = fake.add_scale_set("b", capacity=2, priority="Regular")
    fake.add_scale_set("u", mode="Uniform", capacity=4)  # Uniform VMs are not in this list
    a.set_member(a.keys()[0], health="healthy")

    vms = list(compute.virtual_machines.list(RG, filter=flexible_filter(a), expand="instanceView"))
    assert [vm.name for vm in vms] == a.keys()
    for vm in vms:
        assert vm.name.startswith("a_") and len(vm.name) == len("a_") + 8
        assert vm.virtual_machine_scale_set.id == a.id
        assert vm.hardware_profile.vm_size == "Standard_NC4as_T4_v3"
        assert (vm.priority, vm.eviction_policy) == ("Spot", "Delete")
        assert vm.billing_profile.max_price == -1
        assert vm.provisioning_state == "Succeeded"
        assert statuses(vm) == ["ProvisioningState/succeeded", "PowerState/running"]
        assert vm.tags == {"set": "a"}
        assert vm.network_profile.network_interfaces[0].id == a.member(vm.name).nic_id
    assert vms[0].instance_view.vm_health.status.code == "HealthState/healthy"
    assert vms[0].as_dict() == a.vm(a.member(vms[0].name), instance_view=True)
    [call] = fake.calls("virtualMachines.list")
    assert call.query["$filter"] == flexible_filter(a)
    assert call.query["$expand"] == "instanceView"

    # ARM ids are case-insensitive; the documented form has no quotes around the value.
    loud = f"virtualMachineScaleSet/id eq {b.id.upper()}"
    listed = list(compute.virtual_machines.list(RG, filter=loud))
    assert [vm.name for vm in listed] == b.keys()
    assert listed[0].instance_view is None and listed[0].priority == "Regular"
    assert listed[0].eviction_policy is None

    everything = [vm.name for vm in compute.virtual_machines.list(RG)]
    assert everything == a.keys() + b.keys()

    with pytest.raises(HttpResponseError) as info:
        list(compute.virtual_machines.list(RG, filter="name eq 'x'"))
    assert (info.value.status_code, info.value.error.code) == (400, "InvalidParameter")


def test_flexible_vm_list_expands_the_instance_view_only_with_a_filter(
    fake: FakeArm, compute: Any
) -> None:
    a = fake.add_scale_set("a", capacity=1)
    fake.add_scale_set("b", capacity=1)

    with pytest.raises(HttpResponseError) as info:
        list(compute.virtual_machines.list(RG, expand="instanceView"))
    assert (info.value.status_code, info.value.error.code) == (400, "InvalidParameter")

    fake.vm_filter_ignored = True  # a server that lets every VM of the group through
    listed = compute.virtual_machines.list(RG, filter=flexible_filter(a), expand="instanceView")
    assert len({vm.virtual_machine_scale_set.id for vm in listed}) == 2


def test_flexible_vm_list_pages(fake: FakeArm, compute: Any) -> None:
    big = fake.add_scale_set("big", capacity=250)
    fake.page_size = 100
    assert len(list(compute.virtual_machines.list(RG, filter=flexible_filter(big)))) == 250
    assert len(fake.calls("virtualMachines.list")) == 3


def test_vmss_vm_apis_refuse_flexible_sets(fake: FakeArm, compute: Any, network: Any) -> None:
    fake.add_scale_set("flex", capacity=1)
    with pytest.raises(HttpResponseError) as info:
        list(compute.virtual_machine_scale_set_vms.list(RG, "flex"))
    assert (info.value.status_code, info.value.error.code) == (400, "OperationNotAllowed")
    with pytest.raises(HttpResponseError):
        list(
            network.network_interfaces.list_virtual_machine_scale_set_network_interfaces(RG, "flex")
        )


# ----------------------------------------------------------------------------- NICs


def test_uniform_nics_map_to_their_vms(fake: FakeArm, compute: Any, network: Any) -> None:
    workers = fake.add_scale_set("workers", mode="Uniform", capacity=120)
    nics = list(
        network.network_interfaces.list_virtual_machine_scale_set_network_interfaces(RG, "workers")
    )
    calls = fake.calls("networkInterfaces.listVirtualMachineScaleSetNetworkInterfaces")
    assert len(nics) == 120 and len(calls) == 2
    assert {c.api_version for c in calls} == {"2018-10-01"}
    vms = {vm.id: vm for vm in compute.virtual_machine_scale_set_vms.list(RG, "workers")}
    ips = set()
    for nic in nics:
        vm = vms[nic.virtual_machine.id]
        assert vm.network_profile.network_interfaces[0].id == nic.id
        member = workers.member(vm.instance_id)
        ip = nic.ip_configurations[0].private_ip_address
        assert ip == member.private_ip and ip.startswith("10.")
        assert nic.ip_configurations[0].primary and nic.primary
        ips.add(ip)
    assert len(ips) == 120
    assert nics[0].name == "nic0"
    assert nics[0].as_dict() == workers.nic(workers.member("0"))


def test_flexible_nics_map_to_their_vms(fake: FakeArm, compute: Any, network: Any) -> None:
    flex = fake.add_scale_set("flex", capacity=3)
    other = fake.add_scale_set("other", capacity=1)
    fake.add_scale_set("u", mode="Uniform", capacity=2)  # not in the resource group's NICs
    nics = list(network.network_interfaces.list(RG))
    assert len(nics) == 4
    assert {c.api_version for c in fake.calls("networkInterfaces.list")} == {"2026-03-01"}
    vms = {vm.id: vm for vm in compute.virtual_machines.list(RG, filter=flexible_filter(flex))}
    by_vm = {nic.virtual_machine.id: nic for nic in nics}
    assert set(vms) <= set(by_vm)
    for vm_id, vm in vms.items():
        nic = by_vm[vm_id]
        assert nic.id == vm.network_profile.network_interfaces[0].id
        assert nic.id.startswith(f"/subscriptions/{SUBSCRIPTION}/resourceGroups/rg/providers/")
        assert "/Microsoft.Network/networkInterfaces/" in nic.id
        assert nic.ip_configurations[0].private_ip_address == flex.member(vm.name).private_ip
    assert other.member(other.keys()[0]).id in by_vm

    # One NIC by name: what a hand-written discovery script asks per VM.
    member = flex.member(flex.keys()[0])
    nic = network.network_interfaces.get(RG, member.nic_name)
    assert nic.ip_configurations[0].private_ip_address == member.private_ip
    with pytest.raises(HttpResponseError) as info:
        network.network_interfaces.get(RG, "missing-nic")
    assert (info.value.status_code, info.value.error.code) == (404, "ResourceNotFound")


def test_references_can_spell_the_resource_group_in_upper_case(
    fake: FakeArm, compute: Any, network: Any
) -> None:
    flex = fake.add_scale_set("flex", resource_group="my-rg", capacity=1)
    fake.reference_rg_upper = True
    [vm] = compute.virtual_machines.list("my-rg", filter=flexible_filter(flex))
    [nic] = network.network_interfaces.list("my-rg")
    assert "/resourceGroups/MY-RG/" in vm.virtual_machine_scale_set.id
    assert vm.virtual_machine_scale_set.id.lower() == flex.id.lower()
    assert "/resourceGroups/MY-RG/" in nic.virtual_machine.id
    assert "/resourceGroups/my-rg/" in vm.id and "/resourceGroups/my-rg/" in nic.id


# ----------------------------------------------------------------------------- changes


def test_capacity_update_then_members_advance_to_running(fake: FakeArm, compute: Any) -> None:
    workers = fake.add_scale_set("workers", mode="Uniform", capacity=2)
    poller = compute.virtual_machine_scale_sets.begin_update(
        RG, "workers", {"sku": {"capacity": 4}}
    )
    result = poller.result()
    assert (result.sku.capacity, result.provisioning_state) == (4, "Succeeded")
    assert [r.api for r in fake.requests] == [
        "virtualMachineScaleSets.update",
        "operations.get",  # InProgress
        "operations.get",  # Succeeded
        "virtualMachineScaleSets.get",  # a PATCH's final GET is its own URL
    ]
    patch = fake.calls("virtualMachineScaleSets.update")[0]
    assert patch.body == {"sku": {"capacity": 4}}
    assert workers.capacity == 4
    new = [workers.member(k) for k in ("2", "3")]
    assert [(m.provisioning_state, m.power_state) for m in new] == [("Creating", None)] * 2

    def states() -> list[list[str]]:
        return [
            statuses(vm)
            for vm in compute.virtual_machine_scale_set_vms.list(
                RG, "workers", expand="instanceView"
            )
        ]

    # Every list first moves in-flight members one stage on; a VM being created may
    # briefly report PowerState/stopped (learn.microsoft.com/azure/virtual-machines/
    # states-billing).
    assert states()[2:] == [["ProvisioningState/creating", "PowerState/stopped"]] * 2
    assert states()[2:] == [["ProvisioningState/succeeded", "PowerState/starting"]] * 2
    assert states()[2:] == [["ProvisioningState/succeeded", "PowerState/running"]] * 2
    assert workers.is_stable()

    # Scale in: the newest members are deleted.
    compute.virtual_machine_scale_sets.begin_update(
        RG, "workers", {"sku": {"capacity": 1}}
    ).result()
    assert [m.provisioning_state for m in workers.members] == [
        "Succeeded",
        "Deleting",
        "Deleting",
        "Deleting",
    ]
    assert [vm.instance_id for vm in compute.virtual_machine_scale_set_vms.list(RG, "workers")] == [
        "0"
    ]


def test_update_answers_updating_until_its_operation_is_done(fake: FakeArm, compute: Any) -> None:
    workers = fake.add_scale_set("workers", capacity=1)
    workers.auto_advance = False
    fake.lro_in_progress_polls = 3
    poller = compute.virtual_machine_scale_sets.begin_update(
        RG, "workers", {"sku": {"capacity": 3}}, polling=False
    )
    assert poller.done()  # polling=False: the initial answer is the result
    patch_answer = poller.result()
    assert (patch_answer.provisioning_state, patch_answer.sku.capacity) == ("Updating", 3)
    assert compute.virtual_machine_scale_sets.get(RG, "workers").provisioning_state == "Updating"
    [op] = fake.operations
    assert op.status == "InProgress"
    workers.advance()  # advancing a set also finishes its operations
    assert op.status == "Succeeded"
    assert compute.virtual_machine_scale_sets.get(RG, "workers").provisioning_state == "Succeeded"
    assert [m.power_state for m in workers.members] == ["running", "stopped", "stopped"]
    fake.stopped_while_creating = False
    workers.add_member(provisioning_state="Creating", power_state=None)
    workers.advance()
    assert [m.power_state for m in workers.members] == ["running"] + ["starting"] * 3


def test_delete_instances_uniform_drops_capacity(fake: FakeArm, compute: Any) -> None:
    workers = fake.add_scale_set("workers", mode="Uniform", capacity=4)
    result = compute.virtual_machine_scale_sets.begin_delete_instances(
        RG, "workers", {"instanceIds": ["0", "2"]}
    ).result()
    assert result is None
    assert [r.api for r in fake.requests] == [
        "virtualMachineScaleSets.deleteInstances",
        "operations.get",
        "operations.get",
        "operations.get",  # a POST's final GET is its Location URL
    ]
    assert fake.requests[-1].query["monitor"] == "true"
    assert fake.calls("virtualMachineScaleSets.deleteInstances")[0].body == {
        "instanceIds": ["0", "2"]
    }
    assert workers.capacity == 2
    assert [workers.member(k).provisioning_state for k in ("0", "2")] == ["Deleting"] * 2
    vms = list(compute.virtual_machine_scale_set_vms.list(RG, "workers"))
    assert [vm.instance_id for vm in vms] == ["1", "3"]
    assert compute.virtual_machine_scale_sets.get(RG, "workers").sku.capacity == 2

    with pytest.raises(HttpResponseError) as info:
        compute.virtual_machine_scale_sets.begin_delete_instances(
            RG, "workers", {"instanceIds": ["0"]}
        )
    assert (info.value.status_code, info.value.error.code) == (400, "InvalidParameter")


def test_delete_vm_flexible_drops_capacity(fake: FakeArm, compute: Any) -> None:
    flex = fake.add_scale_set("flex", capacity=3)
    victim = flex.keys()[1]
    assert compute.virtual_machines.begin_delete(RG, victim).result() is None
    assert [r.api for r in fake.requests] == [
        "virtualMachines.delete",
        "operations.get",
        "operations.get",
    ]
    assert flex.capacity == 2
    assert flex.member(victim).provisioning_state == "Deleting"
    names = [vm.name for vm in compute.virtual_machines.list(RG, filter=flexible_filter(flex))]
    assert victim not in names and len(names) == 2
    assert compute.virtual_machine_scale_sets.get(RG, "flex").sku.capacity == 2

    # Deleting what is not there answers 204, which the poller takes as done.
    fake.clear_requests()
    assert compute.virtual_machines.begin_delete(RG, victim).result() is None
    assert [(r.api, r.status) for r in fake.requests] == [("virtualMachines.delete", 204)]


@pytest.mark.parametrize("mode", ["Uniform", "Flexible"])
def test_evict_with_both_policies(fake: FakeArm, compute: Any, mode: str) -> None:
    keep = fake.add_scale_set("keep", mode=mode, capacity=2, eviction_policy="Deallocate")
    drop = fake.add_scale_set("drop", mode=mode, capacity=2, eviction_policy="Delete")

    def listed(scale_set: Any) -> dict[str, Any]:
        if mode == "Uniform":
            vms = compute.virtual_machine_scale_set_vms.list(
                RG, scale_set.name, expand="instanceView"
            )
            return {vm.instance_id: vm for vm in vms}
        vms = compute.virtual_machines.list(
            RG, filter=flexible_filter(scale_set), expand="instanceView"
        )
        return {vm.name: vm for vm in vms}

    evicted = keep.keys()[0]
    keep.evict(evicted)
    vms = listed(keep)
    assert len(vms) == 2 and keep.capacity == 2
    assert statuses(vms[evicted]) == ["ProvisioningState/succeeded", "PowerState/deallocated"]

    gone = drop.keys()[0]
    drop.evict(gone)
    assert list(listed(drop)) == [drop.keys()[0]] != [gone]
    assert compute.virtual_machine_scale_sets.get(RG, "drop").sku.capacity == 1


def test_a_set_that_restores_evicted_spot_vms(fake: FakeArm, compute: Any) -> None:
    workers = fake.add_scale_set("workers", capacity=2, spot_restore=True)
    restore = compute.virtual_machine_scale_sets.get(RG, "workers").spot_restore_policy
    assert (restore.enabled, restore.restore_timeout) == (True, "PT1H")
    assert fake.add_scale_set("plain").record()["properties"].get("spotRestorePolicy") is None

    evicted = workers.keys()[0]
    workers.evict(evicted)

    assert evicted not in [m.name for m in workers.members] and workers.capacity == 2
    assert [m.provisioning_state for m in workers.members] == ["Succeeded", "Creating"]


def test_creation_passes_stopped_and_a_start_from_deallocated_too(fake: FakeArm) -> None:
    workers = fake.add_scale_set("workers", capacity=1, eviction_policy="Deallocate")
    workers.auto_advance = False
    new = workers.add_member(provisioning_state="Creating", power_state=None)
    seen = []
    for _ in range(3):
        workers.advance()
        seen.append((new.provisioning_state, new.power_state))
    assert seen == [("Creating", "stopped"), ("Succeeded", "starting"), ("Succeeded", "running")]

    workers.evict(new.name)
    workers.start(new.name)
    assert (new.provisioning_state, new.power_state) == ("Updating", "stopped")
    workers.advance()
    assert (new.provisioning_state, new.power_state) == ("Succeeded", "running")


def test_a_state_conflict_refuses_updates_without_quota_words(fake: FakeArm, compute: Any) -> None:
    workers = fake.add_scale_set("workers", capacity=1)
    workers.state_conflict(1)

    with pytest.raises(ResourceExistsError) as info:
        compute.virtual_machine_scale_sets.begin_update(RG, "workers", {"sku": {"capacity": 2}})
    assert (info.value.status_code, info.value.error.code) == (409, "OperationNotAllowed")
    assert "is marked for deletion" in info.value.error.message
    assert "quota" not in info.value.error.message.lower()
    assert workers.capacity == 1
    compute.virtual_machine_scale_sets.begin_update(RG, "workers", {"sku": {"capacity": 2}})
    assert workers.capacity == 2


def test_failed_creations_with_a_power_state(fake: FakeArm, compute: Any) -> None:
    workers = fake.add_scale_set("workers", mode="Uniform", capacity=1, max_price=0.1)
    workers.capacity_error("SpotPriceGreaterThanProvidedMaxPrice", power_state="stopped")
    poller = compute.virtual_machine_scale_sets.begin_update(
        RG, "workers", {"sku": {"capacity": 2}}
    )
    with pytest.raises(HttpResponseError) as info:
        poller.result()

    assert info.value.error.code == "SpotPriceGreaterThanProvidedMaxPrice"
    assert "provided max price '0.1 USD' is lower than" in info.value.error.message
    [_, failed] = compute.virtual_machine_scale_set_vms.list(RG, "workers", expand="instanceView")
    assert statuses(failed) == [
        "ProvisioningState/failed/SpotPriceGreaterThanProvidedMaxPrice",
        "PowerState/stopped",
    ]


def test_capacity_error_in_the_operation(fake: FakeArm, compute: Any) -> None:
    workers = fake.add_scale_set("workers", mode="Uniform", capacity=1)
    workers.capacity_error("SkuNotAvailable")
    poller = compute.virtual_machine_scale_sets.begin_update(
        RG, "workers", {"sku": {"capacity": 2}}
    )
    with pytest.raises(HttpResponseError) as info:
        poller.result()
    assert info.value.error.code == "SkuNotAvailable"
    assert "Standard_NC4as_T4_v3" in info.value.error.message
    [vm0, vm1] = compute.virtual_machine_scale_set_vms.list(RG, "workers", expand="instanceView")
    assert vm1.provisioning_state == "Failed"
    assert statuses(vm1) == ["ProvisioningState/failed/SkuNotAvailable"]
    assert vm1.instance_view.statuses[0].level == "Error"
    assert statuses(vm0)[-1] == "PowerState/running"
    assert workers.capacity == 2  # the failed VM still counts
    # The failed status says when (InstanceViewStatus.time), and nothing when it is unknown.
    assert vm1.instance_view.statuses[0].time == workers.member("1").failed_at is not None
    workers.set_member("1", failed_at=None)
    raw = fake.handle(
        "GET",
        f"{workers.id}/virtualMachines",
        {"api-version": "2024-07-01", "$expand": "instanceView"},
        None,
    )[1]["value"][1]["properties"]["instanceView"]["statuses"][0]
    assert raw["code"] == "ProvisioningState/failed/SkuNotAvailable" and "time" not in raw


@pytest.mark.parametrize("creating_view", [False, True])
def test_a_vm_being_created_has_no_nic_and_at_most_a_creating_status(
    fake: FakeArm, compute: Any, network: Any, creating_view: bool
) -> None:
    workers = fake.add_scale_set("workers", mode="Uniform", capacity=1)
    workers.auto_advance = False
    fake.creating_instance_view = creating_view
    compute.virtual_machine_scale_sets.begin_update(RG, "workers", {"sku": {"capacity": 2}})

    [_, new] = compute.virtual_machine_scale_set_vms.list(RG, "workers", expand="instanceView")

    assert new.provisioning_state == "Creating"
    if creating_view:
        assert statuses(new) == ["ProvisioningState/creating"]  # no PowerState yet
    else:
        assert new.instance_view is None
    nics = network.network_interfaces.list_virtual_machine_scale_set_network_interfaces(
        RG, "workers"
    )
    assert [n.virtual_machine.id for n in nics] == [workers.member("0").id]


def test_a_scale_out_beyond_a_vcpu_quota_is_refused(fake: FakeArm, compute: Any) -> None:
    spot = fake.add_scale_set("spot", capacity=1)  # Standard_NC4as_T4_v3: 4 vCPUs
    other = fake.add_scale_set("other", resource_group="rg-b", capacity=1)
    regular = fake.add_scale_set("regular", capacity=1, priority="Regular")
    fake.set_quota("LowPriorityCores", 12)  # spot VMs of every set count against it

    compute.virtual_machine_scale_sets.begin_update(RG, "spot", {"sku": {"capacity": 2}})
    with pytest.raises(ResourceExistsError) as info:
        compute.virtual_machine_scale_sets.begin_update(RG, "spot", {"sku": {"capacity": 3}})

    assert (info.value.status_code, info.value.error.code) == (409, "OperationNotAllowed")
    assert (
        "exceeding approved LowPriorityCores quota. Additional details - Deployment Model:"
        " Resource Manager, Location: eastus, Current Limit: 12, Current Usage: 12,"
        " Additional Required: 4, (Minimum) New Limit Required: 16."
    ) in info.value.error.message
    assert (spot.capacity, other.capacity) == (2, 1)
    # Regular VMs count against their family's quota, not the spot one.
    compute.virtual_machine_scale_sets.begin_update(RG, "regular", {"sku": {"capacity": 3}})
    fake.set_quota("standardNCASv3_T4Family", 12)
    with pytest.raises(ResourceExistsError, match="standardNCASv3_T4Family quota"):
        compute.virtual_machine_scale_sets.begin_update(RG, "regular", {"sku": {"capacity": 4}})
    fake.set_quota("LowPriorityCores", None)
    compute.virtual_machine_scale_sets.begin_update(RG, "spot", {"sku": {"capacity": 3}})
    assert (spot.capacity, regular.capacity) == (3, 3)


def test_spot_priority_mix(fake: FakeArm, compute: Any) -> None:
    fake.add_scale_set("mixed", capacity=5, priority_mix=(2, 34))
    fake.add_scale_set("half", priority_mix=(None, 50))
    with pytest.raises(ValueError, match="Flexible set of Spot priority"):
        fake.add_scale_set("uniform", mode="Uniform", priority_mix=(1, 50))

    mixed = compute.virtual_machine_scale_sets.get(RG, "mixed")
    half = compute.virtual_machine_scale_sets.get(RG, "half")

    policy = mixed.properties.priority_mix_policy
    assert (policy.base_regular_priority_count, policy.regular_priority_percentage_above_base) == (
        2,
        34,
    )
    assert mixed.properties.virtual_machine_profile.priority == "Spot"
    # An absent field is left out, as ARM leaves out what was never set.
    assert half.as_dict()["properties"]["priorityMixPolicy"] == {
        "regularPriorityPercentageAboveBase": 50
    }
    vms = compute.virtual_machines.list(RG, filter=flexible_filter(mixed))
    # The base 2 are Regular, then one in three above it.
    assert [vm.priority for vm in vms] == ["Regular", "Regular", "Spot", "Spot", "Regular"]
    for vm in compute.virtual_machines.list(RG, filter=flexible_filter(mixed)):
        assert (vm.eviction_policy is None) == (vm.priority == "Regular")


def test_quota_error_rejects_the_request(fake: FakeArm, compute: Any) -> None:
    workers = fake.add_scale_set("workers", capacity=1)
    workers.capacity_error("OperationNotAllowed")
    with pytest.raises(ResourceExistsError) as info:  # the SDK maps 409 to ResourceExistsError
        compute.virtual_machine_scale_sets.begin_update(RG, "workers", {"sku": {"capacity": 3}})
    assert (info.value.status_code, info.value.error.code) == (409, "OperationNotAllowed")
    assert "LowPriorityCores quota" in info.value.error.message
    assert workers.capacity == 1 and len(workers.keys()) == 1
    # Shrinking is still allowed; clearing the error allows growing again.
    compute.virtual_machine_scale_sets.begin_update(
        RG, "workers", {"sku": {"capacity": 0}}
    ).result()
    workers.clear_capacity_error()
    compute.virtual_machine_scale_sets.begin_update(
        RG, "workers", {"sku": {"capacity": 2}}
    ).result()
    assert workers.capacity == 2


def test_lro_retry_after_overrides_the_polling_interval(fake: FakeArm) -> None:
    fake.add_scale_set("workers", capacity=1)
    fake.lro_retry_after = 0.05
    slow = ComputeManagementClient(**client_kwargs(fake, polling_interval=30))
    started = time.monotonic()
    slow.virtual_machine_scale_sets.begin_update(RG, "workers", {"sku": {"capacity": 2}}).result()
    assert time.monotonic() - started < 5
    assert [r.api for r in fake.requests].count("operations.get") == 2


def test_invalid_capacity(fake: FakeArm, compute: Any) -> None:
    fake.add_scale_set("workers", capacity=1)
    with pytest.raises(HttpResponseError) as info:
        compute.virtual_machine_scale_sets.begin_update(RG, "workers", {"sku": {"capacity": -1}})
    assert (info.value.status_code, info.value.error.code) == (400, "InvalidParameter")


# ----------------------------------------------------------------------------- SKUs


def test_resource_sku_list(fake: FakeArm, compute: Any) -> None:
    skus = list(compute.resource_skus.list(filter="location eq 'eastus'"))
    [call] = fake.calls("resourceSkus.list")
    assert call.api_version == "2021-07-01"
    assert call.query["$filter"] == "location eq 'eastus'"
    vms = {s.name: s for s in skus if s.resource_type == "virtualMachines"}
    assert {s.resource_type for s in skus} == {"virtualMachines", "disks"}

    def gpus(name: str) -> str | None:
        caps = {c.name: c.value for c in vms[name].capabilities}
        return caps.get("GPUs")

    assert gpus("Standard_NC4as_T4_v3") == "1"
    assert gpus("Standard_NC64as_T4_v3") == "4"
    assert gpus("Standard_D4s_v5") is None
    nc4 = vms["Standard_NC4as_T4_v3"]
    assert nc4.locations == ["eastus"] and nc4.location_info[0].zones == ["1", "2", "3"]
    assert nc4.family == "standardNCASv3_T4Family" and nc4.size == "NC4as_T4_v3"
    assert {c.name: c.value for c in nc4.capabilities}["vCPUs"] == "4"
    assert nc4.restrictions == []

    fake.add_sku("Standard_NC6s_v3", vcpus=6, memory_gb=112, gpus=1, restricted=True)
    fake.add_sku("Standard_NV6", vcpus=6, memory_gb=56, gpus=1, locations=["westus2"])
    restricted = next(
        s
        for s in compute.resource_skus.list(filter="location eq 'eastus'")
        if s.name.endswith("v3") and s.restrictions
    )
    assert restricted.restrictions[0].reason_code == "NotAvailableForSubscription"
    assert [s.name for s in compute.resource_skus.list(filter="location eq 'westus2'")] == [
        "Standard_NV6"
    ]
    assert len(list(compute.resource_skus.list())) == len(fake.skus)
    fake.page_size = 3
    fake.clear_requests()
    assert len(list(compute.resource_skus.list())) == len(fake.skus) == 10
    assert len(fake.calls("resourceSkus.list")) == 4


# ----------------------------------------------------------------------------- errors


def test_not_found_errors(fake: FakeArm, compute: Any, network: Any) -> None:
    fake.add_scale_set("workers", capacity=1)
    with pytest.raises(ResourceNotFoundError) as info:
        compute.virtual_machine_scale_sets.get("nope", "workers")
    assert info.value.status_code == 404
    assert info.value.error.code == "ResourceGroupNotFound"
    assert info.value.error.message == "Resource group 'nope' could not be found."

    with pytest.raises(ResourceNotFoundError) as info:
        compute.virtual_machine_scale_sets.get(RG, "ghost")
    assert info.value.error.code == "ResourceNotFound"
    assert info.value.error.message == (
        "The Resource 'Microsoft.Compute/virtualMachineScaleSets/ghost' under resource group "
        "'rg' was not found. For more details please go to https://aka.ms/ARMResourceNotFoundFix"
    )
    with pytest.raises(ResourceNotFoundError):
        list(compute.virtual_machine_scale_set_vms.list(RG, "ghost"))
    with pytest.raises(ResourceNotFoundError):
        list(network.network_interfaces.list("nope"))
    with pytest.raises(ResourceNotFoundError):
        compute.virtual_machine_scale_sets.begin_update(RG, "ghost", {"sku": {"capacity": 1}})

    other = ComputeManagementClient(
        **{**client_kwargs(fake), "subscription_id": "11111111-1111-1111-1111-111111111111"}
    )
    with pytest.raises(ResourceNotFoundError) as info:
        other.virtual_machine_scale_sets.get(RG, "workers")
    assert info.value.error.code == "SubscriptionNotFound"

    fake.add_resource_group("empty")
    assert list(compute.virtual_machines.list("empty")) == []


def test_permission_denied(fake: FakeArm, compute: Any) -> None:
    workers = fake.add_scale_set("workers", mode="Uniform", capacity=1)
    fake.deny("Microsoft.Compute/virtualMachineScaleSets/read")
    with pytest.raises(HttpResponseError) as info:
        compute.virtual_machine_scale_sets.get(RG, "workers")
    error = info.value
    assert type(error) is HttpResponseError
    assert (error.status_code, error.error.code) == (403, "AuthorizationFailed")
    assert error.error.message == (
        f"The client '{fake.client_id}' with object id '{fake.object_id}' does not have "
        "authorization to perform action 'Microsoft.Compute/virtualMachineScaleSets/read' over "
        f"scope '{workers.id}' or the scope is invalid. If access was recently granted, please "
        "refresh your credentials."
    )
    # RBAC comes before existence: a missing set is 403 too.
    with pytest.raises(HttpResponseError) as info:
        compute.virtual_machine_scale_sets.get(RG, "ghost")
    assert info.value.status_code == 403
    # Other actions still work.
    assert len(list(compute.virtual_machine_scale_set_vms.list(RG, "workers"))) == 1

    fake.deny(PERMISSIONS["virtualMachineScaleSets.update"])
    with pytest.raises(HttpResponseError) as info:
        compute.virtual_machine_scale_sets.begin_update(RG, "workers", {"sku": {"capacity": 2}})
    assert info.value.status_code == 403
    assert "'Microsoft.Compute/virtualMachineScaleSets/write'" in info.value.error.message
    fake.allow()
    assert compute.virtual_machine_scale_sets.get(RG, "workers").sku.capacity == 1


def test_every_route_has_a_permission() -> None:
    prefix = f"/subscriptions/{SUBSCRIPTION}/resourceGroups/rg/providers"
    vmss = f"{prefix}/Microsoft.Compute/virtualMachineScaleSets/w"
    paths = {
        ("GET", vmss): "virtualMachineScaleSets.get",
        ("PATCH", vmss): "virtualMachineScaleSets.update",
        ("POST", f"{vmss}/delete"): "virtualMachineScaleSets.deleteInstances",
        ("GET", f"{vmss}/virtualMachines"): "virtualMachineScaleSetVMs.list",
        ("GET", f"{vmss}/networkInterfaces"): (
            "networkInterfaces.listVirtualMachineScaleSetNetworkInterfaces"
        ),
        ("GET", f"{prefix}/Microsoft.Compute/virtualMachines"): "virtualMachines.list",
        ("DELETE", f"{prefix}/Microsoft.Compute/virtualMachines/v"): "virtualMachines.delete",
        ("GET", f"{prefix}/Microsoft.Network/networkInterfaces"): "networkInterfaces.list",
        ("GET", f"{prefix}/Microsoft.Network/networkInterfaces/n"): "networkInterfaces.get",
        ("GET", f"/subscriptions/{SUBSCRIPTION}/providers/Microsoft.Compute/skus"): (
            "resourceSkus.list"
        ),
    }
    for (method, path), api in paths.items():
        route = _route(method, path)
        assert route is not None and route[0] == api, (method, path)
        assert api in PERMISSIONS
    assert PERMISSIONS["resourceSkus.list"] == "Microsoft.Compute/skus/read"


# ----------------------------------------------------------------------------- throttling/faults


def test_throttling_and_the_sdk_retry_policy(fake: FakeArm, compute: Any) -> None:
    fake.add_scale_set("workers", capacity=1)

    # Default RetryPolicy: one 429 costs one retry, after sleeping Retry-After.
    fake.fail_next(1, 429, retry_after=0.01)
    assert compute.virtual_machine_scale_sets.get(RG, "workers").sku.capacity == 1
    assert [(r.status, r.fault) for r in fake.requests] == [(429, "error"), (200, None)]

    # It gives up after retry_total=3 retries: 4 requests, then the 429 is raised.
    fake.clear_requests()
    fake.fail_next(10, 429, retry_after=0.01)
    with pytest.raises(HttpResponseError) as info:
        compute.virtual_machine_scale_sets.get(RG, "workers")
    assert len(fake.requests) == 4
    assert (info.value.status_code, info.value.error.code) == (429, "TooManyRequests")
    assert info.value.response.headers["Retry-After"] == "0.01"

    # retry_total=0: the first 429 is raised, with Retry-After (1 s unless told otherwise).
    fake.clear_faults()
    fake.clear_requests()
    once = ComputeManagementClient(**client_kwargs(fake, retry_total=0))
    fake.fail_next(1, 429)
    with pytest.raises(HttpResponseError) as info:
        once.virtual_machine_scale_sets.get(RG, "workers")
    assert len(fake.requests) == 1
    assert info.value.status_code == 429
    assert info.value.response.headers["Retry-After"] == "1"


def test_retry_policy_depends_on_method_and_retry_after(fake: FakeArm, compute: Any) -> None:
    workers = fake.add_scale_set("workers", capacity=1)
    body = {"sku": {"capacity": 1}}

    def updates() -> int:
        return len(fake.calls("virtualMachineScaleSets.update"))

    # PATCH (and POST): a 502 without Retry-After is not retried ...
    fake.fail_next(1, 502)
    with pytest.raises(HttpResponseError) as info:
        compute.virtual_machine_scale_sets.begin_update(RG, "workers", body)
    assert (info.value.status_code, updates()) == (502, 1)
    # ... a 503 is ...
    fake.clear_requests()
    fake.fail_next(1, 503)
    compute.virtual_machine_scale_sets.begin_update(RG, "workers", body).result()
    assert updates() == 2
    # ... and so is anything with Retry-After, whatever the status.
    fake.clear_requests()
    fake.fail_next(1, 409, retry_after=0.01)
    compute.virtual_machine_scale_sets.begin_update(RG, "workers", body).result()
    assert updates() == 2
    # A dropped PATCH is not retried (a dropped GET is: see below).
    fake.clear_requests()
    fake.fail_next(1, kind="drop", match="virtualMachineScaleSets.update")
    with pytest.raises(ServiceResponseError):
        compute.virtual_machine_scale_sets.begin_update(RG, "workers", body)
    assert updates() == 1
    assert workers.capacity == 1


def test_server_errors_faults_and_matching(fake: FakeArm, compute: Any) -> None:
    fake.add_scale_set("workers", mode="Uniform", capacity=1)
    once = ComputeManagementClient(**client_kwargs(fake, retry_total=0))

    fake.fail_next(1, 500, match="virtualMachineScaleSetVMs.list")
    assert once.virtual_machine_scale_sets.get(RG, "workers")  # not matched
    with pytest.raises(HttpResponseError) as info:
        list(once.virtual_machine_scale_set_vms.list(RG, "workers"))
    assert (info.value.status_code, info.value.error.code) == (500, "InternalServerError")

    # The default policy retries a 5xx at once (no backoff before the first retry).
    fake.fail_next(1, 503, match="/virtualMachines")
    assert len(list(compute.virtual_machine_scale_set_vms.list(RG, "workers"))) == 1

    # A dropped connection: raised without retries, retried with the default policy.
    fake.fail_next(1, kind="drop")
    with pytest.raises((ServiceResponseError, ServiceRequestError)):
        once.virtual_machine_scale_sets.get(RG, "workers")
    fake.fail_next(1, kind="drop")
    assert compute.virtual_machine_scale_sets.get(RG, "workers")

    # A hang longer than the read timeout.
    fake.fail_next(1, kind="hang", seconds=1.0)
    with pytest.raises(ServiceResponseError):
        once.virtual_machine_scale_sets.get(RG, "workers", read_timeout=0.2)

    fake.clear_requests()
    fake.fail_rate(1.0, [502], match="virtualMachineScaleSets.get", seed=1)
    with pytest.raises(HttpResponseError) as info:
        once.virtual_machine_scale_sets.get(RG, "workers")
    assert info.value.error.code == "BadGateway"
    fake.clear_faults()
    assert once.virtual_machine_scale_sets.get(RG, "workers")
    assert [r.fault for r in fake.requests] == ["error", None]


def test_raw_http_edges(fake: FakeArm) -> None:
    workers = fake.add_scale_set("workers", capacity=1)

    def get(path: str) -> tuple[int, dict[str, Any]]:
        try:
            with urllib.request.urlopen(fake.url + path) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read())

    status, body = get(workers.id)
    assert (status, body["error"]["code"]) == (400, "MissingApiVersionParameter")
    status, body = get(workers.id + "?api-version=2024-07-01")  # any version is accepted
    assert (status, body["sku"]["capacity"]) == (200, 1)
    assert fake.requests[-1].api_version == "2024-07-01"
    status, body = get(f"/subscriptions/{SUBSCRIPTION}/nothing?api-version=1")
    assert (status, body["error"]["code"]) == (404, "NotFound")
    assert fake.requests[-1].api is None
    status, body = get(
        f"/subscriptions/{SUBSCRIPTION}/resourceGroups/rg/providers/Microsoft.Compute/"
        "virtualMachines?api-version=2026-04-01&$skiptoken=bogus"
    )
    assert (status, body["error"]["code"]) == (400, "InvalidParameter")
