"""Runs Horovod's elastic driver with spotring's discovery, launcher and stop conditions.

We drive ``horovod.runner.elastic.driver.ElasticDriver`` -- the engine ``horovodrun``
uses -- with our own ``HostDiscovery`` (the controller's inventory) and our own worker
factory. Horovod keeps doing what it does well: rendezvous, rank assignment,
blacklisting and resets. What we do instead of ``horovod.runner.gloo_run`` and why:

* Each worker's command and environment go to the launcher as data (a
  :class:`~spotring.driver.launcher.WorkerSpec`), not as an ``env K=V ...`` string, so
  no value reaches any process's argv; and only allow-listed variables are forwarded.
* No interface probe over ssh (Horovod's pickles the job's secret key onto each task's
  command line): with ``--network-interface`` the named interfaces are used, otherwise
  the driver listens on its address towards the hosts and each worker picks its own
  interface towards the driver.
* Every ring gets a generation number, published on the rendezvous server, which the
  peer-failure messages are bound to.
* The rendezvous server is Horovod's, hardened against hostile requests
  (:mod:`spotring.driver.rendezvous`): it unpickles nothing a client sends it, hands
  no worker's key to anyone, and stores only the current ring's Gloo keys; and the
  driver takes nothing but Horovod's own answers from the workers it registered.
* The job stops cleanly, with the controller's message, when the controller hits an
  error it cannot retry (a missing group, denied permissions, a plugin's bug).
* A READY host's workers are started ahead and wait in ``hvd.init``; the host is
  offered to Horovod once they do, and ``create_worker`` hands them their slots
  (:mod:`spotring.driver.warm_pool`): a join stalls the ring for the join only.
* A host that announced its interruption leaves discovery at once; Horovod re-forms
  the ring without it at the next commit (nothing restored), and only then are its
  workers stopped: a worker stopped mid-collective would force a rollback.
* Every ring member's commits and heartbeats reach the driver, and so does each rank
  request as it arrives (:mod:`spotring.driver.ring_progress`): the run records when a
  ring stood still, and with ``hang_timeout`` a ring that made no progress for that
  long, training or in a reset, has the member that holds it up failed like one that
  died.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from horovod.runner.elastic.driver import ElasticDriver
from horovod.runner.elastic.worker import HostUpdateResult
from horovod.runner.gloo_run import create_slot_env_vars
from horovod.runner.util.network import get_driver_ip

from spotring.core import InterruptionNotice
from spotring.core.job import JobShape
from spotring.driver import horovod_internals
from spotring.driver.discovery import InventoryHostDiscovery, InventorySource
from spotring.driver.durable import RingLoss, RingLossJudge, resume_lost_rings
from spotring.driver.launcher import ProcessLauncher, WorkerExit, WorkerSpec
from spotring.driver.options import ElasticOptions
from spotring.driver.peer_failure import PeerFailureNotifier
from spotring.driver.rendezvous import RingTracker, rendezvous_handler, use_safe_worker_clients
from spotring.driver.ring_progress import Hang, RingProgress
from spotring.driver.warm_pool import WarmPool
from spotring.worker_image import wire
from spotring.worker_image.notices import REBALANCE, Notice
from spotring.worker_image.supervisor import local_address_towards

log = logging.getLogger(__name__)

COORDINATOR_REPLAY_DELAY_SECONDS = 1.0
WARM_RANK = -1
"""The rank logged for a worker started ahead, before it joins a ring."""


class JobController(InventorySource, Protocol):
    """What the driver needs of spotring's controller (its ``inventory`` among it)."""

    def host_failed(self, address: str, reason: str) -> object: ...

    def host_noticed(self, address: str, notice: InterruptionNotice) -> bool: ...

    def notice_watcher(self, address: str) -> dict[str, Any] | None: ...

    def ring_formed(self, hosts: Sequence[str]) -> Sequence[str]:
        """Horovod planned a ring of ``hosts`` (on its thread; quick). Returns the hosts
        the controller took out of discovery itself (handed back to their group) that
        the ring left out: their workers are stopped like a noticed host's."""
        ...

    def wait_for_fatal_error(self, timeout: float | None = None) -> Exception | None:
        """Block until the controller stops for good; its error, or None on timeout."""
        ...


class JobAborted(RuntimeError):
    """The job was stopped before it could finish: by the controller, or a signal."""

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause


def run_elastic(
    command: Sequence[str],
    controller: JobController,
    launcher: ProcessLauncher,
    job: JobShape,
    options: ElasticOptions,
    rendezvous: RingTracker | None = None,
    progress: RingProgress | None = None,
    on_ring_lost: Callable[[RingLoss], None] | None = None,
) -> None:
    """Run ``command`` as an elastic Horovod job of ``job``'s worker counts on the
    controller's hosts.

    Returns when the job succeeds; raises ``RuntimeError`` with Horovod's message when
    it fails, and :class:`JobAborted` when the controller stopped it. ``progress``
    (default: one with ``options.hang_timeout`` and no listeners) hears every ring and
    every member's commits while the job runs. With ``options.durable``, a ring that
    lost every member starts again from durable storage, ``on_ring_lost`` told first.
    """
    rendezvous = rendezvous or RingTracker(options.verbose)
    # Listen only where the workers reach the driver, not on every interface.
    address = _driver_address(options.nics, controller, options.elastic_timeout)
    job_key = secrets.token_bytes(32)
    notifier = PeerFailureNotifier(job_key, lambda: rendezvous.generation, rendezvous.abandon)
    launcher.add_listener(_FailureRouter(controller, notifier))
    notices = _NoticeRouter(
        controller,
        launcher,
        rendezvous.request_flush if options.durable else None,
        job.min_num_proc,
    )
    launcher.add_listener(notices)
    rendezvous.add_ring_listener(notices.ring_formed)
    warm_pool = WarmPool(launcher) if options.warm_start else None
    progress = progress or RingProgress(options.hang_timeout)
    launcher.add_listener(progress)
    rendezvous.add_ring_listener(progress.ring_formed)

    def fail_hung(hang: Hang) -> None:
        # The host leaves discovery first, then the worker's failed exit takes the
        # path of a worker that died: peers told, Horovod blacklists, replacement.
        controller.host_failed(hang.host, hang.reason)
        if not launcher.fail_worker(hang.host, hang.local_rank, hang.reason):
            log.warning("no worker runs on %s[%d] to fail", hang.host, hang.local_rank)

    driver = ElasticDriver(
        rendezvous,
        InventoryHostDiscovery(controller, warm_pool),
        job.min_num_proc,
        job.max_num_proc,
        timeout=options.elastic_timeout,
        reset_limit=options.reset_limit,
        cooldown_range=options.cooldown_range,
        verbose=options.verbose,
    )
    if options.durable is not None:
        judge = RingLossJudge()
        launcher.add_listener(judge)
        resume_lost_rings(driver, judge, on_ring_lost or _log_ring_loss)
    notices.hold_rank_answers(driver)
    _tell_rank_requests(driver, progress.slot_asked)
    _quiet_exits_after_stop(driver)
    use_safe_worker_clients(driver)
    port = rendezvous.start(rendezvous_handler(driver), address, job_key=job_key)
    notifier.attach(driver)
    _announce_joins_as_additions(driver)
    _replay_host_changes_for_new_coordinator(driver)
    stopper = _Stopper(driver)
    threading.Thread(
        target=_stop_on_fatal_error, args=(controller, stopper), name="spotring-stop", daemon=True
    ).start()
    run_env = _rendezvous_env(options.nics, address, port)
    run_env[wire.JOB_KEY_ENV] = job_key.hex()
    base = {**options.worker_env, **run_env, "PYTHONUNBUFFERED": "1"}

    def worker_spec(host: str, local_rank: int, rank: int, env: dict[str, str]) -> WorkerSpec:
        return WorkerSpec(
            host=host,
            local_rank=local_rank,
            rank=rank,
            argv=tuple(command),
            env={**base, **env},
            cwd=os.getcwd(),
            notices=controller.notice_watcher(host),
        )

    def create_worker(slot_info: Any, events: Sequence[threading.Event]) -> tuple[int, float]:
        host, local_rank = slot_info.hostname, slot_info.local_rank
        rendezvous.worker_launched(host, local_rank)
        spec = worker_spec(host, local_rank, slot_info.rank, create_slot_env_vars(slot_info))
        warm = warm_pool.take(host, local_rank) if warm_pool is not None else None
        return launcher(spec, events, warm)

    if warm_pool is not None:
        warm_pool.start(
            lambda host, local_rank: worker_spec(
                host, local_rank, WARM_RANK, warm_worker_env(host, local_rank)
            )
        )
    progress.start(fail_hung)
    try:
        driver.wait_for_available_slots(job.num_proc)
        driver.start(job.num_proc, create_worker)
        results = _wait_for_results(driver, stopper)
    except RuntimeError:
        if stopper.reason is None:
            raise
    finally:
        stopper.stop()
        progress.close()
        if warm_pool is not None:
            warm_pool.close()
    if stopper.reason is not None:
        raise JobAborted(stopper.reason, stopper.cause)
    if results.error_message is not None:
        raise RuntimeError(results.error_message)
    for name, (exit_code, _) in sorted(results.worker_results.items(), key=lambda i: i[1][1]):
        if exit_code != 0:
            raise RuntimeError(
                "Horovod detected that one or more processes exited with non-zero status, "
                f"thus causing the job to be terminated. The first process to do so was: "
                f"Process name: {name} Exit code: {exit_code}"
            )


