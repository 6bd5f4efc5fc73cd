"""``RingTracker``: Horovod's rendezvous server, hardened, recording every ring."""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

from horovod.runner.http.http_server import (
    RendezvousServer,
)

from spotring.driver import horovod_internals
from spotring.driver.rendezvous.handler import HardenedRendezvousHandler
from spotring.driver.rendezvous.server import StoreServer
from spotring.driver.ring_events import RingFormation
from spotring.worker_image.wire import FLUSH_KEY, RING_SCOPE

log = logging.getLogger(__name__)


class RingTracker(RendezvousServer):
    """Horovod's rendezvous server, hardened, recording every ring the driver forms.

    Horovod calls ``init`` with the new slot plan at the start and after every reset,
    which makes it the one place that sees each ring. Each ring's generation is
    published in the server's store as ASCII digits, where workers read it after
    their ``init``; every slot of every plan is remembered, and only those may ask
    for a rank or register. ``formation`` hears of each ring planned.
    """

    def __init__(self, verbose: int = 0, formation: RingFormation | None = None):
        super().__init__(verbose)
        self.world_sizes: list[int] = []
        self._formation = formation

    @property
    def generation(self) -> int:
        """The current ring's number: 1 for the first ring, +1 per reset."""
        return len(self.world_sizes)

    def start(self, handler_cls: Any = None, address: str = "", *, job_key: bytes) -> int:
        """Listen on ``address`` (every interface if empty, as Horovod's); the port.

        ``handler_cls`` defaults to a plain hardened store; the elastic driver's comes
        from :func:`rendezvous_handler`. Every write must be signed with ``job_key``
        (see :mod:`spotring.worker_image.wire`).
        """
        handler_cls = handler_cls or HardenedRendezvousHandler
        verbose = horovod_internals.server_verbose(self)
        httpd = StoreServer((address, 0), handler_cls, verbose, job_key)
        listen_thread = threading.Thread(
            target=httpd.serve_forever, name="spotring-rendezvous", daemon=True
        )
        horovod_internals.set_http_server(self, httpd, listen_thread)
        listen_thread.start()
        return int(httpd.server_address[1])

    @property
    def httpd(self) -> StoreServer:
        """The HTTP server :meth:`start` started."""
        httpd: StoreServer = horovod_internals.http_server(self)
        return httpd

    def stop(self) -> None:
        if self.world_sizes:
            log.debug(
                "rendezvous: ring %d (scopes %s) served %s",
                self.generation,
                json.dumps(self.httpd.scope_size, sort_keys=True),
                json.dumps(dict(self.httpd.take_requests()), sort_keys=True),
            )
        super().stop()
        self.httpd.server_close()

    def abandon(self, generation: int) -> None:
        """A member of ring ``generation`` died: if that ring is still the current one,
        members still forming it are told at once, where they would otherwise wait for
        the dead member's address until Gloo's timeout (30 s). A member asking for an
        address that is not there gets an empty one, which Gloo rejects; spotring's
        Horovod build turns that into a failed ``hvd.init``, which the worker retries
        in the next ring. A ring already formed makes no such requests. Members past
        the store (connecting to their peers) that the driver cannot message yet ask
        for ``spotring/abandoned``, published here until the next ring clears it."""
        if generation == self.generation:
            self.httpd.abandon()

    def worker_launched(self, host: str, local_rank: int) -> None:
        """A worker was launched into the current ring with its rank (its environment
        names it: it sends no rank request). It forms this ring like a member told its
        rank: it may ask whether the ring was abandoned (its first ``init`` has no
        notification service for the driver to tell it), and a rank request of its
        slot later in this ring means it left it."""
        self.httpd.rank_given((host, local_rank))

    def request_flush(self) -> None:
        """After a notice, nobody would carry the current ring's state on: ask its rank
        0 to write the commit at which it stops to durable storage before it goes. The
        next ring's ``init`` clears the store, and the request with it."""
        httpd = self.httpd
        with httpd.cache_lock:
            value = str(self.generation).encode("ascii")
            httpd.cache.setdefault(RING_SCOPE, {})[FLUSH_KEY] = value

    def init(self, host_alloc_plan):
        httpd = self.httpd
        if self.world_sizes:
            log.debug(
                "rendezvous: ring %d (scopes %s) served %s",
                self.generation,
                json.dumps(httpd.scope_size, sort_keys=True),
                json.dumps(dict(httpd.take_requests()), sort_keys=True),
            )
        current = frozenset((slot.hostname, slot.local_rank) for slot in host_alloc_plan)
        self.world_sizes.append(len(host_alloc_plan))
        httpd.begin_ring(host_alloc_plan, self.generation, current)  # clears the store
        if self._formation is not None:
            hosts = sorted({slot.hostname for slot in host_alloc_plan})
            self._formation.ring_formed(len(host_alloc_plan), hosts)
