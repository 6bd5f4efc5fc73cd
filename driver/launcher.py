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

With a notice watcher in the spec, the supervisor also reports interruption notices
for its host as signed lines among the worker's output (see
``spotring.worker_image.notices``). The launcher takes those lines out of the output,
checks them against the job key and the launch they belong to, and tells listeners of
the good ones; a forged, replayed, oversized or malformed one is logged and dropped.
"""

from __future__ import annotations

import contextlib
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
from typing import IO, Any, Literal, Protocol

from spotring.providers.base import is_valid_address
from spotring.worker_image.notices import MESSAGE_MARKER, Notice, NoticeMessage
from spotring.worker_image.peer_abort import JOB_KEY_ENV

log = logging.getLogger(__name__)

STOP_GRACE_SECONDS = 5.0
"""How long a stopped worker gets between SIGTERM and SIGKILL."""

LAUNCH_FAILED_EXIT = 255
"""The exit code reported for a worker that could not be started or watched."""

STOPPED_EXIT = 128 + signal.SIGTERM
"""Reported for a stopped worker that exited 0 anyway (over ssh, a remote worker killed
by a signal can look like that): Horovod takes any 0 as success and ends the job."""

HostKeyChecking = Literal["accept-new", "yes", "no"]


@dataclass(frozen=True)
class WorkerSpec:
    """What to run for one slot: Horovod's slot, the command, its environment."""

    host: str
    local_rank: int
    rank: int
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str = ""
    notices: Mapping[str, Any] | None = None
    """The notice watcher the host's supervisor runs (``Provider.notice_watcher``)."""


@dataclass(frozen=True)
class WorkerExit:
    """How a worker process ended."""

    host: str
    local_rank: int
    rank: int
    exit_code: int
    stopped: bool
    """True when spotring/Horovod stopped the worker (host removed, job over)."""

    @property
    def failed(self) -> bool:
        """A failure is an error exit that nobody asked for."""
        return self.exit_code != 0 and not self.stopped


class WorkerListener(Protocol):
    """Told of workers' starts and exits; optionally of notices (``worker_noticed``)."""

    def worker_started(self, host: str, process_group: int) -> None: ...

    def worker_exited(self, exit: WorkerExit, process_group: int) -> None: ...


