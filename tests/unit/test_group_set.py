"""A job's groups and the controller's capacity steering: two groups of one job, driven
by Controller.step() with the capacity policy's own clock (no sleeps)."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from spotring.autoscaler import hookimpl
from spotring.autoscaler.capacity import CapacityOptions, ShortageBackoff
from spotring.autoscaler.controller import Controller
from spotring.autoscaler.groups import describe_groups, job_groups, list_members
from spotring.autoscaler.observers.events import EventLog
from spotring.autoscaler.plugins import get_plugin_manager
from spotring.core import (
    CapacityShortage,
    ConfigurationError,
    CoreOptions,
    Instance,
    InstanceState,
    InterruptionNotice,
    JobShape,
    Lifecycle,
    ProviderError,
    ShortageCause,
)
from spotring.providers.base import Provider
from tests.fakes.scripted import ScriptedProvider, instance

JOB = JobShape(num_proc=4, min_num_proc=1, max_num_proc=4)
OPTIONS = CapacityOptions(return_after=0)
BACKOFF = ShortageBackoff().cap * 1.4  # past any first backoff


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Pool(Provider):
    """A group that launches up to ``capacity`` members at once and reports the rest
    as a capacity shortage, as a cloud group's activity log would."""

    name = "pool"
    can_remove = True

    def __init__(self, group: str, lifecycle: Lifecycle, capacity: int) -> None:
        self.group = group
        self.lifecycle = lifecycle
        self.capacity = capacity
        self.members: list[Instance] = []
        self.targets: list[int] = []
        self.removed: list[str] = []
        self.replaced: list[str] = []
        self.noticed: list[str] = []
        self.shortage: CapacityShortage | None = None
        self.shortage_asks: list[float] = []
        self.lifecycle_asks = 0
        self._next = 0

    @classmethod
    def from_options(cls, options: argparse.Namespace, core: CoreOptions) -> Pool:
        raise NotImplementedError

    def group_name(self) -> str:
        return self.group

    def group_lifecycle(self) -> Lifecycle:
        self.lifecycle_asks += 1
        return self.lifecycle

    def list_instances(self) -> list[Instance]:
        return list(self.members)

    def set_target_size(self, size: int) -> None:
        self.targets.append(size)
        self._fill(size)

    def _fill(self, size: int) -> None:
        import time

        while len(self.members) < min(size, self.capacity):
            name = f"{self.group}{self._next}"
            self._next += 1
            self.members.append(Instance(id=f"i-{name}", address=name, state=InstanceState.READY))
        if size > self.capacity:
            self.shortage = CapacityShortage(
                ShortageCause.CAPACITY, "InsufficientInstanceCapacity", "no spot", time.time()
            )

    def replace_instance(self, instance_id: str) -> None:
        self.replaced.append(instance_id)

    def host_noticed(self, instance: Instance, notice: InterruptionNotice) -> None:
        self.noticed.append(instance.id)

    def remove_instance(self, instance_id: str) -> None:
        self.removed.append(instance_id)
        self.members = [m for m in self.members if m.id != instance_id]
        self.targets.append(self.targets[-1] - 1)

    def capacity_shortage(self, since: float) -> CapacityShortage | None:
        self.shortage_asks.append(since)
        shortage = self.shortage
        return shortage if shortage is not None and (shortage.at or 0) >= since else None


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, ...]] = []
        self.in_group: list[float] = []

    @hookimpl
    def spotring_capacity_shortage(self, group, shortage) -> None:  # type: ignore[no-untyped-def]
        self.events.append(("capacity_shortage", group, shortage.code))

    @hookimpl
    def spotring_fell_back(self, from_group, to_group, hosts) -> None:  # type: ignore[no-untyped-def]
        self.events.append(("fell_back", from_group, to_group, str(hosts)))

    @hookimpl
    def spotring_returned(self, instance, group, seconds) -> None:  # type: ignore[no-untyped-def]
        self.events.append(("returned", instance.address, group))
        self.in_group.append(seconds)


