"""``spotring run --metrics-port PORT``: the job's state for Prometheus.

:func:`run_series` builds every series of a run on a registry of its own (nothing
global), without serving it: the docs' metrics page and the tests read it from there.
:class:`Metrics` feeds those series from the same hooks as the events file (on the
threads they come on: prometheus_client's series are thread-safe) and serves them with
prometheus_client on ``--metrics-addr`` (default 127.0.0.1: put a scraper on the
driver, or open it on purpose). The docs' generated metrics page lists the series.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from spotring.autoscaler.capacity import GroupStatus
from spotring.autoscaler.observers.cost import BILLED_STATES, LiveCost
from spotring.core import CapacityShortage, Instance, InstanceState, InterruptionNotice, Lifecycle
from spotring.core.hooks import hookimpl
from spotring.core.inventory import Inventory
from spotring.core.prices import HourlyPrice
from spotring.driver.ring_events import RingStatus, Stall

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
    from prometheus_client.metrics import MetricWrapperBase


@dataclass(frozen=True)
class RunSeries:
    """Every Prometheus series of a run, on :attr:`registry` (a registry of its own)."""

    registry: CollectorRegistry
    world_size: Gauge
    hosts: Gauge
    target: Gauge
    resets: Counter
    failures: Counter
    notices: Counter
    calls: Counter
    errors: Counter
    refresh_seconds: Histogram
    instance_seconds: Counter
    since_progress: Gauge
    stall_seconds: Histogram
    group_hosts: Gauge
    group_instance_seconds: Counter
    below_target: Gauge
    group_asked: Gauge
    shortages: Counter
    fallbacks: Counter
    returns: Counter
    price: Gauge
    cost: Gauge
    all_on_demand: Gauge
    spot_share: Gauge
    steps: Gauge
    cost_per_step: Gauge
    epochs: Gauge
    cost_per_epoch: Gauge
    samples: Gauge
    cost_per_sample: Gauge

    def collectors(self) -> list[MetricWrapperBase]:
        """The series, in the order they are declared."""
        return [getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "registry"]


def run_series() -> RunSeries:
    """Every series of a run on a new registry, unserved: what ``--metrics-port``
    serves, and what the docs list."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    r = CollectorRegistry()
    series = RunSeries(
        registry=r,
        world_size=Gauge("spotring_world_size", "Workers in the current ring", registry=r),
        hosts=Gauge("spotring_hosts", "Group members by state", ["state"], registry=r),
        target=Gauge("spotring_target_hosts", "Group size spotring asks for", registry=r),
        resets=Counter("spotring_resets", "Rings re-formed after the first", registry=r),
        failures=Counter(
            "spotring_host_failures", "Hosts taken out of the job", ["reason"], registry=r
        ),
        notices=Counter("spotring_notices", "Interruption notices heard", ["kind"], registry=r),
        calls=Counter(
            "spotring_provider_api_calls", "Cloud API requests", ["provider"], registry=r
        ),
        errors=Counter(
            "spotring_provider_errors", "Failed group listings", ["provider"], registry=r
        ),
        refresh_seconds=Histogram(
            "spotring_refresh_duration_seconds",
            "Time to list the group once",
            ["provider"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        ),
        instance_seconds=Counter(
            "spotring_instance_seconds",
            "Seconds of running instances, by lifecycle",
            ["lifecycle"],
            registry=r,
        ),
        since_progress=Gauge(
            "spotring_seconds_since_progress",
            "Seconds since the ring's last commit (or its formation); 0 while none stands",
            registry=r,
        ),
        stall_seconds=Histogram(
            "spotring_stall_seconds",
            "The ring's longest time without a commit around each reset",
            buckets=(0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
            registry=r,
        ),
        group_hosts=Gauge(
            "spotring_group_hosts",
            "Members by group, lifecycle and state",
            ["group", "lifecycle", "state"],
            registry=r,
        ),
        group_instance_seconds=Counter(
            "spotring_group_instance_seconds",
            "Seconds of running instances, by group and lifecycle",
            ["group", "lifecycle"],
            registry=r,
        ),
        below_target=Gauge(
            "spotring_group_below_target_seconds",
            "Seconds the group has been below the size asked of it (0: it is not)",
            ["group"],
            registry=r,
        ),
        group_asked=Gauge(
            "spotring_group_target_hosts", "Hosts asked of each group", ["group"], registry=r
        ),
        shortages=Counter(
            "spotring_capacity_shortages",
            "Times a group was found short, by cause",
            ["group", "cause"],
            registry=r,
        ),
        fallbacks=Counter(
            "spotring_fallbacks",
            "Times a short group's shortfall was asked of another",
            ["from_group", "to_group"],
            registry=r,
        ),
        returns=Counter(
            "spotring_returns", "Fallback hosts handed back, by group", ["group"], registry=r
        ),
        price=Gauge(
            "spotring_group_price_usd_per_hour",
            "A member's price for one hour, by group (absent while unknown)",
            ["group", "source"],
            registry=r,
        ),
        cost=Gauge(
            "spotring_cost_usd",
            "The job's cost so far: billed member-hours at their group's price then",
            ["group", "lifecycle"],
            registry=r,
        ),
        all_on_demand=Gauge(
            "spotring_cost_all_on_demand_usd",
            "What the same member-hours would have cost on-demand (NaN without an on-demand price)",
            registry=r,
        ),
        spot_share=Gauge(
            "spotring_spot_share",
            "Time-weighted share of member-hours on spot (0 to 1)",
            registry=r,
        ),
        steps=Gauge(
            "spotring_committed_steps",
            "Steps the rings committed (each ring's most commits, summed)",
            registry=r,
        ),
        cost_per_step=Gauge(
            "spotring_cost_per_step_usd",
            "USD per committed step (NaN before a step or while hours are unpriced)",
            registry=r,
        ),
        epochs=Gauge(
            "spotring_trained_epochs",
            "Epochs trained in this run, as the workers' elastic samplers commit them (NaN"
            " while none did)",
            registry=r,
        ),
        cost_per_epoch=Gauge(
            "spotring_cost_per_epoch_usd",
            "USD per epoch trained (NaN before any or while hours are unpriced)",
            registry=r,
        ),
        samples=Gauge(
            "spotring_trained_samples",
            "Samples trained in this run, as the workers' elastic samplers commit them (NaN"
            " while none did)",
            registry=r,
        ),
        cost_per_sample=Gauge(
            "spotring_cost_per_sample_usd",
            "USD per sample trained (NaN before any, without an elastic sampler or while"
            " hours are unpriced)",
            registry=r,
        ),
    )
    for state in InstanceState:
        series.hosts.labels(state.value)
    for lifecycle in Lifecycle:
        series.instance_seconds.labels(lifecycle.value)
    return series


class Metrics:
    """The run's series (:func:`run_series`), fed from the hooks and served on
    ``addr:port`` until :meth:`close`."""

    def __init__(
        self,
        port: int,
        addr: str = "127.0.0.1",
        provider: str = "",
        capacity: Callable[[], Sequence[GroupStatus]] | None = None,
    ) -> None:
        from prometheus_client import start_http_server

        self.series = run_series()
        self._capacity = capacity
        self._provider = provider
        self._rings = 0
        self._group_running: dict[tuple[str, str], int] = {}  # (group, lifecycle) -> running
        self._running: dict[str, int] = {}  # lifecycle -> running instances at last refresh
        self._since = time.monotonic()
        self._lock = threading.Lock()
        self._cost = LiveCost()
        self._priced: set[tuple[str, str]] = set()  # the price series' labels
        self._server, self._thread = start_http_server(port, addr, registry=self.registry)

    @property
    def registry(self) -> CollectorRegistry:
        """The registry it serves."""
        return self.series.registry

    @property
    def port(self) -> int:
        """The port it serves on (``--metrics-port 0`` picks a free one)."""
        return int(self._server.server_address[1])

    def close(self) -> None:
        self._account_instance_seconds()
        self._server.shutdown()
        self._server.server_close()

    # ------------------------------------------------------- the job and the ring

    @hookimpl
    def spotring_ring_formed(self, size: int, hosts: Sequence[str]) -> None:
        self.series.world_size.set(size)
        with self._lock:
            self._rings += 1
            reset = self._rings > 1
        if reset:
            self.series.resets.inc()

    @hookimpl
    def spotring_ring_progress(self, status: RingStatus) -> None:
        self._cost.progressed(status)
        self._publish_cost()

    @hookimpl
    def spotring_ring_idle(self, seconds: float) -> None:
        self.series.since_progress.set(seconds)

    @hookimpl
    def spotring_ring_stalled(self, stall: Stall) -> None:
        self.series.stall_seconds.observe(stall.seconds)

    @hookimpl
    def spotring_job_finished(self) -> None:
        self.series.world_size.set(0)
        self.series.since_progress.set(0)

    # --------------------------------------------------------- the controller

    @hookimpl
    def spotring_refreshed(
        self,
        inventory: Inventory | None,
        seconds: float,
        calls: int | None,
        error: str | None,
        target: int | None,
    ) -> None:
        self.series.refresh_seconds.labels(self._provider).observe(seconds)
        if target is not None:
            self.series.target.set(target)
        if calls:
            self.series.calls.labels(self._provider).inc(calls)
        if error is not None:
            self.series.errors.labels(self._provider).inc()
            return
        if inventory is None:
            return
        self._account_instance_seconds()
        self._cost.listed(inventory)
        self._publish_cost()
        running: dict[str, int] = {}
        by_group: dict[tuple[str, str], int] = {}
        members: dict[tuple[str, str, str], int] = {}
        for state in InstanceState:
            self.series.hosts.labels(state.value).set(inventory.count(state))
        for instance in inventory.instances:
            labels = (instance.group or self._provider, instance.lifecycle.value)
            member = (*labels, instance.state.value)
            members[member] = members.get(member, 0) + 1
            if instance.state.value in BILLED_STATES:
                key = instance.lifecycle.value
                running[key] = running.get(key, 0) + 1
                by_group[labels] = by_group.get(labels, 0) + 1
        self.series.group_hosts.clear()
        for labels3, count in members.items():
            self.series.group_hosts.labels(*labels3).set(count)
        for status in self._capacity() if self._capacity is not None else ():
            self.series.below_target.labels(status.name).set(round(status.below_target_s, 3))
            self.series.group_asked.labels(status.name).set(status.asked)
        with self._lock:
            self._running = running
            self._group_running = by_group

    @hookimpl
    def spotring_host_failed(self, instance: Instance, reason: str) -> None:
        # The reason's kind, not its text: labels must stay few.
        if reason.startswith("hung:"):
            kind = "worker_hung"
        elif "exited with -" in reason:
            kind = "worker_killed"
        else:
            kind = "worker_failed"
        self.series.failures.labels(kind).inc()

    @hookimpl
    def spotring_host_noticed(
        self, instance: Instance, notice: InterruptionNotice, draining: bool
    ) -> None:
        self.series.notices.labels(notice.kind).inc()

    def _account_instance_seconds(self) -> None:
        """Add the time since the last call for the instances running then."""
        with self._lock:
            now = time.monotonic()
            elapsed, self._since = now - self._since, now
            for lifecycle, count in self._running.items():
                self.series.instance_seconds.labels(lifecycle).inc(count * elapsed)
            for (group, lifecycle), count in self._group_running.items():
                self.series.group_instance_seconds.labels(group, lifecycle).inc(count * elapsed)

    # ------------------------------------------------------------------ cost

    @hookimpl
    def spotring_price_changed(
        self, group: str, lifecycle: Lifecycle | None, price: HourlyPrice | None
    ) -> None:
        self._cost.priced(group, lifecycle, price)
        with self._lock:  # one group's series at a time: its old source goes
            for labels in [k for k in self._priced if k[0] == group]:
                self.series.price.remove(*labels)
                self._priced.discard(labels)
            if price is not None:
                self.series.price.labels(group, price.source).set(price.usd)
                self._priced.add((group, price.source))
        self._publish_cost()

    def _publish_cost(self) -> None:
        cost = self._cost.cost()
        for (group, lifecycle), usd in cost.usd.items():
            self.series.cost.labels(group or self._provider, lifecycle).set(usd)
        _set_or_nan(self.series.all_on_demand, cost.all_on_demand_usd)
        self.series.spot_share.set(cost.spot_share or 0.0)
        self.series.steps.set(cost.steps)
        _set_or_nan(self.series.cost_per_step, cost.per_step_usd)
        _set_or_nan(self.series.epochs, cost.epochs)
        _set_or_nan(self.series.cost_per_epoch, cost.per_epoch_usd)
        _set_or_nan(self.series.samples, cost.samples)
        _set_or_nan(self.series.cost_per_sample, cost.per_sample_usd)

    # ------------------------------------------------------------- capacity

    @hookimpl
    def spotring_capacity_shortage(self, group: str, shortage: CapacityShortage) -> None:
        self.series.shortages.labels(group, shortage.cause.value).inc()

    @hookimpl
    def spotring_fell_back(self, from_group: str, to_group: str, hosts: int) -> None:
        self.series.fallbacks.labels(from_group, to_group).inc()

    @hookimpl
    def spotring_returned(self, instance: Instance, group: str, seconds: float) -> None:
        self.series.returns.labels(group).inc()


def _set_or_nan(gauge: Gauge, value: float | None) -> None:
    """``gauge`` set to ``value``, or NaN while it is unknown."""
    gauge.set(math.nan if value is None else value)
