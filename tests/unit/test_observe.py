"""The events file, the Prometheus endpoint and the report, fed by a real controller."""

from __future__ import annotations

import base64
import json
import re
import urllib.request
from pathlib import Path

import pluggy
import pytest

from spotring.autoscaler.cli import main
from spotring.autoscaler.controller import Controller
from spotring.autoscaler.observers.events import VERSION, EventLog
from spotring.autoscaler.observers.metrics import Metrics, run_series
from spotring.autoscaler.observers.report import ReportError, read_events, write_report
from spotring.autoscaler.plugins import get_plugin_manager
from spotring.core.job import JobShape
from spotring.driver.ring_progress import Hang, RingStatus, Stall
from spotring.providers.base import InstanceState, InterruptionNotice
from tests.fakes.scripted import ScriptedProvider, instance

RECORDED = Path(__file__).parents[1] / "data" / "run_events.jsonl"
"""The events of a local run: 2 hosts, a scale-up to 3, a noticed preemption."""


def manager_with(*plugins: object) -> pluggy.PluginManager:
    pm = get_plugin_manager(load_entry_points=False)
    for plugin in plugins:
        pm.register(plugin)
    return pm


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_events_are_versioned_lines_written_as_they_happen(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    provider = ScriptedProvider([instance("a"), instance("b", InstanceState.PENDING)])
    log = EventLog(path)
    pm = manager_with(log)
    controller = Controller(provider, pm.hook, refresh_interval=60)
    assert controller.refresh()
    # Line-buffered: readable while the run goes on.
    recorded = lines(path)
    assert all(e["v"] == VERSION and isinstance(e["t"], float) for e in recorded)
    assert [(e["event"], e.get("id"), e.get("state")) for e in recorded] == [
        ("instance_state", "i-a", "ready"),
        ("instance_state", "i-b", "pending"),
        ("refresh", None, None),
    ]
    assert recorded[-1]["hosts"] == {"ready": 1, "pending": 1} and recorded[-1]["ready"] == 1

    provider.members = [instance("a"), instance("b")]
    controller.refresh()  # b: pending -> ready; a unchanged, not written again
    controller.host_noticed("b", InterruptionNotice("preempt", 123.0))
    controller._take_noticed_hosts()
    provider.members = [instance("a")]
    controller.refresh()
    # The rings and the job's end reach the log through the plugin manager too.
    pm.hook.spotring_ring_formed(size=1, hosts=["a"])
    pm.hook.spotring_job_finished(ok=True, exit_code=0, seconds=12.5, world_sizes=[2, 1])
    log.close()
    events = [(e["event"], e.get("id"), e.get("state")) for e in lines(path)[3:]]
    assert ("instance_state", "i-b", "ready") in events
    assert ("instance_state", "i-a", "ready") not in events
    assert ("notice", "i-b", None) in events
    gone = events.index(("instance_state", "i-b", "gone"))
    assert events[gone + 1 :] == [
        ("refresh", None, None),
        ("ring_formed", None, None),
        ("job_finished", None, None),
    ]
    finished = lines(path)[-1]
    assert finished["event"] == "job_finished" and finished["resets"] == 1


def test_the_registry_the_docs_read_is_the_one_a_run_serves() -> None:
    """``run_series`` builds every series without a port: what a run serves, no more."""
    listed = {
        f"{family.name}_total" if family.type == "counter" else family.name
        for family in run_series().registry.collect()
    }
    metrics = Metrics(0)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics.port}/metrics") as answer:
            text = answer.read().decode()
    finally:
        metrics.close()
    served = set(re.findall(r"^# TYPE (\S+) ", text, re.MULTILINE))
    assert len(listed) > 10
    assert {name for name in served if not name.endswith("_created")} == listed


