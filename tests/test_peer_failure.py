"""Worker side of the peer-failure abort: which sockets, and what shutting them does."""

from __future__ import annotations

import socket
import threading

from horovod.runner.elastic.worker import HostUpdateResult

from spotring.driver.peer_failure import PEER_FAILED, CollectiveAbort, own_tcp_sockets


def connected_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
    return client, accepted


def test_tracked_init_remembers_only_the_sockets_it_opened() -> None:
    unrelated = connected_pair()  # e.g. a data loader's connection, open before init
    opened: list[socket.socket] = []
    guard = CollectiveAbort()
    guard.track_init(lambda: opened.extend(connected_pair()))()
    try:
        assert guard.abort() == 2
        # The unrelated connection still works.
        unrelated[0].sendall(b"x")
        assert unrelated[1].recv(1) == b"x"
    finally:
        for sock in [*unrelated, *opened]:
            sock.close()


def test_abort_frees_a_blocked_receive_at_once() -> None:
    guard = CollectiveAbort()
    before = own_tcp_sockets()
    ours, peer = connected_pair()
    guard.remember(own_tcp_sockets() - before)
    received: list[bytes] = []
    reader = threading.Thread(target=lambda: received.append(ours.recv(1)))
    reader.start()  # blocked, like Gloo waiting on a peer that will never send
    assert guard.handle(HostUpdateResult(HostUpdateResult.removed | PEER_FAILED))
    reader.join(timeout=5)
    try:
        assert not reader.is_alive() and received == [b""]
    finally:
        ours.close()
        peer.close()


def test_plain_host_updates_are_left_to_horovod() -> None:
    guard = CollectiveAbort()
    before = own_tcp_sockets()
    ours, peer = connected_pair()
    guard.remember(own_tcp_sockets() - before)
    try:
        assert not guard.handle(HostUpdateResult.removed)
        assert not guard.handle(HostUpdateResult.added)
        peer.sendall(b"y")
        assert ours.recv(1) == b"y"
    finally:
        ours.close()
        peer.close()


def test_abort_touches_a_context_once() -> None:
    guard = CollectiveAbort()
    before = own_tcp_sockets()
    pair = connected_pair()
    guard.remember(own_tcp_sockets() - before)
    try:
        assert guard.abort() == 2
        assert guard.abort() == 0  # a later context is not the one that was aborted
    finally:
        for sock in pair:
            sock.close()


class Recorder:
    """Stands in for a worker's WorkerNotificationManager: records what arrives."""

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


def test_notifier_reaches_every_survivor_through_horovods_service() -> None:
    from horovod.runner.common.util import secret
    from horovod.runner.elastic.worker import (
        WorkerNotificationClient,
        WorkerNotificationService,
    )

    from spotring.driver.peer_failure import PeerFailureNotifier

    key = secret.make_secret_key()
    recorders = {host: Recorder() for host in ("host-0", "host-1", "host-2")}
    services = {h: WorkerNotificationService(key, "lo", r) for h, r in recorders.items()}
    try:
        clients = {
            (h, 0): WorkerNotificationClient(s.addresses(), key, verbose=0)
            for h, s in services.items()
        }
        notifier = PeerFailureNotifier()
        notifier.attach(Ring(clients))
        assert notifier.notify("host-1", 0) == 2
        assert recorders["host-1"].updates == [], "the dead worker is not told"
        for host in ("host-0", "host-2"):
            (update,) = recorders[host].updates
            assert update & PEER_FAILED and update & HostUpdateResult.removed
        # A worker outside the current ring (already blacklisted) triggers nothing.
        assert notifier.notify("host-9", 0) == 0
    finally:
        for service in services.values():
            service.shutdown()
