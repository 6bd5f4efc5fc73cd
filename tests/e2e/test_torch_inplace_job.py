"""End to end: `spotring run --backend torch --in-place` keeps the surviving workers running.

One job of examples/torch_inplace.py (DDP, a commit every step) on the local provider,
two hosts, and in turn, each once the job has made progress (its commits, never the
clock): a host preempted without notice (its worker SIGKILLed), a host's interruption
notice, a worker that hangs (SIGSTOP, found by --hang-timeout), and every host
preempted at once. After each of the first three, the survivors go on in their process
from their last commit, the replacement joins warm and is synced bit for bit; after the
last, the new workers resume from the durable checkpoint (--checkpoint). The job ends
with the same state everywhere.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.support import job_output, running_job

pytestmark = pytest.mark.e2e

SPOTRING = str(Path(sys.executable).with_name("spotring"))
STEPS = 1200
JOB_TIMEOUT = 240


def records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def wait_for(process: Any, path: Path, done: Any, what: str) -> list[dict[str, Any]]:
    deadline = time.monotonic() + JOB_TIMEOUT
    while time.monotonic() < deadline:
        recorded = records(path)
        if done(recorded):
            return recorded
        assert process.poll() is None, f"the job ended before {what}"
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def generations(recorded: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    starts: dict[int, list[dict[str, Any]]] = {}
    for record in recorded:
        if record["event"] == "start":
            starts.setdefault(record["generation"], []).append(record)
    return starts


def full_after(generation: int, commits: int) -> Any:
    """Done once a generation after ``generation`` with 2 members committed ``commits``."""

    def done(recorded: list[dict[str, Any]]) -> bool:
        full = [g for g, s in generations(recorded).items() if g > generation and len(s) == 2]
        return (
            bool(full)
            and sum(1 for r in recorded if r["event"] == "commit" and r["generation"] == full[0])
            >= commits
        )

    return done


def test_kill_notice_and_hang_cost_only_uncommitted_steps(repo: Path, tmp_path: Path) -> None:
    work, events, control = tmp_path / "work.jsonl", tmp_path / "events.jsonl", tmp_path / "control"
    argv = [
        *(SPOTRING, "--log-level", "info", "run", "--provider", "local", "--backend", "torch"),
        *("--in-place", "-np", "2", "--min-np", "1", "--max-np", "2", "--hosts", "2"),
        *("--hang-timeout", "6", "--refresh-interval", "0.5", "--boot-seconds", "1"),
        *("--events", str(events), "--control", str(control)),
        *("--checkpoint", str(tmp_path / "checkpoints"), "--checkpoint-every", "0.5"),
        *("--", sys.executable, str(repo / "examples" / "torch_inplace.py"), "--ddp"),
        *("--steps", str(STEPS), "--step-seconds", "0.02", "--events", str(work)),
    ]
    with running_job(argv, cwd=tmp_path, env=dict(os.environ)) as process:
        wait_for(process, work, full_after(-1, 30), "the first generation's commits")
        control.write_text("preempt host-1\n")
        recorded = wait_for(process, work, full_after(0, 30), "the replacement joining")
        with control.open("a") as stream:
            stream.write("notice host-0\n")  # with host-2, the replacement, in the group
        last = max(generations(recorded))
        recorded = wait_for(process, work, full_after(last, 30), "a join after the notice")
        last = max(generations(recorded))
        stopped = generations(recorded)[last][-1]["pid"]
        os.kill(stopped, signal.SIGSTOP)
        recorded = wait_for(process, work, full_after(last + 1, 30), "a join after the hang")
        last = max(generations(recorded))
        with control.open("a") as stream:
            stream.write("preempt all\n")
        log = job_output(process, JOB_TIMEOUT)
    assert process.returncode == 0, log[-4000:]
    recorded = records(work)
    starts = generations(recorded)
    commits = [r for r in recorded if r["event"] == "commit"]
    for generation, members in sorted(starts.items()):
        # Every member of a generation starts from the same state...
        assert len({m["digest"] for m in members}) == 1, members
        assert len({m["step"] for m in members}) == 1, members
        # ...and from every step committed before it: no committed step is lost, but
        # for the whole ring's loss, which costs the steps since the durable copy.
        before = [c["step"] for c in commits if c["time"] < min(m["time"] for m in members)]
        if generation <= last:
            assert members[0]["step"] >= max(before, default=0), (generation, members)
    resumed = starts[last + 1]
    assert {m["pid"] for m in resumed}.isdisjoint(m["pid"] for m in starts[last])
    assert 0 < resumed[0]["step"] <= max(c["step"] for c in commits if c["generation"] == last)
    assert "resumed from the checkpoint of commit" in log
    done = [r for r in recorded if r["event"] == "done"]
    assert len(done) == 2 and {d["step"] for d in done} == {STEPS}
    assert len({d["digest"] for d in done}) == 1
    stalls = sorted(e["seconds"] for e in records(events) if e["event"] == "stall")
    # Nobody waited out Gloo's 60 s: each change cost seconds at most, the hang its
    # --hang-timeout (6 s) and the seconds to find and stop it.
    assert stalls and stalls[-3] < 5 and stalls[-1] < 30, stalls  # but the hang, the loss
    sizes = [e["size"] for e in records(events) if e["event"] == "ring_formed"]
    assert sizes[0] == 2 and sizes[-1] == 2 and sizes.count(1) >= 3, sizes
    assert "chaos: preempted host-1" in log
    assert "left the ring at a commit, 0 steps rolled back" in log  # the notice
    assert "hung: the ring made no progress" in log
