"""The controller: keeps the inventory fresh and steers the job's groups, on its own thread.

Horovod's driver polls discovery every second under a lock, so the cloud is never
called from there: the controller refreshes on its own schedule and publishes an
immutable :class:`Inventory` that discovery reads. A failed refresh keeps the last
good inventory (and backs off); discovery never sees "no hosts" because a call failed.
It holds the job's groups (:mod:`spotring.autoscaler.groups`: one provider per group,
in the user's order of preference), lists every one and steers each member through its
own group; a job of several has its size split across them by the capacity steering
(:mod:`spotring.autoscaler.steering`), which the loop runs after each refresh.

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
from typing import Any

import pluggy

from spotring.autoscaler.calls import ControllerError, call, emit, unexpected
from spotring.autoscaler.capacity import CapacityOptions, GroupStatus
from spotring.autoscaler.groups import (
    describe_groups,
    group_names,
    job_groups,
    job_size_limits,
    list_members,
    refresh_calls,
)
from spotring.autoscaler.steering import CapacitySteering
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

__all__ = ["Backoff", "Controller", "ControllerError"]  # ControllerError lives in calls


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
    """Refreshes the inventory, replaces failed hosts and steers the groups' sizes.

    :param groups: the job's groups, one provider each, in the user's order of
        preference (a single provider: a job of one group); their ``group_name()``
        must differ (:class:`ConfigurationError`).
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
    :param capacity: the capacity policy's options, for a job of several groups: the
        job's size is split across them, a short group's shortfall asked of the next,
        and fallback hosts handed back at a commit once a preferred group has capacity
        again (:class:`CapacitySteering`).
    :param capacity_clock: the capacity policy's clock (seconds, monotonic): tests
        pass a fake one to pass its backoffs and waits without sleeping.
    """

    def __init__(
        self,
        groups: Provider | Sequence[Provider],
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
        self.groups: tuple[Provider, ...] = job_groups(groups)
        """The job's groups, in the user's order of preference."""
        self._by_name = dict(zip(group_names(self.groups), self.groups, strict=True))
        self._lifecycles: dict[str, Lifecycle | None] = {}  # group -> as it says, asked once
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
        self._steering: CapacitySteering | None = None
        if job is not None and len(self.groups) > 1:
            options = capacity or CapacityOptions()
            self._steering = CapacitySteering(
                self.groups, hook, job, options, capacity_clock, self._drain
            )

        self._last_error: ProviderError | None = None
        self._fatal: ProviderError | None = None
        self._fatal_event = threading.Event()
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
        """The error of the last failed refresh, None once one succeeds."""
        return self._last_error

    @property
    def target_size(self) -> int | None:
        """The job's size spotring last asked for, None before it asked."""
        return self._target

    @property
    def capacity_status(self) -> tuple[GroupStatus, ...]:
        """Each group's status after the last capacity steering (a job of several
        groups; empty otherwise), readable from any thread."""
        return self._steering.status if self._steering is not None else ()

    def describe(self) -> str:
        """The job's groups in a few words, for progress lines and logs."""
        return describe_groups(self.groups)

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
                    self.describe(),
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
                    f"no answer from {self.describe()} within {timeout:.0f}s"
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
        if refreshed and self._job is not None and any(g.can_resize for g in self.groups):
            self._steer()
            if self._steering is not None and self._target is not None:
                assert self._inventory is not None  # refreshed
                self._steering.steer(self._target, self._inventory, self._lifecycles)
            for group in self.groups:
                if group.can_resize:
                    call("keeping the group's size", group.keep_size)
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
            self._fail(unexpected("spotring's controller", error))

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
        log.info("%s: controller stopped: %s", self.describe(), error)
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
                calls=refresh_calls(self.groups),
                error=str(error) if error is not None else None,
                target=self._target,
            )

    def _refresh(self) -> bool:
        try:
            instances = tuple(
                call("listing the group", list_members, self.groups, self._lifecycles)
            )
        except ProviderError as error:
            if not error.retryable:
                raise
            self._failures += 1
            self._last_error = error
            log.warning(
                "refresh of %s failed (%d in a row), keeping the last inventory: %s",
                self.describe(),
                self._failures,
                error,
            )
            return False
        if self._failures:
            log.info(
                "refresh of %s recovered after %d failures",
                self.describe(),
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
                group = self._group_of(instance)
                if group is None:
                    continue
                try:
                    watcher = call("the provider's notice watcher", group.notice_watcher, instance)
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
                    self.describe(),
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
            if self._steering is not None and self._steering.handing_back(instance.id):
                # Its workers stopped as it left: no failure, no replacement.
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
                call(
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
            self._drain(instance.id, notice)
        log.info("host %s (%s) announced %s%s", address, instance.id, notice.kind,
                 "; leaving the job" if drain else "")  # fmt: skip
        self._noticed_hosts.put((instance, notice, drain))
        self._wake.set()
        return drain

    def _drain(self, instance_id: str, notice: InterruptionNotice) -> None:
        """Take ``instance_id`` out of discovery: DRAINING with ``notice`` from now on."""
        with self._lock:
            self._notices[instance_id] = notice
            self._publish()

    def _take_noticed_hosts(self) -> None:
        while True:
            try:
                instance, notice, drain = self._noticed_hosts.get_nowait()
            except queue.Empty:
                return
            self._emit("spotring_host_noticed", instance=instance, notice=notice, draining=drain)
            if notice.kind != "rebalance" and self._steering is not None:
                self._steering.preempted(instance.id)
            group = self._group_of(self._listed(instance.id))
            if group is None:  # no longer listed
                continue
            try:
                call("starting a replacement", group.host_noticed, instance, notice)
            except ProviderError as error:  # the group still replaces it after the reclaim
                log.warning("could not start a replacement for %s early: %s", instance.id, error)

    def ring_formed(self, hosts: Sequence[str]) -> list[str]:
        """Horovod formed a ring of ``hosts`` (called on Horovod's thread; quick, no
        cloud). Returns the addresses of hosts being handed back that have left the
        ring: their workers are stopped, and their group shrinks at the controller's
        next step."""
        leaving = self._steering.ring_formed(hosts) if self._steering is not None else []
        if leaving:
            self._wake.set()
        return leaving

    def hosts_offered(self, hosts: Collection[str]) -> None:
        """The hosts discovery last offered Horovod (READY and, with warm starts, their
        workers waiting in ``hvd.init``): called by the driver's discovery on Horovod's
        thread about once a second; only stores them. A fallback host is handed back
        only while the job keeps its size in offered hosts without it."""
        if self._steering is not None:
            self._steering.hosts_offered(hosts)

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
            log.info("%s: member %s failed: %s", self.describe(), key, instance.failure)
            self._host_failed(instance, instance.failure, 0.0)

    def _host_failed(self, instance: Instance, reason: str, grace: float) -> None:
        """Tell the plugins, and let ``spotring_replace_host`` decide whether the
        member is replaced once ``grace`` seconds have passed."""
        self._emit("spotring_host_failed", instance=instance, reason=reason)
        group = self._group_of(instance)
        if self._job is None or group is None or not group.can_replace:
            return
        replace = call(
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
            group = self._group_of(self._listed(instance_id))
            try:
                if group is not None:  # else no longer listed: nothing left to replace
                    call("replacing a host", group.replace_instance, instance_id)
            except ProviderError as error:
                if not error.retryable:
                    raise
                log.warning("could not replace %s, will retry: %s", instance_id, error)
                self._pending_replacements[instance_id] = now + self._refresh_interval
                continue
            log.info("asked %s to replace %s", self.describe(), instance_id)
            del self._pending_replacements[instance_id]
            if self._steering is not None:
                self._steering.asked_to_go(instance_id)
        upcoming = self._pending_replacements.values()
        return max(0.0, min(upcoming) - now) if upcoming else None

    # ------------------------------------------------------------------ steering

    def _steer(self) -> None:
        assert self._job is not None and self._inventory is not None
        wanted = call(
            "the spotring_target_size hook",
            self._hook.spotring_target_size,
            inventory=self._inventory,
            job=self._job,
            current_target=self._target,
        )
        if wanted is None or wanted == self._target:
            return
        limits = call("reading the group's limits", job_size_limits, self.groups)
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
            if len(self.groups) == 1:  # several: the capacity steering splits the size
                call("resizing the group", self.groups[0].set_target_size, size)
        except ProviderError as error:
            if not error.retryable:
                raise
            log.warning("could not resize %s, will retry: %s", self.describe(), error)
            return
        self._target = size
        log.info("asked %s for %d hosts", self.describe(), size)

    # ------------------------------------------------------------------ plumbing

    def _group_of(self, instance: Instance | None) -> Provider | None:
        """The group ``instance`` was listed in; None for a member not listed (a job
        of one group: that group, which makes sense of any id)."""
        if len(self.groups) == 1:
            return self.groups[0]
        return None if instance is None else self._by_name.get(instance.group)

    def _listed(self, instance_id: str) -> Instance | None:
        """``instance_id`` as the last good listing has it, or None."""
        inventory = self._inventory
        return inventory.by_id(instance_id) if inventory is not None else None

    def _emit(self, name: str, **kwargs: Any) -> None:
        emit(self._hook, name, **kwargs)


def _draining(instance: Instance, notice: InterruptionNotice) -> Instance:
    """``instance`` as it is after ``notice``: leaving, unless already further gone."""
    usable = instance.state in (InstanceState.PENDING, InstanceState.READY)
    return replace(instance, state=InstanceState.DRAINING if usable else instance.state,
                   notice=notice)  # fmt: skip
