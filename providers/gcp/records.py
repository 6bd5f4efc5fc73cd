"""What Compute Engine's answers hold, and what one member of a group is made of.

The fields each answer the ``gcp`` provider reads must or may hold (the table below),
one listManagedInstances row read into a :class:`Member`, one VM of instances.list into a
:class:`Vm`, the two made into an :class:`Instance`, and the rule for a member that lacks
what the API always sends: it costs only itself (listed as not usable, warned once while
it stays so); only an answer broken as a whole is a :class:`MalformedAnswer`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from spotring.providers.base import Instance, InstanceState, Lifecycle
from spotring.providers.cloud import MalformedAnswer, SlotResolver, worst_state
from spotring.providers.gcp.states import member_state, member_views

# ------------------------------------------------------- fields the answers must hold
#
# What Compute Engine's REST reference (compute/docs/reference/rest/v1, the same text as
# google-cloud-compute's message docs) says of each field spotring reads. An answer
# broken as a whole (no list where the API always sends one, a row that names no member
# or VM) makes the listing a retryable MalformedAnswer. A member whose row or VM lacks
# what the API always sends costs only itself: it is listed as not usable (PENDING, or
# worse if its other fields say so), with one warning while it stays so. An absent
# optional field keeps its documented meaning.
#
# instanceGroupManagers.get (InstanceGroupManager)
#   name, targetSize                always sent (targetSize: "The target number of
#                                   running instances for this managed instance group")
#   status.autoscaler               optional: no autoscaler attached
# listManagedInstances (ManagedInstance)
#   managedInstances[]              optional: an empty group sends none (checked against
#                                   targetSize, see GcpProvider.list_members)
#   name                            required: "The name always exists even if the
#                                   instance has not yet been created"; a row without it
#                                   (nor an instance URL that names it) is malformed
#   currentAction                   required: every member has one (NONE: "The instance
#                                   is running, and the group does not have any scheduled
#                                   actions for this instance"); without it, not usable
#   id, instanceStatus              optional, together: "empty when the instance does
#                                   not exist" (being created, or its creation failed):
#                                   then PENDING, no address. NONE without them is a VM
#                                   deleted behind the group's back, which the group
#                                   repairs ("About repairing VMs in a MIG": a VM "deleted
#                                   by an action not initiated by the MIG", such as the
#                                   preemption of a spot VM whose termination action is
#                                   DELETE, as terraform/gcp sets it): GONE. One without
#                                   the other: not usable
#   instance (the URL)              optional: "can exist even if the instance has not yet
#                                   been created"; an existing VM whose zone only the URL
#                                   names (a regional group) without it: not usable
#   instanceHealth[], lastAttempt   optional: no health check; no failed attempt
# instances.list (Instance)
#   items[]                         optional: none match; all of them missing is malformed
#   name, id                        always sent (id: "[Output Only] The unique identifier
#                                   for the resource. This identifier is defined by the
#                                   server"); an item without them is malformed
#   status                          always sent ("[Output Only] The status of the
#                                   instance"); without it, not usable
#   networkInterfaces[0].networkIP  the internal IPv4 address, sent once RUNNING unless
#                                   the interface is IPV6_ONLY (NetworkInterface.stackType;
#                                   then ipv6Address instead): a running VM without it is
#                                   not usable (spotring and Horovod address hosts by IPv4)
#   scheduling, guestAccelerators,  optional: standard provisioning, no accelerators, no
#   labels, creationTimestamp       labels, no launch time
# instanceGroupManagers.get, again (group_lifecycle)
#   versions[].instanceTemplate,    optional: versions[] "overrides the top-level
#   instanceTemplate                instanceTemplate field"; neither: lifecycle unknown
# instanceTemplates.get / regionInstanceTemplates.get (InstanceTemplate)
#   properties.scheduling           optional, each field too: none is a STANDARD VM;
#                                   provisioningModel SPOT or preemptible true is spot
# listErrors (InstanceManagedByIgmError)
#   items[]                         optional: no errors; in no documented order (the
#                                   method refuses orderBy), so every page is read
#   error.code, error.message       an item without a code is skipped
#   timestamp                       "The time that this error occurred" (RFC 3339); an
#                                   item without one cannot be placed after `since`
#   instanceActionDetails           optional: "May be null, if the error was not caused by
#                                   an action on an instance" (then it counts)


@dataclass(frozen=True)
class Member:
    """One row of listManagedInstances, reduced to what spotring uses."""

    name: str
    zone: str
    vm_id: int | None
    current_action: str
    instance_status: str
    health: tuple[str, ...]
    errors: tuple[tuple[str, str], ...]
    """The last creation attempt's (code, message) pairs."""
    problem: str = ""
    """What the row lacks that the API always sends ("": nothing): then not usable."""

    @property
    def key(self) -> tuple[str, str, int | None]:
        # The name survives a recreate, the VM's id does not.
        return (self.zone, self.name, self.vm_id)

    @property
    def leaving(self) -> bool:
        return self.current_action in ("DELETING", "ABANDONING")


@dataclass(frozen=True)
class Vm:
    """What spotring keeps of a member's VM (instances.list), read once."""

    name: str
    vm_id: int
    status: str
    address: str
    spot: bool
    accelerators: int
    machine_type: str
    launch_time: float | None
    labels: Mapping[str, str]
    problem: str = ""
    """What the VM lacks that a usable one has ("": nothing): then not usable."""

    @property
    def final(self) -> bool:
        """Whether these details stay true while the VM lives: it runs, and is whole."""
        return self.status == "RUNNING" and not self.problem

    @classmethod
    def of(cls, vm: Any) -> Vm:
        """The VM as instances.list answers it; raises :class:`MalformedAnswer` for one
        without a name or id (it cannot be told which member's it is)."""
        raw = type(vm).pb(vm)
        if not (raw.name and raw.HasField("id")):
            raise MalformedAnswer("instances.list", f"VM {raw.name or '?'} without its name or id")
        scheduling = raw.scheduling
        nic = raw.network_interfaces[0] if raw.network_interfaces else None
        address = nic.network_i_p if nic is not None else ""
        problem = ""
        if not raw.status:
            problem = "its VM has no status"
        elif raw.status == "RUNNING" and not address:
            ipv6_only = nic is not None and nic.stack_type == "IPV6_ONLY"
            problem = "its VM runs without an internal IPv4 address" + (
                " (an IPV6_ONLY network interface)" if ipv6_only else ""
            )
        return cls(
            name=raw.name,
            vm_id=raw.id,
            status=raw.status,
            address="" if problem else address,
            spot=scheduling.provisioning_model == "SPOT" or scheduling.preemptible,
            accelerators=sum(a.accelerator_count for a in raw.guest_accelerators),
            machine_type=last_segment(raw.machine_type),
            launch_time=timestamp(raw.creation_timestamp),
            labels=dict(raw.labels),
            problem=problem,
        )


_ZONE_IN_URL = re.compile(r"/zones/([^/]+)/instances/([^/]+)$")
TEMPLATE_URL = re.compile(
    r"(?:^|/)projects/([^/]+)/(?:global|regions/([^/]+))/instanceTemplates/([^/]+)$"
)
"""An instance template's URL: its project, its region (none for a global one), its name."""


def member_of(managed: Any, group_zone: str | None) -> Member:
    """A row of listManagedInstances (see the field table at the top of the module);
    ``group_zone`` is a zonal group's zone (None: regional). Raises
    :class:`MalformedAnswer` for one that names no member."""
    # The raw protobuf: proto-plus attribute access costs ~10x more, and a
    # 1,000-member group is read on every refresh.
    raw = type(managed).pb(managed)
    found = _ZONE_IN_URL.search(raw.instance)
    zone, name = found.groups() if found else (group_zone or "", raw.name)
    if not name:
        raise MalformedAnswer(
            "instanceGroupManagers.listManagedInstances", "a member without its name"
        )
    return Member(
        name=name,
        zone=zone,
        vm_id=raw.id if raw.HasField("id") else None,
        current_action=raw.current_action,
        instance_status=raw.instance_status,
        health=tuple(h.detailed_health_state for h in raw.instance_health),
        errors=tuple((e.code, e.message) for e in raw.last_attempt.errors.errors),
        problem=_missing_field(raw, zone),
    )


def _missing_field(raw: Any, zone: str) -> str:
    """What a listManagedInstances row lacks that the API always sends ("" if whole)."""
    vm_exists = raw.HasField("id")
    if not raw.current_action:
        return "its row has no currentAction"
    if vm_exists and not raw.instance_status:  # together "empty when the instance does not exist"
        return "its row has a VM id but no instanceStatus"
    if raw.instance_status and not vm_exists:
        return "its row has an instanceStatus but no VM id"
    if vm_exists and not zone:  # an existing VM is described in its zone: only the URL says
        return "its row has no instance URL, which names its VM's zone"
    return ""


def instance_of(member: Member, vm: Vm | None, slots: SlotResolver) -> Instance:
    """The :class:`Instance` a member and its VM (None: none listed) make."""
    if member.problem:  # not usable, and no VM asked for: what its fields say, or PENDING
        state = worst_state(
            InstanceState.PENDING,
            *member_views(member.current_action, member.instance_status, member.health),
        )
    else:
        state = member_state(
            member.current_action, member.instance_status, member.health, vm is not None
        )
    if vm is None:
        return Instance(
            id=member.name,
            address="",
            state=state,
            slots=slots.slots(member.name, {}, None),
            zone=member.zone,
            cloud_state=cloud_state(member),
        )
    return Instance(
        id=member.name,
        address=vm.address,
        state=worst_state(state, InstanceState.PENDING) if vm.problem else state,
        slots=slots.slots(member.name, vm.labels, vm.accelerators),
        lifecycle=Lifecycle.SPOT if vm.spot else Lifecycle.ON_DEMAND,
        zone=member.zone,
        instance_type=vm.machine_type,
        launch_time=vm.launch_time,
        cloud_state=cloud_state(member),
        labels=vm.labels,
    )


def odd_members(
    group: str,
    members: Sequence[Member],
    vms: Mapping[tuple[str, str, int | None], Vm],
    instances: Sequence[Instance],
) -> dict[str, str]:
    """The warning of each member listed as not usable for what it lacks, by member (for
    :class:`~spotring.providers.cloud.EpisodeWarnings`: once per member while it lasts)."""
    odd: dict[str, str] = {}
    for member, instance in zip(members, instances, strict=True):
        vm = vms.get(member.key)
        problem = member.problem or (vm.problem if vm is not None else "")
        if problem:
            odd[f"gcp: group {group} member {member.name}"] = (
                f"gcp: group {group}: member {member.name} is listed as"
                f" {instance.state.value}, not usable: {problem}"
            )
    return odd


def cloud_state(member: Member) -> str:
    """``ACTION/STATUS/HEALTH`` of a member, as the inventory shows its cloud state."""
    health = ",".join(member.health) or "-"
    return f"{member.current_action or '-'}/{member.instance_status or '-'}/{health}"


def replace_action(member: Member, action: str) -> Member:
    """``member`` with the group's action on it set to ``action``."""
    return replace(member, current_action=action)


def timestamp(text: str) -> float | None:
    """An RFC 3339 time of an answer as epoch seconds; None when absent or unreadable."""
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def last_segment(url: str) -> str:
    """The last part of a resource URL: the resource's name."""
    return url.rstrip("/").rsplit("/", 1)[-1]


__all__ = [
    "TEMPLATE_URL",
    "Member",
    "Vm",
    "cloud_state",
    "instance_of",
    "last_segment",
    "member_of",
    "odd_members",
    "replace_action",
    "timestamp",
]
