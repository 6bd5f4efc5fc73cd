"""The rendezvous server's bounds: what a request, the store, a wait and the server's
threads and connections may take, and what Gloo's keys weigh."""

from __future__ import annotations

import logging
import re

log = logging.getLogger(__name__)

_GLOO_KEY = re.compile(r"(rank_)?(0|[1-9][0-9]{0,8})\Z")  # as Gloo writes a rank


MAX_BODY_BYTES = 1 << 20
"""The largest ``PUT`` body taken. Gloo's largest value is one rank's addresses towards
every other rank, 136 bytes each (about 136 KiB for a 1,000-worker ring)."""

HOSTNAME_MAX_BYTES = 256
"""The largest ``rank_<r>`` value: Gloo's ``connectFullMesh`` stores the rank's host name
there, read with ``gethostname`` into a buffer of this size."""

PAIR_ADDRESS_MAX_BYTES = 256
"""What a ``<r>`` value may hold per other rank of its scope: Gloo stores one pair
address (136 bytes for its TCP transport: a ``sockaddr_storage`` and a sequence
number) for each; the rest is headroom."""

ENTRY_OVERHEAD_BYTES = 256
"""What one stored key is charged beyond its value (the dict entry, key and bytes
object), so that empty values are not free."""

STORE_HEADROOM = 2
"""The store may hold this many times the planned ring's full set of keys: a fast rank
starts the next context while a slow one still reads the last, and process sets
(``_process_set_hash_<h>`` scopes) add contexts of their own."""

MAX_STORE_BYTES = 512 << 20
"""The store's size whatever the plan: Gloo keeps about 136 N^2 bytes for one context
of N ranks (136 MiB at 1,024 ranks)."""

MAX_WORKER_ADDRESSES_BYTES = 128 << 10
"""The largest registration taken (Horovod's worker sends about 40 bytes per address)."""

REQUEST_DEADLINE_SECONDS = 10.0
"""How long a client has to send its whole request (line, headers and body)."""

MAX_CONNECTIONS = 4096
"""Most connections served at once (a thread each); more are closed unanswered. A ring
of N workers needs about 2 N: each worker's rank request waits for the whole ring, and
each polls Gloo's keys one request at a time."""

WORKER_IDLE_SECONDS = 30.0
"""How long a server thread waits for another connection before it ends."""

MAX_ADDRESSES = 16
"""Most addresses a registration may list. Horovod's worker sends each IPv4 address of
each interface (of the one it uses towards the driver, under spotring: usually one),
and the driver probes each."""

MAX_CONCURRENT_PROBES = 64
"""Most address probes the driver runs at once, over every registration (each is a
thread, of up to 3 attempts of up to 2 x :data:`ANSWER_TIMEOUT_SECONDS`)."""

PROBE_WAIT_SECONDS = 60.0
"""How long an address waits for a free probe; one that gets none is not probed."""

MAX_ANSWER_BYTES = 64 << 10
ANSWER_TIMEOUT_SECONDS = 20.0
"""The largest answer the driver takes from a worker's notification service (Horovod's
are about 150 bytes), and the most time it gives the connection and the whole answer,
each (a service that trickles its answer gets no more than one that says nothing)."""

MESH_WAIT_SECONDS = 10.0
"""The longest a ``spotring-mesh-<r>`` request is held waiting for the rest of its
scope; then it is answered 404 and asked again (until Gloo's own timeout)."""

MESH_WAITERS_MARGIN = 64
"""Mesh requests that may wait at once beyond twice the planned ring's ranks (each rank
waits in one scope at a time); more are refused with 429, which fails that member's
``init`` (a reset), never holds a thread."""

CONNECTION_THREADS = 8
"""Threads that serve connections, normally: a ring's ranks arriving at once queue for
them rather than each taking a thread (a thousand threads contending for the GIL cost
the driver more CPU than the requests themselves). When none of them has taken a
connection for :data:`STUCK_SECONDS` (slow clients hold them all), one more is started,
up to :data:`MAX_CONNECTIONS`."""

STUCK_SECONDS = 0.05

MESH_ANSWER_THREADS = 16
"""Threads that answer parked ranks (the answers of a mesh of N ranks go out 16 at a
time, not N threads at once); each answer is given :data:`REQUEST_DEADLINE_SECONDS`."""

NONCES_PER_SLOT = 64
NONCES_MARGIN = 4096
"""Signed requests taken per ring: :data:`NONCES_PER_SLOT` per planned slot plus
:data:`NONCES_MARGIN` (a worker makes a few per context; its nonces are remembered for
the ring, to refuse replays). More are refused with 429."""


def gloo_value_limit(size: int, key: str) -> int | None:
    """The largest value Gloo writes under ``key`` in a scope of ``size`` ranks; None
    when Gloo never writes that key there.

    Gloo's ``connectFullMesh`` (third_party/gloo/gloo/rendezvous/context.cc) writes
    ``rank_<r>`` (the rank's host name) and ``<r>`` (its address towards every other
    rank), each rank ``r`` once, through Horovod's ``HTTPStore`` under
    ``/<scope>/<key>``.
    """
    match = _GLOO_KEY.match(key)
    if match is None or int(match[2]) >= size:
        return None
    if match[1]:
        return HOSTNAME_MAX_BYTES
    return max(size - 1, 1) * PAIR_ADDRESS_MAX_BYTES


def store_budget(scope_size: dict[str, int]) -> int:
    """The bytes the store may hold for a ring whose Gloo scopes have ``scope_size``
    ranks: every key Gloo writes there at its largest, :data:`STORE_HEADROOM` times,
    and never more than :data:`MAX_STORE_BYTES`."""
    one_ring = 0
    for size in scope_size.values():
        per_rank = 2 * ENTRY_OVERHEAD_BYTES + HOSTNAME_MAX_BYTES
        one_ring += size * (per_rank + max(size - 1, 1) * PAIR_ADDRESS_MAX_BYTES)
    return min(MAX_STORE_BYTES, STORE_HEADROOM * one_ring)


def stored_values(cache: dict[str, dict[str, bytes]]) -> list[bytes]:
    return [value for entries in cache.values() for value in entries.values()]


def charge(value: bytes | None) -> int:
    """What a stored value counts against the store's budget (0: none stored)."""
    return 0 if value is None else len(value) + ENTRY_OVERHEAD_BYTES
