"""A worker's own requests to the driver's rendezvous server, from Python.

Two kinds: plain reads of what the driver publishes in the ``spotring`` scope (ASCII
digits only, nothing unpickled: whoever can reach the server cannot run code in the
worker), and the worker's registration of its notification service, which Horovod
sends unsigned (``put_data_into_kvstore``) and spotring sends signed under the job key
for the current ring (:mod:`spotring.worker_image.wire`), as the server
requires of every write.
"""

from __future__ import annotations

import http.client
import os
from collections.abc import Callable
from typing import Any

from spotring.worker_image import wire

READ_TIMEOUT_SECONDS = 10.0
REGISTRATION_TIMEOUT_SECONDS = 60.0
"""The driver probes a registration's addresses before it answers."""


def rendezvous_endpoint() -> tuple[str, int] | None:
    """The driver's rendezvous server, as the worker's environment names it."""
    try:
        return os.environ[wire.RENDEZVOUS_ADDR_ENV], int(os.environ[wire.RENDEZVOUS_PORT_ENV])
    except (KeyError, ValueError):
        return None


def read_published_generation(
    endpoint: tuple[str, int], key: str, timeout: float = READ_TIMEOUT_SECONDS
) -> int | None:
    """The ring generation the driver published under ``/spotring/<key>``; None when
    it is not there. Raises ``OSError``, or ``ValueError`` for an answer that is not
    ASCII digits or not a 200/404."""
    connection = http.client.HTTPConnection(*endpoint, timeout=timeout)
    try:
        connection.request("GET", f"/{wire.RING_SCOPE}/{key}")
        answer = connection.getresponse()
        body = answer.read(wire.MAX_RING_BYTES + 1)
    finally:
        connection.close()
    if answer.status == 404:
        return None
    if answer.status != 200:
        raise ValueError(f"the rendezvous server answered {answer.status}")
    generation = wire.parse_ring(body)
    if generation is None:
        raise ValueError("the ring generation is not a number")
    return generation


def signed_put(
    job_key: bytes,
    endpoint: tuple[str, int],
    path: str,
    body: bytes,
    timeout: float = REGISTRATION_TIMEOUT_SECONDS,
) -> int:
    """``PUT path`` with ``body``, signed for the ring the server forms now; the
    answer's status. Raises ``OSError`` when the server cannot be reached, and
    ``ValueError`` when it publishes no ring."""
    ring = read_published_generation(endpoint, wire.RING_KEY)
    if ring is None:
        raise ValueError("the rendezvous server publishes no ring generation")
    signature = wire.sign(job_key, "PUT", path, ring, body)
    connection = http.client.HTTPConnection(*endpoint, timeout=timeout)
    try:
        connection.request("PUT", path, body=body, headers={wire.AUTH_HEADER: signature.header()})
        answer = connection.getresponse()
        answer.read(4096)
        return answer.status
    finally:
        connection.close()


def signed_registration(job_key: bytes) -> Callable[[str, int, str, str, Any], None]:
    """Horovod's ``put_data_into_kvstore(addr, port, scope, key, value)`` (the worker's
    registration), sending the same body signed under ``job_key``."""
    from horovod.runner.common.util import codec

    def put_data_into_kvstore(addr: str, port: int, scope: str, key: str, value: Any) -> None:
        body = codec.dumps_base64(value, to_ascii=False)
        try:
            status = signed_put(job_key, (addr, int(port)), f"/{scope}/{key}", body)
        except (OSError, ValueError) as error:
            raise RuntimeError("Put data input KVStore server failed.", error) from error
        if status != 200:
            raise RuntimeError(f"Put data input KVStore server failed: {status}")

    return put_data_into_kvstore
