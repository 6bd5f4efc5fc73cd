"""Runs Horovod's elastic driver with spotring's discovery and launcher.

We call ``horovod.runner.gloo_run.launch_gloo_elastic`` -- the function ``horovodrun``
uses -- with our own ``HostDiscovery`` (the controller's inventory) and our own
``exec_command`` (the launcher). Horovod keeps doing what it does well: rendezvous,
rank assignment, blacklisting and resets.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from horovod.runner.common.util import secret, timeout
from horovod.runner.driver import driver_service
from horovod.runner.elastic.driver import ElasticDriver
from horovod.runner.elastic.settings import ElasticSettings
from horovod.runner.elastic.worker import HostUpdateResult
from horovod.runner.gloo_run import launch_gloo_elastic
from horovod.runner.http.http_server import RendezvousServer

from spotring.autoscaler.controller import Controller
from spotring.driver.discovery import InventoryHostDiscovery
from spotring.driver.launcher import ProcessLauncher, WorkerExit
from spotring.driver.peer_failure import PeerFailureNotifier

log = logging.getLogger(__name__)

COORDINATOR_REPLAY_DELAY_SECONDS = 1.0


@dataclass(frozen=True)
class ElasticOptions:
    """The elastic options of ``horovodrun``, by the same names."""

    num_proc: int
    min_num_proc: int
    max_num_proc: int
    reset_limit: int | None = None
    cooldown_range: tuple[int, int] | None = None
    elastic_timeout: int = 600
    start_timeout: int = 120
    nics: tuple[str, ...] = ()
    verbose: int = 0


class RingTracker(RendezvousServer):
    """Horovod's rendezvous server, recording every ring the driver forms.

    Horovod calls ``init`` with the new slot plan at the start and after every reset,
    which makes it the one place that sees each world size.
    """

    def __init__(self, verbose: int = 0, on_ring: Callable[[int, list[str]], None] | None = None):
        super().__init__(verbose)
        self.world_sizes: list[int] = []
        self._on_ring = on_ring

    def init(self, host_alloc_plan):  # type: ignore[no-untyped-def]
        result = super().init(host_alloc_plan)
        hosts = sorted({slot.hostname for slot in host_alloc_plan})
        self.world_sizes.append(len(host_alloc_plan))
        if self._on_ring is not None:
            self._on_ring(len(host_alloc_plan), hosts)
        return result


def run_elastic(
    command: Sequence[str],
    controller: Controller,
    launcher: ProcessLauncher,
    options: ElasticOptions,
    rendezvous: RingTracker | None = None,
) -> None:
    """Run ``command`` as an elastic Horovod job on the controller's hosts.

    Returns when the job succeeds; raises ``RuntimeError`` with Horovod's message when
    it fails.
    """
    notifier = PeerFailureNotifier()
    launcher.add_listener(_FailureRouter(controller, notifier))

    settings = ElasticSettings(
        discovery=InventoryHostDiscovery(controller),
        min_num_proc=options.min_num_proc,
        max_num_proc=options.max_num_proc,
        elastic_timeout=options.elastic_timeout,
        reset_limit=options.reset_limit,
        cooldown_range=options.cooldown_range,
        num_proc=options.num_proc,
        verbose=options.verbose,
        nics=set(options.nics) or None,
        key=secret.make_secret_key(),
        start_timeout=timeout.Timeout(
            options.start_timeout, message="Timed out waiting for {activity}."
        ),
    )

    def get_common_interfaces(driver: ElasticDriver) -> set[str]:
        # Horovod hands us its driver here: the one chance to reach its worker clients.
        notifier.attach(driver)
        _replay_host_changes_for_new_coordinator(driver)
        if options.nics:
            return set(options.nics)
        hosts = driver.wait_for_available_slots(options.num_proc, min_hosts=2)
        return driver_service.get_common_interfaces(settings, hosts.host_assignment_order)

    env = dict(os.environ)
    launch_gloo_elastic(
        list(command),
        launcher,
        settings,
        env,
        get_common_interfaces,
        rendezvous or RingTracker(options.verbose),
        sys.executable,
    )


def _replay_host_changes_for_new_coordinator(driver: ElasticDriver) -> None:
    """Tell a newly registered coordinator of host changes it missed.

    Horovod notifies only the coordinator (rank 0) of host changes, and silently skips
    the notification while no coordinator has registered yet, i.e. while the workers
    are still starting. A host that became ready in that window would then wait for
    the *next* change to be noticed. We re-check shortly after the coordinator
    registers: not at once, because the worker registers its state object as a
    listener just after registering its address, and a message in between is lost.
    """
    register = driver.register_worker_server

    def replay() -> None:
        with driver._wait_hosts_cond:
            if driver.finished():
                return
            # Horovod itself returns early when the assignments would not change.
            current = driver._host_manager.current_hosts
            driver._notify_workers_host_changes(current, HostUpdateResult.mixed)

    def register_worker_server(host, slot, addresses, secret_key):  # type: ignore[no-untyped-def]
        register(host, slot, addresses, secret_key)
        coordinator = driver.get_coordinator_info()
        if coordinator is not None and (coordinator.hostname, coordinator.local_rank) == (
            host,
            slot,
        ):
            timer = threading.Timer(COORDINATOR_REPLAY_DELAY_SECONDS, replay)
            timer.daemon = True
            timer.start()

    driver.register_worker_server = register_worker_server  # type: ignore[method-assign]


class _FailureRouter:
    """On a worker failure: take its host out of discovery and free its peers.

    Runs on the failed worker's launcher thread, before Horovod records the failure,
    so the peers are told before any new rendezvous can begin.
    """

    def __init__(self, controller: Controller, notifier: PeerFailureNotifier) -> None:
        self._controller = controller
        self._notifier = notifier

    def worker_started(self, host: str, process_group: int) -> None:
        pass

    def worker_exited(self, exit: WorkerExit, process_group: int) -> None:
        if not exit.failed:
            return
        reason = f"worker rank {exit.rank} exited with {exit.exit_code}"
        self._controller.host_failed(exit.host, reason)
        self._notifier.notify(exit.host, exit.local_rank)
