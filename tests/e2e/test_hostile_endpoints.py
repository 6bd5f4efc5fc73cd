"""Hostile input to every endpoint the job listens on (issue #13).

Random methods, paths, headers and bodies, pickles that would run code, forged
messages: each is refused without effect, and the server keeps answering its workers.
The tests drive, in turn: the driver's rendezvous server alone (with a stub of
Horovod's elastic driver), the driver's client for a registered worker address, the
worker's reading of the ring generation and its notification service; the last one
throws all of it at every port of a running local job.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import logging
import os
import pickle
import random
import re
import socket
import socketserver
import struct
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import cloudpickle
import psutil
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from spotring.driver import rendezvous
from spotring.driver.rendezvous import (
    MAX_BODY_BYTES,
    HostileInput,
    RingTracker,
    decode_worker_addresses,
    rendezvous_handler,
    use_safe_worker_clients,
    worker_client,
)
from spotring.driver.rendezvous import handler as rendezvous_handler_module
from spotring.worker_image import peer_abort
from tests.e2e.support import (
    assert_no_committed_step_lost,
    commits,
    job_output,
    read_events,
    running_job,
    wait_for_events,
    worker_pids,
)
from tests.fakes.store_signing import JOB_KEY, auth_line, is_write

MARKER = Path(f"/tmp/spotring-hostile-{os.getpid()}")
"""Created by any of the hostile pickles below, if anything ever loads one."""

PLAN_HOSTS = ("host-0", "host-1")


class _Touch:
    """Pickles to a call that creates :data:`MARKER`."""

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (MARKER,))


class _System:
    def __reduce__(self) -> tuple[Any, ...]:
        return (os.system, (f"touch {MARKER}",))


def hostile_pickles() -> list[bytes]:
    """Pickles that would create the marker file (or worse) when loaded."""
    key = bytes(32)
    shapes: list[object] = [
        _Touch(),
        _System(),
        ({"lo": [("127.0.0.1", 1)]}, _Touch()),  # the right shape around a call
        ({"lo": [(_System(), 1)]}, key),
        ({"lo": [("127.0.0.1", 1)], _Touch(): []}, key),
        (lambda: MARKER.touch(), key),
    ]
    found = []
    for shape in shapes:
        found.append(cloudpickle.dumps(shape))
        for protocol in (0, 2, 5):
            try:
                found.append(pickle.dumps(shape, protocol=protocol))
            except (pickle.PicklingError, AttributeError, TypeError):
                continue
    # A memo index that would make the unpickler allocate gigabytes.
    found.append(b"\x80\x05)r\xff\xff\xff\x7f.")
    found.append(b"(\x8c\x02lo]p99999999999\n.")
    return found


HOSTILE_PICKLES = hostile_pickles()


class StubDriver:
    """What the rendezvous handler calls on Horovod's ElasticDriver, recorded."""

    def __init__(self) -> None:
        self.ready: list[tuple[str, int]] = []
        self.registered: list[tuple[str, int, dict[str, Any], bytes]] = []

    def record_ready(self, host: str, slot: int) -> None:
        self.ready.append((host, slot))

    def get_slot_info(self, host: str, slot: int) -> Any:
        from horovod.runner.common.util.hosts import SlotInfo

        rank = PLAN_HOSTS.index(host)
        return SlotInfo(host, rank, slot, rank, 2, 1, 2)

    def register_worker_server(
        self, host: str, slot: int, addresses: dict[str, Any], secret_key: bytes
    ) -> None:
        self.registered.append((host, slot, addresses, secret_key))


def plan() -> list[Any]:
    from horovod.runner.common.util.hosts import SlotInfo

    return [SlotInfo(host, rank, 0, rank, 2, 1, 2) for rank, host in enumerate(PLAN_HOSTS)]


class Server:
    """A running hardened rendezvous server with a stub driver, and its state."""

    def __init__(self, deadline: float | None = None) -> None:
        self.driver = StubDriver()
        handler = rendezvous_handler(self.driver)
        if deadline is not None:
            handler.deadline_seconds = deadline
        self.tracker = RingTracker()
        self.port = self.tracker.start(handler, "127.0.0.1", job_key=JOB_KEY)
        self.tracker.init(plan())
        self.httpd = self.tracker._httpd

    def state(self) -> Any:
        with self.httpd.cache_lock:
            return copy.deepcopy(
                (
                    self.httpd.cache,
                    dict(self.httpd.finished_list),
                    self.httpd.scope_size,
                    self.httpd.planned_slots,
                    self.httpd.store_bytes,
                )
            )

    def send(self, raw: bytes, timeout: float = 5.0) -> bytes:
        """Send ``raw`` on a fresh connection, end it, and return whatever comes back."""
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as sock:
            try:
                sock.sendall(raw)
                sock.shutdown(socket.SHUT_WR)
            except OSError:  # refused before all was sent
                pass
            return receive_all(sock)

    def request(
        self, method: str, path: str, body: bytes | None = None, sign: bool | None = None
    ) -> tuple[int, bytes]:
        """``method path`` with ``body``; signed as the job's workers sign it (by
        default: when it is a write) for the current ring."""
        head = f"{method} {path} HTTP/1.0\r\n".encode()
        if body is not None:
            head += f"Content-Length: {len(body)}\r\n".encode()
        if is_write(method, path) if sign is None else sign:
            head += auth_line(method, path, body or b"", self.tracker.generation)
        return parse_answer(self.send(head + b"\r\n" + (body or b"")))


def receive_all(sock: socket.socket) -> bytes:
    chunks = []
    try:
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    except OSError:  # reset: the server refused and closed before reading it all
        pass
    return b"".join(chunks)


def parse_answer(answer: bytes) -> tuple[int, bytes]:
    """(status, body) of an HTTP answer; (0, b"") for none."""
    if not answer:
        return 0, b""
    if not answer.startswith(b"HTTP/"):  # an error page to an HTTP/0.9-style request
        code = re.search(rb"Error code: (\d+)", answer)
        assert code is not None, answer[:200]
        return int(code[1]), answer
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), body


