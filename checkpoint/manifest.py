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
from typing import Any

FORMAT = 1
"""The manifest format this code writes; it reads this one and older."""

PREFIX = "ckpt-"
DATA = "data"
MANIFEST = "manifest.json"
MAX_STEP = 10**12 - 1

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
    return json.dumps(document, sort_keys=True, allow_nan=False).encode()


def decode(name: str, raw: bytes) -> CheckpointInfo:
    """The manifest of checkpoint ``name``; ValueError if it is not one (unreadable, of a
    newer format, of another checkpoint, or with fields of the wrong type)."""
    document = json.loads(raw)
    if not isinstance(document, dict):
        raise ValueError("not a JSON object")
    version = document.get("format")
    if not isinstance(version, int) or not 1 <= version <= FORMAT:
        raise ValueError(f"unsupported manifest format {version!r}")
    if document.get("name") != name:
        raise ValueError(f"manifest names {document.get('name')!r}")
    step, created_at, size = document.get("step"), document.get("created_at"), document.get("size")
    sha256, job_id, meta = document.get("sha256"), document.get("job_id"), document.get("meta")
    if not (isinstance(step, int) and not isinstance(step, bool) and 0 <= step <= MAX_STEP):
        raise ValueError(f"bad step {step!r}")
    if not (isinstance(created_at, (int, float)) and math.isfinite(created_at)):
        raise ValueError(f"bad created_at {created_at!r}")
    if not (isinstance(size, int) and not isinstance(size, bool) and size >= 0):
        raise ValueError(f"bad size {size!r}")
    if not (isinstance(sha256, str) and re.fullmatch(r"[0-9a-f]{64}", sha256)):
        raise ValueError("bad sha256")
    if not isinstance(job_id, str) or not isinstance(meta, dict):
        raise ValueError("bad job_id or meta")
    return CheckpointInfo(name, step, float(created_at), size, sha256, job_id, meta)
