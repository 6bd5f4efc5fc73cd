"""Runs one Horovod worker on its host for spotring's launcher, and stops it on EOF.

The launcher starts ``python -m spotring.worker_image.supervisor`` (locally, or on the
worker host over ssh) and writes one JSON line to its stdin::

    {"argv": [...], "env": {...}, "cwd": "/dir", "grace": 5.0,
     "launch": "<id>", "notices": {"watcher": "aws", ...}, "warm": true}

Why a supervisor instead of ``env K=V ... command`` on a command line:

* The worker's environment (Horovod's settings, what the user forwarded, the job key)
  travels over the pipe, or ssh's encrypted channel, never through any process's argv,
  where ``ps`` on the driver or the host would show it.
* The job key (``SPOTRING_JOB_KEY`` in the spec's ``env``) is taken out of the worker's
  environment, whose block ``/proc/PID/environ`` shows for the worker's whole life and
  the script's children inherit. The worker gets it in a pipe instead: written whole
  and closed here before the worker starts, inherited by the worker alone, named by
  ``SPOTRING_JOB_KEY_FD`` (a number); spotring's ``sitecustomize`` reads and closes it
  before the script runs.
* The launcher keeps stdin open for the worker's life. When it closes (a stop, or the
  driver dying, or ssh's connection dropping), the supervisor stops the worker's whole
  process group: SIGTERM, then SIGKILL after ``grace`` seconds. Over ssh this is the only
  way a stop reaches the remote process, since signals reach the local ssh client only.
* The worker gets spotring's ``sitecustomize`` (the fast peer-failure abort, whatever
  state class the script uses) and, unless given one, the network interface that routes
  to the driver's rendezvous server, found on this host.
* With ``notices``, the supervisor watches the cloud's metadata service for an
  interruption notice about this host (``spotring.worker_image.notices``) and reports
  it to the driver as a signed line on its stdout. It then relays the worker's output
  itself, so a report always starts a line of its own.

* With ``warm``, the worker is started ahead of its join and holds in ``hvd.init``
  (``spotring.worker_image.warm_start``) on a socket pair shared with the supervisor.
  When it is held, the supervisor prints a ready line with the launch id; the launcher's
  second stdin line, ``{"HOROVOD_RANK": ..., ...}``, is the slot's environment, which
  the supervisor passes on to the worker. Closing stdin before that stops it as usual.
* With ``progress`` (and a ``launch`` id and the job key), the worker counts its
  commits into a shared page the supervisor hands it (``SPOTRING_PROGRESS_FD``), and
  the supervisor reports the count, at most twice a second, as a signed line on its
  stdout (``spotring.worker_image.progress``): the driver sees when a ring stands still.

The supervisor exits as its worker did: with its exit code, or killed by the same signal.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spotring.worker_image.peer_abort import MAX_JOB_KEY_HEX
from spotring.worker_image.progress import ProgressForwarder, ProgressPage
from spotring.worker_image.warm_start import READY
from spotring.worker_image.wire import (
    JOB_KEY_ENV,
    JOB_KEY_FD_ENV,
    PEER_ABORT_ENV,
    PROGRESS_FD_ENV,
    RENDEZVOUS_ADDR_ENV,
    WARM_FD_ENV,
    WARM_READY_MARKER,
)

if TYPE_CHECKING:
    from spotring.worker_image.notices import NoticeReporter

SITEHOOK_DIR = str(Path(__file__).resolve().with_name("sitehook"))
"""Put first on the worker's PYTHONPATH: its sitecustomize installs the peer abort."""

DEFAULT_GRACE_SECONDS = 5.0
CANNOT_START_EXIT = 127


def worker_environment(base: Mapping[str, str], given: Mapping[str, str]) -> dict[str, str]:
    """The worker's environment: this host's, the launcher's on top, spotring's hooks;
    never the job key (see :func:`key_pipe`)."""
    env = {**base, **given}
    env.pop(JOB_KEY_ENV, None)
    env.pop(JOB_KEY_FD_ENV, None)  # only ours names a descriptor the worker inherits
    env.pop(PROGRESS_FD_ENV, None)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = SITEHOOK_DIR + (os.pathsep + path if path else "")
    env.setdefault(PEER_ABORT_ENV, "1")
    if "HOROVOD_GLOO_IFACE" not in env and RENDEZVOUS_ADDR_ENV in env:
        iface = interface_towards(env[RENDEZVOUS_ADDR_ENV])
        if iface is not None:
            env["HOROVOD_GLOO_IFACE"] = iface
            env.setdefault("NCCL_SOCKET_IFNAME", iface)
    return env


def key_pipe(key_hex: str) -> int | None:
    """The read end of a pipe that holds ``key_hex`` and nothing more (its write end
    closed), for the worker to inherit; None without a key, or with one too long to be
    a key (the pipe's buffer must hold it whole: nobody reads it before the worker
    starts)."""
    if not key_hex or len(key_hex) > MAX_JOB_KEY_HEX:
        return None
    read_fd, write_fd = os.pipe()  # both non-inheritable: pass_fds lets the worker's in
    try:
        os.write(write_fd, key_hex.encode())
    finally:
        os.close(write_fd)
    return read_fd


