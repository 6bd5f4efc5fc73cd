"""The ``aws`` provider: an EC2 Auto Scaling group.

spotring lists the group's members with one DescribeAutoScalingGroups call (lifecycle
and health), then DescribeInstances in batches (address, EC2 state, spot or on-demand,
type, zone, tags). It steers the group with SetDesiredCapacity and replaces a failed
host by marking it Unhealthy, so the group itself terminates and relaunches it.

A job may span several groups (``--group`` given more than once, ``NAME`` or
``REGION/NAME``): one provider per group, in the user's order of preference. For the
capacity controller each reports what it launches (spot or on-demand, from the group's
configuration), the launches the group's scaling activities say failed for capacity,
quota or price, and hands a fallback host back with TerminateInstanceInAutoScalingGroup.

boto3 is imported on first use, so importing this module (and ``spotring --help``) costs
nothing when the ``aws`` extra is not installed.
"""

from __future__ import annotations

import argparse
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from spotring.core.hooks import hookimpl
from spotring.providers.base import (
    CapacityShortage,
    ConfigurationError,
    CoreOptions,
    Instance,
    InstanceState,
    InterruptionNotice,
    Lifecycle,
    Provider,
    ProviderError,
    ShortageCause,
)
from spotring.providers.cloud import (
    DEFAULT_MAX_API_ATTEMPTS,
    CloudGroupProvider,
    DescribeOnce,
    EpisodeWarnings,
    MalformedAnswer,
    batches,
    lookup_state,
    one_line,
    refuse_repeated_groups,
    worst_state,
)

if TYPE_CHECKING:
    from spotring.providers.base import ProviderRegistry

log = logging.getLogger(__name__)

# ------------------------------------------------------------------ IAM and limits

IAM_ACTION_BY_OPERATION: Mapping[str, str] = {
    "DescribeAutoScalingGroups": "autoscaling:DescribeAutoScalingGroups",
    "DescribeAutoScalingInstances": "autoscaling:DescribeAutoScalingInstances",
    "SetDesiredCapacity": "autoscaling:SetDesiredCapacity",
    "SetInstanceHealth": "autoscaling:SetInstanceHealth",
    "DetachInstances": "autoscaling:DetachInstances",
    "DescribeScalingActivities": "autoscaling:DescribeScalingActivities",
    "TerminateInstanceInAutoScalingGroup": "autoscaling:TerminateInstanceInAutoScalingGroup",
    "DescribeInstances": "ec2:DescribeInstances",
    "DescribeInstanceTypes": "ec2:DescribeInstanceTypes",
    "DescribeLaunchTemplateVersions": "ec2:DescribeLaunchTemplateVersions",
}
"""The IAM action each API operation the provider makes needs (the README's table is
made from it: :mod:`spotring.providers.permissions`)."""

IAM_ACTIONS: tuple[str, ...] = tuple(IAM_ACTION_BY_OPERATION.values())
"""Every IAM action the provider calls; the policy of the role spotring runs as must
allow all of them (see :func:`iam_policy`)."""

IAM_STEERING_ACTIONS: tuple[str, ...] = (
    "autoscaling:SetDesiredCapacity",
    "autoscaling:SetInstanceHealth",
    "autoscaling:DetachInstances",
    "autoscaling:TerminateInstanceInAutoScalingGroup",
)
"""The actions that change the group; they accept the group's ARN as resource, while
the Describe* actions only accept ``"*"`` (Service Authorization Reference, "Actions
defined by Amazon EC2 Auto Scaling": the four name the ``autoScalingGroup`` resource
type; DescribeScalingActivities, DescribeAutoScalingGroups and EC2's Describe* name
none)."""

DESCRIBE_INSTANCES_BATCH = 200
"""Instance ids per DescribeInstances call. EC2 accepts at most 200 values in one
filter, and the ids go in an ``instance-id`` filter rather than ``InstanceIds``:
with ``InstanceIds`` one id EC2 does not know yet (a just-launched member, EC2 being
eventually consistent) or no longer (a purged one) fails the whole batch with
InvalidInstanceID.NotFound, while a filter just leaves it out. A 1,000-member group
thus costs 1 + 5 calls per refresh."""

DESCRIBE_INSTANCE_TYPES_BATCH = 100
"""Instance types per DescribeInstanceTypes call (the API's limit)."""

DEFAULT_SLOTS_TAG = "spotring:slots"

_REGION_NAME = re.compile(r"[a-z]{2}(-[a-z]+)+-\d+")
"""An AWS region name (us-east-1, us-gov-west-1, ap-southeast-4, ...): what may stand
before the ``/`` of ``--group REGION/NAME``. A group name may itself hold a ``/``
(API_CreateAutoScalingGroup allows any printable character), so a prefix that is no
region name leaves the whole argument as the name."""

# ------------------------------------------------------------- capacity signals
#
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


# ------------------------------------------------------- fields the answers must hold
#
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

# ------------------------------------------------------------------- state maps