@pytest.fixture(scope="module")
def server() -> Iterator[Server]:
    running = Server()
    yield running
    running.tracker.stop()


@pytest.fixture(autouse=True)
def no_marker() -> Iterator[None]:
    MARKER.unlink(missing_ok=True)
    yield
    assert not MARKER.exists(), "a hostile pickle was loaded"


def assert_serving(server: Server) -> None:
    assert server.request("GET", "/spotring/ring") == (200, b"1")
    assert server.tracker._listen_thread.is_alive()


# ------------------------------------------------------------------ the legitimate path


def test_a_workers_registration_from_horovods_own_code_is_taken_and_not_stored(
    server: Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Horovod's worker registers its notification service unsigned: refused, nothing
    registered. spotring's workers send the same registration signed: taken, handed to
    the driver, and not stored."""
    import horovod.runner.elastic.worker as worker
    from horovod.runner.elastic.worker import WorkerNotificationManager

    from spotring.worker_image import horovod_internals, store_client

    def register() -> Any:
        manager = WorkerNotificationManager()
        try:
            manager.init(
                rendezvous_addr="127.0.0.1",
                rendezvous_port=server.port,
                nic="lo",
                hostname="host-1",
                local_rank=0,
            )
        finally:
            if manager._service is not None:
                manager._service.shutdown()
        return manager._service

    with pytest.raises(RuntimeError, match="Put data input KVStore server failed"):
        register()  # Horovod's own, unsigned
    assert server.driver.registered == []
    monkeypatch.setattr(worker, "put_data_into_kvstore", worker.put_data_into_kvstore)
    horovod_internals.replace_registration_put(store_client.signed_registration(JOB_KEY))
    service = register()
    host, slot, addresses, key = server.driver.registered.pop()
    assert (host, slot, addresses) == ("host-1", 0, service.addresses())
    assert key == service._wire._key
    assert "worker_addresses" not in server.httpd.cache
    assert server.request("GET", "/worker_addresses/host-1:0") == (404, b"")


def test_unsigned_rank_requests_and_registrations_change_nothing(server: Server) -> None:
    """Asking a slot's rank tells the driver the slot is ready (and a second ask
    abandons the ring it formed); a registration redirects the driver's messages for
    the slot. Neither is taken unsigned, signed with another key, or replayed."""
    body = base64.b64encode(cloudpickle.dumps(({"lo": [("127.0.0.1", 5)]}, bytes(32))))
    for path, payload in (("/rank_and_size/host-1:0", None), ("/worker_addresses/host-1:0", body)):
        method = "GET" if payload is None else "PUT"
        assert server.request(method, path, payload, sign=False)[0] == 401
        line = auth_line(method, path, payload or b"", server.tracker.generation, key=bytes(32))
        raw = f"{method} {path} HTTP/1.0\r\nContent-Length: {len(payload or b'')}\r\n".encode()
        assert parse_answer(server.send(raw + line + b"\r\n" + (payload or b"")))[0] == 403
        signed = raw + auth_line(method, path, payload or b"", server.tracker.generation)
        assert parse_answer(server.send(signed + b"\r\n" + (payload or b"")))[0] == 200
        assert parse_answer(server.send(signed + b"\r\n" + (payload or b"")))[0] == 409
    assert server.driver.ready == [("host-1", 0)]
    assert [r[:2] for r in server.driver.registered] == [("host-1", 0)]
    server.driver.ready.clear()
    server.driver.registered.clear()


def test_a_rank_is_answered_only_for_a_planned_slot(server: Server) -> None:
    status, body = server.request("GET", "/rank_and_size/host-1:0")
    expected = server.driver.get_slot_info("host-1", 0).to_response_string().encode()
    assert (status, body) == (200, expected)
    assert server.driver.ready.pop() == ("host-1", 0)
    for key in ("host-9:0", "host-1:1", "host-1", "host-1:x", ":0", "host-1:0:0"):
        assert server.request("GET", f"/rank_and_size/{key}")[0] == 404, key
    assert server.driver.ready == []


def test_gloo_keys_of_the_current_ring_round_trip_and_nothing_else_is_stored(
    server: Server,
) -> None:
    before = server.state()
    value = os.urandom(136)
    try:
        for scope in ("global", "local_host-0", "cross_0", "global_process_set_hash_5a1f"):
            assert server.request("PUT", f"/{scope}/rank_0", value)[0] == 200
            assert server.request("GET", f"/{scope}/rank_0") == (200, value)
        assert server.request("DELETE", "/global_process_set_hash_5a1f/rank_0")[0] == 403
        for path in ("/local_host-9/0", "/cross_1/0", "/evil/0", "/global/../x", "/global/0/"):
            assert server.request("PUT", path, value)[0] in (400, 403), path
        assert server.request("PUT", "/spotring/ring", b"7")[0] == 403
        assert server.request("DELETE", "/spotring/ring")[0] == 403
        assert server.request("PUT", "/rank_and_size/host-0:0", b"")[0] == 403
        assert_serving(server)
    finally:
        with server.httpd.cache_lock:
            server.httpd.cache.clear()
            server.httpd.cache.update(before[0])
            server.httpd.store_bytes = before[4]


def test_the_ring_generation_is_plain_digits(server: Server) -> None:
    assert server.httpd.cache["spotring"]["ring"] == b"1"


def test_an_oversize_body_is_refused_before_it_is_sent(server: Server) -> None:
    ring = server.tracker.generation
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(
            f"PUT /global/0 HTTP/1.0\r\nContent-Length: {MAX_BODY_BYTES + 1}\r\n".encode()
            + auth_line("PUT", "/global/0", b"", ring)
            + b"\r\n"
        )
        # Nothing of the body was sent: the answer comes anyway.
        assert parse_answer(receive_all(sock))[0] == 413
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
        sock.sendall(
            b"PUT /worker_addresses/host-0:0 HTTP/1.0\r\nContent-Length: 999999\r\n"
            + auth_line("PUT", "/worker_addresses/host-0:0", b"", ring)
            + b"\r\n"
        )
        assert parse_answer(receive_all(sock))[0] == 413
    assert "0" not in server.httpd.cache.get("global", {})
    assert_serving(server)


# ------------------------------------------------------------------ the store's bounds

ADDRESS = 136
"""The size of one Gloo TCP pair address."""


def scope_sizes(server: Server) -> dict[str, int]:
    return dict(server.httpd.scope_size)


def test_only_the_keys_gloo_writes_for_the_planned_ring_are_taken() -> None:
    fresh = Server()
    try:
        sizes = scope_sizes(fresh)
        assert sizes == {"global": 2, "local_host-0": 1, "local_host-1": 1, "cross_0": 2}
        for base, size in sizes.items():
            for scope in (base, f"{base}_process_set_hash_9c2e"):
                for rank in range(size):  # what Gloo's connectFullMesh writes, at full size
                    address = os.urandom(ADDRESS * (size - 1))
                    assert fresh.request("PUT", f"/{scope}/rank_{rank}", b"host")[0] == 200
                    assert fresh.request("PUT", f"/{scope}/{rank}", address)[0] == 200
                    assert fresh.request("GET", f"/{scope}/{rank}") == (200, address)
                for key in (f"rank_{size}", str(size), "01", "rank_01", "rank_", "999999"):
                    assert fresh.request("PUT", f"/{scope}/{key}", b"x")[0] == 403, (scope, key)
                    assert fresh.request("DELETE", f"/{scope}/{key}")[0] == 403, (scope, key)
        # A value longer than Gloo's is refused before it is read.
        assert fresh.request("PUT", "/global/0", bytes(257))[0] == 413
        assert fresh.request("PUT", "/global/rank_0", bytes(257))[0] == 413
        assert fresh.request("PUT", "/global/1", bytes(MAX_BODY_BYTES))[0] == 413
        assert_serving(fresh)
    finally:
        fresh.tracker.stop()


def test_puts_of_large_values_end_at_the_store_budget_and_the_next_ring_starts_empty(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fresh = Server()
    try:
        httpd = fresh.httpd
        budget = httpd.store_budget
        assert budget == rendezvous.store_budget(scope_sizes(fresh)) < 64 << 10
        value = bytes(rendezvous.PAIR_ADDRESS_MAX_BYTES)  # the most one key takes here
        taken = 0
        with caplog.at_level(logging.WARNING, logger="spotring.driver.rendezvous"):
            for n in range(10_000):  # new process-set scopes, one after another
                status, _ = fresh.request("PUT", f"/global_process_set_hash_{n:x}/0", value)
                if status != 200:
                    break
                taken += 1
        assert status == 413 and "the store is full" in caplog.text
        assert 0 < taken <= budget // len(value)
        with httpd.cache_lock:
            stored = sum(len(v) for entries in httpd.cache.values() for v in entries.values())
            assert stored <= httpd.store_bytes <= budget
        assert_serving(fresh)
        fresh.tracker.init(plan())  # the next ring: an empty store, the same budget
        assert httpd.store_bytes == 0 and httpd.store_budget == budget
        assert fresh.request("PUT", "/global/0", bytes(ADDRESS))[0] == 200
    finally:
        fresh.tracker.stop()


def test_a_scope_is_cleared_when_each_of_its_ranks_has_finished_it_once() -> None:
    fresh = Server()
    try:
        httpd = fresh.httpd
        for scope in ("global", "global_process_set_hash_9c2e"):
            for rank in (0, 1):
                assert fresh.request("PUT", f"/{scope}/rank_{rank}", b"host")[0] == 200
                assert fresh.request("PUT", f"/{scope}/{rank}", bytes(ADDRESS))[0] == 200
        before = httpd.store_bytes
        # Rank 0 says twice that it is done: the scope stays for rank 1 (Horovod's list
        # counted both and cleared it under rank 1's feet).
        assert fresh.request("DELETE", "/global/0")[0] == 200
        assert fresh.request("DELETE", "/global/0")[0] == 200
        assert fresh.request("GET", "/global/0") == (200, bytes(ADDRESS))
        assert fresh.request("DELETE", "/global/1")[0] == 200
        assert httpd.cache["global"] == {}
        # A process set's scope loses the finished rank's address (as Horovod's).
        assert fresh.request("DELETE", "/global_process_set_hash_9c2e/1")[0] == 200
        assert set(httpd.cache["global_process_set_hash_9c2e"]) == {"rank_0", "rank_1", "0"}
        per_key = rendezvous.ENTRY_OVERHEAD_BYTES
        assert httpd.store_bytes == before - 2 * (4 + per_key) - 3 * (ADDRESS + per_key)
    finally:
        fresh.tracker.stop()


def test_head_describes_no_file(server: Server) -> None:
    assert server.request("HEAD", "/")[0] == 405
    assert server.request("HEAD", "/README.md")[0] == 405


def test_a_refusal_is_one_warning_line_naming_the_client(caplog: pytest.LogCaptureFixture) -> None:
    server = Server()
    try:
        body = base64.b64encode(HOSTILE_PICKLES[0])
        with caplog.at_level(logging.WARNING, logger="spotring.driver.rendezvous"):
            assert server.request("PUT", "/worker_addresses/host-0:0", body)[0] == 400
            assert server.send(b"\x16\x03\x01junk\r\n\r\n")  # a TLS hello, say
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == 2, lines
        assert all("127.0.0.1" in line and "\n" not in line for line in lines), lines
        assert all(r.exc_info is None for r in caplog.records)
        assert server.driver.registered == []
    finally:
        server.tracker.stop()


def test_a_slow_client_is_cut_off_and_others_are_served_meanwhile() -> None:
    slow = Server(deadline=1.0)
    try:
        with socket.create_connection(("127.0.0.1", slow.port), timeout=10) as sock:
            started = time.monotonic()
            sock.sendall(
                b"PUT /global/0 HTTP/1.0\r\nContent-Length: 100\r\n"
                + auth_line("PUT", "/global/0", bytes(100), slow.tracker.generation)
                + b"\r\n"
            )
            closed = False
            while time.monotonic() - started < 5:
                assert_serving(slow)
                try:
                    sock.sendall(b"x")  # a byte at a time, never the whole body
                except OSError:
                    closed = True
                    break
                time.sleep(0.2)
            assert closed or parse_answer(receive_all(sock))[0] == 408
            assert time.monotonic() - started < 4
        assert "0" not in slow.httpd.cache.get("global", {})
        assert_serving(slow)
    finally:
        slow.tracker.stop()


def test_connections_beyond_the_limit_are_closed_and_the_server_recovers() -> None:
    fresh = Server(deadline=30.0)
    fresh.httpd._connections = threading.BoundedSemaphore(4)
    try:
        with ExitStack() as idle:
            for _ in range(4):  # connected, sending nothing: each holds a thread
                sock = idle.enter_context(socket.create_connection(("127.0.0.1", fresh.port)))
                sock.sendall(b"GET /spotring/ring HTTP/1.0\r\n")
            time.sleep(0.2)
            started = time.monotonic()
            assert fresh.request("GET", "/spotring/ring") == (0, b"")  # closed at once
            assert time.monotonic() - started < 2
        deadline = time.monotonic() + 5  # the idle ones gone: served again
        while fresh.request("GET", "/spotring/ring") != (200, b"1"):
            assert time.monotonic() < deadline
            time.sleep(0.05)
    finally:
        fresh.tracker.stop()


# ------------------------------------------------------------------ registrations


@pytest.mark.parametrize(
    "raw", HOSTILE_PICKLES, ids=[f"pickle-{i}" for i in range(len(HOSTILE_PICKLES))]
)
def test_hostile_pickles_are_refused_without_being_loaded(raw: bytes, server: Server) -> None:
    with pytest.raises(HostileInput):
        decode_worker_addresses(base64.b64encode(raw))
    status, _ = server.request("PUT", "/worker_addresses/host-0:0", base64.b64encode(raw))
    assert status == 400
    assert server.driver.registered == []


@pytest.mark.parametrize(
    "value",
    [
        ({"lo": [("127.0.0.1", 1)]}, b"short"),
        ({"lo": [("127.0.0.1", 1)]}, "x" * 32),
        ({"lo": [("127.0.0.1", 0)]}, bytes(32)),
        ({"lo": [("127.0.0.1", True)]}, bytes(32)),
        ({"lo": [("not an ip", 1)]}, bytes(32)),
        ({"lo": [["127.0.0.1", 1]]}, bytes(32)),
        ({"lo": []}, bytes(32)),
        ({}, bytes(32)),
        ({"lo\n": [("127.0.0.1", 1)]}, bytes(32)),
        ({"lo": [("127.0.0.1", 1)] * 2000}, bytes(32)),
        ({"lo": [("127.0.0.1", 1)] * 9, "eth0": [("10.0.0.1", 1)] * 8}, bytes(32)),  # 17
        ([{"lo": [("127.0.0.1", 1)]}, bytes(32)],),
        ({"lo": [("127.0.0.1", 1)]}, bytes(32), None),
        "just a string",
    ],
)
def test_registrations_of_the_wrong_shape_are_refused(value: object) -> None:
    with pytest.raises(HostileInput):
        decode_worker_addresses(base64.b64encode(cloudpickle.dumps(value)))


def test_the_right_shape_decodes() -> None:
    value = ({"lo": [("127.0.0.1", 5)], "eth0": [("10.0.0.1", 5)]}, bytes(range(32)))
    assert decode_worker_addresses(base64.b64encode(cloudpickle.dumps(value))) == value


def test_a_registration_may_list_as_many_addresses_as_interfaces_and_no_more() -> None:
    addresses = {f"eth{n}": [(f"10.0.0.{n}", 5)] for n in range(rendezvous.MAX_ADDRESSES)}
    value = (addresses, bytes(32))
    assert decode_worker_addresses(base64.b64encode(cloudpickle.dumps(value))) == value
    addresses["eth99"] = [("10.0.0.99", 5)]
    with pytest.raises(HostileInput, match="more than 16 addresses"):
        decode_worker_addresses(base64.b64encode(cloudpickle.dumps((addresses, bytes(32)))))


def test_only_the_current_rings_slots_may_register() -> None:
    from horovod.runner.common.util.hosts import SlotInfo

    fresh = Server()
    try:
        body = base64.b64encode(cloudpickle.dumps(({"lo": [("127.0.0.1", 5)]}, bytes(32))))
        assert fresh.request("PUT", "/worker_addresses/host-0:0", body)[0] == 200
        # host-0 leaves: the next ring is host-1 alone.
        fresh.tracker.init([SlotInfo("host-1", 0, 0, 0, 1, 1, 1)])
        assert fresh.request("PUT", "/worker_addresses/host-0:0", body)[0] == 403
        assert fresh.request("PUT", "/worker_addresses/host-1:0", body)[0] == 200
        assert [r[:2] for r in fresh.driver.registered] == [("host-0", 0), ("host-1", 0)]
        # A worker of the slot that left still asks for its rank: Horovod answers it
        # (-1 for a slot it no longer has, and the worker leaves).
        assert fresh.request("GET", "/rank_and_size/host-0:0")[0] == 200
    finally:
        fresh.tracker.stop()


class BlockingDriver(StubDriver):
    """Registrations that take until :attr:`release` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def register_worker_server(
        self, host: str, slot: int, addresses: dict[str, Any], secret_key: bytes
    ) -> None:
        self.entered.set()
        assert self.release.wait(10)
        super().register_worker_server(host, slot, addresses, secret_key)


