"""Signed writes to the driver's rendezvous server: now part of the wire protocol,
:mod:`spotring.worker_image.wire` (see its ``AUTH_HEADER``); re-exported here for the
imports that name this module."""

from spotring.worker_image.wire import (
    AUTH_HEADER,
    MAC_HEX,
    MAX_HEADER_CHARS,
    MAX_RING_BYTES,
    NONCE_HEX,
    PROTOCOL_TAG,
    RING_KEY,
    RING_SCOPE,
    Signature,
    parse,
    parse_ring,
    sign,
    signed_message,
    verify,
)

__all__ = [
    "AUTH_HEADER",
    "MAC_HEX",
    "MAX_HEADER_CHARS",
    "MAX_RING_BYTES",
    "NONCE_HEX",
    "PROTOCOL_TAG",
    "RING_KEY",
    "RING_SCOPE",
    "Signature",
    "parse",
    "parse_ring",
    "sign",
    "signed_message",
    "verify",
]
