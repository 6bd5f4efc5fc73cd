"""Worker side of the peer-failure abort: free a survivor from a collective a dead peer hung.

When a worker dies mid-allreduce, a survivor waiting on *another survivor* (already gone
to the reset) stays blocked in a Gloo recv until ``HOROVOD_GLOO_TIMEOUT_SECONDS`` (30 s).
spotring's driver sees the worker's process exit at once and sends every other worker of
the ring a :class:`PeerFailedRequest` through Horovod's worker notification service. On
that message the worker shuts down the sockets its current Gloo context opened: the
blocked recv fails at once and Horovod takes its normal path (restore the last commit,
re-rendezvous, sync).

This runs inside the user's worker process whatever state class the script uses:
spotring's launcher puts ``spotring/worker_image/sitehook`` on ``PYTHONPATH``, whose
``sitecustomize`` calls :func:`install_when_imported`. Once ``horovod.torch`` is imported,
:func:`install` wraps Horovod's ``init`` (to learn each context's sockets and its ring
generation, plain digits read over HTTP) and the notification service's request handler
(to take our message before Horovod's own listeners, which only know host updates; and
to refuse junk without a traceback, cutting off connections that never finish).

Who can trigger an abort: a message is accepted only with a valid HMAC-SHA256 under the
job key, for the ring generation the worker is in, and with a sequence number above every
one accepted before. A forged, replayed or stale message (from an earlier ring) is
rejected and logged. The job key is a per-job secret that the launcher hands the
supervisor on its stdin and the supervisor hands the worker in a pipe it inherits
(:func:`take_job_key`): never argv, HTTP, or an environment block, which
``/proc/PID/environ`` shows for the process's whole life and its children inherit.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import socket
import stat
import struct
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from spotring.worker_image import horovod_internals, sampler_reset, store_client
from spotring.worker_image.after_import import call_after_import
from spotring.worker_image.ring_formation import (
    retry_failed_formation,
    watch_abandoned_formation,
)
from spotring.worker_image.wire import (  # re-exported: the old import locations
    ABANDONED_KEY,
    ABANDONED_SLOT_PREFIX,
    HOSTNAME_ENV,
    JOB_KEY_ENV,
    JOB_KEY_FD_ENV,
    LOCAL_RANK_ENV,
    PEER_ABORT_ENV,
    RING_KEY,
    PeerFailedRequest,
    parse_ring,
)

log = logging.getLogger(__name__)

ENABLE_ENV = PEER_ABORT_ENV
"""Set to ``1`` by spotring's supervisor for the workers it starts."""

MAX_JOB_KEY_HEX = 256
"""A job key is 64 hex digits; anything much longer is not one."""

RING_READ_TIMEOUT_SECONDS = 10.0
WATCH_READ_TIMEOUT_SECONDS = 2.0
REAP_EVERY_SECONDS = 0.02
REAP_SECONDS = 120.0
"""An aborted formation's new Gloo sockets are shut down this often, at most this long
(the attempt ends long before: Gloo gives up at its first failed pair)."""

NOTIFICATION_DEADLINE_SECONDS = 10.0
"""How long a connection to the worker's notification service may last."""

MAX_NOTIFICATION_BYTES = 1 << 20
"""The largest message the notification service reads (Horovod's are a few hundred
bytes); a longer one is refused from its header, before any of it is read."""

MAX_NOTIFICATION_CONNECTIONS = 16
"""Connections the notification service serves at once; more are closed at once."""

_WIRE_LENGTH = struct.Struct("i")
"""The body length after the digest in Horovod's ``Wire`` frame (native int, signed)."""


# ------------------------------------------------------------- sockets of a context


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


def own_tcp_sockets() -> set[int]:
    """Inodes of this process's TCP sockets.

    Each of this process's sockets is asked its own family and type. (Matching them
    against /proc/net/tcp instead read a table of every socket of the network
    namespace, TIME_WAIT included: Gloo's rendezvous opens an HTTP connection per key,
    so after a few ring formations on one machine the table held thousands of lines and
    a read took 0.2 s, twice per ``init``, inside the ring's stall.)
    """
    return {inode for inode, _ in tcp_sockets()}


