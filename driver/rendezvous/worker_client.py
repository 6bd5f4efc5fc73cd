"""The driver's client for a registered worker's notification service: Horovod's,
unpickling nothing but Horovod's answers, and bounded in time and in probes."""

from __future__ import annotations

import logging
import queue
import socket
import struct
import threading
import time
from typing import Any

from horovod.runner.common.util import secret
from horovod.runner.common.util.network import Wire
from horovod.runner.elastic.worker import WorkerNotificationClient

from spotring.driver import horovod_internals
from spotring.driver.rendezvous.limits import (
    ANSWER_TIMEOUT_SECONDS,
    MAX_ANSWER_BYTES,
    MAX_CONCURRENT_PROBES,
    PROBE_WAIT_SECONDS,
)
from spotring.driver.rendezvous.pickles import ANSWER_CLASSES, ANSWER_OPCODES, load_restricted
from spotring.driver.rendezvous.refusal import HostileInput

log = logging.getLogger(__name__)


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
        return load_restricted(message, ANSWER_OPCODES, ANSWER_CLASSES)


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


def register_safe_worker_client(
    driver: Any,
    host: str,
    slot: int,
    addresses: dict[str, list[tuple[str, int]]],
    secret_key: bytes,
    probes: threading.BoundedSemaphore,
) -> None:
    """Horovod's ``register_worker_server``, with :class:`SafeWorkerNotificationClient`
    (its address probes bounded by ``probes``, shared by every client of ``driver``)."""
    verbose = horovod_internals.driver_verbose(driver)
    client = SafeWorkerNotificationClient(addresses, secret_key, verbose, probes)
    horovod_internals.set_worker_client(driver, host, slot, client)


def use_safe_worker_clients(driver: Any, max_probes: int = MAX_CONCURRENT_PROBES) -> None:
    """Make a driver that is not spotring's own (a stub, in tests) register workers as
    :class:`~spotring.driver.horovod_driver.SpotringElasticDriver` does: through
    :func:`register_safe_worker_client`, probing at most ``max_probes`` addresses at
    once. Call it before the rendezvous server starts."""
    probes = threading.BoundedSemaphore(max_probes)

    def register_worker_server(
        host: str, slot: int, addresses: dict[str, list[tuple[str, int]]], secret_key: bytes
    ) -> None:
        register_safe_worker_client(driver, host, slot, addresses, secret_key, probes)

    driver.register_worker_server = register_worker_server
