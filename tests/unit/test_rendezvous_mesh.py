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
from tests.e2e.test_hostile_endpoints import StubDriver, parse_answer, receive_all
from tests.fakes.store_signing import JOB_KEY, auth_line, is_write

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
        self.port = self.tracker.start(
            rendezvous_handler(StubDriver()), "127.0.0.1", job_key=JOB_KEY
        )
        self.tracker.init(four_slot_plan())
        self.httpd = self.tracker.httpd

    def request(
        self, method: str, path: str, body: bytes = b"", sign: bool | None = None
    ) -> tuple[int, bytes]:
        """``method path`` with ``body``, signed for the current ring as the job's
        workers sign it (by default: when it is a write)."""
        import socket

        head = f"{method} {path} HTTP/1.1\r\nContent-Length: {len(body)}\r\n".encode()
        if is_write(method, path) if sign is None else sign:
            head += auth_line(method, path, body, self.tracker.generation)
        head += b"\r\n"
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


# ------------------------------------------------------------------ who may write (#32)


def raw_put(mesh: Mesh, scope: str, rank: int, body: bytes, head: bytes = b"") -> Any:
    """A socket that sent ``PUT /scope/spotring-mesh-<rank>`` with ``body`` (and the
    extra header lines ``head``), left open for its answer."""
    import socket

    path = f"/{scope}/spotring-mesh-{rank}"
    sock = socket.create_connection(("127.0.0.1", mesh.port), timeout=30)
    sock.sendall(
        f"PUT {path} HTTP/1.1\r\nContent-Length: {len(body)}\r\n".encode() + head + b"\r\n" + body
    )
    return sock


def free_permits(mesh: Mesh) -> int:
    return mesh.httpd._connections._value  # type: ignore[attr-defined]  # a BoundedSemaphore's count


