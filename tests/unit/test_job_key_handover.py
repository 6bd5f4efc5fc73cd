"""The job key reaches a worker through an inherited pipe, never an environment block.

``/proc/PID/environ`` shows the environment a process started with for its whole life,
whatever it pops from ``os.environ`` later, and the script's children inherit it: the
key must be in neither, nor in any argv, and the abort must still verify messages.
"""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from spotring.driver.launcher import ProcessLauncher, WorkerSpec
from spotring.worker_image import peer_abort
from spotring.worker_image.peer_abort import JOB_KEY_ENV, JOB_KEY_FD_ENV, PeerFailedRequest
from spotring.worker_image.supervisor import key_pipe

ENV = {"PATH": os.environ["PATH"]}
KEY = os.urandom(32)

WORKER = """\
import json, os, subprocess, sys, time
import horovod.torch  # spotring's sitecustomize installs the abort on this import
from horovod.runner.common.util import secret
from horovod.runner.elastic.worker import WorkerNotificationService
from spotring.worker_image import peer_abort

guard = peer_abort.install()
guard.context_formed((), 7)
key = secret.make_secret_key()
service = WorkerNotificationService(key, "lo", None)
# close_fds=False: the child inherits every descriptor the worker left inheritable.
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], close_fds=False)
print(json.dumps({"pid": os.getpid(), "child": child.pid, "port": service.get_port(),
                  "key": key.hex()}), flush=True)
deadline = time.monotonic() + 60
while guard._last_sequence < 1 and time.monotonic() < deadline:
    time.sleep(0.05)
print(json.dumps({"accepted": guard._last_sequence, "rejected": guard.rejected}), flush=True)
child.kill()
service.shutdown()
"""


def environ(pid: int) -> dict[str, str]:
    """The environment block ``pid`` started with (what ``/proc`` shows anyone)."""
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def pipes(pid: int) -> set[str]:
    """The pipes ``pid`` holds beyond its stdin, stdout and stderr."""
    fds = Path(f"/proc/{pid}/fd")
    links = {os.readlink(fd) for fd in fds.iterdir() if int(fd.name) > 2}
    return {link for link in links if link.startswith("pipe:")}


def cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")


def test_a_real_workers_environment_and_its_childs_lack_the_key(tmp_path: Path) -> None:
    from horovod.runner.elastic.worker import WorkerNotificationClient

    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    spec = {"argv": [sys.executable, str(script)], "env": {**ENV, JOB_KEY_ENV: KEY.hex()}}
    supervisor = subprocess.Popen(
        [sys.executable, "-m", "spotring.worker_image.supervisor"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=ENV,
        text=True,
    )
    assert supervisor.stdin is not None and supervisor.stdout is not None
    try:
        supervisor.stdin.write(json.dumps(spec) + "\n")
        supervisor.stdin.flush()  # stays open: closing it stops the worker
        started = json.loads(supervisor.stdout.readline())
        worker, child = started["pid"], started["child"]
        for pid in (worker, child):
            assert KEY.hex() not in "\0".join(f"{k}={v}" for k, v in environ(pid).items())
            assert KEY.hex() not in cmdline(pid)
            assert JOB_KEY_ENV not in environ(pid)
        # The pipe the worker was told of: read and closed before the script ran.
        assert JOB_KEY_FD_ENV in environ(worker) and JOB_KEY_FD_ENV not in environ(child)
        assert pipes(worker) == pipes(child) == set(), "the key's pipe is still open"

        address = {"lo": [("127.0.0.1", started["port"])]}
        client = WorkerNotificationClient(address, bytes.fromhex(started["key"]), verbose=0)
        client._send(PeerFailedRequest.sign(os.urandom(32), 7, 1, "host-9[0]"))  # forged
        client._send(PeerFailedRequest.sign(KEY, 7, 1, "host-9[0]"))
        assert json.loads(supervisor.stdout.readline()) == {"accepted": 1, "rejected": 1}
        assert supervisor.wait(timeout=30) == 0
    finally:
        supervisor.kill()
        supervisor.wait()


def test_the_launchers_supervisor_and_its_worker_lack_the_key_in_their_environment() -> None:
    """Through the real launcher: the local supervisor's own block too."""
    show = (
        "import os\n"
        "for pid in (os.getpid(), os.getppid()):\n"
        "    print(open(f'/proc/{pid}/environ', 'rb').read().replace(b'\\0', b' ').decode())\n"
    )
    out = io.StringIO()
    spec = WorkerSpec(
        host="host-1",
        local_rank=0,
        rank=0,
        argv=(sys.executable, "-c", show),
        env={**ENV, JOB_KEY_ENV: KEY.hex()},
    )
    code, _ = ProcessLauncher(remote=False, output=out)(spec, [threading.Event()])
    assert code == 0, out.getvalue()
    assert len(re.findall(r"(?<![A-Z_])PATH=", out.getvalue())) == 2  # both blocks read
    assert KEY.hex() not in out.getvalue()


def test_the_key_pipe_holds_the_key_and_is_read_once_then_closed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(peer_abort, "_job_key", None)
    fd = key_pipe(KEY.hex())
    assert fd is not None
    monkeypatch.setenv(JOB_KEY_FD_ENV, str(fd))
    monkeypatch.setenv(JOB_KEY_ENV, os.urandom(32).hex())  # never taken from here
    assert peer_abort.take_job_key() == KEY
    assert JOB_KEY_FD_ENV not in os.environ and JOB_KEY_ENV not in os.environ
    with pytest.raises(OSError):
        os.fstat(fd)
    assert peer_abort.take_job_key() == KEY  # remembered: install() asks again


@pytest.mark.parametrize("content", [b"", b"not hex", b"ab" * 200])
def test_a_pipe_without_a_key_gives_none(content: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(peer_abort, "_job_key", None)
    read_fd, write_fd = os.pipe()
    os.write(write_fd, content)
    os.close(write_fd)
    monkeypatch.setenv(JOB_KEY_FD_ENV, str(read_fd))
    assert peer_abort.take_job_key() is None  # never an empty key anyone could sign with


def test_a_descriptor_that_is_no_pipe_is_left_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(peer_abort, "_job_key", None)
    with open(tmp_path / "file", "wb") as file:
        monkeypatch.setenv(JOB_KEY_FD_ENV, str(file.fileno()))
        assert peer_abort.take_job_key() is None
        os.fstat(file.fileno())  # still open


def test_no_key_pipe_without_a_key_or_for_one_too_long() -> None:
    assert key_pipe("") is None
    assert key_pipe("ab" * 200) is None
