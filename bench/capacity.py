"""Capacity fallback (#25): what a spot pool that runs dry, then comes back, costs a job.

Set-up: ``bench/workloads/steps.py`` (a 0.3 M-parameter MLP, 50 ms of sleep per step)
with a commit every ``COMMIT_EVERY`` steps, 4 workers on 4 hosts, 2 of which the spot
pool cannot supply at first; hosts boot for ``BOOT_SECONDS``.

- spotring: ``spotring run --provider local --spot-capacity 2``: the spot group's
  failed launches are the shortage signal; the job falls back to the local on-demand
  group (``od-0``, ``od-1``) and trains at 4. Then the control line ``spot-capacity 4``
  gives the capacity back: once the policy probes the spot group again (its backoff:
  60 s x1.6, +-40%), the new spot hosts start warm and each on-demand host leaves the
  ring at a commit (``--return-after 1``).
- anchor: ``horovodrun --host-discovery-script`` with a host list the benchmark edits
  as an oracle would: it adds the 2 on-demand hosts ``BOOT_SECONDS`` after it learns of
  the shortage, and later swaps each on-demand host for a spot one in one edit of the
  list (Horovod's own path for a host that leaves discovery; the new worker starts
  cold at the reset).

Figures, from rank 0's step log (and the run's events file for spotring's shortage):
seconds from the shortage to the first step of the full ring (spotring: the
``capacity_shortage`` event; anchor: the moment the oracle learns of it), and per swap
back to spot the steps rolled back (the last step completed before the ring changed,
minus the step it resumed from), the ring's stall (the longest time between two
completed steps around the swap), and the seconds rank 0 trained in a ring smaller than
4 while the on-demand hosts were swapped for spot ones.

    python -m bench.capacity [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import Row, format_table, row
from bench.recovery import BIN, CYCLE_TIMEOUT, WORKERS, WORKLOAD, Job, _local_host_names

BENCHMARK = "capacity fallback, 4 local workers, spot pool of 2 then 4"
ANCHOR = "horovodrun + discovery script edited by an oracle"
COMMIT_EVERY = 5
BOOT_SECONDS = 2.0
SPOT_PROBE_TIMEOUT = 300.0
"""The policy's first probe of a short spot group comes 36 to 84 s after the shortage."""


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


def _steps_at(job: Job, size: int, after: float) -> list[dict[str, Any]]:
    return [
        e for e in job.events() if e["event"] == "step" and e["size"] == size and e["t"] > after
    ]


def _swap_costs(events: list[dict[str, Any]], after: float) -> list[dict[str, float]]:
    """Rolled-back steps and stall of each restart of rank 0 after time ``after``."""
    costs = []
    for index, event in enumerate(events):
        if event["event"] != "resume" or event["t"] <= after:
            continue
        before = [e for e in events[:index] if e["event"] == "step"]
        following = [e for e in events[index:] if e["event"] == "step"][:3]
        if not before or not following:
            continue
        times = [before[-1]["t"], *(e["t"] for e in following)]
        costs.append(
            {
                "rolled_back": max(0, before[-1]["step"] - event["step"]),
                "stall_s": max(b - a for a, b in itertools.pairwise(times)),
            }
        )
    return costs


def _below_full(events: list[dict[str, Any]], after: float) -> float:
    """Seconds rank 0 trained in a ring smaller than ``WORKERS`` after time ``after``
    (from its first step below full size to its next step at full size)."""
    steps = [e for e in events if e["event"] == "step" and e["t"] > after]
    small = next((e for e in steps if e["size"] < WORKERS), None)
    if small is None:
        return 0.0
    full = next((e for e in steps if e["size"] == WORKERS and e["t"] > small["t"]), None)
    return (full["t"] if full is not None else steps[-1]["t"]) - small["t"]


def _read_story(path: Path) -> list[dict[str, Any]]:
    story = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                story.append(json.loads(line))
            except ValueError:  # a line still being written
                break
    return story


