"""Driver side of the peer-failure abort: tell a dead worker's peers at once.

When a worker dies mid-allreduce, a survivor waiting on *another survivor* (already gone
to the reset) stays blocked in a Gloo recv until ``HOROVOD_GLOO_TIMEOUT_SECONDS`` (30 s).
The launcher sees the worker's process exit at once; before Horovod records the failure
(so before any new rendezvous can form), :class:`PeerFailureNotifier` sends every other
worker of the ring a signed :class:`~spotring.worker_image.wire.PeerFailedRequest`
through Horovod's worker notification service. The worker side
(``spotring.worker_image.peer_abort``) shuts down its Gloo context's sockets, the hung
collective fails, and Horovod's normal path follows: restore the last commit,
re-rendezvous, sync. Members still *forming* the ring (in ``hvd.init``, waiting for the
dead member's address) are freed by the rendezvous server instead
(``RingTracker.abandon``).

Why this is safe: the message is sent only when a worker of the ring has *exited* with
an error, never on a timeout, so a slow but healthy step is never aborted. Every
survivor gets the same message and takes the same restore-and-sync path, so survivors
cannot disagree about whether to sync (horovod #3494). Each message carries the ring
generation and a sequence number under the job key's HMAC: a forged, replayed or late
one (from an earlier ring) is rejected by the worker.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from spotring.driver import horovod_internals
from spotring.worker_image.wire import PeerFailedRequest

log = logging.getLogger(__name__)

NOTIFY_TIMEOUT_SECONDS = 2.0


class PeerFailureNotifier:
    """Tells the surviving workers of the ring that a peer died.

    :param key: the job key the workers verify messages with.
    :param generation: the current ring generation (the rendezvous round).
    :param abandon_ring: called with the generation of a ring a member of which died,
        for members still forming it (``RingTracker.abandon``).
    """

    def __init__(
        self,
        key: bytes,
        generation: Callable[[], int],
        abandon_ring: Callable[[int], None] = lambda generation: None,
    ) -> None:
        self._key = key
        self._generation = generation
        self._abandon_ring = abandon_ring
        self._driver: Any = None
        self._sequence = itertools.count(1)
        self._sequence_lock = threading.Lock()

    def attach(self, driver: Any) -> None:
        """Horovod's ``ElasticDriver``: it knows the ring and each worker's client."""
        self._driver = driver

    def notify(self, host: str, local_rank: int) -> int:
        """Tell every other worker of the current ring; returns how many acknowledged."""
        driver = self._driver
        if driver is None or not driver.has_rank_assignment(host, local_rank):
            return 0
        generation = self._generation()
        self._abandon_ring(generation)  # for members still forming it
        peers = [
            slot
            for slots in list(driver.host_assignments.values())
            for slot in slots
            if (slot.hostname, slot.local_rank) != (host, local_rank)
        ]
        with self._sequence_lock:
            sequence = next(self._sequence)
        request = PeerFailedRequest.sign(self._key, generation, sequence, f"{host}[{local_rank}]")
        delivered: list[str] = []
        failed: list[str] = []
        threads = []
        for slot in peers:
            name = f"{slot.hostname}[{slot.local_rank}]"
            client = driver.get_worker_client(slot)
            if client is None:  # not registered yet: still starting, not in a collective
                failed.append(f"{name} (not registered)")
                continue
            thread = threading.Thread(
                target=_send, args=(client, request, name, delivered, failed), daemon=True
            )
            thread.start()
            threads.append(thread)
        deadline = time.monotonic() + NOTIFY_TIMEOUT_SECONDS
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        log.info("told %d peers of %s[%d] that it died", len(delivered), host, local_rank)
        # A refused connection: nothing listens there, the peer is gone too (every host
        # reclaimed at once): it waits for nothing.
        gone = [name for name in failed if name.endswith(f"({ConnectionRefusedError.__name__})")]
        failed = [name for name in failed if name not in gone]
        if gone:
            log.info("%s gone too", ", ".join(sorted(gone)))
        if failed:
            log.warning(
                "could not tell %s that %s[%d] died; they may wait out Gloo's timeout",
                ", ".join(sorted(failed)),
                host,
                local_rank,
            )
        return len(delivered)


def _send(
    client: Any, request: PeerFailedRequest, name: str, delivered: list[str], failed: list[str]
) -> None:
    try:
        horovod_internals.send_request(client, request)
        delivered.append(name)
    except Exception as error:  # a peer that is gone too, or one without the abort
        failed.append(f"{name} ({type(error).__name__})")
