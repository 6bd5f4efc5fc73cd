"""The torch backend's in-place mode, measured through ``spotring run``, beside its anchors.

One long job of ``examples/torch_inplace.py`` (a small DDP model, a commit every step,
:data:`STEP_SECONDS` of sleep per step to stand for compute) under
``spotring run --provider local --backend torch --in-place`` on 4 hosts of one slot,
``--min-np 2``. Its ``--events`` lines (each member's ``start`` in a generation with
the step it starts from; rank 0's ``commit`` after every step) are the clock of
everything below. Measured:

- **hard kills** on a randomized schedule, as in ``bench/kills.py``: SIGKILL to a
  member's worker (rank 0 included) at a random point of a step (``step``), at once
  after a commit (``commit``), two members 50 ms apart (``double``), or one and another
  0.1-1.5 s later while the group re-forms (``reset``). A cycle's stall is its last
  kill -> rank 0's first commit in a generation without the killed workers; its
  committed steps lost are the steps committed before that generation that it starts
  short of. A stall over :data:`TIMEOUT_SECONDS`, or Gloo's or the group store's
  timeout message in the job's output, counts as a survivor that waited out a
  timeout. The local provider replaces each killed host (it boots in 1 s, its worker
  joins warm);
- **join stall**: each generation that grew (a replacement joining): the gap between
  rank 0's last commit before it and its first commit in it;
- **noticed preemption**: ``notice`` in the ``--control`` file (the newest host's
  interruption notice): the steps rolled back by the next generation's members and the
  pause (rank 0's last commit before it -> first in it);
- **formation driver CPU**: N simulated ranks (threads of this process) form one
  generation against a real :class:`GroupServer` in a process of its own, each doing
  what Gloo's rendezvous does through :class:`GroupStore` with the driver's
  environment (``GLOO_ENABLE_RANK_AS_SEQUENCE_NUMBER=1``, ``GLOO_ENABLE_STORE_V2_API=1``):
  set its key (its host name and one address), then multi-get every rank's key (its
  own too) 128 at a time, as ``tcp::Context::createAndConnectAllPairs`` does. The
  server process's CPU seconds for the formation, and the requests sent;
- anchors in the same run: torchrun's restart (``bench/torch_anchor.py``, its store
  sharing turned off so that its restart works) on the same model: kill -> next step
  and steps lost; the Horovod path's hard-kill recovery (``bench/recovery.py``'s
  spotring rows, its own 4-worker workload); torchft 0.2.0 with its Lighthouse on the same
  model (``bench/torchft_anchor.py``, from the scratch venv ``bench/torchft_env.sh`` makes;
  without it its rows say why they were skipped).

    python -m bench.torch_inplace [--quick] [--kills N] [--seed S] [--ranks 64,128] [--output F]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import itertools
import json
import math
import os
import random
import secrets
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench.common import RESULTS, Row, format_extras, format_table, row, write_json
from bench.kills import GLOO_TIMED_OUT
from bench.recovery import BIN, REPO, Job, _percentile, run_spotring
from bench.torch_anchor import Outcome, torchrun_once
from bench.torchft_anchor import bench_rows as torchft_rows
from spotring.torch.driver_coordinator import DriverClient, GroupStore

WORKERS = 4
MIN_NP = 2
STEP_SECONDS = 0.05
TIMEOUT_SECONDS = 10.0
"""A recovery slower than this counts as one that waited out a timeout."""
CYCLE_TIMEOUT = 120.0
KINDS = ("step", "step", "commit", "double", "reset")
"""The schedule's mix: most kills at a random point of a step."""
GLOO_CHUNK = 128
"""Keys Gloo's TCP transport multi-gets at a time (``kDefaultBatchSize``,
gloo/transport/tcp/context.cc)."""
VALUE_BYTES = 60
"""About the rendezvous value of one rank with rank-as-sequence-number: a host name
and one address."""
STORE_TIMED_OUT = "timed out waiting for"
"""What GroupStore's wait that ran out says (torch_state/driver_coordinator.py)."""
STALL_TARGET = "<= 0.3 s"
ANCHOR = "torchrun restart (kill -> next step)"
HOROVOD_ANCHOR = "spotring run, Horovod path (bench/recovery.py)"
ANCHOR_EVERY = 10
"""torchrun's script saves a checkpoint every this many steps."""
FORMATION_TARGET_S = 2.0

