"""The one-request full mesh of spotring's Horovod build (``horovod-rendezvous.patch``):
one scope's exchange of host names and pair addresses. The request's and answer's
layout is the wire protocol's (:mod:`spotring.worker_image.wire`)."""

from __future__ import annotations

import collections
import logging
import socket

from spotring.driver.rendezvous.limits import (
    ENTRY_OVERHEAD_BYTES,
    HOSTNAME_MAX_BYTES,
    MESH_WAIT_SECONDS,
    PAIR_ADDRESS_MAX_BYTES,
)
from spotring.driver.rendezvous.refusal import HostileInput
from spotring.worker_image.wire import (  # the layout, byte by byte, is documented there
    MESH_ABANDONED as MESH_ABANDONED,  # re-exported
)
from spotring.worker_image.wire import MESH_ANSWER, MESH_HEADER, MESH_MAGIC, MESH_OK

log = logging.getLogger(__name__)


class MeshScope:
    """One Gloo scope's full-mesh exchange (spotring's Horovod build,
    ``worker_image/horovod-rendezvous.patch``): each rank ``PUT`` s its host name and
    its ``size - 1`` pair addresses once, and is answered, once every rank has, with
    its local rank and the one address of each peer's that is meant for it.

    The addresses are kept in one ``size x (size - 1) x entry`` array, written row by
    row as ranks arrive, so that each answer is two strided copies (O(N) bytes), not
    N slices of N whole values.
    """

    def __init__(self, size: int, entry: int) -> None:
        import numpy

        self.size = size
        self.entry = entry
        self.hosts: list[bytes | None] = [None] * size
        self.addresses = numpy.zeros((size, max(size - 1, 1), entry), dtype=numpy.uint8)
        self.count = 0
        self.charge = size * (max(size - 1, 1) * entry + 2 * ENTRY_OVERHEAD_BYTES)
        self.local_ranks: list[int] | None = None
        self.answered: set[int] = set()
        """Ranks that were answered their peers' addresses."""
        self.finished: set[int] = set()
        """Answered ranks that finished the scope (their ``DELETE``)."""
        self.dropped = False
        """A new ring replaced this one, or every rank finished it: its waiters are
        answered 404."""
        self.parked: dict[int, tuple[socket.socket, float]] = {}
        """Each rank waiting for the rest, ``rank: (connection, deadline)``, one per
        rank (a newer request replaces an older one): no thread waits with them; they
        are answered when the mesh is complete, the ring abandoned or replaced, or
        their deadline passes."""

    def put(self, rank: int, host: bytes, addresses: bytes | memoryview) -> bool:
        """Store rank ``rank`` 's host name and addresses; the first are final: False
        (nothing changed) when it already stored others."""
        import numpy

        row = numpy.frombuffer(addresses, dtype=numpy.uint8)
        shaped = row.reshape(max(self.size - 1, 1), self.entry)
        if self.hosts[rank] is not None:
            return self.hosts[rank] == host and bool(
                numpy.array_equal(self.addresses[rank], shaped)
            )
        self.addresses[rank] = shaped
        self.count += 1
        self.hosts[rank] = host
        if self.count == self.size and self.local_ranks is None:
            seen: collections.Counter[bytes | None] = collections.Counter()
            local_ranks = []
            for name in self.hosts:
                local_ranks.append(seen[name])
                seen[name] += 1
            self.local_ranks = local_ranks
        return True

    def answer(self, rank: int) -> memoryview:
        """What rank ``rank`` is answered once every rank is in: its local rank and,
        for each other rank ``i`` in order, entry ``rank`` (``rank - 1`` past ``i``)
        of ``i`` 's addresses, as Gloo's ``extractAddress`` takes it. Copied once,
        straight from the array into the answer."""
        import numpy

        assert self.local_ranks is not None
        peers = self.size - 1
        out = numpy.empty(MESH_ANSWER.size + peers * self.entry, dtype=numpy.uint8)
        view = out.data.cast("B")
        MESH_ANSWER.pack_into(view, 0, MESH_MAGIC, MESH_OK, self.local_ranks[rank], self.entry)
        body = out[MESH_ANSWER.size :].reshape(peers, self.entry)
        if rank:
            body[:rank] = self.addresses[:rank, rank - 1]
        if rank < peers:
            body[rank:] = self.addresses[rank + 1 :, rank]
        return view


def mesh_request(body: bytes, planned: int, exact: bool) -> tuple[int, float, bytes, memoryview]:
    """``(size, wait seconds, host name, addresses)`` from a ``spotring-mesh-<r>``
    body: its scope has ``planned`` ranks (``exact``), or at most that many (a process
    set's). Raises :class:`HostileInput` for anything else."""
    if len(body) < MESH_HEADER.size:
        raise HostileInput("a mesh request without its header")
    size, wait_ms, host_length = MESH_HEADER.unpack_from(body)
    if not 2 <= size <= planned or (exact and size != planned):
        raise HostileInput(f"a mesh of {size} ranks in a scope of {planned}")
    if host_length > HOSTNAME_MAX_BYTES:
        raise HostileInput(f"a host name of {host_length} bytes")
    host = body[MESH_HEADER.size : MESH_HEADER.size + host_length]
    addresses = memoryview(body)[MESH_HEADER.size + host_length :]  # not copied
    if len(host) != host_length:
        raise HostileInput("the body ended early")
    entry, rest = divmod(len(addresses), size - 1)
    if rest or not 0 < entry <= PAIR_ADDRESS_MAX_BYTES:
        raise HostileInput(f"{len(addresses)} bytes of addresses for {size - 1} peers")
    return size, min(wait_ms / 1000, MESH_WAIT_SECONDS), host, addresses


def mesh_body_limit(size: int) -> int:
    """The largest ``spotring-mesh-<r>`` body for a scope of ``size`` ranks."""
    return MESH_HEADER.size + HOSTNAME_MAX_BYTES + max(size - 1, 1) * PAIR_ADDRESS_MAX_BYTES
