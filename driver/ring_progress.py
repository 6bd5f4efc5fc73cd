"""Whether the ring trains: each member's last commit, the stalls around resets, hangs.

The launcher tells this tracker every ring member's verified progress (its commit
count and the age of its last commit, :mod:`spotring.worker_image.progress`); the
rendezvous server tells it of every ring formed. From that it tells its
:class:`~spotring.driver.ring_events.RingEvents` (on the tracker's own thread):

* ``ring_progress(progress: RingStatus)``: every :data:`RECORD_INTERVAL_SECONDS` while a
  ring stands, and once as it forms;
* ``ring_idle(seconds: float)``: every tick (about twice a second): seconds since the
  ring's last commit (or its formation, if later), 0 while no ring stands;
* ``ring_stalled(stall: Stall)``: once per reset, when the new ring has committed: the
  ring's longest time without any commit around that reset, from the last commit before
  it to the first commit after it;
* ``ring_hung(hang: Hang)``: with ``hang_timeout``, a ring that made no progress for
  that long, measured from its planning or its members' last commit, whichever is later
  (a new ring's rendezvous, state sync and first step count: keep the timeout above
  them and above the longest gap between commits the script has, an evaluation, a
  checkpoint). The clock runs through resets too: a ring whose reset never ends (a
  member that never joins it) hangs like one that stopped training. The member that
  holds the ring up is then failed through ``on_hang``, which takes the same path as a
  worker that died (its host leaves, the peers are told, Horovod blacklists it and the
  controller replaces it). It is told from the peers that wait for it by, in turn: a
  heartbeat that stopped while theirs go on (a worker stopped or wedged); not joining
  a reset they joined (asking the driver for its rank); fewer commits in this ring;
  being the ring's only member. Nobody is failed when no member stands out; a member
  is failed once, and the next judgment waits another ``hang_timeout``.

Times are the driver's monotonic clock; the ages the supervisors send are turned into
times on it, so hosts' clocks never matter. Epoch seconds (``wall``) only for records.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from spotring.driver.ring_events import Hang, NoRingEvents, RingEvents
from spotring.driver.ring_events import RingStatus as RingStatus  # re-exported: its old home
from spotring.driver.ring_events import Stall as Stall
from spotring.driver.worker_events import WorkerEvents
from spotring.worker_image.progress import KEEPALIVE_SECONDS

log = logging.getLogger(__name__)

TICK_SECONDS = 0.5
RECORD_INTERVAL_SECONDS = 10.0
SETTLE_SECONDS = 1.0
"""How long a stall's end waits for late reports of commits before it (supervisors
report every 0.5 s) before the stall is told."""
STALE_BEAT_SECONDS = 3 * KEEPALIVE_SECONDS
"""A member whose last heartbeat the driver knows of is this old has stopped beating
(a live worker's supervisor reports one at least every ``KEEPALIVE_SECONDS``)."""

Slot = tuple[str, int]


@dataclass
class _Member:
    commits: int = 0
    at_formation: int = 0  # its count when the current ring formed
    last_commit: float | None = None
    beat: float | None = None  # its last heartbeat, as reported; None: none reported
    epochs: float | None = None  # the job's epochs at its last commit; None: no sampler
    samples: int | None = None  # the job's samples then; None: no sampler
    asked: float | None = None  # when it last asked the driver for its rank (a reset)

    @property
    def resetting(self) -> bool:
        """It asked for its rank after its last commit: it is in a reset (or joins its
        first ring). Its own two times: no other worker's pace or clock in between."""
        if self.asked is None:
            return False
        return self.last_commit is None or self.asked > self.last_commit


class RingProgress(WorkerEvents):
    """Tracks each ring member's progress; reports stalls; fails a hung member.

    :param hang_timeout: seconds without progress after which the member that holds the
        ring up is failed (None: never).
    :param events: told of the rings' progress, stalls, idle time and hangs.
    :param clock: monotonic seconds; :param wall: epoch seconds (tests pass fakes).
    """

    def __init__(
        self,
        hang_timeout: float | None = None,
        events: RingEvents | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.hang_timeout = hang_timeout
        self._events: RingEvents = events or NoRingEvents()
        self._clock = clock
        self._wall = wall
        self._on_hang: Callable[[Hang], None] | None = None
        self._lock = threading.Lock()
        self._members: dict[Slot, _Member] = {}
        self._ring = 0
        self._size = 0
        self._hosts: frozenset[str] = frozenset()
        self._formed_at: float | None = None
        self._standing = False  # a ring formed and none of its members has left it
        self._last_commit: float | None = None  # any member's, any ring
        self._stall_start: float | None = None  # last commit before a pending reset
        self._stall_end: float | None = None  # the new ring's first commit
        self._next_record = 0.0
        self._job_commits = 0  # the job's commits when the current ring formed
        self._ring_commits = 0  # the most commits a member made since it formed
        self._failed: set[Slot] = set()  # members failed as hung, until they exit
        self._judged_at: float | None = None  # when the last hung member was failed
        self._undecided_since: float | None = None  # a hang no member stood out in, told
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ inputs

    def ring_formed(self, size: int, hosts: list[str]) -> None:
        """Horovod planned a new ring (the rendezvous server's listener)."""
        now = self._clock()
        with self._lock:
            self._ring += 1
            self._job_commits += self._ring_commits
            self._ring_commits = 0
            self._size, self._hosts = size, frozenset(hosts)
            self._formed_at, self._standing = now, True
            for member in self._members.values():
                member.at_formation = member.commits
            if self._ring > 1 and self._stall_start is None:
                self._stall_start = self._last_commit
            self._stall_end = None
            self._next_record = now  # one record as it forms

    def slot_started(self, host: str, local_rank: int) -> None:
        """A worker took slot ``host[local_rank]`` (the launcher's listener)."""
        with self._lock:
            self._members[(host, local_rank)] = _Member()
            self._failed.discard((host, local_rank))

    def slot_asked(self, host: str, local_rank: int) -> None:
        """The worker of slot ``host[local_rank]`` asked the driver for its rank: it
        has left its ring's training for a reset (or it joins its first ring)."""
        now = self._clock()
        with self._lock:
            member = self._members.get((host, local_rank))
            if member is not None:
                member.asked = now

    def worker_started(self, host: str, process_group: int) -> None:
        pass

    def worker_exited(self, exit: Any, process_group: int) -> None:
        """A member left: its ring is about to reset (or the job ends); until the next
        ring forms, no stall records are made."""
        with self._lock:
            self._members.pop((exit.host, exit.local_rank), None)
            self._failed.discard((exit.host, exit.local_rank))
            if exit.host in self._hosts:
                self._standing = False
                if self._stall_start is None and self._stall_end is None:
                    self._stall_start = self._last_commit

    def worker_progress(
        self,
        host: str,
        local_rank: int,
        commits: int,
        age: float,
        beat: float | None = None,
        epochs: float | None = None,
        samples: int | None = None,
    ) -> None:
        """A verified progress report: ``commits`` so far, the last ``age`` s ago; the
        worker's last heartbeat ``beat`` s ago (None: it never beat); the job's
        ``epochs`` and ``samples`` at that commit (None: no sampler)."""
        now = self._clock()
        at = now - max(0.0, age)
        with self._lock:
            member = self._members.get((host, local_rank))
            if member is None:
                return  # not a member now
            if beat is not None:
                member.beat = max(member.beat or -math.inf, now - max(0.0, beat))
            if commits <= member.commits:
                return  # nothing new
            member.commits, member.last_commit = commits, at
            member.epochs, member.samples = epochs, samples
            formed = self._formed_at
            if formed is not None and at <= formed:
                member.at_formation = commits  # a late report of a commit before it
            if host in self._hosts:
                self._ring_commits = max(self._ring_commits, commits - member.at_formation)
            if self._last_commit is None or at > self._last_commit:
                self._last_commit = at
            if formed is not None and at <= formed and self._stall_start is not None:
                self._stall_start = max(self._stall_start, at)  # a late report
            ends_stall = formed is not None and at > formed and self._stall_start is not None
            if ends_stall and (self._stall_end is None or at < self._stall_end):
                self._stall_end = at

    def restart_from(self, commits: int) -> tuple[int, float | None]:
        """The next ring starts from a durable checkpoint of the job's commit
        ``commits`` (a lost ring's, or the one a run starts from): the job's count goes
        on from there. Returns the commits the job had made and the epoch time of the
        last, as reported: a worker reports twice a second, so the commits of its last
        half second before a hard kill may be missing."""
        now = self._clock()
        with self._lock:
            made = self._job_commits + self._ring_commits
            self._job_commits, self._ring_commits = commits, 0
            last = self._last_commit
        return made, None if last is None else self._to_wall(last, now)

    # ------------------------------------------------------------ the thread

    def start(self, on_hang: Callable[[Hang], None] | None = None) -> None:
        """Tick on a thread of its own until :meth:`close`; ``on_hang`` fails a member."""
        self._on_hang = on_hang
        self._thread = threading.Thread(target=self._run, name="spotring-progress", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def _run(self) -> None:
        failures = 0
        while not self._stop.wait(TICK_SECONDS):
            try:
                self.tick()
            except Exception:  # never die silently; log, and keep watching
                failures += 1
                if failures in (1, 10) or failures % 100 == 0:
                    log.exception("ring progress tracker failed (%d times)", failures)

    def tick(self) -> None:
        """One look: tell stalls, records and idle time; fail a hung ring's member."""
        now = self._clock()
        stall = status = None
        with self._lock:
            if self._stall_end is not None and now >= self._stall_end + SETTLE_SECONDS:
                if self._stall_start is not None:
                    start, end = self._stall_start, self._stall_end
                    stall = Stall(self._ring, self._to_wall(start, now), self._to_wall(end, now))
                self._stall_start = self._stall_end = None
            idle = self._idle(now)
            if self._standing and now >= self._next_record:
                self._next_record = now + RECORD_INTERVAL_SECONDS
                status = self._status(now, idle or 0.0)
            hangs = self._judge_hang(now)
        self._tell(self._events.ring_idle, idle or 0.0)
        if stall is not None:
            self._tell(self._events.ring_stalled, stall)
        if status is not None:
            self._tell(self._events.ring_progress, status)
        for hang in hangs:
            log.warning("ring %d: %s: failing %s[%d]", hang.ring, hang.reason, hang.host,
                        hang.local_rank)  # fmt: skip
            self._tell(self._events.ring_hung, hang)
            if self._on_hang is not None:
                self._on_hang(hang)

    # ------------------------------------------------------------ helpers (locked)

    def _idle(self, now: float) -> float | None:
        if not self._standing or self._formed_at is None:
            return None
        return max(0.0, now - self._last_ring_event(self._ring_members()))

    def _last_ring_event(self, members: list[tuple[Slot, _Member]]) -> float:
        """The ring's planning or its members' last commit, whichever is later."""
        assert self._formed_at is not None
        commits = [m.last_commit for _, m in members if m.last_commit is not None]
        return max([self._formed_at, *commits])

    def _ring_members(self) -> list[tuple[Slot, _Member]]:
        return sorted((s, m) for s, m in self._members.items() if s[0] in self._hosts)

    def _member_since(self, member: _Member) -> float:
        assert self._formed_at is not None
        if member.last_commit is None:
            return self._formed_at
        return max(self._formed_at, member.last_commit)

    def _status(self, now: float, idle: float) -> RingStatus:
        members = self._ring_members()
        steps = max((m.commits - m.at_formation for _, m in members), default=0)
        slowest = ""
        if members:
            (host, slot), _ = min(members, key=lambda i: (self._member_since(i[1]), i[0]))
            slowest = f"{host}[{slot}]"
        sampled = [m for _, m in members if m.epochs is not None]
        latest = max(sampled, key=lambda m: m.epochs or 0.0, default=None)
        epochs, samples = (None, None) if latest is None else (latest.epochs, latest.samples)
        return RingStatus(self._ring, self._size, steps, round(idle, 3), slowest, epochs, samples)

    def _judge_hang(self, now: float) -> list[Hang]:
        """The members to fail now, if the ring (training, resetting or forming) made no
        progress for ``hang_timeout``; each is failed once."""
        timeout = self.hang_timeout
        members = self._ring_members()
        if timeout is None or self._formed_at is None or not members:
            return []
        since = self._last_ring_event(members)
        if self._judged_at is not None:
            since = max(since, self._judged_at)
        idle = now - since
        suspects = [(s, m) for s, m in members if s not in self._failed]
        if idle < timeout or not suspects:
            return []
        hung = _hung_members(suspects, now)
        if not hung:
            stopping = len(suspects) < len(members)  # a member failed already, not gone yet
            self._tell_undecided(suspects, since, idle, stopping)
            return []
        self._judged_at = now
        self._failed.update(slot for slot, _, _ in hung)
        return [
            Hang(self._ring, host, slot, round(idle, 3),
                 round(now - self._member_since(member), 3), why)
            for (host, slot), member, why in hung
        ]  # fmt: skip

    def _tell_undecided(
        self, suspects: list[tuple[Slot, _Member]], since: float, idle: float, stopping: bool
    ) -> None:
        """Say once per hang that no member stands out, unless the ring waits for the
        driver (every member in a reset: hosts below --min-np, a resume) or for a member
        failed already to stop."""
        waiting = all(m.resetting for _, m in suspects)
        if stopping or waiting or self._undecided_since == since:
            return
        self._undecided_since = since
        log.warning(
            "ring %d made no progress for %.1f s, but no member stands out (every one is "
            "alive and made as many commits); none is failed",
            self._ring,
            idle,
        )

    def _to_wall(self, at: float, now: float) -> float:
        return round(self._wall() - (now - at), 3)

    def _tell(self, event: Callable[[Any], None], value: Any) -> None:
        """Tell an event; one whose listener raises is logged, and the tracker goes on."""
        try:
            event(value)
        except Exception:
            log.exception("ring event %s failed", getattr(event, "__name__", event))


def _hung_members(
    members: Sequence[tuple[Slot, _Member]], now: float
) -> list[tuple[Slot, _Member, str]]:
    """The members of a ring that made no progress that hold it up, and why; none when
    none stands out. In a collective that hangs every member's last commit is the same,
    so the commits come last:

    1. members whose heartbeat stopped (a process stopped or wedged) while another
       member's goes on (the driver still hears from the ring);
    2. in a reset or formation that some members joined (they asked for their rank
       after their last commit), the members that did not;
    3. members that made fewer commits in this ring than the others;
    4. the member of a ring of one.
    """
    silent = {slot: now - m.beat for slot, m in members if m.beat is not None}
    stale = [(slot, m) for slot, m in members if silent.get(slot, 0.0) >= STALE_BEAT_SECONDS]
    if stale and (len(stale) < len(silent) or len(members) == 1):
        return [
            (slot, m, f"its worker stopped beating {silent[slot]:.1f} s ago (stopped or "
                      "wedged, while its peers beat)")
            for slot, m in stale
        ]  # fmt: skip
    asked = [m.asked for _, m in members if m.resetting and m.asked is not None]
    if asked:
        return [
            (slot, m, f"its worker never asked for its rank (its peers did, "
                      f"{now - max(asked):.1f} s ago)")
            for slot, m in members
            if not m.resetting
        ]  # fmt: skip
    made = {slot: m.commits - m.at_formation for slot, m in members}
    most = max(made.values(), default=0)
    behind = [
        (slot, m, f"it made {made[slot]} commits in this ring, its peers {most}")
        for slot, m in members
        if made[slot] < most
    ]
    if behind:
        return behind
    if len(members) == 1:
        ((slot, m),) = members
        return [(slot, m, "it is the ring's only member")]
    return []
