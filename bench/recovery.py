"""Hard-kill recovery, steps lost per failure, and scale-up latency.

Set-up: 4 workers of ``bench/workloads/steps.py`` (a 0.3 M-parameter MLP, a commit
after every step, 50 ms of sleep per step to stand for compute) on 4 hosts. A worker
process is killed with SIGKILL while its host is still listed; the time from the kill
to the next completed step at the new size is the recovery time. Then the host comes
back, the ring returns to 4 workers, and the next kill follows.

- spotring: ``spotring run --provider local`` (the killed host is taken out of the
  inventory at once, its peers are freed, and the group launches a replacement that
  boots in 2 s);
- anchor: plain ``horovodrun --host-discovery-script`` with a script that always lists
  the same 4 local host names (``localhost``, ``127.0.0.1``, this machine's name and
  its IP): the host stays listed, as a cloud API keeps listing a dead spot instance;
  ``--blacklist-cooldown-range`` lets it back after a few seconds.

Scale-up latency: from the moment spotring reports the replacement host READY to the
first completed step at size 4. Scale-up stall: when the host joins, the gap between
the ring's last step at size 3 and its first at size 4 (the running ring's pause; for
horovodrun, when the blacklisted host is let back).

    python bench/recovery.py [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

from bench.common import Row, format_extras, format_table, row

REPO = Path(__file__).resolve().parents[1]
WORKLOAD = REPO / "bench" / "workloads" / "steps.py"
BIN = Path(sys.executable).parent
WORKERS = 4
RECOVERY = "hard-kill recovery, 4 local workers"
ANCHOR = "horovodrun + discovery script"
CYCLE_TIMEOUT = 120.0


class Job:
    """A running elastic job whose rank 0 logs every step to a file."""

    def __init__(self, argv: list[str], log: Path, env: dict[str, str]) -> None:
        self.log = log
        self.lines: list[tuple[float, str]] = []  # (arrival time, driver output line)
        self.process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env=env,
            cwd=log.parent,
            start_new_session=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append((time.time(), line.rstrip("\n")))

    def events(self) -> list[dict]:
        if not self.log.exists():
            return []
        events = []
        for line in self.log.read_text().splitlines():
            with contextlib.suppress(ValueError):  # a line cut short by a kill of its writer
                events.append(json.loads(line))
        return events

    def wait_recovered(self, after: float) -> tuple[dict, dict]:
        """Rank 0's first resume after time ``after`` and its first step after that,
        at whatever size: after a stall long enough for the replacement to arrive, the
        ring comes back at full size at once."""
        deadline = time.monotonic() + CYCLE_TIMEOUT
        while time.monotonic() < deadline:
            events = [e for e in self.events() if e["t"] > after]
            resume = next((e for e in events if e["event"] == "resume"), None)
            if resume is not None:
                step = next(
                    (e for e in events if e["event"] == "step" and e["t"] > resume["t"]), None
                )
                if step is not None:
                    return resume, step
            self._check_running()
            time.sleep(0.1)
        raise TimeoutError(f"no recovery; the job's last lines:\n{self._tail()}")

    def wait_steady(self, size: int, after: float, steps: int = 5) -> None:
        """Wait until rank 0 completed ``steps`` steps at ``size`` after time ``after``."""
        deadline = time.monotonic() + CYCLE_TIMEOUT
        while time.monotonic() < deadline:
            done = [e for e in self.events() if e["event"] == "step" and e["t"] > after]
            if sum(1 for e in done if e["size"] == size) >= steps and done[-1]["size"] == size:
                return
            self._check_running()
            time.sleep(0.1)
        raise TimeoutError(f"no steady state at size {size}; the job's last lines:\n{self._tail()}")

    def wait_steady_at_least(self, size: int, steps: int) -> None:
        """Wait until rank 0 completed ``steps`` steps in a row, from now on, in a ring of
        at least ``size`` workers."""
        after = time.time()
        deadline = time.monotonic() + CYCLE_TIMEOUT
        while time.monotonic() < deadline:
            done = [e for e in self.events() if e["event"] == "step" and e["t"] > after]
            if len(done) >= steps and all(e["size"] >= size for e in done[-steps:]):
                return
            self._check_running()
            time.sleep(0.1)
        raise TimeoutError(f"no ring of {size}+; the job's last lines:\n{self._tail()}")

    def _check_running(self) -> None:
        if self.process.poll() is not None:
            raise RuntimeError(f"the job ended:\n{self._tail()}")

    def _tail(self) -> str:
        return "\n".join(line for _, line in self.lines[-60:])

    def members(self) -> dict[int, int]:
        """``{rank: pid}`` of the current ring: the workers that logged joining it at
        rank 0's last (re)start (same step and size; workers started ahead and still
        waiting for a slot run the script too, but are no members)."""
        events = self.events()
        resume = [e for e in events if e["event"] == "resume"][-1]
        return {
            e["rank"]: e["pid"]
            for e in events
            if e["event"] == "member" and (e["step"], e["size"]) == (resume["step"], resume["size"])
        }

    def workers(self) -> dict[str, int]:
        """``{HOROVOD_HOSTNAME: pid}`` of the running worker Python processes."""
        found: dict[str, int] = {}
        for child in psutil.Process(self.process.pid).children(recursive=True):
            try:
                host = child.environ().get("HOROVOD_HOSTNAME")
                if host and "python" in child.name() and "steps.py" in " ".join(child.cmdline()):
                    found[host] = child.pid
            except psutil.Error:
                continue
        return found

    def stop(self) -> None:
        try:
            tree = psutil.Process(self.process.pid).children(recursive=True)
        except psutil.Error:
            tree = []
        if self.process.poll() is None:
            tree.append(psutil.Process(self.process.pid))
        for proc in tree:
            with contextlib.suppress(psutil.Error):
                proc.kill()
        self.process.wait(timeout=30)


def _kill_cycles(job: Job, kills: int) -> list[dict]:
    """Kill a worker ``kills`` times; measure each recovery."""
    results = []
    job.wait_steady(WORKERS, after=0.0)
    for _ in range(kills):
        members = job.members()
        events = job.events()
        # The newest member, never rank 0 (which logs).
        victim = max((pid for rank, pid in members.items() if rank != 0))
        committed = max(e["step"] for e in events if e["event"] == "commit")
        last_step = max(e["step"] for e in events if e["event"] == "step")
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        resumed, first = job.wait_recovered(after=killed_at)
        results.append(
            {
                "recovery_s": first["t"] - killed_at,
                "committed_at_kill": committed,
                "last_step_at_kill": last_step,
                "resumed_from": resumed["step"],
                "killed_at": killed_at,
            }
        )
        job.wait_steady(WORKERS, after=first["t"], steps=5)
        if first["size"] < WORKERS:
            stall, to_resume = _join_stall(job.events(), first["t"])
            results[-1]["join_stall_s"] = stall
            results[-1]["join_to_resume_s"] = to_resume
    return results


def _join_stall(events: list[dict], since: float) -> tuple[float, float]:
    """Wait for the ring to grow back to full size after ``since``; the gap between
    rank 0's last step before that join and its first step after it, and the part of
    it until rank 0 resumed training (the step's sleep and commit, the reset, the
    sync: the rest is the first step at the new size)."""
    steps = [e for e in events if e["event"] in ("step", "resume") and e["t"] >= since]
    last = None
    for event in steps:
        if event["event"] == "step" and event["size"] < WORKERS:
            last = event
        elif event["size"] == WORKERS and last is not None:
            resume = next(
                (e for e in steps if e["event"] == "resume" and last["t"] < e["t"]), event
            )
            following = next(e for e in steps if e["event"] == "step" and e["t"] > resume["t"])
            return following["t"] - last["t"], resume["t"] - last["t"]
    raise RuntimeError("no join found in the step log")


def _scale_up_latencies(job: Job, cycles: list[dict]) -> list[float]:
    """Replacement READY (spotring's progress line) -> first step at size 4."""
    latencies = []
    events = job.events()
    for cycle in cycles:
        ready = next(
            (
                t
                for t, line in job.lines
                if t > cycle["killed_at"] and re.search(r"\] hosts \+host-\d+", line)
            ),
            None,
        )
        if ready is None:
            continue
        first = next(
            (
                e["t"]
                for e in events
                if e["event"] == "step" and e["size"] == WORKERS and e["t"] > ready
            ),
            None,
        )
        if first is not None:
            latencies.append(first - ready)
    return latencies


def _local_host_names() -> list[str]:
    """Up to 4 names Horovod treats as this machine, so horovodrun runs them without ssh."""
    names = ["localhost", "127.0.0.1", socket.gethostname()]
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # no packet is sent: picks the primary address
            names.append(probe.getsockname()[0])
    except OSError:
        pass
    return list(dict.fromkeys(names))[:WORKERS]


def _workload(log: Path, state: str) -> list[str]:
    return [sys.executable, str(WORKLOAD), "--step-log", str(log), "--state", state]


def run_spotring(
    workdir: Path, kills: int, state: str = "spotring"
) -> tuple[list[dict], list[float]]:
    """Kill cycles under ``spotring run`` with the workload's ``state`` class
    (spotring's TorchState or ``hvd.elastic.TorchState``), and scale-up latencies."""
    log = workdir / f"spotring-{state}.jsonl"
    argv = [
        str(BIN / "spotring"),
        "run",
        "--provider",
        "local",
        "-np",
        str(WORKERS),
        "--min-np",
        "2",
        "--max-np",
        str(WORKERS),
        "--hosts",
        str(WORKERS),
        "--refresh-interval",
        "1",
        "--boot-seconds",
        "2",
        "--",
        *_workload(log, state),
    ]
    job = Job(argv, log, dict(os.environ))
    try:
        cycles = _kill_cycles(job, kills)
        return cycles, _scale_up_latencies(job, cycles)
    finally:
        job.stop()


def run_anchor(workdir: Path, kills: int) -> list[dict]:
    names = _local_host_names()
    if len(names) < WORKERS:
        raise RuntimeError(f"only {len(names)} local host names: {names}")
    script = workdir / "discover.sh"
    script.write_text("#!/bin/sh\n" + "".join(f"echo {n}:1\n" for n in names))
    script.chmod(0o755)
    log = workdir / "anchor.jsonl"
    argv = [
        str(BIN / "horovodrun"),
        "-np",
        str(WORKERS),
        "--min-np",
        "2",
        "--max-np",
        str(WORKERS),
        "--host-discovery-script",
        str(script),
        "--network-interface",
        "lo",
        "--blacklist-cooldown-range",
        "3",
        "5",
        *_workload(log, "horovod"),
    ]
    job = Job(argv, log, dict(os.environ))
    try:
        return _kill_cycles(job, kills)
    finally:
        job.stop()


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


def measure(quick: bool = False) -> list[Row]:
    """Rows for bench/run: recovery p50/p95/max, steps lost, scale-up latency."""
    kills = 3 if quick else 10
    anchor_kills = 2 if quick else 5  # each costs Gloo's 30 s timeout
    with tempfile.TemporaryDirectory(prefix="spotring-bench-") as tmp:
        workdir = Path(tmp)
        ours, scale_up = run_spotring(workdir, kills)
        with_horovod_state, _ = run_spotring(workdir, kills, state="horovod")
        anchor = run_anchor(workdir, anchor_kills)
    ours_s = [c["recovery_s"] for c in ours]
    horovod_state_s = [c["recovery_s"] for c in with_horovod_state]
    anchor_s = [c["recovery_s"] for c in anchor]
    setup = {
        "workers": WORKERS,
        "kills": len(ours),
        "anchor kills": len(anchor),
        "spotring recoveries s": [round(s, 2) for s in ours_s],
        "anchor recoveries s": [round(s, 2) for s in anchor_s],
    }
    rows = [
        row(RECOVERY, f"{label} s kill -> next step", _percentile(ours_s, q), ANCHOR,
            _percentile(anchor_s, q), target, setup)
        for label, q, target in (("p50", 0.5, ""), ("p95", 0.95, "<= 0.3 s"), ("max", 1.0, ""))
    ]  # fmt: skip
    rows.append(
        row(f"{RECOVERY}, hvd.elastic.TorchState", "p95 s kill -> next step",
            _percentile(horovod_state_s, 0.95), ANCHOR, _percentile(anchor_s, 0.95), "<= 0.3 s",
            {"recoveries s": [round(s, 2) for s in horovod_state_s],
             "why": "the abort is installed by the launcher, whatever the state class"})
    )  # fmt: skip
    # A commit in flight at the kill can land after we read the log: resuming past the
    # step we read is not a loss, hence the clamp at 0.
    lost = [max(0, c["committed_at_kill"] - c["resumed_from"]) for c in ours]
    redone = [max(0, c["last_step_at_kill"] - c["resumed_from"]) for c in ours]
    anchor_lost = [max(0, c["committed_at_kill"] - c["resumed_from"]) for c in anchor]
    rows.append(
        row("steps lost per failure", "max committed steps lost", max(lost), ANCHOR,
            max(anchor_lost), "== 0",
            {"uncommitted steps redone (max)": max(redone), "per kill": lost})
    )  # fmt: skip
    stalls = [c["join_stall_s"] for c in ours if "join_stall_s" in c]
    anchor_stalls = [c["join_stall_s"] for c in anchor if "join_stall_s" in c]
    rows.append(
        row("scale-up stall, a host joining 3 local workers", "max s between steps",
            max(stalls), ANCHOR, max(anchor_stalls), "<= 0.3 s",
            {"spotring stalls s": [round(s, 2) for s in stalls],
             "of which until rank 0 resumed s": [
                 round(c["join_to_resume_s"], 2) for c in ours if "join_to_resume_s" in c],
             "anchor stalls s": [round(s, 2) for s in anchor_stalls],
             "why": "spotring started the joining worker ahead: it waited in hvd.init"})
    )  # fmt: skip
    horovod_state_stalls = [c["join_stall_s"] for c in with_horovod_state if "join_stall_s" in c]
    if horovod_state_stalls:
        rows.append(
            row("scale-up stall, a host joining 3 local workers, hvd.elastic.TorchState",
                "max s between steps", max(horovod_state_stalls), ANCHOR, max(anchor_stalls),
                "", {"stalls s": [round(s, 2) for s in horovod_state_stalls],
                     "of which until rank 0 resumed s": [
                         round(c["join_to_resume_s"], 2) for c in with_horovod_state
                         if "join_to_resume_s" in c],
                     "why": "started ahead too; horovod's sync takes six collective rounds, "
                            "spotring's TorchState two"})
        )  # fmt: skip
    if scale_up:
        base = _percentile(ours_s, 0.5)
        rows.append(
            row("scale-up latency", "median s host READY -> step at size 4",
                statistics.median(scale_up), "recovery p50 (for scale)", base, "",
                {"samples": [round(s, 2) for s in scale_up],
                 "includes": "the new worker's start-up (imports) and a reset of the ring"})
        )  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rows = measure(args.quick)
    print(format_table(rows))
    print(format_extras(rows))


if __name__ == "__main__":
    main()
