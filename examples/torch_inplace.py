"""A DistributedDataParallel script in spotring's in-place mode (torch.distributed backend).

    spotring run --backend torch --in-place ... -- python examples/torch_inplace.py \
        [--steps N] [--ddp] [--events FILE]
    python examples/torch_inplace.py --store HOST:PORT --worker-id ID ...   # tests, bench

Every worker runs this; the coordinator (the driver's, or with ``--store`` a test's
:class:`spotring.torch.coordinator.StorePublisher`) says which generation each one is
in. When a worker dies, hangs or joins, the others keep their process and go on from
their last commit. ``--events FILE``: each commit of rank 0 and each member's start in
a generation as a JSON line (``commit``: step, size, generation; ``start``: step,
rolled back, digest of the model and optimizer state). With ``--store`` it reports
into that store under ``example/`` for tests and bench/torch_anchor.py:
``stepped/B`` and ``committed/B`` (rank 0, after the step and after the commit of batch
B), ``start/GEN/ID`` and ``done/ID`` (the batch, the steps rolled back, and the digest).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from spotring.torch import inplace
from spotring.torch.coordinator import StoreCoordinator


def state_digest(state: inplace.TorchState) -> str:
    """A digest of the model's and the optimizer's tensors, to compare members."""
    digest = hashlib.sha256()
    assert state.model is not None and state.optimizer is not None
    tensors = list(state.model.state_dict().values())
    for param_state in state.optimizer.state_dict()["state"].values():
        tensors += [t for t in param_state.values() if torch.is_tensor(t)]
    for t in tensors:
        digest.update(t.detach().contiguous().numpy().tobytes())
    return digest.hexdigest()[:16]


def batch_of(batch: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(batch * 1000 + rank)
    x = torch.randn(32, 64, generator=generator)
    return x, x.sum(dim=1, keepdim=True)


class Reports:
    """Where the example says what it did: a test's store, an events file, or nowhere."""

    def __init__(self, store: dist.Store | None, events: str | None) -> None:
        self._store = store
        self._events = events

    def set(self, key: str, value: str, **record: Any) -> None:
        if self._store is not None:
            self._store.set(key, value)
        if self._events is not None and record:
            line = json.dumps({"time": time.time(), "pid": os.getpid(), **record}) + "\n"
            with open(self._events, "a") as stream:  # one write per line: O_APPEND
                stream.write(line)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", help="HOST:PORT of a test's coordinator store")
    parser.add_argument("--worker-id", help="this worker's name in that store's memberships")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--commit-every", type=int, default=1)
    parser.add_argument("--ddp", action="store_true", help="wrap the model in DDP")
    parser.add_argument("--events", help="append what rank 0 commits here, as JSON lines")
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep per step")
    args = parser.parse_args(argv)
    coordinator = None
    worker = args.worker_id or os.environ.get("SPOTRING_TORCH_WORKER", "?")
    store = None
    if args.store:
        host, _, port = args.store.rpartition(":")
        store = dist.PrefixStore("example/", dist.TCPStore(host, int(port), is_master=False))
        coordinator = StoreCoordinator(host, int(port), args.worker_id)
    report = Reports(store, args.events)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    state = inplace.TorchState(model, optimizer, commit_every=args.commit_every, batch=0)

    @inplace.run(coordinator)
    def train(state: inplace.TorchState) -> None:
        generation = state.group.membership.generation if state.group else -1
        digest = state_digest(state)
        report.set(f"start/{generation}/{worker}", f"{state.batch} {digest}", event="start",
                   worker=worker, generation=generation, step=state.batch, size=state.world_size,
                   rolled_back=state.steps_rolled_back, digest=digest)  # fmt: skip
        # DDP keeps the group it was built with: wrap again on every formation (the
        # state is synced already: no broadcast of DDP's own).
        net = DistributedDataParallel(model, init_sync=False) if args.ddp else model
        while state.batch < args.steps:
            x, y = batch_of(state.batch, state.rank)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
            if not args.ddp:
                for p in model.parameters():
                    assert p.grad is not None
                    dist.all_reduce(p.grad)
                    p.grad /= state.world_size
            optimizer.step()
            time.sleep(args.step_seconds)
            state.batch += 1
            if state.rank == 0:
                report.set(f"stepped/{state.batch}", f"{generation} {time.time()}")
            try:
                state.commit()
            finally:  # a commit that raised MembershipChanged saved the step all the same
                if state.rank == 0 and state.steps_since_commit == 0:
                    report.set(f"committed/{state.batch}", f"{generation} {time.time()}",
                               event="commit", step=state.batch, size=state.world_size,
                               generation=generation)  # fmt: skip

    train(state)
    digest = state_digest(state)
    report.set(f"done/{worker}", f"{state.batch} {state.steps_rolled_back} {digest}",
               event="done", worker=worker, step=state.batch,
               rolled_back=state.steps_rolled_back, digest=digest)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
