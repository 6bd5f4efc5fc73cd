"""A worker's side of the driver's coordinator (``spotring run --backend torch --in-place``).

:class:`DriverCoordinator` is :class:`~spotring.torch.coordinator.Coordinator` over the
driver's HTTP server (:mod:`spotring.driver.torch_group_server`), and
:class:`GroupStore` the ``torch.distributed`` store a generation's process group forms
through there. Every request is signed under the job key, stamped with the time
(:func:`spotring.worker_image.wire.sign_torch_request`); the key comes from the
supervisor's pipe, never the environment. Every request has a timeout, every wait is
the server's bounded one asked again.
"""

from __future__ import annotations

import contextlib
import http.client
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Mapping
from datetime import timedelta

import torch.distributed as dist

from spotring.torch.coordinator import STORE_TIMEOUT, Membership
from spotring.worker_image import wire

__all__ = ["DriverCoordinator", "GenerationGone", "GroupStore", "coordinator_from_env"]

ANSWER_SLACK_SECONDS = 10.0
"""How much longer than the server may hold an answer the client waits for it."""
RETRY_SECONDS = 30.0
"""How long a request is retried (with backoff) while the driver cannot be reached."""
MAX_ANSWER_BYTES = 2 << 20
WAIT_MS = wire.TORCH_MAX_WAIT_MS


class GenerationGone(RuntimeError):
    """The generation this store belongs to was given up (a member died or hangs, or a
    newer one replaced it): its group can never form or finish."""


class DriverClient:
    """Signed requests to the coordinator, one kept-alive connection per thread."""

    def __init__(self, host: str, port: int, job_key: bytes) -> None:
        self.host, self.port = host, port
        self._key = job_key
        self._local = threading.local()

    def request(
        self, method: str, path: str, body: bytes = b"", *, wait_ms: int = 0
    ) -> tuple[int, bytes]:
        """The answer's status and body. Retries a broken or refused connection for up
        to :data:`RETRY_SECONDS`; raises ``OSError`` after that."""
        if wait_ms:
            path = f"{path}?wait={wait_ms}"
        timeout = wait_ms / 1000 + ANSWER_SLACK_SECONDS
        deadline = time.monotonic() + RETRY_SECONDS
        delay = 0.05
        while True:
            connection = self._connection(timeout)
            try:
                return _exchange(connection, self._key, method, path, body)
            except (OSError, http.client.HTTPException) as error:
                connection.close()
                self._local.connection = None
                if time.monotonic() + delay > deadline:
                    raise OSError(f"the driver's coordinator did not answer: {error}") from error
                time.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        connection: http.client.HTTPConnection | None = getattr(self._local, "connection", None)
        if connection is None:
            connection = http.client.HTTPConnection(self.host, self.port, timeout=timeout)
            self._local.connection = connection
        connection.timeout = timeout
        if connection.sock is not None:
            connection.sock.settimeout(timeout)
        return connection


def _exchange(
    connection: http.client.HTTPConnection, key: bytes, method: str, path: str, body: bytes
) -> tuple[int, bytes]:
    signature = wire.sign_torch_request(key, method, path, body)
    connection.request(method, path, body=body, headers={wire.AUTH_HEADER: signature.header()})
    answer = connection.getresponse()
    data = answer.read(MAX_ANSWER_BYTES + 1)
    if answer.will_close:
        connection.close()
    return answer.status, data


