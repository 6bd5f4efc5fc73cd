"""Frees surviving workers from a collective that a dead peer left hanging.

The problem: when a worker dies mid-allreduce, a survivor waiting on *another survivor*
(which has already left for the reset) stays blocked in a Gloo recv until
``HOROVOD_GLOO_TIMEOUT_SECONDS`` (30 s) passes, and the whole job waits with it.

The mechanism, in two halves:

* Driver side (:class:`PeerFailureNotifier`): the launcher sees the worker's process
  exit at once. Before Horovod records the failure (so before any new rendezvous can
  form), the driver sends every other worker of the current ring a message through
  Horovod's own worker notification service, which authenticates requests with the
  job's secret key. The message is a ``HostsUpdatedRequest`` whose result carries the
  extra :data:`PEER_FAILED` bit.
* Worker side (:class:`CollectiveAbort`): on that message the worker shuts down the
  TCP sockets of its current Gloo context. The blocked recv returns an error at once,
  Horovod raises ``HorovodInternalError``, and the worker takes the normal elastic
  path: restore the last commit, re-rendezvous, sync.

Why this is safe: the message is sent only when a worker of the ring has *exited* with
an error, never on a timeout, so a slow but healthy step is never aborted. Every
survivor gets the same message and takes the same ``HorovodInternalError`` path
(restore + sync), so survivors cannot disagree about whether to sync (horovod #3494).
Only sockets created by Horovod's ``init`` are touched, and only those of the context
in use when the message arrived; a context formed later is left alone.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable

from horovod.runner.elastic.worker import HostUpdateResult

log = logging.getLogger(__name__)

PEER_FAILED = 8
"""Bit set in a HostsUpdatedRequest's result when a ring member's process died."""

NOTIFY_TIMEOUT_SECONDS = 2.0


# ------------------------------------------------------------------ driver side


class PeerFailureNotifier:
    """Tells the surviving workers of the ring that a peer died."""

    def __init__(self) -> None:
        self._driver = None

    def attach(self, driver) -> None:  # type: ignore[no-untyped-def]
        """Horovod's ``ElasticDriver``: it knows the ring and each worker's client."""
        self._driver = driver

    def notify(self, host: str, local_rank: int) -> int:
        """Notify every other worker of the current ring; returns how many were told."""
        driver = self._driver
        if driver is None or not driver.has_rank_assignment(host, local_rank):
            return 0
        peers = [
            slot
            for slots in list(driver.host_assignments.values())
            for slot in slots
            if (slot.hostname, slot.local_rank) != (host, local_rank)
        ]
        clients = [c for c in (driver.get_worker_client(slot) for slot in peers) if c]
        result = HostUpdateResult(HostUpdateResult.removed | PEER_FAILED)
        timestamp = int(time.time())
        threads = [
            threading.Thread(target=_send, args=(client, timestamp, result), daemon=True)
            for client in clients
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + NOTIFY_TIMEOUT_SECONDS
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        log.info("told %d peers of %s[%d] that it died", len(clients), host, local_rank)
        return len(clients)


def _send(client, timestamp: int, result: HostUpdateResult) -> None:  # type: ignore[no-untyped-def]
    try:
        client.notify_hosts_updated(timestamp, result)
    except Exception as error:  # a peer that is gone too: nothing to free
        log.debug("could not notify a peer: %s", error)


# ------------------------------------------------------------------ worker side


def _socket_inodes() -> dict[int, int]:
    """``{inode: fd}`` of this process's sockets."""
    inodes: dict[int, int] = {}
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes[int(target[8:-1])] = int(name)
    return inodes


def _tcp_inodes() -> set[int]:
    """Inodes of every TCP socket on this machine (IPv4 and IPv6), any state."""
    inodes: set[int] = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as stream:
                next(stream)
                for line in stream:
                    fields = line.split()
                    inodes.add(int(fields[9]))
        except OSError:
            continue
    return inodes


def own_tcp_sockets() -> set[int]:
    """Inodes of this process's TCP sockets."""
    return set(_socket_inodes()) & _tcp_inodes()


class CollectiveAbort:
    """Knows which sockets belong to the current Gloo context and can shut them down."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._context_sockets: set[int] = set()

    def track_init(self, init: Callable[[], None]) -> Callable[[], None]:
        """Wrap Horovod's ``init`` so the sockets it opens are remembered."""

        def tracked_init(*args, **kwargs):  # type: ignore[no-untyped-def]
            before = own_tcp_sockets()
            result = init(*args, **kwargs)
            self.remember(own_tcp_sockets() - before)
            return result

        return tracked_init

    def remember(self, inodes: Iterable[int]) -> None:
        with self._lock:
            self._context_sockets = set(inodes)

    def abort(self) -> int:
        """Shut down the current context's sockets; returns how many were open."""
        with self._lock:
            targets, self._context_sockets = self._context_sockets, set()
        fds = _socket_inodes()
        count = 0
        for inode in targets:
            fd = fds.get(inode)
            if fd is None:
                continue
            try:
                # Shutdown acts on the connection, which the dup shares with Gloo's fd.
                with socket.socket(fileno=os.dup(fd)) as sock:
                    sock.shutdown(socket.SHUT_RDWR)
                count += 1
            except OSError:
                continue
        return count

    def handle(self, update_res: int) -> bool:
        """Abort if ``update_res`` says a peer died. True when it did."""
        if not int(update_res) & PEER_FAILED:
            return False
        count = self.abort()
        if count:  # zero when this worker's own collective had already failed
            log.warning("a peer died: shut down %d sockets of the collective to fail fast", count)
        return True


_guard: CollectiveAbort | None = None
_guard_lock = threading.Lock()


def install() -> CollectiveAbort:
    """Install the worker-side guard once per process and return it.

    Wraps ``horovod.torch.elastic``'s ``init`` (what elastic resets call) so each new
    context's sockets are known. The context that exists already (the user's first
    ``hvd.init()``) is taken to be every TCP socket open now: call this right after
    ``hvd.init()``, as constructing spotring's ``TorchState`` does.
    """
    global _guard
    with _guard_lock:
        if _guard is None:
            import horovod.torch.elastic as elastic

            guard = CollectiveAbort()
            guard.remember(own_tcp_sockets())
            elastic.init = guard.track_init(elastic.init)
            _guard = guard
        return _guard
