"""spotring.checkpoint against real stores: a directory, and S3, GCS and Azure Blob
emulators (tests/fakes/storage_emulators.py) started for the session.

The same cases run on every backend: round trips, newest-first listing, pruning, partial
and damaged checkpoints, conditional writes, sizes refused before a download (the job
lock: tests/providers/test_checkpoint_lock.py).
"""

from __future__ import annotations

import json
import logging
import random
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from spotring.checkpoint import (
    CheckpointError,
    CheckpointInfo,
    Checkpoints,
    ObjectNotFoundError,
    ObjectStore,
    ObjectTooLargeError,
    Versioned,
    open_store,
)
from spotring.checkpoint import uri as uri_module
from tests.fakes.fault_proxy import Fault, FaultProxy
from tests.fakes.storage_emulators import (  # noqa: F401 (fixtures)
    BUCKET,
    Backend,
    azure_backend,
    backend_fixture,
    gcs_backend,
    local_backend,
    s3_backend,
    store_fixture,
)

MiB = 2**20
MANIFEST_LIMIT = 2**20
"""spotring.checkpoint.manifest.MAX_MANIFEST_BYTES, as the tests know it."""


def payload(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name.startswith("spotring.checkpoint")
    ]


# ------------------------------------------------------------------ the store itself


def test_put_get_list_delete(store: ObjectStore) -> None:
    big = payload(3 * MiB + 17)
    store.put("a/big", big)
    store.put("a/small", b"x")
    store.put("ab", memoryview(b"from a memoryview"))
    assert store.get("a/big") == big
    assert store.get("ab") == b"from a memoryview"
    assert store.list() == ["a/big", "a/small", "ab"]
    assert store.list("a/") == ["a/big", "a/small"]
    assert store.list("a") == ["a/big", "a/small", "ab"]
    assert store.list("nothing/") == []
    store.put("a/small", b"replaced")
    assert store.get("a/small") == b"replaced"
    store.delete("a/big")
    store.delete("a/big")  # missing is fine
    assert store.list() == ["a/small", "ab"]
    with pytest.raises(ObjectNotFoundError):
        store.get("a/big")


def test_a_large_object_goes_up_in_parts(store: ObjectStore) -> None:
    """Above each SDK's single-request size: S3 multipart, GCS resumable chunks, Azure
    staged blocks (and, for all, a memoryview that is not of bytes)."""
    import array

    big = payload(34 * MiB + 5, seed=4)
    store.put("big", memoryview(big))
    assert store.get("big") == big
    numbers = array.array("d", range(1000))
    store.put("doubles", memoryview(numbers))
    assert store.get("doubles") == numbers.tobytes()


def test_an_empty_object(store: ObjectStore) -> None:
    store.put("empty", b"")
    assert store.get("empty") == b""
    assert store.list() == ["empty"]


def test_put_if_writes_only_over_the_version_read(store: ObjectStore) -> None:
    first = store.put_if("claim", b"first", None)
    assert first is not None
    assert store.put_if("claim", b"second", None) is None  # it exists
    assert store.put_if("claim", b"second", store.unused_version) is None
    seen = store.get_versioned("claim", max_size=100)
    assert (seen.data, seen.version) == (b"first", first)
    second = store.put_if("claim", b"second", first)
    assert second is not None and second != first
    assert store.put_if("claim", b"third", first) is None  # a late writer of the old one
    assert store.get("claim") == b"second"
    assert store.put_if("missing", b"x", second) is None  # no such object: no version
    assert store.list() == ["claim"]


def test_a_versioned_read_says_the_age_by_the_stores_clock(store: ObjectStore) -> None:
    store.put_if("lock", b"x", None)
    assert 0 <= store.get_versioned("lock", max_size=10).age_s < 5
    with pytest.raises(ObjectNotFoundError):
        store.get_versioned("missing", max_size=10)


def test_a_larger_object_than_expected_is_not_read(store: ObjectStore) -> None:
    store.put("big", payload(3 * MiB))
    for read in (
        lambda: store.get("big", max_size=MiB),
        lambda: store.get_versioned("big", max_size=MiB),
    ):
        with pytest.raises(ObjectTooLargeError, match="more than the 1048576 expected"):
            read()
    assert store.get("big", max_size=3 * MiB) == payload(3 * MiB)


@pytest.mark.parametrize("key", ["", "/a", "a/", "a//b", "a/../b", ".hidden", "a\\b", "a/./b"])
def test_bad_keys_are_refused(store: ObjectStore, key: str) -> None:
    with pytest.raises(CheckpointError, match="invalid checkpoint store key"):
        store.put(key, b"x")


