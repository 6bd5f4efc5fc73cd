"""End to end: the ``spotring`` CLI with ``--provider aws`` against a moto server on loopback.

``spotring discover`` needs no Horovod: it checks the exact ``host:slots`` lines the
provider makes of a group. ``spotring run`` trains the digits example with local worker
processes standing in for the group's hosts, while the test scales the group up and
takes a member away, as AWS would.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from tests.e2e.support import (
    commits,
    job_output,
    read_events,
    running_job,
    wait_for_events,
    worker_pids,
)
from tests.fakes.aws import REGION, boto_session, create_group, moto_members, running_moto_server

SPOTRING = str(Path(sys.executable).with_name("spotring"))
JOB_TIMEOUT = 300


@pytest.fixture(scope="module")
def moto_url() -> Iterator[str]:
    with running_moto_server() as url:
        yield url


@pytest.fixture
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> dict[str, str]:
    """Fake credentials for this process and the CLI; nothing from this machine's AWS setup."""
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    fake = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_CONFIG_FILE": str(tmp_path / "aws-config"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "aws-credentials"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    for key, value in fake.items():
        monkeypatch.setenv(key, value)
    return dict(os.environ)


def client(service: str, url: str) -> Any:
    return boto_session().client(service, region_name=REGION, endpoint_url=url)


def aws_args(group: str, url: str) -> list[str]:
    return ["--provider", "aws", "--group", group, "--region", REGION, "--endpoint-url", url]


def run_argv(
    group: str, url: str, repo: Path, events: Path, epochs: int, *options: str
) -> list[str]:
    """``spotring run`` on ``group`` with local workers training the digits example."""
    return [
        *(SPOTRING, "run", *aws_args(group, url), "--launcher", "local"),
        *("--refresh-interval", "0.5", *options, "--"),
        *(sys.executable, str(repo / "examples" / "train_digits.py"), "--events", str(events)),
        *("--epochs", str(epochs), "--step-seconds", "0.1"),
    ]


def addresses(url: str, ids: list[str]) -> dict[str, str]:
    reservations = client("ec2", url).describe_instances(InstanceIds=ids)["Reservations"]
    return {i["InstanceId"]: i["PrivateIpAddress"] for r in reservations for i in r["Instances"]}


# ------------------------------------------------------------------------ discover


def test_discover_prints_ready_hosts_and_slots(moto_url: str, aws_env: dict[str, str]) -> None:
    ids = create_group("discover", size=4, instance_type="g4dn.12xlarge", endpoint_url=moto_url)
    client("ec2", moto_url).create_tags(
        Resources=[ids[1]], Tags=[{"Key": "spotring:slots", "Value": "2"}]
    )
    moto_members("discover")[ids[2]].lifecycle_state = "Pending:Wait"
    client("autoscaling", moto_url).set_instance_health(InstanceId=ids[3], HealthStatus="Unhealthy")
    ip = addresses(moto_url, ids)

    result = subprocess.run(
        [SPOTRING, "discover", *aws_args("discover", moto_url)],
        capture_output=True,
        text=True,
        env=aws_env,
        timeout=60,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{ip[ids[0]]}:4\n{ip[ids[1]]}:2\n"


def test_discover_slots_per_host_flag(moto_url: str, aws_env: dict[str, str]) -> None:
    ids = create_group("discover-flag", size=2, endpoint_url=moto_url)
    ip = addresses(moto_url, ids)

    result = subprocess.run(
        [SPOTRING, "discover", *aws_args("discover-flag", moto_url), "--slots-per-host", "3"],
        capture_output=True,
        text=True,
        env=aws_env,
        timeout=60,
        check=False,
    )

    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == sorted(f"{ip[i]}:3" for i in ids)


def test_discover_unknown_group_fails_with_one_line(moto_url: str, aws_env: dict[str, str]) -> None:
    result = subprocess.run(
        [SPOTRING, "discover", *aws_args("no-such-group", moto_url)],
        capture_output=True,
        text=True,
        env=aws_env,
        timeout=60,
        check=False,
    )

    assert result.returncode == 2
    assert result.stdout == "", "a failed listing prints no hosts"
    assert result.stderr.strip() == (
        "spotring discover: error: auto scaling group 'no-such-group' not found in region us-east-1"
    )


def test_run_on_an_unknown_group_exits_2_at_once_with_one_line(
    moto_url: str, aws_env: dict[str, str]
) -> None:
    began = time.monotonic()
    result = subprocess.run(
        [SPOTRING, "run", *aws_args("no-such-group", moto_url), "-np", "2", "--", "true"],
        capture_output=True,
        text=True,
        env=aws_env,
        timeout=120,
        check=False,
    )
    # Far below --start-timeout (120 s by default), with room for a busy machine.
    assert time.monotonic() - began < 60, "it waited for --start-timeout"
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "spotring run: error: auto scaling group 'no-such-group' not found in region us-east-1"
    )


