"""The AWS provider's side of the capacity contract (#25), against moto.

Several groups (``--group`` more than once, ``REGION/NAME``), what a group launches
(spot or on-demand, from its configuration), launch failures read from the group's
scaling activities, and a fallback host handed back with TerminateInstanceInAutoScaling
Group. moto 5.2 records no scaling activity and never fails a launch:
:class:`tests.fakes.aws.LaunchActivities` adds both, shaped as the API reference
describes them.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from spotring.providers.aws import (
    SCALING_ACTIVITIES_PAGES,
    AwsProvider,
    parse_group,
    shortage_from_activity,
)
from spotring.providers.base import (
    CapacityShortage,
    ConfigurationError,
    CoreOptions,
    Lifecycle,
    ShortageCause,
)
from tests.fakes.aws import (
    REGION,
    SPOT_NO_CAPACITY,
    LaunchActivities,
    capture_params,
    count_operations,
    create_group,
    inject_errors,
    moto_members,
)
from tests.providers.test_aws_provider import aws_env, client, desired_capacity, make_provider, moto

__all__ = ["aws_env", "moto"]  # fixtures, used by name

OTHER_REGION = "us-west-2"


@pytest.fixture
def launches(moto: None) -> Iterator[LaunchActivities]:
    with LaunchActivities() as activities:
        yield activities


def providers(*argv: str) -> list[AwsProvider]:
    parser = argparse.ArgumentParser()
    AwsProvider.add_arguments(parser.add_argument_group("aws provider options"))
    made = AwsProvider.groups_from_options(parser.parse_args(list(argv)), CoreOptions())
    assert all(isinstance(p, AwsProvider) for p in made)
    return made  # type: ignore[return-value]


def ago(seconds: float) -> datetime:
    return datetime.now(timezone.utc) - timedelta(seconds=seconds)


# ------------------------------------------------------------------ several groups


def test_two_groups_are_listed_with_their_names(moto: None) -> None:
    spot = create_group("spot", size=2)
    backup = create_group("backup", size=1)

    made = providers("--region", REGION, "--group", "spot", "--group", "backup")

    assert [p.group_name() for p in made] == ["spot", "backup"]
    assert [sorted(i.id for i in p.list_instances()) for p in made] == [
        sorted(spot),
        sorted(backup),
    ]
    # One region: one pair of clients for both groups.
    assert made[0].autoscaling is made[1].autoscaling and made[0].ec2 is made[1].ec2


def test_a_group_in_another_region_has_its_own_clients(moto: None) -> None:
    home = create_group("workers", size=1)
    away = create_group("workers", size=2, region=OTHER_REGION)

    made = providers("--region", REGION, "--group", "workers", "--group", f"{OTHER_REGION}/workers")

    assert [p.group_name() for p in made] == ["workers", f"{OTHER_REGION}/workers"]
    assert [p.region for p in made] == [REGION, OTHER_REGION]
    assert made[0].autoscaling is not made[1].autoscaling
    assert made[1].autoscaling.meta.region_name == OTHER_REGION
    assert {i.id for i in made[0].list_instances()} == set(home)
    assert {i.id for i in made[1].list_instances()} == set(away)
    assert made[1].describe() == f"aws auto scaling group workers ({OTHER_REGION})"


def test_every_group_named_with_a_region_is_shown_bare_in_the_first_ones_region() -> None:
    made = providers("--group", f"{OTHER_REGION}/a", "--group", f"{REGION}/b")
    assert [p.group_name() for p in made] == ["a", f"{REGION}/b"]


@pytest.mark.parametrize(
    ("argument", "parsed"),
    [
        ("workers", (None, "workers")),
        ("eu-west-1/workers", ("eu-west-1", "workers")),
        ("us-gov-west-1/workers", ("us-gov-west-1", "workers")),
        ("ap-southeast-4/a/b", ("ap-southeast-4", "a/b")),
        ("team/workers", (None, "team/workers")),  # a group name may hold a "/"
    ],
)
def test_group_argument_is_name_or_region_slash_name(
    argument: str, parsed: tuple[str | None, str]
) -> None:
    assert parse_group(argument) == parsed


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["--region", REGION, "--group", "a", "--group", "b", "--group", "a"],
            f"--group {REGION}/a is given more than once",
        ),
        (
            ["--region", REGION, "--group", "a", "--group", f"{REGION}/a"],
            f"--group {REGION}/a is given more than once",
        ),
        (["--region", REGION, "--group", f"{REGION}/"], "--group 'us-east-1/' names no"),
        ([], "--group is required for --provider aws"),
    ],
)
def test_bad_group_lists_are_one_line_errors(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigurationError) as caught:
        providers(*argv)
    assert str(caught.value).startswith(message)
    assert "\n" not in str(caught.value)


def test_one_group_still_makes_one_provider_through_from_options() -> None:
    parser = argparse.ArgumentParser()
    AwsProvider.add_arguments(parser.add_argument_group("aws provider options"))
    one = parser.parse_args(["--group", "g", "--region", REGION])
    two = parser.parse_args(["--group", "g", "--group", "h", "--region", REGION])

    provider = AwsProvider.from_options(one, CoreOptions())

    assert (provider.group, provider.group_name()) == ("g", "g")
    assert [p.group_name() for p in AwsProvider.groups_from_options(one, CoreOptions())] == ["g"]
    with pytest.raises(ConfigurationError, match="--group is given 2 times"):
        AwsProvider.from_options(two, CoreOptions())


# --------------------------------------------------------------- group lifecycle


def _mixed_group(name: str, distribution: dict[str, Any] | None) -> None:
    client("ec2").create_launch_template(
        LaunchTemplateName=f"{name}-template",
        LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "t3.micro"},
    )
    policy: dict[str, Any] = {
        "LaunchTemplate": {
            "LaunchTemplateSpecification": {"LaunchTemplateName": f"{name}-template"},
            "Overrides": [{"InstanceType": "t3.micro"}],
        }
    }
    if distribution is not None:
        policy["InstancesDistribution"] = distribution
    client("autoscaling").create_auto_scaling_group(
        AutoScalingGroupName=name,
        MinSize=0,
        MaxSize=4,
        DesiredCapacity=0,
        AvailabilityZones=[f"{REGION}a"],
        MixedInstancesPolicy=policy,
    )


def _template_group(name: str, market: dict[str, Any] | None) -> None:
    data: dict[str, Any] = {"ImageId": "ami-12c6146b", "InstanceType": "t3.micro"}
    if market is not None:
        data["InstanceMarketOptions"] = market
    client("ec2").create_launch_template(LaunchTemplateName=f"{name}-t", LaunchTemplateData=data)
    client("autoscaling").create_auto_scaling_group(
        AutoScalingGroupName=name,
        MinSize=0,
        MaxSize=4,
        DesiredCapacity=0,
        AvailabilityZones=[f"{REGION}a"],
        LaunchTemplate={"LaunchTemplateName": f"{name}-t", "Version": "$Latest"},
    )


def test_group_lifecycle_comes_from_the_groups_configuration(moto: None) -> None:
    # API_InstancesDistribution: OnDemandPercentageAboveBaseCapacity defaults to 100.
    _mixed_group("all-spot", {"OnDemandBaseCapacity": 1, "OnDemandPercentageAboveBaseCapacity": 0})
    _mixed_group("half", {"OnDemandPercentageAboveBaseCapacity": 50})
    _mixed_group("all-on-demand", {"OnDemandPercentageAboveBaseCapacity": 100})
    _mixed_group("default-distribution", None)
    _template_group("spot-template", {"MarketType": "spot"})
    _template_group("plain-template", None)

    found = {
        name: make_provider(name).group_lifecycle()
        for name in (
            "all-spot",
            "half",
            "all-on-demand",
            "default-distribution",
            "spot-template",
            "plain-template",
        )
    }

    assert found == {
        "all-spot": Lifecycle.SPOT,
        "half": Lifecycle.SPOT,
        "all-on-demand": Lifecycle.ON_DEMAND,
        "default-distribution": Lifecycle.ON_DEMAND,
        "spot-template": Lifecycle.SPOT,
        "plain-template": Lifecycle.ON_DEMAND,
    }


def test_group_lifecycle_is_read_once(moto: None) -> None:
    _template_group("spot-template", {"MarketType": "spot"})
    provider = make_provider("spot-template")
    ops = count_operations(provider.autoscaling, provider.ec2)

    assert [provider.group_lifecycle() for _ in range(3)] == [Lifecycle.SPOT] * 3
    assert ops == {
        "autoscaling:DescribeAutoScalingGroups": 1,
        "ec2:DescribeLaunchTemplateVersions": 1,
    }


def test_group_lifecycle_unknown_when_the_template_may_not_be_read(
    moto: None, caplog: pytest.LogCaptureFixture
) -> None:
    _template_group("spot-template", {"MarketType": "spot"})
    provider = make_provider("spot-template")
    inject_errors(provider.ec2, "DescribeLaunchTemplateVersions", 403, "UnauthorizedOperation")

    with caplog.at_level(logging.WARNING, logger="spotring.providers.aws"):
        assert provider.group_lifecycle() is None
        assert provider.group_lifecycle() is None

    assert caplog.text.count("allow ec2:DescribeLaunchTemplateVersions") == 1


def test_logs_carry_the_package_name(moto: None, caplog: pytest.LogCaptureFixture) -> None:
    """The rooms log as ``spotring.providers.aws``: the name spotring's log lines and
    the events file's ``provider_warning`` source showed before the package had rooms."""
    _template_group("spot-template", {"MarketType": "spot"})
    (member,) = create_group("workers", size=1)
    template_reader = make_provider("spot-template")
    inject_errors(
        template_reader.ec2, "DescribeLaunchTemplateVersions", 403, "UnauthorizedOperation"
    )

    with caplog.at_level(logging.INFO, logger="spotring.providers.aws"):
        assert template_reader.group_lifecycle() is None  # capacity: a warning
        make_provider("workers").replace_instance(member)  # provider: an info line

    names = [r.name for r in caplog.records if r.name.startswith("spotring.providers.aws")]
    assert names == ["spotring.providers.aws"] * 2