def test_stores_under_one_prefix_do_not_see_each_other(backend: Backend) -> None:
    base = backend.uri()
    outer, inner, sibling = open_store(base), open_store(base + "/in"), open_store(base + "x")
    inner.put("k", b"1")
    sibling.put("k", b"2")
    assert outer.list() == ["in/k"]
    assert outer.get("in/k") == b"1"
    assert sibling.list() == ["k"]


# ------------------------------------------------------------------ checkpoints


def test_round_trip(store: ObjectStore) -> None:
    checkpoints = Checkpoints(store, job_id="job-1")
    assert checkpoints.load_latest() is None
    assert checkpoints.latest_info() is None
    data = payload(5 * MiB + 3, seed=1)
    info = checkpoints.write(42, data, {"epoch": 3, "note": "é"})
    assert (info.step, info.size, info.job_id, info.meta) == (
        42,
        len(data),
        "job-1",
        {"epoch": 3, "note": "é"},
    )
    found = checkpoints.load_latest()
    assert found is not None
    assert found[0] == info
    assert found[1] == data
    assert checkpoints.latest_info() == info
    assert store.list() == [info.data_key, info.manifest_key]


def test_list_is_newest_first(store: ObjectStore) -> None:
    checkpoints = Checkpoints(store, job_id="job-1", keep=10)
    for step in (5, 10, 7):
        checkpoints.write(step, f"step {step}".encode())
    again = checkpoints.write(7, b"step 7 again")
    assert [i.step for i in checkpoints.list()] == [10, 7, 7, 5]
    assert checkpoints.list()[1] == again  # same step: the later one first
    latest = checkpoints.latest_info()
    assert latest is not None and latest.step == 10
    found = checkpoints.load_latest()
    assert found is not None and found[1] == b"step 10"


def test_keep_prunes_older_checkpoints(store: ObjectStore) -> None:
    checkpoints = Checkpoints(store, job_id="job-1", keep=2)
    written = [checkpoints.write(step, b"x" * step) for step in range(1, 6)]
    assert checkpoints.list() == written[:2:-1]
    names = {key.split("/")[0] for key in store.list()}
    assert names == {written[3].name, written[4].name}  # no leftovers


def test_a_restarted_run_keeps_what_it_writes(store: ObjectStore) -> None:
    """After a resume from an older checkpoint, the new one is kept even with keep=1."""
    checkpoints = Checkpoints(store, job_id="job-1", keep=1)
    checkpoints.write(200, b"newer step, from before the restart")
    written = checkpoints.write(150, b"resumed")
    assert written in checkpoints.list()


def test_data_without_manifest_is_invisible(store: ObjectStore) -> None:
    checkpoints = Checkpoints(store, job_id="job-1", keep=3)
    old = checkpoints.write(1, b"complete")
    # A writer that died after its data, before its manifest (newer step).
    partial_name = "ckpt-000000000009-" + "9" * 13 + "-abcdef"
    store.put(f"{partial_name}/data", b"partial")
    assert checkpoints.list() == [old]
    assert checkpoints.latest_info() == old
    found = checkpoints.load_latest()
    assert found is not None and found[1] == b"complete"
    # A newer partial may be a write in progress: pruning leaves it alone.
    checkpoints.write(2, b"two")
    assert f"{partial_name}/data" in store.list()
    # Once a newer checkpoint is complete, the leftover goes.
    newest = checkpoints.write(10, b"ten")
    assert f"{partial_name}/data" not in store.list()
    assert [i.step for i in checkpoints.list()] == [10, 2, 1]
    assert checkpoints.latest_info() == newest


def test_unreadable_manifests_are_ignored(store: ObjectStore) -> None:
    checkpoints = Checkpoints(store, job_id="job-1", keep=5)
    good = checkpoints.write(1, b"good")
    bad = checkpoints.write(2, b"bad manifest")
    store.put(bad.manifest_key, b"{not json")
    other = checkpoints.write(3, b"other")
    document = json.loads(store.get(other.manifest_key))
    store.put(other.manifest_key, json.dumps({**document, "format": 99}).encode())
    assert checkpoints.list() == [good]
    found = checkpoints.load_latest()
    assert found is not None and found[0] == good


