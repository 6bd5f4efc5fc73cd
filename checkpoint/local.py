"""A checkpoint store in a local (or network-mounted) directory."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

from spotring.checkpoint.errors import CheckpointError, ObjectNotFoundError
from spotring.checkpoint.store import (
    ObjectStore,
    Versioned,
    check_key,
    check_prefix,
    check_size,
)

_CHUNK = 8 * 2**20
GUARD_TIMEOUT_SECONDS = 10.0
"""How long a conditional write waits for another one of the same key."""


def _is_temporary(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")


class LocalStore(ObjectStore):
    """Objects are files under ``root`` (created on the first write). A put writes a
    temporary file beside the target, fsyncs it and renames it into place, so a crash
    leaves the old file or the new one, never half of one.

    A conditional write (:meth:`put_if`) compares and renames while it holds ``flock``
    on a hidden guard file beside the key (Linux's NFS client turns it into a lock the
    server keeps): the kernel drops it with a process that dies, so none is ever left
    stale. A version is the SHA-256 of the bytes."""

    unused_version = "0" * 64  # no SHA-256 of anything written

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.uri = str(self.root)

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*check_key(key).split("/"))

    def _fail(self, action: str, key: str, error: OSError) -> CheckpointError:
        reason = error.strerror or type(error).__name__
        return CheckpointError(f"cannot {action} {self.uri}/{key}: {reason}")

    def _write_temporary(self, path: Path, data: bytes | memoryview) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        view = memoryview(data).cast("B")
        try:
            with open(temporary, "wb") as out:
                for start in range(0, len(view), _CHUNK):
                    out.write(view[start : start + _CHUNK])
                out.flush()
                os.fsync(out.fileno())
        except BaseException:
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise
        return temporary

    def _sync_directory(self, path: Path) -> None:
        # The rename is durable only once the directory entry is on disk too.
        with contextlib.suppress(OSError):
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def put(self, key: str, data: bytes | memoryview) -> None:
        path = self._path(key)
        try:
            temporary = self._write_temporary(path, data)
            try:
                os.replace(temporary, path)
            except BaseException:
                with contextlib.suppress(OSError):
                    temporary.unlink()
                raise
        except OSError as error:
            raise self._fail("write", key, error) from error
        self._sync_directory(path.parent)

    def get(self, key: str, *, max_size: int | None = None) -> bytes:
        return self._read(key, max_size)[0]

    def _read(self, key: str, max_size: int | None) -> tuple[bytes, float]:
        """The file's bytes and its mtime, from one open file."""
        path = self._path(key)
        try:
            with open(path, "rb") as file:
                status = os.fstat(file.fileno())
                check_size(self.uri, key, status.st_size, max_size)
                data = file.read() if max_size is None else file.read(max_size + 1)
        except FileNotFoundError as error:
            raise ObjectNotFoundError(f"{self.uri}/{key} does not exist") from error
        except OSError as error:
            raise self._fail("read", key, error) from error
        check_size(self.uri, key, len(data), max_size)  # it grew since the fstat
        return data, status.st_mtime

    def get_versioned(self, key: str, *, max_size: int) -> Versioned:
        data, modified = self._read(key, max_size)
        age = self._now(self._path(key).parent, key) - modified
        return Versioned(data, hashlib.sha256(data).hexdigest(), max(0.0, age))

    def _now(self, folder: Path, key: str) -> float:
        """The file system's clock: the mtime of a file created now in ``folder`` (on a
        network mount, the server's; the key's mtime came from there too)."""
        try:
            with self._temporary_file(folder) as (_, status):
                return status.st_mtime
        except OSError as error:
            raise self._fail("read the clock of", key, error) from error

    @contextlib.contextmanager
    def _temporary_file(self, folder: Path) -> Iterator[tuple[Path, os.stat_result]]:
        path = folder / f".clock.{secrets.token_hex(6)}.tmp"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            yield path, os.fstat(fd)
        finally:
            os.close(fd)
            with contextlib.suppress(OSError):
                path.unlink()

    def list(self, prefix: str = "") -> list[str]:
        check_prefix(prefix)
        # Walk only the deepest folder the prefix names.
        folder, _, _ = prefix.rpartition("/")
        start = self.root.joinpath(*folder.split("/")) if folder else self.root
        keys = []
        try:
            for directory, subdirectories, files in os.walk(start):
                subdirectories[:] = [d for d in subdirectories if not d.startswith(".")]
                relative = Path(directory).relative_to(self.root).as_posix()
                base = "" if relative == "." else relative + "/"
                for name in files:
                    key = base + name
                    if not _is_temporary(name) and key.startswith(prefix):
                        keys.append(key)
        except OSError as error:
            raise self._fail("list", prefix, error) from error
        return sorted(keys)

    def delete(self, key: str) -> None:
        path = self._path(key)
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        except OSError as error:
            raise self._fail("delete", key, error) from error
        # Folders left empty go too (a pruned checkpoint leaves none behind).
        parent = path.parent
        while parent != self.root and self.root in parent.parents:
            try:
                parent.rmdir()
            except OSError:
                break
            parent = parent.parent

    def put_if(self, key: str, data: bytes, version: str | None) -> str | None:
        path = self._path(key)
        try:
            temporary = self._write_temporary(path, data)
            try:
                with self._guard(path, key):
                    try:
                        current: str | None = hashlib.sha256(path.read_bytes()).hexdigest()
                    except FileNotFoundError:
                        current = None
                    if current != version:
                        return None
                    os.replace(temporary, path)
            finally:
                with contextlib.suppress(OSError):
                    temporary.unlink()
        except OSError as error:
            raise self._fail("write", key, error) from error
        self._sync_directory(path.parent)
        return hashlib.sha256(data).hexdigest()

    @contextlib.contextmanager
    def _guard(self, path: Path, key: str) -> Iterator[None]:
        """Hold the key's guard lock (waiting at most :data:`GUARD_TIMEOUT_SECONDS`)."""
        guard = path.with_name(f".{path.name}.guard.tmp")  # never listed
        fd = os.open(guard, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            deadline = time.monotonic() + GUARD_TIMEOUT_SECONDS
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise CheckpointError(
                            f"cannot write {self.uri}/{key}: another writer held {guard.name}"
                            f" for {GUARD_TIMEOUT_SECONDS:g} s"
                        ) from None
                    time.sleep(0.005)
            yield
        finally:
            os.close(fd)  # releases the lock
