"""One job per checkpoint prefix: a lock object that fences writers.

``lock.json`` names the job that owns the prefix and the driver process that holds it
now: a random token drawn by each :class:`JobLock` (never a host name or a PID, which
containers share), and a generation counted up by every acquisition. Every write of the
lock is conditional on the version read before it (S3 ``If-Match``/``If-None-Match``,
GCS ``ifGenerationMatch``, Azure ``If-Match``, a directory's guarded rename:
:meth:`~spotring.checkpoint.store.ObjectStore.put_if`), so of two drivers racing, one
wins, and a late heartbeat never overwrites a newer holder. A lock counts as abandoned
when its last write is older than the lease by the store's own clock (its Last-Modified
against the Date of the answer), or when it names a process of this very PID namespace
that is gone. Writers of checkpoints carry the :class:`Fence` they write under and
check it against the lock before each put or prune (:func:`check_fence`).
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import socket
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

from spotring.checkpoint.errors import (
    CheckpointError,
    CheckpointLockError,
    CheckpointLockLost,
    ObjectNotFoundError,
    ObjectTooLargeError,
)
from spotring.checkpoint.store import ObjectStore

log = logging.getLogger(__name__)

LOCK_KEY = "lock.json"
MAX_LOCK_BYTES = 64 * 2**10
"""A larger ``lock.json`` is not spotring's: it is not downloaded."""
FORMAT = 2
"""1: ``owner`` was ``host:pid`` and staleness the holder's own ``heartbeat_at``."""


# ------------------------------------------------------------------ processes


