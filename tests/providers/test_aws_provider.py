"""The AWS provider against moto 5 in process, injected API errors, and a fast fake API."""

from __future__ import annotations

import argparse
import logging
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.retries.standard import ExponentialBackoff
from moto import mock_aws

from spotring.autoscaler.plugins import get_plugin_manager, provider_registry
from spotring.providers.aws import (
    DESCRIBE_INSTANCES_BATCH,
    IAM_ACTIONS,
    LIFECYCLE_STATE_MAP,
    AwsProvider,
    prices,
)
from spotring.providers.base import (
    ConfigurationError,
    CoreOptions,
    InstanceState,
    InterruptionNotice,
    Lifecycle,
    ProviderError,
)
from spotring.providers.conformance import ProviderContract
from tests.fakes.aws import (
    REGION,
    FakeGroupApi,
    boto_session,
    capture_params,
    count_operations,
    create_group,
    forget_ec2_instance,
    inject_errors,
    make_ipv6_only,
    moto_members,
    set_ec2_state,
)
from tests.fakes.prices import AwsPriceList, ec2_product

SECRET = "wJalrXUtnFEMI-spotring-test-secret"

P, R, D, T, G = (
    InstanceState.PENDING,
    InstanceState.READY,
    InstanceState.DRAINING,
    InstanceState.TERMINATING,
    InstanceState.GONE,
)

# Written out by hand, not derived from the provider's map, so a changed mapping fails here.
EXPECTED_LIFECYCLE = {
    "Pending": P,
    "Pending:Wait": P,
    "Pending:Proceed": P,
    "Quarantined": P,
    "InService": R,
    "Terminating": T,
    "Terminating:Wait": T,
    "Terminating:Proceed": T,
    "Terminating:Retained": T,
    "Terminated": G,
    "Detaching": D,
    "Detached": G,
    "EnteringStandby": D,
    "Standby": D,
    "ReplacingRootVolume": D,
    "ReplacingRootVolume:Wait": D,
    "ReplacingRootVolume:Proceed": D,
    "RootVolumeReplaced": P,
    "Warmed:Pending": P,
    "Warmed:Pending:Wait": P,
    "Warmed:Pending:Proceed": P,
    "Warmed:Pending:Retained": P,
    "Warmed:Terminating": T,
    "Warmed:Terminating:Wait": T,
    "Warmed:Terminating:Proceed": T,
    "Warmed:Terminating:Retained": T,
    "Warmed:Terminated": G,
    "Warmed:Stopped": P,
    "Warmed:Running": P,
    "Warmed:Hibernated": P,
}


