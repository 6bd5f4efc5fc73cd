"""The digits example on the torch.distributed backend, in place (no Horovod).

    spotring run --provider local --backend torch --in-place -np 2 --min-np 1 --max-np 4 -- \
        python examples/train_digits_torch.py --epochs 8

``train_digits.py``'s model and data on ``spotring.torch.inplace``: :func:`inplace.run`
around the training loop, a ``TorchState`` holding model, optimizer and the plain values
(the epoch, the samples processed in it, the step), ``ElasticDistributedSampler`` so
that each re-formation repartitions only the samples not yet processed this epoch,
``DistributedDataParallel`` wrapped again on every formation, and a commit every
``--commit-every`` steps. A failure costs at most the steps since the last commit.

``--events FILE`` and ``--audit-samples`` write what ``train_digits.py``'s do: rank 0
appends a JSON line for every commit, resume (each formation), the end of training and,
with ``--audit-samples``, an ``epoch_audit`` per epoch (how many training samples the
group processed once, twice or never, counted in the committed state so that a
rollback uncounts what it undoes).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from spotring.torch import inplace
from spotring.torch.sampler import ElasticDistributedSampler

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
    parser.add_argument("--step-seconds", type=float, default=0.0, help="sleep this long per step")
    parser.add_argument("--events", help="rank 0 appends JSON lines here")
    parser.add_argument(
        "--audit-samples",
        action="store_true",
        help="count how often each training sample is processed per epoch (epoch_audit events)",
    )
    args = parser.parse_args(argv)
    if args.epochs < 1 or args.batch_size < 1 or args.commit_every < 1:
        parser.error("--epochs, --batch-size and --commit-every must be at least 1")
    return args


class MarkedPaddingSampler(ElasticDistributedSampler):
    """The elastic sampler with its padding marked (see ``digits.SampleIds``)."""

    def padding(self, remaining: list[int], count: int) -> list[int]:
        return marked_padding(super().padding(remaining, count))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.manual_seed(0)
    torch.set_num_threads(1)
    train_set, test_set = load_data()
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    # `seen` counts each sample's passes this epoch; replaced, never changed in place.
    seen = torch.zeros(len(train_set), dtype=torch.int32)
    state = inplace.TorchState(
        model, optimizer, commit_every=args.commit_every, epoch=0, processed=0, step=0, seen=seen
    )
    if args.audit_samples:
        sampler: ElasticDistributedSampler = MarkedPaddingSampler(train_set, state, seed=0)
        loader = DataLoader(SampleIds(train_set), batch_size=args.batch_size, sampler=sampler)
    else:
        sampler = ElasticDistributedSampler(train_set, state, seed=0)
        loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    formations = 0  # seen by this process: a counter in `state` would roll back with it

    def emit(event: str, **fields: object) -> None:
        if state.rank != 0:
            return
        record = {"event": event, "time": time.time(), "size": state.world_size, **fields}
        if event != "commit" or fields.get("end_of_epoch"):
            print(json.dumps(record), flush=True)
        if args.events:
            with open(args.events, "a") as stream:  # one write per line: O_APPEND
                stream.write(json.dumps(record) + "\n")

    def commit(**fields: object) -> None:
        try:
            state.commit()  # saves every --commit-every calls; may then raise to re-form
        finally:
            if state.steps_since_commit == 0:  # saved
                emit("commit", step=state.step, epoch=state.epoch, **fields)

    @inplace.run()
    def train(state: inplace.TorchState) -> None:
        nonlocal formations
        formations += 1
        for group in optimizer.param_groups:
            group["lr"] = args.lr * state.world_size
        worker = os.environ.get("SPOTRING_TORCH_WORKER", "")  # its name under spotring run
        emit("resume", step=state.step, epoch=state.epoch, resets=formations - 1, worker=worker)
        # DDP keeps its group: wrapped on every formation, the state synced already.
        net = DistributedDataParallel(model, init_sync=False)
        while state.epoch < args.epochs:
            model.train()
            for inputs, targets, *ids in loader:  # this group's share of what is left
                optimizer.zero_grad()
                if ids:  # padding counts for nothing: each sample weighs once per epoch
                    loss = padded_loss(net(inputs), targets, ids[0])
                    state.seen = state.seen + count_samples(ids[0], len(train_set))
                else:
                    loss = F.cross_entropy(net(inputs), targets)
                loss.backward()
                optimizer.step()
                sampler.record_batch(len(inputs))
                state.step += 1
                if args.step_seconds:
                    time.sleep(args.step_seconds)
                commit(loss=round(loss.item(), 4))
            if args.audit_samples:
                emit("epoch_audit", epoch=state.epoch, **audit(state.seen))
                state.seen = torch.zeros_like(state.seen)
            sampler.set_epoch(state.epoch + 1)
            commit(end_of_epoch=True)
        if state.rank == 0:
            model.eval()
            with torch.no_grad():
                inputs, targets = test_set.tensors
                accuracy = (model(inputs).argmax(dim=1) == targets).float().mean().item()
            emit("done", step=state.step, epochs=state.epoch, resets=formations - 1,
                 accuracy=round(accuracy, 4))  # fmt: skip
            print(
                f"training done: {state.step} steps, {state.epoch} epochs, "
                f"{formations - 1} re-formations seen by rank 0, final world size "
                f"{state.world_size}, test accuracy {accuracy:.3f}",
                flush=True,
            )

    train(state)
    return 0


def count_samples(ids: torch.Tensor, total: int) -> torch.Tensor:
    """How often each of ``total`` samples appears in this step's batches, all ranks
    (every rank's batch has as many ids: the sampler pads)."""
    everyone = [torch.empty_like(ids) for _ in range(dist.get_world_size())]
    dist.all_gather(everyone, ids)
    return sample_counts(torch.cat(everyone), total)


if __name__ == "__main__":
    sys.exit(main())
