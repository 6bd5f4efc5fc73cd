"""Noticed preemption: what a spot reclaim that was announced costs the running ring.

Set-up: ``bench/workloads/steps.py`` (a 0.3 M-parameter MLP, 50 ms of sleep per step to
stand for compute) with a commit every ``COMMIT_EVERY`` steps, as a job whose commits
cost real time would. 4 workers on 4 hosts; a host is preempted, twice per job (4 -> 3
-> 2 workers), with no replacement joining during the measurement.

- spotring: ``spotring run --provider local``; the host announces its interruption
  ``LEAD_SECONDS`` ahead through its metadata service (the real AWS watcher reads it),
  leaves the ring at the next commit, and is SIGKILLed at the deadline.
- anchor: ``horovodrun --host-discovery-script`` with a script that prints a host
  list. It knows nothing of the notice: it sees the host die at the deadline (a
  SIGKILL of its worker, and the host dropped from the list at the same moment: the
  best a discovery script can do).

Figures per preemption, from rank 0's step log: steps rolled back (the last step
completed before the ring changed, minus the step it resumed from) and the ring's
stall (the longest gap between consecutive completed steps from the notice, or the
kill, until the ring has made 3 steps at its new size).

    python -m bench.notice [--quick]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import Row, format_table, row
from bench.recovery import BIN, WORKERS, WORKLOAD, Job, _local_host_names

BENCHMARK = "noticed preemption, 4 -> 3 -> 2 local workers"
ANCHOR = "horovodrun + discovery script (host dies at the deadline)"
COMMIT_EVERY = 20
STEP_SECONDS = 0.05  # the workload's default
LEAD_SECONDS = 30.0


def _random_phase(rng: random.Random) -> None:
    """Wait a random part of a commit interval: a cloud's deadline falls anywhere."""
    time.sleep(rng.uniform(0, COMMIT_EVERY * STEP_SECONDS))


def _workload(log: Path, state: str) -> list[str]:
    return [
        str(BIN / "python"),
        str(WORKLOAD),
        "--step-log",
        str(log),
        "--state",
        state,
        "--commit-every",
        str(COMMIT_EVERY),
    ]


def _measure_change(job: Job, before: float, size: int) -> dict[str, float]:
    """Rolled-back steps and stall of the ring change that began at ``before``."""
    job.wait_steady(size, after=before, steps=3)
    events = job.events()
    prior = [e for e in events if e["event"] == "step" and e["t"] <= before]
    resumed = next(e for e in events if e["event"] == "resume" and e["t"] > before)
    steps = [e for e in events if e["event"] == "step" and e["t"] > before - 0.5]
    new_size = [e for e in steps if e["size"] == size]
    window = [e["t"] for e in steps if e["t"] <= new_size[2]["t"]]
    gaps = [b - a for a, b in zip([before, *window], window, strict=False)]
    last_before = max(e["step"] for e in events if e["event"] == "step" and e["t"] < resumed["t"])
    return {
        "rolled_back": max(0, last_before - resumed["step"]),
        "stall_s": max(gaps),
        "steps_before": prior[-1]["step"] if prior else 0,
    }


def run_spotring(
    workdir: Path, rng: random.Random, state: str = "spotring"
) -> list[dict[str, float]]:
    log, control = workdir / f"spotring-{state}.jsonl", workdir / "control"
    argv = [
        str(BIN / "spotring"),
        *("run", "--provider", "local", "-np", str(WORKERS), "--min-np", "2"),
        *("--max-np", str(WORKERS), "--hosts", str(WORKERS), "--refresh-interval", "1"),
        *("--boot-seconds", "3600", "--control", str(control)),
        *("--notice-lead", str(LEAD_SECONDS)),
        "--",
        *_workload(log, state),
    ]

    def notice(job: Job) -> None:
        with control.open("a") as stream:
            stream.write("notice\n")

    return _preempt_twice(Job(argv, log, dict(os.environ)), rng, notice)