Event = dict[str, Any]


# ------------------------------------------------------------------ the job


class InplaceJob:
    """A running ``spotring run --backend torch --in-place`` job and its events, read
    as they are appended (a long job writes tens of thousands of lines: each poll
    parses only the new ones, to leave the 2 cores to the job)."""

    def __init__(self, workdir: Path) -> None:
        self.events_file = workdir / "work.jsonl"
        self.control = workdir / "control"
        argv = [
            str(BIN / "spotring"), "--log-level", "info", "run", "--provider", "local",
            "--backend", "torch", "--in-place",
            "-np", str(WORKERS), "--min-np", str(MIN_NP), "--max-np", str(WORKERS),
            "--hosts", str(WORKERS), "--refresh-interval", "0.5", "--boot-seconds", "1",
            "--control", str(self.control),
            "--", sys.executable, str(REPO / "examples" / "torch_inplace.py"), "--ddp",
            "--steps", "100000000", "--step-seconds", str(STEP_SECONDS),
            "--events", str(self.events_file),
        ]  # fmt: skip
        self.job = Job(argv, self.events_file, dict(os.environ))
        self.starts: dict[int, list[Event]] = {}
        """Each generation's members' start events."""
        self.commits: list[Event] = []
        """Rank 0's commits, in order."""
        self._commits_in: collections.Counter[int] = collections.Counter()
        self._offset = 0

    def refresh(self) -> None:
        """Take the whole lines appended since the last call."""
        try:
            with self.events_file.open("rb") as stream:
                stream.seek(self._offset)
                data = stream.read()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1
        self._offset += end
        for line in data[:end].splitlines():
            with contextlib.suppress(ValueError):  # two writers' lines run together
                self._take(json.loads(line))

    def _take(self, event: Event) -> None:
        if event["event"] == "start":
            self.starts.setdefault(event["generation"], []).append(event)
        elif event["event"] == "commit":
            self.commits.append(event)
            self._commits_in[event["generation"]] += 1

    def commits_in(self, generation: int) -> int:
        return self._commits_in[generation]

    def latest_generation(self) -> tuple[int, list[Event]]:
        """The newest generation whose members all started, and their start events."""
        for generation in sorted(self.starts, reverse=True):
            members = self.starts[generation]
            if len(members) == members[0]["size"]:
                return generation, members
        return -1, []

    def wait(self, done: Callable[[], bool], what: str) -> None:
        """Until ``done()`` holds, polling the events (progress, not the clock)."""
        deadline = time.monotonic() + CYCLE_TIMEOUT
        while time.monotonic() < deadline:
            self.refresh()
            if done():
                return
            if self.job.process.poll() is not None:
                raise RuntimeError(f"the job ended before {what}:\n{self._tail()}")
            time.sleep(0.01)
        raise TimeoutError(f"no {what} in {CYCLE_TIMEOUT:g} s:\n{self._tail()}")

    def wait_steady(self, size: int, commits: int = 3) -> tuple[int, list[Event]]:
        """Until the newest generation has ``size`` members or more, all started, and
        rank 0 committed ``commits`` steps in it; that generation."""

        def done() -> bool:
            generation, members = self.latest_generation()
            return len(members) >= size and self.commits_in(generation) >= commits

        self.wait(done, f"a generation of {size}+ committing")
        return self.latest_generation()

    def pause_into(self, generation: int) -> tuple[float, float] | None:
        """Rank 0's last commit before ``generation`` and its first commit in it (the
        times); None before both are there."""
        before = [e["time"] for e in self.commits if e["generation"] < generation]
        inside = [e["time"] for e in self.commits if e["generation"] == generation]
        return (max(before), min(inside)) if before and inside else None

    def committed_before(self, generation: int) -> int:
        """The last step committed in the generations before ``generation``."""
        return max((e["step"] for e in self.commits if e["generation"] < generation), default=0)

    def output_since(self, since: float) -> list[str]:
        return [line for t, line in self.job.lines if t >= since]

    def stop(self) -> None:
        self.job.stop()

    def _tail(self) -> str:
        return "\n".join(line for _, line in self.job.lines[-40:])


# ------------------------------------------------------------------ kills


@dataclass
class Cycle:
    kind: str
    killed: list[tuple[float, int]] = field(default_factory=list)
    """(time, pid) of each kill."""
    stall_s: float = math.inf
    lost: int | None = None
    rolled_back: int | None = None
    timed_out: bool = False


def kill_cycle(job: InplaceJob, rng: random.Random, kind: str) -> Cycle:
    """One cycle of the schedule (see the module), measured once rank 0 commits in a
    generation without the killed workers."""
    generation, members = job.wait_steady(WORKERS if kind in ("double", "reset") else MIN_NP + 1)
    pids = [m["pid"] for m in members]
    rng.shuffle(pids)
    cycle = Cycle(kind)
    if kind == "commit":
        seen = job.commits_in(generation)
        job.wait(lambda: job.commits_in(generation) > seen, "a commit")
    else:
        time.sleep(rng.uniform(0.0, STEP_SECONDS))  # a random point of the step
    _kill(cycle, pids[0])
    if kind == "double":
        time.sleep(0.05)
        _kill(cycle, pids[1])
    elif kind == "reset":
        time.sleep(rng.uniform(0.1, 1.5))
        _kill(cycle, pids[1])
    victims = {pid for _, pid in cycle.killed}
    last_kill = cycle.killed[-1][0]
    try:
        job.wait(lambda: _recovery(job, victims, last_kill) is not None, "a commit after a kill")
    except TimeoutError:
        cycle.timed_out = True
        return cycle
    commit = _recovery(job, victims, last_kill)
    assert commit is not None
    cycle.stall_s = commit["time"] - last_kill
    starts = job.starts[commit["generation"]]
    cycle.lost = max(0, job.committed_before(commit["generation"]) - starts[0]["step"])
    cycle.rolled_back = max(s["rolled_back"] for s in starts)
    cycle.timed_out = cycle.stall_s > TIMEOUT_SECONDS or any(
        GLOO_TIMED_OUT.search(line) or STORE_TIMED_OUT in line
        for line in job.output_since(cycle.killed[0][0])
    )
    return cycle


def _kill(cycle: Cycle, pid: int) -> None:
    cycle.killed.append((time.time(), pid))
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def _recovery(job: InplaceJob, victims: set[int], after: float) -> Event | None:
    """Rank 0's first commit after ``after`` in a generation none of ``victims`` is in."""
    with_victims = {
        g for g, members in job.starts.items() if any(m["pid"] in victims for m in members)
    }
    found = None
    for commit in reversed(job.commits):
        if commit["time"] <= after:
            break
        if commit["generation"] not in with_victims:
            found = commit
    return found


# ------------------------------------------------------------------ joins, notices


def join_stalls(job: InplaceJob, kills: list[float]) -> list[float]:
    """The gap into each generation that grew (a host joined), but for those with a
    kill between rank 0's last commit before it and its first in it."""
    stalls = []
    generations = sorted(g for g, m in job.starts.items() if len(m) == m[0]["size"])
    for before, generation in itertools.pairwise(generations):
        pause = job.pause_into(generation)
        grew = job.starts[generation][0]["size"] > job.starts[before][0]["size"]
        if grew and pause and not any(pause[0] <= k <= pause[1] for k in kills):
            stalls.append(pause[1] - pause[0])
    return stalls


@dataclass
class Notice:
    pause_s: float
    rolled_back: int
    lost: int


def notice_cycle(job: InplaceJob) -> Notice:
    """``notice`` (the newest host's interruption) once the group is whole, measured at
    the first generation without that host."""
    generation, _ = job.wait_steady(WORKERS)
    with job.control.open("a") as stream:
        stream.write("notice\n")

    def smaller() -> int | None:
        return next(
            (
                g
                for g, members in sorted(job.starts.items())
                if g > generation
                and members[0]["size"] < WORKERS
                and len(members) == members[0]["size"]
                and job.commits_in(g) > 0
            ),
            None,
        )

    job.wait(lambda: smaller() is not None, "a generation without the noticed host")
    after = smaller()
    assert after is not None
    starts = job.starts[after]
    pause = job.pause_into(after)
    assert pause is not None  # it committed in ``after``
    return Notice(
        pause_s=pause[1] - pause[0],
        rolled_back=max(s["rolled_back"] for s in starts),
        lost=max(0, job.committed_before(after) - starts[0]["step"]),
    )


@dataclass
class JobFigures:
    cycles: list[Cycle]
    notices: list[Notice]
    joins: list[float]
    """Join stalls, s."""
    longest_gap_s: float
    """The longest gap between two of rank 0's commits over the whole job."""
    kept: Path | None
    """Where the job's events and output were kept (a cycle timed out), or None."""


def run_job(kills: int, notices: int, seed: int) -> JobFigures:
    """The kill schedule, then the notices, in one job; and its join stalls. A group
    that does not settle after a cycle (the next one's wait for it runs out) marks that
    cycle timed out; the job's events and output are then kept."""
    rng = random.Random(seed)
    workdir = Path(tempfile.mkdtemp(prefix="spotring-torch-inplace-"))
    job = InplaceJob(workdir)
    cycles: list[Cycle] = []
    found: list[Notice] = []
    try:
        while sum(len(c.killed) for c in cycles) < kills:
            try:
                cycles.append(kill_cycle(job, rng, rng.choice(KINDS)))
            except TimeoutError as error:
                print(f"the group did not settle: {str(error)[:200]}", flush=True)
                if not cycles or cycles[-1].timed_out:
                    break  # twice in a row: the rest would measure nothing
                cycles[-1].timed_out = True
                continue
            if cycles[-1].stall_s == math.inf:
                break  # the job did not recover
        with contextlib.suppress(TimeoutError):
            for _ in range(notices):
                found.append(notice_cycle(job))
        job.refresh()
    finally:
        job.stop()
        (workdir / "job.log").write_text("".join(f"{t:.3f} {line}\n" for t, line in job.job.lines))
    times = [c["time"] for c in job.commits]
    kept = workdir if any(c.timed_out for c in cycles) or len(found) < notices else None
    if kept is None:
        shutil.rmtree(workdir, ignore_errors=True)
    else:
        print(f"a cycle timed out: the job's events and output are kept in {workdir}", flush=True)
    return JobFigures(
        cycles,
        found,
        join_stalls(job, [t for c in cycles for t, _ in c.killed]),
        max((b - a for a, b in itertools.pairwise(times)), default=math.nan),
        kept,
    )


# ------------------------------------------------------------------ formation

_SERVER = """
import sys
from spotring.driver.torch_group_server import GroupServer
key = bytes.fromhex(sys.stdin.readline())
server = GroupServer(key, "127.0.0.1")
server.start()
server.publish([f"r{rank}" for rank in range(int(sys.argv[1]))], "127.0.0.1", abandon=False)
print(server.port, flush=True)
sys.stdin.read()  # until the bench closes it
server.close()
"""


class _CountingClient(DriverClient):
    """The workers' client, counting the requests the store makes (not the retries of
    a refused connection)."""

    def __init__(self, host: str, port: int, job_key: bytes) -> None:
        super().__init__(host, port, job_key)
        self.requests = 0

    def request(
        self, method: str, path: str, body: bytes = b"", *, wait_ms: int = 0
    ) -> tuple[int, bytes]:
        self.requests += 1
        return super().request(method, path, body, wait_ms=wait_ms)


def _rendezvous_value(rank: int) -> bytes:
    return f"host-{rank:05d}\n127.0.0.1:{40000 + rank}".ljust(VALUE_BYTES).encode()


def formation(size: int) -> dict[str, float]:
    """One generation of ``size`` simulated ranks formed against a GroupServer in a
    process of its own (see the module): its CPU seconds, the wall time, the requests."""
    key = secrets.token_bytes(32)
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVER, str(size)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdin is not None and server.stdout is not None
    try:
        server.stdin.write(key.hex() + "\n")
        server.stdin.flush()
        port = int(server.stdout.readline())
        clients = [_CountingClient("127.0.0.1", port, key) for _ in range(size)]
        errors: list[BaseException] = []
        go = threading.Barrier(size + 1)
        every_rank = [str(rank) for rank in range(size)]

        def rank_main(rank: int) -> None:
            store = GroupStore(clients[rank], 0, size)
            go.wait()
            try:
                store.set(
                    str(rank), f"host-{rank:05d}\n127.0.0.1:{40000 + rank}".ljust(VALUE_BYTES)
                )
                for first in range(0, size, GLOO_CHUNK):
                    store.multi_get(every_rank[first : first + GLOO_CHUNK])
            except Exception as error:  # raised again below, from the bench's thread
                errors.append(error)

        default_stack = threading.stack_size(256 << 10)  # a thousand threads
        threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(size)]
        for thread in threads:
            thread.start()
        threading.stack_size(default_stack)
        process = psutil.Process(server.pid)
        cpu = sum(process.cpu_times()[:2])
        go.wait()
        start = time.perf_counter()
        for thread in threads:
            thread.join()
        wall = time.perf_counter() - start
        cpu = sum(process.cpu_times()[:2]) - cpu
        if errors:
            raise RuntimeError(f"{len(errors)} ranks failed to form: {errors[0]!r}")
        return {"cpu_s": cpu, "wall_s": wall, "requests": sum(c.requests for c in clients)}
    finally:
        server.stdin.close()
        server.wait(timeout=30)


# ------------------------------------------------------------------ rows


def _anchor(runs: int) -> tuple[float, float, list[Outcome]]:
    """torchrun's restart on the same model: median kill -> next step and steps lost."""
    outcomes = [torchrun_once(ANCHOR_EVERY, share_store=False) for _ in range(runs)]
    recovered = [o for o in outcomes if o.recovery is not None and o.lost is not None]
    if not recovered:
        return math.nan, math.nan, outcomes
    return (
        statistics.median(o.recovery for o in recovered if o.recovery is not None),
        statistics.median(o.lost for o in recovered if o.lost is not None),
        outcomes,
    )


def _horovod_path(kills: int) -> list[float]:
    """The Horovod path's hard-kill recoveries (bench/recovery.py's spotring rows)."""
    with tempfile.TemporaryDirectory(prefix="spotring-torch-inplace-hvd-") as folder:
        cycles, _ = run_spotring(Path(folder), kills)
    return sorted(c["recovery_s"] for c in cycles)


def measure(
    quick: bool = False,
    kills: int | None = None,
    seed: int = 0,
    ranks: tuple[int, ...] | None = None,
) -> list[Row]:
    """Rows for bench/run (see the module)."""
    total = kills or (30 if quick else 200)
    load = {"load average before (1, 5, 15 min)": [round(x, 2) for x in os.getloadavg()]}
    figures = run_job(total, 3 if quick else 10, seed)
    cycles, notices, joins = figures.cycles, figures.notices, figures.joins
    load["load average after the job"] = [round(x, 2) for x in os.getloadavg()]
    anchor_s, anchor_lost, outcomes = _anchor(1 if quick else 3)
    horovod = _horovod_path(3 if quick else 10)
    sizes = ranks or ((64, 128, 256) if quick else (64, 128, 256, 1024))
    formed = {size: formation(size) for size in sizes}

    killed = sum(len(c.killed) for c in cycles)
    stalls = sorted(c.stall_s for c in cycles)
    setup = {
        "workers": WORKERS, "min-np": MIN_NP, "step sleep s": STEP_SECONDS, **load,
        "kills (by kind)": {k: sum(len(c.killed) for c in cycles if c.kind == k)
                            for k in dict.fromkeys(KINDS)},
        "stalls s": [round(s, 3) for s in stalls],
        "steps rolled back (uncommitted, per cycle)": [c.rolled_back for c in cycles],
        "longest gap between rank 0's commits in the job s": round(figures.longest_gap_s, 2),
        "events and output kept in": str(figures.kept) if figures.kept else None,
        "torchrun runs (kill -> next step s, steps lost)": [
            (o.recovery and round(o.recovery, 2), o.lost) for o in outcomes
        ],
        "torchrun": f"--nproc-per-node {WORKERS}, checkpoint every {ANCHOR_EVERY} steps, "
                    "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (bench/torch_anchor.py)",
    }  # fmt: skip
    kills_name = f"in-place hard kills, spotring run, {WORKERS} local workers"
    rows = []
    for label, q in (("p50", 0.5), ("p95", 0.95), ("max", 1.0)):
        rows.append(
            row(kills_name, f"{label} s kill -> rank 0's next step", _percentile(stalls, q),
                ANCHOR, anchor_s, STALL_TARGET if label == "p95" else "",
                setup if label == "p50" else {})
        )  # fmt: skip
        rows.append(
            row(kills_name, f"{label} s kill -> rank 0's next step", _percentile(stalls, q),
                HOROVOD_ANCHOR, _percentile(horovod, q), "",
                {"Horovod path recoveries s": [round(h, 3) for h in horovod]}
                if label == "p50" else {})
        )  # fmt: skip
    lost = sum(c.lost or 0 for c in cycles) + sum(1 for c in cycles if c.lost is None)
    rows += [
        row(kills_name, "committed steps lost (all kills)", lost,
            "torchrun steps lost per kill", anchor_lost, "== 0"),
        row(kills_name, "kills whose survivors waited out a timeout", sum(
            len(c.killed) for c in cycles if c.timed_out), "kills", killed, "== 0",
            {"timeout": f"a recovery over {TIMEOUT_SECONDS:g} s, or Gloo's timeout message"}),
        row("in-place join (a replacement host)", "max s gap between rank 0's steps",
            max(joins, default=math.nan), ANCHOR + ": a join restarts every worker",
            anchor_s, STALL_TARGET, {"joins": len(joins), "gaps s": [round(j, 3) for j in joins]}),
        row("in-place noticed preemption", "steps rolled back (all notices)",
            sum(n.rolled_back + n.lost for n in notices), "torchrun steps lost per kill",
            anchor_lost, "== 0", {"notices": len(notices)}),
        row("in-place noticed preemption", "max s pause between rank 0's steps",
            max((n.pause_s for n in notices), default=math.nan), ANCHOR, anchor_s, "",
            {"pauses s": [round(n.pause_s, 3) for n in notices]}),
    ]  # fmt: skip
    for size, figures in formed.items():
        rows.append(
            row(f"in-place formation, {size} simulated ranks", "driver CPU s",
                figures["cpu_s"], "target", FORMATION_TARGET_S,
                f"<= {FORMATION_TARGET_S:g} s" if size == max(sizes) else "",
                {"wall s": round(figures["wall_s"], 2), "requests": figures["requests"],
                 "requests per rank": round(figures["requests"] / size, 2),
                 "requests with one get per peer (N^2)": size * size})
        )  # fmt: skip
    rows += torchft_rows(kills_name, _percentile(stalls, 0.5), "in-place join (a replacement host)",
                         max(joins, default=math.nan), 1 if quick else 3)  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--kills", type=int, default=None, help="30 quick, else 200")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ranks", help="formation sizes, e.g. 64,128,256,1024")
    parser.add_argument("--output", type=Path, default=RESULTS / "torch_inplace.json")
    args = parser.parse_args()
    ranks = tuple(int(n) for n in args.ranks.split(",")) if args.ranks else None
    start = time.perf_counter()
    rows = measure(args.quick, args.kills, args.seed, ranks)
    print(format_table(rows))
    print(format_extras(rows))
    took = f"torch_inplace: {time.perf_counter() - start:.1f} s, seed {args.seed}"
    write_json(rows, args.output, [took], quick=args.quick)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
