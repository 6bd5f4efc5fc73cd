"""``spotring run --metrics-port PORT``: the job's state for Prometheus.

Served by prometheus_client from a registry of the run's own (nothing global), on
``--metrics-addr`` (default 127.0.0.1: put a scraper on the driver, or open it on
purpose). Fed by the same hooks as the events file (on the threads they come on:
prometheus_client's series are thread-safe); README.md lists the series.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

from spotring.autoscaler.capacity import GroupStatus
from spotring.autoscaler.hookspecs import hookimpl
from spotring.core import CapacityShortage, Instance, InstanceState, InterruptionNotice, Lifecycle
from spotring.core.inventory import Inventory
from spotring.driver.ring_progress import Stall

_RUNNING = (InstanceState.PENDING, InstanceState.READY, InstanceState.DRAINING)
"""States in which an instance is billed."""


class Metrics:
    """The run's Prometheus series, served on ``addr:port`` until :meth:`close`."""

    def __init__(
        self,
        port: int,
        addr: str = "127.0.0.1",
        provider: str = "",
        capacity: Callable[[], Sequence[GroupStatus]] | None = None,
    ) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = CollectorRegistry()
        r = self.registry
        self.world_size = Gauge("spotring_world_size", "Workers in the current ring", registry=r)
        self.hosts = Gauge("spotring_hosts", "Group members by state", ["state"], registry=r)
        self.target = Gauge("spotring_target_hosts", "Group size spotring asks for", registry=r)
        self.resets = Counter("spotring_resets", "Rings re-formed after the first", registry=r)
        self.failures = Counter(
            "spotring_host_failures", "Hosts taken out of the job", ["reason"], registry=r
        )
        self.notices = Counter(
            "spotring_notices", "Interruption notices heard", ["kind"], registry=r
        )
        self.calls = Counter(
            "spotring_provider_api_calls", "Cloud API requests", ["provider"], registry=r
        )
        self.errors = Counter(
            "spotring_provider_errors", "Failed group listings", ["provider"], registry=r
        )
        self.refresh_seconds = Histogram(
            "spotring_refresh_duration_seconds",
            "Time to list the group once",
            ["provider"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.instance_seconds = Counter(
            "spotring_instance_seconds",
            "Seconds of running instances, by lifecycle",
            ["lifecycle"],
            registry=r,
        )
        self.since_progress = Gauge(
            "spotring_seconds_since_progress",
            "Seconds since the ring's last commit (or its formation); 0 while none stands",
            registry=r,
        )
        self.stall_seconds = Histogram(
            "spotring_stall_seconds",
            "The ring's longest time without a commit around each reset",
            buckets=(0.25, 0.5, 1, 2, 5, 10, 30, 60, 300),
            registry=r,
        )
        self.group_hosts = Gauge(
            "spotring_group_hosts",
            "Members by group, lifecycle and state",
            ["group", "lifecycle", "state"],
            registry=r,
        )
        self.group_instance_seconds = Counter(
            "spotring_group_instance_seconds",
            "Seconds of running instances, by group and lifecycle",
            ["group", "lifecycle"],
            registry=r,
        )
        self.below_target = Gauge(
            "spotring_group_below_target_seconds",
            "Seconds the group has been below the size asked of it (0: it is not)",
            ["group"],
            registry=r,
        )
        self.group_asked = Gauge(
            "spotring_group_target_hosts", "Hosts asked of each group", ["group"], registry=r
        )
        self.shortages = Counter(
            "spotring_capacity_shortages",
            "Times a group was found short, by cause",
            ["group", "cause"],
            registry=r,
        )
        self.fallbacks = Counter(
            "spotring_fallbacks",
            "Times a short group's shortfall was asked of another",
            ["from_group", "to_group"],
            registry=r,
        )
        self.returns = Counter(
            "spotring_returns", "Fallback hosts handed back, by group", ["group"], registry=r
        )
        self._capacity = capacity
        self._provider = provider
        self._rings = 0
        self._group_running: dict[tuple[str, str], int] = {}  # (group, lifecycle) -> running
        self._running: dict[str, int] = {}  # lifecycle -> running instances at last refresh
        self._since = time.monotonic()
        self._lock = threading.Lock()
        for state in InstanceState:
            self.hosts.labels(state.value)
        for lifecycle in Lifecycle:
            self.instance_seconds.labels(lifecycle.value)
        from prometheus_client import start_http_server

        self._server, self._thread = start_http_server(port, addr, registry=r)

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
        self.world_size.set(size)
        with self._lock:
            self._rings += 1
            reset = self._rings > 1
        if reset:
            self.resets.inc()

    @hookimpl
    def spotring_ring_idle(self, seconds: float) -> None:
        self.since_progress.set(seconds)

    @hookimpl
    def spotring_ring_stalled(self, stall: Stall) -> None:
        self.stall_seconds.observe(stall.seconds)

    @hookimpl
    def spotring_job_finished(self) -> None:
        self.world_size.set(0)
        self.since_progress.set(0)

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
        self.refresh_seconds.labels(self._provider).observe(seconds)
        if target is not None:
            self.target.set(target)
        if calls:
            self.calls.labels(self._provider).inc(calls)
        if error is not None:
            self.errors.labels(self._provider).inc()
            return
        if inventory is None:
            return
        self._account_instance_seconds()
        running: dict[str, int] = {}
        by_group: dict[tuple[str, str], int] = {}
        members: dict[tuple[str, str, str], int] = {}
        for state in InstanceState:
            self.hosts.labels(state.value).set(inventory.count(state))
        for instance in inventory.instances:
            labels = (instance.group or self._provider, instance.lifecycle.value)
            member = (*labels, instance.state.value)
            members[member] = members.get(member, 0) + 1
            if instance.state in _RUNNING:
                key = instance.lifecycle.value
                running[key] = running.get(key, 0) + 1
                by_group[labels] = by_group.get(labels, 0) + 1
        self.group_hosts.clear()
        for labels3, count in members.items():
            self.group_hosts.labels(*labels3).set(count)
        for status in self._capacity() if self._capacity is not None else ():
            self.below_target.labels(status.name).set(round(status.below_target_s, 3))
            self.group_asked.labels(status.name).set(status.asked)
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
        self.failures.labels(kind).inc()

    @hookimpl
    def spotring_host_noticed(
        self, instance: Instance, notice: InterruptionNotice, draining: bool
    ) -> None:
        self.notices.labels(notice.kind).inc()

    def _account_instance_seconds(self) -> None:
        """Add the time since the last call for the instances running then."""
        with self._lock:
            now = time.monotonic()
            elapsed, self._since = now - self._since, now
            for lifecycle, count in self._running.items():
                self.instance_seconds.labels(lifecycle).inc(count * elapsed)
            for (group, lifecycle), count in self._group_running.items():
                self.group_instance_seconds.labels(group, lifecycle).inc(count * elapsed)

    # ------------------------------------------------------------- capacity

    @hookimpl
    def spotring_capacity_shortage(self, group: str, shortage: CapacityShortage) -> None:
        self.shortages.labels(group, shortage.cause.value).inc()

    @hookimpl
    def spotring_fell_back(self, from_group: str, to_group: str, hosts: int) -> None:
        self.fallbacks.labels(from_group, to_group).inc()

    @hookimpl
    def spotring_returned(self, instance: Instance, group: str, seconds: float) -> None:
        self.returns.labels(group).inc()