def tcp_sockets(inodes: Iterable[int] | None = None) -> Iterator[tuple[int, socket.socket]]:
    """``(inode, socket)`` for this process's TCP sockets (of ``inodes``, if given),
    each a duplicate that is closed once the caller moves on."""
    fds = _socket_inodes()
    for inode in fds if inodes is None else inodes:
        fd = fds.get(inode)
        if fd is None:
            continue
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:  # closed meanwhile
            continue
        with sock:  # closes the duplicate only
            if sock.family in (socket.AF_INET, socket.AF_INET6) and (
                sock.type == socket.SOCK_STREAM
            ):
                yield inode, sock


def listening_sockets(inodes: Iterable[int]) -> dict[int, tuple[str, int]]:
    """``{inode: (host, port)}`` of those of ``inodes`` that are listening sockets."""
    found: dict[int, tuple[str, int]] = {}
    for inode, sock in tcp_sockets(inodes):
        with contextlib.suppress(OSError):
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                host, port = sock.getsockname()[:2]
                found[inode] = (host, port)
    return found


def _listening_ports(inodes: Iterable[int]) -> frozenset[int]:
    """Local ports of those of ``inodes`` that are listening sockets."""
    return frozenset(port for _, port in listening_sockets(inodes).values())


@dataclass(frozen=True)
class _Forming:
    """An ``init`` in progress: what was open when it began."""

    before: frozenset[int]
    """Inodes of the TCP sockets open then."""
    listening_ports: frozenset[int]
    """Ports listening then (the notification service): connections accepted on them
    are the driver's, not Gloo's."""

    def gloo_sockets(self) -> set[int]:
        """Sockets the ``init`` opened for Gloo's pairs (listening, connecting or
        connected), leaving out connections to the rendezvous server: Horovod retries
        a failed store request on a new connection, and a rank request asked twice
        counts twice at the driver's barrier."""
        rendezvous = store_client.rendezvous_endpoint()
        found: set[int] = set()
        for inode, sock in tcp_sockets():
            if inode in self.before:
                continue
            try:
                if sock.getsockname()[1] in self.listening_ports:
                    continue
                peer_port = sock.getpeername()[1]
            except OSError:  # listening or still connecting: Gloo's
                peer_port = None
            if rendezvous is None or peer_port != rendezvous[1]:
                found.add(inode)
        return found


def shutdown_sockets(inodes: Iterable[int]) -> int:
    """Shut down these sockets (a listening or connecting one too: Linux then wakes
    whoever polls it with an error); how many were open."""
    fds = _socket_inodes()
    count = 0
    for inode in inodes:
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


# ------------------------------------------------------------------- the abort


