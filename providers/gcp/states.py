"""Compute Engine's states of a managed instance group's member -> :class:`InstanceState`:
the group's action on it, the VM's status and its health, and how they combine."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from spotring.providers.base import InstanceState
from spotring.providers.cloud import lookup_state, worst_state

CURRENT_ACTION_MAP: Mapping[str, InstanceState] = {
    "NONE": InstanceState.READY,
    # Applies a new configuration in place; the VM keeps running.
    "REFRESHING": InstanceState.READY,
    "CREATING": InstanceState.PENDING,
    "CREATING_WITHOUT_RETRIES": InstanceState.PENDING,
    "VERIFYING": InstanceState.PENDING,
    "STARTING": InstanceState.PENDING,
    "RESUMING": InstanceState.PENDING,
    # A restart kills the workers; the member comes back afterwards.
    "RESTARTING": InstanceState.DRAINING,
    # Deleted and created again under the same name: this VM is on its way out.
    "RECREATING": InstanceState.TERMINATING,
    "DELETING": InstanceState.TERMINATING,
    # Leaves the group (the VM itself keeps running, outside spotring's job).
    "ABANDONING": InstanceState.TERMINATING,
    "STOPPING": InstanceState.TERMINATING,
    "SUSPENDING": InstanceState.TERMINATING,
}
"""The group's ``currentAction`` on a member -> InstanceState."""

INSTANCE_STATUS_MAP: Mapping[str, InstanceState] = {
    # Waiting for capacity (a Flex-start VM; "Compute Engine instance lifecycle").
    "PENDING": InstanceState.PENDING,
    "PROVISIONING": InstanceState.PENDING,
    "STAGING": InstanceState.PENDING,
    "REPAIRING": InstanceState.PENDING,
    "RUNNING": InstanceState.READY,
    "PENDING_STOP": InstanceState.TERMINATING,
    "STOPPING": InstanceState.TERMINATING,
    "SUSPENDING": InstanceState.TERMINATING,
    # Stopped (a preempted spot VM with termination action STOP): the VM still
    # exists and holds its place in the group, but runs nothing until restarted.
    "STOPPED": InstanceState.TERMINATING,
    "SUSPENDED": InstanceState.TERMINATING,
    "TERMINATED": InstanceState.TERMINATING,
    # "The instance is halted and we are performing tear down tasks like network
    # deprogramming, releasing quota, IP, tearing down disks" (Instance.Status).
    "DEPROVISIONING": InstanceState.TERMINATING,
}
"""The VM's ``instanceStatus`` -> InstanceState."""

HEALTH_STATE_MAP: Mapping[str, InstanceState] = {
    "HEALTHY": InstanceState.READY,
    # Not yet judged by the health check: do not hold a running VM back for it.
    "UNKNOWN": InstanceState.READY,
    # Autohealing will recreate it: take no new work there.
    "UNHEALTHY": InstanceState.DRAINING,
    "TIMEOUT": InstanceState.DRAINING,
    "DRAINING": InstanceState.DRAINING,
}
"""``instanceHealth[].detailedHealthState`` -> the best state a member can have."""


def member_state(
    current_action: str, instance_status: str, health: Sequence[str], vm_found: bool = True
) -> InstanceState:
    """Combine the group's action, the VM's status and its health: the least usable
    wins. A member with no VM (no status) is as its action says, and GONE with action
    NONE (its VM was deleted behind the group's back: see the field table in
    :mod:`spotring.providers.gcp.records`); one whose VM instances.list no longer
    returns is GONE. Unknown strings count as PENDING."""
    if not instance_status:
        if current_action == "NONE":
            return InstanceState.GONE
        return worst_state(InstanceState.PENDING, lookup_state(CURRENT_ACTION_MAP, current_action))
    if not vm_found:
        return InstanceState.GONE
    return worst_state(*member_views(current_action, instance_status, health))


def member_views(
    current_action: str, instance_status: str, health: Sequence[str]
) -> list[InstanceState]:
    """What the group's action, the VM's status and its health each say of a member."""
    return [
        lookup_state(CURRENT_ACTION_MAP, current_action),
        lookup_state(INSTANCE_STATUS_MAP, instance_status),
        *(lookup_state(HEALTH_STATE_MAP, state) for state in health),
    ]


__all__ = [
    "CURRENT_ACTION_MAP",
    "HEALTH_STATE_MAP",
    "INSTANCE_STATUS_MAP",
    "member_state",
    "member_views",
]
