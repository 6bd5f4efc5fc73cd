"""The Azure provider's side of the capacity contract (#25), against the fake ARM server.

Several scale sets per job (``--group`` more than once, in other resource groups too),
what each set launches (priority, Spot Priority Mix), the capacity shortages Azure
reports (VMs whose provisioning failed, scale-outs refused for quota) and handing one
VM back for good. The real azure-mgmt-compute client makes every call over HTTP; the
fake's request log shows what Azure would have seen.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

pytest.importorskip("azure.mgmt.compute", reason="the azure extra is not installed")

from spotring.autoscaler.cli import core_options, parse, provider_options
from spotring.autoscaler.plugins import get_plugin_manager
from spotring.core.capacity import ShortageCause
from spotring.providers.azure import AzureProvider, shortage_cause
from spotring.providers.base import ConfigurationError, Lifecycle, ProviderError
from tests.fakes.azure import FakeArm, FakeScaleSet

PM = get_plugin_manager(load_entry_points=False)
MODES = ["Uniform", "Flexible"]


@pytest.fixture
def fake() -> Iterator[FakeArm]:
    with FakeArm() as server:
        yield server


def groups(fake: FakeArm, *argv: str) -> list[AzureProvider]:
    """The providers ``spotring discover --provider azure ARGV`` makes."""
    options, cls = parse(
        [
            "discover",
            "--provider",
            "azure",
            *argv,
            *("--subscription", fake.subscription, "--endpoint", fake.url),
        ],
        PM,
    )
    assert cls is AzureProvider
    made = cls.groups_from_options(provider_options(options), core_options(options))
    azure = [p for p in made if isinstance(p, AzureProvider)]
    assert len(azure) == len(made)
    return azure


def make_provider(fake: FakeArm, group: str = "workers", rg: str = "rg") -> AzureProvider:
    return AzureProvider(
        group, resource_group=rg, subscription=fake.subscription, endpoint=fake.url
    )


def methods(fake: FakeArm) -> set[str]:
    return {r.method for r in fake.requests}


def grow_with_failures(fake: FakeArm, vmss: FakeScaleSet, code: str, by: int = 1) -> AzureProvider:
    """A provider whose set was asked ``by`` more VMs that failed with ``code``."""
    vmss.capacity_error(code, when="operation")
    provider = make_provider(fake, vmss.name, vmss.resource_group)
    provider.list_instances()
    provider.set_target_size(vmss.capacity + by)
    provider.list_instances()  # Creating (the listing advances the fake one stage)
    provider.list_instances()  # Failed
    return provider


# ------------------------------------------------------------------- several groups


def test_sets_in_other_resource_groups_are_groups_of_one_job(fake: FakeArm) -> None:
    a = fake.add_scale_set("spot", resource_group="rg-a", capacity=2)
    b = fake.add_scale_set("spot", resource_group="rg-b", capacity=1, mode="Uniform")
    c = fake.add_scale_set("regular", resource_group="rg-b", capacity=1, priority="Regular")
    fake.clear_requests()

    made = groups(
        fake,
        *("--group", "spot", "--group", "rg-b/spot", "--group", "rg-b/regular"),
        *("--resource-group", "rg-a"),
    )

    assert fake.requests == []  # making them calls nothing
    # The same name in two resource groups is told apart; a unique name stays short.
    assert [p.group_name() for p in made] == ["rg-a/spot", "rg-b/spot", "regular"]
    assert [(p.resource_group, p.group) for p in made] == [
        ("rg-a", "spot"),
        ("rg-b", "spot"),
        ("rg-b", "regular"),
    ]
    listed = [sorted(i.id for i in p.list_instances()) for p in made]
    assert listed == [sorted(m.name for m in s.members) for s in (a, b, c)]
    assert [p.group_lifecycle() for p in made] == [
        Lifecycle.SPOT,
        Lifecycle.SPOT,
        Lifecycle.ON_DEMAND,
    ]
    # One pair of clients for the job, closed once, by the last provider closing.
    assert len({id(p._compute) for p in made}) == 1
    for provider in made[:-1]:
        provider.close()
    made[0].close()  # closing twice does not count twice
    assert made[-1].list_instances()
    made[-1].close()
    assert methods(fake) == {"GET"}


def test_one_group_works_as_it_did(fake: FakeArm) -> None:
    fake.add_scale_set("workers", capacity=1)
    (provider,) = groups(fake, "--group", "workers", "--resource-group", "rg")
    assert (provider.group_name(), provider.describe()) == (
        "workers",
        "azure scale set workers (rg)",
    )
    assert len(provider.list_instances()) == 1


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["--group", "a", "--group", "A", "--resource-group", "rg"], "rg/A is given more"),
        (["--group", "rg/a", "--group", "a", "--resource-group", "RG"], "given more than once"),
        (["--group", "a"], "no resource group"),
        (["--group", "x/y/z"], "write NAME or RESOURCE_GROUP/NAME"),
        (["--group", "/y"], "write NAME or RESOURCE_GROUP/NAME"),
        (["--group", "rg/"], "write NAME or RESOURCE_GROUP/NAME"),
        (["--resource-group", "rg"], "--group is required"),
    ],
)
def test_group_options_are_checked(fake: FakeArm, argv: list[str], error: str) -> None:
    with pytest.raises(ConfigurationError, match=error):
        groups(fake, *argv)
    assert fake.requests == []


# ------------------------------------------------------------------------ lifecycle


@pytest.mark.parametrize(
    ("priority", "mix", "expected", "why"),
    [
        ("Spot", None, Lifecycle.SPOT, "priority Spot"),
        ("Low", None, Lifecycle.SPOT, "priority Low"),
        ("Regular", None, Lifecycle.ON_DEMAND, "priority Regular"),
        ("Spot", (0, 0), Lifecycle.SPOT, "every VM spot"),
        ("Spot", (2, 100), Lifecycle.ON_DEMAND, "every VM Regular"),
        ("Spot", (1, 50), None, "mixed"),
        ("Spot", (1, 0), None, "mixed"),
        ("Spot", (None, 0), None, "mixed"),  # an absent field is not guessed
    ],
)
def test_group_lifecycle_from_priority_and_mix(
    fake: FakeArm,
    priority: str,
    mix: tuple[int | None, int | None] | None,
    expected: Lifecycle | None,
    why: str,
) -> None:
    fake.add_scale_set("workers", priority=priority, priority_mix=mix)
    provider = make_provider(fake)

    assert provider.group_lifecycle() is expected
    assert why in provider.lifecycle_reason
    assert [r.api for r in fake.requests] == ["virtualMachineScaleSets.get"]
    provider.group_lifecycle()  # the set read is kept: no second call
    assert len(fake.requests) == 1


def test_a_mixed_sets_members_go_by_their_own_priority(fake: FakeArm) -> None:
    fake.add_scale_set("workers", capacity=4, priority_mix=(1, 50))
    provider = make_provider(fake)

    lifecycles = sorted(i.lifecycle.value for i in provider.list_instances())

    assert provider.group_lifecycle() is None
    # The base VM and half of the three above it are Regular.
    assert lifecycles == ["on-demand", "on-demand", "spot", "spot"]


# ------------------------------------------------------------------------ shortages


@pytest.mark.parametrize(
    ("code", "cause"),
    [
        ("SkuNotAvailable", ShortageCause.CAPACITY),
        ("AllocationFailed", ShortageCause.CAPACITY),
        ("ZonalAllocationFailed", ShortageCause.CAPACITY),
        ("OverconstrainedAllocationRequest", ShortageCause.CAPACITY),
    ],
)
@pytest.mark.parametrize("mode", MODES)
def test_failed_vms_are_a_capacity_shortage(
    fake: FakeArm, mode: str, code: str, cause: ShortageCause
) -> None:
    vmss = fake.add_scale_set("workers", mode=mode, capacity=1)
    before = time.time()
    provider = grow_with_failures(fake, vmss, code)
    fake.clear_requests()

    shortage = provider.capacity_shortage(before - 1)

    assert shortage is not None
    assert (shortage.cause, shortage.code) == (cause, code)
    failed = next(m for m in vmss.members if m.provisioning_state == "Failed")
    assert failed.failed_at is not None
    # The failed VM, and the scale-out's operation (read once, when done), say so.
    assert shortage.at is not None and shortage.at >= failed.failed_at.timestamp() - 1e-5
    assert "Allocation failed" in shortage.message or "not available" in shortage.message
    assert [r.api for r in fake.requests] == ["operations.get"]
    assert provider.capacity_shortage(before - 1) == shortage
    assert [r.api for r in fake.requests] == ["operations.get"]


def test_shortages_are_filtered_by_time(fake: FakeArm) -> None:
    vmss = fake.add_scale_set("workers", capacity=1)
    provider = grow_with_failures(fake, vmss, "AllocationFailed")
    failed = next(m for m in vmss.members if m.provisioning_state == "Failed")
    assert failed.failed_at is not None
    at = failed.failed_at.timestamp()

    assert provider.capacity_shortage(at) is not None
    assert provider.capacity_shortage(at + 0.001) is None
    assert make_provider(fake).capacity_shortage(0.0) is None  # nothing listed yet


def test_a_failure_without_a_time_counts_from_its_first_listing(fake: FakeArm) -> None:
    vmss = fake.add_scale_set("workers", capacity=2)
    key = vmss.keys()[0]
    vmss.set_member(
        key,
        provisioning_state="Failed",
        power_state=None,
        error_code="QuotaExceeded",
        failed_at=None,
    )
    provider = make_provider(fake)
    before = time.time()
    provider.list_instances()
    after = time.time()
    provider.list_instances()  # listed again: still the first time it was seen

    shortage = provider.capacity_shortage(0.0)

    assert shortage is not None and shortage.cause is ShortageCause.QUOTA
    assert shortage.at is not None and before <= shortage.at <= after


def test_the_newest_failure_wins_and_outlives_its_vm(fake: FakeArm) -> None:
    vmss = fake.add_scale_set("workers", capacity=3)
    newer, older, oldest = vmss.keys()
    for key, code, year in [
        (newer, "InternalError", 2100),
        (older, "SkuNotAvailable", 2090),
        (oldest, "AllocationFailed", 2080),
    ]:
        vmss.set_member(key, provisioning_state="Failed", power_state=None, error_code=code)
        vmss.member(key).failed_at = vmss.member(key).time_created.replace(year=year)
    vmss.set_member(oldest, provisioning_state="Succeeded", power_state="running")
    provider = make_provider(fake)

    provider.list_instances()  # the newest is listed first
    newest = provider.capacity_shortage(0.0)
    assert newest is not None
    assert (newest.code, newest.cause) == ("InternalError", ShortageCause.OTHER)

    vmss.remove_member(newer)
    vmss.remove_member(older)
    vmss.set_member(oldest, provisioning_state="Failed", power_state=None)
    provider.list_instances()  # an older failure seen later does not replace it

    assert provider.capacity_shortage(0.0) == newest


def test_a_vm_that_failed_after_running_is_no_shortage(fake: FakeArm) -> None:
    vmss = fake.add_scale_set("workers", capacity=1)
    vmss.set_member(vmss.keys()[0], provisioning_state="Failed", error_code="AllocationFailed")
    provider = make_provider(fake)
    provider.list_instances()

    assert provider.capacity_shortage(0.0) is None  # it ran: no launch failed


@pytest.mark.parametrize("mode", MODES)
def test_a_scale_out_beyond_the_quota_is_a_quota_shortage(fake: FakeArm, mode: str) -> None:
    vmss = fake.add_scale_set("workers", mode=mode, capacity=2)  # 4 vCPUs each
    fake.set_quota("LowPriorityCores", 8)
    provider = make_provider(fake)
    provider.list_instances()
    before = time.time()

    with pytest.raises(ProviderError, match="exceeding approved LowPriorityCores quota"):
        provider.set_target_size(3)
    after = time.time()

    assert vmss.capacity == 2
    shortage = provider.capacity_shortage(before)
    assert shortage is not None
    assert (shortage.cause, shortage.code) == (ShortageCause.QUOTA, "OperationNotAllowed")
    assert "Current Limit: 8, Current Usage: 8" in shortage.message
    assert shortage.at is not None and before <= shortage.at <= after
    assert provider.capacity_shortage(after + 0.001) is None

    fake.set_quota("LowPriorityCores", 12)
    provider.set_target_size(3)  # room again
    assert vmss.capacity == 3


def test_a_quota_refusal_of_keep_size_is_reported_too(fake: FakeArm) -> None:
    vmss = fake.add_scale_set("workers", capacity=2)
    provider = make_provider(fake)
    provider.set_target_size(2)
    vmss.evict(vmss.keys()[0])  # policy Delete: capacity 1
    fake.set_quota("LowPriorityCores", 4)
    provider.list_instances()

    with pytest.raises(ProviderError):
        provider.keep_size()

    shortage = provider.capacity_shortage(0.0)
    assert shortage is not None and shortage.cause is ShortageCause.QUOTA


@pytest.mark.parametrize(
    ("code", "message", "cause"),
    [
        (
            "OperationNotAllowed",
            "... exceeding approved standardDSv5Family Cores quota ...",
            "quota",
        ),
        ("OperationNotAllowed", "The operation is not allowed on a stopped set.", "other"),
        ("QuotaExceeded", "", "quota"),
        ("SkuNotAvailable", "", "capacity"),
        ("OverconstrainedZonalAllocationRequest", "", "capacity"),
        ("VMExtensionProvisioningError", "", "other"),
    ],
)
def test_shortage_causes(code: str, message: str, cause: str) -> None:
    assert shortage_cause(code, message).value == cause


# ------------------------------------------------------------------------ removing


@pytest.mark.parametrize("mode", MODES)
def test_remove_instance_deletes_one_vm_and_lowers_the_capacity(fake: FakeArm, mode: str) -> None:
    vmss = fake.add_scale_set("workers", mode=mode, capacity=3)
    provider = make_provider(fake)
    assert provider.can_remove
    provider.set_target_size(3)
    gone = provider.list_instances()[1].id
    fake.clear_requests()

    provider.remove_instance(gone)

    writes = [r.api for r in fake.requests if r.method != "GET"]
    assert writes == [
        "virtualMachines.delete"
        if mode == "Flexible"
        else "virtualMachineScaleSets.deleteInstances"
    ]
    for _ in range(3):  # refreshes while the controller steers: the set stays at 2
        provider.list_instances()
        provider.keep_size()
    assert vmss.capacity == 2
    assert sorted(i.id for i in provider.list_instances()) == sorted(m.name for m in vmss.members)
    assert gone not in {m.name for m in vmss.members}
    assert "virtualMachineScaleSets.update" not in {r.api for r in fake.requests}

    fake.clear_requests()
    provider.remove_instance(gone)  # again: nothing
    provider.keep_size()
    assert methods(fake) <= {"GET"} and vmss.capacity == 2


def test_removing_a_vm_already_gone_lowers_the_size_kept_once(fake: FakeArm) -> None:
    vmss = fake.add_scale_set("workers", capacity=3)
    provider = make_provider(fake)
    provider.set_target_size(3)
    name = vmss.keys()[0]
    vmss.evict(name)  # policy Delete: gone, capacity 2
    provider.list_instances()
    fake.clear_requests()

    provider.remove_instance(name)
    provider.remove_instance(name)
    provider.list_instances()
    provider.keep_size()

    assert methods(fake) == {"GET"}  # nothing to delete, nothing to restore
    assert vmss.capacity == 2
    # The size kept was lowered once: an eviction now is still made good.
    vmss.evict(vmss.keys()[0])
    provider.list_instances()
    provider.keep_size()
    assert vmss.capacity == 2


def test_a_vm_deleted_meanwhile_is_removed_without_error(fake: FakeArm) -> None:
    vmss = fake.add_scale_set("workers", capacity=2, mode="Flexible")
    provider = make_provider(fake)
    provider.set_target_size(2)
    name = provider.list_instances()[0].id
    vmss.remove_member(name)  # after the listing: the delete finds no VM

    provider.remove_instance(name)
    provider.list_instances()
    provider.keep_size()

    assert vmss.capacity == 1


# ------------------------------------------------------------------------- reads only


@pytest.mark.parametrize("mode", MODES)
def test_listing_lifecycle_and_shortages_only_read(fake: FakeArm, mode: str) -> None:
    spot = fake.add_scale_set("spot", mode=mode, capacity=2)
    regular = fake.add_scale_set("regular", resource_group="rg-b", capacity=1, priority="Regular")
    fake.creating_instance_view = True
    spot.add_member(provisioning_state="Creating", power_state=None)
    spot.auto_advance = False
    spot.set_member(
        spot.keys()[0], provisioning_state="Failed", power_state=None, error_code="SkuNotAvailable"
    )
    regular.add_member(provisioning_state="Creating", power_state=None)
    fake.clear_requests()

    made = groups(fake, "--group", "rg/spot", "--group", "rg-b/regular")
    for provider in made:
        provider.list_instances()
        provider.group_lifecycle()
        provider.capacity_shortage(0.0)

    assert methods(fake) == {"GET"}
    shortage = made[0].capacity_shortage(0.0)
    assert shortage is not None and shortage.code == "SkuNotAvailable"
    assert made[1].capacity_shortage(0.0) is None