def _wait(what: str, done: Any, job: Job, timeout: float = CYCLE_TIMEOUT) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        answer = done()
        if answer:
            return answer
        job._check_running()
        time.sleep(0.1)
    raise TimeoutError(f"{what}; the job's last lines:\n{job._tail()}")


def run_spotring(workdir: Path) -> dict[str, Any]:
    log, control, story = workdir / "spotring.jsonl", workdir / "control", workdir / "run.jsonl"
    argv = [
        str(BIN / "spotring"),
        *("run", "--provider", "local", "-np", str(WORKERS), "--min-np", "2"),
        *("--max-np", str(WORKERS), "--spot-capacity", "2", "--return-after", "1"),
        *("--refresh-interval", "0.5", "--boot-seconds", str(BOOT_SECONDS)),
        *("--control", str(control), "--events", str(story), "--"),
        *_workload(log, "spotring"),
    ]
    job = Job(argv, log, dict(os.environ))
    try:
        job.wait_steady(WORKERS, after=0.0, steps=4 * COMMIT_EVERY)
        shortage = next(e["t"] for e in _read_story(story) if e["event"] == "capacity_shortage")
        full = _steps_at(job, WORKERS, 0.0)[0]["t"]
        given_back = time.time()
        with control.open("a") as stream:
            stream.write("spot-capacity 4\n")

        def returned() -> bool:
            events = _read_story(story)
            back = {e["id"] for e in events if e["event"] == "returned"}
            rings = [e for e in events if e["event"] == "ring_formed"]
            spot_ring = bool(rings) and all(h.startswith("host-") for h in rings[-1]["hosts"])
            return back >= {"od-0", "od-1"} and spot_ring

        _wait("both on-demand hosts handed back", returned, job, SPOT_PROBE_TIMEOUT)
        job.wait_steady(WORKERS, after=time.time(), steps=2 * COMMIT_EVERY)
        events = _read_story(story)
        first_return = min(e["t"] for e in events if e["event"] == "returned")
        return {
            "to_full_s": full - shortage,
            "swaps": _swap_costs(job.events(), given_back),
            "below_full_s": _below_full(job.events(), given_back),
            "probe_s": first_return - given_back,
            "sizes": [
                e["size"] for e in events if e["event"] == "ring_formed" and e["t"] > given_back
            ],
        }
    finally:
        job.stop()


def _extra_local_names(count: int) -> list[str]:
    """More names Horovod runs on this machine without ssh: dotted forms of 127.0.0.1
    that resolve to it (``127.1``, ``127.0.1``)."""
    local = {"127.0.0.1"}
    names = [n for n in ("127.1", "127.0.1", "2130706433") if _resolves_to(n) in local]
    return names[:count]


def _resolves_to(name: str) -> str | None:
    try:
        return socket.gethostbyname(name)
    except OSError:
        return None


