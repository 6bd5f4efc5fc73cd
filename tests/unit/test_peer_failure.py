"""The peer-failure abort: which sockets, which messages, and what reaches whom."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spotring.worker_image.peer_abort import (
    CollectiveAbort,
    PeerFailedRequest,
    own_tcp_sockets,
    patch_notification_service,
)
from spotring.worker_image.store_auth import AUTH_HEADER, sign
from tests.fakes.store_signing import JOB_KEY

KEY = bytes(range(32))


def connected_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
    return client, accepted


def guard_in_ring(generation: int = 3) -> tuple[CollectiveAbort, list[socket.socket]]:
    """A guard whose current context (ring ``generation``) is one connected pair."""
    guard = CollectiveAbort(KEY, lambda: generation)
    opened: list[socket.socket] = []
    guard.track_init(lambda: opened.extend(connected_pair()))()
    return guard, opened


def test_tracked_init_remembers_only_the_sockets_it_opened() -> None:
    unrelated = connected_pair()  # e.g. a data loader's connection, open before init
    guard, opened = guard_in_ring()
    try:
        assert guard.abort() == 2
        # The unrelated connection still works.
        unrelated[0].sendall(b"x")
        assert unrelated[1].recv(1) == b"x"
    finally:
        for sock in [*unrelated, *opened]:
            sock.close()


def test_a_valid_message_frees_a_blocked_receive_at_once() -> None:
    guard, (ours, peer) = guard_in_ring(generation=3)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(ours.recv(1)))
    reader.start()  # blocked, like Gloo waiting on a peer that will never send
    assert guard.handle(PeerFailedRequest.sign(KEY, 3, 1, "host-1[0]"))
    reader.join(timeout=5)
    try:
        assert not reader.is_alive() and received == [b""]
    finally:
        ours.close()
        peer.close()


@pytest.mark.parametrize(
    ("request_", "reason"),
    [
        (PeerFailedRequest.sign(b"x" * 32, 3, 1, "host-1[0]"), "bad signature"),
        (PeerFailedRequest(3, 1, "host-1[0]", b"\0" * 32), "bad signature"),
        (PeerFailedRequest(3, "1", "host-1[0]", b"\0" * 32), "bad signature"),  # type: ignore[arg-type]
        (PeerFailedRequest.sign(KEY, 2, 1, "host-1[0]"), "ring 2"),  # from an earlier ring
        ("update", "not a peer-failure message"),
    ],
)
def test_forged_stale_and_malformed_messages_leave_the_ring_alone(
    request_: object, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    guard, (ours, peer) = guard_in_ring(generation=3)
    try:
        with caplog.at_level(logging.WARNING):
            assert not guard.handle(request_)
        assert reason in caplog.text and guard.rejected == 1
        peer.sendall(b"y")
        assert ours.recv(1) == b"y", "the collective's sockets were touched"
    finally:
        ours.close()
        peer.close()


def test_a_replayed_message_is_rejected() -> None:
    guard, (ours, peer) = guard_in_ring(generation=3)
    message = PeerFailedRequest.sign(KEY, 3, 7, "host-1[0]")
    try:
        assert guard.handle(message)
        guard.context_formed(own_tcp_sockets(), 3)
        assert guard.check(message) == "replayed (sequence 7)"
        assert guard.check(PeerFailedRequest.sign(KEY, 3, 6, "host-1[0]")) is not None
        assert guard.check(PeerFailedRequest.sign(KEY, 3, 8, "host-1[0]")) is None
    finally:
        ours.close()
        peer.close()


def test_a_worker_without_the_job_key_accepts_nothing() -> None:
    guard = CollectiveAbort(None, lambda: 1)
    guard.context_formed((), 1)
    assert guard.check(PeerFailedRequest.sign(KEY, 1, 1, "h[0]")) == "this worker has no job key"


def test_abort_touches_a_context_once() -> None:
    guard, pair = guard_in_ring()
    try:
        assert guard.abort() == 2
        assert guard.abort() == 0  # a later context is not the one that was aborted
    finally:
        for sock in pair:
            sock.close()


def test_a_message_for_the_formed_ring_has_gloo_fail_its_waits_too() -> None:
    aborted: list[str] = []
    guard = CollectiveAbort(KEY, lambda: 3, lambda: aborted.append("contexts") or True)
    guard.context_formed((), 3)
    assert guard.handle(PeerFailedRequest.sign(KEY, 3, 1, "host-1[0]"))
    assert aborted == ["contexts"]


def test_the_contexts_of_a_ring_being_formed_are_not_failed_for_the_last_ring(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ring = FormingRing(monkeypatch)
    aborted: list[str] = []
    guard = CollectiveAbort(KEY, lambda: 4, lambda: aborted.append("contexts") or True)
    guard.context_formed((), 3)
    thread = ring.start(guard.track_init(guard.track_attempt(ring.init)))
    try:
        # Ring 3's contexts were shut down before this init began; ring 4's must live.
        assert guard.handle(PeerFailedRequest.sign(KEY, 3, 1, "host-8[0]"))
        # And a message for ring 4 aborts its formation by its sockets alone.
        assert guard.handle(PeerFailedRequest.sign(KEY, 4, 2, "host-9[0]"))
        thread.join(5)
        assert aborted == []
    finally:
        ring.close()


# ------------------------------------------------------------ through Horovod's service


class Recorder:
    """Stands in for a worker's WorkerNotificationManager: records Horovod's updates."""

    def __init__(self) -> None:
        self.updates: list[int] = []

    def handle_hosts_updated(self, timestamp: int, update_res: int) -> None:
        self.updates.append(int(update_res))


class Ring:
    """The three things PeerFailureNotifier asks of Horovod's ElasticDriver."""

    def __init__(self, clients: dict[tuple[str, int], object]) -> None:
        from horovod.runner.common.util.hosts import SlotInfo

        self.clients = clients
        self.host_assignments = {
            host: [SlotInfo(host, rank, 0, rank, len(clients), 1, len(clients))]
            for rank, (host, _) in enumerate(clients)
        }

    def has_rank_assignment(self, host: str, slot: int) -> bool:
        return host in self.host_assignments

    def get_worker_client(self, slot_info):  # type: ignore[no-untyped-def]
        return self.clients.get((slot_info.hostname, slot_info.local_rank))


