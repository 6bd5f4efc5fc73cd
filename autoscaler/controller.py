"""The controller: keeps the inventory fresh and steers the group, on its own thread.

Horovod's driver polls discovery every second under a lock, so the cloud is never
called from there: the controller refreshes on its own schedule and publishes an
immutable :class:`Inventory` that discovery reads. A failed refresh keeps the last
good inventory (and backs off); discovery never sees "no hosts" because a call failed.

Every call into the provider and every hook the controller calls runs on the
controller's thread, with one exception: ``spotring_drain_on_notice``, which
:meth:`Controller.host_noticed` calls on the launcher's thread that heard the notice,
so the host leaves discovery at once. The provider's notice watchers are asked for
on the controller's thread too, as hosts are listed, and handed out from there. The
thread never dies silently: a retryable :class:`ProviderError` is retried with
backoff; anything else (a :class:`ConfigurationError`, a provider's or plugin's bug, a
decision hook that raises, wherever it runs) stops the controller with one message,
which :meth:`Controller.wait_for_inventory` raises and
:meth:`Controller.wait_for_fatal_error` hands to whoever runs the job.

Events reach the plugins through the plugin manager's hook relay (``pm.hook``); the
manager (:class:`spotring.autoscaler.plugins.SpotringPluginManager`) keeps one
plugin's error from the others and from the controller.
"""

from __future__ import annotations

import logging
import queue
import random
import threading
import time
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

import pluggy

from spotring.autoscaler.capacity import CapacityOptions, CapacityPolicy, GroupStatus
from spotring.autoscaler.group_set import GroupSet
from spotring.core import (
    Instance,
    InstanceState,
    InterruptionNotice,
    Lifecycle,
    ProviderError,
    is_valid_address,
)
from spotring.core.inventory import Inventory
from spotring.core.job import JobShape
from spotring.providers.base import Provider

log = logging.getLogger(__name__)

T = TypeVar("T")

