"""The job's cost: member-hours at their group's price then (time-weighted as prices
change), what they would have cost on-demand, the share on spot and the cost per
committed step, in the events file, the metrics and the report."""

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
from spotring.driver.ring_progress import RingStatus

HOUR = 3600.0


def two_hours(meter: CostMeter) -> None:
    """Two spot members of ``spot`` and one on-demand of ``od`` for two hours; spot
    costs 0.1 the first hour and 0.2 the second, on-demand 1.0; rings 1 and 2 commit
    10 and 5 steps."""
    meter.price(0.0, "spot", "spot", 0.1)
    meter.price(0.0, "od", "on-demand", 1.0)
    meter.members(0.0, {("spot", "spot"): 2, ("od", "on-demand"): 1})
    meter.progress(1, 7)
    meter.progress(1, 10)
    meter.price(HOUR, "spot", "spot", 0.2)
    meter.progress(2, 5)


def test_member_hours_are_priced_at_their_groups_price_then() -> None:
    meter = CostMeter()
    two_hours(meter)
    cost = meter.cost(2 * HOUR)
    assert cost.hours == {("spot", "spot"): 4.0, ("od", "on-demand"): 2.0}
    assert cost.usd == pytest.approx({("spot", "spot"): 0.6, ("od", "on-demand"): 2.0})
    assert cost.all_on_demand_usd == pytest.approx(6.0)
    assert cost.spot_share == pytest.approx(4 / 6)
    assert cost.steps == 15
    assert cost.per_step_usd == pytest.approx(2.6 / 15)


def test_hours_before_a_groups_first_price_are_priced_once_it_is_told() -> None:
    meter = CostMeter()  # the prices are read off the controller's thread: told late
    meter.members(0.0, {("spot", "spot"): 2, ("od", "on-demand"): 1})
    early = meter.cost(HOUR)
    assert early.unpriced_hours == 3.0 and early.all_on_demand_usd is None
    meter.price(HOUR, "spot", "spot", 0.1)
    meter.price(HOUR, "od", "on-demand", 1.0)
    meter.members(2 * HOUR, {("spot", "spot"): 2, ("od", "on-demand"): 1})
    cost = meter.cost(2 * HOUR)
    assert cost.unpriced_hours == 0.0
    assert cost.usd == pytest.approx({("spot", "spot"): 0.4, ("od", "on-demand"): 2.0})
    assert cost.all_on_demand_usd == pytest.approx(6.0)


def test_overrides_win_and_an_unknown_price_is_counted_apart() -> None:
    meter = CostMeter({"spot": 0.05})
    two_hours(meter)
    assert meter.cost(2 * HOUR).usd[("spot", "spot")] == pytest.approx(0.2)

    unknown = CostMeter()
    unknown.price(0.0, "spot", "spot", None)
    unknown.members(0.0, {("spot", "spot"): 1})
    unknown.progress(1, 3)
    cost = unknown.cost(HOUR)
    assert (cost.usd, cost.unpriced_hours) == ({}, 1.0)
    assert cost.per_step_usd is None and cost.all_on_demand_usd is None


def test_the_cost_per_epoch_counts_the_epochs_trained_in_the_run() -> None:
    meter = CostMeter()
    two_hours(meter)  # $2.60
    assert meter.cost(2 * HOUR).epochs is None  # no sampler committed
    meter.progress(1, 10, 10.25)  # a job resumed at its 10th epoch
    meter.progress(1, 12, 11.25)
    meter.progress(2, 5, 10.75)  # a ring resumed from an older checkpoint: net progress
    cost = meter.cost(2 * HOUR)
    assert cost.epochs == pytest.approx(0.5)
    assert cost.per_epoch_usd == pytest.approx(2.6 / 0.5)
    record = cost.record()
    assert record["epochs"] == 0.5 and record["usd_per_epoch"] == pytest.approx(5.2)


def test_a_one_group_jobs_members_take_the_groups_price() -> None:
    meter = CostMeter()
    meter.price(0.0, "workers", "spot", 0.3)
    meter.members(0.0, {("", "spot"): 1})
    assert meter.cost(HOUR).usd == {("", "spot"): pytest.approx(0.3)}


def events_file(path: Path) -> Path:
    """A run as the events file records it: two spot hosts and one on-demand for two
    hours, the spot price doubling after one."""
    records = [
        {"event": "job_started", "progress": True, "groups": ["spot", "od"]},
        {"event": "price", "group": "spot", "lifecycle": "spot", "usd": 0.1},
        {"event": "price", "group": "od", "lifecycle": "on-demand", "usd": 1.0},
        *[
            {"event": "instance_state", "id": i, "state": "ready", "lifecycle": lc, "group": g}
            for i, lc, g in [("a", "spot", "spot"), ("b", "spot", "spot"), ("c", "on-demand", "od")]
        ],
        {"event": "progress", "ring": 1, "steps": 10, "epochs": 0.25},
        {"event": "price", "group": "spot", "lifecycle": "spot", "usd": 0.2, "t": HOUR},
        {"event": "progress", "ring": 2, "steps": 5, "t": 2 * HOUR, "epochs": 1.25},
        {"event": "job_finished", "t": 2 * HOUR},
    ]
    path.write_text("".join(json.dumps({"v": 1, "t": 0.0, **r}) + "\n" for r in records))
    return path


