"""End to end: `spotring run --backend torch` runs an unchanged torchrun script.

examples/torch_ddp_checkpoint.py (its own checkpoint every K steps and, with
``--save-on-sigterm``, one of the step where SIGTERM stopped it) on two local hosts,
through one job: a hard preemption of one host, its replacement's join, an interruption
notice, the loss of every host at once, then its stop file. Each chaos waits for
training progress.

- The hard preemption restarts every worker at the size the hosts left allow, from the
  last periodic checkpoint; the replacement's join restarts them at full size.
- The notice restarts every worker while the noticed host still runs: spotring's
  SIGTERM reaches the script, rank 0 saves the step every rank completed, and the next
  attempt starts just past it (nothing rolled back).
- The whole-ring loss: the replacements boot and the workers start again from the
  newest checkpoint (fewer than K steps lost).
The kill counts as a restart, the joins and the notice do not. The workers of each
restart were started ahead (interpreter up, torch imported); each join waited for its
new host's.
"""

from __future__ import annotations

import itertools
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.support import job_output, read_events, running_job

pytestmark = pytest.mark.e2e

SPOTRING = str(Path(sys.executable).with_name("spotring"))
JOB_TIMEOUT = 300  # a loaded machine: each replacement boots and imports torch ahead
STEPS, EVERY, PREEMPT_AFTER, AFTER_STEPS = 100_000, 10, 25, 5


def progress(checkpoint: Path, rank: int) -> list[tuple[int, int]]:
    """(TORCHELASTIC_RESTART_COUNT, step) of each step rank ``rank`` made, in order."""
    path = checkpoint / f"steps.{rank}"
    if not path.exists():
        return []
    lines = [line.split() for line in path.read_text().splitlines()]
    return [(int(restart), int(step)) for restart, step, _ in (x for x in lines if len(x) == 3)]


def rings(events: Path) -> list[dict[str, Any]]:
    """The ``ring_formed`` events so far: one per attempt."""
    return [e for e in read_events(events) if e["event"] == "ring_formed"]


def wait_for(process: subprocess.Popen[str], what: str, done: Callable[[], bool]) -> None:
    """Poll ``done`` (training progress, never a clock) while the job runs; fail with
    the job's output (and, if it still runs, every process's stacks) if it never is."""
    deadline = time.monotonic() + JOB_TIMEOUT
    while not done():
        if process.poll() is not None:
            raise AssertionError(f"the job ended before {what}:\n{job_output(process, 1)[-4000:]}")
        if time.monotonic() > deadline:
            try:
                job_output(process, 0)  # raises
            except AssertionError as hung:
                raise AssertionError(f"no {what} in {JOB_TIMEOUT} s: {hung}") from None
        time.sleep(0.1)


def test_kill_join_notice_and_whole_ring_loss_restart_every_worker_from_its_checkpoint(
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
        *("--stop-file", str(tmp_path / "stop"), "--save-on-sigterm"),
    ]
    with running_job(argv, cwd=tmp_path, env=dict(os.environ)) as process:

        def full_ring_since(formed: int) -> bool:
            """Whether an attempt at full size started after the first ``formed``."""
            now = rings(events)
            return len(now) > formed and now[-1]["size"] == 2

        def rank_1_trained_since(stepped: int) -> bool:
            return len(progress(checkpoint, 1)) >= stepped + AFTER_STEPS

        def chaos(command: str) -> None:
            """Run ``command`` through the control file, then wait until the workers
            train again at full size (rank 1, there only then, made steps)."""
            formed = len(rings(events))
            with control.open("a") as stream:
                stream.write(command + "\n")
            wait_for(process, f"a full ring after {command!r}", lambda: full_ring_since(formed))
            stepped = len(progress(checkpoint, 1))
            wait_for(process, f"training after {command!r}", lambda: rank_1_trained_since(stepped))

        wait_for(process, "progress", lambda: len(progress(checkpoint, 1)) >= PREEMPT_AFTER)
        chaos("preempt host-1")  # a hard preemption, then its replacement's join
        counted = progress(checkpoint, 0)[-1][0]
        chaos("notice host-0")  # the ring leaves host-0 while it runs; its replacement joins
        assert progress(checkpoint, 0)[-1][0] == counted  # a notice is no failure
        lost_ring = set(rings(events)[-1]["hosts"])
        chaos("preempt all")  # the whole ring at once
        (tmp_path / "stop").touch()
        log = job_output(process, JOB_TIMEOUT)
    assert process.returncode == 0, log[-4000:]
    assert "chaos: preempted host-1" in log
    assert all(f"chaos: preempted {host}" in log for host in lost_ring), log[-4000:]
    formed = rings(events)
    assert 1 in [e["size"] for e in formed]  # the kill left one host for a while
    assert not lost_ring & set(formed[-1]["hosts"]), (lost_ring, formed[-1])  # replacements
    steps = progress(checkpoint, 0)
    assert steps[-1] == progress(checkpoint, 1)[-1]  # both stopped at the same step
    # The kill counts as a restart (torchrun's rule: failures only), the joins and the
    # notice do not; the whole-ring loss does when a worker's exit, not the inventory,
    # tells of it first.
    assert {0, 1} <= {restart for restart, _ in steps} <= {0, 1, 2}, sorted(set(steps))
    # Rank 0's steps never skip one, and go back fewer than --every (a host lost
    # without notice: the steps since the newest checkpoint, periodic or on SIGTERM).
    for (_, before), (_, now) in itertools.pairwise(steps):
        assert before - EVERY < now - 1 <= before, (before, now)
    resumes = re.findall(r"resumed from step \d+ \(saved (.*)\)", log)
    assert resumes[0] == f"every {EVERY} steps", resumes  # the kill: no SIGTERM to save on
    assert_notice_restarted_from_its_sigterm_save(log)
    # Every attempt's workers were started ahead; each join's waited for their slots.
    handed = [line for line in log.splitlines() if "the worker started ahead on" in line]
    assert len(handed) == sum(e["size"] for e in formed), handed
    assert_joins_waited_for_their_workers(log)


def assert_notice_restarted_from_its_sigterm_save(log: str) -> None:
    """After the notice, before its host was taken: rank 0 saved its step on SIGTERM,
    the driver restarted because the noticed host left, and rank 0 of the next attempt
    resumed from that step."""
    marks = re.compile(
        r"interruption notice to host-0|preempted host-0|saved step \d+ on SIGTERM"
        r"|restarting every worker: .*|resumed from step \d+ \(saved .*\)"
    )
    seen = [m.group(0) for m in marks.finditer(log)]
    after = seen[seen.index("interruption notice to host-0") + 1 :][:3]
    saved = re.fullmatch(r"saved step (\d+) on SIGTERM", after[0]) if after else None
    assert saved, after
    assert after[1:] == [
        "restarting every worker: host-0 left",
        f"resumed from step {saved.group(1)} (saved on SIGTERM)",
    ], after


def assert_joins_waited_for_their_workers(log: str) -> None:
    """The workers of an attempt that a join started had reached their wait."""
    joined = False
    for line in log.splitlines():
        if "restarting every worker:" in line:
            joined = line.endswith(" joined")
        elif joined and "the worker started ahead on" in line:
            assert "before it reached" not in line, line
