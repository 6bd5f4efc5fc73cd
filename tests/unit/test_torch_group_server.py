"""The in-place torch backend's coordinator server, attacked and used over real HTTP.

Each attack is sent as a client on the network would send it: without the job key
(unsigned, forged), with a signed request captured and replayed, stamped outside the
clock window, writing to a generation that is not forming, or overwriting a peer's
address; and the legitimate uses: a worker waiting for its membership, a group's keys,
an abandonment ending every wait on the generation at once.
"""

from __future__ import annotations

import http.client
import threading
import time
from collections.abc import Iterator
from datetime import timedelta

import pytest

from spotring.driver.torch_group_server import GroupServer
from spotring.torch.coordinator import Membership
from spotring.worker_image import wire

KEY = b"k" * 32


@pytest.fixture
def server() -> Iterator[GroupServer]:
    asked: list[str] = []
    server = GroupServer(KEY, "127.0.0.1", on_asked=asked.append)
    server.asked = asked  # type: ignore[attr-defined]  # the test reads what it was told
    server.start()
    yield server
    server.close()


def send(
    server: GroupServer, method: str, path: str, body: bytes = b"", *,
    key: bytes | None = KEY, signature: wire.Signature | None = None,
) -> tuple[int, bytes]:  # fmt: skip
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=40)
    headers = {}
    if signature is None and key is not None:
        signature = wire.sign_torch_request(key, method, path, body)
    if signature is not None:
        headers[wire.AUTH_HEADER] = signature.header()
    try:
        connection.request(method, path, body=body, headers=headers)
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


def test_a_worker_waits_for_its_membership_and_is_told_when_it_comes(server: GroupServer) -> None:
    server.admit("w0")
    server.admit("w1")
    status, _ = send(server, "GET", "/torch/member/w0/0?wait=100")
    assert status == 204  # nothing yet: ask again
    assert server.waiting() == {"w0"} and server.asked == ["w0"]  # type: ignore[attr-defined]
    answers: list[tuple[int, bytes]] = []
    waiter = threading.Thread(target=lambda: answers.append(
        send(server, "GET", "/torch/member/w0/0?wait=20000")))  # fmt: skip
    waiter.start()
    time.sleep(0.2)
    assert server.publish(["w1", "w0"], "127.0.0.1", abandon=False) == 0
    waiter.join(10)
    status, body = answers[0]
    assert status == 200
    index, _, place = body.decode().partition(" ")
    assert index == "0"
    assert Membership.decode(place) == Membership(0, 1, 2, "127.0.0.1", server.port)
    assert server.waiting() == set()
    assert send(server, "GET", "/torch/latest") == (200, b"0")


def test_an_unknown_worker_is_refused(server: GroupServer) -> None:
    assert send(server, "GET", "/torch/member/nobody/0?wait=10")[0] == 404
    server.admit("w0")
    server.forget("w0")
    assert send(server, "GET", "/torch/member/w0/0?wait=10")[0] == 404


def test_requests_without_the_job_key_are_refused_before_anything_is_stored(
    server: GroupServer,
) -> None:
    server.admit("w0")
    server.publish(["w0"], "127.0.0.1", abandon=False)
    path = "/torch/group/0/rank_0"
    assert send(server, "PUT", path, b"evil", key=None)[0] == 401
    assert send(server, "PUT", path, b"evil", key=b"x" * 32)[0] == 403
    # Reads that could park a thread need the key too.
    assert send(server, "GET", path + "?wait=20000", key=None)[0] == 401
    assert send(server, "GET", "/torch/member/w0/1?wait=20000", key=b"x" * 32)[0] == 403
    assert send(server, "GET", path)[0] == 204  # still nothing stored


def test_a_captured_request_is_refused_when_replayed(server: GroupServer) -> None:
    server.admit("w0")
    server.publish(["w0"], "127.0.0.1", abandon=False)
    path = "/torch/group/0/rank_0"
    signature = wire.sign_torch_request(KEY, "PUT", path, b"addr")
    assert send(server, "PUT", path, b"addr", signature=signature)[0] == 204
    assert send(server, "PUT", path, b"addr", signature=signature)[0] == 409
    read = wire.sign_torch_request(KEY, "GET", "/torch/latest")
    assert send(server, "GET", "/torch/latest", signature=read)[0] == 200
    assert send(server, "GET", "/torch/latest", signature=read)[0] == 409


def test_a_request_stamped_outside_the_clock_window_is_refused(server: GroupServer) -> None:
    stale_ms = int(time.time() * 1000) - wire.TORCH_CLOCK_SKEW_MS - 5000
    signature = wire.sign(KEY, "GET", "/torch/latest", stale_ms)
    assert send(server, "GET", "/torch/latest", signature=signature)[0] == 401


