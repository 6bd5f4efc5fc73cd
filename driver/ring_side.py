"""The ring side of a job: every object around the ring backend, built once, in one place.

A backend (Horovod's elastic driver, :mod:`spotring.driver.horovod_driver`) forms the
rings; around it, whatever the backend, stand the same objects, which :class:`RingSide`
builds and wires: the rendezvous server that sees each ring (:class:`RingTracker`), the
progress tracker (:class:`RingProgress`), the peer-failure notifier, the routers of
worker failures and interruption notices, the warm pool, and (with durable
checkpoints) the judge of a lost ring. The rings' events go to one
:class:`~spotring.driver.ring_events.RingEvents`, in the order and on the threads it
documents. ``driver/`` depends on a small protocol of the controller
(:class:`JobController`), not on its class.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from spotring.core import InterruptionNotice
from spotring.core.job import JobShape
from spotring.driver.durable import RingLossJudge
from spotring.driver.job_control import JobController as JobController  # re-exported
from spotring.driver.launcher import ProcessLauncher, WorkerExit, WorkerSpec
from spotring.driver.options import ElasticOptions
from spotring.driver.peer_failure import PeerFailureNotifier
from spotring.driver.rendezvous import RingTracker
from spotring.driver.ring_events import Hang, NoRingEvents, RingEvents, RingLoss
from spotring.driver.ring_progress import RingProgress
from spotring.driver.warm_pool import WarmPool
from spotring.driver.worker_events import WorkerEvents
from spotring.worker_image.notices import REBALANCE, Notice

log = logging.getLogger(__name__)


class DurableCheckpoints(Protocol):
    """What the ring side needs of the run's durable checkpoints (``--checkpoint``)."""

    @property
    def at_start(self) -> dict[str, Any] | None:
        """The newest checkpoint when the run began (``commits``, ``committed_at``...):
        the first ring's start; None when there was none."""
        ...

    def newest(self) -> dict[str, Any] | None:
        """The newest checkpoint now (as :attr:`at_start`); None when there is none or
        it cannot be read."""
        ...


class _LoggedRingLosses(NoRingEvents):
    """The events of a job nobody listens to: only a lost ring is said (in the log)."""

    def ring_lost(self, loss: RingLoss) -> None:
        log.warning("ring lost (%s): starting a new ring from durable storage", loss.why)


