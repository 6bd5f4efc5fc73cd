"""The signature of a write to the rendezvous server (spotring.worker_image.store_auth):
the Python side and the C++ side of spotring's Horovod build compute the same MAC, and
anything but the job's own signature over exactly this request fails."""

from __future__ import annotations

import ctypes
import hashlib
import hmac

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spotring.worker_image import store_auth
from tests.fakes.store_signing import JOB_KEY


def library_mac(key: bytes, method: str, path: str, ring: int, nonce: str, body: bytes) -> str:
    """The MAC as spotring's Horovod build computes it (horovod-rendezvous.patch)."""
    mpi_ops = pytest.importorskip("horovod.torch.mpi_ops")
    entry = mpi_ops._basics.MPI_LIB_CTYPES.horovod_spotring_store_mac
    entry.restype = None
    out = ctypes.create_string_buffer(65)
    entry(
        key,
        len(key),
        method.encode("ascii"),
        path.encode("latin-1"),
        ctypes.c_longlong(ring),
        nonce.encode("ascii"),
        body,
        len(body),
        out,
    )
    return out.value.decode("ascii")


@settings(max_examples=60, deadline=None)
@given(
    key=st.binary(min_size=1, max_size=130),
    method=st.sampled_from(["PUT", "GET", "DELETE"]),
    path=st.text(
        alphabet=st.characters(min_codepoint=0x21, max_codepoint=0xFF), min_size=1, max_size=80
    ),
    ring=st.integers(min_value=0, max_value=10**17),
    body=st.binary(max_size=3000),
)
def test_the_horovod_build_signs_exactly_as_the_server_checks(
    key: bytes, method: str, path: str, ring: int, body: bytes
) -> None:
    signature = store_auth.sign(key, method, path, ring, body)
    assert library_mac(key, method, path, ring, signature.nonce, body) == signature.mac
    assert store_auth.verify(key, signature, method, path, body)


def test_a_large_body_and_the_rfc_4231_key_sizes_agree() -> None:
    body = bytes(range(256)) * 600  # a 1,000-rank mesh row is about 136 KiB
    for key in (b"\x0b" * 20, b"Jefe", b"\xaa" * 131):  # RFC 4231's keys, short and long
        signature = store_auth.sign(key, "PUT", "/global/spotring-mesh-7", 3, body)
        expected = hmac.new(
            key,
            store_auth.signed_message("PUT", "/global/spotring-mesh-7", 3, signature.nonce, body),
            hashlib.sha256,
        ).hexdigest()
        assert signature.mac == expected
        assert (
            library_mac(key, "PUT", "/global/spotring-mesh-7", 3, signature.nonce, body) == expected
        )


def test_each_field_is_bound() -> None:
    path, body = "/global/spotring-mesh-2", b"addresses"
    signature = store_auth.sign(JOB_KEY, "PUT", path, 5, body)
    assert store_auth.verify(JOB_KEY, signature, "PUT", path, body)
    changed = [
        (bytes(32), signature, "PUT", path, body),  # another key
        (JOB_KEY, signature, "DELETE", path, body),  # another method
        (JOB_KEY, signature, "PUT", "/global/spotring-mesh-3", body),  # another rank
        (JOB_KEY, signature, "PUT", "/cross_0/spotring-mesh-2", body),  # another scope
        (JOB_KEY, signature, "PUT", path, body + b"!"),  # another body
        (JOB_KEY, store_auth.Signature(6, signature.nonce, signature.mac), "PUT", path, body),
        (JOB_KEY, store_auth.Signature(5, "0" * 32, signature.mac), "PUT", path, body),
    ]
    for key, sig, method, other_path, other_body in changed:
        assert not store_auth.verify(key, sig, method, other_path, other_body)


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "1 2",
        "1 " + "a" * 32 + " " + "b" * 64 + " x",
        "-1 " + "a" * 32 + " " + "b" * 64,
        "1 " + "A" * 32 + " " + "b" * 64,  # upper-case hex
        "1 " + "a" * 31 + " " + "b" * 64,
        "1 " + "a" * 32 + " " + "b" * 63,
        "1" * 19 + " " + "a" * 32 + " " + "b" * 64,
        "\u0661 " + "a" * 32 + " " + "b" * 64,  # a digit, but not ASCII
        "1  " + "a" * 32 + " " + "b" * 64,
    ],
)
def test_malformed_signatures_do_not_parse(value: str | None) -> None:
    assert store_auth.parse(value) is None


def test_a_signature_parses_back() -> None:
    signature = store_auth.sign(JOB_KEY, "GET", "/rank_and_size/h:0", 12)
    assert store_auth.parse(signature.header()) == signature
    assert store_auth.sign(JOB_KEY, "GET", "/rank_and_size/h:0", 12).nonce != signature.nonce