def test_a_peer_address_cannot_be_overwritten_and_only_the_forming_generation_takes_writes(
    server: GroupServer,
) -> None:
    server.admit("w0")
    server.publish(["w0"], "127.0.0.1", abandon=False)
    assert send(server, "PUT", "/torch/group/0/rank_0", b"real")[0] == 204
    assert send(server, "PUT", "/torch/group/0/rank_0", b"forged")[0] == 409
    assert send(server, "PUT", "/torch/group/0/rank_0", b"real")[0] == 204  # a retry
    assert send(server, "GET", "/torch/group/0/rank_0") == (200, b"real")
    assert send(server, "PUT", "/torch/group/7/rank_0", b"x")[0] == 410  # not published
    server.publish(["w0"], "127.0.0.1", abandon=False)
    assert send(server, "PUT", "/torch/group/0/other", b"x")[0] == 410  # superseded


def test_a_generation_holds_keys_and_bytes_bounded_by_its_size(server: GroupServer) -> None:
    server.admit("w0")
    server.publish(["w0"], "127.0.0.1", abandon=False)
    statuses = [send(server, "PUT", f"/torch/group/0/k{i}", b"v")[0] for i in range(80)]
    assert 413 in statuses and statuses.index(413) == 4 + 64  # KEYS_PER_MEMBER x 1 + EXTRA_KEYS


def test_abandoning_a_generation_ends_every_wait_on_it_at_once(server: GroupServer) -> None:
    server.admit("w0")
    server.admit("w1")
    server.publish(["w0", "w1"], "127.0.0.1", abandon=False)
    answers: list[tuple[int, bytes]] = []
    waits = [
        threading.Thread(target=lambda p=p: answers.append(send(server, "GET", p)))
        for p in ("/torch/group/0/rank_1?wait=25000", "/torch/abandoned/0?wait=25000")
    ]
    for wait in waits:
        wait.start()
    time.sleep(0.3)
    started = time.monotonic()
    server.publish(["w0"], "127.0.0.1", abandon=True)
    for wait in waits:
        wait.join(10)
    assert time.monotonic() - started < 5
    assert sorted(status for status, _ in answers) == [200, 410]
    assert send(server, "PUT", "/torch/group/0/rank_0", b"x")[0] == 410


def test_the_driver_coordinator_and_group_store_speak_the_servers_protocol(
    server: GroupServer,
) -> None:
    from spotring.torch.driver_coordinator import DriverCoordinator, GenerationGone

    server.admit("w0")
    coordinator = DriverCoordinator("127.0.0.1", server.port, "w0", KEY)
    assert coordinator.latest() == -1
    server.publish(["w0"], "127.0.0.1", abandon=False)
    place = coordinator.next_membership(after=-1)
    assert place.generation == 0 and place.rank == 0
    store = coordinator.group_store(place)
    store.set("a", b"1")
    store.wait(["a"], timedelta(seconds=5))
    assert store.get("a") == b"1" and store.check(["a"]) and not store.check(["b"])
    watch = coordinator.watch(0)
    server.abandon()
    assert watch.wait() is True
    with pytest.raises(GenerationGone):
        store.set("b", b"2")


def test_a_multi_get_answers_once_every_key_is_there(server: GroupServer) -> None:
    from spotring.torch.driver_coordinator import DriverCoordinator

    server.admit("w0")
    server.publish(["w0"], "127.0.0.1", abandon=False)
    assert send(server, "POST", "/torch/multi/0?wait=100", b"0\n1")[0] == 204
    send(server, "PUT", "/torch/group/0/0", b"zero")
    assert send(server, "POST", "/torch/multi/0?wait=100", b"0\n1")[0] == 204
    send(server, "PUT", "/torch/group/0/1", b"one")
    status, body = send(server, "POST", "/torch/multi/0", b"0\n1")
    assert status == 200 and wire.decode_values(body, 2) == [b"zero", b"one"]
    store = DriverCoordinator("127.0.0.1", server.port, "w0", KEY).group_store(
        Membership(0, 0, 1, "127.0.0.1", server.port)
    )
    assert store.multi_get(["1", "0"]) == [b"one", b"zero"]
    assert send(server, "POST", "/torch/multi/0", b"0\n1", key=None)[0] == 401
    server.abandon()
    assert send(server, "POST", "/torch/multi/0?wait=100", b"0\n1")[0] == 410


@pytest.mark.parametrize("data", [b"\x00\x00\x00\x05abc", b"\x00\x00", b"\x00\x00\x00\x01ab"])
def test_a_multi_get_answer_of_the_wrong_shape_is_refused(data: bytes) -> None:
    with pytest.raises(ValueError):
        wire.decode_values(data, 1)