def test_the_report_prices_the_hours_at_the_recorded_prices_unless_given(
    tmp_path: Path,
) -> None:
    run = read_events(events_file(tmp_path / "events.jsonl"))
    line = group_cost_line(run, {})
    assert "spot (spot): 4.000 h, $0.60 at $0.15/h" in line
    assert "od (on-demand): 2.000 h, $2.00 at $1/h;" in line and "total $2.60" in line
    assert "all on-demand $6.00 (saved 57%)" in line
    assert "67% of the hours on spot" in line
    assert "$0.173333 per committed step (15 steps)" in line
    assert "$2.6 per epoch (1 epochs)" in line
    assert "total $4.40" in group_cost_line(run, {"spot": 0.6})


def test_the_events_file_records_prices_and_the_cost_so_far(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    pm = get_plugin_manager(load_entry_points=False)
    pm.register(log)
    host = Instance("i-a", "a", InstanceState.READY, 1, Lifecycle.SPOT, group="spot")
    pm.hook.spotring_price_changed(
        group="spot", lifecycle=Lifecycle.SPOT, price=HourlyPrice(0.5, "--price", 7.0)
    )
    pm.hook.spotring_refreshed(
        inventory=Inventory((host,), 1), seconds=0.0, calls=None, error=None, target=1
    )
    pm.hook.spotring_ring_progress(status=RingStatus(1, 1, 3, 0.0, "a[0]", 0.5))
    pm.hook.spotring_ring_progress(status=RingStatus(1, 1, 4, 0.0, "a[0]", 0.75))
    pm.hook.spotring_job_finished(ok=True, exit_code=0, seconds=1.0, world_sizes=[1])
    log.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    price = next(r for r in records if r["event"] == "price")
    assert (price["group"], price["usd"], price["source"], price["read_at"]) == (
        "spot",
        0.5,
        "--price",
        7.0,
    )
    cost = [r for r in records if r["event"] == "cost"][-1]
    assert cost["steps"] == 4 and cost["spot_share"] == 1.0
    assert cost["epochs"] == 0.25 and cost["usd_per_epoch"] is not None
    assert [r["epochs"] for r in records if r["event"] == "progress"] == [0.5, 0.75]
    assert cost["by_group"][0]["group"] == "spot" and cost["by_group"][0]["usd"] >= 0
    assert records[-1]["cost"]["steps"] == 4  # job_finished's


def test_the_metrics_give_the_price_and_the_cost(tmp_path: Path) -> None:
    metrics = Metrics(port=0)
    try:
        pm = get_plugin_manager(load_entry_points=False)
        pm.register(metrics)
        pm.hook.spotring_price_changed(
            group="od", lifecycle=Lifecycle.ON_DEMAND, price=HourlyPrice(2.0, "cloud", 0.0)
        )
        pm.hook.spotring_price_changed(
            group="od", lifecycle=Lifecycle.ON_DEMAND, price=HourlyPrice(3.0, "--price", 0.0)
        )
        host = Instance("i-a", "a", InstanceState.READY, 1, Lifecycle.ON_DEMAND, group="od")
        pm.hook.spotring_refreshed(
            inventory=Inventory((host,), 1), seconds=0.0, calls=None, error=None, target=1
        )
        sample = metrics.registry.get_sample_value
        pm.hook.spotring_ring_progress(status=RingStatus(1, 1, 1, 0.0, "a[0]", 3.0))
        assert math.isnan(sample("spotring_cost_per_epoch_usd"))  # type: ignore[arg-type]
        pm.hook.spotring_ring_progress(status=RingStatus(1, 1, 2, 0.0, "a[0]", 3.5))
        assert sample("spotring_trained_epochs") == 0.5
        assert sample("spotring_cost_per_epoch_usd") >= 0  # type: ignore[operator]
        assert (
            sample("spotring_group_price_usd_per_hour", {"group": "od", "source": "--price"}) == 3.0
        )
        assert (
            sample("spotring_group_price_usd_per_hour", {"group": "od", "source": "cloud"}) is None
        )
        assert sample("spotring_committed_steps") == 2
        assert sample("spotring_spot_share") == 0.0
        assert sample("spotring_cost_usd", {"group": "od", "lifecycle": "on-demand"}) >= 0  # type: ignore[operator]
        assert not math.isnan(sample("spotring_cost_all_on_demand_usd"))  # type: ignore[arg-type]
    finally:
        metrics.close()
