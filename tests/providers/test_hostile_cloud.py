"""Hostile cloud answers: each provider lists its group right or fails with a ProviderError.

Each cloud's test server (moto, tests/fakes/gcp.py, tests/fakes/azure.py) sits behind a
:class:`~tests.fakes.fault_proxy.FaultProxy`, and hypothesis draws sequences of faults for the
listing calls: throttling, 5xx, hangs past the client's timeout, dropped connections,
truncated, garbage, huge answers, and answers with fields deleted. For each sequence, a
fresh provider must:

* list the group cold (every listing call made) either right or with a retryable,
  one-line :class:`ProviderError` naming the call, never another exception;
* and, once a good refresh has given its Controller an inventory, refresh warm either
  right, or fail so that the Controller keeps that inventory, ready hosts and all.

"Right" means every member, each in the state the intact answer gives it or a less
usable one, and only ready hosts the intact answer has, with the same slots: never a
member more usable than it is, nor a host at a wrong address. The rule the providers
follow for a deleted field (each cloud's API reference, field by field: the tables in
each provider module): an answer broken as a whole (the list of members itself, a
member's or VM's identity) fails the whole listing with a retryable
:class:`spotring.providers.cloud.MalformedAnswer`, and the controller keeps its last
good inventory; a member that lacks a field the cloud always sends (a state, a running
VM's address) costs only itself: it is listed as not usable. A field the reference lets
the cloud leave out (a member's id, status and URL before its VM exists, a creating VM's
instance view) keeps its documented meaning. A field whose absence means something (no
tags, no health check, not spot, no accelerators) cannot be told from a deleted one; the
groups here are built so that deleting those changes nothing the test compares.

Each group has three running members and one still booting, whose details are asked on
every refresh, so warm refreshes hit the detail calls too.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from spotring.autoscaler.controller import Backoff, Controller
from spotring.autoscaler.plugins import get_plugin_manager
from spotring.providers.base import Instance, InstanceState, Provider, ProviderError
from spotring.providers.cloud import retries
from tests.fakes.fault_proxy import GARBAGE_VARIANTS, HUGE_VARIANTS, KINDS, Fault, FaultProxy

TIMEOUT = 0.5
"""The providers' client timeout here: a ``hang`` costs this much per attempt."""
HANG = 1.5
ATTEMPTS = 2
"""--max-api-attempts: a fault is retried once within the call."""
HUGE = 4 * 2**20
EXAMPLES = 40
HOOK = get_plugin_manager(load_entry_points=False).hook

Summary = tuple[dict[str, InstanceState], dict[str, int]]


@dataclass
class Cloud:
    """One cloud's server behind a proxy, and how to list its group."""

    proxy: FaultProxy
    make_provider: Callable[[], Provider]
    calls: Sequence[str]
    """A pattern for each listing call (``Fault.match``)."""
    call_names: Sequence[str]
    """What the providers' errors call them."""
    expected: Summary | None = None


USABILITY = [
    InstanceState.READY,
    InstanceState.PENDING,
    InstanceState.DRAINING,
    InstanceState.TERMINATING,
    InstanceState.GONE,
]
"""The states from the most usable to the least."""


def summary(instances: Sequence[Instance]) -> Summary:
    """Each member's state, and the ready hosts with their slots."""
    states = {i.id: i.state for i in instances}
    assert len(states) == len(instances), "an id listed twice"
    return states, {i.address: i.slots for i in instances if i.is_ready}


def assert_right(instances: Sequence[Instance], expected: Summary, *context: object) -> None:
    """Every member the intact answer has, none more usable than it says, and only its
    ready hosts with their slots (see the module docstring)."""
    states, hosts = summary(instances)
    intact_states, intact_hosts = expected
    assert states.keys() == intact_states.keys(), context
    for member, state in states.items():
        intact = intact_states[member]
        assert USABILITY.index(state) >= USABILITY.index(intact), (member, state, context)
    assert hosts.items() <= intact_hosts.items(), context


def settle(cloud_: Cloud) -> Cloud:
    """Record what an intact listing says (3 ready members, 1 pending)."""
    provider = cloud_.make_provider()
    controller = Controller(provider, HOOK)
    assert any(controller.refresh() for _ in range(4)), controller.last_error
    assert controller.inventory is not None
    cloud_.expected = summary(controller.inventory.instances)
    provider.close()
    states, hosts = cloud_.expected
    assert sorted(s.value for s in states.values()) == ["pending", "ready", "ready", "ready"]
    assert len(hosts) == 3
    return cloud_


