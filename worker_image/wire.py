"""The driver<->worker wire protocol: every name, key and message format both sides share.

The driver (:mod:`spotring.driver`) and the code on worker hosts
(:mod:`spotring.worker_image`) import these from here, and only from here; the C++ side,
spotring's Horovod build (``worker_image/horovod-rendezvous.patch``), spells the same
constants out, and ``tests/unit/test_wire.py`` checks the patch against this module.
Nothing here is secret and nothing does I/O: it is cheap enough for ``sitecustomize``.

Sections: the environment the driver sets for supervisors and workers; the rendezvous
store's scopes and keys; the signed-request header; the one-request full mesh, byte by
byte; the peer-failure message; the markers of the supervisor's signed lines.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
import time
from dataclasses import dataclass

# --------------------------------------------------------------- the environment

JOB_KEY_ENV = "SPOTRING_JOB_KEY"
"""The hex job key's name in the environment the launcher sends the supervisor on its
stdin. The supervisor takes it out of the worker's environment."""
JOB_KEY_FD_ENV = "SPOTRING_JOB_KEY_FD"
"""The number of the descriptor from which a worker reads the hex job key (not secret)."""
PEER_ABORT_ENV = "SPOTRING_PEER_ABORT"
"""Set to ``1`` by spotring's supervisor for the workers it starts: the peer-failure
abort is installed (:mod:`spotring.worker_image.peer_abort`)."""
PROGRESS_FD_ENV = "SPOTRING_PROGRESS_FD"
"""The number of the descriptor of the worker's progress page (not secret)."""
WARM_FD_ENV = "SPOTRING_WARM_FD"
"""The descriptor of the channel to the supervisor, in a worker started warm."""

CHECKPOINT_URI_ENV = "SPOTRING_CHECKPOINT_URI"
"""``--checkpoint``: where the workers write durable copies (no credentials in it)."""
CHECKPOINT_EVERY_ENV = "SPOTRING_CHECKPOINT_EVERY"
"""At most one durable copy per this many seconds (a float's ``repr``)."""
CHECKPOINT_KEEP_ENV = "SPOTRING_CHECKPOINT_KEEP"
"""How many durable copies are kept."""
JOB_ID_ENV = "SPOTRING_JOB_ID"
"""The job's name in its checkpoints and its prefix's lock."""
CHECKPOINT_FENCE_ENV = "SPOTRING_CHECKPOINT_FENCE"
"""The driver's lock generation the workers write under ('' unfenced)."""

RENDEZVOUS_ADDR_ENV = "HOROVOD_GLOO_RENDEZVOUS_ADDR"
RENDEZVOUS_PORT_ENV = "HOROVOD_GLOO_RENDEZVOUS_PORT"
"""Horovod's names for where workers find the driver's rendezvous server; a warm
worker's port is ``0`` until it is given its slot."""
HOSTNAME_ENV = "HOROVOD_HOSTNAME"
LOCAL_RANK_ENV = "HOROVOD_LOCAL_RANK"
"""Horovod's names for a worker's host and slot (a warm worker knows them early)."""

# ------------------------------------------------------- the rendezvous store's keys

RING_SCOPE = "spotring"
"""spotring's own scope on the rendezvous server (read-only from outside)."""
RING_KEY = "ring"
"""``/spotring/ring``: where the driver's rendezvous server publishes the current ring's
generation, as ASCII digits (read-only from outside)."""
ABANDONED_KEY = "abandoned"
"""Where the driver's rendezvous server publishes the current ring's generation once a
member of it died while it formed, as ASCII digits (read-only from outside), beside
the current ring's (:data:`RING_KEY`)."""
ABANDONED_SLOT_PREFIX = ABANDONED_KEY + "."
"""``abandoned.HOST:SLOT``: the current ring's generation if it was abandoned and that
slot is still forming it (a slot gone on to the next ring gets 404)."""
FLUSH_KEY = "flush"
"""``/spotring/flush``: the current ring's generation while the driver asks its rank 0 to
make each commit durable before going on (a noticed total reclaim)."""
MAX_RING_BYTES = 18
"""The longest generation (ASCII digits) either side accepts."""

RANK_AND_SIZE_SCOPE = "rank_and_size"
"""Horovod's scope of the rank request ``GET /rank_and_size/<host>:<slot>``
(``horovod.runner.elastic.rendezvous``; ``HOROVOD_GLOO_GET_RANK_AND_SIZE`` in C++)."""
WORKER_ADDRESSES_SCOPE = "worker_addresses"
"""Horovod's scope of a worker's registration ``PUT /worker_addresses/<host>:<slot>``."""
GLOBAL_SCOPE = "global"
"""The global context's scope (``HOROVOD_GLOO_GLOBAL_PREFIX``)."""
MESH_KEY_PREFIX = "spotring-mesh-"
"""``PUT /<scope>/spotring-mesh-<rank>``: one rank's whole full-mesh exchange (below)."""

