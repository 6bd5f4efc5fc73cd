"""The torchft anchor: torchft 0.2.0's fault-tolerant DDP on the torch anchors' workload.

The model, data and optimizer of bench/torch_anchor.py (examples/torch_inplace.py's
small MLP, ``batch_of(step, replica)``, SGD with momentum) as :data:`REPLICAS` replica
groups of one CPU worker each, :data:`STEP_SECONDS` of sleep per step, under one
``torchft_lighthouse``: each worker is a ``torchft.Manager`` over a ``ProcessGroupGloo``
(rank 0 of its own group, with its own ``TCPStore``), its optimizer in
``torchft.Optimizer``, its gradients all-reduced by ``torchft.DistributedDataParallel``
(torchft's ``train_ddp.py``, without the data loader) or by ``Manager.allreduce`` per
gradient (:data:`VARIANTS`). Each worker appends ``STEP TIME COMMITTED PARTICIPANTS``
to its progress file after every step. Once replica 0 has committed step
:data:`KILL_AT_STEP` with all replicas, replica 1 is SIGKILLed; then it is started
again (same replica id), and must heal from a survivor. Measured on replica 0:

- *kill -> next step*: from the kill to the end of its first committed step in a
  quorum without the killed replica (steps committed in the old quorum just after the
  kill, whose all-reduce was done before it, do not count);
- *steps lost*: committed steps done again after the kill (torchft never rolls a
  survivor back: a step whose all-reduce failed is not committed and is retried);
- *join stall*: the gap between its last committed step without the restarted replica
  and its first with it, and the restarted replica's start -> first committed step.

torchft is not a project dependency: it runs from the scratch venv that
``bench/torchft_env.sh`` makes (torch==2.13.0, torchft==0.2.0; ``TORCHFT_VENV``
elsewhere than /tmp/torchft-venv); without it each row says why it was skipped.

    bench/torchft_env.sh && python -m bench.torchft_anchor [--runs 3] [--variant N]

The worker side (``worker ...``) runs under that venv's python and imports only torch
and torchft.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.common import Row

VENV = Path(os.environ.get("TORCHFT_VENV", "/tmp/torchft-venv"))
"""The scratch venv bench/torchft_env.sh makes."""
REPLICAS = 4
KILL_AT_STEP = 35
STEP_SECONDS = 0.05
"""Sleep per step standing for compute, as bench/torch_inplace.py's in-place job."""
AFTER_JOIN_STEPS = 5
"""Committed steps of the rejoined replica after which a run ends."""
RUN_BOUND_SECONDS = 120.0
"""The longest wait for one stage of a run (start, recovery, rejoin)."""
LIGHTHOUSE_FLAGS = ["--min_replicas", "2", "--quorum_tick_ms", "100", "--join_timeout_ms", "10000"]
"""As torchft's README starts it (``--min_replicas 1`` there; 2 here so that a lone
worker never trains alone)."""


@dataclass(frozen=True)
class Step:
    """One line of a worker's progress file."""

    step: int
    time: float
    committed: bool
    participants: int


@dataclass(frozen=True)
class Variant:
    """How the replicas all-reduce, and the lighthouse's heartbeat timeout."""

    name: str
    ddp: bool
    heartbeat_ms: int


VARIANTS = (
    Variant("torchft 0.2.0 DDP, heartbeat timeout 5 s", True, 5000),
    Variant("torchft 0.2.0 Manager.allreduce, heartbeat timeout 5 s", False, 5000),
    Variant("torchft 0.2.0 Manager.allreduce, heartbeat timeout 1 s", False, 1000),
)
"""``torchft.DistributedDataParallel`` as torchft's train_ddp.py uses it; the manual
all-reduce (the anchors' non-DDP path) sidesteps its crash (docs/torch.md); the lighthouse
finds a dead replica only once its heartbeats stop for the timeout (default 5,000 ms)."""