class CollectiveAbort:
    """Knows the current Gloo context's sockets and ring, and judges abort messages.

    :param key: the job key messages must be signed with; None rejects every message.
    :param read_generation: returns the ring generation of the context just formed
        (None when it cannot be learned: then messages for that context are rejected).
    :param abort_contexts: fails every wait on the Gloo contexts that exist now
        (:func:`.horovod_internals.abort_collectives`); returns whether it could.

    Aborting the formed ring does two things. It shuts down the context's sockets, which
    fails every pair and the operations queued on them. And it has Gloo fail every wait
    of those contexts: a survivor's receive posted to another survivor that already left
    for the reset, or to any of several ranks, is queued on no pair whose socket fails;
    it waited out ``HOROVOD_GLOO_TIMEOUT_SECONDS`` about once in fifty hard kills.

    While an ``init`` is in progress (the ring forming), a message for a ring newer
    than the last one formed is for the ring being formed: a member died while it
    formed, and those still connecting to it, or listening for its connection, would
    wait out Gloo's connect timeout (five times ``HOROVOD_GLOO_TIMEOUT_SECONDS``). The
    abort then shuts down the sockets that ``init`` opened for Gloo's pairs.
    """

    def __init__(
        self,
        key: bytes | None,
        read_generation: Callable[[], int | None] = lambda: None,
        abort_contexts: Callable[[], bool] = lambda: False,
    ) -> None:
        self._key = key
        self._read_generation = read_generation
        self._abort_contexts = abort_contexts
        self._lock = threading.Lock()
        self._context_sockets: set[int] = set()
        self._generation: int | None = None
        self._forming: _Forming | None = None
        self._reaping: _Forming | None = None
        self._last_sequence = -1
        self.rejected = 0
        """Messages rejected so far (forged, replayed, stale, malformed)."""

    def track_init(self, init: Callable[..., Any]) -> Callable[..., Any]:
        """Wrap Horovod's ``init`` (with its retries) so each new context's sockets and
        ring are known."""

        def tracked_init(*args: Any, **kwargs: Any) -> Any:
            before = own_tcp_sockets()
            result = init(*args, **kwargs)
            self.context_formed(own_tcp_sockets() - before, self._read_generation())
            return result

        tracked_init.__wrapped__ = init  # type: ignore[attr-defined]  # as functools.wraps
        return tracked_init

    def track_attempt(self, init: Callable[..., Any]) -> Callable[..., Any]:
        """Wrap one attempt of Horovod's ``init`` (a ring being formed): what it opens
        for Gloo can be aborted, until it returns or fails."""

        def attempt(*args: Any, **kwargs: Any) -> Any:
            before = own_tcp_sockets()
            with self._lock:
                self._forming = _Forming(frozenset(before), _listening_ports(before))
            try:
                return init(*args, **kwargs)
            finally:
                with self._lock:
                    self._forming = None

        attempt.__wrapped__ = init  # type: ignore[attr-defined]  # as functools.wraps
        return attempt

    def context_formed(self, sockets: Iterable[int], generation: int | None) -> None:
        """A new context: these sockets are Gloo's, and it belongs to ``generation``."""
        with self._lock:
            self._context_sockets = set(sockets)
            self._generation = generation

    def check(self, request: object) -> str | None:
        """Why ``request`` must be rejected, or None to accept it (and remember it)."""
        if not isinstance(request, PeerFailedRequest):
            return "not a peer-failure message"
        if self._key is None:
            return "this worker has no job key"
        if not request.verify(self._key):
            return "bad signature"
        with self._lock:
            if request.sequence <= self._last_sequence:
                return f"replayed (sequence {request.sequence})"
            formed = self._generation is not None and request.generation == self._generation
            forming = self._forming is not None and request.generation > (self._generation or 0)
            if not (formed or forming):
                return f"for ring {request.generation}, this worker is in ring {self._generation}"
            self._last_sequence = request.sequence
        return None

    def abort(self, generation: int | None = None) -> int:
        """Shut down the current context's sockets, and abort the ring being formed
        when ``generation`` (the dead member's ring) is newer than the last one formed;
        returns how many were open."""
        with self._lock:
            targets, self._context_sockets = self._context_sockets, set()
            newer = generation is not None and generation > (self._generation or 0)
            if not newer and self._forming is None:
                # Under the lock: an init attempt (which marks itself forming under it
                # first) makes its contexts after this, and they are not aborted. While
                # one forms, the ring this message is for has been shut down already.
                self._abort_contexts()
        return shutdown_sockets(targets) + (self.abort_formation() if newer else 0)

    def abort_formation(self) -> int:
        """Make the ring being formed (if an ``init`` attempt is in progress) fail: shut
        down the sockets it opened for Gloo's pairs, and go on shutting down those it
        opens next until the attempt ends (Gloo forms three contexts one after another,
        six with a stock Horovod build: one formed after the abort would leave its ring
        half-formed, its members waiting on each other until Gloo's timeout). How many
        were open at first."""
        with self._lock:
            forming = self._forming
            if forming is None:
                return 0
            reaping, self._reaping = self._reaping, forming
        count = shutdown_sockets(forming.gloo_sockets())
        if reaping is not forming:
            threading.Thread(
                target=self._reap, args=(forming,), name="spotring-abort-formation", daemon=True
            ).start()
        return count

    def _reap(self, forming: _Forming) -> None:
        deadline = time.monotonic() + REAP_SECONDS
        while time.monotonic() < deadline:
            with self._lock:
                if self._forming is not forming:
                    return
            shutdown_sockets(forming.gloo_sockets())
            time.sleep(REAP_EVERY_SECONDS)

    def handle(self, request: object) -> bool:
        """Abort the collective if ``request`` is a valid, fresh message. True if so."""
        reason = self.check(request)
        if reason is not None:
            self.rejected += 1
            log.warning("spotring: rejected a peer-failure message: %s", reason)
            return False
        count = self.abort(getattr(request, "generation", None))
        if count:  # zero when this worker's own collective had already failed
            log.warning(
                "spotring: peer %s died: shut down %d sockets of the collective to fail fast",
                getattr(request, "failed", "?"),
                count,
            )
        return True


