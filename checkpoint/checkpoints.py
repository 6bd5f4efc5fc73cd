"""Checkpoints of one job in an object store: write, list, load the newest good one."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterator
from typing import Any

from spotring.checkpoint import manifest
from spotring.checkpoint.errors import (
    CheckpointError,
    ObjectCorruptError,
    ObjectNotFoundError,
    one_line,
)
from spotring.checkpoint.manifest import CheckpointInfo
from spotring.checkpoint.store import ObjectStore

log = logging.getLogger(__name__)


class Checkpoints:
    """The checkpoints under a store's prefix.

    A write puts the payload first and the manifest last: a checkpoint counts only once
    its manifest is there, so a writer that dies mid-upload leaves nothing a reader takes.
    A reader checks the payload's size and SHA-256 against the manifest, so a damaged
    newest checkpoint costs its progress, never the job.

    :param store: where they are (see :func:`~spotring.checkpoint.open_store`).
    :param job_id: written into each manifest.
    :param keep: complete checkpoints kept after each write (the newest ones).
    """

    def __init__(self, store: ObjectStore, *, job_id: str, keep: int = 3) -> None:
        if keep < 1:
            raise ValueError(f"keep must be at least 1, got {keep}")
        self.store = store
        self.job_id = job_id
        self.keep = keep

    # ------------------------------------------------------------------ writing

    def write(
        self, step: int, payload: bytes | memoryview, meta: dict[str, Any] | None = None
    ) -> CheckpointInfo:
        """Store ``payload`` as the checkpoint of ``step`` and prune old ones.

        Returns what was written once its manifest is durable. Raises
        :class:`CheckpointError` if the payload or the manifest could not be stored (the
        previous checkpoints are untouched); a failed prune is only logged.
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
            sha256=hashlib.sha256(view).hexdigest(),
            job_id=self.job_id,
            meta=dict(meta or {}),
        )
        try:
            document = manifest.encode(info)
        except (TypeError, ValueError) as error:
            raise CheckpointError(f"checkpoint meta is not JSON: {one_line(error)}") from error
        self.store.put(info.data_key, view)
        self.store.put(info.manifest_key, document)
        try:
            self._prune(info.name)
        except CheckpointError as error:
            log.warning("could not prune old checkpoints in %s: %s", self.store.uri, error)
        return info

    def _prune(self, written: str) -> None:
        """Keep the newest ``keep`` complete checkpoints (always the one just written);
        delete older ones and data without a manifest older than the newest complete."""
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
                # Manifest first: the checkpoint stops counting before its data goes.
                self.store.delete(f"{name}/{manifest.MANIFEST}")
                self.store.delete(f"{name}/{manifest.DATA}")
            elif name < newest:  # a newer partial may be a write in progress
                self.store.delete(f"{name}/{manifest.DATA}")

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
            if manifest.MANIFEST not in parts:
                continue
            try:
                raw = self.store.get(f"{name}/{manifest.MANIFEST}")
            except ObjectNotFoundError:
                continue  # pruned since the listing
            try:
                yield manifest.decode(name, raw)
            except ValueError as error:
                log.debug("ignoring checkpoint %s: bad manifest: %s", name, error)

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
        for info in self._manifests():
            problem = self._check(info)
            if isinstance(problem, bytes):
                return info, problem
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
                data = self.store.get(info.data_key)
            except ObjectNotFoundError:
                return "its data is missing"
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