CLOCK = Clock()


def job_of(
    spot: Pool, od: Pool, *plugins: object, capacity: CapacityOptions = OPTIONS
) -> Controller:
    pm = get_plugin_manager(load_entry_points=False)
    for plugin in plugins:
        pm.register(plugin)
    return Controller([spot, od], pm.hook, job=JOB, capacity=capacity, capacity_clock=CLOCK)


def probe(spot: Pool, capacity: int = 4) -> None:
    """Give ``spot`` its capacity back, and let its backoff pass."""
    spot.capacity = capacity
    spot.shortage = None
    CLOCK.now += BACKOFF


def ready(controller: Controller) -> list[str]:
    assert controller.inventory is not None
    return sorted(i.address for i in controller.inventory.ready)


def fall_back(*plugins: object) -> tuple[Pool, Pool, Controller]:
    spot = Pool("spot", Lifecycle.SPOT, capacity=2)
    od = Pool("od", Lifecycle.ON_DEMAND, capacity=10)
    controller = job_of(spot, od, *plugins)
    controller.step()  # the job's 4 hosts asked of spot, which launches 2
    CLOCK.now += 1  # a refresh later (the policy's since is this clock's, on the wall)
    controller.step()  # spot's shortage read; its 2 missing hosts asked of od
    controller.step()
    return spot, od, controller


# ------------------------------------------------------------------ the groups


def test_one_group_is_that_group_call_for_call() -> None:
    provider = ScriptedProvider([instance("a"), instance("b")])
    assert list_members([provider], {}) == provider.members  # as listed: no group named
    assert describe_groups([provider]) == provider.describe()
    controller = Controller([provider], job=JOB, replace_grace=0)
    assert controller.groups == (provider,) == Controller(provider).groups
    controller.step()
    controller.host_failed("a", "worker exited with 1")
    controller.step()
    assert provider.targets == [4] and provider.replaced == ["i-a"]


def test_members_are_named_with_their_group_and_lifecycle_asked_once() -> None:
    spot = Pool("spot", Lifecycle.SPOT, capacity=4)
    od = Pool("od", Lifecycle.ON_DEMAND, capacity=4)
    spot.set_target_size(1)
    od.set_target_size(1)
    lifecycles: dict[str, Lifecycle | None] = {}
    for _ in range(2):
        listed = {i.id: (i.group, i.lifecycle) for i in list_members([spot, od], lifecycles)}
        assert listed == {
            "i-spot0": ("spot", Lifecycle.SPOT),
            "i-od0": ("od", Lifecycle.ON_DEMAND),
        }
    assert (spot.lifecycle_asks, od.lifecycle_asks) == (1, 1)
    assert "spot" in describe_groups([spot, od]) and "od" in describe_groups([spot, od])


def test_each_member_is_steered_through_its_own_group() -> None:
    """A failed host is replaced, and a noticed one told, by the group that lists it."""
    spot = Pool("spot", Lifecycle.SPOT, capacity=4)
    od = Pool("od", Lifecycle.ON_DEMAND, capacity=4)
    spot.set_target_size(2)
    od.set_target_size(1)
    controller = Controller([spot, od], job=JOB, replace_grace=0)
    controller.refresh()
    controller.host_failed("od0", "worker exited with 1")
    assert controller.host_noticed("spot0", InterruptionNotice("preempt"))
    controller.step()
    assert (spot.replaced, od.replaced) == ([], ["i-od0"])
    assert (spot.noticed, od.noticed) == (["i-spot0"], [])


def test_group_names_must_differ() -> None:
    same = [Pool("a", Lifecycle.SPOT, 1), Pool("a", Lifecycle.SPOT, 1)]
    with pytest.raises(ConfigurationError, match="differ"):
        job_groups(same)
    with pytest.raises(ConfigurationError, match="differ"):
        Controller(same)


