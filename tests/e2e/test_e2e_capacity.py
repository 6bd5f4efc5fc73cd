"""End to end (#25): a spot pool that runs dry and comes back, on the local provider with
real Horovod workers.

One job for the whole story (CI time is tight): a 4-host job whose spot group can
supply 2 (``--spot-capacity 2``) falls back to 2 on-demand hosts and trains at 4; after
some training (chaos waits on committed steps, never on the clock) the control line
``spot-capacity 4`` gives the capacity back, and both on-demand hosts are swapped for
spot ones at a commit: nothing rolled back, and each swap stalls the ring under 1 s.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.support import (
    assert_no_committed_step_lost,
    commits,
    job_output,
    read_events,
    running_job,
    wait_for_events,
)

pytestmark = pytest.mark.e2e

SPOTRING = str(Path(sys.executable).with_name("spotring"))
JOB_TIMEOUT = 300
FALLBACK_AFTER = 20.0
"""--fallback-after: the cloud's own signal (the failed spot launches) must make the job
fall back well before a silent group would count as short."""
STALL_LIMIT_S = 1.0


def test_falls_back_to_on_demand_and_returns_to_spot_at_a_commit(
    repo: Path, tmp_path: Path
) -> None:
    events, control, stop = tmp_path / "events.jsonl", tmp_path / "control", tmp_path / "stop"
    run_events = tmp_path / "run.jsonl"
    argv = [
        *(SPOTRING, "--log-level", "info", "run", "--provider", "local"),
        *("-np", "4", "--min-np", "2", "--max-np", "4", "--spot-capacity", "2"),
        *("--fallback-after", str(FALLBACK_AFTER), "--return-after", "1", "--probe-after", "5"),
        *("--refresh-interval", "0.5", "--boot-seconds", "1", "--control", str(control)),
        *("--price", "spot=0.3", "--price", "local-on-demand=1.0"),
        *("--events", str(run_events), "--"),
        *(sys.executable, str(repo / "examples" / "train_digits.py"), "--events", str(events)),
        *("--epochs", "1000", "--step-seconds", "0.05", "--stop-file", str(stop)),
    ]
    with running_job(argv, cwd=tmp_path, env=dict(os.environ)) as process:
        wait_for_events(process, events, commits(size=4, steps=20), "20 commits at size 4")
        given_back = len(read_events(events))
        rings_before = len(rings_formed(run_events))
        control.write_text("spot-capacity 4\n")
        wait_for_events(
            process, events, lambda _: all_spot_again(run_events), "a ring of 4 spot hosts"
        )
        first = len(read_events(events))
        wait_for_events(
            process,
            events,
            lambda recorded: len([e for e in recorded[first:] if e["event"] == "commit"]) >= 10,
            "10 commits after the return to spot",
        )
        stop.touch()
        log = job_output(process, JOB_TIMEOUT)
    assert process.returncode == 0, log[-4000:]
    assert "Traceback" not in log, log[-8000:]
    recorded = read_events(events)
    assert_no_committed_step_lost(recorded)
    story = run_story(run_events)

    # The spot group's failed launches are the signal; the job falls back at once.
    started = next(e["t"] for e in story if e["event"] == "job_started")
    short = [e for e in story if e["event"] == "capacity_shortage"]
    assert short and short[0]["group"] == "local-spot" and short[0]["cause"] == "capacity"
    fell = [e for e in story if e["event"] == "fell_back"]
    assert fell and (fell[0]["from"], fell[0]["to"]) == ("local-spot", "local-on-demand")
    assert fell[0]["t"] - started <= FALLBACK_AFTER, "fell back only once the group was silent"
    rings = [e for e in story if e["event"] == "ring_formed"]
    full = next(e for e in rings if e["size"] == 4)
    assert sorted(full["hosts"]) == ["host-0", "host-1", "od-0", "od-1"], rings
    # Each host's lifecycle is in the events file.
    lifecycles = {e["id"]: e.get("lifecycle") for e in story if e["event"] == "instance_state"}
    assert {lifecycles[h] for h in ("host-0", "host-1", "host-2", "host-3")} == {"spot"}
    assert {lifecycles["od-0"], lifecycles["od-1"]} == {"on-demand"}

    # Back to spot: both on-demand hosts handed back, one at a time, at a commit.
    returned = [e for e in story if e["event"] == "returned"]
    assert sorted(e["id"] for e in returned) == ["od-0", "od-1"], returned
    assert all(e["group"] == "local-on-demand" for e in returned)
    assert sorted(rings[-1]["hosts"]) == ["host-0", "host-1", "host-2", "host-3"]
    # A swap: the spot host joins as the on-demand host leaves; the ring never trains small.
    during = [(e["size"], e["hosts"]) for e in rings_formed(run_events)[rings_before:]]
    assert all(size == 4 for size, _ in during), during
    swaps = swap_costs(recorded[given_back:])
    assert swaps, "the ring never re-formed after the capacity came back"
    assert [s["rolled_back"] for s in swaps] == [0] * len(swaps), swaps
    assert max(s["stall_s"] for s in swaps) < STALL_LIMIT_S, swaps
    assert recorded[-1]["event"] == "done" and recorded[-1]["size"] == 4

    # The cost (#35): each group priced by --price (by lifecycle, by name), the hours of
    # both counted, what all on-demand would have cost above it, steps from the rings.
    prices = {e["group"]: (e["usd"], e["source"]) for e in story if e["event"] == "price"}
    assert prices == {"local-spot": (0.3, "--price"), "local-on-demand": (1.0, "--price")}
    cost = story[-1]["cost"]
    assert story[-1]["event"] == "job_finished" and cost["unpriced_hours"] == 0, cost
    assert {g["lifecycle"] for g in cost["by_group"]} == {"spot", "on-demand"}, cost
    assert 0 < cost["usd"] < cost["all_on_demand_usd"] and 0 < cost["spot_share"] < 1, cost
    assert cost["steps"] >= 30 and cost["usd_per_step"] > 0, cost


def run_story(run_events: Path) -> list[dict[str, Any]]:
    """The run's events file (``spotring run --events``) so far."""
    story = []
    if run_events.exists():
        for line in run_events.read_text().splitlines():
            try:
                story.append(json.loads(line))
            except ValueError:  # a line still being written
                break
    return story


