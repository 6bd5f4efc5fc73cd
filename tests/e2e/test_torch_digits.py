"""End to end: the digits example on `spotring run --backend torch --in-place`.

examples/train_digits_torch.py on the local provider, two hosts; once the job has
committed (its progress, never the clock) one host is preempted without notice. The
survivor goes on in its process from its last commit, the replacement joins, and the
elastic sampler hands each group what is left of the epoch: every training sample is
processed exactly once per epoch, and the driver's progress records carry the job's
epochs (read from the in-place state's sampler on the workers' progress lines).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.e2e.support import (
    assert_every_sample_once,
    assert_no_committed_step_lost,
    commits,
    job_output,
    read_events,
    running_job,
    wait_for_events,
)

pytestmark = pytest.mark.e2e

SPOTRING = str(Path(sys.executable).with_name("spotring"))
EPOCHS = 2
JOB_TIMEOUT = 120


def test_digits_in_place_process_every_sample_once_through_a_preemption(
    repo: Path, tmp_path: Path
) -> None:
    work, events, control = tmp_path / "work.jsonl", tmp_path / "events.jsonl", tmp_path / "control"
    argv = [
        *(SPOTRING, "run", "--provider", "local", "--backend", "torch", "--in-place"),
        *("-np", "2", "--min-np", "1", "--max-np", "2", "--hosts", "2"),
        *("--refresh-interval", "0.5", "--boot-seconds", "1"),
        *("--events", str(events), "--control", str(control)),
        *("--", sys.executable, str(repo / "examples" / "train_digits_torch.py")),
        *("--epochs", str(EPOCHS), "--audit-samples"),  # a commit every step
        *("--step-seconds", "0.02", "--events", str(work)),
    ]
    with running_job(argv, cwd=tmp_path, env=dict(os.environ)) as process:
        wait_for_events(process, work, commits(size=2, steps=20), "commits of both workers")
        control.write_text("preempt host-1\n")
        log = job_output(process, JOB_TIMEOUT)
    assert process.returncode == 0, log[-4000:]
    assert "chaos: preempted host-1" in log
    recorded = read_events(work)
    resumes = [e for e in recorded if e["event"] == "resume"]
    assert len(resumes) >= 2 and resumes[0]["size"] == 2, resumes  # the preemption re-formed
    assert_no_committed_step_lost(recorded)
    assert_every_sample_once(recorded)
    assert len({e["epoch"] for e in recorded if e["event"] == "epoch_audit"}) == EPOCHS
    progress = [e for e in read_events(events) if e["event"] == "progress"]
    assert any(e["epochs"] is not None for e in progress), progress
