"""What an Auto Scaling group launches when it grows (spot or on-demand, from its
configuration), and the launches its scaling activities say failed, and why (EC2's error
codes -> :class:`ShortageCause`): what the capacity controller asks of a group."""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from typing import Any

from spotring.providers.aws.client import ApiCall
from spotring.providers.aws.errors import ACCESS_DENIED_CODES, aws_code
from spotring.providers.aws.records import require
from spotring.providers.base import CapacityShortage, ConfigurationError, Lifecycle, ShortageCause
from spotring.providers.cloud import one_line

# The package's logger: the name spotring's AWS logs have always carried.
log = logging.getLogger(__package__)


def launch_lifecycle(
    call: ApiCall, ec2: Any, record: Mapping[str, Any], group: str
) -> Lifecycle | None:
    """What ``group`` (its DescribeAutoScalingGroups ``record``) launches when it grows;
    see :meth:`AwsProvider.group_lifecycle`."""
    mixed = record.get("MixedInstancesPolicy")
    if mixed:
        distribution = mixed.get("InstancesDistribution") or {}
        on_demand = distribution.get("OnDemandPercentageAboveBaseCapacity")
        on_demand = 100 if on_demand is None else int(on_demand)
        return Lifecycle.ON_DEMAND if on_demand >= 100 else Lifecycle.SPOT
    data = launch_template_data(call, ec2, record, group)
    if data is None:
        return None
    market = (data.get("InstanceMarketOptions") or {}).get("MarketType")
    return Lifecycle.SPOT if market == "spot" else Lifecycle.ON_DEMAND


def launch_template_data(
    call: ApiCall, ec2: Any, record: Mapping[str, Any], group: str
) -> Mapping[str, Any] | None:
    """The ``LaunchTemplateData`` of the launch template version ``group`` (its
    DescribeAutoScalingGroups ``record``) launches from, its own or its mixed instances
    policy's; None for a launch configuration, or when the template may not be read
    (warned)."""
    mixed = record.get("MixedInstancesPolicy") or {}
    template = record.get("LaunchTemplate") or (mixed.get("LaunchTemplate") or {}).get(
        "LaunchTemplateSpecification"
    )
    if not template:
        return None
    wanted: dict[str, Any] = {"Versions": [str(template.get("Version") or "$Default")]}
    if template.get("LaunchTemplateId"):
        wanted["LaunchTemplateId"] = template["LaunchTemplateId"]
    elif template.get("LaunchTemplateName"):
        wanted["LaunchTemplateName"] = template["LaunchTemplateName"]
    else:
        return None
    try:
        page = call(ec2, "DescribeLaunchTemplateVersions", **wanted)
    except ConfigurationError as error:
        if aws_code(error) not in ACCESS_DENIED_CODES:
            raise
        log.warning(
            "aws: cannot read group %s's launch template (%s): spot or on-demand is"
            " judged by its members; allow ec2:DescribeLaunchTemplateVersions",
            group,
            aws_code(error),
        )
        return None
    versions = page.get("LaunchTemplateVersions") or []
    if not versions:
        return None
    data: Mapping[str, Any] = versions[0].get("LaunchTemplateData") or {}
    return data


# DescribeScalingActivities (Amazon EC2 Auto Scaling API Reference,
# API_DescribeScalingActivities): "If an attempt to launch instances failed, the
# StatusCode value is Failed or Cancelled and the StatusMessage element in the response
# indicates the cause of the failure." Activities are sorted by start time, newest
# first, "Activities still in progress are described first"; MaxRecords is at most 100.
# API_Activity: ActivityId, AutoScalingGroupName, Cause, StartTime and StatusCode are
# required; StatusCode is one of PendingSpotBidPlacement, WaitingForSpotInstanceRequestId,
# WaitingForSpotInstanceId, WaitingForInstanceId, PreInService, InProgress,
# WaitingForELBConnectionDraining, MidLifecycleAction, WaitingForInstanceWarmup,
# Successful, Failed, Cancelled, WaitingForConnectionDraining (and the in-place update
# states); Description, StatusMessage, EndTime, Details are optional ("Required: No").
# A failed launch reads, e.g., Description "Launching a new EC2 instance.  Status
# Reason: Could not launch Spot Instances. InsufficientInstanceCapacity - There is no
# Spot capacity available that matches your request. Launching EC2 instance failed."
# with the same text after "Status Reason:" as StatusMessage. The codes are EC2's
# (Amazon EC2 API Reference, "Error codes"; Auto Scaling User Guide, "Troubleshoot
# Amazon EC2 Auto Scaling: EC2 instance launch failures").

# SpotMaxPriceTooLow is EC2's refusal of a spot launch for price ("Error codes for the
# Amazon EC2 API"). SpotPriceGreaterThanProvidedMaxPrice is no EC2 code: it is Azure's
# (Azure Spot Virtual Machines error codes), so no scaling activity carries it.
SHORTAGE_CODES: Mapping[str, ShortageCause] = {
    "InsufficientInstanceCapacity": ShortageCause.CAPACITY,
    "InsufficientHostCapacity": ShortageCause.CAPACITY,
    "InsufficientCapacity": ShortageCause.CAPACITY,
    "UnfulfillableCapacity": ShortageCause.CAPACITY,
    "SpotMaxPriceTooLow": ShortageCause.PRICE,
    "MaxSpotInstanceCountExceeded": ShortageCause.QUOTA,
    "InstanceLimitExceeded": ShortageCause.QUOTA,
    "VcpuLimitExceeded": ShortageCause.QUOTA,
    "InsufficientFreeAddressesInSubnet": ShortageCause.QUOTA,
}
"""EC2 launch error codes a failed scaling activity names -> why the group is short.
Any other failed launch is :attr:`ShortageCause.OTHER`."""

