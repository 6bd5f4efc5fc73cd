"""Helpers for the AWS provider tests: moto groups, injected API errors, a fast fake API.

moto answers in process (``mock_aws``) or on loopback (``ThreadedMotoServer``), but
serialises each EC2 instance in about 30 ms, so groups of hundreds of members go through
:class:`FakeGroupApi` instead.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import datetime, timezone
from typing import Any

REGION = "us-east-1"
ACCOUNT = "123456789012"  # moto's default account
AMI = "ami-12c6146b"  # an image moto knows in us-east-1


_botocore_sessions: list[Any] = []


@contextlib.contextmanager
def running_moto_server() -> Iterator[str]:
    """A moto server on loopback (a free port) for the test's duration; its URL."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def boto_session() -> Any:
    """A boto3 session over one botocore session shared by the tests.

    Loading the EC2 service model costs about 0.3 s per botocore session, and moto
    drops boto3's default session each time a mock starts.
    """
    import boto3
    import botocore.session

    if not _botocore_sessions:
        _botocore_sessions.append(botocore.session.Session())
    return boto3.session.Session(botocore_session=_botocore_sessions[0], region_name=REGION)


def create_group(
    name: str = "workers",
    *,
    size: int = 3,
    min_size: int = 0,
    max_size: int = 8,
    instance_type: str = "t3.micro",
    region: str = REGION,
    endpoint_url: str | None = None,
) -> list[str]:
    """Create a launch template and an Auto Scaling group; return the member ids."""
    session = boto_session()
    ec2 = session.client("ec2", region_name=region, endpoint_url=endpoint_url)
    autoscaling = session.client("autoscaling", region_name=region, endpoint_url=endpoint_url)
    template = f"{name}-template"
    ec2.create_launch_template(
        LaunchTemplateName=template,
        LaunchTemplateData={"ImageId": AMI, "InstanceType": instance_type},
    )
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=name,
        MinSize=min_size,
        MaxSize=max_size,
        DesiredCapacity=size,
        LaunchTemplate={"LaunchTemplateName": template},
        AvailabilityZones=[f"{region}a"],
    )
    group = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[name])
    return [m["InstanceId"] for m in group["AutoScalingGroups"][0]["Instances"]]


def moto_members(name: str, region: str = REGION) -> dict[str, Any]:
    """moto's own records of a group's members (``InstanceState``), by instance id.

    Tests set ``lifecycle_state`` / ``health_status`` on these, and on ``.instance``
    (the EC2 record) ``lifecycle = "spot"`` or the EC2 state, where the AWS API offers
    no way to put a member in that state.
    """
    from moto.autoscaling.models import autoscaling_backends

    group = autoscaling_backends[ACCOUNT][region].autoscaling_groups[name]
    return {member.instance.id: member for member in group.instance_states}


def set_ec2_state(member: Any, state: str) -> None:
    """Put moto's EC2 record of ``member`` into ``state`` (pending, stopped, ...)."""
    codes = {"pending": 0, "running": 16, "shutting-down": 32, "terminated": 48}
    codes |= {"stopping": 64, "stopped": 80}
    member.instance._state.name = state
    member.instance._state.code = codes[state]


def make_ipv6_only(member: Any, address: str = "2600:1f18:0:1::10") -> None:
    """Make moto's EC2 record of ``member`` an IPv6-only instance: DescribeInstances then
    gives its ``Ipv6Address`` and no ``PrivateIpAddress`` (an instance in an IPv6-only
    subnet has no IPv4 address: EC2 User Guide, "IPv6-only subnets"). moto cannot
    launch one, and derives PrivateIpAddress and PrivateDnsName from the first network
    interface's IPv4 address, so the record's class is swapped for one without them."""
    instance = member.instance
    base = type(instance)
    instance.__class__ = type(
        "Ipv6OnlyInstance",
        (base,),
        {
            "__module__": base.__module__,  # moto's model metaclass reads its service here
            "private_ip": None,
            "private_ip_address": None,
            "private_dns_name": "",
            "ipv6_address": address,
        },
    )