class DriverCoordinator:
    """:class:`~spotring.torch.coordinator.Coordinator` served by the driver.

    :param host: the coordinator's host; ``port`` its port.
    :param worker: this worker's name (the driver's, from :data:`wire.TORCH_WORKER_ENV`).
    :param job_key: the job key.
    """

    def __init__(self, host: str, port: int, worker: str, job_key: bytes) -> None:
        self._client = DriverClient(host, port, job_key)
        self._key = job_key
        self._worker = urllib.parse.quote(worker, safe="")
        self._received = 0

    def latest(self) -> int:
        status, body = self._client.request("GET", f"{wire.TORCH_PREFIX}latest")
        if status == 404:
            return -1
        return int(_expect(status, body, "latest"))

    def next_membership(self, after: int) -> Membership:
        while True:
            path = f"{wire.TORCH_PREFIX}member/{self._worker}/{self._received}"
            status, body = self._client.request("GET", path, wait_ms=WAIT_MS)
            if status == 204:
                continue  # the server's wait ran out: ask again
            # The newest membership handed so far, with its index: a superseded one is
            # skipped, since its group may never form.
            index, _, text = _expect(status, body, "membership").decode().partition(" ")
            place = Membership.decode(text)
            self._received = int(index) + 1
            if place.generation > after:
                return place

    def flush_requested(self) -> bool:
        """Whether the driver asks rank 0 to make every commit durable before training
        on: every host of the group is leaving, nobody will carry the state on."""
        status, body = self._client.request("GET", f"{wire.TORCH_PREFIX}flush")
        if status == 404:
            return False
        _expect(status, body, "flush")
        return True

    def watch(self, generation: int) -> _DriverWatch:
        return _DriverWatch(self._client, self._key, generation)

    def group_store(self, membership: Membership) -> GroupStore:
        return GroupStore(self._client, membership.generation, membership.world_size)


class _DriverWatch:
    """:class:`~spotring.torch.coordinator.AbandonWatch`: waits on a connection of its
    own, which :meth:`close` shuts down to end the wait."""

    def __init__(self, client: DriverClient, key: bytes, generation: int) -> None:
        self._path = f"{wire.TORCH_PREFIX}abandoned/{generation}?wait={WAIT_MS}"
        self._connection = http.client.HTTPConnection(
            client.host, client.port, timeout=WAIT_MS / 1000 + ANSWER_SLACK_SECONDS
        )
        self._key = key
        self._closed = threading.Event()
        # Connected now, not at the first wait (in the watching thread): the connections
        # a group opens are those made after its watch was (inplace.ProcessGroup.abort).
        with contextlib.suppress(OSError):  # wait() connects again
            self._connection.connect()

    def wait(self) -> bool:
        failures = 0
        while not self._closed.is_set():
            try:
                status, body = _exchange(self._connection, self._key, "GET", self._path, b"")
            except (OSError, http.client.HTTPException):
                self._connection.close()
                if self._closed.is_set():
                    return False
                failures += 1
                if failures * 0.5 > RETRY_SECONDS:
                    raise
                time.sleep(0.5)
                continue
            failures = 0
            if status == 200:
                return not self._closed.is_set()
            if status != 204:
                raise RuntimeError(f"the coordinator answered {status}: {body[:200]!r}")
        return False

    def close(self) -> None:
        self._closed.set()
        sock = self._connection.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # the waiting read ends now


