"""The cost per sample (#35): the samples the workers' elastic samplers commit travel
from the signed progress line through the ring's status to the cost meter, and the
events file, the metrics and the report give the cost per sample; unknown (not 0)
when no worker commits a sampler."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from spotring.autoscaler.observers.cost import CostMeter
from spotring.autoscaler.observers.events import EventLog
from spotring.autoscaler.observers.metrics import Metrics
from spotring.autoscaler.observers.report import group_cost_line, read_events
from spotring.autoscaler.plugins import get_plugin_manager
from spotring.core import Instance, InstanceState, Inventory, Lifecycle
from spotring.core.prices import HourlyPrice
from spotring.driver.ring_events import RingStatus
from spotring.worker_image.progress import ProgressMessage
from tests.unit.test_ring_progress import tracker

HOUR = 3600.0


def test_a_progress_line_carries_the_jobs_samples_from_the_samplers_position() -> None:
    line = ProgressMessage("launch-1", 1, 5, 0.25, 0.1, (2, 300, 1000))
    assert line.samples == 2 * 1000 + 300
    assert (
        ProgressMessage.from_body(line.fields() | {"launch": "l", "seq": 1, "mac": ""}).samples
        == 2300
    )
    assert ProgressMessage("launch-1", 1, 5, 0.25, 0.1).samples is None  # no sampler


def test_the_ring_status_carries_the_samples_of_its_latest_commit() -> None:
    progress, clock, recorder = tracker()
    for host in ("a", "b"):
        progress.slot_started(host, 0)
    progress.ring_formed(2, ["a", "b"])
    progress.worker_progress("a", 0, 1, 0.0, 0.0, 1.5, 1500)
    progress.worker_progress("b", 0, 1, 0.0, 0.0, 1.25, 1250)  # an older commit of the job
    clock.now += 10.0
    progress.tick()
    assert (recorder.records[-1].epochs, recorder.records[-1].samples) == (1.5, 1500)


def test_without_a_sampler_the_ring_status_has_no_samples() -> None:
    progress, clock, recorder = tracker()
    progress.slot_started("a", 0)
    progress.ring_formed(1, ["a"])
    progress.worker_progress("a", 0, 1, 0.0, 0.0)
    clock.now += 10.0
    progress.tick()
    assert recorder.records[-1].samples is None


def test_the_cost_per_sample_counts_the_samples_trained_in_the_run() -> None:
    meter = CostMeter()
    meter.price(0.0, "spot", "spot", 0.5)
    meter.members(0.0, {("spot", "spot"): 2})  # $1 an hour
    meter.progress(1, 10, 10.25, 10250)  # a job resumed at its 10th epoch
    meter.progress(1, 20, 11.25, 11250)
    meter.progress(2, 5, 10.75, 10750)  # a ring resumed from an older checkpoint: net progress
    cost = meter.cost(HOUR)
    assert cost.samples == 500 and cost.per_sample_usd == pytest.approx(1.0 / 500)
    record = cost.record()
    assert record["samples"] == 500 and record["usd_per_sample"] == pytest.approx(0.002)


def test_without_a_sampler_the_cost_per_sample_is_unknown_not_zero() -> None:
    meter = CostMeter()
    meter.price(0.0, "spot", "spot", 0.5)
    meter.members(0.0, {("spot", "spot"): 2})
    meter.progress(1, 10)
    cost = meter.cost(HOUR)
    assert cost.samples is None and cost.per_sample_usd is None
    assert cost.record()["usd_per_sample"] is None and cost.per_step_usd is not None


def started(pm: object, lifecycle: Lifecycle = Lifecycle.SPOT) -> None:
    host = Instance("i-a", "a", InstanceState.READY, 1, lifecycle, group="g")
    pm.hook.spotring_price_changed(  # type: ignore[attr-defined]
        group="g", lifecycle=lifecycle, price=HourlyPrice(0.5, "--price", 0.0)
    )
    pm.hook.spotring_refreshed(  # type: ignore[attr-defined]
        inventory=Inventory((host,), 1), seconds=0.0, calls=None, error=None, target=1
    )


def test_the_events_file_records_the_samples_and_the_cost_per_sample(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    pm = get_plugin_manager(load_entry_points=False)
    pm.register(log)
    started(pm)
    pm.hook.spotring_ring_progress(status=RingStatus(1, 1, 3, 0.0, "a[0]", 0.5, 500))
    pm.hook.spotring_ring_progress(status=RingStatus(1, 1, 4, 0.0, "a[0]", 0.75, 750))
    log.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["samples"] for r in records if r["event"] == "progress"] == [500, 750]
    cost = [r for r in records if r["event"] == "cost"][-1]
    assert cost["samples"] == 250 and cost["usd_per_sample"] is not None


def test_the_metrics_give_the_samples_and_the_cost_per_sample() -> None:
    metrics = Metrics(port=0)
    try:
        pm = get_plugin_manager(load_entry_points=False)
        pm.register(metrics)
        started(pm)
        sample = metrics.registry.get_sample_value
        pm.hook.spotring_ring_progress(status=RingStatus(1, 1, 1, 0.0, "a[0]"))
        assert math.isnan(sample("spotring_cost_per_sample_usd"))  # type: ignore[arg-type]
        assert math.isnan(sample("spotring_trained_samples"))  # type: ignore[arg-type]
        pm.hook.spotring_ring_progress(status=RingStatus(1, 1, 2, 0.0, "a[0]", 3.0, 3000))
        pm.hook.spotring_ring_progress(status=RingStatus(1, 1, 3, 0.0, "a[0]", 3.5, 3500))
        assert sample("spotring_trained_samples") == 500
        assert sample("spotring_cost_per_sample_usd") >= 0  # type: ignore[operator]
    finally:
        metrics.close()


def run_file(path: Path, samples: tuple[int, int] | None) -> Path:
    """One spot host at $0.5 an hour for two hours; its ring commits 10 steps, then 20,
    with the sampler's ``samples`` if given."""
    first, last = samples or (None, None)
    records = [
        {"event": "job_started", "progress": True, "groups": ["g"]},
        {"event": "price", "group": "g", "lifecycle": "spot", "usd": 0.5},
        {"event": "instance_state", "id": "a", "state": "ready", "lifecycle": "spot", "group": "g"},
        {"event": "progress", "ring": 1, "steps": 10, "samples": first},
        {"event": "progress", "ring": 1, "steps": 20, "t": 2 * HOUR, "samples": last},
        {"event": "job_finished", "t": 2 * HOUR},
    ]
    path.write_text("".join(json.dumps({"v": 1, "t": 0.0, **r}) + "\n" for r in records))
    return path


def test_the_report_gives_the_cost_per_sample_or_says_it_is_unknown(tmp_path: Path) -> None:
    line = group_cost_line(read_events(run_file(tmp_path / "a.jsonl", (1000, 3000))), {})
    assert "$0.0005 per sample (2000 samples)" in line
    line = group_cost_line(read_events(run_file(tmp_path / "b.jsonl", None)), {})
    assert "cost per sample unknown (no worker committed an elastic sampler)" in line
    assert "per sample (" not in line