def test_notifier_counts_deliveries_through_horovods_service(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from horovod.runner.common.util import secret
    from horovod.runner.elastic.worker import (
        WorkerNotificationClient,
        WorkerNotificationService,
    )

    from spotring.driver.peer_failure import PeerFailureNotifier

    monkeypatch.setattr(WorkerNotificationService, "_handle", WorkerNotificationService._handle)
    hosts = ("host-0", "host-1", "host-2", "host-3")
    guards = {h: CollectiveAbort(KEY, lambda: 5) for h in hosts}
    for guard in guards.values():
        guard.context_formed((), 5)
    by_service: dict[int, CollectiveAbort] = {}
    patch_notification_service(lambda service: by_service[id(service)])
    recorders = {h: Recorder() for h in hosts}
    worker_keys = {h: secret.make_secret_key() for h in hosts}
    services = {h: WorkerNotificationService(worker_keys[h], "lo", recorders[h]) for h in hosts}
    for host, service in services.items():
        by_service[id(service)] = guards[host]
    try:
        clients = {
            (h, 0): WorkerNotificationClient(s.addresses(), worker_keys[h], verbose=0)
            for h, s in services.items()
        }
        services["host-3"].shutdown()  # gone too: it cannot be told
        notifier = PeerFailureNotifier(KEY, lambda: 5)
        notifier.attach(Ring(clients))
        with caplog.at_level(logging.INFO):
            assert notifier.notify("host-1", 0) == 2
        assert "told 2 peers of host-1[0] that it died" in caplog.text
        # Nothing listens where host-3 was: gone too, not a peer left waiting.
        assert "host-3[0] (ConnectionRefusedError) gone too" in caplog.text
        assert "could not tell" not in caplog.text
        assert guards["host-1"].rejected == 0 and guards["host-1"]._last_sequence == -1
        for host in ("host-0", "host-2"):
            assert guards[host]._last_sequence == 1, f"{host} did not take the message"
        assert all(not r.updates for r in recorders.values()), "reached Horovod's listeners"
        # A worker outside the current ring (already blacklisted) triggers nothing.
        assert notifier.notify("host-9", 0) == 0
    finally:
        for host in ("host-0", "host-1", "host-2"):
            services[host].shutdown()


def test_ring_tracker_publishes_each_rings_generation(monkeypatch: pytest.MonkeyPatch) -> None:
    from horovod.runner.common.util.hosts import SlotInfo

    from spotring.driver.elastic import RingTracker
    from spotring.worker_image.peer_abort import _read_ring_generation

    tracker = RingTracker()
    port = tracker.start(job_key=JOB_KEY)
    monkeypatch.setenv("HOROVOD_GLOO_RENDEZVOUS_ADDR", "127.0.0.1")
    monkeypatch.setenv("HOROVOD_GLOO_RENDEZVOUS_PORT", str(port))
    try:
        plan = [SlotInfo("host-0", 0, 0, 0, 1, 1, 1)]
        tracker.init(plan)
        assert _read_ring_generation() == 1
        tracker.init(plan)
        assert _read_ring_generation() == 2
        assert tracker.world_sizes == [1, 1]
    finally:
        tracker.stop()


def test_ring_tracker_listens_only_on_the_address_it_is_given() -> None:
    from spotring.driver.elastic import RingTracker

    tracker = RingTracker()
    port = tracker.start(address="127.0.0.1", job_key=JOB_KEY)
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
        with pytest.raises(OSError):  # another loopback address: nothing listens there
            socket.create_connection(("127.0.0.2", port), timeout=5).close()
    finally:
        tracker.stop()


@settings(max_examples=200, deadline=None)
@given(
    generation=st.integers(min_value=-(2**40), max_value=2**40),
    sequence=st.integers(min_value=-(2**40), max_value=2**40),
    failed=st.text(max_size=40),
    mac=st.binary(max_size=64),
)
def test_random_messages_never_abort(
    generation: int, sequence: int, failed: str, mac: bytes
) -> None:
    guard = CollectiveAbort(KEY, lambda: 3)
    guard.context_formed((), 3)
    assert guard.check(PeerFailedRequest(generation, sequence, failed, mac)) is not None
    assert guard._last_sequence == -1


def test_random_bytes_to_a_workers_service_are_rejected_without_effect(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import os

    from horovod.runner.common.util import secret
    from horovod.runner.elastic.worker import WorkerNotificationService

    monkeypatch.setattr(WorkerNotificationService, "_handle", WorkerNotificationService._handle)
    guard = CollectiveAbort(KEY, lambda: 1)
    guard.context_formed((), 1)
    patch_notification_service(lambda service: guard)
    recorder = Recorder()
    service = WorkerNotificationService(secret.make_secret_key(), "lo", recorder)
    try:
        address = next(iter(service.addresses().values()))[0]
        for size in (0, 1, 36, 100, 5000):
            with socket.create_connection(address, timeout=5) as sock:
                sock.sendall(os.urandom(size))
                sock.shutdown(socket.SHUT_WR)
                sock.settimeout(5)
                assert sock.recv(100) == b"", "a reply to a message without a valid digest"
        assert recorder.updates == [] and guard._last_sequence == -1
    finally:
        service.shutdown()


def test_an_abandoned_ring_answers_missing_member_addresses_with_nothing() -> None:
    """Members waiting in Gloo's rendezvous for a dead member's address get an empty
    one at once (Gloo rejects it: the init fails and is retried), not a 30 s wait."""
    import urllib.error
    import urllib.request

    from horovod.runner.common.util.hosts import SlotInfo

    from spotring.driver.elastic import RingTracker

    tracker = RingTracker()
    port = tracker.start(address="127.0.0.1", job_key=JOB_KEY)

    def get(path: str) -> tuple[int, bytes]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
                return answer.status, answer.read()
        except urllib.error.HTTPError as error:
            return error.code, b""

    def put(path: str, body: bytes) -> None:
        signature = sign(JOB_KEY, "PUT", path, tracker.generation, body)
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}{path}",
            body,
            {AUTH_HEADER: signature.header()},
            method="PUT",
        )
        urllib.request.urlopen(request, timeout=5).close()

    try:
        plan = [SlotInfo(f"host-{i}", i, 0, i, 2, 1, 2) for i in range(2)]
        tracker.init(plan)
        put("/global/0", b"addresses of rank 0")
        tracker.abandon(tracker.generation - 1)  # an earlier ring: nothing changes
        assert get("/global/1") == (404, b"")
        tracker.abandon(tracker.generation)
        assert get("/global/1") == (200, b"")  # the dead member's: nothing
        assert get("/global/0") == (200, b"addresses of rank 0")  # what is there stays
        assert get("/global/rank_1")[0] == 404  # not an address key
        tracker.init(plan)  # the next ring forms normally
        assert get("/global/1") == (404, b"")
    finally:
        tracker.stop()


