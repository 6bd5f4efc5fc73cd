"""The torchrun anchor beside the torch backend's in-place mode, on one small CPU workload.

Both rows run the same model and data on 4 local Gloo workers (examples/
torch_ddp_checkpoint.py under torchrun; examples/torch_inplace.py under a
:class:`~spotring.torch.coordinator.StorePublisher` that plays the driver), SIGKILL
one worker once rank 0 has finished step :data:`KILL_AT_STEP`, and measure:

- *kill -> next step*: from the kill to the end of the first step after it (rank 0);
- *steps lost*: steps done before the kill that were done again after it.

Rows:

- ``torchrun``: ``torchrun --standalone --nproc-per-node 4 --max-restarts 3`` as a user
  runs it, its script saving a checkpoint every ``--every`` steps. On torch 2.13 its
  restart never forms a group (docs/torch.md says why): the row says so;
- ``torchrun, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``: the same with the agent's shared
  store turned off, which makes its restart work: the anchor's figure;
- ``spotring run --backend torch``: the restart mode on the same unchanged script, 4
  local hosts of one slot (a fresh store port per attempt: it does not share torchrun's
  stale keys), its workers started ahead; and with ``--cold-start`` (each attempt starts
  fresh interpreters, as torchrun does);
- ``in place``: the survivors re-form at 3 workers, committing every step. The driver's
  reaction (publishing the next generation) is immediate here: the figure is the
  workers' side only.

    python -m bench.torch_anchor [--runs 3] [--every 10]

Not run by CI: each torchrun run restarts 4 interpreters (tens of seconds on 2 cores).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import psutil
import torch.distributed as dist

from spotring.torch.coordinator import StorePublisher

REPO = Path(__file__).resolve().parents[1]
WORKERS = 4
KILL_AT_STEP = 35
STEPS = 60
RUN_BOUND_SECONDS = 180.0


@dataclass(frozen=True)
class Outcome:
    """One run: kill -> next step in seconds (None: never stepped again), steps lost."""

    recovery: float | None
    lost: int | None


def _lines(path: Path) -> list[tuple[int, int, float]]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 3:
            rows.append((int(parts[0]), int(parts[1]), float(parts[2])))
    return rows


def torchrun_once(every: int, share_store: bool) -> Outcome:
    """One torchrun run with a kill (see the module)."""
    with tempfile.TemporaryDirectory(prefix="torch-anchor-") as folder:
        ckpt = Path(folder)
        env = dict(os.environ)
        if not share_store:
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        command = [
            str(Path(sys.executable).with_name("torchrun")), "--standalone",
            "--nproc-per-node", str(WORKERS), "--max-restarts", "3",
            str(REPO / "examples" / "torch_ddp_checkpoint.py"), "--checkpoint", str(ckpt),
            "--steps", str(STEPS), "--every", str(every),
        ]  # fmt: skip
        with open(ckpt / "torchrun.log", "wb") as log:
            agent = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
            try:
                kill_time = _kill_worker_at(agent, ckpt / "steps.0", KILL_AT_STEP)
                agent.wait(timeout=RUN_BOUND_SECONDS)
            except subprocess.TimeoutExpired:
                pass  # a restart that hangs did not recover; its steps tell the rest
            finally:
                if agent.poll() is None:
                    agent.kill()
                    agent.wait()
        return _outcome(_lines(ckpt / "steps.0"), kill_time)


def spotring_restart_once(every: int, cold: bool = False) -> Outcome:
    """One ``spotring run --backend torch`` run (restart mode) with a kill: 4 local
    hosts of one slot each; the killed worker's host is replaced by one that never
    boots (``--boot-seconds 3600``), so the job restarts once, at 3 workers. ``cold``:
    with ``--cold-start`` (no worker started ahead: each attempt pays ``import torch``)."""
    with tempfile.TemporaryDirectory(prefix="torch-anchor-") as folder:
        ckpt = Path(folder)
        command = [
            str(Path(sys.executable).with_name("spotring")), "run", "--provider", "local",
            "--backend", "torch", *(["--cold-start"] if cold else []),
            "-np", str(WORKERS), "--min-np", str(WORKERS - 1),
            "--hosts", str(WORKERS), "--slots-per-host", "1", "--boot-seconds", "3600",
            "--refresh-interval", "0.5", "--",
            sys.executable, str(REPO / "examples" / "torch_ddp_checkpoint.py"),
            "--checkpoint", str(ckpt), "--steps", str(STEPS), "--every", str(every),
        ]  # fmt: skip
        with open(ckpt / "spotring.log", "wb") as log:
            job = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
            try:
                kill_time = _kill_worker_at(job, ckpt / "steps.0", KILL_AT_STEP)
                job.wait(timeout=RUN_BOUND_SECONDS)
            except subprocess.TimeoutExpired:
                pass
            finally:
                if job.poll() is None:
                    job.kill()
                    job.wait()
        return _outcome(_lines(ckpt / "steps.0"), kill_time)


def _outcome(rows: list[tuple[int, int, float]], kill_time: float) -> Outcome:
    """Rank 0's first step after the kill (restart count > 0), and the steps lost."""
    before = max(step for restart, step, t in rows if t <= kill_time)
    after = [(step, t) for restart, step, t in rows if restart > 0]
    if not after:
        return Outcome(None, None)
    first_step, first_time = min(after, key=lambda row: row[1])
    return Outcome(first_time - kill_time, before - (first_step - 1))