# --------------------------------------------------------------- signed requests

AUTH_HEADER = "X-Spotring-Auth"
"""Every request a worker makes that changes the rendezvous server's state carries one
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

The requests that carry it: Gloo's ``PUT`` and ``DELETE`` of its keys and the full-mesh
``PUT`` (made by the C++ ``HTTPStore`` of spotring's Horovod build, which gets the key
from :func:`spotring.worker_image.horovod_internals.set_store_key`, never from the
environment), a worker's rank request (which tells the driver the worker is ready and
can abandon a forming ring), and its registration
(:func:`spotring.worker_image.store_client.signed_put`). Reads of Gloo's keys and of
the ``spotring`` scope carry nothing: they change nothing."""
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
    """What the MAC covers (see :data:`AUTH_HEADER`)."""
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


# ------------------------------------------------------------- the full mesh

# One ``PUT /<scope>/spotring-mesh-<rank>`` per rank forms a Gloo context (signed as
# above). Every integer is an unsigned 32-bit big-endian one.
#
# Request body (:data:`MESH_HEADER`, then two byte strings):
#
#   offset  size  field
#   0       4     size: the context's ranks (2 or more)
#   4       4     wait: how long the server may hold the answer, in milliseconds
#   8       4     n: the host name's length in bytes
#   12      n     the host name (not terminated)
#   12 + n  rest  the rank's pair addresses, (size - 1) entries of equal length, one per
#                 other rank in order, as Gloo stores them under "<rank>"
#
# Answer body (:data:`MESH_ANSWER`, then the peers' addresses), once every rank is in:
#
#   offset  size  field
#   0       4     magic: "SRM1" (:data:`MESH_MAGIC`; anything else: a store that took
#                 the PUT as a plain key, Horovod's own, and Gloo's exchange is used)
#   4       4     status: 0 (:data:`MESH_OK`) or 1 (:data:`MESH_ABANDONED`: a member
#                 left the forming ring; nothing follows)
#   8       4     the rank's local rank (its place among the ranks of its host name)
#   12      4     e: the entry size in bytes (more than 0)
#   16      e*(size-1)  for each other rank i in order, the one address of i's pairs
#                 meant for this rank (entry ``rank`` of i's, ``rank - 1`` past i)
#
# Until every rank is in, the server holds the request up to ``wait`` and then answers
# 404: the rank asks again.

MESH_MAGIC = b"SRM1"
MESH_OK, MESH_ABANDONED = 0, 1
MESH_HEADER = struct.Struct(">III")  # size, wait (ms), host name length
MESH_ANSWER = struct.Struct(">4sIII")  # magic, status, local rank, entry size


# ------------------------------------------------------- the peer-failure message


PEER_FAILED_TAG = "spotring-peer-failed"
"""Starts the payload a :class:`PeerFailedRequest`'s MAC covers."""


@dataclass(frozen=True)
class PeerFailedRequest:
    """A ring member's process died: the receiver should abort its collective.

    Sent by the driver through Horovod's worker notification service (pickled by
    Horovod's ``Wire``, with its digest under Horovod's own key); the MAC is
    HMAC-SHA256 under the job key over ``spotring-peer-failed:GEN:SEQ:FAILED``
    (UTF-8)."""

    generation: int
    """The ring (rendezvous round) the dead worker belonged to."""
    sequence: int
    """Increases with every message of the job: a repeat is a replay."""
    failed: str
    """``host[local_rank]`` of the dead worker, for logs."""
    mac: bytes

    @staticmethod
    def payload(generation: int, sequence: int, failed: str) -> bytes:
        return f"{PEER_FAILED_TAG}:{generation}:{sequence}:{failed}".encode()

    @classmethod
    def sign(cls, key: bytes, generation: int, sequence: int, failed: str) -> PeerFailedRequest:
        """A request authenticated with ``key`` (the job key)."""
        mac = hmac.new(key, cls.payload(generation, sequence, failed), hashlib.sha256).digest()
        return cls(generation, sequence, failed, mac)

    def verify(self, key: bytes) -> bool:
        """Whether the MAC is valid under ``key``."""
        fields = (self.generation, self.sequence, self.failed, self.mac)
        if not all(isinstance(v, t) for v, t in zip(fields, (int, int, str, bytes), strict=True)):
            return False
        expected = PeerFailedRequest.sign(key, self.generation, self.sequence, self.failed).mac
        return hmac.compare_digest(expected, self.mac)


# ------------------------------------------------------ the supervisor's lines

# Lines the driver acts on among a worker's output: a marker (the ASCII record
# separator first: no training script prints that by accident) then a signed JSON
# object (:mod:`spotring.worker_image.signed_lines`), or for the warm line the launch id.

