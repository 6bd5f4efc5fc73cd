"""Ring progress: commits counted in a real worker, carried by its supervisor as signed
lines, tracked by the driver (a fake clock), stalls recorded, a hung member failed."""

from __future__ import annotations

import io
import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from spotring.driver.launcher import ProcessLauncher, WorkerExit, WorkerSpec
from spotring.driver.ring_progress import Hang, RingProgress, Stall
from spotring.worker_image.peer_abort import JOB_KEY_ENV
from spotring.worker_image.progress import MESSAGE_MARKER, ProgressMessage

ENV = {"PATH": os.environ["PATH"]}
KEY = os.urandom(32)

WORKER = """\
import os, sys, time
from horovod.common import elastic

class Overrides(elastic.ObjectState):  # as spotring's TorchState: its own commit
    def commit(self):
        self.save()
        super().commit()  # counted once: only the outermost call counts

state = Overrides(bcast_object=lambda o, **k: o, get_rank=lambda: 0, step=0)
plain = elastic.ObjectState(bcast_object=lambda o, **k: o, get_rank=lambda: 0, step=0)
for _ in range(3):
    state.commit()
plain.commit()
# The script shares the supervisor's stdout: what it prints is no progress.
forged = '{"launch":"x","seq":99,"count":1000,"age":0,"mac":"00"}'
print("\\x1espotring-progress " + forged, flush=True)
# What a child the script starts could inherit of the page (the mapping's own copy of
# the descriptor, made by mmap, is close-on-exec).
def inheritable(fd):
    try:
        return os.get_inheritable(fd) and "memfd:spotring" in os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return False
print("fds:", [f for f in range(3, 256) if inheritable(f)], flush=True)
print("env:", os.environ.get("SPOTRING_PROGRESS_FD"), flush=True)
time.sleep(1.5)  # the supervisor reads the page every 0.5 s
"""


class Heard:
    def __init__(self) -> None:
        self.progress: list[tuple[str, int, int, float]] = []

    def worker_progress(self, host: str, local_rank: int, commits: int, age: float) -> None:
        self.progress.append((host, local_rank, commits, age))


def test_a_real_workers_commits_reach_the_driver_signed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    out, heard = io.StringIO(), Heard()
    spec = WorkerSpec(
        host="host-1",
        local_rank=0,
        rank=0,
        argv=(sys.executable, str(script)),
        env={**ENV, JOB_KEY_ENV: KEY.hex()},
    )
    launcher = ProcessLauncher(remote=False, output=out, listeners=[heard])
    code, _ = launcher(spec, [threading.Event()])
    assert code == 0, out.getvalue()
    assert heard.progress, out.getvalue()
    host, local_rank, commits, age = heard.progress[-1]
    assert (host, local_rank, commits) == ("host-1", 0, 4)  # 3 overridden + 1 plain
    assert 0 <= age < 5
    assert all(c <= 4 for _, _, c, _ in heard.progress)  # the forged 1000 was dropped
    assert "rejected a progress line from host-1" in caplog.text
    assert "spotring-progress" not in out.getvalue()  # neither shown nor taken
    assert "env: None" in out.getvalue()  # the descriptor's name is gone...
    assert "fds: []" in out.getvalue()  # ...and no child can inherit the page


def test_progress_lines_are_rejected_when_forged_replayed_or_foreign() -> None:
    good = ProgressMessage("launch-1", 1, 5, 0.25).signed(KEY)
    parsed = ProgressMessage.parse(good.line().rstrip("\n"))
    assert parsed == good and parsed.verify(KEY)
    assert not ProgressMessage("launch-1", 1, 6, 0.25, good.mac).verify(KEY)
    assert not ProgressMessage("launch-1", 1, 5, 0.25).signed(os.urandom(32)).verify(KEY)
    for bad in (
        '{"launch":"l","seq":0,"count":1,"age":0,"mac":""}',
        '{"launch":"l","seq":1,"count":-1,"age":0,"mac":""}',
        '{"launch":"l","seq":1,"count":1,"age":-1,"mac":""}',
        '{"launch":"l","seq":1,"count":1,"age":NaN,"mac":""}',
        '{"launch":"l","seq":1,"count":true,"age":0,"mac":""}',
        "[1]",
        "x" * 600,
    ):
        with pytest.raises(ValueError):
            ProgressMessage.parse(MESSAGE_MARKER + bad)


# ------------------------------------------------------------------ the tracker


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Recorder:
    def __init__(self) -> None:
        self.stalls: list[Stall] = []
        self.hangs: list[Hang] = []
        self.idle: list[float] = []
        self.records: list[Any] = []

    def ring_stalled(self, stall: Stall) -> None:
        self.stalls.append(stall)

    def ring_hung(self, hang: Hang) -> None:
        self.hangs.append(hang)

    def ring_idle(self, seconds: float) -> None:
        self.idle.append(seconds)

    def ring_progress(self, status: Any) -> None:
        self.records.append(status)


def tracker(hang_timeout: float | None = None) -> tuple[RingProgress, Clock, Recorder]:
    clock, recorder = Clock(), Recorder()
    # wall == clock + 1000, so records are easy to check
    progress = RingProgress(hang_timeout, [recorder], clock=clock, wall=lambda: clock.now + 1000)
    return progress, clock, recorder


def train(progress: RingProgress, clock: Clock, slots: list[tuple[str, int]], steps: int,
          counts: dict[tuple[str, int], int], step: float = 0.1) -> None:  # fmt: skip
    """Every slot commits once per ``step`` s, reported at once."""
    for _ in range(steps):
        clock.now += step
        for slot in slots:
            counts[slot] = counts.get(slot, 0) + 1
            progress.worker_progress(*slot, counts[slot], 0.0)
        progress.tick()


