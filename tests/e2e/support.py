"""Helpers shared by the end-to-end tests that run real Horovod workers."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil


def read_events(path: Path) -> list[dict[str, Any]]:
    """The JSON lines rank 0 of ``examples/train_digits.py`` wrote so far."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def assert_no_committed_step_lost(events: list[dict[str, Any]]) -> None:
    """Each resume continues from the last commit before it; commits only go forward.

    A resume one step past rank 0's last recorded commit is no loss: a ring allreduce
    can complete on some workers before a peer's death breaks it on others, so another
    worker may hold the next commit, and the new ring syncs from its rank 0.
    """
    last_commit = 0
    for event in events:
        if event["event"] == "resume":
            assert last_commit <= event["step"] <= last_commit + 1, (
                f"resumed at step {event['step']}, last commit was {last_commit}"
            )
        elif event["event"] == "commit":
            assert event["step"] >= last_commit, f"commit went back to {event['step']}"
            last_commit = event["step"]


def assert_every_sample_once(events: list[dict[str, Any]]) -> None:
    """Every epoch rank 0 audited (``train_digits.py --audit-samples``; an epoch rolled
    back past its end is audited again, the last audit counts) processed each training
    sample exactly once."""
    audits = {e["epoch"]: e for e in events if e["event"] == "epoch_audit"}
    assert audits, "no epoch was audited"
    wrong = {epoch: a for epoch, a in audits.items() if a["once"] != a["samples"]}
    assert not wrong, f"epochs with samples missed or repeated: {wrong}"


def worker_pids(driver_pid: int, **environ: str) -> list[tuple[int, dict[str, str]]]:
    """(pid, environment) of the driver's Python workers whose environment matches."""
    found = []
    for child in psutil.Process(driver_pid).children(recursive=True):
        try:
            env = child.environ()
            supervisor = "spotring.worker_image.supervisor" in child.cmdline()
            if (
                "python" in child.name()
                and not supervisor
                and all(env.get(k) == v for k, v in environ.items())
            ):
                found.append((child.pid, env))
        except psutil.Error:
            continue
    return found


@contextmanager
def running_job(
    argv: Sequence[str], cwd: Path, env: dict[str, str]
) -> Iterator[subprocess.Popen[str]]:
    """A ``spotring run`` process (output on its stdout), killed if still running at exit.

    Every process of the job runs with Python's fault handler on, so that
    :func:`job_output` can have a hung job print where each of its threads stood.
    """
    env = dict(env, PYTHONFAULTHANDLER="1")
    process = subprocess.Popen(
        list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd, env=env
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()


def job_output(process: subprocess.Popen[str], timeout: float) -> str:
    """The job's whole output once it ends; if it is still running after ``timeout``,
    fail with the end of its output and the Python stacks of all its processes."""
    try:
        output, _ = process.communicate(timeout=timeout)
        return output
    except subprocess.TimeoutExpired:
        pass
    # SIGABRT makes the fault handler print every thread's stack, workers first (their
    # output reaches us through the driver), then the driver's.
    for child in psutil.Process(process.pid).children(recursive=True):
        try:
            if "spotring.worker_image.supervisor" not in child.cmdline():
                os.kill(child.pid, signal.SIGABRT)
        except (psutil.Error, ProcessLookupError):
            continue
    time.sleep(2)
    os.kill(process.pid, signal.SIGABRT)
    try:
        output, _ = process.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        output, _ = process.communicate()
    raise AssertionError(f"the job was still running after {timeout:.0f} s:\n{output[-20000:]}")


def wait_for_events(
    process: subprocess.Popen[str],
    events: Path,
    done: Callable[[list[dict[str, Any]]], bool],
    what: str,
    timeout: float = 300.0,
) -> list[dict[str, Any]]:
    """Poll rank 0's events until ``done(events)``; fail naming ``what`` if the job ends
    first or ``timeout`` passes. Chaos in the e2e tests waits on this, never on a clock."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        recorded = read_events(events)
        if done(recorded):
            return recorded
        if process.poll() is not None:
            output = process.stdout.read() if process.stdout else ""
            raise AssertionError(f"job ended before {what}:\n{output[-4000:]}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def commits(size: int | None = None, steps: int = 1, min_step: int = 0) -> Callable[..., bool]:
    """A ``done`` for :func:`wait_for_events`: ``steps`` commits (at ``size``, if given)
    at step ``min_step`` or later."""

    def done(recorded: list[dict[str, Any]]) -> bool:
        matching = [
            e
            for e in recorded
            if e["event"] == "commit"
            and (size is None or e["size"] == size)
            and e["step"] >= min_step
        ]
        return len(matching) >= steps

    return done
