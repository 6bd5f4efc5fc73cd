"""A checkpoint store in a local (or network-mounted) directory."""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
from pathlib import Path

from spotring.checkpoint.errors import CheckpointError, ObjectNotFoundError
from spotring.checkpoint.store import ObjectStore, check_key, check_prefix

_CHUNK = 8 * 2**20


def _is_temporary(name: str) -> bool:
    return name.startswith(".") and name.endswith(".tmp")


class LocalStore(ObjectStore):
    """Objects are files under ``root`` (created on the first write). A put writes a
    temporary file beside the target, fsyncs it and renames it into place, so a crash
    leaves the old file or the new one, never half of one."""

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

    def get(self, key: str) -> bytes:
        path = self._path(key)
        try:
            return path.read_bytes()
        except FileNotFoundError as error:
            raise ObjectNotFoundError(f"{self.uri}/{key} does not exist") from error
        except OSError as error:
            raise self._fail("read", key, error) from error

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

    def create_exclusive(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        try:
            temporary = self._write_temporary(path, data)
            try:
                # link() fails if the target exists and publishes a complete file, where
                # O_EXCL would let a reader see it empty.
                os.link(temporary, path)
            except FileExistsError:
                return False
            except OSError as error:
                if error.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP):
                    raise
                return self._create_without_links(path, data)
            finally:
                with contextlib.suppress(OSError):
                    temporary.unlink()
        except OSError as error:
            raise self._fail("create", key, error) from error
        self._sync_directory(path.parent)
        return True

    def _create_without_links(self, path: Path, data: bytes) -> bool:
        """For file systems without hard links: O_EXCL, then write."""
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        return True
