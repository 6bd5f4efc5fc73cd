"""The rendezvous HTTP server: Horovod's store, counted and bounded, with the current
ring's state (its generation, slots, meshes, signed requests taken)."""

from __future__ import annotations

import collections
import logging
import socket
import threading
import time
from typing import Any

from horovod.runner.http.http_server import (
    RendezvousHTTPServer,
)

from spotring.driver.rendezvous.limits import (
    CONNECTION_THREADS,
    MAX_CONNECTIONS,
    MESH_ANSWER_THREADS,
    MESH_WAITERS_MARGIN,
    NONCES_MARGIN,
    NONCES_PER_SLOT,
    REQUEST_DEADLINE_SECONDS,
    STUCK_SECONDS,
    charge,
    store_budget,
)
from spotring.driver.rendezvous.mesh import MeshScope
from spotring.driver.rendezvous.refusal import printable
from spotring.driver.rendezvous.threads import ThreadPool
from spotring.worker_image import wire
from spotring.worker_image.wire import (
    ABANDONED_KEY,
    MESH_ABANDONED,
    MESH_ANSWER,
    MESH_MAGIC,
    RING_KEY,
    RING_SCOPE,
)

log = logging.getLogger(__name__)


PARKED = b"parked"
"""What :meth:`StoreServer.mesh_answer_or_park` returns for a request it
keeps waiting."""


class WarningBudget:
    """At most ``per_minute`` warning lines a minute; the rest are counted, and the
    count is reported with the next line that is logged."""

    def __init__(self, per_minute: int = 30) -> None:
        self._per_minute = per_minute
        self._lock = threading.Lock()
        self._window = 0.0
        self._logged = 0
        self._dropped = 0

    def warn(self, message: str) -> None:
        now = time.monotonic()
        with self._lock:
            if now - self._window >= 60:
                self._window, self._logged = now, 0
            if self._logged >= self._per_minute:
                self._dropped += 1
                return
            self._logged += 1
            dropped, self._dropped = self._dropped, 0
        suffix = f" ({dropped} more refused requests not logged)" if dropped else ""
        log.warning("rendezvous: %s%s", message, suffix)