@dataclass(frozen=True)
class FtOutcome:
    """One run (see the module); None where it did not get that far."""

    recovery: float | None = None
    lost: int | None = None
    join_stall: float | None = None
    join_seconds: float | None = None
    """The restarted replica's start -> its first committed step."""
    healed_at: int | None = None
    """The restarted replica's first committed step (> 0: it healed from a survivor)."""
    discarded: int | None = None
    """Replica 0's steps not committed between the kill and its recovery (an all-reduce
    that failed: the step is done again)."""
    failure: str | None = None
    """Why the run stopped short: a survivor's last words, or a bound run out."""


def unavailable() -> str | None:
    """Why torchft cannot run here, or None."""
    missing = [p for p in (_python(), _lighthouse()) if not p.exists()]
    if missing:
        return f"torchft venv missing ({missing[0]}): run bench/torchft_env.sh"
    return None


def _python() -> Path:
    return VENV / "bin" / "python"


def _lighthouse() -> Path:
    return VENV / "bin" / "torchft_lighthouse"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _steps(path: Path) -> list[Step]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 4:
            rows.append(Step(int(parts[0]), float(parts[1]), parts[2] == "1", int(parts[3])))
    return rows


class _Run:
    """A lighthouse and its replicas, their output in ``folder``."""

    def __init__(self, folder: Path, variant: Variant) -> None:
        self.folder = folder
        self.ddp = variant.ddp
        self.lighthouse_addr = f"http://127.0.0.1:{_free_port()}"
        self.processes: list[subprocess.Popen[bytes]] = []
        self.incarnations: dict[int, int] = {}
        self.lighthouse = self._spawn(
            [str(_lighthouse()), "--bind", self.lighthouse_addr.removeprefix("http://"),
             "--heartbeat_timeout_ms", str(variant.heartbeat_ms), *LIGHTHOUSE_FLAGS],
            "lighthouse",
        )  # fmt: skip
        self.replicas = {r: self.start(r) for r in range(REPLICAS)}

    def _spawn(self, argv: list[str], name: str) -> subprocess.Popen[bytes]:
        with open(self.folder / f"{name}.log", "ab") as out:
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        self.processes.append(process)
        return process

    def start(self, replica: int) -> subprocess.Popen[bytes]:
        """Start ``replica``'s worker (again: a new incarnation, its own progress file)."""
        self.incarnations[replica] = self.incarnations.get(replica, -1) + 1
        argv = [
            str(_python()), __file__, "worker", "--replica", str(replica),
            "--lighthouse", self.lighthouse_addr, "--progress", str(self.progress(replica)),
            *(["--ddp"] if self.ddp else []),
        ]  # fmt: skip
        return self._spawn(argv, f"replica{replica}")

    def progress(self, replica: int) -> Path:
        """The progress file of ``replica``'s latest incarnation."""
        return self.folder / f"steps.{replica}.{self.incarnations[replica]}"

    def last_words(self, name: str) -> str:
        """Where a process's log says it failed: its last source line and last line."""
        lines = (self.folder / f"{name}.log").read_text(errors="replace").splitlines()
        where = [line.strip() for line in lines if line.strip().startswith('File "')]
        return f"{name} exited: {lines[-1] if lines else '(no output)'}" + (
            f" ({where[-1]})" if where else ""
        )

    def wait_for(self, replica: int, done: Callable[[list[Step]], bool], what: str) -> list[Step]:
        """Poll ``replica``'s progress until ``done(steps)`` (progress, not the clock)."""
        deadline = time.monotonic() + RUN_BOUND_SECONDS
        while time.monotonic() < deadline:
            steps = _steps(self.progress(replica))
            if done(steps):
                return steps
            self.check_survivors(what)
            time.sleep(0.01)
        raise TimeoutError(f"no {what} in {RUN_BOUND_SECONDS:g} s")

    def check_survivors(self, what: str) -> None:
        """Raise if the lighthouse or a replica that was not killed has ended."""
        survivors = {f"replica{r}": p for r, p in self.replicas.items() if r != 1}
        for name, process in {"lighthouse": self.lighthouse, **survivors}.items():
            if process.poll() is not None:
                raise RuntimeError(f"before {what}: {self.last_words(name)}")

    def stop(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait()


def once(variant: Variant) -> FtOutcome:
    """One run with a kill and a rejoin (see the module)."""
    with tempfile.TemporaryDirectory(prefix="torchft-anchor-") as folder:
        run = _Run(Path(folder), variant)
        try:
            return _measure(run)
        except (RuntimeError, TimeoutError) as error:
            return FtOutcome(failure=str(error))
        finally:
            run.stop()


def _committed(steps: list[Step]) -> list[Step]:
    return [s for s in steps if s.committed]


def _measure(run: _Run) -> FtOutcome:
    run.wait_for(
        0,
        lambda steps: any(s.step >= KILL_AT_STEP and s.participants == REPLICAS for s in steps),
        f"step {KILL_AT_STEP} with {REPLICAS} replicas",
    )
    kill_time = time.time()
    run.replicas[1].send_signal(signal.SIGKILL)
    run.replicas[1].wait()

    def recovered(steps: list[Step]) -> bool:
        return any(s.time > kill_time and s.participants < REPLICAS for s in _committed(steps))

    every = run.wait_for(0, recovered, "a step without the killed replica")
    steps = _committed(every)
    before = max(s.step for s in steps if s.time <= kill_time)
    first = next(s for s in steps if s.time > kill_time and s.participants < REPLICAS)
    discarded = sum(1 for s in every if kill_time < s.time < first.time and not s.committed)
    restart_time = time.time()
    run.replicas[1] = run.start(1)
    joined = _committed(
        run.wait_for(1, lambda s: len(_committed(s)) >= AFTER_JOIN_STEPS, "the rejoin")
    )

    def rejoined(steps: list[Step]) -> bool:
        return any(s.time > first.time and s.participants == REPLICAS for s in _committed(steps))

    steps = _committed(run.wait_for(0, rejoined, "a step with the restarted replica"))
    at = next(i for i, s in enumerate(steps) if s.time > first.time and s.participants == REPLICAS)
    run.check_survivors("the end of the run")
    return FtOutcome(
        recovery=first.time - kill_time,
        lost=before - (first.step - 1),
        join_stall=steps[at].time - steps[at - 1].time,
        join_seconds=joined[0].time - restart_time,
        healed_at=joined[0].step,
        discarded=discarded,
    )


def measure(runs: int) -> dict[Variant, list[FtOutcome] | str]:
    """Each variant's runs, or why none ran."""
    why = unavailable()
    return {v: why if why else [once(v) for _ in range(runs)] for v in VARIANTS}


def _median(outcomes: list[FtOutcome], field: str) -> float:
    values = [getattr(o, field) for o in outcomes if getattr(o, field) is not None]
    return round(statistics.median(values), 3) if values else math.nan


def summary(outcomes: list[FtOutcome] | str) -> dict[str, Any]:
    """Medians over the runs that got that far, and how the others failed."""
    if isinstance(outcomes, str):
        return {"skipped": outcomes}
    failures = [o.failure for o in outcomes if o.failure]
    return {
        "kill -> next step s": _median(outcomes, "recovery"),
        "steps lost": _median(outcomes, "lost"),
        "join stall s": _median(outcomes, "join_stall"),
        "restart -> first step s": _median(outcomes, "join_seconds"),
        "healed at step": _median(outcomes, "healed_at"),
        "steps discarded after the kill": _median(outcomes, "discarded"),
        "runs": len(outcomes),
        "runs that failed": len(failures),
        **({"failures": sorted(set(failures))} if failures else {}),
    }


def bench_rows(
    kills_name: str, kill_p50: float, join_name: str, join_max: float, runs: int
) -> list[Row]:
    """bench/torch_inplace.py's rows beside the torchft anchors: the in-place mode's p50
    kill -> next step and max join stall, against each variant's median."""
    from bench.common import row  # here: the worker side runs without the bench package

    rows = []
    for variant, outcomes in measure(runs).items():
        figures = summary(outcomes)
        rows += [
            row(kills_name, "p50 s kill -> rank 0's next step", kill_p50, variant.name,
                figures.get("kill -> next step s", math.nan), "", figures),
            row(join_name, "max s gap between rank 0's steps", join_max,
                f"{variant.name}: join stall", figures.get("join stall s", math.nan)),
        ]  # fmt: skip
    return rows


# ------------------------------------------------------------------ the worker


def worker(argv: list[str]) -> int:
    """One replica group of one worker (torchft's train_ddp.py on the anchors' model)."""
    parser = argparse.ArgumentParser(prog="torchft_anchor worker")
    parser.add_argument("--replica", type=int, required=True)
    parser.add_argument("--lighthouse", required=True)
    parser.add_argument("--progress", type=Path, required=True)
    parser.add_argument("--step-seconds", type=float, default=STEP_SECONDS)
    parser.add_argument("--ddp", action="store_true", help="torchft.DistributedDataParallel")
    args = parser.parse_args(argv)
    from datetime import timedelta

    import torch
    import torch.distributed as dist
    from torchft import DistributedDataParallel, Manager, Optimizer, ProcessGroupGloo  # type: ignore[import-not-found]

    # The group's own store (torchrun's agent hosts it in train_ddp.py).
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    inner = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def load_state_dict(state: dict[str, object]) -> None:
        model.load_state_dict(state["model"])  # type: ignore[arg-type]
        inner.load_state_dict(state["optim"])  # type: ignore[arg-type]

    manager = Manager(
        pg=ProcessGroupGloo(timeout=timedelta(seconds=5)),  # as train_ddp.py on CPU
        load_state_dict=load_state_dict,
        state_dict=lambda: {"model": model.state_dict(), "optim": inner.state_dict()},
        min_replica_size=2,
        rank=0,
        world_size=1,
        store_addr="127.0.0.1",
        store_port=store.port,
        lighthouse_addr=args.lighthouse,
        replica_id=f"anchor_{args.replica}",
        hostname="127.0.0.1",
        timeout=timedelta(seconds=30),
    )
    net = DistributedDataParallel(manager, model) if args.ddp else model
    optimizer = Optimizer(manager, inner)
    parent = os.getppid()
    with open(args.progress, "a", buffering=1) as progress:
        while os.getppid() == parent:  # until stopped, or orphaned
            step = manager.current_step()
            x = torch.randn(
                32, 64, generator=torch.Generator().manual_seed(step * 1000 + args.replica)
            )
            optimizer.zero_grad()  # starts the quorum
            torch.nn.functional.mse_loss(net(x), x.sum(dim=1, keepdim=True)).backward()
            if not args.ddp:
                for p in model.parameters():
                    # A failed all-reduce is reported to the manager: no commit.
                    manager.allreduce(p.grad).wait()
            optimizer.step()  # commits only if every all-reduce of the step succeeded
            time.sleep(args.step_seconds)
            done = manager.current_step()
            progress.write(
                f"{done} {time.time()} {int(done > step)} {manager.num_participants()}\n"
            )
    os._exit(0)  # at once, without tearing down torchft's threads and servers


# ------------------------------------------------------------------ main


def main(argv: list[str]) -> int:
    if argv[:1] == ["worker"]:
        return worker(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="kills per variant")
    parser.add_argument(
        "--variant", type=int, action="append", choices=range(len(VARIANTS)),
        help="only these (0: DDP, 1: Manager.allreduce, 2: the same with a 1 s heartbeat timeout)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    variants = [VARIANTS[i] for i in args.variant] if args.variant else VARIANTS
    print(f"{REPLICAS} replica groups of 1 CPU worker, kill at step {KILL_AT_STEP}")
    why = unavailable()
    for variant in variants:
        if why:
            print(f"{variant.name}: skipped: {why}")
            continue
        outcomes = []
        for _ in range(args.runs):
            outcomes.append(once(variant))
            print(f"  {outcomes[-1]}", flush=True)
        print(f"{variant.name}: {json.dumps(summary(outcomes))}", flush=True)
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))  # run.stop()
    sys.exit(main(sys.argv[1:]))