def test_the_events_file_lists_the_groups_of_a_job_of_several(tmp_path: Path) -> None:
    """It hears them with the job's start (``spotring_job_started``'s ``groups``)."""
    for names, listed in ((["spot", "od"], ["spot", "od"]), (["spot"], None)):
        path = tmp_path / f"{len(names)}.jsonl"
        pm = get_plugin_manager(load_entry_points=False)
        pm.register(EventLog(path))
        groups = [Pool(name, Lifecycle.SPOT, 1) for name in names]
        pm.hook.spotring_job_started.call_historic(
            kwargs={"provider": groups[0], "job": JOB, "groups": groups}
        )
        started = json.loads(path.read_text().splitlines()[0])
        assert started["provider"] == "pool" and started.get("groups") == listed


# ----------------------------------------------------------- the controller


def test_a_short_group_falls_back_to_the_next() -> None:
    recorder = Recorder()
    spot, od, controller = fall_back(recorder)
    assert spot.targets == [4, 2]  # short: asked for no more than it holds
    assert od.targets == [0, 2]
    assert ready(controller) == ["od0", "od1", "spot0", "spot1"]
    assert ("capacity_shortage", "spot", "InsufficientInstanceCapacity") in recorder.events
    assert ("fell_back", "spot", "od", "2") in recorder.events
    assert spot.shortage_asks, "the cloud was asked for its signal"
    asks = len(spot.shortage_asks)
    controller.step()  # backed off: the cloud is not asked again, spot not asked for more
    assert len(spot.shortage_asks) == asks and spot.targets == [4, 2]


def test_capacity_back_hands_fallback_hosts_back_one_at_a_time_at_a_commit() -> None:
    recorder = Recorder()
    spot, od, controller = fall_back(recorder)
    probe(spot)
    controller.step()  # the probe: spot asked for 4 again, and launches them
    assert spot.targets[-1] == 4
    controller.step()  # 6 ready: an od host leaves discovery (drains)
    assert len([h for h in ready(controller) if h.startswith("od")]) == 1
    assert od.removed == []  # not before the ring re-formed without it
    leaving = next(i for i in controller.inventory.instances if i.state is InstanceState.DRAINING)  # type: ignore[union-attr]
    controller.step()
    assert od.removed == []  # one at a time: no second host drains meanwhile
    assert len([h for h in ready(controller) if h.startswith("od")]) == 1
    stop = controller.ring_formed([h for h in ready(controller)])
    assert stop == [leaving.address]  # its workers are stopped
    controller.step()
    assert od.removed == [leaving.id]
    assert ("returned", leaving.address, "od") in recorder.events
    controller.step()  # gone from the listing: the next drains
    assert ready(controller) == ["spot0", "spot1", "spot2", "spot3"]
    controller.ring_formed(ready(controller))
    controller.step()
    controller.step()
    assert len(od.removed) == 2 and od.members == []
    assert ready(controller) == ["spot0", "spot1", "spot2", "spot3"]


def test_a_fallback_host_waits_for_its_replacement_to_be_offered_to_horovod() -> None:
    """A spot host still starting its warm worker is READY but not yet offered to
    Horovod: handing an on-demand host back then would train the ring small until the
    spot host is warm (rings 4 -> 3 -> 2 seen in the e2e)."""
    spot, od, controller = fall_back()
    ring = ["od0", "od1", "spot0", "spot1"]
    controller.hosts_offered(ring)
    probe(spot)
    controller.step()  # spot asked for 4 again, and launches them
    controller.step()  # READY, but discovery offers only the ring's hosts yet
    controller.step()
    assert ready(controller) == [*ring, "spot2", "spot3"] and od.removed == []
    controller.hosts_offered([*ring, "spot2"])  # one is warm: one od host may go
    controller.step()
    assert len([h for h in ready(controller) if h.startswith("od")]) == 1


def test_a_host_handed_back_that_fails_is_not_replaced() -> None:
    spot, _od, controller = fall_back()
    probe(spot)
    controller.step()
    controller.step()
    assert controller.inventory is not None
    leaving = next(i for i in controller.inventory.instances if i.state is InstanceState.DRAINING)
    controller.host_failed(leaving.address, "worker exited with 1")
    controller.step()
    assert controller.inventory.excluded == frozenset()