def test_a_slot_registers_once_at_a_time() -> None:
    fresh = Server()
    fresh.driver = driver = BlockingDriver()
    fresh.httpd.RequestHandlerClass = rendezvous_handler(driver)
    body = base64.b64encode(cloudpickle.dumps(({"lo": [("127.0.0.1", 5)]}, bytes(32))))
    answers: list[int] = []
    first = threading.Thread(
        target=lambda: answers.append(fresh.request("PUT", "/worker_addresses/host-0:0", body)[0])
    )
    try:
        first.start()
        assert driver.entered.wait(5)
        assert fresh.request("PUT", "/worker_addresses/host-0:0", body)[0] == 429
        driver.release.set()
        first.join(5)
        assert answers == [200]
        assert fresh.request("PUT", "/worker_addresses/host-0:0", body)[0] == 200
        assert len(driver.registered) == 2
    finally:
        driver.release.set()
        fresh.tracker.stop()


def test_address_probes_run_at_most_the_limit_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from horovod.runner.common.util.network import NoValidAddressesFound

    running, peak, lock = 0, 0, threading.Lock()

    def slow_probe(self: Any, interface: str, endpoint: Any, found: Any) -> None:
        nonlocal running, peak
        with lock:
            running += 1
            peak = max(peak, running)
        time.sleep(0.05)
        with lock:
            running -= 1

    monkeypatch.setattr(rendezvous.SafeWorkerNotificationClient, "_probe_one", slow_probe)
    driver = StubDriver()
    driver._verbose = 0  # type: ignore[attr-defined]
    driver._worker_clients = {}  # type: ignore[attr-defined]
    use_safe_worker_clients(driver, max_probes=3)
    addresses = {f"eth{n}": [(f"10.0.0.{n}", 5)] for n in range(rendezvous.MAX_ADDRESSES)}

    def register(slot: int) -> None:
        with pytest.raises(NoValidAddressesFound):
            driver.register_worker_server("host-0", slot, addresses, bytes(32))

    registrations = [threading.Thread(target=register, args=(slot,)) for slot in range(4)]
    for thread in registrations:
        thread.start()
    for thread in registrations:
        thread.join(10)
    assert not any(thread.is_alive() for thread in registrations)
    assert peak == 3, peak  # 64 probes in all, 3 at a time


