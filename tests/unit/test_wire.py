"""The wire protocol's Python side (spotring.worker_image.wire) against its C++ side
(worker_image/horovod-rendezvous.patch) and the worker's sitecustomize.

Each check reads a constant out of the patch's text and compares it with the module's:
a change to either side alone fails here. Pure text and struct checks: no Horovod."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from spotring.worker_image import wire

WORKER_IMAGE = Path(wire.__file__).resolve().parent
PATCH = (WORKER_IMAGE / "horovod-rendezvous.patch").read_text()
ADDED = "\n".join(line[1:] for line in PATCH.splitlines() if line.startswith("+"))
"""The lines the patch adds, without their ``+``: the C++ as built."""


def _one(pattern: str, text: str = ADDED) -> re.Match[str]:
    found = list(re.finditer(pattern, text, re.DOTALL))
    assert len(found) == 1, f"{pattern!r}: {len(found)} matches in the patch"
    return found[0]


def _cpp_string(literal: str) -> str:
    return literal.encode("ascii").decode("unicode_escape")


def test_mesh_magic_and_statuses() -> None:
    assert _one(r'const char kMeshMagic\[\] = "([^"]*)";').group(1).encode() == wire.MESH_MAGIC
    abandoned = _one(r"constexpr uint32_t kMeshAbandoned = (\d+);").group(1)
    assert int(abandoned) == wire.MESH_ABANDONED
    # Any other status than 0 is malformed to the C++ side: OK is 0.
    assert _one(r"if \(status != (\d+) \|\|").group(1) == str(wire.MESH_OK)


def test_mesh_integers_are_big_endian_uint32() -> None:
    put = _one(r"void PutUint32\(std::string& out, uint32_t value\) \{(.*?)\n\}").group(1)
    shifts = [int(s) for s in re.findall(r"value >> (\d+)", put)]
    assert shifts == [24, 16, 8], "the most significant byte first"
    for layout in (wire.MESH_HEADER, wire.MESH_ANSWER):
        assert layout.format.startswith(">")
        assert set(layout.format[1:]) <= {"I", "4", "s"}


def test_mesh_request_header_fields_in_order() -> None:
    body = _one(r"std::string body;\n(.*?)body\.append\(hostname").group(1)
    fields = re.findall(r"PutUint32\(body, static_cast<uint32_t>\((.*?)\)\);", body)
    # size, how long the server may hold the answer (ms), the host name's length
    assert [f.split("(")[0].split(",")[-1].strip() for f in fields] == [
        "size",
        "std::max<int64_t>",
        "hostname.size",
    ]
    assert "left.count()" in fields[1], "the wait is in milliseconds"
    assert wire.MESH_HEADER.format == ">" + "I" * len(fields)
    size, wait_ms, length = wire.MESH_HEADER.unpack(wire.MESH_HEADER.pack(3, 250, 7))
    assert (size, wait_ms, length) == (3, 250, 7)
    assert "body.append(addresses.data()" in ADDED  # the host name, then the addresses


def test_mesh_answer_fields_in_order() -> None:
    magic = _one(r"answer\.compare\(0, (\d+), kMeshMagic, \d+\)").group(1)
    start = _one(r"size_t pos = (\d+);\n\s*uint32_t status").group(1)
    assert int(magic) == int(start) == len(wire.MESH_MAGIC)
    reads = _one(r"if \(!GetUint32\(answer, pos, (\w+)\) \|\| !GetUint32\(answer, pos, (\w+)\) "
                 r"\|\|\s*!GetUint32\(answer, pos, (\w+)\)\)").groups()  # fmt: skip
    assert reads == ("status", "local", "entry")
    assert wire.MESH_ANSWER.format == f">{len(wire.MESH_MAGIC)}s" + "I" * len(reads)
    assert wire.MESH_ANSWER.size == len(wire.MESH_MAGIC) + 4 * len(reads)


def test_store_scopes_and_keys() -> None:
    assert _one(r'"(/[a-z]+/[a-z]+)"\);').group(1) == f"/{wire.RING_SCOPE}/{wire.RING_KEY}"
    assert _one(r'const std::string key = "([^"]*)" \+ std::to_string\(rank\);').group(1) == (
        wire.MESH_KEY_PREFIX
    )
    assert _one(r'signs_reads_\(scope == "([^"]*)"\)').group(1) == wire.RANK_AND_SIZE_SCOPE
    assert _one(r'global_\(scope == "([^"]*)"\)').group(1) == wire.GLOBAL_SCOPE
    assert int(_one(r"!body\.empty\(\) && body\.size\(\) <= (\d+) &&").group(1)) == (
        wire.MAX_RING_BYTES
    )


def test_signed_request_header_and_message() -> None:
    header = _one(
        r'return \{"([^"]*): " \+ std::to_string\(ring\) \+ " " \+ nonce \+ " " \+ mac\};'
    )
    assert header.group(1) == wire.AUTH_HEADER
    assert wire.Signature(7, "n", "m").header() == "7 n m"  # ring, nonce, MAC; one space
    head = _one(r"const std::string head = (.*?);").group(1)
    parts = [p.strip() for p in head.split("+")]
    tag = _cpp_string(parts[0].strip('"'))
    assert tag == wire.PROTOCOL_TAG.decode() + "\n"
    # then METHOD \n PATH \n RING \n NONCE \n, and the body hashed after them
    assert [p for p in parts[1:] if not p.startswith('"')] == [
        "method", "path", "std::to_string(ring)", "nonce",
    ]  # fmt: skip
    assert wire.signed_message("PUT", "/s/k", 5, "ab", b"B") == (
        wire.PROTOCOL_TAG + b"\nPUT\n/s/k\n5\nab\nB"
    )
    nonce_bytes = int(_one(r"uint8_t bytes\[(\d+)\];").group(1))
    assert nonce_bytes * 2 == wire.NONCE_HEX
    assert wire.MAC_HEX == 64  # HMAC-SHA256 in hex, as HmacSha256 + Hex make it


SITECUSTOMIZE = (WORKER_IMAGE / "sitehook" / "sitecustomize.py").read_text()


@pytest.mark.parametrize(
    "name",
    [wire.WARM_FD_ENV, wire.PROGRESS_FD_ENV, wire.CHECKPOINT_URI_ENV, wire.JOB_KEY_FD_ENV,
     wire.PEER_ABORT_ENV],
)  # fmt: skip
def test_sitecustomize_reads_the_wire_names(name: str) -> None:
    """sitecustomize runs in every worker process before anything is imported: it spells
    the names out rather than import the module; they must be the module's."""
    assert f'"{name}"' in SITECUSTOMIZE


