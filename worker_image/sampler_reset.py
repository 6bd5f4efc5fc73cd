"""Worker side: re-partition each ``ElasticSampler`` whenever the ring changes.

An ``ElasticSampler`` splits the epoch's remaining samples by world size and rank, and
re-reads them only in ``reset()``, which Horovod calls from ``load_state_dict``: on a
restore or a sync. When hosts only *leave* the ring (a drained host, a scale-down),
Horovod resets with ``skip_sync`` (no restore, no sync), so the sampler keeps splitting
for the old size and ranks: some samples of the epoch are never seen and others twice.
``bench/soak`` measured up to 416 of 1,437 samples skipped and 192 repeated in such an
epoch. Re-partitioning on every reset, before the sync, fixes it: every rank holds the
same committed ``processed_num``, and a later sync re-partitions again all the same.

spotring's ``TorchState`` does this itself; for ``hvd.elastic.TorchState`` the workers'
``sitecustomize`` installs it (:func:`install`) when the script imports Horovod.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from spotring.worker_image import horovod_internals


def reset_samplers(handlers: Iterable[Any]) -> None:
    """Re-partition the ``ElasticSampler`` of each state handler that holds one."""
    from horovod.torch.elastic.sampler import ElasticSampler

    for handler in handlers:
        if isinstance(handler.value, ElasticSampler):
            handler.value.reset()


def install() -> None:
    """Make ``hvd.elastic.TorchState`` re-partition its samplers on every reset."""
    reset = horovod_internals.torch_state_reset()
    if getattr(reset, "spotring_resets_samplers", False):
        return

    def reset_with_samplers(state: Any) -> None:
        reset(state)
        reset_samplers(horovod_internals.state_handlers(state).values())

    reset_with_samplers.spotring_resets_samplers = True  # type: ignore[attr-defined]  # a marker on the patch
    horovod_internals.replace_torch_state_reset(reset_with_samplers)