# ------------------------------------------------------------------ the driver's clients


class AnsweringService:
    """A 'notification service' that answers every message with ``message``, signed
    with ``key``: what anyone could register for a planned slot."""

    def __init__(self, key: bytes, message: bytes) -> None:
        from horovod.runner.common.util import secret

        frame = secret.compute_digest(key, message) + struct.pack("i", len(message)) + message

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                self.rfile.read(32)
                (length,) = struct.unpack("i", self.rfile.read(4))
                self.rfile.read(length)
                self.wfile.write(frame)

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        self.addresses = {"lo": [("127.0.0.1", self.server.server_address[1])]}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class Updates:
    """The notification manager's side: which host updates arrived."""

    def __init__(self) -> None:
        self.updates: list[tuple[float, int]] = []

    def handle_hosts_updated(self, timestamp: float, result: int) -> None:
        self.updates.append((timestamp, result))


class ProbingDriver(StubDriver):
    """The stub, with Horovod's client registry, registering through spotring's."""

    def __init__(self) -> None:
        super().__init__()
        self._verbose = 0
        self._worker_clients: dict[tuple[str, int], Any] = {}
        use_safe_worker_clients(self)


def answers() -> list[bytes]:
    from horovod.runner.common.util.network import PingResponse

    return [
        cloudpickle.dumps(_Touch()),
        cloudpickle.dumps(PingResponse(_Touch(), "127.0.0.1")),  # Horovod's class, around a call
        b"\x80\x05)r\xff\xff\xff\x7f.",  # a memo index of 2**31
        b"not a pickle",
    ]


