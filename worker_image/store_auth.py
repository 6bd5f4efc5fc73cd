"""Signed writes to the driver's rendezvous server: the format both sides share.

Every request a worker makes that changes the rendezvous server's state carries one
header, ``X-Spotring-Auth: RING NONCE MAC``:

* ``RING``: the ring generation the worker forms (ASCII digits), as the server
  publishes it under ``/spotring/ring``; the server takes it only while that ring is
  the current one, so a request captured in one ring is refused in every later one;
* ``NONCE``: :data:`NONCE_HEX` lower-case hex digits, fresh for every request; the
  server takes each nonce once per ring, so a request replayed within its ring is
  refused too;
* ``MAC``: HMAC-SHA256 under the job key, in lower-case hex, over

      b"spotring-store-1\\n" METHOD b"\\n" PATH b"\\n" RING b"\\n" NONCE b"\\n" BODY

  where ``PATH`` is the request line's target as sent (``/scope/key``; its bytes are
  Latin-1, as http.server decodes them) and ``BODY`` the request's whole body (empty
  for a ``GET`` or ``DELETE``). The MAC binds the ring, the scope and key (and so the
  rank), and the body.

The requests that carry it: Gloo's ``PUT`` and ``DELETE`` of its keys and the one-request
full-mesh ``PUT /<scope>/spotring-mesh-<rank>`` (made by the C++ ``HTTPStore`` in
spotring's Horovod build, ``worker_image/horovod-rendezvous.patch``, which implements
this same format and gets the key from :func:`spotring.worker_image.horovod_internals.
set_store_key`, never from the environment), a worker's rank request
``GET /rank_and_size/<host>:<slot>`` (which tells the driver the worker is ready and
can abandon a forming ring), and its registration ``PUT /worker_addresses/<host>:<slot>``
(:func:`spotring.worker_image.store_client.signed_put`). Reads of Gloo's keys and of the
``spotring`` scope carry nothing: they change nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass

RING_SCOPE = "spotring"
RING_KEY = "ring"
"""``/spotring/ring``: where the driver's rendezvous server publishes the current ring's
generation, as ASCII digits (read-only from outside)."""
MAX_RING_BYTES = 18

AUTH_HEADER = "X-Spotring-Auth"
PROTOCOL_TAG = b"spotring-store-1"
NONCE_HEX = 32
MAC_HEX = 64
MAX_HEADER_CHARS = MAX_RING_BYTES + NONCE_HEX + MAC_HEX + 2

_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class Signature:
    """One request's ``X-Spotring-Auth`` fields (parsed, not yet checked)."""

    ring: int
    nonce: str
    mac: str

    def header(self) -> str:
        """The header's value."""
        return f"{self.ring} {self.nonce} {self.mac}"


def parse_ring(body: bytes) -> int | None:
    """The generation in a ``/spotring/ring`` answer (ASCII digits only), or None."""
    if not 0 < len(body) <= MAX_RING_BYTES or not body.isdigit():  # bytes: ASCII only
        return None
    return int(body)


def signed_message(method: str, path: str, ring: int, nonce: str, body: bytes) -> bytes:
    """What the MAC covers (see the module)."""
    return _signed_head(method, path, ring, nonce) + body


def _signed_head(method: str, path: str, ring: int, nonce: str) -> bytes:
    return PROTOCOL_TAG + f"\n{method}\n{path}\n{ring}\n{nonce}\n".encode("latin-1")


def _mac(key: bytes, method: str, path: str, ring: int, nonce: str, body: bytes) -> str:
    # The body is hashed where it lies, not copied behind the head: a mesh row of a
    # 1,000-rank ring is 136 KiB, and the server checks one per rank and context.
    mac = hmac.new(key, _signed_head(method, path, ring, nonce), hashlib.sha256)
    mac.update(body)
    return mac.hexdigest()


def sign(key: bytes, method: str, path: str, ring: int, body: bytes = b"") -> Signature:
    """A fresh signature of ``method path`` with ``body`` for ring ``ring``."""
    nonce = secrets.token_hex(NONCE_HEX // 2)
    return Signature(ring, nonce, _mac(key, method, path, ring, nonce, body))


def parse(value: str | None) -> Signature | None:
    """The fields of an ``X-Spotring-Auth`` value; None for anything malformed."""
    if value is None or len(value) > MAX_HEADER_CHARS:
        return None
    parts = value.split(" ")
    if len(parts) != 3:
        return None
    ring, nonce, mac = parts
    if not (ring.isascii() and ring.isdigit() and len(ring) <= MAX_RING_BYTES):
        return None
    if len(nonce) != NONCE_HEX or len(mac) != MAC_HEX or not _HEX.issuperset(nonce + mac):
        return None
    return Signature(int(ring), nonce, mac)


def verify(key: bytes, signature: Signature, method: str, path: str, body: bytes) -> bool:
    """Whether ``signature`` is the job key's over this request (constant time)."""
    expected = _mac(key, method, path, signature.ring, signature.nonce, body)
    return hmac.compare_digest(expected, signature.mac)