def test_metrics_serve_the_documented_series(tmp_path: Path) -> None:
    provider = ScriptedProvider([instance("a"), instance("b", InstanceState.PENDING)])
    metrics = Metrics(0)
    try:
        pm = manager_with(metrics)
        controller = Controller(provider, pm.hook, refresh_interval=60)
        controller.refresh()
        pm.hook.spotring_ring_formed(size=2, hosts=["a", "b"])
        pm.hook.spotring_ring_formed(size=1, hosts=["a"])
        pm.hook.spotring_ring_idle(seconds=2.5)
        pm.hook.spotring_ring_stalled(stall=Stall(2, 1000.0, 1000.75))
        pm.hook.spotring_host_failed(
            instance=instance("a"), reason="hung: the ring made no progress ..."
        )
        controller.host_noticed("b", InterruptionNotice("preempt"))
        controller._take_noticed_hosts()
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics.port}/metrics") as answer:
            text = answer.read().decode()
    finally:
        metrics.close()
    samples = dict(re.findall(r"^(spotring_[^ ]+) ([0-9.e+-]+)$", text, re.MULTILINE))
    assert samples["spotring_world_size"] == "1.0"
    assert samples['spotring_hosts{state="ready"}'] == "1.0"
    assert samples['spotring_hosts{state="pending"}'] == "1.0"
    assert samples["spotring_resets_total"] == "1.0"
    assert samples['spotring_notices_total{kind="preempt"}'] == "1.0"
    assert 'spotring_refresh_duration_seconds_count{provider=""}' in samples
    assert 'spotring_instance_seconds_total{lifecycle="spot"}' in samples
    assert "spotring_target_hosts" in samples
    assert samples["spotring_seconds_since_progress"] == "2.5"
    assert samples["spotring_stall_seconds_sum"] == "0.75"
    assert samples['spotring_stall_seconds_bucket{le="1.0"}'] == "1.0"
    assert samples['spotring_host_failures_total{reason="worker_hung"}'] == "1.0"


def test_the_jobs_and_the_rings_events_are_lines_written_through_the_hooks(
    tmp_path: Path,
) -> None:
    path = tmp_path / "events.jsonl"
    pm = get_plugin_manager(load_entry_points=False)
    job = JobShape(num_proc=4, min_num_proc=2, max_num_proc=8)
    provider = ScriptedProvider()
    pm.hook.spotring_job_started.call_historic(
        kwargs={"provider": provider, "job": job, "groups": [provider]}
    )
    log = EventLog(path)
    pm.register(log)  # after the job started: the historic hook is replayed to it
    hang = Hang(2, "a", 1, 30.0, 31.0)
    pm.hook.spotring_ring_progress(status=RingStatus(1, 4, 10, 0.5, "a[0]"))
    pm.hook.spotring_ring_stalled(stall=Stall(2, 1000.0, 1000.75))
    pm.hook.spotring_ring_hung(hang=hang)
    log.close()
    assert [{k: v for k, v in e.items() if k not in ("v", "t")} for e in lines(path)] == [
        {"event": "job_started", "provider": "scripted", "np": 4, "min_np": 2, "max_np": 8,
         "progress": True},
        {"event": "progress", "ring": 1, "size": 4, "steps": 10, "idle_s": 0.5,
         "slowest": "a[0]", "epochs": None, "samples": None},
        {"event": "cost", "usd": 0.0, "by_group": [], "unpriced_hours": 0.0,
         "all_on_demand_usd": 0.0, "spot_share": None, "steps": 10, "usd_per_step": 0.0,
         "epochs": None, "usd_per_epoch": None, "samples": None, "usd_per_sample": None},
        {"event": "stall", "ring": 2, "start": 1000.0, "end": 1000.75, "seconds": 0.75},
        {"event": "hang", "ring": 2, "host": "a", "local_rank": 1, "idle_s": 30.0,
         "member_idle_s": 31.0, "reason": hang.reason},
    ]  # fmt: skip


def test_a_taken_metrics_port_is_a_one_line_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    taken = Metrics(0)
    try:
        code = main(["run", "--provider", "local", "-np", "1", "--metrics-port",
                     str(taken.port), "--", "true"])  # fmt: skip
    finally:
        taken.close()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "--metrics-port" in err[0], err


def test_report_renders_a_recorded_run(tmp_path: Path) -> None:
    run = read_events(RECORDED)
    assert [size for _, size in run.world] == [2, 3, 3, 0]
    assert [what for _, what in run.notices] == ["host-2 preempt"]
    assert run.instance_hours["spot"] > 0
    # Written before progress was recorded: its since_change_s is no stall.
    assert run.stalls == [] and not run.has_progress

    page = tmp_path / "report.html"
    message = write_report(RECORDED, page, price_spot=0.3, price_on_demand=1.0)
    assert message.startswith(f"wrote {page}")
    text = page.read_text()
    png = base64.b64decode(re.search(r'src="data:image/png;base64,([^"]+)"', text)[1])
    assert png.startswith(b"\x89PNG\r\n\x1a\n")
    table_rows = re.findall(r"<tr><td>", text)
    quiet = sum(1 for e in lines(RECORDED) if e["event"] in ("refresh", "instance_state"))
    assert len(table_rows) == len(lines(RECORDED)) - quiet
    assert "notice" in text and "host=host-2" in text
    assert re.search(r"spot and 0\.000 on-demand instance-hours: \$\d+\.\d\d at \$0\.3/h", text)
    assert "saved $" in text
    assert "has no progress records" in text and "stood still" not in text.split("<h2>")[0]

    chart = tmp_path / "report.png"
    write_report(RECORDED, chart)
    assert chart.read_bytes().startswith(b"\x89PNG")


