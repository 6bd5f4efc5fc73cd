"""The driver's rendezvous server: Horovod's, hardened against hostile requests.

Horovod's elastic driver runs an HTTP key-value store (``RendezvousServer``) that every
worker reaches: Gloo's rendezvous keeps each ring's addresses there, a worker asks it
for its rank (``GET /rank_and_size/<host>:<slot>``) and registers its notification
service (``PUT /worker_addresses/<host>:<slot>``). As shipped, that server unpickles
the registration's body in the driver, keeps it (with the worker's secret key) where
any ``GET`` hands it out, stores any ``PUT`` to any scope, and reads whatever length a
request announces. spotring runs the same server (same store, same answers to Horovod's
clients) with a request handler that:

* decodes a registration with :func:`decode_worker_addresses`: no class or function is
  ever looked up, and only the shape Horovod's worker sends is accepted; it is handed
  to the driver and never stored;
* takes a write (every ``PUT`` and ``DELETE``, and the rank request, which tells the
  driver a worker is ready) only when it is signed by a worker of the job for the
  current ring (:mod:`spotring.worker_image.store_auth`: HMAC-SHA256 under the job key
  over the method, path, ring, a nonce and the body): an unsigned one is refused before
  its body is read, a forged, replayed or stale one before anything is stored or
  parked, and the first signed value of a key (a rank's mesh row) is final;
* answers ``rank_and_size`` only for slots of a ring this driver planned (Horovod
  answers a slot that left with ``-1``, and its worker leaves), and takes
  registrations only for slots of the current ring, one at a time per slot, each
  listing at most :data:`MAX_ADDRESSES` addresses;
* stores ``PUT`` s only under the keys Gloo's rendezvous writes for the current ring
  (``rank_<r>`` and ``<r>`` for each rank ``r`` below a scope's size), each up to the
  size Gloo's value has there, and the whole store up to a budget made from the plan
  (see :func:`store_budget`); keeps the ``spotring`` scope (the ring generation, plain
  ASCII digits) read-only from outside; and refuses a body over its key's bound before
  reading it;
* keeps one waiting mesh request per scope and rank (a newer one replaces it), counts
  a rank's ``DELETE`` only once the rank was answered, and answers a scope's waiters
  before the scope goes;
* gives a client :data:`REQUEST_DEADLINE_SECONDS` to send its whole request, and
  answers anything malformed with a 4xx and one warning line naming the client, never
  a traceback and never a change to the store.

A registration names an address and a key, and the driver then talks to that address:
:func:`use_safe_worker_clients` makes the driver's client for it unpickle nothing but
Horovod's three answer classes, whatever key the service signs with, gives a
connection and a whole answer :data:`ANSWER_TIMEOUT_SECONDS` each, and probes at most
:data:`MAX_CONCURRENT_PROBES` addresses at once.

What it cannot do: keep a client that reads the network between a worker and the
driver from reading what goes over it (the Gloo addresses, a registration's key), or
hold off one that opens connections until :data:`MAX_CONNECTIONS` (each cut off after
:data:`REQUEST_DEADLINE_SECONDS`). Reads change nothing and are not signed.
"""

from __future__ import annotations

import base64
import binascii
import collections
import io
import ipaddress
import json
import logging
import pickle
import pickletools
import queue
import re
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from horovod.runner.common.util import secret
from horovod.runner.common.util.network import Wire
from horovod.runner.elastic.worker import WorkerNotificationClient
from horovod.runner.http.http_server import (
    RendezvousHandler,
    RendezvousHTTPServer,
    RendezvousServer,
)

from spotring.driver import horovod_internals
from spotring.worker_image import store_auth
from spotring.worker_image.durable import FLUSH_KEY
from spotring.worker_image.peer_abort import ABANDONED_KEY, ABANDONED_SLOT_PREFIX
from spotring.worker_image.store_auth import RING_KEY, RING_SCOPE

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 1 << 20
"""The largest ``PUT`` body taken. Gloo's largest value is one rank's addresses towards
every other rank, 136 bytes each (about 136 KiB for a 1,000-worker ring)."""

HOSTNAME_MAX_BYTES = 256
"""The largest ``rank_<r>`` value: Gloo's ``connectFullMesh`` stores the rank's host name
there, read with ``gethostname`` into a buffer of this size."""

PAIR_ADDRESS_MAX_BYTES = 256
"""What a ``<r>`` value may hold per other rank of its scope: Gloo stores one pair
address (136 bytes for its TCP transport: a ``sockaddr_storage`` and a sequence
number) for each; the rest is headroom."""

ENTRY_OVERHEAD_BYTES = 256
"""What one stored key is charged beyond its value (the dict entry, key and bytes
object), so that empty values are not free."""

STORE_HEADROOM = 2
"""The store may hold this many times the planned ring's full set of keys: a fast rank
starts the next context while a slow one still reads the last, and process sets
(``_process_set_hash_<h>`` scopes) add contexts of their own."""

MAX_STORE_BYTES = 512 << 20
"""The store's size whatever the plan: Gloo keeps about 136 N^2 bytes for one context
of N ranks (136 MiB at 1,024 ranks)."""

MAX_WORKER_ADDRESSES_BYTES = 128 << 10
"""The largest registration taken (Horovod's worker sends about 40 bytes per address)."""

REQUEST_DEADLINE_SECONDS = 10.0
"""How long a client has to send its whole request (line, headers and body)."""

MAX_CONNECTIONS = 4096
"""Most connections served at once (a thread each); more are closed unanswered. A ring
of N workers needs about 2 N: each worker's rank request waits for the whole ring, and
each polls Gloo's keys one request at a time."""

WORKER_IDLE_SECONDS = 30.0
"""How long a server thread waits for another connection before it ends."""

MAX_ADDRESSES = 16
"""Most addresses a registration may list. Horovod's worker sends each IPv4 address of
each interface (of the one it uses towards the driver, under spotring: usually one),
and the driver probes each."""

MAX_CONCURRENT_PROBES = 64
"""Most address probes the driver runs at once, over every registration (each is a
thread, of up to 3 attempts of up to 2 x :data:`ANSWER_TIMEOUT_SECONDS`)."""

PROBE_WAIT_SECONDS = 60.0
"""How long an address waits for a free probe; one that gets none is not probed."""

