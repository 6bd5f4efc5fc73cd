"""Worker launchers: start one Horovod worker per slot, watch it, report its exit.

Horovod's elastic driver calls the launcher on a thread per slot; any of the events
set means "stop this worker". The launcher returns ``(exit_code, time)``.

Each worker runs under ``spotring.worker_image.supervisor``, started as a local process
or over ssh; the worker's command and environment go to it as one JSON line on its
stdin, so no environment value appears in any process's argv. Closing that stdin stops
the worker (on a remote host too, where a signal would only reach the ssh client).

spotring's launchers add what Horovod's own lack: they report every worker start and
exit to listeners the moment it happens, so a dead worker's host leaves discovery and
its peers are told at once instead of after Gloo's 30 s timeout; and any failure to
start or watch a worker becomes that worker's failed exit, never a silent hang.

A worker can also be started ahead of its join (:meth:`ProcessLauncher.prestart`): it
runs the script up to ``hvd.init`` and waits there until the launcher hands it its
slot's environment as a second stdin line (see ``spotring.worker_image.warm_start``).
Listeners hear ``worker_started`` only then; ``process_started`` and
``process_exited`` cover every process group the launcher runs on a host.

With a notice watcher in the spec, the supervisor also reports interruption notices
for its host as signed lines among the worker's output (see
``spotring.worker_image.notices``). The launcher takes those lines out of the output,
checks them against the job key and the launch they belong to, and tells listeners of
the good ones; a forged, replayed, oversized or malformed one is logged and dropped.
Progress lines (each worker's commit count, ``spotring.worker_image.progress``) are
checked the same way and told to listeners as ``worker_progress``.
:meth:`ProcessLauncher.fail_worker` stops one worker and reports its exit as a failure
(a hung worker: the failure path then runs as for one that died).

What the driver holds per worker stays small (:mod:`spotring.driver.output_pump`): one
thread reads every worker's output and sees every exit and stop event, so the thread
that waits for a worker (Horovod's, one per slot) blocks on one event, without waking
up until there is something to do. Over ssh, the workers of a host share one ssh
connection: a master per host (``ControlMaster``, its socket in the job's private
directory), opened before the host's first worker and closed by :meth:`close`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Literal

from spotring.core import is_valid_address
from spotring.driver.output_pump import MAX_LINE_CHARS as MAX_LINE_CHARS  # re-exported
from spotring.driver.output_pump import Pump, Watch
from spotring.driver.worker_events import WorkerEvents
from spotring.driver.worker_events import WorkerExit as WorkerExit  # re-exported: its old home
from spotring.worker_image.notices import NoticeMessage
from spotring.worker_image.progress import ProgressMessage
from spotring.worker_image.signed_lines import LineAcceptor, Rejected
from spotring.worker_image.wire import (
    JOB_KEY_ENV,
    NOTICE_MARKER,
    PROGRESS_MARKER,
    WARM_READY_MARKER,
)

log = logging.getLogger(__name__)

STOP_GRACE_SECONDS = 5.0
"""How long a stopped worker gets between SIGTERM and SIGKILL."""

LAUNCH_FAILED_EXIT = 255
"""The exit code reported for a worker that could not be started or watched."""

CONTROL_PERSIST_SECONDS = 60
"""How long a host's ssh master connection outlives its last worker: a reset restarts
the workers within seconds; a host left for good lets its connection go."""

MASTER_START_SECONDS = 30.0
"""The longest wait for a host's ssh master connection to open."""

STOPPED_EXIT = 128 + signal.SIGTERM
"""Reported for a stopped worker that exited 0 anyway (over ssh, a remote worker killed
by a signal can look like that): Horovod takes any 0 as success and ends the job."""

HostKeyChecking = Literal["accept-new", "yes", "no"]

WorkerListener = WorkerEvents
"""The old name of :class:`WorkerEvents`."""

Tell = Callable[[Callable[[WorkerEvents], None]], None]
"""Calls one event on every listener."""


