"""End to end: the ``spotring`` CLI with ``--provider azure`` against the fake ARM server.

``spotring run`` trains the digits example with local worker processes standing in for
the scale set's VMs while the test adds a VM and evicts one, in both orchestration
modes. The fake listens on plain HTTP on loopback, where the provider sends no
credentials (azure-core never sends a bearer token over HTTP).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("azure.mgmt.compute", reason="the azure extra is not installed")

from tests.e2e.support import (
    commits,
    job_output,
    read_events,
    running_job,
    wait_for_events,
    worker_pids,
)
from tests.fakes.azure import FakeArm

SPOTRING = str(Path(sys.executable).with_name("spotring"))
RG = "rg"
JOB_TIMEOUT = 300


@pytest.fixture
def fake() -> Iterator[FakeArm]:
    with FakeArm() as server:
        yield server


@pytest.fixture
def azure_env(tmp_path: Path) -> dict[str, str]:
    """Nothing from this machine's Azure set-up."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AZURE_")}
    env["AZURE_CONFIG_DIR"] = str(tmp_path / "azure")
    return env


def azure_args(fake: FakeArm, group: str) -> list[str]:
    return [
        *("--provider", "azure", "--group", group, "--resource-group", RG),
        *("--subscription", fake.subscription, "--endpoint", fake.url),
    ]


def spotring(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [SPOTRING, *argv], capture_output=True, text=True, env=env, timeout=120, check=False
    )


def test_providers_lists_all_four(azure_env: dict[str, str]) -> None:
    result = spotring("providers", env=azure_env)
    names = [line.split()[0] for line in result.stdout.splitlines()]
    assert {"local", "aws", "gcp", "azure"} <= set(names), result.stdout


@pytest.mark.parametrize("mode", ["Uniform", "Flexible"])
def test_discover_prints_ready_hosts_and_slots(
    fake: FakeArm, azure_env: dict[str, str], mode: str
) -> None:
    vmss = fake.add_scale_set("discover", mode=mode, capacity=3, vm_size="Standard_NC64as_T4_v3")
    first = vmss.members[0]
    vmss.set_member(first.key, power_state="starting")
    vmss.auto_advance = False

    result = spotring("discover", *azure_args(fake, "discover"), env=azure_env)

    assert result.returncode == 0, result.stderr
    expected = sorted(f"{m.private_ip}:4" for m in vmss.members if m is not first)
    assert sorted(result.stdout.splitlines()) == expected


def test_errors_are_one_line_and_exit_2(fake: FakeArm, azure_env: dict[str, str]) -> None:
    fake.add_scale_set("workers", capacity=1)
    missing = spotring("discover", *azure_args(fake, "missing"), env=azure_env)
    fake.deny("Microsoft.Compute/virtualMachineScaleSets/read")
    denied = spotring("discover", *azure_args(fake, "workers"), env=azure_env)

    assert (missing.returncode, missing.stdout) == (2, "")
    assert missing.stderr == (
        "spotring discover: error: scale set 'missing' not found in resource group 'rg'\n"
    )
    assert denied.returncode == 2 and len(denied.stderr.splitlines()) == 1
    assert denied.stderr.startswith(
        "spotring discover: error: Azure denied Microsoft.Compute/virtualMachineScaleSets/read"
    )


def test_no_credentials_is_one_line(azure_env: dict[str, str]) -> None:
    env = dict(azure_env, AZURE_TOKEN_CREDENTIALS="EnvironmentCredential")
    result = spotring(
        "discover",
        *("--provider", "azure", "--group", "g", "--resource-group", RG),
        *("--subscription", "00000000-0000-0000-0000-000000000000"),
        env=env,
    )

    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("spotring discover: error: no usable Azure credentials")
    assert len(result.stderr.splitlines()) == 1


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["Uniform", "Flexible"])
def test_run_follows_the_scale_set(
    repo: Path, tmp_path: Path, fake: FakeArm, azure_env: dict[str, str], mode: str
) -> None:
    vmss = fake.add_scale_set("run", mode=mode, capacity=2, eviction_policy="Delete")
    events = tmp_path / "events.jsonl"
    argv = [
        *(SPOTRING, "run", *azure_args(fake, "run"), "--launcher", "local"),
        *("--refresh-interval", "0.5", "--scale-down-on-exit"),
        *("-np", "2", "--min-np", "1", "--max-np", "3", "--"),
        *(sys.executable, str(repo / "examples" / "train_digits.py"), "--events", str(events)),
        *("--epochs", "8", "--step-seconds", "0.1"),
    ]
    with running_job(argv, cwd=tmp_path, env=azure_env) as process:
        wait_for_events(process, events, commits(size=2, steps=10), "training at size 2")
        # A VM joins: Creating -> Succeeded -> running.
        vmss.add_member(provisioning_state="Creating", power_state=None)
        wait_for_events(process, events, commits(size=3, steps=10), "training at size 3")

        # A spot eviction (policy Delete): the VM's processes die and it leaves the set.
        victim = vmss.members[0]
        victim_ip = victim.private_ip
        ((pid, _),) = worker_pids(process.pid, HOROVOD_HOSTNAME=victim_ip)
        os.kill(pid, signal.SIGKILL)
        vmss.evict(victim.key)
        output = job_output(process, JOB_TIMEOUT)

    assert process.returncode == 0, output[-4000:]
    recorded = read_events(events)
    done = recorded[-1]
    assert done["event"] == "done" and done["epochs"] == 8, recorded[-3:]
    sizes = [e["size"] for e in recorded if e["event"] == "commit"]
    assert sizes[0] == 2 and 3 in sizes
    assert f"host {victim_ip} failed" in output or f"-{victim_ip}" in output, output[-4000:]
    # --scale-down-on-exit: a scale set has no minimum of its own, so 0.
    assert fake.calls("virtualMachineScaleSets.update")[-1].body == {"sku": {"capacity": 0}}