@pytest.mark.parametrize("message", answers(), ids=["touch", "inside", "memo", "junk"])
def test_the_driver_takes_no_pickle_but_horovods_answers_from_a_registered_address(
    message: bytes,
) -> None:
    from horovod.runner.common.util.network import NoValidAddressesFound

    key = os.urandom(32)  # the key the registration named: the attacker's own
    service = AnsweringService(key, message)
    driver = ProbingDriver()
    try:
        with pytest.raises(NoValidAddressesFound):
            driver.register_worker_server("host-0", 0, service.addresses, key)
        assert driver._worker_clients == {}
    finally:
        service.close()


def test_a_registration_whose_service_answers_a_pickle_is_refused_over_http(
    caplog: pytest.LogCaptureFixture,
) -> None:
    key = os.urandom(32)
    service = AnsweringService(key, cloudpickle.dumps(_Touch()))
    server = Server()
    server.driver = driver = ProbingDriver()
    server.httpd.RequestHandlerClass = rendezvous_handler(driver)
    try:
        body = base64.b64encode(cloudpickle.dumps((service.addresses, key)))
        with caplog.at_level(logging.WARNING, logger="spotring.driver.rendezvous"):
            assert server.request("PUT", "/worker_addresses/host-0:0", body) == (0, b"")
        assert driver._worker_clients == {}
        assert [r.exc_info for r in caplog.records] == [None]
        assert "NoValidAddressesFound" in caplog.records[0].getMessage()
        assert_serving(server)
    finally:
        server.tracker.stop()
        service.close()


def test_a_registered_service_that_never_answers_is_given_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from horovod.runner.common.util.network import NoValidAddressesFound

    monkeypatch.setattr(worker_client, "ANSWER_TIMEOUT_SECONDS", 0.2)
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        addresses = {"lo": [("127.0.0.1", silent.getsockname()[1])]}
        driver = ProbingDriver()
        started = time.monotonic()
        with pytest.raises(NoValidAddressesFound):
            driver.register_worker_server("host-0", 0, addresses, os.urandom(32))
        assert time.monotonic() - started < 5


