"""The run's side of durable checkpoints (spotring.autoscaler.durable_job): the prefix's
lock held for the run, one line when it cannot be, the newest checkpoint said."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from spotring.autoscaler.durable_job import DurableJob
from spotring.checkpoint import Checkpoints, JobLock, open_store
from spotring.core import ConfigurationError
from spotring.driver.options import DurableOptions


def _job(directory: Path, job_id: str = "job-a") -> tuple[DurableJob, list[str]]:
    said: list[str] = []
    return DurableJob(DurableOptions(uri=str(directory), job_id=job_id), said.append), said


def test_the_lock_is_held_while_the_run_lasts_and_released_after(tmp_path: Path) -> None:
    durable, said = _job(tmp_path)
    with durable.locked():
        assert (tmp_path / "lock.json").exists()
    assert not (tmp_path / "lock.json").exists()
    assert said == [f"durable checkpoints to {tmp_path} (none yet)"]


def test_a_second_live_driver_of_the_same_job_is_refused(tmp_path: Path) -> None:
    live = f"{os.uname().nodename}:{os.getppid()}"  # a live process, not this one
    JobLock(open_store(str(tmp_path)), job_id="job-a", owner=live).acquire()
    durable, _ = _job(tmp_path)
    with pytest.raises(ConfigurationError, match="already"), durable.locked():
        pass


def test_another_job_is_refused_the_prefix_in_one_line(tmp_path: Path) -> None:
    JobLock(open_store(str(tmp_path)), job_id="job-b", owner="elsewhere:1").acquire()
    durable, _ = _job(tmp_path)
    with pytest.raises(ConfigurationError) as refused, durable.locked():
        pass
    message = str(refused.value)
    assert message.startswith(f"--checkpoint {tmp_path}: ") and "\n" not in message


def test_a_driver_that_died_on_this_host_is_taken_over(tmp_path: Path) -> None:
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)
    JobLock(
        open_store(str(tmp_path)), job_id="job-a", owner=f"{os.uname().nodename}:{dead}"
    ).acquire()
    Checkpoints(open_store(str(tmp_path)), job_id="job-a").write(
        7, b"state", {"commits": 41, "committed_at": 0.0}
    )
    durable, said = _job(tmp_path)
    with durable.locked():
        newest = durable.newest()
    assert newest is not None and newest["commits"] == 41
    assert said and "the first ring resumes from commit 41" in said[0]