class GroupStore(dist.Store):
    """The c10d store of one generation's group, on the driver: what Gloo's rendezvous
    uses (``set``, ``wait``, ``get``, ``check``). A key's value, once read, is kept
    (it is final on the server), so ``wait`` then ``get`` costs one request."""

    def __init__(self, client: DriverClient, generation: int, size: int = 0) -> None:
        super().__init__()
        self._client = client
        self._prefix = f"{wire.TORCH_PREFIX}group/{generation}/"
        self._generation = generation
        self._size = size
        """The group's ranks: a multi-get of rank keys asks for every rank's at once."""
        self._values: dict[str, bytes] = {}
        self._timeout = STORE_TIMEOUT

    def set(self, key: str, value: bytes | str) -> None:
        data = value.encode() if isinstance(value, str) else bytes(value)
        status, body = self._client.request("PUT", self._path(key), data)
        if status == 410:
            raise GenerationGone(f"generation {self._generation} was given up")
        if status != 204:
            raise RuntimeError(f"the coordinator refused key {key!r}: {status} {body[:200]!r}")

    def get(self, key: str) -> bytes:
        self._wait_one(key, time.monotonic() + self._timeout.total_seconds())
        return self._values[key]

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        seconds = (timeout or self._timeout).total_seconds()
        deadline = time.monotonic() + seconds
        for key in keys:
            self._wait_one(key, deadline)

    def check(self, keys: list[str]) -> bool:
        return all(self._read(key, 0) for key in keys)

    def has_extended_api(self) -> bool:
        """Yes: with ``GLOO_ENABLE_STORE_V2_API=1`` Gloo reads its peers' addresses by
        :meth:`multi_get` (see :mod:`spotring.worker_image.wire`)."""
        return True

    def multi_get(self, keys: list[str]) -> list[bytes]:
        """The values of ``keys``, once all are there: one request (waited again)."""
        missing = _every_rank(
            [key for key in keys if key not in self._values], self._size, self._values
        )
        deadline = time.monotonic() + self._timeout.total_seconds()
        body = "\n".join(missing).encode()
        path = f"{wire.TORCH_PREFIX}multi/{self._generation}"
        while missing:
            wait_ms = int(min(max(deadline - time.monotonic(), 0), WAIT_MS / 1000) * 1000)
            status, answer = self._client.request("POST", path, body, wait_ms=wait_ms)
            if status == 410:
                raise GenerationGone(f"generation {self._generation} was given up")
            if status == 200:
                self._values.update(
                    zip(missing, wire.decode_values(answer, len(missing)), strict=True)
                )
                break
            if status != 204:
                raise RuntimeError(f"the coordinator answered {status}: {answer[:200]!r}")
            if time.monotonic() >= deadline:
                raise dist.DistStoreError(f"timed out waiting for {len(missing)} keys of the group")
        return [self._values[key] for key in keys]

    def multi_set(self, keys: list[str], values: list[bytes]) -> None:
        for key, value in zip(keys, values, strict=True):
            self.set(key, value)

    def set_timeout(self, timeout: timedelta) -> None:
        self._timeout = timeout

    def _wait_one(self, key: str, deadline: float) -> None:
        while not self._read(
            key, int(min(max(deadline - time.monotonic(), 0), WAIT_MS / 1000) * 1000)
        ):
            if time.monotonic() >= deadline:
                raise dist.DistStoreError(f"timed out waiting for key {key!r} of the group")

    def _read(self, key: str, wait_ms: int) -> bool:
        if key in self._values:
            return True
        status, body = self._client.request("GET", self._path(key), wait_ms=wait_ms)
        if status == 410:
            raise GenerationGone(f"generation {self._generation} was given up")
        if status == 204:
            return False
        self._values[key] = _expect(status, body, key)
        return True

    def _path(self, key: str) -> str:
        return self._prefix + urllib.parse.quote(key, safe="")


def _every_rank(keys: list[str], size: int, have: Mapping[str, bytes]) -> list[str]:
    """``keys``, widened to every rank's when they are rank keys (one prefix, then a
    rank below ``size``): Gloo's TCP transport asks for every rank's key, 128 at a
    time; asking for all in the first request makes a formation one multi-get per rank."""
    if not keys or size <= 0:
        return keys
    prefix = keys[0].rstrip("0123456789")
    ranks = [key[len(prefix) :] for key in keys]
    if not all(key.startswith(prefix) and r.isdigit() and int(r) < size
               for key, r in zip(keys, ranks, strict=True)):  # fmt: skip
        return keys
    every = [f"{prefix}{rank}" for rank in range(size)]
    return [key for key in every if key not in have]


def _expect(status: int, body: bytes, what: str) -> bytes:
    if status != 200:
        raise RuntimeError(f"the coordinator answered {status} for {what}: {body[:200]!r}")
    return body


_from_env: DriverCoordinator | None = None
_from_env_lock = threading.Lock()


def coordinator_from_env() -> DriverCoordinator:
    """The coordinator ``spotring run --backend torch --in-place`` gave this worker
    (one per process): where from :data:`wire.TORCH_COORDINATOR_ENV`, who from
    :data:`wire.TORCH_WORKER_ENV`, the job key from the supervisor's pipe. Raises
    ``RuntimeError`` outside such a job."""
    global _from_env
    with _from_env_lock:
        if _from_env is None:
            _from_env = _coordinator_from_env()
        return _from_env


def _coordinator_from_env() -> DriverCoordinator:
    from spotring.worker_image.peer_abort import take_job_key

    where = os.environ.get(wire.TORCH_COORDINATOR_ENV, "")
    worker = os.environ.get(wire.TORCH_WORKER_ENV, "")
    host, _, port = where.rpartition(":")
    key = take_job_key()
    if not (host and port.isdigit() and worker and key):
        raise RuntimeError(
            "not started by `spotring run --backend torch --in-place`: no coordinator "
            f"({wire.TORCH_COORDINATOR_ENV}, {wire.TORCH_WORKER_ENV} or the job key missing)"
        )
    return DriverCoordinator(host, int(port), worker, key)
