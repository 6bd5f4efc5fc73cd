"""States Azure documents, and answers it may give, that the Azure provider must read
right (#32): each against the fake ARM server (tests/fakes/azure.py), with the real
azure-mgmt clients.

- A VM being created, or started from deallocated, may briefly report
  ``PowerState/stopped``: PENDING, not a VM going away.
- A failed creation shows ``Failed`` with any power state but running; the scale-out's
  operation carries the error too.
- 409 ``OperationNotAllowed`` is a quota refusal only when its message names a quota;
  a state conflict is retried. ``SpotPriceGreaterThanProvidedMaxPrice`` is a price
  refusal.
- One odd member (a running VM listed without its power state) costs only itself.
- A Flexible set's members are the VMs that name it, whatever the server's filter let
  through, and are deleted by the id they were listed with.
- An eviction notice grows the set once per VM, and the growth is taken back where
  Azure keeps it (a set that restores evicted spot VMs itself).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import pytest

pytest.importorskip("azure.mgmt.compute", reason="the azure extra is not installed")

from spotring.core.capacity import ShortageCause
from spotring.providers.azure import AzureProvider
from spotring.providers.base import InstanceState, InterruptionNotice, ProviderError
from tests.fakes.azure import FakeArm
from tests.providers.test_azure_provider import make_provider, members, steer

MODES = ["Uniform", "Flexible"]


@pytest.fixture
def fake() -> Iterator[FakeArm]:
    with FakeArm() as server:
        yield server


def listed_states(provider: AzureProvider) -> dict[str, InstanceState]:
    return {i.id: i.state for i in provider.list_instances()}


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


# ------------------------------------------------------------- transient stopped


@pytest.mark.parametrize("mode", MODES)
def test_a_vm_being_created_may_report_stopped_and_is_pending(fake: FakeArm, mode: str) -> None:
    vmss = fake.add_scale_set("workers", mode=mode, capacity=1)
    vmss.auto_advance = False
    provider = make_provider(fake)
    before = set(members(vmss))
    provider.set_target_size(2)
    (new,) = set(members(vmss)) - before

    seen = []
    while not vmss.is_stable():
        vmss.advance()
        member = members(vmss)[new]
        seen.append((member.provisioning_state, member.power_state, listed_states(provider)[new]))

    assert ("Creating", "stopped", InstanceState.PENDING) in seen
    assert [state for *_, state in seen] == [InstanceState.PENDING] * (len(seen) - 1) + [
        InstanceState.READY
    ]


def test_a_vm_started_from_deallocated_may_report_stopped_and_is_pending(fake: FakeArm) -> None:
    vmss = fake.add_scale_set("workers", capacity=2, eviction_policy="Deallocate")
    vmss.auto_advance = False
    provider = make_provider(fake, keep_evicted=True)
    victim = provider.list_instances()[0].id
    vmss.evict(members(vmss)[victim].key)
    assert listed_states(provider)[victim] is InstanceState.GONE

    vmss.start(members(vmss)[victim].key)  # Updating, PowerState/stopped
    assert listed_states(provider)[victim] is InstanceState.PENDING
    vmss.advance()
    assert listed_states(provider)[victim] is InstanceState.READY
    # Stopped once provisioning settled is stopped.
    vmss.set_member(members(vmss)[victim].key, power_state="stopped")
    assert listed_states(provider)[victim] is InstanceState.TERMINATING


# -------------------------------------------------------------- failed creations


@pytest.mark.parametrize("power", ["stopped", "deallocated", "starting"])
def test_failed_with_a_power_state_but_running_is_a_creation_failure(
    fake: FakeArm, power: str
) -> None:
    vmss = fake.add_scale_set("workers", capacity=2, priority="Regular")
    key = vmss.keys()[1]
    vmss.set_member(
        key, provisioning_state="Failed", power_state=power, error_code="ZonalAllocationFailed"
    )
    provider = make_provider(fake)

    failed = {i.id: i for i in provider.list_instances()}[members(vmss)[key].name]

    assert failed.failure == "provisioning failed: ZonalAllocationFailed"
    assert failed.state is InstanceState.DRAINING
    shortage = provider.capacity_shortage(0.0)
    assert shortage is not None
    assert (shortage.cause, shortage.code) == (ShortageCause.CAPACITY, "ZonalAllocationFailed")


@pytest.mark.parametrize(
    ("code", "cause"),
    [
        ("ZonalAllocationFailed", ShortageCause.CAPACITY),
        ("SpotPriceGreaterThanProvidedMaxPrice", ShortageCause.PRICE),
    ],
)
def test_the_scale_outs_operation_error_is_a_shortage(
    fake: FakeArm, code: str, cause: ShortageCause
) -> None:
    vmss = fake.add_scale_set("workers", capacity=1, max_price=0.2)
    vmss.capacity_error(code, when="operation")
    provider = make_provider(fake)
    provider.set_target_size(3)  # no listing sees the failed VMs: the operation tells

    assert provider.capacity_shortage(0.0) is None  # InProgress
    shortage = provider.capacity_shortage(0.0)  # Failed

    assert shortage is not None and (shortage.cause, shortage.code) == (cause, code)
    assert len(fake.calls("operations.get")) == 2
    assert provider.capacity_shortage(0.0) == shortage
    assert len(fake.calls("operations.get")) == 2, "a finished operation is read once"


def test_a_price_refusal_of_the_request_is_not_retried(fake: FakeArm) -> None:
    vmss = fake.add_scale_set("workers", capacity=1, max_price=0.2)
    vmss.capacity_error("SpotPriceGreaterThanProvidedMaxPrice", when="request")
    provider = make_provider(fake)

    with pytest.raises(ProviderError, match="cannot grow: Unable to perform operation"):
        provider.set_target_size(2)

    assert len(fake.calls("virtualMachineScaleSets.update")) == 1
    shortage = provider.capacity_shortage(0.0)
    assert shortage is not None and shortage.cause is ShortageCause.PRICE


# ------------------------------------------------------------------- 409 conflicts


def test_a_state_conflict_is_retried_not_taken_for_a_quota(fake: FakeArm) -> None:
    vmss = fake.add_scale_set("workers", capacity=1)
    provider = make_provider(fake)
    provider.list_instances()
    vmss.state_conflict(1)  # 409 OperationNotAllowed: "... marked for deletion"

    provider.set_target_size(2)

    assert [u.status for u in fake.calls("virtualMachineScaleSets.update")] == [409, 200]
    assert vmss.capacity == 2
    assert provider.capacity_shortage(0.0) is None


# ---------------------------------------------------------------- one odd member


@pytest.mark.parametrize("mode", MODES)
def test_a_running_vm_without_its_power_state_costs_only_itself(
    fake: FakeArm, mode: str, caplog: pytest.LogCaptureFixture
) -> None:
    vmss = fake.add_scale_set("workers", mode=mode, capacity=3)
    odd = vmss.keys()[1]
    # "in some rare situations, the power state may not [be] available"
    vmss.set_member(odd, power_state=None)
    provider = make_provider(fake)
    caplog.set_level(logging.INFO, logger="spotring.providers")

    for _ in range(3):
        states = listed_states(provider)
        assert len(states) == 3
        assert states.pop(vmss.member(odd).name) is InstanceState.PENDING
        assert set(states.values()) == {InstanceState.READY}
    assert len(warnings(caplog)) == 1, warnings(caplog)
    assert "without its power state" in warnings(caplog)[0]

    vmss.set_member(odd, power_state="running")
    assert set(listed_states(provider).values()) == {InstanceState.READY}
    assert any(r.getMessage().endswith(": resolved") for r in caplog.records)


# ------------------------------------------------------------ Flexible membership


def test_a_flexible_sets_members_are_the_vms_that_name_it(
    fake: FakeArm, caplog: pytest.LogCaptureFixture
) -> None:
    ours = fake.add_scale_set("workers", capacity=2)
    theirs = fake.add_scale_set("others", capacity=2)
    fake.vm_filter_ignored = True  # the server answers every VM of the resource group
    provider = make_provider(fake)

    for _ in range(2):
        assert set(listed_states(provider)) == set(members(ours))
    assert len(warnings(caplog)) == 1 and "other scale sets" in warnings(caplog)[0]

    provider.replace_instance(next(iter(members(theirs))))
    assert not fake.calls("virtualMachines.delete")
    victim = next(iter(members(ours).values()))
    provider.replace_instance(victim.name)
    (delete,) = fake.calls("virtualMachines.delete")
    assert delete.path.lower() == victim.id.lower()  # by the id it was listed with
    assert len(theirs.members) == 2


# --------------------------------------------------------------- eviction notices


def test_a_notice_grows_the_set_once_per_vm(fake: FakeArm) -> None:
    fake.add_scale_set("workers", capacity=2)
    provider = make_provider(fake)
    provider.set_target_size(2)
    victim = provider.list_instances()[0]

    # Two distinct notices for one VM (two events, or two deadlines).
    provider.host_noticed(victim, InterruptionNotice("preempt", time.time() + 30))
    provider.host_noticed(victim, InterruptionNotice("preempt", time.time() + 31))
    steer(provider, 3)

    assert [u.body for u in fake.calls("virtualMachineScaleSets.update")] == [
        {"sku": {"capacity": 3}}
    ]


def test_a_notices_growth_is_taken_back_where_the_set_restores_the_vm(
    fake: FakeArm, caplog: pytest.LogCaptureFixture
) -> None:
    vmss = fake.add_scale_set("workers", capacity=2, spot_restore=True)
    provider = make_provider(fake)
    provider.set_target_size(2)
    victim = provider.list_instances()[0]
    provider.host_noticed(victim, InterruptionNotice("preempt", time.time() + 30))
    steer(provider, 4)
    assert vmss.capacity == 3  # the replacement runs while the VM still trains

    vmss.evict(members(vmss)[victim.id].key)  # Azure restores it: the capacity stays
    steer(provider, 6)

    assert vmss.capacity == 2 and len(vmss.members) == 2
    assert sum(i.is_ready for i in provider.list_instances()) == 2
    assert sum("restores evicted spot VMs itself" in w for w in warnings(caplog)) == 1