def wait_until(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def assert_ring_forms(mesh: Mesh, scope: str = "global") -> None:
    """The real ranks of ``scope`` (signed) all get each other's true addresses."""
    answers = exchange(mesh, scope, [0, 1, 2, 3], 4)
    for rank in range(4):
        status, body = answers[rank]
        assert status == 200, (rank, status)
        code, _, peers = decode(body, rank, 4)
        assert code == MESH_OK and peers == {p: address(p, rank) for p in range(4) if p != rank}


def test_the_orphaned_waiters_attack_leaves_ring_formation_unaffected(mesh: Mesh) -> None:
    """The issue's attack: 72 parked mesh requests and every rank's DELETE from one
    client. Unsigned, nothing of it is parked or counted: no permit stays held, and
    the real ring forms, this ring and the next."""

    permits = free_permits(mesh)
    socks = [raw_put(mesh, "global", 0, mesh_body(0, 4, "host-a", 20000)) for _ in range(72)]
    for rank in range(4):
        assert mesh.request("DELETE", f"/global/{rank}", sign=False)[0] == 401
    for sock in socks:
        sock.settimeout(5)
        assert parse_answer(receive_all(sock))[0] == 401
        sock.close()
    wait_until(lambda: free_permits(mesh) == permits)
    assert mesh.httpd.mesh_waiters == 0 and mesh.httpd.meshes == {}
    assert_ring_forms(mesh)
    mesh.tracker.init(four_slot_plan())
    assert_ring_forms(mesh)
    # A handler gives its permit back just after its answer is sent: wait, not assert.
    wait_until(lambda: free_permits(mesh) == permits)


def test_a_rank_s_delete_counts_only_once_it_was_answered(mesh: Mesh) -> None:
    """Every rank's DELETE (signed) while rank 0 waits for the others: the scope is not
    dropped under the waiter, which is answered once the others come."""
    waiter = raw_put(
        mesh,
        "global",
        0,
        body := mesh_body(0, 4, "host-a", 20000),
        auth_line("PUT", "/global/spotring-mesh-0", body, mesh.tracker.generation),
    )
    wait_until(lambda: mesh.httpd.mesh_waiters == 1)
    for rank in range(4):
        assert mesh.request("DELETE", f"/global/{rank}")[0] == 200
    assert "global" in mesh.httpd.meshes and mesh.httpd.mesh_waiters == 1
    answers: dict[int, tuple[int, bytes]] = {}
    others = [
        threading.Thread(
            target=lambda r=r: answers.update({r: mesh.put("global", r, mesh_body(r, 4, HOSTS[r]))})
        )
        for r in (1, 2, 3)
    ]
    for thread in others:
        thread.start()
    for thread in others:
        thread.join(10)
    assert sorted(answers) == [1, 2, 3] and all(s == 200 for s, _ in answers.values())
    waiter.settimeout(5)
    status, answer = parse_answer(receive_all(waiter))
    waiter.close()
    assert status == 200 and decode(answer, 0, 4)[2] == {p: address(p, 0) for p in (1, 2, 3)}
    assert mesh.httpd.mesh_waiters == 0
    for rank in range(4):  # now each DELETE counts: the mesh goes
        assert mesh.request("DELETE", f"/global/{rank}")[0] == 200
    assert "global" not in mesh.httpd.meshes


def test_a_rank_waits_once_its_newer_request_replacing_the_older(mesh: Mesh) -> None:
    def signed_waiter() -> Any:
        body = mesh_body(0, 4, "host-a", 20000)
        line = auth_line("PUT", "/global/spotring-mesh-0", body, mesh.tracker.generation)
        return raw_put(mesh, "global", 0, body, line)

    older = signed_waiter()
    wait_until(lambda: mesh.httpd.mesh_waiters == 1)
    newer = signed_waiter()
    older.settimeout(5)
    assert parse_answer(receive_all(older)) == (404, b"")  # asked again by a real rank
    older.close()
    assert mesh.httpd.mesh_waiters == 1
    mesh.tracker.init(four_slot_plan())  # a new ring: the waiter is sent away, none counted
    newer.settimeout(5)
    assert parse_answer(receive_all(newer)) == (404, b"")
    newer.close()
    assert mesh.httpd.mesh_waiters == 0


def test_forged_writes_are_refused_before_they_are_stored(mesh: Mesh) -> None:
    """A client that writes every rank of ``global`` first, unsigned or signed with
    another key: nothing is stored; the real ranks get each other's addresses."""
    wrong_key = bytes(32)
    for rank in range(4):
        forged = mesh_body(rank, 4, "evil", wait_ms=0)
        path = f"/global/spotring-mesh-{rank}"
        assert mesh.request("PUT", path, forged, sign=False)[0] == 401
        sock = raw_put(
            mesh,
            "global",
            rank,
            forged,
            auth_line("PUT", path, forged, mesh.tracker.generation, key=wrong_key),
        )
        sock.settimeout(5)
        assert parse_answer(receive_all(sock))[0] == 403
        sock.close()
        for key in (f"rank_{rank}", str(rank)):
            assert mesh.request("PUT", f"/global/{key}", b"evil", sign=False)[0] == 401
    assert mesh.httpd.meshes == {} and mesh.httpd.cache.get("global", {}) == {}
    assert_ring_forms(mesh)


def test_a_replayed_write_is_refused_in_its_ring_and_in_every_later_one(mesh: Mesh) -> None:
    body = mesh_body(3, 4, "host-b", wait_ms=0)
    line = auth_line("PUT", "/global/spotring-mesh-3", body, mesh.tracker.generation)
    first = raw_put(mesh, "global", 3, body, line)
    first.settimeout(5)
    assert parse_answer(receive_all(first))[0] == 404  # taken, the others not there yet
    replay = raw_put(mesh, "global", 3, body, line)
    replay.settimeout(5)
    assert parse_answer(receive_all(replay))[0] == 409
    mesh.tracker.init(four_slot_plan())
    later = raw_put(mesh, "global", 3, body, line)
    later.settimeout(5)
    assert parse_answer(receive_all(later))[0] == 409
    assert mesh.httpd.meshes == {}
    assert_ring_forms(mesh)


def test_a_ranks_first_signed_addresses_are_final(mesh: Mesh) -> None:
    assert mesh.put("global", 2, mesh_body(2, 4, "host-b", wait_ms=0))[0] == 404
    other = mesh_body(2, 4, "host-b", wait_ms=0).replace(address(2, 0), address(9, 9))
    assert mesh.put("global", 2, other)[0] == 409  # signed, but not what rank 2 said
    assert mesh.put("global", 2, mesh_body(2, 4, "host-b", wait_ms=0))[0] == 404  # a retry
    assert_ring_forms(mesh)


def test_a_flood_of_unsigned_waiters_leaves_ring_formation_unaffected(mesh: Mesh) -> None:
    """Hundreds of unsigned mesh requests with long waits, in the ring's scopes and in
    process-set scopes, while the real ranks form: none is parked, the real ring forms
    at once, and every permit comes back."""
    permits = free_permits(mesh)
    scopes = ["global", "cross_0", "global_process_set_hash_ab", "local_host-a"]
    flood = [
        raw_put(mesh, scopes[n % 4], n % 2, mesh_body(n % 2, 2 if n % 4 else 4, "x", 20000))
        for n in range(300)
    ]
    started = time.monotonic()
    assert_ring_forms(mesh)
    assert time.monotonic() - started < 5
    for sock in flood:
        sock.settimeout(5)
        assert parse_answer(receive_all(sock))[0] in (401, 403)  # 403: not a ring's rank
        sock.close()
    wait_until(lambda: free_permits(mesh) == permits)
    assert mesh.httpd.mesh_waiters == 0
