"""The ``aws`` provider's class, :class:`AwsProvider`: an EC2 Auto Scaling group listed
and steered through the package's rooms, and its registration."""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from spotring.core.hooks import hookimpl
from spotring.providers.aws import capacity, client, prices
from spotring.providers.aws.errors import member_not_found
from spotring.providers.aws.options import (
    DEFAULT_SLOTS_TAG,
    AwsOptions,
    add_aws_arguments,
    parse_group,
)
from spotring.providers.aws.records import (
    detail_problem,
    instance_tags,
    member_instance,
    member_problem,
)
from spotring.providers.aws.states import LIFECYCLE_STATE_MAP
from spotring.providers.base import (
    CapacityShortage,
    ConfigurationError,
    CoreOptions,
    HourlyPrice,
    Instance,
    InstanceState,
    InterruptionNotice,
    Lifecycle,
    Provider,
)
from spotring.providers.cloud import (
    DEFAULT_MAX_API_ATTEMPTS,
    CloudGroupProvider,
    DescribeOnce,
    EpisodeWarnings,
    refuse_repeated_groups,
)

if TYPE_CHECKING:
    from spotring.providers.base import ProviderRegistry

# The package's logger: the name spotring's AWS logs have always carried.
log = logging.getLogger(__package__)


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
        pricing: Any | None = None,
    ) -> None:
        """Make the clients; no API call. See :meth:`add_arguments` for the options.

        :param session: a ``boto3.session.Session`` to make the clients from, for
            embedding and tests; by default a new one from ``profile`` and ``region``.
        :param clients: the (autoscaling, ec2) clients of another group in the same
            region, to share instead of making new ones (:meth:`groups_from_options`).
        :param label: what :meth:`group_name` answers; default the group's name.
        :param pricing: the Price List query API's client; by default one made from
            ``session`` or ``profile`` when the on-demand price is first read.
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
            lambda ids: client.describe_instances(self._call, self.ec2, ids),
            lambda detail: not detail_problem(detail) and detail["State"]["Name"] == "running",
        )
        self._odd = EpisodeWarnings(log)  # members listed as not usable for what they lack
        # Public so that tests and plugins can hook botocore events on them.
        self.autoscaling, self.ec2 = clients or client.make_clients(
            region, profile, endpoint_url, max_api_attempts, session
        )
        self.region: str = self.autoscaling.meta.region_name
        self._pricing = pricing
        self._endpoint_url = endpoint_url
        self._client_args = (profile, max_api_attempts, session)  # for the pricing client

    @classmethod
    def add_arguments(cls, group: argparse._ArgumentGroup) -> None:
        """Add ``--group``, ``--region``, ``--profile`` and the other AWS options."""
        add_aws_arguments(group)
        cls.add_common_arguments(group, "aws")

    @classmethod
    def credential_source(cls) -> str | None:
        """Where boto3's credential chain finds credentials (``env``, ``shared-
        credentials-file``, ``iam-role``, ...); no API call."""
        return client.credential_source()

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
        aws = AwsOptions.read(options)
        specs = [parse_group(name) for name in aws.groups]
        if not specs:
            raise ConfigurationError("--group is required for --provider aws")
        common = cls.common_options(options, core, "aws")
        slots_tag = common.pop("slots_label")
        clients: dict[str | None, tuple[Any, Any]] = {}
        made: list[AwsProvider] = []
        try:
            for region, name in specs:
                key = region or aws.region
                provider = cls(
                    name,
                    region=key,
                    profile=aws.profile,
                    endpoint_url=aws.endpoint_url,
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
            problem = member_problem(member, detail)
            instance = member_instance(member, detail, problem, self.slots, self._gpus_by_type)
            instances.append(instance)
            if problem:
                odd[f"aws: group {self.group} member {instance.id}"] = (
                    f"aws: group {self.group}: member {instance.id} is listed as"
                    f" {instance.state.value}, not usable: {problem}"
                )
        self._odd.update(odd)  # one warning per member while it stays odd
        return instances

    def _describe_group(self) -> dict[str, Any]:
        """The group's record, kept for steering; its ``Instances`` come whole in it."""
        self._group_record = client.describe_group(
            self._call, self.autoscaling, self.group, self.region
        )
        return self._group_record

    # -------------------------------------------------------------------- slots

    def _needs_gpu_count(self, detail: Mapping[str, Any]) -> bool:
        return self.slots.needs_accelerator_count(
            detail.get("InstanceId", ""), instance_tags(detail)
        )

    def _learn_gpu_counts(self, instance_types: Iterable[str]) -> None:
        """Fill the per-type GPU cache for types not seen before (0 GPUs -> 1 slot)."""
        unknown = sorted({t for t in instance_types if t and t not in self._gpus_by_type})
        client.learn_gpu_counts(self._call, self.ec2, unknown, self._gpus_by_type)

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
            if member_not_found(error):
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
            if member_not_found(error):
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
            record = self._group_record or self._describe_group()
            self._lifecycle = (capacity.launch_lifecycle(self._call, self.ec2, record, self.group),)
        return self._lifecycle[0]

    def hourly_price(self) -> HourlyPrice | None:
        """A member's price for one hour, by what the group launches
        (:meth:`group_lifecycle`): spot from DescribeSpotPriceHistory, on-demand from
        the Price List query API; the median over the group's instance types (and, for
        spot, its zones: see :mod:`spotring.providers.aws.prices`). None when the
        group's configuration names no instance type, no price is listed, or, for
        on-demand, the group is reached through ``--endpoint-url`` (a test or private
        endpoint) and no Price List client was given."""
        record = self._describe_group()
        data = capacity.launch_template_data(self._call, self.ec2, record, self.group)
        types = prices.launch_types(data, record)
        if not types:
            return None
        now = time.time()
        if self.group_lifecycle() is Lifecycle.SPOT:
            zones = record.get("AvailabilityZones") or []
            usd = prices.spot_price(self._call, self.ec2, types, zones)
            return None if usd is None else HourlyPrice(usd, prices.SPOT_SOURCE, now)
        if self._pricing is None and self._endpoint_url:
            return None
        if self._pricing is None:
            profile, attempts, session = self._client_args
            (self._pricing,) = client.make_service_clients(
                ("pricing",), prices.PRICING_REGION, profile, None, attempts, session
            )
        usd = prices.on_demand_price(self._call, self._pricing, types, self.region)
        return None if usd is None else HourlyPrice(usd, prices.ON_DEMAND_SOURCE, now)

    def capacity_shortage(self, since: float) -> CapacityShortage | None:
        """The newest launch the group's scaling activities say failed at or after
        ``since`` (epoch seconds): InsufficientInstanceCapacity, "Could not launch Spot
        Instances", SpotMaxPriceTooLow, a quota (see :data:`SHORTAGE_CODES`), or None.

        Reads only: DescribeScalingActivities for this group, newest first, at most
        :data:`SCALING_ACTIVITIES_PAGES` pages of :data:`SCALING_ACTIVITIES_PAGE`, with
        the StartTimeLowerBound filter where the installed botocore knows it.
        """
        return capacity.newest_shortage(self._call, self.autoscaling, self.group, since)

    def _membership(self, instance_id: str) -> dict[str, Any] | None:
        return client.membership(self._call, self.autoscaling, self.group, instance_id)

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
        for api_client in (self.autoscaling, self.ec2, self._pricing):
            close = getattr(api_client, "close", None)
            if close is not None:
                close()

    def _call(self, api_client: Any, operation: str, **kwargs: Any) -> dict[str, Any]:
        """One API operation, counted, with every failure turned into ProviderError."""
        return client.counted_call(self, api_client, operation, **kwargs)


@hookimpl
def spotring_register_providers(registry: ProviderRegistry) -> None:
    """Register :class:`AwsProvider` as ``aws``."""
    registry.add(AwsProvider)