class Resizable(Pool):
    """A group that can only be resized (no removal of one member), whose resizes
    fail while ``failures`` lasts, as a throttled cloud's would."""

    can_remove = False
    failures = 0

    def set_target_size(self, size: int) -> None:
        if self.failures:
            self.failures -= 1
            raise ProviderError("Throttling: Rate exceeded")
        super().set_target_size(size)


def test_a_group_that_cannot_remove_a_member_is_shrunk_by_one() -> None:
    """Handing a host back through a resize asks one less than the group holds, even
    when none of its resizes went through before (it asked 0: every member gone)."""
    spot = Pool("spot", Lifecycle.SPOT, capacity=2)
    od = Resizable("od", Lifecycle.ON_DEMAND, capacity=10)
    od.set_target_size(2)  # two members the job falls back on
    od.targets.clear()
    od.failures = 10**6  # throttled: the controller never resizes it
    controller = job_of(spot, od)
    controller.step()
    CLOCK.now += 1
    controller.step()
    controller.step()
    assert od.targets == [] and len(od.members) == 2
    probe(spot)
    controller.step()
    controller.step()  # 6 ready: an od host drains
    controller.ring_formed(ready(controller))
    od.failures = 1  # this step's resize of od fails, its hand-back's goes through
    controller.step()
    assert od.targets == [1]


class Veto:
    def __init__(self, fall_back: bool = True, hand_back: bool = True) -> None:
        self.fall_back = fall_back
        self.hand_back = hand_back

    @hookimpl
    def spotring_fall_back(self, group, short, hosts, job) -> bool:  # type: ignore[no-untyped-def]
        return self.fall_back

    @hookimpl
    def spotring_return_to_spot(self, instance, group, job) -> bool:  # type: ignore[no-untyped-def]
        return self.hand_back


def test_a_plugin_may_veto_a_fallback() -> None:
    _spot, od, controller = fall_back(Veto(fall_back=False))
    assert max(od.targets, default=0) == 0  # od never asked for more than it holds
    assert ready(controller) == ["spot0", "spot1"]


def test_a_plugin_may_veto_a_hand_back() -> None:
    spot, od, controller = fall_back(Veto(hand_back=False))
    probe(spot)
    for _ in range(3):
        controller.step()
    assert len(ready(controller)) == 6 and od.removed == []


class Reverse:
    @hookimpl
    def spotring_order_groups(self, groups, job) -> list[str]:  # type: ignore[no-untyped-def]
        return [g.name for g in reversed(groups)]


def test_a_plugin_may_reorder_the_groups() -> None:
    spot = Pool("spot", Lifecycle.SPOT, capacity=4)
    od = Pool("od", Lifecycle.ON_DEMAND, capacity=4)
    controller = job_of(spot, od, Reverse())
    controller.step()
    assert od.targets == [4] and spot.targets == [0]