def test_a_stall_is_the_time_without_commits_around_a_reset_not_the_time_to_a_ring() -> None:
    progress, clock, recorder = tracker()
    a, b, c = ("a", 0), ("b", 0), ("c", 0)
    counts: dict[tuple[str, int], int] = {}
    for slot in (a, b):
        progress.slot_started(*slot)
    progress.ring_formed(2, ["a", "b"])
    train(progress, clock, [a, b], 50, counts)  # a host joins meanwhile: the ring trains
    last_commit = clock.now
    clock.now += 0.3  # the reset: rendezvous, new ring
    progress.slot_started(*c)
    progress.ring_formed(3, ["a", "b", "c"])
    clock.now += 0.2
    progress.tick()
    assert recorder.stalls == []  # no commit of the new ring yet
    # The first commit of the new ring, reported 0.4 s late (ages, not arrival times).
    clock.now += 0.4
    counts[c] = 1
    progress.worker_progress(*c, 1, 0.4)
    progress.tick()
    assert recorder.stalls == []  # waits for late reports of earlier commits
    clock.now += 1.0
    progress.tick()
    assert len(recorder.stalls) == 1
    stall = recorder.stalls[0]
    assert stall.ring == 2
    assert stall.start == pytest.approx(last_commit + 1000)
    assert stall.seconds == pytest.approx(0.5)
    progress.tick()
    assert len(recorder.stalls) == 1  # one per reset
    assert recorder.records[0].ring == 1 and recorder.records[-1].ring == 2


def test_a_hung_member_is_the_one_whose_last_commit_is_oldest() -> None:
    progress, clock, recorder = tracker(hang_timeout=5.0)
    hung: list[Hang] = []
    progress._on_hang = hung.append
    slots = [("a", 0), ("b", 0), ("b", 1)]
    counts: dict[tuple[str, int], int] = {}
    for slot in slots:
        progress.slot_started(*slot)
    progress.ring_formed(3, ["a", "b"])
    train(progress, clock, slots, 20, counts)
    # b[1] hangs before its commit; the others commit once more, then wait on it.
    clock.now += 0.1
    for slot in (("a", 0), ("b", 0)):
        counts[slot] += 1
        progress.worker_progress(*slot, counts[slot], 0.0)
    for _ in range(9):
        clock.now += 0.5
        progress.tick()
    assert hung == [] and recorder.idle[-1] == pytest.approx(4.5)
    clock.now += 0.6
    progress.tick()
    assert [(h.host, h.local_rank) for h in hung] == [("b", 1)]
    assert hung[0].idle_s == pytest.approx(5.1) and hung[0].member_idle_s == pytest.approx(5.2)
    assert "no progress for 5.1 s" in hung[0].reason
    assert recorder.hangs == hung
    clock.now += 30
    progress.tick()
    assert len(hung) == 1  # once per ring
    # Its exit and the next ring: watched anew, from the ring's formation.
    progress.worker_exited(WorkerExit("b", 1, 2, -15, False, hung[0].reason), 0)
    progress.slot_started("c", 0)
    progress.ring_formed(3, ["a", "b", "c"])
    clock.now += 4.9
    progress.tick()
    assert len(hung) == 1
    clock.now += 0.2
    progress.tick()
    assert len(hung) == 2 and hung[1].ring == 2


def test_no_hang_without_a_timeout_or_while_no_ring_stands() -> None:
    progress, clock, recorder = tracker(hang_timeout=None)
    hung: list[Hang] = []
    progress._on_hang = hung.append
    progress.slot_started("a", 0)
    progress.ring_formed(1, ["a"])
    clock.now += 100
    progress.tick()
    assert hung == [] and recorder.idle[-1] == 100
    progress.hang_timeout = 5.0
    progress.worker_exited(WorkerExit("a", 0, 0, 1, False), 0)  # a reset (or the end)
    clock.now += 100
    progress.tick()
    assert hung == [] and recorder.idle[-1] == 0


def test_the_jobs_commits_are_counted_across_rings_and_go_on_from_a_checkpoint() -> None:
    """Survivors keep their count, a joining worker starts from 0; a lost ring's
    commits since the checkpoint it resumes from are what the resume loses."""
    progress, clock, _ = tracker()
    a, b, c = ("a", 0), ("b", 0), ("c", 0)
    counts: dict[tuple[str, int], int] = {}
    assert progress.restart_from(7) == (0, None)  # the run starts from commit 7
    for slot in (a, b):
        progress.slot_started(*slot)
    progress.ring_formed(2, ["a", "b"])
    train(progress, clock, [a, b], 10, counts)  # commits 8..17
    progress.worker_exited(WorkerExit("b", 0, 1, -9, stopped=False), 0)
    progress.slot_started(*c)
    progress.ring_formed(2, ["a", "c"])
    train(progress, clock, [a, c], 5, counts)  # 18..22: a at 15, c at 5
    last = clock.now
    made, last_at = progress.restart_from(20)  # the ring is lost; commit 20 was durable
    assert made == 22 and last_at == pytest.approx(last + 1000)
    for slot in (a, c):
        progress.worker_exited(WorkerExit(slot[0], 0, 0, -9, stopped=False), 0)
    for slot in (("d", 0), ("e", 0)):
        progress.slot_started(*slot)
    progress.ring_formed(2, ["d", "e"])
    train(progress, clock, [("d", 0), ("e", 0)], 3, {})
    assert progress.restart_from(0)[0] == 23