def _log_ring_loss(loss: RingLoss) -> None:
    log.warning("ring lost (%s): starting a new ring from durable storage", loss.why)


def warm_worker_env(host: str, local_rank: int) -> dict[str, str]:
    """What a worker started ahead gets on top of every worker's environment.

    It knows its host and slot; its rank comes when it joins. Until then its rendezvous
    port is 0: an ``hvd.init`` that runs without spotring's hold (a script run with
    ``python -I`` ignores the ``sitecustomize``) fails at once instead of forming a
    ring of one and training alone as rank 0.
    """
    return {
        wire.HOSTNAME_ENV: host,
        wire.LOCAL_RANK_ENV: str(local_rank),
        wire.RENDEZVOUS_PORT_ENV: "0",
    }


def _driver_address(nics: Sequence[str], controller: JobController, timeout: float) -> str:
    """The driver's address on the named interface, or on the route to the group's
    hosts (waiting up to ``timeout`` for a first READY host)."""
    if nics:
        return str(get_driver_ip(nics))
    deadline = time.monotonic() + timeout
    while True:
        inventory = controller.inventory
        hosts = [i.address for i in inventory.ready] if inventory else []
        if hosts or time.monotonic() > deadline:
            return _address_towards(hosts)
        error = controller.wait_for_fatal_error(timeout=0.2)
        if error is not None:
            raise JobAborted(str(error), error)


