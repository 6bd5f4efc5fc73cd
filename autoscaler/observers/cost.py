"""What the job cost so far: instance-hours priced at each group's price as it was then.

:class:`CostMeter` is fed, in time order, the billed members by (group, lifecycle) and
each group's price as it changes, and integrates the one over the other: a member-hour
costs the price its group had at that hour (time-weighted as prices change; the hours
before a group's first price, read off the controller's thread, at that first price). The same
meter serves the live events file and metrics (fed from the hooks) and ``spotring
report`` (fed from the events file), so both count alike. Beside the cost it keeps what
the same hours would have cost all on-demand (each hour at the job's on-demand price:
an on-demand group's own, else ``--price on-demand``), the time-weighted share of
hours on spot, the cost per committed step (the rings' commits, from their
progress), the cost per epoch and the cost per sample (the job's epochs and samples as
the workers' elastic samplers commit them).

Samples are counted from the samplers' positions (epoch x the dataset's length + the
samples processed in the epoch), not as committed steps x a global batch: the driver
does not know the script's batch, the global batch changes with the ring's size, an
epoch's last batch is short (or padded), and the steps a ring redoes after a reset
would count twice; the position counts each sample once. Without a sampler the cost per
sample is unknown (None), never 0.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from spotring.core import Instance, Lifecycle
from spotring.core.inventory import Inventory
from spotring.core.prices import HourlyPrice
from spotring.driver.ring_events import RingStatus

__all__ = ["BILLED_STATES", "Cost", "CostMeter", "LiveCost", "billed_members"]

BILLED_STATES = frozenset({"pending", "ready", "draining"})
"""Member states counted as billed (as the report's instance-hours always were)."""

ON_DEMAND = "on-demand"
SPOT = "spot"


@dataclass(frozen=True)
class Cost:
    """The job's cost so far."""

    hours: Mapping[tuple[str, str], float]
    """Instance-hours by (group, lifecycle)."""
    usd: Mapping[tuple[str, str], float]
    """USD by (group, lifecycle), for the hours whose group had a price."""
    unpriced_hours: float
    """Instance-hours of groups whose price was unknown then."""
    all_on_demand_usd: float | None
    """What the same hours would have cost on-demand; None while the job has no
    on-demand price."""
    steps: int
    """Steps the rings committed (each ring's most commits, summed over rings)."""
    epochs: float | None = None
    """Epochs the job trained in the run (its epochs at the latest commit less those at
    the first reported: a resumed job's earlier epochs are not this run's); None while
    no worker committed an elastic sampler's position."""
    samples: int | None = None
    """Samples the job trained in the run, counted as its epochs are; None while no
    worker committed an elastic sampler's position."""

    @property
    def total_usd(self) -> float:
        return sum(self.usd.values(), 0.0)

    @property
    def total_hours(self) -> float:
        return sum(self.hours.values(), 0.0)

    @property
    def spot_share(self) -> float | None:
        """The time-weighted share of instance-hours on spot; None before any."""
        total = self.total_hours
        spot = sum(h for (_, lifecycle), h in self.hours.items() if lifecycle == SPOT)
        return spot / total if total else None

    @property
    def per_step_usd(self) -> float | None:
        """USD per committed step; None before a step or while some hours are
        unpriced (a partial cost per step would flatter it)."""
        if not self.steps or self.unpriced_hours:
            return None
        return self.total_usd / self.steps

    @property
    def per_epoch_usd(self) -> float | None:
        """USD per epoch trained; None before any or while some hours are unpriced."""
        if self.epochs is None or self.epochs <= 0 or self.unpriced_hours:
            return None
        return self.total_usd / self.epochs

    @property
    def per_sample_usd(self) -> float | None:
        """USD per sample trained; None before any, without a sampler or while some
        hours are unpriced."""
        if not self.samples or self.samples < 0 or self.unpriced_hours:
            return None
        return self.total_usd / self.samples

    def record(self) -> dict[str, object]:
        """The cost as the events file's ``cost`` record holds it."""
        return {
            "usd": round(self.total_usd, 6),
            "by_group": [
                {
                    "group": group,
                    "lifecycle": lifecycle,
                    "hours": round(hours, 6),
                    "usd": None
                    if (group, lifecycle) not in self.usd
                    else round(self.usd[(group, lifecycle)], 6),
                }
                for (group, lifecycle), hours in sorted(self.hours.items())
            ],
            "unpriced_hours": round(self.unpriced_hours, 6),
            "all_on_demand_usd": None
            if self.all_on_demand_usd is None
            else round(self.all_on_demand_usd, 6),
            "spot_share": None if self.spot_share is None else round(self.spot_share, 4),
            "steps": self.steps,
            "usd_per_step": None if self.per_step_usd is None else round(self.per_step_usd, 9),
            "epochs": None if self.epochs is None else round(self.epochs, 6),
            "usd_per_epoch": None if self.per_epoch_usd is None else round(self.per_epoch_usd, 9),
            "samples": self.samples,
            "usd_per_sample": None
            if self.per_sample_usd is None
            else float(f"{self.per_sample_usd:.6g}"),
        }


class CostMeter:
    """Integrates billed members over their groups' prices; fed in time order
    (epoch seconds). Not thread-safe: its owner holds a lock.

    ``overrides``: USD per member-hour by group or lifecycle, over the prices fed (a
    group's name wins over its lifecycle), as ``--price`` is everywhere.
    """

    def __init__(self, overrides: Mapping[str, float] | None = None) -> None:
        self._overrides = dict(overrides or {})
        self._prices: dict[str, float | None] = {}
        self._lifecycles: dict[str, str] = {}  # group -> lifecycle, as its price said
        self._members: dict[tuple[str, str], int] = {}
        self._at: float | None = None
        self._hours: dict[tuple[str, str], float] = {}
        self._usd: dict[tuple[str, str], float] = {}
        self._unpriced = 0.0
        self._pending: dict[tuple[str, str], float] = {}  # hours before the group's first price
        self._all_on_demand = 0.0
        self._all_on_demand_known = True
        self._steps: dict[int, int] = {}  # ring generation -> its most commits
        self._epochs: tuple[float, float] | None = None  # the job's (first, latest) reported
        self._samples: tuple[int, int] | None = None  # the same, in samples

    def price(self, at: float, group: str, lifecycle: str | None, usd: float | None) -> None:
        """``group``'s price per member-hour from ``at`` on (None: unknown)."""
        self._advance(at)
        self._prices[group] = usd
        if lifecycle:
            self._lifecycles[group] = lifecycle

    def members(self, at: float, billed: Mapping[tuple[str, str], int]) -> None:
        """The billed members by (group, lifecycle) from ``at`` on; the group is ""
        for a job of one group."""
        self._advance(at)
        self._settle()
        self._members = {key: n for key, n in billed.items() if n}

    def progress(
        self, ring: int, steps: int, epochs: float | None = None, samples: int | None = None
    ) -> None:
        """Ring generation ``ring`` has made ``steps`` commits and the job is at
        ``epochs`` and ``samples`` (None: no sampler reported; a ring resumed from an
        older checkpoint may lower them: what it redoes is not counted again)."""
        self._steps[ring] = max(steps, self._steps.get(ring, 0))
        if epochs is not None:
            self._epochs = (epochs if self._epochs is None else self._epochs[0], epochs)
        if samples is not None:
            self._samples = (samples if self._samples is None else self._samples[0], samples)

    def cost(self, at: float) -> Cost:
        """The cost up to ``at``; the hours of a group whose price was not told yet
        count as unpriced until it is."""
        self._advance(at)
        self._settle()
        pending = sum(self._pending.values(), 0.0)
        return Cost(
            hours=dict(self._hours),
            usd=dict(self._usd),
            unpriced_hours=self._unpriced + pending,
            all_on_demand_usd=self._all_on_demand
            if self._all_on_demand_known and not pending
            else None,
            steps=sum(self._steps.values()),
            epochs=None if self._epochs is None else self._epochs[1] - self._epochs[0],
            samples=None if self._samples is None else self._samples[1] - self._samples[0],
        )

    def _advance(self, at: float) -> None:
        if self._at is not None and at > self._at:
            for key, count in self._members.items():
                self._count(key, count * (at - self._at) / 3600)
        self._at = at if self._at is None else max(at, self._at)

    def _count(self, key: tuple[str, str], hours: float) -> None:
        self._hours[key] = self._hours.get(key, 0.0) + hours
        if self._told(*key):
            self._price_hours(key, hours)
        else:  # its price is read off the controller's thread: priced once told
            self._pending[key] = self._pending.get(key, 0.0) + hours

    def _settle(self) -> None:
        """Price the hours counted before their group's first price, now that it is
        told (at the next listing or reading: a job's first prices come together)."""
        for key in [key for key in self._pending if self._told(*key)]:
            self._price_hours(key, self._pending.pop(key))

    def _told(self, group: str, lifecycle: str) -> bool:
        """Whether the group's price was told (a price event, or ``--price``)."""
        group = group or self._only_group()
        return group in self._overrides or lifecycle in self._overrides or group in self._prices

    def _price_hours(self, key: tuple[str, str], hours: float) -> None:
        group, lifecycle = key
        usd = self._price_of(group, lifecycle)
        if usd is None:
            self._unpriced += hours
        else:
            self._usd[key] = self._usd.get(key, 0.0) + hours * usd
        on_demand = usd if lifecycle == ON_DEMAND else self._on_demand_price()
        if on_demand is None:
            self._all_on_demand_known = False
        else:
            self._all_on_demand += hours * on_demand

    def _price_of(self, group: str, lifecycle: str) -> float | None:
        group = group or self._only_group()
        if group in self._overrides:
            return self._overrides[group]
        if lifecycle in self._overrides:
            return self._overrides[lifecycle]
        return self._prices.get(group)

    def _only_group(self) -> str:
        """The group a member of a one-group job (group "") belongs to: the one group
        priced; "" when there is none or several."""
        return next(iter(self._prices)) if len(self._prices) == 1 else ""

    def _on_demand_price(self) -> float | None:
        """The job's on-demand price: ``--price on-demand``, else the first on-demand
        group's."""
        if ON_DEMAND in self._overrides:
            return self._overrides[ON_DEMAND]
        for group, lifecycle in self._lifecycles.items():
            if lifecycle == ON_DEMAND and self._price_of(group, ON_DEMAND) is not None:
                return self._price_of(group, ON_DEMAND)
        return None


def billed_members(instances: Iterable[Instance]) -> dict[tuple[str, str], int]:
    """The billed members of a listing by (group, lifecycle); the group is "" for a
    job of one group."""
    billed: dict[tuple[str, str], int] = {}
    for instance in instances:
        if instance.state.value in BILLED_STATES:
            key = (instance.group or "", instance.lifecycle.value)
            billed[key] = billed.get(key, 0) + 1
    return billed


class LiveCost:
    """A :class:`CostMeter` fed from the hooks, which come on several threads: the
    events file's and the metrics' own."""

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self._meter = CostMeter()
        self._clock = clock
        self._lock = threading.Lock()

    def listed(self, inventory: Inventory) -> None:
        with self._lock:
            self._meter.members(self._clock(), billed_members(inventory.instances))

    def priced(self, group: str, lifecycle: Lifecycle | None, price: HourlyPrice | None) -> None:
        with self._lock:
            self._meter.price(
                self._clock(),
                group,
                None if lifecycle is None else lifecycle.value,
                None if price is None else price.usd,
            )

    def progressed(self, status: RingStatus) -> None:
        """A ring's progress (``spotring_ring_progress``)."""
        with self._lock:
            self._meter.progress(status.ring, status.steps, status.epochs, status.samples)

    def cost(self) -> Cost:
        with self._lock:
            return self._meter.cost(self._clock())
