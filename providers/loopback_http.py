"""A small HTTP server on loopback, served from a daemon thread.

What the local provider's metadata service (``providers/local/metadata.py``) and the test
servers (``tests/fakes/gcp.py``, ``tests/fakes/azure.py``, ``tests/fakes/fault_proxy.py``) share:
a ``ThreadingHTTPServer`` bound to 127.0.0.1 on a free port (or a given one), served on a
daemon thread, with ``start``/``stop``/``port``/``url`` and a context manager::

    class Service(LoopbackHTTPServer):
        handler_class = _Handler  # a LoopbackHandler; it reaches the Service as self.server.owner
        thread_name = "spotring-service"

    with Service() as service:
        urllib.request.urlopen(service.url + "/...")

Bounds: a request line or header line is at most 64 KiB and a request has at most 100
headers (``http.server``'s own limits); a handler reads a body only as it chooses.
``request_timeout`` (seconds, None: no limit) bounds each read and write on a connection.
Each connection has a daemon thread of its own, so ``stop`` never waits for a request in
progress.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, ClassVar, TypeVar

_S = TypeVar("_S", bound="LoopbackHTTPServer")

log = logging.getLogger(__name__)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # a request in progress (a hung one) must not hold up stop()

    def __init__(
        self,
        port: int,
        handler_class: type[BaseHTTPRequestHandler],
        owner: Any,
        request_timeout: float | None,
    ) -> None:
        super().__init__(("127.0.0.1", port), handler_class)
        self.owner = owner
        self.request_timeout = request_timeout

    def get_request(self) -> tuple[socket.socket, Any]:
        connection, address = super().get_request()
        if self.request_timeout is not None:
            connection.settimeout(self.request_timeout)
        return connection, address

    def handle_error(self, request: Any, client_address: Any) -> None:
        """One warning line, never socketserver's traceback on stderr (the driver relays
        stderr as the job's output); a client that went away is no error at all."""
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError)):
            return
        log.warning(
            "%s: a request from %s failed: %s",
            type(self.owner).__name__,
            client_address[0] if client_address else "?",
            " ".join(str(error).split())[:200] or type(error).__name__,
        )


class LoopbackHandler(BaseHTTPRequestHandler):
    """A request handler of a :class:`LoopbackHTTPServer`: quiet (a server that wants a
    log keeps its own); ``self.server.owner`` is the server object that started it."""

    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        pass


class LoopbackHTTPServer:
    """An HTTP server on 127.0.0.1, served on a daemon thread (see the module docstring).

    A subclass sets ``handler_class`` (its handlers reach the subclass's instance as
    ``self.server.owner``) and may set ``thread_name`` and ``request_timeout``.
    """

    handler_class: ClassVar[type[LoopbackHandler]]
    thread_name: ClassVar[str] = "spotring-loopback"
    request_timeout: ClassVar[float | None] = None
    """Seconds each read or write on a connection may take; None: no limit."""

    _server: _Server | None = None

    def start(self: _S, port: int = 0) -> _S:
        """Serve on 127.0.0.1:``port`` (0: a free one) on a daemon thread; returns self."""
        server = _Server(port, self.handler_class, self, self.request_timeout)
        self._server = server
        # A short poll interval keeps stop() (shutdown) fast.
        threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=self.thread_name,
            daemon=True,
        ).start()
        return self

    def stop(self) -> None:
        """Stop serving (at once: requests in progress are not waited for)."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self: _S) -> _S:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        """The port it serves on."""
        assert self._server is not None, "not started"
        return int(self._server.server_address[1])

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``."""
        return f"http://127.0.0.1:{self.port}"
