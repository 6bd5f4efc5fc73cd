"""Ring progress: commits counted in a real worker, carried by its supervisor as signed
lines, tracked by the driver (a fake clock), stalls recorded, a hung member failed."""

from __future__ import annotations

import io
import os
import signal
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import psutil
import pytest

from spotring.driver.launcher import ProcessLauncher, WorkerExit, WorkerSpec
from spotring.driver.ring_events import Hang, NoRingEvents, Stall
from spotring.driver.ring_progress import STALE_BEAT_SECONDS, RingProgress
from spotring.driver.worker_events import WorkerEvents
from spotring.worker_image.peer_abort import JOB_KEY_ENV
from spotring.worker_image.progress import (
    MESSAGE_MARKER,
    CommitCounter,
    ProgressForwarder,
    ProgressMessage,
    ProgressPage,
)

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


class Heard(WorkerEvents):
    def __init__(self) -> None:
        self.progress: list[tuple[str, int, int, float, float | None]] = []

    def worker_progress(
        self,
        host: str,
        local_rank: int,
        commits: int,
        age: float,
        beat: float | None,
        epochs: float | None = None,
        samples: int | None = None,
    ) -> None:
        self.progress.append((host, local_rank, commits, age, beat))


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
    host, local_rank, commits, age, _ = heard.progress[-1]
    assert (host, local_rank, commits) == ("host-1", 0, 4)  # 3 overridden + 1 plain
    assert 0 <= age < 5
    assert all(c <= 4 for _, _, c, _, _ in heard.progress)  # the forged 1000 was dropped
    assert all(b is not None and b < STALE_BEAT_SECONDS for *_, b in heard.progress)
    assert "rejected a progress line from host-1" in caplog.text
    assert "spotring-progress" not in out.getvalue()  # neither shown nor taken
    assert "env: None" in out.getvalue()  # the descriptor's name is gone...
    assert "fds: []" in out.getvalue()  # ...and no child can inherit the page


STOPS = """\
import os, sys, time
from horovod.common import elastic

state = elastic.ObjectState(bcast_object=lambda o, **k: o, get_rank=lambda: 0, step=0)
state.commit()
print("pid", os.getpid(), flush=True)
time.sleep(120)  # until stopped, then killed
"""


