"""The torch restart mode: ranks over the hosts' slots, torchrun's environment, the port
of each attempt's store, what counts as a membership change; the workers started ahead
(the command that runs the script in them, the hand-over of the attempt's environment);
and a failed worker's host taken out only when the host, not the script, failed."""

from __future__ import annotations

import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from spotring.core.job import JobShape
from spotring.driver.launcher import LAUNCH_FAILED_EXIT, ProcessLauncher, WorkerSpec
from spotring.driver.options import ElasticOptions
from spotring.driver.ring_events import NoRingEvents
from spotring.driver.torch_restart import (
    PORT_TAKEN_EXIT,
    STOP_GRACE_SECONDS,
    WARM_MODULE,
    Attempt,
    Slot,
    TorchRestartDriver,
    assign_ranks,
    free_port,
    host_lost,
    membership_change,
    torchrun_env,
    warm_command,
)
from spotring.driver.torch_workers import TorchJobFailed
from tests.unit.quiet_controller import QuietController

TWO_HOSTS = {"host-0": 1, "host-1": 1}


def test_ranks_are_consecutive_per_host_and_stop_at_the_most_workers() -> None:
    slots = assign_ranks({"b": 2, "a": 3, "c": 2}, max_workers=4)
    assert slots == [
        Slot("b", 0, 0, 0, 2),
        Slot("b", 1, 1, 0, 2),
        Slot("a", 0, 2, 1, 2),  # a gets the 2 slots left: its local world size is 2
        Slot("a", 1, 3, 1, 2),
    ]  # c is left out, so it has no group rank


def test_a_host_with_no_slot_left_takes_no_group_rank() -> None:
    slots = assign_ranks({"a": 2, "b": 0, "c": 1}, max_workers=8)
    assert [(s.host, s.rank, s.group_rank) for s in slots] == [
        ("a", 0, 0),
        ("a", 1, 0),
        ("c", 2, 1),
    ]


ATTEMPT = Attempt(
    world_size=3,
    group_world_size=2,
    master_addr="10.0.0.5",
    master_port=29511,
    run_id="r1",
    restart_count=2,
    max_restarts=3,
)


def test_the_environment_is_torchruns() -> None:
    env = torchrun_env(Slot("a", 1, 1, 0, 2), ATTEMPT, omp_num_threads=None)
    assert env == {
        "RANK": "1",
        "LOCAL_RANK": "1",
        "GROUP_RANK": "0",
        "ROLE_RANK": "1",
        "ROLE_NAME": "default",
        "LOCAL_WORLD_SIZE": "2",
        "WORLD_SIZE": "3",
        "GROUP_WORLD_SIZE": "2",
        "ROLE_WORLD_SIZE": "3",
        "MASTER_ADDR": "10.0.0.5",
        "MASTER_PORT": "29511",
        "TORCHELASTIC_RESTART_COUNT": "2",
        "TORCHELASTIC_MAX_RESTARTS": "3",
        "TORCHELASTIC_RUN_ID": "r1",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "OMP_NUM_THREADS": "1",  # torchrun's default with several workers per host
    }


@pytest.mark.parametrize(
    ("local_world_size", "user", "expected"), [(1, None, None), (2, "4", "4"), (1, "4", "4")]
)
def test_omp_threads_as_torchrun_sets_them(
    local_world_size: int, user: str | None, expected: str | None
) -> None:
    env = torchrun_env(Slot("a", 0, 0, 0, local_world_size), ATTEMPT, omp_num_threads=user)
    assert env.get("OMP_NUM_THREADS") == expected


def test_each_attempt_gets_a_port_no_earlier_attempt_had() -> None:
    picks = iter([29500, 29501, 29502])
    assert free_port("127.0.0.1", [29500, 29501], lambda address: next(picks)) == 29502


def test_the_kernel_picks_a_free_port() -> None:
    port = free_port("127.0.0.1", ())
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))  # free: nothing listens there


@pytest.mark.parametrize(
    ("hosts_now", "size", "expected"),
    [
        ({"a": 1, "b": 1}, 2, ""),
        ({"a": 1}, 2, "b left"),  # gone, failed, or draining after its notice
        ({"a": 1, "b": 1, "c": 1}, 2, "c joined"),
        ({"a": 1, "b": 1, "c": 1}, 3, ""),  # already at --max-np: a new host waits
    ],
)
def test_membership_changes(hosts_now: dict[str, int], size: int, expected: str) -> None:
    assert membership_change({"a", "b"}, size, hosts_now, max_workers=3) == expected


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (["python", "train.py", "-v"], ["python", "-m", WARM_MODULE, "train.py", "-v"]),
        (["/v/python3.11", "-m", "t"], ["/v/python3.11", "-m", WARM_MODULE, "-m", "t"]),
        (["python", "-u", "train.py"], None),  # an interpreter option: cold
        (["python", "-m"], None),
        (["python"], None),
        (["bash", "train.sh"], None),
        (["./train.py"], None),
    ],
)  # fmt: skip
def test_python_scripts_and_modules_can_be_started_ahead(
    command: list[str], expected: list[str] | None
) -> None:
    warm = warm_command(command)
    assert (list(warm) if warm is not None else None) == expected