# -------------------------------------------------------------- capacity shortage


@pytest.mark.parametrize(
    ("message", "cause", "code"),
    [
        (SPOT_NO_CAPACITY, ShortageCause.CAPACITY, "InsufficientInstanceCapacity"),
        (
            "Could not launch Spot Instances. UnfulfillableCapacity - Unable to fulfill"
            " capacity due to your request configuration. Please adjust your request and"
            " try again. Launching EC2 instance failed.",
            ShortageCause.CAPACITY,
            "UnfulfillableCapacity",
        ),
        (
            "We currently do not have sufficient p3.2xlarge capacity in the Availability"
            " Zone you requested (us-east-1a). Launching EC2 instance failed.",
            ShortageCause.CAPACITY,
            "InsufficientInstanceCapacity",
        ),
        (
            "Could not launch Spot Instances. SpotMaxPriceTooLow - Your Spot request price"
            " of 0.01 is lower than the minimum required Spot request fulfillment price of"
            " 0.0735. Launching EC2 instance failed.",
            ShortageCause.PRICE,
            "SpotMaxPriceTooLow",
        ),
        (
            "Could not launch Spot Instances. MaxSpotInstanceCountExceeded - Max spot"
            " instance count exceeded. Launching EC2 instance failed.",
            ShortageCause.QUOTA,
            "MaxSpotInstanceCountExceeded",
        ),
        (
            "Could not launch On-Demand Instances. VcpuLimitExceeded - You have requested"
            " more vCPU capacity than your current vCPU limit of 0 allows for the instance"
            " bucket that the specified instance type belongs to.",
            ShortageCause.QUOTA,
            "VcpuLimitExceeded",
        ),
        (
            "You have requested more instances (9) than your current instance limit of 8"
            " allows for the specified instance type. Launching EC2 instance failed.",
            ShortageCause.QUOTA,
            "InstanceLimitExceeded",
        ),
        (
            "Could not launch Spot Instances. InvalidParameterCombination - The specified"
            " instance type is not eligible for Free Tier. Launching EC2 instance failed.",
            ShortageCause.OTHER,
            "InvalidParameterCombination",
        ),
    ],
)
def test_failed_launch_messages_name_cause_and_code(
    message: str, cause: ShortageCause, code: str
) -> None:
    start = ago(30)
    activity = {
        "ActivityId": "a",
        "AutoScalingGroupName": "g",
        "Cause": "At ... an instance was started in response to a difference between"
        " desired and actual capacity, increasing the capacity from 0 to 1.",
        "StartTime": start,
        "StatusCode": "Failed",
        "StatusMessage": message,
        "Description": f"Launching a new EC2 instance.  Status Reason: {message}",
    }

    found = shortage_from_activity(activity)

    assert found == CapacityShortage(cause, code, message, start.timestamp())
    # StatusMessage is optional: the Description's status reason says the same.
    del activity["StatusMessage"]
    assert shortage_from_activity(activity) == found
    assert shortage_from_activity({**activity, "StatusCode": "Cancelled"}) == found
    assert shortage_from_activity({**activity, "StatusCode": "Successful"}) is None