def test_the_events_file_records_groups_shortages_fallbacks_and_returns(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    spot, _od, controller = fall_back(log)
    probe(spot)
    controller.step()
    controller.step()
    controller.ring_formed(ready(controller))
    controller.step()
    log.close()
    events = [json.loads(line) for line in path.read_text().splitlines()]
    kinds = {e["event"] for e in events}
    assert {"capacity_shortage", "fell_back", "returned"} <= kinds
    fell = next(e for e in events if e["event"] == "fell_back")
    assert (fell["from"], fell["to"], fell["hosts"]) == ("spot", "od", 2)
    states = [e for e in events if e["event"] == "instance_state" and e["id"] == "i-od0"]
    assert states[0]["group"] == "od" and states[0]["lifecycle"] == "on-demand"


def test_metrics_count_hosts_by_group_shortages_fallbacks_and_returns() -> None:
    import urllib.request

    from spotring.autoscaler.observers.metrics import Metrics

    holder: list[Controller] = []
    metrics = Metrics(0, capacity=lambda: holder[0].capacity_status)
    try:
        spot, _od, controller = fall_back(metrics)
        holder.append(controller)
        probe(spot)
        controller.step()
        controller.step()
        controller.ring_formed(ready(controller))
        controller.step()
        controller.step()
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics.port}/metrics") as answer:
            text = answer.read().decode()
    finally:
        metrics.close()
    samples = dict(re.findall(r"^(spotring_[^ ]+) ([0-9.e+-]+)$", text, re.MULTILINE))
    ready_spot = 'spotring_group_hosts{group="spot",lifecycle="spot",state="ready"}'
    assert samples[ready_spot] == "4.0"
    assert samples['spotring_capacity_shortages_total{cause="capacity",group="spot"}'] == "1.0"
    assert samples['spotring_fallbacks_total{from_group="spot",to_group="od"}'] == "1.0"
    assert samples['spotring_returns_total{group="od"}'] == "1.0"
    assert samples['spotring_group_below_target_seconds{group="spot"}'] == "0.0"
    assert samples['spotring_group_target_hosts{group="spot"}'] == "4.0"
    assert 'spotring_group_instance_seconds_total{group="od",lifecycle="on-demand"}' in samples


def test_report_shows_hours_and_cost_by_group_time_below_target_and_each_swap(
    tmp_path: Path,
) -> None:
    from spotring.autoscaler.observers.report import read_events, write_report

    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    spot, _od, controller = fall_back(log)
    probe(spot)
    controller.step()
    controller.step()
    controller.ring_formed(ready(controller))
    controller.step()
    log.close()
    run = read_events(path)
    assert {key for key in run.group_hours} == {("spot", "spot"), ("od", "on-demand")}
    assert [what for _, what in run.fallbacks] == ["spot -> od (2)"]
    assert len(run.returns) == 1 and run.returns[0][1].endswith("back from od")
    assert len(run.shortages) == 1
    page = tmp_path / "report.html"
    write_report(path, page)
    assert "no prices given" in page.read_text()
    write_report(path, page, prices={"od": 1.0, "spot": 0.25})
    text = page.read_text()
    assert "od (on-demand): " in text and "at $1/h" in text and "at $0.25/h" in text
    assert "total $" in text and "1 fallback(s), 1 host(s) handed back" in text


def test_report_counts_the_time_below_target(tmp_path: Path) -> None:
    from spotring.autoscaler.observers.report import read_events

    t0 = 1_800_000_000.0
    records = [
        {"v": 1, "t": t0, "event": "refresh", "ready": 2, "target": 4, "error": None},
        {"v": 1, "t": t0 + 30, "event": "refresh", "ready": 4, "target": 4, "error": None},
        {"v": 1, "t": t0 + 50, "event": "refresh", "ready": 3, "target": 4, "error": None},
        {"v": 1, "t": t0 + 60, "event": "refresh", "ready": 3, "target": 4, "error": None},
    ]
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    assert read_events(path).below_target_s == pytest.approx(40)


def test_progress_lines_name_groups_and_swaps() -> None:
    import io

    from spotring.autoscaler.observers.progress import ProgressReporter

    stream = io.StringIO()
    reporter = ProgressReporter(stream)
    spot, _od, controller = fall_back(reporter)
    probe(spot)
    controller.step()
    controller.step()
    controller.ring_formed(ready(controller))
    controller.step()
    reporter.summary([4], True, 1.0)
    text = stream.getvalue()
    assert "+od0[od]" in text and "group spot is short" in text
    assert "asking od for 2 host(s) spot cannot supply" in text
    assert re.search(r"handed back after \d+ s in od: od shrunk by one", text)
    assert "fallbacks and hand-backs: spot -> od (2), od0 back from od" in text


class TwoPools(Pool):
    """A provider whose options name two groups (``--group`` twice)."""

    name = "twopools"

    @classmethod
    def groups_from_options(cls, options: argparse.Namespace, core: CoreOptions) -> list[Provider]:
        return [Pool("spot", Lifecycle.SPOT, 2), Pool("od", Lifecycle.ON_DEMAND, 2)]