@dataclass(frozen=True)
class WorkerSpec:
    """What to run for one slot: Horovod's slot, the command, its environment."""

    host: str
    local_rank: int
    rank: int
    """-1 where ranks change with each group (the torch backend's in-place mode)."""
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str = ""
    notices: Mapping[str, Any] | None = None
    """The notice watcher the host's supervisor runs (``Provider.notice_watcher``)."""
    stop_grace: float = STOP_GRACE_SECONDS
    """Seconds a stop gives the worker between SIGTERM and SIGKILL."""


@dataclass(frozen=True)
class SshOptions:
    """How the ssh launcher reaches worker hosts.

    ``host_key_checking``: ``accept-new`` (default) trusts a host's key the first time
    and refuses a changed one, in a known_hosts file of the job's own (or
    ``known_hosts``); ``yes`` accepts only keys already in ``known_hosts`` (default:
    ssh's own files); ``no`` checks nothing. Keys are pinned under the instance id when
    one is known, so a new instance that reuses a private IP is not mistaken for an
    attacker.
    """

    port: int | None = None
    identity_file: str | None = None
    host_key_checking: HostKeyChecking = "accept-new"
    known_hosts: str | None = None
    multiplex: bool = True
    """One ssh connection per host for all its workers (``ControlMaster``)."""


