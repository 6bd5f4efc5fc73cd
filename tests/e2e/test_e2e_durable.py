"""End to end: durable checkpoints with real Horovod workers on the local provider.

Each scenario runs with both state classes (spotring's ``TorchState``, and
``hvd.elastic.TorchState`` through the workers' hooks), one job taking several blows
in turn (chaos on training progress, never on the clock):

* Every host hard-killed at once mid-epoch (``preempt all``) -> a new ring resumes
  from the newest durable checkpoint, within the loss bound, and says what it lost;
  then the driver is SIGKILLed, the newest checkpoint is corrupted, and the same
  command is run again -> it resumes from the one before, with one warning, and
  finishes with every sample seen once per epoch.
* Checkpoints in S3 (moto's server): one host noticed, the other once the ring has
  stopped without it, no replacement before they go -> the ring writes the commit at
  which it stops before its hosts go, and the new ring loses nothing.
* Two drivers of one job: the first frozen past the lock's lease, the second started
  then takes the lock over and resumes the job; the first, thawed, stops in one line
  (exit 1) with its workers, and its ring wrote nothing after the takeover.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.e2e.support import (
    assert_every_sample_once,
    commits,
    job_output,
    read_events,
    running_job,
    wait_for_events,
)
from tests.fakes.storage_emulators import Backend, s3_backend  # noqa: F401 (a fixture)

pytestmark = pytest.mark.e2e

SPOTRING = str(Path(sys.executable).with_name("spotring"))
JOB_TIMEOUT = 300
STATE_CLASSES = pytest.mark.parametrize("state", ["spotring", "horovod"])
"""spotring's ``TorchState``, and ``hvd.elastic.TorchState`` through the workers' hooks."""


def _argv(repo: Path, tmp: Path, state: str, *extra: str) -> list[str]:
    return [
        *(SPOTRING, "run", "--provider", "local", "-np", "2", "--hosts", "2"),
        *("--refresh-interval", "0.5", "--boot-seconds", "1", "--control", str(tmp / "control")),
        *("--checkpoint", str(tmp / "ckpt"), "--checkpoint-every", "0.5", *extra),
        *("--", sys.executable, str(repo / "examples" / "train_digits.py")),
        *("--events", str(tmp / "events.jsonl"), "--epochs", "3", "--step-seconds", "0.03"),
        *("--state", state, "--audit-samples"),
    ]


def _checkpointed_step(directory: Path) -> tuple[int, str]:
    """The script's step in the newest complete checkpoint, and its name."""
    from spotring.checkpoint import Checkpoints, open_store
    from spotring.worker_image.durable import deserialize

    loaded = Checkpoints(open_store(str(directory)), job_id="any").load_latest()
    assert loaded is not None, "no checkpoint yet"
    info, payload = loaded
    return int(deserialize(payload)["attributes"]["step"]), info.name


def _wait_for_checkpoint(directory: Path, process: Any, after: str | None = None) -> None:
    from spotring.checkpoint import Checkpoints, open_store

    checkpoints = Checkpoints(open_store(str(directory)), job_id="any")
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        names = [info.name for info in checkpoints.list()]
        if names and names[0] != after:
            return
        assert process.poll() is None, "the job ended before writing a checkpoint"
        time.sleep(0.1)
    raise AssertionError("no new checkpoint was written")


def _last_commit_before(recorded: list[dict[str, Any]], moment: float) -> int:
    return max(e["step"] for e in recorded if e["event"] == "commit" and e["time"] < moment)


def _first_resume_after(recorded: list[dict[str, Any]], moment: float) -> dict[str, Any]:
    resumes = [e for e in recorded if e["event"] == "resume" and e["time"] > moment]
    assert resumes, "no ring resumed"
    return resumes[0]


