"""A DistributedDataParallel script in spotring's in-place mode (torch.distributed backend).

    python examples/torch_inplace.py --store HOST:PORT --worker-id ID [--steps N] [--ddp]

Every worker runs this; the coordinator behind ``--store`` (the driver, or a test's
:class:`spotring.torch.coordinator.StorePublisher`) says which generation each one is
in. When a worker dies, hangs or joins, the others keep their process and go on from
their last commit. For tests and bench/torch_anchor.py it reports its progress into
the same store under ``example/``: ``stepped/B`` and ``committed/B`` (rank 0, after
the step and after the commit of batch B), ``start/GEN/ID`` and ``done/ID`` (the
batch, the steps rolled back, and a digest of the model and optimizer state).
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time

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


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="HOST:PORT of the coordinator's store")
    parser.add_argument("--worker-id", required=True)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--commit-every", type=int, default=1)
    parser.add_argument("--ddp", action="store_true", help="wrap the model in DDP")
    args = parser.parse_args(argv)
    host, _, port = args.store.rpartition(":")
    store = dist.TCPStore(host, int(port), is_master=False)
    report = dist.PrefixStore("example/", store)

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    state = inplace.TorchState(model, optimizer, commit_every=args.commit_every, batch=0)

    @inplace.run(StoreCoordinator(host, int(port), args.worker_id))
    def train(state: inplace.TorchState) -> None:
        generation = state.group.membership.generation if state.group else -1
        report.set(f"start/{generation}/{args.worker_id}", f"{state.batch} {state_digest(state)}")
        # DDP keeps the group it was built with: wrap again on every formation.
        net = DistributedDataParallel(model) if args.ddp else model
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
            state.batch += 1
            if state.rank == 0:
                report.set(f"stepped/{state.batch}", f"{generation} {time.time()}")
            state.commit()
            if state.rank == 0 and state.steps_since_commit == 0:
                report.set(f"committed/{state.batch}", f"{generation} {time.time()}")

    train(state)
    report.set(
        f"done/{args.worker_id}",
        f"{state.batch} {state.steps_rolled_back} {state_digest(state)}",
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
