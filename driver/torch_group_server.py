"""The in-place torch backend's coordinator, served by the driver to its workers.

It is :class:`spotring.torch.coordinator.Coordinator`'s other half, over HTTP: the
driver publishes generations (each one process group: its members in rank order) and
abandons them; a worker asks for its next membership, for the newest generation (at
each commit), whether its generation was abandoned, and reads and writes its group's
c10d store keys (Gloo's rendezvous) here. The protocol is in
:mod:`spotring.worker_image.wire` (its in-place torch section).

What a client that can reach the port but lacks the job key can do: open connections
up to :data:`MAX_CONNECTIONS`, each cut off after :data:`REQUEST_SECONDS` without a
whole request, and be refused. Every request must be signed: an unsigned or
malformed one is refused (401) before its body is read, a forged one (403) or a replay
(409) before anything is read out, stored or held. So nobody without the key can write
a group's keys (forging a peer's address), hold waiting requests open (exhausting the
waiters' budget), or stop a generation from forming. A key's first value is final, a
write is taken only for the newest generation, and the keys of a generation are
bounded in count and bytes by its size. What it cannot hide: the group's addresses
travel in the clear, as on the Horovod path (docs/security.md).
"""

from __future__ import annotations

import collections
import contextlib
import http.server
import io
import itertools
import logging
import socket
import sys
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from spotring.driver.deadline_reader import DeadlineReader
from spotring.torch.coordinator import Membership
from spotring.worker_image import wire

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 4096
"""Connections served at once; more are closed at once."""
REQUEST_SECONDS = 10.0
"""How long a client has to send a whole request (and to go idle between two)."""
MAX_VALUE_BYTES = 1 << 20
"""The largest key value: Gloo's is about 60 bytes per rank of the group."""
MAX_KEY_CHARS = 512
MAX_MULTI_KEYS = 65536
"""Keys one multi-get may name (a rank asks for every rank's at once)."""
MAX_CACHED_ANSWERS = 64
"""Answers kept per generation (its ranks all ask for the same keys)."""
KEYS_PER_MEMBER = 4
"""Keys a generation may hold per member, beyond :data:`EXTRA_KEYS` (Gloo writes one
per rank and group)."""
EXTRA_KEYS = 64
BYTES_PER_MEMBER = 1 << 20
NONCE_MEMORY_SECONDS = 2 * wire.TORCH_CLOCK_SKEW_MS / 1000 + 10
"""A nonce is remembered longer than a request stamped with it is taken."""
MAX_NONCES = 1 << 20
"""Nonces remembered at most: about 100 MB at worst. More requests inside the window
than this are refused (503), the workers' retries included."""


class _Refused(Exception):
    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status


class _KeyWait:
    """A request waiting for keys of a generation, parked under one missing key at a
    time: the first of its keys, in its order, not written yet. A write moves it past
    every key written since, so one waiter costs O(its keys) over a whole formation,
    not a wake per key (a thousand ranks each asking for every rank's key)."""

    def __init__(self, keys: Sequence[str]) -> None:
        self.keys = keys
        self.cursor = 0
        self.parked_on: str | None = None
        self.done = threading.Event()

    def next_missing(self, written: dict[str, bytes]) -> str | None:
        """The first of its keys not in ``written``; None once all are."""
        # In C (dropwhile over a builtin): a thousand waiters walk a thousand keys each.
        after = itertools.islice(self.keys, self.cursor, None)
        missing = next(itertools.dropwhile(written.__contains__, after), None)
        if missing is not None:
            self.cursor = self.keys.index(missing, self.cursor)
        return missing


@dataclass
class _Generation:
    number: int
    members: tuple[str, ...]
    keys: dict[str, bytes] = field(default_factory=dict)
    stored_bytes: int = 0
    abandoned: bool = False
    """Given up: a member died or hangs; its members roll back."""
    closed: bool = False
    """Superseded before every member had written its key: it can never form, so its
    key reads are refused (its members go on to the next one, nothing rolled back)."""
    waits: dict[str, list[_KeyWait]] = field(default_factory=dict)
    answers: dict[tuple[object, tuple[str, ...]], bytes] = field(default_factory=dict)
    """Multi-get answers made, by their keys (the keys are final once written)."""

    @property
    def unreadable(self) -> bool:
        return self.abandoned or self.closed

    def park(self, waiting: _KeyWait) -> None:
        """Park ``waiting`` under its next missing key, or wake it: it has them all."""
        missing = waiting.next_missing(self.keys)
        waiting.parked_on = missing
        if missing is None:
            waiting.done.set()
        else:
            self.waits.setdefault(missing, []).append(waiting)

    def unpark(self, waiting: _KeyWait) -> None:
        if waiting.parked_on is not None:
            with contextlib.suppress(ValueError, KeyError):
                self.waits[waiting.parked_on].remove(waiting)

    def wake_all(self) -> None:
        for waits in self.waits.values():
            for wait in waits:
                wait.done.set()
        self.waits.clear()


