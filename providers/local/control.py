"""The ``--control`` file: chaos on demand, one command per line appended to it.

Tests append a line when training reaches a point (``preempt host-1``, ``notice all``,
``scale 3``, ``spot-capacity 0``), not at a time; each refresh of the local group runs
the lines appended since the last (``--control`` in ``spotring run --provider local
--help`` lists the commands).
"""

from __future__ import annotations

from pathlib import Path


class ControlFile:
    """Reads the whole lines appended to ``path`` since the last read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0

    def new_lines(self) -> list[str]:
        """The lines appended since the last call; none while the file does not exist.
        A line still being written (no newline yet) waits for the next call."""
        try:
            with self.path.open("rb") as stream:
                stream.seek(self._offset)
                data = stream.read()
        except FileNotFoundError:
            return []
        complete = data[: data.rfind(b"\n") + 1]
        self._offset += len(complete)
        return complete.decode(errors="replace").splitlines()