NOTICE_MARKER = "\x1espotring-notice "
"""Starts an interruption notice line (:class:`~spotring.worker_image.notices.NoticeMessage`)."""
PROGRESS_MARKER = "\x1espotring-progress "
"""Starts a progress line (:class:`~spotring.worker_image.progress.ProgressMessage`)."""
WARM_READY_MARKER = "\x1espotring-warm-ready "
"""Starts the line by which the supervisor tells the launcher its worker is held,
followed by the launch id (which the worker never sees, so it cannot forge the line)."""


# ------------------------------------------- the in-place torch backend's coordinator

# The driver of ``spotring run --backend torch --in-place`` serves each worker its
# place in every generation (one process group) and the generation's store, over HTTP
# (``spotring.driver.torch_group_server``; the worker's side is
# ``spotring.torch.driver_coordinator``). Every request, reads included, carries the
# signed header above with one difference: its RING field holds the sender's Unix time
# in milliseconds, not a ring generation. The server takes a request only within
# :data:`TORCH_CLOCK_SKEW_MS` of its own clock and each nonce once (it remembers the
# nonces it took for longer than that window), so a request captured on the network is
# refused when replayed, and only a holder of the job key can write a group's keys or
# hold a waiting request open. Paths (a ``wait`` query parameter, in milliseconds up
# to :data:`TORCH_MAX_WAIT_MS`, lets the server hold the answer until there is one;
# 204 means "nothing yet, ask again"):
#
#   GET /torch/latest                       the newest generation (ASCII digits); 404: none
#   GET /torch/member/<worker>/<n>?wait=    the worker's newest membership if it has one
#                                           from the n-th on ("INDEX GEN RANK SIZE ADDR PORT"),
#                                           404: unknown worker
#   GET /torch/abandoned/<gen>?wait=        200 once generation <gen> is given up
#   GET /torch/flush                        200 while every member's host is leaving (rank 0
#                                           makes each commit durable at once), else 404
#   PUT /torch/group/<gen>/<key>            a key of the generation's group (first write final)
#   GET /torch/group/<gen>/<key>?wait=      its value; 410: the generation is given up, or
#                                           was superseded before every member wrote its key
#   POST /torch/multi/<gen>?wait=           the values of the keys in the body (one per line),
#                                           once all are there (:func:`encode_values`)
#
# ``<key>`` is the c10d store key, percent-encoded (``urllib.parse.quote(key, safe="")``).
# A member's ProcessGroup (torch_state/inplace.py) sets ``GLOO_ENABLE_STORE_V2_API=1`` and
# ``GLOO_ENABLE_RANK_AS_SEQUENCE_NUMBER=1`` (gloo/common/utils.cc) in its process: each
# rank's rendezvous value is then its host name and one
# address, whatever the group's size, and Gloo's TCP transport reads its peers' values
# with a multi-get of 128 keys at a time (gloo/transport/tcp/context.cc): a formation
# costs the driver N/128 + 1 requests per rank instead of N.

TORCH_COORDINATOR_ENV = "SPOTRING_TORCH_COORDINATOR"
"""``HOST:PORT`` of the driver's coordinator, for an in-place torch worker."""
TORCH_WORKER_ENV = "SPOTRING_TORCH_WORKER"
"""The worker's name in the coordinator's memberships (not secret)."""
TORCH_PREFIX = "/torch/"
TORCH_CLOCK_SKEW_MS = 60_000
"""How far a request's time may be from the server's clock (NTP keeps hosts far closer)."""
TORCH_MAX_WAIT_MS = 30_000
"""The longest the server holds a waiting request; the client asks again."""


def sign_torch_request(key: bytes, method: str, path: str, body: bytes = b"") -> Signature:
    """A fresh signature of a coordinator request, stamped with the time now."""
    return sign(key, method, path, int(time.time() * 1000), body)


_VALUE_LENGTH = struct.Struct(">I")


def encode_values(values: list[bytes]) -> bytes:
    """A multi-get's answer: each value as a 4-byte big-endian length and its bytes."""
    return b"".join(_VALUE_LENGTH.pack(len(v)) + v for v in values)


def decode_values(data: bytes, count: int) -> list[bytes]:
    """The ``count`` values of a multi-get's answer; ValueError for anything else."""
    values, offset = [], 0
    for _ in range(count):
        if offset + _VALUE_LENGTH.size > len(data):
            raise ValueError("a multi-get's answer is cut short")
        (length,) = _VALUE_LENGTH.unpack_from(data, offset)
        offset += _VALUE_LENGTH.size
        if offset + length > len(data):
            raise ValueError("a multi-get's answer is cut short")
        values.append(data[offset : offset + length])
        offset += length
    if offset != len(data):
        raise ValueError("a multi-get's answer has bytes left over")
    return values
