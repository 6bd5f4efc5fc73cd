"""Workers started ahead of their join, so that a joining host costs the ring only the join.

Horovod starts a new host's worker only once the running ring has stopped for the
reset, so the whole ring waits out the worker's start-up: the interpreter, the torch
and Horovod imports, the script's set-up before ``hvd.init`` and, on GPU hosts, CUDA's
initialisation (7-10 s on 2 cores; more on GPU hosts). The pool starts a worker for
each slot of a READY host as soon as the inventory lists it, while the ring trains
on; each waits in ``hvd.init`` (:mod:`spotring.worker_image.warm_start`). The host is
offered to Horovod (:class:`~spotring.driver.discovery.InventoryHostDiscovery`) only
once all its workers wait there, and Horovod's ``create_worker`` hands each its slot
(:meth:`WarmPool.take`): the ring pauses for the rendezvous, the new ring and the
state sync only. The same holds for the first ring and for replacements.

A host whose warm worker ends before it reaches ``hvd.init`` (a script that fails on
start-up, a host that died) is offered all the same and started cold, so the failure
takes Horovod's usual path. Workers of a host that leaves the inventory before it
joins (a reclaim, a scale-down) are stopped; so are all that are left at the end.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from spotring.driver.launcher import ProcessLauncher, WarmWorker, WorkerSpec

log = logging.getLogger(__name__)

SLOW_START_SECONDS = 120.0
"""After this long without reaching ``hvd.init``, a warm worker is reported (once)."""


@dataclass
class _WarmHost:
    workers: dict[int, WarmWorker]
    """By local rank, until Horovod takes them."""
    since: float
    offered: bool = False
    reported_slow: bool = False


class WarmPool:
    """Keeps a worker started ahead for every slot of every READY host not yet offered
    to Horovod, and says which hosts to offer.

    :param launcher: starts the workers (:meth:`ProcessLauncher.prestart`).
    :param clock: for tests.
    """

    def __init__(
        self, launcher: ProcessLauncher, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._launcher = launcher
        self._clock = clock
        self._lock = threading.Lock()
        self._hosts: dict[str, _WarmHost] = {}
        self._make_spec: Callable[[str, int], WorkerSpec] | None = None
        self._closed = False

    def start(self, make_spec: Callable[[str, int], WorkerSpec]) -> None:
        """Start warming hosts: ``make_spec(host, local_rank)`` is the worker to start
        ahead, without the slot's rank variables. Until then no host is offered."""
        with self._lock:
            self._make_spec = make_spec

    def offer(self, available: Mapping[str, int]) -> dict[str, int]:
        """The hosts of ``available`` (READY hosts and their slots) to offer Horovod.

        A host is offered once every one of its workers waits in ``hvd.init`` (or one
        ended before, see the module's doc), and from then on until it leaves
        ``available``. Starts workers for the hosts new in ``available``; stops those of
        hosts that left it before they joined. Never raises.
        """
        with self._lock:
            if self._make_spec is None or self._closed:
                return {}
            for host in [h for h in self._hosts if h not in available]:
                self._forget(host, "left")
            offered: dict[str, int] = {}
            for host, slots in available.items():
                warm = self._hosts.get(host)
                if warm is None:
                    warm = self._hosts[host] = self._warm_up(host, slots, self._make_spec)
                if not warm.offered:
                    warm.offered = self._ready(host, warm)
                if warm.offered:
                    offered[host] = slots
            return offered

    def take(self, host: str, local_rank: int) -> WarmWorker | None:
        """The worker started ahead for this slot, for Horovod's ``create_worker``
        (None: start it cold). Each is taken once."""
        with self._lock:
            warm = self._hosts.get(host)
            return None if warm is None else warm.workers.pop(local_rank, None)

    def close(self) -> None:
        """Stop every worker not taken; offer nothing from now on."""
        with self._lock:
            self._closed = True
            for host in list(self._hosts):
                self._forget(host, "did not join before the job ended")

    def _warm_up(
        self, host: str, slots: int, make_spec: Callable[[str, int], WorkerSpec]
    ) -> _WarmHost:
        warm = _WarmHost(workers={}, since=self._clock())
        for local_rank in range(slots):
            try:
                warm.workers[local_rank] = self._launcher.prestart(make_spec(host, local_rank))
            except Exception as error:  # Horovod's cold start will meet it too, and report it
                log.warning("cannot start a worker ahead on %s: %s", host, error)
                warm.offered = True
        if warm.workers:
            log.info("host %s: started %d workers ahead of its join", host, len(warm.workers))
        return warm

    def _ready(self, host: str, warm: _WarmHost) -> bool:
        ended = [r for r, w in warm.workers.items() if w.exited and not w.held]
        if ended:
            log.warning(
                "a worker started ahead on %s ended before it reached hvd.init (its "
                "output is above); the host joins and that worker starts cold",
                host,
            )
            for local_rank in ended:
                warm.workers.pop(local_rank).stop()  # reaps it
            return True
        if all(w.held for w in warm.workers.values()):
            log.info("host %s: its workers wait in hvd.init; offered to Horovod", host)
            return True
        waited = self._clock() - warm.since
        if waited > SLOW_START_SECONDS and not warm.reported_slow:
            warm.reported_slow = True
            log.warning(
                "the workers started ahead on %s have not reached hvd.init after %.0f s; "
                "the host joins once they have",
                host,
                waited,
            )
        return False

    def _forget(self, host: str, why: str) -> None:
        warm = self._hosts.pop(host)
        for worker in warm.workers.values():
            worker.stop()
        if warm.workers:
            count = len(warm.workers)
            log.info("host %s %s: stopped its %d workers started ahead", host, why, count)