# ------------------------------------------------------------ installing it


_guard: CollectiveAbort | None = None
_guard_lock = threading.Lock()
_job_key: bytes | None = None
_job_key_lock = threading.Lock()


def take_job_key() -> bytes | None:
    """The job key, read once from the pipe named in :data:`JOB_KEY_FD_ENV` (then
    closed, so the script's children never inherit it) and remembered; None if there
    is none.

    spotring's ``sitecustomize`` calls this at the worker's start, before the script
    runs. A key in the environment itself (:data:`JOB_KEY_ENV`) is dropped unread:
    the process's environment block keeps it readable whatever ``os.environ`` says.
    """
    global _job_key
    with _job_key_lock:
        os.environ.pop(JOB_KEY_ENV, None)  # so at least the script's children lack it
        fd_text = os.environ.pop(JOB_KEY_FD_ENV, "")
        if fd_text.isdigit():
            _job_key = _read_key_pipe(int(fd_text))
        return _job_key


def _read_key_pipe(fd: int) -> bytes | None:
    """The hex key in pipe ``fd`` (written whole, its write end closed, before this
    process started), as bytes; closes ``fd``. None for anything else."""
    try:
        if not stat.S_ISFIFO(os.fstat(fd).st_mode):
            return None  # not the supervisor's pipe: not ours to read or close
    except OSError:
        return None
    text = bytearray()
    try:
        os.set_blocking(fd, False)  # a write end still open somewhere must not hang us
        while len(text) <= MAX_JOB_KEY_HEX and (chunk := os.read(fd, MAX_JOB_KEY_HEX + 1)):
            text += chunk
    except OSError:  # BlockingIOError: the pipe is drained
        pass
    finally:
        os.close(fd)
    if not 0 < len(text) <= MAX_JOB_KEY_HEX:
        return None  # never an empty key: anyone could sign under it
    try:
        return bytes.fromhex(text.decode("ascii"))
    except ValueError:
        return None


def read_generation_key(key: str, timeout: float = RING_READ_TIMEOUT_SECONDS) -> int | None:
    """A ring generation the driver published on its rendezvous server under ``key``
    (:data:`RING_KEY`: the current ring; :data:`ABANDONED_KEY`: the current ring, once
    a member of it died while it formed); None when it is not there.

    A plain GET whose answer must be ASCII digits: nothing read over the network is
    unpickled, so whoever can reach the server cannot run code in the worker. Raises
    ``OSError`` (or ``ValueError`` for a malformed answer) when it cannot be read.
    """
    endpoint = store_client.rendezvous_endpoint()
    if endpoint is None:
        raise ValueError("no rendezvous server in the environment")
    return store_client.read_published_generation(endpoint, key, timeout)


def _read_ring_generation() -> int | None:
    """The current ring's generation; None (no fast abort) when it cannot be learned."""
    try:
        generation = read_generation_key(RING_KEY)
    except Exception as error:  # no driver of ours, or it is gone: no aborts
        log.warning("spotring: cannot learn the ring generation (%s); no fast abort", error)
        return None
    if generation is None:
        log.warning("spotring: the driver published no ring generation; no fast abort")
    return generation


def _abandoned_key() -> str:
    """The key that says whether the ring this worker's slot forms was abandoned: the
    slot's own, so that a member already waiting for the next ring is not told about
    the last one (it would abort the next one's formation); the ring's where Horovod
    did not name the slot."""
    host, local_rank = os.environ.get(HOSTNAME_ENV), os.environ.get(LOCAL_RANK_ENV)
    if not host or not local_rank:
        return ABANDONED_KEY
    return f"{ABANDONED_SLOT_PREFIX}{host}:{local_rank}"


def _unregistered() -> bool:
    """Whether the driver cannot message this worker yet: Horovod starts the worker's
    notification service (and registers it) in ``hvd.elastic.run``, after the
    script's first ``hvd.init``."""
    return not horovod_internals.has_notification_service()


