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
from collections.abc import Sequence
from dataclasses import dataclass

from horovod.runner.common.util import secret, timeout
from horovod.runner.driver import driver_service
from horovod.runner.elastic.driver import ElasticDriver
from horovod.runner.elastic.settings import ElasticSettings
from horovod.runner.gloo_run import launch_gloo_elastic
from horovod.runner.http.http_server import RendezvousServer
from spotring.autoscaler.controller import Controller
from spotring.driver.discovery import InventoryHostDiscovery
from spotring.driver.launcher import ProcessLauncher, WorkerExit
from spotring.driver.peer_failure import PeerFailureNotifier

log = logging.getLogger(__name__)


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


class JobTracker:
    """Follows the job for the progress lines and the closing summary."""

    def __init__(self) -> None:
        self.world_sizes: list[int] = []
        self.failures: list[WorkerExit] = []
        self._driver: ElasticDriver | None = None
        self._lock = threading.Lock()

    def attach(self, driver: ElasticDriver) -> None:
        self._driver = driver

    def worker_started(self, host: str, process_group: int) -> None:
        driver = self._driver
        if driver is None:
            return
        size = driver.world_size()
        with self._lock:
            if not self.world_sizes or self.world_sizes[-1] != size:
                self.world_sizes.append(size)
                print(f"spotring: world size {size}", file=sys.stderr, flush=True)

    def worker_exited(self, exit: WorkerExit, process_group: int) -> None:
        if exit.failed:
            with self._lock:
                self.failures.append(exit)

    @property
    def resets(self) -> int:
        driver = self._driver
        return driver._worker_registry._reset_count if driver is not None else 0


def run_elastic(
    command: Sequence[str],
    controller: Controller,
    launcher: ProcessLauncher,
    options: ElasticOptions,
    tracker: JobTracker | None = None,
) -> None:
    """Run ``command`` as an elastic Horovod job on the controller's hosts.

    Returns when the job succeeds; raises ``RuntimeError`` with Horovod's message when
    it fails.
    """
    tracker = tracker or JobTracker()
    notifier = PeerFailureNotifier()
    launcher.add_listener(_FailureRouter(controller, notifier))
    launcher.add_listener(tracker)

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
        tracker.attach(driver)
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
        RendezvousServer(options.verbose),
        sys.executable,
    )


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