def test_failed_activity_that_is_no_launch_is_no_shortage() -> None:
    activity = {
        "ActivityId": "a",
        "AutoScalingGroupName": "g",
        "Cause": "At ... instance i-0 was taken out of service in response to a user request.",
        "StartTime": ago(1),
        "StatusCode": "Failed",
        "Description": "Terminating EC2 instance: i-0123456789abcdef0",
        "StatusMessage": "Instance i-0123456789abcdef0 is protected from termination.",
    }
    assert shortage_from_activity(activity) is None


def test_launches_beyond_capacity_show_as_a_shortage(launches: LaunchActivities) -> None:
    ids = create_group("spot", size=1, max_size=4)
    launches.limit("spot", 1)
    provider = make_provider("spot")
    since = time.time() - 1
    assert provider.capacity_shortage(since) is None, "a successful launch is no shortage"

    provider.list_instances()
    provider.set_target_size(3)
    members = provider.list_instances()
    shortage = provider.capacity_shortage(since)

    assert [i.id for i in members] == ids
    assert desired_capacity("spot") == 3, "the group keeps wanting 3 while it is short"
    assert shortage is not None
    assert (shortage.cause, shortage.code) == (
        ShortageCause.CAPACITY,
        "InsufficientInstanceCapacity",
    )
    assert shortage.message == SPOT_NO_CAPACITY
    assert shortage.at is not None and shortage.at >= since

    launches.limit("spot", 3)  # capacity is back: the group launches what it missed
    recovered = time.time()
    time.sleep(0.01)
    later = provider.list_instances()
    assert len(later) == 3 and all(i.lifecycle is Lifecycle.SPOT for i in later[1:])
    assert provider.capacity_shortage(recovered + 0.005) is None