parse_ring_generation = parse_ring
"""The generation in ``body`` (ASCII digits only), or None."""


def install() -> CollectiveAbort:
    """Install the abort in this worker process, once; returns it.

    Wraps every name under which Horovod's torch ``init`` is reached (``hvd.init``, the
    elastic reset's ``init``, ``mpi_ops.init``): to learn each context's sockets, and
    to join the next ring when one fails to form (:mod:`.ring_formation`). Patches
    the notification service's request handler, and hardens the service against junk
    connections. Call it after ``horovod.torch`` is imported and before ``hvd.init()``.
    """
    global _guard
    with _guard_lock:
        if _guard is not None:
            return _guard
        import horovod.torch.mpi_ops as mpi_ops

        job_key = take_job_key()
        guard = CollectiveAbort(job_key, _read_ring_generation, horovod_internals.abort_collectives)
        sign_store_writes(job_key)
        formation = watch_abandoned_formation(
            retry_failed_formation(guard.track_attempt(mpi_ops.init), mpi_ops.shutdown),
            guard.abort_formation,
            lambda: read_generation_key(_abandoned_key(), timeout=WATCH_READ_TIMEOUT_SECONDS),
            _unregistered,
        )
        horovod_internals.replace_torch_init(guard.track_init(formation))

        patch_notification_service(lambda service: guard)
        harden_notification_service()
        _guard = guard
        return guard


def sign_store_writes(job_key: bytes | None) -> None:
    """Sign this worker's writes to the driver's rendezvous server with ``job_key``,
    which the server requires of every one (:mod:`spotring.worker_image.wire`): hand the key to
    spotring's Horovod build, which signs Gloo's and the rank request, and send the
    notification service's registration signed. Without a key (a worker not started
    by spotring's driver) nothing is signed, as with Horovod's own server."""
    if job_key is None:
        return
    if not horovod_internals.set_store_key(job_key):
        print(
            "spotring: this Horovod build cannot sign its rendezvous requests "
            "(horovod-rendezvous.patch missing): the driver will refuse them",
            file=sys.stderr,
        )
    horovod_internals.replace_registration_put(store_client.signed_registration(job_key))


def patch_notification_service(guard_for: Callable[[Any], CollectiveAbort]) -> None:
    """Make Horovod's worker notification service hand :class:`PeerFailedRequest`s to
    ``guard_for(service)`` before anything else; other requests go on as before."""
    handle_request = horovod_internals.notification_handle()

    def _handle(service: Any, request: Any, client_address: Any) -> Any:
        if isinstance(request, PeerFailedRequest):
            guard_for(service).handle(request)
            # The same answer either way: no oracle.
            return horovod_internals.ack_response()
        return handle_request(service, request, client_address)

    horovod_internals.replace_notification_handle(_handle)


class _ThrottledLog:
    """Warnings on this module's logger, at most ``lines`` per ``window`` seconds; the
    rest are counted and the count joins the next line logged."""

    def __init__(self, lines: int, window: float = 60.0) -> None:
        self._lines, self._window = lines, window
        self._lock = threading.Lock()
        self._times: list[float] = []
        self._suppressed = 0

    def warning(self, message: str, *args: object) -> None:
        now = time.monotonic()
        with self._lock:
            self._times = [t for t in self._times if now - t < self._window]
            if len(self._times) >= self._lines:
                self._suppressed += 1
                return
            self._times.append(now)
            suppressed, self._suppressed = self._suppressed, 0
        if suppressed:
            message += f" (and {suppressed} more like it, not logged)"
        log.warning(message, *args)


def read_bounded_frame(rfile: Any, digest_bytes: int) -> io.BytesIO:
    """One frame of Horovod's ``Wire`` (digest, signed 4-byte length, body) from
    ``rfile``, refused from its header when the length is negative (Horovod would read
    to the end of the stream) or over :data:`MAX_NOTIFICATION_BYTES`. Returns the
    whole frame, for Horovod's own reader to check and decode."""
    header = rfile.read(digest_bytes + _WIRE_LENGTH.size)
    if len(header) < digest_bytes + _WIRE_LENGTH.size:
        raise ValueError(f"a short header ({len(header)} bytes)")
    (length,) = _WIRE_LENGTH.unpack_from(header, digest_bytes)
    if not 0 <= length <= MAX_NOTIFICATION_BYTES:
        raise ValueError(
            f"a message of {length} bytes announced (at most {MAX_NOTIFICATION_BYTES})"
        )
    body = rfile.read(length)
    if len(body) < length:
        raise ValueError(f"the message ended after {len(body)} of {length} bytes")
    return io.BytesIO(header + body)