def test_the_command_line_makes_the_groups_in_the_users_order() -> None:
    from spotring.autoscaler.cli import make_groups

    options = argparse.Namespace(slots_per_host=None)
    made = make_groups(TwoPools, options)
    assert [group.group_name() for group in made] == ["spot", "od"]
    (single,) = make_groups(ScriptedProvider, options)
    assert isinstance(single, ScriptedProvider)


def test_a_fallback_host_stays_return_after_seconds_in_its_group() -> None:
    recorder = Recorder()
    spot = Pool("spot", Lifecycle.SPOT, capacity=2)
    od = Pool("od", Lifecycle.ON_DEMAND, capacity=10)
    controller = job_of(spot, od, recorder, capacity=CapacityOptions(return_after=600))
    controller.step()
    CLOCK.now += 1
    controller.step()
    controller.step()  # od's two hosts listed: they fell back now
    probe(spot)  # 420 s later, spot has capacity again
    controller.step()
    controller.step()
    assert len(ready(controller)) == 6  # nothing handed back yet
    CLOCK.now += 180
    controller.step()
    assert len(ready(controller)) == 5  # one leaves the ring
    controller.ring_formed(ready(controller))
    controller.step()
    assert od.removed and recorder.in_group == [pytest.approx(600)]
    assert ("returned", "od0", "od") in recorder.events


def test_the_driver_stops_a_handed_back_hosts_workers_and_holds_its_rank_answer() -> None:
    """A host the controller hands back leaves the ring like a noticed host: once a
    ring forms without it, its workers are stopped, and until they exit Horovod's
    "no rank" answer (which makes them abort with a C++ error) is held back."""
    from spotring.driver.ring_side import NoticeRouter as _NoticeRouter

    class HandingBack:
        def ring_formed(self, hosts: list[str]) -> list[str]:
            return [] if "od0" in hosts else ["od0"]

    class Launcher:
        def __init__(self) -> None:
            self.stopped: list[str] = []

        def stop_workers_on(self, host: str) -> None:
            self.stopped.append(host)

    launcher = Launcher()
    router = _NoticeRouter(HandingBack(), launcher)  # type: ignore[arg-type]
    router.worker_started("od0", 7)
    router.ring_formed(2, ["spot0", "od0"])
    assert launcher.stopped == []
    router.ring_formed(1, ["spot0"])
    assert launcher.stopped == ["od0"]
    assert "od0" in router._departed  # its rank answers wait for its workers' exit


class Demotions:
    def __init__(self) -> None:
        self.groups: list[str] = []

    @hookimpl
    def spotring_group_demoted(self, group, until) -> None:  # type: ignore[no-untyped-def]
        self.groups.append(group)


@pytest.mark.parametrize(
    ("ran", "demoted"),
    [(False, []), (True, ["spot"])],
    ids=["launches-that-failed", "members-that-ran"],
)
def test_only_members_that_ran_count_as_preempted(ran: bool, demoted: list[str]) -> None:
    """Three spot members the cloud took within the hour demote their group; three
    launches that failed while the VMs were being created (Azure's Failed VMs, a
    GCP member whose creation failed) are a shortage, not preemptions."""
    demotions = Demotions()
    spot = Pool("spot", Lifecycle.SPOT, capacity=4)
    od = Pool("od", Lifecycle.ON_DEMAND, capacity=4)
    controller = job_of(spot, od, demotions)
    controller.step()  # 4 hosts asked of spot, launched
    controller.step()  # listed
    for n in range(3):
        name = f"launch{n}"
        seen = InstanceState.READY if ran else InstanceState.PENDING  # being created
        spot.members.append(Instance(f"i-{name}", name, seen))
        controller.step()
        spot.members[-1] = Instance(
            f"i-{name}", name, InstanceState.TERMINATING, failure="taken by the cloud"
        )
        controller.step()
        spot.members.pop()
        controller.step()
    assert demotions.groups == demoted