def test_only_failures_since_count_and_the_newest_wins(launches: LaunchActivities) -> None:
    create_group("spot", size=0)
    provider = make_provider("spot")
    launches.add("spot", "Failed", start=ago(600), message=SPOT_NO_CAPACITY)
    launches.add("spot", "Successful", start=ago(100), description="Launching a new EC2 instance")

    assert provider.capacity_shortage(time.time() - 300) is None

    quota = "Could not launch Spot Instances. MaxSpotInstanceCountExceeded - Max spot."
    launches.add("spot", "Failed", start=ago(50), message=SPOT_NO_CAPACITY)
    launches.add("spot", "Failed", start=ago(20), message=quota)
    launches.add("spot", "InProgress", start=ago(5), description="Launching a new EC2 instance")
    launches.add("other", "Failed", start=ago(1), message=SPOT_NO_CAPACITY)

    found = provider.capacity_shortage(time.time() - 300)

    assert found is not None and found.code == "MaxSpotInstanceCountExceeded"
    assert found.cause is ShortageCause.QUOTA
    assert provider.capacity_shortage(time.time() - 35) == found
    assert provider.capacity_shortage(time.time() - 10) is None


def test_a_failure_earlier_in_the_same_second_does_not_count(launches: LaunchActivities) -> None:
    # StartTimeLowerBound takes whole seconds: the provider filters the rest itself.
    create_group("spot", size=0)
    provider = make_provider("spot")
    second = float(int(time.time()) - 30)
    launches.add(
        "spot",
        "Failed",
        start=datetime.fromtimestamp(second + 0.2, timezone.utc),
        message=SPOT_NO_CAPACITY,
    )

    assert provider.capacity_shortage(second + 0.7) is None
    assert provider.capacity_shortage(second) is not None


