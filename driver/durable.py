"""Driver side of durable checkpoints: a ring that lost every member starts again.

Horovod re-forms a ring around its survivors, who hold the committed state; with no
survivor it stops the job ("failure count == N -> stop running", or "No hosts from
previous set remaining, unable to broadcast state"). With ``--checkpoint``, the
workers' state also lives in durable storage (:mod:`spotring.worker_image.durable`),
so the driver starts a new ring instead, on whatever hosts the inventory offers, and
its rank 0 loads the newest checkpoint before the first sync.

Only a reclaim is resumed: a ring whose members all failed because they were killed (a
signal: a spot reclaim, a hard kill, the OOM killer) or lost (the ssh connection to a
host that vanished). Members that all exited on their own with an error code are a
broken script: the job stops as before, its checkpoints kept. Each resume counts
against ``--reset-limit`` like any other reset.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from spotring.driver import horovod_internals as internals
from spotring.driver.ring_events import RingLoss as RingLoss  # re-exported: its old home
from spotring.driver.worker_events import WorkerEvents, WorkerExit

log = logging.getLogger(__name__)

SSH_LOST_EXIT = 255
"""The exit status of an ssh client whose connection died (its host vanished)."""


def killed(exit_code: int) -> bool:
    """Whether a worker's exit status says it was killed or lost rather than failing
    by itself: a signal (negative, or 128 + the signal from a shell or ssh) or a lost
    ssh connection."""
    return exit_code < 0 or exit_code > 128


class RingLossJudge(WorkerEvents):
    """Remembers how each worker ended; a launcher listener.

    :meth:`reclaimed` tells a reclaim (some member killed or lost) from a broken
    script (every member exited by itself with an error)."""

    def __init__(self) -> None:
        self._exits: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    def worker_started(self, host: str, process_group: int) -> None:
        pass

    def worker_exited(self, exit: WorkerExit, process_group: int) -> None:
        with self._lock:
            self._exits[(exit.host, exit.local_rank)] = exit.exit_code

    def reclaimed(self, slots: Any) -> bool:
        """Whether any of ``slots`` ((host, local_rank) pairs) was killed or lost."""
        with self._lock:
            return any(killed(self._exits.get(tuple(slot), 0)) for slot in slots)


class LostRings:
    """Starts a new ring when the ring lost every member to a reclaim (``judge``), and
    lets a new ring form on hosts none of which was in the previous one (every host left
    after its notice) instead of stopping; ``on_resume`` is told before the new ring's
    workers start.

    Spotring's driver and its worker registry (:mod:`spotring.driver.horovod_driver`)
    ask it at three of Horovod's steps, handing it Horovod's own step (``horovod_*``).
    """

    def __init__(self, judge: RingLossJudge, on_resume: Callable[[RingLoss], None]) -> None:
        self._judge = judge
        self._on_resume = on_resume

    def workers_recorded(
        self, driver: Any, registry: Any, horovod_decision: Callable[[], None]
    ) -> None:
        """A round ended (every worker recorded): a ring whose members were all killed
        or lost starts again on whatever hosts there are; any other round is Horovod's
        to decide."""
        failed = internals.failed_slots(registry)
        size = internals.registry_size(registry)
        if size == 0 or len(failed) != size or not self._judge.reclaimed(failed):
            horovod_decision()
            return
        if internals.reset_limit_reached(registry):
            horovod_decision()  # Horovod stops the job, as for any reset over the limit
            return
        # As Horovod does with failed hosts: a new ring on them would fail at once
        # (they are gone, or their workers are), and the hosts' listing lags.
        for host in sorted({host for host, _ in failed}):
            internals.blacklist(driver, host)
        internals.count_reset(registry)
        internals.forget_host_assignments(driver)
        self._on_resume(RingLoss(size, f"all {size} workers were killed or lost"))
        try:
            driver.resume()
        except Exception:  # as Horovod's own resume: the job stops with the reason logged
            log.exception("failed to start a new ring -> stop running")
            driver.stop()

    def update_host_assignments(
        self, driver: Any, horovod_update: Callable[[Any], Any], current_hosts: Any
    ) -> Any:
        """The next ring's ranks: when no host of the last ring is left, the ring is
        lost, and the next one starts every slot anew."""
        previous = internals.assigned_hosts(driver)
        following = internals.hosts_to_assign(driver, current_hosts)
        if previous and not previous & following:
            internals.forget_host_assignments(driver)
            self._on_resume(RingLoss(len(previous), "every host of the ring left"))
        return horovod_update(current_hosts)

    @staticmethod
    def record_failure(
        driver: Any, registry: Any, horovod_record: Callable[[str, int], int], host: str, slot: int
    ) -> int:
        """Record a worker's failed exit, unless a ring formed meanwhile without it.

        Horovod checks that the slot has a rank, then records, waiting for the round
        being decided; when that decision formed a ring on other hosts, the failure of
        a worker of the previous ring would count as a member of the new round (and a
        ring lost twice). Checked again after the wait, it is left out."""
        internals.wait_for_round_decision(registry)
        if not driver.has_rank_assignment(host, slot):
            log.info("ignoring the exit of %s[%d]: not in the current ring", host, slot)
            return int(registry.last_rendezvous())
        return horovod_record(host, slot)
