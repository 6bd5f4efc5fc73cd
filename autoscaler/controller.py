"""The controller: keeps the inventory fresh and steers the job's groups, on its own thread.

Horovod's driver polls discovery every second under a lock, so the cloud is never
called from there: the controller refreshes on its own schedule and publishes an
immutable :class:`Inventory` that discovery reads. A failed refresh keeps the last
good inventory (and backs off); discovery never sees "no hosts" because a call failed.
The controller holds the job's groups (:mod:`spotring.autoscaler.groups`: one
provider per group, in the user's order of preference), lists every one, and reaches
each member through its own group. Its rooms: the published inventory
(:mod:`~spotring.autoscaler.membership`), the groups' sizes
(:mod:`~spotring.autoscaler.steering`), failed hosts' replacements
(:mod:`~spotring.autoscaler.replacements`) and the hosts' notice watchers
(:mod:`~spotring.autoscaler.watchers`); the loop feeds them and runs them in turn.

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
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pluggy

from spotring.autoscaler.calls import ControllerError, call, emit, unexpected
from spotring.autoscaler.capacity import CapacityOptions, GroupStatus
from spotring.autoscaler.groups import (
    describe_groups,
    group_names,
    job_groups,
    list_members,
    refresh_calls,
)
from spotring.autoscaler.membership import Membership
from spotring.autoscaler.replacements import Replacements
from spotring.autoscaler.steering import Steering
from spotring.autoscaler.watchers import NoticeWatchers
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
from spotring.core.prices import HourlyPrice, PriceBook
from spotring.core.queues import taken
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
        again (:class:`Steering`).
    :param capacity_clock: the capacity policy's clock (seconds, monotonic): tests
        pass a fake one to pass its backoffs and waits without sleeping.
    :param prices: ``--price``: USD per member-hour by group name or lifecycle, over
        what the groups' clouds say (:attr:`prices`).
    :param price_refresh: seconds between two readings of a group's price from its
        cloud.
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
        prices: Mapping[str, float] | None = None,
        price_refresh: float = 3600.0,
    ) -> None:
        if hook is None:
            from spotring.autoscaler.plugins import get_plugin_manager

            hook = get_plugin_manager(load_entry_points=False).hook
        self.groups: tuple[Provider, ...] = job_groups(groups)
        """The job's groups, in the user's order of preference."""
        self._by_name = dict(zip(group_names(self.groups), self.groups, strict=True))
        self.prices = PriceBook(self.groups, prices or {}, refresh_s=price_refresh)
        self.prices.wait_for_listing()
        """The job's prices, per group: read by its own thread while the controller's
        runs (a job's only), announced after each listing."""
        self._prices_told: dict[str, HourlyPrice | None] = {}  # group -> as last emitted
        self._lifecycles: dict[str, Lifecycle | None] = {}  # group -> as it says, asked once
        self._hook = hook
        self._job = job
        self._refresh_interval = refresh_interval
        self._backoff = backoff
        self._replace_grace = replace_grace
        self._readmit_after = readmit_after

        self._membership = Membership()
        # What the launcher's threads report, for the controller's thread.
        self._failed_hosts: queue.SimpleQueue[tuple[Instance, str]] = queue.SimpleQueue()
        self._noticed_hosts: queue.SimpleQueue[tuple[Instance, InterruptionNotice, bool]] = (
            queue.SimpleQueue()
        )

        # Only the controller thread touches these.
        self._announced: dict[str, Instance] = {}
        self._cloud_failures: dict[str, str] = {}  # instance id -> failure decided on
        self._invalid_addresses: set[str] = set()
        self._failures = 0
        # A job's steering, replacements and notice watchers; none for a listing only
        # (no job, as for ``spotring discover``): it asks for nothing more.
        self._steering: Steering | None = None
        self._replacements: Replacements | None = None
        self._watchers: NoticeWatchers | None = None
        if job is not None:
            options = capacity or CapacityOptions()
            drain = self._membership.drain
            self._steering = Steering(
                self.groups, hook, job, options, capacity_clock, drain, self.prices.per_slot
            )
            self._replacements = Replacements(hook, job, retry_after=refresh_interval)
            self._watchers = NoticeWatchers()

        self._last_error: ProviderError | None = None
        self._fatal_lock = threading.Lock()
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
        return self._membership.inventory

    @property
    def last_error(self) -> ProviderError | None:
        """The error of the last failed refresh, None once one succeeds."""
        return self._last_error

    @property
    def target_size(self) -> int | None:
        """The job's size spotring last asked for, None before it asked."""
        return self._steering.target if self._steering is not None else None

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
        inventory = self.inventory
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
            if self._job is not None:  # a listing only (discover) reads no prices
                self.prices.start()

    STOP_WAIT_SECONDS = 10.0

    def stop(self) -> None:
        """Stop the controller thread and wait for it, at most :data:`STOP_WAIT_SECONDS`:
        a stop (Ctrl-C included) must not wait out a cloud call's retries. The thread is a
        daemon; one still in a call ends with the process."""
        self._stopped.set()
        self._wake.set()
        self.prices.stop()
        if self._thread is not None:
            self._thread.join(self.STOP_WAIT_SECONDS)
            if self._thread.is_alive():
                log.warning("the controller is still in a call to %s; not waiting for it",
                            self.describe())  # fmt: skip
        if self._replacements is not None:
            self._replacements.cancel()

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
        inventory = self.inventory
        assert inventory is not None
        return inventory

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
        inventory = self.inventory
        if refreshed and self._steering is not None and inventory is not None:
            self._steering.steer(inventory, self._lifecycles)
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
        finally:
            self.prices.stop(wait=0)  # the prices stop with the job

    def _wait(self, refreshed: bool, next_replacement: float | None) -> None:
        delay = self._refresh_interval if refreshed else self._backoff.delay(self._failures)
        if next_replacement is not None:
            delay = min(delay, next_replacement)
        readmit = self._membership.next_readmission()
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
        with self._fatal_lock:
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
                inventory=self.inventory,
                seconds=time.monotonic() - started,
                calls=refresh_calls(self.groups),
                error=str(error) if error is not None else None,
                target=self.target_size,
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
            log.warning("refresh of %s failed (%d in a row), keeping the last inventory: %s",
                        self.describe(), self._failures, error)  # fmt: skip
            return False
        if self._failures:
            log.info("refresh of %s recovered after %d failures", self.describe(),
                     self._failures)  # fmt: skip
        self._failures = 0
        self._last_error = None
        self._warn_invalid_addresses(instances)
        if self._watchers is not None:
            self._watchers.update(instances, self._group_of)
        self._membership.listed(instances)
        self.refreshes += 1
        self._first.set()
        if self._job is not None:  # a listing only (discover) reads no prices
            self.prices.groups_listed()
            self._read_prices(instances)
        return True

    def _read_prices(self, instances: tuple[Instance, ...]) -> None:
        """Tell the price book the groups' slots per host and announce each group's
        price as it changes (the book's thread reads them from the clouds: this never
        waits on a price API)."""
        for instance in instances:
            group = self._group_of(instance)
            if group is not None:
                self.prices.note_slots(group.group_name(), instance.slots)
        for name, group in self._by_name.items():
            if not self.prices.settled(name):
                continue  # not read yet: announced once it is
            price = self.prices.price(name)
            told = self._prices_told.get(name)
            if name in self._prices_told and _same_price(told, price):
                continue
            self._prices_told[name] = price
            lifecycle = self._lifecycles.get(name) if len(self.groups) > 1 else None
            if lifecycle is None:
                lifecycle = group.group_lifecycle()
            self._emit("spotring_price_changed", group=name, lifecycle=lifecycle, price=price)

    def _warn_invalid_addresses(self, instances: tuple[Instance, ...]) -> None:
        for instance in instances:
            if (
                instance.state is InstanceState.READY
                and instance.address
                and not is_valid_address(instance.address)
                and instance.id not in self._invalid_addresses
            ):
                self._invalid_addresses.add(instance.id)
                log.warning("%s: member %s has address %r, which is not a host name or IP "
                            "address; it is left out", self.describe(), instance.id,
                            instance.address)  # fmt: skip

    def _announce(self) -> None:
        """Tell the plugins how the READY set changed since they last heard."""
        inventory = self.inventory
        if inventory is None:
            return
        after = {i.id: i for i in inventory.ready}
        added = [i for key, i in after.items() if key not in self._announced]
        removed = [i for key, i in self._announced.items() if key not in after]
        self._announced = after
        if added or removed:
            self._emit("spotring_inventory_changed", added=added, removed=removed,
                       ready=list(after.values()))  # fmt: skip

    # ----------------------------------------------------------------- failures

    def host_failed(self, address: str, reason: str) -> Instance | None:
        """Take the member at ``address`` out of the job now.

        Called by the worker launcher (on its thread) the moment a worker exits with an
        error, so the host leaves discovery at once instead of when the cloud notices.
        The plugins hear of it, and the replacement is decided, on the controller
        thread. Returns the instance, or None when no listed member has that address.
        """
        inventory = self.inventory
        instance = inventory.by_address(address) if inventory else None
        if instance is None:
            return None
        if self._steering is not None and self._steering.handing_back(instance.id):
            # Its workers stopped as it left: no failure, no replacement.
            log.info("host %s (%s) is being handed back: %s", address, instance.id, reason)
            return instance
        if not self._membership.exclude(instance.id, self._readmit_after):
            return instance  # out already
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
        inventory = self.inventory
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
            self._membership.drain(instance.id, notice)
        log.info("host %s (%s) announced %s%s", address, instance.id, notice.kind,
                 "; leaving the job" if drain else "")  # fmt: skip
        self._noticed_hosts.put((instance, notice, drain))
        self._wake.set()
        return drain

    def _take_noticed_hosts(self) -> None:
        for instance, notice, drain in taken(self._noticed_hosts):
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
        instance_id = self.instance_id(address)
        if instance_id is None or self._watchers is None:
            return None
        return self._watchers.get(instance_id)

    def _take_failed_hosts(self) -> None:
        for instance, reason in taken(self._failed_hosts):
            self._host_failed(instance, reason, self._replace_grace)

    def _take_cloud_failures(self) -> None:
        """Members the cloud reports failed for good (:attr:`Instance.failure`: an
        evicted spot VM kept deallocated, a VM that never provisioned) are failed hosts,
        each decided on once while the cloud lists it so. Their replacement is due at
        once: the cloud, not a failing job, said they failed."""
        inventory = self.inventory
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
        if self._replacements is not None and group is not None and group.can_replace:
            self._replacements.decide(instance, reason, grace)

    def _replace_due(self) -> float | None:
        """Replace the failed hosts whose grace period is over. Returns seconds until
        the next one is due, or None when none is pending."""
        if self._replacements is None or self._steering is None:  # no job
            return None
        for instance_id in self._replacements.replace_due(
            lambda key: self._group_of(self._listed(key))
        ):
            log.info("asked %s to replace %s", self.describe(), instance_id)
            self._steering.asked_to_go(instance_id)
        return self._replacements.next_due()

    # ------------------------------------------------------------------ plumbing

    def _group_of(self, instance: Instance | None) -> Provider | None:
        """The group ``instance`` was listed in; None for a member not listed (a job
        of one group: that group, which makes sense of any id)."""
        if len(self.groups) == 1:
            return self.groups[0]
        return None if instance is None else self._by_name.get(instance.group)

    def _listed(self, instance_id: str) -> Instance | None:
        """``instance_id`` as the last good listing has it, or None."""
        inventory = self.inventory
        return inventory.by_id(instance_id) if inventory is not None else None

    def _emit(self, name: str, **kwargs: Any) -> None:
        emit(self._hook, name, **kwargs)


def _same_price(told: HourlyPrice | None, price: HourlyPrice | None) -> bool:
    """Whether ``price`` says what ``told`` said (the time it was read aside)."""
    if told is None or price is None:
        return told is price
    return (told.usd, told.source) == (price.usd, price.source)