MAX_ANSWER_BYTES = 64 << 10
ANSWER_TIMEOUT_SECONDS = 20.0
"""The largest answer the driver takes from a worker's notification service (Horovod's
are about 150 bytes), and the most time it gives the connection and the whole answer,
each (a service that trickles its answer gets no more than one that says nothing)."""

MESH_WAIT_SECONDS = 10.0
"""The longest a ``spotring-mesh-<r>`` request is held waiting for the rest of its
scope; then it is answered 404 and asked again (until Gloo's own timeout)."""

MESH_WAITERS_MARGIN = 64
"""Mesh requests that may wait at once beyond twice the planned ring's ranks (each rank
waits in one scope at a time); more are refused with 429, which fails that member's
``init`` (a reset), never holds a thread."""

CONNECTION_THREADS = 8
"""Threads that serve connections, normally: a ring's ranks arriving at once queue for
them rather than each taking a thread (a thousand threads contending for the GIL cost
the driver more CPU than the requests themselves). When none of them has taken a
connection for :data:`STUCK_SECONDS` (slow clients hold them all), one more is started,
up to :data:`MAX_CONNECTIONS`."""

STUCK_SECONDS = 0.05

MESH_ANSWER_THREADS = 16
"""Threads that answer parked ranks (the answers of a mesh of N ranks go out 16 at a
time, not N threads at once); each answer is given :data:`REQUEST_DEADLINE_SECONDS`."""

NONCES_PER_SLOT = 64
NONCES_MARGIN = 4096
"""Signed requests taken per ring: :data:`NONCES_PER_SLOT` per planned slot plus
:data:`NONCES_MARGIN` (a worker makes a few per context; its nonces are remembered for
the ring, to refuse replays). More are refused with 429."""

PARKED = b"parked"
"""What :meth:`_RendezvousHTTPServer.mesh_answer_or_park` returns for a request it
keeps waiting."""

MESH_MAGIC = b"SRM1"
MESH_OK, MESH_ABANDONED = 0, 1
_MESH_HEADER = struct.Struct(">III")  # size, wait (ms), host name length
_MESH_ANSWER = struct.Struct(">4sIII")  # magic, status, local rank, entry size

GET_RANK_AND_SIZE = "rank_and_size"  # horovod.runner.elastic.rendezvous
PUT_WORKER_ADDRESSES = "worker_addresses"
READ_ONLY_SCOPES = frozenset({RING_SCOPE, GET_RANK_AND_SIZE, PUT_WORKER_ADDRESSES})

_PROCESS_SET_SUFFIX = re.compile(r"_process_set_hash_[0-9a-f]{1,64}\Z")
_GLOO_KEY = re.compile(r"(rank_)?(0|[1-9][0-9]{0,8})\Z")  # as Gloo writes a rank
_SLOT = re.compile(r"[0-9]{1,6}\Z")
_MESH_KEY = re.compile(r"spotring-mesh-(0|[1-9][0-9]{0,8})\Z")

# Every opcode the pickle of plain tuples, lists, dicts, str, bytes and ints may use.
# Nothing that looks up a global (GLOBAL, STACK_GLOBAL, EXT*, INST), calls (REDUCE,
# NEWOBJ*, OBJ, BUILD) or reaches outside the data (PERSID, NEXT_BUFFER); and no memo
# index chosen by the sender (PUT, LONG_BINPUT): the unpickler would size its memo to it.
_PLAIN_DATA_OPCODES = frozenset(
    {
        *("PROTO", "FRAME", "STOP", "MARK", "POP", "POP_MARK", "DUP", "MEMOIZE"),
        *("BINPUT", "BINGET", "LONG_BINGET"),
        *("EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3"),
        *("EMPTY_LIST", "LIST", "APPEND", "APPENDS", "EMPTY_DICT", "DICT"),
        *("SETITEM", "SETITEMS", "BININT", "BININT1", "BININT2", "LONG1"),
        *("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8"),
        *("SHORT_BINBYTES", "BINBYTES", "BINBYTES8"),
    }
)


# Horovod's answers to the driver's messages, and what their pickles use beyond plain data.
_ANSWER_CLASSES = frozenset(
    ("horovod.runner.common.util.network", name)
    for name in ("PingResponse", "AckResponse", "AckStreamResponse")
)
_ANSWER_OPCODES = _PLAIN_DATA_OPCODES | {"STACK_GLOBAL", "NEWOBJ", "BUILD"}


class HostileInput(ValueError):
    """A request the server refuses; the message says why, for the log."""


class ElasticDriverCalls(Protocol):
    """What the handler calls on Horovod's ``ElasticDriver``."""

    def record_ready(self, host: str, slot: int) -> object: ...

    def get_slot_info(self, host: str, slot: int) -> Any: ...

    def register_worker_server(
        self, host: str, slot: int, addresses: dict[str, list[tuple[str, int]]], secret_key: bytes
    ) -> object: ...


# ------------------------------------------------------------- registrations


class _RestrictedUnpickler(pickle.Unpickler):
    """Looks up only the ``classes`` given (none: plain data only)."""

    def __init__(self, data: bytes, classes: frozenset[tuple[str, str]]) -> None:
        self.stream = io.BytesIO(data)
        super().__init__(self.stream)
        self._classes = classes

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._classes:
            raise HostileInput(f"the pickle names {_printable(module)}.{_printable(name)}")
        return super().find_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        raise HostileInput("the pickle has a persistent id")


def _load_restricted(
    data: bytes, opcodes: frozenset[str], classes: frozenset[tuple[str, str]] = frozenset()
) -> Any:
    """Unpickle ``data`` if it uses only ``opcodes`` and ``classes``, and nothing follows
    it; raises :class:`HostileInput` otherwise. The opcodes are checked before anything
    is loaded."""
    try:
        for opcode, _arg, _pos in pickletools.genops(data):
            if opcode.name not in opcodes:
                raise HostileInput(f"pickle opcode {opcode.name}")
        unpickler = _RestrictedUnpickler(data, classes)
        value = unpickler.load()
    except HostileInput:
        raise
    except Exception as error:  # any malformed pickle
        raise HostileInput(f"not a pickle of the expected kind: {type(error).__name__}") from None
    if unpickler.stream.read(1):
        raise HostileInput("bytes after the pickle")
    return value


