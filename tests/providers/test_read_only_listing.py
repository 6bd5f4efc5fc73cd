"""Listing a group never changes it, on every cloud (ARCHITECTURE: "Read paths never
change a group").

``spotring discover`` and a bare ``list_instances`` run against a group holding every
kind of member a listing could be tempted to act on: an evicted spot VM, a VM whose
creation failed, a stopped one, one still being created (no address yet, and on GCP no
VM at all). Each cloud's request log (the fakes' own, the fault proxy's in front of
moto) must then show reads only: no PUT, PATCH or DELETE, and a POST only where the
cloud's read is a POST (GCP's listManagedInstances, every Auto Scaling and EC2 query
action) or for a token. Replacing or resizing is the controller's decision
(tests/providers/test_azure_provider.py: ``--no-replace``, a plugin's answer).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from spotring.autoscaler.cli import main
from tests.fakes.aws import running_moto_server

WRITE_METHODS = frozenset({"PUT", "PATCH", "DELETE"})


def discover(capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    """``spotring discover`` in process; its host lines (exit status 0 asserted)."""
    capsys.readouterr()
    status = main(["discover", *args])
    out, err = capsys.readouterr()
    assert status == 0, err
    return sorted(out.split())


# -------------------------------------------------------------------------- Azure


@pytest.mark.parametrize("mode", ["Uniform", "Flexible"])
def test_azure_listing_sends_only_gets(capsys: pytest.CaptureFixture[str], mode: str) -> None:
    pytest.importorskip("azure.mgmt.compute", reason="the azure extra is not installed")
    from spotring.providers.azure import AzureProvider
    from tests.fakes.azure import FakeArm

    with FakeArm() as fake:
        vmss = fake.add_scale_set("workers", mode=mode, capacity=2, eviction_policy="Deallocate")
        vmss.auto_advance = False
        running = sorted(f"{m.private_ip}:1" for m in vmss.members)
        vmss.evict(vmss.add_member().key)
        failed = vmss.add_member(provisioning_state="Failed", power_state=None)
        vmss.set_member(failed.key, error_code="AllocationFailed")
        vmss.add_member(power_state="stopped")
        vmss.add_member(provisioning_state="Creating", power_state=None)
        fake.clear_requests()

        hosts = discover(
            capsys,
            "--provider", "azure", "--group", "workers", "--resource-group", "rg",
            "--subscription", fake.subscription, "--endpoint", fake.url,
        )  # fmt: skip
        provider = AzureProvider(
            "workers", resource_group="rg", subscription=fake.subscription, endpoint=fake.url
        )
        listed = {i.id: i for i in provider.list_instances()}

        assert hosts == running
        assert {r.method for r in fake.requests} == {"GET"}, [
            (r.method, r.api) for r in fake.requests if r.method != "GET"
        ]
        assert len(vmss.members) == 6 and vmss.capacity == 6
        assert sorted(i.failure for i in listed.values() if i.failure) == [
            "provisioning failed: AllocationFailed",
            "spot VM evicted (deallocated)",
        ]


# ---------------------------------------------------------------------------- GCP

GCP_READS = frozenset(
    {
        "oauth2.token",
        "instanceGroupManagers.get",
        "regionInstanceGroupManagers.get",
        # A POST in Compute's REST reference, but a read: "Lists all of the instances
        # in the managed instance group".
        "instanceGroupManagers.listManagedInstances",
        "regionInstanceGroupManagers.listManagedInstances",
        "instances.list",
    }
)


@pytest.mark.parametrize("where", ["zone", "region"])
def test_gcp_listing_sends_only_reads(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    where: str,
) -> None:
    pytest.importorskip("google.cloud.compute_v1", reason="the gcp extra is not installed")
    from spotring.providers.gcp import GcpProvider
    from tests.fakes.gcp import FakeCompute

    location = "us-central1-a" if where == "zone" else "us-central1"
    with FakeCompute() as fake:
        group = fake.add_group("workers", size=2, **{where: location})
        group.auto_advance = False
        running = sorted(f"{fake_ip}:1" for fake_ip in _gcp_addresses(group))
        group.add_member(current_action="CREATING", instance_status=None)  # no VM yet
        failed = group.add_member(current_action="CREATING", instance_status=None)
        group.set_member(failed.name, last_attempt_errors=["ZONE_RESOURCE_POOL_EXHAUSTED"])
        group.add_member(instance_status="STOPPED")
        group.preempt(group.add_member().name)
        credentials = fake.write_credentials(tmp_path / "adc.json")
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(credentials))
        fake.clear_requests()

        hosts = discover(
            capsys,
            "--provider", "gcp", "--group", "workers", f"--{where}", location,
            "--project", fake.project, "--endpoint", fake.url,
        )  # fmt: skip
        kwargs = {where: location}
        provider = GcpProvider("workers", project=fake.project, endpoint=fake.url, **kwargs)
        listed = provider.list_instances()

        assert hosts == running
        assert {r.api for r in fake.requests} <= GCP_READS, [r.api for r in fake.requests]
        assert not {r.method for r in fake.requests} & WRITE_METHODS
        assert len(group.members) == group.target_size == 6
        pending = [i for i in listed if i.state.value == "pending" and not i.address]
        assert len(pending) == 2, listed


def _gcp_addresses(group: object) -> list[str]:
    return [m.network_ip for m in group.members]  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------- AWS

AWS_READS = frozenset({"DescribeAutoScalingGroups", "DescribeInstances", "DescribeInstanceTypes"})


@pytest.fixture
def moto_server(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[str]:
    """A moto server on loopback, with fake credentials and nothing of this machine's."""
    pytest.importorskip("moto")
    for key in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    with running_moto_server() as url:
        yield url


