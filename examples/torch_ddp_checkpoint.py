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

With ``--save-on-sigterm`` it does what a careful torchrun user's script does when its
agent (or spotring, on a notice) stops it: SIGTERM only raises a flag; the ranks agree
on it between steps, in the same all-reduce as the stop file, so every rank stops after
the same completed step, whatever moment each one got the signal; rank 0 then saves
that step and every rank exits with 143 (128 + SIGTERM: never a success). A rank whose
peer has already gone fails in that all-reduce (or in DDP's) and exits with the error,
saving nothing: its step in flight never completed, and the last checkpoint stands.
Rank 0 prints where each run resumed from (``resumed from step N (saved ...)``).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
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


def on_sigterm() -> threading.Event:
    """An event that SIGTERM sets, instead of ending the process."""
    terminated = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: terminated.set())
    return terminated


def stop_asked(stop_file: Path | None, terminated: threading.Event | None) -> tuple[bool, bool]:
    """(whether any rank sees ``stop_file``, whether any rank got SIGTERM), the same on
    every rank: one more collective per step, so no rank leaves the group while another
    still uses it, or stops at another step. (False, False) when neither is watched."""
    if stop_file is None and terminated is None:
        return False, False
    seen = torch.tensor(
        [
            float(stop_file is not None and stop_file.exists()),
            float(terminated is not None and terminated.is_set()),
        ]
    )
    dist.all_reduce(seen, op=dist.ReduceOp.MAX)
    return bool(seen[0].item()), bool(seen[1].item())


def save(
    path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int, why: str
) -> None:
    """``path`` holds ``step``'s model and optimizer (written aside, then renamed)."""
    aside = path.with_suffix(".tmp")
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict()}
    torch.save({**state, "step": step, "saved": why}, aside)
    aside.replace(path)


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
    parser.add_argument(
        "--save-on-sigterm",
        action="store_true",
        help="on SIGTERM, stop every rank after the same step and have rank 0 save it",
    )
    args = parser.parse_args(argv)
    terminated = on_sigterm() if args.save_on_sigterm else None  # before anything slow
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
        if rank == 0:
            print(f"resumed from step {step} (saved {saved.get('saved', 'periodically')})")
    net = DistributedDataParallel(model)
    signalled = False
    with open(args.checkpoint / f"steps.{rank}", "a", buffering=1) as progress:
        while step < args.steps:
            asked, signalled = stop_asked(args.stop_file, terminated)
            if asked or signalled:
                break
            x, y = batch_of(step, rank)
            optimizer.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
            optimizer.step()
            step += 1
            if rank == 0 and step % args.every == 0:
                save(path, model, optimizer, step, f"every {args.every} steps")
            progress.write(f"{restart} {step} {time.time()}\n")
    if signalled and rank == 0:
        # Every rank completed ``step`` (they all agreed after it): its parameters
        # are the group's, whichever rank got the signal first.
        save(path, model, optimizer, step, "on SIGTERM")
        print(f"saved step {step} on SIGTERM")
    dist.destroy_process_group()
    # torch 2.13: freeing DDP now can deadlock. Its reducer drops the group's last
    # reference, and the group's destructor, run holding the interpreter's lock, joins
    # Gloo's worker threads, one of which may still be freeing the last collective's
    # tensors, which needs that lock (seen here in 8 of 12 processes under load). End
    # here, without the interpreter's teardown: every file is closed already.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(128 + signal.SIGTERM if signalled else 0)


if __name__ == "__main__":
    main(sys.argv[1:])
