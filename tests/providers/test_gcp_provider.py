"""The GCP provider against the fake Compute Engine REST server (tests/fakes/gcp.py).

The real google-cloud-compute clients make every call over HTTP; the fake records what
it received, so the tests assert the requests as the cloud would have seen them.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.cloud.compute_v1", reason="the gcp extra is not installed")

from google.auth.credentials import AnonymousCredentials

from spotring.providers.base import (
    ConfigurationError,
    InstanceState,
    Lifecycle,
    ProviderError,
)
from spotring.providers.conformance import ProviderContract
from spotring.providers.gcp import IAM_PERMISSIONS, GcpProvider, member_state
from tests.fakes.gcp import FakeCompute
from tests.fakes.prices import GcpPrices

ZONE = "us-central1-a"
REGION = "us-central1"
LIST = "instanceGroupManagers.listManagedInstances"
REGIONAL_LIST = "regionInstanceGroupManagers.listManagedInstances"


@pytest.fixture
def fake() -> Iterator[FakeCompute]:
    with FakeCompute() as server:
        yield server


def make_provider(fake: FakeCompute, group: str = "workers", **options: Any) -> GcpProvider:
    where = {} if "region" in options or "zone" in options else {"zone": ZONE}
    return GcpProvider(
        group,
        project=fake.project,
        endpoint=fake.url,
        credentials=AnonymousCredentials(),
        **where,
        **options,
    )


def states(provider: GcpProvider) -> dict[str, InstanceState]:
    return {i.id: i.state for i in provider.list_instances()}


# ------------------------------------------------------------------------ listing


def test_lists_a_zonal_group_with_addresses_spot_and_type(fake: FakeCompute) -> None:
    group = fake.add_group("workers", zone=ZONE, size=2, machine_type="n1-standard-8")
    provider = make_provider(fake)

    instances = provider.list_instances()

    assert sorted(i.id for i in instances) == sorted(group.names())
    for instance in instances:
        member = group.member(instance.id)
        assert instance.address == member.network_ip
        assert instance.is_ready and instance.state is InstanceState.READY
        assert instance.lifecycle is Lifecycle.SPOT
        assert (instance.zone, instance.instance_type, instance.slots) == (ZONE, "n1-standard-8", 1)
        assert instance.launch_time is not None


def test_regional_group_describes_each_zone_once(fake: FakeCompute) -> None:
    group = fake.add_group("workers", region=REGION, size=4)
    provider = make_provider(fake, region=REGION)

    instances = provider.list_instances()

    assert {i.zone for i in instances} == {f"{REGION}-a", f"{REGION}-b"}
    assert sorted(i.id for i in instances) == sorted(group.names())
    assert len(fake.calls(REGIONAL_LIST)) == 1
    zones = sorted(r.path.split("/zones/")[1].split("/")[0] for r in fake.calls("instances.list"))
    assert zones == [f"{REGION}-a", f"{REGION}-b"]


def test_a_steady_group_costs_one_call_per_refresh(fake: FakeCompute) -> None:
    fake.add_group("workers", zone=ZONE, size=3)
    provider = make_provider(fake)
    provider.list_instances()
    fake.clear_requests()

    for _ in range(3):
        provider.list_instances()
        assert provider.last_refresh_calls == 1

    assert [r.api for r in fake.requests] == [LIST] * 3


def test_pages_through_a_thousand_members(fake: FakeCompute) -> None:
    group = fake.add_group(
        "big", region=REGION, size=1200, list_managed_instances_results="PAGINATED"
    )
    provider = make_provider(fake, "big", region=REGION)

    first = provider.list_instances()
    second = provider.list_instances()

    assert len(first) == len(second) == 1200
    assert len({i.id for i in first}) == 1200 and all(i.is_ready for i in first)
    assert sorted(i.address for i in first) == sorted(
        group.member(n).network_ip for n in group.names()
    )
    pages = fake.calls(REGIONAL_LIST)
    assert len(pages) == 6  # 3 pages of 500 per listing
    # 600 new members per zone, 100 names per filtered list: 12 calls, once.
    assert len(fake.calls("instances.list")) == 12
    assert provider.last_refresh_calls == 3


def test_joins_go_creating_to_running(fake: FakeCompute) -> None:
    group = fake.add_group("workers", zone=ZONE, size=2)
    group.auto_advance = False
    provider = make_provider(fake)
    provider.list_instances()

    provider.set_target_size(3)
    (newcomer,) = [n for n in group.names() if group.member(n).current_action == "CREATING"]
    assert states(provider)[newcomer] is InstanceState.PENDING
    group.advance()  # VM created, STAGING
    joined = {i.id: i for i in provider.list_instances()}[newcomer]
    assert joined.state is InstanceState.PENDING and joined.address
    group.advance()  # RUNNING
    assert states(provider)[newcomer] is InstanceState.READY


def test_deleting_stopping_and_preempted_members_leave(fake: FakeCompute) -> None:
    group = fake.add_group("workers", zone=ZONE, size=4)
    group.auto_advance = False
    deleting, stopping, unhealthy, kept = group.names()
    provider = make_provider(fake)
    provider.list_instances()
    group.set_member(deleting, current_action="DELETING")
    group.preempt(stopping)
    group.set_member(unhealthy, health=["UNHEALTHY"])

    seen = states(provider)
    assert seen == {
        deleting: InstanceState.TERMINATING,
        stopping: InstanceState.TERMINATING,
        unhealthy: InstanceState.DRAINING,
        kept: InstanceState.READY,
    }
    group.advance(2)  # deleted; the preempted VM is TERMINATED, then recreated
    seen = states(provider)
    assert deleting not in seen and seen[stopping] is InstanceState.TERMINATING


def test_a_recreated_vm_is_described_again(fake: FakeCompute) -> None:
    group = fake.add_group("workers", zone=ZONE, size=2)
    group.auto_advance = False
    victim = group.names()[0]
    provider = make_provider(fake)
    old_address = {i.id: i.address for i in provider.list_instances()}[victim]

    provider.replace_instance(victim)
    group.advance(3)

    member = group.member(victim)
    assert member.network_ip != old_address
    refreshed = {i.id: i for i in provider.list_instances()}[victim]
    assert refreshed.state is InstanceState.READY and refreshed.address == member.network_ip


def test_a_spot_vm_preempted_with_delete_is_gone_until_the_group_repairs_it(
    fake: FakeCompute, caplog: pytest.LogCaptureFixture
) -> None:
    """terraform/gcp's spot VMs are deleted on preemption: torn down (DEPROVISIONING),
    then a member NONE without a VM until the group recreates it. Each listing says so."""
    group = fake.add_group("workers", zone=ZONE, size=2, termination_action="DELETE")
    group.auto_advance = False
    victim, kept = group.names()
    provider = make_provider(fake)
    provider.list_instances()
    group.preempt(victim)

    seen = []
    with caplog.at_level(logging.WARNING, logger="spotring.providers.gcp"):
        for _ in range(6):
            listed = {i.id: i for i in provider.list_instances()}
            assert listed[kept].state is InstanceState.READY
            seen.append((group.member(victim).instance_status, listed[victim].state))
            group.advance()

    assert seen == [
        ("STOPPING", InstanceState.TERMINATING),
        ("DEPROVISIONING", InstanceState.TERMINATING),
        (None, InstanceState.GONE),  # NONE, no VM: deleted, not yet repaired
        (None, InstanceState.TERMINATING),  # RECREATING, no VM yet
        ("PROVISIONING", InstanceState.TERMINATING),  # RECREATING its new VM
        ("RUNNING", InstanceState.READY),
    ]
    assert not caplog.records  # documented states: nothing odd


@pytest.mark.parametrize(
    ("where", "dropped", "ipv6_only"),
    [
        ("zone", ["currentAction"], False),
        ("zone", ["id"], False),  # an instanceStatus without the VM's id
        ("zone", ["instanceStatus"], False),  # a VM id without its status
        ("zone", ["status"], False),  # instances.list: a VM without its status
        ("zone", ["networkInterfaces.networkIP"], False),
        ("zone", [], True),  # an IPV6_ONLY interface: no networkIP by design
        ("region", ["instance"], False),  # a running VM whose zone only its URL names
    ],
)
def test_one_odd_member_costs_only_itself(
    fake: FakeCompute,
    caplog: pytest.LogCaptureFixture,
    where: str,
    dropped: list[str],
    ipv6_only: bool,
) -> None:
    """A member lacking what the API always sends is listed as not usable, with one
    warning while it stays so; the others are listed as ever."""
    place = {"zone": ZONE} if where == "zone" else {"region": REGION}
    group = fake.add_group("workers", **place, size=2)
    odd = group.add_member(dropped=dropped, ipv6_only=ipv6_only).name
    provider = make_provider(fake, **place)

    with caplog.at_level(logging.INFO, logger="spotring.providers.gcp"):
        for _ in range(3):
            listed = {i.id: i for i in provider.list_instances()}
            assert listed[odd].state is InstanceState.PENDING and not listed[odd].address
            assert [i.state for n, i in listed.items() if n != odd] == [InstanceState.READY] * 2
            assert all(i.address for n, i in listed.items() if n != odd)
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert (
            len(warnings) == 1 and f"member {odd} is listed as pending, not usable" in warnings[0]
        )

        group.set_member(odd, dropped=[])
        group.member(odd).ipv6_only = False
        assert {i.id: i.state for i in provider.list_instances()}[odd] is InstanceState.READY
    assert f"group workers member {odd}: resolved" in caplog.text


def test_member_state_table() -> None:
    assert member_state("NONE", "RUNNING", ()) is InstanceState.READY
    assert member_state("NONE", "RUNNING", ("UNKNOWN",)) is InstanceState.READY
    assert member_state("CREATING", "", ()) is InstanceState.PENDING
    assert member_state("NONE", "STAGING", ()) is InstanceState.PENDING
    assert member_state("RESTARTING", "RUNNING", ()) is InstanceState.DRAINING
    assert member_state("NONE", "RUNNING", ("TIMEOUT",)) is InstanceState.DRAINING
    assert member_state("RECREATING", "RUNNING", ()) is InstanceState.TERMINATING
    assert member_state("NONE", "TERMINATED", ()) is InstanceState.TERMINATING
    assert member_state("NONE", "DEPROVISIONING", ()) is InstanceState.TERMINATING
    assert member_state("NONE", "PENDING", ()) is InstanceState.PENDING
    assert member_state("NONE", "", ()) is InstanceState.GONE  # its VM deleted, not repaired
    assert member_state("NONE", "RUNNING", (), vm_found=False) is InstanceState.GONE
    assert member_state("SOMETHING_NEW", "RUNNING", ()) is InstanceState.PENDING


def test_every_state_the_library_defines_is_mapped() -> None:
    """Each value of google-cloud-compute's enums (the REST reference's) has its entry,
    so none reads as PENDING only because it is new to spotring."""
    from google.cloud import compute_v1

    from spotring.providers.gcp import CURRENT_ACTION_MAP, HEALTH_STATE_MAP, INSTANCE_STATUS_MAP

    for enum, table in [
        (compute_v1.ManagedInstance.CurrentAction, CURRENT_ACTION_MAP),
        (compute_v1.ManagedInstance.InstanceStatus, INSTANCE_STATUS_MAP),
        (compute_v1.Instance.Status, INSTANCE_STATUS_MAP),
        (compute_v1.ManagedInstanceInstanceHealth.DetailedHealthState, HEALTH_STATE_MAP),
    ]:
        defined = {value.name for value in enum if not value.name.startswith("UNDEFINED_")}
        assert defined <= table.keys(), f"{enum.__qualname__}: {sorted(defined - table.keys())}"


def test_spot_only_leaves_standard_vms_out(fake: FakeCompute) -> None:
    fake.add_group("standard", zone=ZONE, size=2, provisioning_model="STANDARD")
    fake.add_group("spot", zone=ZONE, size=2)

    standard = make_provider(fake, "standard").list_instances()
    assert [i.lifecycle for i in standard] == [Lifecycle.ON_DEMAND] * 2
    assert make_provider(fake, "standard", spot_only=True).list_instances() == []
    assert len(make_provider(fake, "spot", spot_only=True).list_instances()) == 2


def test_slots_from_option_label_and_accelerators(fake: FakeCompute) -> None:
    fake.add_group("gpus", zone=ZONE, size=1, accelerators=4)
    fake.add_group("labelled", zone=ZONE, size=1, accelerators=4, labels={"gpus": "2"})

    assert [i.slots for i in make_provider(fake, "gpus").list_instances()] == [4]
    labelled = make_provider(fake, "labelled", slots_label="gpus").list_instances()
    assert [i.slots for i in labelled] == [2]
    assert [i.slots for i in make_provider(fake, "gpus", slots_per_host=3).list_instances()] == [3]


# ----------------------------------------------------------------------- steering


def test_resize_is_sent_once_and_only_when_it_changes(fake: FakeCompute) -> None:
    group = fake.add_group("workers", zone=ZONE, size=2)
    provider = make_provider(fake)
    provider.list_instances()

    provider.set_target_size(2)
    provider.set_target_size(3)
    provider.set_target_size(3)

    resizes = fake.calls("instanceGroupManagers.resize")
    assert [r.query["size"] for r in resizes] == ["3"]
    assert group.target_size == 3


def test_resize_notices_someone_else_resized_the_group(fake: FakeCompute) -> None:
    group = fake.add_group("workers", zone=ZONE, size=2)
    group.auto_advance = False
    provider = make_provider(fake)
    provider.list_instances()
    group._resize(4)  # the console, or another tool
    provider.list_instances()

    provider.set_target_size(2)

    assert [r.query["size"] for r in fake.calls("instanceGroupManagers.resize")] == ["2"]


def test_recreate_request_as_the_cloud_receives_it(fake: FakeCompute) -> None:
    group = fake.add_group("workers", region=REGION, size=3)
    provider = make_provider(fake, region=REGION)
    victim = next(i for i in provider.list_instances() if i.zone == f"{REGION}-b")

    provider.replace_instance(victim.id)
    provider.replace_instance(victim.id)  # idempotent before the next listing
    provider.list_instances()
    provider.replace_instance(victim.id)  # ... and after it (the group says RECREATING)
    provider.replace_instance("not-a-member")

    calls = fake.calls("regionInstanceGroupManagers.recreateInstances")
    assert [c.body for c in calls] == [{"instances": [f"zones/{REGION}-b/instances/{victim.id}"]}]
    assert group.target_size == 3


def test_recreating_a_member_that_left_since_the_listing_is_no_error(fake: FakeCompute) -> None:
    group = fake.add_group("workers", zone=ZONE, size=3)
    gone, refused, _ = group.names()
    provider = make_provider(fake)
    provider.list_instances()
    group.remove_member(gone)  # scaled in by someone else meanwhile

    provider.replace_instance(gone)  # the API answers 400: not a member any more

    [call] = fake.calls("instanceGroupManagers.recreateInstances")
    assert call.status == 400
    # A 400 for a member still there is the user's to fix, and said so.
    fake.fail_next(1, 400, match="recreateInstances")
    with pytest.raises(ConfigurationError, match="recreateInstances failed"):
        provider.replace_instance(refused)


def test_an_autoscaled_group_is_not_resized_but_failed_hosts_are_recreated(
    fake: FakeCompute, caplog: pytest.LogCaptureFixture
) -> None:
    autoscaler = f"projects/{fake.project}/zones/{ZONE}/autoscalers/workers-as"
    group = fake.add_group("workers", zone=ZONE, size=2, autoscaler=autoscaler)
    provider = make_provider(fake)

    with caplog.at_level(logging.WARNING, logger="spotring.providers.gcp"):
        instances = provider.list_instances()
        provider.list_instances()

    assert not provider.can_resize
    assert caplog.text.count("is sized by autoscaler workers-as") == 1
    with pytest.raises(ConfigurationError, match="autoscaler workers-as"):
        provider.set_target_size(3)
    provider.replace_instance(instances[0].id)
    assert len(fake.calls("instanceGroupManagers.recreateInstances")) == 1
    assert not fake.calls("instanceGroupManagers.resize") and group.target_size == 2


def test_scale_down_on_exit_resizes_to_zero(fake: FakeCompute) -> None:
    group = fake.add_group("workers", zone=ZONE, size=2)
    provider = make_provider(fake, scale_down_on_exit=True)
    provider.list_instances()

    provider.job_finished()

    assert group.target_size == 0


def test_capacity_errors_warn_once_per_episode(
    fake: FakeCompute, caplog: pytest.LogCaptureFixture
) -> None:
    group = fake.add_group("workers", zone=ZONE, size=1)
    provider = make_provider(fake)
    provider.list_instances()
    group.capacity_error(ZONE)
    provider.set_target_size(3)

    with caplog.at_level(logging.INFO, logger="spotring.providers.gcp"):
        for _ in range(4):
            assert len(provider.list_instances()) == 3
        group.clear_capacity_error()
        for _ in range(3):
            provider.list_instances()

    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"gcp: group workers cannot create VMs in zone {ZONE}: ZONE_RESOURCE_POOL_EXHAUSTED:"
        f" The zone 'projects/p/zones/{ZONE}' does not have enough resources available to"
        " fulfill the request. Try a different zone, or try again later."
    ]
    assert f"zone {ZONE} ZONE_RESOURCE_POOL_EXHAUSTED: resolved" in caplog.text


# ------------------------------------------------------------------------- errors


@pytest.mark.parametrize("status", [429, 503])
def test_throttling_and_5xx_are_retried(fake: FakeCompute, status: int) -> None:
    fake.add_group("workers", zone=ZONE, size=2)
    provider = make_provider(fake)
    fake.fail_next(2, status, match="listManagedInstances")

    assert len(provider.list_instances()) == 2
    assert provider.api_retries == 2


def test_persistent_failure_is_a_retryable_error_never_an_empty_group(fake: FakeCompute) -> None:
    fake.add_group("workers", zone=ZONE, size=2)
    provider = make_provider(fake, max_api_attempts=2)
    assert len(provider.list_instances()) == 2
    fake.fail_next(2, 503)

    with pytest.raises(ProviderError) as caught:
        provider.list_instances()

    assert caught.value.retryable
    assert "503" in str(caught.value)
    assert len(provider.list_instances()) == 2


def test_a_dropped_connection_is_retried(fake: FakeCompute) -> None:
    fake.add_group("workers", zone=ZONE, size=2)
    provider = make_provider(fake)
    fake.fail_next(1, kind="drop", match="listManagedInstances")

    assert len(provider.list_instances()) == 2
    assert provider.api_retries == 1


def test_unknown_group_is_one_line(fake: FakeCompute) -> None:
    with pytest.raises(ConfigurationError) as caught:
        make_provider(fake, "nope").list_instances()
    assert str(caught.value) == (
        f"managed instance group 'nope' not found (project {fake.project}, zone {ZONE})"
    )


def test_unknown_project_is_one_line(fake: FakeCompute) -> None:
    provider = GcpProvider(
        "workers",
        zone=ZONE,
        project="no-such-project",
        endpoint=fake.url,
        credentials=AnonymousCredentials(),
    )
    with pytest.raises(ConfigurationError, match=r"^project no-such-project not found"):
        provider.list_instances()


def test_permission_denied_names_the_permission(fake: FakeCompute) -> None:
    fake.add_group("workers", zone=ZONE, size=2)
    fake.deny("compute.instances.list")

    with pytest.raises(ConfigurationError) as caught:
        make_provider(fake).list_instances()

    assert str(caught.value).startswith(
        "permission compute.instances.list denied on instances.list"
    )
    assert "\n" not in str(caught.value)


def test_iam_permissions_are_the_ones_the_calls_need(fake: FakeCompute) -> None:
    group = fake.add_group("workers", zone=ZONE, size=3)
    provider = make_provider(fake)
    provider.set_target_size(4)
    provider.list_instances()
    provider.replace_instance(group.names()[0])
    provider.remove_instance(group.names()[1])
    assert provider.group_lifecycle() is Lifecycle.SPOT
    provider.capacity_shortage(0.0)  # no member failing: listErrors
    # The price: machineTypes.get, answered by the prices fake in front of this one.
    with GcpPrices([], {"n1-standard-4": (4, 15360)}, upstream=fake.url) as front:
        priced = GcpProvider(
            "workers",
            zone=ZONE,
            project=fake.project,
            endpoint=front.url,
            credentials=AnonymousCredentials(),
            catalog_endpoint=front.url,
        )
        assert priced.hourly_price() is None  # an empty catalog
    read_machine_type = any("/machineTypes/n1-standard-4" in r for r in front.requests)

    from tests.fakes.gcp import PERMISSIONS

    used = {PERMISSIONS[r.api] for r in fake.requests if r.api}
    used |= {"compute.machineTypes.get"} if read_machine_type else set()
    assert used == set(IAM_PERMISSIONS)


def test_options_are_checked_before_any_call(fake: FakeCompute) -> None:
    with pytest.raises(ConfigurationError, match="exactly one of --zone"):
        GcpProvider("g", project="p", credentials=AnonymousCredentials())
    with pytest.raises(ConfigurationError, match="--group is required"):
        GcpProvider("", zone=ZONE, project="p", credentials=AnonymousCredentials())
    with pytest.raises(ConfigurationError, match="--endpoint must be an http"):
        GcpProvider(
            "g", zone=ZONE, project="p", endpoint="ftp://x", credentials=AnonymousCredentials()
        )
    assert not fake.requests


@pytest.mark.parametrize(
    "endpoint", ["http://compute.example.com", "http://10.0.0.5:8080/compute", "http://[fd00::1]"]
)
def test_plain_http_to_another_host_is_refused_before_a_token_is_sent(
    fake: FakeCompute,
    endpoint: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from spotring.autoscaler.cli import main

    # The credentials would refresh against the fake: no token may be asked either.
    monkeypatch.setenv(
        "GOOGLE_APPLICATION_CREDENTIALS", str(fake.write_credentials(tmp_path / "c.json"))
    )
    with pytest.raises(ConfigurationError, match="only for a test server on loopback"):
        GcpProvider("g", zone=ZONE, project="p", endpoint=endpoint)

    status = main(["discover", "--provider", "gcp", "--group", "g", "--zone", ZONE,
                   "--project", "p", "--endpoint", endpoint])  # fmt: skip

    err = capsys.readouterr().err
    assert status == 2
    assert err == (
        "spotring discover: error: --endpoint over plain http is only for a test server"
        " on loopback\n"
    )
    assert not fake.requests
    # https anywhere, and http on loopback (the fake) stay accepted.
    GcpProvider("g", zone=ZONE, project="p", endpoint="https://compute.example.com")
    GcpProvider("g", zone=ZONE, project="p", endpoint=fake.url)


def test_application_default_credentials_from_a_file(
    fake: FakeCompute, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake.add_group("workers", zone=ZONE, size=2)
    fake.require_auth = True
    monkeypatch.setenv(
        "GOOGLE_APPLICATION_CREDENTIALS", str(fake.write_credentials(tmp_path / "c.json"))
    )

    provider = GcpProvider("workers", zone=ZONE, project=fake.project, endpoint=fake.url)

    assert len(provider.list_instances()) == 2
    assert fake.requests[0].api == "oauth2.token"


# -------------------------------------------------------------------- conformance


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TestGcpContract(ProviderContract):
    @pytest.fixture
    def provider(self, fake: FakeCompute) -> GcpProvider:
        fake.add_group("workers", zone=ZONE, size=2)
        return make_provider(fake)

    @pytest.fixture
    def failing_provider(self) -> GcpProvider:
        return GcpProvider(
            "workers",
            zone=ZONE,
            project="p",
            endpoint=f"http://127.0.0.1:{_closed_port()}",
            credentials=AnonymousCredentials(),
            max_api_attempts=1,
        )


def test_a_failing_get_is_retried_by_spotring_not_for_ten_minutes(fake: FakeCompute) -> None:
    fake.add_group("workers", zone=ZONE, size=2)
    provider = make_provider(fake, max_api_attempts=2)
    fake.fail_next(5, 503, match="instanceGroupManagers/workers")

    with pytest.raises(ProviderError):
        provider.list_instances()

    assert len(fake.calls("instanceGroupManagers.get")) == 2