class TricklingService:
    """A 'notification service' that answers a byte at a time, each well within any
    socket timeout, and never finishes: a header announcing a long message."""

    def __init__(self, interval: float = 0.02) -> None:
        stop = self.stop = threading.Event()

        class Handler(socketserver.StreamRequestHandler):
            def handle(self) -> None:
                with contextlib.suppress(OSError):
                    self.rfile.read(32)
                    (length,) = struct.unpack("i", self.rfile.read(4))
                    self.rfile.read(length)
                    frame = bytes(32) + struct.pack("i", 60_000) + bytes(60_000)
                    for byte in frame:
                        if stop.wait(interval):
                            return
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True).start()
        self.address = ("127.0.0.1", self.server.server_address[1])

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


def finishes_within(seconds: float, call: Any, *args: Any) -> BaseException | None:
    """What ``call(*args)`` raised, run in a thread, asserting it ended in ``seconds``."""
    raised: list[BaseException | None] = []

    def run() -> None:
        try:
            call(*args)
            raised.append(None)
        except BaseException as error:
            raised.append(error)

    thread = threading.Thread(target=run, daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still waiting after {time.monotonic() - started:.1f} s"
    return raised[0]


def test_an_answer_that_trickles_in_is_given_up_at_its_deadline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from horovod.runner.common.util import secret
    from horovod.runner.common.util.network import NoValidAddressesFound
    from horovod.runner.elastic.worker import HostUpdateResult, WorkerNotificationService

    monkeypatch.setattr(worker_client, "ANSWER_TIMEOUT_SECONDS", 0.3)
    trickling = TricklingService()
    driver = ProbingDriver()
    key = secret.make_secret_key()
    service = WorkerNotificationService(key, "lo", Updates())
    try:
        # Registering an address that trickles: each of 3 attempts ends at 0.3 s.
        addresses = {"lo": [trickling.address]}
        error = finishes_within(4, driver.register_worker_server, "host-0", 0, addresses, key)
        assert isinstance(error, NoValidAddressesFound)
        # A registered worker whose service starts to trickle: a host-change notice
        # to it is given up as soon (Horovod's discovery thread waits for it).
        driver.register_worker_server("host-0", 0, service.addresses(), key)
        client = driver._worker_clients[("host-0", 0)]
        client._addresses = {"lo": [trickling.address]}
        error = finishes_within(4, client.notify_hosts_updated, 1.0, HostUpdateResult.added)
        assert isinstance(error, TimeoutError)
    finally:
        trickling.close()
        service.shutdown()


def test_a_real_worker_service_is_registered_and_reached() -> None:
    from horovod.runner.common.util import secret
    from horovod.runner.common.util.network import PingRequest
    from horovod.runner.elastic.worker import HostUpdateResult, WorkerNotificationService

    key = secret.make_secret_key()
    manager = Updates()
    service = WorkerNotificationService(key, "lo", manager)
    driver = ProbingDriver()
    try:
        driver.register_worker_server("host-0", 0, service.addresses(), key)
        client = driver._worker_clients[("host-0", 0)]
        client.notify_hosts_updated(2.0, HostUpdateResult.removed)
        assert manager.updates == [(2.0, HostUpdateResult.removed)]
        assert client._send(PingRequest()).service_name == WorkerNotificationService.NAME
    finally:
        service.shutdown()


# ------------------------------------------------------------------ random requests

METHODS = ["GET", "PUT", "DELETE", "POST", "HEAD", "OPTIONS", "PATCH", "CONNECT", "get", ""]
PATHS = [
    "/worker_addresses/host-0:0",
    "/worker_addresses/host-9:0",
    "/worker_addresses/host-0",
    "/spotring/ring",
    "/spotring/other",
    "/rank_and_size/host-9:0",
    "/rank_and_size/host-0",
    "/rank_and_size/host-0:x",
    "/rank_and_size/host-0:0:0",
    "/local_host-9/0",
    "/cross_5/rank_0",
    "/evil/key",
    "/a/b/c",
    "/",
    "//",
    "",
    "*",
    "http://127.0.0.1/spotring/ring",
    "/global",
    "/global/../../etc/passwd",
    "/%2e%2e/x",
]


def bodies() -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.binary(max_size=300),
        st.sampled_from(HOSTILE_PICKLES).map(base64.b64encode),
        st.sampled_from(HOSTILE_PICKLES),
        st.binary(max_size=200).map(base64.b64encode),
        st.builds(
            lambda obj: base64.b64encode(cloudpickle.dumps(obj)),
            st.recursive(
                st.none() | st.integers() | st.text(max_size=8) | st.binary(max_size=40),
                lambda inner: (
                    st.lists(inner, max_size=3)
                    | st.tuples(inner, inner)
                    | st.dictionaries(st.text(max_size=4), inner, max_size=3)
                ),
                max_leaves=8,
            ),
        ),
    )


def headers() -> st.SearchStrategy[list[tuple[str, str]]]:
    lengths = st.one_of(
        st.integers(min_value=0, max_value=400).map(str),
        st.sampled_from(["-1", "abc", "", "1e3", " 5", "٣", str(MAX_BODY_BYTES + 1), "9" * 30]),
    )
    return st.lists(
        st.one_of(
            st.tuples(st.just("Content-Length"), lengths),
            st.tuples(st.just("Transfer-Encoding"), st.sampled_from(["chunked", "gzip"])),
            st.tuples(st.just("Connection"), st.just("keep-alive")),
            st.tuples(st.text("abcXY-", min_size=1, max_size=8), st.text(max_size=20)),
        ),
        max_size=4,
    )