class RingSide:
    """Every ring-side object of one job, built and wired once.

    Its objects hear the launcher's workers from its construction on (in this order:
    the failure router, the notice router, the progress tracker, the ring-loss judge).
    :meth:`start` starts the progress tracker's and the warm pool's threads;
    :meth:`close` stops them. ``events`` (default: a lost ring logged) hears the rings'
    events; ``checkpoints``, with ``--checkpoint``, gives the commits a lost ring is
    told in.
    """

    def __init__(
        self,
        controller: JobController,
        launcher: ProcessLauncher,
        job: JobShape,
        options: ElasticOptions,
        events: RingEvents | None = None,
        checkpoints: DurableCheckpoints | None = None,
    ) -> None:
        self.controller = controller
        self.launcher = launcher
        self.events: RingEvents = events or _LoggedRingLosses()
        self._checkpoints = checkpoints
        self.job_key = secrets.token_bytes(32)
        """The job's secret: signs the rendezvous writes and the driver's messages."""
        self.tracker = RingTracker(options.verbose, self)
        self.notifier = PeerFailureNotifier(
            self.job_key, lambda: self.tracker.generation, self.tracker.abandon
        )
        self.notices = NoticeRouter(
            controller,
            launcher,
            self.tracker.request_flush if options.durable is not None else None,
            job.min_num_proc,
        )
        self.warm_pool = WarmPool(launcher) if options.warm_start else None
        self.progress = RingProgress(options.hang_timeout, self.events)
        self.judge = RingLossJudge() if options.durable is not None else None
        launcher.add_listener(FailureRouter(controller, self.notifier))
        launcher.add_listener(self.notices)
        launcher.add_listener(self.progress)
        if self.judge is not None:
            launcher.add_listener(self.judge)
        start = checkpoints.at_start if checkpoints is not None else None
        if start is not None:  # the job's commits count on from the checkpoint's
            self.progress.restart_from(start["commits"])

    @property
    def world_sizes(self) -> list[int]:
        """The size of every ring planned so far, in order."""
        return self.tracker.world_sizes

    def ring_formed(self, size: int, hosts: Sequence[str]) -> None:
        """The backend planned a ring (on its thread): the events hear it first, then
        the notice router (which stops the workers of hosts that left) and the
        progress tracker (whose first record of the ring follows the event)."""
        self.events.ring_formed(size, hosts)
        self.notices.ring_formed(size, hosts)
        self.progress.ring_formed(size, list(hosts))

    def ring_lost(self, loss: RingLoss) -> None:
        """A ring lost every member and starts again from the newest durable
        checkpoint: the job's commits count on from it, and the events hear what was
        lost (on the backend's thread, before the new ring's workers start)."""
        checkpoint = self._checkpoints.newest() if self._checkpoints is not None else None
        restored = checkpoint["commits"] if checkpoint is not None else 0
        made, last_at = self.progress.restart_from(restored)
        seconds = None
        if last_at is not None and checkpoint is not None:
            seconds = round(max(0.0, last_at - checkpoint["committed_at"]), 3)
        lost = {"commits": max(0, made - restored), "seconds": seconds}
        self.events.ring_lost(dataclasses.replace(loss, checkpoint=checkpoint, lost=lost))

    def fail_hung(self, hang: Hang) -> None:
        """Fail the member that holds a hung ring up, as if it died: its host leaves
        discovery first, then its worker's failed exit takes a dead worker's path
        (peers told, the backend blacklists it, the controller replaces it)."""
        self.controller.host_failed(hang.host, hang.reason)
        if not self.launcher.fail_worker(hang.host, hang.local_rank, hang.reason):
            log.warning("no worker runs on %s[%d] to fail", hang.host, hang.local_rank)

    def start(self, warm_spec: Callable[[str, int], WorkerSpec]) -> None:
        """Start the progress tracker and the warm pool, which starts a READY host's
        workers ahead with ``warm_spec(host, local_rank)``."""
        if self.warm_pool is not None:
            self.warm_pool.start(warm_spec)
        self.progress.start(self.fail_hung)

    def close(self) -> None:
        """Stop the progress tracker's and the warm pool's threads."""
        self.progress.close()
        if self.warm_pool is not None:
            self.warm_pool.close()


class FailureRouter(WorkerEvents):
    """On a worker failure: take its host out of discovery and free its peers.

    Runs on the failed worker's launcher thread, before Horovod records the failure,
    so the peers are told before any new rendezvous can begin.
    """

    def __init__(self, controller: JobController, notifier: PeerFailureNotifier) -> None:
        self._controller = controller
        self._notifier = notifier

    def worker_started(self, host: str, process_group: int) -> None:
        pass

    def worker_exited(self, exit: WorkerExit, process_group: int) -> None:
        if not exit.failed:
            return
        reason = exit.reason or f"worker rank {exit.rank} exited with {exit.exit_code}"
        self._controller.host_failed(exit.host, reason)
        self._notifier.notify(exit.host, exit.local_rank)