@pytest.fixture(scope="module", autouse=True)
def fast_retries() -> Iterator[None]:
    """Retry at once: the test is about what a failure ends as, not the backoff."""
    from botocore.retries.standard import ExponentialBackoff

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(retries, "backoff_delay", lambda failures, **_: 0.0)
        patch.setattr(ExponentialBackoff, "delay_amount", lambda self, context: 0.0)
        yield


def check(cloud_: Cloud, faults: list[Fault]) -> None:
    """The property: see the module docstring."""
    proxy, expected = cloud_.proxy, cloud_.expected
    proxy.clear()
    proxy.clear_log()
    provider = cloud_.make_provider()
    controller = Controller(provider, HOOK, backoff=Backoff(base=0.01, cap=0.01))
    try:
        proxy.next_faults(faults)
        try:
            listed = provider.list_instances()
        except ProviderError as error:
            assert_retryable(cloud_, error)
        else:
            assert_right(listed, expected, proxy.hits())
        if faults[0].match is None:
            assert proxy.hits(), "the first fault never hit"

        proxy.clear()
        # A few tries: on a busy machine an intact call may outlast the short timeout.
        assert any(controller.refresh() for _ in range(4)), controller.last_error
        good = controller.inventory
        assert good is not None and summary(good.instances) == expected

        proxy.next_faults(faults)
        if controller.refresh():
            assert controller.inventory is not None
            assert_right(controller.inventory.instances, expected, proxy.hits())
            assert controller.inventory.generation == good.generation + 1
        else:
            assert controller.inventory is good, "a failed refresh changed the inventory"
            assert controller.last_error is not None
            assert_retryable(cloud_, controller.last_error)
        assert controller.inventory.hosts_and_slots().items() <= expected[1].items()
    finally:
        proxy.clear()
        provider.close()


def assert_retryable(cloud_: Cloud, error: ProviderError) -> None:
    message = str(error)
    assert error.retryable, f"{type(error).__name__}: {message}"
    assert "\n" not in message and len(message) < 400, message
    assert any(name in message for name in cloud_.call_names), message


def fault_sequences(fields: Sequence[str], calls: Sequence[str]) -> st.SearchStrategy:
    """Lists of faults of every kind, each for the next listing call or a named one."""
    seed = st.integers(0, 2**32 - 1)
    match = st.none() | st.sampled_from(calls)
    fault = st.one_of(
        st.builds(
            Fault,
            st.sampled_from(["throttle", "server_error", "hang", "drop", "truncate"]),
            seed=seed,
            match=match,
        ),
        st.builds(
            Fault,
            st.just("garbage"),
            variant=st.sampled_from(GARBAGE_VARIANTS),
            seed=seed,
            match=match,
        ),
        st.builds(
            Fault,
            st.just("huge"),
            variant=st.sampled_from(HUGE_VARIANTS),
            size=st.just(HUGE),
            match=match,
        ),
        st.builds(
            Fault,
            st.just("missing_fields"),
            fields=st.lists(st.sampled_from(fields), min_size=1, max_size=3, unique=True).map(
                tuple
            ),
            match=match,
        ),
        st.builds(
            Fault,
            st.just("missing_fields"),
            rate=st.sampled_from([0.05, 0.2, 0.5]),
            seed=seed,
            match=match,
        ),
    )
    return st.lists(fault, min_size=1, max_size=4)


def every_kind(*extra: list[Fault]) -> Callable[[Any], Any]:
    """An ``@example`` of each fault kind on the first call, plus ``extra`` ones."""

    def decorate(test: Any) -> Any:
        for kind in KINDS:
            test = example(faults=[Fault(kind, seed=1)])(test)
        for faults in extra:
            test = example(faults=faults)(test)
        return test

    return decorate


hostile = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# ---------------------------------------------------------------------------- AWS

AWS_CALLS = ["DescribeAutoScalingGroups", "DescribeInstances", "DescribeInstanceTypes"]
AWS_FIELDS = [
    # DescribeAutoScalingGroups
    "AutoScalingGroups", "AutoScalingGroupName", "Instances", "InstanceId", "LifecycleState",
    "HealthStatus", "MinSize", "MaxSize", "DesiredCapacity", "AvailabilityZone",
    # DescribeInstances (EC2's own element names)
    "reservationSet", "instancesSet", "instanceId", "instanceState", "name", "code",
    "privateIpAddress", "instanceType", "placement", "tagSet", "key", "value", "launchTime",
    # DescribeInstanceTypes
    "instanceTypeSet", "gpuInfo",
]  # fmt: skip


