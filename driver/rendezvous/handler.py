"""The request handler: Horovod's rendezvous handler, refusing what its clients never
send and every write a worker of the job did not sign."""

from __future__ import annotations

import io
import logging
import re
import time
from typing import Any, Protocol

from horovod.runner.http.http_server import (
    RendezvousHandler,
)

from spotring.driver import horovod_internals
from spotring.driver.deadline_reader import DeadlineReader
from spotring.driver.rendezvous.limits import (
    MAX_BODY_BYTES,
    MAX_WORKER_ADDRESSES_BYTES,
    REQUEST_DEADLINE_SECONDS,
    charge,
    gloo_value_limit,
)
from spotring.driver.rendezvous.mesh import mesh_body_limit, mesh_request
from spotring.driver.rendezvous.pickles import decode_worker_addresses
from spotring.driver.rendezvous.refusal import HostileInput, printable
from spotring.driver.rendezvous.server import PARKED, StoreServer
from spotring.worker_image import wire
from spotring.worker_image.wire import (
    ABANDONED_SLOT_PREFIX,
    MESH_KEY_PREFIX,
    RANK_AND_SIZE_SCOPE,
    RING_SCOPE,
    WORKER_ADDRESSES_SCOPE,
)

log = logging.getLogger(__name__)


GET_RANK_AND_SIZE = RANK_AND_SIZE_SCOPE
PUT_WORKER_ADDRESSES = WORKER_ADDRESSES_SCOPE
READ_ONLY_SCOPES = frozenset({RING_SCOPE, GET_RANK_AND_SIZE, PUT_WORKER_ADDRESSES})

PROCESS_SET_SUFFIX = re.compile(r"_process_set_hash_[0-9a-f]{1,64}\Z")
_SLOT = re.compile(r"[0-9]{1,6}\Z")
_MESH_KEY = re.compile(re.escape(MESH_KEY_PREFIX) + r"(0|[1-9][0-9]{0,8})\Z")


class ElasticDriverCalls(Protocol):
    """What the handler calls on Horovod's ``ElasticDriver``."""

    def record_ready(self, host: str, slot: int) -> object: ...

    def get_slot_info(self, host: str, slot: int) -> Any: ...

    def register_worker_server(
        self, host: str, slot: int, addresses: dict[str, list[tuple[str, int]]], secret_key: bytes
    ) -> object: ...


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
    server: StoreServer
    rfile: io.BufferedIOBase

    def setup(self) -> None:
        super().setup()
        self.rfile.close()
        deadline = time.monotonic() + self.deadline_seconds
        reader = DeadlineReader(self.connection, deadline, float(self.timeout or 3))
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
            f"refused {printable(self.command or '?')} {printable(self.path or '?')} "
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
        self.server.warn(f"bad request from {self.client_address[0]}: {printable(format % args)}")

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
        base = PROCESS_SET_SUFFIX.sub("", scope)
        return base in self.server.scope_size

    def _gloo_limit(self, scope: str, key: str) -> int | None:
        """The largest value Gloo writes under ``/scope/key`` for the current ring;
        None when it writes nothing there."""
        size = self.server.scope_size.get(PROCESS_SET_SUFFIX.sub("", scope))
        return None if size is None else gloo_value_limit(size, key)

    # -- signed writes (see spotring.worker_image.wire)

    def _signature(self) -> wire.Signature | None:
        """The request's signature; None once the request was refused for having none
        (or a malformed one), before any of its body is read."""
        header = self.headers.get(wire.AUTH_HEADER)
        signature = wire.parse(header)
        if signature is None:
            self._refuse(401, "an unsigned write" if header is None else "a malformed signature")
        return signature

    def _admit(self, signature: wire.Signature, body: bytes) -> bool:
        """Whether the signed request, with ``body``, is the job's own (its MAC under
        the job key), for the current ring, and not taken before; refused otherwise."""
        key = self.server.job_key
        if not wire.verify(key, signature, self.command, self.path, body):
            self._refuse(403, "a signature that is not the job's")
            return False
        refusal = self.server.admit(signature)
        if refusal is not None:
            self._refuse(*refusal)
            return False
        return True

    def _signed_body(
        self, limit: int, room: int | None = None
    ) -> tuple[wire.Signature, bytes] | None:
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
        elif key.startswith(MESH_KEY_PREFIX):
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
        base = PROCESS_SET_SUFFIX.sub("", scope)
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
        if room is not None and charge(b"") + int(length) > room:
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
