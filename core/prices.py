"""What a group's members cost: one hourly price per group, and the job's book of them.

A provider (one group's client) may tell the price of one member for one hour
(:meth:`PriceSource.hourly_price`, read from its cloud's price API); ``--price
GROUP_OR_LIFECYCLE=USD`` overrides it. The controller owns one :class:`PriceBook` for
the job: its own thread asks each group at most every ``refresh_s`` and keeps the
last good answer, so a price API that fails costs one warning, never the job, and is
never retried in a tight loop, and a slow one never delays the controller.
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
    USD per member-hour; a group's own name wins over its lifecycle. Reading a price
    never calls a provider: the providers are asked by :meth:`read_due`, which the
    book's own thread (:meth:`start`) runs, so a slow price API (the GCP catalog's
    pages) never delays whoever reads (the controller's refresh). Safe from any thread.
    """

    STOP_WAIT_SECONDS = 2.0
    """The longest :meth:`stop` waits for the thread by default."""
    MIN_WAIT_SECONDS = 1.0
    """The least time between two readings, whatever ``refresh_s`` says."""

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
        self._read: set[str] = set()  # groups whose provider has answered (or failed) once
        self._warned: set[str] = set()
        self._slots: dict[str, int] = {}
        self._lifecycles: dict[str, Lifecycle | None] = {}  # as each group said, asked once
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._listed = threading.Event()
        self._listed.set()

    def wait_for_listing(self) -> None:
        """Ask no group's price until :meth:`groups_listed`: a job whose group is not
        there (a typo, a deleted group) then stops with its one line, not a price
        warning first. The controller calls it before the book's thread starts."""
        self._listed.clear()

    def groups_listed(self) -> None:
        """The groups were listed once: their prices may be asked from now on."""
        self._listed.set()

    def price(self, group: str) -> HourlyPrice | None:
        """The price of one of ``group``'s members for one hour: its override, else
        its provider's last good answer; None when unknown (not read yet included) or
        when no such group is in the job. Never calls the provider."""
        if group not in self._groups:
            return None
        override = self._override(group)
        if override is not None:
            return HourlyPrice(override, OVERRIDE_SOURCE, self._clock())
        with self._lock:
            return self._known.get(group)

    def settled(self, group: str) -> bool:
        """Whether :meth:`price` tells ``group``'s price as known for now: it is
        overridden, or its provider was asked once (its answer, or its failure, in).
        Until then its price is not known to be unknown: the controller waits to
        announce it, so the first hours are not counted unpriced."""
        if self._override(group) is not None:
            return True
        with self._lock:
            return group in self._read

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

    def read_due(self) -> float:
        """Ask each group whose price is due (never read, or read ``refresh_s`` ago)
        and not overridden; return the seconds until the next is due. Never raises:
        a failure of its own is logged and the groups are asked again after
        ``refresh_s``. On the caller's thread (the book's, or a test's)."""
        try:
            return self._read_due()
        except Exception:  # a bug of ours: logged, never the end of the prices
            _log.exception("reading the groups' prices failed; retrying in %.0fs", self._refresh_s)
            return self._refresh_s

    def start(self) -> None:
        """Start the book's thread, which runs :meth:`read_due` as the groups' prices
        fall due until :meth:`stop` (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="spotring-prices", daemon=True)
            self._thread.start()

    def stop(self, wait: float = STOP_WAIT_SECONDS) -> None:
        """Stop the book's thread, waiting at most ``wait`` seconds for it: a thread
        still in a price call (a daemon) ends with the process."""
        self._stopped.set()
        if self._thread is not None and wait > 0:
            self._thread.join(wait)

    def _run(self) -> None:
        while not self._stopped.is_set():
            self._stopped.wait(max(self.read_due(), self.MIN_WAIT_SECONDS))

    def _read_due(self) -> float:
        if not self._listed.is_set():
            return self.MIN_WAIT_SECONDS  # asked again then
        now = self._clock()
        next_due = self._refresh_s
        for group, source in self._groups.items():
            if self._stopped.is_set():
                break
            self._learn_lifecycle(group, source)
            if self._override(group) is not None:
                continue
            asked = self._asked_at.get(group)
            if asked is None or now - asked >= self._refresh_s:
                self._asked_at[group] = now
                self._ask(group, source)
            else:
                next_due = min(next_due, asked + self._refresh_s - now)
        return max(next_due, 0.0)

    def _override(self, group: str) -> float | None:
        """``--price`` for the group by its name, else by its lifecycle (once
        :meth:`read_due` has asked the group for it)."""
        if group in self._overrides:
            return self._overrides[group]
        with self._lock:
            lifecycle = self._lifecycles.get(group)
        return None if lifecycle is None else self._overrides.get(lifecycle.value)

    def _learn_lifecycle(self, group: str, source: PricedGroup) -> None:
        """Ask ``source`` its lifecycle once, unless its name is overridden or no
        lifecycle is (the answer may call the cloud; a failure is asked again)."""
        if group in self._lifecycles or group in self._overrides:
            return
        if not any(lifecycle.value in self._overrides for lifecycle in Lifecycle):
            return
        try:
            lifecycle = source.group_lifecycle()
        except Exception as error:  # asked again at the next reading
            _log.warning("group %s: its lifecycle could not be read for --price: %s", group, error)
            return
        with self._lock:
            self._lifecycles[group] = lifecycle

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
        with self._lock:
            self._read.add(group)
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