@pytest.fixture(autouse=True)
def aws_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Fake credentials, and nothing read from this machine's AWS setup or IMDS."""
    for key in [k for k in list(__import__("os").environ) if k.startswith("AWS_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def moto(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    # moto rebuilds its 2,600 default AMIs on every reset (0.7 s); the tests need none.
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    with mock_aws():
        yield


@pytest.fixture
def backoffs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """botocore's retry backoff, made instant; lists the attempt numbers it delayed."""
    delays: list[int] = []

    def delay_amount(self: ExponentialBackoff, context: object) -> float:
        delays.append(context.attempt_number)  # type: ignore[attr-defined]
        return 0.0

    monkeypatch.setattr(ExponentialBackoff, "delay_amount", delay_amount)
    return delays


@pytest.fixture
def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def make_provider(group: str = "workers", **kwargs: object) -> AwsProvider:
    """An AwsProvider on the tests' shared botocore session."""
    kwargs.setdefault("region", REGION)
    kwargs.setdefault("session", boto_session())
    return AwsProvider(group, **kwargs)  # type: ignore[arg-type]


def client(service: str) -> Any:
    return boto_session().client(service, region_name=REGION)


def desired_capacity(group: str = "workers") -> int:
    record = client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[group])
    return record["AutoScalingGroups"][0]["DesiredCapacity"]


# ----------------------------------------------------------------- conformance


class TestAwsContract(ProviderContract):
    @pytest.fixture
    def provider(self, moto: None) -> Iterator[AwsProvider]:
        create_group(size=3, max_size=6)
        provider = make_provider()
        yield provider
        provider.close()

    @pytest.fixture
    def failing_provider(self, closed_port: int) -> AwsProvider:
        return make_provider(endpoint_url=f"http://127.0.0.1:{closed_port}", max_api_attempts=1)


def test_unreachable_endpoint_is_retryable_and_named(closed_port: int) -> None:
    provider = make_provider(endpoint_url=f"http://127.0.0.1:{closed_port}", max_api_attempts=1)
    with pytest.raises(ProviderError) as caught:
        provider.list_instances()
    assert not isinstance(caught.value, ConfigurationError)
    assert caught.value.retryable
    assert f"127.0.0.1:{closed_port}" in str(caught.value)
    assert provider.api_calls == 1


# --------------------------------------------------------------- state mapping


def test_every_lifecycle_state_the_api_defines_is_mapped() -> None:
    model = client("autoscaling").meta.service_model
    defined = set(model.shape_for("LifecycleState").enum)
    assert defined <= set(LIFECYCLE_STATE_MAP), defined - set(LIFECYCLE_STATE_MAP)
    assert defined <= set(EXPECTED_LIFECYCLE)


def test_lifecycle_states_map_as_listed(moto: None) -> None:
    states = sorted(EXPECTED_LIFECYCLE)
    ids = create_group(size=len(states), max_size=len(states))
    members = moto_members("workers")
    for instance_id, state in zip(ids, states, strict=True):
        members[instance_id].lifecycle_state = state

    listed = {i.id: i for i in make_provider().list_instances()}

    assert len(listed) == len(states)
    for instance_id, state in zip(ids, states, strict=True):
        instance = listed[instance_id]
        assert instance.state is EXPECTED_LIFECYCLE[state], state
        assert instance.cloud_state == f"{state}/Healthy/running"
        assert instance.is_ready == (state == "InService")


COMBINED = [
    # (LifecycleState, HealthStatus, EC2 state) -> state: the least usable view wins
    ("InService", "Healthy", "pending", P),
    ("InService", "Healthy", "running", R),
    ("InService", "Healthy", "shutting-down", T),
    ("InService", "Healthy", "terminated", G),
    ("InService", "Healthy", "stopping", T),
    ("InService", "Healthy", "stopped", T),
    ("InService", "Unhealthy", "running", D),
    ("Pending", "Unhealthy", "pending", D),
    ("Terminating", "Unhealthy", "running", T),
    ("Pending", "Healthy", "running", P),
    ("Standby", "Healthy", "stopped", T),
    ("Some:FutureState", "Healthy", "running", P),
]


def test_group_health_and_ec2_state_combine(moto: None) -> None:
    ids = create_group(size=len(COMBINED), max_size=len(COMBINED))
    members = moto_members("workers")
    for instance_id, (lifecycle_state, health, ec2_state, _) in zip(ids, COMBINED, strict=True):
        members[instance_id].lifecycle_state = lifecycle_state
        members[instance_id].health_status = health
        set_ec2_state(members[instance_id], ec2_state)

    listed = {i.id: i for i in make_provider().list_instances()}

    for instance_id, row in zip(ids, COMBINED, strict=True):
        lifecycle_state, health, ec2_state, expected = row
        instance = listed[instance_id]
        assert instance.state is expected, (lifecycle_state, health, ec2_state)
        assert instance.cloud_state == f"{lifecycle_state}/{health}/{ec2_state}"


def test_member_missing_from_ec2_is_gone(moto: None) -> None:
    ids = create_group(size=3)
    forget_ec2_instance(ids[1])

    listed = {i.id: i for i in make_provider().list_instances()}

    assert set(listed) == set(ids), "a member the group lists is reported, not dropped"
    assert listed[ids[1]].state is G
    assert listed[ids[1]].cloud_state == "InService/Healthy/missing"
    assert [listed[i].state for i in (ids[0], ids[2])] == [R, R]


@pytest.mark.parametrize("odd", ["ipv6-only", "no LifecycleState", "no HealthStatus",
                                 "no State.Name", "a tag without its Value"])  # fmt: skip
def test_one_odd_member_costs_only_itself(
    moto: None, caplog: pytest.LogCaptureFixture, odd: str
) -> None:
    """A member lacking what a usable host has is listed as not usable, with one
    warning while it stays so; the others are listed as ever."""
    ids = create_group(size=3)
    member = moto_members("workers")[ids[0]]
    if odd == "ipv6-only":
        make_ipv6_only(member)
    elif odd == "no LifecycleState":
        member.lifecycle_state = None
    elif odd == "no HealthStatus":
        member.health_status = None
    elif odd == "no State.Name":
        member.instance._state.name = None
    else:  # moto refuses such a tag through its API: put it in its records
        member.instance.ec2_backend.tags[ids[0]]["spotring:slots"] = None
    provider = make_provider()

    with caplog.at_level(logging.INFO, logger="spotring.providers.aws"):
        for _ in range(3):
            listed = {i.id: i for i in provider.list_instances()}
            assert listed[ids[0]].state is P and not listed[ids[0]].address
            assert [listed[i].state for i in ids[1:]] == [R, R]
            assert all(listed[i].address for i in ids[1:])
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, warnings
        assert f"member {ids[0]} is listed as pending, not usable" in warnings[0]

        fresh = moto_members("workers")[ids[0]]  # whole again
        fresh.instance.__class__ = type(moto_members("workers")[ids[1]].instance)
        fresh.lifecycle_state, fresh.health_status = "InService", "Healthy"
        set_ec2_state(fresh, "running")
        fresh.instance.ec2_backend.tags[ids[0]].pop("spotring:slots", None)
        assert {i.id: i for i in provider.list_instances()}[ids[0]].state is R
    assert f"group workers member {ids[0]}: resolved" in caplog.text


def test_pending_member_becomes_ready(moto: None) -> None:
    ids = create_group(size=2)
    member = moto_members("workers")[ids[0]]
    member.lifecycle_state = "Pending:Wait"
    set_ec2_state(member, "pending")
    provider = make_provider()

    first = {i.id: i for i in provider.list_instances()}
    member.lifecycle_state = "InService"
    set_ec2_state(member, "running")
    second = {i.id: i for i in provider.list_instances()}

    assert first[ids[0]].state is P and not first[ids[0]].is_ready
    assert second[ids[0]].state is R and second[ids[0]].is_ready
    assert re.fullmatch(r"\d+\.\d+\.\d+\.\d+", second[ids[0]].address)


def test_scaled_up_member_appears(moto: None) -> None:
    ids = create_group(size=2, max_size=4)
    provider = make_provider()
    provider.list_instances()

    provider.set_target_size(3)
    listed = provider.list_instances()

    assert len(listed) == 3 and set(ids) < {i.id for i in listed}


def test_terminating_member_leaves(moto: None) -> None:
    ids = create_group(size=3)
    provider = make_provider()
    moto_members("workers")[ids[0]].lifecycle_state = "Terminating:Wait"

    during = {i.id: i for i in provider.list_instances()}
    client("autoscaling").terminate_instance_in_auto_scaling_group(
        InstanceId=ids[0], ShouldDecrementDesiredCapacity=True
    )
    after = {i.id: i for i in provider.list_instances()}

    assert during[ids[0]].state is T
    assert set(after) == set(ids[1:])
    assert all(i.state is R for i in after.values())


def test_instance_fields(moto: None) -> None:
    ids = create_group(size=1, instance_type="t3.micro")
    (instance,) = make_provider().list_instances()
    assert instance.id == ids[0]
    assert instance.zone == f"{REGION}a"
    assert instance.instance_type == "t3.micro"
    assert instance.launch_time is not None and instance.launch_time > 1.5e9
    assert instance.labels["aws:autoscaling:groupName"] == "workers"
    assert instance.lifecycle is Lifecycle.ON_DEMAND


# -------------------------------------------------------------------- spot filter


def test_spot_only_keeps_spot_members_of_a_mixed_group(moto: None) -> None:
    ec2 = client("ec2")
    ec2.create_launch_template(
        LaunchTemplateName="mixed-template",
        LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "t3.micro"},
    )
    autoscaling = client("autoscaling")
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName="mixed",
        MinSize=0,
        MaxSize=8,
        DesiredCapacity=4,
        AvailabilityZones=[f"{REGION}a"],
        MixedInstancesPolicy={
            "LaunchTemplate": {
                "LaunchTemplateSpecification": {"LaunchTemplateName": "mixed-template"},
                "Overrides": [{"InstanceType": "t3.micro"}, {"InstanceType": "t3.small"}],
            },
            "InstancesDistribution": {
                "OnDemandBaseCapacity": 1,
                "OnDemandPercentageAboveBaseCapacity": 0,
            },
        },
    )
    members = moto_members("mixed")
    # moto launches every member on demand; AWS would launch three of them as spot.
    spot = sorted(members)[1:]
    for instance_id in spot:
        members[instance_id].instance.lifecycle = "spot"

    everyone = make_provider("mixed").list_instances()
    spot_only = make_provider("mixed", spot_only=True).list_instances()

    assert len(everyone) == 4
    assert {i.id for i in everyone if i.lifecycle is Lifecycle.SPOT} == set(spot)
    assert sorted(i.id for i in spot_only) == spot
    assert all(i.lifecycle is Lifecycle.SPOT and i.state is R for i in spot_only)