def decode_worker_addresses(body: bytes) -> tuple[dict[str, list[tuple[str, int]]], bytes]:
    """``(addresses, secret_key)`` from the body of Horovod's ``PUT worker_addresses``.

    Horovod's worker sends ``base64(cloudpickle((addresses, key)))``: ``addresses`` maps
    an interface name to a list of ``(ip, port)``, ``key`` is its notification
    service's secret. The pickle is checked opcode by opcode before it is loaded (plain
    data only), loaded without any global lookups, and must have exactly that shape.
    Raises :class:`HostileInput` for anything else.
    """
    if len(body) > MAX_WORKER_ADDRESSES_BYTES:
        raise HostileInput(f"registration of {len(body)} bytes")
    try:
        raw = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError) as error:
        raise HostileInput(f"not base64: {error}") from None
    return _worker_addresses(_load_restricted(raw, _PLAIN_DATA_OPCODES))


def _worker_addresses(value: object) -> tuple[dict[str, list[tuple[str, int]]], bytes]:
    if type(value) is not tuple or len(value) != 2:
        raise HostileInput("not a pair (addresses, key)")
    addresses, key = value
    if type(key) is not bytes or len(key) != secret.SECRET_LENGTH:
        raise HostileInput(f"the key is not {secret.SECRET_LENGTH} bytes")
    if type(addresses) is not dict or not addresses:
        raise HostileInput("the addresses are not a dict of interfaces")
    result: dict[str, list[tuple[str, int]]] = {}
    count = 0
    for interface, endpoints in addresses.items():
        if type(interface) is not str or not 0 < len(interface) <= 64:
            raise HostileInput("an interface name is not a short string")
        if not interface.isprintable():
            raise HostileInput("an interface name has control characters")
        if type(endpoints) is not list or not endpoints:
            raise HostileInput("an interface has no address list")
        count += len(endpoints)
        if count > MAX_ADDRESSES:
            raise HostileInput(f"more than {MAX_ADDRESSES} addresses")
        checked = []
        for endpoint in endpoints:
            if type(endpoint) is not tuple or len(endpoint) != 2:
                raise HostileInput("an address is not a pair (ip, port)")
            ip, port = endpoint
            if type(ip) is not str or len(ip) > 64 or type(port) is not int:
                raise HostileInput("an address is not (str, int)")
            try:
                ipaddress.ip_address(ip)
            except ValueError:
                raise HostileInput("an address is not an IP address") from None
            if not 0 < port < 65536:
                raise HostileInput(f"port {port} out of range")
            checked.append((ip, port))
        result[interface] = checked
    return result, key


# ------------------------------------------------------------- the store's bounds


def gloo_value_limit(size: int, key: str) -> int | None:
    """The largest value Gloo writes under ``key`` in a scope of ``size`` ranks; None
    when Gloo never writes that key there.

    Gloo's ``connectFullMesh`` (third_party/gloo/gloo/rendezvous/context.cc) writes
    ``rank_<r>`` (the rank's host name) and ``<r>`` (its address towards every other
    rank), each rank ``r`` once, through Horovod's ``HTTPStore`` under
    ``/<scope>/<key>``.
    """
    match = _GLOO_KEY.match(key)
    if match is None or int(match[2]) >= size:
        return None
    if match[1]:
        return HOSTNAME_MAX_BYTES
    return max(size - 1, 1) * PAIR_ADDRESS_MAX_BYTES


def store_budget(scope_size: dict[str, int]) -> int:
    """The bytes the store may hold for a ring whose Gloo scopes have ``scope_size``
    ranks: every key Gloo writes there at its largest, :data:`STORE_HEADROOM` times,
    and never more than :data:`MAX_STORE_BYTES`."""
    one_ring = 0
    for size in scope_size.values():
        per_rank = 2 * ENTRY_OVERHEAD_BYTES + HOSTNAME_MAX_BYTES
        one_ring += size * (per_rank + max(size - 1, 1) * PAIR_ADDRESS_MAX_BYTES)
    return min(MAX_STORE_BYTES, STORE_HEADROOM * one_ring)


def _values(cache: dict[str, dict[str, bytes]]) -> list[bytes]:
    return [value for entries in cache.values() for value in entries.values()]


def _charge(value: bytes | None) -> int:
    """What a stored value counts against the store's budget (0: none stored)."""
    return 0 if value is None else len(value) + ENTRY_OVERHEAD_BYTES


# ------------------------------------------------------------- one-request full mesh


class MeshScope:
    """One Gloo scope's full-mesh exchange (spotring's Horovod build,
    ``worker_image/horovod-rendezvous.patch``): each rank ``PUT`` s its host name and
    its ``size - 1`` pair addresses once, and is answered, once every rank has, with
    its local rank and the one address of each peer's that is meant for it.

    The addresses are kept in one ``size x (size - 1) x entry`` array, written row by
    row as ranks arrive, so that each answer is two strided copies (O(N) bytes), not
    N slices of N whole values.
    """

    def __init__(self, size: int, entry: int) -> None:
        import numpy

        self.size = size
        self.entry = entry
        self.hosts: list[bytes | None] = [None] * size
        self.addresses = numpy.zeros((size, max(size - 1, 1), entry), dtype=numpy.uint8)
        self.count = 0
        self.charge = size * (max(size - 1, 1) * entry + 2 * ENTRY_OVERHEAD_BYTES)
        self.local_ranks: list[int] | None = None
        self.answered: set[int] = set()
        """Ranks that were answered their peers' addresses."""
        self.finished: set[int] = set()
        """Answered ranks that finished the scope (their ``DELETE``)."""
        self.dropped = False
        """A new ring replaced this one, or every rank finished it: its waiters are
        answered 404."""
        self.parked: dict[int, tuple[socket.socket, float]] = {}
        """Each rank waiting for the rest, ``rank: (connection, deadline)``, one per
        rank (a newer request replaces an older one): no thread waits with them; they
        are answered when the mesh is complete, the ring abandoned or replaced, or
        their deadline passes."""

    def put(self, rank: int, host: bytes, addresses: bytes | memoryview) -> bool:
        """Store rank ``rank`` 's host name and addresses; the first are final: False
        (nothing changed) when it already stored others."""
        import numpy

        row = numpy.frombuffer(addresses, dtype=numpy.uint8)
        shaped = row.reshape(max(self.size - 1, 1), self.entry)
        if self.hosts[rank] is not None:
            return self.hosts[rank] == host and bool(
                numpy.array_equal(self.addresses[rank], shaped)
            )
        self.addresses[rank] = shaped
        self.count += 1
        self.hosts[rank] = host
        if self.count == self.size and self.local_ranks is None:
            seen: collections.Counter[bytes | None] = collections.Counter()
            local_ranks = []
            for name in self.hosts:
                local_ranks.append(seen[name])
                seen[name] += 1
            self.local_ranks = local_ranks
        return True

    def answer(self, rank: int) -> memoryview:
        """What rank ``rank`` is answered once every rank is in: its local rank and,
        for each other rank ``i`` in order, entry ``rank`` (``rank - 1`` past ``i``)
        of ``i`` 's addresses, as Gloo's ``extractAddress`` takes it. Copied once,
        straight from the array into the answer."""
        import numpy

        assert self.local_ranks is not None
        peers = self.size - 1
        out = numpy.empty(_MESH_ANSWER.size + peers * self.entry, dtype=numpy.uint8)
        view = out.data.cast("B")
        _MESH_ANSWER.pack_into(view, 0, MESH_MAGIC, MESH_OK, self.local_ranks[rank], self.entry)
        body = out[_MESH_ANSWER.size :].reshape(peers, self.entry)
        if rank:
            body[:rank] = self.addresses[:rank, rank - 1]
        if rank < peers:
            body[rank:] = self.addresses[rank + 1 :, rank]
        return view