def writes_a_current_gloo_key(server: Server, method: str, path: str) -> bool:
    parts = path.split("/")
    if method not in ("PUT", "DELETE") or len(parts) != 3:
        return False
    return rendezvous_handler_module.PROCESS_SET_SUFFIX.sub("", parts[1]) in server.httpd.scope_size


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    method=st.one_of(st.sampled_from(METHODS), st.text(max_size=8)),
    path=st.one_of(st.sampled_from(PATHS), st.text(max_size=30)),
    version=st.sampled_from(["HTTP/1.0", "HTTP/1.1", "HTTP/2.0", "HTTP/x", ""]),
    header_lines=headers(),
    body=bodies(),
    with_length=st.booleans(),
    junk=st.none() | st.binary(max_size=200),
)
@example(
    method="PUT",
    path="/worker_addresses/host-0:0",
    version="HTTP/1.0",
    header_lines=[],
    body=base64.b64encode(HOSTILE_PICKLES[1]),
    with_length=True,
    junk=None,
)
def test_random_requests_are_refused_without_effect(
    server: Server,
    method: str,
    path: str,
    version: str,
    header_lines: list[tuple[str, str]],
    body: bytes,
    with_length: bool,
    junk: bytes | None,
) -> None:
    before = server.state()
    if junk is not None:
        raw = junk
    else:
        if writes_a_current_gloo_key(server, method, path):
            path = "/evil" + path  # a legitimate write, tested above
        line = " ".join(p for p in (method, path, version) if p)
        head = [f"{name}: {value}" for name, value in header_lines]
        if with_length:
            head.append(f"Content-Length: {len(body)}")
        raw = "\r\n".join([line, *head, "", ""]).encode("utf-8", "replace") + body
    status, _ = parse_answer(server.send(raw))
    # No answer (the request never ended), a refusal, or the answer to a plain read.
    assert status == 0 or 400 <= status < 500 or (status == 200 and method == "GET"), status
    assert server.state() == before
    assert server.driver.registered == [] and server.driver.ready == []
    assert not MARKER.exists()
    assert_serving(server)


# ------------------------------------------------------------------ the worker side


class _Answer(BaseHTTPRequestHandler):
    body = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.mark.parametrize(
    "body",
    [
        base64.b64encode(HOSTILE_PICKLES[0]),
        HOSTILE_PICKLES[1],
        base64.b64encode(pickle.dumps(5)),  # what the driver published before: refused too
        b"-1",
        b" 7",
        b"7\n",
        b"\xd9\xa3",  # an Arabic-Indic digit: int() would take it as text
        b"",
        b"9" * 40,
    ],
)
def test_a_worker_takes_only_digits_for_the_ring_and_unpickles_nothing(
    body: bytes, monkeypatch: pytest.MonkeyPatch
) -> None:
    unpickled: list[object] = []

    def no_unpickling(data: object, *args: object, **kwargs: object) -> None:
        unpickled.append(data)
        raise AssertionError("the worker unpickled what the server sent")

    for module in (pickle, cloudpickle):
        monkeypatch.setattr(module, "loads", no_unpickling)
    handler = type("Answer", (_Answer,), {"body": body})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    monkeypatch.setenv("HOROVOD_GLOO_RENDEZVOUS_ADDR", "127.0.0.1")
    monkeypatch.setenv("HOROVOD_GLOO_RENDEZVOUS_PORT", str(httpd.server_address[1]))
    try:
        assert peer_abort._read_ring_generation() is None
        handler.body = b"12"
        assert peer_abort._read_ring_generation() == 12
        assert unpickled == []
    finally:
        httpd.shutdown()
        httpd.server_close()


@given(st.binary(max_size=24))
def test_parse_ring_generation_takes_ascii_digits_only(body: bytes) -> None:
    expected = int(body) if body and len(body) <= 18 and all(48 <= b <= 57 for b in body) else None
    assert peer_abort.parse_ring_generation(body) == expected