def forget_ec2_instance(instance_id: str, region: str = REGION) -> None:
    """Drop an instance from moto's EC2 records while its group still lists it."""
    from moto.ec2.models import ec2_backends

    for reservation in ec2_backends[ACCOUNT][region].reservations.values():
        reservation.instances = [i for i in reservation.instances if i.id != instance_id]


# ------------------------------------------------------------ injected API errors


class _Body(io.BytesIO):
    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self.getvalue()


def error_response(client: Any, status: int, code: str, message: str = "injected") -> Any:
    """An HTTP error response in ``client``'s wire protocol, for a ``before-send`` hook."""
    from botocore.awsrequest import AWSResponse

    if client.meta.service_model.protocol == "ec2":
        body = (
            f"<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message>"
            "</Error></Errors><RequestID>injected</RequestID></Response>"
        )
    else:  # query: Auto Scaling
        body = (
            f"<ErrorResponse><Error><Type>Sender</Type><Code>{code}</Code>"
            f"<Message>{message}</Message></Error><RequestId>injected</RequestId></ErrorResponse>"
        )
    return AWSResponse(client.meta.endpoint_url, status, {}, _Body(body.encode()))


def inject_errors(
    client: Any,
    operation: str,
    status: int,
    code: str,
    *,
    times: int | None = None,
    message: str = "injected",
) -> Callable[[], int]:
    """Answer the next ``times`` sends of ``operation`` (all, if None) with an error.

    Hooks ``before-send``, so botocore's retry logic sees the errors as it would see
    AWS's. Returns a function giving how many errors were injected.
    """
    sent = {"errors": 0}

    def before_send(**_: Any) -> Any:
        if times is not None and sent["errors"] >= times:
            return None
        sent["errors"] += 1
        return error_response(client, status, code, message)

    event_service = client.meta.service_model.service_id.hyphenize()
    client.meta.events.register_first(f"before-send.{event_service}.{operation}", before_send)
    return lambda: sent["errors"]


def count_operations(*clients: Any) -> Counter[str]:
    """Count the operations (not retries) made through ``clients`` from now on."""
    counter: Counter[str] = Counter()

    def before_call(model: Any, **_: Any) -> None:
        counter[f"{model.service_model.signing_name}:{model.name}"] += 1

    for client in clients:
        client.meta.events.register("before-call", before_call)
    return counter


# ----------------------------------------------------------- fast fake for big groups


class _FakeClient:
    def __init__(self, api: FakeGroupApi, endpoint_url: str) -> None:
        self._api = api
        self.meta = type("Meta", (), {"endpoint_url": endpoint_url, "region_name": REGION})()

    def __getattr__(self, name: str) -> Callable[..., dict[str, Any]]:
        handler = getattr(self._api, name)

        def call(**kwargs: Any) -> dict[str, Any]:
            self._api.calls[name] += 1
            return handler(**kwargs)

        return call