def test_manifests_that_are_not_spotrings_are_ignored(store: ObjectStore) -> None:
    """Too large (never downloaded), nested deeper than the JSON parser goes, or with a
    meta whose commit count is not one: a reader skips or falls back, it never raises."""
    checkpoints = Checkpoints(store, job_id="job-1", keep=5)
    good = checkpoints.write(1, b"good", {"commits": "many", "committed_at": [1]})
    assert (good.commits, good.committed_at) == (1, good.created_at)
    big = checkpoints.write(2, b"big manifest")
    store.put(big.manifest_key, b" " * (MANIFEST_LIMIT + 1))
    deep = checkpoints.write(3, b"deep manifest")
    document = json.loads(store.get(deep.manifest_key))
    raw = json.dumps({**document, "meta": {"x": None}}).encode()
    store.put(deep.manifest_key, raw.replace(b"null", b"[" * 100_000 + b"]" * 100_000))
    assert checkpoints.list() == [good]
    assert checkpoints.latest_info() == good
    found = checkpoints.load_latest()
    assert found is not None and found[0] == good


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete"])
def test_a_damaged_newest_checkpoint_falls_back(
    store: ObjectStore, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    checkpoints = Checkpoints(store, job_id="job-1")
    previous_data = payload(MiB, seed=2)
    previous = checkpoints.write(1, previous_data)
    newest = checkpoints.write(2, payload(MiB, seed=3))
    data = bytearray(store.get(newest.data_key))
    if damage == "flip":
        data[len(data) // 2] ^= 0x01
        store.put(newest.data_key, bytes(data))
    elif damage == "truncate":
        store.put(newest.data_key, bytes(data[:-1]))
    else:
        store.delete(newest.data_key)
    caplog.set_level(logging.WARNING)
    found = checkpoints.load_latest()
    assert found is not None
    assert found[0] == previous
    assert found[1] == previous_data
    warned = warnings_of(caplog)
    assert len(warned) == 1, warned
    assert newest.name in warned[0]
    assert checkpoints.latest_info() == newest  # the manifest alone looks fine


def test_meta_must_be_json(store: ObjectStore) -> None:
    checkpoints = Checkpoints(store, job_id="job-1")
    with pytest.raises(CheckpointError, match="not JSON"):
        checkpoints.write(1, b"x", {"when": object()})
    with pytest.raises(CheckpointError, match="step"):
        checkpoints.write(-1, b"x")
    assert store.list() == []


class RecordingStore(ObjectStore):
    """Records each call; fails a put whose key ends with ``fail_suffix``."""

    def __init__(self, inner: ObjectStore, fail_suffix: str | None = None) -> None:
        self.inner, self.uri, self.fail_suffix = inner, inner.uri, fail_suffix
        self.unused_version = inner.unused_version
        self.calls: list[tuple[str, str]] = []

    def put(self, key: str, data: bytes | memoryview) -> None:
        self.calls.append(("put", key))
        if self.fail_suffix and key.endswith(self.fail_suffix):
            raise CheckpointError(f"injected failure writing {key}")
        self.inner.put(key, data)

    def get(self, key: str, *, max_size: int | None = None) -> bytes:
        return self.inner.get(key, max_size=max_size)

    def get_versioned(self, key: str, *, max_size: int) -> Versioned:
        return self.inner.get_versioned(key, max_size=max_size)

    def list(self, prefix: str = "") -> list[str]:
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.calls.append(("delete", key))
        self.inner.delete(key)

    def put_if(self, key: str, data: bytes, version: str | None) -> str | None:
        return self.inner.put_if(key, data, version)


def test_the_manifest_is_written_last_and_deleted_first(store: ObjectStore) -> None:
    recording = RecordingStore(store)
    checkpoints = Checkpoints(recording, job_id="job-1", keep=1)
    first = checkpoints.write(1, b"one")
    second = checkpoints.write(2, b"two")
    assert recording.calls == [
        ("put", first.data_key),
        ("put", first.manifest_key),
        ("put", second.data_key),
        ("put", second.manifest_key),
        ("delete", first.manifest_key),
        ("delete", first.data_key),
    ]


@pytest.mark.parametrize("failing", ["/data", "/manifest.json"])
def test_a_failed_write_leaves_the_previous_checkpoint(store: ObjectStore, failing: str) -> None:
    good = Checkpoints(store, job_id="job-1")
    previous = good.write(1, b"previous")
    broken = Checkpoints(RecordingStore(store, fail_suffix=failing), job_id="job-1")
    with pytest.raises(CheckpointError, match="injected"):
        broken.write(2, b"never complete")
    assert good.list() == [previous]
    found = good.load_latest()
    assert found is not None and found[0] == previous


# ------------------------------------------------------------------ URIs (no network)


@pytest.mark.parametrize(
    ("uri", "kind", "shown"),
    [
        ("s3://my-bucket/jobs/run-1/", "s3", "s3://my-bucket/jobs/run-1"),
        ("s3://my-bucket", "s3", "s3://my-bucket"),
        ("gs://my_bucket.example/p", "gcs", "gs://my_bucket.example/p"),
        ("az://acct1/ckpts/run", "azure", "az://acct1/ckpts/run"),
        (
            "https://acct1.blob.core.windows.net/ckpts/run",
            "azure",
            "https://acct1.blob.core.windows.net/ckpts/run",
        ),
        (
            "http://127.0.0.1:10000/devstoreaccount1/ckpts/run",
            "azure",
            "http://127.0.0.1:10000/devstoreaccount1/ckpts/run",
        ),
        *(
            (f"https://acct1.{suffix}/ckpts/run", "azure", f"https://acct1.{suffix}/ckpts/run")
            for suffix in (
                "blob.core.chinacloudapi.cn",
                "blob.core.usgovcloudapi.net",
                "z07.blob.storage.azure.net",
            )
        ),
    ],
)
def test_uri_forms(uri: str, kind: str, shown: str) -> None:
    location = uri_module.parse(uri)
    assert (location.kind, location.uri) == (kind, shown)


def test_local_uri_forms(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert open_store("rel/dir").uri == str(tmp_path / "rel" / "dir")
    assert open_store(f"file://{tmp_path}/abs").uri == str(tmp_path / "abs")
    assert not (tmp_path / "rel").exists()  # nothing made before the first write
    (tmp_path / "afile").write_text("")
    with pytest.raises(CheckpointError, match="not a directory"):
        open_store("afile")


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("", "empty"),
        ("ftp://host/x", "unknown scheme"),
        ("s3://", "bucket"),
        ("s3://UPPER/x", "bucket"),
        ("s3://bucket/a/../b", "prefix"),
        ("gs://b", "bucket"),
        ("az://acct1", "container"),
        ("az://acct1/C/x", "container"),
        ("https://example.com/c/x", "not an Azure Blob endpoint"),
        # Would get the storage token (DefaultAzureCredential's) sent to another host.
        ("https://acct1.blob.core.windows.net.evil.example/c/x", "not an Azure Blob endpoint"),
        ("https://acct1.blob.evil.example/c/x", "not an Azure Blob endpoint"),
        ("https://acct1.blob.core.windows.net.evil.example:443/c/x", "not an Azure"),
        ("https://evil.example/acct1.blob.core.windows.net/c", "not an Azure Blob endpoint"),
        ("http://acct1.blob.core.windows.net/c/x", "plain http"),
        ("http://127.0.0.1:10000/otheraccount/c", "devstoreaccount1"),
        ("http://127.0.0.2:10000/devstoreaccount1/c", "plain http"),
        ("https://acct1.blob.core.windows.net/c/x?sv=2020&sig=SECRET", "SAS"),
        ("file://remote/x", "file:///path"),
    ],
)
def test_bad_uris(uri: str, says: str) -> None:
    with pytest.raises(CheckpointError, match=says) as caught:
        open_store(uri)
    assert "\n" not in str(caught.value)
    assert "SECRET" not in str(caught.value)


def test_credentials_in_a_uri_are_refused_without_repeating_them() -> None:
    for uri in (
        "s3://AKIAKEY:s3cr3t@bucket/x",
        "https://user:s3cr3t@acct1.blob.core.windows.net/c",
    ):
        with pytest.raises(CheckpointError, match="credentials") as caught:
            open_store(uri)
        assert "s3cr3t" not in str(caught.value)


def test_a_missing_sdk_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real = uri_module.importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        if name.split(".")[0] in ("boto3", "google", "azure"):
            return None
        return real(name, *args)

    monkeypatch.setattr(uri_module.importlib.util, "find_spec", find_spec)
    for uri, extra in [("s3://bkt/x", "aws"), ("gs://bkt/x", "gcp"), ("az://acct1/ctr/x", "azure")]:
        with pytest.raises(CheckpointError, match=rf"pip install 'spotring\[{extra}\]'"):
            open_store(uri)


def test_opening_a_cloud_store_touches_no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_network(*_: Any, **__: Any) -> None:
        raise AssertionError("open_store connected")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setattr(socket, "create_connection", no_network)
    for uri in (
        "s3://bucket/x",
        "gs://bucket/x",
        "az://acct1/ctr/x",
        "https://acct1.blob.core.windows.net/ctr/x",
        "http://localhost:10000/devstoreaccount1/ctr/x",
    ):
        assert open_store(uri).uri.endswith("/x")


def test_a_bad_timeout_is_refused() -> None:
    with pytest.raises(CheckpointError, match="timeout"):
        open_store("s3://bucket/x", timeout_s=0)


# ------------------------------------------------------------------ S3 behind the fault proxy

DATA_PUT = r"^PUT [^?]*/data(\?|$)"
"""A checkpoint's data upload: a single PUT or a multipart upload's parts."""


@dataclass
class ProxiedS3:
    proxy: FaultProxy
    backend: Backend


@pytest.fixture
def s3_proxy(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ProxiedS3]:
    """A fault proxy between boto3 and moto: the store's S3 endpoint is the proxy."""
    backend: Backend = request.getfixturevalue("s3_backend")
    for name, value in backend.env.items():
        monkeypatch.setenv(name, value)
    with FaultProxy(backend.endpoint, flavour="aws", seed=5, hang_seconds=30) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.url)
        yield ProxiedS3(proxy, backend)