class ProcessLauncher:
    """Runs each worker under the supervisor, as a local process or over ssh.

    :param remote: run workers over ssh on their host (False: as local processes, for
        the ``local`` provider and for tests that map cloud instances to this machine).
    :param listeners: told of every start and exit, on the worker's thread.
    :param ssh: ssh settings for remote workers.
    :param python: the interpreter that runs the supervisor on the hosts.
    :param host_alias: the instance id of an address, to pin its ssh host key under.
    """

    def __init__(
        self,
        *,
        remote: bool,
        listeners: Sequence[WorkerEvents] = (),
        ssh: SshOptions = SshOptions(),
        python: str = sys.executable,
        host_alias: Callable[[str], str | None] = lambda address: None,
        output: IO[str] | None = None,
    ) -> None:
        self._remote = remote
        self._listeners = list(listeners)
        self._ssh = ssh
        self._python = python
        self._host_alias = host_alias
        self._output = output or sys.stdout
        self._output_lock = threading.Lock()
        self._job_dir: str | None = None
        self._job_dir_lock = threading.Lock()
        self._host_stops: dict[str, threading.Event] = {}
        self._host_stops_lock = threading.Lock()
        self._running: dict[tuple[str, int], _Launch] = {}  # (host, local_rank) -> launch
        self._pump = Pump("spotring-output")  # the thread hookspecs names
        self._multiplex = ssh.multiplex
        self._output_failed = False
        # (host, host key alias) -> its ssh master's control socket
        self._masters: dict[tuple[str, str | None], _Master] = {}

    def add_listener(self, listener: WorkerEvents) -> None:
        self._listeners.append(listener)

    def stop_workers_on(self, host: str) -> None:
        """Stop every worker running on ``host`` (it has left the ring); their exits
        are reported as stopped, not failed."""
        with self._host_stops_lock:
            self._host_stops.setdefault(host, threading.Event()).set()
            launches = [launch for (h, _), launch in self._running.items() if h == host]
        for launch in launches:  # at once, not at the pump's next look at the events
            launch.watch.wake.set()

    def fail_worker(self, host: str, local_rank: int, reason: str) -> bool:
        """Stop the worker of slot ``host[local_rank]`` and report its exit as a
        failure, with ``reason`` (a hung worker: Horovod, the peers and the controller
        then take it as they take a worker that died). Whether one was running."""
        with self._host_stops_lock:
            launch = self._running.get((host, local_rank))
        if launch is None:
            return False
        launch.failure = reason
        launch.fail.set()
        launch.watch.wake.set()
        return True

    def _stop_event(self, host: str) -> threading.Event:
        """The event that stops workers on ``host``; a fresh one if an earlier stop
        (of an instance that had this address before) is still set."""
        with self._host_stops_lock:
            event = self._host_stops.get(host)
            if event is None or event.is_set():
                event = self._host_stops[host] = threading.Event()
            return event

    @property
    def threads(self) -> int:
        """The threads the launcher runs itself (not those that wait in :meth:`__call__`)."""
        return self._pump.threads

    def close(self) -> None:
        """Close the hosts' ssh master connections; remove the job's own directory
        (known_hosts, control sockets), if one was made."""
        with self._job_dir_lock:
            masters, self._masters = list(self._masters.items()), {}
        for (host, _), master in masters:
            master.close(host)
        with self._job_dir_lock:
            if self._job_dir is not None:
                shutil.rmtree(self._job_dir, ignore_errors=True)
                self._job_dir = None

    def prestart(self, spec: WorkerSpec) -> WarmWorker:
        """Start ``spec``'s worker ahead of its join: it runs the script up to
        ``hvd.init`` and waits there (:mod:`spotring.worker_image.warm_start`) until
        :meth:`__call__` hands it a slot. ``spec.env`` lacks the slot's variables.
        Raises ``OSError`` or ``ValueError`` when it cannot be started."""
        return WarmWorker(self._start(spec, warm=True))

    def __call__(
        self,
        spec: WorkerSpec,
        events: Sequence[threading.Event],
        warm: WarmWorker | None = None,
    ) -> tuple[int, float]:
        """Run ``spec`` until it ends or an event is set; never raises.

        With ``warm`` (a worker :meth:`prestart`-ed for this slot), that process gets
        the slot's environment and goes on; one that has exited or been stopped is
        replaced by a fresh start. A worker that cannot be started or watched (a bad
        address, no ssh binary, a listener raising) is reported as failed with
        :data:`LAUNCH_FAILED_EXIT`, so Horovod records its exit instead of waiting
        for it forever.
        """
        launch: _Launch | None = None
        host_stop = self._stop_event(spec.host)
        try:
            launch = warm.hand_over(spec) if warm is not None else None
            if launch is None:
                launch = self._start(spec, warm=False)
            with self._host_stops_lock:
                self._running[(spec.host, spec.local_rank)] = launch
            pid = launch.process.pid
            self._tell(lambda listener: listener.worker_started(spec.host, pid))
            self._tell(lambda listener: listener.slot_started(spec.host, spec.local_rank))
            exit_code, stopped = self._watch(launch, events, host_stop)
        except Exception as error:
            log.error(
                "could not run worker rank %d on %s: %s: %s",
                spec.rank,
                spec.host,
                type(error).__name__,
                error,
            )
            if launch is not None and launch.process.poll() is None:
                _kill_group(launch.process)
            exit_code, stopped = LAUNCH_FAILED_EXIT, False
        reason = ""
        if launch is not None:
            with self._host_stops_lock:
                if self._running.get((spec.host, spec.local_rank)) is launch:
                    del self._running[(spec.host, spec.local_rank)]
            if launch.failure is not None and not stopped:
                reason = launch.failure
        result = WorkerExit(spec.host, spec.local_rank, spec.rank, exit_code, stopped, reason)
        pid = launch.process.pid if launch is not None else -1
        self._tell(lambda listener: listener.worker_exited(result, pid))
        if launch is not None:
            launch.exited()
        return exit_code, time.time()

    # ---------------------------------------------------------------- starting

    def _start(self, spec: WorkerSpec, warm: bool) -> _Launch:
        if not is_valid_address(spec.host):
            raise ValueError(f"{spec.host!r} is not a host name or IP address")
        if self._remote:
            self._open_master(spec.host)
        process = subprocess.Popen(
            self.argv(spec.host),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so kills reach its children
            # The job key goes on stdin only, never into an environment block.
            env=_without_key(spec.env) if not self._remote else None,
        )
        launch = _Launch(spec, process, secrets.token_hex(8), self._tell)
        launch.prefix = f"[warm]<{spec.host}:{spec.local_rank}>" if warm else _prefix(spec)
        self._tell(lambda listener: listener.process_started(spec.host, process.pid))
        assert process.stdin is not None
        line: dict[str, Any] = {"argv": list(spec.argv), "env": dict(spec.env), "cwd": spec.cwd}
        line["grace"] = spec.stop_grace
        if spec.notices is not None:
            line.update(launch=launch.id, notices=dict(spec.notices))
        if warm:
            line.update(launch=launch.id, warm=True)
        progress = None
        if spec.env.get(JOB_KEY_ENV):  # signed like notices: without a key, no progress
            line.update(launch=launch.id, progress=True)
            progress = _ProgressReader(launch, self._tell)
        notices = _NoticeReader(spec, launch.id, self._tell) if spec.notices is not None else None
        try:
            launch.watch = self._pump.add(
                process,
                functools.partial(self._relay, launch, notices, progress),
                lambda: launch.prefix,
            )
            process.stdin.write((json.dumps(line) + "\n").encode())
            process.stdin.flush()  # stays open: closing it stops the worker
        except OSError:  # it died at once (ssh could not connect): the caller reports it
            _kill_group(process)
            launch.exited()
            raise
        return launch

    def argv(self, host: str) -> list[str]:
        """The command line that starts the supervisor for ``host``: no secrets in it."""
        supervisor = [self._python, "-m", "spotring.worker_image.supervisor"]
        if not self._remote:
            return supervisor
        options = self._ssh_options(host)
        master = self._master(host)
        if master is not None:
            # The host's master connection (_open_master) carries this session; should
            # it be gone, this client opens one itself and keeps it in the background.
            options += ["-o", "ControlMaster=auto", *master.options()]
        remote = "exec " + shlex.join(supervisor)
        # "--" ends ssh's options: nothing from a provider is ever read as one.
        return ["ssh", *options, "--", host, remote]

    def _ssh_options(self, host: str) -> list[str]:
        options = [
            "-o",
            "BatchMode=yes",  # never prompt for a password or passphrase
            # A host that vanishes (spot reclaim) drops ssh within ~10 s, not at TCP timeout.
            "-o",
            "ServerAliveInterval=5",
            "-o",
            "ServerAliveCountMax=2",
            *self._host_key_options(host),
        ]
        if self._ssh.port is not None:
            options += ["-p", str(self._ssh.port)]
        if self._ssh.identity_file is not None:
            options += ["-i", self._ssh.identity_file]
        return options

    def _master(self, host: str) -> _Master | None:
        """The control socket of ``host``'s ssh master connection (None: every worker
        connects on its own). One per host and host key alias: a new instance that
        reuses an address never shares the old one's connection."""
        if not self._multiplex:
            return None
        key = (host, self._host_alias(host))
        directory = self._job_directory()
        with self._job_dir_lock:
            master = self._masters.get(key)
            if master is None:
                path = os.path.join(directory, f"c{len(self._masters)}")
                if len(path.encode()) > _MAX_CONTROL_PATH:
                    log.warning(
                        "the job's directory %s is too deep for ssh's control sockets; "
                        "each worker gets an ssh connection of its own",
                        directory,
                    )
                    self._multiplex = False
                    return None
                master = self._masters[key] = _Master(path)
            return master

    def _open_master(self, host: str) -> None:
        """Open ``host``'s ssh master connection unless it is open: once per host, even
        when its workers start together (each of them would otherwise race to be the
        master, and the losers connect on their own). A failure is logged and left to
        the workers' own ssh, which reports it in their output."""
        master = self._master(host)
        if master is None:
            return
        with master.lock:
            if os.path.exists(master.path):
                return
            command = [
                "ssh",
                *self._ssh_options(host),
                *["-o", "ControlMaster=yes", *master.options(), "-o", "ConnectTimeout=10"],
                # -f: in the background once connected; -N: no command of its own
                *["-f", "-N", "--", host],
            ]
            with tempfile.TemporaryFile() as errors:
                try:
                    result = subprocess.run(
                        command,
                        stdin=subprocess.DEVNULL,
                        stdout=subprocess.DEVNULL,
                        stderr=errors,
                        timeout=MASTER_START_SECONDS,
                        start_new_session=True,  # no worker's stop may reach it
                        check=False,
                    )
                except (OSError, subprocess.TimeoutExpired) as error:
                    log.warning("could not open an ssh connection to %s: %s", host, error)
                    return
                if result.returncode != 0:
                    errors.seek(0)
                    said = errors.read(2000).decode(errors="replace").strip()
                    log.warning(
                        "could not open an ssh connection to %s (exit %d): %s",
                        host,
                        result.returncode,
                        " ".join(said.split()) or "no message",
                    )

    def _host_key_options(self, host: str) -> list[str]:
        mode = self._ssh.host_key_checking
        if mode == "no":
            return ["-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null"]
        options = ["-o", f"StrictHostKeyChecking={mode}"]
        known_hosts = self._ssh.known_hosts
        if known_hosts is None and mode == "accept-new":
            known_hosts = os.path.join(self._job_directory(), "known_hosts")
        if known_hosts is not None:
            options += ["-o", f"UserKnownHostsFile={known_hosts}"]
        alias = self._host_alias(host)
        if alias and is_valid_address(alias):
            options += ["-o", f"HostKeyAlias={alias}"]
        return options

    def _job_directory(self) -> str:
        with self._job_dir_lock:
            if self._job_dir is None:
                self._job_dir = tempfile.mkdtemp(prefix="spotring-ssh-")
            return self._job_dir

    # ---------------------------------------------------------------- watching

    def _watch(
        self, launch: _Launch, events: Sequence[threading.Event], host_stop: threading.Event
    ) -> tuple[int, bool]:
        """Wait for the worker; stop it if any event is set (Horovod's, or
        :meth:`stop_workers_on` for its host). Returns (code, stopped).

        Blocks on the launch's one wake-up event: the pump sets it when the process
        exits or one of the events is set, :meth:`fail_worker` when it fails it."""
        process, watch = launch.process, launch.watch
        watched = (*events, host_stop)
        self._pump.watch_events(watch, watched)
        stopped = False
        try:
            while not watch.ended.is_set():
                if watch.error is not None:
                    launch.failure = watch.error
                    raise RuntimeError(watch.error)
                if launch.fail.is_set():  # spotring's own verdict: a failure, not a stop
                    _stop(launch)
                    break
                if any(event.is_set() for event in watched):
                    _stop(launch)
                    stopped = True
                    break
                watch.wake.wait()
                watch.wake.clear()  # then look again: nothing set after it is missed
        finally:
            self._pump.unwatch_events(watch)
        if watch.ended.is_set():
            process.wait()  # it has exited: at once
        watch.drained.wait(2.0)  # the rest of its output, before its exit is told
        # Its host had left the ring and it exited just before the stop reached it:
        # still a stop, not a failure.
        stopped = stopped or (host_stop.is_set() and not launch.fail.is_set())
        code = process.poll()
        if code is None:  # not even SIGKILL ended it: never a hang for Horovod
            return LAUNCH_FAILED_EXIT, stopped
        if code == 0 and (stopped or launch.fail.is_set()):
            return STOPPED_EXIT, stopped  # never a 0: Horovod would end the job
        return code, stopped

    def _relay(
        self,
        launch: _Launch,
        notices: _NoticeReader | None,
        progress: _ProgressReader | None,
        lines: list[str],
    ) -> None:
        """Pass on a batch of ``launch``'s output lines (on the pump's thread): signed
        lines to their readers, the ready line to the launch, the rest to the output."""
        relayed = []
        for line in lines:
            reader = (
                notices if notices is not None and line.startswith(NOTICE_MARKER)
                else progress if progress is not None and line.startswith(PROGRESS_MARKER)
                else None
            )  # fmt: skip
            if reader is not None:
                try:
                    reader.read(line)
                except Exception as error:  # a reader's bug must not stop the output
                    launch.unreadable += 1
                    if launch.unreadable == 1:
                        log.warning(
                            "dropped a line from %s that could not be read (%s: %s); "
                            "further ones are dropped without a word",
                            launch.spec.host, type(error).__name__, str(error)[:200],
                        )  # fmt: skip
                continue
            if line.startswith(WARM_READY_MARKER):
                if line[len(WARM_READY_MARKER) :].strip() == launch.id:
                    launch.held.set()
                else:
                    log.warning("dropped a forged ready line from %s", launch.spec.host)
                continue
            relayed.append(f"{launch.prefix}: {line}")
        if not relayed:
            return
        with self._output_lock:
            try:
                self._output.write("".join(relayed))
                self._output.flush()
            except (OSError, ValueError) as error:  # closed or broken: the workers go on
                if not self._output_failed:
                    self._output_failed = True
                    log.error("workers' output is lost: %s: %s", type(error).__name__, error)

    def _tell(self, event: Callable[[WorkerEvents], None]) -> None:
        """Tell every listener ``event``; one that raises is logged and does not stop
        the others."""
        for listener in self._listeners:
            try:
                event(listener)
            except Exception:
                log.exception("worker listener %r failed", listener)


