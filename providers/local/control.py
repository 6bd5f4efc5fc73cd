"""The ``--control`` file: chaos on demand, one command per line appended to it.

Tests append a line when training reaches a point (``preempt host-1``, ``notice all``,
``scale 3``, ``spot-capacity 0``), not at a time; each refresh of the local group runs
the lines appended since the last (``--control`` in ``spotring run --provider local
--help`` lists the commands).
"""

from __future__ import annotations

from pathlib import Path

MAX_READ_BYTES = 1 << 20
"""What one read takes at most: a file grown faster is read over several refreshes."""


class ControlFile:
    """Reads the whole lines appended to ``path`` since the last read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._skipping = False
        """In a line over the bound: its rest is skipped up to its newline."""

    def new_lines(self) -> list[str]:
        """The lines appended since the last call; none while the file does not exist.
        A line still being written (no newline yet) waits for the next call; a line
        longer than :data:`MAX_READ_BYTES` is skipped whole."""
        try:
            with self.path.open("rb") as stream:
                stream.seek(self._offset)
                data = stream.read(MAX_READ_BYTES)
        except FileNotFoundError:
            return []
        if self._skipping:
            end = data.find(b"\n")
            self._offset += len(data) if end < 0 else end + 1
            self._skipping = end < 0
            return []
        complete = data[: data.rfind(b"\n") + 1]
        if not complete and len(data) == MAX_READ_BYTES:  # no command is this long
            self._offset += len(data)
            self._skipping = True
            return []
        self._offset += len(complete)
        return complete.decode(errors="replace").splitlines()
