"""The GCP provider's side of the capacity contract (#25) against the fake Compute server.

Several groups per job (a zonal and a regional MIG), what a group launches (its instance
template), why it cannot grow (members' ``lastAttempt.errors``, ``listErrors``) and
handing a member back (``deleteInstances``), all with the real google-cloud-compute
clients over HTTP; the fake's request log shows what the cloud would have received.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("google.cloud.compute_v1", reason="the gcp extra is not installed")

from google.auth.credentials import AnonymousCredentials

from spotring.providers.base import (
    ConfigurationError,
    CoreOptions,
    InstanceState,
    Lifecycle,
    ProviderError,
    ShortageCause,
)
from spotring.providers.gcp import (
    GcpProvider,
    GroupSpec,
    client,
    group_specs,
    parse_group,
    shortage_cause,
)
from tests.fakes.gcp import FakeCompute

ZONE = "us-central1-a"
REGION = "us-east1"
LIST_ERRORS = "instanceGroupManagers.listErrors"
DELETE = "instanceGroupManagers.deleteInstances"
REGIONAL_DELETE = "regionInstanceGroupManagers.deleteInstances"
# What a listing and the capacity checks may call: reads only. listManagedInstances is
# a POST in Compute's REST API (instanceGroupManagers/listManagedInstances reference),
# but changes nothing.
READS = {
    "oauth2.token",
    "instanceGroupManagers.get",
    "regionInstanceGroupManagers.get",
    "instanceGroupManagers.listManagedInstances",
    "regionInstanceGroupManagers.listManagedInstances",
    "instanceGroupManagers.listErrors",
    "regionInstanceGroupManagers.listErrors",
    "instances.list",
    "instanceTemplates.get",
    "regionInstanceTemplates.get",
}


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


def parsed_options(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    GcpProvider.add_arguments(parser.add_argument_group("gcp"))
    return parser.parse_args(list(argv))


def rfc3339(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).isoformat(timespec="milliseconds")


# ------------------------------------------------------------------ several groups


@pytest.mark.parametrize(
    ("text", "zone", "region", "wanted"),
    [
        ("workers", ZONE, None, GroupSpec("workers", ZONE, None)),
        ("workers", None, REGION, GroupSpec("workers", None, REGION)),
        ("europe-west4-b/gpu-2", None, None, GroupSpec("gpu-2", "europe-west4-b", None)),
        ("us-east1/w", ZONE, None, GroupSpec("w", None, "us-east1")),
        (
            "northamerica-northeast1-c/w",
            REGION,
            None,
            GroupSpec("w", "northamerica-northeast1-c", None),
        ),
    ],
)
def test_a_group_is_a_name_in_a_zone_or_a_region_told_apart_by_form(
    text: str, zone: str | None, region: str | None, wanted: GroupSpec
) -> None:
    assert parse_group(text, zone, region) == wanted


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("workers", "exactly one of --zone"),
        ("us-central1-a/w/x", "expected NAME, ZONE/NAME or REGION/NAME"),
        ("us-central1-a/Workers", "expected NAME"),
        ("moon/w", "'moon' is neither a zone"),
        ("us-central1-a/", "expected NAME"),
    ],
)
def test_a_malformed_group_is_one_line(text: str, message: str) -> None:
    with pytest.raises(ConfigurationError, match=message) as caught:
        parse_group(text, None, None)
    assert "\n" not in str(caught.value)


def test_group_names_are_short_unless_two_groups_share_a_name() -> None:
    labels = [label for _, label in group_specs(["spot", f"{REGION}/ondemand"], ZONE, None)]
    assert labels == ["spot", "ondemand"]
    specs = group_specs([f"{ZONE}/w", f"{REGION}/w", "v"], ZONE, None)
    assert [label for _, label in specs] == [f"{ZONE}/w", f"{REGION}/w", "v"]


@pytest.mark.parametrize("groups", [["w", f"{ZONE}/w"], ["w", "w"], [f"{REGION}/a", f"{REGION}/a"]])
def test_a_group_given_twice_is_refused(groups: list[str]) -> None:
    with pytest.raises(ConfigurationError, match="given more than once"):
        group_specs(groups, ZONE, None)


def test_a_zonal_and_a_regional_group_in_one_job_share_clients_and_credentials(
    fake: FakeCompute, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spot = fake.add_group("spot", zone=ZONE, size=2)
    ondemand = fake.add_group("ondemand", region=REGION, size=3, provisioning_model="STANDARD")
    fake.require_auth = True
    monkeypatch.setenv(
        "GOOGLE_APPLICATION_CREDENTIALS", str(fake.write_credentials(tmp_path / "c.json"))
    )
    options = parsed_options(
        "--group", "spot", "--group", f"{REGION}/ondemand", "--zone", ZONE,
        "--project", fake.project, "--endpoint", fake.url,
    )  # fmt: skip

    first, second = GcpProvider.groups_from_options(options, CoreOptions())

    assert isinstance(first, GcpProvider) and isinstance(second, GcpProvider)
    assert (first.group_name(), first.zone, first.region) == ("spot", ZONE, None)
    assert (second.group_name(), second.zone, second.region) == ("ondemand", None, REGION)
    assert sorted(i.id for i in first.list_instances()) == sorted(spot.names())
    listed = second.list_instances()
    assert sorted(i.id for i in listed) == sorted(ondemand.names())
    assert {i.lifecycle for i in listed} == {Lifecycle.ON_DEMAND}
    assert (first.group_lifecycle(), second.group_lifecycle()) == (
        Lifecycle.SPOT,
        Lifecycle.ON_DEMAND,
    )
    # One set of credentials: one token for both groups.
    assert len(fake.calls("oauth2.token")) == 1
    assert fake.calls("instanceGroupManagers.listManagedInstances")
    assert fake.calls("regionInstanceGroupManagers.listManagedInstances")
    first.close()
    second.close()


def test_one_group_still_makes_one_provider_and_from_options_refuses_several(
    fake: FakeCompute, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "GOOGLE_APPLICATION_CREDENTIALS", str(fake.write_credentials(tmp_path / "c.json"))
    )
    one = parsed_options("--group", f"{REGION}/w", "--project", "p", "--endpoint", fake.url)
    (made,) = GcpProvider.groups_from_options(one, CoreOptions())
    assert isinstance(made, GcpProvider) and (made.region, made.group_name()) == (REGION, "w")
    assert GcpProvider.from_options(one, CoreOptions()).region == REGION

    two = parsed_options("--group", "a", "--group", "b", "--zone", ZONE, "--project", "p")
    with pytest.raises(ConfigurationError, match="--group is given 2 times"):
        GcpProvider.from_options(two, CoreOptions())
    with pytest.raises(ConfigurationError, match="--group is required"):
        GcpProvider.groups_from_options(parsed_options("--zone", ZONE), CoreOptions())
    assert not fake.requests


# ------------------------------------------------------------------ lifecycle


@pytest.mark.parametrize(
    ("model", "template_region", "wanted"),
    [
        ("SPOT", None, Lifecycle.SPOT),
        ("PREEMPTIBLE", None, Lifecycle.SPOT),  # preemptible: true, no provisioning model
        ("STANDARD", None, Lifecycle.ON_DEMAND),
        (None, None, Lifecycle.ON_DEMAND),  # no scheduling at all
        ("SPOT", REGION, Lifecycle.SPOT),
        ("STANDARD", REGION, Lifecycle.ON_DEMAND),
    ],
)
def test_group_lifecycle_comes_from_the_instance_template_read_once(
    fake: FakeCompute, model: str | None, template_region: str | None, wanted: Lifecycle
) -> None:
    fake.add_group(
        "workers", region=REGION, size=0, provisioning_model=model, template_region=template_region
    )
    provider = make_provider(fake, region=REGION)

    assert provider.group_lifecycle() is wanted
    assert provider.group_lifecycle() is wanted

    api = "regionInstanceTemplates.get" if template_region else "instanceTemplates.get"
    (call,) = fake.calls(api)
    assert call.path.endswith("/instanceTemplates/workers-template")
    assert {r.api for r in fake.requests} == {"regionInstanceGroupManagers.get", api}


def test_an_unreadable_template_leaves_the_lifecycle_to_the_members(
    fake: FakeCompute, caplog: pytest.LogCaptureFixture
) -> None:
    fake.add_group("workers", zone=ZONE, size=1)
    fake.deny("compute.instanceTemplates.get")
    provider = make_provider(fake)

    with caplog.at_level(logging.WARNING, logger="spotring.providers.gcp"):
        assert provider.group_lifecycle() is None
        assert provider.group_lifecycle() is None

    assert caplog.text.count("cannot read its instance template") == 1
    assert "compute.instanceTemplates.get" in caplog.text


def test_a_template_that_cannot_be_reached_is_a_retryable_error(fake: FakeCompute) -> None:
    fake.add_group("workers", zone=ZONE, size=1)
    provider = make_provider(fake, max_api_attempts=2)
    provider.list_instances()
    fake.fail_next(2, 503, match="instanceTemplates")

    with pytest.raises(ProviderError) as caught:
        provider.group_lifecycle()

    assert caught.value.retryable
    assert provider.group_lifecycle() is Lifecycle.SPOT


# ------------------------------------------------------------------ shortage


def test_shortage_codes_map_to_causes() -> None:
    assert shortage_cause("ZONE_RESOURCE_POOL_EXHAUSTED") is ShortageCause.CAPACITY
    assert shortage_cause("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS") is ShortageCause.CAPACITY
    assert shortage_cause("QUOTA_EXCEEDED") is ShortageCause.QUOTA
    assert shortage_cause("REGION_RESOURCE_POOL_EXHAUSTED") is ShortageCause.CAPACITY
    assert shortage_cause("RESOURCE_NOT_FOUND") is ShortageCause.OTHER


@pytest.mark.parametrize(
    ("code", "cause"),
    [
        ("ZONE_RESOURCE_POOL_EXHAUSTED", ShortageCause.CAPACITY),
        ("ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS", ShortageCause.CAPACITY),
        ("QUOTA_EXCEEDED", ShortageCause.QUOTA),
    ],
)
def test_a_member_whose_creation_failed_is_a_shortage_without_another_call(
    fake: FakeCompute, code: str, cause: ShortageCause
) -> None:
    group = fake.add_group("workers", zone=ZONE, size=1)
    provider = make_provider(fake)
    provider.list_instances()
    group.capacity_error(ZONE, code)
    provider.set_target_size(3)
    since = time.time()
    listed = provider.list_instances()
    calls = len(fake.requests)

    shortage = provider.capacity_shortage(since)

    assert shortage is not None
    assert (shortage.cause, shortage.code) == (cause, code)
    assert shortage.at is not None and shortage.at >= since
    assert shortage.message and "\n" not in shortage.message
    assert len(fake.requests) == calls, "the listing already held the errors"
    # What the listing showed: two members without a VM, CREATING, not usable.
    failing = [i for i in listed if not i.address]
    assert [i.state for i in failing] == [InstanceState.PENDING] * 2
    assert {i.cloud_state for i in failing} == {"CREATING/-/-"}


def test_a_shortage_clears_when_capacity_returns(fake: FakeCompute) -> None:
    group = fake.add_group("workers", zone=ZONE, size=1)
    provider = make_provider(fake)
    group.capacity_error(ZONE)
    provider.list_instances()
    provider.set_target_size(2)
    provider.list_instances()
    assert provider.capacity_shortage(0.0) is not None
    group.clear_capacity_error()
    provider.list_instances()  # created now
    provider.list_instances()

    later = time.time()
    assert provider.capacity_shortage(later) is None
    # ... while the error stays in listErrors, with the time it happened.
    older = provider.capacity_shortage(0.0)
    assert older is not None and older.code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert older.at is not None and older.at < later


def test_list_errors_gives_the_newest_launch_failure_since_a_time(fake: FakeCompute) -> None:
    group = fake.add_group("workers", zone=ZONE, size=2)
    provider = make_provider(fake)
    provider.list_instances()  # every member running: no lastAttempt errors
    now = time.time()
    group.add_error("QUOTA_EXCEEDED", timestamp=rfc3339(now - 600))
    group.add_error(
        "ZONE_RESOURCE_POOL_EXHAUSTED",
        action="CREATING_WITHOUT_RETRIES",
        timestamp=rfc3339(now - 100),
    )
    group.add_error("SOMETHING_ELSE", action=None, timestamp=rfc3339(now - 50))
    group.add_error("RESOURCE_IN_USE", action="DELETING", timestamp=rfc3339(now - 10))
    fake.clear_requests()

    newest = provider.capacity_shortage(now - 200)
    assert newest is not None
    assert (newest.cause, newest.code) == (ShortageCause.OTHER, "SOMETHING_ELSE")
    assert newest.at == pytest.approx(now - 50, abs=0.01)

    group.errors.pop(2)  # only the capacity one after `since` now
    found = provider.capacity_shortage(now - 200)
    assert found is not None and (found.cause, found.code) == (
        ShortageCause.CAPACITY,
        "ZONE_RESOURCE_POOL_EXHAUSTED",
    )
    quota = provider.capacity_shortage(now - 1000)
    assert quota is not None and quota.code == "ZONE_RESOURCE_POOL_EXHAUSTED"  # the newest
    assert provider.capacity_shortage(now - 5) is None  # only a deletion's error since then

    calls = fake.calls(LIST_ERRORS)
    assert len(calls) == 4 and {c.query.get("maxResults") for c in calls} == {"500"}
    assert all(c.method == "GET" for c in calls)


@pytest.mark.parametrize("order", ["oldest", "shuffled", "newest"])
def test_list_errors_finds_the_newest_on_any_page_in_any_order(
    fake: FakeCompute, order: str
) -> None:
    """listErrors names no order (and refuses orderBy): every page is read."""
    group = fake.add_group("workers", region=REGION, size=1)
    group.errors_order = order
    now = time.time()
    for i in range(700):  # two pages of 500, the newest last added
        group.add_error("ZONE_RESOURCE_POOL_EXHAUSTED", timestamp=rfc3339(now - 700 + i))
    provider = make_provider(fake, region=REGION)

    found = provider.capacity_shortage(now - 1000)

    assert found is not None and found.at == pytest.approx(now - 1, abs=0.01)
    assert len(fake.calls("regionInstanceGroupManagers.listErrors")) == 2


def test_list_errors_reads_a_bounded_number_of_pages(
    fake: FakeCompute, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(client, "ERRORS_PAGES", 2)
    group = fake.add_group("workers", zone=ZONE, size=1)
    now = time.time()
    for i in range(1600):
        group.add_error("QUOTA_EXCEEDED", timestamp=rfc3339(now - 1600 + i))

    assert make_provider(fake).capacity_shortage(now - 2000) is not None
    assert len(fake.calls(LIST_ERRORS)) == 2


# ------------------------------------------------------------------ remove


@pytest.mark.parametrize("where", ["zone", "region"])
def test_remove_instance_deletes_it_and_lowers_the_target_once(
    fake: FakeCompute, where: str
) -> None:
    location = {"zone": ZONE} if where == "zone" else {"region": REGION}
    group = fake.add_group("workers", size=3, **location)
    group.auto_advance = False
    provider = make_provider(fake, **location)
    victim = provider.list_instances()[0]

    provider.remove_instance(victim.id)
    provider.remove_instance(victim.id)  # idempotent before the next listing
    # The target size it remembers is the group's now: resizing to 2 asks nothing.
    api = DELETE if where == "zone" else REGIONAL_DELETE
    calls = len(fake.requests)
    provider.set_target_size(2)
    assert len(fake.requests) == calls
    states = {i.id: i.state for i in provider.list_instances()}
    provider.remove_instance(victim.id)  # ... and after it (the group says DELETING)
    group.advance()  # deleted
    provider.list_instances()
    provider.remove_instance(victim.id)  # ... and once it is gone

    (call,) = fake.calls(api)
    assert call.body == {
        "instances": [f"zones/{victim.zone}/instances/{victim.id}"],
        "skipInstancesOnValidationError": True,
    }
    assert states[victim.id] is InstanceState.TERMINATING
    assert group.target_size == 2 and victim.id not in group.names()
    assert provider.can_remove


def test_remove_instance_of_a_member_that_left_meanwhile_is_no_error(fake: FakeCompute) -> None:
    group = fake.add_group("workers", zone=ZONE, size=3)
    group.auto_advance = False
    provider = make_provider(fake)
    victim = provider.list_instances()[0].id
    group.remove_member(victim)  # gone between the listing and the call

    provider.remove_instance(victim)
    provider.remove_instance("never-a-member")

    assert len(fake.calls(DELETE)) == 1  # sent, skipped by the group
    assert group.target_size == 2  # lowered once, by the member's own removal


def test_remove_instance_of_a_regional_member_never_placed_is_retryable(
    fake: FakeCompute,
) -> None:
    group = fake.add_group("workers", region=REGION, size=1)
    group.auto_advance = False
    group.add_member("workers-new", current_action="CREATING", instance_status=None)
    provider = make_provider(fake, region=REGION)
    provider.list_instances()

    with pytest.raises(ProviderError, match="has not placed it in a zone") as caught:
        provider.remove_instance("workers-new")

    assert caught.value.retryable and not fake.calls(REGIONAL_DELETE)


# ------------------------------------------------------------------ reads only


def test_listing_and_capacity_checks_only_read(fake: FakeCompute) -> None:
    spot = fake.add_group("spot", zone=ZONE, size=2)
    ondemand = fake.add_group(
        "ondemand", region=REGION, size=1, provisioning_model="STANDARD", template_region=REGION
    )
    spot.capacity_error(ZONE)
    spot._resize(4)
    providers = [make_provider(fake, "spot"), make_provider(fake, "ondemand", region=REGION)]

    for provider in providers:
        for _ in range(2):
            provider.list_instances()
            provider.group_lifecycle()
            provider.capacity_shortage(0.0)

    assert {r.api for r in fake.requests} <= READS
    posts = {r.api for r in fake.requests if r.method != "GET"}
    assert posts <= {
        "instanceGroupManagers.listManagedInstances",
        "regionInstanceGroupManagers.listManagedInstances",
    }
    assert (spot.target_size, ondemand.target_size) == (4, 1)