def _rendezvous_env(nics: Sequence[str], address: str, port: int) -> dict[str, str]:
    """Where workers find the rendezvous server, and the interfaces they use."""
    env = {
        wire.RENDEZVOUS_ADDR_ENV: address,
        wire.RENDEZVOUS_PORT_ENV: str(port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_ELASTIC": "1",
    }
    if nics:  # otherwise each worker's supervisor picks its interface towards the driver
        env["HOROVOD_GLOO_IFACE"] = nics[0]
        env["NCCL_SOCKET_IFNAME"] = ",".join(nics)
    return env


def _address_towards(hosts: Sequence[str]) -> str:
    """This machine's address on the route to the first host it can route to."""
    for host in hosts:
        address = local_address_towards(host)
        if address is not None:
            return address
    raise RuntimeError(f"no route to any of the hosts {', '.join(hosts)}: pass --network-interface")


class _Stopper:
    """Stops Horovod's driver once, remembering why (None: the job ended by itself).

    Never waits without a bound: on Ctrl-C it runs on the main thread, in place of a
    signal handler. Horovod's ``stop`` joins its discovery thread, which may be inside
    a host-change notice to a worker that does not answer (holding the hosts lock for
    up to three attempts of 20 s), so it runs on a thread of its own. What stops the
    workers comes first in it (the shutdown event the launcher watches): everything
    after that may be left behind once :data:`STOP_WAIT_SECONDS` have passed.
    """

    STOP_WAIT_SECONDS = 5.0

    def __init__(self, driver: ElasticDriver) -> None:
        self._driver = driver
        self._lock = threading.Lock()
        self.stopped = threading.Event()
        self.reason: str | None = None
        self.cause: BaseException | None = None

    def stop(self, reason: str | None = None, cause: BaseException | None = None) -> None:
        with self._lock:
            if self.stopped.is_set():
                return
            self.stopped.set()
            self.reason, self.cause = reason, cause
        deadline = time.monotonic() + self.STOP_WAIT_SECONDS
        stopping = threading.Thread(
            target=self._driver.stop, args=(reason,), name="spotring-stop-horovod", daemon=True
        )
        stopping.start()
        while not self._driver.finished() and time.monotonic() < deadline:
            time.sleep(0.01)
        # Wake a wait for slots (the start, a resume): it sees the shutdown and ends.
        cond = horovod_internals.wait_hosts_cond(self._driver)
        if cond.acquire(timeout=max(0.0, deadline - time.monotonic())):
            try:
                cond.notify_all()
            finally:
                cond.release()
        # Release the threads waiting at the reset's barrier (a dead worker's exit, a
        # survivor's rank request): once the job is stopped it never completes, and
        # Horovod's results join the exits' threads. Barrier.abort waits for a barrier
        # action in progress (a resume), so on a thread of its own too.
        releasing = threading.Thread(
            target=_break_reset_barrier, args=(self._driver,), name="spotring-stop-barrier",
            daemon=True,
        )  # fmt: skip
        releasing.start()
        releasing.join(max(0.0, deadline - time.monotonic()))
        stopping.join(max(0.0, deadline - time.monotonic()))
        if stopping.is_alive():
            log.warning(
                "Horovod's driver did not stop within %g s (its discovery thread is busy); "
                "going on without waiting for it",
                self.STOP_WAIT_SECONDS,
            )


def _break_reset_barrier(driver: ElasticDriver) -> None:
    barrier = horovod_internals.reset_barrier(driver)
    if barrier is not None:
        barrier.abort()


def _quiet_exits_after_stop(driver: ElasticDriver) -> None:
    """A worker's exit recorded once the job is stopped meets the reset's broken barrier
    (:meth:`_Stopper.stop`): that is the stop, not an error to print a traceback for."""
    handle_exit = horovod_internals.handle_worker_exit(driver)

    def _handle_worker_exit(slot_info: Any, exit_code: int, timestamp: float) -> None:
        try:
            handle_exit(slot_info, exit_code, timestamp)
        except threading.BrokenBarrierError:
            if not driver.finished():
                raise

    horovod_internals.replace_handle_worker_exit(driver, _handle_worker_exit)


def _stop_on_fatal_error(controller: JobController, stopper: _Stopper) -> None:
    while not stopper.stopped.is_set():
        error = controller.wait_for_fatal_error(timeout=0.5)
        if error is not None:
            log.info("stopping the job: %s", error)
            stopper.stop(str(error), error)


def _wait_for_results(driver: ElasticDriver, stopper: _Stopper) -> Any:
    """Horovod's results; on Ctrl-C, stop every worker first (a second Ctrl-C forces)."""
    try:
        return driver.get_results()
    except KeyboardInterrupt as interrupt:
        stopper.stop("interrupted", interrupt)
        return driver.get_results()


def _tell_rank_requests(driver: ElasticDriver, asked: Callable[[str, int], None]) -> None:
    """Call ``asked(host, slot)`` for each worker's rank request as it arrives, before
    Horovod holds it at the reset's barrier (which a member that never asks holds up)."""
    record_ready = driver.record_ready

    def record_asked(host: str, slot: int) -> None:
        asked(host, slot)
        record_ready(host, slot)

    horovod_internals.replace_record_ready(driver, record_asked)


def _announce_joins_as_additions(driver: ElasticDriver) -> None:
    """Tell the workers of a change that brings a new host into the ring as an addition.

    Horovod's workers skip the state sync after a reset when every change they heard
    of was a removal (``HostsUpdatedInterrupt(skip_sync=True)``): the survivors all hold
    the same state. But a host discovered earlier that found no slot (the ring at
    ``--max-np``, a warm spare) takes the slot a removed host frees, and Horovod tells
    of the removal only: the new member then waits in the sync's broadcasts while the
    survivors train, and the ring hangs for good (seen handing an on-demand host back
    with a warm spot host waiting). Such a change is told as removal and addition.
    """
    notify = horovod_internals.notify_workers_host_changes_function(driver)

    def notify_with_joins(current_hosts: Any, update_result: Any) -> None:
        if not update_result & HostUpdateResult.added:
            try:
                joining = horovod_internals.hosts_to_assign(driver, current_hosts)
            except ValueError:  # too few slots for a ring: Horovod tells no one
                joining = set()
            if joining - horovod_internals.assigned_hosts(driver):
                update_result |= HostUpdateResult.added
        notify(current_hosts, update_result)

    horovod_internals.replace_notify_workers_host_changes(driver, notify_with_joins)


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
        with horovod_internals.wait_hosts_cond(driver):
            if driver.finished():
                return
            # Horovod itself returns early when the assignments would not change.
            current = horovod_internals.current_hosts(driver)
            horovod_internals.notify_workers_host_changes(driver, current, HostUpdateResult.mixed)

    def register_worker_server(host, slot, addresses, secret_key):
        register(host, slot, addresses, secret_key)
        coordinator = driver.get_coordinator_info()
        if coordinator is not None and (coordinator.hostname, coordinator.local_rank) == (
            host,
            slot,
        ):
            timer = threading.Timer(COORDINATOR_REPLAY_DELAY_SECONDS, replay)
            timer.daemon = True
            timer.start()

    horovod_internals.replace_register_worker_server(driver, register_worker_server)


class _FailureRouter:
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


class _NoticeRouter:
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

    def hold_rank_answers(self, driver: ElasticDriver) -> None:
        """Make a departed host's workers wait for their stop instead of hearing that
        they have no rank: Horovod's answer makes them abort with a C++ error."""
        get_slot_info = driver.get_slot_info

        def held(host: str, slot: int) -> Any:
            with self._lock:
                departed = self._departed.get(host)
            if departed is not None:
                departed.wait(self.STOP_WAIT_SECONDS)
            return get_slot_info(host, slot)

        horovod_internals.replace_get_slot_info(driver, held)

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

    def ring_formed(self, size: int, hosts: list[str]) -> None:
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
