"""An Azure VM's states and what they make of a member: the provisioning state, power
state and health maps to :class:`InstanceState`, and :func:`member_state`, which
combines them."""

from __future__ import annotations

from collections.abc import Mapping

from spotring.providers.base import InstanceState
from spotring.providers.cloud import lookup_state, worst_state

PROVISIONING_STATE_MAP: Mapping[str, InstanceState] = {
    "Creating": InstanceState.PENDING,
    "Migrating": InstanceState.PENDING,
    "Canceled": InstanceState.PENDING,
    "Succeeded": InstanceState.READY,
    # A model update on a running VM; it keeps running.
    "Updating": InstanceState.READY,
    # The VM may still run, but something about it failed: no new work there.
    "Failed": InstanceState.DRAINING,
    "Deleting": InstanceState.TERMINATING,
}
"""``properties.provisioningState`` -> InstanceState."""

POWER_STATE_MAP: Mapping[str, InstanceState] = {
    "starting": InstanceState.PENDING,
    "running": InstanceState.READY,
    "stopping": InstanceState.TERMINATING,
    # Stopped for good once provisioning settled; see TRANSIENT_STOP_PROVISIONING.
    "stopped": InstanceState.TERMINATING,
    "deallocating": InstanceState.TERMINATING,
    # What a spot eviction with policy Deallocate leaves: the VM holds its place in
    # the set but will not run again by itself.
    "deallocated": InstanceState.GONE,
    "unknown": InstanceState.PENDING,
}
"""The instance view's ``PowerState/<state>`` -> InstanceState."""

TRANSIENT_STOP_PROVISIONING = frozenset({"Creating", "Updating"})
"""Provisioning states in which ``PowerState/stopped`` passes by itself (PENDING): "The
Stopped state may also be observed briefly during VM creation or while starting a VM from
Deallocated state" ("States and billing status of Azure Virtual Machines"). Kubernetes'
Azure cloud provider, too, takes a VM for shut down only once its provisioning Succeeded
(cloud-provider-azure, pkg/provider/azure_instances.go, InstanceShutdownByProviderID)."""

HEALTH_STATE_MAP: Mapping[str, InstanceState] = {
    "healthy": InstanceState.READY,
    "unknown": InstanceState.READY,
    "unhealthy": InstanceState.DRAINING,
}
"""The instance view's ``vmHealth`` ``HealthState/<state>`` -> the best state possible."""


def creation_failed(provisioning: str, power: str) -> bool:
    """Whether provisioning failed before the VM ever ran: ``Failed`` with any power
    state but ``running`` (or none). A VM whose provisioning failed while it ran keeps
    running. Cluster-autoscaler's Azure provider reads it the same way (kubernetes/
    autoscaler#5767: "only report InstanceCreating errors when the power state indicates
    the instance has not yet started running")."""
    return provisioning == "Failed" and power != "running"


def member_state(provisioning: str, power: str, health: str = "") -> InstanceState:
    """Combine the provisioning state, power state and health: the least usable wins.

    Without a power state (no instance view yet, the VM is being created) a member is
    at best PENDING; so is one whose creation failed (:func:`creation_failed`: whatever
    its power state says, it never ran), and one ``stopped`` while Creating or Updating
    (:data:`TRANSIENT_STOP_PROVISIONING`). Unknown strings count as PENDING.
    """
    provisioned = lookup_state(PROVISIONING_STATE_MAP, provisioning)
    if not power or creation_failed(provisioning, power):
        return worst_state(InstanceState.PENDING, provisioned)
    if power == "stopped" and provisioning in TRANSIENT_STOP_PROVISIONING:
        powered = InstanceState.PENDING
    else:
        powered = lookup_state(POWER_STATE_MAP, power)
    states = [provisioned, powered]
    if health:
        states.append(lookup_state(HEALTH_STATE_MAP, health))
    return worst_state(*states)
