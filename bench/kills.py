"""Hard kills on a randomized schedule: does any survivor wait out Gloo's timeout?

A ring of 4 local workers of ``bench/workloads/steps.py`` (a 32 MiB allreduce every step
besides the model's gradients, so a kill often lands mid-message) under
``spotring run --provider local``, killed over and over with SIGKILL while the killed
host stays listed until spotring takes it out. Each cycle picks one of:

- ``step``: one member, at a random point of a step (mid-allreduce, in the commit, in
  the step's sleep);
- ``double``: two members 50 ms apart;
- ``reset``: one member, then another 0.1-1.5 s later, while the ring re-forms
  (Gloo's rendezvous, the state sync, ``hvd.broadcast_object``);
- ``sigint``: one member, then Ctrl-C to the driver 0-2 s later, at a random point of
  the reset: the driver must stop within :data:`SIGINT_BOUND_SECONDS`; a new job then
  takes over the loop.

The stall of a cycle is its last kill -> rank 0's next completed step. A survivor that
waited out one of Gloo's timeouts (``HOROVOD_GLOO_TIMEOUT_SECONDS``, 30 s; five times
that for a connect) fails with Gloo's own message ("Timed out waiting ...", "Connect
timeout", ...), which its worker prints and the driver relays: a cycle with one in the
job's output is counted. A cycle that left fewer than ``--min-np`` hosts (a double kill
of a ring of 3) waits for replacement hosts to boot and start their workers: its stall
is reported apart. Both state classes (spotring's ``TorchState`` and
``hvd.elastic.TorchState``) get half the kills.

    python -m bench.kills [--kills 200] [--seed 0] [--quick] [--diagnose]

``--diagnose`` runs the drivers with debug logging, saves every socket, every Python
stack and every thread's kernel state of a cycle not recovered after
:data:`DIAGNOSE_AFTER_SECONDS` (with tools that stop no process), and keeps the jobs'
timestamped output of a run with any cycle that stalled longer than
:data:`SLOW_CYCLE_SECONDS`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench.common import Row, format_table, row
from bench.recovery import BIN, WORKERS, Job, _percentile, _workload

GLOO_TIMEOUT_SECONDS = 30.0
GLOO_TIMED_OUT = re.compile(
    r"Timed out waiting|Connect timeout|Read timeout|Write timeout|Wait timeout after"
)
"""What a Gloo operation that waited out its timeout fails with (Gloo's own messages)."""
MIN_NP = 2
READY = re.compile(r"-> ready: (.*)$")
SIGINT_BOUND_SECONDS = 10.0
DIAGNOSE_AFTER_SECONDS = 5.0
"""A cycle not recovered by then gets its sockets and stacks saved."""
SLOW_CYCLE_SECONDS = 5.0
"""With ``--diagnose``, a run with a cycle slower than this (that did not wait for
replacement hosts) keeps its jobs' logs."""
TENSOR_MB = 32
KINDS = ("step", "step", "step", "double", "reset", "sigint")
"""The schedule's mix: most kills at a random point of a step."""
ANCHOR = "kills"


@dataclass
class Cycle:
    kind: str
    state: str
    stall_s: float | None = None
    timed_out: bool = False
    waited_for_hosts: bool = False
    """Fewer than MIN_NP hosts were left: the ring waited for replacements."""
    sigint_exit_s: float | None = None
    kills: int = 1
    job: int = 0
    killed: list[tuple[float, int]] = field(default_factory=list)
    """(time, pid) of each kill."""


@dataclass
class Loop:
    """One state class's share of the schedule."""

    state: str
    rng: random.Random
    workdir: Path
    diagnose: bool = False
    cycles: list[Cycle] = field(default_factory=list)
    jobs: int = 0

    def start(self) -> Job:
        self.jobs += 1
        log = self.workdir / f"{self.state}-{self.jobs}.jsonl"
        argv = [
            str(BIN / "spotring"), *(("--log-level", "debug") if self.diagnose else ()),
            "run", "--provider", "local",
            "-np", str(WORKERS), "--min-np", str(MIN_NP), "--max-np", str(WORKERS),
            "--hosts", str(WORKERS), "--refresh-interval", "1", "--boot-seconds", "1",
            "--", *_workload(log, self.state), "--tensor-mb", str(TENSOR_MB),
        ]  # fmt: skip
        env = dict(os.environ, HOROVOD_GLOO_TIMEOUT_SECONDS=str(int(GLOO_TIMEOUT_SECONDS)))
        job = Job(argv, log, env)
        job.wait_steady(WORKERS, after=0.0, steps=3)
        return job

    def run(self, kills: int) -> None:
        job = self.start()
        try:
            while sum(c.kills for c in self.cycles) < kills:
                kind = self.rng.choice(KINDS)
                job.wait_steady_at_least(4 if kind == "double" else 3, steps=3)
                cycle = Cycle(kind, self.state, job=self.jobs)
                self.cycles.append(cycle)
                job = self._cycle(job, cycle)
        finally:
            job.stop()
            self.save(job)

    def save(self, job: Job) -> None:
        """The job's output, timestamped, beside its step log (kept when a cycle stalls)."""
        out = self.workdir / f"{self.state}-{self.jobs}.log"
        out.write_text("".join(f"{t:.3f} {line}\n" for t, line in job.lines))

    def _cycle(self, job: Job, cycle: Cycle) -> Job:
        members = list(job.members().values())
        self.rng.shuffle(members)
        step_s = _step_seconds(job)
        time.sleep(self.rng.uniform(0.0, step_s))  # a random point of the step
        first = last = _kill(cycle, members[0])
        if cycle.kind == "double":
            time.sleep(0.05)
            last = _kill(cycle, members[1])
        elif cycle.kind == "reset":
            time.sleep(self.rng.uniform(0.1, 1.5))
            others = [pid for pid in job.workers().values() if pid != members[0]]
            if others:
                last = _kill(cycle, self.rng.choice(others))
        elif cycle.kind == "sigint":
            time.sleep(self.rng.uniform(0.0, 2.0))
            cycle.sigint_exit_s = _interrupt(job)
            cycle.timed_out = _gloo_timed_out(job, first)
            self.save(job)
            return self.start()
        recovered = threading.Event()
        if self.diagnose:
            report = self.workdir / f"{self.state}-stall-{len(self.cycles)}.txt"
            watchdog = threading.Timer(
                DIAGNOSE_AFTER_SECONDS, lambda: recovered.is_set() or _diagnose(job, report)
            )
            watchdog.daemon = True
            watchdog.start()
        try:
            _, step = job.wait_recovered(after=last)
            cycle.stall_s = step["t"] - last
        except TimeoutError:
            cycle.stall_s = float("inf")
        finally:
            recovered.set()
        cycle.timed_out = _gloo_timed_out(job, first)
        cycle.waited_for_hosts = _left_too_few_hosts(job, first)
        return job


def _kill(cycle: Cycle, pid: int) -> float:
    """SIGKILL ``pid``, recorded in ``cycle``; the time of the kill."""
    at = time.time()
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    cycle.killed.append((at, pid))
    cycle.kills = len(cycle.killed)
    return at


def _step_seconds(job: Job) -> float:
    """Rank 0's recent time between steps (at least 50 ms)."""
    steps = [e["t"] for e in job.events() if e["event"] == "step"][-6:]
    if len(steps) < 2:
        return 0.3
    return max(0.05, (steps[-1] - steps[0]) / (len(steps) - 1))


def _gloo_timed_out(job: Job, since: float) -> bool:
    return any(t >= since and GLOO_TIMED_OUT.search(line) for t, line in job.lines)


def _left_too_few_hosts(job: Job, since: float) -> bool:
    """Whether spotring's progress lines since ``since`` show fewer than MIN_NP ready
    slots: the ring could not re-form until replacements arrived."""
    for t, line in job.lines:
        found = READY.search(line) if t >= since else None
        if found is not None:
            hosts = [h for h in found.group(1).split(", ") if h != "none"]
            if sum(int(h.rsplit(":", 1)[1]) for h in hosts) < MIN_NP:
                return True
    return False


def _interrupt(job: Job) -> float:
    """Ctrl-C to the driver's process group; seconds until it exited (inf if it did not
    within the bound, after which it is killed)."""
    sent = time.monotonic()
    os.killpg(job.process.pid, signal.SIGINT)
    try:
        job.process.wait(timeout=SIGINT_BOUND_SECONDS)
        return time.monotonic() - sent
    except subprocess.TimeoutExpired:
        _dump_stacks(job.process.pid)
        job.stop()
        return float("inf")


def _diagnose(job: Job, out: Path) -> None:
    """A stalled ring: every socket, and every process's Python stacks and the kernel's
    word on each of its threads (state and wait channel). Nothing here stops a process
    (py-spy without pausing, no gdb): a tool that stops the driver or a worker while it
    reads it makes the very stall it looks at (seen: gdb on the driver held the ring
    51 s)."""
    parts = []
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        ss = subprocess.run(["ss", "-tanp"], capture_output=True, text=True, timeout=30)
        parts.append(ss.stdout)
    for pid in [job.process.pid, *job.workers().values()]:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            dump = subprocess.run(
                [str(BIN / "py-spy"), "dump", "--nonblocking", "--pid", str(pid)],
                capture_output=True, text=True, timeout=60,
            )  # fmt: skip
            parts.append(f"== {pid}\n{dump.stdout}{dump.stderr}")
        parts.append(f"== {pid} (threads)\n" + _thread_states(pid))
    out.write_text("\n".join(parts))


def _thread_states(pid: int) -> str:
    """Each thread of ``pid``: its name, state (R running, S sleeping, D in I/O, T
    stopped) and the kernel function it waits in, read from /proc."""
    lines = []
    with contextlib.suppress(OSError):
        for task in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
            with contextlib.suppress(OSError):
                stat = Path(f"/proc/{pid}/task/{task}/stat").read_text()
                name = stat[stat.index("(") + 1 : stat.rindex(")")]
                state = stat[stat.rindex(")") + 2]
                wchan = Path(f"/proc/{pid}/task/{task}/wchan").read_text() or "-"
                lines.append(f"{task} {name} {state} {wchan}")
    return "\n".join(lines)


def _dump_stacks(pid: int) -> None:
    """Where a driver that ignored Ctrl-C is stuck (py-spy, when installed)."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            [str(BIN / "py-spy"), "dump", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=30,
        )
        print(f"driver {pid} did not stop on Ctrl-C:\n{out.stdout}{out.stderr}", flush=True)


def measure(
    quick: bool = False, kills: int | None = None, seed: int = 0, diagnose: bool = False
) -> list[Row]:
    """Rows for bench/run: Gloo-timeout survivors in the schedule's kills, the stalls,
    and Ctrl-C during a reset."""
    total = kills or (20 if quick else 200)
    rng = random.Random(seed)
    cycles: list[Cycle] = []
    workdir = Path(tempfile.mkdtemp(prefix="spotring-kills-"))
    for state in ("spotring", "horovod"):
        loop = Loop(state, random.Random(rng.random()), workdir, diagnose)
        loop.run(total // 2)
        cycles += loop.cycles
    (workdir / "cycles.json").write_text(json.dumps([vars(c) for c in cycles], indent=1))
    slow = [
        c
        for c in cycles
        if not c.waited_for_hosts and c.stall_s is not None and c.stall_s > SLOW_CYCLE_SECONDS
    ]
    if any(c.timed_out for c in cycles) or (diagnose and slow):
        print(f"a cycle stalled: the jobs' logs are kept in {workdir}", flush=True)
    else:
        shutil.rmtree(workdir, ignore_errors=True)
    killed = sum(c.kills for c in cycles)
    timed_out = [c for c in cycles if c.timed_out]
    stalls = [c.stall_s for c in cycles if c.stall_s is not None and not c.waited_for_hosts]
    finite = [s for s in stalls if s != float("inf")] or [float("nan")]
    waited = [round(c.stall_s, 2) for c in cycles if c.waited_for_hosts and c.stall_s]
    by_kind = {k: sum(c.kills for c in cycles if c.kind == k) for k in dict.fromkeys(KINDS)}
    setup = {
        "kills": killed,
        "cycles by kind (kills)": by_kind,
        "tensor MiB allreduced per step": TENSOR_MB,
        "timed-out cycles": [(c.kind, c.state, c.job, c.killed, c.stall_s) for c in timed_out],
        "cycles that left fewer than --min-np hosts (stall s, apart)": waited,
    }
    rows = [
        row("hard kills whose survivors waited out Gloo's timeout", "kills", len(timed_out),
            ANCHOR, killed, "== 0", setup),
    ]  # fmt: skip
    for label, q in (("p50", 0.5), ("p95", 0.95), ("max", 1.0)):
        rows.append(
            row("randomized hard kills, 4 local workers, >= min-np left",
                f"{label} s stall (last kill -> step)",
                _percentile(finite, q), "Gloo timeout", GLOO_TIMEOUT_SECONDS,
                "", {"stalls s": sorted(round(s, 2) for s in stalls)})
        )  # fmt: skip
    exits = [c.sigint_exit_s for c in cycles if c.sigint_exit_s is not None]
    if exits:
        rows.append(
            row("Ctrl-C at a random point of a reset", "max s to exit", max(exits),
                "bound", SIGINT_BOUND_SECONDS, f"<= {SIGINT_BOUND_SECONDS:g} s",
                {"exits s": [round(s, 2) for s in exits]})
        )  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--kills", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--diagnose", action="store_true", help="see the module docstring")
    args = parser.parse_args()
    # Started in the background by a shell, this process (and so every driver it
    # starts) may have SIGINT ignored: the drivers would never see the Ctrl-C it sends.
    # A handled signal is back to its default in a child after exec.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    rows = measure(args.quick, args.kills, args.seed, args.diagnose)
    print(format_table(rows))
    print(json.dumps(rows[0]["extra"]), flush=True)


if __name__ == "__main__":
    main()
