"""The object store interface the checkpoints are written through, and what its
backends share (key checks, a reader over bytes without copying them)."""

from __future__ import annotations

import abc
import io
import re
from dataclasses import dataclass

from spotring.checkpoint.errors import CheckpointError

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

    @abc.abstractmethod
    def put(self, key: str, data: bytes | memoryview) -> None:
        """Write ``data`` to ``key``, replacing what was there. Large data goes through
        the SDK's multipart / resumable / block upload."""

    @abc.abstractmethod
    def get(self, key: str) -> bytes:
        """The object at ``key``; :class:`ObjectNotFoundError` if there is none."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> list[str]:
        """Every key that starts with ``prefix``, sorted."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Delete ``key``; a missing key is fine."""

    @abc.abstractmethod
    def create_exclusive(self, key: str, data: bytes) -> bool:
        """Create ``key`` with ``data`` only if it does not exist, atomically: True if
        this call created it, False if it existed (whoever wins a race, one call does)."""

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
