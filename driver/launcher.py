"""Worker launchers: start one Horovod worker per slot, watch it, report its exit.

Horovod's elastic driver calls the launcher on a thread per slot with the full worker
command (Horovod's environment variables prefixed with ``env``) and a list of events;
any event set means "stop this worker". The launcher returns ``(exit_code, time)``.

spotring's launchers add what Horovod's own lacks: they report every worker start and
exit to listeners the moment it happens, so a dead worker's host leaves discovery and
its peers are told at once instead of after Gloo's 30 s timeout.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import IO, Protocol

STOP_GRACE_SECONDS = 5.0
"""How long a stopped worker gets between SIGTERM and SIGKILL."""


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
    def worker_started(self, host: str, process_group: int) -> None: ...

    def worker_exited(self, exit: WorkerExit, process_group: int) -> None: ...


class ProcessLauncher:
    """Runs each worker as a process group, locally or over ssh.

    :param remote: run workers over ssh on their host (False: as local processes, for
        the ``local`` provider and for tests that map cloud instances to this machine).
    :param listeners: told of every start and exit, on the worker's thread.
    """

    def __init__(
        self,
        *,
        remote: bool,
        listeners: Sequence[WorkerListener] = (),
        ssh_port: int | None = None,
        ssh_identity_file: str | None = None,
        output: IO[str] | None = None,
    ) -> None:
        self._remote = remote
        self._listeners = list(listeners)
        self._ssh_port = ssh_port
        self._ssh_identity_file = ssh_identity_file
        self._output = output or sys.stdout
        self._output_lock = threading.Lock()

    def add_listener(self, listener: WorkerListener) -> None:
        self._listeners.append(listener)

    def __call__(
        self, command: str, slot_info, events: Sequence[threading.Event]
    ) -> tuple[int, float]:
        """Horovod's ``exec_command``: run ``command`` for ``slot_info`` until it ends."""
        host, local_rank, rank = slot_info.hostname, slot_info.local_rank, slot_info.rank
        argv = self._argv(command, host)
        process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group, so kills reach its children
            text=True,
            errors="replace",
        )
        for listener in self._listeners:
            listener.worker_started(host, process.pid)
        pump = threading.Thread(
            target=self._pump, args=(process.stdout, f"[{rank}]<{host}:{local_rank}>"), daemon=True
        )
        pump.start()
        stopped = self._wait(process, events)
        pump.join(timeout=2.0)
        exit_code = process.returncode
        result = WorkerExit(host, local_rank, rank, exit_code, stopped)
        for listener in self._listeners:
            listener.worker_exited(result, process.pid)
        return exit_code, time.time()

    def _argv(self, command: str, host: str) -> list[str]:
        if not self._remote:
            return ["/bin/sh", "-c", command]
        remote_command = f"cd {shlex.quote(os.getcwd())} >/dev/null 2>&1; {command}"
        argv = [
            "ssh",
            "-o",
            "PasswordAuthentication=no",
            "-o",
            "StrictHostKeyChecking=no",
            # A host that vanishes (spot reclaim) drops ssh within ~10 s, not at TCP timeout.
            "-o",
            "ServerAliveInterval=5",
            "-o",
            "ServerAliveCountMax=2",
        ]
        if self._ssh_port is not None:
            argv += ["-p", str(self._ssh_port)]
        if self._ssh_identity_file is not None:
            argv += ["-i", self._ssh_identity_file]
        return [*argv, host, remote_command]

    @staticmethod
    def _wait(process: subprocess.Popen[str], events: Sequence[threading.Event]) -> bool:
        """Wait for the process; stop it if any event is set. True if we stopped it."""
        while process.poll() is None:
            if any(event.is_set() for event in events):
                _stop(process)
                return True
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=0.05)
        return False

    def _pump(self, stream: IO[str] | None, prefix: str) -> None:
        if stream is None:
            return
        for line in stream:
            with self._output_lock:
                self._output.write(f"{prefix}: {line}")
                self._output.flush()


def _stop(process: subprocess.Popen[str]) -> None:
    """SIGTERM the worker's process group, SIGKILL it after a grace period."""
    for sig, grace in ((signal.SIGTERM, STOP_GRACE_SECONDS), (signal.SIGKILL, None)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            process.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue
