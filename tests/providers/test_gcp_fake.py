"""The fake Compute Engine API (tests/fakes/gcp.py) against the real google-cloud-compute
clients."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

compute_v1 = pytest.importorskip("google.cloud.compute_v1")

from google.api_core import exceptions  # noqa: E402
from google.api_core.client_options import ClientOptions  # noqa: E402
from google.auth.credentials import AnonymousCredentials  # noqa: E402

from tests.fakes.gcp import FakeCompute, parse_filter  # noqa: E402

PROJECT = "test-project"
ZONE = "us-central1-a"
REGION = "us-central1"


def client_kwargs(url: str, credentials: Any = None) -> dict[str, Any]:
    """Keyword arguments for any compute_v1 client talking to the fake at ``url``."""
    return {
        "transport": "rest",
        "credentials": credentials or AnonymousCredentials(),
        "client_options": ClientOptions(api_endpoint=url),
    }


@pytest.fixture
def fake() -> Iterator[FakeCompute]:
    with FakeCompute(PROJECT) as server:
        yield server


@pytest.fixture
def igm(fake: FakeCompute) -> Any:
    return compute_v1.InstanceGroupManagersClient(**client_kwargs(fake.url))


@pytest.fixture
def rigm(fake: FakeCompute) -> Any:
    return compute_v1.RegionInstanceGroupManagersClient(**client_kwargs(fake.url))


@pytest.fixture
def instances(fake: FakeCompute) -> Any:
    return compute_v1.InstancesClient(**client_kwargs(fake.url))


def zonal(name: str = "workers") -> dict[str, str]:
    return {"project": PROJECT, "zone": ZONE, "instance_group_manager": name}


def regional(name: str = "workers") -> dict[str, str]:
    return {"project": PROJECT, "region": REGION, "instance_group_manager": name}


def listed(client: Any, **where: str) -> dict[str, Any]:
    """Managed instances by name."""
    return {mi.name: mi for mi in client.list_managed_instances(**where)}


# ----------------------------------------------------------------------------- shapes


def test_zonal_group_record_and_members(fake: FakeCompute, igm: Any) -> None:
    autoscaler = f"projects/{PROJECT}/zones/{ZONE}/autoscalers/workers-as"
    group = fake.add_group("workers", zone=ZONE, size=3, accelerators=1, autoscaler=autoscaler)
    group.set_member(group.names()[0], health=["HEALTHY"])

    record = igm.get(**zonal())
    assert record.name == "workers"
    assert record.target_size == 3
    assert record.base_instance_name == "workers"
    assert record.zone.endswith(f"/projects/{PROJECT}/zones/{ZONE}")
    assert record.self_link.endswith(f"/zones/{ZONE}/instanceGroupManagers/workers")
    assert record.status.is_stable
    assert record.status.autoscaler == autoscaler
    assert record.current_actions.none == 3
    assert record.current_actions.creating == 0

    members = listed(igm, **zonal())
    assert sorted(members) == sorted(group.names())
    for name, mi in members.items():
        assert name.startswith("workers-") and len(name) == len("workers-") + 4
        assert mi.instance.startswith("https://www.googleapis.com/compute/v1/")
        assert mi.instance.endswith(f"/projects/{PROJECT}/zones/{ZONE}/instances/{name}")
        assert (mi.current_action, mi.instance_status) == ("NONE", "RUNNING")
        assert mi.id == group.member(name).id
    first = members[group.names()[0]]
    assert [h.detailed_health_state for h in first.instance_health] == ["HEALTHY"]
    assert len({mi.id for mi in members.values()}) == 3


def test_group_without_autoscaler_has_none(fake: FakeCompute, igm: Any) -> None:
    fake.add_group("workers", zone=ZONE, size=1)
    assert "autoscaler" not in compute_v1.InstanceGroupManagerStatus.to_dict(
        igm.get(**zonal()).status
    )


def test_regional_paging_over_1200_members(fake: FakeCompute, rigm: Any) -> None:
    fake.add_group("workers", region=REGION, size=1200, list_managed_instances_results="PAGINATED")
    record = rigm.get(**regional())
    assert record.region.endswith(f"/regions/{REGION}")
    assert [z.zone.rsplit("/", 1)[1] for z in record.distribution_policy.zones] == [
        f"{REGION}-a",
        f"{REGION}-b",
    ]

    members = list(rigm.list_managed_instances(**regional()))
    assert len(members) == 1200
    assert len({m.name for m in members}) == 1200
    assert Counter(m.instance.split("/zones/")[1].split("/")[0] for m in members) == {
        f"{REGION}-a": 600,
        f"{REGION}-b": 600,
    }
    pages = fake.calls("regionInstanceGroupManagers.listManagedInstances")
    assert len(pages) == 3  # 500 + 500 + 200: the real default and maximum page size
    assert "pageToken" not in pages[0].query and all("pageToken" in p.query for p in pages[1:])

    fake.clear_requests()
    assert (
        len(list(rigm.list_managed_instances(request={**regional(), "max_results": 100}))) == 1200
    )
    assert len(fake.requests) == 12
    with pytest.raises(exceptions.BadRequest, match="maxResults"):
        list(rigm.list_managed_instances(request={**regional(), "max_results": 501}))


def test_pageless_group_answers_everything_at_once(fake: FakeCompute, igm: Any) -> None:
    # PAGELESS is the real default: maxResults and pageToken are ignored.
    fake.add_group("workers", zone=ZONE, size=600)
    assert len(list(igm.list_managed_instances(request={**zonal(), "max_results": 10}))) == 600
    assert len(fake.requests) == 1


def test_instances_list_and_filters(fake: FakeCompute, instances: Any) -> None:
    group = fake.add_group("workers", zone=ZONE, size=4, accelerators=2, labels={"role": "worker"})
    fake.add_group("standard", zone=ZONE, size=1, provisioning_model="STANDARD")
    a, b, c, _ = group.names()

    def names(flt: str | None = None, **extra: Any) -> list[str]:
        request = {"project": PROJECT, "zone": ZONE, **extra}
        if flt is not None:
            request["filter"] = flt
        return [i.name for i in instances.list(request=request)]

    assert len(names()) == 5
    assert names(f'name = "{a}"') == [a]
    assert names(f"name = {a}") == [a]
    assert names(f'name eq "{a}"') == [a]
    assert names(f'(name = "{a}") OR (name = "{b}") OR (name = "{c}")') == [a, b, c]
    assert names("labels.role = worker") == group.names()
    assert len(names(None, max_results=2)) == 5  # the pager follows nextPageToken
    assert len(fake.calls("instances.list")) == 3 + 6

    [vm] = instances.list(request={"project": PROJECT, "zone": ZONE, "filter": f"name = {a}"})
    assert vm.id == group.member(a).id
    assert vm.status == "RUNNING"
    assert vm.network_interfaces[0].network_i_p == group.member(a).network_ip
    assert vm.scheduling.provisioning_model == "SPOT" and vm.scheduling.preemptible
    assert vm.guest_accelerators[0].accelerator_type.endswith("/nvidia-tesla-t4")
    assert vm.guest_accelerators[0].accelerator_count == 2
    assert vm.machine_type.endswith("/machineTypes/n1-standard-4")
    assert vm.labels == {"role": "worker"}
    assert vm.creation_timestamp
    [std] = instances.list(
        request={"project": PROJECT, "zone": ZONE, "filter": 'name eq "standard-.*"'}
    )
    assert std.scheduling.provisioning_model == "STANDARD" and not std.scheduling.preemptible
    assert (
        len(
            {
                i.network_interfaces[0].network_i_p
                for i in instances.list(project=PROJECT, zone=ZONE)
            }
        )
        == 5
    )

    with pytest.raises(exceptions.BadRequest, match="filter"):
        names("name ~ x")


def test_filter_grammar() -> None:
    row = {"name": "w-1", "status": "RUNNING", "labels": {"k": "v"}}
    assert parse_filter('name = "w-1" AND status = RUNNING')(row)
    assert parse_filter('(name = "x") OR (labels.k = "v")')(row)
    assert parse_filter('name != "x" status ne "STOP.*"')(row)
    assert not parse_filter('NOT (name = "w-1")')(row)
    for bad in ("name", "name = ", "(name = a", "name < 3", "= a"):
        with pytest.raises(ValueError):
            parse_filter(bad)


# ----------------------------------------------------------------------------- steering


def test_resize_then_advance_until_running(fake: FakeCompute, igm: Any) -> None:
    group = fake.add_group("workers", zone=ZONE, size=2)
    group.auto_advance = False
    before = set(group.names())
    oldest, newer = group.names()

    op = igm.resize(**zonal(), size=4)
    assert op.name.startswith("operation-")
    assert op.operation_type == "compute.instanceGroupManagers.resize"
    assert op.target_link == group.self_link
    [call] = fake.calls("instanceGroupManagers.resize")
    assert call.method == "POST" and call.query == {"size": "4"}
    assert igm.get(**zonal()).target_size == 4
    assert igm.get(**zonal()).current_actions.creating == 2
    assert not igm.get(**zonal()).status.is_stable

    new = set(group.names()) - before
    members = listed(igm, **zonal())
    for name in new:  # no VM yet: no id, no instanceStatus
        assert members[name].current_action == "CREATING"
        assert "id" not in compute_v1.ManagedInstance.to_dict(members[name])
        assert "instance_status" not in compute_v1.ManagedInstance.to_dict(members[name])
    group.advance()
    members = listed(igm, **zonal())
    assert {(members[n].current_action, members[n].instance_status) for n in new} == {
        ("CREATING", "STAGING")
    }
    assert all(members[n].id for n in new)
    group.advance()
    members = listed(igm, **zonal())
    assert all(
        (m.current_action, m.instance_status) == ("NONE", "RUNNING") for m in members.values()
    )
    assert igm.get(**zonal()).status.is_stable

    # Down: the newest go first, DELETING until they are gone.
    igm.resize(**zonal(), size=1)
    deleting = {n for n, m in listed(igm, **zonal()).items() if m.current_action == "DELETING"}
    assert deleting == new | {newer}
    group.advance()
    assert set(listed(igm, **zonal())) == set(group.names()) and len(group.names()) == 1

    # To the current target: the state stays as it is.
    fake.clear_requests()
    igm.resize(**zonal(), size=1)
    assert group.names() == [oldest]
    assert len(fake.calls("instanceGroupManagers.resize")) == 1


def test_auto_advance_moves_the_group_on_each_listing(fake: FakeCompute, rigm: Any) -> None:
    group = fake.add_group("workers", region=REGION, size=0)
    rigm.resize(**regional(), size=3)
    seen = []
    for _ in range(5):
        members = listed(rigm, **regional())
        seen.append(sorted({m.instance_status for m in members.values()}))
        if all(m.instance_status == "RUNNING" for m in members.values()):
            break
    assert seen == [["STAGING"], ["RUNNING"]]
    assert group.is_stable()

    # Regional recreate, then the regional operation.
    name = group.names()[0]
    zone = group.member(name).zone
    body = compute_v1.RegionInstanceGroupManagersRecreateRequest(
        instances=[f"zones/{zone}/instances/{name}"]
    )
    op = rigm.recreate_instances_unary(
        **regional(), region_instance_group_managers_recreate_request_resource=body
    )
    assert op.operation_type == "compute.regionInstanceGroupManagers.recreateInstances"
    assert op.region.endswith(f"/regions/{REGION}")
    ops = compute_v1.RegionOperationsClient(**client_kwargs(fake.url))
    assert ops.wait(project=PROJECT, region=REGION, operation=op.name).status == op.Status.DONE
    assert listed(rigm, **regional())[name].current_action == "RECREATING"


def test_recreate_gives_a_new_id_with_the_same_name(fake: FakeCompute, igm: Any) -> None:
    group = fake.add_group("workers", zone=ZONE, size=2)
    group.auto_advance = False
    name = group.names()[0]
    old = group.member(name).id

    body = compute_v1.InstanceGroupManagersRecreateInstancesRequest(
        instances=[f"zones/{ZONE}/instances/{name}"]
    )
    op = igm.recreate_instances(
        **zonal(), instance_group_managers_recreate_instances_request_resource=body
    )
    assert op.operation_type == "compute.instanceGroupManagers.recreateInstances"
    [call] = fake.calls("instanceGroupManagers.recreateInstances")
    assert call.body == {"instances": [f"zones/{ZONE}/instances/{name}"]}
    assert listed(igm, **zonal())[name].current_action == "RECREATING"

    group.advance()
    mi = listed(igm, **zonal())[name]
    assert (mi.current_action, mi.instance_status) == ("RECREATING", "PROVISIONING")
    assert mi.id != old
    group.advance()
    mi = listed(igm, **zonal())[name]
    assert (mi.current_action, mi.instance_status) == ("NONE", "RUNNING")
    assert mi.id != old and mi.id == group.member(name).id

    # A full URL works too; a member already RECREATING stays as it is.
    group.set_member(name, current_action="RECREATING")
    url = f"https://www.googleapis.com/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances/{name}"
    body = compute_v1.InstanceGroupManagersRecreateInstancesRequest(instances=[url])
    igm.recreate_instances(
        **zonal(), instance_group_managers_recreate_instances_request_resource=body
    )
    assert group.member(name).id == mi.id

    bad = compute_v1.InstanceGroupManagersRecreateInstancesRequest(
        instances=[f"zones/{ZONE}/instances/nobody"]
    )
    with pytest.raises(exceptions.BadRequest, match="instances"):
        igm.recreate_instances(
            **zonal(), instance_group_managers_recreate_instances_request_resource=bad
        )


def test_preemption_then_recreation(fake: FakeCompute) -> None:
    group = fake.add_group("workers", zone=ZONE, size=1)
    name = group.names()[0]
    old = group.member(name).id
    group.preempt(name)
    stages = []
    for _ in range(5):
        m = group.member(name)
        stages.append((m.current_action, m.instance_status, m.id == old))
        group.advance()
    assert stages == [
        ("NONE", "STOPPING", True),
        ("NONE", "TERMINATED", True),
        ("RECREATING", "TERMINATED", True),
        ("RECREATING", "PROVISIONING", False),
        ("NONE", "RUNNING", False),
    ]


def test_preemption_with_termination_action_delete(fake: FakeCompute, igm: Any) -> None:
    """As terraform/gcp deploys spot VMs: the VM is torn down (DEPROVISIONING) and
    deleted, the member shows NONE without a VM, then the group repairs it."""
    group = fake.add_group("workers", zone=ZONE, size=1, termination_action="DELETE")
    group.auto_advance = False
    name = group.names()[0]
    old = group.member(name).id
    group.preempt(name)
    stages = []
    for _ in range(6):
        mi = listed(igm, **zonal())[name]
        raw = type(mi).pb(mi)
        vm = (raw.id == old) if raw.HasField("id") else None
        stages.append((mi.current_action, mi.instance_status, vm, bool(mi.instance)))
        group.advance()
    assert stages == [
        ("NONE", "STOPPING", True, True),
        ("NONE", "DEPROVISIONING", True, True),
        ("NONE", "", None, True),  # deleted; the URL stays ("can exist even if ...")
        ("RECREATING", "", None, True),
        ("RECREATING", "PROVISIONING", False, True),
        ("NONE", "RUNNING", False, True),
    ]
    template = compute_v1.InstanceTemplatesClient(**client_kwargs(fake.url)).get(
        project=PROJECT, instance_template=group.template_name
    )
    assert template.properties.scheduling.instance_termination_action == "DELETE"


def test_an_ipv6_only_vm_has_no_network_ip(fake: FakeCompute, instances: Any) -> None:
    group = fake.add_group("workers", zone=ZONE, size=0)
    member = group.add_member(ipv6_only=True)
    [vm] = instances.list(project=PROJECT, zone=ZONE)
    nic = type(vm).pb(vm).network_interfaces[0]
    assert (nic.stack_type, nic.network_i_p) == ("IPV6_ONLY", "")
    assert nic.ipv6_address.startswith("fd20:") and vm.name == member.name


def test_dropped_fields_leave_one_members_rows(fake: FakeCompute, igm: Any, instances: Any) -> None:
    group = fake.add_group("workers", zone=ZONE, size=2)
    odd, whole = group.names()
    group.set_member(odd, dropped=["currentAction", "networkInterfaces.networkIP"])
    rows = listed(igm, **zonal())
    assert not type(rows[odd]).pb(rows[odd]).HasField("current_action")
    assert rows[whole].current_action == "NONE"
    vms = {vm.name: vm for vm in instances.list(project=PROJECT, zone=ZONE)}
    assert vms[odd].network_interfaces[0].network_i_p == ""
    assert vms[whole].network_interfaces[0].network_i_p


def test_list_managed_instances_refuses_order_by(fake: FakeCompute, igm: Any) -> None:
    fake.add_group("workers", zone=ZONE, size=1)
    # "The orderBy query parameter is not supported" (listManagedInstances reference).
    request = compute_v1.ListManagedInstancesInstanceGroupManagersRequest(
        **zonal(), order_by="name"
    )
    with pytest.raises(exceptions.BadRequest, match="orderBy"):
        list(igm.list_managed_instances(request=request))


def test_capacity_errors_keep_members_creating(fake: FakeCompute, igm: Any) -> None:
    group = fake.add_group("workers", zone=ZONE, size=0)
    group.capacity_error(ZONE)
    igm.resize(**zonal(), size=1)
    for _ in range(3):
        [mi] = listed(igm, **zonal()).values()
        assert mi.current_action == "CREATING"
        assert [e.code for e in mi.last_attempt.errors.errors] == ["ZONE_RESOURCE_POOL_EXHAUSTED"]
    group.clear_capacity_error(ZONE)
    [mi] = listed(igm, **zonal()).values()
    assert (mi.current_action, mi.instance_status) == ("CREATING", "STAGING")
    assert not mi.last_attempt.errors.errors


def test_a_failed_creation_has_no_vm_and_is_a_list_errors_item(fake: FakeCompute, igm: Any) -> None:
    group = fake.add_group("workers", zone=ZONE, size=0)
    group.capacity_error(ZONE, "QUOTA_EXCEEDED")
    igm.resize(**zonal(), size=1)
    [mi] = listed(igm, **zonal()).values()
    raw = type(mi).pb(mi)

    # ManagedInstance: id and instanceStatus "are empty when the instance does not exist".
    assert raw.current_action == "CREATING"
    assert not raw.HasField("id") and not raw.HasField("instance_status")
    assert [e.code for e in mi.last_attempt.errors.errors] == ["QUOTA_EXCEEDED"]
    [item] = list(igm.list_errors(**zonal()))
    assert (item.error.code, item.instance_action_details.action) == (
        "QUOTA_EXCEEDED",
        "CREATING",
    )
    assert item.instance_action_details.instance.endswith(f"/zones/{ZONE}/instances/{mi.name}")
    assert item.instance_action_details.version.instance_template.endswith(
        "/global/instanceTemplates/workers-template"
    )
    assert "Quota 'PREEMPTIBLE_CPUS' exceeded" in item.error.message
    assert item.timestamp.endswith("+00:00")


def test_list_errors_pages_in_the_order_asked_and_refuses_filters(
    fake: FakeCompute, rigm: Any
) -> None:
    group = fake.add_group("workers", region=REGION, size=1)
    group.errors_order = "newest"
    group.add_error("ZONE_RESOURCE_POOL_EXHAUSTED", timestamp="2026-01-01T00:00:00.000+00:00")
    group.add_error("QUOTA_EXCEEDED", action=None, timestamp="2026-01-01T00:01:00.000+00:00")
    group.add_error("OTHER", timestamp="2026-01-01T00:02:00.000+00:00")
    request = compute_v1.ListErrorsRegionInstanceGroupManagersRequest(**regional(), max_results=2)

    pager = rigm.list_errors(request=request)
    first_page = list(pager.items)
    assert [i.error.code for i in first_page] == ["OTHER", "QUOTA_EXCEEDED"]
    assert [i.error.code for i in pager] == [
        "OTHER",
        "QUOTA_EXCEEDED",
        "ZONE_RESOURCE_POOL_EXHAUSTED",
    ]
    # "May be null, if the error was not caused by an action on an instance".
    assert not type(first_page[1]).pb(first_page[1]).HasField("instance_action_details")
    assert [
        r.query.get("maxResults") for r in fake.calls("regionInstanceGroupManagers.listErrors")
    ] == ["2", "2"]
    group.errors_order = "oldest"
    oldest_first = [i.error.code for i in rigm.list_errors(request=request)]
    assert oldest_first == ["ZONE_RESOURCE_POOL_EXHAUSTED", "QUOTA_EXCEEDED", "OTHER"]
    group.errors_order = "shuffled"  # the default: the reference names no order
    for n in range(20):
        group.add_error("OTHER", timestamp=f"2026-01-01T01:{n:02d}:00.000+00:00")
    stamps = [i.timestamp for i in rigm.list_errors(request=request)]
    assert len(stamps) == 23 and stamps not in (sorted(stamps), sorted(stamps, reverse=True))
    with pytest.raises(exceptions.BadRequest):
        rigm.list_errors(
            request=compute_v1.ListErrorsRegionInstanceGroupManagersRequest(
                **regional(), filter='error.code = "OTHER"'
            )
        )


def test_delete_instances_lowers_the_target_and_validates(fake: FakeCompute, igm: Any) -> None:
    group = fake.add_group("workers", zone=ZONE, size=3)
    group.auto_advance = False
    first, second, _ = group.names()

    def delete(*names: str, skip: bool = False, zone: str = ZONE) -> None:
        igm.delete_instances_unary(
            **zonal(),
            instance_group_managers_delete_instances_request_resource=(
                compute_v1.InstanceGroupManagersDeleteInstancesRequest(
                    instances=[f"zones/{zone}/instances/{n}" for n in names],
                    skip_instances_on_validation_error=skip,
                )
            ),
        )

    delete(first)
    assert group.target_size == 2 and group.member(first).current_action == "DELETING"
    # Already being deleted, or not a member: the call fails, unless told to skip them.
    with pytest.raises(exceptions.BadRequest):
        delete(first)
    with pytest.raises(exceptions.BadRequest):
        delete("not-a-member")
    delete(first, "not-a-member", second, skip=True)
    assert group.target_size == 1 and group.member(second).current_action == "DELETING"
    # Another zone's URL fails whatever the flag says.
    with pytest.raises(exceptions.BadRequest):
        delete("x", zone="us-central1-b", skip=True)
    group.advance()
    assert len(group.names()) == 1 and group.is_stable()


@pytest.mark.parametrize(
    ("model", "provisioning_model", "preemptible"),
    [
        ("SPOT", "SPOT", True),
        ("PREEMPTIBLE", None, True),  # the older form: preemptible without a model
        ("STANDARD", "STANDARD", False),
        (None, None, None),  # no scheduling at all
    ],
)
def test_instance_templates_global_and_regional(
    fake: FakeCompute, model: str | None, provisioning_model: str | None, preemptible: bool | None
) -> None:
    fake.add_group("zonal", zone=ZONE, size=1, provisioning_model=model)
    fake.add_group(
        "regional", region=REGION, size=1, provisioning_model=model, template_region=REGION
    )
    global_client = compute_v1.InstanceTemplatesClient(**client_kwargs(fake.url))
    regional_client = compute_v1.RegionInstanceTemplatesClient(**client_kwargs(fake.url))

    found = global_client.get(project=PROJECT, instance_template="zonal-template")
    regional_found = regional_client.get(
        project=PROJECT, region=REGION, instance_template="regional-template"
    )

    for template in (found, regional_found):
        data = json.loads(type(template).to_json(template))
        scheduling = data["properties"].get("scheduling")
        if preemptible is None:
            assert scheduling is None
        else:
            assert scheduling.get("provisioningModel") == provisioning_model
            assert scheduling.get("preemptible") is preemptible
    assert regional_found.region.endswith(f"/regions/{REGION}")
    assert regional_found.self_link.endswith(
        f"/regions/{REGION}/instanceTemplates/regional-template"
    )
    with pytest.raises(exceptions.NotFound):
        global_client.get(project=PROJECT, instance_template="regional-template")


def test_operations_get_and_wait(fake: FakeCompute, igm: Any) -> None:
    fake.add_group("workers", zone=ZONE, size=1)
    op = igm.resize_unary(**zonal(), size=2)
    assert op.status == compute_v1.Operation.Status.RUNNING
    ops = compute_v1.ZoneOperationsClient(**client_kwargs(fake.url))
    done = ops.get(project=PROJECT, zone=ZONE, operation=op.name)
    assert done.status == compute_v1.Operation.Status.DONE
    assert ops.wait(project=PROJECT, zone=ZONE, operation=op.name).status == done.status
    with pytest.raises(exceptions.NotFound):
        ops.get(project=PROJECT, zone=ZONE, operation="operation-nope")

    # The library polls an ExtendedOperation through a ZoneOperationsClient that it builds
    # WITHOUT the caller's client_options (it would go to compute.googleapis.com), so a
    # test that calls .result() must hand the transport one aimed at the fake.
    igm._transport._extended_operations_services["zone_operations"] = ops
    fake.clear_requests()
    assert igm.resize(**zonal(), size=3).result(timeout=5) is None
    assert [r.api for r in fake.requests] == ["instanceGroupManagers.resize", "zoneOperations.get"]

    # operations_start_done: answered DONE at once, nothing polled.
    fake.operations_start_done = True
    fake.clear_requests()
    assert igm.resize(**zonal(), size=4).done()
    assert len(fake.requests) == 1


# ----------------------------------------------------------------------------- errors


def test_error_bodies_become_api_core_exceptions(
    fake: FakeCompute, igm: Any, instances: Any
) -> None:
    fake.add_group("workers", zone=ZONE, size=1)
    resource = f"projects/{PROJECT}/zones/{ZONE}/instanceGroupManagers/nope"
    with pytest.raises(exceptions.NotFound) as info:
        igm.get(**zonal("nope"))
    assert f"The resource '{resource}' was not found" in info.value.message
    assert info.value.errors[0]["reason"] == "notFound"
    with pytest.raises(exceptions.NotFound, match="'projects/other' was not found"):
        igm.get(project="other", zone=ZONE, instance_group_manager="workers")
    with pytest.raises(exceptions.BadRequest, match="Unknown zone"):
        igm.get(project=PROJECT, zone="nowhere", instance_group_manager="workers")

    fake.deny("compute.instanceGroupManagers.get")
    with pytest.raises(exceptions.Forbidden) as info:
        igm.get(**zonal())
    assert "Required 'compute.instanceGroupManagers.get' permission for " in info.value.message
    assert f"projects/{PROJECT}/zones/{ZONE}/instanceGroupManagers/workers" in info.value.message
    with pytest.raises(exceptions.Forbidden):
        list(igm.list_managed_instances(**zonal()))
    igm.resize(**zonal(), size=1)  # update is still allowed
    fake.deny("compute.instances.list")
    with pytest.raises(exceptions.Forbidden, match=r"compute\.instances\.list"):
        list(instances.list(project=PROJECT, zone=ZONE))
    fake.allow()

    fake.fail_next(1, 429, match="listManagedInstances")
    igm.get(**zonal())  # not matched
    with pytest.raises(exceptions.TooManyRequests):
        list(igm.list_managed_instances(**zonal()))
    # get (like instances.list and operations.get) retries 503 by itself by default;
    # listManagedInstances, resize and recreateInstances do not.
    fake.fail_next(2, 503)
    assert igm.get(**zonal()).name == "workers"
    fake.fail_next(1, 503)
    with pytest.raises(exceptions.ServiceUnavailable) as info:
        list(igm.list_managed_instances(**zonal()))
    assert info.value.errors[0]["reason"] == "backendError"
    faulted = [r for r in fake.requests if r.fault]
    assert [(r.api, r.status) for r in faulted] == [
        ("instanceGroupManagers.listManagedInstances", 429),
        ("instanceGroupManagers.get", 503),
        ("instanceGroupManagers.get", 503),
        ("instanceGroupManagers.listManagedInstances", 503),
    ]


def test_drop_hang_and_random_faults(fake: FakeCompute, igm: Any) -> None:
    fake.add_group("workers", zone=ZONE, size=1)
    fake.fail_next(1, kind="drop")
    with pytest.raises(Exception, match=r"Remote end closed|Connection aborted"):
        igm.get(**zonal())
    assert fake.requests[-1].fault == "drop" and fake.requests[-1].status is None

    fake.fail_next(1, kind="hang", seconds=0.3)
    started = time.monotonic()
    igm.get(**zonal())
    assert time.monotonic() - started >= 0.3

    def outcomes(seed: int) -> list[str]:
        fake.fail_rate(0.5, kinds=[503, 500], seed=seed)
        seen = []
        for _ in range(20):
            try:
                list(igm.list_managed_instances(**zonal()))  # no default retry
                seen.append("ok")
            except exceptions.GoogleAPICallError as error:
                seen.append(str(error.code))
        fake.clear_faults()
        return seen

    first = outcomes(7)
    assert first == outcomes(7)
    assert {"ok", "503", "500"} <= set(first)


# ----------------------------------------------------------------------------- auth


def test_token_flow_with_a_credentials_file(
    fake: FakeCompute, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import google.auth
    import google.auth.exceptions

    fake.add_group("workers", zone=ZONE, size=1)
    fake.require_auth = True
    anonymous = compute_v1.InstanceGroupManagersClient(**client_kwargs(fake.url))
    # On a 401 google-auth's session refreshes the credentials and retries; anonymous
    # ones cannot be refreshed.
    with pytest.raises(google.auth.exceptions.InvalidOperation):
        anonymous.get(**zonal())
    [denied] = fake.calls("instanceGroupManagers.get")
    assert denied.status == 401 and denied.authorization is None
    with pytest.raises(urllib.error.HTTPError) as info:
        urllib.request.urlopen(f"{fake.url}/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances")
    error = json.loads(info.value.read())["error"]
    assert error["code"] == 401 and error["errors"][0]["reason"] == "required"

    path = fake.write_credentials(tmp_path / "credentials.json")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(path))
    monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", PROJECT)
    credentials, project = google.auth.default()
    assert credentials.token_url == f"{fake.url}/token" and project == PROJECT
    # No credentials given: the client itself finds them through google.auth.default().
    client = compute_v1.InstanceGroupManagersClient(
        transport="rest", client_options=ClientOptions(api_endpoint=fake.url)
    )
    assert client.get(**zonal()).name == "workers"
    [token] = fake.calls("oauth2.token")
    assert token.body == {"grant_type": "refresh_token", "refresh_token": fake.refresh_token}
    assert token.status == 200
    last = fake.calls("instanceGroupManagers.get")[-1]
    assert last.status == 200 and last.authorization.removeprefix("Bearer ") in fake.tokens
    client.get(**zonal())
    assert len(fake.calls("oauth2.token")) == 1  # the token is reused until it expires


def test_authorized_user_credentials_built_by_hand(fake: FakeCompute) -> None:
    import google.oauth2.credentials

    fake.add_group("workers", zone=ZONE, size=1)
    fake.require_auth = True
    info = fake.credentials_info("authorized_user")
    # google-auth replaces the token_uri of authorized_user files with Google's own.
    loaded = google.oauth2.credentials.Credentials.from_authorized_user_info(info)
    assert loaded.token_uri != info["token_uri"]
    credentials = google.oauth2.credentials.Credentials(
        token=None,
        refresh_token=info["refresh_token"],
        token_uri=info["token_uri"],
        client_id=info["client_id"],
        client_secret=info["client_secret"],
    )
    client = compute_v1.InstanceGroupManagersClient(**client_kwargs(fake.url, credentials))
    assert client.get(**zonal()).name == "workers"
    [token] = fake.calls("oauth2.token")
    assert token.body["client_id"] == fake.client_id and token.status == 200


# ----------------------------------------------------------------------------- subprocess


def _control(url: str, method: str, path: str, body: Any = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{url}/_fake/{path}", data=data, method=method)
    request.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())


def test_subprocess_entry_point_and_control_api(tmp_path: Path, repo: Path) -> None:
    state = {
        "project": PROJECT,
        "groups": [
            {"name": "workers", "zone": ZONE, "size": 2, "auto_advance": False},
            {
                "name": "rworkers",
                "region": REGION,
                "members": [
                    {"name": "rworkers-abcd", "zone": f"{REGION}-b"},
                    {
                        "name": "rworkers-efgh",
                        "current_action": "CREATING",
                        "instance_status": None,
                    },
                ],
            },
        ],
    }
    (tmp_path / "state.json").write_text(json.dumps(state))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.fakes.gcp",
            "--port",
            "0",
            "--state",
            str(tmp_path / "state.json"),
        ],
        stdout=subprocess.PIPE,
        text=True,
        cwd=repo,
    )
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        igm = compute_v1.InstanceGroupManagersClient(**client_kwargs(url))
        rigm = compute_v1.RegionInstanceGroupManagersClient(**client_kwargs(url))

        assert len(listed(igm, **zonal())) == 2
        regional_members = listed(rigm, **regional("rworkers"))
        assert set(regional_members) == {"rworkers-abcd", "rworkers-efgh"}
        assert f"zones/{REGION}-b/" in regional_members["rworkers-abcd"].instance

        [added] = _control(url, "POST", "groups/workers/members", {"name": "workers-zzzz"})
        assert added["instance_status"] == "RUNNING"
        assert "workers-zzzz" in listed(igm, **zonal())
        assert igm.get(**zonal()).target_size == 3

        # A VM deleted behind the MIG's back comes back under its name with a new id.
        gone = _control(url, "DELETE", "groups/workers/members/workers-zzzz")
        assert gone["current_action"] == "RECREATING" and gone["id"] is None
        _control(url, "POST", "groups/workers/advance", {"steps": 2})
        mi = listed(igm, **zonal())["workers-zzzz"]
        assert (mi.current_action, mi.instance_status) == ("NONE", "RUNNING")
        assert mi.id != added["id"]
        _control(url, "DELETE", "groups/workers/members/workers-zzzz?mode=remove")
        assert "workers-zzzz" not in listed(igm, **zonal())

        patched = _control(
            url, "PATCH", "groups/rworkers/members/rworkers-abcd", {"health": ["UNHEALTHY"]}
        )
        assert patched["health"] == ["UNHEALTHY"]
        health = listed(rigm, **regional("rworkers"))["rworkers-abcd"].instance_health
        assert [h.detailed_health_state for h in health] == ["UNHEALTHY"]
        _control(
            url, "POST", "faults", {"count": 1, "status": 503, "match": "listManagedInstances"}
        )
        with pytest.raises(exceptions.ServiceUnavailable):
            listed(igm, **zonal())
        _control(url, "POST", "deny", {"permissions": ["compute.instanceGroupManagers.update"]})
        with pytest.raises(exceptions.Forbidden, match=r"compute\.instanceGroupManagers\.update"):
            igm.resize(**zonal(), size=5)
        _control(url, "DELETE", "deny")
        igm.resize(**zonal(), size=5)

        log = _control(url, "GET", "requests")
        assert [r["status"] for r in log if r["fault"]] == [503]
        resizes = [r for r in log if r["api"] == "instanceGroupManagers.resize"]
        assert [(r["status"], r["query"]) for r in resizes] == [
            (403, {"size": "5"}),
            (200, {"size": "5"}),
        ]
        assert _control(url, "GET", "groups/workers")["target_size"] == 5
    finally:
        proc.terminate()
        proc.wait(timeout=5)
