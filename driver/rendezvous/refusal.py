"""What the rendezvous server refuses a request with, and how it names it in a log line."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


class HostileInput(ValueError):
    """A request the server refuses; the message says why, for the log."""


def printable(text: str, limit: int = 120) -> str:
    """``text`` for one log line: no control characters, at most ``limit`` characters."""
    clean = "".join(c if c.isprintable() else "?" for c in text[:limit])
    return clean + ("..." if len(text) > limit else "")
