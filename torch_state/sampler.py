"""An elastic sampler for the in-place mode: every sample once per epoch, whatever the
membership does.

The counterpart of Horovod's ``horovod.torch.elastic.ElasticSampler`` (same
semantics: the dataset's indices shuffled per epoch with ``seed + epoch``, the samples
processed this epoch a prefix of that order, the rest split over the ranks by stride
and padded so every rank gets as many), for :class:`spotring.torch.inplace.TorchState`::

    state = inplace.TorchState(model, optimizer, epoch=0, processed=0)
    sampler = ElasticDistributedSampler(train_set, state, seed=0)

    @inplace.run()
    def train(state):
        loader = DataLoader(train_set, batch_size=16, sampler=sampler)
        while state.epoch < epochs:
            for inputs, targets in loader:  # this epoch's samples not yet processed
                ...
                sampler.record_batch(len(inputs))
                state.commit()
            sampler.set_epoch(state.epoch + 1)
            state.commit()

The position (the epoch, and how many samples the group processed in it) is two plain
values of the state, ``epoch`` and ``processed``, not the sampler's own: the state
commits and restores them with the model (a rollback undoes what it counted) and syncs
them to joiners. Each ``iter(sampler)`` partitions what is left over the group as it
is then (``state.rank``, ``state.world_size``), so the loop that :func:`inplace.run`
calls again after each re-formation takes the new group's share.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sized
from typing import Any

from torch.utils.data import Sampler

__all__ = ["ElasticDistributedSampler"]


class ElasticDistributedSampler(Sampler[int]):
    """Partitions a dataset's samples not yet processed this epoch over the ranks of the
    in-place group, from the position held in the state (see the module).

    Args:
        dataset: Anything with a constant ``len``.
        state: The in-place ``TorchState``; it must carry the plain values ``epoch``
            and ``processed`` (integers, 0 to start), and gets this sampler as its
            ``sampler`` attribute (not committed: where progress reports find it).
        shuffle: Shuffle the indices, the same on every rank (``seed + epoch``).
        seed: The shuffle's seed; the same on every rank.
    """

    def __init__(self, dataset: Sized, state: Any, *, shuffle: bool = True, seed: int = 0) -> None:
        for name in ("epoch", "processed"):
            if not isinstance(getattr(state, name, None), int):
                raise ValueError(
                    f"the state needs the plain value {name}= (an int) for the sampler: "
                    "TorchState(model, optimizer, epoch=0, processed=0)"
                )
        self.dataset = dataset
        self.state = state
        self.shuffle = shuffle
        self.seed = seed
        state.sampler = self

    @property
    def epoch(self) -> int:
        """The state's epoch."""
        return int(self.state.epoch)

    @property
    def processed(self) -> int:
        """Samples the group processed this epoch (at most the dataset's length)."""
        return min(int(self.state.processed), len(self.dataset))

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch``: nothing of it processed. Call it at an epoch's end (not its
        start), so that a partly done epoch is not processed again."""
        self.state.epoch = epoch
        self.state.processed = 0

    def record_batch(self, batch_size: int) -> None:
        """Count one step: ``batch_size`` samples on each rank of the group (padding
        past the dataset's end not counted)."""
        done = int(self.state.processed) + batch_size * self.state.world_size
        self.state.processed = min(done, len(self.dataset))

    def remaining(self) -> list[int]:
        """This epoch's indices not yet processed, in the epoch's order."""
        indices = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(indices)
        return indices[self.processed :]

    def padding(self, remaining: list[int], count: int) -> list[int]:
        """``count`` indices that make the remainder divide evenly over the ranks:
        the first ones again, as Horovod's and torch's samplers do."""
        return (remaining * math.ceil(count / max(len(remaining), 1)))[:count]

    def indices(self, rank: int, world_size: int) -> list[int]:
        """``rank``'s share of the remainder in a group of ``world_size``."""
        remaining = self.remaining()
        total = math.ceil(len(remaining) / world_size) * world_size
        padded = remaining + self.padding(remaining, total - len(remaining))
        return padded[rank:total:world_size]

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices(self.state.rank, self.state.world_size))

    def __len__(self) -> int:
        remaining = len(self.dataset) - self.processed
        return math.ceil(remaining / self.state.world_size)