# -------------------------------------------------------------------------- slots


def test_slots_from_gpu_count_cached_per_type(moto: None) -> None:
    create_group(size=2, instance_type="g4dn.12xlarge")  # 4 x T4
    provider = make_provider()
    ops = count_operations(provider.ec2)

    first = provider.list_instances()
    second = provider.list_instances()

    assert [i.slots for i in first + second] == [4] * 4
    assert ops["ec2:DescribeInstanceTypes"] == 1
    assert provider.last_refresh_calls == 1  # steady group: the group record only


def test_unknown_instance_type_counts_one_slot(moto: None) -> None:
    ids = create_group(size=2, instance_type="g4dn.12xlarge")
    # A type EC2 does not describe (moto skips instance type validation) fails the
    # batch lookup; the provider then asks for each type alone.
    moto_members("workers")[ids[1]].instance.instance_type = "x9.unknown"
    provider = make_provider()
    ops = count_operations(provider.ec2)

    first = {i.id: i.slots for i in provider.list_instances()}
    second = {i.id: i.slots for i in provider.list_instances()}

    assert first == second == {ids[0]: 4, ids[1]: 1}
    assert ops["ec2:DescribeInstanceTypes"] == 3


def test_slots_without_gpus_is_one(moto: None) -> None:
    create_group(size=2, instance_type="t3.micro")
    assert [i.slots for i in make_provider().list_instances()] == [1, 1]


