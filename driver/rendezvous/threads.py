"""The server's threads: a few that serve connections one at a time, more only when
they are all held."""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

from spotring.driver.rendezvous.limits import STUCK_SECONDS, WORKER_IDLE_SECONDS

log = logging.getLogger(__name__)


class ThreadPool:
    """Daemon threads that each serve one connection at a time, started when none is
    idle and ended after :data:`WORKER_IDLE_SECONDS` idle: a ring's thousands of
    short requests do not each start a thread (and wait for it to start). How many
    run at once is the caller's bound."""

    def __init__(self, target: Callable[..., None], limit: int | None = None) -> None:
        self._target = target
        self._limit = limit
        self._threads = 0
        self._pending = 0
        self._progress = time.monotonic()
        self._queue: queue.SimpleQueue[tuple[Callable[..., None], tuple[Any, ...]]] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._idle = 0

    def submit(self, *item: Any) -> None:
        """Serve ``target(*item)`` on a thread."""
        self.submit_call(self._target, *item)

    def submit_call(self, call: Callable[..., None], *args: Any) -> None:
        """Run ``call(*args)`` on a thread."""
        with self._lock:
            start = self._idle == 0 and (self._limit is None or self._threads < self._limit)
            if start:
                self._threads += 1
            elif self._idle:
                self._idle -= 1  # that worker takes this item (or another's: any item)
            # else: at the limit, all busy: the next one free takes it
            self._pending += 1
        if start:
            threading.Thread(target=self._run, name="spotring-rendezvous", daemon=True).start()
        self._queue.put((call, args))

    def grow_if_stuck(self) -> None:
        """One more thread when work waits and no thread has taken any for
        :data:`STUCK_SECONDS` (every one is held, by slow clients)."""
        now = time.monotonic()
        with self._lock:
            stuck = self._pending > 0 and self._idle == 0 and now - self._progress > STUCK_SECONDS
            if stuck:
                self._threads += 1
                self._progress = now
        if stuck:
            threading.Thread(target=self._run, name="spotring-rendezvous", daemon=True).start()

    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=WORKER_IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    if self._idle > 0:  # not promised to an item on its way
                        self._idle -= 1
                        self._threads -= 1
                        return
                continue
            with self._lock:
                self._pending -= 1
                self._progress = time.monotonic()
            call, args = item
            try:
                call(*args)
            except Exception:  # a call's own errors are its own to report
                log.debug("rendezvous: a server task failed", exc_info=True)
            finally:
                with self._lock:
                    self._idle += 1
