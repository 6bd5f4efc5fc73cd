"""The object store interface the checkpoints are written through, and what its
backends share (key checks, a reader over bytes without copying them)."""

from __future__ import annotations

import abc
import email.utils
import io
import re
from dataclasses import dataclass
from datetime import datetime, timezone

from spotring.checkpoint.errors import CheckpointError, ObjectTooLargeError

# Printable, no backslash: the same key must mean the same object in every backend.
_KEY_PART = re.compile(r"[^\x00-\x1f\x7f\\]+")


def check_key(key: str) -> str:
    """``key`` if it is a valid store key: '/'-separated parts, none empty, none '.' or
    '..', none starting with '.' (the local store's temporary files do), no backslash."""
    parts = key.split("/") if isinstance(key, str) else [""]
    for part in parts:
        if not _KEY_PART.fullmatch(part) or part.startswith("."):
            raise CheckpointError(f"invalid checkpoint store key {key!r}")
    return key


def check_prefix(prefix: str) -> str:
    """A list prefix: '' or a key's beginning (it may end with '/')."""
    if prefix:
        check_key(prefix.rstrip("/") or "/")
    return prefix


@dataclass(frozen=True)
class Location:
    """A parsed checkpoint URI."""

    kind: str
    """``local``, ``s3``, ``gcs`` or ``azure``."""
    uri: str
    """The URI to show in messages (normalised, never with credentials)."""
    path: str = ""
    """``local``: the absolute directory."""
    bucket: str = ""
    """``s3``/``gcs``: the bucket; ``azure``: the container."""
    prefix: str = ""
    """Inside the bucket or container, without slashes at either end ('' for its root)."""
    account_url: str = ""
    """``azure``: the account's blob endpoint (``https://ACCOUNT.blob.core.windows.net``, or
    the emulator's ``http://127.0.0.1:PORT/devstoreaccount1``)."""
    emulator: bool = False
    """``azure``: a loopback emulator (Azurite), with its well-known development key."""


@dataclass(frozen=True)
class Versioned:
    """An object as one read saw it: its bytes, which write of it they are, and how long
    ago that write was, by the store's own clock."""

    data: bytes
    version: str
    """Opaque, different for every write of the key (S3 and Azure: the ETag; GCS: the
    generation; a directory: the SHA-256 of the bytes). :meth:`ObjectStore.put_if`
    compares it."""
    age_s: float
    """Seconds from the object's last write to this read, both times as the store tells
    them (its Last-Modified and its Date; a directory: a file's mtime against one it
    creates now), so clocks of other hosts never enter it; within a second or so."""


def seconds_between(earlier: datetime, later: datetime | str | None) -> float:
    """``later - earlier`` in seconds (0 when ``later`` is unknown or earlier): a store's
    Last-Modified against the Date of one of its answers (RFC 9110 HTTP-date text)."""
    if isinstance(later, str):
        try:
            later = email.utils.parsedate_to_datetime(later)
        except (TypeError, ValueError):
            later = None
    if later is None:
        return 0.0
    # RFC 5322's "-0000" zone parses naive; HTTP dates are UTC.
    earlier, later = (t if t.tzinfo else t.replace(tzinfo=timezone.utc) for t in (earlier, later))
    return max(0.0, (later - earlier).total_seconds())


def check_size(uri: str, key: str, size: int, max_size: int | None) -> None:
    """:class:`ObjectTooLargeError` when an object of ``size`` bytes exceeds ``max_size``
    (checked before its bytes are read)."""
    if max_size is not None and size > max_size:
        raise ObjectTooLargeError(
            f"{uri}/{key} has {size} bytes, more than the {max_size} expected"
        )


class ObjectStore(abc.ABC):
    """A flat key -> bytes store under one URI prefix (a directory, a bucket prefix, a
    container prefix). Keys are '/'-separated and relative to that prefix.

    Every call is bounded (the SDK's connect/read timeouts and retries with backoff) and
    raises :class:`CheckpointError` (:class:`ObjectNotFoundError` for a missing key on
    ``get``) with a one-line message. ``put`` is atomic: readers see the old object, or
    none, or the whole new one, never part of it.
    """

    uri: str
    """Where the store is, for messages; never contains credentials."""
    unused_version: str
    """A version no write ever has: :meth:`put_if` with it must fail (a check that the
    store honours the condition)."""

    @abc.abstractmethod
    def put(self, key: str, data: bytes | memoryview) -> None:
        """Write ``data`` to ``key``, replacing what was there. Large data goes through
        the SDK's multipart / resumable / block upload."""

    @abc.abstractmethod
    def get(self, key: str, *, max_size: int | None = None) -> bytes:
        """The object at ``key``; :class:`ObjectNotFoundError` if there is none, and
        :class:`ObjectTooLargeError`, before downloading it, if it has more than
        ``max_size`` bytes."""

    @abc.abstractmethod
    def get_versioned(self, key: str, *, max_size: int) -> Versioned:
        """The object at ``key`` with its version and age (one consistent read of a small
        object); errors as :meth:`get`."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Every key that starts with ``prefix``, sorted."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Delete ``key``; a missing key is fine."""

    @abc.abstractmethod
    def put_if(self, key: str, data: bytes, version: str | None) -> str | None:
        """Write ``data`` (a small object) to ``key`` only if the key's current version is
        ``version`` (None: only if the key does not exist), atomically: of several such
        calls against one version, one wins. The new version, or None when the condition
        did not hold (the object changed, appeared or disappeared since ``version``)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.uri!r})"


class BytesReader(io.RawIOBase):
    """A seekable, read-only file over bytes or a memoryview, without copying it (the
    SDKs' managed uploads want a file object; io.BytesIO copies a memoryview)."""

    def __init__(self, data: bytes | memoryview) -> None:
        super().__init__()
        self._view = memoryview(data).cast("B")
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        target = memoryview(buffer).cast("B")
        count = min(len(target), len(self._view) - self._pos)
        if count <= 0:
            return 0
        target[:count] = self._view[self._pos : self._pos + count]
        self._pos += count
        return count

    def read(self, size: int = -1) -> bytes:
        end = (
            len(self._view) if size is None or size < 0 else min(len(self._view), self._pos + size)
        )
        start, self._pos = self._pos, max(self._pos, end)
        return bytes(self._view[start:end])

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: len(self._view)}[whence]
        if base + offset < 0:
            raise ValueError("negative seek position")
        self._pos = base + offset
        return self._pos

    def tell(self) -> int:
        return self._pos

    def __len__(self) -> int:
        return len(self._view)
