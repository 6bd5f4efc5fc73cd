"""The ``aws`` provider: an EC2 Auto Scaling group.

spotring lists the group's members with one DescribeAutoScalingGroups call (lifecycle
and health), then DescribeInstances in batches (address, EC2 state, spot or on-demand,
type, zone, tags). It steers the group with SetDesiredCapacity and replaces a failed
host by marking it Unhealthy, so the group itself terminates and relaunches it.

boto3 is imported on first use, so importing this module (and ``spotring --help``) costs
nothing when the ``aws`` extra is not installed.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from spotring.core.hooks import hookimpl
from spotring.providers.base import (
    ConfigurationError,
    CoreOptions,
    Instance,
    InstanceState,
    InterruptionNotice,
    Lifecycle,
    ProviderError,
)
from spotring.providers.cloud import (
    DEFAULT_MAX_API_ATTEMPTS,
    CloudGroupProvider,
    DescribeOnce,
    MalformedAnswer,
    batches,
    lookup_state,
    one_line,
    worst_state,
)

if TYPE_CHECKING:
    from spotring.providers.base import ProviderRegistry

log = logging.getLogger(__name__)

# ------------------------------------------------------------------ IAM and limits

_IAM_ACTION_BY_OPERATION: Mapping[str, str] = {
    "DescribeAutoScalingGroups": "autoscaling:DescribeAutoScalingGroups",
    "DescribeAutoScalingInstances": "autoscaling:DescribeAutoScalingInstances",
    "SetDesiredCapacity": "autoscaling:SetDesiredCapacity",
    "SetInstanceHealth": "autoscaling:SetInstanceHealth",
    "DetachInstances": "autoscaling:DetachInstances",
    "DescribeInstances": "ec2:DescribeInstances",
    "DescribeInstanceTypes": "ec2:DescribeInstanceTypes",
}

IAM_ACTIONS: tuple[str, ...] = tuple(_IAM_ACTION_BY_OPERATION.values())
"""Every IAM action the provider calls; the policy of the role spotring runs as must
allow all of them (see :func:`iam_policy`)."""

IAM_STEERING_ACTIONS: tuple[str, ...] = (
    "autoscaling:SetDesiredCapacity",
    "autoscaling:SetInstanceHealth",
    "autoscaling:DetachInstances",
)
"""The actions that change the group; they accept the group's ARN as resource, while
the Describe* actions only accept ``"*"``."""

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

# ------------------------------------------------------- fields the answers must hold
#
# A field the API reference marks required (botocore's service model carries the same
# "required" lists) missing makes the listing a retryable MalformedAnswer; an optional
# one keeps its documented meaning. References: Amazon EC2 Auto Scaling API Reference
# (autoscaling/ec2/APIReference), Amazon EC2 API Reference (AWSEC2/latest/APIReference).
#
# DescribeAutoScalingGroups
#   AutoScalingGroups               required (API_DescribeAutoScalingGroups, Response)
#   AutoScalingGroupName, MinSize,  required (API_AutoScalingGroup)
#   MaxSize
#   Instances                       "Required: No" (API_AutoScalingGroup); spotring still
#                                   requires it: an absent list cannot be told from an
#                                   answer cut short, and an empty group drops every host
#   Instances[].InstanceId,         required (API_Instance)
#   LifecycleState, HealthStatus
# DescribeInstances (API_Instance marks every member "Required: No")
#   Reservations[].Instances[]      the list itself: what the filtered call returns
#   InstanceId                      needed to match the member asked for (instance-id filter)
#   State.Name                      needed: without it a running instance looks like none
#   PrivateIpAddress                optional: absent while pending (not assigned yet);
#                                   required once State.Name is running, where an instance
#                                   in a VPC always has its primary private IPv4 address
#   Tags[].Key, Tags[].Value        required of a tag that is sent (API_Tag)
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
    ) -> None:
        """Make the clients; no API call. See :meth:`add_arguments` for the options.

        :param session: a ``boto3.session.Session`` to make the clients from, for
            embedding and tests; by default a new one from ``profile`` and ``region``.
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
        self._gpus_by_type: dict[str, int] = {}
        self._group_record: dict[str, Any] | None = None
        # EC2 details of running members: address, type, zone, lifecycle and tags do
        # not change while an instance runs, so each member is described once.
        self._details: DescribeOnce[str, dict[str, Any]] = DescribeOnce(
            self._describe_instances, lambda detail: detail["State"]["Name"] == "running"
        )
        # Public so that tests and plugins can hook botocore events on them.
        self.autoscaling, self.ec2 = self._make_clients(
            region, profile, endpoint_url, max_api_attempts, session
        )
        self.region: str = self.autoscaling.meta.region_name

    @classmethod
    def add_arguments(cls, group: argparse._ArgumentGroup) -> None:
        """Add ``--group``, ``--region``, ``--profile`` and the other AWS options."""
        group.add_argument(
            "--group", dest="aws_group", metavar="NAME", help="Auto Scaling group name (required)"
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
        """Make the provider from parsed options; makes no API call.

        Raises :class:`ConfigurationError` without ``--group``, for an unknown profile
        or when no region is configured.
        """
        group = getattr(options, "aws_group", None)
        if not group:
            raise ConfigurationError("--group is required for --provider aws")
        common = cls.common_options(options, core, "aws")
        return cls(
            group,
            region=getattr(options, "aws_region", None),
            profile=getattr(options, "aws_profile", None),
            endpoint_url=getattr(options, "aws_endpoint_url", None),
            slots_tag=common.pop("slots_label"),
            **common,
        )

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
        members = record.get("Instances", [])
        details = self._details.get([m["InstanceId"] for m in members])
        self._learn_gpu_counts(
            details[m["InstanceId"]].get("InstanceType", "")
            for m in members
            if m["InstanceId"] in details and self._needs_gpu_count(details[m["InstanceId"]])
        )
        return [self._to_instance(m, details.get(m["InstanceId"])) for m in members]

    def _to_instance(self, member: Mapping[str, Any], detail: Mapping[str, Any] | None) -> Instance:
        lifecycle_state = member.get("LifecycleState", "")
        health = member.get("HealthStatus", "")
        ec2_state = detail["State"]["Name"] if detail else None
        detail = detail or {}
        tags = {t["Key"]: t["Value"] for t in detail.get("Tags", [])}
        launch_time = detail.get("LaunchTime")
        spot = detail.get("InstanceLifecycle") == "spot"
        return Instance(
            id=member["InstanceId"],
            address=detail.get("PrivateIpAddress", ""),
            state=member_state(lifecycle_state, health, ec2_state),
            slots=self.slots.slots(
                member["InstanceId"], tags, self._gpus_by_type.get(detail.get("InstanceType", ""))
            ),
            lifecycle=Lifecycle.SPOT if spot else Lifecycle.ON_DEMAND,
            zone=detail.get("Placement", {}).get("AvailabilityZone")
            or member.get("AvailabilityZone", ""),
            instance_type=cast(str, detail.get("InstanceType") or member.get("InstanceType", "")),
            launch_time=launch_time.timestamp() if launch_time is not None else None,
            cloud_state=f"{lifecycle_state}/{health}/{ec2_state or 'missing'}",
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
            wanted = ("InstanceId", "LifecycleState", "HealthStatus")
            _require(member, wanted, "DescribeAutoScalingGroups", "a member")
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
                        _check_detail(detail)
                        details[detail["InstanceId"]] = detail
                token = page.get("NextToken")
                if not token:
                    break
        return details

    # -------------------------------------------------------------------- slots

    def _needs_gpu_count(self, detail: Mapping[str, Any]) -> bool:
        tags = {t["Key"]: t["Value"] for t in detail.get("Tags", [])}
        return self.slots.needs_accelerator_count(detail.get("InstanceId", ""), tags)

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
        try:
            found = self._call(
                self.autoscaling, "DescribeAutoScalingInstances", InstanceIds=[instance_id]
            ).get("AutoScalingInstances", [])
        except ConfigurationError as error:
            if _aws_code(error) != "ValidationError":  # e.g. an id that is not an EC2 id
                raise
            found = []
        member = next((m for m in found if m.get("AutoScalingGroupName") == self.group), None)
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
            action = _IAM_ACTION_BY_OPERATION.get(operation, operation)
            raise self.translate_error(action, error) from None
        self.api_retries += response.get("ResponseMetadata", {}).get("RetryAttempts", 0)
        return response

    def _client_error(self, operation: str, error: Any) -> ProviderError:
        details = error.response.get("Error", {})
        code = details.get("Code", "Unknown")
        message = one_line(details.get("Message", ""))
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        action = _IAM_ACTION_BY_OPERATION.get(operation, operation)
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

        action = _IAM_ACTION_BY_OPERATION.get(operation, operation)
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


def _require(record: Any, keys: Sequence[str], operation: str, what: str) -> None:
    """Raise :class:`MalformedAnswer` unless ``record`` has every one of ``keys``."""
    missing = [k for k in keys if not isinstance(record, Mapping) or record.get(k) in (None, "")]
    if missing:
        name = record.get("InstanceId") if isinstance(record, Mapping) else None
        raise MalformedAnswer(
            _IAM_ACTION_BY_OPERATION.get(operation, operation),
            f"{what}{f' {name}' if name else ''} without {', '.join(missing)}",
        )


def _check_detail(detail: Any) -> None:
    """An EC2 instance record must say what it is, its state and, running, its address."""
    _require(detail, ("InstanceId", "State"), "DescribeInstances", "an instance")
    _require(
        detail["State"], ("Name",), "DescribeInstances", f"the state of {detail['InstanceId']}"
    )
    if detail["State"]["Name"] == "running":
        _require(detail, ("PrivateIpAddress",), "DescribeInstances", "running instance")
    for tag in detail.get("Tags") or ():
        if not isinstance(tag, Mapping) or not tag.get("Key") or tag.get("Value") is None:
            raise MalformedAnswer("ec2:DescribeInstances", f"a tag of {detail['InstanceId']}")


def _aws_code(error: ProviderError) -> str:
    """The AWS error code behind a translated error ("" for a non-AWS failure)."""
    return getattr(error, "aws_code", "")


def _snake(operation: str) -> str:
    """``DescribeAutoScalingGroups`` -> ``describe_auto_scaling_groups``."""
    return "".join("_" + c.lower() if c.isupper() else c for c in operation).lstrip("_")


def iam_policy(group_arn: str = "*") -> dict[str, Any]:
    """The least-privilege IAM policy document for :data:`IAM_ACTIONS`.

    :param group_arn: the group's ARN, to limit the steering actions to it; the
        Describe* actions only support ``"*"``.
    """
    describe = [a for a in IAM_ACTIONS if a not in IAM_STEERING_ACTIONS]
    return {
        "Version": "2012-10-17",
        "Statement": [
            {"Sid": "SpotringDescribe", "Effect": "Allow", "Action": describe, "Resource": "*"},
            {
                "Sid": "SpotringSteerGroup",
                "Effect": "Allow",
                "Action": list(IAM_STEERING_ACTIONS),
                "Resource": group_arn,
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
    "LIFECYCLE_STATE_MAP",
    "AwsProvider",
    "iam_policy",
    "member_state",
]