@pytest.mark.parametrize(
    ("exit_code", "lost"),
    [
        (-signal.SIGKILL, True),  # the local launcher: the supervisor dies as its worker did
        (128 + signal.SIGKILL, True),  # a shell's way of saying the same
        (LAUNCH_FAILED_EXIT, True),  # unreachable, or ssh's connection dropped
        (1, False),  # a Python exception
        (2, False),
        (-signal.SIGSEGV, False),  # the script's (or its extension's) crash
    ],
)
def test_only_a_killed_or_unreachable_worker_says_its_host_was_lost(
    exit_code: int, lost: bool
) -> None:
    assert host_lost(exit_code) is lost


SCRIPT = """\
import json, os, sys
with open(os.environ["OUT"], "w") as out:
    json.dump({"name": __name__, "argv": sys.argv, "path0": sys.path[0],
               "rank": os.environ.get("RANK"), "torch": "torch" in sys.modules}, out)
"""


def _script(folder: Path) -> Path:
    script = folder / "sub" / "train.py"
    script.parent.mkdir()
    script.write_text(SCRIPT)
    return script


def test_started_cold_the_script_runs_as_python_runs_it(tmp_path: Path) -> None:
    script, out = _script(tmp_path), tmp_path / "out.json"
    command = warm_command([sys.executable, str(script), "--lr", "1"])
    assert command is not None
    env = {**os.environ, "OUT": str(out)}
    subprocess.run(command, env=env, cwd=tmp_path, check=True, timeout=60)
    seen = json.loads(out.read_text())
    assert seen["name"] == "__main__"
    assert seen["argv"] == [str(script), "--lr", "1"]
    assert seen["path0"] == str(script.parent)


def test_a_missing_script_is_one_line_and_exit_2(tmp_path: Path) -> None:
    command = warm_command([sys.executable, str(tmp_path / "nope.py")])
    assert command is not None
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_started_ahead_it_waits_and_runs_the_script_with_its_attempts_environment(
    tmp_path: Path,
) -> None:
    """Through the launcher and the supervisor, as the driver starts it; a ``torch``
    that cannot be imported keeps this test in milliseconds (the import is what the
    end-to-end test pays ahead)."""
    script, out = _script(tmp_path), tmp_path / "out.json"
    (tmp_path / "stub").mkdir()
    (tmp_path / "stub" / "torch.py").write_text("raise ImportError('not in this test')\n")
    argv = warm_command([sys.executable, str(script), "x"])
    assert argv is not None
    env = {"OUT": str(out), "PYTHONPATH": str(tmp_path / "stub")}
    ahead = WorkerSpec("localhost", 0, -1, argv, env, str(tmp_path))
    launcher = ProcessLauncher(remote=False, output=io.StringIO())
    try:
        warm = launcher.prestart(ahead)
        assert warm.wait_held(30.0), "never held"
        assert not out.exists()  # the script has not run
        spec = replace(ahead, rank=3, env={**ahead.env, "RANK": "3"})
        code, _ = launcher(spec, [threading.Event()], warm)
    finally:
        launcher.close()
    assert code == 0
    seen = json.loads(out.read_text())
    assert (seen["rank"], seen["argv"], seen["name"]) == ("3", [str(script), "x"], "__main__")


def _run(command: list[str], max_restarts: int) -> QuietController:
    controller = QuietController(TWO_HOSTS)
    launcher = ProcessLauncher(remote=False, output=io.StringIO())
    driver = TorchRestartDriver(
        command, controller, launcher, JobShape(2, 1, 2), ElasticOptions(),
        NoRingEvents(), max_restarts=max_restarts, local=True,
    )  # fmt: skip
    try:
        with pytest.raises(TorchJobFailed, match="no restart left"):
            driver.run()
    finally:
        launcher.close()
    assert len(driver.world_sizes) == max_restarts + 1
    return controller


def test_a_script_that_fails_by_itself_replaces_no_host() -> None:
    controller = _run([sys.executable, "-c", "raise SystemExit(1)"], max_restarts=1)
    assert controller.failed == []  # both attempts on the same two hosts