@pytest.fixture(scope="module")
def aws() -> Iterator[Cloud]:
    pytest.importorskip("moto")
    import botocore.config
    from moto.server import ThreadedMotoServer

    from spotring.providers.aws import AwsProvider
    from tests.fakes.aws import REGION, boto_session, create_group, moto_members, set_ec2_state

    logging.getLogger("werkzeug").setLevel(logging.WARNING)
    keys = [k for k in os.environ if k.startswith("AWS_")]
    with pytest.MonkeyPatch.context() as patch:
        for key in keys:
            patch.delenv(key)
        patch.setenv("AWS_ACCESS_KEY_ID", "testing")
        patch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        patch.setenv("AWS_EC2_METADATA_DISABLED", "true")
        patch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        url = f"http://{host}:{port}"
        ids = create_group("hostile", size=4, endpoint_url=url)
        set_ec2_state(moto_members("hostile")[ids[3]], "pending")
        proxy = FaultProxy(url, flavour="aws", hang_seconds=HANG, huge_bytes=HUGE).start()

        def make_provider() -> AwsProvider:
            session = boto_session()
            provider = AwsProvider(
                "hostile",
                region=REGION,
                endpoint_url=proxy.url,
                session=session,
                max_api_attempts=ATTEMPTS,
            )
            # The provider's clients (botocore's standard retries), with a timeout below
            # the proxy's hang instead of 20 s.
            config = botocore.config.Config(
                retries={"mode": "standard", "total_max_attempts": ATTEMPTS},
                connect_timeout=TIMEOUT,
                read_timeout=TIMEOUT,
            )
            provider.autoscaling, provider.ec2 = (
                session.client(service, region_name=REGION, endpoint_url=proxy.url, config=config)
                for service in ("autoscaling", "ec2")
            )
            return provider

        try:
            yield settle(Cloud(proxy, make_provider, AWS_CALLS, AWS_CALLS))
        finally:
            proxy.stop()
            server.stop()


@hostile
@given(faults=fault_sequences(AWS_FIELDS, AWS_CALLS))
@every_kind(
    [Fault("missing_fields", fields=("Instances",))],
    [Fault("missing_fields", fields=("privateIpAddress",), match="DescribeInstances")],
    [Fault("missing_fields", fields=("instanceState",), match="DescribeInstances")],
    [Fault("missing_fields", fields=("reservationSet",), match="DescribeInstances")],
    [Fault("huge", variant="padded", size=20 * 2**20)],
    [Fault("garbage", variant="json", seed=0, match="DescribeInstanceTypes")] * 2,
)
def test_aws_lists_right_or_fails_retryably(aws: Cloud, faults: list[Fault]) -> None:
    check(aws, faults)


# ---------------------------------------------------------------------------- GCP

GCP_ZONE = "us-central1-a"
GCP_CALLS = [r"instanceGroupManagers/hostile$", "listManagedInstances", r"/instances\?"]
GCP_FIELDS = [
    # listManagedInstances, the group
    "managedInstances", "instance", "name", "id", "currentAction", "instanceStatus",
    "instanceHealth", "targetSize", "status",
    # instances.list
    "items", "networkInterfaces", "networkIP", "scheduling", "machineType", "labels",
    "creationTimestamp",
]  # fmt: skip


@pytest.fixture(scope="module")
def gcp() -> Iterator[Cloud]:
    pytest.importorskip("google.cloud.compute_v1", reason="the gcp extra is not installed")
    from google.auth.credentials import AnonymousCredentials

    from spotring.providers import gcp as gcp_provider
    from spotring.providers.gcp import client as gcp_client
    from tests.fakes.gcp import FakeCompute

    with pytest.MonkeyPatch.context() as patch, FakeCompute() as fake:
        patch.setattr(gcp_client, "CALL_OPTIONS", {"timeout": TIMEOUT, "retry": None})
        group = fake.add_group("hostile", zone=GCP_ZONE, size=3)
        group.add_member(current_action="CREATING", instance_status="STAGING")
        group.auto_advance = False

        def make_provider() -> Provider:
            return gcp_provider.GcpProvider(
                "hostile",
                zone=GCP_ZONE,
                project=fake.project,
                endpoint=proxy.url,
                credentials=AnonymousCredentials(),
                max_api_attempts=ATTEMPTS,
            )

        names = ["instanceGroupManagers.", "instances.list"]
        with FaultProxy(fake.url, flavour="gcp", hang_seconds=HANG, huge_bytes=HUGE) as proxy:
            yield settle(Cloud(proxy, make_provider, GCP_CALLS, names))


