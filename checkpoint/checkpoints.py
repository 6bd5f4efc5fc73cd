"""Checkpoints of one job in an object store: write, list, load the newest good one."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from spotring.checkpoint import manifest
from spotring.checkpoint.errors import (
    CheckpointError,
    ObjectCorruptError,
    ObjectNotFoundError,
    ObjectTooLargeError,
    one_line,
)
from spotring.checkpoint.lock import Fence, check_fence
from spotring.checkpoint.manifest import CheckpointInfo
from spotring.checkpoint.store import ObjectStore

log = logging.getLogger(__name__)

T = TypeVar("T")

_HASH_CHUNK = 16 * 2**20


class _Hashing:
    """SHA-256 of a buffer on a thread of its own, while the same bytes are uploaded:
    hashlib drops the GIL over large buffers, so the two overlap instead of adding up."""

    def __init__(self, view: memoryview) -> None:
        self._view = view
        self._digest = ""
        self._error: BaseException | None = None
        # A thread inherits its creator's scheduling priority (Linux nice is per thread).
        self._thread = threading.Thread(target=self._run, name="spotring-sha256", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            digest = hashlib.sha256()
            for start in range(0, len(self._view), _HASH_CHUNK):
                digest.update(self._view[start : start + _HASH_CHUNK])
            self._digest = digest.hexdigest()
        except BaseException as error:  # handed to the caller of result()
            self._error = error

    def result(self) -> str:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._digest


class Checkpoints:
    """The checkpoints under a store's prefix.

    A write puts the payload first and the manifest last: a checkpoint counts only once
    its manifest is there, so a writer that dies mid-upload leaves nothing a reader takes.
    A reader checks the payload's size (before downloading it) and SHA-256 against the
    manifest, so a damaged newest checkpoint costs its progress, never the job.

    :param store: where they are (see :func:`~spotring.checkpoint.open_store`).
    :param job_id: written into each manifest.
    :param keep: complete checkpoints kept after each write (the newest ones).
    :param fence: the job lock's generation this writer writes under: checked against
        ``lock.json`` before each put and each prune (:class:`CheckpointLockLost` once
        another driver holds it), and written into each manifest. None: unfenced (a
        reader, or a writer that holds no lock).
    """

    def __init__(
        self, store: ObjectStore, *, job_id: str, keep: int = 3, fence: Fence | None = None
    ) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.store = store
        self.job_id = job_id
        self.keep = keep
        self.fence = fence

    def _check_fence(self) -> None:
        if self.fence is not None:
            check_fence(self.store, self.job_id, self.fence)

    # ------------------------------------------------------------------ writing

    def write(
        self, step: int, payload: bytes | memoryview, meta: dict[str, Any] | None = None
    ) -> CheckpointInfo:
        """Store ``payload`` as the checkpoint of ``step`` and prune old ones.

        Returns what was written once its manifest is durable. Raises
        :class:`CheckpointError` if the payload or the manifest could not be stored (the
        previous checkpoints are untouched), :class:`CheckpointLockLost` if the fence no
        longer holds (nothing more is written); a failed prune is only logged.
        """
        if (
            isinstance(step, bool)
            or not isinstance(step, int)
            or not 0 <= step <= manifest.MAX_STEP
        ):
            raise CheckpointError(f"checkpoint step must be an integer 0..{manifest.MAX_STEP}")
        view = memoryview(payload).cast("B")
        created_at = time.time()
        info = CheckpointInfo(
            name=manifest.new_name(step, created_at),
            step=step,
            created_at=created_at,
            size=view.nbytes,
            sha256="0" * 64,  # known once the data is written
            job_id=self.job_id,
            meta=dict(meta or {}),
            lock_generation=self.fence.generation if self.fence is not None else None,
        )
        try:
            manifest.encode(info)
        except (TypeError, ValueError) as error:
            raise CheckpointError(f"checkpoint meta is not JSON: {one_line(error)}") from error
        self._check_fence()
        # The payload must not change until this returns: it is hashed while it is put.
        hashing = _Hashing(view)
        try:
            self.store.put(info.data_key, view)
        finally:
            sha256 = hashing.result()
        info = dataclasses.replace(info, sha256=sha256)
        self._check_fence()  # the manifest is what makes a checkpoint count
        self.store.put(info.manifest_key, manifest.encode(info))
        self._check_fence()
        try:
            self._prune(info.name)
        except CheckpointError as error:
            log.warning("could not prune old checkpoints in %s: %s", self.store.uri, error)
        return info

    def _prune(self, written: str) -> None:
        """Keep the newest ``keep`` complete checkpoints (always the one just written);
        delete older ones that are this job's (by their manifest: never another job's,
        nor one written under a newer lock generation than this writer's), and data
        without a manifest older than the newest complete."""
        names = self._scan()
        complete = [name for name, parts in names.items() if manifest.MANIFEST in parts]
        kept = set(complete[: self.keep])
        if written not in kept:  # e.g. newer steps of a run this one was restarted from
            kept = set(complete[: self.keep - 1]) | {written}
        newest = complete[0] if complete else written
        for name, parts in names.items():
            if name in kept:
                continue
            if manifest.MANIFEST in parts:
                if not self._own(name):
                    continue
                # Manifest first: the checkpoint stops counting before its data goes.
                self.store.delete(f"{name}/{manifest.MANIFEST}")
                self.store.delete(f"{name}/{manifest.DATA}")
            elif name < newest:  # a newer partial may be a write in progress
                self.store.delete(f"{name}/{manifest.DATA}")

    def _own(self, name: str) -> bool:
        """Whether this writer may delete checkpoint ``name``: its manifest is this
        job's, of this writer's lock generation or an older one (an unreadable one is
        nobody's checkpoint: it goes too)."""
        info = self._info(name)
        if info is None:
            return True
        ours = self.fence.generation if self.fence is not None else None
        newer = ours is not None and (info.lock_generation or 0) > ours
        return info.job_id == self.job_id and not newer

    # ------------------------------------------------------------------ reading

    def _scan(self) -> dict[str, set[str]]:
        """Checkpoint names, newest first, each with the objects it has (data, manifest)."""
        names: dict[str, set[str]] = {}
        for key in self.store.list(manifest.PREFIX):
            name, _, part = key.partition("/")
            if manifest.is_name(name) and part in (manifest.DATA, manifest.MANIFEST):
                names.setdefault(name, set()).add(part)
        return {name: names[name] for name in sorted(names, reverse=True)}

    def _manifests(self) -> Iterator[CheckpointInfo]:
        """The complete checkpoints, newest first (by name), reading each manifest only
        when the caller gets that far."""
        for name, parts in self._scan().items():
            if manifest.MANIFEST in parts:
                info = self._info(name)
                if info is not None:
                    yield info

    def _info(self, name: str) -> CheckpointInfo | None:
        """Checkpoint ``name``'s manifest; None when it is gone (pruned since the
        listing) or not a manifest (too large to download, unreadable)."""
        try:
            raw = self.store.get(
                f"{name}/{manifest.MANIFEST}", max_size=manifest.MAX_MANIFEST_BYTES
            )
            return manifest.decode(name, raw)
        except ObjectNotFoundError:
            return None
        except (ObjectTooLargeError, ValueError) as error:
            log.debug("ignoring checkpoint %s: bad manifest: %s", name, error)
            return None

    def list(self) -> list[CheckpointInfo]:
        """Every complete checkpoint (its manifest parses), newest first: by step, then
        by creation time."""
        return sorted(self._manifests(), key=lambda i: (i.step, i.created_at, i.name), reverse=True)

    def latest_info(self) -> CheckpointInfo | None:
        """The newest complete checkpoint's manifest, without downloading its data."""
        return next(self._manifests(), None)

    def load_latest(self) -> tuple[CheckpointInfo, bytes] | None:
        """The newest checkpoint whose data matches its manifest, and that data; None if
        there is none. A newer one that is incomplete or damaged is skipped with one
        warning naming it. Store errors (other than a missing object) are raised, not
        skipped: a flaky network must not roll the job back."""
        return self.load_latest_decoded(lambda data: data)

    def load_latest_decoded(self, decode: Callable[[bytes], T]) -> tuple[CheckpointInfo, T] | None:
        """As :meth:`load_latest`, with the data passed through ``decode``: a checkpoint
        whose data matches its manifest but that ``decode`` refuses (raises anything) is
        skipped with the same one warning, and the one before it tried."""
        for info in self._manifests():
            problem = self._check(info)
            if isinstance(problem, bytes):
                try:
                    return info, decode(problem)
                except Exception as error:  # whatever the bytes made it raise: damaged
                    problem = (
                        f"its data is not a checkpoint: {type(error).__name__}: {one_line(error)}"
                    )
            log.warning(
                "checkpoint %s/%s (step %d) is unusable (%s); trying the one before it",
                self.store.uri,
                info.name,
                info.step,
                problem,
            )
        return None

    def _check(self, info: CheckpointInfo) -> bytes | str:
        """The checkpoint's data if it matches the manifest, else what is wrong. A
        mismatch is read a second time first: it may have been damaged on the way."""
        problem = ""
        for _ in range(2):
            try:
                data = self.store.get(info.data_key, max_size=info.size)
            except ObjectNotFoundError:
                return "its data is missing"
            except ObjectTooLargeError:
                return f"its data is larger than the {info.size} bytes the manifest says"
            except ObjectCorruptError as error:
                problem = str(error)
                continue
            if len(data) != info.size:
                problem = f"{len(data)} bytes of data, the manifest says {info.size}"
            elif hashlib.sha256(data).hexdigest() != info.sha256:
                problem = "its data does not match the manifest's SHA-256"
            else:
                return data
        return problem