def _wait_until_the_ring_stops(process: Any, events: Path, quiet: float = 2.0) -> None:
    """Until rank 0 has recorded no commit for ``quiet`` seconds (steps take 0.03 s)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        last = max((e["time"] for e in read_events(events) if e["event"] == "commit"), default=0)
        if time.time() - last > quiet:
            return
        assert process.poll() is None, "the job ended"
        time.sleep(0.1)
    raise AssertionError("the ring went on training")


@STATE_CLASSES
def test_whole_ring_loss_and_driver_restart_resume_from_durable_checkpoints(
    repo: Path, tmp_path: Path, state: str
) -> None:
    events, control, ckpt = tmp_path / "events.jsonl", tmp_path / "control", tmp_path / "ckpt"
    argv = _argv(repo, tmp_path, state)
    env = dict(os.environ)
    with running_job(argv, cwd=tmp_path, env=env) as process:
        wait_for_events(process, events, commits(size=2, steps=20), "20 commits")
        _wait_for_checkpoint(ckpt, process)
        durable_step, _ = _checkpointed_step(ckpt)
        preempted_at = time.time()
        control.write_text("preempt all\n")
        resumed = _first_resume_after(
            wait_for_events(
                process,
                events,
                lambda r: any(e["event"] == "resume" and e["time"] > preempted_at for e in r),
                "a resume after every host was preempted",
            ),
            preempted_at,
        )
        recorded = read_events(events)
        # The hosts die at the provider's next refresh after the line: the old ring's
        # rank 0 recorded commits up to then.
        last = _last_commit_before(recorded, resumed["time"])
        # Nothing older than the newest checkpoint at the loss; nothing beyond the
        # last commit.
        assert durable_step <= resumed["step"] <= last, (durable_step, resumed, last)

        # Train on, then kill the driver outright and damage its newest checkpoint.
        wait_for_events(
            process, events, commits(size=2, steps=10, min_step=resumed["step"] + 1), "10 more"
        )
        _, newest = _checkpointed_step(ckpt)
        _wait_for_checkpoint(ckpt, process, after=newest)
        workers = psutil.Process(process.pid).children(recursive=True)
        process.send_signal(signal.SIGKILL)
        first_output = job_output(process, 30)
        psutil.wait_procs(workers, timeout=30)  # they die with their driver
    assert "ring lost (all 2 workers were killed or lost)" in first_output, first_output[-4000:]
    # What the resume lost, as the workers reported their commits (one per step, and
    # one more at an epoch's end): none beyond the steps between the two.
    told = re.search(
        r"from the checkpoint of commit \d+, taken \S+ s ago; (\d+) commits", first_output
    )
    assert told is not None, first_output[-4000:]
    assert 0 <= int(told[1]) <= last - resumed["step"] + 1, (told[0], last, resumed)
    previous_step, newest = _checkpointed_step(ckpt)
    from spotring.checkpoint import Checkpoints, open_store

    newest_info, before_newest, *_ = Checkpoints(open_store(str(ckpt)), job_id="any").list()
    assert newest_info.name == newest
    data = ckpt / newest_info.data_key
    damaged = bytearray(data.read_bytes())
    damaged[len(damaged) // 2] ^= 0xFF
    data.write_bytes(bytes(damaged))
    restarted_at = time.time()

    with running_job(argv, cwd=tmp_path, env=env) as process:
        output = job_output(process, JOB_TIMEOUT)
    assert process.returncode == 0, output[-4000:]
    assert output.count(newest) == 1, output[-4000:]  # one warning names it
    recorded = read_events(events)
    resumed = _first_resume_after(recorded, restarted_at)
    assert resumed["step"] < previous_step  # the damaged newest one was skipped
    assert f"resumed from the checkpoint of commit {before_newest.meta['commits']}" in output
    assert recorded[-1]["event"] == "done" and recorded[-1]["epochs"] == 3
    assert_every_sample_once(recorded)
    assert "rings lost and resumed from durable checkpoints" not in output


@STATE_CLASSES
def test_a_noticed_total_reclaim_loses_no_commit(
    repo: Path,
    tmp_path: Path,
    s3_backend: Backend,  # noqa: F811 (the fixture)
    state: str,
) -> None:
    """Through S3 (moto's server, the real boto3 in the driver and the workers).

    The second host's notice comes after the ring stopped for the first (--min-np 2):
    the commit at which it stopped is the last one, and only the first notice could
    have it written."""
    events, control = tmp_path / "events.jsonl", tmp_path / "control"
    # Replacements boot for longer than the notice lasts: the ring has no host left to
    # re-form around, and starts again from what it wrote when the notices came.
    argv = _argv(
        repo, tmp_path, state,
        *("--notice-lead", "8", "--boot-seconds", "15", "--checkpoint-every", "3600"),
        *("--checkpoint", s3_backend.uri("notice"), "--events", str(tmp_path / "run.jsonl")),
        *(arg for name in s3_backend.env for arg in ("-x", name)),
    )  # fmt: skip
    with running_job(argv, cwd=tmp_path, env={**os.environ, **s3_backend.env}) as process:
        wait_for_events(process, events, commits(size=2, steps=20), "20 commits")
        noticed_at = time.time()
        control.write_text("notice host-0\n")
        _wait_until_the_ring_stops(process, events)
        with control.open("a") as lines:
            lines.write("notice host-1\n")
        output = job_output(process, JOB_TIMEOUT)
    assert process.returncode == 0, output[-4000:]
    recorded = read_events(events)
    resumed = _first_resume_after(recorded, noticed_at)
    last = max(
        e["step"] for e in recorded if e["event"] == "commit" and e["time"] < resumed["time"]
    )
    assert resumed["step"] == last, (resumed, last)  # 0 commits lost
    assert "nobody stays to carry the ring on: writing commit" in output
    # The driver still sees the ring's commits (the durable hooks and the progress
    # counter both wrap Horovod's state).
    run = read_events(tmp_path / "run.jsonl")
    assert any(e["event"] == "stall" for e in run), [e["event"] for e in run]
    assert [e["lost"]["commits"] for e in run if e["event"] == "ring_lost"] == [0], run
    # The old ring's round may still wait for hosts when they die (it then forms on
    # the replacements), or have ended with their deaths: either way, one resume.
    lost = re.findall(r"ring lost \((.*)\); a new ring resumes from the checkpoint", output)
    assert lost in (["every host of the ring left"], ["all 2 workers were killed or lost"]), output[
        -6000:
    ]
    assert_every_sample_once(recorded)
    assert recorded[-1]["event"] == "done"


BROKEN_SCRIPT = """
import horovod.torch as hvd
import torch
from spotring.torch import TorchState

hvd.init()
model = torch.nn.Linear(2, 1)
optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1))
state = TorchState(model, optimizer, step=0)


