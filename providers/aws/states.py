"""AWS's state strings -> :class:`InstanceState`: the Auto Scaling lifecycle and health
states, EC2's instance states, and how a member's three views combine."""

from __future__ import annotations

from collections.abc import Mapping

from spotring.providers.base import InstanceState
from spotring.providers.cloud import lookup_state, worst_state

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
