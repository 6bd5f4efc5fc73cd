"""The script provider: line formats, command failures, steering, conformance, e2e."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spotring.autoscaler.controller import Controller
from spotring.autoscaler.policy import JobShape
from spotring.providers.base import InstanceState, Provider, ProviderError
from spotring.providers.conformance import ProviderContract
from spotring.providers.script import ScriptProvider, parse_members
from tests.e2e.support import (
    assert_no_committed_step_lost,
    commits,
    job_output,
    read_events,
    running_job,
    wait_for_events,
    worker_pids,
)

POOL = Path(__file__).parents[1] / "data" / "fake_pool.py"
SPOTRING = str(Path(sys.executable).with_name("spotring"))


def pool_provider(tmp_path: Path, size: int = 3) -> ScriptProvider:
    state = tmp_path / "pool.json"
    state.write_text(json.dumps({"next": 0, "members": {}}))
    base = f"{sys.executable} {POOL} {state}"
    subprocess.run(f"{base} resize {size}", shell=True, check=True)
    return ScriptProvider(
        f"{base} list", resize_command=f"{base} resize", replace_command=f"{base} replace"
    )


class TestScriptContract(ProviderContract):
    @pytest.fixture
    def provider(self, tmp_path: Path) -> Provider:
        return pool_provider(tmp_path)

    @pytest.fixture
    def failing_provider(self) -> Provider:
        return ScriptProvider("exit 3", resize_command="exit 3", replace_command="exit 3")


def test_both_line_formats_mixed() -> None:
    members = parse_members(
        "# spotring-group v1\n\nhost-a:4\nhost-b\ni-1 10.0.0.7 pending 2\ni-2 - pending\n"
        "i-3 10.0.0.9 ready\n"
    )
    assert [(m.id, m.address, m.state, m.slots) for m in members] == [
        ("host-a", "host-a", InstanceState.READY, 4),
        ("host-b", "host-b", InstanceState.READY, 1),
        ("i-1", "10.0.0.7", InstanceState.PENDING, 2),
        ("i-2", "", InstanceState.PENDING, 1),
        ("i-3", "10.0.0.9", InstanceState.READY, 1),
    ]


@pytest.mark.parametrize(
    ("output", "message"),
    [
        ("a:1\nb:x\n", "line 2: slots 'x'"),
        ("a:0\n", "line 1: slots '0'"),
        ("ok\n-oProxyCommand=x\n", "line 2: '-oProxyCommand=x' is not a host name"),
        ("i-1 10.0.0.1 ready\n--force 10.0.0.2 ready\n", "line 2: id '--force' starts with '-'"),
        ("i-1 10.0.0.1 sleepy 1\n", "line 1: state 'sleepy'"),
        ("a b\n", "line 1: expected"),
        ("a:1\na:2\n", "line 2: id 'a' repeated"),
    ],
)
def test_malformed_lines_are_named_by_number(output: str, message: str) -> None:
    with pytest.raises(ProviderError, match=message):
        parse_members(output)


def test_a_failing_or_hanging_command_is_a_provider_error() -> None:
    failing = ScriptProvider("echo 'no route to pool' >&2; exit 5")
    with pytest.raises(ProviderError, match="exited with 5: no route to pool"):
        failing.list_instances()
    hanging = ScriptProvider("sleep 60 & sleep 60", timeout=0.5)
    began = time.monotonic()
    with pytest.raises(ProviderError, match=r"did not finish within 0\.5s"):
        hanging.list_instances()
    assert time.monotonic() - began < 5


def test_without_steering_commands_the_group_is_only_listed() -> None:
    provider = ScriptProvider("echo a:1; echo b:1")
    assert not provider.can_resize and not provider.can_replace
    controller = Controller(provider, job=JobShape(num_proc=4, min_num_proc=1, max_num_proc=4))
    controller.refresh()
    controller._steering._steer_size = lambda inventory: pytest.fail(
        "steered a group it cannot resize"
    )
    controller.start()
    try:
        controller.wait_for_inventory(timeout=10)
        controller.host_failed("a", "exit 1")
        time.sleep(0.3)
    finally:
        controller.stop()
    assert controller.wait_for_fatal_error(timeout=0) is None
    assert controller._replacements._due == {}


@pytest.mark.e2e
def test_a_horovodrun_discovery_script_runs_unchanged(repo: Path, tmp_path: Path) -> None:
    script = tmp_path / "discover.sh"
    script.write_text("#!/bin/sh\necho 10.8.0.1:1\necho 10.8.0.2:1\necho 10.8.0.3:1\n")
    script.chmod(0o755)
    events = tmp_path / "events.jsonl"
    argv = [
        *(SPOTRING, "run", "--provider", "script", "--list-command", str(script)),
        *("--launcher", "local", "--refresh-interval", "1"),
        *("-np", "3", "--min-np", "2", "--max-np", "3", "--"),
        *(sys.executable, str(repo / "examples" / "train_digits.py"), "--events", str(events)),
        *("--epochs", "6", "--step-seconds", "0.05"),
    ]
    with running_job(argv, cwd=tmp_path, env=dict(os.environ)) as process:
        wait_for_events(process, events, commits(min_step=10), "step 10")
        pid, _ = worker_pids(process.pid, HOROVOD_HOSTNAME="10.8.0.3")[0]
        os.kill(pid, signal.SIGKILL)
        output = job_output(process, 300)
    assert process.returncode == 0, output[-4000:]
    recorded = read_events(events)
    assert_no_committed_step_lost(recorded)
    assert recorded[-1]["event"] == "done" and recorded[-1]["size"] == 2
    assert "host 10.8.0.3 failed" in output
