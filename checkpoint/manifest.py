"""What a checkpoint is in the store: its name, its objects and its manifest.

A checkpoint named ``ckpt-<step>-<created ms>-<random>`` is two objects: ``NAME/data``
(the payload) and ``NAME/manifest.json``, written last. Names sort by step, then by
creation time, so the newest is found from a listing alone.
"""

from __future__ import annotations

import json
import math
import re
import secrets
from dataclasses import dataclass, field
from typing import Any, TypeGuard

FORMAT = 1
"""The manifest format this code writes; it reads this one and older."""

PREFIX = "ckpt-"
DATA = "data"
MANIFEST = "manifest.json"
MAX_STEP = 10**12 - 1
MAX_MANIFEST_BYTES = 2**20
"""A larger manifest is not downloaded: no writer makes one."""

_NAME = re.compile(r"ckpt-(\d{12})-(\d{13})-([0-9a-f]{6})")


@dataclass(frozen=True)
class CheckpointInfo:
    """One complete checkpoint, as its manifest describes it."""

    name: str
    """Its folder under the store's prefix (``ckpt-...``)."""
    step: int
    created_at: float
    """Unix time the writer started it."""
    size: int
    """Bytes of payload."""
    sha256: str
    """Hex SHA-256 of the payload."""
    job_id: str
    meta: dict[str, Any] = field(default_factory=dict)
    """What the writer passed along (JSON values)."""
    lock_generation: int | None = None
    """The generation of the job's lock its writer wrote under (None: unfenced, or
    written before spotring fenced writers)."""

    @property
    def commits(self) -> int:
        """The job's commit count it holds (``meta["commits"]``), else its step."""
        commits = self.meta.get("commits")
        return commits if _is_count(commits) else self.step

    @property
    def committed_at(self) -> float:
        """When it was committed (``meta["committed_at"]``), else when it was written."""
        moment = self.meta.get("committed_at")
        return float(moment) if _is_time(moment) else self.created_at

    @property
    def data_key(self) -> str:
        return f"{self.name}/{DATA}"

    @property
    def manifest_key(self) -> str:
        return f"{self.name}/{MANIFEST}"


def new_name(step: int, created_at: float) -> str:
    """A fresh checkpoint name; the random part keeps two writers of one step apart."""
    return f"{PREFIX}{step:012d}-{int(created_at * 1000):013d}-{secrets.token_hex(3)}"


def is_name(name: str) -> bool:
    return _NAME.fullmatch(name) is not None


def encode(info: CheckpointInfo) -> bytes:
    """The manifest's JSON; TypeError/ValueError if ``meta`` is not JSON."""
    document = {
        "format": FORMAT,
        "name": info.name,
        "step": info.step,
        "created_at": info.created_at,
        "size": info.size,
        "sha256": info.sha256,
        "job_id": info.job_id,
        "data": DATA,
        "meta": info.meta,
    }
    if info.lock_generation is not None:
        document["lock_generation"] = info.lock_generation
    return json.dumps(document, sort_keys=True, allow_nan=False).encode()


def _is_count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_STEP


def _is_time(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def decode(name: str, raw: bytes) -> CheckpointInfo:
    """The manifest of checkpoint ``name``; ValueError if it is not one (unreadable, too
    large or deep, of a newer format, of another checkpoint, or with fields of the wrong
    type)."""
    if len(raw) > MAX_MANIFEST_BYTES:
        raise ValueError(f"{len(raw)} bytes of manifest")
    try:
        document = json.loads(raw)
    except RecursionError as error:  # json.loads is recursive
        raise ValueError("nested too deeply") from error
    if not isinstance(document, dict):
        raise ValueError("not a JSON object")
    version = document.get("format")
    if not isinstance(version, int) or not 1 <= version <= FORMAT:
        raise ValueError(f"unsupported manifest format {version!r}")
    if document.get("name") != name:
        raise ValueError(f"manifest names {document.get('name')!r}")
    step, created_at, size = document.get("step"), document.get("created_at"), document.get("size")
    sha256, job_id, meta = document.get("sha256"), document.get("job_id"), document.get("meta")
    if not _is_count(step):
        raise ValueError(f"bad step {step!r}")
    if not _is_time(created_at):
        raise ValueError(f"bad created_at {created_at!r}")
    if not (isinstance(size, int) and not isinstance(size, bool) and size >= 0):
        raise ValueError(f"bad size {size!r}")
    if not (isinstance(sha256, str) and re.fullmatch(r"[0-9a-f]{64}", sha256)):
        raise ValueError("bad sha256")
    if not isinstance(job_id, str) or not isinstance(meta, dict):
        raise ValueError("bad job_id or meta")
    generation = document.get("lock_generation")
    if generation is not None and not _is_count(generation):
        raise ValueError(f"bad lock_generation {generation!r}")
    return CheckpointInfo(name, step, float(created_at), size, sha256, job_id, meta, generation)