def test_a_killed_worker_takes_its_host_out_at_once() -> None:
    kill_rank_1 = (
        "import os, signal, time\n"
        "if os.environ['RANK'] == '1': os.kill(os.getpid(), signal.SIGKILL)\n"
        "time.sleep(60)\n"
    )
    controller = _run([sys.executable, "-c", kill_rank_1], max_restarts=0)
    assert controller.failed == ["host-1"]


@pytest.mark.parametrize(("rank", "runs"), [("0", False), ("1", True)])
def test_rank_0_ends_before_the_script_when_the_stores_port_is_taken_on_its_host(
    tmp_path: Path, rank: str, runs: bool
) -> None:
    script, out = _script(tmp_path), tmp_path / "out.json"
    command = warm_command([sys.executable, str(script)])
    assert command is not None
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = str(taken.getsockname()[1])
        env = {**os.environ, "OUT": str(out), "RANK": rank, "MASTER_PORT": port}
        result = subprocess.run(command, env=env, capture_output=True, timeout=60, check=False)
    assert out.exists() is runs  # only rank 0 serves the store
    assert result.returncode == (0 if runs else PORT_TAKEN_EXIT)


def test_a_store_port_taken_on_rank_0s_host_is_retried_without_counting(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import os, pathlib, sys\n"
        f"seen = pathlib.Path({str(tmp_path / 'seen')!r})\n"
        "if os.environ['RANK'] == '0' and not seen.exists():\n"
        "    seen.touch()\n"
        f"    sys.exit({PORT_TAKEN_EXIT})  # as the port check exits\n"
        "assert os.environ['TORCHELASTIC_RESTART_COUNT'] == '0'\n"
    )
    controller = QuietController(TWO_HOSTS)
    launcher = ProcessLauncher(remote=False, output=io.StringIO())
    driver = TorchRestartDriver(
        [sys.executable, str(script)], controller, launcher, JobShape(2, 1, 2),
        ElasticOptions(warm_start=False), NoRingEvents(), max_restarts=0, local=True,
    )  # fmt: skip
    try:
        driver.run()  # no restart left, yet it ends well
    finally:
        launcher.close()
    assert len(driver.world_sizes) == 2
    assert controller.failed == []


def test_a_host_joining_once_a_worker_ended_the_training_restarts_nothing(
    tmp_path: Path,
) -> None:
    ended = tmp_path / "ended"
    script = tmp_path / "train.py"
    script.write_text(
        "import os, pathlib, time\n"
        f"ended = pathlib.Path({str(ended)!r})\n"
        "if os.environ['RANK'] == '0':\n"
        "    ended.touch()\n"
        "else:\n"
        "    time.sleep(3)  # its last step, as a host joins\n"
    )
    controller = QuietController(TWO_HOSTS)
    launcher = ProcessLauncher(remote=False, output=io.StringIO())
    driver = TorchRestartDriver(
        [sys.executable, str(script)], controller, launcher, JobShape(2, 1, 3),
        ElasticOptions(warm_start=False), NoRingEvents(), local=True,
    )  # fmt: skip

    def add_a_host_once_rank_0_ended() -> None:
        deadline = time.monotonic() + 60
        while not ended.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.5)  # rank 0's exit is seen
        controller.inventory.hosts["host-2"] = 1

    threading.Thread(target=add_a_host_once_rank_0_ended, daemon=True).start()
    try:
        driver.run()
    finally:
        launcher.close()
    assert driver.world_sizes == [2]  # not restarted with host-2


def test_a_stopped_worker_gets_torchruns_30_s_to_checkpoint_before_sigkill(
    tmp_path: Path,
) -> None:
    # A stand-in for the supervisor's interpreter: it keeps the launcher's line, exits 0.
    supervisor = tmp_path / "python"
    supervisor.write_text(f'#!/bin/sh\nread -r line\necho "$line" > {tmp_path}/line.$$\n')
    supervisor.chmod(0o755)
    launcher = ProcessLauncher(remote=False, python=str(supervisor), output=io.StringIO())
    driver = TorchRestartDriver(
        [sys.executable, "train.py"], QuietController(TWO_HOSTS), launcher, JobShape(2, 1, 2),
        ElasticOptions(warm_start=False), NoRingEvents(), local=True,
    )  # fmt: skip
    try:
        driver.run()
    finally:
        launcher.close()
    lines = [json.loads(path.read_text()) for path in tmp_path.glob("line.*")]
    assert [line["grace"] for line in lines] == [STOP_GRACE_SECONDS] * 2 == [30.0] * 2