def test_slots_from_tag_then_gpus(moto: None) -> None:
    ids = create_group(size=3, instance_type="g4dn.12xlarge")
    ec2 = client("ec2")
    ec2.create_tags(Resources=[ids[0]], Tags=[{"Key": "spotring:slots", "Value": "2"}])
    ec2.create_tags(Resources=[ids[1]], Tags=[{"Key": "spotring:slots", "Value": "zero"}])

    listed = {i.id: i.slots for i in make_provider().list_instances()}

    assert listed == {ids[0]: 2, ids[1]: 4, ids[2]: 4}


def test_slots_tag_name_is_an_option(moto: None) -> None:
    ids = create_group(size=2)
    ec2 = client("ec2")
    ec2.create_tags(Resources=ids, Tags=[{"Key": "gpus", "Value": "8"}])
    provider = make_provider(slots_tag="gpus")
    ops = count_operations(provider.ec2)

    assert [i.slots for i in provider.list_instances()] == [8, 8]
    assert ops["ec2:DescribeInstanceTypes"] == 0, "tagged hosts need no type lookup"


def test_slots_per_host_flag_wins(moto: None) -> None:
    ids = create_group(size=2, instance_type="g4dn.12xlarge")
    ec2 = client("ec2")
    ec2.create_tags(Resources=ids[:1], Tags=[{"Key": "spotring:slots", "Value": "2"}])
    provider = make_provider(slots_per_host=3)
    ops = count_operations(provider.ec2)

    assert [i.slots for i in provider.list_instances()] == [3, 3]
    assert ops["ec2:DescribeInstanceTypes"] == 0


