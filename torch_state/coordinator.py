"""Where a worker of the in-place torch backend learns its membership: the coordinator.

A *generation* is one process group: its members, each one's rank, and the store its
Gloo (or NCCL) rendezvous runs through. The driver decides generations (it sees workers
die, hang and join); a worker asks for its place in the next one, and learns when the
one it is in has been given up. :class:`Coordinator` is that contract, the whole of it;
docs/torch.md states what the driver's implementation must guarantee (bounded,
authenticated, O(N) requests per formation).

:class:`StoreCoordinator` implements it over one ``torch.distributed`` TCPStore and
:class:`StorePublisher` is the driver's half of it over the same store: enough for
tests, the bench and one machine. A plain ``TCPStore`` has no authentication, so it is
not what a job on a network uses.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Protocol

import torch.distributed as dist

from spotring.worker_image.peer_abort import own_tcp_sockets, shutdown_sockets

__all__ = ["AbandonWatch", "Coordinator", "Membership", "StoreCoordinator", "StorePublisher"]

PREFIX = "spotring/"
LATEST_KEY = PREFIX + "latest"
"""The newest generation published, as ASCII digits."""

STORE_TIMEOUT = timedelta(seconds=30)
"""A store request's bound (connect, get, set)."""
LONG_WAIT = timedelta(hours=1)
"""One bounded wait for a key that may take long (the next membership, an abandonment);
waited again when it runs out."""


@dataclass(frozen=True)
class Membership:
    """One worker's place in one generation."""

    generation: int
    rank: int
    world_size: int
    master_addr: str
    """Host of the store the generation's process group rendezvouses through."""
    master_port: int

    def encode(self) -> str:
        return (
            f"{self.generation} {self.rank} {self.world_size} {self.master_addr} {self.master_port}"
        )

    @classmethod
    def decode(cls, text: str) -> Membership:
        generation, rank, world_size, addr, port = text.split(" ")
        return cls(int(generation), int(rank), int(world_size), addr, int(port))


class AbandonWatch(Protocol):
    """A wait for one generation to be abandoned, which another thread can end."""

    def wait(self) -> bool:
        """Block until the generation is abandoned (True) or :meth:`close` is called
        (False)."""
        ...

    def close(self) -> None:
        """End a :meth:`wait` in progress, and any later one, with False."""
        ...


class Coordinator(Protocol):
    """What a worker of the in-place mode needs from the driver."""

    def next_membership(self, after: int) -> Membership:
        """Block until this worker is a member of a generation newer than ``after``
        (-1: any), and return its place in it. Generations this worker is not in are
        passed over."""
        ...

    def latest(self) -> int:
        """The newest generation published so far (-1 before the first): one bounded read."""
        ...

    def watch(self, generation: int) -> AbandonWatch:
        """A watch for ``generation`` being abandoned: a member died or hangs, so its
        pending collectives will never complete."""
        ...

    def group_store(self, membership: Membership) -> dist.Store:
        """The store the generation's process group rendezvouses through (its keys
        apart from every other generation's)."""
        ...


class StoreCoordinator:
    """:class:`Coordinator` over a ``torch.distributed`` TCPStore (see the module).

    The publisher writes each worker's n-th membership under ``spotring/worker/ID/n``,
    so a worker waits on one key per formation and generations it is not in cost it
    nothing. A watch has a connection of its own (a TCPStore client serves one request
    at a time), which :meth:`_StoreWatch.close` shuts down to end its wait.

    :param host: the store's host.
    :param port: its port.
    :param worker_id: this worker's name in the publisher's memberships.
    """

    def __init__(self, host: str, port: int, worker_id: str) -> None:
        self._host, self._port = host, port
        self._store = dist.TCPStore(host, port, is_master=False, timeout=STORE_TIMEOUT)
        self._worker_id = worker_id
        self._received = 0

    def latest(self) -> int:
        if not self._store.check([LATEST_KEY]):
            return -1
        return int(self._store.get(LATEST_KEY))

    def next_membership(self, after: int) -> Membership:
        while True:
            key = _worker_key(self._worker_id, self._received)
            _wait_long(self._store, key)
            self._received += 1
            place = Membership.decode(self._store.get(key).decode())
            if place.generation > after:
                return place

    def watch(self, generation: int) -> _StoreWatch:
        return _StoreWatch(self._host, self._port, _abandoned_key(generation))

    def group_store(self, membership: Membership) -> dist.Store:
        store = dist.TCPStore(
            membership.master_addr, membership.master_port, is_master=False,
            timeout=STORE_TIMEOUT,
        )  # fmt: skip
        return dist.PrefixStore(f"{PREFIX}group/{membership.generation}/", store)


class _StoreWatch:
    """:class:`AbandonWatch` on its own TCPStore connection."""

    def __init__(self, host: str, port: int, key: str) -> None:
        before = own_tcp_sockets()
        self._store = dist.TCPStore(host, port, is_master=False, timeout=STORE_TIMEOUT)
        self._socket = own_tcp_sockets() - before
        self._key = key
        self._closed = threading.Event()

    def wait(self) -> bool:
        try:
            _wait_long(self._store, self._key, self._closed)
        except (dist.DistError, RuntimeError):
            if self._closed.is_set():
                return False
            raise
        return not self._closed.is_set()

    def close(self) -> None:
        self._closed.set()
        shutdown_sockets(self._socket)


def _wait_long(store: dist.Store, key: str, closed: threading.Event | None = None) -> None:
    """Wait for ``key`` for as long as it takes: a store wait is bounded, so wait again
    each time one runs out (unless ``closed``)."""
    while closed is None or not closed.is_set():
        try:
            store.wait([key], LONG_WAIT)
            return
        except dist.DistStoreError:  # the wait's time ran out (a lost connection is a
            continue  # DistNetworkError, which goes up)


def _worker_key(worker_id: str, n: int) -> str:
    return f"{PREFIX}worker/{worker_id}/{n}"


def _abandoned_key(generation: int) -> str:
    return f"{PREFIX}abandoned/{generation}"


class StorePublisher:
    """The driver's half of :class:`StoreCoordinator`: publishes generations.

    :param store: the store the workers' coordinators read (this process may host it).
    :param master_addr: where the workers reach that store.
    :param master_port: its port.
    """

    def __init__(self, store: dist.Store, master_addr: str, master_port: int) -> None:
        self._store = store
        self._addr = master_addr
        self._port = master_port
        self._handed: dict[str, int] = {}
        self.generation = -1

    def publish(self, members: list[str], *, abandon: bool = True) -> int:
        """Publish the next generation, whose ranks are the order of ``members`` (worker
        ids), and return its number.

        ``abandon`` (a member died or hangs): the current generation is given up first,
        so its members abort what they wait for and roll back to their last commit.
        Otherwise (a join) they move over at their next commit, nothing rolled back.
        """
        if abandon and self.generation >= 0:
            self.abandon()
        generation = self.generation + 1
        for rank, worker in enumerate(members):
            place = Membership(generation, rank, len(members), self._addr, self._port)
            n = self._handed.get(worker, 0)
            self._store.set(_worker_key(worker, n), place.encode())
            self._handed[worker] = n + 1
        self._store.set(LATEST_KEY, str(generation))
        self.generation = generation
        return generation

    def abandon(self) -> None:
        """Tell the members of the current generation that it is given up."""
        self._store.set(_abandoned_key(self.generation), "1")
