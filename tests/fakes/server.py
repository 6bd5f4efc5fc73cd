"""What the fake cloud APIs (tests/fakes/gcp.py, tests/fakes/azure.py) share.

- :class:`KeepAliveHandler`: an HTTP/1.1 keep-alive handler with Nagle's algorithm off
  (the fault proxy's too).
- :class:`JsonHandler`: every method to one ``serve``, the request body read (JSON, a
  form or text), JSON answers, and an injected fault applied to a request.
- :class:`Fault` and :class:`FakeServer`'s fault injection: ``fail_next`` (the next
  requests that match), ``fail_rate`` (each request with a probability, from a seeded
  RNG), ``clear_faults``; a fault is ``error`` (the cloud's own error answer), ``drop``
  (close the connection without an answer) or ``hang`` (sleep, then answer normally).
- :class:`FakeServer`'s request log: ``requests``, ``calls(api)``, ``clear_requests``.
- :class:`FakeServer`'s permissions: ``deny``/``allow`` fill ``denied``, the permissions
  (the fake's ``PERMISSIONS`` values) whose calls answer 403.

Each fake keeps its own request record (the fields its cloud's requests have), error
bodies, routes and what a fault's ``match`` is matched against.
"""

from __future__ import annotations

import contextlib
import json
import random
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar
from urllib.parse import parse_qs

from spotring.providers.loopback_http import LoopbackHandler, LoopbackHTTPServer

FAULT_KINDS = ("error", "drop", "hang")


