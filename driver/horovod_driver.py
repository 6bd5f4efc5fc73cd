"""spotring's seam to Horovod: one subclass of its elastic driver, whose overrides are the
whole list of what spotring changes in it.

:class:`SpotringElasticDriver` is Horovod 0.28.1's ``ElasticDriver`` (rendezvous, rank
assignment, blacklisting, resets) with these overrides, each for the reason its
docstring gives:

* :meth:`~SpotringElasticDriver.register_worker_server`: the driver's client of each
  worker unpickles nothing but Horovod's answers, with its probes bounded; and a newly
  registered coordinator is told of the host changes it missed;
* :meth:`~SpotringElasticDriver.get_slot_info`: a departed host's workers wait for their
  stop instead of hearing that they have no rank;
* :meth:`~SpotringElasticDriver.record_ready`: each rank request is told to the progress
  tracker as it arrives, before the reset's barrier holds it;
* :meth:`~SpotringElasticDriver.handle_worker_exit`: an exit recorded after the job was
  stopped ends quietly;
* :meth:`~SpotringElasticDriver.notify_workers_host_changes`: a change that brings a
  waiting host into the ring is announced as an addition;
* :meth:`~SpotringElasticDriver.update_host_assignments` and the worker registry's
  :class:`SpotringWorkerStateRegistry` (with ``--checkpoint``): a ring that lost every
  member starts again from durable storage (:class:`~spotring.driver.durable.LostRings`).

Horovod's private steps reach these methods through
:func:`~spotring.driver.horovod_internals.route_driver_hooks` (and
:func:`~spotring.driver.horovod_internals.route_registry_hooks`), so no method of a
driver is replaced after it is made, and no order of installing matters. Everything
around the driver (the rendezvous server, progress, routers, warm pool) is the ring
side's (:class:`~spotring.driver.ring_side.RingSide`), which any backend could use.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from horovod.runner.elastic.driver import ElasticDriver
from horovod.runner.elastic.registration import WorkerStateRegistry
from horovod.runner.elastic.worker import HostUpdateResult

from spotring.core.job import JobShape
from spotring.driver import horovod_internals
from spotring.driver.discovery import InventoryHostDiscovery
from spotring.driver.durable import LostRings
from spotring.driver.options import ElasticOptions
from spotring.driver.rendezvous import register_safe_worker_client
from spotring.driver.rendezvous.limits import MAX_CONCURRENT_PROBES
from spotring.driver.ring_side import RingSide

COORDINATOR_REPLAY_DELAY_SECONDS = 1.0
"""How long after a coordinator registers the host changes it missed are replayed."""


@horovod_internals.route_driver_hooks
class SpotringElasticDriver(ElasticDriver):
    """Horovod's elastic driver over ``ring``'s rendezvous server and the controller's
    inventory (with ``ring``'s warm pool), for ``job``'s worker counts and ``options``'
    elastic settings; see the module for what it changes and why."""

    horovod_handle_worker_exit: Callable[[Any, int, float], None]
    horovod_notify_workers_host_changes: Callable[[Any, Any], None]
    horovod_update_host_assignments: Callable[[Any], Any]

    def __init__(self, ring: RingSide, job: JobShape, options: ElasticOptions) -> None:
        # Before Horovod's __init__: it starts the discovery thread, which calls the
        # overrides below.
        self.ring_side = ring
        self.worker_probes = threading.BoundedSemaphore(MAX_CONCURRENT_PROBES)
        self.lost_rings = LostRings(ring.judge, ring.ring_lost) if ring.judge is not None else None
        super().__init__(
            ring.tracker,
            InventoryHostDiscovery(ring.controller, ring.warm_pool),
            job.min_num_proc,
            job.max_num_proc,
            timeout=options.elastic_timeout,
            reset_limit=options.reset_limit,
            cooldown_range=options.cooldown_range,
            verbose=options.verbose,
        )
        lost_rings = self.lost_rings
        if lost_rings is not None:  # before any reset: the registry records them
            horovod_internals.replace_worker_registry(
                self,
                lambda driver, hosts: SpotringWorkerStateRegistry(
                    driver, hosts, options.reset_limit, lost_rings
                ),
            )

    # -- the rendezvous handler's calls

    def register_worker_server(
        self, host: str, slot: int, addresses: dict[str, list[tuple[str, int]]], secret_key: bytes
    ) -> None:
        """Take a worker's registration with a client that unpickles nothing but
        Horovod's answers (anyone who reaches the rendezvous server may register a
        planned slot: Horovod's own client would unpickle whatever its service
        answers), its address probes bounded for the whole driver.

        Then, for the coordinator (rank 0), replay the host changes it missed: Horovod
        notifies only the coordinator, and silently skips the notice while none has
        registered (the workers still starting), so a host that became ready in that
        window would wait for the *next* change. Not at once: the worker registers its
        state object as a listener just after its address, and a message in between
        is lost."""
        register_safe_worker_client(self, host, slot, addresses, secret_key, self.worker_probes)
        coordinator = self.get_coordinator_info()
        if coordinator is not None and (coordinator.hostname, coordinator.local_rank) == (
            host,
            slot,
        ):
            timer = threading.Timer(COORDINATOR_REPLAY_DELAY_SECONDS, self.replay_host_changes)
            timer.daemon = True
            timer.start()

    def replay_host_changes(self) -> None:
        """Tell the coordinator of the current hosts as a change (Horovod itself returns
        early when the assignments would not change)."""
        with horovod_internals.wait_hosts_cond(self):
            if self.finished():
                return
            current = horovod_internals.current_hosts(self)
            horovod_internals.notify_workers_host_changes(self, current, HostUpdateResult.mixed)

    def get_slot_info(self, host: str, slot: int) -> Any:
        """Answer a rank request, but make a departed host's workers wait for their stop
        first (:meth:`~spotring.driver.ring_side.NoticeRouter.wait_if_departed`):
        Horovod's answer that they have no rank makes them abort with a C++ error."""
        self.ring_side.notices.wait_if_departed(host)
        return super().get_slot_info(host, slot)

    def record_ready(self, host: str, slot: int) -> None:
        """Tell the progress tracker of a worker's rank request as it arrives, before
        Horovod holds it at the reset's barrier (which a member that never asks holds
        up: the tracker finds that member)."""
        self.ring_side.progress.slot_asked(host, slot)
        super().record_ready(host, slot)

    # -- Horovod's private steps (routed here by route_driver_hooks)

    def handle_worker_exit(self, slot_info: Any, exit_code: int, timestamp: float) -> None:
        """Record a worker's exit; one recorded once the job is stopped meets the
        reset's broken barrier (the job's stop breaks it): that is the stop, not an
        error to print a traceback for."""
        try:
            self.horovod_handle_worker_exit(slot_info, exit_code, timestamp)
        except threading.BrokenBarrierError:
            if not self.finished():
                raise

    def notify_workers_host_changes(self, current_hosts: Any, update_result: Any) -> None:
        """Tell the coordinator of a host change, one that brings a new host into the
        ring as an addition (:func:`announced_change`)."""
        self.horovod_notify_workers_host_changes(
            current_hosts, announced_change(self, current_hosts, update_result)
        )

    def update_host_assignments(self, current_hosts: Any) -> Any:
        """The next ring's ranks; with durable checkpoints, a ring none of whose hosts
        is left is lost and starts anew (:class:`~spotring.driver.durable.LostRings`)."""
        if self.lost_rings is None:
            return self.horovod_update_host_assignments(current_hosts)
        return self.lost_rings.update_host_assignments(
            self, self.horovod_update_host_assignments, current_hosts
        )