class GroupServer:
    """Serves the generations the driver publishes (see the module).

    :param job_key: what every request must be signed with.
    :param host: the address to listen on; ``port`` 0: a free one.
    :param on_asked: called with a worker's name when it asks for a membership it has
        not been given yet (it waits for the next generation: a joiner is ready, a
        survivor rolled back, a worker left its group at a commit). On the request's
        thread, without the server's lock.
    """

    def __init__(
        self,
        job_key: bytes,
        host: str = "0.0.0.0",
        port: int = 0,
        *,
        on_asked: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not job_key:
            raise ValueError("the coordinator needs the job key to check requests")
        self._key = job_key
        self._clock = clock
        self._on_asked = on_asked or (lambda worker: None)
        self._changed = threading.Condition()
        self._workers: dict[str, list[Membership]] = {}  # name -> memberships handed
        self._received: dict[str, int] = {}  # name -> generation of the last one answered
        self._asking: dict[str, int] = {}  # name -> the membership it waits for
        self._generations: dict[int, _Generation] = {}
        self._latest = -1
        self.flush = False
        """Set by the driver while every member's host is leaving: rank 0 makes each
        commit durable before training on (``GET /torch/flush``)."""
        self._nonces: collections.OrderedDict[str, float] = collections.OrderedDict()
        self._connections = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._http = _HttpServer((host, port), _Handler, self)
        self._thread = threading.Thread(
            target=self._http.serve_forever,
            args=(0.1,),
            name="spotring-torch-coordinator",
            daemon=True,
        )  # polls for shutdown every 0.1 s

    @property
    def port(self) -> int:
        return int(self._http.server_address[1])

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self._http.shutdown()
        self._http.server_close()
        with self._changed:
            for generation in self._generations.values():
                generation.wake_all()
            self._changed.notify_all()

    # -- the driver's side

    def admit(self, worker: str) -> None:
        """Let ``worker`` (a name the driver gave a process it started) ask."""
        with self._changed:
            self._workers.setdefault(worker, [])

    def forget(self, worker: str) -> None:
        """``worker`` ended: its requests are refused from now on."""
        with self._changed:
            self._workers.pop(worker, None)
            self._asking.pop(worker, None)
            self._received.pop(worker, None)

    def waiting(self) -> set[str]:
        """The workers that asked for a membership they have not been given."""
        with self._changed:
            return {w for w, n in self._asking.items() if n >= len(self._workers.get(w, ()))}

    def received(self, worker: str) -> int:
        """The generation of the last membership ``worker`` was answered (-1: none yet).
        A worker that ended in an older generation than the newest never formed that one."""
        with self._changed:
            return self._received.get(worker, -1)

    @property
    def latest(self) -> int:
        """The newest generation published; -1 before the first."""
        return self._latest

    def publish(
        self, members: Sequence[str], master_addr: str, *, abandon: bool
    ) -> int:  # fmt: skip
        """Publish the next generation of ``members`` (ranks in this order) and return
        its number. ``abandon``: give up the current one first (a member died or hangs:
        its members roll back); otherwise its members move over at their next commit."""
        with self._changed:
            if abandon:
                self._abandon_locked()
            previous = self._generations.get(self._latest)
            if previous is not None and len(previous.keys) < len(previous.members):
                previous.closed = True  # superseded while forming: it never will
                previous.wake_all()
            number = self._latest + 1
            for rank, worker in enumerate(members):
                place = Membership(number, rank, len(members), master_addr, self.port)
                self._workers.setdefault(worker, []).append(place)
            self._generations[number] = _Generation(number, tuple(members))
            # Keys of generations before the current one are never read again.
            for old in [g for g in self._generations if g < self._latest]:
                self._generations.pop(old).wake_all()
            self._latest = number
            self._changed.notify_all()
            return number

    def abandon(self) -> None:
        """Give up the newest generation: its members abort what they wait for."""
        with self._changed:
            self._abandon_locked()

    def _abandon_locked(self) -> None:
        current = self._generations.get(self._latest)
        if current is not None and not current.abandoned:
            current.abandoned = True
            current.keys.clear()
            current.wake_all()
            self._changed.notify_all()

    # -- the requests (on the server's threads)

    def check_signature(self, header: str | None) -> wire.Signature:
        """The request's signature, if its form and time are right (body unread)."""
        signature = wire.parse(header)
        if signature is None:
            raise _Refused(401, "not signed")
        if abs(signature.ring - self._clock() * 1000) > wire.TORCH_CLOCK_SKEW_MS:
            raise _Refused(401, "stamped too far from the server's clock")
        return signature

    def take_nonce(self, signature: wire.Signature, method: str, path: str, body: bytes) -> None:
        """Refuse a forged (403) or replayed (409) request; remember its nonce."""
        if not wire.verify(self._key, signature, method, path, body):
            raise _Refused(403, "bad signature")
        now = self._clock()
        with self._changed:
            while self._nonces and next(iter(self._nonces.values())) < now - NONCE_MEMORY_SECONDS:
                self._nonces.popitem(last=False)
            if signature.nonce in self._nonces:
                raise _Refused(409, "replayed")
            if len(self._nonces) >= MAX_NONCES:
                raise _Refused(503, "too many requests")
            self._nonces[signature.nonce] = now

    def answer(self, method: str, parts: list[str], wait: float, body: bytes) -> tuple[int, bytes]:
        """The status and body for a checked request to ``/torch/<parts...>``."""
        match method, parts:
            case "GET", ["latest"]:
                latest = self._latest
                return (200, str(latest).encode()) if latest >= 0 else (404, b"")
            case "GET", ["member", worker, n] if n.isdigit():
                return self._membership(worker, int(n), wait)
            case "GET", ["flush"]:
                return (200, b"1") if self.flush else (404, b"")
            case "GET", ["abandoned", g] if g.isdigit():
                return self._wait_for(lambda: self._is_abandoned(int(g)), wait)
            case "PUT", ["group", g, key] if g.isdigit():
                return self._set(int(g), _key(key), body)
            case "GET", ["group", g, key] if g.isdigit():
                return self._get(int(g), _key(key), wait)
            case "POST", ["multi", g] if g.isdigit():
                return self._multi_get(int(g), _keys(body), wait)
        raise _Refused(404, "no such request")

    def _membership(self, worker: str, n: int, wait: float) -> tuple[int, bytes]:
        with self._changed:
            handed = self._workers.get(worker)
            if handed is None:
                raise _Refused(404, "unknown worker")
            newly_asking = n >= len(handed) and self._asking.get(worker) != n
            if n >= len(handed):
                self._asking[worker] = n
        if newly_asking:
            self._on_asked(worker)

        def place() -> bytes | None:
            """The newest of the memberships from the n-th on, with its index: one
            already superseded is skipped (its group may never form)."""
            handed = self._workers.get(worker)
            if handed is None:
                raise _Refused(404, "unknown worker")
            if n >= len(handed):
                return None
            self._received[worker] = handed[-1].generation
            return f"{len(handed) - 1} {handed[-1].encode()}".encode()

        return self._wait_for(place, wait)

    def _is_abandoned(self, number: int) -> bytes | None:
        generation = self._generations.get(number)
        # One no longer kept is past: given up or superseded, never waited on again.
        return b"1" if generation is None or generation.abandoned else None

    def _set(self, number: int, key: str, value: bytes) -> tuple[int, bytes]:
        with self._changed:
            generation = self._generations.get(number)
            if generation is None or generation.abandoned or number != self._latest:
                raise _Refused(410, f"generation {number} is not the one forming")
            size = len(generation.members)
            old = generation.keys.get(key)
            if old is not None:
                if old == value:
                    return 204, b""
                raise _Refused(409, "the key has a value already")
            if len(generation.keys) >= KEYS_PER_MEMBER * size + EXTRA_KEYS:
                raise _Refused(413, "too many keys for the generation")
            if generation.stored_bytes + len(value) > BYTES_PER_MEMBER * size:
                raise _Refused(413, "too many bytes for the generation")
            generation.keys[key] = value
            generation.stored_bytes += len(value)
            for waiting in generation.waits.pop(key, []):
                generation.park(waiting)
        return 204, b""

    def _get(self, number: int, key: str, wait: float) -> tuple[int, bytes]:
        return self._wait_for_keys(number, [key], wait, _only_value)

    def _multi_get(self, number: int, keys: list[str], wait: float) -> tuple[int, bytes]:
        return self._wait_for_keys(number, keys, wait, wire.encode_values)

    def _wait_for_keys(
        self, number: int, keys: list[str], wait: float, answer: Callable[[list[bytes]], bytes]
    ) -> tuple[int, bytes]:
        """200 with ``answer(values)`` once every key of generation ``number`` is
        written (waiting up to ``wait`` s), 204 if not by then, 410 once it cannot form."""
        with self._changed:
            waiting = _KeyWait(keys)
            self._readable(number).park(waiting)
        waiting.done.wait(wait)
        with self._changed:
            generation = self._readable(number)
            if waiting.next_missing(generation.keys) is not None:
                generation.unpark(waiting)
                return 204, b""
            # Every rank asks for the same keys: the answer is made once.
            cached = generation.answers.get((answer, tuple(keys)))
            if cached is None:
                cached = answer([generation.keys[key] for key in keys])
                if len(generation.answers) < MAX_CACHED_ANSWERS:
                    generation.answers[(answer, tuple(keys))] = cached
            return 200, cached

    def _readable(self, number: int) -> _Generation:
        generation = self._generations.get(number)
        if generation is None or generation.unreadable:
            raise _Refused(410, f"generation {number} was given up or superseded")
        return generation

    def _wait_for(self, find: Callable[[], bytes | None], wait: float) -> tuple[int, bytes]:
        """200 with what ``find`` (called under the lock) finds, waiting up to
        ``wait`` seconds for it; 204 when nothing came."""
        deadline = time.monotonic() + wait
        with self._changed:
            while True:
                value = find()
                if value is not None:
                    return 200, value
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._thread.is_alive():
                    return 204, b""
                self._changed.wait(remaining)


def _only_value(values: list[bytes]) -> bytes:
    return values[0]


def _keys(body: bytes) -> list[str]:
    """The keys of a multi-get: one per line."""
    try:
        keys = body.decode().split("\n")
    except UnicodeDecodeError:
        raise _Refused(400, "bad keys") from None
    if not 0 < len(keys) <= MAX_MULTI_KEYS or "" in keys or max(map(len, keys)) > MAX_KEY_CHARS:
        raise _Refused(400, "bad keys")
    return keys


def _key(quoted: str) -> str:
    key = urllib.parse.unquote(quoted)
    if not 0 < len(key) <= MAX_KEY_CHARS:
        raise _Refused(400, "bad key")
    return key


class _HttpServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 1024

    def __init__(self, address: Any, handler: Any, owner: GroupServer) -> None:
        super().__init__(address, handler)
        self.owner = owner

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.owner._connections.acquire(blocking=False):
            self.shutdown_request(request)  # full: this client costs only its connection
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.owner._connections.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.owner._connections.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """One line, no traceback: a connection that broke is the client's loss only."""
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            log.warning("coordinator: a request from %s failed: %r", client_address[0], error)


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: a worker asks at every commit
    timeout = REQUEST_SECONDS
    server: _HttpServer
    rfile: io.BufferedIOBase

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.rfile.close()
        self._reader = DeadlineReader(self.connection, 0.0, REQUEST_SECONDS)
        self.rfile = io.BufferedReader(self._reader)

    def handle_one_request(self) -> None:
        """http.server's, with the whole request (line, headers, body) due within
        :data:`REQUEST_SECONDS` of the connection's last answer."""
        self._reader.restart(REQUEST_SECONDS)
        try:
            super().handle_one_request()
        except TimeoutError:
            self.close_connection = True

    def do_GET(self) -> None:
        self._serve()

    def do_PUT(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def _serve(self) -> None:
        owner = self.server.owner
        try:
            url = urllib.parse.urlsplit(self.path)
            if not url.path.startswith(wire.TORCH_PREFIX):
                raise _Refused(404, "no such request")
            signature = owner.check_signature(self.headers.get(wire.AUTH_HEADER))
            body = self._body()
            owner.take_nonce(signature, self.command, self.path, body)
            query = urllib.parse.parse_qs(url.query)
            wait_ms = min(int(query.get("wait", ["0"])[0] or 0), wire.TORCH_MAX_WAIT_MS)
            parts = url.path[len(wire.TORCH_PREFIX) :].split("/")
            status, answer = owner.answer(self.command, parts, max(wait_ms, 0) / 1000, body)
        except _Refused as refusal:
            if refusal.status in (401, 403, 409, 413, 400, 503):
                log.warning(
                    "coordinator: refused %s %s from %s: %s",
                    self.command, self.path[:200], self.client_address[0], refusal,
                )  # fmt: skip
            status, answer = refusal.status, str(refusal).encode()
            self.close_connection = refusal.status in (401, 403, 409, 413, 400, 503)
        except ValueError:
            status, answer = 400, b"bad request"
            self.close_connection = True
        try:
            self.send_response(status)
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            if answer:
                self.wfile.write(answer)
        except OSError:  # the client left (a worker stopped, a watch closed): its loss
            self.close_connection = True

    def _body(self) -> bytes:
        length = int(self.headers.get("Content-Length") or 0)
        if not 0 <= length <= MAX_VALUE_BYTES:
            raise _Refused(413, "body too long")
        body = self.rfile.read(length)  # the request's deadline bounds it
        if len(body) != length:
            raise ValueError("short body")
        return body

    def log_message(self, format: str, *args: Any) -> None:  # http.server's name
        pass  # one line per request is noise; refusals are logged above