def test_discover_without_group_or_credentials(moto_url: str, aws_env: dict[str, str]) -> None:
    no_group = subprocess.run(
        [SPOTRING, "discover", "--provider", "aws", "--region", REGION],
        capture_output=True,
        text=True,
        env=aws_env,
        timeout=60,
        check=False,
    )
    no_credentials = subprocess.run(
        [SPOTRING, "discover", *aws_args("discover", moto_url)],
        capture_output=True,
        text=True,
        env={k: v for k, v in aws_env.items() if not k.startswith("AWS_ACCESS_KEY_ID")},
        timeout=60,
        check=False,
    )

    assert no_group.returncode == 2
    assert "--group is required for --provider aws" in no_group.stderr
    assert no_credentials.returncode == 2 and no_credentials.stdout == ""
    assert "no AWS credentials" in no_credentials.stderr


# ----------------------------------------------------------------------------- run


@pytest.mark.e2e
def test_run_follows_the_group(
    repo: Path, tmp_path: Path, moto_url: str, aws_env: dict[str, str]
) -> None:
    ids = create_group("run", size=2, min_size=1, max_size=4, endpoint_url=moto_url)
    autoscaling = client("autoscaling", moto_url)
    events = tmp_path / "events.jsonl"
    with running_job(
        run_argv(
            "run",
            moto_url,
            repo,
            events,
            8,
            *("--scale-down-on-exit", "-np", "2", "--min-np", "1", "--max-np", "3"),
        ),
        cwd=tmp_path,
        env=aws_env,
    ) as process:
        wait_for_events(process, events, commits(size=2, steps=10), "training at size 2")
        # The group grows, as when someone raises its desired capacity.
        autoscaling.set_desired_capacity(AutoScalingGroupName="run", DesiredCapacity=3)
        wait_for_events(process, events, commits(size=3, steps=10), "training at size 3")

        # A spot interruption: the host's processes die and the group drops it.
        victim = ids[0]
        victim_ip = addresses(moto_url, [victim])[victim]
        ((pid, _),) = worker_pids(process.pid, HOROVOD_HOSTNAME=victim_ip)
        os.kill(pid, signal.SIGKILL)
        autoscaling.terminate_instance_in_auto_scaling_group(
            InstanceId=victim, ShouldDecrementDesiredCapacity=True
        )
        output = job_output(process, JOB_TIMEOUT)

    assert process.returncode == 0, output[-4000:]
    recorded = read_events(events)
    done = recorded[-1]
    assert done["event"] == "done" and done["epochs"] == 8, recorded[-3:]
    assert done["size"] == 2
    sizes = [e["size"] for e in recorded if e["event"] == "commit"]
    assert sizes[0] == 2 and 3 in sizes and sizes[-1] == 2
    assert f"host {victim_ip} failed" in output or f"-{victim_ip}" in output, output[-4000:]
    # --scale-down-on-exit: the group is back at its MinSize.
    group = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=["run"])
    assert group["AutoScalingGroups"][0]["DesiredCapacity"] == 1


@pytest.mark.e2e
def test_a_group_deleted_mid_run_stops_the_job_with_one_line(
    repo: Path, tmp_path: Path, moto_url: str, aws_env: dict[str, str]
) -> None:
    create_group("doomed", size=2, min_size=1, max_size=4, endpoint_url=moto_url)
    events = tmp_path / "events.jsonl"
    with running_job(
        run_argv("doomed", moto_url, repo, events, 50, "-np", "2"),
        cwd=tmp_path,
        env=aws_env,
    ) as process:
        wait_for_events(process, events, commits(size=2, steps=5), "training at size 2")
        workers = [pid for pid, _ in worker_pids(process.pid)]
        client("autoscaling", moto_url).delete_auto_scaling_group(
            AutoScalingGroupName="doomed", ForceDelete=True
        )
        output = job_output(process, 60)

    assert process.returncode == 2, output[-4000:]
    failures = [line for line in output.splitlines() if line.startswith("spotring run:")]
    assert failures == [
        "spotring run: job failed: auto scaling group 'doomed' not found in region us-east-1"
    ]
    assert "Traceback" not in output
    assert workers and not [pid for pid in workers if psutil.pid_exists(pid)]


@pytest.mark.e2e
def test_a_signal_stops_the_job_and_still_scales_the_group_down(
    repo: Path, tmp_path: Path, moto_url: str, aws_env: dict[str, str]
) -> None:
    """SIGTERM (a scheduler's stop): every worker stopped, exit 130, and
    --scale-down-on-exit still shrinks the group to its MinSize."""
    create_group("stopped", size=2, min_size=1, max_size=4, endpoint_url=moto_url)
    events = tmp_path / "events.jsonl"
    with running_job(
        run_argv("stopped", moto_url, repo, events, 50, "--scale-down-on-exit", "-np", "2"),
        cwd=tmp_path,
        env=aws_env,
    ) as process:
        wait_for_events(process, events, commits(size=2, steps=3), "training at size 2")
        workers = [psutil.Process(pid) for pid, _ in worker_pids(process.pid)]
        process.send_signal(signal.SIGTERM)
        output = job_output(process, 30)

    assert process.returncode == 130, output[-4000:]
    assert output.rstrip().endswith("spotring: interrupted") and "Traceback" not in output
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert workers and not [w for w in alive if w.status() != psutil.STATUS_ZOMBIE]
    group = client("autoscaling", moto_url).describe_auto_scaling_groups(
        AutoScalingGroupNames=["stopped"]
    )
    assert group["AutoScalingGroups"][0]["DesiredCapacity"] == 1