class NoticeListener(Protocol):
    def worker_noticed(self, host: str, notice: Notice) -> None: ...


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
        listeners: Sequence[WorkerListener] = (),
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

    def add_listener(self, listener: WorkerListener) -> None:
        self._listeners.append(listener)

    def stop_workers_on(self, host: str) -> None:
        """Stop every worker running on ``host`` (it has left the ring); their exits
        are reported as stopped, not failed."""
        with self._host_stops_lock:
            self._host_stops.setdefault(host, threading.Event()).set()

    def _stop_event(self, host: str) -> threading.Event:
        """The event that stops workers on ``host``; a fresh one if an earlier stop
        (of an instance that had this address before) is still set."""
        with self._host_stops_lock:
            event = self._host_stops.get(host)
            if event is None or event.is_set():
                event = self._host_stops[host] = threading.Event()
            return event

    def close(self) -> None:
        """Remove the job's own known_hosts file, if one was made."""
        with self._job_dir_lock:
            if self._job_dir is not None:
                shutil.rmtree(self._job_dir, ignore_errors=True)
                self._job_dir = None

    def __call__(self, spec: WorkerSpec, events: Sequence[threading.Event]) -> tuple[int, float]:
        """Run ``spec`` until it ends or an event is set; never raises.

        A worker that cannot be started or watched (a bad address, no ssh binary, a
        listener raising) is reported as failed with :data:`LAUNCH_FAILED_EXIT`, so
        Horovod records its exit instead of waiting for it forever.
        """
        process: subprocess.Popen[str] | None = None
        launch = secrets.token_hex(8)
        host_stop = self._stop_event(spec.host)
        try:
            process = self._start(spec, launch)
            self._tell("worker_started", spec.host, process.pid)
            exit_code, stopped = self._watch(process, spec, launch, events, host_stop)
        except Exception as error:
            log.error(
                "could not run worker rank %d on %s: %s: %s",
                spec.rank,
                spec.host,
                type(error).__name__,
                error,
            )
            if process is not None and process.poll() is None:
                _kill_group(process)
            exit_code, stopped = LAUNCH_FAILED_EXIT, False
        result = WorkerExit(spec.host, spec.local_rank, spec.rank, exit_code, stopped)
        self._tell("worker_exited", result, process.pid if process is not None else -1)
        return exit_code, time.time()

    # ---------------------------------------------------------------- starting

    def _start(self, spec: WorkerSpec, launch: str) -> subprocess.Popen[str]:
        if not is_valid_address(spec.host):
            raise ValueError(f"{spec.host!r} is not a host name or IP address")
        process = subprocess.Popen(
            self.argv(spec.host),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so kills reach its children
            env=dict(spec.env) if not self._remote else None,
            text=True,
            errors="replace",
        )
        assert process.stdin is not None
        line: dict[str, Any] = {"argv": list(spec.argv), "env": dict(spec.env), "cwd": spec.cwd}
        line["grace"] = STOP_GRACE_SECONDS
        if spec.notices is not None:
            line.update(launch=launch, notices=dict(spec.notices))
        process.stdin.write(json.dumps(line) + "\n")
        process.stdin.flush()  # stays open: closing it stops the worker
        return process

    def argv(self, host: str) -> list[str]:
        """The command line that starts the supervisor for ``host``: no secrets in it."""
        supervisor = [self._python, "-m", "spotring.worker_image.supervisor"]
        if not self._remote:
            return supervisor
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
        remote = "exec " + shlex.join(supervisor)
        # "--" ends ssh's options: nothing from a provider is ever read as one.
        return ["ssh", *options, "--", host, remote]

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
        self,
        process: subprocess.Popen[str],
        spec: WorkerSpec,
        launch: str,
        events: Sequence[threading.Event],
        host_stop: threading.Event,
    ) -> tuple[int, bool]:
        """Wait for the worker; stop it if any event is set (Horovod's, or
        :meth:`stop_workers_on` for its host). Returns (code, stopped)."""
        events = [*events, host_stop]
        notices = _NoticeReader(spec, launch, self._tell) if spec.notices is not None else None
        pump = threading.Thread(
            target=self._pump, args=(process.stdout, spec, notices), daemon=True
        )
        pump.start()
        stopped = False
        while process.poll() is None:
            if any(event.is_set() for event in events):
                _stop(process)
                stopped = True
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=0.05)
        pump.join(timeout=2.0)
        # Its host had left the ring and it exited just before the stop reached it:
        # still a stop, not a failure.
        stopped = stopped or host_stop.is_set()
        if stopped and process.returncode == 0:
            return STOPPED_EXIT, True
        return process.returncode, stopped

    def _pump(
        self, stream: IO[str] | None, spec: WorkerSpec, notices: _NoticeReader | None
    ) -> None:
        if stream is None:
            return
        prefix = f"[{spec.rank}]<{spec.host}:{spec.local_rank}>"
        for line in stream:
            if notices is not None and line.startswith(MESSAGE_MARKER):
                notices.read(line)
                continue
            with self._output_lock:
                self._output.write(f"{prefix}: {line}")
                self._output.flush()

    def _tell(self, method: str, *args: Any) -> None:
        """Call every listener that has ``method``; one that raises is logged and does
        not stop the others."""
        for listener in self._listeners:
            call = getattr(listener, method, None)
            if call is None:
                continue
            try:
                call(*args)
            except Exception:
                log.exception("worker listener %r failed in %s", listener, method)


class _NoticeReader:
    """Checks the notice lines of one worker launch and passes on the good ones."""

    def __init__(self, spec: WorkerSpec, launch: str, tell: Callable[..., None]) -> None:
        self._host = spec.host
        self._launch = launch
        self._key = bytes.fromhex(spec.env.get(JOB_KEY_ENV, ""))
        self._tell = tell
        self._last_sequence = 0

    def read(self, line: str) -> None:
        try:
            message = NoticeMessage.parse(line.rstrip("\n"))
        except ValueError as error:
            log.warning("rejected a notice line from %s: %s", self._host, error)
            return
        if not self._key or not message.verify(self._key):
            log.warning("rejected a notice from %s: bad signature", self._host)
        elif message.launch != self._launch:
            log.warning("rejected a notice from %s: it belongs to another launch", self._host)
        elif message.sequence <= self._last_sequence:
            log.warning("rejected a notice from %s: replayed", self._host)
        else:
            self._last_sequence = message.sequence
            self._tell("worker_noticed", self._host, message.notice)


def _stop(process: subprocess.Popen[str]) -> None:
    """Close the supervisor's stdin (it stops the worker); kill what is left after that."""
    with contextlib.suppress(OSError):
        assert process.stdin is not None
        process.stdin.close()
    try:
        process.wait(timeout=STOP_GRACE_SECONDS + 2.0)
    except subprocess.TimeoutExpired:
        _kill_group(process)


def _kill_group(process: subprocess.Popen[str]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=5.0)