# ------------------------------------------------------------ scale and API cost


def test_thousand_member_group_costs_bounded_calls() -> None:
    api = FakeGroupApi("big", 1000, instance_type="p3.8xlarge")
    provider = make_provider("big")
    provider.autoscaling, provider.ec2 = api.autoscaling, api.ec2

    first = provider.list_instances()
    first_calls = provider.last_refresh_calls
    second = provider.list_instances()

    batches = -(-1000 // DESCRIBE_INSTANCES_BATCH)
    assert len(first) == len(second) == 1000
    assert len({i.id for i in first}) == 1000
    assert all(i.is_ready and i.slots == 4 and i.lifecycle is Lifecycle.SPOT for i in first)
    assert first_calls == 1 + batches + 1  # + the one DescribeInstanceTypes
    assert provider.last_refresh_calls == 1  # all running: only the group record
    assert provider.api_calls == first_calls + 1
    assert api.calls["describe_instance_types"] == 1
    assert max(api.filter_sizes) <= 200


def test_short_pages_are_followed() -> None:
    api = FakeGroupApi("big", 450)
    api.page_limit = 150  # EC2 may return fewer than MaxResults per page
    provider = make_provider("big", slots_per_host=1)
    provider.autoscaling, provider.ec2 = api.autoscaling, api.ec2

    listed = provider.list_instances()

    assert len({i.id for i in listed}) == 450 and all(i.is_ready for i in listed)
    # batches of 200, 200, 50 -> pages 2 + 2 + 1
    assert api.calls["describe_instances"] == 5
    assert provider.last_refresh_calls == 6


def test_refresh_logs_its_cost(moto: None, caplog: pytest.LogCaptureFixture) -> None:
    create_group(size=2)
    provider = make_provider()
    with caplog.at_level(logging.DEBUG, logger="spotring.providers.aws"):
        provider.list_instances()
    assert "aws refresh: 2 instances, 3 API calls" in caplog.text


# ------------------------------------------------------------------------ retries


def test_throttling_and_5xx_are_retried(moto: None, backoffs: list[int]) -> None:
    create_group(size=2)
    provider = make_provider(max_api_attempts=4)
    asg_errors = inject_errors(
        provider.autoscaling, "DescribeAutoScalingGroups", 400, "Throttling", times=2
    )
    ec2_errors = inject_errors(
        provider.ec2, "DescribeInstances", 503, "RequestLimitExceeded", times=1
    )
    type_errors = inject_errors(
        provider.ec2, "DescribeInstanceTypes", 500, "InternalError", times=1
    )

    listed = provider.list_instances()

    assert len(listed) == 2 and all(i.is_ready for i in listed)
    assert (asg_errors(), ec2_errors(), type_errors()) == (2, 1, 1)
    assert provider.api_retries == 4
    assert provider.last_refresh_calls == 3
    assert backoffs == [1, 2, 1, 1]


@pytest.mark.parametrize(
    ("client", "operation", "status", "code"),
    [
        ("autoscaling", "DescribeAutoScalingGroups", 400, "Throttling"),
        ("ec2", "DescribeInstances", 503, "RequestLimitExceeded"),
        ("ec2", "DescribeInstances", 500, "InternalError"),
    ],
)
def test_persistent_throttling_raises_retryable_error(
    moto: None, backoffs: list[int], client: str, operation: str, status: int, code: str
) -> None:
    create_group(size=2)
    provider = make_provider(max_api_attempts=3)
    injected = inject_errors(getattr(provider, client), operation, status, code)

    with pytest.raises(ProviderError) as caught:
        provider.list_instances()

    assert not isinstance(caught.value, ConfigurationError)
    assert caught.value.retryable
    assert code in str(caught.value) and operation in str(caught.value)
    assert injected() == 3


# ------------------------------------------------------------- configuration errors


def test_missing_group_is_a_one_line_configuration_error(moto: None) -> None:
    create_group(size=1)
    provider = make_provider("nope")
    for attempt in (provider.list_instances, lambda: provider.set_target_size(1)):
        with pytest.raises(ConfigurationError) as caught:
            attempt()
        assert str(caught.value) == "auto scaling group 'nope' not found in region us-east-1"
        assert not caught.value.retryable


def test_no_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(ConfigurationError) as caught:
        AwsProvider("workers", region=REGION).list_instances()
    assert str(caught.value) == (
        "no AWS credentials: set AWS_PROFILE / AWS_ACCESS_KEY_ID or use an instance role"
    )


@pytest.mark.parametrize(
    ("client", "operation", "status", "code", "expected"),
    [
        (
            "autoscaling",
            "DescribeAutoScalingGroups",
            403,
            "AccessDenied",
            "AWS denied autoscaling:DescribeAutoScalingGroups (AccessDenied)",
        ),
        (
            "ec2",
            "DescribeInstances",
            403,
            "UnauthorizedOperation",
            "AWS denied ec2:DescribeInstances (UnauthorizedOperation)",
        ),
        (
            "ec2",
            "DescribeInstanceTypes",
            403,
            "UnauthorizedOperation",
            "AWS denied ec2:DescribeInstanceTypes (UnauthorizedOperation)",
        ),
        (
            "autoscaling",
            "DescribeAutoScalingGroups",
            403,
            "InvalidClientTokenId",
            "AWS rejected the credentials (InvalidClientTokenId)",
        ),
        ("ec2", "DescribeInstances", 401, "AuthFailure", "AWS rejected the credentials"),
        (
            "autoscaling",
            "DescribeAutoScalingGroups",
            403,
            "ExpiredToken",
            "AWS credentials have expired (ExpiredToken)",
        ),
    ],
)
def test_permission_and_credential_errors_name_the_fix(
    moto: None, client: str, operation: str, status: int, code: str, expected: str
) -> None:
    create_group(size=1)
    provider = make_provider()
    inject_errors(getattr(provider, client), operation, status, code)

    with pytest.raises(ConfigurationError) as caught:
        provider.list_instances()

    assert str(caught.value).startswith(expected)
    assert "\n" not in str(caught.value)
    assert provider.api_retries == 0, "a permission error is not retried"


def test_errors_and_logs_carry_no_secret(caplog: pytest.LogCaptureFixture) -> None:
    provider = AwsProvider("workers", region=REGION)
    inject_errors(provider.autoscaling, "DescribeAutoScalingGroups", 403, "SignatureDoesNotMatch")
    with caplog.at_level(logging.DEBUG), pytest.raises(ConfigurationError) as caught:
        provider.list_instances()
    assert "SignatureDoesNotMatch" in str(caught.value)
    assert SECRET not in str(caught.value) and SECRET not in caplog.text


def test_unknown_profile_and_missing_region(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigurationError, match="AWS profile 'nope' not found"):
        AwsProvider("workers", profile="nope")
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    with pytest.raises(ConfigurationError, match="no AWS region: pass --region"):
        AwsProvider("workers")


# ------------------------------------------------------------------------ steering


def test_set_target_size_is_idempotent_and_within_limits(moto: None) -> None:
    create_group(size=2, min_size=1, max_size=4)
    provider = make_provider()
    provider.list_instances()
    sent = capture_params(provider.autoscaling, "SetDesiredCapacity")

    assert provider.size_limits() == (1, 4)
    provider.set_target_size(2)  # the group already wants 2
    provider.set_target_size(3)
    provider.set_target_size(3)

    assert sent == [
        {"AutoScalingGroupName": "workers", "DesiredCapacity": 3, "HonorCooldown": False}
    ]
    assert desired_capacity() == 3
    assert len(provider.list_instances()) == 3
    with pytest.raises(ConfigurationError, match="MaxSize=4"):
        provider.set_target_size(5)
    with pytest.raises(ConfigurationError, match="MinSize=1"):
        provider.set_target_size(0)
    assert len(sent) == 1


def test_replace_instance_marks_unhealthy_once(moto: None) -> None:
    ids = create_group(size=3)
    provider = make_provider()
    sent = capture_params(provider.autoscaling, "SetInstanceHealth")

    provider.replace_instance(ids[0])
    provider.replace_instance(ids[0])
    listed = {i.id: i for i in provider.list_instances()}

    assert sent == [
        {"InstanceId": ids[0], "HealthStatus": "Unhealthy", "ShouldRespectGracePeriod": False}
    ]
    assert listed[ids[0]].state is D
    assert listed[ids[0]].cloud_state == "InService/Unhealthy/running"


def test_replace_instance_gone_or_foreign_is_a_no_op(moto: None) -> None:
    ids = create_group(size=3)
    create_group("other", size=1)
    (foreign,) = moto_members("other")
    client("autoscaling").terminate_instance_in_auto_scaling_group(
        InstanceId=ids[0], ShouldDecrementDesiredCapacity=True
    )
    moto_members("workers")[ids[1]].lifecycle_state = "Terminating"
    provider = make_provider()
    sent = capture_params(provider.autoscaling, "SetInstanceHealth")

    provider.replace_instance(ids[0])  # left the group
    provider.replace_instance(ids[1])  # already terminating
    provider.replace_instance(foreign)  # another group's
    provider.replace_instance("i-0123456789abcdef0")  # never existed

    assert sent == []
    assert moto_members("other")[foreign].health_status == "Healthy"


def test_scale_down_on_exit(moto: None) -> None:
    create_group(size=3, min_size=1)
    provider = make_provider(scale_down_on_exit=True)
    provider.list_instances()

    provider.job_finished()

    assert desired_capacity() == 1


def test_no_scale_down_without_the_flag(moto: None) -> None:
    create_group(size=3, min_size=1)
    provider = make_provider()
    ops = count_operations(provider.autoscaling)

    provider.job_finished()

    assert desired_capacity() == 3
    assert sum(ops.values()) == 0


# ------------------------------------------------------------ options and plugin


def test_options_build_the_provider() -> None:
    parser = argparse.ArgumentParser()
    AwsProvider.add_arguments(parser.add_argument_group("aws provider options"))
    options = parser.parse_args(
        [
            *("--group", "g", "--region", "eu-west-1"),
            *("--endpoint-url", "http://127.0.0.1:5000", "--spot-only", "--slots-tag", "gpus"),
            *("--scale-down-on-exit", "--max-api-attempts", "2"),
        ]
    )
    provider = AwsProvider.from_options(options, CoreOptions(slots_per_host=2))

    assert (provider.group, provider.region) == ("g", "eu-west-1")
    assert provider.spot_only and provider.scale_down_on_exit
    assert (provider.slots_per_host, provider.slots.label) == (2, "gpus")
    assert provider.ec2.meta.endpoint_url == "http://127.0.0.1:5000"
    assert provider.autoscaling.meta.config.retries["total_max_attempts"] == 2
    assert provider.describe() == "aws auto scaling group g (eu-west-1)"


def test_group_is_required() -> None:
    parser = argparse.ArgumentParser()
    AwsProvider.add_arguments(parser.add_argument_group("aws provider options"))
    with pytest.raises(ConfigurationError) as caught:
        AwsProvider.from_options(parser.parse_args([]), CoreOptions())
    assert str(caught.value) == "--group is required for --provider aws"


def test_registered_as_builtin_plugin() -> None:
    registry = provider_registry(get_plugin_manager(load_entry_points=False))
    assert registry.get("aws") is AwsProvider


def test_import_does_not_load_boto3() -> None:
    code = (
        "import sys, spotring.providers.aws; "
        "loaded = [m for m in sys.modules if m.split('.')[0] in ('boto3', 'botocore')]; "
        "sys.exit(f'loaded: {loaded}' if loaded else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# ---------------------------------------------------------------------------- IAM


def test_iam_actions_are_exactly_the_calls_made(moto: None, price_list: AwsPriceList) -> None:
    ids = create_group(size=3, min_size=1, instance_type="g4dn.12xlarge")
    pricing = boto_session().client("pricing", region_name=REGION, endpoint_url=price_list.url)
    provider = make_provider(scale_down_on_exit=True, pricing=pricing)
    ops = count_operations(provider.autoscaling, provider.ec2, pricing)

    listed = provider.list_instances()
    provider.set_target_size(4)
    provider.replace_instance(ids[0])
    provider.host_noticed(listed[1], InterruptionNotice("preempt"))
    provider.remove_instance(ids[2])
    assert provider.group_lifecycle() is Lifecycle.ON_DEMAND  # reads the launch template
    assert provider.capacity_shortage(time.time() - 60) is None
    assert provider.hourly_price().usd == 3.912  # type: ignore[union-attr]  # on-demand
    assert prices.spot_price(provider._call, provider.ec2, ["g4dn.12xlarge"], []) is not None
    provider.job_finished()

    assert set(ops) == set(IAM_ACTIONS)
    assert len(IAM_ACTIONS) == len(set(IAM_ACTIONS))


@pytest.fixture
def price_list() -> Iterator[AwsPriceList]:
    with AwsPriceList([ec2_product("g4dn.12xlarge", REGION, "3.912")]) as fake:
        yield fake


def test_only_members_not_yet_running_are_described_again(moto: None) -> None:
    ids = create_group(size=2)
    provider = make_provider()
    ops = count_operations(provider.ec2)
    provider.list_instances()
    assert ops["ec2:DescribeInstances"] == 1
    provider.list_instances()
    assert ops["ec2:DescribeInstances"] == 1, "running members are not described again"

    provider.autoscaling.set_desired_capacity(AutoScalingGroupName="workers", DesiredCapacity=3)
    listed = provider.list_instances()
    assert ops["ec2:DescribeInstances"] == 2
    (new,) = [i for i in listed if i.id not in ids]
    assert new.address and new.is_ready


def test_a_spot_notice_detaches_the_host_so_its_replacement_launches_now(moto: None) -> None:
    ids = create_group(size=2)
    provider = make_provider()
    sent = capture_params(provider.autoscaling, "DetachInstances")
    noticed = {i.id: i for i in provider.list_instances()}[ids[1]]

    provider.host_noticed(noticed, InterruptionNotice("rebalance"))  # only a risk: kept
    provider.host_noticed(noticed, InterruptionNotice("terminate"))  # the group's own scale-in
    assert sent == []
    provider.host_noticed(noticed, InterruptionNotice("preempt", time.time() + 120))

    assert sent == [
        {
            "InstanceIds": [ids[1]],
            "AutoScalingGroupName": "workers",
            "ShouldDecrementDesiredCapacity": False,
        }
    ]
    members = {i.id for i in provider.list_instances()}
    assert ids[1] not in members and ids[0] in members and len(members) == 2
    group = client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=["workers"])
    assert group["AutoScalingGroups"][0]["DesiredCapacity"] == 2
