"""Helpers shared by the end-to-end tests that run real Horovod workers."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator, Sequence
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
    """Each resume continues from the last commit before it; commits only go forward."""
    last_commit = 0
    for event in events:
        if event["event"] == "resume":
            assert event["step"] == last_commit, (
                f"resumed at step {event['step']}, last commit was {last_commit}"
            )
        elif event["event"] == "commit":
            assert event["step"] >= last_commit, f"commit went back to {event['step']}"
            last_commit = event["step"]


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
    """A ``spotring run`` process (output on its stdout), killed if still running at exit."""
    process = subprocess.Popen(
        list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd, env=env
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