class _Launch:
    """One supervisor the launcher started, and how its output is relayed."""

    watch: Watch
    """How the pump watches it (set once it is started)."""

    def __init__(
        self,
        spec: WorkerSpec,
        process: subprocess.Popen[bytes],
        launch_id: str,
        tell: Tell,
    ) -> None:
        self.spec = spec
        self.process = process
        self.id = launch_id
        self.prefix = ""
        """Put before each line of its output: the worker's rank, host and slot."""
        self.held = threading.Event()
        """Set when a warm worker reports that it holds in ``hvd.init``."""
        self.fail = threading.Event()
        """Set to stop the worker as failed (:meth:`ProcessLauncher.fail_worker`)."""
        self.failure: str | None = None
        self.unreadable = 0
        """Signed lines from it that a reader failed on (only the pump's thread counts)."""
        self._tell = tell
        self._exit_told = threading.Event()

    def exited(self) -> None:
        """Tell listeners that the process group is gone (once; it has ended)."""
        if not self._exit_told.is_set():
            self._exit_told.set()
            self._tell(lambda listener: listener.process_exited(self.spec.host, self.process.pid))


class WarmWorker:
    """A worker started ahead of its join (:meth:`ProcessLauncher.prestart`), held in
    ``hvd.init`` until the launcher hands it a slot or it is stopped."""

    def __init__(self, launch: _Launch) -> None:
        self._launch = launch
        self._lock = threading.Lock()
        self._state: Literal["warm", "joined", "stopped"] = "warm"

    @property
    def held(self) -> bool:
        """Whether it has reached ``hvd.init`` and waits there for its slot."""
        return self._launch.held.is_set()

    def wait_held(self, timeout: float) -> bool:
        """Wait up to ``timeout`` s for :attr:`held`; whether it is."""
        return self._launch.held.wait(timeout)

    @property
    def exited(self) -> bool:
        """Whether the process has ended (it never will by itself while held)."""
        return self._launch.process.poll() is not None

    def hand_over(self, spec: WorkerSpec) -> _Launch | None:
        """Send ``spec``'s slot environment to the waiting process. The launch to
        watch from now on, or None when this worker cannot take the slot: it ended,
        was stopped, or runs another command (it is stopped; start the slot cold)."""
        with self._lock:
            if self._state != "warm":
                return None
            self._state = "joined"
        launch = self._launch
        slot_env = {k: v for k, v in spec.env.items() if launch.spec.env.get(k) != v}
        same_command = (spec.argv, spec.cwd, spec.host) == (
            launch.spec.argv,
            launch.spec.cwd,
            launch.spec.host,
        )
        try:
            if not same_command or launch.process.poll() is not None:
                raise OSError("the warm worker cannot take this slot")
            assert launch.process.stdin is not None
            launch.process.stdin.write((json.dumps(slot_env) + "\n").encode())
            launch.process.stdin.flush()
        except OSError:
            self._end()
            return None
        launch.spec, launch.prefix = spec, _prefix(spec)
        log.info(
            "the worker started ahead on %s[%d] joins as rank %d%s",
            spec.host,
            spec.local_rank,
            spec.rank,
            "" if launch.held.is_set() else " (before it reached hvd.init)",
        )
        return launch

    def stop(self) -> None:
        """Stop it unless it was handed a slot; in the background, never blocking."""
        with self._lock:
            if self._state != "warm":
                return
            self._state = "stopped"
        threading.Thread(target=self._end, name="spotring-warm-stop", daemon=True).start()

    def _end(self) -> None:
        _stop(self._launch)
        self._launch.watch.drained.wait(2.0)
        self._launch.exited()