class FakeGroupApi:
    """An Auto Scaling group of ``size`` members answered from dicts, with AWS's limits.

    Install with ``provider.autoscaling, provider.ec2 = api.autoscaling, api.ec2``. It
    enforces what moto does not: at most 200 values in an EC2 filter, MaxResults within
    5..1000 and paging by it, at most 100 instance types per DescribeInstanceTypes.
    """

    def __init__(self, name: str, size: int, instance_type: str = "p3.8xlarge") -> None:
        self.name = name
        self.calls: Counter[str] = Counter()
        self.filter_sizes: list[int] = []
        self.page_limit = 1000
        """Most instances per DescribeInstances page; AWS may return fewer than asked."""
        launched = datetime(2024, 1, 1, tzinfo=timezone.utc)
        self.members = [
            {
                "InstanceId": f"i-{n:017x}",
                "LifecycleState": "InService",
                "HealthStatus": "Healthy",
                "AvailabilityZone": f"{REGION}a",
                "InstanceType": instance_type,
            }
            for n in range(size)
        ]
        self.instances = {
            m["InstanceId"]: {
                "InstanceId": m["InstanceId"],
                "InstanceType": instance_type,
                "PrivateIpAddress": f"10.{n // 65536}.{n // 256 % 256}.{n % 256}",
                "State": {"Code": 16, "Name": "running"},
                "InstanceLifecycle": "spot",
                "Placement": {"AvailabilityZone": f"{REGION}a"},
                "LaunchTime": launched,
                "Tags": [{"Key": "aws:autoscaling:groupName", "Value": name}],
            }
            for n, m in enumerate(self.members)
        }
        self.autoscaling = _FakeClient(self, "https://autoscaling.us-east-1.amazonaws.com")
        self.ec2 = _FakeClient(self, "https://ec2.us-east-1.amazonaws.com")

    def describe_auto_scaling_groups(self, AutoScalingGroupNames: list[str]) -> dict[str, Any]:
        assert len(AutoScalingGroupNames) <= 100
        record = {
            "AutoScalingGroupName": self.name,
            "MinSize": 0,
            "MaxSize": len(self.members) * 2,
            "DesiredCapacity": len(self.members),
            "Instances": self.members,
        }
        groups = [record] if self.name in AutoScalingGroupNames else []
        return {"AutoScalingGroups": groups}

    def describe_instances(
        self,
        Filters: list[dict[str, Any]],
        MaxResults: int,
        NextToken: str | None = None,
    ) -> dict[str, Any]:
        assert 5 <= MaxResults <= 1000, "EC2 takes MaxResults in 5..1000"
        (only,) = Filters
        assert only["Name"] == "instance-id"
        assert len(only["Values"]) <= 200, "EC2 takes at most 200 values per filter"
        self.filter_sizes.append(len(only["Values"]))
        found = [self.instances[i] for i in only["Values"] if i in self.instances]
        start = int(NextToken or 0)
        end = start + min(MaxResults, self.page_limit)
        response: dict[str, Any] = {"Reservations": [{"Instances": found[start:end]}]}
        if end < len(found):
            response["NextToken"] = str(end)
        return response

    def describe_instance_types(self, InstanceTypes: list[str]) -> dict[str, Any]:
        assert len(InstanceTypes) <= 100
        gpus = {"p3.8xlarge": 4, "p3.2xlarge": 1}
        return {
            "InstanceTypes": [
                {"InstanceType": t, "GpuInfo": {"Gpus": [{"Count": gpus[t]}]}}
                if t in gpus
                else {"InstanceType": t}
                for t in InstanceTypes
            ]
        }


def capture_params(client: Any, operation: str) -> list[dict[str, Any]]:
    """Record the parameters of every ``operation`` call made through ``client``."""
    captured: list[dict[str, Any]] = []

    def provide_params(params: dict[str, Any], **_: Any) -> None:
        captured.append(dict(params))

    event_service = client.meta.service_model.service_id.hyphenize()
    client.meta.events.register(
        f"provide-client-params.{event_service}.{operation}", provide_params
    )
    return captured


