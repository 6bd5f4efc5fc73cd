"""examples/provider-plugin, installed as a user would (scripts/test.sh does it): spotring
finds it, shows its options, and trains on its hosts while the host file changes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.support import (
    assert_no_committed_step_lost,
    commits,
    job_output,
    read_events,
    running_job,
    wait_for_events,
)

SPOTRING = str(Path(sys.executable).with_name("spotring"))


@pytest.fixture(scope="module", autouse=True)
def installed() -> None:
    try:
        import spotring_hostfile  # noqa: F401
    except ImportError:
        pytest.fail("examples/provider-plugin is not installed: run scripts/test.sh")


def spotring(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SPOTRING, *args], capture_output=True, text=True, timeout=60)


def test_spotring_lists_the_plugin_and_its_options() -> None:
    listed = spotring("providers")
    assert any(line.split()[0] == "hostfile" for line in listed.stdout.splitlines())
    assert "spotring_hostfile" in listed.stdout
    helped = spotring("run", "--provider", "hostfile", "--help")
    assert helped.returncode == 0 and "--hosts-file" in helped.stdout


def test_a_missing_hosts_file_option_is_one_line() -> None:
    result = spotring("discover", "--provider", "hostfile")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "spotring discover: error: --hosts-file is required for --provider hostfile"
    )


@pytest.mark.e2e
def test_a_job_follows_the_host_file(repo: Path, tmp_path: Path) -> None:
    hosts, events = tmp_path / "hosts", tmp_path / "events.jsonl"
    stop_file = tmp_path / "stop"
    hosts.write_text("10.7.0.1\n10.7.0.2\n")
    argv = [
        *(SPOTRING, "run", "--provider", "hostfile", "--hosts-file", str(hosts)),
        *("--launcher", "local", "--refresh-interval", "0.5"),
        *("-np", "2", "--min-np", "2", "--max-np", "3", "--"),
        *(sys.executable, str(repo / "examples" / "train_digits.py"), "--events", str(events)),
        # Trains until the stop file, given once the third host trained: a slow
        # machine's join cannot come after the training's end.
        *("--epochs", "1000", "--step-seconds", "0.05", "--stop-file", str(stop_file)),
    ]
    with running_job(argv, cwd=tmp_path, env=dict(os.environ)) as process:
        wait_for_events(process, events, commits(min_step=5), "step 5")
        with hosts.open("a") as stream:
            stream.write("10.7.0.3\n")  # a host joins
        wait_for_events(process, events, commits(size=3, steps=5), "5 commits of 3 workers")
        stop_file.touch()
        output = job_output(process, 300)
    assert process.returncode == 0, output[-4000:]
    recorded = read_events(events)
    assert_no_committed_step_lost(recorded)
    assert recorded[-1]["event"] == "done" and recorded[-1]["size"] == 3