@hostile
@given(faults=fault_sequences(GCP_FIELDS, GCP_CALLS))
@every_kind(
    [Fault("missing_fields", fields=("managedInstances",), match="listManagedInstances")],
    [Fault("missing_fields", fields=("items",), match=r"/instances\?")],
    [Fault("missing_fields", fields=("currentAction",), match="listManagedInstances")],
    [Fault("missing_fields", fields=("id",), match="listManagedInstances")],
    [Fault("missing_fields", fields=("networkIP",), match=r"/instances\?")],
    # Documented optional: the URL "can exist even if the instance has not yet been created".
    [Fault("missing_fields", fields=("instance",), match="listManagedInstances")],
    # Together "empty when the instance does not exist": the booting member reads as one
    # being created (still PENDING); the running ones (NONE) as VMs deleted behind the
    # group's back (GONE until it repairs them).
    [Fault("missing_fields", fields=("id", "instanceStatus"), match="listManagedInstances")],
)
def test_gcp_lists_right_or_fails_retryably(gcp: Cloud, faults: list[Fault]) -> None:
    check(gcp, faults)


# -------------------------------------------------------------------------- Azure

AZURE_CALLS = [
    r"virtualMachineScaleSets/hostile\?",
    r"/virtualMachines\?",
    "networkInterfaces",
    "resourceSkus",
]
AZURE_FIELDS = [
    # the scale set
    "sku", "capacity", "properties", "orchestrationMode", "virtualMachineProfile", "id",
    "location",
    # its VMs
    "value", "name", "instanceId", "provisioningState", "instanceView", "statuses", "code",
    "vmHealth", "tags", "zones",
    # its NICs
    "virtualMachine", "ipConfigurations", "privateIPAddress",
]  # fmt: skip


@pytest.fixture(scope="module")
def azure() -> Iterator[Cloud]:
    pytest.importorskip("azure.mgmt.compute", reason="the azure extra is not installed")
    from spotring.providers import azure as azure_provider
    from tests.fakes.azure import FakeArm

    with pytest.MonkeyPatch.context() as patch, FakeArm() as fake:
        patch.setattr(azure_provider, "CONNECTION_TIMEOUT", TIMEOUT)
        patch.setattr(azure_provider, "READ_TIMEOUT", TIMEOUT)
        vmss = fake.add_scale_set("hostile", mode="Uniform", capacity=3, vm_size="Standard_D4s_v5")
        vmss.add_member(provisioning_state="Creating", power_state="starting")
        vmss.auto_advance = False

        def make_provider() -> Provider:
            return azure_provider.AzureProvider(
                "hostile",
                resource_group="rg",
                subscription=fake.subscription,
                endpoint=proxy.url,
                max_api_attempts=ATTEMPTS,
            )

        names = ["virtualMachineScaleSet", "networkInterfaces.", "resourceSkus.list"]
        with FaultProxy(
            fake.url, flavour="azure", hang_seconds=HANG, huge_bytes=HUGE, retry_after=0
        ) as proxy:
            yield settle(Cloud(proxy, make_provider, AZURE_CALLS, names))


@hostile
@given(faults=fault_sequences(AZURE_FIELDS, AZURE_CALLS))
@every_kind(
    [Fault("missing_fields", fields=("value",), match=r"/virtualMachines\?")],
    [Fault("missing_fields", fields=("statuses",), match=r"/virtualMachines\?")],
    [Fault("missing_fields", fields=("instanceView",), match=r"/virtualMachines\?")],
    [Fault("missing_fields", fields=("properties",))],
    [Fault("missing_fields", fields=("privateIPAddress",), match="networkInterfaces")],
    [Fault("huge", variant="stream")],
    [Fault("garbage", variant="json", seed=0, match="resourceSkus")] * 2,
)
def test_azure_lists_right_or_fails_retryably(azure: Cloud, faults: list[Fault]) -> None:
    check(azure, faults)
