"""End to end: the ``spotring`` CLI with ``--provider gcp`` against the fake Compute API.

The CLI finds its credentials the way it would on a workstation: Application Default
Credentials from GOOGLE_APPLICATION_CREDENTIALS, here a file whose token endpoint is
the fake (which then insists on the bearer token it issued). ``spotring run`` trains
the digits example with local worker processes standing in for the group's VMs while
the test adds a member and takes one away, as a MIG and a spot reclaim would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("google.cloud.compute_v1", reason="the gcp extra is not installed")

from tests.e2e.support import (
    commits,
    job_output,
    read_events,
    running_job,
    wait_for_events,
    worker_pids,
)
from tests.fakes.gcp import FakeCompute

SPOTRING = str(Path(sys.executable).with_name("spotring"))
ZONE = "us-central1-a"
JOB_TIMEOUT = 300


@pytest.fixture
def fake() -> Iterator[FakeCompute]:
    with FakeCompute() as server:
        server.require_auth = True
        yield server


@pytest.fixture
def gcp_env(fake: FakeCompute, tmp_path: Path) -> dict[str, str]:
    """Credentials from the fake only; nothing from this machine's gcloud set-up."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GOOGLE_", "CLOUDSDK_"))}
    env["CLOUDSDK_CONFIG"] = str(tmp_path / "gcloud")  # no gcloud login to fall back on
    env["NO_GCE_CHECK"] = "true"  # not on a VM: do not probe a metadata server
    env["GOOGLE_APPLICATION_CREDENTIALS"] = str(fake.write_credentials(tmp_path / "adc.json"))
    return env


def gcp_args(fake: FakeCompute, group: str) -> list[str]:
    return [
        *("--provider", "gcp", "--group", group, "--zone", ZONE),
        *("--project", fake.project, "--endpoint", fake.url),
    ]


def spotring(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SPOTRING, *argv], capture_output=True, text=True, env=env, timeout=120, check=False
    )


# ------------------------------------------------------------------------ discover


def test_discover_prints_ready_hosts_and_slots(fake: FakeCompute, gcp_env: dict[str, str]) -> None:
    group = fake.add_group("discover", zone=ZONE, size=3, accelerators=2)
    booting = group.add_member(current_action="CREATING", instance_status=None)
    group.auto_advance = False

    result = spotring("discover", *gcp_args(fake, "discover"), env=gcp_env)

    assert result.returncode == 0, result.stderr
    expected = sorted(f"{group.member(n).network_ip}:2" for n in group.names() if n != booting.name)
    assert sorted(result.stdout.splitlines()) == expected
    assert fake.requests[0].api == "oauth2.token"


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (
            "no group",
            f"managed instance group 'missing' not found (project test-project, zone {ZONE})",
        ),
        (
            "denied",
            "permission compute.instanceGroupManagers.get denied on instanceGroupManagers.get"
            f" (project test-project, zone {ZONE}): grant it to the account spotring runs as"
            " (see IAM_PERMISSIONS in spotring.providers.gcp)",
        ),
    ],
)
def test_errors_are_one_line_and_exit_2(
    fake: FakeCompute, gcp_env: dict[str, str], setup: str, message: str
) -> None:
    fake.add_group("workers", zone=ZONE, size=2)
    group = "missing" if setup == "no group" else "workers"
    if setup == "denied":
        fake.deny("compute.instanceGroupManagers.get")

    result = spotring("discover", *gcp_args(fake, group), env=gcp_env)

    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"spotring discover: error: {message}\n"


def test_no_credentials_is_one_line(fake: FakeCompute, gcp_env: dict[str, str]) -> None:
    env = {k: v for k, v in gcp_env.items() if k != "GOOGLE_APPLICATION_CREDENTIALS"}
    env["HOME"] = gcp_env["CLOUDSDK_CONFIG"]  # no ~/.config/gcloud either

    result = spotring("discover", *gcp_args(fake, "workers"), env=env)

    assert result.returncode == 2
    assert result.stderr.startswith("spotring discover: error: no Google Cloud credentials:")
    assert len(result.stderr.splitlines()) == 1 and not fake.requests


def test_run_on_an_unknown_group_exits_2_at_once(
    fake: FakeCompute, gcp_env: dict[str, str]
) -> None:
    began = time.monotonic()
    result = spotring("run", *gcp_args(fake, "missing"), "-np", "2", "--", "true", env=gcp_env)

    # Far below --start-timeout (120 s by default), with room for a busy machine.
    assert time.monotonic() - began < 60, "it waited for --start-timeout"
    assert result.returncode == 2
    assert result.stderr.strip() == (
        f"spotring run: error: managed instance group 'missing' not found"
        f" (project test-project, zone {ZONE})"
    )


# ----------------------------------------------------------------------------- run


@pytest.mark.e2e
def test_run_follows_the_group(
    repo: Path, tmp_path: Path, fake: FakeCompute, gcp_env: dict[str, str]
) -> None:
    group = fake.add_group("run", zone=ZONE, size=2)
    events = tmp_path / "events.jsonl"
    argv = [
        *(SPOTRING, "run", *gcp_args(fake, "run"), "--launcher", "local"),
        *("--refresh-interval", "0.5", "--scale-down-on-exit"),
        *("-np", "2", "--min-np", "1", "--max-np", "3", "--"),
        *(sys.executable, str(repo / "examples" / "train_digits.py"), "--events", str(events)),
        *("--epochs", "8", "--step-seconds", "0.1"),
    ]
    with running_job(argv, cwd=tmp_path, env=gcp_env) as process:
        wait_for_events(process, events, commits(size=2, steps=10), "training at size 2")
        # A member joins through CREATING -> STAGING -> RUNNING, as after a resize.
        group.add_member(current_action="CREATING", instance_status=None)
        wait_for_events(process, events, commits(size=3, steps=10), "training at size 3")

        # A spot reclaim: the VM's processes die and it leaves the group.
        victim = group.names()[0]
        victim_ip = group.member(victim).network_ip
        assert victim_ip is not None
        ((pid, _),) = worker_pids(process.pid, HOROVOD_HOSTNAME=victim_ip)
        os.kill(pid, signal.SIGKILL)
        group.remove_member(victim)
        output = job_output(process, JOB_TIMEOUT)

    assert process.returncode == 0, output[-4000:]
    recorded = read_events(events)
    done = recorded[-1]
    assert done["event"] == "done" and done["epochs"] == 8, recorded[-3:]
    sizes = [e["size"] for e in recorded if e["event"] == "commit"]
    assert sizes[0] == 2 and 3 in sizes and sizes[-1] == 2
    assert f"host {victim_ip} failed" in output or f"-{victim_ip}" in output, output[-4000:]
    # --scale-down-on-exit: a MIG has no minimum of its own, so 0.
    assert group.target_size == 0
    assert [r.query["size"] for r in fake.calls("instanceGroupManagers.resize")][-1] == "0"
