"""The checkpoint layer's errors: one line each, safe to print to users."""

from __future__ import annotations

import re

_SPACE = re.compile(r"\s+")


class CheckpointError(Exception):
    """A checkpoint store could not do what was asked. The message is one line that says
    what failed and, where it can, what to do; it never contains credentials."""


class CheckpointLockError(CheckpointError):
    """The checkpoint prefix is held by another job, or by a live driver of this job."""


class CheckpointLockLost(CheckpointLockError):
    """The lock this process holds, or writes checkpoints under, is another driver's now
    (or released): it must stop writing there."""


class ObjectTooLargeError(CheckpointError):
    """The object is larger than its reader accepts (checked before downloading it)."""


class ObjectNotFoundError(CheckpointError):
    """The key asked for does not exist in the store."""


class ObjectCorruptError(CheckpointError):
    """The object read does not match the checksum the store keeps for it, on every try:
    it was damaged when written or at rest."""


def one_line(text: object, limit: int = 300) -> str:
    """``text`` on one line (SDK messages span several), at most ``limit`` characters."""
    flat = _SPACE.sub(" ", str(text)).strip()
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