def test_the_flush_request_is_told_only_while_the_driver_asks(server: GroupServer) -> None:
    from spotring.torch.driver_coordinator import DriverCoordinator

    server.admit("w0")
    coordinator = DriverCoordinator("127.0.0.1", server.port, "w0", KEY)
    assert coordinator.flush_requested() is False
    server.flush = True
    assert coordinator.flush_requested() is True
    assert send(server, "GET", "/torch/flush", key=None)[0] == 401


def test_a_worker_behind_is_handed_its_newest_membership(server: GroupServer) -> None:
    """A generation superseded before the worker asked may never form: it is skipped."""
    server.admit("w0")
    server.publish(["w0"], "127.0.0.1", abandon=False)
    server.publish(["w0"], "127.0.0.1", abandon=False)
    status, body = send(server, "GET", "/torch/member/w0/0")
    assert status == 200 and body.decode().startswith("1 1 0 1 ")


def test_a_generation_superseded_while_forming_ends_its_waits_one_formed_does_not(
    server: GroupServer,
) -> None:
    for worker in ("w0", "w1"):
        server.admit(worker)
    server.publish(["w0", "w1"], "127.0.0.1", abandon=False)
    send(server, "PUT", "/torch/group/0/0", b"a0")
    send(server, "PUT", "/torch/group/0/1", b"a1")  # every member wrote: it forms
    server.publish(["w0", "w1"], "127.0.0.1", abandon=False)
    # Generation 0 formed: a member still reading it (slow) gets its keys.
    assert send(server, "GET", "/torch/group/0/1") == (200, b"a1")
    assert send(server, "POST", "/torch/multi/1?wait=100", b"0\n1")[0] == 204
    send(server, "PUT", "/torch/group/1/0", b"b0")  # w1 never writes into generation 1
    answers: list[tuple[int, bytes]] = []
    waiter = threading.Thread(target=lambda: answers.append(
        send(server, "POST", "/torch/multi/1?wait=20000", b"0\n1")))  # fmt: skip
    waiter.start()
    time.sleep(0.2)
    started = time.monotonic()
    server.publish(["w0"], "127.0.0.1", abandon=False)  # generation 1 never formed
    waiter.join(10)
    assert answers[0][0] == 410 and time.monotonic() - started < 5


def test_a_multi_get_of_rank_keys_asks_for_every_ranks_at_once(server: GroupServer) -> None:
    """Gloo asks 128 rank keys at a time; the group's store asks for all of them in its
    first request, so a formation costs each rank one multi-get."""
    from spotring.torch.driver_coordinator import DriverClient, GroupStore

    members = [f"w{rank}" for rank in range(300)]
    for worker in members:
        server.admit(worker)
    server.publish(members, "127.0.0.1", abandon=False)
    for rank in range(300):
        assert send(server, "PUT", f"/torch/group/0/%2F0%2F{rank}", f"v{rank}".encode())[0] == 204

    class Counting(DriverClient):
        requests = 0

        def request(self, method: str, path: str, body: bytes = b"", *, wait_ms: int = 0
                    ) -> tuple[int, bytes]:  # fmt: skip
            Counting.requests += 1
            return super().request(method, path, body, wait_ms=wait_ms)

    store = GroupStore(Counting("127.0.0.1", server.port, KEY), 0, 300)
    got = [store.multi_get([f"/0/{r}" for r in range(first, min(first + 128, 300))])
           for first in range(0, 300, 128)]  # fmt: skip
    assert [v for values in got for v in values] == [f"v{r}".encode() for r in range(300)]
    assert Counting.requests == 1


def test_a_waiting_multi_get_is_answered_when_its_last_key_lands_in_any_order(
    server: GroupServer,
) -> None:
    server.admit("w0")
    server.publish(["w0", "w1", "w2"], "127.0.0.1", abandon=False)
    answers: list[tuple[int, bytes]] = []
    waiter = threading.Thread(
        target=lambda: answers.append(send(server, "POST", "/torch/multi/0?wait=20000", b"a\nb\nc"))
    )
    waiter.start()
    for key in ("b", "a"):  # "a" moves the waiter on to "c", still missing
        assert send(server, "PUT", f"/torch/group/0/{key}", key.encode())[0] == 204
    waiter.join(0.5)
    assert waiter.is_alive() and not answers
    send(server, "PUT", "/torch/group/0/c", b"c")
    waiter.join(10)
    status, body = answers[0]
    assert status == 200 and wire.decode_values(body, 3) == [b"a", b"b", b"c"]
