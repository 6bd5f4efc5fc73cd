"""One thread that watches every worker process of a launcher: output, exits, stop events.

A launcher with a thread or two per worker (a blocking reader of its output, a loop
polling its exit) costs 1,024 workers 2,048 threads, tens of thousands of wake-ups a
second and as much driver CPU. The :class:`Pump` instead runs one thread around an
``epoll`` selector (:mod:`selectors`) holding every worker's output pipe (read without
blocking, cut into bounded lines) and a ``pidfd`` per process (readable when it exits:
no polling; where pidfds are missing, one tick polls those processes). The stop events
(Horovod's and the launcher's) are checked on the same tick, each event once however
many workers watch it. The thread ends when it has nothing left to watch and starts
again with the next process.

Each watched process has a :class:`Watch`: its ``wake`` event is set whenever there is
something for the thread that waits for that worker to look at (the process exited,
its output ended, one of its events was set, the pump failed), so that thread blocks
on one event without a timeout. Should the pump's thread fail, the failure is logged
and every watch is told (:attr:`Watch.error`): no worker is left waiting on a thread
that is gone. What it calls (the launcher's relay of lines, the listeners of notices
and progress) must be quick: it holds up every worker's output and exit meanwhile.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import locale
import logging
import os
import selectors
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from typing import Literal

log = logging.getLogger(__name__)

MAX_LINE_CHARS = 64 << 10
"""The longest line of a worker's output kept: the rest of a longer line is dropped (and
never held), so a worker printing without newlines cannot fill the driver's memory."""

READ_BYTES = 64 << 10
"""Read at most this much of one pipe at a time (the pipe's own buffer is 64 KiB)."""

TICK_SECONDS = 0.05
"""How often the events are checked (and, without pidfds, the processes polled)."""

GATHER_SECONDS = 0.01
"""After handling what was ready, wait this long before looking again, unless a read
found :data:`BUSY_BYTES` or more (a worker printing fast is read at once): 1,024
workers printing a line a second then cost about 2/3 of the CPU. An exit or an event
is seen that much later at most."""

BUSY_BYTES = 4096

_ENCODING = locale.getpreferredencoding(False)  # as ``Popen(text=True)`` decodes


class Watch:
    """What the pump knows of one process; made by :meth:`Pump.add`.

    :param process: the process (its ``stdout`` a binary pipe, or None).
    :param on_lines: told each batch of complete output lines, on the pump's thread.
    :param name: how the process is named in a log line (called when one is written).
    """

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        on_lines: Callable[[list[str]], None],
        name: Callable[[], str],
    ) -> None:
        self.process = process
        self.wake = threading.Event()
        """Set when there is something to look at: clear it, then look."""
        self.ended = threading.Event()
        """Set once the process has exited (``process.wait()`` then returns at once)."""
        self.drained = threading.Event()
        """Set once its output has reached its end (or cannot be read any more)."""
        self.error: str | None = None
        """Why the pump stopped watching it, when its thread failed."""
        self._on_lines = on_lines
        self._worker_name = name
        self._decoder = io.IncrementalNewlineDecoder(
            codecs.getincrementaldecoder(_ENCODING)(errors="replace"), translate=True
        )
        self._partial = ""
        self._dropping = False
        self._warned = False
        self._pidfd: int | None = None
        self._events: tuple[threading.Event, ...] = ()

    @property
    def done(self) -> bool:
        return self.ended.is_set() and self.drained.is_set()

    def _split(self, data: bytes, final: bool = False) -> list[str]:
        """The complete lines of what was read so far, each cut at
        :data:`MAX_LINE_CHARS` (the first cut logged once); at the end, the last
        unterminated line as it is."""
        text = self._partial + self._decoder.decode(data, final)
        lines: list[str] = []
        start = 0
        while (end := text.find("\n", start)) >= 0:
            if self._dropping:  # the rest of a line already cut
                self._dropping = False
            elif end - start >= MAX_LINE_CHARS:
                lines.append(self._cut(text[start : start + MAX_LINE_CHARS]))
            else:
                lines.append(text[start : end + 1])
            start = end + 1
        rest = "" if self._dropping else text[start:]
        if len(rest) >= MAX_LINE_CHARS:
            lines.append(self._cut(rest[:MAX_LINE_CHARS]))
            self._dropping, rest = True, ""
        if final and rest:
            lines.append(rest)
            rest = ""
        self._partial = rest
        return lines

    def _cut(self, head: str) -> str:
        if not self._warned:
            self._warned = True
            log.warning(
                "worker %s printed a line longer than %d characters; cut",
                self._worker_name(),
                MAX_LINE_CHARS,
            )
        return head + " [cut]\n"