LIFECYCLE_STATE_MAP: Mapping[str, InstanceState] = {
    "Pending": InstanceState.PENDING,
    "Pending:Wait": InstanceState.PENDING,
    "Pending:Proceed": InstanceState.PENDING,
    # Held back before entering service; not usable, not leaving either.
    "Quarantined": InstanceState.PENDING,
    "InService": InstanceState.READY,
    "Terminating": InstanceState.TERMINATING,
    "Terminating:Wait": InstanceState.TERMINATING,
    "Terminating:Proceed": InstanceState.TERMINATING,
    # Kept running by a retention policy, but out of the group's service for good.
    "Terminating:Retained": InstanceState.TERMINATING,
    "Terminated": InstanceState.GONE,
    # Still running but on its way out of the group: take no new work.
    "Detaching": InstanceState.DRAINING,
    "Detached": InstanceState.GONE,
    "EnteringStandby": InstanceState.DRAINING,
    "Standby": InstanceState.DRAINING,
    # Root volume replacement reboots the host: its workers die, then it boots again.
    "ReplacingRootVolume": InstanceState.DRAINING,
    "ReplacingRootVolume:Wait": InstanceState.DRAINING,
    "ReplacingRootVolume:Proceed": InstanceState.DRAINING,
    "RootVolumeReplaced": InstanceState.PENDING,
    # Warm-pool members are not in service; they may enter it later.
    "Warmed:Pending": InstanceState.PENDING,
    "Warmed:Pending:Wait": InstanceState.PENDING,
    "Warmed:Pending:Proceed": InstanceState.PENDING,
    "Warmed:Pending:Retained": InstanceState.PENDING,
    "Warmed:Running": InstanceState.PENDING,
    "Warmed:Stopped": InstanceState.PENDING,
    "Warmed:Hibernated": InstanceState.PENDING,
    "Warmed:Terminating": InstanceState.TERMINATING,
    "Warmed:Terminating:Wait": InstanceState.TERMINATING,
    "Warmed:Terminating:Proceed": InstanceState.TERMINATING,
    "Warmed:Terminating:Retained": InstanceState.TERMINATING,
    "Warmed:Terminated": InstanceState.GONE,
}
"""Auto Scaling LifecycleState -> InstanceState."""

HEALTH_STATUS_MAP: Mapping[str, InstanceState] = {
    "Healthy": InstanceState.READY,
    # The group will terminate and replace it: stop placing work there now.
    "Unhealthy": InstanceState.DRAINING,
}
"""Auto Scaling HealthStatus -> the best state a member can have."""

EC2_STATE_MAP: Mapping[str, InstanceState] = {
    "pending": InstanceState.PENDING,
    "running": InstanceState.READY,
    "shutting-down": InstanceState.TERMINATING,
    "terminated": InstanceState.GONE,
    # A stopped member cannot run work; the group marks it unhealthy and replaces it.
    "stopping": InstanceState.TERMINATING,
    "stopped": InstanceState.TERMINATING,
}
"""EC2 instance State.Name -> InstanceState."""


def member_state(lifecycle_state: str, health_status: str, ec2_state: str | None) -> InstanceState:
    """Combine the group's and EC2's view of a member: the least usable one wins.

    ``ec2_state`` is None when DescribeInstances did not return the member (GONE).
    Unknown strings (a state AWS adds later) count as PENDING: not usable, not gone.
    """
    if ec2_state is None:
        return InstanceState.GONE
    return worst_state(
        lookup_state(LIFECYCLE_STATE_MAP, lifecycle_state),
        lookup_state(HEALTH_STATUS_MAP, health_status),
        lookup_state(EC2_STATE_MAP, ec2_state),
    )


# ------------------------------------------------------------------ error mapping

_RETRYABLE_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "RequestLimitExceeded",
        "RequestThrottled",
        "TooManyRequestsException",
        "ResourceContention",
        "ScalingActivityInProgress",
        "InternalError",
        "InternalFailure",
        "ServiceUnavailable",
        "Unavailable",
    }
)
_ACCESS_DENIED_CODES = frozenset(
    {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "UnauthorizedAccess"}
)
_BAD_CREDENTIAL_CODES = frozenset(
    {
        "AuthFailure",
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "SignatureDoesNotMatch",
        "IncompleteSignature",
        "InvalidAccessKeyId",
        "MissingAuthenticationToken",
        "OptInRequired",
    }
)
_EXPIRED_CREDENTIAL_CODES = frozenset({"ExpiredToken", "ExpiredTokenException"})


# ------------------------------------------------------------------------ provider