def mesh_request(body: bytes, planned: int, exact: bool) -> tuple[int, float, bytes, memoryview]:
    """``(size, wait seconds, host name, addresses)`` from a ``spotring-mesh-<r>``
    body: its scope has ``planned`` ranks (``exact``), or at most that many (a process
    set's). Raises :class:`HostileInput` for anything else."""
    if len(body) < _MESH_HEADER.size:
        raise HostileInput("a mesh request without its header")
    size, wait_ms, host_length = _MESH_HEADER.unpack_from(body)
    if not 2 <= size <= planned or (exact and size != planned):
        raise HostileInput(f"a mesh of {size} ranks in a scope of {planned}")
    if host_length > HOSTNAME_MAX_BYTES:
        raise HostileInput(f"a host name of {host_length} bytes")
    host = body[_MESH_HEADER.size : _MESH_HEADER.size + host_length]
    addresses = memoryview(body)[_MESH_HEADER.size + host_length :]  # not copied
    if len(host) != host_length:
        raise HostileInput("the body ended early")
    entry, rest = divmod(len(addresses), size - 1)
    if rest or not 0 < entry <= PAIR_ADDRESS_MAX_BYTES:
        raise HostileInput(f"{len(addresses)} bytes of addresses for {size - 1} peers")
    return size, min(wait_ms / 1000, MESH_WAIT_SECONDS), host, addresses


def mesh_body_limit(size: int) -> int:
    """The largest ``spotring-mesh-<r>`` body for a scope of ``size`` ranks."""
    return _MESH_HEADER.size + HOSTNAME_MAX_BYTES + max(size - 1, 1) * PAIR_ADDRESS_MAX_BYTES


# ------------------------------------------------------------- the driver's clients


class _AnswerWire(Wire):
    """Horovod's wire format, taking only Horovod's answers, each within
    :data:`ANSWER_TIMEOUT_SECONDS`.

    The driver talks to whatever address and key a registration named, and anyone who
    can reach the rendezvous server can register a planned slot: Horovod's own client
    would unpickle whatever that service answers, under the key it chose itself, and
    wait for it as long as each byte comes within its socket's timeout.
    """

    def read(self, rfile: Any) -> Any:
        deadline = time.monotonic() + ANSWER_TIMEOUT_SECONDS
        digest = _read_by(rfile, secret.DIGEST_LENGTH, deadline)
        header = _read_by(rfile, 4, deadline)
        if len(digest) != secret.DIGEST_LENGTH or len(header) != 4:
            raise EOFError("the answer ended early")
        (length,) = struct.unpack("i", header)
        if not 0 <= length <= MAX_ANSWER_BYTES:
            raise HostileInput(f"an answer of {length} bytes")
        message = _read_by(rfile, length, deadline)
        key = horovod_internals.wire_key(self)
        if len(message) != length or not secret.check_digest(key, message, digest):
            raise HostileInput("Security error: digest did not match the message.")
        return _load_restricted(message, _ANSWER_OPCODES, _ANSWER_CLASSES)


def _read_by(rfile: Any, size: int, deadline: float) -> bytes:
    """Up to ``size`` bytes of ``rfile`` (fewer if it ends), all before ``deadline``;
    raises ``TimeoutError`` after it."""
    sock = getattr(getattr(rfile, "raw", None), "_sock", None)
    data = bytearray()
    while len(data) < size:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the answer did not arrive in time")
        if isinstance(sock, socket.socket):
            sock.settimeout(remaining)
        chunk = rfile.read1(size - len(data))
        if not chunk:
            break
        data += chunk
    return bytes(data)


