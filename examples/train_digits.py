"""Elastic Horovod training of a small classifier on scikit-learn's digits.

Run it through spotring (see README.md)::

    spotring run --provider local -np 2 --min-np 1 --max-np 4 -- \
        python examples/train_digits.py --epochs 8

It follows the Elastic Horovod recipe: ``hvd.elastic.run`` around the training loop, a
state object holding model, optimizer, sampler and counters, ``ElasticSampler`` so a
reset repartitions only the samples not yet processed this epoch, and a commit every
``--commit-every`` steps. A failure costs at most the steps since the last commit.

With ``--events FILE`` rank 0 appends one JSON object per line for every commit,
resume and the end of training (tests and the summary read them). ``--audit-samples``
adds an ``epoch_audit`` line per epoch: how many training samples the ring processed
once, twice or never, counted in the committed state so that a rollback uncounts what
it undoes (``bench/soak`` checks it under chaos). ``--stop-file FILE`` ends training
at the next epoch end once FILE exists. ``--hang-file FILE`` makes the last rank hang
(sleep for good, as on a stuck filesystem) before its next commit once FILE exists;
it removes FILE, so one worker hangs once (``spotring run --hang-timeout`` replaces it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator

import horovod.torch as hvd
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader

from spotring.torch import TorchState

# digits.py lies beside this script: importable also when the script runs through
# runpy from elsewhere (sys.path[0] is then the caller's directory).
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from digits import Net, SampleIds, audit, load_data, marked_padding, padded_loss, sample_counts


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=16, help="per worker")
    parser.add_argument("--lr", type=float, default=0.05, help="per worker; scaled by world size")
    parser.add_argument("--commit-every", type=int, default=1, help="steps between commits")
    parser.add_argument(
        "--step-seconds",
        type=float,
        default=0.0,
        help="sleep this long per step, to stretch a demo over chaos events",
    )
    parser.add_argument("--events", help="rank 0 appends JSON lines here")
    parser.add_argument(
        "--state",
        choices=["spotring", "horovod"],
        default="spotring",
        help="spotring's TorchState (buffer commits) or horovod's hvd.elastic.TorchState",
    )
    parser.add_argument(
        "--audit-samples",
        action="store_true",
        help="count how often each training sample is processed per epoch (epoch_audit events)",
    )
    parser.add_argument("--stop-file", help="finish at the next epoch end once this file exists")
    parser.add_argument(
        "--hang-file",
        help="the last rank hangs before its next commit once this file exists (removed)",
    )
    return parser.parse_args(argv)


class MarkedPaddingSampler(hvd.elastic.ElasticSampler):
    """Horovod's ``ElasticSampler``, with the samples it repeats to give every rank as
    many (the padding) marked as ``-1 - index``, so they can be left out of the loss
    and of the count."""

    def __iter__(self) -> Iterator[int]:
        remaining = self.remaining_indices
        padding = marked_padding(remaining[: self.total_size - len(remaining)])
        return iter((remaining + padding)[self.rank : self.total_size : self.num_replicas])


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    hvd.init()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    train_set, test_set = load_data()

    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    if args.audit_samples:
        sampler = MarkedPaddingSampler(train_set, shuffle=True, seed=0)
        loader = DataLoader(SampleIds(train_set), batch_size=args.batch_size, sampler=sampler)
    else:
        sampler = hvd.elastic.ElasticSampler(train_set, shuffle=True, seed=0)
        loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)

    def emit(event: str, **fields: object) -> None:
        if hvd.rank() != 0:
            return
        record = {"event": event, "time": time.time(), "size": hvd.size(), **fields}
        if event != "commit" or fields.get("end_of_epoch"):
            print(json.dumps(record), flush=True)
        if args.events:
            with open(args.events, "a") as stream:
                stream.write(json.dumps(record) + "\n")

    state_class = TorchState if args.state == "spotring" else hvd.elastic.TorchState
    # `seen` counts each sample's passes this epoch; replaced, never changed in place, as
    # the state objects keep extra attributes by reference.
    seen = torch.zeros(len(train_set), dtype=torch.int32)
    state = state_class(model, optimizer, sampler=sampler, epoch=0, batch=0, step=0, seen=seen)
    resets = 0  # seen by this process: a counter in `state` would roll back with the rest

    def on_reset() -> None:
        nonlocal resets
        resets += 1
        for group in optimizer.param_groups:
            group["lr"] = args.lr * hvd.size()

    state.register_reset_callbacks([on_reset])

    def commit(**fields: object) -> None:
        try:
            state.commit()  # saves first; may then raise to start a reset
        finally:
            emit("commit", step=state.step, epoch=state.epoch, **fields)

    @hvd.elastic.run
    def train(state: TorchState) -> None:
        host = os.environ.get("HOROVOD_HOSTNAME", "")
        emit("resume", step=state.step, epoch=state.epoch, resets=resets, host=host)
        while state.epoch < args.epochs:
            model.train()
            for inputs, targets, *ids in loader:
                optimizer.zero_grad()
                if ids:  # padding counts for nothing: each sample weighs once per epoch
                    loss = padded_loss(model(inputs), targets, ids[0])
                    state.seen = state.seen + count_samples(ids[0], len(train_set))
                else:
                    loss = F.cross_entropy(model(inputs), targets)
                loss.backward()
                optimizer.step()
                state.sampler.record_batch(state.batch, len(inputs))
                state.batch += 1
                state.step += 1
                if args.step_seconds:
                    time.sleep(args.step_seconds)
                if args.hang_file and hvd.rank() == hvd.size() - 1:
                    hang_if_asked(args.hang_file)
                if state.step % args.commit_every == 0:
                    commit(loss=round(loss.item(), 4))
            if args.audit_samples:
                emit("epoch_audit", epoch=state.epoch, **audit(state.seen))
                state.seen = torch.zeros_like(state.seen)
            state.batch = 0
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            commit(end_of_epoch=True)
            if args.stop_file and stop_requested(args.stop_file):
                break

    train(state)

    if hvd.rank() == 0:
        model.eval()
        with torch.no_grad():
            inputs, targets = test_set.tensors
            accuracy = (model(inputs).argmax(dim=1) == targets).float().mean().item()
        emit(
            "done",
            step=state.step,
            epochs=state.epoch,
            resets=resets,
            accuracy=round(accuracy, 4),
        )
        print(
            f"training done: {state.step} steps, {state.epoch} epochs, "
            f"{resets} resets seen by rank 0, final world size {hvd.size()}, "
            f"test accuracy {accuracy:.3f}",
            flush=True,
        )
    return 0


def count_samples(ids: torch.Tensor, total: int) -> torch.Tensor:
    """How often each of ``total`` samples appears in this step's batches, all ranks."""
    return sample_counts(hvd.allgather(ids, name="audit.sample_ids"), total)


def hang_if_asked(path: str) -> None:
    """Hang for good once ``path`` exists (removed first: one hang per file)."""
    try:
        os.remove(path)
    except FileNotFoundError:
        return
    print(f"rank {hvd.rank()} hangs before its commit of step", flush=True)
    while True:
        time.sleep(3600)


def stop_requested(path: str) -> bool:
    """Whether rank 0 sees ``path``; every rank gets the same answer."""
    return bool(hvd.broadcast_object(os.path.exists(path), root_rank=0, name="stop_file"))


if __name__ == "__main__":
    sys.exit(main())