def test_report_shades_the_recorded_stalls_only(tmp_path: Path) -> None:
    """A join: ring_formed says 5.6 s since the change (the ring trained meanwhile);
    the stall record says 0.6 s without a commit. Only that is shaded."""
    t0 = 1_800_000_000.0
    records = [
        {"v": 1, "t": t0, "event": "job_started", "provider": "local", "np": 2,
         "min_np": 1, "max_np": 3, "progress": True},
        {"v": 1, "t": t0 + 1, "event": "ring_formed", "size": 2, "hosts": ["a", "b"],
         "since_change_s": None},
        {"v": 1, "t": t0 + 1, "event": "progress", "ring": 1, "size": 2, "steps": 0,
         "idle_s": 0, "slowest": "a[0]"},
        {"v": 1, "t": t0 + 20, "event": "ring_formed", "size": 3, "hosts": ["a", "b", "c"],
         "since_change_s": 5.6},
        {"v": 1, "t": t0 + 21.5, "event": "stall", "ring": 2, "start": t0 + 19.8,
         "end": t0 + 20.4, "seconds": 0.6},
        {"v": 1, "t": t0 + 30, "event": "job_finished", "ok": True, "exit_code": 0,
         "seconds": 30, "world_sizes": [2, 3], "resets": 1},
    ]  # fmt: skip
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    run = read_events(path)
    assert run.has_progress
    assert [(round(a, 3), round(b, 3)) for a, b in run.stalls] == [(19.8, 20.4)]
    page = tmp_path / "report.html"
    write_report(path, page)
    text = page.read_text()
    assert "the ring stood still 0.6 s in 1 stall(s)" in text
    assert "has no progress records" not in text


def test_report_skips_a_truncated_last_line_and_refuses_what_it_cannot_read(
    tmp_path: Path,
) -> None:
    crashed = tmp_path / "crashed.jsonl"
    crashed.write_text(RECORDED.read_text() + '{"v":1,"t":17954126')
    assert read_events(crashed).skipped_lines == 1
    with pytest.raises(ReportError, match="cannot read"):
        read_events(tmp_path / "missing.jsonl")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("not json\n")
    with pytest.raises(ReportError, match="holds no spotring events"):
        read_events(empty)
    newer = tmp_path / "newer.jsonl"
    newer.write_text(json.dumps({"v": VERSION + 1, "t": 1.0, "event": "x"}) + "\n")
    with pytest.raises(ReportError, match="version"):
        read_events(newer)


def test_provider_warnings_become_events_while_the_log_is_open(tmp_path: Path) -> None:
    import logging

    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    capacity = "azure: scale set w cannot create VMs in zone 1: AllocationFailed: ..."
    logging.getLogger("spotring.providers.azure").warning("%s", capacity)
    logging.getLogger("spotring.providers.azure").info("not a warning")
    log.close()
    logging.getLogger("spotring.providers.azure").warning("after the run")
    assert [(e["event"], e["source"], e["message"]) for e in lines(path)] == [
        ("provider_warning", "spotring.providers.azure", capacity)
    ]


def test_report_shows_a_lost_ring_as_no_workers_until_the_next_ring(tmp_path: Path) -> None:
    t0 = 1_800_000_000.0
    records = [
        {"v": 1, "t": t0, "event": "ring_formed", "size": 2, "hosts": ["a", "b"]},
        {"v": 1, "t": t0 + 10, "event": "ring_lost", "size": 2,
         "why": "all 2 workers were killed or lost",
         "resumed_from": {"commits": 40, "age_seconds": 1.5, "name": "ckpt-x"}},
        {"v": 1, "t": t0 + 30, "event": "ring_formed", "size": 2, "hosts": ["c", "d"]},
    ]  # fmt: skip
    path = tmp_path / "events.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    run = read_events(path)
    assert run.world == [(0.0, 2), (10.0, 0), (30.0, 2)]
    assert run.lost_rings == [10.0]
    write_report(path, tmp_path / "report.html")