def local_address_towards(address: str) -> str | None:
    """This machine's address on its route to ``address`` (None: no route)."""
    try:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((address, 9))  # UDP: picks a route, sends nothing
            return str(probe.getsockname()[0])
    except OSError:
        return None


def interface_towards(address: str) -> str | None:
    """The name of this host's interface whose address routes to ``address``."""
    import psutil

    local = local_address_towards(address)
    if local is None:
        return None
    for name, addresses in psutil.net_if_addrs().items():
        if any(a.address.split("%")[0] == local for a in addresses):
            return name
    return None


def _die_with_parent() -> None:
    """In the worker, before exec: SIGKILL it if the supervisor dies (Linux), so a
    killed supervisor never leaves a worker training on its own."""
    import ctypes

    pr_set_pdeathsig = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def _read_line(fd: int, limit: int = 16 << 20) -> bytes:
    """One line from ``fd``, unbuffered: nothing past it is consumed."""
    chunks = bytearray()
    while len(chunks) < limit:
        byte = os.read(fd, 1)
        if not byte or byte == b"\n":
            break
        chunks += byte
    return bytes(chunks)


def _read_spec(fd: int) -> dict[str, Any]:
    try:
        spec = json.loads(_read_line(fd) or b"null")
    except json.JSONDecodeError as error:
        raise ValueError(f"not JSON: {error}") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("argv"), list) or not spec["argv"]:
        raise ValueError("expected a JSON object with a non-empty 'argv' list")
    if not all(isinstance(a, str) for a in spec["argv"]):
        raise ValueError("'argv' must hold strings")
    env = spec.get("env", {})
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise ValueError("'env' must map strings to strings")
    if spec.get("notices") is not None and not (
        isinstance(spec["notices"], dict) and isinstance(spec.get("launch"), str)
    ):
        raise ValueError("'notices' must be an object, with a 'launch' id")
    if spec.get("warm") and not isinstance(spec.get("launch"), str):
        raise ValueError("'warm' needs a 'launch' id")
    if spec.get("progress") and not isinstance(spec.get("launch"), str):
        raise ValueError("'progress' needs a 'launch' id")
    return spec


class _Output:
    """This process's stdout, shared by the worker's relayed output and notice lines."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at_line_start = True

    def relay(self, fd: int) -> None:
        """Copy the worker's output from ``fd`` until it closes."""
        while chunk := os.read(fd, 65536):
            with self._lock:
                _write_all(1, chunk)
                self._at_line_start = chunk.endswith(b"\n")
        os.close(fd)

    def line(self, text: str) -> None:
        """Write ``text`` (one line) so that it starts a line of its own."""
        with self._lock:
            _write_all(1, (b"" if self._at_line_start else b"\n") + text.encode())
            self._at_line_start = True


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BrokenPipeError:  # the driver is gone: nothing left to tell
            return


def _notice_reporter(spec: dict[str, Any], output: _Output) -> NoticeReporter | None:
    """The reporter the spec asks for (None: none asked, or no job key to sign with)."""
    config, key = spec.get("notices"), spec.get("env", {}).get(JOB_KEY_ENV, "")
    if not config or not key:
        return None
    # Imported here: a worker without notices does not pay for urllib at start-up.
    from spotring.worker_image.notices import NoticeReporter, make_watcher

    try:
        watcher = make_watcher(config)
        return NoticeReporter(watcher, bytes.fromhex(key), spec["launch"], output.line)
    except Exception as error:  # a bad watcher must not keep the worker from training
        print(f"spotring supervisor: no notice watcher: {error}", file=sys.stderr)
        return None


def _progress_forwarder(
    spec: dict[str, Any], output: _Output
) -> tuple[ProgressForwarder, int] | None:
    """The forwarder of the worker's commit count and the page's descriptor for the
    worker, as the spec asks (None: not asked, no job key to sign with, or no page)."""
    key = spec.get("env", {}).get(JOB_KEY_ENV, "")
    if not spec.get("progress") or not key or len(key) > MAX_JOB_KEY_HEX:
        return None
    try:
        page, fd = ProgressPage.create()
        return ProgressForwarder(page, bytes.fromhex(key), spec["launch"], output.line), fd
    except (OSError, ValueError) as error:  # no progress must not keep a worker from training
        print(f"spotring supervisor: no progress reports: {error}", file=sys.stderr)
        return None


def _report_held(channel: socket.socket, output: _Output, launch: str) -> None:
    """Tell the launcher, by a ready line, once the warm worker holds in ``hvd.init``."""
    with contextlib.suppress(OSError):
        if channel.recv(len(READY), socket.MSG_WAITALL) == READY:
            output.line(f"{WARM_READY_MARKER}{launch}\n")