def _kill_worker_at(agent: subprocess.Popen[bytes], progress: Path, step: int) -> float:
    """SIGKILL rank 1's worker once rank 0 has logged ``step``; the kill's time. Rank 1
    is the process that holds ``steps.1`` open: a worker started ahead got ``RANK`` after
    its start, which its ``/proc/PID/environ`` does not show."""
    deadline = time.monotonic() + RUN_BOUND_SECONDS
    while not any(s >= step for _, s, _ in _lines(progress)):
        if agent.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"torchrun ended before step {step}")
        time.sleep(0.01)  # polling a file the workers append to: progress, not a trigger
    rank_1 = str(progress.with_name("steps.1"))
    for child in psutil.Process(agent.pid).children(recursive=True):
        with contextlib.suppress(psutil.Error):  # one that ended meanwhile
            if any(f.path == rank_1 for f in child.open_files()):
                kill_time = time.time()
                child.send_signal(signal.SIGKILL)
                return kill_time
    raise RuntimeError("no worker of rank 1")


def inplace_once() -> Outcome:
    """One in-place run with a kill (see the module)."""
    store = dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=60), wait_for_workers=False)
    report = dist.PrefixStore("example/", store)
    publisher = StorePublisher(store, "127.0.0.1", store.port)
    names = [f"w{i}" for i in range(WORKERS)]
    workers = {name: _start_inplace_worker(store.port, name) for name in names}
    try:
        publisher.publish(names)
        report.wait([f"stepped/{KILL_AT_STEP}"], timedelta(seconds=RUN_BOUND_SECONDS))
        kill_time = time.time()
        workers["w1"].send_signal(signal.SIGKILL)
        workers["w1"].wait()
        # Read before the next generation is published: no survivor can step until then.
        done_before = max(b for b in range(1, STEPS + 1) if report.check([f"stepped/{b}"]))
        survivors = [n for n in names if n != "w1"]
        publisher.publish(survivors)
        if not _wait(report, f"start/1/{survivors[0]}"):
            return Outcome(None, None)
        start = int(report.get(f"start/1/{survivors[0]}").split()[0])
        _wait(report, f"stepped/{start + 1}")
        generation, stepped = report.get(f"stepped/{start + 1}").decode().split()
        assert generation == "1"
        return Outcome(float(stepped) - kill_time, done_before - start)
    finally:
        for process in workers.values():
            if process.poll() is None:
                process.kill()
            process.wait()


def _start_inplace_worker(port: int, name: str) -> subprocess.Popen[bytes]:
    command = [
        sys.executable, str(REPO / "examples" / "torch_inplace.py"),
        "--store", f"127.0.0.1:{port}", "--worker-id", name, "--ddp", "--steps", str(STEPS),
    ]  # fmt: skip
    return subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


def _wait(store: dist.Store, key: str) -> bool:
    try:
        store.wait([key], timedelta(seconds=RUN_BOUND_SECONDS))
    except dist.DistStoreError:
        return False
    return True


def _row(name: str, outcomes: list[Outcome]) -> tuple[str, float | None, str]:
    recovered = [o for o in outcomes if o.recovery is not None]
    if not recovered:
        return name, None, f"did not recover in {len(outcomes)} of {len(outcomes)} runs"
    p50 = statistics.median(o.recovery for o in recovered if o.recovery is not None)
    lost = statistics.median(o.lost for o in recovered if o.lost is not None)
    failed = len(outcomes) - len(recovered)
    note = f"lost {lost:g} steps (median)" + (f"; {failed} runs did not recover" if failed else "")
    return name, p50, note


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="kills per row")
    parser.add_argument("--every", type=int, default=10, help="torchrun's checkpoint every K steps")
    args = parser.parse_args(argv)
    rows = [
        _row("torchrun --standalone", [torchrun_once(args.every, True) for _ in range(args.runs)]),
        _row(
            "torchrun, TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1",
            [torchrun_once(args.every, False) for _ in range(args.runs)],
        ),
        _row(
            "spotring run --backend torch (restart mode)",
            [spotring_restart_once(args.every) for _ in range(args.runs)],
        ),
        _row(
            "restart mode, --cold-start",
            [spotring_restart_once(args.every, cold=True) for _ in range(args.runs)],
        ),
        _row("in place (spotring.torch.inplace)", [inplace_once() for _ in range(args.runs)]),
    ]
    ours = rows[-1][1]
    print(f"{WORKERS} workers, kill at step {KILL_AT_STEP}, torchrun checkpoint every {args.every}")
    print(f"{'row':<48} {'kill -> next step':>18} {'x in place':>11}  notes")
    for name, p50, note in rows:
        shown = "-" if p50 is None else f"{p50:.3f} s"
        ratio = "-" if p50 is None or not ours else f"{p50 / ours:.1f}"
        print(f"{name:<48} {shown:>18} {ratio:>11}  {note}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