def test_a_stopped_workers_heartbeat_ages_while_its_supervisor_reports_and_it_is_killed(
    tmp_path: Path,
) -> None:
    """SIGSTOP: the process lives and holds its sockets, but its heartbeat thread stops
    with it; the supervisor, not stopped, goes on reporting the beat's age. Failing it
    kills it (SIGKILL reaches a stopped process)."""
    script = tmp_path / "stops.py"
    script.write_text(STOPS)
    out, heard = io.StringIO(), Heard()
    spec = WorkerSpec(
        "host-1", 0, 0, (sys.executable, str(script)), {**ENV, JOB_KEY_ENV: KEY.hex()}
    )
    launcher = ProcessLauncher(remote=False, output=out, listeners=[heard])
    result: list[tuple[int, float]] = []
    runs = threading.Thread(target=lambda: result.append(launcher(spec, [threading.Event()])))
    runs.start()
    try:
        wait_until(lambda: "pid " in out.getvalue() and heard.progress, "a report")
        pid = int(out.getvalue().split("pid ")[1].split()[0])
        os.kill(pid, signal.SIGSTOP)
        wait_until(lambda: (heard.progress[-1][4] or 0) >= STALE_BEAT_SECONDS, "a stale beat")
        assert heard.progress[-1][2] == 1  # no commit since, and still reported
        assert launcher.fail_worker("host-1", 0, "hung: stopped")
    finally:
        runs.join(timeout=30)
    assert result and result[0][0] == -signal.SIGKILL, out.getvalue()
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def wait_until(condition: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"no {what} after {timeout:.0f} s"
        time.sleep(0.05)


def test_progress_lines_are_rejected_when_forged_replayed_or_foreign() -> None:
    good = ProgressMessage("launch-1", 1, 5, 0.25, 0.1).signed(KEY)
    parsed = ProgressMessage.parse(good.line().rstrip("\n"))
    assert parsed == good and parsed.verify(KEY)
    assert not ProgressMessage("launch-1", 1, 6, 0.25, 0.1, mac=good.mac).verify(KEY)
    assert not ProgressMessage("launch-1", 1, 5, 0.25, 9.0, mac=good.mac).verify(KEY)
    assert not ProgressMessage("launch-1", 1, 5, 0.25).signed(os.urandom(32)).verify(KEY)
    never = ProgressMessage("launch-1", 1, 0, 0.0, None).signed(KEY)  # a worker that never beat
    assert ProgressMessage.parse(never.line().rstrip("\n")) == never
    for bad in (
        '{"launch":"l","seq":0,"count":1,"age":0,"beat":0,"mac":""}',
        '{"launch":"l","seq":1,"count":-1,"age":0,"beat":0,"mac":""}',
        '{"launch":"l","seq":1,"count":1,"age":-1,"beat":0,"mac":""}',
        '{"launch":"l","seq":1,"count":1,"age":NaN,"beat":0,"mac":""}',
        '{"launch":"l","seq":1,"count":true,"age":0,"beat":0,"mac":""}',
        '{"launch":"l","seq":1,"count":1,"age":0,"mac":""}',
        '{"launch":"l","seq":1,"count":1,"age":0,"beat":-1,"mac":""}',
        '{"launch":"l","seq":1,"count":1,"age":0,"beat":"1","mac":""}',
        '{"launch":"l","seq":1,"count":1,"age":0,"beat":0,"position":[1,5],"mac":""}',
        '{"launch":"l","seq":1,"count":1,"age":0,"beat":0,"position":[1,11,10],"mac":""}',
        '{"launch":"l","seq":1,"count":1,"age":0,"beat":0,"position":[-1,0,10],"mac":""}',
        '{"launch":"l","seq":1,"count":1,"age":0,"beat":0,"position":[1,0,0],"mac":""}',
        '{"launch":"l","seq":1,"count":1,"age":0,"beat":0,"position":[1,0.5,9],"mac":""}',
        "[1]",
        "x" * 600,
    ):
        with pytest.raises(ValueError):
            ProgressMessage.parse(MESSAGE_MARKER + bad)


def test_the_samplers_position_goes_from_the_commit_to_the_line_signed() -> None:
    from horovod.torch.elastic.sampler import ElasticSampler

    sampler = object.__new__(ElasticSampler)  # its reset() needs a ring; the fields do not
    sampler.dataset, sampler.epoch, sampler.processed_num = list(range(40)), 2, 10

    class State:  # what a TorchState holds: its handlers, one with the sampler
        _handlers = {"sampler": types.SimpleNamespace(value=sampler)}

        def commit(self) -> None:
            pass

    page, fd = ProgressPage.create()
    os.close(fd)
    State.commit = CommitCounter(page).wrap(State.commit)  # type: ignore[method-assign]
    State().commit()
    lines: list[str] = []
    ProgressForwarder(page, KEY, "launch-1", lines.append).forward()
    message = ProgressMessage.parse(lines[0].rstrip("\n"))
    assert message.verify(KEY) and message.position == (2, 10, 40) and message.epochs == 2.25
    forged = message.line().replace("[2,10,40]", "[3,10,40]")
    assert not ProgressMessage.parse(forged.rstrip("\n")).verify(KEY)
    sampler.processed_num = 48  # a last batch padded to the ring's size
    State().commit()
    ProgressForwarder(page, KEY, "launch-1", lines.append).forward()
    assert ProgressMessage.parse(lines[1].rstrip("\n")).epochs == 3.0


# ------------------------------------------------------------------ the tracker


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Recorder(NoRingEvents):
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
    progress = RingProgress(hang_timeout, recorder, clock=clock, wall=lambda: clock.now + 1000)
    return progress, clock, recorder


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


def train(progress: RingProgress, clock: Clock, slots: list[tuple[str, int]], steps: int,
          counts: dict[tuple[str, int], int], step: float = 0.1) -> None:  # fmt: skip
    """Every slot commits once per ``step`` s and beats, reported at once."""
    for _ in range(steps):
        clock.now += step
        for slot in slots:
            counts[slot] = counts.get(slot, 0) + 1
            progress.worker_progress(*slot, counts[slot], 0.0, 0.0)
        progress.tick()


def wait(progress: RingProgress, clock: Clock, seconds: float, beating: list[tuple[str, int]],
         counts: dict[tuple[str, int], int]) -> None:  # fmt: skip
    """``seconds`` pass without a commit; the ``beating`` slots' supervisors report a
    fresh beat twice a second; the tracker ticks."""
    for _ in range(round(seconds / 0.5)):
        clock.now += 0.5
        for slot in beating:
            progress.worker_progress(*slot, counts.get(slot, 0), 0.0, 0.1)
        progress.tick()


def hung_ring(slots: list[tuple[str, int]], hang_timeout: float = 5.0) -> tuple[
    RingProgress, Clock, Recorder, list[Hang], dict[tuple[str, int], int]
]:  # fmt: skip
    """A ring of ``slots`` that trained 20 steps."""
    progress, clock, recorder = tracker(hang_timeout)
    hung: list[Hang] = []
    progress._on_hang = hung.append
    counts: dict[tuple[str, int], int] = {}
    for slot in slots:
        progress.slot_started(*slot)
    progress.ring_formed(len(slots), sorted({host for host, _ in slots}))
    train(progress, clock, slots, 20, counts)
    return progress, clock, recorder, hung, counts


def test_in_a_collective_that_hangs_the_member_that_stopped_beating_is_failed() -> None:
    """Every member's last commit is the same; b[1] was stopped (SIGSTOP), its peers
    wait in the step's allreduce and beat on: b[1], and only it, is failed."""
    slots = [("a", 0), ("b", 0), ("b", 1)]
    progress, clock, recorder, hung, counts = hung_ring(slots)
    wait(progress, clock, 4.5, [("a", 0), ("b", 0)], counts)
    assert hung == [] and recorder.idle[-1] == pytest.approx(4.5)
    wait(progress, clock, 0.5, [("a", 0), ("b", 0)], counts)
    assert [(h.host, h.local_rank) for h in hung] == [("b", 1)]
    assert hung[0].idle_s == pytest.approx(5.0)
    assert "stopped beating 5.0 s ago" in hung[0].reason
    assert recorder.hangs == hung
    # It is being stopped: failed once; the others are judged again only after another
    # timeout, and nothing sets them apart.
    wait(progress, clock, 30, [("a", 0), ("b", 0)], counts)
    assert len(hung) == 1


def test_a_member_that_never_joins_a_reset_or_a_formation_is_failed() -> None:
    """A reset that one member never joins (stopped before its supervisor could tell a
    beat) holds Horovod's barrier for good; a ring planned with a new member that never
    asks for its rank never forms. Each such member is failed after the timeout."""
    slots = [("a", 0), ("b", 0), ("c", 0)]
    progress, clock, _, hung, counts = hung_ring(slots)
    for slot in slots:
        progress._members[slot].beat = None  # never beat (no sitecustomize)
    # c dies; a asks for its rank in the reset, b never does.
    progress.worker_exited(WorkerExit("c", 0, 2, -9, False), 0)
    clock.now += 0.2
    progress.slot_asked("a", 0)
    wait(progress, clock, 4.5, [], counts)
    assert hung == []
    wait(progress, clock, 0.5, [], counts)
    assert [(h.host, h.local_rank) for h in hung] == [("b", 0)]
    assert "its worker never asked for its rank (its peers did, 5.0 s ago)" in hung[0].reason
    progress.worker_exited(WorkerExit("b", 0, 1, -15, False, hung[0].reason), 0)
    # The next ring: a, and d, which never asks for its rank; a asked again.
    progress.slot_started("d", 0)
    progress.slot_asked("a", 0)
    progress.ring_formed(2, ["a", "d"])
    wait(progress, clock, 5.0, [], counts)
    assert [(h.host, h.local_rank, h.ring) for h in hung[1:]] == [("d", 0, 2)]


def test_a_member_behind_its_peers_is_failed_and_nobody_when_none_stands_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """b[1] hangs (alive, beating) before its commit while the others made theirs: it
    made fewer. Then every member is alive with as many commits: nobody is failed
    (said once), nor while they all wait for the driver in a reset."""
    slots = [("a", 0), ("b", 0), ("b", 1)]
    progress, clock, _, hung, counts = hung_ring(slots)
    train(progress, clock, [("a", 0), ("b", 0)], 1, counts)
    wait(progress, clock, 5.0, slots, counts)
    assert [(h.host, h.local_rank) for h in hung] == [("b", 1)]
    assert "it made 20 commits in this ring, its peers 21" in hung[0].reason
    progress.worker_exited(WorkerExit("b", 1, 2, -15, False, hung[0].reason), 0)
    progress.ring_formed(2, ["a", "b"])
    train(progress, clock, [("a", 0), ("b", 0)], 3, counts)
    wait(progress, clock, 20, [("a", 0), ("b", 0)], counts)
    assert len(hung) == 1
    assert caplog.text.count("no member stands out") == 1
    for slot in (("a", 0), ("b", 0)):  # a reset: both wait for hosts below --min-np
        progress.slot_asked(*slot)
    train(progress, clock, [], 0, counts)
    caplog.clear()
    wait(progress, clock, 20, [("a", 0), ("b", 0)], counts)
    assert len(hung) == 1 and "no member stands out" not in caplog.text


def test_the_driver_hearing_nobody_fails_nobody_but_a_ring_of_one_fails_its_member() -> None:
    """No member's beat reached the driver for a while (its own reader stalled):
    nothing sets one apart. A ring of one that makes no progress: its member."""
    slots = [("a", 0), ("b", 0)]
    progress, clock, _, hung, counts = hung_ring(slots)
    wait(progress, clock, 10, [], counts)
    assert hung == []
    progress, clock, _, hung, counts = hung_ring([("a", 0)])
    wait(progress, clock, 5, [("a", 0)], counts)
    assert [(h.host, h.why) for h in hung] == [("a", "it is the ring's only member")]


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


def test_the_ring_status_carries_the_jobs_epochs_from_its_members_samplers() -> None:
    """The epochs are the job's (restored with the sampler), not the ring's: a joining
    member that has not committed yet neither lowers nor hides them."""
    progress, clock, recorder = tracker()
    for host in ("a", "b"):
        progress.slot_started(host, 0)
    progress.ring_formed(2, ["a", "b"])
    progress.tick()
    assert recorder.records[-1].epochs is None  # no member reported a sampler yet
    progress.worker_progress("a", 0, 1, 0.0, 0.0, 1.5)
    progress.worker_progress("b", 0, 1, 0.0, 0.0, None)
    clock.now += 10.0
    progress.tick()
    assert recorder.records[-1].epochs == 1.5