@horovod_internals.route_client_hooks
class SafeWorkerNotificationClient(WorkerNotificationClient):
    """Horovod's client for a worker's notification service, unpickling nothing but
    Horovod's answers (see :class:`_AnswerWire`), with every exchange bounded in time
    and its address probes in number (``probes``: shared by every client of a driver).

    Horovod's wire, probe and exchange steps are this class's :meth:`use_wire`,
    :meth:`probe` and :meth:`send_one` (see
    :func:`~spotring.driver.horovod_internals.route_client_hooks`).
    """

    answer_wire: Wire

    def __init__(
        self,
        addresses: dict[str, list[tuple[str, int]]],
        key: bytes,
        verbose: int,
        probes: threading.BoundedSemaphore | None = None,
    ) -> None:
        self._probes = probes or threading.BoundedSemaphore(MAX_CONCURRENT_PROBES)
        super().__init__(addresses, key, verbose)  # probes the addresses

    def use_wire(self, wire: Wire) -> None:
        """Take Horovod's wire (``BasicClient.__init__`` sets it): only its key."""
        self.answer_wire = _AnswerWire(horovod_internals.wire_key(wire))

    def probe(self, addresses: dict[str, list[tuple[str, int]]]) -> dict[str, list[Any]]:
        """Horovod's: the addresses that answer a ping, each probed in a thread of
        its own; but no more threads at once than ``probes`` allows."""
        found: queue.Queue[tuple[str, Any]] = queue.Queue()
        threads = []
        for interface, endpoints in addresses.items():
            for endpoint in endpoints:
                if not self._probes.acquire(timeout=PROBE_WAIT_SECONDS):
                    log.warning("no free probe for %s within %.0f s", endpoint, PROBE_WAIT_SECONDS)
                    continue
                thread = threading.Thread(
                    target=self._probe_and_release,
                    args=(interface, endpoint, found),
                    name="spotring-probe",
                    daemon=True,
                )
                thread.start()
                threads.append(thread)
        for thread in threads:
            thread.join()
        result: dict[str, list[Any]] = {}
        while not found.empty():
            interface, endpoint = found.get()
            result.setdefault(interface, []).append(endpoint)
        return result

    def _probe_and_release(self, interface: str, endpoint: Any, found: queue.Queue[Any]) -> None:
        try:
            # Horovod's: catches everything
            horovod_internals.probe_one(self, interface, endpoint, found)
        finally:
            self._probes.release()

    def send_one(self, addr: tuple[str, int], req: Any, stream: Any = None) -> Any:
        """Horovod's exchange (its attempts, the last failure raised), with the
        connection bounded in time too: Horovod's waits on a dead address as long as
        the kernel retries its connect (minutes)."""
        if stream is not None:
            raise NotImplementedError("the driver takes no stream from a worker")
        attempts = horovod_internals.send_attempts(self)
        for attempt in range(attempts):
            try:
                with (
                    socket.create_connection(addr, timeout=ANSWER_TIMEOUT_SECONDS) as sock,
                    sock.makefile("rb") as rfile,
                    sock.makefile("wb") as wfile,
                ):
                    self.answer_wire.write(req, wfile)
                    return self.answer_wire.read(rfile)
            except Exception:
                if attempt == attempts - 1:
                    raise
        return None  # no attempts


def use_safe_worker_clients(driver: Any, max_probes: int = MAX_CONCURRENT_PROBES) -> None:
    """Make Horovod's elastic ``driver`` reach registered workers through
    :class:`SafeWorkerNotificationClient` (Horovod's ``register_worker_server``, with
    that client), probing at most ``max_probes`` addresses at once. Call it before the
    rendezvous server starts."""
    probes = threading.BoundedSemaphore(max_probes)

    def register_worker_server(
        host: str, slot: int, addresses: dict[str, list[tuple[str, int]]], secret_key: bytes
    ) -> None:
        verbose = horovod_internals.driver_verbose(driver)
        client = SafeWorkerNotificationClient(addresses, secret_key, verbose, probes)
        horovod_internals.set_worker_client(driver, host, slot, client)

    horovod_internals.replace_register_worker_server(driver, register_worker_server)


# ------------------------------------------------------------- the request handler


def _printable(text: str, limit: int = 120) -> str:
    """``text`` for one log line: no control characters, at most ``limit`` characters."""
    clean = "".join(c if c.isprintable() else "?" for c in text[:limit])
    return clean + ("..." if len(text) > limit else "")


class _DeadlineReader(io.RawIOBase):
    """A socket's bytes, until a deadline: a slow sender cannot hold a thread longer."""

    def __init__(self, sock: socket.socket, deadline: float, idle: float) -> None:
        super().__init__()
        self._sock = sock
        self._deadline = deadline
        self._idle = idle

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        remaining = self._deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the request was not complete in time")
        self._sock.settimeout(min(remaining, self._idle))
        try:
            return self._sock.recv_into(buffer)
        finally:
            self._sock.settimeout(self._idle)  # for the answer