class NoticeRouter(WorkerEvents):
    """On a host's interruption notice (or the controller handing a host back to its
    group): drain it, and stop its workers once it has left.

    The notice takes the host out of discovery (the controller); Horovod tells the
    ring, whose workers stop at their next commit and re-form without it. The leaving
    host's workers wait in that rendezvous too: they are stopped as soon as the new
    ring is formed without them, before Horovod would tell them they have no rank.

    With durable checkpoints, a notice after which nobody would carry the ring's state
    on asks the ring to make the commit at which it stops durable (see
    :meth:`_ring_stops_for_good`).
    """

    STOP_WAIT_SECONDS = 3.0

    def __init__(
        self,
        controller: JobController,
        launcher: ProcessLauncher,
        request_flush: Callable[[], None] | None = None,
        min_workers: int = 1,
    ) -> None:
        self._controller = controller
        self._launcher = launcher
        self._request_flush = request_flush
        self._min_workers = min_workers
        self._ring: set[str] = set()  # the current ring's hosts
        self._leaving: set[str] = set()
        self._noticed: set[str] = set()  # hosts of the ring that announced a reclaim
        self._workers: dict[str, int] = {}  # host -> workers running there
        self._departed: dict[str, threading.Event] = {}  # host -> all its workers exited
        self._lock = threading.Lock()

    def worker_started(self, host: str, process_group: int) -> None:
        with self._lock:
            self._workers[host] = self._workers.get(host, 0) + 1

    def worker_exited(self, exit: WorkerExit, process_group: int) -> None:
        with self._lock:
            self._workers[exit.host] = self._workers.get(exit.host, 1) - 1
            if self._workers[exit.host] <= 0 and exit.host in self._departed:
                self._departed.pop(exit.host).set()

    def wait_if_departed(self, host: str) -> None:
        """Make a departed host's workers wait (a while) for their stop instead of
        hearing that they have no rank: Horovod's answer makes them abort with a C++
        error. The driver asks this before it answers a rank request."""
        with self._lock:
            departed = self._departed.get(host)
        if departed is not None:
            departed.wait(self.STOP_WAIT_SECONDS)

    def worker_noticed(self, host: str, notice: Notice) -> None:
        announced = InterruptionNotice(notice.kind, notice.deadline)
        # A rebalance recommendation is a risk, not a reclaim: it may last for hours,
        # and a flush makes every commit wait for its durable copy.
        reclaim = notice.kind != REBALANCE
        with self._lock:
            if reclaim:
                self._noticed.add(host)
            ring, leaving = set(self._ring), self._leaving | {host}
        if reclaim and self._request_flush is not None and self._ring_stops_for_good(ring, leaving):
            # Before the host leaves discovery: the commit at which the ring stops for
            # its departure must find the request there.
            log.info("the ring stops with nobody to carry its state on: its last commit "
                     "is made durable")  # fmt: skip
            self._request_flush()
        if self._controller.host_noticed(host, announced):
            with self._lock:
                self._leaving.add(host)

    def _ring_stops_for_good(self, ring: set[str], leaving: set[str]) -> bool:
        """Whether the ring's state would be held by nobody who stays once ``leaving``
        go: every host of the ring leaves, or the hosts that stay (those waiting to
        join among them) have fewer slots than ``--min-np``, so the ring would wait with
        its state in the memory of hosts that may be reclaimed next (spot reclaims come
        in batches). Their notices may reach the driver only after the ring has
        stopped, when no commit is left to write it: decided on the first notice."""
        if not ring:
            return False
        if ring <= leaving:
            return True
        inventory = self._controller.inventory
        if inventory is None:
            return False
        slots = inventory.hosts_and_slots()
        return sum(n for host, n in slots.items() if host not in leaving) < self._min_workers

    def ring_formed(self, size: int, hosts: Sequence[str]) -> None:
        handed_back = set(self._controller.ring_formed(hosts))
        with self._lock:
            self._ring = set(hosts)
            self._noticed &= self._ring
            # Every host of the new ring announced a reclaim (one stays while no other
            # can carry on): the store the ring formed on no longer holds the request.
            reclaimed = bool(self._ring) and self._ring <= self._noticed
            gone = (self._leaving | handed_back) - set(hosts)
            self._leaving -= gone
            for host in gone:
                if self._workers.get(host, 0) > 0:
                    self._departed[host] = threading.Event()
        if reclaimed and self._request_flush is not None:
            self._request_flush()
        for host in sorted(gone):
            log.info("host %s has left the ring; stopping its workers", host)
            self._launcher.stop_workers_on(host)
