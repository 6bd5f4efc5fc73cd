"""spotring.torch.sampler: every sample once per epoch across shrink, grow and rollback.

No processes: a ring of in-place TorchStates, each told its rank and the group's size
as ``inplace.run`` would, steps taken in lock step, commits saved, failures restored
and joiners synced from a survivor, as the in-place mode does.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterator
from types import SimpleNamespace

import pytest

from spotring.torch.inplace import TorchState
from spotring.torch.sampler import ElasticDistributedSampler
from spotring.worker_image.progress import sampler_position

DATASET = list(range(103))  # not a multiple of any group size or batch: padding
BATCH = 4


class MarkedPadding(ElasticDistributedSampler):
    """Padding marked as ``-1 - i`` so that it is left out of the count."""

    def padding(self, remaining: list[int], count: int) -> list[int]:
        return [-1 - i for i in super().padding(remaining, count)]


class Ring:
    """Simulated members of the in-place group, training in lock step."""

    def __init__(self, size: int) -> None:
        self.members: list[tuple[TorchState, ElasticDistributedSampler]] = []
        self.iterators: list[Iterator[int]] = []
        self.pending: list[int] = []  # processed since the last commit
        self.committed: Counter[int] = Counter()  # this epoch's, as of the last commit
        self.audits: list[Counter[int]] = []
        for _ in range(size):
            self.members.append(self._member())
        self.form()

    @staticmethod
    def _member() -> tuple[TorchState, ElasticDistributedSampler]:
        state = TorchState(epoch=0, processed=0)
        return state, MarkedPadding(DATASET, state, seed=7)

    def form(self) -> None:
        """A new formation: ranks renumbered, iteration started again (run() calls the
        function again, whose loop iterates the sampler again)."""
        size = len(self.members)
        for rank, (state, _) in enumerate(self.members):
            membership = SimpleNamespace(rank=rank, world_size=size)
            state.group = SimpleNamespace(membership=membership)  # type: ignore[assignment]
        self.iterators = [iter(sampler) for _, sampler in self.members]

    def step(self) -> bool:
        """One step on every rank; False at the epoch's end."""
        batches = [list(itertools.islice(it, BATCH)) for it in self.iterators]
        assert len({len(b) for b in batches}) == 1, "ranks out of step"
        if not batches[0]:
            return False
        for (_, sampler), batch in zip(self.members, batches, strict=True):
            self.pending += [i for i in batch if i >= 0]
            sampler.record_batch(len(batch))
        return True

    def commit(self) -> None:
        for state, _ in self.members:
            state.save()
        self.committed.update(self.pending)
        self.pending = []

    def end_epoch(self) -> None:
        self.commit()  # the epoch's last steps, then the new epoch's start
        self.audits.append(self.committed)
        self.committed = Counter()
        for state, sampler in self.members:
            sampler.set_epoch(state.epoch + 1)
        self.commit()
        self.form()

    def fail(self, survivors: int) -> None:
        """A member lost (or none: a rollback alone): back to the last commit."""
        del self.members[survivors:]
        for state, _ in self.members:
            state.restore()
        self.pending = []
        self.form()

    def join(self) -> None:
        """A joiner at a commit: synced from a survivor (the values sync() sends)."""
        self.commit()
        state, _ = joiner = self._member()
        state.epoch, state.processed = self.members[0][0].epoch, self.members[0][0].processed
        state.save()
        self.members.append(joiner)
        self.form()


def train(ring: Ring, epochs: int, events: dict[int, str]) -> list[Counter[int]]:
    """Train ``epochs``, committing every 2 steps; ``events[step]`` happens after that
    step: "shrink", "grow" or "rollback"."""
    for step in itertools.count(1):
        if len(ring.audits) == epochs:
            return ring.audits
        if not ring.step():
            ring.end_epoch()
            continue
        if step % 2 == 0:
            ring.commit()
        event = events.get(step)
        if event == "shrink":
            ring.fail(len(ring.members) - 1)
        elif event == "rollback":
            ring.fail(len(ring.members))
        elif event == "grow":
            ring.join()
    raise AssertionError("unreachable")


def assert_each_sample_once(audits: list[Counter[int]]) -> None:
    for epoch, seen in enumerate(audits):
        assert seen == Counter(DATASET), (
            f"epoch {epoch}: missing {set(DATASET) - set(seen)}, "
            f"repeated {sorted(i for i, n in seen.items() if n > 1)}"
        )


@pytest.mark.parametrize(
    "events",
    [
        {},
        {3: "shrink", 9: "grow"},  # in the first epoch: 3 -> 2 -> 3
        {5: "rollback", 11: "shrink", 12: "shrink", 14: "grow", 20: "grow", 30: "rollback"},
        {7: "grow", 8: "grow", 9: "shrink", 17: "rollback", 22: "shrink"},
    ],
    ids=["steady", "shrink-grow", "mixed", "grow-first"],
)
def test_every_sample_is_processed_once_per_epoch_whatever_the_membership(
    events: dict[int, str],
) -> None:
    assert_each_sample_once(train(Ring(3), epochs=3, events=events))


def test_each_epoch_has_its_own_order_the_same_on_every_rank() -> None:
    ring = Ring(2)
    first = [list(s.indices(0, 1)) for _, s in ring.members]
    ring.members[0][1].set_epoch(1)
    assert first[0] == first[1] and sorted(first[0]) == DATASET
    assert ring.members[0][1].indices(0, 1) != first[0]


def test_progress_reports_the_in_place_states_sampler_position() -> None:
    ring = Ring(2)
    ring.step()
    ring.step()
    assert sampler_position(ring.members[0][0]) == (0, 2 * BATCH * 2, len(DATASET))
    ring.end_epoch()
    assert sampler_position(ring.members[1][0]) == (1, 0, len(DATASET))


def test_a_state_without_the_position_values_is_refused() -> None:
    with pytest.raises(ValueError, match="processed="):
        ElasticDistributedSampler(DATASET, TorchState(epoch=0))