def run_anchor(workdir: Path, rng: random.Random) -> list[dict[str, float]]:
    names = _local_host_names()
    if len(names) < WORKERS:
        raise RuntimeError(f"only {len(names)} local host names: {names}")
    hosts = workdir / "hosts"
    hosts.write_text("".join(f"{n}:1\n" for n in names))
    script = workdir / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(0o755)
    log = workdir / "anchor.jsonl"
    argv = [
        str(BIN / "horovodrun"),
        *("-np", str(WORKERS), "--min-np", "2", "--max-np", str(WORKERS)),
        *("--host-discovery-script", str(script), "--network-interface", "lo"),
        *_workload(log, "horovod"),
    ]

    def die_at_the_deadline(job: Job) -> None:
        workers = job.workers()
        victim = max(workers, key=workers.__getitem__)  # the newest: not rank 0's
        os.kill(workers[victim], signal.SIGKILL)
        hosts.write_text("".join(line for line in hosts.read_text().splitlines(True)
                                 if not line.startswith(f"{victim}:")))  # fmt: skip

    return _preempt_twice(Job(argv, log, dict(os.environ)), rng, die_at_the_deadline)


def _preempt_twice(
    job: Job, rng: random.Random, preempt: Callable[[Job], None]
) -> list[dict[str, float]]:
    """Preempt a host of the steady ring twice (4 -> 3 -> 2), measuring each change."""
    results = []
    try:
        job.wait_steady(WORKERS, after=0.0, steps=COMMIT_EVERY)
        for size in (WORKERS - 1, WORKERS - 2):
            _random_phase(rng)
            started = time.time()
            preempt(job)
            results.append(_measure_change(job, started, size))
            job.wait_steady(size, after=time.time(), steps=COMMIT_EVERY)
    finally:
        job.stop()
    return results


def measure(quick: bool = False) -> list[Row]:
    """Rows for bench/run: steps rolled back and ring stall per noticed preemption."""
    jobs = 1 if quick else 3
    rng = random.Random(0)
    with tempfile.TemporaryDirectory(prefix="spotring-bench-") as tmp:
        workdir = Path(tmp)
        ours: list[dict[str, float]] = []
        theirs: list[dict[str, float]] = []
        for index in range(jobs):
            for side in ("spotring", "anchor"):
                (workdir / f"{side}-{index}").mkdir()
            ours += run_spotring(workdir / f"spotring-{index}", rng)
            theirs += run_anchor(workdir / f"anchor-{index}", rng)
    extra = {
        "preemptions": len(ours),
        "commit every": f"{COMMIT_EVERY} steps of 50 ms",
        "notice lead s": LEAD_SECONDS,
        "spotring stalls s": [round(r["stall_s"], 2) for r in ours],
        "anchor stalls s": [round(r["stall_s"], 2) for r in theirs],
        "spotring rolled back": [int(r["rolled_back"]) for r in ours],
        "anchor rolled back": [int(r["rolled_back"]) for r in theirs],
    }
    return [
        row(BENCHMARK, "max steps rolled back", max(r["rolled_back"] for r in ours), ANCHOR,
            max(r["rolled_back"] for r in theirs), "== 0", extra),
        row(BENCHMARK, "median steps rolled back",
            statistics.median(r["rolled_back"] for r in ours), ANCHOR,
            statistics.median(r["rolled_back"] for r in theirs), "", extra),
        row(BENCHMARK, "max s the ring made no step", max(r["stall_s"] for r in ours), ANCHOR,
            max(r["stall_s"] for r in theirs), "<= 1 s", extra),
        row(BENCHMARK, "median s the ring made no step",
            statistics.median(r["stall_s"] for r in ours), ANCHOR,
            statistics.median(r["stall_s"] for r in theirs), "", extra),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    print(format_table(measure(parser.parse_args().quick)))


if __name__ == "__main__":
    main()
