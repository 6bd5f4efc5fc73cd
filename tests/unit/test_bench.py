"""Smoke test of bench/: the table and JSON helpers on made-up rows; every module imports.

No benchmark runs here and no moto server starts (the figures live in bench/run).
"""

from __future__ import annotations

import importlib
import json
import math
from pathlib import Path

import pytest

from bench import common


def _rows() -> list[common.Row]:
    return [
        common.row("discovery", "CPU ms per refresh", 10.0, "aws cli script", 400.0, "< 20 ms"),
        common.row("commit", "ms per commit", 30.0, "raw memcpy", 20.0, "<= 1.2x", {"k": 1}),
        common.row("driver overhead", "RSS MiB", 60.0, "script", 30.0),
        common.row("scale", "skipped size", math.nan, "script", math.nan, "< 2 s"),
    ]


def test_row_computes_the_ratio() -> None:
    first, second, *_ = _rows()
    assert first["ratio"] == pytest.approx(0.025)
    assert second["ratio"] == pytest.approx(1.5)
    assert set(first) == {
        "benchmark",
        "metric",
        "value",
        "anchor_name",
        "anchor_value",
        "ratio",
        "target",
        "extra",
    }
    assert math.isnan(common.row("b", "m", 1.0, "a", 0.0)["ratio"])


def test_targets_bound_the_value_or_the_ratio() -> None:
    met = [common.target_met(r) for r in _rows()]
    assert met == [True, False, None, None]
    assert common.target_met({"target": "<= 0.1", "value": 0.4, "ratio": 0.2}) is False
    assert common.target_met({"target": "< 1x", "value": 9.0, "ratio": 0.5}) is True


def test_table_lists_each_figure_next_to_its_anchor() -> None:
    lines = common.format_table(_rows()).splitlines()
    assert lines[0].split() == [
        "benchmark",
        "metric",
        "spotring",
        "anchor",
        "anchor",
        "value",
        "ratio",
        "target",
        "met",
    ]
    assert len(lines) == 2 + len(_rows())
    discovery = lines[2]
    for cell in ("CPU ms per refresh", "10", "aws cli script", "400", "0.025x", "< 20 ms", "yes"):
        assert cell in discovery
    assert lines[3].rstrip().endswith("NO")
    assert lines[5].rstrip().endswith("-")  # NaN figures: no ratio, target not checkable


def test_json_holds_machine_info_and_strict_numbers(tmp_path: Path) -> None:
    path = tmp_path / "latest.json"
    common.write_json(_rows(), path, notes=["n"], quick=True)
    document = json.loads(path.read_text())  # strict JSON: NaN was written as null
    assert {"cpu_count", "python", "torch", "horovod", "date"} <= set(document["machine"])
    assert [r["met"] for r in document["rows"]] == [True, False, None, None]
    assert document["rows"][3]["value"] is None
    assert document["quick"] is True

    changed = [dict(r) for r in _rows()]
    changed[0]["value"] = 15.0
    report = common.format_changes(changed, document)
    assert "10 -> 15 (+50%)" in report


@pytest.mark.parametrize("name", ["common", "discovery", "driver_overhead"])
def test_bench_modules_import(name: str) -> None:
    module = importlib.import_module(f"bench.{name}")
    if name != "common":
        assert callable(module.measure)


def test_runner_knows_every_benchmark() -> None:
    assert set(common.BENCHMARKS) >= {"discovery", "driver_overhead", "commit", "recovery"}
    assert (common.REPO / "bench" / "run").stat().st_mode & 0o111


# ------------------------------------------------------------------ the soak's figures


def _event(event: str, time: float, **fields: object) -> dict[str, object]:
    return {"event": event, "time": time, **fields}


def test_soak_counts_committed_steps_lost_and_the_stall_of_each_reset() -> None:
    from bench import soak

    recorded = [
        _event("resume", 0.0, step=0),
        _event("commit", 1.0, step=1),
        _event("commit", 2.0, step=2),
        _event("resume", 9.0, step=3),  # one past the last commit: no loss
        _event("commit", 10.0, step=4),
        _event("resume", 20.0, step=2),  # two committed steps lost
        _event("commit", 25.0, step=3),
    ]
    assert soak.steps_lost(recorded) == (2, 3)
    assert soak.stall_seconds(recorded) == [8.0, 15.0]


def test_soak_keeps_the_last_audit_of_each_epoch_and_judges_its_bounds() -> None:
    from bench import soak

    audits = soak.epoch_audits(
        [
            _event("epoch_audit", 1.0, epoch=0, samples=10, once=9, missing=1, repeated=0),
            _event("epoch_audit", 2.0, epoch=0, samples=10, once=10, missing=0, repeated=0),
            _event("epoch_audit", 3.0, epoch=1, samples=10, once=8, missing=1, repeated=1),
        ]
    )
    assert [a["once"] for a in audits.values()] == [10, 8]
    result = {
        "job finished": True,
        "committed steps lost": 0,
        "epochs completed": 2,
        "epochs with every sample exactly once": 1,
        "processes left": [],
        "driver RSS MiB (after 1 min -> end)": [200.0, 210.0],
        "driver open fds (after 1 min -> end)": [15, 80],
        "resets": 3,
        "longest stall s": 2.0,
        "median reset stall s": 1.0,
    }
    failed = {name for name, _, _, met in soak.verdict(result) if not met}
    assert failed == {"epochs with every sample exactly once", "driver fd growth"}
    assert "NO" in soak.format_verdict(result)