def test_sitecustomize_names_no_other_variable() -> None:
    names = set(re.findall(r'"(SPOTRING_[A-Z_]+)"', SITECUSTOMIZE))
    declared = {v for k, v in vars(wire).items() if k.endswith("_ENV")}
    assert names and names <= declared


def test_peer_failure_payload() -> None:
    request = wire.PeerFailedRequest.sign(b"k" * 32, 3, 9, "h[1]")
    assert wire.PeerFailedRequest.payload(3, 9, "h[1]") == b"spotring-peer-failed:3:9:h[1]"
    assert request.verify(b"k" * 32)
    assert not request.verify(b"j" * 32)


def test_old_import_locations_give_the_wire_objects() -> None:
    from spotring.driver.rendezvous import mesh
    from spotring.worker_image import durable, peer_abort, store_auth

    assert store_auth.sign is wire.sign and store_auth.AUTH_HEADER is wire.AUTH_HEADER
    assert peer_abort.PeerFailedRequest is wire.PeerFailedRequest
    assert peer_abort.ABANDONED_KEY is wire.ABANDONED_KEY
    assert durable.FENCE_ENV is wire.CHECKPOINT_FENCE_ENV and durable.FLUSH_KEY is wire.FLUSH_KEY
    assert mesh.MESH_HEADER is wire.MESH_HEADER and mesh.MESH_MAGIC is wire.MESH_MAGIC
