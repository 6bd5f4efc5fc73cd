"""Training progress, from a worker to the driver: how many commits, and how long ago;
and whether the worker process still runs at all.

The driver cannot see whether a ring trains: a ring whose members all live can still
stand still (a reset, a rendezvous, a hung rank). Each worker counts its state's
``commit`` calls; the driver learns the count, and the age of the last commit, per
ring member, and from that when and for how long a ring made no progress.

When a ring stands still, the driver must also tell the member that holds it up from
the ones that wait for it. The commits cannot: in a collective that hangs, every
member's last commit is the same one. So a thread of the worker's own beats: it stores
the time in the page every :data:`BEAT_SECONDS`. A member stopped (SIGSTOP) or wedged
(a call that never gives the interpreter back) stops beating; its peers, blocked in a
collective (Horovod's waits release the interpreter's lock), keep beating.

How it travels, and what it costs:

* **Worker -> supervisor: a shared page, no syscall per commit.** The supervisor makes
  an anonymous memory file (``memfd``) and hands its descriptor to the worker, named by
  ``SPOTRING_PROGRESS_FD`` (:data:`PROGRESS_FD_ENV`), as it hands the job key's pipe.
  spotring's ``sitecustomize`` maps it and closes the descriptor before the script
  runs, and wraps ``commit`` of ``horovod.common.elastic.State`` (and of any subclass
  that overrides it, as spotring's ``TorchState`` does) so that each outermost call
  stores its count and ``time.monotonic()`` in the page as it starts: two stores into
  memory. The heartbeat thread starts there too, before the script runs.
* **Supervisor -> driver: a signed line.** The supervisor reads the page every
  :data:`INTERVAL_SECONDS` and, when the count has changed or
  :data:`KEEPALIVE_SECONDS` have passed since its last line, writes a
  :class:`ProgressMessage` line on its stdout (the pipe or ssh channel the driver reads
  the worker's output from): count, the last commit's age and the last beat's age in
  seconds (ages, not clock readings: hosts' clocks differ), HMAC-SHA256 under the job
  key, bound to the worker launch, with a sequence number, exactly as interruption
  notices are (:mod:`spotring.worker_image.notices`). Two lines a second per worker at
  most, one at least: a host that stops sending (frozen whole) ages the same way.

Who can forge what: the training script prints on the same stdout, but a progress line
it prints fails the MAC and is dropped, so printing can neither fake progress nor hide
it. The script itself can write into its own process's page (as it can corrupt its own
model): it is the job's own code, and the most it can do is make its own worker look
busier than it is.
"""

from __future__ import annotations

import contextlib
import math
import mmap
import os
import struct
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, cast

from spotring.worker_image import horovod_internals
from spotring.worker_image.signed_lines import SignedLine, is_int
from spotring.worker_image.state_hooks import wrap_in_state_classes
from spotring.worker_image.wire import PROGRESS_FD_ENV as PROGRESS_FD_ENV  # re-exported
from spotring.worker_image.wire import PROGRESS_MARKER

MESSAGE_MARKER = PROGRESS_MARKER

MAX_MESSAGE_BYTES = 512
"""Longer lines with the marker are rejected unread."""

INTERVAL_SECONDS = 0.5
"""How often the supervisor reads the page (and at most how often it writes a line)."""

KEEPALIVE_SECONDS = 1.0
"""The longest the supervisor goes without a line: the driver keeps each beat's age fresh."""

BEAT_SECONDS = 0.25
"""How often the worker's heartbeat thread stores the time in the page."""

MAX_AGE_SECONDS = 1e7
_COMMIT = struct.Struct("=dQ")  # last commit's time.monotonic(), commits so far
_BEAT = struct.Struct("=d")  # last beat's time.monotonic() (0: none), written apart
_POSITION = struct.Struct("=QQQ")  # the sampler's epoch, position, epoch size (0: none)
_RECORD = struct.Struct("=dQdQQQ")  # all three, as read
MAX_INT = 2**63
PAGE_BYTES = mmap.PAGESIZE


# ------------------------------------------------------------------ the message