_Kind = Literal["out", "exit", "wake"]


class Pump:
    """Watches processes on one thread (see the module's doc).

    :param thread_name: the name of its thread.
    """

    def __init__(self, thread_name: str = "spotring-output") -> None:
        self._thread_name = thread_name
        self._lock = threading.Lock()
        self._watches: set[Watch] = set()
        self._added: list[Watch] = []
        self._polled: set[Watch] = set()  # processes without a pidfd
        self._events: dict[int, tuple[threading.Event, set[Watch]]] = {}
        self._thread: threading.Thread | None = None
        self._selector: selectors.BaseSelector | None = None
        self._wake_read, self._wake_write = -1, -1

    @property
    def threads(self) -> int:
        """How many threads it runs now (0 or 1)."""
        with self._lock:
            return int(self._thread is not None)

    def add(
        self,
        process: subprocess.Popen[bytes],
        on_lines: Callable[[list[str]], None],
        name: Callable[[], str],
    ) -> Watch:
        """Watch ``process`` from now on until it has exited and its output ended."""
        watch = Watch(process, on_lines, name)
        if process.stdout is None:
            watch.drained.set()
        else:
            os.set_blocking(process.stdout.fileno(), False)
        try:
            watch._pidfd = os.pidfd_open(process.pid)
        except (AttributeError, OSError):  # not Linux >= 5.3: its exit is polled
            watch._pidfd = None
        with self._lock:
            self._watches.add(watch)
            self._added.append(watch)
            if watch._pidfd is None:
                self._polled.add(watch)
            self._start_or_wake()
        return watch

    def watch_events(self, watch: Watch, events: Sequence[threading.Event]) -> None:
        """Set ``watch.wake`` when any of ``events`` is set (checked every
        :data:`TICK_SECONDS`), until :meth:`unwatch_events`."""
        with self._lock:
            self._drop_events(watch)
            watch._events = tuple(events)
            for event in watch._events:
                self._events.setdefault(id(event), (event, set()))[1].add(watch)
            if watch in self._watches:
                self._start_or_wake()
        watch.wake.set()  # an event already set is seen at once

    def unwatch_events(self, watch: Watch) -> None:
        with self._lock:
            self._drop_events(watch)

    # ------------------------------------------------------------ the thread

    def _start_or_wake(self) -> None:
        """Under the lock: start the thread, or wake it to take the new work."""
        if self._thread is None:
            self._selector = selectors.DefaultSelector()
            self._wake_read, self._wake_write = os.pipe()
            os.set_blocking(self._wake_read, False)
            os.set_blocking(self._wake_write, False)
            self._selector.register(self._wake_read, selectors.EVENT_READ, ("wake", None))
            self._thread = threading.Thread(target=self._run, name=self._thread_name, daemon=True)
            self._thread.start()
        else:
            with contextlib.suppress(BlockingIOError):  # already woken
                os.write(self._wake_write, b"\0")

    def _drop_events(self, watch: Watch) -> None:
        for event in watch._events:
            entry = self._events.get(id(event))
            if entry is not None:
                entry[1].discard(watch)
                if not entry[1]:
                    del self._events[id(event)]
        watch._events = ()

    def _run(self) -> None:
        selector = self._selector
        assert selector is not None
        try:
            next_tick = time.monotonic() + TICK_SECONDS
            while True:
                with self._lock:
                    self._take_added(selector)
                    if not self._watches:
                        self._close_thread()
                        return
                    ticking = bool(self._events or self._polled)
                timeout = max(0.0, next_tick - time.monotonic()) if ticking else None
                ready = selector.select(timeout)
                flooded = False
                for key, _ in ready:
                    kind, watch = key.data
                    flooded |= self._ready(selector, kind, watch)
                if ready and not flooded:
                    # Let the next lines gather: many workers printing a line now and
                    # then cost one wake-up per batch instead of one per line.
                    time.sleep(GATHER_SECONDS)
                now = time.monotonic()
                if ticking and now >= next_tick:
                    next_tick = now + TICK_SECONDS
                    self._tick()
        except BaseException as error:  # never a silent death: every waiter is told
            log.critical(
                "the launcher's output and exit watcher failed (%s: %s); its workers are failed",
                type(error).__name__,
                error,
                exc_info=True,
            )
            with self._lock:
                reason = f"the launcher's watcher thread failed: {type(error).__name__}"
                for watch in self._watches:
                    watch.error = reason
                    watch.drained.set()
                    watch.wake.set()
                    if watch._pidfd is not None:
                        with contextlib.suppress(OSError):
                            os.close(watch._pidfd)
                self._watches.clear()
                self._added.clear()
                self._polled.clear()
                self._events.clear()
                self._close_thread()

    def _close_thread(self) -> None:
        """Under the lock: the thread is ending; the next :meth:`add` starts another."""
        if self._selector is not None:
            self._selector.close()
        for fd in (self._wake_read, self._wake_write):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._selector, self._thread = None, None

    def _take_added(self, selector: selectors.BaseSelector) -> None:
        for watch in self._added:
            stdout = watch.process.stdout
            if stdout is not None:
                selector.register(stdout, selectors.EVENT_READ, ("out", watch))
            if watch._pidfd is not None:
                selector.register(watch._pidfd, selectors.EVENT_READ, ("exit", watch))
        self._added.clear()

    def _ready(self, selector: selectors.BaseSelector, kind: _Kind, watch: Watch | None) -> bool:
        """Handle one ready file; whether it was a pipe with much in it (more is
        likely waiting: no pause)."""
        if kind == "wake":
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_read, 4096)
        elif kind == "exit":
            assert watch is not None and watch._pidfd is not None
            selector.unregister(watch._pidfd)
            os.close(watch._pidfd)
            watch._pidfd = None
            self._ended(watch)
        else:
            assert watch is not None
            return self._read(selector, watch)
        return False

    def _read(self, selector: selectors.BaseSelector, watch: Watch) -> bool:
        stdout = watch.process.stdout
        assert stdout is not None
        try:
            data = os.read(stdout.fileno(), READ_BYTES)
        except BlockingIOError:
            return False
        except OSError as error:  # the pipe is broken: its output is over
            log.warning("cannot read the output of %s: %s", watch._worker_name(), error)
            data = b""
        lines = watch._split(data, final=not data)
        if lines:
            try:
                watch._on_lines(lines)
            except Exception:  # the caller's bug: this worker's lines, not the thread
                log.exception("the output of %s could not be relayed", watch._worker_name())
        if not data:
            selector.unregister(stdout)
            stdout.close()
            watch.drained.set()
            watch.wake.set()
            self._forget_if_done(watch)
        return len(data) >= BUSY_BYTES

    def _ended(self, watch: Watch) -> None:
        watch.ended.set()
        watch.wake.set()
        self._forget_if_done(watch)

    def _forget_if_done(self, watch: Watch) -> None:
        if watch.done:
            with self._lock:
                self._watches.discard(watch)
                self._polled.discard(watch)
                self._drop_events(watch)

    def _tick(self) -> None:
        with self._lock:
            fired = [entry for entry in self._events.values() if entry[0].is_set()]
            for event, _ in fired:
                del self._events[id(event)]  # told once: the waiters stop their workers
            polled = list(self._polled)
        for _, watches in fired:
            for watch in watches:
                watch.wake.set()
        for watch in polled:
            if watch.process.poll() is not None:
                with self._lock:
                    self._polled.discard(watch)
                self._ended(watch)
