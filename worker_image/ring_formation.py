"""Worker side: join the next ring when a member dies while the ring is forming.

Each reset ends in ``hvd.init``, whose Gloo context connects every member to every
other. When a member dies during that (a spot reclaim, a kill), the others' connects
fail. Stock Horovod 0.28.1 lets that exception escape its background thread, so every
other member dies of ``std::terminate`` and the committed state in their memory dies
with them; when they were all the hosts of the previous ring, the job is over.
spotring's Horovod build (``worker_image/horovod-failure-paths.patch``, applied by
``scripts/setup.sh`` and by the hosts' bootstrap) makes ``hvd.init`` fail
with Horovod's "initialization failed" error instead. This wrapper then shuts Horovod
down and calls ``init`` again: the driver records the dead worker, the round ends
without it, and the process joins the next ring with its state intact.

A member that already read its peers' addresses is past the store: it waits in Gloo's
connect, or listens for a peer's connection, and a peer that died (or left the ring
because another one died) leaves it waiting out Gloo's connect timeout, five times
``HOROVOD_GLOO_TIMEOUT_SECONDS``. Registered members hear of the death from the driver
(:mod:`.peer_abort`); a member in its first ``init`` has no notification service yet
(Horovod starts it in ``hvd.elastic.run``), so :func:`watch_abandoned_formation` asks
the driver's rendezvous server whether the ring it forms was abandoned.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

FORMATION_FAILED = "Horovod initialization failed"
"""The start of the message of the ``ValueError`` ``hvd.init`` raises when it fails."""

MAX_ATTEMPTS = 10
"""Rings tried before giving up: a failure that repeats is not a dead peer."""

WATCH_AFTER_SECONDS = 1.0
"""A formation that takes longer starts asking whether its ring was abandoned (a
healthy one of a few ranks is done well before: no request at all)."""
WATCH_EVERY_SECONDS = 0.5


def retry_failed_formation(
    init: Callable[..., Any], shutdown: Callable[[], Any], attempts: int = MAX_ATTEMPTS
) -> Callable[..., Any]:
    """``init``, called again after ``shutdown`` when the ring failed to form."""

    def init_until_formed(*args: Any, **kwargs: Any) -> Any:
        attempt = 1
        while True:
            try:
                return init(*args, **kwargs)
            except ValueError as error:
                if not str(error).startswith(FORMATION_FAILED) or attempt >= attempts:
                    raise
            attempt += 1
            log.warning(
                "spotring: the ring failed to form (a member died while it formed?); "
                "joining the next one (attempt %d of %d)",
                attempt,
                attempts,
            )
            shutdown()

    init_until_formed.__wrapped__ = init  # type: ignore[attr-defined]  # as functools.wraps
    return init_until_formed


def watch_abandoned_formation(
    init: Callable[..., Any],
    abort_formation: Callable[[], int],
    read_abandoned: Callable[[], int | None],
    unreachable: Callable[[], bool],
    after: float = WATCH_AFTER_SECONDS,
    every: float = WATCH_EVERY_SECONDS,
) -> Callable[..., Any]:
    """``init``, watched while it runs when the driver cannot reach this worker
    (``unreachable()``: no notification service yet): once it has run ``after``
    seconds, every ``every`` seconds ``read_abandoned()`` (the generation of the current
    ring if a member of it died while it formed, else None) is asked, and for each
    abandoned generation ``abort_formation()`` shuts down the sockets of the ring being
    formed once: its ``init`` fails, and :func:`retry_failed_formation` joins the next.
    """

    def watched_init(*args: Any, **kwargs: Any) -> Any:
        try:
            watch = unreachable()
        except Exception as error:  # never break the script's init over the watch
            log.warning("spotring: cannot tell whether to watch the ring form: %s", error)
            watch = False
        if not watch:
            return init(*args, **kwargs)
        done = threading.Event()
        watcher = threading.Thread(
            target=_watch, args=(done, abort_formation, read_abandoned, after, every),
            name="spotring-formation-watch", daemon=True,
        )  # fmt: skip
        watcher.start()
        try:
            return init(*args, **kwargs)
        finally:
            done.set()

    watched_init.__wrapped__ = init  # type: ignore[attr-defined]  # as functools.wraps
    return watched_init


def _watch(
    done: threading.Event,
    abort_formation: Callable[[], int],
    read_abandoned: Callable[[], int | None],
    after: float,
    every: float,
) -> None:
    aborted: set[int] = set()
    if done.wait(after):
        return
    while True:
        try:
            generation = read_abandoned()
        except Exception as error:  # the driver gone or busy: Gloo's timeout still holds
            log.debug("spotring: cannot ask whether the ring was abandoned: %s", error)
            generation = None
        if generation is not None and generation not in aborted and not done.is_set():
            aborted.add(generation)
            count = abort_formation()
            log.warning(
                "spotring: a member of ring %d died while it formed; shut down %d "
                "sockets to join the next ring",
                generation,
                count,
            )
        if done.wait(every):
            return