@hvd.elastic.run
def train(state):
    while True:
        optimizer.zero_grad()
        model(torch.ones(4, 2)).sum().backward()
        optimizer.step()
        state.step += 1
        state.commit()
        if state.step == 30:
            raise RuntimeError("a bug in the training script")


train(state)
"""


def test_a_broken_script_stops_the_job_and_keeps_its_checkpoints(tmp_path: Path) -> None:
    """Every worker exiting by itself with an error is no reclaim: no resume."""
    script = tmp_path / "broken.py"
    script.write_text(BROKEN_SCRIPT)
    argv = [
        *(SPOTRING, "run", "--provider", "local", "-np", "2", "--refresh-interval", "0.5"),
        *("--checkpoint", str(tmp_path / "ckpt"), "--checkpoint-every", "0.01"),
        *("--", sys.executable, str(script)),
    ]
    with running_job(argv, cwd=tmp_path, env=dict(os.environ)) as process:
        output = job_output(process, JOB_TIMEOUT)
    assert process.returncode == 1, output[-4000:]
    assert "ring lost" not in output, output[-4000:]
    assert "a bug in the training script" in output
    assert re.search(r"checkpoints kept in .*: run the same command again to resume", output)


def test_a_frozen_driver_whose_lock_another_took_stops_and_the_other_finishes(
    repo: Path, tmp_path: Path
) -> None:
    from spotring.autoscaler.durable_job import LEASE_SECONDS
    from spotring.checkpoint import LOCK_KEY, Checkpoints, open_store

    events, ckpt = tmp_path / "events.jsonl", tmp_path / "ckpt"
    store = open_store(str(ckpt))

    def lock() -> dict[str, Any]:
        document: dict[str, Any] = json.loads(store.get(LOCK_KEY))
        return document

    # The ring trains on until the stop file (many epochs): the first driver must find its
    # lock taken while its ring still trains, not a ring that finished while it was frozen.
    stop_file = tmp_path / "stop"
    first_argv = _argv(repo, tmp_path, "spotring")
    first_argv[first_argv.index("--epochs") + 1] = "1000"
    first_argv += ["--stop-file", str(stop_file)]
    control = first_argv.index("--control") + 1
    second_argv = [*first_argv[:control], str(tmp_path / "second"), *first_argv[control + 1 :]]
    env = dict(os.environ)
    with running_job(first_argv, cwd=tmp_path, env=env) as first:
        wait_for_events(first, events, commits(size=2, steps=10), "10 commits")
        _wait_for_checkpoint(ckpt, first)
        workers = psutil.Process(first.pid).children(recursive=True)
        first.send_signal(signal.SIGSTOP)  # a frozen VM, a long pause: its ring trains on
        try:
            frozen = lock()
            # A lease of the store's clock without a heartbeat, without waiting it out:
            # the frozen driver writes nothing, so its lock file is dated back a lease.
            stale = time.time() - LEASE_SECONDS - 5
            os.utime(ckpt / LOCK_KEY, (stale, stale))
            assert store.get_versioned(LOCK_KEY, max_size=2**16).age_s > LEASE_SECONDS
            with running_job(second_argv, cwd=tmp_path, env=env) as second:
                deadline = time.monotonic() + 120
                while lock()["owner"] == frozen["owner"]:
                    assert second.poll() is None, job_output(second, 1)[-4000:]
                    assert time.monotonic() < deadline, "the second driver took no lock"
                    time.sleep(0.2)
                taken = lock()
                first.send_signal(signal.SIGCONT)
                first_output = job_output(first, 120)
                stop_file.touch()
                second_output = job_output(second, JOB_TIMEOUT)
        finally:
            first.send_signal(signal.SIGCONT)
    assert first.returncode == 1, first_output[-4000:]
    (failed,) = [line for line in first_output.splitlines() if "job failed" in line]
    assert f"--checkpoint {ckpt}: lost {ckpt}/{LOCK_KEY}: it is held by" in failed, failed
    assert "run the same command again" not in first_output
    assert first_output.count("nor any after it") <= 1, first_output[-4000:]
    _, alive = psutil.wait_procs(workers, timeout=30)
    assert not alive, alive  # nothing of the first job left running
    assert second.returncode == 0, second_output[-4000:]
    assert re.search(
        r"took .*lock\.json of job .* over from .* \(last written \d+ s ago\)", second_output
    )
    assert taken["generation"] == frozen["generation"] + 1
    assert read_events(events)[-1]["event"] == "done"
    # The frozen driver's ring wrote nothing once the lock was the second's.
    late = [
        info.name
        for info in Checkpoints(store, job_id="any").list()
        if info.lock_generation == frozen["generation"] and info.created_at > taken["acquired_at"]
    ]
    assert late == [], late