class HardenedRendezvousHandler(RendezvousHandler):
    """Horovod's rendezvous request handler, refusing what its clients never send.

    Without a ``driver`` (see :func:`rendezvous_handler`) it is a plain store: rank
    requests and registrations are refused.
    """

    driver: ElasticDriverCalls | None = None
    deadline_seconds = REQUEST_DEADLINE_SECONDS
    disable_nagle_algorithm = True
    """An answer's body goes out as a second write after its headers: with Nagle's
    algorithm it waited for the client's delayed ACK (40 ms on Linux) each time."""
    server: _RendezvousHTTPServer
    rfile: io.BufferedIOBase

    def setup(self) -> None:
        super().setup()
        self.rfile.close()
        deadline = time.monotonic() + self.deadline_seconds
        reader = _DeadlineReader(self.connection, deadline, float(self.timeout or 3))
        self.rfile = io.BufferedReader(reader)

    def parse_request(self) -> bool:
        """http.server's, counting each request parsed (by method)."""
        parsed = super().parse_request()
        if parsed:
            scope = self.path.split("/")[1] if self.path.count("/") >= 2 else ""
            if self._is_gloo_scope(scope):
                kind = "gloo"
            elif scope in READ_ONLY_SCOPES:
                kind = scope
            else:
                kind = "other"
            self.server.count_request(f"{self.command} {kind}")
        return bool(parsed)

    # -- answers

    def _refuse(self, code: int, reason: str) -> None:
        self.server.warn(
            f"refused {_printable(self.command or '?')} {_printable(self.path or '?')} "
            f"from {self.client_address[0]}: {reason}"
        )
        self.close_connection = True
        self.send_status_code(code)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's refusals, as 4xx: an unknown method (its 501) is a 405."""
        if code >= 500:
            code = 405 if code == 501 else 400
        self.close_connection = True
        super().send_error(code, message, explain)

    def log_error(self, format: str, *args: Any) -> None:
        """http.server's own refusals (bad request line, unknown method, time-outs)."""
        self.server.warn(f"bad request from {self.client_address[0]}: {_printable(format % args)}")

    def _scope_and_key(self) -> tuple[str, str] | None:
        parts = self.path.split("/")
        if len(parts) != 3 or parts[0] or not parts[1] or not parts[2]:
            self._refuse(400, "not a /scope/key path")
            return None
        return parts[1], parts[2]

    def _planned_slot(self, key: str, current: bool = False) -> tuple[str, int] | None:
        """The ``(host, slot)`` of ``key`` when a ring of this job had that slot (with
        ``current``: the current ring); None otherwise."""
        host, _, slot = key.rpartition(":")
        slots = self.server.current_slots if current else self.server.planned_slots
        if not _SLOT.match(slot) or (host, int(slot)) not in slots:
            return None
        return host, int(slot)

    def _is_member_address(self, scope: str, key: str) -> bool:
        """Whether ``key`` is where a member of the current ring puts its addresses (a
        rank, in one of the ring's Gloo scopes)."""
        return key.isascii() and key.isdigit() and self._is_gloo_scope(scope)

    def _is_gloo_scope(self, scope: str) -> bool:
        """A scope of the current ring's Gloo contexts (global, local_<host>, cross_<n>,
        each also with a process set's suffix)."""
        base = _PROCESS_SET_SUFFIX.sub("", scope)
        return base in self.server.scope_size

    def _gloo_limit(self, scope: str, key: str) -> int | None:
        """The largest value Gloo writes under ``/scope/key`` for the current ring;
        None when it writes nothing there."""
        size = self.server.scope_size.get(_PROCESS_SET_SUFFIX.sub("", scope))
        return None if size is None else gloo_value_limit(size, key)

    # -- signed writes (see spotring.worker_image.store_auth)

    def _signature(self) -> store_auth.Signature | None:
        """The request's signature; None once the request was refused for having none
        (or a malformed one), before any of its body is read."""
        header = self.headers.get(store_auth.AUTH_HEADER)
        signature = store_auth.parse(header)
        if signature is None:
            self._refuse(401, "an unsigned write" if header is None else "a malformed signature")
        return signature

    def _admit(self, signature: store_auth.Signature, body: bytes) -> bool:
        """Whether the signed request, with ``body``, is the job's own (its MAC under
        the job key), for the current ring, and not taken before; refused otherwise."""
        key = self.server.job_key
        if not store_auth.verify(key, signature, self.command, self.path, body):
            self._refuse(403, "a signature that is not the job's")
            return False
        refusal = self.server.admit(signature)
        if refusal is not None:
            self._refuse(*refusal)
            return False
        return True

    def _signed_body(
        self, limit: int, room: int | None = None
    ) -> tuple[store_auth.Signature, bytes] | None:
        """The request's signature and body (see :meth:`_read_body`), once both are
        checked; None once the request was refused. An unsigned request is refused
        before its body is read."""
        signature = self._signature()
        if signature is None:
            return None
        body = self._read_body(limit, room)
        if body is None or not self._admit(signature, body):
            return None
        return signature, body

    # -- methods

    def do_GET(self) -> None:
        parsed = self._scope_and_key()
        if parsed is None:
            return
        scope, key = parsed
        if scope == GET_RANK_AND_SIZE:
            slot = self._planned_slot(key) if self.driver is not None else None
            if slot is None:
                self._refuse(404, "not a slot of any ring of this job")
                return
            # It tells the driver the worker is ready (and can abandon a forming ring):
            # a write, signed like the others.
            signature = self._signature()
            if signature is None or not self._admit(signature, b""):
                return
            value: bytes | None = self._rank_and_size(*slot)
        elif scope == PUT_WORKER_ADDRESSES:
            value = None  # never stored: it holds each worker's secret key
        elif scope == RING_SCOPE and key.startswith(ABANDONED_SLOT_PREFIX):
            forming = self._planned_slot(key.removeprefix(ABANDONED_SLOT_PREFIX))
            generation = None if forming is None else self.server.abandoned_for(forming)
            value = None if generation is None else str(generation).encode("ascii")
        else:
            value = horovod_internals.stored_value(self, scope, key)
            if value is None and self.server.abandoned and self._is_member_address(scope, key):
                # An empty address list: Gloo rejects it, and the member leaves the ring
                # at once instead of waiting out its timeout for a dead member.
                value = b""
        if value is None:
            self.send_status_code(404)
            return
        self._send_value(value)

    def _send_value(self, value: bytes | memoryview) -> None:
        """200 with ``value``; headers and a small body in one write (a ring's ranks
        make thousands of these), a large body written as it is (not copied)."""
        self.send_response(200)
        self.send_header("Content-Length", str(len(value)))
        if len(value) <= 65536:
            self._headers_buffer.append(b"\r\n")  # http.server's end_headers, with the body
            self._headers_buffer.append(bytes(value))
            self.flush_headers()
        else:
            self.end_headers()
            self.wfile.write(value)

    def _rank_and_size(self, host: str, slot: int) -> bytes:
        driver = self.driver
        assert driver is not None
        if self.server.rank_asked((host, slot)):
            # Its worker was told its rank in the current ring and asks again: it left
            # that ring, which cannot form without it. Members still forming it (a
            # new worker, past the store, waiting in Gloo's connect for this one) would
            # wait out five times Gloo's timeout unless they hear it was abandoned. A
            # ring that already trained is being reset: nothing of it reads the store.
            log.debug("rendezvous: %s[%d] left ring %d", host, slot, self.server.generation)
            self.server.abandon()
        driver.record_ready(host, slot)
        answer = str(driver.get_slot_info(host, slot).to_response_string()).encode("ascii")
        self.server.rank_given((host, slot))
        return answer

    def do_PUT(self) -> None:
        parsed = self._scope_and_key()
        if parsed is None:
            return
        scope, key = parsed
        if scope == PUT_WORKER_ADDRESSES:
            self._register(key)
        elif scope in READ_ONLY_SCOPES:
            self._refuse(403, "read-only scope")
        elif key.startswith("spotring-mesh-"):
            self._mesh_exchange(scope, key)
        else:
            self._put_gloo_key(scope, key)

    def _register(self, key: str) -> None:
        """Take a worker's registration for a slot of the current ring, one at a time
        per slot: the driver probes its addresses before it answers."""
        slot = self._planned_slot(key, current=True) if self.driver is not None else None
        if slot is None:
            self._refuse(403, "not a slot of the current ring")
            return
        signed = self._signed_body(MAX_WORKER_ADDRESSES_BYTES)
        if signed is None:
            return
        try:
            addresses, secret_key = decode_worker_addresses(signed[1])
        except HostileInput as error:
            self._refuse(400, str(error))
            return
        if not self.server.begin_registration(slot):
            self._refuse(429, "a registration of this slot is under way")
            return
        try:
            driver = self.driver
            assert driver is not None
            driver.register_worker_server(slot[0], slot[1], addresses, secret_key)
        finally:
            self.server.end_registration(slot)
        self.send_status_code(200)

    def _put_gloo_key(self, scope: str, key: str) -> None:
        """Store a key Gloo's rendezvous writes for the current ring, within its bound
        and the store's budget."""
        limit = self._gloo_limit(scope, key)
        if limit is None:
            self._refuse(403, "not a key of the current ring's rendezvous")
            return
        signed = self._signed_body(min(limit, MAX_BODY_BYTES), self.server.store_room())
        if signed is None:
            return
        refusal = self.server.store(scope, key, signed[1], signed[0].ring)
        if refusal is not None:
            self._refuse(*refusal)
            return
        self.send_status_code(200)

    def _mesh_exchange(self, scope: str, key: str) -> None:
        """A rank's whole full-mesh exchange (see :class:`MeshScope`): store its host
        name and addresses, wait (bounded) until every rank of the scope has, answer
        its peers' addresses for it; 404 when the wait ran out (it asks again), an
        abandoned ring's answer when the ring lost a member before it formed."""
        base = _PROCESS_SET_SUFFIX.sub("", scope)
        planned = self.server.scope_size.get(base)
        match = _MESH_KEY.match(key)
        if planned is None or match is None or int(match[1]) >= planned:
            self._refuse(403, "not a rank of the current ring's rendezvous")
            return
        rank = int(match[1])
        signed = self._signed_body(min(mesh_body_limit(planned), MAX_BODY_BYTES))
        if signed is None:
            return
        signature, body = signed
        try:
            size, wait, host, addresses = mesh_request(body, planned, exact=base == scope)
        except HostileInput as error:
            self._refuse(400, str(error))
            return
        if rank >= size:
            self._refuse(400, f"rank {rank} of a mesh of {size}")
            return
        mesh, refusal = self.server.mesh_put(scope, size, rank, host, addresses, signature.ring)
        if mesh is None:
            self._refuse(*refusal)
            return
        answer = self.server.mesh_answer_or_park(mesh, rank, wait, self.connection)
        if answer is PARKED:
            self.close_connection = True  # the answer is sent later, by another thread
        elif answer is None:
            self.send_status_code(404)
        else:
            self._send_value(answer)

    def _read_body(self, limit: int, room: int | None = None) -> bytes | None:
        """The request's body, or None once the request was refused. A body over
        ``limit``, or over ``room`` (what the store has left), is refused unread."""
        if "Transfer-Encoding" in self.headers:
            self._refuse(411, "a body without Content-Length")
            return None
        length = self.headers.get("Content-Length", "")
        if not (length.isascii() and length.isdigit()):
            self._refuse(411, "no valid Content-Length")
            return None
        if int(length) > limit:
            self._refuse(413, f"a body of {length} bytes (at most {limit})")
            return None
        if room is not None and _charge(b"") + int(length) > room:
            self._refuse(413, "the store is full")
            return None
        try:
            body = self.rfile.read(int(length))
        except TimeoutError:
            self._refuse(408, "the body did not arrive in time")
            return None
        if len(body) != int(length):
            self._refuse(400, "the body ended early")
            return None
        return body

    def do_DELETE(self) -> None:
        parsed = self._scope_and_key()
        if parsed is None:
            return
        scope, key = parsed
        if scope in READ_ONLY_SCOPES or not self._is_gloo_scope(scope):
            self._refuse(403, "not a scope of the current ring's rendezvous")
        elif not key.isdigit() or self._gloo_limit(scope, key) is None:
            self._refuse(403, "not a rank of the current ring")  # Gloo's Finalize: its rank
        else:
            signature = self._signature()
            if signature is None or not self._admit(signature, b""):
                return
            if not self.server.finish(scope, key, signature.ring):
                self._refuse(409, "signed for a ring that is no longer the current one")
                return
            self.send_status_code(200)

    def do_HEAD(self) -> None:  # SimpleHTTPRequestHandler's would describe local files
        self._refuse(405, "method not allowed")


