"""The job lock fences writers (spotring.checkpoint.lock), on every store: a directory,
and the S3, GCS and Azure Blob emulators (tests/fakes/storage_emulators.py).

Drivers race for it with real clients, one wins; a late heartbeat never overwrites a
newer holder; staleness is the store's clock; a process is told dead only where it can
be; checkpoint writers check the lock before each put and prune; and an S3 endpoint
that ignores If-None-Match is refused at start.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from spotring.checkpoint import (
    LOCK_KEY,
    CheckpointError,
    CheckpointInfo,
    CheckpointLockError,
    CheckpointLockLost,
    Checkpoints,
    Fence,
    JobLock,
    ObjectStore,
    Versioned,
    check_fence,
    manifest,
    open_store,
)
from spotring.checkpoint import lock as lock_module
from spotring.checkpoint.lock import LockState, process_gone, process_identity
from tests.fakes.fault_proxy import FaultProxy
from tests.fakes.storage_emulators import (  # noqa: F401 (fixtures)
    Backend,
    azure_backend,
    backend_fixture,
    gcs_backend,
    local_backend,
    s3_backend,
    store_fixture,
)

LEASE = 1.0
"""Leases of the tests that wait for one to run out (the stores' clocks tick in seconds)."""


def lock_document(store: ObjectStore) -> dict[str, Any]:
    document: dict[str, Any] = json.loads(store.get(LOCK_KEY))
    return document


def plant(store: ObjectStore, job_id: str = "job-1", **fields: Any) -> LockState:
    """A lock written by another driver (of another process, host or container)."""
    state = LockState(job_id, fields.pop("owner", "other-driver"), 1, True, **fields)
    store.put(LOCK_KEY, state.encode())
    return state


def wait_until_stale(store: ObjectStore, lease: float = LEASE) -> None:
    """Until the store says the lock was last written more than ``lease`` ago."""
    deadline = time.monotonic() + 30
    while store.get_versioned(LOCK_KEY, max_size=2**16).age_s <= lease:
        assert time.monotonic() < deadline, "the store's clock does not move"
        time.sleep(0.1)


def race(uri: str, contenders: int = 2, lease: float = 60.0) -> list[JobLock | Exception]:
    """``contenders`` drivers, each with a client of its own, acquiring at once."""
    locks = [
        JobLock(open_store(uri, timeout_s=20), job_id="job-1", lease_s=lease)
        for _ in range(contenders)
    ]
    start = threading.Barrier(contenders)
    results: list[JobLock | Exception] = [RuntimeError("did not run")] * contenders

    def contend(index: int) -> None:
        start.wait()
        try:
            locks[index].acquire()
            results[index] = locks[index]
        except CheckpointLockError as error:
            results[index] = error

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(contenders)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


def winners(results: list[JobLock | Exception]) -> list[JobLock]:
    assert all(isinstance(r, (JobLock, CheckpointLockError)) for r in results), results
    return [r for r in results if isinstance(r, JobLock)]


# ------------------------------------------------------------------ racing drivers


@pytest.mark.parametrize("before", ["none", "released", "abandoned"])
def test_of_drivers_racing_for_the_lock_one_wins(backend: Backend, before: str) -> None:
    """Three drivers with clients of their own take the lock at once: on a prefix with
    none, a released one, one whose process is gone (a lock unwritten for the lease
    takes the same conditional write; its race would need a lease longer than a race
    takes on a loaded machine, and as long a wait)."""
    for _ in range(3):
        uri = backend.uri("race")
        store = open_store(uri, timeout_s=20)
        if before == "released":
            with JobLock(store, job_id="job-1"):
                pass
        elif before == "abandoned":
            if not process_identity():
                pytest.skip("no /proc: no process is taken for gone here")
            plant(store, process=_dead_pid_identity())
        results = race(uri, contenders=3)
        (winner,) = winners(results)
        assert all("already running" in str(r) for r in results if r is not winner), results
        held = lock_document(store)
        assert (held["owner"], held["held"]) == (winner.owner, True)
        assert held["generation"] == winner.fence.generation
        check_fence(store, "job-1", winner.fence)


def test_two_drivers_of_one_host_and_pid_are_two_drivers(store: ObjectStore) -> None:
    """Containers with the host's name, each its driver as PID 1: the same ``host:pid``
    (here: the same process) is not the same holder."""
    first = JobLock(store, job_id="job-1")
    first.acquire()
    second = JobLock(store, job_id="job-1")
    assert first.owner != second.owner
    with pytest.raises(CheckpointLockError, match="already running"):
        second.acquire()
    first.heartbeat()
    assert lock_document(store)["owner"] == first.owner


def test_a_late_heartbeat_never_overwrites_the_new_holder(store: ObjectStore) -> None:
    old = JobLock(store, job_id="job-1", lease_s=LEASE)
    old.acquire()
    wait_until_stale(store)
    new = JobLock(store, job_id="job-1", lease_s=LEASE)
    new.acquire()
    assert new.fence.generation == old.fence.generation + 1
    with pytest.raises(CheckpointLockLost, match=f"generation {new.fence.generation}"):
        old.heartbeat()
    old.release()
    held = lock_document(store)
    assert (held["owner"], held["held"]) == (new.owner, True)
    new.heartbeat()
    new.release()
    released = lock_document(store)
    assert (released["held"], released["generation"]) == (False, new.fence.generation)
    assert store.list() == [LOCK_KEY]


def test_a_heartbeat_whose_first_try_landed_keeps_the_lock(store: ObjectStore) -> None:
    """A retried conditional write finds its own first try there: still this holder's."""
    holder = JobLock(store, job_id="job-1")
    holder.acquire()
    # The first try of the next heartbeat went through; its answer was lost.
    landed = store.put_if(LOCK_KEY, holder._state.encode(), holder._version)
    assert landed is not None
    holder.heartbeat()
    assert lock_document(store)["owner"] == holder.owner


# ------------------------------------------------------------------ staleness


def test_staleness_is_the_stores_clock_not_the_holders(store: ObjectStore) -> None:
    """The holder's clock (an hour behind, in its own fields) does not make its lock
    stale; only the store's timestamps do."""
    plant(store, acquired_at=time.time() - 3600)
    with pytest.raises(CheckpointLockError, match="already running"):
        JobLock(store, job_id="job-1", lease_s=60).acquire()
    # Written before spotring fenced writers, with an old heartbeat of its own: the same.
    old = {"job_id": "job-1", "owner": "host-b:7", "heartbeat_at": 0.0, "acquired_at": 0.0}
    store.put(LOCK_KEY, json.dumps(old).encode())
    with pytest.raises(CheckpointLockError, match="host-b:7"):
        JobLock(store, job_id="job-1", lease_s=60).acquire()
    wait_until_stale(store)
    taker = JobLock(store, job_id="job-1", lease_s=LEASE)
    taker.acquire()
    assert lock_document(store)["owner"] == taker.owner


def test_another_job_is_refused_even_with_a_stale_lock(store: ObjectStore) -> None:
    plant(store, "job-other", label="host-b:7")
    wait_until_stale(store)
    lock = JobLock(store, job_id="job-1", lease_s=LEASE)
    with pytest.raises(CheckpointLockError) as caught:
        lock.acquire()
    message = str(caught.value)
    assert "\n" not in message
    for part in ("job-other", "host-b:7", "--checkpoint", LOCK_KEY, store.uri):
        assert part in message
    assert lock_document(store)["job_id"] == "job-other"  # untouched


def test_a_released_lock_is_free_for_the_next_job(store: ObjectStore) -> None:
    with JobLock(store, job_id="job-1") as first:
        generation = first.fence.generation
    with JobLock(store, job_id="job-2") as second:
        assert second.fence.generation == generation + 1


# ------------------------------------------------------------------ dead or alive


def _dead_pid_identity() -> str:
    """The identity a process of this namespace had, that has exited."""
    code = "from spotring.checkpoint.lock import process_identity; print(process_identity())"
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.strip()


def test_a_process_is_gone_only_where_this_one_can_tell() -> None:
    mine = process_identity()
    if not mine:
        pytest.skip("no /proc: processes are never taken for gone here")
    boot, namespace, _, _ = mine.split("/")
    assert not process_gone(mine)
    assert process_gone(_dead_pid_identity())
    parent = f"{boot}/{namespace}/{os.getppid()}/1"  # its PID reused by another process
    assert process_gone(parent)
    dead = _dead_pid_identity().split("/")
    assert not process_gone("/".join([boot, "4026531999", *dead[2:]]))  # another namespace
    assert not process_gone("/".join(["another-boot", *dead[1:]]))  # another boot or host
    assert not process_gone("")  # unknown (another OS, or a lock of an older spotring)


def test_a_dead_driver_of_this_namespace_is_taken_over_at_once(store: ObjectStore) -> None:
    if not process_identity():
        pytest.skip("no /proc")
    plant(store, process=_dead_pid_identity(), label="host-b:7")
    taker = JobLock(store, job_id="job-1", lease_s=60)
    taker.acquire()
    assert lock_document(store)["owner"] == taker.owner


def test_a_live_driver_in_another_pid_namespace_keeps_its_lock(store: ObjectStore) -> None:
    """Its PID means nothing here: its lock is fresh, so it is running."""
    dead = _dead_pid_identity().split("/")
    plant(store, process="/".join([dead[0], "4026531999", *dead[2:]]))
    with pytest.raises(CheckpointLockError, match="already running"):
        JobLock(store, job_id="job-1", lease_s=60).acquire()


# ------------------------------------------------------------------ fenced writers


@pytest.fixture
def two_holders(store: ObjectStore) -> Iterator[tuple[JobLock, JobLock]]:
    """A driver whose lock a second one took over, once it went stale."""
    old = JobLock(store, job_id="job-1", lease_s=LEASE)
    old.acquire()
    wait_until_stale(store)
    new = JobLock(store, job_id="job-1", lease_s=LEASE)
    new.acquire()
    yield old, new


def test_a_superseded_writer_writes_and_prunes_nothing(
    store: ObjectStore, two_holders: tuple[JobLock, JobLock]
) -> None:
    old, new = two_holders
    new_writer = Checkpoints(store, job_id="job-1", keep=1, fence=new.fence)
    old_writer = Checkpoints(store, job_id="job-1", keep=1, fence=old.fence)
    written = new_writer.write(5, b"the new ring")
    assert written.lock_generation == new.fence.generation
    before = store.list()
    with pytest.raises(CheckpointLockLost, match="not generation 1"):
        old_writer.write(9, b"the old ring")
    assert store.list() == before  # not even its data
    assert Checkpoints(store, job_id="job-1").list() == [written]


class TakenOverAfterData(ObjectStore):
    """``inner``, where another driver takes the lock as soon as a checkpoint's data is
    written."""

    def __init__(self, inner: ObjectStore) -> None:
        self.inner, self.uri, self.unused_version = inner, inner.uri, inner.unused_version

    def put(self, key: str, data: bytes | memoryview) -> None:
        self.inner.put(key, data)
        if key.endswith("/data"):
            plant(self.inner, owner="another-driver")

    def get(self, key: str, *, max_size: int | None = None) -> bytes:
        return self.inner.get(key, max_size=max_size)

    def get_versioned(self, key: str, *, max_size: int) -> Versioned:
        return self.inner.get_versioned(key, max_size=max_size)

    def list(self, prefix: str = "") -> list[str]:
        return self.inner.list(prefix)

    def delete(self, key: str) -> None:
        self.inner.delete(key)

    def put_if(self, key: str, data: bytes, version: str | None) -> str | None:
        return self.inner.put_if(key, data, version)


def test_a_lock_taken_over_mid_write_stops_it_before_its_manifest(store: ObjectStore) -> None:
    """The takeover comes between the data and the manifest (on the writer's progress)."""
    holder = JobLock(store, job_id="job-1")
    holder.acquire()

    writer = Checkpoints(TakenOverAfterData(store), job_id="job-1", fence=holder.fence)
    with pytest.raises(CheckpointLockLost, match="another-driver"):
        writer.write(3, b"data, never a manifest")
    assert Checkpoints(store, job_id="job-1").list() == []


def test_a_writer_prunes_only_its_jobs_checkpoints_of_its_generation_or_older(
    store: ObjectStore,
) -> None:
    holder = JobLock(store, job_id="job-1")
    holder.acquire()
    fence = holder.fence

    def written_under(job_id: str, step: int, generation: int | None) -> CheckpointInfo:
        info = Checkpoints(store, job_id=job_id, keep=10).write(step, b"x")
        info = dataclasses.replace(info, lock_generation=generation)
        store.put(info.manifest_key, manifest.encode(info))
        return info

    older = written_under("job-1", 1, fence.generation - 1)
    others = written_under("job-other", 2, None)
    newer = written_under("job-1", 3, fence.generation + 1)
    writer = Checkpoints(store, job_id="job-1", keep=1, fence=fence)
    mine = writer.write(4, b"mine")
    names = {key.split("/")[0] for key in store.list() if key != LOCK_KEY}
    assert names == {mine.name, others.name, newer.name}, (older.name, names)


def test_check_fence_says_whose_lock_it_is_now(store: ObjectStore) -> None:
    with pytest.raises(CheckpointLockLost, match="gone"):
        check_fence(store, "job-1", Fence(1, "me"))
    with JobLock(store, job_id="job-1") as holder:
        check_fence(store, "job-1", holder.fence)
        with pytest.raises(CheckpointLockLost, match="held by"):
            check_fence(store, "job-1", Fence(holder.fence.generation, "me"))
        with pytest.raises(CheckpointLockLost):
            check_fence(store, "job-2", holder.fence)
    with pytest.raises(CheckpointLockLost, match="released"):
        check_fence(store, "job-1", holder.fence)


@pytest.mark.parametrize(
    "raw",
    [b"{not json", b"[" * 30_000 + b"]" * 30_000, b"x" * (2**16 + 1), b"[]"],
    ids=["not json", "deep", "large", "a list"],
)
def test_a_lock_that_is_not_spotrings_is_refused_in_one_line(
    store: ObjectStore, raw: bytes
) -> None:
    store.put(LOCK_KEY, raw)
    with pytest.raises(CheckpointLockError) as caught:
        JobLock(store, job_id="job-1").acquire()
    assert "\n" not in str(caught.value) and LOCK_KEY in str(caught.value)
    assert store.get(LOCK_KEY) == raw


# ------------------------------------------------------------------ a store that cannot fence


@pytest.fixture
def s3_without_conditions(
    s3_backend: Backend,  # noqa: F811 (the fixture)
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Backend]:
    """S3 behind a proxy that drops If-None-Match: an endpoint that ignores it."""
    for name, value in s3_backend.env.items():
        monkeypatch.setenv(name, value)
    with FaultProxy(s3_backend.endpoint, drop_request_headers=("If-None-Match",)) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.url)
        yield s3_backend