class KeepAliveHandler(LoopbackHandler):
    """HTTP/1.1 (keep-alive), answers without Nagle's delay; quiet (tests read the log)."""

    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        # Headers and body go out in two writes: without this, Nagle's algorithm and the
        # client's delayed ACK add 40 ms to every keep-alive response.
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def drop_connection(self) -> None:
        """Close the connection without an answer (a ``drop`` fault)."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)


class JsonHandler(KeepAliveHandler):
    """A JSON API's handler: GET, POST, PATCH, PUT and DELETE all go to :meth:`serve`."""

    content_type = "application/json; charset=utf-8"

    def serve(self) -> None:
        raise NotImplementedError

    def do_GET(self) -> None:
        self.serve()

    def do_POST(self) -> None:
        self.serve()

    def do_PATCH(self) -> None:
        self.serve()

    def do_PUT(self) -> None:
        self.serve()

    def do_DELETE(self) -> None:
        self.serve()

    def read_body(self) -> Any:
        """The body: None when empty, JSON when it parses (curl -d sends JSON as
        form-encoded), a form's fields, else the text."""
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            pass
        if self.headers.get("Content-Type", "").startswith("application/x-www-form-urlencoded"):
            return {k: v[0] for k, v in parse_qs(raw.decode()).items()}
        return raw.decode(errors="replace")

    def extra_headers(self) -> dict[str, str]:
        """Headers the cloud adds to every answer."""
        return {}

    def send_json(self, status: int, body: Any, headers: dict[str, str] | None = None) -> None:
        """Answer ``body`` as JSON (None: no body)."""
        data = b"" if body is None else json.dumps(body).encode()
        self.send_response(status)
        if body is not None:
            self.send_header("Content-Type", self.content_type)
        self.send_header("Content-Length", str(len(data)))
        for name, value in {**self.extra_headers(), **(headers or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.wfile.write(data)  # the client may have given up (a hang fault)

    def apply_fault(
        self,
        record: Any,
        fault: Fault | None,
        error: Callable[[Fault], tuple[int, Any, dict[str, str]]],
    ) -> bool:
        """Apply ``fault`` to the request ``record`` stands for; True when that answered it
        (a drop, or ``error(fault)``'s status, body and headers), False when the request is
        to be served (no fault, or after a hang)."""
        if fault is None:
            return False
        record.fault = fault.kind
        if fault.kind == "drop":
            self.drop_connection()
            return True
        if fault.kind == "hang":
            time.sleep(fault.seconds)
            return False
        status, body, headers = error(fault)
        record.status = status
        self.send_json(status, body, headers)
        return True


@dataclass
class Fault:
    """An injected fault: ``error`` (an HTTP error in the cloud's own body), ``drop`` or
    ``hang``."""

    kind: str = "error"
    status: int = 503
    match: str | None = None  # None: any request; else see matches
    seconds: float = 30.0  # for hang

    def matches(self, path: str, api: str | None = None) -> bool:
        """Whether this fault applies to a request for ``path``: ``match`` is a substring
        of the path or (when the fake names it) the request's API name."""
        return self.match is None or self.match == api or self.match in path


class _Record(Protocol):
    api: str | None


R = TypeVar("R", bound=_Record)


class FakeServer(LoopbackHTTPServer, Generic[R]):
    """A fake cloud API served on loopback, with permissions, fault injection and a
    request log.

    Everything here runs under ``self._lock`` (an RLock the fake's own state shares).
    ``fault_type`` is the fake's :class:`Fault` (a subclass may add fields, which
    ``fail_next``/``fail_rate`` take as keywords).
    """

    fault_type: ClassVar[type[Fault]] = Fault

    def __init__(self, *, seed: int | None) -> None:
        self._lock = threading.RLock()
        self.denied: set[str] = set()
        self._fault_rng = random.Random(seed)
        self._faults: list[Fault] = []
        self._fault_rate = 0.0
        self._fault_rate_kinds: list[Fault] = []
        self._requests: list[R] = []

    # ------------------------------------------------------------------ permissions

    def deny(self, *permissions: str) -> None:
        """Calls needing any of ``permissions`` (see the fake's PERMISSIONS) answer 403
        from now on."""
        with self._lock:
            self.denied.update(permissions)

    def allow(self, *permissions: str) -> None:
        """Undo ``deny`` (all of them when none are named)."""
        with self._lock:
            if permissions:
                self.denied.difference_update(permissions)
            else:
                self.denied.clear()

    # ------------------------------------------------------------------ faults

    def fail_next(
        self,
        count: int = 1,
        status: int = 503,
        *,
        match: str | None = None,
        kind: str = "error",
        seconds: float = 30.0,
        **fields: Any,
    ) -> None:
        """The next ``count`` requests matching ``match`` (None: any) fail.

        ``kind``: ``error`` (answer ``status`` with the cloud's error body), ``drop`` (close
        the connection without answering) or ``hang`` (sleep ``seconds``, then answer
        normally). ``fields``: the fake's further Fault fields.
        """
        if kind not in FAULT_KINDS:
            raise ValueError(f"unknown fault kind {kind!r}")
        with self._lock:
            self._faults.extend(
                self.fault_type(kind, status, match, seconds, **fields) for _ in range(count)
            )

    def fail_rate(
        self,
        p: float,
        kinds: Iterable[str | int] = (503,),
        *,
        seed: int | None = None,
        match: str | None = None,
        seconds: float = 30.0,
        **fields: Any,
    ) -> None:
        """Each request fails with probability ``p``, with a kind drawn from ``kinds``.

        A kind is an HTTP status (answered as an error), ``"drop"`` or ``"hang"``.
        """
        with self._lock:
            self._fault_rate = p
            if seed is not None:
                self._fault_rng = random.Random(seed)
            self._fault_rate_kinds = [
                self.fault_type("error", k, match, seconds, **fields)
                if isinstance(k, int)
                else self.fault_type(k, 503, match, seconds, **fields)
                for k in kinds
            ]

    def clear_faults(self) -> None:
        """No more injected faults."""
        with self._lock:
            self._faults.clear()
            self._fault_rate = 0.0

    def _take_fault(self, path: str, api: str | None = None) -> Fault | None:
        with self._lock:
            for i, fault in enumerate(self._faults):
                if fault.matches(path, api):
                    return self._faults.pop(i)
            if self._fault_rate and self._fault_rng.random() < self._fault_rate:
                fault = self._fault_rng.choice(self._fault_rate_kinds)
                if fault.matches(path, api):
                    return fault
        return None

    # ------------------------------------------------------------------ request log

    def _record(self, record: R) -> None:
        with self._lock:
            self._requests.append(record)

    @property
    def requests(self) -> list[R]:
        """Every request logged so far, oldest first."""
        with self._lock:
            return list(self._requests)

    def calls(self, api: str) -> list[R]:
        """Logged requests of one API method (the fake's name for it)."""
        return [r for r in self.requests if r.api == api]

    def clear_requests(self) -> None:
        """Forget the request log."""
        with self._lock:
            self._requests.clear()
