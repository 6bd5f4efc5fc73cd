"""End the waits of a Gloo group still forming once its generation is abandoned.

Gloo's TCP transport (``gloo/transport/tcp``) connects each pair of a forming group from
one side: the member with the greater address connects and writes a sequence number
(with ``GLOO_ENABLE_RANK_AS_SEQUENCE_NUMBER=1``, its own rank: ``Context::
createAndConnectAllPairs``); the other waits on its device's listener for a connection
that names the rank of the peer it expects (``Listener::waitForConnection``). A peer
lost after it published its address never connects and never answers:

* a member waiting for its connection holds five times the group's timeout
  (``Pair::waitUntil``), and no socket of the pair exists that could be shut down;
* a member connecting to it is refused at once while the peer's host runs (Gloo's
  ``ConnectOperation`` retries three times, then fails), but waits the same five times
  when the host is gone and its SYNs go unanswered.

:func:`release` ends both: it connects to this process's own listener once for every
peer rank, writes that rank as Gloo's handshake does and closes, so a pair that waits
is handed a connection already closed (Gloo fails it: "Connection closed by peer"); and
:func:`shut_connects` shuts down connects still waiting for an answer. A connection for a
pair that was not waiting is kept by the listener, unmatched, until the group is
destroyed. Were Gloo's handshake to change, the connections would match no pair and the
waits would end at Gloo's own bound, as before.
"""

from __future__ import annotations

import contextlib
import socket
import struct
from collections.abc import Set

from spotring.worker_image.peer_abort import (
    listening_sockets,
    own_tcp_sockets,
    shutdown_sockets,
    tcp_sockets,
)

__all__ = ["release", "shut_connects"]

TCP_SYN_SENT = 2
"""``tcpi_state`` of a connect not yet answered (Linux ``include/net/tcp_states.h``)."""
HANDSHAKE_TIMEOUT_SECONDS = 1.0
"""How long one connection to this process's own listener may take."""


def release(before: Set[int], rank: int, world_size: int) -> int:
    """Hand every pair of the forming group that waits for its peer a closed connection
    and shut down its connects left unanswered (see the module); the connections made.

    ``before``: the inodes of this process's TCP sockets open before the group began
    forming (its listener is one opened since).
    """
    made = 0
    for address in _listeners(before):
        for peer in range(world_size):
            if peer == rank:
                continue
            try:
                with socket.create_connection(address, HANDSHAKE_TIMEOUT_SECONDS) as sock:
                    sock.sendall(struct.pack("@n", peer))  # Gloo's sequence_number_t: ssize_t
            except OSError:  # the group is gone already
                return made
            made += 1
    shut_connects(before)
    return made


def shut_connects(before: Set[int]) -> int:
    """Shut down this process's connects opened since ``before`` that no peer answered
    yet (Linux fails each at once; Gloo retries a failed one on a new socket, so call
    this until the formation ends); how many."""
    waiting = set()
    for inode, sock in tcp_sockets():
        if inode not in before:
            with contextlib.suppress(OSError):
                if sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == TCP_SYN_SENT:
                    waiting.add(inode)
    return shutdown_sockets(waiting)


def _listeners(before: Set[int]) -> list[tuple[str, int]]:
    """Where this process's listening TCP sockets opened since ``before`` are reached."""
    wildcard = {"0.0.0.0": "127.0.0.1", "::": "::1"}
    opened = listening_sockets(own_tcp_sockets() - before)
    return [(wildcard.get(host, host), port) for host, port in opened.values()]
