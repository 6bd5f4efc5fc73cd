"""The run's side of durable checkpoints (spotring.autoscaler.durable_job): the prefix's
lock held for the run, one line when it cannot be, the newest checkpoint said, the
workers told the lock's generation, and a lock lost stopping the job."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from spotring.autoscaler import durable_job
from spotring.autoscaler.durable_job import DurableJob
from spotring.checkpoint import (
    LOCK_KEY,
    CheckpointError,
    Checkpoints,
    Fence,
    JobLock,
    check_fence,
    open_store,
)
from spotring.checkpoint.lock import LockState
from spotring.core import ConfigurationError, ProviderError
from spotring.driver.options import DurableOptions
from spotring.worker_image.durable import FENCE_ENV, DurableConfig
from tests.fakes.fault_proxy import FaultProxy
from tests.fakes.storage_emulators import Backend, s3_backend  # noqa: F401 (a fixture)


def _job(directory: Path | str, job_id: str = "job-a") -> tuple[DurableJob, list[str]]:
    said: list[str] = []
    return DurableJob(DurableOptions(uri=str(directory), job_id=job_id), said.append), said


def _lock(directory: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((directory / LOCK_KEY).read_text())
    return document


def test_the_lock_is_held_while_the_run_lasts_and_released_after(tmp_path: Path) -> None:
    durable, said = _job(tmp_path)
    with durable.locked():
        assert _lock(tmp_path)["held"] is True
    assert _lock(tmp_path)["held"] is False
    assert said == [f"durable checkpoints to {tmp_path} (none yet)"]


def test_the_workers_are_told_the_generation_they_write_under(tmp_path: Path) -> None:
    durable, _ = _job(tmp_path)
    with durable.locked():
        env = durable.worker_env()
        config = DurableConfig.from_env(env)
        assert config is not None and config.uri == str(tmp_path)
        fence = Fence.decode(env[FENCE_ENV])
        check_fence(open_store(str(tmp_path)), "job-a", fence)
        assert (fence.generation, fence.owner) == (
            _lock(tmp_path)["generation"],
            _lock(tmp_path)["owner"],
        )


def test_a_second_live_driver_of_the_same_job_is_refused(tmp_path: Path) -> None:
    JobLock(open_store(str(tmp_path)), job_id="job-a").acquire()
    durable, _ = _job(tmp_path)
    with pytest.raises(ConfigurationError, match="already"), durable.locked():
        pass


def test_another_job_is_refused_the_prefix_in_one_line(tmp_path: Path) -> None:
    JobLock(open_store(str(tmp_path)), job_id="job-b").acquire()
    durable, _ = _job(tmp_path)
    with pytest.raises(ConfigurationError) as refused, durable.locked():
        pass
    message = str(refused.value)
    assert message.startswith(f"--checkpoint {tmp_path}: ") and "\n" not in message


def test_a_driver_that_died_here_is_taken_over_and_its_checkpoint_said(tmp_path: Path) -> None:
    """A driver process that took the lock and died; a checkpoint whose meta is not what
    spotring writes is still said (from its step)."""
    took = "from spotring.checkpoint import JobLock, open_store; "
    took += f"JobLock(open_store({str(tmp_path)!r}), job_id='job-a').acquire()"
    subprocess.run([sys.executable, "-c", took], check=True)
    Checkpoints(open_store(str(tmp_path)), job_id="job-a").write(
        7, b"state", {"commits": 41, "committed_at": 0.0}
    )
    Checkpoints(open_store(str(tmp_path)), job_id="job-a").write(8, b"state", {"commits": "x"})
    durable, said = _job(tmp_path)
    with durable.locked():
        newest = durable.newest()
    assert newest is not None and newest["commits"] == 8
    assert said and "the first ring resumes from commit 8" in said[0]


@pytest.fixture
def fast_lease(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(durable_job, "LEASE_SECONDS", 1.0)
    monkeypatch.setattr(durable_job, "HEARTBEAT_SECONDS", 0.05)


class JobStopper:
    """What the run gives :meth:`DurableJob.stop_job_with`: records why it stopped."""

    def __init__(self) -> None:
        self.stopped = threading.Event()
        self.errors: list[ProviderError] = []

    def __call__(self, error: ProviderError) -> None:
        self.errors.append(error)
        self.stopped.set()


def test_a_driver_whose_lock_another_took_stops_the_job_in_one_line(
    tmp_path: Path, fast_lease: None
) -> None:
    durable, _ = _job(tmp_path)
    with durable.locked():
        stop = JobStopper()
        durable.stop_job_with(stop)
        generation = _lock(tmp_path)["generation"]
        # Another driver judged this one dead and took the lock.
        taken = LockState("job-a", "another-driver", generation + 1, True, label="host-b:9")
        (tmp_path / LOCK_KEY).write_bytes(taken.encode())
        assert stop.stopped.wait(10), "the job was not stopped"
        assert durable.lost
    (error,) = stop.errors
    message = str(error)
    assert "\n" not in message and message.startswith(f"--checkpoint {tmp_path}: lost ")
    assert "host-b:9" in message and "stops its workers" in message
    assert _lock(tmp_path)["owner"] == "another-driver"  # the exit released nothing
    late = JobStopper()
    durable.stop_job_with(late)  # told at once when the loss came first
    assert late.stopped.is_set()


def test_a_driver_that_cannot_refresh_its_lock_for_a_lease_stops_the_job(
    tmp_path: Path, fast_lease: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    durable, _ = _job(tmp_path)
    with durable.locked():
        stop = JobStopper()
        durable.stop_job_with(stop)

        def unreachable(*_: Any) -> Any:
            raise CheckpointError("cannot write: connection refused")

        monkeypatch.setattr(durable._store, "put_if", unreachable)
        assert stop.stopped.wait(10), "the job was not stopped"
    (error,) = stop.errors
    assert "could not refresh" in str(error) and "connection refused" in str(error)


def test_a_store_that_cannot_fence_is_a_usage_error_at_start(
    s3_backend: Backend,  # noqa: F811 (the fixture)
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in s3_backend.env.items():
        monkeypatch.setenv(name, value)
    with FaultProxy(s3_backend.endpoint, drop_request_headers=("If-None-Match",)) as proxy:
        monkeypatch.setenv("AWS_ENDPOINT_URL_S3", proxy.url)
        durable, _ = _job(s3_backend.uri("no-conditions"))
        with (
            pytest.raises(ConfigurationError, match="ignores conditional writes"),
            durable.locked(),
        ):
            pass


def test_a_job_that_cannot_read_its_checkpoints_at_start_leaves_the_lock_free(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    durable, _ = _job(tmp_path)

    def unreadable() -> Any:
        raise CheckpointError("cannot list: connection refused")

    monkeypatch.setattr(durable._checkpoints, "latest_info", unreadable)
    with pytest.raises(ConfigurationError, match="connection refused"), durable.locked():
        pass
    assert _lock(tmp_path)["held"] is False


def test_the_driver_opens_the_checkpoint_store_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--checkpoint is checked when the options are composed (a bad URI refused before
    anything starts); the run's lock and summaries use that same store."""
    import spotring.checkpoint as checkpoint
    from spotring.autoscaler.composition import durable_options

    opened: list[str] = []
    open_store = checkpoint.open_store

    def counted(uri: str, **kwargs: Any) -> Any:
        opened.append(uri)
        return open_store(uri, **kwargs)

    monkeypatch.setattr(checkpoint, "open_store", counted)
    options = durable_options(str(tmp_path), 60.0, 3, ["python", "train.py"])
    assert options is not None and options.store is not None
    job = DurableJob(options, [].append)
    with job.locked():
        assert job.newest() is None
    assert opened == [str(tmp_path)]
