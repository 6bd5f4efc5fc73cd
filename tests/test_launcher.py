"""ProcessLauncher: output, exits reported to listeners, stopping on events."""

from __future__ import annotations

import io
import threading
import time

from horovod.runner.common.util.hosts import SlotInfo

from spotring.driver.launcher import ProcessLauncher, WorkerExit


class Listener:
    def __init__(self) -> None:
        self.started: list[tuple[str, int]] = []
        self.exits: list[WorkerExit] = []

    def worker_started(self, host: str, process_group: int) -> None:
        self.started.append((host, process_group))

    def worker_exited(self, exit: WorkerExit, process_group: int) -> None:
        self.exits.append(exit)


def slot(host: str = "host-1", rank: int = 2) -> SlotInfo:
    return SlotInfo(
        hostname=host, rank=rank, local_rank=0, cross_rank=rank, size=3, local_size=1, cross_size=3
    )


def test_output_is_prefixed_and_exit_reported() -> None:
    out, listener = io.StringIO(), Listener()
    launcher = ProcessLauncher(remote=False, listeners=[listener], output=out)
    code, _ = launcher("echo hello; exit 3", slot(), [threading.Event()])
    assert code == 3
    assert out.getvalue() == "[2]<host-1:0>: hello\n"
    assert listener.started and listener.started[0][0] == "host-1"
    (exit,) = listener.exits
    assert (exit.host, exit.rank, exit.exit_code, exit.stopped, exit.failed) == (
        "host-1",
        2,
        3,
        False,
        True,
    )


def test_event_stops_the_whole_process_group_and_is_not_a_failure() -> None:
    listener, event = Listener(), threading.Event()
    launcher = ProcessLauncher(remote=False, listeners=[listener], output=io.StringIO())
    threading.Timer(0.3, event.set).start()
    began = time.monotonic()
    code, _ = launcher("sleep 60 & sleep 60; wait", slot(), [event])
    assert time.monotonic() - began < 10
    assert code != 0
    (exit,) = listener.exits
    assert exit.stopped and not exit.failed


def test_success_is_not_a_failure() -> None:
    listener = Listener()
    ProcessLauncher(remote=False, listeners=[listener], output=io.StringIO())("true", slot(), [])
    assert listener.exits[0].exit_code == 0 and not listener.exits[0].failed


def test_remote_workers_go_over_ssh_with_keepalive() -> None:
    launcher = ProcessLauncher(remote=True, ssh_port=2222, ssh_identity_file="/k")
    argv = launcher._argv("python train.py", "10.0.0.5")
    assert argv[0] == "ssh" and "10.0.0.5" in argv
    assert "ServerAliveInterval=5" in argv and argv[argv.index("-p") + 1] == "2222"
    assert argv[-1].endswith("python train.py") and argv[-1].startswith("cd ")