# ------------------------------------------- scaling activities and launch failures
#
# moto 5.2 answers DescribeScalingActivities with an empty list and launches every
# member the group asks for. ``LaunchActivities`` fills the gap in the test's moto (in
# process or its ThreadedMotoServer: both run moto's classes in this process): it hooks
# moto's group so that each launch records the activity AWS records, lets a test take a
# group's capacity away (launches beyond it fail and record a Failed activity with the
# message AWS writes) and give it back, and answers DescribeScalingActivities from that
# record the way the API reference describes the call:
#
# * API_DescribeScalingActivities: AutoScalingGroupName, ActivityIds, MaxRecords
#   (default and most 100), NextToken, Filters StartTimeLowerBound / StartTimeUpperBound
#   (ISO 8601) and Status; activities newest first, "Activities still in progress are
#   described first".
# * API_Activity: ActivityId, AutoScalingGroupName, Cause, StartTime and StatusCode
#   always; Description, EndTime, StatusMessage, Progress, Details, AutoScalingGroupARN
#   optional, and a successful launch has no StatusMessage.
# * The texts follow AWS's own records (Auto Scaling User Guide, "Verify a scaling
#   activity" and "Troubleshoot ... instance launch failures"): a failed launch's
#   Description is "Launching a new EC2 instance.  Status Reason: <StatusMessage>".

SPOT_NO_CAPACITY = (
    "Could not launch Spot Instances. InsufficientInstanceCapacity - There is no Spot"
    " capacity available that matches your request. Launching EC2 instance failed."
)
"""The StatusMessage of a spot launch that failed for capacity."""

_DONE = ("Successful", "Failed", "Cancelled")