def inode(sock: socket.socket) -> int:
    return int(os.readlink(f"/proc/self/fd/{sock.fileno()}")[len("socket:[") : -1])


def test_own_tcp_sockets_are_this_process_tcp_connections_only() -> None:
    ours, peer = connected_pair()
    unix_a, unix_b = socket.socketpair()
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tcp = {inode(ours), inode(peer)}
    try:
        found = own_tcp_sockets()
        assert tcp <= found
        assert not {inode(unix_a), inode(unix_b), inode(udp)} & found
    finally:
        for sock in (ours, peer, unix_a, unix_b, udp):
            sock.close()
    assert not tcp & own_tcp_sockets()  # closed ones are gone


class FormingRing:
    """A worker forming ring 4 (ring 3 formed), as Gloo does it: connected to the
    rendezvous server, with a connection accepted by its notification service, and
    blocked in the accept of a pair whose peer never connects (it died); then, as Gloo
    goes on to its next context, in the accept of that context's pair."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.rendezvous = socket.create_server(("127.0.0.1", 0))
        monkeypatch.setenv("HOROVOD_GLOO_RENDEZVOUS_ADDR", "127.0.0.1")
        monkeypatch.setenv("HOROVOD_GLOO_RENDEZVOUS_PORT", str(self.rendezvous.getsockname()[1]))
        self.notification_service = socket.create_server(("127.0.0.1", 0))  # before init
        # The driver's end of a message it sends while the ring forms (another process
        # in real life: here it exists before init, so it is not the init's).
        self.driver_end = socket.create_connection(self.notification_service.getsockname())
        self.guard = CollectiveAbort(KEY, lambda: 4)
        self.guard.context_formed((), 3)
        self.listening = threading.Event()
        self.ended: list[str] = []
        self.kept: list[socket.socket] = []

    def init(self) -> None:
        store = socket.create_connection(self.rendezvous.getsockname())
        driver, _ = self.notification_service.accept()
        self.kept += [store, driver]
        for context in ("global", "cross"):
            with socket.create_server(("127.0.0.1", 0)) as pair:
                self.listening.set()
                try:
                    pair.accept()
                    self.ended.append(f"{context}: a peer connected")
                except OSError as error:
                    self.ended.append(f"{context}: failed: {error}")

    def start(self, init: object) -> threading.Thread:
        thread = threading.Thread(target=init, daemon=True)
        thread.start()
        assert self.listening.wait(5)
        return thread

    def assert_only_gloo_was_shut_down(self) -> None:
        store, driver = self.kept
        for sock in (store, driver):  # still connected: a send works, nothing was shut
            sock.sendall(b"x")
        self.close()

    def close(self) -> None:
        for sock in (*self.kept, self.driver_end, self.rendezvous, self.notification_service):
            sock.close()


def test_a_message_for_the_ring_being_formed_frees_a_member_waiting_for_a_dead_peer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ring = FormingRing(monkeypatch)
    thread = ring.start(ring.guard.track_init(ring.guard.track_attempt(ring.init)))
    # A late message for the ring already formed leaves the formation alone.
    assert ring.guard.handle(PeerFailedRequest.sign(KEY, 3, 1, "host-8[0]"))
    thread.join(0.3)
    assert thread.is_alive() and ring.ended == []
    assert ring.guard.handle(PeerFailedRequest.sign(KEY, 4, 2, "host-9[0]"))
    thread.join(5)
    # The next context's pair, opened after the abort, failed too: no half-formed ring.
    assert not thread.is_alive() and all("failed" in end for end in ring.ended), ring.ended
    assert len(ring.ended) == 2
    ring.assert_only_gloo_was_shut_down()


def test_a_message_for_a_ring_newer_than_the_last_formed_is_refused_outside_init() -> None:
    guard = CollectiveAbort(KEY, lambda: 4)
    guard.context_formed((), 3)
    assert guard.check(PeerFailedRequest.sign(KEY, 4, 1, "host-9[0]")) is not None


def test_a_first_init_leaves_a_ring_abandoned_while_it_formed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A member the driver cannot message yet (its first init) asks the rendezvous
    server, and leaves the ring it forms once a member of it died."""
    from horovod.runner.common.util.hosts import SlotInfo

    from spotring.driver.elastic import RingTracker
    from spotring.worker_image.peer_abort import ABANDONED_KEY, read_generation_key
    from spotring.worker_image.ring_formation import watch_abandoned_formation

    tracker = RingTracker()
    port = tracker.start(address="127.0.0.1", job_key=JOB_KEY)
    ring = FormingRing(monkeypatch)
    monkeypatch.setenv("HOROVOD_GLOO_RENDEZVOUS_PORT", str(port))
    asked: list[int | None] = []

    def read_abandoned() -> int | None:
        asked.append(read_generation_key(ABANDONED_KEY))
        return asked[-1]

    try:
        plan = [SlotInfo(f"host-{i}", i, 0, i, 2, 1, 2) for i in range(2)]
        tracker.init(plan)
        watched = watch_abandoned_formation(
            ring.guard.track_attempt(ring.init),
            ring.guard.abort_formation,
            read_abandoned,
            lambda: True,
            0.05,
            0.05,
        )
        thread = ring.start(ring.guard.track_init(watched))
        thread.join(0.5)
        assert thread.is_alive() and ring.ended == [] and asked and set(asked) == {None}
        tracker.abandon(tracker.generation)
        thread.join(5)
        assert not thread.is_alive() and all("failed" in end for end in ring.ended)
        assert asked[-1] == tracker.generation
        tracker.init(plan)  # the next ring: nothing abandoned
        assert read_generation_key(ABANDONED_KEY) is None
    finally:
        ring.close()
        tracker.stop()


