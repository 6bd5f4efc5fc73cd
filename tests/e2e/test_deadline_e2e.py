"""End to end (#35): deadline mode switching a job's hosts on real Horovod workers, on the
local provider, with nothing rolled back.

One job: 2 hosts, a spot pool that can supply 1 (``--spot-capacity 1``), a deadline the
job cannot meet on its rate (``--total-epochs``, the script's 1,000 epochs, far beyond
it: the progress is the epoch and elastic sampler position the workers commit). The
policy finds the job behind uniform progress from its first refresh (mode ``catch-up``):
the spot group's shortfall falls back to on-demand. Once the rate is measured
(``--restart-cost`` after the first commit) the slack is gone: the safety net asks the
on-demand group first for the whole job, and the spot host is handed back at a commit.
Each decision is a ``deadline`` event with its reason. Chaos waits on events, never on
the clock.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.e2e.support import (
    assert_no_committed_step_lost,
    commits,
    job_output,
    read_events,
    running_job,
    wait_for_events,
)
from tests.e2e.test_e2e_capacity import SPOTRING, run_story, swap_costs

pytestmark = pytest.mark.e2e

JOB_TIMEOUT = 120


def on_demand_only(run_events: Path) -> bool:
    """The run's last ring is the two on-demand hosts, the spot host handed back."""
    story = run_story(run_events)
    rings = [e for e in story if e["event"] == "ring_formed"]
    returned = {e["id"] for e in story if e["event"] == "returned"}
    return bool(rings) and sorted(rings[-1]["hosts"]) == ["od-0", "od-1"] and "host-0" in returned


def test_behind_it_falls_back_then_the_safety_net_moves_the_job_to_on_demand(
    repo: Path, tmp_path: Path
) -> None:
    events, stop, run_events = tmp_path / "events.jsonl", tmp_path / "stop", tmp_path / "run.jsonl"
    argv = [
        *(SPOTRING, "--log-level", "info", "run", "--provider", "local"),
        *("-np", "2", "--min-np", "1", "--max-np", "2", "--spot-capacity", "1"),
        *("--deadline", "10m", "--total-epochs", "1000", "--restart-cost", "2"),
        *("--return-after", "1", "--probe-after", "5"),
        *("--refresh-interval", "0.5", "--boot-seconds", "1", "--events", str(run_events)),
        *("--", sys.executable, str(repo / "examples" / "train_digits.py")),
        *("--events", str(events), "--epochs", "1000", "--step-seconds", "0.05"),
        *("--stop-file", str(stop)),
    ]
    with running_job(argv, cwd=tmp_path, env=dict(os.environ)) as process:
        wait_for_events(process, events, lambda _: on_demand_only(run_events), "an on-demand ring")
        first = len(read_events(events))
        wait_for_events(
            process,
            events,
            lambda recorded: len([e for e in recorded[first:] if e["event"] == "commit"]) >= 3,
            "3 commits on the on-demand ring",
            timeout=JOB_TIMEOUT,
        )
        stop.touch()
        log = job_output(process, JOB_TIMEOUT)
    assert process.returncode == 0, log[-4000:]
    assert "Traceback" not in log, log[-8000:]
    recorded = read_events(events)
    assert_no_committed_step_lost(recorded)
    assert commits(size=2)(recorded)
    story = run_story(run_events)

    decided = [e for e in story if e["event"] == "deadline"]
    assert [e["mode"] for e in decided][:2] == ["catch-up", "safety-net"], decided
    assert "behind" in decided[0]["reason"] and decided[1]["slack_s"] < 4, decided
    assert 0 < decided[1]["done"] < 1000 and decided[1]["total"] == 1000  # from the sampler
    kinds = [e["event"] for e in story]
    # Behind: the spot group's shortfall went to on-demand after the policy said so.
    fell = [e for e in story if e["event"] == "fell_back"]
    assert fell and (fell[0]["from"], fell[0]["to"]) == ("local-spot", "local-on-demand")
    assert kinds.index("deadline") < kinds.index("fell_back")
    # The safety net: the spot host handed back once both on-demand hosts joined.
    returned = [e for e in story if e["event"] == "returned"]
    assert [(e["id"], e["group"]) for e in returned] == [("host-0", "local-spot")], returned
    assert story.index(decided[1]) < story.index(returned[0])
    # At a commit: nothing rolled back.
    swaps = swap_costs(recorded)
    assert swaps and [s["rolled_back"] for s in swaps] == [0] * len(swaps), swaps
    # The samplers' samples travel to the cost record (its cost per sample wants prices).
    cost = [e for e in story if e["event"] == "cost"][-1]
    assert cost["samples"] > 0 and cost["epochs"] > 0, cost