def _hand_over_slot(channel: socket.socket) -> None:
    """Pass the slot's environment (the next stdin line) to the held worker. A stop
    instead (EOF), or anything but a map of strings, closes the channel: the worker
    exits rather than join without its slot."""
    line = _read_line(0)
    try:
        env = json.loads(line)
        if isinstance(env, dict) and all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            env.pop(JOB_KEY_ENV, None)  # the worker has it; it goes into os.environ
            env.pop(JOB_KEY_FD_ENV, None)
            channel.sendall(json.dumps(env).encode() + b"\n")
    except (ValueError, OSError):
        pass
    with contextlib.suppress(OSError):
        channel.shutdown(socket.SHUT_WR)


def _stop_group_when_stdin_closes(
    grace: float, reporter: NoticeReporter | None, warm: socket.socket | None
) -> None:
    if warm is not None:
        _hand_over_slot(warm)
    # The raw descriptor, not sys.stdin: a daemon thread blocked in a buffered read
    # holds its lock, which would abort the interpreter's shutdown.
    while os.read(0, 65536):
        pass
    group = os.getpgid(0)
    try:
        os.killpg(group, signal.SIGTERM)  # the worker and its children; ours is a no-op
        if reporter is not None:
            # After a notice, a stop means the host has left the ring: the cloud may go
            # on (acknowledge does nothing without a notice, or on clouds without one).
            reporter.stop()
            reporter.acknowledge()
        time.sleep(grace)
        os.killpg(group, signal.SIGKILL)  # whatever is left, this process included
    except ProcessLookupError:
        pass


def main() -> int:
    try:
        spec = _read_spec(0)
    except ValueError as error:
        print(f"spotring supervisor: bad worker spec: {error}", file=sys.stderr)
        return 2
    if os.getpgid(0) != os.getpid():
        os.setsid()  # over ssh: a group of our own, so a stop reaches every child
    # A stop signals the whole group: the worker decides what SIGTERM means, we wait.
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    cwd = spec.get("cwd")
    if not (isinstance(cwd, str) and os.path.isdir(cwd)):
        cwd = None
    env = worker_environment(os.environ, spec.get("env", {}))
    output = _Output()
    reporter = _notice_reporter(spec, output)
    warm, worker_channel = socket.socketpair() if spec.get("warm") else (None, None)
    passed: list[int] = []
    if worker_channel is not None:
        env[WARM_FD_ENV] = str(worker_channel.fileno())
        passed.append(worker_channel.fileno())
    key_fd = key_pipe(spec.get("env", {}).get(JOB_KEY_ENV, ""))
    if key_fd is not None:
        env[JOB_KEY_FD_ENV] = str(key_fd)
        passed.append(key_fd)
    progress = _progress_forwarder(spec, output)
    if progress is not None:
        env[PROGRESS_FD_ENV] = str(progress[1])
        passed.append(progress[1])
    # Our own lines (notices, ready, progress) must start lines of their own: relay.
    relayed = reporter is not None or warm is not None or progress is not None
    relay_fd, worker_out = os.pipe() if relayed else (None, None)
    try:
        worker = subprocess.Popen(
            spec["argv"],
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=worker_out,
            stderr=worker_out,
            pass_fds=passed,
            preexec_fn=_die_with_parent,  # one libc call before exec: no locks taken
        )
    except OSError as error:
        print(f"spotring: cannot start {spec['argv'][0]!r}: {error}", file=sys.stderr)
        return CANNOT_START_EXIT
    finally:
        if key_fd is not None:
            os.close(key_fd)  # the worker's now
        if progress is not None:
            os.close(progress[1])  # the worker's; our mapping stays
    relay = None
    if relay_fd is not None and worker_out is not None:
        os.close(worker_out)  # the worker holds it; EOF when the worker (group) is done
        relay = threading.Thread(target=output.relay, args=(relay_fd,), daemon=True)
        relay.start()
    if reporter is not None:
        reporter.start()
    if progress is not None:
        progress[0].start()
    if warm is not None and worker_channel is not None:
        worker_channel.close()  # the worker's end
        threading.Thread(
            target=_report_held, args=(warm, output, spec["launch"]), daemon=True
        ).start()
    grace = float(spec.get("grace", DEFAULT_GRACE_SECONDS))
    threading.Thread(
        target=_stop_group_when_stdin_closes, args=(grace, reporter, warm), daemon=True
    ).start()
    while True:
        try:
            code = worker.wait()
            break
        except InterruptedError:  # pragma: no cover - PEP 475 retries for us
            continue
    if relay is not None:
        relay.join(timeout=2.0)  # the worker's last lines (children may hold the pipe)
    if progress is not None:
        progress[0].stop()
    if code < 0:  # die the way the worker did, so the driver sees the signal
        with contextlib.suppress(OSError, ValueError):  # SIGKILL has no handler to reset
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


if __name__ == "__main__":
    status = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # no interpreter shutdown while the stdin thread is blocked
