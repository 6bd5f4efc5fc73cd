"""Deprecated path of :mod:`spotring.autoscaler.plugins.policy` (spotring's own answers
to the decision hooks), kept so that existing imports work: import from there."""

from spotring.autoscaler.plugins.policy import (
    JobShape,
    group_slots,
    size_bounds,
    spotring_drain_on_notice,
    spotring_fall_back,
    spotring_order_groups,
    spotring_replace_host,
    spotring_return_to_spot,
    spotring_target_size,
)

__all__ = [
    "JobShape",  # its home before spotring.core
    "group_slots",
    "size_bounds",
    "spotring_drain_on_notice",
    "spotring_fall_back",
    "spotring_order_groups",
    "spotring_replace_host",
    "spotring_return_to_spot",
    "spotring_target_size",
]