def fresh(backend: Backend, timeout_s: float = 5) -> tuple[ObjectStore, Checkpoints]:
    store = open_store(backend.uri("proxy"), timeout_s=timeout_s)
    return store, Checkpoints(store, job_id="job-1", keep=3)


def assert_only(checkpoints: Checkpoints, previous: CheckpointInfo, data: bytes) -> None:
    """``previous`` is the only checkpoint and the one loaded; no other data is left."""
    assert checkpoints.list() == [previous]
    found = checkpoints.load_latest()
    assert found is not None
    assert found == (previous, data)
    assert {key.split("/")[0] for key in checkpoints.store.list()} == {previous.name}


@pytest.mark.parametrize("size", [2 * MiB, 40 * MiB], ids=["single-put", "multipart"])
def test_an_upload_cut_mid_body_is_never_seen(s3_proxy: ProxiedS3, size: int) -> None:
    _, checkpoints = fresh(s3_proxy.backend)
    previous_data = payload(MiB, seed=7)
    previous = checkpoints.write(1, previous_data)
    s3_proxy.proxy.set_rate(1.0, ["cut_request"], match=DATA_PUT)
    with pytest.raises(CheckpointError, match="cannot write"):
        checkpoints.write(2, payload(size, seed=8))
    s3_proxy.proxy.clear()
    cuts = s3_proxy.proxy.hits("cut_request")
    assert len(cuts) >= 2, "boto3 retries a cut upload"
    assert_only(checkpoints, previous, previous_data)
    if size > 16 * MiB:  # the failed multipart upload was aborted, not left to bill
        import boto3

        client = boto3.client("s3", endpoint_url=s3_proxy.backend.endpoint)
        uploads = client.list_multipart_uploads(Bucket=BUCKET).get("Uploads", [])
        assert [u["Key"] for u in uploads if "proxy" in u["Key"]] == []


