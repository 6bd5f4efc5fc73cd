"""The run's side of durable checkpoints: the prefix's lock, and what a resume says.

One job owns a checkpoint prefix at a time (:class:`spotring.checkpoint.JobLock`):
the driver takes the lock before any worker starts and keeps it fresh on a thread of
its own while the job runs; the same command run again after the driver died takes it
over (its process gone from this PID namespace, or the lock unwritten for the lease by
the store's clock), another job is refused with one line. The workers learn the lock's
generation (:meth:`DurableJob.worker_env`) and write only while it holds. A driver whose
lock another driver took over, or that could not refresh it for a whole lease, stops the
job: workers first, then one line, exit 1. The newest checkpoint's commit and age are
said at start, and at every resume, in the run's output and through
``spotring_ring_lost``.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from spotring.core import ConfigurationError, ProviderError
from spotring.driver.options import DurableOptions

log = logging.getLogger(__name__)

LEASE_SECONDS = 60.0
"""A lock unwritten for longer (by the store's clock) is taken over by the same job."""
HEARTBEAT_SECONDS = LEASE_SECONDS / 4
STORE_TIMEOUT_SECONDS = 10.0
"""Each request to the checkpoint store the driver makes (the options' composition opens
it with this)."""


def checkpoint_summary(info: Any | None) -> dict[str, Any] | None:
    """A checkpoint's commit and age, as events and summaries give them."""
    if info is None:
        return None
    return {
        "commits": info.commits,
        "age_seconds": round(max(0.0, time.time() - info.committed_at), 3),
        "committed_at": round(info.committed_at, 3),
        "name": info.name,
    }


class DurableJob:
    """The run's checkpoint prefix: locked while the job runs, read for its summary."""

    def __init__(self, options: DurableOptions, say: Callable[[str], None]) -> None:
        from spotring.checkpoint import Checkpoints, open_store

        self.options = options
        self._say = say
        # Short: the newest checkpoint is read on Horovod's thread as a new ring starts.
        self._store = (
            options.store
            if options.store is not None
            else open_store(options.uri, timeout_s=STORE_TIMEOUT_SECONDS)
        )
        self._checkpoints = Checkpoints(self._store, job_id=options.job_id, keep=options.keep)
        self._fence = ""
        self._lost: ProviderError | None = None
        self._stop_job: Callable[[ProviderError], None] | None = None
        self._stop_lock = threading.Lock()
        self.at_start: dict[str, Any] | None = None
        """The newest checkpoint when the lock was taken: the first ring's start."""

    @property
    def lost(self) -> bool:
        """Whether this driver lost the prefix's lock (and stops the job)."""
        return self._lost is not None

    def worker_env(self) -> dict[str, str]:
        """What each worker is told: the checkpoint settings and the lock's generation
        it writes under (once :meth:`locked` holds it)."""
        from spotring.worker_image.wire import CHECKPOINT_FENCE_ENV

        return {**self.options.worker_env(), CHECKPOINT_FENCE_ENV: self._fence}

    def stop_job_with(self, stop: Callable[[ProviderError], None]) -> None:
        """Call ``stop`` (from any thread, once) with the error that says why, should
        the lock be lost: at once if it already is."""
        with self._stop_lock:
            self._stop_job = stop
            lost = self._lost
        if lost is not None:
            stop(lost)

    @contextlib.contextmanager
    def locked(self) -> Iterator[DurableJob]:
        """Hold the prefix's lock (kept fresh) while the block runs.

        Raises :class:`ConfigurationError` (one line) when another job or a live driver
        of this one holds it, or the store cannot be reached or cannot fence writers."""
        from spotring.checkpoint import CheckpointError, JobLock

        lock = JobLock(self._store, job_id=self.options.job_id, lease_s=LEASE_SECONDS)
        try:
            lock.acquire()
            self._fence = lock.fence.encode()
            newest = self.at_start = checkpoint_summary(self._checkpoints.latest_info())
        except CheckpointError as error:
            with contextlib.suppress(CheckpointError, OSError):
                lock.release()  # if it was taken: the job does not start
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
            target=self._keep, args=(lock, stop), name="spotring-lock", daemon=True
        )
        beat.start()
        try:
            yield self
        finally:
            stop.set()
            beat.join(timeout=5.0)
            with contextlib.suppress(CheckpointError, OSError):
                lock.release()

    def _keep(self, lock: Any, stop: threading.Event) -> None:
        """Refresh the lock every :data:`HEARTBEAT_SECONDS`; lose it when another driver
        holds it, or when no refresh went through for a whole lease (another driver may
        have taken it over by then)."""
        from spotring.checkpoint import CheckpointLockLost

        refreshed = time.monotonic()
        failures = 0
        while not stop.wait(HEARTBEAT_SECONDS):
            try:
                lock.heartbeat()
                refreshed, failures = time.monotonic(), 0
            except CheckpointLockLost as error:
                self._lose(str(error))
                return
            except Exception as error:  # said; the lease still holds for a while
                failures += 1
                log.warning("checkpoint lock heartbeat failed (%d in a row): %s", failures, error)
                if time.monotonic() - refreshed > LEASE_SECONDS:
                    self._lose(
                        f"could not refresh {lock.where} for {LEASE_SECONDS:.0f} s ({error}):"
                        " another driver may hold it now"
                    )
                    return

    def _lose(self, reason: str) -> None:
        error = ProviderError(
            f"--checkpoint {self.options.uri}: {reason}; this driver stops its workers and"
            " writes no more checkpoints there"
        )
        with self._stop_lock:
            self._lost = error
            stop = self._stop_job
        log.info("%s", error)  # the job's one line says it
        if stop is not None:
            stop(error)

    def newest(self) -> dict[str, Any] | None:
        """The newest complete checkpoint's commit and age; None on none (or when the
        store cannot be read: a resume says so, the workers still load what is there)."""
        try:
            return checkpoint_summary(self._checkpoints.latest_info())
        except Exception as error:
            log.warning("cannot read the newest checkpoint of %s: %s", self.options.uri, error)
            return None
