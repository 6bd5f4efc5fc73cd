"""The rendezvous server's one-request full mesh (``spotring-mesh-<r>``), as spotring's
Horovod build (worker_image/horovod-rendezvous.patch) asks for it: every rank gets its
local rank and, from each peer, the one address meant for it; bounded waits; an
abandoned ring or a new ring answers at once; the hardening's bounds hold."""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from spotring.driver.rendezvous import (
    MESH_ABANDONED,
    MESH_MAGIC,
    MESH_OK,
    RingTracker,
    rendezvous_handler,
)
from tests.test_hostile_endpoints import StubDriver, parse_answer, receive_all

ENTRY = 136  # Gloo's TCP pair address
HOSTS = ["host-a", "host-a", "host-b", "host-b"]  # rank -> host name, 2 slots each


def four_slot_plan() -> list[Any]:
    from horovod.runner.common.util.hosts import SlotInfo

    # hostname, rank, local_rank, cross_rank, size, local_size, cross_size
    return [SlotInfo(HOSTS[r], r, r % 2, r // 2, 4, 2, 2) for r in range(4)]


def address(owner: int, peer: int) -> bytes:
    """What rank ``owner`` 's pair towards ``peer`` would publish."""
    return struct.pack(">II", owner, peer) * (ENTRY // 8)


def mesh_body(rank: int, size: int, host: str, wait_ms: int = 5000, entry: int = ENTRY) -> bytes:
    peers = [p for p in range(size) if p != rank]
    addresses = b"".join(address(rank, p)[:entry].ljust(entry, b"\0") for p in peers)
    name = host.encode()
    return struct.pack(">III", size, wait_ms, len(name)) + name + addresses


class Mesh:
    def __init__(self) -> None:
        self.tracker = RingTracker()
        self.port = self.tracker.start(rendezvous_handler(StubDriver()), "127.0.0.1")
        self.tracker.init(four_slot_plan())
        self.httpd = self.tracker.httpd

    def request(self, method: str, path: str, body: bytes = b"") -> tuple[int, bytes]:
        import socket

        head = f"{method} {path} HTTP/1.1\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        with socket.create_connection(("127.0.0.1", self.port), timeout=20) as sock:
            sock.sendall(head + body)
            sock.shutdown(socket.SHUT_WR)
            return parse_answer(receive_all(sock))

    def put(self, scope: str, rank: int, body: bytes) -> tuple[int, bytes]:
        return self.request("PUT", f"/{scope}/spotring-mesh-{rank}", body)


@pytest.fixture
def mesh() -> Iterator[Mesh]:
    running = Mesh()
    yield running
    running.tracker.stop()


def exchange(mesh: Mesh, scope: str, ranks: list[int], size: int, **kwargs: Any) -> dict[int, Any]:
    answers: dict[int, Any] = {}

    def one(rank: int) -> None:
        answers[rank] = mesh.put(scope, rank, mesh_body(rank, size, HOSTS[ranks[rank]], **kwargs))

    threads = [threading.Thread(target=one, args=(r,)) for r in range(size)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return answers


def decode(answer: bytes, rank: int, size: int) -> tuple[int, int, dict[int, bytes]]:
    magic, status, local_rank, entry = struct.unpack_from(">4sIII", answer)
    assert magic == MESH_MAGIC
    rest = answer[16:]
    peers = [p for p in range(size) if p != rank]
    assert len(rest) == entry * len(peers)
    return status, local_rank, {p: rest[k * entry : (k + 1) * entry] for k, p in enumerate(peers)}


def test_every_rank_gets_its_local_rank_and_the_address_each_peer_made_for_it(mesh: Mesh) -> None:
    answers = exchange(mesh, "global", [0, 1, 2, 3], 4)
    for rank in range(4):
        status, body = answers[rank]
        assert status == 200
        code, local_rank, peers = decode(body, rank, 4)
        assert code == MESH_OK
        assert local_rank == rank % 2  # ranks below it on the same host
        assert peers == {p: address(p, rank) for p in range(4) if p != rank}
    # a process set's scope of that ring, of fewer ranks: sized by its requests
    answers = exchange(mesh, "global_process_set_hash_ab12", [0, 1, 2], 3)
    assert all(answers[r][0] == 200 for r in range(3))
    assert decode(answers[2][1], 2, 3)[2] == {0: address(0, 2), 1: address(1, 2)}


def test_one_request_per_rank_and_the_mesh_is_dropped_once_every_rank_finished(mesh: Mesh) -> None:
    before = mesh.httpd.store_bytes
    exchange(mesh, "cross_0", [0, 2], 2)
    assert mesh.httpd.requests["PUT gloo"] == 2
    assert mesh.httpd.store_bytes > before
    for rank in range(2):
        assert mesh.request("DELETE", f"/cross_0/{rank}")[0] == 200
    assert "cross_0" not in mesh.httpd.meshes
    assert mesh.httpd.store_bytes == before


def test_a_rank_alone_waits_its_bounded_wait_and_is_answered_404(mesh: Mesh) -> None:
    started = time.monotonic()
    status, _ = mesh.put("global", 1, mesh_body(1, 4, "host-a", wait_ms=300))
    assert status == 404
    assert 0.25 <= time.monotonic() - started < 3
    assert mesh.httpd.mesh_waiters == 0


def test_an_abandoned_ring_answers_its_waiting_members_at_once(mesh: Mesh) -> None:
    result: list[tuple[int, bytes]] = []
    waiter = threading.Thread(
        target=lambda: result.append(mesh.put("global", 0, mesh_body(0, 4, "host-a", 20000)))
    )
    waiter.start()
    time.sleep(0.3)
    started = time.monotonic()
    mesh.tracker.abandon(mesh.tracker.generation)
    waiter.join(5)
    assert time.monotonic() - started < 1
    assert result and result[0][0] == 200
    assert struct.unpack_from(">4sI", result[0][1]) == (MESH_MAGIC, MESH_ABANDONED)
    # and a member asking later too
    status, body = mesh.put("global", 2, mesh_body(2, 4, "host-b"))
    assert status == 200 and struct.unpack_from(">4sI", body)[1] == MESH_ABANDONED


def test_a_new_ring_sends_the_old_rings_waiters_away(mesh: Mesh) -> None:
    result: list[tuple[int, bytes]] = []
    waiter = threading.Thread(
        target=lambda: result.append(mesh.put("global", 0, mesh_body(0, 4, "host-a", 20000)))
    )
    waiter.start()
    time.sleep(0.3)
    mesh.tracker.init(four_slot_plan())
    waiter.join(5)
    assert result == [(404, b"")]
    assert mesh.httpd.meshes == {}


@pytest.mark.parametrize(
    ("scope", "rank", "body", "status"),
    [
        ("global", 4, mesh_body(0, 4, "h"), 403),  # not a rank of the scope
        ("elsewhere", 0, mesh_body(0, 4, "h"), 403),  # not a scope of the ring
        ("spotring", 0, mesh_body(0, 4, "h"), 403),  # read-only
        ("global", 0, mesh_body(0, 3, "h"), 400),  # a plan scope's size is the plan's
        ("global_process_set_hash_ab", 0, mesh_body(0, 5, "h"), 400),  # over the plan
        ("global", 0, mesh_body(0, 4, "h", entry=300), 400),  # an entry over 256 B
        ("global", 0, mesh_body(0, 4, "h")[:-1], 400),  # not (size - 1) equal entries
        ("global", 0, mesh_body(0, 4, "h" * 300), 400),  # a host name over 256 B
        ("global", 0, mesh_body(0, 4, "h", entry=2000), 413),  # over the bound: unread
        ("global", 0, b"\0\0", 400),  # no header
    ],
)
def test_malformed_mesh_requests_are_refused_without_effect(
    mesh: Mesh, scope: str, rank: int, body: bytes, status: int
) -> None:
    assert mesh.put(scope, rank, body)[0] == status
    assert mesh.httpd.meshes == {}


def test_ranks_of_one_scope_must_agree_on_its_shape(mesh: Mesh) -> None:
    scope = "global_process_set_hash_ff"
    assert mesh.put(scope, 0, mesh_body(0, 3, "h", wait_ms=0))[0] == 404
    assert mesh.put(scope, 1, mesh_body(1, 2, "h", wait_ms=0))[0] == 400
    assert mesh.put(scope, 1, mesh_body(1, 3, "h", wait_ms=0, entry=100))[0] == 400


def test_the_listen_backlog_takes_a_ring_arriving_at_once(mesh: Mesh) -> None:
    assert mesh.httpd.request_queue_size >= 1024
