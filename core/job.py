"""What a job asks of its group: the elastic limits and the steering options."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class JobShape:
    """What the job asks of the group: the elastic limits and the steering options."""

    num_proc: int
    """Workers to start with (``-np``)."""
    min_num_proc: int
    max_num_proc: int
    slots_per_host: int | None = None
    """``--slots-per-host``; None: the slots the group's members report."""
    target_hosts: int | None = None
    """``--target-hosts``: the size to ask for at start instead of enough for ``-np``."""
    resize: bool = True
    """False with ``--no-resize``: never change the group's size."""
    replace_failed: bool = True
    """False with ``--no-replace``: leave failed hosts to the cloud."""
    drain_on_rebalance: bool = False
    """``--drain-on-rebalance``: leave a host at a rebalance recommendation already."""


def hosts_for_slots(num_proc: int, slots_per_host: int) -> int:
    """Hosts needed to run ``num_proc`` workers at ``slots_per_host`` each (at least 1)."""
    return max(1, math.ceil(num_proc / max(1, slots_per_host)))
