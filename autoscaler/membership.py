"""Membership: the inventory discovery reads, and what changes it between listings.

The last good listing, with the hosts that failed left out until they are readmitted
(or until the cloud stops listing them) and the hosts that announced their
interruption draining. The controller's thread publishes listings; the launcher's
threads take failed and noticed hosts out at once; any thread reads. Every change
publishes a new immutable :class:`Inventory` under one lock, so a reader never sees
half of one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import replace

from spotring.core import Instance, InstanceState, InterruptionNotice
from spotring.core.inventory import Inventory

__all__ = ["Membership"]


class Membership:
    """The published inventory of one job and its exclusions and notices."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # guards the fields below
        self._instances: tuple[Instance, ...] = ()
        self._inventory: Inventory | None = None
        self._excluded: dict[str, float | None] = {}  # instance id -> readmit at (monotonic)
        self._notices: dict[str, InterruptionNotice] = {}  # instance id -> draining notice

    @property
    def inventory(self) -> Inventory | None:
        """The latest inventory, or None before the first listing."""
        return self._inventory

    def listed(self, instances: Sequence[Instance]) -> None:
        """Publish a new listing (a new generation). Exclusions and notices are
        forgotten once the cloud stops listing their member."""
        with self._lock:
            self._instances = tuple(instances)
            listed = {i.id for i in instances}
            self._excluded = {i: at for i, at in self._excluded.items() if i in listed}
            self._notices = {i: n for i, n in self._notices.items() if i in listed}
            self._publish(new_generation=True)

    def exclude(self, instance_id: str, readmit_after: float | None) -> bool:
        """Leave ``instance_id`` out for ``readmit_after`` seconds (None: while it is
        listed). False when it is out already."""
        with self._lock:
            if instance_id in self._excluded:
                return False
            readmit = None if readmit_after is None else time.monotonic() + readmit_after
            self._excluded[instance_id] = readmit
            self._publish()
        return True

    def drain(self, instance_id: str, notice: InterruptionNotice) -> None:
        """``instance_id`` is DRAINING with ``notice`` from now on: out of discovery."""
        with self._lock:
            self._notices[instance_id] = notice
            self._publish()

    def next_readmission(self) -> float | None:
        """Seconds until the next excluded host is readmitted (republishing the
        inventory for those whose time has come), or None when none is waiting."""
        with self._lock:
            now = time.monotonic()
            times = [at for at in self._excluded.values() if at is not None]
            if any(at <= now for at in times):
                self._publish()
                times = [at for at in self._excluded.values() if at is not None]
        return max(0.0, min(times) - now) if times else None

    def _publish(self, new_generation: bool = False) -> None:
        """Build the inventory from the last listing, the exclusions whose time has not
        come and the notices (lock held)."""
        now = time.monotonic()
        self._excluded = {i: at for i, at in self._excluded.items() if at is None or at > now}
        old = self._inventory
        generation = (old.generation if old else 0) + (1 if new_generation else 0)
        refreshed_at = now if new_generation or old is None else old.refreshed_at
        instances = tuple(
            _draining(i, self._notices[i.id]) if i.id in self._notices else i
            for i in self._instances
        )
        self._inventory = Inventory(instances, generation, refreshed_at, frozenset(self._excluded))


def _draining(instance: Instance, notice: InterruptionNotice) -> Instance:
    """``instance`` as it is after ``notice``: leaving, unless already further gone."""
    usable = instance.state in (InstanceState.PENDING, InstanceState.READY)
    return replace(instance, state=InstanceState.DRAINING if usable else instance.state,
                   notice=notice)  # fmt: skip
