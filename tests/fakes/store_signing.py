"""Signed requests to the driver's rendezvous server, as a worker of the job makes them
(see spotring.worker_image.store_auth), for tests that play workers."""

from __future__ import annotations

import os

from spotring.worker_image import store_auth

JOB_KEY = bytes(range(32))
"""The job key the tests' rendezvous servers check writes against."""


def is_write(method: str, path: str) -> bool:
    """Whether the server requires a signature of this request."""
    return method != "GET" or path.startswith("/rank_and_size/")


def auth_line(method: str, path: str, body: bytes, ring: int, key: bytes = JOB_KEY) -> bytes:
    """The ``X-Spotring-Auth`` header line (CRLF ended) of a request signed for ``ring``."""
    signature = store_auth.sign(key, method, path, ring, body)
    return f"{store_auth.AUTH_HEADER}: {signature.header()}\r\n".encode()


def key_pipe_env(key: bytes = JOB_KEY) -> tuple[dict[str, str], int]:
    """The environment entry and inheritable descriptor through which a worker process
    started by a test reads ``key`` (as spotring's supervisor hands it; pass the
    descriptor in ``pass_fds`` and close it after the start)."""
    from spotring.worker_image.peer_abort import JOB_KEY_FD_ENV
    from spotring.worker_image.supervisor import key_pipe

    fd = key_pipe(key.hex())
    assert fd is not None
    os.set_inheritable(fd, True)
    return {JOB_KEY_FD_ENV: str(fd)}, fd
