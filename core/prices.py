"""What a group's members cost: one hourly price per group, and the job's book of them.

A provider (one group's client) may tell the price of one member for one hour
(:meth:`PriceSource.hourly_price`, read from its cloud's price API); ``--price
GROUP_OR_LIFECYCLE=USD`` overrides it. The controller owns one :class:`PriceBook` for
the job: it asks each group at most every ``refresh_s`` and keeps the last good
answer, so a price API that fails costs one warning, never the job, and is never
retried in a tight loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from spotring.core.instance import Lifecycle

__all__ = ["OVERRIDE_SOURCE", "HourlyPrice", "PriceBook", "PriceSource", "PricedGroup"]

_log = logging.getLogger(__name__)

OVERRIDE_SOURCE = "--price"
"""The :attr:`HourlyPrice.source` of a price given on the command line."""


@dataclass(frozen=True)
class HourlyPrice:
    """The price of one member (instance, VM) of a group for one hour."""

    usd: float
    """US dollars for one member for one hour."""
    source: str
    """Where it came from: ``"aws:DescribeSpotPriceHistory"``, ``"--price"``, ..."""
    read_at: float
    """Epoch seconds at which it was read."""


class PriceSource(Protocol):
    """What a provider (one group's client) implements to tell its members' price."""

    def hourly_price(self) -> HourlyPrice | None:
        """The price of one member for one hour now; None when the group has none to
        tell (the price book notes it once). Raises when the price cannot be read: the
        book keeps its last good answer and warns once; the job never fails for it."""


class PricedGroup(PriceSource, Protocol):
    """A group as the price book sees it: a provider, by its name and lifecycle."""

    def group_name(self) -> str:
        """The group's name, unique in the job."""

    def group_lifecycle(self) -> Lifecycle | None:
        """How the group's members are billed, when the group says."""


class PriceBook:
    """The job's prices, per group: each group's provider asked at most every
    refresh_s, the last good answer kept, --price overrides first.

    ``overrides`` maps a group's name, or a lifecycle (``spot``, ``on-demand``), to
    USD per member-hour; a group's own name wins over its lifecycle. Safe to read
    from any thread; a provider is asked on the thread that reads its price.
    """

    def __init__(
        self,
        groups: Sequence[PricedGroup],
        overrides: Mapping[str, float],
        refresh_s: float = 3600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._groups = {group.group_name(): group for group in groups}
        self._overrides = dict(overrides)
        self._refresh_s = refresh_s
        self._clock = clock
        self._lock = threading.Lock()
        self._known: dict[str, HourlyPrice] = {}
        self._asked_at: dict[str, float] = {}
        self._warned: set[str] = set()
        self._slots: dict[str, int] = {}
        self._lifecycles: dict[str, Lifecycle | None] = {}

    def price(self, group: str) -> HourlyPrice | None:
        """The price of one of ``group``'s members for one hour: its override, else
        its provider's last good answer (asked again once ``refresh_s`` has passed);
        None when unknown or when no such group is in the job."""
        source = self._groups.get(group)
        if source is None:
            return None
        override = self._override(group, source)
        if override is not None:
            return HourlyPrice(override, OVERRIDE_SOURCE, self._clock())
        with self._lock:
            now = self._clock()
            asked = self._asked_at.get(group)
            if asked is None or now - asked >= self._refresh_s:
                self._asked_at[group] = now
                self._ask(group, source)
            return self._known.get(group)

    def per_slot(self, group: str) -> float | None:
        """USD per slot-hour of ``group``: its price over its slots per host (the
        slots its members report, :meth:`note_slots`; one until they are seen)."""
        price = self.price(group)
        if price is None:
            return None
        with self._lock:
            slots = self._slots.get(group, 1)
        return price.usd / slots

    def note_slots(self, group: str, slots: int) -> None:
        """Record that ``group``'s hosts hold ``slots`` slots each (the controller
        calls this from each listing)."""
        if slots >= 1:
            with self._lock:
                self._slots[group] = slots

    def _override(self, group: str, source: PricedGroup) -> float | None:
        """``--price`` for the group by its name, else by its lifecycle (asked of the
        group once: it may call the cloud)."""
        if group in self._overrides:
            return self._overrides[group]
        with self._lock:
            if group not in self._lifecycles:
                self._lifecycles[group] = source.group_lifecycle()
            lifecycle = self._lifecycles[group]
        return None if lifecycle is None else self._overrides.get(lifecycle.value)

    def _ask(self, group: str, source: PricedGroup) -> None:
        """Ask ``source`` for its price and keep a good answer. While the group has
        none, say so once: a warning when its cloud's price could not be read, a note
        when the group has no price to read (the local provider, a group reached
        through a test or private endpoint)."""
        try:
            answer = source.hourly_price()
            level, problem = logging.INFO, "no price from its cloud"
        except Exception as error:  # a price API's failure never fails the job
            answer = None
            level, problem = logging.WARNING, f"its price could not be read: {error}"
        if answer is not None:
            self._known[group] = answer
            return
        if group not in self._known and group not in self._warned:
            self._warned.add(group)
            _log.log(
                level,
                "group %s: %s; cost is not counted for it (give --price %s=USD_PER_HOUR)",
                group,
                problem,
                group,
            )