@dataclass(frozen=True)
class ProgressMessage(SignedLine):
    """A worker's progress on its way from its supervisor to the driver: a signed line
    (:mod:`spotring.worker_image.signed_lines`).

    ``count``: the worker's ``commit`` calls since it started; ``age``: seconds since
    the last of them, when the supervisor wrote the line; ``beat``: seconds since the
    worker's heartbeat thread last stored the time (None: it never did, e.g. a script
    run without spotring's ``sitecustomize``). ``position``: at the last commit, the
    state's ``ElasticSampler``'s epoch, samples processed in it and the dataset's length
    (None: no sampler). ``launch`` and ``sequence`` as for notices; the MAC covers
    everything else.
    """

    MARKER = MESSAGE_MARKER
    MAX_BYTES = MAX_MESSAGE_BYTES
    TAG = ("progress",)

    launch: str
    sequence: int
    count: int
    age: float
    beat: float | None = None
    position: tuple[int, int, int] | None = None
    mac: str = ""

    def fields(self) -> dict[str, Any]:
        position = None if self.position is None else list(self.position)
        return {"count": self.count, "age": self.age, "beat": self.beat, "position": position}

    @property
    def epochs(self) -> float | None:
        """The job's progress in epochs at the last commit (None: no sampler)."""
        if self.position is None:
            return None
        epoch, samples, epoch_size = self.position
        return epoch + samples / epoch_size

    @property
    def samples(self) -> int | None:
        """The job's samples at the last commit: epochs x the dataset's length + those
        processed in this epoch (None: no sampler)."""
        if self.position is None:
            return None
        epoch, samples, epoch_size = self.position
        return epoch * epoch_size + samples

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> ProgressMessage:
        launch, sequence, count = body.get("launch"), body.get("seq"), body.get("count")
        age, beat, mac = body.get("age"), body.get("beat"), body.get("mac")
        if not (isinstance(launch, str) and isinstance(mac, str)):
            raise ValueError("missing launch or mac")
        for name, value in (("sequence", sequence), ("count", count)):
            if not is_int(value) or not 0 <= value < 2**63:
                raise ValueError(f"bad {name}")
        sequence, count = cast(int, sequence), cast(int, count)  # checked just above
        if sequence < 1:
            raise ValueError("bad sequence")
        if "beat" not in body:
            raise ValueError("missing beat")
        beat_s = None if beat is None else _seconds(beat, "beat")
        position = _position(body.get("position"))
        return cls(launch, sequence, count, _seconds(age, "age"), beat_s, position, mac)


def _position(value: Any) -> tuple[int, int, int] | None:
    """A sampler's position on a line: absent or null, or ``[epoch, samples, size]``,
    integers with ``0 <= samples <= size``, ``1 <= size``, all below 2**63."""
    if value is None:
        return None
    if not (isinstance(value, list) and len(value) == 3 and all(is_int(v) for v in value)):
        raise ValueError("bad position")
    epoch, samples, size = value
    if not (0 <= epoch < MAX_INT and 1 <= size < MAX_INT and 0 <= samples <= size):
        raise ValueError("bad position")
    return epoch, samples, size