def test_a_cut_part_is_retried_and_the_checkpoint_completes(s3_proxy: ProxiedS3) -> None:
    _, checkpoints = fresh(s3_proxy.backend)
    data = payload(40 * MiB, seed=9)
    s3_proxy.proxy.next_faults([Fault("cut_request", match=r"^PUT [^?]*/data\?.*partNumber=2\b")])
    info = checkpoints.write(3, data)
    assert len(s3_proxy.proxy.hits("cut_request")) == 1
    assert checkpoints.load_latest() == (info, data)


def test_throttled_uploads_are_retried_then_given_up(
    s3_proxy: ProxiedS3, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("spotring.checkpoint.s3.ATTEMPTS", 3)  # backoff: 1 + 2 s at most
    _, checkpoints = fresh(s3_proxy.backend)
    previous_data = payload(MiB, seed=10)
    s3_proxy.proxy.next_faults([Fault("throttle", match=DATA_PUT)] * 2)
    previous = checkpoints.write(1, previous_data)  # two SlowDowns, then through
    assert len(s3_proxy.proxy.hits("throttle")) == 2
    s3_proxy.proxy.set_rate(1.0, ["throttle"], match=DATA_PUT)
    started = time.monotonic()
    with pytest.raises(CheckpointError, match="SlowDown"):
        checkpoints.write(2, payload(MiB, seed=11))
    assert len(s3_proxy.proxy.hits("throttle")) == 2 + 3
    assert time.monotonic() - started < 20  # bounded: retries with backoff, then an error
    s3_proxy.proxy.clear()
    assert_only(checkpoints, previous, previous_data)


def test_s3_without_credentials_says_so(
    s3_proxy: ProxiedS3, monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    store = open_store(s3_proxy.backend.uri(), timeout_s=5)
    with pytest.raises(CheckpointError, match="no AWS credentials found") as caught:
        store.put("k", b"x")
    assert "\n" not in str(caught.value)
    assert s3_proxy.proxy.log == []  # refused before any request


def test_a_hung_upload_times_out_and_is_retried(s3_proxy: ProxiedS3) -> None:
    _, checkpoints = fresh(s3_proxy.backend, timeout_s=1)
    data = payload(MiB, seed=12)
    s3_proxy.proxy.next_faults([Fault("hang", seconds=30, match=DATA_PUT)])
    started = time.monotonic()
    info = checkpoints.write(1, data)
    assert time.monotonic() - started < 15
    assert len(s3_proxy.proxy.hits("hang")) == 1
    assert checkpoints.load_latest() == (info, data)


@pytest.mark.parametrize("checksums", ["when_supported", "when_required"])
def test_an_upload_corrupted_in_transit_is_never_loaded(
    s3_proxy: ProxiedS3,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    checksums: str,
) -> None:
    """With boto3's checksums (its default) S3 refuses the damaged body (moto keeps it,
    with the checksum the client sent, which then fails every read); without them (as
    for some S3-compatible stores) the object lands damaged and only the manifest's
    SHA-256 catches it. Either way the previous checkpoint is loaded, with one warning
    naming the damaged one if it got a manifest."""
    monkeypatch.setenv("AWS_REQUEST_CHECKSUM_CALCULATION", checksums)
    _, checkpoints = fresh(s3_proxy.backend)
    previous_data = payload(MiB, seed=13)
    previous = checkpoints.write(1, previous_data)
    s3_proxy.proxy.next_faults([Fault("corrupt_request", match=DATA_PUT)])
    caplog.set_level(logging.WARNING)
    try:
        damaged = checkpoints.write(2, payload(MiB, seed=14))
    except CheckpointError:  # real S3: BadDigest
        assert_only(checkpoints, previous, previous_data)
        assert warnings_of(caplog) == []
    else:
        assert checkpoints.load_latest() == (previous, previous_data)
        warned = warnings_of(caplog)
        assert len(warned) == 1 and damaged.name in warned[0], warned
        if checksums == "when_supported":
            assert "checksum" in warned[0]
    assert len(s3_proxy.proxy.hits("corrupt_request")) == 1


def test_a_download_damaged_once_is_read_again(
    s3_proxy: ProxiedS3, caplog: pytest.LogCaptureFixture
) -> None:
    _, checkpoints = fresh(s3_proxy.backend)
    data = payload(MiB, seed=15)
    info = checkpoints.write(1, data)
    s3_proxy.proxy.next_faults([Fault("garbage", variant="bytes", match=r"^GET [^?]*/data")])
    caplog.set_level(logging.WARNING)
    assert checkpoints.load_latest() == (info, data)
    assert len(s3_proxy.proxy.hits("garbage")) == 1
    assert warnings_of(caplog) == []


def test_an_object_larger_than_expected_is_never_downloaded(
    s3_proxy: ProxiedS3, caplog: pytest.LogCaptureFixture
) -> None:
    """Its size is asked first (HEAD): a manifest over the limit, or data larger than its
    manifest says, is skipped without a GET of its bytes."""
    store, checkpoints = fresh(s3_proxy.backend)
    previous = checkpoints.write(1, b"previous")
    swollen = checkpoints.write(2, b"data")
    store.put(swollen.data_key, payload(3 * MiB))
    big = checkpoints.write(3, b"big manifest")
    store.put(big.manifest_key, b" " * (MANIFEST_LIMIT + 1))
    s3_proxy.proxy.clear_log()
    caplog.set_level(logging.WARNING)
    assert checkpoints.load_latest() == (previous, b"previous")
    fetched = [(e.method, e.path.split("?")[0]) for e in s3_proxy.proxy.log]
    assert [m for m, path in fetched if path.endswith(swollen.data_key)] == ["HEAD"], fetched
    assert [m for m, path in fetched if path.endswith(big.manifest_key)] == ["HEAD"], fetched
    warned = warnings_of(caplog)
    assert len(warned) == 1 and swollen.name in warned[0] and "larger" in warned[0], warned