def run_anchor(workdir: Path) -> dict[str, Any]:
    names = _local_host_names() + _extra_local_names(2)
    if len(names) < WORKERS + 2:
        raise RuntimeError(f"only {len(names)} local host names: {names}")
    spot, on_demand, spare = names[:2], names[2:4], names[4:6]
    hosts = workdir / "hosts"
    hosts.write_text("".join(f"{n}:1\n" for n in spot))
    script = workdir / "discover.sh"
    script.write_text(f"#!/bin/sh\ncat {hosts}\n")
    script.chmod(0o755)
    log = workdir / "anchor.jsonl"
    argv = [
        str(BIN / "horovodrun"),  # -np 2: stock Horovod waits for -np hosts to start
        *("-np", "2", "--min-np", "2", "--max-np", str(WORKERS)),
        *("--host-discovery-script", str(script), "--network-interface", "lo"),
        *_workload(log, "horovod"),
    ]
    job = Job(argv, log, dict(os.environ))
    try:
        job.wait_steady(2, after=0.0, steps=4 * COMMIT_EVERY)
        shortage = time.time()  # the oracle learns of it now, and launches on-demand hosts
        time.sleep(BOOT_SECONDS)
        hosts.write_text("".join(f"{n}:1\n" for n in [*spot, *on_demand]))
        _wait("a ring of 4", lambda: _steps_at(job, WORKERS, shortage), job)
        full = _steps_at(job, WORKERS, shortage)[0]["t"]
        job.wait_steady(WORKERS, after=time.time(), steps=4 * COMMIT_EVERY)
        given_back = time.time()
        current = [*spot, *on_demand]
        failed = ""
        try:
            for old, new in zip(on_demand, spare, strict=True):
                time.sleep(BOOT_SECONDS)  # the spot host boots; then one edit swaps them
                current = [new if n == old else n for n in current]
                hosts.write_text("".join(f"{n}:1\n" for n in current))
                _wait("the swap", _resumed_since(job, time.time()), job)
                job.wait_steady(WORKERS, after=time.time(), steps=2 * COMMIT_EVERY)
        except (RuntimeError, TimeoutError) as error:  # stock Horovod may lose the job here
            failed = _last_error(job) or str(error).splitlines()[0]
        return {
            "to_full_s": full - shortage,
            "swaps": _swap_costs(job.events(), given_back),
            "below_full_s": _below_full(job.events(), given_back),
            "failed": failed,
        }
    finally:
        job.stop()


def _last_error(job: Job) -> str:
    """The job's last line that names an error, if any (why a stock job ended)."""
    errors = [line for _, line in job.lines if "Error" in line or "error" in line]
    return errors[-1].strip()[:300] if errors else ""


def _resumed_since(job: Job, at: float) -> Any:
    return lambda: any(e["event"] == "resume" and e["t"] > at for e in job.events())


def measure(quick: bool = False) -> list[Row]:
    """Rows for bench/run: time from shortage to full size, steps rolled back and
    stall per swap back to spot."""
    with tempfile.TemporaryDirectory(prefix="spotring-bench-") as tmp:
        workdir = Path(tmp)
        (workdir / "spotring").mkdir()
        (workdir / "anchor").mkdir()
        ours = run_spotring(workdir / "spotring")
        theirs = run_anchor(workdir / "anchor")
    our_swaps, their_swaps = ours["swaps"], theirs["swaps"] or [dict.fromkeys(("stall_s",
        "rolled_back"), math.nan)]  # fmt: skip
    extra = {
        "commit every": f"{COMMIT_EVERY} steps of 50 ms",
        "boot s": BOOT_SECONDS,
        "spotring s from capacity back to first hand-back": round(ours["probe_s"], 1),
        "spotring ring sizes after capacity came back": ours["sizes"],
        "spotring swaps": [{k: round(v, 3) for k, v in s.items()} for s in our_swaps],
        "anchor swaps": [{k: round(v, 3) for k, v in s.items()} for s in their_swaps],
        "note": "the anchor adds hosts the moment it is told: it has no shortage detection",
    }
    if theirs["failed"]:
        extra["anchor failed at a swap"] = theirs["failed"]
    return [
        row(BENCHMARK, "s from shortage to full size", ours["to_full_s"], ANCHOR,
            theirs["to_full_s"], "", extra),
        row(BENCHMARK, "max s stall per swap back to spot",
            max(s["stall_s"] for s in our_swaps), ANCHOR,
            max(s["stall_s"] for s in their_swaps), "< 1 s", extra),
        row(BENCHMARK, "s trained below full size while swapping back",
            ours["below_full_s"], ANCHOR, theirs["below_full_s"], "== 0", extra),
        row(BENCHMARK, "steps rolled back, all swaps",
            sum(s["rolled_back"] for s in our_swaps), ANCHOR,
            sum(s["rolled_back"] for s in their_swaps), "== 0", extra),
    ]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    print(format_table(measure(parser.parse_args().quick)))


if __name__ == "__main__":
    main()