def _seconds(value: Any, name: str) -> float:
    """An age on a line: a finite number of seconds in [0, MAX_AGE_SECONDS]."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ValueError(f"bad {name}")
    if not (math.isfinite(value) and 0 <= value <= MAX_AGE_SECONDS):
        raise ValueError(f"bad {name}")
    return float(value)


# ------------------------------------------------------------------ the page


class ProgressPage:
    """A worker's commit count, last commit time and last beat in shared memory."""

    def __init__(self, memory: mmap.mmap) -> None:
        self._memory = memory

    @classmethod
    def create(cls) -> tuple[ProgressPage, int]:
        """A new page (zero commits) and its descriptor, for the worker to inherit.
        The descriptor is not inheritable: pass it in ``pass_fds``, then close it."""
        fd = os.memfd_create("spotring-progress", os.MFD_CLOEXEC)
        try:
            os.ftruncate(fd, PAGE_BYTES)
            return cls(mmap.mmap(fd, PAGE_BYTES)), fd
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def attach(cls, fd: int) -> ProgressPage:
        """Map the page behind ``fd`` (closed here). Raises ``OSError`` or ``ValueError``
        for anything but a page of the right size."""
        try:
            if os.fstat(fd).st_size != PAGE_BYTES:
                raise ValueError("not a progress page")
            return cls(mmap.mmap(fd, PAGE_BYTES))
        finally:
            os.close(fd)

    def record(self, count: int, at: float, position: tuple[int, int, int] | None = None) -> None:
        """Store a commit: the sampler's position, then its time and count (a reader
        reads all twice)."""
        epoch, samples, size = position or (0, 0, 0)
        _POSITION.pack_into(self._memory, _COMMIT.size + _BEAT.size, epoch, samples, size)
        _COMMIT.pack_into(self._memory, 0, at, count)

    def beat(self, at: float) -> None:
        """Store a heartbeat's time (a field of its own: no writer waits for the other)."""
        _BEAT.pack_into(self._memory, _COMMIT.size, at)

    def read(self) -> tuple[int, float, float, tuple[int, int, int] | None]:
        """(count, time of the last commit, time of the last beat: 0 for none, the
        sampler's position at it: None for none); a torn read is read again."""
        for _ in range(100):
            record = _RECORD.unpack_from(self._memory, 0)
            again = _RECORD.unpack_from(self._memory, 0)
            if again == record:
                break
        at, count, beat, epoch, samples, size = again
        return count, at, beat, (epoch, samples, size) if size else None


# ------------------------------------------------------------------ in the worker


class CommitCounter:
    """Counts outermost ``commit`` calls into a :class:`ProgressPage`."""

    def __init__(self, page: ProgressPage, clock: Callable[[], float] = time.monotonic) -> None:
        self.page = page
        self.count = 0
        self._clock = clock
        self._depth = threading.local()

    def wrap(self, commit: Callable[..., Any]) -> Callable[..., Any]:
        """``commit`` counting each call that is not inside another counted one (an
        override calling ``super().commit()`` counts once), as it starts: the step
        before it is done. Not as it ends: a commit ends with a collective (Horovod's
        host check broadcasts), in which every member waits for a hung one, and which
        a reset ends with an error; counted at its end, the member that never got
        there would look no slower than the ones waiting for it."""
        if getattr(commit, "_spotring_counted", False):
            return commit
        counter = self

        def counted_commit(*args: Any, **kwargs: Any) -> Any:
            depth = getattr(counter._depth, "value", 0)
            if depth == 0:
                counter.count += 1
                position = sampler_position(args[0]) if args else None
                counter.page.record(counter.count, counter._clock(), position)
            counter._depth.value = depth + 1
            try:
                return commit(*args, **kwargs)
            finally:
                counter._depth.value = depth

        counted_commit._spotring_counted = True  # type: ignore[attr-defined]  # a marker on the wrapper
        counted_commit.__wrapped__ = commit  # type: ignore[attr-defined]  # as functools.wraps
        counted_commit.__doc__ = commit.__doc__
        return counted_commit

    def install(self, elastic: ModuleType) -> None:
        """Count ``elastic.State.commit`` and every subclass's own ``commit``."""
        wrap_in_state_classes(elastic, "commit", self.wrap)


def sampler_position(state: Any) -> tuple[int, int, int] | None:
    """The epoch, samples processed in it and dataset length of the first
    ``ElasticSampler`` a (Torch) state holds, or of the in-place ``TorchState``'s
    ``ElasticDistributedSampler``; None without one. Never imports torch: a script that
    made a sampler has imported its module already."""
    inplace = sys.modules.get("spotring.torch.sampler")
    if inplace is not None and isinstance(
        sampler := getattr(state, "sampler", None), inplace.ElasticDistributedSampler
    ):
        try:
            return _position([sampler.epoch, sampler.processed, len(sampler.dataset)])
        except (TypeError, ValueError):  # an odd dataset: no position, never a failed commit
            return None
    module = sys.modules.get("horovod.torch.elastic.sampler")
    if module is None:
        return None
    try:
        handlers = horovod_internals.state_handlers(state)
    except AttributeError:  # a state without handlers (an ObjectState)
        return None
    for handler in handlers.values():
        sampler = getattr(handler, "value", None)
        if isinstance(sampler, module.ElasticSampler):
            try:
                size = len(sampler.dataset)
                # A last batch padded to the ring's size counts past the dataset's end.
                return _position([sampler.epoch, min(sampler.processed_num, size), size])
            except (TypeError, ValueError):  # an odd sampler: no position, never a failed commit
                return None
    return None


