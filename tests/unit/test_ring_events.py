"""The rings' events: one typed interface (driver/ring_events.py), fed by the ring side
(driver/ring_side.py) and turned into the plugins' hooks by one adapter
(autoscaler/job.py: PluginRingEvents). No Horovod run: milliseconds."""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import pytest

from spotring.autoscaler import hookspecs
from spotring.autoscaler.job import PluginRingEvents
from spotring.autoscaler.plugins import get_plugin_manager
from spotring.core import hookimpl
from spotring.core.job import JobShape
from spotring.driver.launcher import ProcessLauncher
from spotring.driver.options import DurableOptions, ElasticOptions
from spotring.driver.ring_events import Hang, NoRingEvents, RingEvents, RingLoss, RingStatus, Stall
from tests.unit.quiet_controller import QuietController

EVENTS = [n for n, _ in inspect.getmembers(RingEvents, inspect.isfunction) if n.startswith("ring_")]


def test_every_ring_event_is_a_hook_of_its_name_and_the_adapter_calls_it() -> None:
    assert sorted(EVENTS) == sorted(
        ["ring_formed", "ring_progress", "ring_idle", "ring_stalled", "ring_hung", "ring_lost"]
    )
    heard: list[tuple[str, dict[str, Any]]] = []

    class Plugin:
        @hookimpl
        def spotring_ring_formed(self, size: int, hosts: Sequence[str]) -> None:
            heard.append(("ring_formed", {"size": size, "hosts": hosts}))

        @hookimpl
        def spotring_ring_progress(self, status: RingStatus) -> None:
            heard.append(("ring_progress", {"status": status}))

        @hookimpl
        def spotring_ring_idle(self, seconds: float) -> None:
            heard.append(("ring_idle", {"seconds": seconds}))

        @hookimpl
        def spotring_ring_stalled(self, stall: Stall) -> None:
            heard.append(("ring_stalled", {"stall": stall}))

        @hookimpl
        def spotring_ring_hung(self, hang: Hang) -> None:
            heard.append(("ring_hung", {"hang": hang}))

        @hookimpl
        def spotring_ring_lost(self, size: int, why: str, checkpoint: Any, lost: Any) -> None:
            heard.append(("ring_lost", {"size": size, "why": why, "checkpoint": checkpoint,
                                        "lost": lost}))  # fmt: skip

    for name in EVENTS:
        assert hasattr(hookspecs, f"spotring_{name}"), f"no hook for the ring event {name}"
    pm = get_plugin_manager(load_entry_points=False)
    pm.register(Plugin())
    events: RingEvents = PluginRingEvents(pm.hook)
    status, stall = RingStatus(2, 3, 10, 0.5, "a[0]"), Stall(2, 1.0, 2.5)
    hang = Hang(2, "a", 0, 9.0, 9.0)
    lost = {"commits": 2, "seconds": 1.5}
    loss = RingLoss(3, "all 3 workers were killed or lost", {"commits": 7}, lost)
    events.ring_formed(3, ["a", "b"])
    events.ring_progress(status)
    events.ring_idle(0.5)
    events.ring_stalled(stall)
    events.ring_hung(hang)
    events.ring_lost(loss)
    assert heard == [
        ("ring_formed", {"size": 3, "hosts": ["a", "b"]}),
        ("ring_progress", {"status": status}),
        ("ring_idle", {"seconds": 0.5}),
        ("ring_stalled", {"stall": stall}),
        ("ring_hung", {"hang": hang}),
        ("ring_lost", {"size": 3, "why": loss.why, "checkpoint": {"commits": 7},
                       "lost": {"commits": 2, "seconds": 1.5}}),
    ]  # fmt: skip


class Checkpoints:
    """The run's durable checkpoints (driver.ring_side.DurableCheckpoints)."""

    def __init__(self, at_start: dict[str, Any] | None, newest: dict[str, Any] | None) -> None:
        self.at_start = at_start
        self._newest = newest

    def newest(self) -> dict[str, Any] | None:
        return self._newest


class Heard(NoRingEvents):
    def __init__(self) -> None:
        self.told: list[Any] = []

    def ring_formed(self, size: int, hosts: Sequence[str]) -> None:
        self.told.append(("formed", size, list(hosts)))

    def ring_lost(self, loss: RingLoss) -> None:
        self.told.append(loss)


@pytest.fixture
def launcher() -> Any:
    launcher = ProcessLauncher(remote=False)
    yield launcher
    launcher.close()


def _ring_side(launcher: ProcessLauncher, heard: Heard, checkpoints: Checkpoints) -> Any:
    from spotring.driver.ring_side import RingSide

    options = ElasticOptions(durable=DurableOptions("file:///tmp/x"), warm_start=False)
    job = JobShape(num_proc=2, min_num_proc=1, max_num_proc=2, resize=True)
    return RingSide(QuietController(), launcher, job, options, heard, checkpoints)


def test_a_lost_ring_is_told_with_its_checkpoint_and_the_commits_lost_since(
    launcher: ProcessLauncher,
) -> None:
    """The commits count from the checkpoint the run started from (5); 4 more were
    made; the ring is lost and the next starts from commit 7: 2 were lost."""
    newest = {"commits": 7, "committed_at": 1000.0, "age_seconds": 1.0, "name": "c7"}
    heard = Heard()
    ring = _ring_side(launcher, heard, Checkpoints({"commits": 5}, newest))
    ring.ring_formed(2, ["a", "b"])
    ring.progress.slot_started("a", 0)
    ring.progress.worker_progress("a", 0, 4, 0.0)
    ring.ring_lost(RingLoss(2, "all 2 workers were killed or lost"))
    loss = heard.told[-1]
    assert heard.told[0] == ("formed", 2, ["a", "b"])
    assert (loss.size, loss.checkpoint, loss.lost["commits"]) == (2, newest, 2)
    assert loss.lost["seconds"] is not None


def test_a_lost_ring_without_a_readable_checkpoint_counts_from_zero(
    launcher: ProcessLauncher,
) -> None:
    heard = Heard()
    ring = _ring_side(launcher, heard, Checkpoints(None, None))
    ring.ring_formed(1, ["a"])
    ring.progress.slot_started("a", 0)
    ring.progress.worker_progress("a", 0, 3, 0.0)
    ring.ring_lost(RingLoss(1, "every host of the ring left"))
    assert heard.told[-1].lost == {"commits": 3, "seconds": None}
    assert heard.told[-1].checkpoint is None
