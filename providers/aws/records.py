"""What AWS's answers must hold, and one group member read into an :class:`Instance`:
an answer broken as a whole is a :class:`MalformedAnswer`, a member that lacks its own
fields is listed as not usable."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

from spotring.providers.aws.permissions import iam_action
from spotring.providers.aws.states import member_state
from spotring.providers.base import Instance, InstanceState, Lifecycle
from spotring.providers.cloud import MalformedAnswer, SlotResolver, worst_state

# An answer broken as a whole (a list the API always sends missing, a member or an
# instance without its id) makes the listing a retryable MalformedAnswer. A member that
# lacks what the API reference marks required (botocore's service model carries the
# same "required" lists), or what a usable host needs, costs only itself: it is listed
# as not usable (PENDING, or worse if its other fields say so), with one warning while
# it stays so. An optional field keeps its documented meaning. References: Amazon EC2
# Auto Scaling API Reference (autoscaling/ec2/APIReference), Amazon EC2 API Reference
# (AWSEC2/latest/APIReference).
#
# DescribeAutoScalingGroups
#   AutoScalingGroups               required (API_DescribeAutoScalingGroups, Response)
#   AutoScalingGroupName, MinSize,  required (API_AutoScalingGroup)
#   MaxSize
#   Instances                       "Required: No" (API_AutoScalingGroup); spotring still
#                                   requires it: an absent list cannot be told from an
#                                   answer cut short, and an empty group drops every host
#   Instances[].InstanceId          required (API_Instance): the member's identity
#   Instances[].LifecycleState,     required (API_Instance); without them, not usable
#   HealthStatus
# DescribeInstances (API_Instance marks every member "Required: No")
#   Reservations[].Instances[]      the list itself: what the filtered call returns
#   InstanceId                      needed to match the member asked for (instance-id
#                                   filter): an instance without it is malformed
#   State.Name                      needed: without it, not usable
#   PrivateIpAddress                optional: absent while pending (not assigned yet), and
#                                   for good on an instance in an IPv6-only subnet ("IPv6-
#                                   only instances" have no private IPv4 address: EC2 User
#                                   Guide, "IPv6-only subnets"): a running instance without
#                                   it is not usable (spotring and Horovod address hosts by
#                                   IPv4)
#   Tags[].Key, Tags[].Value        required of a tag that is sent (API_Tag); a malformed
#                                   tag (it may be the slots tag): not usable
# DescribeInstanceTypes
#   InstanceTypes[].InstanceType    needed to match the type asked for; GpuInfo optional


def require(record: Any, keys: Sequence[str], operation: str, what: str) -> None:
    """Raise :class:`MalformedAnswer` unless ``record`` has every one of ``keys``."""
    missing = [k for k in keys if not isinstance(record, Mapping) or record.get(k) in (None, "")]
    if missing:
        name = record.get("InstanceId") if isinstance(record, Mapping) else None
        raise MalformedAnswer(
            iam_action(operation),
            f"{what}{f' {name}' if name else ''} without {', '.join(missing)}",
        )


def member_problem(member: Mapping[str, Any], detail: Mapping[str, Any] | None) -> str:
    """What a member lacks that a usable one has ("": nothing; see the field table)."""
    missing = [k for k in ("LifecycleState", "HealthStatus") if not member.get(k)]
    if missing:
        return f"its group record has no {' or '.join(missing)}"
    return "" if detail is None else detail_problem(detail)


def detail_problem(detail: Mapping[str, Any]) -> str:
    """What an EC2 instance record lacks that a usable host's has ("": nothing)."""
    state = detail.get("State")
    if not isinstance(state, Mapping) or not state.get("Name"):
        return "its DescribeInstances record has no State.Name"
    if state["Name"] == "running" and not detail.get("PrivateIpAddress"):
        ipv6 = " (an IPv6-only instance)" if detail.get("Ipv6Address") else ""
        return f"it runs without a private IPv4 address{ipv6}"
    tags = detail.get("Tags") or []
    if not isinstance(tags, list) or not all(_is_tag(t) for t in tags):
        return "its DescribeInstances record has a tag without its Key or Value"
    return ""


def instance_tags(detail: Mapping[str, Any]) -> dict[str, str]:
    """The instance's tags, leaving out any without its Key or Value (which make the
    member not usable: :func:`detail_problem`)."""
    tags = detail.get("Tags") or []
    return {t["Key"]: t["Value"] for t in tags if _is_tag(t)} if isinstance(tags, list) else {}


def _is_tag(tag: Any) -> bool:
    return isinstance(tag, Mapping) and bool(tag.get("Key")) and tag.get("Value") is not None


def member_instance(
    member: Mapping[str, Any],
    detail: Mapping[str, Any] | None,
    problem: str,
    slots: SlotResolver,
    gpus_by_type: Mapping[str, int],
) -> Instance:
    """The member as listed; ``problem`` (see :func:`member_problem`) makes it not
    usable and leaves its address out. Its slots come from ``slots``, with the GPU count
    of its type from ``gpus_by_type`` when it has no slots tag."""
    lifecycle_state = member.get("LifecycleState") or ""
    health = member.get("HealthStatus") or ""
    ec2_state = None if detail is None else (detail.get("State") or {}).get("Name") or ""
    state = member_state(lifecycle_state, health, ec2_state)
    detail = detail or {}
    tags = instance_tags(detail)
    launch_time = detail.get("LaunchTime")
    spot = detail.get("InstanceLifecycle") == "spot"
    return Instance(
        id=member["InstanceId"],
        address="" if problem else detail.get("PrivateIpAddress", ""),
        state=worst_state(state, InstanceState.PENDING) if problem else state,
        slots=slots.slots(
            member["InstanceId"], tags, gpus_by_type.get(detail.get("InstanceType", ""))
        ),
        lifecycle=Lifecycle.SPOT if spot else Lifecycle.ON_DEMAND,
        zone=detail.get("Placement", {}).get("AvailabilityZone")
        or member.get("AvailabilityZone", ""),
        instance_type=cast(str, detail.get("InstanceType") or member.get("InstanceType", "")),
        launch_time=launch_time.timestamp() if launch_time is not None else None,
        cloud_state=f"{lifecycle_state or '-'}/{health or '-'}/{ec2_state or 'missing'}",
        labels=tags,
    )
