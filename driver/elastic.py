"""Runs Horovod's elastic driver with spotring's discovery, launcher and stop conditions.

We drive ``horovod.runner.elastic.driver.ElasticDriver`` -- the engine ``horovodrun``
uses -- as spotring's subclass of it
(:class:`~spotring.driver.horovod_driver.SpotringElasticDriver`, whose overrides are
the whole list of what spotring changes in it), with our own ``HostDiscovery`` (the
controller's inventory), our own worker factory, and the ring side's objects around it
(:class:`~spotring.driver.ring_side.RingSide`). Horovod keeps doing what it does well:
rendezvous, rank assignment, blacklisting and resets. What we do instead of
``horovod.runner.gloo_run`` and why:

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
from collections.abc import Sequence
from typing import Any

from horovod.runner.elastic.driver import ElasticDriver
from horovod.runner.gloo_run import create_slot_env_vars
from horovod.runner.util.network import get_driver_ip

from spotring.core.job import JobShape
from spotring.driver import horovod_internals
from spotring.driver.horovod_driver import SpotringElasticDriver
from spotring.driver.job_control import JobAborted as JobAborted  # re-exported
from spotring.driver.job_control import JobController
from spotring.driver.launcher import ProcessLauncher, WorkerSpec
from spotring.driver.options import ElasticOptions
from spotring.driver.rendezvous import RingTracker as RingTracker  # re-exported
from spotring.driver.rendezvous import rendezvous_handler
from spotring.driver.ring_side import RingSide
from spotring.worker_image import wire
from spotring.worker_image.supervisor import local_address_towards

log = logging.getLogger(__name__)

WARM_RANK = -1
"""The rank logged for a worker started ahead, before it joins a ring."""


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
    driver = SpotringElasticDriver(ring, job, options)
    port = rendezvous.start(rendezvous_handler(driver), address, job_key=ring.job_key)
    ring.notifier.attach(driver)
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