def harden_notification_service() -> None:
    """Bound Horovod's worker notification service, which anyone who reaches the
    worker can connect to. Once; before the service is created.

    * At most :data:`MAX_NOTIFICATION_CONNECTIONS` connections at once: more are closed
      at once, with one warning line a minute (Horovod starts a thread per connection
      and waits for every one of them when it exits).
    * A message is read only after its header announced 0 to
      :data:`MAX_NOTIFICATION_BYTES` bytes (Horovod would buffer up to 2 GiB, or read
      to the end of the stream for a negative length).
    * A connection is cut off after :data:`NOTIFICATION_DEADLINE_SECONDS`: its thread
      is not a daemon, so a client that never finishes would keep the worker alive.
    * A refused message (too long, short, malformed, a bad digest) costs one warning
      line on the worker's stderr (at most 30 a minute), never a traceback.
    """
    from horovod.runner.common.util import secret

    make_handler = horovod_internals.notification_handler_factory()
    if getattr(make_handler, "spotring_hardened", False):
        return

    def _make_handler(service: Any) -> Any:
        # Per service: one per worker process.
        slots = threading.BoundedSemaphore(MAX_NOTIFICATION_CONNECTIONS)
        over_limit, refused = _ThrottledLog(1), _ThrottledLog(30)

        class HardenedHandler(make_handler(service)):  # type: ignore[misc]  # Horovod's handler class, made at run time
            rfile: io.BufferedIOBase

            def setup(self) -> None:
                super().setup()
                self.admitted = slots.acquire(blocking=False)
                if not self.admitted:
                    over_limit.warning(
                        "spotring: the notification service closed a connection from %s: "
                        "%d are open already",
                        self.client_address[0],
                        MAX_NOTIFICATION_CONNECTIONS,
                    )
                    return
                self.socket_rfile = self.rfile
                self.deadline = threading.Timer(NOTIFICATION_DEADLINE_SECONDS, self.cut_off)
                self.deadline.daemon = True
                try:
                    self.deadline.start()
                except BaseException:
                    slots.release()
                    raise

            def cut_off(self) -> None:
                with contextlib.suppress(OSError):  # wakes a blocked read
                    self.connection.shutdown(socket.SHUT_RDWR)

            def handle(self) -> None:
                if not self.admitted:
                    return  # closed by the server as soon as this returns
                try:
                    self.rfile = read_bounded_frame(self.socket_rfile, secret.DIGEST_LENGTH)
                    super().handle()
                except Exception as error:
                    refused.warning(
                        "spotring: the notification service refused a message from %s: %s",
                        self.client_address[0],
                        " ".join(str(error).split())[:200] or type(error).__name__,
                    )

            def finish(self) -> None:
                try:
                    super().finish()  # sends the answer: still under the deadline
                finally:
                    if self.admitted:
                        self.deadline.cancel()
                        self.socket_rfile.close()  # the socket closes only with its files
                        slots.release()

        return HardenedHandler

    _make_handler.spotring_hardened = True  # type: ignore[attr-defined]  # a marker on the patch
    horovod_internals.replace_notification_handler_factory(_make_handler)


def install_when_imported() -> None:
    """Install the abort (and the samplers' re-partitioning on every reset, see
    :mod:`spotring.worker_image.sampler_reset`) as soon as the user's script imports
    ``horovod.torch``."""

    def on_import(_module: ModuleType) -> None:
        # Never break the user's import over these.
        try:
            install()
        except Exception as error:
            print(f"spotring: fast peer-failure abort not installed: {error}", file=sys.stderr)
        try:
            sampler_reset.install()
        except Exception as error:
            print(f"spotring: sampler re-partitioning not installed: {error}", file=sys.stderr)

    call_after_import("horovod.torch", on_import)
