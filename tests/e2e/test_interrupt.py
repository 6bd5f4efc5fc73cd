"""End to end: what a running job shows to ``ps``, and stopping it from outside."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.e2e.support import commits, job_output, running_job, wait_for_events, worker_pids

pytestmark = pytest.mark.e2e

SPOTRING = str(Path(sys.executable).with_name("spotring"))


def assert_interrupted(process: subprocess.Popen[str], output: str, took: float) -> None:
    """Stopped by a signal within 10 s: exit 130, one last line, no traceback."""
    assert took < 10, f"took {took:.1f}s to stop"
    assert process.returncode == 130, output[-2000:]
    assert output.rstrip().endswith("spotring: interrupted")
    assert "Traceback" not in output


def two_workers_training(repo: Path, events: Path, *options: str) -> list[str]:
    """``spotring run`` of 2 local workers training long enough to be stopped."""
    return [
        *(SPOTRING, "run", "--provider", "local", "-np", "2", *options, "--"),
        *(sys.executable, str(repo / "examples" / "train_digits.py")),
        *("--events", str(events), "--epochs", "100", "--step-seconds", "0.1"),
    ]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_to_the_driver_stops_every_worker(
    repo: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    events = tmp_path / "events.jsonl"
    argv = two_workers_training(repo, events, "-x", "FORWARD_ME")
    secrets = {"MY_SECRET_TOKEN": "tok-3f9a1c", "AWS_SECRET_ACCESS_KEY": "aws-77d2e0"}
    env = {**os.environ, **secrets, "FORWARD_ME": "forwarded-5b1e"}
    with running_job(argv, cwd=tmp_path, env=env) as process:
        wait_for_events(process, events, commits(), "a first commit")
        found = worker_pids(process.pid)
        workers = [psutil.Process(pid) for pid, _ in found]
        assert len(workers) == 2
        # Nothing forwarded or secret on any command line; workers get only what is named.
        command_lines = " ".join(" ".join(p.info["cmdline"] or ()) for p in
                                 psutil.process_iter(["cmdline"]))  # fmt: skip
        for value in [*secrets.values(), "forwarded-5b1e"]:
            assert value not in command_lines
        for _, worker_env in found:
            assert worker_env["FORWARD_ME"] == "forwarded-5b1e"
            assert not set(secrets) & set(worker_env)
        process.send_signal(sig)
        began = time.monotonic()
        output = job_output(process, 30)
        took = time.monotonic() - began
    assert_interrupted(process, output, took)
    psutil.wait_procs(workers, timeout=5)
    assert not [w for w in workers if w.is_running() and w.status() != psutil.STATUS_ZOMBIE]


def test_a_second_interrupt_forces_the_stop(repo: Path, tmp_path: Path) -> None:
    """Ctrl-C twice: the second ends spotring at once, with no traceback, and the
    workers still go (their supervisors stop them when the driver's pipe closes)."""
    events = tmp_path / "events.jsonl"
    argv = two_workers_training(repo, events)
    with running_job(argv, cwd=tmp_path, env=dict(os.environ)) as process:
        wait_for_events(process, events, commits(), "a first commit")
        workers = [psutil.Process(pid) for pid, _ in worker_pids(process.pid)]
        assert len(workers) == 2
        process.send_signal(signal.SIGINT)
        time.sleep(0.05)
        process.send_signal(signal.SIGINT)
        began = time.monotonic()
        output = job_output(process, 30)
        took = time.monotonic() - began
    assert_interrupted(process, output, took)
    _, alive = psutil.wait_procs(workers, timeout=15)
    assert not [w for w in alive if w.status() != psutil.STATUS_ZOMBIE], "workers outlived it"


def test_workers_of_a_killed_driver_exit_at_once(repo: Path, tmp_path: Path) -> None:
    """kill -9 of the driver: each worker's supervisor sees its stdin close and stops it,
    instead of leaving it training (or hanging) on capacity that costs money."""
    events = tmp_path / "events.jsonl"
    argv = two_workers_training(repo, events)
    with running_job(argv, cwd=tmp_path, env=dict(os.environ)) as process:
        wait_for_events(process, events, commits(), "a first commit")
        workers = [psutil.Process(pid) for pid, _ in worker_pids(process.pid)]
        assert len(workers) == 2
        process.kill()
        process.communicate(timeout=30)
    _, alive = psutil.wait_procs(workers, timeout=15)
    assert not [w for w in alive if w.status() != psutil.STATUS_ZOMBIE], "workers outlived it"