def test_an_endpoint_that_ignores_if_none_match_is_refused_at_start(
    s3_without_conditions: Backend,
) -> None:
    store = open_store(s3_without_conditions.uri("no-conditions"), timeout_s=10)
    with pytest.raises(
        CheckpointError, match=r"ignores conditional writes \(If-None-Match\)"
    ) as caught:
        JobLock(store, job_id="job-1").acquire()
    assert "\n" not in str(caught.value)
    assert lock_document(store)["held"] is False  # nobody holds it


def test_a_heartbeat_that_fails_at_the_store_is_an_error_not_a_loss(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    holder = JobLock(store, job_id="job-1")
    holder.acquire()

    def unreachable(*_: Any) -> Any:
        raise CheckpointError("cannot write: connection refused")

    monkeypatch.setattr(store, "put_if", unreachable)
    with pytest.raises(CheckpointError) as caught:
        holder.heartbeat()
    assert not isinstance(caught.value, CheckpointLockLost)
    monkeypatch.undo()
    holder.heartbeat()


def test_taking_over_is_said_once(store: ObjectStore, caplog: pytest.LogCaptureFixture) -> None:
    plant(store, label="host-b:7")
    wait_until_stale(store)
    caplog.set_level(logging.WARNING, logger=lock_module.__name__)
    JobLock(store, job_id="job-1", lease_s=LEASE).acquire()
    said = [r.getMessage() for r in caplog.records if r.name == lock_module.__name__]
    assert len(said) == 1 and "over from host-b:7 (last written" in said[0], said
