"""A plain torchrun DDP script with its own checkpoint: the anchor's workload.

    torchrun --standalone --nproc-per-node 4 --max-restarts 3 \\
        examples/torch_ddp_checkpoint.py --checkpoint DIR [--steps N] [--every K]

It calls ``init_process_group`` from the environment torchrun sets, loads
``DIR/checkpoint.pt`` if there is one, and rank 0 saves it every K steps (written
aside, then renamed). Each rank appends ``RESTART STEP UNIX_TIME`` to ``DIR/steps.RANK``
after each step, so bench/torch_anchor.py can time a restart. The model and the data
are those of examples/torch_inplace.py, so both modes run the same workload. With
``--stop-file F`` it also stops once F exists (the ranks agree on the step: one more
all-reduce per step), so a test can end a run on progress.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import NoReturn

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def batch_of(batch: int, rank: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(batch * 1000 + rank)
    x = torch.randn(32, 64, generator=generator)
    return x, x.sum(dim=1, keepdim=True)


def stop_asked(stop_file: Path | None) -> bool:
    """Whether any rank sees ``stop_file`` (all ranks agree: one more collective, and
    no rank leaves the group while another still uses rank 0's store)."""
    if stop_file is None:
        return False
    seen = torch.tensor([float(stop_file.exists())])
    dist.all_reduce(seen, op=dist.ReduceOp.MAX)
    return bool(seen.item())


def main(argv: list[str]) -> NoReturn:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", type=Path, required=True, help="checkpoint folder")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--every", type=int, default=10, help="checkpoint every K steps")
    parser.add_argument(
        "--stop-file",
        type=Path,
        help="also stop (every rank at the same step) once this file exists",
    )
    parser.add_argument(
        "--prefix-per-attempt",
        action="store_true",
        help="rendezvous under a key prefix of this restart's own (docs/torch.md)",
    )
    args = parser.parse_args(argv)
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if args.prefix_per_attempt:
        # torchrun's agent keeps one store for every attempt; keys of our own per attempt
        # keep a restarted rank from reading a dead worker's address.
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        attempt = dist.PrefixStore(f"attempt/{restart}/", store)
        dist.init_process_group("gloo", store=attempt, rank=rank, world_size=world)
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    path = args.checkpoint / "checkpoint.pt"
    step = 0
    if path.exists():
        saved = torch.load(path)
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        step = saved["step"]
    net = DistributedDataParallel(model)
    with open(args.checkpoint / f"steps.{rank}", "a", buffering=1) as progress:
        while step < args.steps and not stop_asked(args.stop_file):
            x, y = batch_of(step, rank)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
            optimizer.step()
            step += 1
            if rank == 0 and step % args.every == 0:
                aside = path.with_suffix(".tmp")
                state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
                torch.save({**state, "step": step}, aside)
                aside.replace(path)
            progress.write(f"{restart} {step} {time.time()}\n")
    dist.destroy_process_group()
    # torch 2.13: freeing DDP now can deadlock. Its reducer drops the group's last
    # reference, and the group's destructor, run holding the interpreter's lock, joins
    # Gloo's worker threads, one of which may still be freeing the last collective's
    # tensors, which needs that lock (seen here in 8 of 12 processes under load). End
    # here, without the interpreter's teardown: every file is closed already.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