def test_a_member_asking_for_its_rank_again_abandons_the_ring_it_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A member whose ``init`` failed asks for its rank again and waits (at Horovod's
    barrier) for the next ring; the others still forming the ring it left (a new worker
    in Gloo's connect, waiting for it) hear that ring was abandoned instead of waiting
    out five times Gloo's timeout (150 s seen in bench/kills). The member that left is
    not told: it would abort the next ring's formation for the last one's."""
    import urllib.request

    from horovod.runner.common.util.hosts import SlotInfo

    from spotring.driver.elastic import RingTracker
    from spotring.driver.rendezvous import rendezvous_handler
    from spotring.worker_image.peer_abort import ABANDONED_KEY, read_generation_key

    next_ring = threading.Event()

    class Driver:  # Horovod's barrier: a slot asking again waits for the next ring
        def __init__(self) -> None:
            self.asked: set[str] = set()

        def record_ready(self, host: str, slot: int) -> None:
            if host in self.asked:
                assert next_ring.wait(10)
            self.asked.add(host)

        def get_slot_info(self, host: str, slot: int) -> Any:
            rank = int(host.rsplit("-", 1)[1])
            return SlotInfo(host, rank, slot, rank, 2, 1, 2)

        def register_worker_server(self, *args: Any) -> None:
            pass

    tracker = RingTracker()
    port = tracker.start(rendezvous_handler(Driver()), "127.0.0.1", job_key=JOB_KEY)
    monkeypatch.setenv("HOROVOD_GLOO_RENDEZVOUS_ADDR", "127.0.0.1")
    monkeypatch.setenv("HOROVOD_GLOO_RENDEZVOUS_PORT", str(port))

    def ask_rank(host: str) -> None:
        path = f"/rank_and_size/{host}:0"
        signature = sign(JOB_KEY, "GET", path, tracker.generation)
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}{path}", headers={AUTH_HEADER: signature.header()}
        )
        urllib.request.urlopen(request, timeout=10).close()

    def abandoned(host: str | None = None) -> int | None:
        return read_generation_key(ABANDONED_KEY + (f".{host}:0" if host else ""))

    plan = [SlotInfo(f"host-{i}", i, 0, i, 2, 1, 2) for i in range(2)]
    asking_again = threading.Thread(target=ask_rank, args=("host-0",))
    try:
        tracker.init(plan)
        ask_rank("host-0")
        ask_rank("host-1")
        assert abandoned() is None and abandoned("host-1") is None  # both forming it
        asking_again.start()  # host-0's init failed: it left the ring
        deadline = time.monotonic() + 10
        while abandoned() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert abandoned() == tracker.generation
        assert abandoned("host-1") == tracker.generation  # still forming it: told
        assert abandoned("host-0") is None  # waiting for the next ring: not told
        tracker.init(plan)  # the next ring
        next_ring.set()
        asking_again.join(10)
        assert abandoned() is None and abandoned("host-0") is None
    finally:
        next_ring.set()
        tracker.stop()


def test_a_formation_the_driver_can_message_is_not_watched() -> None:
    from spotring.worker_image.ring_formation import watch_abandoned_formation

    asked: list[int] = []
    watched = watch_abandoned_formation(
        lambda: "formed", lambda: 0, lambda: asked.append(1), lambda: False, 0.0, 0.01
    )
    assert watched() == "formed" and asked == []


def test_a_first_init_asks_about_its_own_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    from spotring.worker_image.peer_abort import ABANDONED_KEY, _abandoned_key

    monkeypatch.delenv("HOROVOD_HOSTNAME", raising=False)
    assert _abandoned_key() == ABANDONED_KEY
    monkeypatch.setenv("HOROVOD_HOSTNAME", "host-11")
    monkeypatch.setenv("HOROVOD_LOCAL_RANK", "0")
    assert _abandoned_key() == f"{ABANDONED_KEY}.host-11:0"


def test_a_worker_launched_into_a_ring_hears_it_was_abandoned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A worker launched (or started ahead and joined) into a ring takes its rank from
    its environment and sends no rank request; in its first ``init`` the driver cannot
    message it either. When a member dies while that ring forms, the ring's abandoned
    key for its slot is what frees it: without it, it waited out Gloo's timeout (found by
    bench/kills: a member killed 25 ms after a ring with a joining warm worker was
    planned, the newcomer failed after 30 s)."""
    from horovod.runner.common.util.hosts import SlotInfo

    from spotring.driver.elastic import RingTracker
    from spotring.worker_image.peer_abort import ABANDONED_KEY, read_generation_key

    tracker = RingTracker()
    port = tracker.start(address="127.0.0.1", job_key=JOB_KEY)
    monkeypatch.setenv("HOROVOD_GLOO_RENDEZVOUS_ADDR", "127.0.0.1")
    monkeypatch.setenv("HOROVOD_GLOO_RENDEZVOUS_PORT", str(port))
    try:
        tracker.init([SlotInfo(f"host-{i}", i, 0, i, 3, 1, 3) for i in range(3)])
        tracker.worker_launched("host-2", 0)  # the newcomer, as run_elastic launches it
        tracker.abandon(tracker.generation)  # host-1 died while the ring formed
        assert read_generation_key(f"{ABANDONED_KEY}.host-2:0") == tracker.generation
    finally:
        tracker.stop()