def process_identity() -> str:
    """This process, as only this process can be: ``boot id/PID namespace/pid/start
    time`` on Linux ('' elsewhere). Another process with the same PID (a container with
    the host's name, PID 1) has another namespace or start time."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as boot:
            boot_id = boot.read().strip()
        namespace = os.stat("/proc/self/ns/pid").st_ino
        pid = os.getpid()
        return f"{boot_id}/{namespace}/{pid}/{_start_time(pid)}"
    except (OSError, ValueError, IndexError):
        return ""


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (/proc/PID/stat, field 22)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rpartition(")")[2].split()[19]


def process_gone(identity: str) -> bool:
    """Whether ``identity`` (:func:`process_identity`) is a process of this boot and PID
    namespace that has exited (its PID free, or another process's now). A process this
    one cannot see (another host, container or boot) is never taken for gone."""
    mine = process_identity()
    if not identity or not mine or os.readlink("/proc/self") != str(os.getpid()):
        return False  # not Linux, or /proc is another namespace's
    parts = identity.split("/")
    if len(parts) != 4 or parts[:2] != mine.split("/")[:2] or not parts[2].isdigit():
        return False
    pid, started = int(parts[2]), parts[3]
    try:
        return _start_time(pid) != started
    except (OSError, IndexError):
        return True  # no such process


# ------------------------------------------------------------------ the lock object


@dataclass(frozen=True)
class Fence:
    """Whose checkpoints a writer writes: the lock's generation and holder when its
    driver started it. Travels to the workers as text (:meth:`encode`)."""

    generation: int
    owner: str

    def encode(self) -> str:
        return f"{self.generation}:{self.owner}"

    @classmethod
    def decode(cls, text: str) -> Fence:
        generation, _, owner = text.partition(":")
        if not generation.isdigit() or not owner:
            raise ValueError(f"not a checkpoint lock fence: {text!r}")
        return cls(int(generation), owner)


@dataclass(frozen=True)
class LockState:
    """What ``lock.json`` says. ``acquired_at`` is the holder's wall clock, shown to
    people only; nothing compares it with another clock."""

    job_id: str
    owner: str
    """The holder's random token."""
    generation: int
    held: bool
    """False once its holder released it: anyone may take it."""
    label: str = ""
    """Who holds it, for people: ``host:pid``."""
    process: str = ""
    """The holder's :func:`process_identity`."""
    acquired_at: float = 0.0
    write: str = ""
    """A random value per write: no two writes of the lock are the same bytes."""

    @property
    def fence(self) -> Fence:
        return Fence(self.generation, self.owner)

    def encode(self) -> bytes:
        document = {"format": FORMAT, **asdict(self), "write": secrets.token_hex(8)}
        return json.dumps(document, sort_keys=True).encode()

    @classmethod
    def decode(cls, raw: bytes) -> LockState:
        """ValueError if ``raw`` is not a lock of a format this code reads."""
        try:
            document: Any = json.loads(raw)
        except RecursionError as error:
            raise ValueError("nested too deeply") from error
        if not isinstance(document, dict):
            raise ValueError("not a JSON object")
        if document.get("format", 1) == 1:  # written by spotring before fencing
            document = {**document, "generation": 0, "held": True, "label": document.get("owner")}
        elif document.get("format") != FORMAT:
            raise ValueError(f"unsupported lock format {document.get('format')!r}")
        fields: dict[str, type | tuple[type, ...]] = {
            "job_id": str, "owner": str, "generation": int, "held": bool,
            "label": str, "process": str, "acquired_at": (int, float),
        }  # fmt: skip
        values: dict[str, Any] = {}
        for name, kind in fields.items():
            value = document.get(name, cls.__dataclass_fields__[name].default)
            wrong_bool = isinstance(value, bool) and kind is not bool
            if not isinstance(value, kind) or wrong_bool:
                raise ValueError(f"bad {name}")
            values[name] = value
        return cls(**values)


@dataclass(frozen=True)
class _Seen:
    """The lock as read: its state, its version and its age by the store's clock."""

    state: LockState
    version: str
    age_s: float


def _read(store: ObjectStore) -> _Seen | None:
    """``lock.json``, or None when there is none; :class:`CheckpointLockError` when it is
    not a lock spotring can read."""
    where = f"{store.uri}/{LOCK_KEY}"
    try:
        seen = store.get_versioned(LOCK_KEY, max_size=MAX_LOCK_BYTES)
    except ObjectNotFoundError:
        return None
    except ObjectTooLargeError as error:
        raise CheckpointLockError(f"{error}: it is not a spotring lock") from error
    try:
        return _Seen(LockState.decode(seen.data), seen.version, seen.age_s)
    except (ValueError, UnicodeDecodeError) as error:
        raise CheckpointLockError(
            f"{where} is not a lock spotring can read ({error}); delete it if no job is"
            " using this checkpoint prefix"
        ) from error


def check_fence(store: ObjectStore, job_id: str, fence: Fence) -> None:
    """Raise :class:`CheckpointLockLost` unless ``lock.json`` is still held by the
    holder and generation of ``fence`` for ``job_id``: a writer calls it before each
    put or prune, and stops writing when it raises."""
    seen = _read(store)
    state = seen.state if seen is not None else None
    if state is None or not state.held or state.job_id != job_id or state.fence != fence:
        raise CheckpointLockLost(
            f"{store.uri}/{LOCK_KEY} is {_whose(state)} now, not generation"
            f" {fence.generation} that this writer writes under"
        )


def _whose(state: LockState | None) -> str:
    if state is None:
        return "gone"
    if not state.held:
        return f"released (generation {state.generation})"
    who = state.label or state.owner
    return f"held by {who} (job {state.job_id!r}, generation {state.generation})"


def _ago(seconds: float) -> str:
    return f"{seconds:.0f} s ago" if seconds < 120 else f"{seconds / 60:.0f} min ago"


def _since(moment: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(moment))


# ------------------------------------------------------------------ the holder


class JobLock:
    """``lock.json`` under a checkpoint prefix: which job writes there and which driver
    of it holds it. Two jobs never share a prefix; a driver of the same job takes the lock
    over once its last write is older than ``lease_s`` (by the store's clock), or at once
    when its holder was a process of this PID namespace that is gone.

    Every change of the lock is conditional on the version read before it: of drivers
    racing for it, one wins; a heartbeat after another driver took over fails
    (:class:`CheckpointLockLost`) instead of overwriting it. :meth:`acquire` also checks
    that the store honours those conditions (an S3-compatible endpoint may ignore them).

    :param label: who this driver is, for people (default ``host:pid``); the identity
        that counts is :attr:`owner`, a random token.
    :param lease_s: how old the lock's last write may be before it counts as abandoned;
        heartbeat well within it (e.g. every ``lease_s / 4``).
    """

    def __init__(
        self, store: ObjectStore, *, job_id: str, label: str = "", lease_s: float = 60.0
    ) -> None:
        if lease_s <= 0:
            raise ValueError(f"lease_s must be positive, got {lease_s}")
        self.store = store
        self.job_id = job_id
        self.lease_s = lease_s
        self.owner = secrets.token_hex(16)
        self._state = LockState(
            job_id,
            self.owner,
            generation=0,
            held=True,
            label=label or f"{socket.gethostname()}:{os.getpid()}",
            process=process_identity(),
        )
        self._version: str | None = None

    @property
    def where(self) -> str:
        return f"{self.store.uri}/{LOCK_KEY}"

    @property
    def fence(self) -> Fence:
        """The generation this holder writes (or wrote) under, once it acquired."""
        if self._state.generation == 0:
            raise CheckpointLockError(f"{self.where} was never taken by this driver")
        return self._state.fence

    def acquire(self) -> None:
        """Take the prefix for this job, or raise :class:`CheckpointLockError` saying who
        holds it and what to do (:class:`CheckpointError` when the store cannot fence)."""
        for _ in range(5):  # the lock changed under us: look again
            seen = _read(self.store)
            taking_over = self._refuse_unless_free(seen) if seen is not None else None
            generation = seen.state.generation + 1 if seen is not None else 1
            state = replace(self._state, generation=generation, acquired_at=time.time())
            version = self.store.put_if(
                LOCK_KEY, state.encode(), seen.version if seen is not None else None
            )
            if version is not None:
                self._state, self._version = state, version
                self._check_the_store_fences()
                if taking_over:
                    log.warning(
                        "took %s of job %r over from %s", self.where, self.job_id, taking_over
                    )
                return
        raise CheckpointLockError(
            f"could not take {self.where}: other drivers keep changing it; try again"
        )

    def _refuse_unless_free(self, seen: _Seen) -> str:
        """Raise :class:`CheckpointLockError` unless the lock may be taken; whom it is
        taken over from, and why ('' for a released lock)."""
        held = seen.state
        if not held.held:
            return ""
        who = (
            f"driver {held.label or held.owner}, since {_since(held.acquired_at)}, last"
            f" written {_ago(seen.age_s)}"
        )
        if held.job_id != self.job_id:
            raise CheckpointLockError(
                f"checkpoint prefix {self.store.uri} belongs to job {held.job_id!r} ({who});"
                f" give job {self.job_id!r} another --checkpoint, or delete {self.where} if"
                f" job {held.job_id!r} is gone"
            )
        stale = seen.age_s > self.lease_s
        if not stale and not process_gone(held.process):
            raise CheckpointLockError(
                f"job {self.job_id!r} is already running with checkpoint prefix"
                f" {self.store.uri} ({who}); stop that driver first, or retry in"
                f" {max(0.0, self.lease_s - seen.age_s):.0f} s if it has died"
            )
        reason = f"last written {_ago(seen.age_s)}" if stale else "its process is gone"
        return f"{held.label or held.owner} ({reason})"

    def _check_the_store_fences(self) -> None:
        """Write the lock again under conditions that must fail (it exists; it has
        another version): a store that ignores them would fence nothing. What it says
        is the same either way."""
        same = self._state.encode()
        created = self.store.put_if(LOCK_KEY, same, None)
        replaced = self.store.put_if(LOCK_KEY, same, self.store.unused_version)
        if created is None and replaced is None:
            return
        self._version = created or replaced
        header = "If-None-Match" if created is not None else "If-Match"
        self.release()
        raise CheckpointError(
            f"{self.store.uri} ignores conditional writes ({header}): two drivers could"
            " both take the job's lock and write over each other's checkpoints; use a"
            " store that honours them (AWS S3 has since 2024, GCS, Azure Blob, a directory)"
        )

    def heartbeat(self) -> None:
        """Rewrite the lock, only over the version this holder wrote last.
        :class:`CheckpointLockLost` when another driver holds it now (this one must
        stop); :class:`CheckpointError` when the store cannot be reached."""
        if self._version is None:
            raise CheckpointLockError(f"{self.where} is not held")
        version = self.store.put_if(LOCK_KEY, self._state.encode(), self._version)
        if version is None:
            version = self._recover()
        self._version = version

    def _recover(self) -> str:
        """After a conditional write that failed: the version if the lock is still this
        holder's (a retried request whose first try had landed), or the lock taken back
        when it was deleted by hand; :class:`CheckpointLockLost` otherwise."""
        seen = _read(self.store)
        if seen is not None and seen.state.held and seen.state.owner == self.owner:
            return seen.version
        if seen is None:
            version = self.store.put_if(LOCK_KEY, self._state.encode(), None)
            if version is not None:
                log.warning("%s had been deleted; recreated it", self.where)
                return version
            seen = _read(self.store)
        raise CheckpointLockLost(
            f"lost {self.where}: it is {_whose(seen.state if seen else None)} now"
        )

    def release(self) -> None:
        """Mark the lock released if it is still this holder's (it stays, with its
        generation, for the next holder to count on)."""
        if self._version is None:
            return
        released = replace(self._state, held=False).encode()
        if self.store.put_if(LOCK_KEY, released, self._version) is None:
            seen = _read(self.store)  # a retried write of ours may have landed
            if seen is not None and seen.state.held and seen.state.owner == self.owner:
                self.store.put_if(LOCK_KEY, released, seen.version)
        self._version = None

    def __enter__(self) -> JobLock:
        self.acquire()
        return self

    def __exit__(self, *_: object) -> None:
        try:
            self.release()
        except CheckpointError as error:
            log.warning("could not release %s: %s", self.where, error)
