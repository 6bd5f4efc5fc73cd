"""spotring's own answers to the decision hooks: how big the group is, what is replaced,
in which order a job's groups are asked, what falls back and what is handed back.

Registered as a built-in plugin with ``trylast``, so a plugin that implements
``spotring_target_size`` or ``spotring_replace_host`` is asked first and its first
non-None answer wins, as in pytest. What a run's options switch on (``--order price``
here, ``--deadline`` in :mod:`spotring.autoscaler.deadline`) is registered for the run
by :func:`before_defaults`: asked after every other plugin, before these defaults.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence

import pluggy

from spotring.autoscaler.capacity import GroupStatus, default_order
from spotring.core.hooks import hookimpl
from spotring.core.instance import Instance, InstanceState, InterruptionNotice
from spotring.core.inventory import Inventory
from spotring.core.job import JobShape, hosts_for_slots

__all__ = [
    "DEFAULTS",
    "JobShape",  # its home before spotring.core
    "PriceOrder",
    "before_defaults",
    "group_slots",
    "size_bounds",
]

DEFAULTS = "spotring.autoscaler.policy"
"""The name this module is registered under (``OWN_PLUGINS``)."""

_LIVE = (InstanceState.PENDING, InstanceState.READY)


def group_slots(inventory: Inventory) -> int | None:
    """Slots per host of the group's live members (the fewest, to size safely)."""
    slots = [i.slots for i in inventory.instances if i.state in _LIVE and i.slots >= 1]
    return min(slots) if slots else None


def size_bounds(inventory: Inventory, job: JobShape) -> tuple[int, int, int]:
    """(hosts for --min-np, hosts for -np, hosts for --max-np) at the group's slots.

    A group with no live member to learn from is sized at one slot per host (or
    ``--slots-per-host``); the bounds tighten once members report their slots.
    """
    slots = job.slots_per_host or group_slots(inventory) or 1
    return (
        hosts_for_slots(job.min_num_proc, slots),
        hosts_for_slots(job.num_proc, slots),
        hosts_for_slots(job.max_num_proc, slots),
    )


@hookimpl(trylast=True)
def spotring_target_size(
    inventory: Inventory, job: JobShape, current_target: int | None
) -> int | None:
    """At start: ``--target-hosts``, or enough hosts for ``-np`` (a group that already
    holds more, up to what ``--max-np`` can use, keeps them). Later: keep the group
    within what ``--min-np``/``--max-np`` need at the slots its hosts really have."""
    if not job.resize:
        return None
    low, start, high = size_bounds(inventory, job)
    live = sum(1 for i in inventory.instances if i.state in _LIVE)
    if current_target is None:
        wanted = job.target_hosts if job.target_hosts is not None else max(start, live)
        return min(max(wanted, low), high)
    if current_target > high or live > high:
        return high
    if current_target < low:
        return low
    return None


@hookimpl(trylast=True)
def spotring_drain_on_notice(instance: Instance, notice: InterruptionNotice, job: JobShape) -> bool:
    """Drain at every notice but a rebalance recommendation, unless
    ``--drain-on-rebalance``."""
    return notice.kind != "rebalance" or job.drain_on_rebalance


@hookimpl(trylast=True)
def spotring_replace_host(instance: Instance, reason: str, job: JobShape) -> bool:
    """Replace a host whose worker failed, unless ``--no-replace``."""
    return job.replace_failed


@hookimpl(trylast=True)
def spotring_order_groups(groups: Sequence[GroupStatus], job: JobShape) -> list[str]:
    """The user's order, a demoted group moved after the others but before the last."""
    return default_order(groups)


@hookimpl(trylast=True)
def spotring_fall_back(group: GroupStatus, short: GroupStatus, hosts: int, job: JobShape) -> bool:
    """Always ask the next group: the job's size matters more than where it runs."""
    return True


@hookimpl(trylast=True)
def spotring_fall_back_hosts(
    group: GroupStatus, short: GroupStatus, hosts: int, total: int, job: JobShape
) -> int:
    """All the hosts still wanted."""
    return hosts


@hookimpl(trylast=True)
def spotring_return_to_spot(instance: Instance, group: GroupStatus, job: JobShape) -> bool:
    """Always hand a host back once the capacity policy allows it (``--return-after``,
    one at a time, the job keeping its size)."""
    return True


class PriceOrder:
    """``--order price``: the groups before the last tried cheapest per slot first
    (:func:`~spotring.autoscaler.capacity.default_order` with ``by_price``)."""

    NAME = "spotring.order-price"

    @hookimpl(trylast=True)
    def spotring_order_groups(self, groups: Sequence[GroupStatus], job: JobShape) -> list[str]:
        return default_order(groups, by_price=True)


@contextlib.contextmanager
def before_defaults(pm: pluggy.PluginManager, plugin: object, name: str) -> Iterator[None]:
    """Register ``plugin`` under ``name`` for the ``with`` block so that its answers come
    after every other plugin's and before spotring's defaults. pluggy asks ``trylast``
    implementations newest last, so the defaults (which implement no historic hook, so
    registering them again calls nothing) are registered again after it."""
    pm.register(plugin, name=name)
    defaults = pm.unregister(name=DEFAULTS)
    pm.register(defaults, name=DEFAULTS)
    try:
        yield
    finally:
        pm.unregister(name=name)