def _without_key(env: Mapping[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if name != JOB_KEY_ENV}


def _prefix(spec: WorkerSpec) -> str:
    """``[rank]<host:slot>``; ``<host:slot>`` for a worker whose rank changes with each
    group (the torch backend's in-place mode: rank -1)."""
    rank = f"[{spec.rank}]" if spec.rank >= 0 else ""
    return f"{rank}<{spec.host}:{spec.local_rank}>"


class _NoticeReader:
    """Checks the notice lines of one worker launch and passes on the good ones."""

    def __init__(self, spec: WorkerSpec, launch: str, tell: Tell) -> None:
        self._host = spec.host
        key = bytes.fromhex(spec.env.get(JOB_KEY_ENV, ""))
        self._lines = LineAcceptor(NoticeMessage, key, launch)
        self._tell = tell

    def read(self, line: str) -> None:
        try:
            message = self._lines.accept(line)
        except Rejected as error:
            if error.malformed:
                log.warning("rejected a notice line from %s: %s", self._host, error)
            else:
                log.warning("rejected a notice from %s: %s", self._host, error)
            return
        notice = message.notice
        self._tell(lambda listener: listener.worker_noticed(self._host, notice))


class _ProgressReader:
    """Checks the progress lines of one worker launch and passes on the good ones.

    The training script shares the output: a line it prints fails the MAC. Rejections
    are logged once per launch and then every 1,000th, so a script printing them cannot
    flood the driver's log."""

    def __init__(self, launch: _Launch, tell: Tell) -> None:
        self._launch = launch
        key = bytes.fromhex(launch.spec.env.get(JOB_KEY_ENV, ""))
        self._lines = LineAcceptor(ProgressMessage, key, launch.id)
        self._tell = tell

    @property
    def rejected(self) -> int:
        return self._lines.rejected

    def read(self, line: str) -> None:
        try:
            message = self._lines.accept(line)
        except Rejected as error:
            if self.rejected % 1000 == 1:
                log.warning(
                    "rejected a progress line from %s (%d so far): %s",
                    self._launch.spec.host,
                    self.rejected,
                    error,
                )
            return
        spec = self._launch.spec  # a warm worker's slot once it joined
        self._tell(
            lambda listener: listener.worker_progress(
                spec.host,
                spec.local_rank,
                message.count,
                message.age,
                message.beat,
                message.epochs,
                message.samples,
            )
        )


def _stop(launch: _Launch) -> None:
    """Close the supervisor's stdin (it stops the worker); kill what is left after that."""
    process = launch.process
    with contextlib.suppress(OSError):
        assert process.stdin is not None
        process.stdin.close()
    if launch.watch.ended.wait(launch.spec.stop_grace + 2.0):
        process.wait()  # it has exited: at once
    else:
        _kill_group(process)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5.0)


_MAX_CONTROL_PATH = 80
"""The longest control socket path given to ssh: a Unix socket's path holds about 104
bytes, and ssh binds a temporary name (the path and 17 more characters) first."""


class _Master:
    """The control socket of one host's ssh master connection."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.lock = threading.Lock()
        """Held while the master is opened, so the host's workers wait for it."""

    def options(self) -> list[str]:
        persist = ["-o", f"ControlPersist={CONTROL_PERSIST_SECONDS}"]
        # ssh expands %-tokens in ControlPath: a literal % is written %%.
        return ["-o", "ControlPath=" + self.path.replace("%", "%%"), *persist]

    def close(self, host: str) -> None:
        """Ask the master to exit (it ends its connection); never raises."""
        if not os.path.exists(self.path):
            return
        command = ["ssh", "-o", "BatchMode=yes", *self.options()[:2], "-O", "exit", "--", host]
        try:
            subprocess.run(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=10.0,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            log.warning("could not close the ssh connection to %s: %s", host, error)