def test_shortage_read_is_bounded(launches: LaunchActivities) -> None:
    create_group("spot", size=0)
    provider = make_provider("spot")
    for age in range(400, 100, -1):  # 300 failures, all newer than `since`
        launches.add("spot", "Failed", start=ago(age), message=SPOT_NO_CAPACITY)
    sent = capture_params(provider.autoscaling, "DescribeScalingActivities")

    found = provider.capacity_shortage(time.time() - 3600)

    assert found is not None and found.cause is ShortageCause.CAPACITY
    assert found.at is not None and found.at > time.time() - 110, "the newest one"
    assert len(sent) == SCALING_ACTIVITIES_PAGES
    assert all(p["AutoScalingGroupName"] == "spot" and p["MaxRecords"] <= 100 for p in sent)
    assert sent[0]["Filters"][0]["Name"] == "StartTimeLowerBound"


# ------------------------------------------------------------------ remove_instance


def test_remove_instance_lowers_desired_capacity_once(moto: None) -> None:
    ids = create_group("backup", size=3)
    provider = make_provider("backup")
    provider.list_instances()
    sent = capture_params(provider.autoscaling, "TerminateInstanceInAutoScalingGroup")

    provider.remove_instance(ids[0])
    provider.remove_instance(ids[0])  # already gone: nothing more

    assert sent == [{"InstanceId": ids[0], "ShouldDecrementDesiredCapacity": True}]
    assert desired_capacity("backup") == 2
    assert sorted(i.id for i in provider.list_instances()) == sorted(ids[1:])
    provider.set_target_size(3)  # the provider knows the group now wants 2
    assert desired_capacity("backup") == 3


def test_remove_instance_of_a_leaving_or_foreign_member_is_a_no_op(moto: None) -> None:
    ids = create_group("backup", size=2)
    (foreign,) = create_group("spot", size=1)
    moto_members("backup")[ids[0]].lifecycle_state = "Terminating:Wait"
    provider = make_provider("backup")
    sent = capture_params(provider.autoscaling, "TerminateInstanceInAutoScalingGroup")

    provider.remove_instance(ids[0])  # already leaving
    provider.remove_instance(foreign)  # another group's
    provider.remove_instance("i-0123456789abcdef0")  # never existed

    assert sent == []
    assert desired_capacity("backup") == 2 and desired_capacity("spot") == 1


def test_remove_instance_that_left_meanwhile_is_fine(moto: None) -> None:
    ids = create_group("backup", size=2)
    provider = make_provider("backup")
    inject_errors(
        provider.autoscaling,
        "TerminateInstanceInAutoScalingGroup",
        400,
        "ValidationError",
        times=1,
        message=f"Instance Id not found - No managed instance found for instance ID: {ids[0]}",
    )
    provider.remove_instance(ids[0])

    inject_errors(
        provider.autoscaling,
        "TerminateInstanceInAutoScalingGroup",
        400,
        "ValidationError",
        message="Currently, desiredSize equals minSize (2). Terminating instance without"
        " replacement will violate group's min size constraint. Either set"
        " shouldDecrementDesiredCapacity flag to false or lower group's min size.",
    )
    with pytest.raises(ConfigurationError, match="min size constraint") as caught:
        provider.remove_instance(ids[1])
    assert "autoscaling:TerminateInstanceInAutoScalingGroup" in str(caught.value)


