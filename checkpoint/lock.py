"""One job per checkpoint prefix: a lock object with a heartbeat, taken over when stale."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from spotring.checkpoint.errors import CheckpointError, CheckpointLockError, ObjectNotFoundError
from spotring.checkpoint.store import ObjectStore

log = logging.getLogger(__name__)

LOCK_KEY = "lock.json"


def default_owner() -> str:
    """This process as a lock owner: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    except OSError:
        return False
    return True


def _owner_gone(owner: str) -> bool:
    """Whether ``owner`` (``host:pid``) is a process of this host that is not running."""
    host, _, pid = owner.rpartition(":")
    if host != socket.gethostname() or not pid.isdigit():
        return False
    return int(pid) != os.getpid() and not _pid_alive(int(pid))


@dataclass(frozen=True)
class _Lock:
    job_id: str
    owner: str
    heartbeat_at: float
    acquired_at: float

    def encode(self) -> bytes:
        return json.dumps(
            {
                "format": 1,
                "job_id": self.job_id,
                "owner": self.owner,
                "heartbeat_at": self.heartbeat_at,
                "acquired_at": self.acquired_at,
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def decode(cls, raw: bytes) -> _Lock:
        document: Any = json.loads(raw)
        job_id, owner = document["job_id"], document["owner"]
        heartbeat_at = document["heartbeat_at"]
        if not isinstance(job_id, str) or not isinstance(owner, str):
            raise ValueError("job_id and owner must be strings")
        if isinstance(heartbeat_at, bool) or not isinstance(heartbeat_at, (int, float)):
            raise ValueError("heartbeat_at must be a number")
        acquired_at = document.get("acquired_at", heartbeat_at)
        return cls(job_id, owner, float(heartbeat_at), float(acquired_at))


def _ago(moment: float) -> str:
    seconds = max(0.0, time.time() - moment)
    return f"{seconds:.0f} s ago" if seconds < 120 else f"{seconds / 60:.0f} min ago"


def _since(moment: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(moment))


class JobLock:
    """``lock.json`` under a checkpoint prefix: which job writes there and which driver
    of it is alive. Two jobs never share a prefix; a driver restarted after a crash
    takes its job's lock over once the old one's heartbeat is older than ``lease_s``, or
    at once when the old owner was a process of this host that is gone.

    Taking over a stale lock is delete-then-create: two drivers of one job restarted at
    the same moment may both believe they won, and the loser finds out at its next
    :meth:`heartbeat`.

    :param owner: who holds it, ``host:pid`` (see :func:`default_owner`).
    :param lease_s: how old a heartbeat may be before the lock counts as abandoned;
        heartbeat well within it (e.g. every ``lease_s / 4``).
    """

    def __init__(
        self, store: ObjectStore, *, job_id: str, owner: str, lease_s: float = 60.0
    ) -> None:
        if lease_s <= 0:
            raise ValueError(f"lease_s must be positive, got {lease_s}")
        self.store = store
        self.job_id = job_id
        self.owner = owner
        self.lease_s = lease_s
        self._acquired_at = 0.0

    @property
    def where(self) -> str:
        return f"{self.store.uri}/{LOCK_KEY}"

    def _mine(self, now: float | None = None) -> _Lock:
        now = time.time() if now is None else now
        return _Lock(self.job_id, self.owner, now, self._acquired_at or now)

    def _read(self) -> _Lock | None:
        try:
            raw = self.store.get(LOCK_KEY)
        except ObjectNotFoundError:
            return None
        try:
            return _Lock.decode(raw)
        except (ValueError, KeyError, TypeError) as error:
            raise CheckpointLockError(
                f"{self.where} is not a lock spotring can read ({type(error).__name__});"
                " delete it if no job is using this checkpoint prefix"
            ) from error

    def acquire(self) -> None:
        """Take the prefix for this job, or raise :class:`CheckpointLockError` saying who
        holds it and what to do."""
        for _ in range(5):  # a lock deleted or taken over under us: look again
            now = time.time()
            self._acquired_at = now
            if self.store.create_exclusive(LOCK_KEY, self._mine(now).encode()):
                return
            held = self._read()
            if held is None:
                continue
            if held.job_id != self.job_id:
                raise CheckpointLockError(
                    f"checkpoint prefix {self.store.uri} belongs to job {held.job_id!r} (driver"
                    f" {held.owner}, since {_since(held.acquired_at)}, last heartbeat"
                    f" {_ago(held.heartbeat_at)}); give job {self.job_id!r} another"
                    f" --checkpoint, or delete {self.where} if job {held.job_id!r} is gone"
                )
            stale = now - held.heartbeat_at > self.lease_s
            if not (held.owner == self.owner or stale or _owner_gone(held.owner)):
                wait = max(0.0, self.lease_s - (now - held.heartbeat_at))
                raise CheckpointLockError(
                    f"job {self.job_id!r} is already running with checkpoint prefix"
                    f" {self.store.uri} (driver {held.owner}, since {_since(held.acquired_at)},"
                    f" last heartbeat {_ago(held.heartbeat_at)}); stop that driver first, or"
                    f" retry in {wait:.0f} s if it has died"
                )
            if held.owner != self.owner:
                reason = (
                    "its process is gone" if not stale else f"heartbeat {_ago(held.heartbeat_at)}"
                )
                log.warning(
                    "taking over %s of job %r from %s (%s)",
                    self.where,
                    self.job_id,
                    held.owner,
                    reason,
                )
            self.store.delete(LOCK_KEY)
        raise CheckpointLockError(
            f"could not take {self.where}: other drivers keep changing it; try again"
        )

    def heartbeat(self) -> None:
        """Refresh the lock's heartbeat; :class:`CheckpointLockError` if another owner
        holds it now (this driver must stop writing checkpoints)."""
        held = self._read()
        if held is None:
            # Deleted by hand: take it back if nobody else has.
            if self.store.create_exclusive(LOCK_KEY, self._mine().encode()):
                log.warning("%s had been deleted; recreated it", self.where)
                return
            held = self._read()
        if held is None or held.job_id != self.job_id or held.owner != self.owner:
            who = "nobody" if held is None else f"{held.owner} (job {held.job_id!r})"
            raise CheckpointLockError(
                f"lost {self.where}: it is held by {who} now; this driver stops writing"
                " checkpoints there"
            )
        self.store.put(LOCK_KEY, self._mine().encode())

    def release(self) -> None:
        """Delete the lock if it is still this owner's."""
        try:
            held = self._read()
        except CheckpointLockError:
            return
        if held is not None and held.job_id == self.job_id and held.owner == self.owner:
            self.store.delete(LOCK_KEY)

    def __enter__(self) -> JobLock:
        self.acquire()
        return self

    def __exit__(self, *_: object) -> None:
        try:
            self.release()
        except CheckpointError as error:
            log.warning("could not release %s: %s", self.where, error)