class StoreServer(RendezvousHTTPServer):
    """Horovod's rendezvous HTTP server: one warning line instead of a traceback for a
    request that failed, and no thread of a hostile client holds up the driver's exit."""

    daemon_threads = True
    block_on_close = False
    request_queue_size = MAX_CONNECTIONS
    """The listen backlog (socketserver's default is 5: a ring's ranks arriving at
    once were reset and had to retry)."""

    def __init__(self, addr: Any, handler: Any, verbose: int, job_key: bytes) -> None:
        super().__init__(addr, handler, verbose)
        if not job_key:
            raise ValueError("the rendezvous server needs the job key to check writes")
        self.job_key = job_key
        """What every write must be signed with (see :mod:`spotring.worker_image.wire`)."""
        self._nonces: set[str] = set()
        """The nonces of the signed requests taken in the current ring; under
        ``_nonce_lock`` (its own: the store's lock is the busiest there is)."""
        self._nonce_lock = threading.Lock()
        self._nonce_limit = NONCES_MARGIN
        self.planned_slots: frozenset[tuple[str, int]] = frozenset()
        """Every slot of every ring planned: they may ask for their rank (Horovod
        answers one that is no longer planned with ``-1``: it leaves)."""
        self.current_slots: frozenset[tuple[str, int]] = frozenset()
        """The current ring's slots: only they may register."""
        self.abandoned = False
        """The current ring lost a member while forming (see ``RingTracker.abandon``)."""
        self.generation = 0
        """The current ring's generation (``RingTracker.generation``); under ``cache_lock``."""
        self._ranked: dict[tuple[str, int], int] = {}
        """Each slot of the current ring that was told its rank: the generation of the
        ring it was told it for; under ``cache_lock``."""
        # Each rank finishing a scope counts once, however often it says so.
        self.finished_list: collections.defaultdict[str, set[str]] = collections.defaultdict(set)
        self.store_bytes = 0
        """What the Gloo keys in :attr:`cache` count (see :func:`charge`); under
        ``cache_lock``."""
        self.store_budget = 0
        self._registering: set[tuple[str, int]] = set()
        self._registering_lock = threading.Lock()
        self._connections = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._workers = ThreadPool(self.process_request_thread, limit=CONNECTION_THREADS)
        self._answerers = ThreadPool(self._answer_parked, limit=MESH_ANSWER_THREADS)
        self._warnings = WarningBudget()
        self.meshes: dict[str, MeshScope] = {}
        """Each scope's one-request full-mesh exchange; under ``cache_lock``."""
        self.mesh_waiters_limit = MESH_WAITERS_MARGIN
        self._detached: set[socket.socket] = set()
        """Connections parked by their request: the thread that read it leaves them
        open, and whoever answers them closes them."""
        self.requests: collections.Counter[str] = collections.Counter()
        """Requests parsed, by method and kind (``"PUT gloo"``: a Gloo scope of the
        ring; the benchmarks check them against the model of a ring's formation)."""
        self._requests_lock = threading.Lock()
        self._closed = threading.Event()
        threading.Thread(target=self._watch, name="spotring-rendezvous-watch", daemon=True).start()

    def warn(self, message: str) -> None:
        self._warnings.warn(message)

    def count_request(self, method: str) -> None:
        with self._requests_lock:
            self.requests[method] += 1

    def take_requests(self) -> collections.Counter[str]:
        """The requests counted since the last call (and start counting again)."""
        with self._requests_lock:
            counted, self.requests = self.requests, collections.Counter()
        return counted

    def process_request(self, request: Any, client_address: Any) -> None:
        """socketserver's (a thread per connection, here an idle one reused), up to
        :data:`MAX_CONNECTIONS`."""
        if not self._connections.acquire(blocking=False):
            self.warn(f"closed a connection from {client_address[0]}: too many open")
            self.shutdown_request(request)
            return
        try:
            self._workers.submit(request, client_address)
        except BaseException:  # no thread took it: it will not release
            self._connections.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        """socketserver's (serve, then close); a connection its request parked is left
        open, to whoever answers it."""
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        with self.cache_lock:
            parked = request in self._detached
            self._detached.discard(request)
        if not parked:
            self.shutdown_request(request)
            self._connections.release()

    # -- the rings

    def init(self, host_alloc_plan: Any) -> None:
        raise NotImplementedError("rings begin with begin_ring (RingTracker.init)")

    def begin_ring(
        self, host_alloc_plan: Any, generation: int, slots: frozenset[tuple[str, int]]
    ) -> None:
        """Ring ``generation`` of ``host_alloc_plan`` (its ``slots``) is the current one:
        in one step, the store is cleared, the new ring's scopes sized (as Horovod's
        ``init``), its generation published, the old ring's waiters sent away (404)
        and its nonces forgotten. A request signed for the old ring is refused from
        here on, and nothing of the old ring reaches the new one's store."""
        scope_size: dict[str, int] = {}  # as Horovod's _extract_scope_size
        for slot_info in host_alloc_plan:
            scope_size["global"] = slot_info.size
            scope_size["local_" + slot_info.hostname] = slot_info.local_size
            scope_size["cross_" + str(slot_info.local_rank)] = slot_info.cross_size
        budget = store_budget(scope_size)
        with self.finished_list_lock, self.cache_lock, self._nonce_lock:
            self.cache.clear()
            self.finished_list.clear()
            self.scope_size = scope_size
            self.store_bytes = 0
            self.store_budget = budget
            self.mesh_waiters_limit = 2 * len(host_alloc_plan) + MESH_WAITERS_MARGIN
            self._nonce_limit = NONCES_PER_SLOT * len(host_alloc_plan) + NONCES_MARGIN
            self._nonces = set()
            for mesh in self.meshes.values():
                mesh.dropped = True
                self._release_parked(mesh)
            self.meshes = {}
            self.generation = generation
            self.abandoned = False
            self._ranked = {slot: seen for slot, seen in self._ranked.items() if slot in slots}
            self.planned_slots = self.planned_slots | slots
            self.current_slots = slots
            self.cache[RING_SCOPE] = {RING_KEY: str(generation).encode("ascii")}

    def admit(self, signature: wire.Signature) -> tuple[int, str] | None:
        """Take a signed request (its MAC checked) if it is for the current ring and
        its nonce was not taken in it; else the refusal (status, reason). What it
        then changes checks the ring again, under the store's lock."""
        with self._nonce_lock:
            if signature.ring != self.generation:
                return 409, f"signed for ring {signature.ring}, not the current {self.generation}"
            if signature.nonce in self._nonces:
                return 409, "a replayed request"
            if len(self._nonces) >= self._nonce_limit:
                return 429, f"more than {self._nonce_limit} signed requests in one ring"
            self._nonces.add(signature.nonce)
        return None

    # -- the one-request full mesh

    def mesh_put(
        self,
        scope: str,
        size: int,
        rank: int,
        host: bytes,
        addresses: bytes | memoryview,
        ring: int,
    ) -> tuple[MeshScope | None, tuple[int, str]]:
        """Store rank ``rank`` 's part of ``scope`` 's mesh for ring ``ring`` (the
        first is final); the scope, or None and the refusal (status, reason)."""
        entry = len(addresses) // (size - 1)
        with self.cache_lock:
            if ring != self.generation:
                return None, (409, f"signed for ring {ring}, not the current {self.generation}")
            mesh = self.meshes.get(scope)
            if mesh is None:
                mesh = MeshScope(size, entry)
                if self.store_bytes + mesh.charge > self.store_budget:
                    return None, (413, "the store is full")
                self.meshes[scope] = mesh
                self.store_bytes += mesh.charge
            elif mesh.size != size or mesh.entry != entry:
                return None, (
                    400,
                    f"a mesh of {size} x {entry} B in one of {mesh.size} x {mesh.entry} B",
                )
            if not mesh.put(rank, host, addresses):
                return None, (409, f"rank {rank} of {scope} already sent other addresses")
            if mesh.local_ranks is not None and mesh.parked:
                self._release_parked(mesh)
        return mesh, (200, "")

    def mesh_answer_or_park(
        self, mesh: MeshScope, rank: int, wait: float, connection: socket.socket
    ) -> bytes | memoryview | None:
        """Rank ``rank`` 's answer if ``mesh`` is complete (or the ring abandoned: its
        answer; or replaced, or ``wait`` is 0: None, a 404); otherwise
        :data:`PARKED`: ``connection`` waits in the mesh, without a thread, and is
        answered later (see :meth:`_answer_parked`). At most
        ``mesh_waiters_limit`` wait at once; more are answered as abandoned. A rank
        waits once: its new request replaces one still waiting (answered 404)."""
        superseded = None
        with self.cache_lock:
            if mesh.dropped:
                return None
            if mesh.local_ranks is not None:
                mesh.answered.add(rank)
                ready = True
            elif self.abandoned:
                return MESH_ANSWER.pack(MESH_MAGIC, MESH_ABANDONED, 0, 0)
            elif wait <= 0:
                return None
            elif rank not in mesh.parked and self.mesh_waiters >= self.mesh_waiters_limit:
                return self._too_many_waiters()
            else:
                ready = False
                superseded = mesh.parked.pop(rank, None)
                mesh.parked[rank] = (connection, time.monotonic() + wait)
                self._detached.add(connection)
        if superseded is not None:
            self._answerers.submit(mesh, superseded[0], rank, True)
        if ready:
            return mesh.answer(rank)
        return PARKED

    @property
    def mesh_waiters(self) -> int:
        """Ranks parked in a mesh now (see :meth:`mesh_answer_or_park`)."""
        return sum(len(mesh.parked) for mesh in list(self.meshes.values()))

    def _too_many_waiters(self) -> bytes:
        self.warn(
            f"more than {self.mesh_waiters_limit} mesh requests waiting: answered as abandoned"
        )
        return MESH_ANSWER.pack(MESH_MAGIC, MESH_ABANDONED, 0, 0)

    def _release_parked(self, mesh: MeshScope, expired_only: bool = False) -> None:
        """Hand ``mesh`` 's parked ranks (those past their deadline only, with
        ``expired_only``) to the server's threads to be answered. Under ``cache_lock``."""
        now = time.monotonic()
        for rank, (connection, deadline) in list(mesh.parked.items()):
            if expired_only and deadline > now:
                continue
            del mesh.parked[rank]
            self._answerers.submit(mesh, connection, rank)

    def _answer_parked(
        self, mesh: MeshScope, connection: socket.socket, rank: int, superseded: bool = False
    ) -> None:
        """Answer a parked rank as :meth:`mesh_answer_or_park` would now (a 404 when
        the mesh is still incomplete: its wait ran out; or when a newer request of
        the same rank took its place), and close its connection."""
        try:
            with self.cache_lock:
                if mesh.dropped or superseded:
                    value: bytes | memoryview | None = None
                elif mesh.local_ranks is not None:
                    mesh.answered.add(rank)
                    value = b""  # built below, outside the lock
                elif self.abandoned:
                    value = MESH_ANSWER.pack(MESH_MAGIC, MESH_ABANDONED, 0, 0)
                else:
                    value = None
            if value == b"":
                value = mesh.answer(rank)
            if value is None:
                head = b"HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n"
                value = b""
            else:
                head = b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n" % len(value)
            connection.settimeout(REQUEST_DEADLINE_SECONDS)  # the whole answer's
            if len(value) <= 65536:
                connection.sendall(head + bytes(value))
            else:
                connection.sendall(head)
                connection.sendall(value)
        except OSError:
            log.debug("rendezvous: a waiting rank went away before its answer", exc_info=True)
        finally:
            self.shutdown_request(connection)
            self._connections.release()

    def _watch(self) -> None:
        """Every :data:`STUCK_SECONDS`: start a thread when slow requests (clients, or
        a registration whose addresses the driver probes) hold every one, and answer
        404 to parked ranks whose wait ran out (they ask again)."""
        while not self._closed.wait(STUCK_SECONDS):
            self._workers.grow_if_stuck()
            self._answerers.grow_if_stuck()
            with self.cache_lock:
                for mesh in self.meshes.values():
                    if mesh.parked:
                        self._release_parked(mesh, expired_only=True)

    def server_close(self) -> None:
        self._closed.set()
        super().server_close()

    def abandon(self) -> None:
        """Abandon the current ring (see ``RingTracker.abandon``)."""
        with self.cache_lock:
            self.abandoned = True
            value = str(self.generation).encode("ascii")
            self.cache.setdefault(RING_SCOPE, {})[ABANDONED_KEY] = value
        self.wake_meshes()

    def rank_given(self, slot: tuple[str, int]) -> None:
        """``slot`` was told its rank in the current ring."""
        with self.cache_lock:
            self._ranked[slot] = self.generation

    def rank_asked(self, slot: tuple[str, int]) -> bool:
        """``slot`` asks for its rank (and is no longer in a ring until told it).
        Whether it was already told it in the current ring: its worker left that ring
        (its ``init`` failed, or the ring is being reset)."""
        with self.cache_lock:
            return self.generation > 0 and self._ranked.pop(slot, None) == self.generation

    def abandoned_for(self, slot: tuple[str, int]) -> int | None:
        """The current ring's generation if it was abandoned and ``slot`` is forming it
        (told its rank in it, not asking again); else None. A member that already left
        for the next ring must not abort that one's formation for this one."""
        with self.cache_lock:
            if self.abandoned and self._ranked.get(slot) == self.generation:
                return self.generation
            return None

    def wake_meshes(self) -> None:
        """Answer every parked rank now (the ring was abandoned)."""
        with self.cache_lock:
            for mesh in self.meshes.values():
                self._release_parked(mesh)

    def _mesh_finished(self, scope: str, key: str) -> None:
        """Rank ``key`` finished ``scope``; it counts once it was answered. Once every
        rank of its mesh has, the mesh is dropped, anything still waiting in it
        answered first. Under ``cache_lock``."""
        mesh = self.meshes.get(scope)
        if mesh is None or not key.isdigit() or int(key) not in mesh.answered:
            return
        mesh.finished.add(int(key))
        if len(mesh.finished) == mesh.size:
            mesh.dropped = True
            self._release_parked(mesh)
            del self.meshes[scope]
            self.store_bytes -= mesh.charge

    def store_room(self) -> int:
        """The bytes the store can still take."""
        with self.cache_lock:
            return self.store_budget - self.store_bytes

    def store(self, scope: str, key: str, value: bytes, ring: int) -> tuple[int, str] | None:
        """Put ``value`` under ``/scope/key`` for ring ``ring`` if that ring is the
        current one, the key holds nothing else (the first value is final) and the
        store has room for it; else the refusal (status, reason)."""
        with self.cache_lock:
            if ring != self.generation:
                return 409, f"signed for ring {ring}, not the current {self.generation}"
            entries = self.cache.get(scope, {})
            stored = entries.get(key)
            if stored is not None:
                return None if stored == value else (409, "the key holds another value already")
            grown = self.store_bytes + charge(value)
            if grown > self.store_budget:
                return 413, "the store is full"
            self.cache.setdefault(scope, entries)[key] = value
            self.store_bytes = grown
        return None

    def finish(self, scope: str, key: str, ring: int) -> bool:
        """Rank ``key`` is done with ``scope`` (Gloo's ``Finalize``) in ring ``ring``;
        False when that ring is no longer the current one. Horovod's ``DELETE``: a
        scope of the plan is cleared once every rank has finished it (and every
        scope's count starts again); a process set's loses that rank's address. A
        scope's mesh is dropped once each of its ranks has finished it."""
        with self.finished_list_lock, self.cache_lock:
            if ring != self.generation:
                return False
            self._mesh_finished(scope, key)
            if scope in self.scope_size:
                finished = self.finished_list[scope]
                finished.add(key)
                if len(finished) >= self.scope_size[scope]:
                    self.finished_list.clear()
                    entries = self.cache.get(scope, {})
                    self.store_bytes -= sum(map(charge, entries.values()))
                    entries.clear()
                return True
            entries = self.cache.get(scope)
            if entries is not None:
                self.store_bytes -= charge(entries.pop(key, None))
                if not entries:
                    del self.cache[scope]
        return True

    # -- registrations

    def begin_registration(self, slot: tuple[str, int]) -> bool:
        """Whether ``slot`` may register now: one registration per slot at a time."""
        with self._registering_lock:
            if slot in self._registering:
                return False
            self._registering.add(slot)
            return True

    def end_registration(self, slot: tuple[str, int]) -> None:
        with self._registering_lock:
            self._registering.discard(slot)

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        error = sys.exc_info()[1]
        if isinstance(error, (BrokenPipeError, ConnectionResetError)):
            log.debug("rendezvous: %s went away before its answer", client_address)
            return
        log.debug("rendezvous: request from %s failed", client_address, exc_info=True)
        self.warn(
            f"a request from {client_address[0]} failed: "
            f"{type(error).__name__}: {printable(str(error))}"
        )
