"""A socket's bytes until a deadline: a client that sends slowly cannot hold a server
thread longer than the deadline, however it spaces its bytes."""

from __future__ import annotations

import io
import socket
import time
from typing import Any


class DeadlineReader(io.RawIOBase):
    """Reads ``sock`` until ``deadline`` (``time.monotonic()``), each ``recv`` waiting
    at most ``idle`` seconds; :meth:`restart` sets a new deadline (the next request on
    a kept-alive connection)."""

    def __init__(self, sock: socket.socket, deadline: float, idle: float) -> None:
        super().__init__()
        self._sock = sock
        self.deadline = deadline
        self._idle = idle

    def restart(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError("the request was not complete in time")
        self._sock.settimeout(min(remaining, self._idle))
        try:
            return self._sock.recv_into(buffer)
        finally:
            self._sock.settimeout(self._idle)  # for the answer
