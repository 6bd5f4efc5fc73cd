"""Bounds of a worker's notification service (Horovod's, hardened by ``peer_abort``).

Horovod's frame is a 32-byte digest, a signed 4-byte length, the body; stock Horovod
buffers whatever length the header announces (a negative one reads to the end of the
stream) before it checks the digest, and serves any number of connections at once.
"""

from __future__ import annotations

import io
import logging
import re
import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import pytest

from spotring.worker_image import peer_abort
from spotring.worker_image.peer_abort import MAX_NOTIFICATION_BYTES, MAX_NOTIFICATION_CONNECTIONS

QUICK = 3.0
"""Seconds within which a refusal must come: well under the 10 s cut-off."""


@pytest.fixture
def service(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from horovod.runner.common.util import secret
    from horovod.runner.elastic.worker import WorkerNotificationService

    monkeypatch.setattr(
        WorkerNotificationService, "_make_handler", WorkerNotificationService._make_handler
    )
    peer_abort.harden_notification_service()
    started = WorkerNotificationService(secret.make_secret_key(), "lo", None)
    try:
        yield started
    finally:
        started.shutdown()


def address(service: Any) -> tuple[str, int]:
    return service.addresses()["lo"][0]


def header(length: int) -> bytes:
    return bytes(32) + struct.pack("i", length)


def closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the service closes ``sock`` within ``seconds`` (sending nothing)."""
    sock.settimeout(seconds)
    try:
        return sock.recv(100) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def refusals(caplog: pytest.LogCaptureFixture, words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if words in r.getMessage()]


@pytest.mark.parametrize("length", [-1, -(2**31), MAX_NOTIFICATION_BYTES + 1, 2**31 - 1])
def test_a_length_out_of_bounds_is_refused_from_the_header(
    length: int, service: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The client keeps its side open: stock Horovod would wait for the rest (or the end
    of the stream) until the cut-off; the bound refuses at once."""
    with caplog.at_level(logging.WARNING, logger=peer_abort.__name__):
        with socket.create_connection(address(service), timeout=5) as sock:
            sock.sendall(header(length) + b"x" * 1000)
            assert closed_within(sock, QUICK), f"a {length}-byte message was read"
        deadline = time.monotonic() + QUICK  # the line comes after the close
        while not refusals(caplog, "bytes announced") and time.monotonic() < deadline:
            time.sleep(0.05)
    assert refusals(caplog, f"a message of {length} bytes announced (at most 1048576)")


def test_a_frame_is_read_whole_up_to_the_largest_length_and_no_further() -> None:
    most = header(MAX_NOTIFICATION_BYTES) + bytes(MAX_NOTIFICATION_BYTES)
    assert peer_abort.read_bounded_frame(io.BytesIO(most + b"next"), 32).getvalue() == most
    for frame, why in [
        (header(MAX_NOTIFICATION_BYTES + 1) + bytes(10), "1048577 bytes announced"),
        (header(-1) + bytes(10), "-1 bytes announced"),
        (header(10) + bytes(9), "ended after 9 of 10 bytes"),
        (bytes(35), "a short header (35 bytes)"),
    ]:
        with pytest.raises(ValueError, match=re.escape(why)):
            peer_abort.read_bounded_frame(io.BytesIO(frame), 32)


def test_connections_over_the_limit_are_closed_at_once_with_one_line(
    service: Any, caplog: pytest.LogCaptureFixture
) -> None:
    from horovod.runner.elastic.worker import WorkerNotificationClient

    held = [socket.create_connection(address(service), timeout=5)]
    try:
        held += [
            socket.create_connection(address(service), timeout=5)
            for _ in range(MAX_NOTIFICATION_CONNECTIONS - 1)
        ]
        time.sleep(1.0)  # every held connection's handler has taken its slot
        with caplog.at_level(logging.WARNING, logger=peer_abort.__name__):
            for _ in range(40):
                with socket.create_connection(address(service), timeout=5) as extra:
                    assert closed_within(extra, QUICK), "a connection over the limit was served"
        assert not any(closed_within(sock, 0.1) for sock in held), "a held one was closed"
        lines = refusals(caplog, "closed a connection")
        assert lines == [
            "spotring: the notification service closed a connection from 127.0.0.1: "
            f"{MAX_NOTIFICATION_CONNECTIONS} are open already"
        ]
    finally:
        for sock in held:
            sock.close()
    # The slots come back: Horovod's own client (a ping) is served again.
    deadline = time.monotonic() + 10
    while True:
        try:
            WorkerNotificationClient(service.addresses(), service._wire._key, verbose=0)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_a_throttled_log_counts_what_it_left_out(caplog: pytest.LogCaptureFixture) -> None:
    throttled = peer_abort._ThrottledLog(2, window=0.5)
    with caplog.at_level(logging.WARNING, logger=peer_abort.__name__):
        for number in range(5):
            throttled.warning("line %d", number)
        time.sleep(0.6)
        throttled.warning("line %d", 5)
    assert [r.getMessage() for r in caplog.records] == [
        "line 0",
        "line 1",
        "line 5 (and 3 more like it, not logged)",
    ]