__all__ = ["Backoff", "Controller", "ControllerError"]


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with jitter for failed refreshes."""

    base: float = 1.0
    cap: float = 60.0

    def delay(self, failures: int, rng: Callable[[], float] = random.random) -> float:
        """Seconds to wait after ``failures`` consecutive failures (>= 1)."""
        ceiling = min(self.cap, self.base * 2 ** (failures - 1))
        return ceiling * (0.5 + rng() / 2)


class ControllerError(ProviderError):
    """A provider or plugin raised something other than a :class:`ProviderError`: a bug.

    Not retryable; the message names where it happened."""

    retryable = False


class Controller:
    """Refreshes the inventory, replaces failed hosts and steers the group's size.

    :param provider: the group to watch.
    :param hook: the plugin manager's hook relay: decisions and events (default: a
        manager with spotring's built-in plugins only).
    :param job: the job's limits and steering options; None never steers or replaces
        (as for ``spotring discover``).
    :param refresh_interval: seconds between refreshes while the cloud answers.
    :param replace_grace: seconds the job must carry on without a failed host before
        it is replaced. When the whole job fails within that time (a bug in the
        training script fails every worker), the hosts were not at fault and none is
        replaced: a cloud group would otherwise replace every instance for nothing.
    :param readmit_after: seconds a failed host stays out of discovery (the lower end of
        ``--blacklist-cooldown-range``; Horovod's own blacklist then decides); None
        keeps it out until the cloud stops listing it, as Horovod does without a range.
    :param capacity: the capacity policy's options, for a job of several groups (a
        :class:`GroupSet` of more than one): the job's size is split across them, a
        short group's shortfall asked of the next, and fallback hosts handed back at a
        commit once a preferred group has capacity again.
    :param capacity_clock: the capacity policy's clock (seconds, monotonic): tests
        pass a fake one to pass its backoffs and waits without sleeping.
    """

    RETURN_LEAVE_SECONDS = 300.0
    """The longest a host being handed back waits for a ring formed without it before
    its group is shrunk anyway (no ring may be forming at all). Generous: the ring
    leaves it at its next commit, and a job may commit minutes apart; shrinking the
    group before then would kill its workers mid-step (a roll back)."""
    RETURN_GONE_SECONDS = 600.0
    """The longest a host handed back may stay listed before another may go."""
    RETURN_NOTICE = "return"
    """The notice kind a host handed back drains with (as a noticed preemption)."""

    def __init__(
        self,
        provider: Provider,
        hook: pluggy.HookRelay | None = None,
        *,
        job: JobShape | None = None,
        refresh_interval: float = 5.0,
        backoff: Backoff = Backoff(),
        replace_grace: float = 5.0,
        readmit_after: float | None = None,
        capacity: CapacityOptions | None = None,
        capacity_clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if hook is None:
            from spotring.autoscaler.plugins import get_plugin_manager

            hook = get_plugin_manager(load_entry_points=False).hook
        self.provider = provider
        self._hook = hook
        self._job = job
        self._refresh_interval = refresh_interval
        self._backoff = backoff
        self._replace_grace = replace_grace
        self._readmit_after = readmit_after

        self._lock = threading.Lock()  # guards the fields below up to _failed_hosts
        self._instances: tuple[Instance, ...] = ()
        self._inventory: Inventory | None = None
        self._excluded: dict[str, float | None] = {}  # instance id -> readmit at (monotonic)
        self._failed_hosts: queue.SimpleQueue[tuple[Instance, str]] = queue.SimpleQueue()
        self._notices: dict[str, InterruptionNotice] = {}  # instance id -> draining notice
        self._noticed_hosts: queue.SimpleQueue[tuple[Instance, InterruptionNotice, bool]] = (
            queue.SimpleQueue()
        )
        # instance id -> its notice watcher, asked of the provider on the controller's
        # thread as the member is first listed; replaced whole, read from any thread.
        self._watchers: dict[str, dict[str, Any] | None] = {}

        # Only the controller thread touches these.
        self._announced: dict[str, Instance] = {}
        self._cloud_failures: dict[str, str] = {}  # instance id -> failure decided on
        self._pending_replacements: dict[str, float] = {}  # instance id -> when due
        self._target: int | None = None
        self._invalid_addresses: set[str] = set()
        self._failures = 0
        # The capacity policy, for a job of several groups: made at its first steering.
        self._capacity_options = capacity or CapacityOptions()
        self._capacity_clock = capacity_clock
        self._policy: CapacityPolicy | None = None
        self._group_asked: dict[str, int] = {}  # group -> size it last accepted
        self._group_limits: dict[str, int] | None = None
        self._members: dict[str, tuple[str, Lifecycle]] = {}  # live id -> (group, lifecycle)
        self._not_preempted: set[str] = set()  # ids that left at spotring's request
        self._return: _Return | None = None
        # The last ring's hosts and when it formed (monotonic), from Horovod's thread.
        self._ring: tuple[float, frozenset[str]] = (0.0, frozenset())
        self._offered: frozenset[str] | None = None
        """What discovery last offered Horovod (:meth:`hosts_offered`); None before it
        says (no driver: every ready host counts)."""

        self._last_error: ProviderError | None = None
        self._fatal: ProviderError | None = None
        self._fatal_event = threading.Event()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._first = threading.Event()
        self._thread: threading.Thread | None = None
        self.refreshes = 0
        """Successful refreshes so far."""
        self.capacity_status: tuple[GroupStatus, ...] = ()
        """Each group's status after the last capacity steering (a job of several
        groups; empty otherwise): replaced whole, readable from any thread."""

    # ------------------------------------------------------------------ reading

    @property
    def inventory(self) -> Inventory | None:
        """The latest good inventory, or None before the first successful refresh."""
        return self._inventory

    @property
    def last_error(self) -> ProviderError | None:
        """The error of the last failed refresh, None once one succeeds."""
        return self._last_error

    @property
    def target_size(self) -> int | None:
        """The group size spotring last asked for, None before it asked."""
        return self._target

    def instance_id(self, address: str) -> str | None:
        """The id of the member at ``address`` (for ssh host-key pinning)."""
        inventory = self._inventory
        instance = inventory.by_address(address) if inventory else None
        return instance.id if instance else None

    # ------------------------------------------------------------------ running

    def start(self) -> None:
        """Start the controller thread (idempotent)."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name="spotring-controller", daemon=True
            )
            self._thread.start()

    STOP_WAIT_SECONDS = 10.0

    def stop(self) -> None:
        """Stop the controller thread and wait for it, at most :data:`STOP_WAIT_SECONDS`:
        a stop (Ctrl-C included) must not wait out a cloud call's retries. The thread is a
        daemon; one still in a call ends with the process."""
        self._stopped.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(self.STOP_WAIT_SECONDS)
            if self._thread.is_alive():
                log.warning(
                    "the controller is still in a call to %s; not waiting for it",
                    self.provider.describe(),
                )
        if self._pending_replacements:
            log.info(
                "not replacing %s: the job ended before their grace period did",
                ", ".join(self._pending_replacements),
            )
        self._pending_replacements.clear()

    def wait_for_inventory(self, timeout: float) -> Inventory:
        """Block until the first successful refresh.

        Raises the controller's fatal error at once (a :class:`ConfigurationError` such
        as a missing group), and the last :class:`ProviderError` if no refresh
        succeeded within ``timeout``.
        """
        deadline = time.monotonic() + timeout
        while not self._first.wait(0.05):
            if self._fatal is not None:
                raise self._fatal
            if time.monotonic() > deadline:
                raise self._last_error or ProviderError(
                    f"no answer from {self.provider.describe()} within {timeout:.0f}s"
                )
        assert self._inventory is not None
        return self._inventory

    def wait_for_fatal_error(self, timeout: float | None = None) -> ProviderError | None:
        """Block until the controller stops on an error it cannot retry; that error, or
        None if ``timeout`` passes first."""
        self._fatal_event.wait(timeout)
        return self._fatal

    def request_refresh(self) -> None:
        """Refresh now instead of at the next interval."""
        self._wake.set()

    def step(self) -> tuple[bool, float | None]:
        """One pass of the controller's loop, on the caller's thread: take reported
        failures and notices, refresh, decide about members the cloud reports failed,
        steer the size, announce changes, replace the hosts that are due.

        Returns whether the refresh succeeded and the seconds until the next
        replacement is due (None when none is pending). Raises what the loop would
        stop on. The thread started by :meth:`start` calls it; embedders and tests may
        call it instead of starting the thread.
        """
        self._take_noticed_hosts()
        self._take_failed_hosts()
        refreshed = self.refresh()
        if refreshed:
            self._take_cloud_failures()
        if refreshed and self._job is not None and self.provider.can_resize:
            self._steer()
            self._steer_capacity()
            self._call("keeping the group's size", self.provider.keep_size)
        self._announce()
        return refreshed, self._replace_due()

    def _run(self) -> None:
        try:
            while not self._stopped.is_set():
                refreshed, next_replacement = self.step()
                self._wait(refreshed, next_replacement)
        except ProviderError as error:
            self._fail(error)
        except Exception as error:  # a bug of ours: still never die silently
            self._fail(_unexpected("spotring's controller", error))

    def _wait(self, refreshed: bool, next_replacement: float | None) -> None:
        delay = self._refresh_interval if refreshed else self._backoff.delay(self._failures)
        if next_replacement is not None:
            delay = min(delay, next_replacement)
        readmit = self._next_readmission()
        if readmit is not None:
            delay = min(delay, readmit)
        self._wake.wait(delay)
        self._wake.clear()

    def fail(self, error: ProviderError) -> None:
        """Stop for good with ``error``, from any thread (the first error wins): the job
        stops as on the controller's own fatal errors, workers first, and ``error`` is
        the run's one line. For what the job needs besides its group (its checkpoint
        lock)."""
        self._fail(error)

    def _fail(self, error: ProviderError) -> None:
        """Stop for good with ``error`` (the first one wins), from any thread."""
        with self._lock:
            if self._fatal is not None:
                return
            self._fatal = error
        # Whoever runs the job reports it, once: the CLI as its one line.
        log.info("%s: controller stopped: %s", self.provider.describe(), error)
        self._stopped.set()
        self._wake.set()
        self._fatal_event.set()

    # --------------------------------------------------------------- refreshing

    def refresh(self) -> bool:
        """List the group once and publish a new inventory. Returns False when the
        listing failed and will be retried; raises a non-retryable error."""
        started = time.monotonic()
        error: ProviderError | None = None
        try:
            return self._refresh()
        except ProviderError as failed:
            error = failed
            raise
        finally:
            error = error or self._last_error
            self._emit(
                "spotring_refreshed",
                inventory=self._inventory,
                seconds=time.monotonic() - started,
                calls=self.provider.last_refresh_calls,
                error=str(error) if error is not None else None,
                target=self._target,
            )

    def _refresh(self) -> bool:
        try:
            instances = tuple(self._call("listing the group", self.provider.list_instances))
        except ProviderError as error:
            if not error.retryable:
                raise
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
        self._warn_invalid_addresses(instances)
        watchers = self._notice_watchers(instances)
        with self._lock:
            self._watchers = watchers
            self._instances = instances
            listed = {i.id for i in instances}
            # Forget exclusions and notices once the cloud stops listing the member.
            self._excluded = {i: at for i, at in self._excluded.items() if i in listed}
            self._notices = {i: n for i, n in self._notices.items() if i in listed}
            self._publish(new_generation=True)
        self.refreshes += 1
        self._first.set()
        return True

    def _publish(self, new_generation: bool = False) -> None:
        """Build the inventory from the last listing and the exclusions (lock held)."""
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

    def _notice_watchers(self, instances: tuple[Instance, ...]) -> dict[str, dict[str, Any] | None]:
        """Each usable member's notice watcher: asked of the provider once per member,
        here on the controller's thread, before discovery can offer the host (a worker
        is started only on a host of a published inventory). None without a job (as for
        ``spotring discover``): a listing asks for nothing more."""
        watchers: dict[str, dict[str, Any] | None] = {}
        if self._job is None:
            return watchers
        for instance in instances:
            if instance.id in self._watchers:
                watchers[instance.id] = self._watchers[instance.id]
            elif instance.state in (InstanceState.PENDING, InstanceState.READY):
                try:
                    watcher = self._call(
                        "the provider's notice watcher", self.provider.notice_watcher, instance
                    )
                except ProviderError as error:
                    if not error.retryable:
                        raise
                    log.warning("no notice watcher for %s yet: %s", instance.id, error)
                    continue
                watchers[instance.id] = dict(watcher) if watcher else None
        return watchers

    def _warn_invalid_addresses(self, instances: tuple[Instance, ...]) -> None:
        for instance in instances:
            if (
                instance.state is InstanceState.READY
                and instance.address
                and not is_valid_address(instance.address)
                and instance.id not in self._invalid_addresses
            ):
                self._invalid_addresses.add(instance.id)
                log.warning(
                    "%s: member %s has address %r, which is not a host name or IP address;"
                    " it is left out",
                    self.provider.describe(),
                    instance.id,
                    instance.address,
                )

    def _announce(self) -> None:
        """Tell the plugins how the READY set changed since they last heard."""
        inventory = self._inventory
        if inventory is None:
            return
        after = {i.id: i for i in inventory.ready}
        added = [i for key, i in after.items() if key not in self._announced]
        removed = [i for key, i in self._announced.items() if key not in after]
        self._announced = after
        if added or removed:
            self._emit(
                "spotring_inventory_changed",
                added=added,
                removed=removed,
                ready=list(after.values()),
            )

    # ----------------------------------------------------------------- failures

    def host_failed(self, address: str, reason: str) -> Instance | None:
        """Take the member at ``address`` out of the job now.

        Called by the worker launcher (on its thread) the moment a worker exits with an
        error, so the host leaves discovery at once instead of when the cloud notices.
        The plugins hear of it, and the replacement is decided, on the controller
        thread. Returns the instance, or None when no listed member has that address.
        """
        with self._lock:
            inventory = self._inventory
            instance = inventory.by_address(address) if inventory else None
            if instance is None or instance.id in self._excluded:
                return instance
            handed_back = self._return is not None and self._return.instance.id == instance.id
            if handed_back:  # its workers stopped as it left: no failure, no replacement
                log.info("host %s (%s) is being handed back: %s", address, instance.id, reason)
                return instance
            self._excluded[instance.id] = (
                None if self._readmit_after is None else time.monotonic() + self._readmit_after
            )
            self._publish()
        log.info("host %s (%s) taken out of the job: %s", address, instance.id, reason)
        self._failed_hosts.put((instance, reason))
        self._wake.set()
        return instance

    def host_noticed(self, address: str, notice: InterruptionNotice) -> bool:
        """The host at ``address`` announced that the cloud will take it.

        Called by the launcher (on its thread) the moment a verified notice arrives.
        Unless the ``spotring_drain_on_notice`` hook, called here on the caller's thread,
        says otherwise, the host is DRAINING with its notice from now on and leaves
        discovery at once: Horovod re-forms the ring without it at the next commit. The
        plugins (``spotring_host_noticed``) and the provider hear of it on the
        controller's thread. Returns whether it drains; a notice for an address that is
        not a member of the group is ignored (False). A drain hook that raises stops the
        controller, and with it the job, with its message (False).
        """
        inventory = self._inventory
        instance = inventory.by_address(address) if inventory else None
        if instance is None:
            log.warning("ignored a notice for %s: not a member of the group", address)
            return False
        if instance.notice == notice:
            return True  # the same notice from another worker of that host
        assert inventory is not None  # the instance came from it
        if not any(i.id != instance.id for i in inventory.ready):
            # Horovod re-forms a ring only around a host of the previous one: with no
            # other host to carry the state, keep training until the cloud takes it.
            log.warning("host %s announced %s, but no other host could carry on; staying",
                        address, notice.kind)  # fmt: skip
            return False
        try:
            drain = self._job is None or bool(
                self._call(
                    "the spotring_drain_on_notice hook",
                    self._hook.spotring_drain_on_notice,
                    instance=instance,
                    notice=notice,
                    job=self._job,
                )
            )
        except ProviderError as error:  # a plugin's bug: the job stops with its message
            self._fail(error)
            return False
        if drain:
            with self._lock:
                self._notices[instance.id] = notice
                self._publish()
        log.info("host %s (%s) announced %s%s", address, instance.id, notice.kind,
                 "; leaving the job" if drain else "")  # fmt: skip
        self._noticed_hosts.put((instance, notice, drain))
        self._wake.set()
        return drain

    def _take_noticed_hosts(self) -> None:
        while True:
            try:
                instance, notice, drain = self._noticed_hosts.get_nowait()
            except queue.Empty:
                return
            self._emit("spotring_host_noticed", instance=instance, notice=notice, draining=drain)
            if notice.kind != "rebalance":
                self._preempted(instance.id)
            try:
                self._call("starting a replacement", self.provider.host_noticed, instance, notice)
            except ProviderError as error:  # the group still replaces it after the reclaim
                log.warning("could not start a replacement for %s early: %s", instance.id, error)

    def ring_formed(self, hosts: Sequence[str]) -> list[str]:
        """Horovod formed a ring of ``hosts`` (called on Horovod's thread; quick, no
        cloud). Returns the addresses of hosts being handed back that have left the
        ring: their workers are stopped, and their group shrinks at the controller's
        next step."""
        self._ring = (time.monotonic(), frozenset(hosts))
        handing = self._return
        if handing is None or handing.instance.address in hosts:
            return []
        self._wake.set()
        return [handing.instance.address]

    def hosts_offered(self, hosts: Collection[str]) -> None:
        """The hosts discovery last offered Horovod (READY and, with warm starts, their
        workers waiting in ``hvd.init``): called by the driver's discovery on Horovod's
        thread about once a second; only stores them. A fallback host is handed back
        only while the job keeps its size in offered hosts without it."""
        self._offered = frozenset(hosts)

    def notice_watcher(self, address: str) -> dict[str, Any] | None:
        """The notice watcher for the host at ``address`` (``Provider.notice_watcher``),
        as the controller's thread asked for it when the host was listed: callable from
        any thread (Horovod's, as it starts a worker), it never calls the provider."""
        inventory = self._inventory
        instance = inventory.by_address(address) if inventory else None
        if instance is None:
            return None
        watcher = self._watchers.get(instance.id)
        return dict(watcher) if watcher else None

    def _take_failed_hosts(self) -> None:
        while True:
            try:
                instance, reason = self._failed_hosts.get_nowait()
            except queue.Empty:
                return
            self._host_failed(instance, reason, self._replace_grace)

    def _take_cloud_failures(self) -> None:
        """Members the cloud reports failed for good (:attr:`Instance.failure`: an
        evicted spot VM kept deallocated, a VM that never provisioned) are failed hosts,
        each decided on once while the cloud lists it so. Their replacement is due at
        once: the cloud, not a failing job, said they failed."""
        inventory = self._inventory
        failed = {i.id: i for i in inventory.instances if i.failure} if inventory else {}
        self._cloud_failures = {
            key: reason for key, reason in self._cloud_failures.items() if key in failed
        }
        for key, instance in failed.items():
            if key in self._cloud_failures:
                continue
            self._cloud_failures[key] = instance.failure
            log.info("%s: member %s failed: %s", self.provider.describe(), key, instance.failure)
            self._host_failed(instance, instance.failure, 0.0)

    def _host_failed(self, instance: Instance, reason: str, grace: float) -> None:
        """Tell the plugins, and let ``spotring_replace_host`` decide whether the
        member is replaced once ``grace`` seconds have passed."""
        self._emit("spotring_host_failed", instance=instance, reason=reason)
        if self._job is None or not self.provider.can_replace:
            return
        replace = self._call(
            "the spotring_replace_host hook",
            self._hook.spotring_replace_host,
            instance=instance,
            reason=reason,
            job=self._job,
        )
        if not replace:
            log.info("not replacing %s (%s): spotring_replace_host said no", instance.id,
                     reason)  # fmt: skip
            return
        due = time.monotonic() + grace
        self._pending_replacements[instance.id] = min(
            due, self._pending_replacements.get(instance.id, due)
        )

    def _next_readmission(self) -> float | None:
        """Seconds until the next excluded host is readmitted (republishing the
        inventory for those whose time has come), or None when none is waiting."""
        with self._lock:
            now = time.monotonic()
            times = [at for at in self._excluded.values() if at is not None]
            if any(at <= now for at in times):
                self._publish()
                times = [at for at in self._excluded.values() if at is not None]
        return max(0.0, min(times) - now) if times else None

    def _replace_due(self) -> float | None:
        """Replace the failed hosts whose grace period is over.

        Returns seconds until the next one is due, or None when none is pending.
        """
        now = time.monotonic()
        for instance_id, at in list(self._pending_replacements.items()):
            if at > now:
                continue
            try:
                self._call("replacing a host", self.provider.replace_instance, instance_id)
            except ProviderError as error:
                if not error.retryable:
                    raise
                log.warning("could not replace %s, will retry: %s", instance_id, error)
                self._pending_replacements[instance_id] = now + self._refresh_interval
                continue
            log.info("asked %s to replace %s", self.provider.describe(), instance_id)
            del self._pending_replacements[instance_id]
            self._not_preempted.add(instance_id)
        upcoming = self._pending_replacements.values()
        return max(0.0, min(upcoming) - now) if upcoming else None

    # ------------------------------------------------------------------ steering

    def _steer(self) -> None:
        assert self._job is not None and self._inventory is not None
        wanted = self._call(
            "the spotring_target_size hook",
            self._hook.spotring_target_size,
            inventory=self._inventory,
            job=self._job,
            current_target=self._target,
        )
        if wanted is None or wanted == self._target:
            return
        limits = self._call("reading the group's limits", self.provider.size_limits)
        size = int(wanted)
        if limits is not None:
            low, high = limits
            size = min(max(size, low), high)
            if size != wanted and size != self._target:
                log.warning(
                    "target of %d hosts is outside the group's limits [%d, %d]; using %d",
                    wanted,
                    low,
                    high,
                    size,
                )
        if size == self._target:
            return
        try:
            self._call("resizing the group", self.provider.set_target_size, size)
        except ProviderError as error:
            if not error.retryable:
                raise
            log.warning("could not resize %s, will retry: %s", self.provider.describe(), error)
            return
        self._target = size
        log.info("asked %s for %d hosts", self.provider.describe(), size)

    # ------------------------------------------------------------------ capacity

    def _steer_capacity(self) -> None:
        """Split the job's size across its groups (a job of several), fall back from
        short groups, and hand fallback hosts back one at a time, at a commit."""
        groups = self.provider
        if not isinstance(groups, GroupSet) or not groups.several or groups.total is None:
            return
        assert self._job is not None and self._inventory is not None
        policy = self._capacity_policy(groups)
        inventory = self._inventory
        live = {name: self._live_members(name) for name in policy.groups}
        ready: dict[str, list[str]] = {name: [] for name in policy.groups}
        for instance in inventory.ready:
            if instance.group in ready:
                ready[instance.group].append(instance.id)
        self._count_preemptions(inventory)
        for name in policy.groups:
            policy.observe(name, live[name], len(ready[name]))
            shortage = None
            since = policy.below_since_wall(name) if policy.wants_signal(name) else None
            if since is not None:
                try:
                    shortage = self._call(
                        f"asking {name} for a capacity shortage",
                        groups.group(name).capacity_shortage,
                        since,
                    )
                except ProviderError as error:
                    if not error.retryable:
                        raise
                    log.warning("could not ask %s for a capacity shortage: %s", name, error)
            decision = policy.report_shortage(name, shortage)
            if decision is not None and decision.shortage is not None:
                log.warning("group %s is short: %s", name, decision.shortage.describe())
                self._emit("spotring_capacity_shortage", group=name, shortage=decision.shortage)
        job = self._job
        order = self._call(
            "the spotring_order_groups hook",
            self._hook.spotring_order_groups,
            groups=policy.statuses(),
            job=job,
        )

        def allow(group: str, short: str, hosts: int) -> bool:
            answer = self._call(
                "the spotring_fall_back hook",
                self._hook.spotring_fall_back,
                group=policy.status(group),
                short=policy.status(short),
                hosts=hosts,
                job=job,
            )
            return answer is None or bool(answer)

        if self._group_limits is None:
            self._group_limits = self._call("reading the groups' limits", groups.group_limits)
        order = list(order) if order is not None else None
        asked, decisions = policy.distribute(groups.total, order, allow, self._group_limits)
        for decision in decisions:
            log.warning("asking %s for %d hosts %s cannot supply", decision.to_group,
                        decision.hosts, decision.group)  # fmt: skip
            self._emit("spotring_fell_back", from_group=decision.group,
                       to_group=decision.to_group, hosts=decision.hosts)  # fmt: skip
        for name, size in asked.items():
            if self._group_asked.get(name) == size or not groups.group(name).can_resize:
                continue
            try:
                self._call(f"resizing {name}", groups.set_group_size, name, size)
            except ProviderError as error:
                if not error.retryable:
                    raise
                log.warning("could not resize %s, will retry: %s", name, error)
                continue
            self._group_asked[name] = size
            log.info("asked %s for %d hosts", name, size)
        offered = self._offered
        if offered is not None:
            # Only hosts Horovod is offered count toward the job's size: a spot host
            # still starting its warm worker is not yet one the ring can re-form onto,
            # and handing a fallback host back before it is would train the ring small.
            addresses = {i.id: i.address for i in inventory.ready}
            ready = {
                name: [key for key in ids if addresses[key] in offered]
                for name, ids in ready.items()
            }
        self._hand_back(groups, policy, ready, order)
        self.capacity_status = tuple(policy.statuses())

    def _live_members(self, group: str) -> list[str]:
        """Ids of ``group``'s members the cloud bills and keeps: starting, up or
        draining, and not failed."""
        billed = (InstanceState.PENDING, InstanceState.READY, InstanceState.DRAINING)
        return [
            i.id
            for i in self._instances
            if i.group == group and i.state in billed and not i.failure
        ]

    def _capacity_policy(self, groups: GroupSet) -> CapacityPolicy:
        if self._policy is None:
            lifecycles = {
                name: self._call(f"reading {name}'s lifecycle", groups.lifecycle, name)
                for name in groups.names()
            }
            self._policy = CapacityPolicy(
                groups.names(),
                self._capacity_options,
                lifecycles=lifecycles,
                clock=self._capacity_clock,
            )
        return self._policy

    def _count_preemptions(self, inventory: Inventory) -> None:
        """A spot member the cloud took (it left the listing, or is going, failed)
        without spotring asking counts against its group: 3 in an hour demote it.
        Only a member that ran counts: one that failed or went while it was being
        created is a launch that failed (the group's capacity shortage says so), not
        a preemption."""
        current: dict[str, tuple[str, Lifecycle]] = {}
        gone: list[str] = []
        for instance in inventory.instances:
            taken = instance.failure or instance.state in (
                InstanceState.TERMINATING,
                InstanceState.GONE,
            )
            if taken:
                gone.append(instance.id)
            elif instance.group and (
                instance.state is InstanceState.READY or instance.id in self._members
            ):
                current[instance.id] = (instance.group, instance.lifecycle)
        gone += [key for key in self._members if key not in current and key not in gone]
        for key in gone:
            if key in self._members:
                self._preempted(key)
        self._members = current
        listed = {i.id for i in inventory.instances}
        self._not_preempted &= listed  # forgotten once the cloud stops listing them

    def _preempted(self, instance_id: str) -> None:
        member = self._members.pop(instance_id, None)
        if member is None or instance_id in self._not_preempted or self._policy is None:
            return
        self._not_preempted.add(instance_id)  # counted once
        group, lifecycle = member
        if lifecycle is not Lifecycle.SPOT:
            return
        decision = self._policy.preempted(group)
        if decision is not None and decision.until is not None:
            log.warning("group %s was preempted often: asked after the others for an hour",
                        group)  # fmt: skip
            self._emit("spotring_group_demoted", group=group, until=decision.until)

    def _hand_back(
        self,
        groups: GroupSet,
        policy: CapacityPolicy,
        ready: dict[str, list[str]],
        order: list[str] | None,
    ) -> None:
        """Hand fallback hosts back, one at a time: take the host out of discovery
        (the ring re-forms without it at its next commit), then, once a ring formed
        without it (or :data:`RETURN_LEAVE_SECONDS` passed), shrink its group."""
        assert self._job is not None and self._inventory is not None and groups.total
        handing = self._return
        if handing is not None:
            listed = self._inventory.by_id(handing.instance.id)
            gone = listed is None or listed.state in (InstanceState.TERMINATING, InstanceState.GONE)
            waited = time.monotonic() - handing.started
            if not handing.removed:
                ring_at, ring = self._ring
                left = ring_at > handing.started and handing.instance.address not in ring
                if gone or left or waited > self.RETURN_LEAVE_SECONDS:
                    self._shrink(groups, policy, handing)
                return
            if not gone and waited <= self.RETURN_GONE_SECONDS:
                return
            self._return = None  # gone: the next may go
            policy.finish_return(removed=False)
        candidate = policy.return_candidate(groups.total, ready, order)
        if candidate is None:
            return
        instance_id, name = candidate
        instance = self._inventory.by_id(instance_id)
        if instance is None:
            return
        keep = not self._call(
            "the spotring_return_to_spot hook",
            self._hook.spotring_return_to_spot,
            instance=instance,
            group=policy.status(name),
            job=self._job,
        )
        if keep:
            return
        log.info("handing %s (%s) back to %s's preferred groups: it leaves the ring at its "
                 "next commit", instance.address, instance.id, name)  # fmt: skip
        self._return = _Return(
            instance, name, time.monotonic(), policy.in_group_for(instance.id, name)
        )
        self._not_preempted.add(instance.id)
        policy.start_return(instance.id, name)
        with self._lock:
            self._notices[instance.id] = InterruptionNotice(self.RETURN_NOTICE)
            self._publish()

    def _shrink(self, groups: GroupSet, policy: CapacityPolicy, handing: _Return) -> None:
        group = groups.group(handing.group)
        try:
            if group.can_remove:
                self._call(f"removing a member of {handing.group}", groups.remove_instance,
                           handing.instance.id)  # fmt: skip
            else:
                # One less than the group was asked for, or than it holds when no
                # resize of it went through yet: never 0 for a group of several.
                asked = self._group_asked.get(handing.group)
                if asked is None:
                    asked = len(self._live_members(handing.group))
                size = max(0, asked - 1)
                self._call(f"resizing {handing.group}", group.set_target_size, size)
        except ProviderError as error:
            if not error.retryable:
                raise
            log.warning("could not hand %s back, will retry: %s", handing.instance.id, error)
            return
        handing.removed = True
        if handing.group in self._group_asked:
            self._group_asked[handing.group] = max(0, self._group_asked[handing.group] - 1)
        policy.finish_return(removed=True)
        policy.start_return(handing.instance.id, handing.group)  # still one at a time
        log.info("handed %s back: %s shrunk by one", handing.instance.id, handing.group)
        self._emit("spotring_returned", instance=handing.instance, group=handing.group,
                   seconds=handing.in_group_s)  # fmt: skip

    # ------------------------------------------------------------------ plumbing

    def _call(self, what: str, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Call a provider or decision hook; a non-ProviderError becomes ControllerError."""
        try:
            return function(*args, **kwargs)
        except ProviderError:
            raise
        except Exception as error:
            raise _unexpected(what, error) from error

    def _emit(self, name: str, **kwargs: Any) -> None:
        """Call the event hook ``name`` through the plugin manager. spotring's manager
        isolates the plugins (one plugin's exception is logged once and the others
        still hear the event); with a bare pluggy manager an exception stops the
        controller as a plugin's bug."""
        self._call(f"the {name} hook", getattr(self._hook, name), **kwargs)


@dataclass
class _Return:
    """A host being handed back: it drains, then its group is shrunk."""

    instance: Instance
    group: str
    started: float
    in_group_s: float
    """How long it had been in its group when its hand-back began."""
    removed: bool = False


def _unexpected(what: str, error: Exception) -> ControllerError:
    log.debug("unexpected error while %s", what, exc_info=error)
    return ControllerError(f"{what} failed unexpectedly: {type(error).__name__}: {error}")


def _draining(instance: Instance, notice: InterruptionNotice) -> Instance:
    """``instance`` as it is after ``notice``: leaving, unless already further gone."""
    usable = instance.state in (InstanceState.PENDING, InstanceState.READY)
    return replace(instance, state=InstanceState.DRAINING if usable else instance.state,
                   notice=notice)  # fmt: skip