def take_progress_page() -> ProgressPage | None:
    """The page named in :data:`PROGRESS_FD_ENV` (the descriptor then closed, so the
    script's children never inherit it); None without one."""
    fd_text = os.environ.pop(PROGRESS_FD_ENV, "")
    if not fd_text.isdigit():
        return None
    return ProgressPage.attach(int(fd_text))


def start_heartbeat(
    page: ProgressPage,
    every: float = BEAT_SECONDS,
    clock: Callable[[], float] = time.monotonic,
) -> threading.Thread:
    """Store the time in ``page`` every ``every`` seconds, on a daemon thread of this
    process, for as long as the process runs and the interpreter lets the thread run.
    It takes the interpreter's lock for a moment per beat: a process that holds it for
    good (a wedged extension call) stops beating, as a stopped one does."""

    def beat() -> None:
        try:
            while True:
                page.beat(clock())
                time.sleep(every)
        except Exception as error:  # the driver will take the silence for a hang: say why
            print(f"spotring: heartbeat stopped: {error!r}", file=sys.stderr)

    thread = threading.Thread(target=beat, name="spotring-heartbeat", daemon=True)
    thread.start()
    return thread


def install_when_imported() -> CommitCounter | None:
    """In a worker: beat into the supervisor's page from now on, and count commits
    into it once ``horovod.common.elastic`` (or the torch backend's
    ``spotring.torch.inplace``) is imported. None without a page."""
    from spotring.worker_image.after_import import call_after_import

    page = take_progress_page()
    if page is None:
        return None
    start_heartbeat(page)
    counter = CommitCounter(page)

    def install(module: ModuleType) -> None:
        try:
            counter.install(module)
        except Exception as error:  # never stop the user's script over this
            print(f"spotring: commits not counted: {error}", file=sys.stderr)

    def install_inplace(module: ModuleType) -> None:  # the torch backend's in-place state
        module.TorchState.commit = counter.wrap(module.TorchState.commit)

    call_after_import("horovod.common.elastic", install)
    call_after_import("spotring.torch.inplace", install_inplace)
    return counter


# ------------------------------------------------------------------ in the supervisor


class ProgressForwarder:
    """Reads a worker's page every :data:`INTERVAL_SECONDS`; writes a signed line
    when the count has changed, or :data:`KEEPALIVE_SECONDS` after its last line.

    :param write: writes one line to the driver (the supervisor's stdout).
    """

    def __init__(
        self,
        page: ProgressPage,
        key: bytes,
        launch: str,
        write: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._page = page
        self._key = key
        self._launch = launch
        self._write = write
        self._clock = clock
        self._sequence = 0
        self._sent = 0
        self._sent_at: float | None = None
        self._stop = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._run, name="spotring-progress", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def forward(self) -> bool:
        """One look at the page; whether a line was written."""
        count, at, beat_at, position = self._page.read()
        now = self._clock()
        quiet = self._sent_at is not None and now - self._sent_at < KEEPALIVE_SECONDS
        if count == self._sent and quiet:
            return False
        self._sent, self._sent_at = count, now
        self._sequence += 1
        beat = None if beat_at == 0 else _age(now, beat_at)
        age = _age(now, at)
        message = ProgressMessage(self._launch, self._sequence, count, age, beat, position)
        self._write(message.signed(self._key).line())
        return True

    def _run(self) -> None:
        failures = 0
        while not self._stop.wait(INTERVAL_SECONDS):
            try:
                self.forward()
            except Exception as error:  # never die silently; say so, and go on
                failures += 1
                if failures in (1, 10) or failures % 100 == 0:
                    with contextlib.suppress(OSError, ValueError):
                        print(f"spotring supervisor: progress: {error!r}", file=sys.stderr)


def _age(now: float, at: float) -> float:
    return round(min(MAX_AGE_SECONDS, max(0.0, now - at)), 3)
