"""End to end: `spotring run --backend torch` runs an unchanged torchrun script.

examples/torch_ddp_checkpoint.py (its own checkpoint every K steps) on two local hosts;
one host is preempted without notice once training has made progress: every worker is
restarted, first at the size the hosts left allow, then at full size when the
replacement joins, each time from the script's own checkpoint, and the job ends with 0
(its stop file, once the grown ring has trained). The workers of each restart were
started ahead (interpreter up, torch imported); the join waited for its new host's.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.support import job_output, running_job

pytestmark = pytest.mark.e2e

SPOTRING = str(Path(sys.executable).with_name("spotring"))
JOB_TIMEOUT = 300  # a loaded machine: the replacement boots and imports torch ahead
STEPS, EVERY, PREEMPT_AFTER, AFTER_JOIN = 100_000, 10, 25, 5


def progress(checkpoint: Path, rank: int) -> list[tuple[int, int]]:
    """(TORCHELASTIC_RESTART_COUNT, step) of each step rank ``rank`` made, in order."""
    path = checkpoint / f"steps.{rank}"
    if not path.exists():
        return []
    lines = [line.split() for line in path.read_text().splitlines()]
    return [(int(restart), int(step)) for restart, step, _ in (x for x in lines if len(x) == 3)]


def test_a_preempted_host_restarts_every_worker_from_the_scripts_checkpoint(
    repo: Path, tmp_path: Path
) -> None:
    checkpoint, events, control = tmp_path / "ckpt", tmp_path / "events.jsonl", tmp_path / "control"
    checkpoint.mkdir()
    argv = [
        *(SPOTRING, "--log-level", "info", "run", "--provider", "local", "--backend", "torch"),
        *("-np", "2", "--min-np", "1", "--max-np", "2", "--hosts", "2", "--events", str(events)),
        *("--refresh-interval", "0.5", "--boot-seconds", "2", "--control", str(control)),
        *("--", sys.executable, str(repo / "examples" / "torch_ddp_checkpoint.py")),
        *("--checkpoint", str(checkpoint), "--steps", str(STEPS), "--every", str(EVERY)),
        *("--stop-file", str(tmp_path / "stop")),
    ]
    with running_job(argv, cwd=tmp_path, env=dict(os.environ)) as process:
        deadline = time.monotonic() + JOB_TIMEOUT
        while len(progress(checkpoint, 1)) < PREEMPT_AFTER:  # chaos on progress, not a clock
            assert process.poll() is None and time.monotonic() < deadline, "no progress"
            time.sleep(0.1)
        control.write_text("preempt host-1\n")
        # Rank 1 trains again (restart count 1) only once the replacement has joined.
        while sum(restart == 1 for restart, _ in progress(checkpoint, 1)) < AFTER_JOIN:
            assert process.poll() is None and time.monotonic() < deadline, "no join"
            time.sleep(0.1)
        (tmp_path / "stop").touch()
        log = job_output(process, JOB_TIMEOUT)
    assert process.returncode == 0, log[-4000:]
    assert "chaos: preempted host-1" in log
    recorded = [json.loads(line) for line in events.read_text().splitlines()]
    sizes = [e["size"] for e in recorded if e["event"] == "ring_formed"]
    # Shrank to the host left, then grew again when the replacement joined.
    assert sizes[0] == 2 and sizes[-1] == 2 and 1 in sizes, sizes
    steps = progress(checkpoint, 0)
    assert steps[-1] == progress(checkpoint, 1)[-1]  # both stopped at the same step
    # Only the failure counts as a restart; the join does not (as under torchrun).
    assert {restart for restart, _ in steps} == {0, 1}, sorted(set(steps))
    # Each later attempt started just past one of the script's checkpoints.
    starts = [now for before, now in itertools.pairwise(steps) if now != (before[0], before[1] + 1)]
    assert starts and all(step % EVERY == 1 for _, step in starts), starts
    # Every attempt's workers were started ahead; the join's waited for their slots.
    handed = [line for line in log.splitlines() if "the worker started ahead on" in line]
    assert len(handed) == 2 + 1 + 2, handed
    assert all("before it reached" not in line for line in handed[-2:]), handed
