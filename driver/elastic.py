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
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from horovod.runner.elastic.driver import ElasticDriver
from horovod.runner.elastic.worker import HostUpdateResult
from horovod.runner.gloo_run import create_slot_env_vars
from horovod.runner.util.network import get_driver_ip

from spotring.core.job import JobShape
from spotring.driver import horovod_internals
from spotring.driver.discovery import InventoryHostDiscovery
from spotring.driver.durable import resume_lost_rings
from spotring.driver.launcher import ProcessLauncher, WorkerSpec
from spotring.driver.options import ElasticOptions
from spotring.driver.rendezvous import RingTracker as RingTracker  # re-exported
from spotring.driver.rendezvous import rendezvous_handler, use_safe_worker_clients
from spotring.driver.ring_side import JobController, NoticeRouter, RingSide
from spotring.worker_image import wire
from spotring.worker_image.supervisor import local_address_towards

log = logging.getLogger(__name__)

COORDINATOR_REPLAY_DELAY_SECONDS = 1.0
WARM_RANK = -1
"""The rank logged for a worker started ahead, before it joins a ring."""


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
    ring: RingSide | None = None,
) -> None:
    """Run ``command`` as an elastic Horovod job of ``job``'s worker counts on the
    controller's hosts.

    Returns when the job succeeds; raises ``RuntimeError`` with Horovod's message when
    it fails, and :class:`JobAborted` when the controller stopped it. ``ring`` (default:
    one whose events are ignored but a lost ring's, logged) holds the ring-side objects
    and tells the rings' events while the job runs. With ``options.durable``, a ring
    that lost every member starts again from durable storage.
    """
    ring = ring or RingSide(controller, launcher, job, options)
    rendezvous = ring.tracker
    # Listen only where the workers reach the driver, not on every interface.
    address = _driver_address(options.nics, controller, options.elastic_timeout)
    driver = ElasticDriver(
        rendezvous,
        InventoryHostDiscovery(controller, ring.warm_pool),
        job.min_num_proc,
        job.max_num_proc,
        timeout=options.elastic_timeout,
        reset_limit=options.reset_limit,
        cooldown_range=options.cooldown_range,
        verbose=options.verbose,
    )
    if ring.judge is not None:
        resume_lost_rings(driver, ring.judge, ring.ring_lost)
    _hold_rank_answers(driver, ring.notices)
    _tell_rank_requests(driver, ring.progress.slot_asked)
    _quiet_exits_after_stop(driver)
    use_safe_worker_clients(driver)
    port = rendezvous.start(rendezvous_handler(driver), address, job_key=ring.job_key)
    ring.notifier.attach(driver)
    _announce_joins_as_additions(driver)
    _replay_host_changes_for_new_coordinator(driver)
    stopper = _Stopper(driver)
    threading.Thread(
        target=_stop_on_fatal_error, args=(controller, stopper), name="spotring-stop", daemon=True
    ).start()
    run_env = _rendezvous_env(options.nics, address, port)
    run_env[wire.JOB_KEY_ENV] = ring.job_key.hex()
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
        warm = ring.warm_pool.take(host, local_rank) if ring.warm_pool is not None else None
        return launcher(spec, events, warm)

    ring.start(
        lambda host, local_rank: worker_spec(
            host, local_rank, WARM_RANK, warm_worker_env(host, local_rank)
        )
    )
    try:
        driver.wait_for_available_slots(job.num_proc)
        driver.start(job.num_proc, create_worker)
        results = _wait_for_results(driver, stopper)
    except RuntimeError:
        if stopper.reason is None:
            raise
    finally:
        stopper.stop()
        ring.close()
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


def _hold_rank_answers(driver: ElasticDriver, notices: NoticeRouter) -> None:
    """Make a departed host's workers wait for their stop instead of hearing that they
    have no rank: Horovod's answer makes them abort with a C++ error."""
    get_slot_info = driver.get_slot_info

    def held(host: str, slot: int) -> Any:
        notices.wait_if_departed(host)
        return get_slot_info(host, slot)

    horovod_internals.replace_get_slot_info(driver, held)


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