class LaunchActivities:
    """Scaling activities and launch capacity for the moto groups of one test.

    Use as a context manager (it patches moto's classes while open), or through the
    ``launch_activities`` fixture of the capacity tests.
    """

    def __init__(self) -> None:
        self.activities: list[dict[str, Any]] = []
        self.capacity: dict[str, int] = {}
        """Group name -> the most members it can have; launches beyond fail."""
        self.spot_groups: set[str] = set()
        self.message: dict[str, str] = {}
        self._undo: list[Callable[[], None]] = []

    # ----------------------------------------------------------- what tests call

    def limit(self, group: str, capacity: int, *, spot: bool = True, message: str = "") -> None:
        """At most ``capacity`` members for ``group`` from now on; launches beyond it fail
        with ``message`` (default: no spot capacity). With ``spot`` its members are
        spot instances. A higher limit lets the group launch what it is missing at
        once, as an Auto Scaling group retries a failed launch by itself."""
        self.capacity[group] = capacity
        if spot:
            self.spot_groups.add(group)
        if message:
            self.message[group] = message
        self.retry(group)

    def retry(self, group: str, region: str = REGION) -> None:
        """The group's own retry of the launches it is missing (AWS retries on its own
        schedule; tests call this where that retry would fall)."""
        from moto.autoscaling.models import autoscaling_backends

        found = autoscaling_backends[ACCOUNT][region].autoscaling_groups[group]
        found.set_desired_capacity(found.desired_capacity)

    def add(
        self,
        group: str,
        status_code: str,
        *,
        start: datetime,
        message: str | None = None,
        description: str | None = None,
        region: str = REGION,
    ) -> dict[str, Any]:
        """Record an activity as AWS would have; returns it."""
        activity: dict[str, Any] = {
            "ActivityId": _activity_id(),
            "AutoScalingGroupName": group,
            "AutoScalingGroupARN": (
                f"arn:aws:autoscaling:{region}:{ACCOUNT}:autoScalingGroup:"
                f"00000000-0000-0000-0000-000000000000:autoScalingGroupName/{group}"
            ),
            "Description": description
            or (
                f"Launching a new EC2 instance.  Status Reason: {message}"
                if message
                else "Launching a new EC2 instance"
            ),
            "Cause": f"At {start:%Y-%m-%dT%H:%M:%SZ} an instance was started in response to a"
            " difference between desired and actual capacity, increasing the capacity.",
            "StartTime": start,
            "StatusCode": status_code,
            "Progress": 100 if status_code in _DONE else 30,
            "Details": json.dumps({"Availability Zone": f"{region}a"}),
            "_region": region,
        }
        if status_code in _DONE:
            activity["EndTime"] = start
        if message is not None:  # optional: AWS sends none for a successful launch
            activity["StatusMessage"] = message
        self.activities.append(activity)
        return activity

    # --------------------------------------------------------------- moto hooks

    def __enter__(self) -> LaunchActivities:
        from moto.autoscaling.models import FakeAutoScalingGroup
        from moto.autoscaling.responses import AutoScalingResponse

        log = self
        launch = FakeAutoScalingGroup.replace_autoscaling_group_instances

        def replace_autoscaling_group_instances(
            group: Any, count_needed: int, propagated_tags: dict[str, str]
        ) -> None:
            limit = log.capacity.get(group.name)
            room = count_needed if limit is None else max(0, limit - len(group.instance_states))
            before = {state.instance.id for state in group.instance_states}
            if room:
                launch(group, min(room, count_needed), propagated_tags)
            region = group.region
            now = datetime.now(timezone.utc)
            for state in group.instance_states:
                if state.instance.id in before:
                    continue
                if group.name in log.spot_groups:
                    state.instance.lifecycle = "spot"
                log.add(
                    group.name,
                    "Successful",
                    start=now,
                    description=f"Launching a new EC2 instance: {state.instance.id}",
                    region=region,
                )
            if count_needed > room:
                log.add(
                    group.name,
                    "Failed",
                    start=now,
                    message=log.message.get(group.name, SPOT_NO_CAPACITY),
                    region=region,
                )

        def describe_scaling_activities(response: Any) -> Any:
            from moto.core.responses import ActionResult

            return ActionResult(log.answer(response.region, response._get_param))

        answering = AutoScalingResponse.describe_scaling_activities
        FakeAutoScalingGroup.replace_autoscaling_group_instances = (  # type: ignore[method-assign]
            replace_autoscaling_group_instances
        )
        AutoScalingResponse.describe_scaling_activities = describe_scaling_activities  # type: ignore[method-assign]

        def undo() -> None:
            FakeAutoScalingGroup.replace_autoscaling_group_instances = launch  # type: ignore[method-assign]
            AutoScalingResponse.describe_scaling_activities = answering  # type: ignore[method-assign]

        self._undo.append(undo)
        return self

    def __exit__(self, *_: object) -> None:
        while self._undo:
            self._undo.pop()()

    def answer(self, region: str, param: Callable[..., Any]) -> dict[str, Any]:
        """The DescribeScalingActivities answer for a request's parameters."""
        group = param("AutoScalingGroupName")
        wanted_ids = set(param("ActivityIds", []) or [])
        limit = int(param("MaxRecords", 100) or 100)
        if not 1 <= limit <= 100:
            raise ValueError("MaxRecords must be within 1..100")
        lower = upper = None
        statuses: set[str] = set()
        for item in param("Filters", []) or []:
            values = item.get("Values") or []
            if item["Name"] == "StartTimeLowerBound":
                lower = datetime.fromisoformat(values[0].replace("Z", "+00:00"))
            elif item["Name"] == "StartTimeUpperBound":
                upper = datetime.fromisoformat(values[0].replace("Z", "+00:00"))
            elif item["Name"] == "Status":
                statuses = set(values)
        chosen = [
            a
            for a in self.activities
            if a["_region"] == region
            and (group is None or a["AutoScalingGroupName"] == group)
            and (not wanted_ids or a["ActivityId"] in wanted_ids)
            and (lower is None or a["StartTime"] >= lower)
            and (upper is None or a["StartTime"] <= upper)
            and (not statuses or a["StatusCode"] in statuses)
        ]
        # In progress first, then newest first.
        chosen.sort(key=lambda a: (a["StatusCode"] in _DONE, -a["StartTime"].timestamp()))
        start = int(param("NextToken") or 0)
        page = [{k: v for k, v in a.items() if not k.startswith("_")} for a in chosen]
        answer: dict[str, Any] = {"Activities": page[start : start + limit]}
        if start + limit < len(page):
            answer["NextToken"] = str(start + limit)
        return answer


def _activity_id() -> str:
    import uuid

    return str(uuid.uuid4())