def rings_formed(run_events: Path) -> list[dict[str, Any]]:
    return [e for e in run_story(run_events) if e["event"] == "ring_formed"]


def all_spot_again(run_events: Path) -> bool:
    """The run's last ring is 4 spot hosts and both on-demand hosts were handed back."""
    story = run_story(run_events)
    rings = [e for e in story if e["event"] == "ring_formed"]
    returned = {e["id"] for e in story if e["event"] == "returned"}
    return (
        bool(rings)
        and len(rings[-1]["hosts"]) == 4
        and all(h.startswith("host-") for h in rings[-1]["hosts"])
        and returned >= {"od-0", "od-1"}
    )


def swap_costs(recorded: list[dict[str, Any]]) -> list[dict[str, float]]:
    """For each restart of rank 0 in ``recorded``: the steps rolled back (its last
    commit before, minus the step it resumed from) and the stall (the time from that
    last commit to the first commit after)."""
    swaps = []
    for index, event in enumerate(recorded):
        if event["event"] != "resume":
            continue
        before = [e for e in recorded[:index] if e["event"] == "commit"]
        after = next((e for e in recorded[index:] if e["event"] == "commit"), None)
        if not before or after is None:
            continue
        swaps.append(
            {
                "rolled_back": before[-1]["step"] - event["step"],
                "stall_s": round(after["time"] - before[-1]["time"], 3),
            }
        )
    return swaps
