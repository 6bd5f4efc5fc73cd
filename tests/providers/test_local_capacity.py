"""The local provider's simulated capacity (#25): a spot group whose launches fail beyond
``--spot-capacity``, the on-demand group behind it, and the control lines that take
capacity away and give it back."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import subprocess

import pytest

from spotring.autoscaler.observers.events import EventLog
from spotring.core.inventory import Inventory
from spotring.providers.base import (
    ConfigurationError,
    CoreOptions,
    InstanceState,
    Lifecycle,
    Provider,
    ProviderError,
    ShortageCause,
)
from spotring.providers.conformance import ProviderContract
from spotring.providers.local import (
    CAPACITY_CODE,
    ON_DEMAND_GROUP,
    SPOT_GROUP,
    LocalOnDemandGroup,
    LocalProvider,
)

READY = InstanceState.READY
PENDING = InstanceState.PENDING
GONE = InstanceState.GONE


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def states(group: Provider) -> dict[str, InstanceState]:
    return {i.id: i.state for i in group.list_instances()}


def groups(*argv: str, np: int = 4) -> list[Provider]:
    """The groups ``spotring run --provider local ARGV -np NP`` would make."""
    parser = argparse.ArgumentParser()
    LocalProvider.add_arguments(parser.add_argument_group())
    options = parser.parse_args(["--boot-seconds", "0", *argv])
    return LocalProvider.groups_from_options(options, CoreOptions(num_proc=np))


@pytest.fixture
def sleeper():  # type: ignore[no-untyped-def]
    """A stand-in worker process group."""
    process = subprocess.Popen(["sleep", "60"], start_new_session=True)
    yield process
    if process.poll() is None:
        process.kill()
        process.wait()


# ------------------------------------------------------------------ the two groups


class _FailingOnDemand(LocalOnDemandGroup):
    """The on-demand group behind an API that always fails."""

    def list_instances(self):  # type: ignore[no-untyped-def]
        raise ProviderError("simulated API outage")

    def set_target_size(self, size: int) -> None:
        raise ProviderError("simulated API outage")

    def replace_instance(self, instance_id: str) -> None:
        raise ProviderError("simulated API outage")


class TestLocalOnDemandContract(ProviderContract):
    @pytest.fixture
    def provider(self) -> Provider:
        on_demand = LocalProvider(1).on_demand
        on_demand.set_target_size(3)
        return on_demand

    @pytest.fixture
    def failing_provider(self) -> Provider:
        return _FailingOnDemand(LocalProvider(1))


def test_a_local_job_has_a_spot_group_then_an_on_demand_group() -> None:
    spot, on_demand = groups("--spot-capacity", "2")
    try:
        assert isinstance(spot, LocalProvider) and isinstance(on_demand, LocalOnDemandGroup)
        assert (spot.group_name(), on_demand.group_name()) == (SPOT_GROUP, ON_DEMAND_GROUP)
        assert spot.group_lifecycle() is Lifecycle.SPOT
        assert on_demand.group_lifecycle() is Lifecycle.ON_DEMAND
        assert spot.can_remove and on_demand.can_remove
        assert states(spot) == {"host-0": READY, "host-1": READY}, "4 asked, 2 of capacity"
        assert states(on_demand) == {}, "the on-demand group starts empty"
    finally:
        spot.close()
        on_demand.close()  # closing the pool twice is fine


def test_each_group_lists_only_its_own_hosts_with_their_lifecycle() -> None:
    spot, on_demand = groups("--spot-capacity", "2")
    on_demand.set_target_size(2)
    listed = {i.id: i for i in [*spot.list_instances(), *on_demand.list_instances()]}
    assert sorted(listed) == ["host-0", "host-1", "od-0", "od-1"], "names unique in the pool"
    assert {i.id for i in spot.list_instances()} == {"host-0", "host-1"}
    for name, instance in listed.items():
        spot_host = name.startswith("host-")
        assert instance.lifecycle is (Lifecycle.SPOT if spot_host else Lifecycle.ON_DEMAND)
        assert instance.group == (SPOT_GROUP if spot_host else ON_DEMAND_GROUP)
        assert instance.address == name and instance.state is READY
    assert on_demand.describe() == "local on-demand group (2 hosts)"
    assert on_demand.capacity_shortage(0.0) is None, "on-demand is never short"


def test_without_spot_capacity_the_group_is_as_before() -> None:
    spot, on_demand = groups(np=3)
    assert states(spot) == {"host-0": READY, "host-1": READY, "host-2": READY}
    spot.set_target_size(40)
    assert len(states(spot)) == 40
    assert spot.capacity_shortage(0.0) is None
    assert states(on_demand) == {}


def test_chaos_never_touches_the_on_demand_hosts(tmp_path) -> None:  # type: ignore[no-untyped-def]
    control = tmp_path / "control"
    spot, on_demand = groups("--control", str(control), np=2)
    assert isinstance(spot, LocalProvider)
    on_demand.set_target_size(1)
    assert spot.preempt("od-0") is None
    assert spot.notice("od-0") is None
    assert sorted(spot.preempt_all()) == ["host-0", "host-1"]
    control.write_text("preempt od-0\npreempt all\nnotice all\n")
    assert states(on_demand) == {"od-0": READY}


# ---------------------------------------------------------------- spot capacity


def test_spot_launches_beyond_capacity_fail_and_are_reported(caplog) -> None:  # type: ignore[no-untyped-def]
    clock = Clock()
    caplog.set_level(logging.WARNING, "spotring.providers")
    provider = LocalProvider(4, spot_capacity=2, clock=clock)
    assert states(provider) == {"host-0": READY, "host-1": READY}
    shortage = provider.capacity_shortage(0.0)
    assert shortage is not None
    assert (shortage.cause, shortage.code) == (ShortageCause.CAPACITY, CAPACITY_CODE)
    assert "no spot capacity for 2 of the 4 hosts" in shortage.message
    # Each launch attempt (each refresh) is a failure of its own, with its own time.
    clock.now += 30
    states(provider)
    newer = provider.capacity_shortage(0.0)
    assert newer is not None and newer.at is not None and shortage.at is not None
    assert newer.at == pytest.approx(shortage.at + 30)
    assert provider.capacity_shortage(shortage.at + 10) == newer
    assert provider.capacity_shortage(newer.at) == newer, "at `since` counts"
    assert provider.capacity_shortage(newer.at + 0.001) is None
    # The log hears of the first failure of a run, not of every refresh.
    warned = [r for r in caplog.records if CAPACITY_CODE in r.getMessage()]
    assert len(warned) == 1 and SPOT_GROUP in warned[0].getMessage()
    # Asked for no more than it holds (the controller backs it off), then probed again.
    provider.set_target_size(2)
    provider.set_target_size(4)
    warned = [r for r in caplog.records if CAPACITY_CODE in r.getMessage()]
    assert len(warned) == 2, "a failed probe is a new run of failures"
    assert not any("capacity again" in what for _, what in provider.events)


def test_capacity_given_back_launches_what_the_group_lacks_and_the_failures_stop() -> None:
    clock = Clock()
    provider = LocalProvider(4, spot_capacity=2, boot_seconds=5, clock=clock)
    failed = provider.capacity_shortage(0.0)
    assert failed is not None and failed.at is not None
    clock.now += 10
    provider.set_spot_capacity(4)
    assert states(provider) == {
        "host-0": READY,
        "host-1": READY,
        "host-2": PENDING,
        "host-3": PENDING,
    }
    clock.now += 5
    assert set(states(provider).values()) == {READY}
    assert provider.capacity_shortage(failed.at + 1) is None, "no failure since"
    assert provider.capacity_shortage(0.0) == failed, "the old one is still the newest"
    notes = [what for _, what in provider.events]
    assert "chaos: spot capacity 4" in notes
    assert f"{SPOT_GROUP}: spot capacity again: launching 2 host(s)" in notes


def test_lowering_capacity_preempts_nobody_but_stops_replacements(sleeper) -> None:  # type: ignore[no-untyped-def]
    provider = LocalProvider(3, spot_capacity=None)
    provider.worker_started("host-2", sleeper.pid)
    provider.set_spot_capacity(1)
    assert states(provider) == {"host-0": READY, "host-1": READY, "host-2": READY}
    assert sleeper.poll() is None, "running hosts stay"
    assert provider.capacity_shortage(0.0) is None, "nothing was launched, nothing failed"
    provider.preempt("host-2")
    assert states(provider) == {"host-0": READY, "host-1": READY, "host-2": GONE}
    assert states(provider) == {"host-0": READY, "host-1": READY}, "no replacement"
    assert provider.capacity_shortage(0.0) is not None


def test_a_noticed_host_holds_its_capacity_until_it_is_gone() -> None:
    provider = LocalProvider(2, spot_capacity=2)
    noticed = provider.list_instances()[1]
    provider.host_noticed(noticed, notice=None)  # type: ignore[arg-type]  # unused by the provider
    assert set(states(provider)) == {"host-0", "host-1"}, "no room for its replacement yet"
    assert provider.capacity_shortage(0.0) is not None
    provider.preempt("host-1")
    states(provider)
    assert states(provider) == {"host-0": READY, "host-2": READY}, "its replacement"


def test_initial_hosts_beyond_capacity_are_not_launched() -> None:
    provider = LocalProvider(3, spot_capacity=0)
    assert states(provider) == {}
    assert provider.capacity_shortage(0.0) is not None


def test_bad_capacity_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError):
        LocalProvider(1, spot_capacity=-1)
    with pytest.raises(ConfigurationError):
        LocalProvider(1).set_spot_capacity(-1)


# ---------------------------------------------------------------- control lines


def test_control_lines_take_spot_capacity_away_and_give_it_back(tmp_path, caplog) -> None:  # type: ignore[no-untyped-def]
    control = tmp_path / "control"
    spot, on_demand = groups("--spot-capacity", "2", "--control", str(control))
    assert len(states(spot)) == 2
    control.write_text("spot-capacity 4\n")
    assert sorted(states(spot)) == ["host-0", "host-1", "host-2", "host-3"]
    with control.open("a") as stream:
        stream.write("spot-capacity 0\nscale 6\n")
    assert len(states(spot)) == 4, "no capacity for the 2 more asked"
    assert spot.capacity_shortage(0.0) is not None
    with control.open("a") as stream:
        stream.write("spot-capacity unlimited\nspot-capacity lots\n")
    assert len(states(on_demand)) == 0  # either group's refresh runs the lines
    assert len(states(spot)) == 6
    assert "ignoring control line 'spot-capacity lots'" in caplog.text
    assert isinstance(spot, LocalProvider)
    assert [what for _, what in spot.events if what.startswith("chaos")] == [
        "chaos: spot capacity 4",
        "chaos: spot capacity 0",
        "chaos: group scaled to 6 hosts",
        "chaos: spot capacity unlimited",
    ]


def test_scale_resizes_the_spot_group_only(tmp_path) -> None:  # type: ignore[no-untyped-def]
    control = tmp_path / "control"
    spot, on_demand = groups("--control", str(control), np=3)
    on_demand.set_target_size(2)
    control.write_text("scale 1\n")
    assert states(spot) == {"host-0": READY, "host-1": GONE, "host-2": GONE}
    assert states(on_demand) == {"od-0": READY, "od-1": READY}


# ------------------------------------------------------------------- removal


@pytest.mark.parametrize("lifecycle", list(Lifecycle))
def test_remove_instance_stops_the_host_and_lowers_the_group(
    lifecycle: Lifecycle,
    sleeper,  # type: ignore[no-untyped-def]
) -> None:
    spot, on_demand = groups(np=2)
    on_demand.set_target_size(2)
    group, other = (spot, on_demand) if lifecycle is Lifecycle.SPOT else (on_demand, spot)
    first, second = sorted(states(group))
    group.worker_started(second, sleeper.pid)
    group.remove_instance(second)
    assert sleeper.wait(timeout=5) == -signal.SIGTERM, "its workers stop as at a scale-in"
    group.remove_instance(second)  # idempotent: the group is not lowered twice
    group.remove_instance("host-99")
    other.remove_instance(first)  # not a member of the other group: nothing
    assert states(group) == {first: READY, second: GONE}
    assert states(group) == {first: READY}, "no replacement: the group now holds one"
    assert len(states(other)) == 2


# ------------------------------------------------------------------ read-only


def test_listing_and_asking_for_shortages_change_no_group() -> None:
    spot, on_demand = groups("--spot-capacity", "1", np=3)
    for _ in range(3):
        spot.list_instances()
        on_demand.list_instances()
        spot.capacity_shortage(0.0)
    assert states(spot) == {"host-0": READY}
    assert states(on_demand) == {}, "a shortage is the controller's to act on"


def test_the_events_file_shows_each_hosts_lifecycle(tmp_path) -> None:  # type: ignore[no-untyped-def]
    spot, on_demand = groups("--spot-capacity", "1", np=2)
    on_demand.set_target_size(1)
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    try:
        instances = (*spot.list_instances(), *on_demand.list_instances())
        log.spotring_refreshed(Inventory(instances), 0.01, None, None, 2)
    finally:
        log.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    shown = {r["id"]: r["lifecycle"] for r in records if r["event"] == "instance_state"}
    assert shown == {"host-0": "spot", "od-0": "on-demand"}