# Older StatusMessages say it in words only (Troubleshooting guide's message texts).
_SHORTAGE_TEXTS: tuple[tuple[str, str], ...] = (
    ("we currently do not have sufficient", "InsufficientInstanceCapacity"),
    ("there is no spot capacity available", "InsufficientInstanceCapacity"),
    ("lower than the minimum required spot request fulfillment price", "SpotMaxPriceTooLow"),
    ("you have requested more vcpu capacity", "VcpuLimitExceeded"),
    ("you have requested more instances", "InstanceLimitExceeded"),
    ("max spot instance count exceeded", "MaxSpotInstanceCountExceeded"),
)
_CODE_AFTER_LAUNCH = re.compile(r"Could not launch (?:Spot|On-Demand) Instances\.\s+(\w+)")
_FAILED_STATUS_CODES = frozenset({"Failed", "Cancelled"})
_DONE_STATUS_CODES = _FAILED_STATUS_CODES | {"Successful"}

SCALING_ACTIVITIES_PAGE = 50
"""Activities per DescribeScalingActivities page (the API allows 1..100)."""
SCALING_ACTIVITIES_PAGES = 2
"""At most this many pages per :meth:`AwsProvider.capacity_shortage`: a group failing
launches records one activity per attempt, and only those since the last look count."""


def shortage_from_activity(activity: Mapping[str, Any]) -> CapacityShortage | None:
    """The shortage a Failed or Cancelled launch activity reports, else None.

    The cause comes from the EC2 error code in ``StatusMessage`` (or, when that optional
    field is absent, the ``Description``'s "Status Reason"). A failed activity that
    names no known code counts as :attr:`ShortageCause.OTHER` only when it was a launch.
    """
    if activity.get("StatusCode") not in _FAILED_STATUS_CODES:
        return None
    description = str(activity.get("Description") or "")
    message = str(activity.get("StatusMessage") or "")
    if not message and "Status Reason:" in description:
        message = description.split("Status Reason:", 1)[1].strip()
    code = next((c for c in SHORTAGE_CODES if re.search(rf"\b{c}\b", message)), None)
    if code is None:
        lowered = message.lower()
        code = next((c for text, c in _SHORTAGE_TEXTS if text in lowered), None)
    if code is None:
        named = _CODE_AFTER_LAUNCH.search(message)
        launching = description.startswith("Launching") or named is not None
        if not launching:
            return None  # e.g. a failed termination: not a shortage
        code = named.group(1) if named else str(activity["StatusCode"])
    start = activity.get("StartTime")
    return CapacityShortage(
        cause=SHORTAGE_CODES.get(code, ShortageCause.OTHER),
        code=code,
        message=one_line(message or description, 400),
        at=start.timestamp() if start is not None else None,
    )


def newest_shortage(
    call: ApiCall, autoscaling: Any, group: str, since: float
) -> CapacityShortage | None:
    """The newest launch of ``group`` its scaling activities say failed at or after
    ``since`` (epoch seconds), or None; see :meth:`AwsProvider.capacity_shortage`.

    Reads only: DescribeScalingActivities through ``call``, newest first, at most
    :data:`SCALING_ACTIVITIES_PAGES` pages of :data:`SCALING_ACTIVITIES_PAGE`, with the
    StartTimeLowerBound filter where ``autoscaling``'s botocore knows it.
    """
    from datetime import datetime, timezone

    request: dict[str, Any] = {
        "AutoScalingGroupName": group,
        "MaxRecords": SCALING_ACTIVITIES_PAGE,
    }
    shape = autoscaling.meta.service_model.operation_model("DescribeScalingActivities").input_shape
    if "Filters" in shape.members:  # newer API; older botocore cannot send it
        lower = datetime.fromtimestamp(since, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        request["Filters"] = [{"Name": "StartTimeLowerBound", "Values": [lower]}]
    newest: CapacityShortage | None = None
    for _ in range(SCALING_ACTIVITIES_PAGES):
        page = call(autoscaling, "DescribeScalingActivities", **request)
        require(page, ("Activities",), "DescribeScalingActivities", "the answer")
        older = False
        for activity in page["Activities"]:
            wanted = ("StatusCode", "StartTime")
            require(activity, wanted, "DescribeScalingActivities", "an activity")
            if activity["StartTime"].timestamp() < since:
                # Finished ones come newest first: the rest are older still.
                older = older or activity["StatusCode"] in _DONE_STATUS_CODES
                continue
            found = shortage_from_activity(activity)
            if found is not None and (newest is None or (found.at or 0) > (newest.at or 0)):
                newest = found
        if older or not page.get("NextToken"):
            break
        request["NextToken"] = page["NextToken"]
    return newest
