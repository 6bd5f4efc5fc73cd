"""The AWS SDK's clients and the calls through them: making the Auto Scaling and EC2
clients (botocore's own retries), one counted call with its failure translated, and the
paginated and batched Describe* reads a listing makes."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

from spotring.providers.aws.errors import aws_code, botocore_error, client_error
from spotring.providers.aws.permissions import iam_action
from spotring.providers.aws.records import require
from spotring.providers.base import ConfigurationError, ProviderError
from spotring.providers.cloud import batches, one_line

DESCRIBE_INSTANCES_BATCH = 200
"""Instance ids per DescribeInstances call. EC2 accepts at most 200 values in one
filter, and the ids go in an ``instance-id`` filter rather than ``InstanceIds``:
with ``InstanceIds`` one id EC2 does not know yet (a just-launched member, EC2 being
eventually consistent) or no longer (a purged one) fails the whole batch with
InvalidInstanceID.NotFound, while a filter just leaves it out. A 1,000-member group
thus costs 1 + 5 calls per refresh."""

DESCRIBE_INSTANCE_TYPES_BATCH = 100
"""Instance types per DescribeInstanceTypes call (the API's limit)."""

ApiCall = Callable[..., dict[str, Any]]
"""How the rooms make a call: ``call(client, "Operation", **parameters)`` -> the answer,
or a :class:`ProviderError` (:func:`counted_call`, counted on the provider)."""


class Caller(Protocol):
    """Whom :func:`counted_call` counts a call on and names in its errors: the provider."""

    api_calls: int
    api_retries: int
    group: str
    region: str

    def translate_error(self, call_name: str, error: Exception) -> ProviderError: ...


def make_clients(
    region: str | None,
    profile: str | None,
    endpoint_url: str | None,
    max_attempts: int,
    session: Any | None,
) -> tuple[Any, Any]:
    """The (autoscaling, ec2) clients, from ``session`` or a new one of ``profile`` and
    ``region``; no API call. Raises :class:`ConfigurationError` without boto3, for an
    unknown profile, without a region or for a malformed ``endpoint_url``."""
    autoscaling, ec2 = make_service_clients(
        ("autoscaling", "ec2"), region, profile, endpoint_url, max_attempts, session
    )
    return autoscaling, ec2


def make_service_clients(
    services: Sequence[str],
    region: str | None,
    profile: str | None,
    endpoint_url: str | None,
    max_attempts: int,
    session: Any | None,
) -> tuple[Any, ...]:
    """A client for each of ``services``, as :func:`make_clients` makes them."""
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
            session.client(service, region_name=region, endpoint_url=endpoint_url, config=config)
            for service in services
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
    return clients


def credential_source() -> str | None:
    """Where boto3's credential chain finds credentials (``env``, ``shared-credentials-
    file``, ``iam-role``, ...); no API call."""
    import boto3

    credentials = boto3.session.Session().get_credentials()
    return None if credentials is None else f"found ({credentials.method})"


def counted_call(caller: Caller, client: Any, operation: str, /, **kwargs: Any) -> dict[str, Any]:
    """One API operation, counted on ``caller``, with every failure turned into
    ProviderError (tagged with the AWS code: :func:`aws_code`)."""
    import botocore.exceptions

    method = getattr(client, _snake(operation))
    caller.api_calls += 1
    try:
        response: dict[str, Any] = method(**kwargs)
    except botocore.exceptions.ClientError as error:
        caller.api_retries += error.response.get("ResponseMetadata", {}).get("RetryAttempts", 0)
        translated = client_error(operation, error, caller.group, caller.region)
        translated.aws_code = error.response.get("Error", {}).get("Code", "")  # type: ignore[attr-defined]  # tagging the exception
        raise translated from None
    except botocore.exceptions.BotoCoreError as error:
        raise botocore_error(operation, error, client) from None
    except Exception as error:  # botocore could not read the answer (not XML, cut short)
        raise caller.translate_error(iam_action(operation), error) from None
    caller.api_retries += response.get("ResponseMetadata", {}).get("RetryAttempts", 0)
    return response


def _snake(operation: str) -> str:
    """``DescribeAutoScalingGroups`` -> ``describe_auto_scaling_groups``."""
    return "".join("_" + c.lower() if c.isupper() else c for c in operation).lstrip("_")


# ------------------------------------------------------------------------ reads


def describe_group(call: ApiCall, autoscaling: Any, group: str, region: str) -> dict[str, Any]:
    """The record of ``group``; its ``Instances`` come whole in the one record. Raises
    :class:`ConfigurationError` when ``region`` has no such group."""
    records: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        kwargs: dict[str, Any] = {"AutoScalingGroupNames": [group]}
        if token:
            kwargs["NextToken"] = token
        page = call(autoscaling, "DescribeAutoScalingGroups", **kwargs)
        # An unknown group is an empty list; no list at all is a broken answer.
        require(page, ("AutoScalingGroups",), "DescribeAutoScalingGroups", "the answer")
        records.extend(page["AutoScalingGroups"])
        token = page.get("NextToken")
        if not token:
            break
    for found in records:
        require(found, ("AutoScalingGroupName",), "DescribeAutoScalingGroups", "a group")
    record = next((r for r in records if r["AutoScalingGroupName"] == group), None)
    if record is None:
        raise ConfigurationError(f"auto scaling group '{group}' not found in region {region}")
    # AWS always sends these (an empty group: an empty Instances list).
    wanted = ("Instances", "MinSize", "MaxSize")
    require(record, wanted, "DescribeAutoScalingGroups", f"group {group}")
    for member in record["Instances"]:
        require(member, ("InstanceId",), "DescribeAutoScalingGroups", "a member")
    return record


def describe_instances(call: ApiCall, ec2: Any, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The EC2 records of ``ids`` that EC2 has, by id (see
    :data:`DESCRIBE_INSTANCES_BATCH`)."""
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
            page = call(ec2, "DescribeInstances", **kwargs)
            require(page, ("Reservations",), "DescribeInstances", "the answer")
            for reservation in page["Reservations"]:
                require(reservation, ("Instances",), "DescribeInstances", "a reservation")
                for detail in reservation["Instances"]:
                    require(detail, ("InstanceId",), "DescribeInstances", "an instance")
                    details[detail["InstanceId"]] = detail
            token = page.get("NextToken")
            if not token:
                break
    return details


def learn_gpu_counts(
    call: ApiCall, ec2: Any, instance_types: Sequence[str], gpus_by_type: dict[str, int]
) -> None:
    """Put the GPU count of each of ``instance_types`` into ``gpus_by_type`` (0 GPUs ->
    1 slot; a type EC2 does not know: 1), batch by batch."""
    for batch in batches(instance_types, DESCRIBE_INSTANCE_TYPES_BATCH):
        try:
            found = _describe_instance_types(call, ec2, list(batch))
        except ConfigurationError as error:
            if aws_code(error) != "InvalidInstanceType":
                raise
            # One type EC2 does not know fails the batch: ask for each alone.
            found = {}
            for instance_type in batch:
                try:
                    found.update(_describe_instance_types(call, ec2, [instance_type]))
                except ConfigurationError as single:
                    if aws_code(single) != "InvalidInstanceType":
                        raise
        for instance_type in batch:
            gpus_by_type[instance_type] = max(1, found.get(instance_type, 1))


def _describe_instance_types(call: ApiCall, ec2: Any, instance_types: list[str]) -> dict[str, int]:
    page = call(ec2, "DescribeInstanceTypes", InstanceTypes=instance_types)
    require(page, ("InstanceTypes",), "DescribeInstanceTypes", "the answer")
    for item in page["InstanceTypes"]:
        require(item, ("InstanceType",), "DescribeInstanceTypes", "an instance type")
    return {
        item["InstanceType"]: sum(
            gpu.get("Count", 0) for gpu in item.get("GpuInfo", {}).get("Gpus", [])
        )
        for item in page.get("InstanceTypes", [])
    }


def membership(
    call: ApiCall, autoscaling: Any, group: str, instance_id: str
) -> dict[str, Any] | None:
    """The group's record of ``instance_id`` (DescribeAutoScalingInstances), or None
    when it is in no group or another one."""
    try:
        found = call(autoscaling, "DescribeAutoScalingInstances", InstanceIds=[instance_id]).get(
            "AutoScalingInstances", []
        )
    except ConfigurationError as error:
        if aws_code(error) != "ValidationError":  # e.g. an id that is not an EC2 id
            raise
        found = []
    return next((m for m in found if m.get("AutoScalingGroupName") == group), None)