def test_provider_can_remove() -> None:
    assert AwsProvider.can_remove is True


# --------------------------------------------------------------------- read only


def test_listing_and_capacity_reads_send_only_describe_calls(launches: LaunchActivities) -> None:
    create_group("spot", size=2)
    create_group("backup", size=1)
    launches.limit("spot", 2)
    made = providers("--region", REGION, "--group", "spot", "--group", "backup")
    ops = count_operations(made[0].autoscaling, made[0].ec2)

    for provider in made:
        provider.list_instances()
        provider.group_lifecycle()
        provider.capacity_shortage(time.time() - 60)

    assert ops and all(op.split(":")[1].startswith("Describe") for op in ops), ops
    assert desired_capacity("spot") == 2 and desired_capacity("backup") == 1


# ------------------------------------------------- the controller over two AWS groups


class _Clock:
    """The capacity policy's clock, moved by the test (no sleeps)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_spot_group_short_of_capacity_makes_the_next_group_grow_then_shrink_back(
    launches: LaunchActivities,
) -> None:
    from spotring.autoscaler import hookimpl
    from spotring.autoscaler.capacity import CapacityOptions, ShortageBackoff
    from spotring.autoscaler.controller import Controller
    from spotring.autoscaler.plugins import get_plugin_manager
    from spotring.core import InstanceState, JobShape

    _template_group("spot", {"MarketType": "spot"})
    _template_group("backup", None)
    launches.limit("spot", 2)  # the spot pool holds 2 of the 4 hosts the job wants
    spot, backup = providers("--region", REGION, "--group", "spot", "--group", "backup")
    shortages: list[tuple[str, str]] = []

    class Recorder:
        @hookimpl
        def spotring_capacity_shortage(self, group: str, shortage: CapacityShortage) -> None:
            shortages.append((group, shortage.code))

    pm = get_plugin_manager(load_entry_points=False)
    pm.register(Recorder())
    clock = _Clock()
    # A --fallback-after far beyond the steps below: the fallback is the cloud's signal.
    options = CapacityOptions(fallback_after=120, return_after=0)
    controller = Controller(
        [spot, backup],
        pm.hook,
        job=JobShape(num_proc=4, min_num_proc=1, max_num_proc=4),
        capacity=options,
        capacity_clock=clock,
    )

    def ready() -> dict[str, list[str]]:
        assert controller.inventory is not None
        by_group: dict[str, list[str]] = {"spot": [], "backup": []}
        for host in controller.inventory.ready:
            by_group[host.group].append(host.address)
        return by_group

    controller.step()  # 4 hosts asked of spot: 2 launch, 2 fail for capacity
    assert desired_capacity("spot") == 4 and len(spot.list_instances()) == 2
    clock.now += 5  # a refresh later
    controller.step()  # spot's failed launches read; the 2 it lacks asked of backup
    controller.step()

    assert shortages == [("spot", "InsufficientInstanceCapacity")]
    assert desired_capacity("backup") == 2
    assert [len(hosts) for hosts in ready().values()] == [2, 2]
    assert controller.inventory is not None
    lifecycles = {(i.group, i.lifecycle) for i in controller.inventory.ready}
    assert lifecycles == {("spot", Lifecycle.SPOT), ("backup", Lifecycle.ON_DEMAND)}

    launches.limit("spot", 4)  # capacity is back
    clock.now += ShortageBackoff().cap * 1.4  # past spot's backoff: it is asked again
    for _ in range(12):
        controller.step()
        # Horovod re-forms its ring without a host handed back; spotring then removes it.
        controller.ring_formed([h for hosts in ready().values() for h in hosts])
        if not backup.list_instances():
            break

    assert desired_capacity("backup") == 0 and backup.list_instances() == []
    assert desired_capacity("spot") == 4
    assert len(ready()["spot"]) == 4 and ready()["backup"] == []
    assert all(i.state is InstanceState.READY for i in spot.list_instances())