def test_aws_listing_sends_only_describes(
    capsys: pytest.CaptureFixture[str], moto_server: str
) -> None:
    from spotring.providers.aws import AwsProvider
    from tests.fakes.aws import REGION, boto_session, create_group, moto_members, set_ec2_state
    from tests.fakes.fault_proxy import FaultProxy

    ids = create_group("workers", size=5, endpoint_url=moto_server)
    members = moto_members("workers")
    set_ec2_state(members[ids[1]], "stopped")
    members[ids[2]].health_status = "Unhealthy"
    set_ec2_state(members[ids[3]], "pending")
    members[ids[3]].instance.nics[0].private_ip_address = None  # not assigned yet
    set_ec2_state(members[ids[4]], "terminated")
    running = f"{members[ids[0]].instance.private_ip}:1"

    with FaultProxy(moto_server, flavour="aws") as proxy:
        hosts = discover(
            capsys,
            "--provider", "aws", "--group", "workers", "--region", REGION,
            "--endpoint-url", proxy.url,
        )  # fmt: skip
        provider = AwsProvider(
            "workers", region=REGION, endpoint_url=proxy.url, session=boto_session()
        )
        listed = {i.id: i for i in provider.list_instances()}
        log = proxy.log

    assert hosts == [running]
    assert {e.action for e in log} <= AWS_READS, [e.action for e in log]
    assert listed[ids[3]].state.value == "pending" and listed[ids[3]].address == ""
    assert [m["HealthStatus"] for m in _describe(moto_server)] == [
        "Healthy", "Healthy", "Unhealthy", "Healthy", "Healthy",
    ]  # fmt: skip


def _describe(endpoint: str) -> list[dict[str, str]]:
    from tests.fakes.aws import REGION, boto_session

    client = boto_session().client("autoscaling", region_name=REGION, endpoint_url=endpoint)
    group = client.describe_auto_scaling_groups(AutoScalingGroupNames=["workers"])
    return group["AutoScalingGroups"][0]["Instances"]