def rendezvous_handler(driver: ElasticDriverCalls) -> type[HardenedRendezvousHandler]:
    """The request handler for Horovod's elastic ``driver``: what Horovod's
    ``create_rendezvous_handler(driver)`` answers, hardened (see the module)."""
    return type("ElasticRendezvousHandler", (HardenedRendezvousHandler,), {"driver": driver})


# ------------------------------------------------------------- the server


class _WarningBudget:
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


class _Workers:
    """Daemon threads that each serve one connection at a time, started when none is
    idle and ended after :data:`WORKER_IDLE_SECONDS` idle: a ring's thousands of
    short requests do not each start a thread (and wait for it to start). How many
    run at once is the caller's bound."""

    def __init__(self, target: Callable[..., None], limit: int | None = None) -> None:
        self._target = target
        self._limit = limit
        self._threads = 0
        self._pending = 0
        self._progress = time.monotonic()
        self._queue: queue.SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]]] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._idle = 0

    def submit(self, *item: Any) -> None:
        """Serve ``target(*item)`` on a thread."""
        self.submit_call(self._target, *item)

    def submit_call(self, call: Callable[..., None], *args: Any) -> None:
        """Run ``call(*args)`` on a thread."""
        with self._lock:
            start = self._idle == 0 and (self._limit is None or self._threads < self._limit)
            if start:
                self._threads += 1
            elif self._idle:
                self._idle -= 1  # that worker takes this item (or another's: any item)
            # else: at the limit, all busy: the next one free takes it
            self._pending += 1
        if start:
            threading.Thread(target=self._run, name="spotring-rendezvous", daemon=True).start()
        self._queue.put((call, args))

    def grow_if_stuck(self) -> None:
        """One more thread when work waits and no thread has taken any for
        :data:`STUCK_SECONDS` (every one is held, by slow clients)."""
        now = time.monotonic()
        with self._lock:
            stuck = self._pending > 0 and self._idle == 0 and now - self._progress > STUCK_SECONDS
            if stuck:
                self._threads += 1
                self._progress = now
        if stuck:
            threading.Thread(target=self._run, name="spotring-rendezvous", daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=WORKER_IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:  # not promised to an item on its way
                        self._idle -= 1
                        self._threads -= 1
                        return
                continue
            with self._lock:
                self._pending -= 1
                self._progress = time.monotonic()
            call, args = item
            try:
                call(*args)
            except Exception:  # a call's own errors are its own to report
                log.debug("rendezvous: a server task failed", exc_info=True)
            finally:
                with self._lock:
                    self._idle += 1


class _RendezvousHTTPServer(RendezvousHTTPServer):
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
        """What every write must be signed with (see :mod:`.store_auth`)."""
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
        """What the Gloo keys in :attr:`cache` count (see :func:`_charge`); under
        ``cache_lock``."""
        self.store_budget = 0
        self._registering: set[tuple[str, int]] = set()
        self._registering_lock = threading.Lock()
        self._connections = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._workers = _Workers(self.process_request_thread, limit=CONNECTION_THREADS)
        self._answerers = _Workers(self._answer_parked, limit=MESH_ANSWER_THREADS)
        self._warnings = _WarningBudget()
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

    def admit(self, signature: store_auth.Signature) -> tuple[int, str] | None:
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
                return _MESH_ANSWER.pack(MESH_MAGIC, MESH_ABANDONED, 0, 0)
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
        return _MESH_ANSWER.pack(MESH_MAGIC, MESH_ABANDONED, 0, 0)

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
                    value = _MESH_ANSWER.pack(MESH_MAGIC, MESH_ABANDONED, 0, 0)
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
            grown = self.store_bytes + _charge(value)
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
                    self.store_bytes -= sum(map(_charge, entries.values()))
                    entries.clear()
                return True
            entries = self.cache.get(scope)
            if entries is not None:
                self.store_bytes -= _charge(entries.pop(key, None))
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
            f"{type(error).__name__}: {_printable(str(error))}"
        )


