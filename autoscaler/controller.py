"""The controller: keeps the inventory fresh and steers the group, on its own thread.

Horovod's driver polls discovery every second under a lock, so the cloud is never
called from there: the controller refreshes on its own schedule and publishes an
immutable :class:`Inventory` that discovery reads. A failed refresh keeps the last
good inventory (and backs off); discovery never sees "no hosts" because a call failed.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import pluggy

from spotring.autoscaler.inventory import Inventory
from spotring.providers.base import ConfigurationError, Instance, Provider, ProviderError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter for failed refreshes."""

    base: float = 1.0
    cap: float = 60.0

    def delay(self, failures: int, rng: Callable[[], float] = random.random) -> float:
        """Seconds to wait after ``failures`` consecutive failures (>= 1)."""
        ceiling = min(self.cap, self.base * 2 ** (failures - 1))
        return ceiling * (0.5 + rng() / 2)


class Controller:
    """Refreshes the inventory, replaces failed hosts and steers the group's size.

    :param provider: the group to watch.
    :param hook: the plugin manager's hook relay, for the inventory/host events.
    :param refresh_interval: seconds between refreshes while the cloud answers.
    :param target_size: members to ask the group for at start; None leaves it alone.
    :param replace_failed: ask the provider to replace hosts whose workers failed.
    :param replace_grace: seconds the job must carry on without a failed host before
        it is replaced. When the whole job fails within that time (a bug in the
        training script fails every worker), the hosts were not at fault and none is
        replaced: a cloud group would otherwise replace every instance for nothing.
    """

    def __init__(
        self,
        provider: Provider,
        hook: pluggy.HookRelay | None = None,
        *,
        refresh_interval: float = 5.0,
        backoff: Backoff = Backoff(),
        target_size: int | None = None,
        replace_failed: bool = True,
        replace_grace: float = 5.0,
    ) -> None:
        self.provider = provider
        self._hook = hook
        self._refresh_interval = refresh_interval
        self._backoff = backoff
        self._target_size = target_size
        self._replace_failed = replace_failed
        self._replace_grace = replace_grace

        self._lock = threading.Lock()
        self._inventory: Inventory | None = None
        self._excluded: set[str] = set()
        self._pending_replacements: dict[str, float] = {}  # instance id -> when due
        self._failures = 0
        self._last_error: ProviderError | None = None
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._first = threading.Event()
        self._thread: threading.Thread | None = None
        self.refreshes = 0
        """Successful refreshes so far."""

    # ------------------------------------------------------------------ reading

    @property
    def inventory(self) -> Inventory | None:
        """The latest good inventory, or None before the first successful refresh."""
        return self._inventory

    @property
    def last_error(self) -> ProviderError | None:
        return self._last_error

    # ------------------------------------------------------------------ running

    def start(self) -> None:
        """Start the refresh thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="spotring-controller", daemon=True
            )
            self._thread.start()

    def stop(self) -> None:
        """Stop the refresh thread and wait for it."""
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            if self._pending_replacements:
                log.info(
                    "not replacing %s: the job ended before their grace period did",
                    ", ".join(self._pending_replacements),
                )
            self._pending_replacements.clear()

    def wait_for_inventory(self, timeout: float) -> Inventory:
        """Block until the first successful refresh.

        Raises :class:`ConfigurationError` at once if the provider reported one, and
        the last :class:`ProviderError` if no refresh succeeded within ``timeout``.
        """
        deadline = time.monotonic() + timeout
        while not self._first.wait(0.05):
            if isinstance(self._last_error, ConfigurationError):
                raise self._last_error
            if time.monotonic() > deadline:
                raise self._last_error or ProviderError(
                    f"no answer from {self.provider.describe()} within {timeout:.0f}s"
                )
        assert self._inventory is not None
        return self._inventory

    def request_refresh(self) -> None:
        """Refresh now instead of at the next interval."""
        self._wake.set()

    def _run(self) -> None:
        if self._target_size is not None:
            self._steer(self._target_size)
        while not self._stopped.is_set():
            next_replacement = self._replace_pending()
            ok = self.refresh()
            # A configuration error will not go away by itself: no point backing off.
            backing_off = not ok and not isinstance(self._last_error, ConfigurationError)
            delay = self._backoff.delay(self._failures) if backing_off else self._refresh_interval
            if next_replacement is not None:
                delay = min(delay, next_replacement)
            self._wake.wait(delay)
            self._wake.clear()

    # --------------------------------------------------------------- refreshing

    def refresh(self) -> bool:
        """List the group once and publish a new inventory. Returns False on failure."""
        try:
            instances = tuple(self.provider.list_instances())
        except ProviderError as error:
            self._failures += 1
            self._last_error = error
            log.warning(
                "refresh of %s failed (%d in a row), keeping the last inventory: %s",
                self.provider.describe(),
                self._failures,
                error,
            )
            return False
        if self._failures:
            log.info(
                "refresh of %s recovered after %d failures",
                self.provider.describe(),
                self._failures,
            )
        self._failures = 0
        self._last_error = None
        with self._lock:
            listed = {i.id for i in instances}
            # Forget exclusions once the cloud stops listing the member.
            self._excluded &= listed
            old = self._inventory
            generation = old.generation + 1 if old else 1
            new = Inventory(instances, generation, time.monotonic(), frozenset(self._excluded))
            self._inventory = new
        self.refreshes += 1
        self._first.set()
        self._announce(old, new)
        return True

    def _announce(self, old: Inventory | None, new: Inventory) -> None:
        before = {i.id: i for i in old.ready} if old else {}
        after = {i.id: i for i in new.ready}
        added = [i for key, i in after.items() if key not in before]
        removed = [i for key, i in before.items() if key not in after]
        if (added or removed) and self._hook is not None:
            self._hook.spotring_inventory_changed(
                added=added, removed=removed, ready=list(after.values())
            )

    # ----------------------------------------------------------------- failures

    def host_failed(self, address: str, reason: str) -> Instance | None:
        """Take the member at ``address`` out of the job now and have it replaced.

        Called by the worker launcher the moment a worker exits with an error, so the
        host leaves discovery at once instead of when the cloud notices. Returns the
        instance, or None when no listed member has that address.
        """
        with self._lock:
            inventory = self._inventory
            instance = inventory.by_address(address) if inventory else None
            if instance is None or instance.id in self._excluded:
                return instance
            self._excluded.add(instance.id)
            self._inventory = inventory.with_excluded([instance.id])
            if self._replace_failed:
                due = time.monotonic() + self._replace_grace
                self._pending_replacements.setdefault(instance.id, due)
        log.info("host %s (%s) taken out of the job: %s", address, instance.id, reason)
        if self._hook is not None:
            self._hook.spotring_host_failed(instance=instance, reason=reason)
            self._announce(inventory, self._inventory)
        self._wake.set()
        return instance

    def _replace_pending(self) -> float | None:
        """Replace the failed hosts whose grace period is over.

        Returns seconds until the next one is due, or None when none is pending.
        """
        now = time.monotonic()
        with self._lock:
            due = [i for i, at in self._pending_replacements.items() if at <= now]
        for instance_id in due:
            try:
                self.provider.replace_instance(instance_id)
                log.info("asked %s to replace %s", self.provider.describe(), instance_id)
            except ProviderError as error:
                log.warning("could not replace %s, will retry: %s", instance_id, error)
                continue
            with self._lock:
                self._pending_replacements.pop(instance_id, None)
        with self._lock:
            upcoming = [at for i, at in self._pending_replacements.items() if i not in due]
        return max(0.0, min(upcoming) - now) if upcoming else None

    # ------------------------------------------------------------------ steering

    def _steer(self, size: int) -> None:
        limits = self.provider.size_limits()
        if limits is not None:
            low, high = limits
            if not low <= size <= high:
                log.warning(
                    "target of %d hosts is outside the group's limits [%d, %d]; using %d",
                    size,
                    low,
                    high,
                    min(max(size, low), high),
                )
                size = min(max(size, low), high)
        try:
            self.provider.set_target_size(size)
            log.info("asked %s for %d hosts", self.provider.describe(), size)
        except ProviderError as error:
            log.warning("could not resize %s: %s", self.provider.describe(), error)


def hosts_for_slots(num_proc: int, slots_per_host: int) -> int:
    """Hosts needed to run ``num_proc`` workers at ``slots_per_host`` each."""
    return max(1, math.ceil(num_proc / max(1, slots_per_host)))