def announced_change(driver: Any, current_hosts: Any, update_result: Any) -> Any:
    """How to tell the workers of a host change: as Horovod would, but a change that
    brings a new host into the ring as an addition too.

    Horovod's workers skip the state sync after a reset when every change they heard
    of was a removal (``HostsUpdatedInterrupt(skip_sync=True)``): the survivors all hold
    the same state. But a host discovered earlier that found no slot (the ring at
    ``--max-np``, a warm spare) takes the slot a removed host frees, and Horovod tells
    of the removal only: the new member then waits in the sync's broadcasts while the
    survivors train, and the ring hangs for good (seen handing an on-demand host back
    with a warm spot host waiting)."""
    if update_result & HostUpdateResult.added:
        return update_result
    try:
        joining = horovod_internals.hosts_to_assign(driver, current_hosts)
    except ValueError:  # too few slots for a ring: Horovod tells no one
        return update_result
    if joining - horovod_internals.assigned_hosts(driver):
        return update_result | HostUpdateResult.added
    return update_result


@horovod_internals.route_registry_hooks
class SpotringWorkerStateRegistry(WorkerStateRegistry):
    """Horovod's worker registry (where each reset records its workers), which starts a
    ring that lost every member again instead of stopping the job (with
    ``--checkpoint``; :class:`~spotring.driver.durable.LostRings`)."""

    horovod_workers_recorded: Callable[[], None]

    def __init__(
        self, driver: Any, host_manager: Any, reset_limit: int | None, lost_rings: LostRings
    ) -> None:
        self.spotring_driver = driver
        self.lost_rings = lost_rings
        super().__init__(driver, host_manager, reset_limit=reset_limit)

    def workers_recorded(self) -> None:
        """A round ended: a ring lost to a reclaim starts again; else Horovod decides."""
        self.lost_rings.workers_recorded(self.spotring_driver, self, self.horovod_workers_recorded)

    def record_failure(self, host: str, slot: int) -> int:
        """Record a worker's failed exit, unless a ring formed meanwhile without it."""
        return self.lost_rings.record_failure(
            self.spotring_driver, self, super().record_failure, host, slot
        )