class RingTracker(RendezvousServer):
    """Horovod's rendezvous server, hardened, recording every ring the driver forms.

    Horovod calls ``init`` with the new slot plan at the start and after every reset,
    which makes it the one place that sees each ring. Each ring's generation is
    published in the server's store as ASCII digits, where workers read it after
    their ``init``; every slot of every plan is remembered, and only those may ask
    for a rank or register.
    """

    def __init__(self, verbose: int = 0, on_ring: Callable[[int, list[str]], None] | None = None):
        super().__init__(verbose)
        self.world_sizes: list[int] = []
        self._ring_listeners = [on_ring] if on_ring is not None else []

    def add_ring_listener(self, listener: Callable[[int, list[str]], None]) -> None:
        """Call ``listener(size, hosts)`` for every ring formed from now on."""
        self._ring_listeners.append(listener)

    @property
    def generation(self) -> int:
        """The current ring's number: 1 for the first ring, +1 per reset."""
        return len(self.world_sizes)

    def start(self, handler_cls: Any = None, address: str = "", *, job_key: bytes) -> int:
        """Listen on ``address`` (every interface if empty, as Horovod's); the port.

        ``handler_cls`` defaults to a plain hardened store; the elastic driver's comes
        from :func:`rendezvous_handler`. Every write must be signed with ``job_key``
        (see :mod:`spotring.worker_image.store_auth`).
        """
        handler_cls = handler_cls or HardenedRendezvousHandler
        verbose = horovod_internals.server_verbose(self)
        httpd = _RendezvousHTTPServer((address, 0), handler_cls, verbose, job_key)
        listen_thread = threading.Thread(
            target=httpd.serve_forever, name="spotring-rendezvous", daemon=True
        )
        horovod_internals.set_http_server(self, httpd, listen_thread)
        listen_thread.start()
        return int(httpd.server_address[1])

    @property
    def httpd(self) -> _RendezvousHTTPServer:
        """The HTTP server :meth:`start` started."""
        httpd: _RendezvousHTTPServer = horovod_internals.http_server(self)
        return httpd

    def stop(self) -> None:
        if self.world_sizes:
            log.debug(
                "rendezvous: ring %d (scopes %s) served %s",
                self.generation,
                json.dumps(self.httpd.scope_size, sort_keys=True),
                json.dumps(dict(self.httpd.take_requests()), sort_keys=True),
            )
        super().stop()
        self.httpd.server_close()

    def abandon(self, generation: int) -> None:
        """A member of ring ``generation`` died: if that ring is still the current one,
        members still forming it are told at once, where they would otherwise wait for
        the dead member's address until Gloo's timeout (30 s). A member asking for an
        address that is not there gets an empty one, which Gloo rejects; spotring's
        Horovod build turns that into a failed ``hvd.init``, which the worker retries
        in the next ring. A ring already formed makes no such requests. Members past
        the store (connecting to their peers) that the driver cannot message yet ask
        for ``spotring/abandoned``, published here until the next ring clears it."""
        if generation == self.generation:
            self.httpd.abandon()

    def request_flush(self) -> None:
        """After a notice, nobody would carry the current ring's state on: ask its rank
        0 to write the commit at which it stops to durable storage before it goes. The
        next ring's ``init`` clears the store, and the request with it."""
        httpd = self.httpd
        with httpd.cache_lock:
            value = str(self.generation).encode("ascii")
            httpd.cache.setdefault(RING_SCOPE, {})[FLUSH_KEY] = value

    def init(self, host_alloc_plan):
        httpd = self.httpd
        if self.world_sizes:
            log.debug(
                "rendezvous: ring %d (scopes %s) served %s",
                self.generation,
                json.dumps(httpd.scope_size, sort_keys=True),
                json.dumps(dict(httpd.take_requests()), sort_keys=True),
            )
        current = frozenset((slot.hostname, slot.local_rank) for slot in host_alloc_plan)
        self.world_sizes.append(len(host_alloc_plan))
        httpd.begin_ring(host_alloc_plan, self.generation, current)  # clears the store
        hosts = sorted({slot.hostname for slot in host_alloc_plan})
        for listener in self._ring_listeners:
            listener(len(host_alloc_plan), hosts)