def test_a_workers_notification_service_refuses_quietly_and_cuts_off_slow_clients(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    from horovod.runner.common.util import secret
    from horovod.runner.elastic.worker import (
        HostUpdateResult,
        WorkerNotificationClient,
        WorkerNotificationService,
    )

    monkeypatch.setattr(
        WorkerNotificationService, "_make_handler", WorkerNotificationService._make_handler
    )
    monkeypatch.setattr(peer_abort, "NOTIFICATION_DEADLINE_SECONDS", 0.5)
    peer_abort.harden_notification_service()
    key = secret.make_secret_key()
    manager = Updates()
    service = WorkerNotificationService(key, "lo", manager)
    try:
        address = service.addresses()["lo"][0]
        payloads = [os.urandom(100), bytes(32) + struct.pack("i", -5), b"\x00" * 5]
        with caplog.at_level(logging.WARNING, logger="spotring.worker_image.peer_abort"):
            for payload in payloads + hostile_payloads()[-5:]:  # the forged messages
                with socket.create_connection(address, timeout=5) as sock:
                    sock.sendall(payload)
                    sock.shutdown(socket.SHUT_WR)
                    assert receive_all(sock) == b""
            with socket.create_connection(address, timeout=5) as sock:
                started = time.monotonic()
                sock.sendall(bytes(32) + struct.pack("i", 100) + b"half")  # and then nothing
                assert receive_all(sock) == b""
                assert time.monotonic() - started < 3, "a stalled client was not cut off"
            deadline = time.monotonic() + 5  # the cut-off's line comes after the close
            while len(caplog.records) < len(payloads) + 6 and time.monotonic() < deadline:
                time.sleep(0.05)
        assert manager.updates == []
        lines = [r.getMessage() for r in caplog.records]
        assert len(lines) == len(payloads) + 6, lines
        assert all("refused a message from 127.0.0.1" in r.getMessage() for r in caplog.records)
        assert "Traceback" not in capsys.readouterr().err
        # Horovod's own driver-side client still gets through.
        WorkerNotificationClient(service.addresses(), key, 0).notify_hosts_updated(
            1.0, HostUpdateResult.added
        )
        assert manager.updates == [(1.0, HostUpdateResult.added)]
    finally:
        service.shutdown()


# ------------------------------------------------------------------ a running job

SPOTRING = str(Path(sys.executable).with_name("spotring"))


def listening_ports(pids: list[int]) -> list[int]:
    ports = set()
    for pid in pids:
        try:
            connections = psutil.Process(pid).net_connections(kind="tcp")
        except psutil.Error:
            continue
        ports.update(c.laddr.port for c in connections if c.status == psutil.CONN_LISTEN)
    return sorted(ports)


def hostile_payloads() -> list[bytes]:
    """Random bytes, random and malformed HTTP, forged Horovod and spotring messages."""
    from horovod.runner.common.util.network import PingRequest, Wire
    from horovod.runner.elastic.worker import HostsUpdatedRequest, HostUpdateResult

    rng = random.Random(13)
    payloads = [rng.randbytes(n) for n in (1, 4, 36, 37, 100, 5000)]
    payloads.append(b"\x00" * 32 + struct.pack("i", -5))  # a negative length
    payloads.append(b"\x00" * 32 + struct.pack("i", 1 << 30) + b"x")  # an absurd one
    for pickled in HOSTILE_PICKLES[:4]:
        encoded = base64.b64encode(pickled)
        for path in ("/worker_addresses/host-0:0", "/spotring/ring", "/cross_9/0", "/evil/x"):
            payloads.append(
                f"PUT {path} HTTP/1.0\r\nContent-Length: {len(encoded)}\r\n\r\n".encode() + encoded
            )
    payloads += [
        b"GET /worker_addresses/host-0:0 HTTP/1.0\r\n\r\n",
        b"GET /rank_and_size/host-9:0 HTTP/1.0\r\n\r\n",
        b"DELETE /spotring/ring HTTP/1.0\r\n\r\n",
        b"DELETE /evil/0 HTTP/1.0\r\n\r\n",
        b"PUT /global/0 HTTP/1.0\r\nContent-Length: 99999999999\r\n\r\n",
        b"PUT /global/0 HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n",
        b"BREW /pot HTTP/1.1\r\n\r\n",
        b"HEAD / HTTP/1.0\r\n\r\n",
        b"GET /a/b/c HTTP/1.0\r\n\r\n",
        b"\r\n\r\n",
        b"GET " + b"/x" * 40000 + b" HTTP/1.0\r\n\r\n",
        b"GET / HTTP/1.0\r\n" + b"X: y\r\n" * 200 + b"\r\n",
    ]
    for _ in range(20):
        method = rng.choice(["GET", "PUT", "DELETE", "POST", "XYZ"])
        path = "/" + "/".join(rng.randbytes(4).hex() for _ in range(rng.randint(0, 3)))
        payloads.append(f"{method} {path} HTTP/1.0\r\n\r\n".encode() + rng.randbytes(50))
    # Horovod's wire format, signed with a key that is not the worker's.
    wrong = Wire(os.urandom(32))
    for message in (
        HostsUpdatedRequest(time.time(), HostUpdateResult.removed),
        PingRequest(),
        peer_abort.PeerFailedRequest.sign(os.urandom(32), 1, 1, "host-0[0]"),
        _Touch(),
    ):
        buffer = _Buffer()
        wrong.write(message, buffer)
        payloads.append(buffer.data)
    # A correctly framed message with no valid digest, carrying a pickle that would
    # create a marker file.
    evil = cloudpickle.dumps(_Touch())
    payloads.append(bytes(32) + struct.pack("i", len(evil)) + evil)
    return payloads


class _Buffer:
    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data

    def flush(self) -> None:
        pass


def attack(port: int, payloads: list[bytes]) -> None:
    for payload in payloads:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=3) as sock:
                sock.sendall(payload)
                sock.shutdown(socket.SHUT_WR)
                receive_all(sock)
        except OSError:  # refused or reset: an answer too
            continue


@pytest.mark.e2e
def test_hostile_payloads_at_every_port_of_a_running_job(repo: Path, tmp_path: Path) -> None:
    """Every port the driver and the workers listen on gets the whole batch while the
    ring trains, and a connection that never finishes its request stays open until
    the job ends: nothing changes, nothing stalls, nothing prints a traceback."""
    events = tmp_path / "events.jsonl"
    argv = [
        *(SPOTRING, "run", "--provider", "local", "-np", "2", "--"),
        *(sys.executable, str(repo / "examples" / "train_digits.py"), "--events", str(events)),
        *("--epochs", "4", "--step-seconds", "0.05"),
    ]
    with running_job(argv, cwd=tmp_path, env=dict(os.environ)) as process, ExitStack() as stack:
        wait_for_events(process, events, commits(size=2, steps=3), "3 commits at size 2", 120)
        workers = worker_pids(process.pid)
        assert len(workers) == 2
        ports = listening_ports([process.pid, *(pid for pid, _ in workers)])
        # The rendezvous server, the local metadata service, a notification service each.
        assert len(ports) >= 4, ports
        # The driver's own: the rendezvous server and the metadata service. (A worker's
        # launch environment does not name the port: workers are started before they
        # have one, see spotring.driver.warm_pool.)
        assert len(listening_ports([process.pid])) >= 2
        for port in ports:  # half a request, never finished
            sock = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=3))
            sock.sendall(b"PUT /global/0 HTTP/1.0\r\nContent-Length: 50\r\n\r\nxx")
        payloads = hostile_payloads()
        threads = [threading.Thread(target=attack, args=(port, payloads)) for port in ports]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        attacked = time.time()
        assert process.poll() is None, "the job ended before the attack was over"
        output = job_output(process, 120)
    assert process.returncode == 0, output[-4000:]
    recorded = read_events(events)
    assert_no_committed_step_lost(recorded)
    assert all(e["step"] == 0 for e in recorded if e["event"] == "resume"), recorded
    assert recorded[-1]["event"] == "done" and recorded[-1]["resets"] == 0
    assert any(e["event"] == "commit" and e["time"] > attacked for e in recorded)
    assert "resets: 0" in output
    assert "Traceback" not in output, output[-6000:]
    assert not MARKER.exists()
