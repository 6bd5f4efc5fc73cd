"""The run's side of durable checkpoints: the prefix's lock, and what a resume says.

One job owns a checkpoint prefix at a time (:class:`spotring.checkpoint.JobLock`):
the driver takes the lock before any worker starts and keeps its heartbeat fresh on a
thread of its own while the job runs; the same command run again after the driver
died takes it over (a dead owner on this host, or a stale heartbeat), another job is
refused with one line. The newest checkpoint's commit and age are said at start, and
at every resume, in the run's output and through ``spotring_ring_lost``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from spotring.core import ConfigurationError
from spotring.driver.options import DurableOptions

log = logging.getLogger(__name__)

LEASE_SECONDS = 60.0
"""A lock whose heartbeat is older is taken over by the same job."""
HEARTBEAT_SECONDS = LEASE_SECONDS / 4
STORE_TIMEOUT_SECONDS = 10.0


def checkpoint_summary(info: Any | None) -> dict[str, Any] | None:
    """A checkpoint's commit and age, as events and summaries give them."""
    if info is None:
        return None
    committed_at = float(info.meta.get("committed_at", info.created_at))
    return {
        "commits": int(info.meta.get("commits", info.step)),
        "age_seconds": round(max(0.0, time.time() - committed_at), 3),
        "committed_at": round(committed_at, 3),
        "name": info.name,
    }


class DurableJob:
    """The run's checkpoint prefix: locked while the job runs, read for its summary."""

    def __init__(self, options: DurableOptions, say: Callable[[str], None]) -> None:
        from spotring.checkpoint import Checkpoints, open_store

        self.options = options
        self._say = say
        # Short: the newest checkpoint is read on Horovod's thread as a new ring starts.
        self._store = open_store(options.uri, timeout_s=STORE_TIMEOUT_SECONDS)
        self._checkpoints = Checkpoints(self._store, job_id=options.job_id, keep=options.keep)
        self.at_start: dict[str, Any] | None = None
        """The newest checkpoint when the lock was taken: the first ring's start."""

    @contextlib.contextmanager
    def locked(self) -> Iterator[DurableJob]:
        """Hold the prefix's lock (with its heartbeat) while the block runs.

        Raises :class:`ConfigurationError` (one line) when another job or a live driver
        of this one holds it, or the store cannot be reached."""
        from spotring.checkpoint import CheckpointError, JobLock

        owner = f"{socket.gethostname()}:{os.getpid()}"
        lock = JobLock(self._store, job_id=self.options.job_id, owner=owner, lease_s=LEASE_SECONDS)
        try:
            lock.acquire()
            newest = self.at_start = checkpoint_summary(self._checkpoints.latest_info())
        except CheckpointError as error:
            raise ConfigurationError(f"--checkpoint {self.options.uri}: {error}") from None
        if newest is None:
            self._say(f"durable checkpoints to {self.options.uri} (none yet)")
        else:
            self._say(
                f"durable checkpoints to {self.options.uri}: the first ring resumes from "
                f"commit {newest['commits']} ({newest['age_seconds']:.0f} s old)"
            )
        stop = threading.Event()
        beat = threading.Thread(
            target=self._heartbeat, args=(lock, stop), name="spotring-lock", daemon=True
        )
        beat.start()
        try:
            yield self
        finally:
            stop.set()
            beat.join(timeout=5.0)
            with contextlib.suppress(CheckpointError, OSError):
                lock.release()

    def _heartbeat(self, lock: Any, stop: threading.Event) -> None:
        failures = 0
        while not stop.wait(HEARTBEAT_SECONDS):
            try:
                lock.heartbeat()
                failures = 0
            except Exception as error:  # said; the lease still holds for a while
                failures += 1
                log.warning("checkpoint lock heartbeat failed (%d in a row): %s", failures, error)

    def newest(self) -> dict[str, Any] | None:
        """The newest complete checkpoint's commit and age; None on none (or when the
        store cannot be read: a resume says so, the workers still load what is there)."""
        try:
            return checkpoint_summary(self._checkpoints.latest_info())
        except Exception as error:
            log.warning("cannot read the newest checkpoint of %s: %s", self.options.uri, error)
            return None