class AwsProvider(CloudGroupProvider):
    """An EC2 Auto Scaling group, listed and steered through the AWS APIs.

    Counters for the API cost: :attr:`api_calls` (operations, all time),
    :attr:`api_retries` (extra attempts botocore made after throttling or 5xx) and
    :attr:`last_refresh_calls` (operations made by the last :meth:`list_instances`).
    Retries are botocore's own ("standard" mode: capped exponential backoff with
    jitter and a client-side retry quota), set to ``--max-api-attempts``.
    """

    name = "aws"
    description = "EC2 Auto Scaling group (--group NAME)"
    slots_label_option = "--slots-tag"
    default_slots_label = DEFAULT_SLOTS_TAG
    sdk_modules = ("boto3",)
    sdk_extra = "spotring[aws]"
    needs_credentials = True

    can_remove = True

    def __init__(
        self,
        group: str,
        *,
        region: str | None = None,
        profile: str | None = None,
        endpoint_url: str | None = None,
        spot_only: bool = False,
        slots_per_host: int | None = None,
        slots_tag: str = DEFAULT_SLOTS_TAG,
        scale_down_on_exit: bool = False,
        max_api_attempts: int = DEFAULT_MAX_API_ATTEMPTS,
        session: Any | None = None,
        clients: tuple[Any, Any] | None = None,
        label: str | None = None,
    ) -> None:
        """Make the clients; no API call. See :meth:`add_arguments` for the options.

        :param session: a ``boto3.session.Session`` to make the clients from, for
            embedding and tests; by default a new one from ``profile`` and ``region``.
        :param clients: the (autoscaling, ec2) clients of another group in the same
            region, to share instead of making new ones (:meth:`groups_from_options`).
        :param label: what :meth:`group_name` answers; default the group's name.
        """
        if not group:
            raise ConfigurationError("--group is required for --provider aws")
        super().__init__(
            spot_only=spot_only,
            slots_per_host=slots_per_host,
            slots_label=slots_tag,
            scale_down_on_exit=scale_down_on_exit,
            max_api_attempts=max_api_attempts,
        )
        self.group = group
        self._label = label or group
        self._gpus_by_type: dict[str, int] = {}
        self._group_record: dict[str, Any] | None = None
        self._lifecycle: tuple[Lifecycle | None] | None = None  # described once
        # EC2 details of running members: address, type, zone, lifecycle and tags do
        # not change while an instance runs, so each member is described once.
        self._details: DescribeOnce[str, dict[str, Any]] = DescribeOnce(
            self._describe_instances,
            lambda detail: not _detail_problem(detail) and detail["State"]["Name"] == "running",
        )
        self._odd = EpisodeWarnings(log)  # members listed as not usable for what they lack
        # Public so that tests and plugins can hook botocore events on them.
        self.autoscaling, self.ec2 = clients or self._make_clients(
            region, profile, endpoint_url, max_api_attempts, session
        )
        self.region: str = self.autoscaling.meta.region_name

    @classmethod
    def add_arguments(cls, group: argparse._ArgumentGroup) -> None:
        """Add ``--group``, ``--region``, ``--profile`` and the other AWS options."""
        group.add_argument(
            "--group",
            dest="aws_group",
            action="append",
            metavar="[REGION/]NAME",
            help="Auto Scaling group name (required); give it again for more groups, in"
            " order of preference (spot first, on-demand last); REGION/NAME for a group in"
            " another region than --region",
        )
        group.add_argument(
            "--region",
            dest="aws_region",
            metavar="REGION",
            help="AWS region (default: AWS_REGION / AWS_DEFAULT_REGION / the profile's)",
        )
        group.add_argument(
            "--profile",
            dest="aws_profile",
            metavar="PROFILE",
            help="named profile from ~/.aws/config (default: AWS_PROFILE or the default chain)",
        )
        group.add_argument(
            "--endpoint-url",
            dest="aws_endpoint_url",
            metavar="URL",
            help="send Auto Scaling and EC2 calls here (a test server or VPC endpoint)",
        )
        cls.add_common_arguments(group, "aws")

    @classmethod
    def credential_source(cls) -> str | None:
        """Where boto3's credential chain finds credentials (``env``, ``shared-
        credentials-file``, ``iam-role``, ...); no API call."""
        import boto3

        credentials = boto3.session.Session().get_credentials()
        return None if credentials is None else f"found ({credentials.method})"

    @classmethod
    def from_options(cls, options: argparse.Namespace, core: CoreOptions) -> AwsProvider:
        """Make the provider of the one ``--group`` from parsed options; no API call.

        Raises :class:`ConfigurationError` without ``--group`` or with several (see
        :meth:`groups_from_options`), for an unknown profile or when no region is
        configured.
        """
        groups = cls._providers(options, core)
        if len(groups) > 1:
            for provider in groups:
                provider.close()
            raise ConfigurationError(
                f"--group is given {len(groups)} times; this command takes one group"
            )
        return groups[0]

    @classmethod
    def groups_from_options(cls, options: argparse.Namespace, core: CoreOptions) -> list[Provider]:
        """One provider per ``--group``, in the order given; no API call.

        ``--group REGION/NAME`` is a group in another region than ``--region``; groups
        in one region share their clients. :meth:`group_name` is the group's name, with
        ``REGION/`` before it for a group outside the default region. Raises
        :class:`ConfigurationError` without ``--group``, for a group given twice, an
        unknown profile, or when no region is configured.
        """
        made: list[Provider] = [*cls._providers(options, core)]
        return made

    @classmethod
    def _providers(cls, options: argparse.Namespace, core: CoreOptions) -> list[AwsProvider]:
        names = getattr(options, "aws_group", None) or []
        if isinstance(names, str):  # a namespace made by hand, not by our parser
            names = [names]
        specs = [parse_group(name) for name in names]
        if not specs:
            raise ConfigurationError("--group is required for --provider aws")
        common = cls.common_options(options, core, "aws")
        slots_tag = common.pop("slots_label")
        default_region = getattr(options, "aws_region", None)
        profile = getattr(options, "aws_profile", None)
        endpoint_url = getattr(options, "aws_endpoint_url", None)
        clients: dict[str | None, tuple[Any, Any]] = {}
        made: list[AwsProvider] = []
        try:
            for region, name in specs:
                key = region or default_region
                provider = cls(
                    name,
                    region=key,
                    profile=profile,
                    endpoint_url=endpoint_url,
                    slots_tag=slots_tag,
                    clients=clients.get(key),
                    **common,
                )
                clients.setdefault(key, (provider.autoscaling, provider.ec2))
                made.append(provider)
            # Names are shown bare in the job's home region (that of the groups given
            # without REGION/), with their region elsewhere.
            unprefixed = [p for p, (region, _) in zip(made, specs, strict=True) if not region]
            home = (unprefixed or made)[0].region
            refuse_repeated_groups([(provider.region, provider.group) for provider in made])
            for provider in made:
                if provider.region != home:
                    provider._label = f"{provider.region}/{provider.group}"
        except ConfigurationError:
            for provider in made:
                provider.close()
            raise
        # The GPU count of an instance type is the same in every region: learn it once.
        for provider in made[1:]:
            provider._gpus_by_type = made[0]._gpus_by_type
        return made

    # ------------------------------------------------------------------ listing

    def list_members(self) -> list[Instance]:
        """Every member of the group, with lifecycle, health and EC2 state combined.

        Costs one DescribeAutoScalingGroups page (a group's members all come in its
        one record); DescribeInstances only for members not yet seen running, in
        batches of 200; and, the first time a type is seen without a slots tag, one
        DescribeInstanceTypes call. A steady group costs one call per refresh.

        Once a member is running, its EC2 details are not asked for again: its later
        fate (stopping, terminated by a spot reclaim) shows in the group's lifecycle
        and health states, and spotring sees its workers die before either.
        """
        record = self._describe_group()
        members = record["Instances"]
        details = self._details.get([m["InstanceId"] for m in members])
        self._learn_gpu_counts(
            details[m["InstanceId"]].get("InstanceType", "")
            for m in members
            if m["InstanceId"] in details and self._needs_gpu_count(details[m["InstanceId"]])
        )
        instances: list[Instance] = []
        odd: dict[str, str] = {}
        for member in members:
            detail = details.get(member["InstanceId"])
            problem = _member_problem(member, detail)
            instance = self._to_instance(member, detail, problem)
            instances.append(instance)
            if problem:
                odd[f"aws: group {self.group} member {instance.id}"] = (
                    f"aws: group {self.group}: member {instance.id} is listed as"
                    f" {instance.state.value}, not usable: {problem}"
                )
        self._odd.update(odd)  # one warning per member while it stays odd
        return instances

    def _to_instance(
        self, member: Mapping[str, Any], detail: Mapping[str, Any] | None, problem: str
    ) -> Instance:
        """The member as listed; ``problem`` (see :func:`_member_problem`) makes it not
        usable and leaves its address out."""
        lifecycle_state = member.get("LifecycleState") or ""
        health = member.get("HealthStatus") or ""
        ec2_state = None if detail is None else (detail.get("State") or {}).get("Name") or ""
        state = member_state(lifecycle_state, health, ec2_state)
        detail = detail or {}
        tags = _tags(detail)
        launch_time = detail.get("LaunchTime")
        spot = detail.get("InstanceLifecycle") == "spot"
        return Instance(
            id=member["InstanceId"],
            address="" if problem else detail.get("PrivateIpAddress", ""),
            state=worst_state(state, InstanceState.PENDING) if problem else state,
            slots=self.slots.slots(
                member["InstanceId"], tags, self._gpus_by_type.get(detail.get("InstanceType", ""))
            ),
            lifecycle=Lifecycle.SPOT if spot else Lifecycle.ON_DEMAND,
            zone=detail.get("Placement", {}).get("AvailabilityZone")
            or member.get("AvailabilityZone", ""),
            instance_type=cast(str, detail.get("InstanceType") or member.get("InstanceType", "")),
            launch_time=launch_time.timestamp() if launch_time is not None else None,
            cloud_state=f"{lifecycle_state or '-'}/{health or '-'}/{ec2_state or 'missing'}",
            labels=tags,
        )

    def _describe_group(self) -> dict[str, Any]:
        """The group's record; its ``Instances`` come whole in the one record."""
        records: list[dict[str, Any]] = []
        token: str | None = None
        while True:
            kwargs: dict[str, Any] = {"AutoScalingGroupNames": [self.group]}
            if token:
                kwargs["NextToken"] = token
            page = self._call(self.autoscaling, "DescribeAutoScalingGroups", **kwargs)
            # An unknown group is an empty list; no list at all is a broken answer.
            _require(page, ("AutoScalingGroups",), "DescribeAutoScalingGroups", "the answer")
            records.extend(page["AutoScalingGroups"])
            token = page.get("NextToken")
            if not token:
                break
        for found in records:
            _require(found, ("AutoScalingGroupName",), "DescribeAutoScalingGroups", "a group")
        record = next((r for r in records if r["AutoScalingGroupName"] == self.group), None)
        if record is None:
            raise ConfigurationError(
                f"auto scaling group '{self.group}' not found in region {self.region}"
            )
        # AWS always sends these (an empty group: an empty Instances list).
        wanted = ("Instances", "MinSize", "MaxSize")
        _require(record, wanted, "DescribeAutoScalingGroups", f"group {self.group}")
        for member in record["Instances"]:
            _require(member, ("InstanceId",), "DescribeAutoScalingGroups", "a member")
        self._group_record = record
        return record

    def _describe_instances(self, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        details: dict[str, dict[str, Any]] = {}
        for batch in batches(ids, DESCRIBE_INSTANCES_BATCH):
            token: str | None = None
            while True:
                kwargs: dict[str, Any] = {
                    "Filters": [{"Name": "instance-id", "Values": list(batch)}],
                    "MaxResults": 1000,
                }
                if token:
                    kwargs["NextToken"] = token
                page = self._call(self.ec2, "DescribeInstances", **kwargs)
                _require(page, ("Reservations",), "DescribeInstances", "the answer")
                for reservation in page["Reservations"]:
                    _require(reservation, ("Instances",), "DescribeInstances", "a reservation")
                    for detail in reservation["Instances"]:
                        _require(detail, ("InstanceId",), "DescribeInstances", "an instance")
                        details[detail["InstanceId"]] = detail
                token = page.get("NextToken")
                if not token:
                    break
        return details

    # -------------------------------------------------------------------- slots

    def _needs_gpu_count(self, detail: Mapping[str, Any]) -> bool:
        return self.slots.needs_accelerator_count(detail.get("InstanceId", ""), _tags(detail))

    def _learn_gpu_counts(self, instance_types: Iterable[str]) -> None:
        """Fill the per-type GPU cache for types not seen before (0 GPUs -> 1 slot)."""
        unknown = sorted({t for t in instance_types if t and t not in self._gpus_by_type})
        for batch in batches(unknown, DESCRIBE_INSTANCE_TYPES_BATCH):
            try:
                found = self._describe_instance_types(list(batch))
            except ConfigurationError as error:
                if _aws_code(error) != "InvalidInstanceType":
                    raise
                # One type EC2 does not know fails the batch: ask for each alone.
                found = {}
                for instance_type in batch:
                    try:
                        found.update(self._describe_instance_types([instance_type]))
                    except ConfigurationError as single:
                        if _aws_code(single) != "InvalidInstanceType":
                            raise
            for instance_type in batch:
                self._gpus_by_type[instance_type] = max(1, found.get(instance_type, 1))

    def _describe_instance_types(self, instance_types: list[str]) -> dict[str, int]:
        page = self._call(self.ec2, "DescribeInstanceTypes", InstanceTypes=instance_types)
        _require(page, ("InstanceTypes",), "DescribeInstanceTypes", "the answer")
        for item in page["InstanceTypes"]:
            _require(item, ("InstanceType",), "DescribeInstanceTypes", "an instance type")
        return {
            item["InstanceType"]: sum(
                gpu.get("Count", 0) for gpu in item.get("GpuInfo", {}).get("Gpus", [])
            )
            for item in page.get("InstanceTypes", [])
        }

    # ----------------------------------------------------------------- steering

    def size_limits(self) -> tuple[int, int]:
        """The group's (MinSize, MaxSize), from the last description of the group."""
        record = self._group_record or self._describe_group()
        return int(record["MinSize"]), int(record["MaxSize"])

    def set_target_size(self, size: int) -> None:
        """SetDesiredCapacity(size), skipped when the group already wants ``size``.

        Uses the group record of the last refresh (the controller refreshes before it
        steers), so an unchanged target costs no call. Raises
        :class:`ConfigurationError` when ``size`` is outside MinSize..MaxSize.
        """
        record = self._group_record or self._describe_group()
        low, high = int(record["MinSize"]), int(record["MaxSize"])
        if not low <= size <= high:
            raise ConfigurationError(
                f"target size {size} is outside auto scaling group '{self.group}' limits"
                f" MinSize={low} MaxSize={high}: change --min-np/--max-np or the group's sizes"
            )
        if record.get("DesiredCapacity") == size:
            return
        self._call(
            self.autoscaling,
            "SetDesiredCapacity",
            AutoScalingGroupName=self.group,
            DesiredCapacity=size,
            HonorCooldown=False,
        )
        record["DesiredCapacity"] = size
        log.info("aws: group %s desired capacity -> %d", self.group, size)

    def replace_instance(self, instance_id: str) -> None:
        """Mark ``instance_id`` Unhealthy so the group terminates and replaces it.

        A member already unhealthy, leaving or gone, or not in the group, is left alone.
        """
        member = self._membership(instance_id)
        if member is None:
            log.debug("aws: %s is not in group %s; nothing to replace", instance_id, self.group)
            return
        state = LIFECYCLE_STATE_MAP.get(member.get("LifecycleState", ""), InstanceState.PENDING)
        if member.get("HealthStatus") == "Unhealthy" or state in (
            InstanceState.TERMINATING,
            InstanceState.GONE,
        ):
            return
        try:
            self._call(
                self.autoscaling,
                "SetInstanceHealth",
                InstanceId=instance_id,
                HealthStatus="Unhealthy",
                ShouldRespectGracePeriod=False,
            )
        except ConfigurationError as error:
            # It left the group between the two calls: already replaced.
            if _aws_code(error) == "ValidationError" and "not found" in str(error).lower():
                return
            raise
        log.info("aws: marked %s unhealthy; group %s will replace it", instance_id, self.group)

    def remove_instance(self, instance_id: str) -> None:
        """Terminate ``instance_id`` and lower the group's desired capacity by one
        (TerminateInstanceInAutoScalingGroup, ShouldDecrementDesiredCapacity true).

        Idempotent: a member already leaving (terminating, detaching, gone) or not in
        this group is left alone, and so is the ValidationError "Instance Id not found -
        No managed instance found for instance ID" of one that left between the check
        and the call (the API reference lists no code of its own for it: only
        ScalingActivityInProgress and ResourceContention, which botocore retries). A
        group at its MinSize refuses the decrement (ValidationError "Currently,
        desiredSize equals minSize"): that is raised, one line, as a ConfigurationError.
        """
        member = self._membership(instance_id)
        if member is None:
            log.debug("aws: %s is not in group %s; nothing to remove", instance_id, self.group)
            return
        state = LIFECYCLE_STATE_MAP.get(member.get("LifecycleState", ""), InstanceState.PENDING)
        if state in (InstanceState.TERMINATING, InstanceState.GONE) or member.get(
            "LifecycleState", ""
        ).startswith("Detach"):
            return
        try:
            self._call(
                self.autoscaling,
                "TerminateInstanceInAutoScalingGroup",
                InstanceId=instance_id,
                ShouldDecrementDesiredCapacity=True,
            )
        except ConfigurationError as error:
            if _aws_code(error) == "ValidationError" and "not found" in str(error).lower():
                return
            raise
        if self._group_record is not None and "DesiredCapacity" in self._group_record:
            # So that set_target_size compares with what the group now wants.
            self._group_record["DesiredCapacity"] = max(
                0, int(self._group_record["DesiredCapacity"]) - 1
            )
        log.info("aws: removed %s from group %s (desired capacity -1)", instance_id, self.group)

    # ------------------------------------------------------------------ capacity

    def group_name(self) -> str:
        """The group's name; ``REGION/NAME`` for a group outside the job's home region."""
        return self._label

    def group_lifecycle(self) -> Lifecycle | None:
        """What the group launches when it grows, from its configuration (read once).

        A mixed instances policy: its InstancesDistribution (API_InstancesDistribution:
        OnDemandPercentageAboveBaseCapacity, default 100) says SPOT when any share above
        the on-demand base is spot, else ON_DEMAND. A launch template: its version's
        ``InstanceMarketOptions.MarketType`` (``spot``) through
        DescribeLaunchTemplateVersions; a policy that denies that call makes it None.
        A launch configuration (legacy): None, and the controller goes by the members.
        """
        if self._lifecycle is None:
            self._lifecycle = (self._read_lifecycle(),)
        return self._lifecycle[0]

    def _read_lifecycle(self) -> Lifecycle | None:
        record = self._group_record or self._describe_group()
        mixed = record.get("MixedInstancesPolicy")
        if mixed:
            distribution = mixed.get("InstancesDistribution") or {}
            on_demand = distribution.get("OnDemandPercentageAboveBaseCapacity")
            on_demand = 100 if on_demand is None else int(on_demand)
            return Lifecycle.ON_DEMAND if on_demand >= 100 else Lifecycle.SPOT
        template = record.get("LaunchTemplate")
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
            page = self._call(self.ec2, "DescribeLaunchTemplateVersions", **wanted)
        except ConfigurationError as error:
            if _aws_code(error) not in _ACCESS_DENIED_CODES:
                raise
            log.warning(
                "aws: cannot read group %s's launch template (%s): spot or on-demand is"
                " judged by its members; allow ec2:DescribeLaunchTemplateVersions",
                self.group,
                _aws_code(error),
            )
            return None
        versions = page.get("LaunchTemplateVersions") or []
        if not versions:
            return None
        data = versions[0].get("LaunchTemplateData") or {}
        market = (data.get("InstanceMarketOptions") or {}).get("MarketType")
        return Lifecycle.SPOT if market == "spot" else Lifecycle.ON_DEMAND

    def capacity_shortage(self, since: float) -> CapacityShortage | None:
        """The newest launch the group's scaling activities say failed at or after
        ``since`` (epoch seconds): InsufficientInstanceCapacity, "Could not launch Spot
        Instances", SpotMaxPriceTooLow, a quota (see :data:`SHORTAGE_CODES`), or None.

        Reads only: DescribeScalingActivities for this group, newest first, at most
        :data:`SCALING_ACTIVITIES_PAGES` pages of :data:`SCALING_ACTIVITIES_PAGE`, with
        the StartTimeLowerBound filter where the installed botocore knows it.
        """
        from datetime import datetime, timezone

        request: dict[str, Any] = {
            "AutoScalingGroupName": self.group,
            "MaxRecords": SCALING_ACTIVITIES_PAGE,
        }
        shape = self.autoscaling.meta.service_model.operation_model(
            "DescribeScalingActivities"
        ).input_shape
        if "Filters" in shape.members:  # newer API; older botocore cannot send it
            lower = datetime.fromtimestamp(since, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
            request["Filters"] = [{"Name": "StartTimeLowerBound", "Values": [lower]}]
        newest: CapacityShortage | None = None
        for _ in range(SCALING_ACTIVITIES_PAGES):
            page = self._call(self.autoscaling, "DescribeScalingActivities", **request)
            _require(page, ("Activities",), "DescribeScalingActivities", "the answer")
            older = False
            for activity in page["Activities"]:
                wanted = ("StatusCode", "StartTime")
                _require(activity, wanted, "DescribeScalingActivities", "an activity")
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

    def _membership(self, instance_id: str) -> dict[str, Any] | None:
        """The group's record of ``instance_id`` (DescribeAutoScalingInstances), or None
        when it is in no group or another one."""
        try:
            found = self._call(
                self.autoscaling, "DescribeAutoScalingInstances", InstanceIds=[instance_id]
            ).get("AutoScalingInstances", [])
        except ConfigurationError as error:
            if _aws_code(error) != "ValidationError":  # e.g. an id that is not an EC2 id
                raise
            found = []
        return next((m for m in found if m.get("AutoScalingGroupName") == self.group), None)

    def scale_down_size(self) -> int:
        """The group's MinSize, described afresh."""
        return int(self._describe_group()["MinSize"])

    def host_noticed(self, instance: Instance, notice: InterruptionNotice) -> None:
        """At EC2's two-minute warning, detach the instance without lowering the
        desired capacity: the group launches its replacement now instead of after the
        reclaim, and EC2 still terminates the instance at the deadline (an Auto
        Scaling group's spot instances are always terminated, never stopped)."""
        if notice.kind != "preempt":
            return  # scale-in is the group's own doing; a rebalance is only a risk
        self._call(
            self.autoscaling,
            "DetachInstances",
            InstanceIds=[instance.id],
            AutoScalingGroupName=self.group,
            ShouldDecrementDesiredCapacity=False,
        )
        log.info("aws: detached %s from %s; its replacement launches now", instance.id, self.group)

    def notice_watcher(self, instance: Instance) -> Mapping[str, Any] | None:
        """Every host watches EC2 instance metadata (IMDSv2): spot/instance-action,
        rebalance recommendations, the group's target lifecycle state."""
        return {"watcher": "aws"}

    def describe(self) -> str:
        """``aws auto scaling group NAME (REGION)``."""
        return f"aws auto scaling group {self.group} ({self.region})"

    def close(self) -> None:
        """Close the clients' connection pools."""
        for client in (self.autoscaling, self.ec2):
            close = getattr(client, "close", None)
            if close is not None:
                close()

    # -------------------------------------------------------------- API plumbing

    @staticmethod
    def _make_clients(
        region: str | None,
        profile: str | None,
        endpoint_url: str | None,
        max_attempts: int,
        session: Any | None,
    ) -> tuple[Any, Any]:
        try:
            import boto3
            import botocore.config
            import botocore.exceptions
        except ImportError:
            raise ConfigurationError(
                "the aws provider needs boto3: pip install 'spotring[aws]'"
            ) from None
        config = botocore.config.Config(
            # total_max_attempts counts the first try; botocore's max_attempts does not.
            retries={"mode": "standard", "total_max_attempts": max_attempts},
            # A stuck call must not hold the controller thread for botocore's 60 s default.
            connect_timeout=5,
            read_timeout=20,
        )
        try:
            if session is None:
                session = boto3.session.Session(profile_name=profile, region_name=region)
            clients = tuple(
                session.client(
                    service, region_name=region, endpoint_url=endpoint_url, config=config
                )
                for service in ("autoscaling", "ec2")
            )
        except botocore.exceptions.ProfileNotFound:
            raise ConfigurationError(
                f"AWS profile '{profile}' not found: check --profile and ~/.aws/config"
            ) from None
        except botocore.exceptions.NoRegionError:
            raise ConfigurationError(
                "no AWS region: pass --region or set AWS_REGION / AWS_DEFAULT_REGION"
            ) from None
        except ValueError as error:  # a malformed --endpoint-url
            raise ConfigurationError(f"bad AWS client settings: {one_line(error)}") from None
        except botocore.exceptions.BotoCoreError as error:
            raise ConfigurationError(f"cannot set up AWS clients: {one_line(error)}") from None
        return clients[0], clients[1]

    def _call(self, client: Any, operation: str, **kwargs: Any) -> dict[str, Any]:
        """One API operation, counted, with every failure turned into ProviderError."""
        import botocore.exceptions

        method = getattr(client, _snake(operation))
        self.api_calls += 1
        try:
            response: dict[str, Any] = method(**kwargs)
        except botocore.exceptions.ClientError as error:
            self.api_retries += error.response.get("ResponseMetadata", {}).get("RetryAttempts", 0)
            translated = self._client_error(operation, error)
            translated.aws_code = error.response.get("Error", {}).get("Code", "")  # type: ignore[attr-defined]  # tagging the exception
            raise translated from None
        except botocore.exceptions.BotoCoreError as error:
            raise self._botocore_error(operation, error, client) from None
        except Exception as error:  # botocore could not read the answer (not XML, cut short)
            action = IAM_ACTION_BY_OPERATION.get(operation, operation)
            raise self.translate_error(action, error) from None
        self.api_retries += response.get("ResponseMetadata", {}).get("RetryAttempts", 0)
        return response

    def _client_error(self, operation: str, error: Any) -> ProviderError:
        details = error.response.get("Error", {})
        code = details.get("Code", "Unknown")
        message = one_line(details.get("Message", ""))
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        action = IAM_ACTION_BY_OPERATION.get(operation, operation)
        if code in _ACCESS_DENIED_CODES:
            # EC2's message carries a long encoded authorization blob: leave it out.
            return ConfigurationError(
                f"AWS denied {action} ({code}): allow it in the IAM policy of the role or"
                " user spotring runs as (see IAM_ACTIONS in spotring.providers.aws)"
            )
        if code in _EXPIRED_CREDENTIAL_CODES:
            return ConfigurationError(
                f"AWS credentials have expired ({code}): refresh them (aws sso login, a new"
                " session token) or use an instance role"
            )
        if code in _BAD_CREDENTIAL_CODES:
            return ConfigurationError(
                f"AWS rejected the credentials ({code}) on {action}: check AWS_PROFILE /"
                " AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY and the region"
            )
        if code == "RequestExpired":
            return ConfigurationError(
                "AWS says the request expired (RequestExpired): check this machine's clock"
            )
        if code in _RETRYABLE_CODES or status >= 500 or status == 429:
            return ProviderError(f"{action} failed after retries: {code}: {message}")
        if "not found" in message.lower() and "autoscalinggroup" in message.lower():
            return ConfigurationError(
                f"auto scaling group '{self.group}' not found in region {self.region}"
            )
        return ConfigurationError(f"{action} failed: {code}: {message}")

    def _botocore_error(self, operation: str, error: Exception, client: Any) -> ProviderError:
        import botocore.exceptions as bce

        action = IAM_ACTION_BY_OPERATION.get(operation, operation)
        if isinstance(error, bce.NoCredentialsError):
            return ConfigurationError(
                "no AWS credentials: set AWS_PROFILE / AWS_ACCESS_KEY_ID or use an instance role"
            )
        if isinstance(error, bce.PartialCredentialsError):
            return ConfigurationError(f"incomplete AWS credentials: {one_line(error)}")
        sso_errors = tuple(
            getattr(bce, name)
            for name in ("TokenRetrievalError", "SSOTokenLoadError", "UnauthorizedSSOTokenError")
            if hasattr(bce, name)
        )
        if sso_errors and isinstance(error, sso_errors):
            return ConfigurationError(
                f"AWS SSO credentials are not usable ({type(error).__name__}): run aws sso login"
            )
        if isinstance(error, bce.ParamValidationError):
            return ConfigurationError(f"bad {action} request: {one_line(error)}")
        if isinstance(
            error,
            (
                bce.EndpointConnectionError,
                bce.ConnectTimeoutError,
                bce.ReadTimeoutError,
                bce.ConnectionClosedError,
            ),
        ):
            return ProviderError(
                f"cannot reach AWS at {client.meta.endpoint_url} for {action}:"
                f" {type(error).__name__}"
            )
        return ProviderError(f"{action} failed: {type(error).__name__}: {one_line(error)}")


def parse_group(argument: str) -> tuple[str | None, str]:
    """``--group`` ``NAME`` -> (None, NAME); ``REGION/NAME`` -> (REGION, NAME).

    Raises :class:`ConfigurationError` for an empty name."""
    region, slash, name = argument.partition("/")
    if not slash or not _REGION_NAME.fullmatch(region):
        region, name = "", argument
    if not name.strip():
        raise ConfigurationError(f"--group {argument!r} names no Auto Scaling group")
    return region or None, name


def _require(record: Any, keys: Sequence[str], operation: str, what: str) -> None:
    """Raise :class:`MalformedAnswer` unless ``record`` has every one of ``keys``."""
    missing = [k for k in keys if not isinstance(record, Mapping) or record.get(k) in (None, "")]
    if missing:
        name = record.get("InstanceId") if isinstance(record, Mapping) else None
        raise MalformedAnswer(
            IAM_ACTION_BY_OPERATION.get(operation, operation),
            f"{what}{f' {name}' if name else ''} without {', '.join(missing)}",
        )


def _member_problem(member: Mapping[str, Any], detail: Mapping[str, Any] | None) -> str:
    """What a member lacks that a usable one has ("": nothing; see the field table)."""
    missing = [k for k in ("LifecycleState", "HealthStatus") if not member.get(k)]
    if missing:
        return f"its group record has no {' or '.join(missing)}"
    return "" if detail is None else _detail_problem(detail)


def _detail_problem(detail: Mapping[str, Any]) -> str:
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


def _tags(detail: Mapping[str, Any]) -> dict[str, str]:
    """The instance's tags, leaving out any without its Key or Value (which make the
    member not usable: :func:`_detail_problem`)."""
    tags = detail.get("Tags") or []
    return {t["Key"]: t["Value"] for t in tags if _is_tag(t)} if isinstance(tags, list) else {}


def _is_tag(tag: Any) -> bool:
    return isinstance(tag, Mapping) and bool(tag.get("Key")) and tag.get("Value") is not None


def _aws_code(error: ProviderError) -> str:
    """The AWS error code behind a translated error ("" for a non-AWS failure)."""
    return getattr(error, "aws_code", "")


def _snake(operation: str) -> str:
    """``DescribeAutoScalingGroups`` -> ``describe_auto_scaling_groups``."""
    return "".join("_" + c.lower() if c.isupper() else c for c in operation).lstrip("_")


def iam_policy(group_arn: str | Sequence[str] = "*") -> dict[str, Any]:
    """The least-privilege IAM policy document for :data:`IAM_ACTIONS`.

    :param group_arn: the group's ARN (or a list of them, for a job of several
        groups), to limit the steering actions to it; the Describe* actions only
        support ``"*"``.
    """
    describe = [a for a in IAM_ACTIONS if a not in IAM_STEERING_ACTIONS]
    resource = group_arn if isinstance(group_arn, str) else list(group_arn)
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "SpotringDescribe", "Effect": "Allow", "Action": describe, "Resource": "*"},
            {
                "Sid": "SpotringSteerGroup",
                "Effect": "Allow",
                "Action": list(IAM_STEERING_ACTIONS),
                "Resource": resource,
            },
        ],
    }


@hookimpl
def spotring_register_providers(registry: ProviderRegistry) -> None:
    """Register :class:`AwsProvider` as ``aws``."""
    registry.add(AwsProvider)


__all__ = [
    "DESCRIBE_INSTANCES_BATCH",
    "EC2_STATE_MAP",
    "HEALTH_STATUS_MAP",
    "IAM_ACTIONS",
    "IAM_ACTION_BY_OPERATION",
    "IAM_STEERING_ACTIONS",
    "LIFECYCLE_STATE_MAP",
    "SHORTAGE_CODES",
    "AwsProvider",
    "iam_policy",
    "member_state",
    "parse_group",
    "shortage_from_activity",
]
