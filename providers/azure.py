"""The ``azure`` provider: an Azure virtual machine scale set (VMSS), Uniform or Flexible.

Each refresh gets the scale set (capacity, orchestration mode, spot settings) and lists
its VMs with their instance view (provisioning state, power state, health): Uniform sets
through the scale set's VM list, Flexible ones (ordinary VMs that name the set) through
the resource group's VM list filtered to the set. Private addresses come from the
network interfaces, listed for the whole set in paged calls, only when a member not
seen before needs one. A member's slots come from ``--slots-per-host``, its tag, or the
GPU count of its VM size (the resource SKU list, asked once).

Listing only reads. Steering sets the set's capacity. A failed host is replaced by
deleting the VM and keeping the capacity: Azure lowers the capacity when a VM is
deleted (or evicted with policy Delete), so :meth:`AzureProvider.keep_size`, which the
controller calls after each refresh while it steers a job, restores the capacity
spotring asked for. A spot VM evicted with policy Deallocate stays in the set,
deallocated, and a VM whose provisioning failed is not retried by the set: the listing
reports both with :attr:`Instance.failure` (the evicted one unless ``--keep-evicted``),
and the controller decides, through ``spotring_replace_host`` (``--no-replace``), to
replace them, which deletes them so the set launches new ones. Long-running operations
are started and never waited on: the next refresh sees them (a scale-out's operation is
read for its error when the controller asks for a shortage). A VM that lacks something
the listing should show is listed as not usable and warned about once.

A job may span several scale sets (``--group`` given more than once, ``NAME`` in
``--resource-group`` or ``RESOURCE_GROUP/NAME``): one provider per set, in the order
given, sharing one pair of clients. Each says what it launches
(:meth:`AzureProvider.group_lifecycle`: the set's priority and Spot Priority Mix), what
stopped it growing (:meth:`AzureProvider.capacity_shortage`: VMs whose provisioning
failed for capacity, price or quota, read from the listing, scale-outs ARM refused, and
the error of a scale-out's operation), and hands a VM back for good
(:meth:`AzureProvider.remove_instance`: the VM deleted and the capacity spotring keeps
lowered by one).

The Azure SDKs are imported on first use.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlsplit

from spotring.core.capacity import CapacityShortage, ShortageCause
from spotring.core.hooks import hookimpl
from spotring.providers.base import (
    ConfigurationError,
    CoreOptions,
    Instance,
    InstanceState,
    InterruptionNotice,
    Lifecycle,
    Provider,
    ProviderError,
)
from spotring.providers.cloud import (
    CloudGroupProvider,
    EpisodeWarnings,
    MalformedAnswer,
    check_endpoint,
    group_labels,
    lookup_state,
    one_line,
    worst_state,
)

if TYPE_CHECKING:
    from spotring.providers.base import ProviderRegistry

log = logging.getLogger(__name__)

# ------------------------------------------------------------------ IAM and limits

_ACTION_BY_CALL: Mapping[str, str] = {
    "virtualMachineScaleSets.get": "Microsoft.Compute/virtualMachineScaleSets/read",
    "virtualMachineScaleSets.update": "Microsoft.Compute/virtualMachineScaleSets/write",
    "virtualMachineScaleSets.deleteInstances": (
        "Microsoft.Compute/virtualMachineScaleSets/delete/action"
    ),
    "virtualMachineScaleSetVMs.list": (
        "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read"
    ),
    "networkInterfaces.listVirtualMachineScaleSetNetworkInterfaces": (
        "Microsoft.Compute/virtualMachineScaleSets/networkInterfaces/read"
    ),
    "virtualMachines.list": "Microsoft.Compute/virtualMachines/read",
    "virtualMachines.delete": "Microsoft.Compute/virtualMachines/delete",
    "networkInterfaces.list": "Microsoft.Network/networkInterfaces/read",
    "resourceSkus.list": "Microsoft.Compute/skus/read",
    # The status of a scale-out's long-running operation (its URL, from the update's
    # Azure-AsyncOperation header, is a subscription-level resource).
    "operations.get": "Microsoft.Compute/locations/operations/read",
}

IAM_ACTIONS: tuple[str, ...] = tuple(dict.fromkeys(_ACTION_BY_CALL.values()))
"""Every action the provider performs; a custom role with exactly these is enough
(terraform/azure gives it to the driver's managed identity)."""

DEFAULT_ENDPOINT = "https://management.azure.com"
"""Azure Resource Manager of the public cloud (``--endpoint`` names another)."""

CONNECTION_TIMEOUT = 5.0
READ_TIMEOUT = 20.0
"""Seconds; a stuck call must not hold the controller thread for azure-core's 300 s."""

DEFAULT_SLOTS_TAG = "spotring-slots"

COMPUTE_API_VERSION = "2024-07-01"
"""Of the VM lists spotring reads as plain JSON (the SDK's models cost too much CPU)."""

CAPACITY_ERRORS = frozenset(
    {
        "SkuNotAvailable",
        "AllocationFailed",
        "ZonalAllocationFailed",
        "OverconstrainedAllocationRequest",
        "OverconstrainedZonalAllocationRequest",
    }
)
"""Codes of a VM that could not be provisioned for lack of capacity (``CAPACITY``).

The error codes Azure documents for allocation failures ("Troubleshoot allocation
failures when you create, restart, or resize VMs in Azure", learn.microsoft.com/
troubleshoot/azure/virtual-machines/windows/allocation-failure): the VM size is not
available there now (SkuNotAvailable), the region or zone has no room for it
(AllocationFailed, ZonalAllocationFailed), or the set's constraints (zone, size,
accelerated networking, ...) leave no cluster that fits (Overconstrained*)."""

QUOTA_ERRORS = frozenset({"QuotaExceeded", "OperationNotAllowed"})
"""Codes of a refused request that count as ``QUOTA`` when their message names a quota:
ARM answers a scale-out beyond the subscription's vCPU quota (regional, family or
``LowPriorityCores`` for spot) with 409 ``OperationNotAllowed`` "Operation could not be
completed as it results in exceeding approved ... quota" ("Resolve errors for resource
quotas", learn.microsoft.com/azure/azure-resource-manager/troubleshooting/
error-resource-quota); ``QuotaExceeded`` is the code of other resource quotas.

Compute uses ``OperationNotAllowed`` for state conflicts too ("Operation '{0}' is not
allowed on VM '{1}' since the VM is marked for deletion", "... since another operation
is in progress": "Azure Virtual Machine Error Messages", MicrosoftDocs/azure-docs): those
name no quota, are no refusal, and are retried like any other 409."""

PRICE_ERRORS = frozenset({"SpotPriceGreaterThanProvidedMaxPrice"})
"""Codes of a spot VM that could not be created for its max price (``PRICE``): "Unable
to perform operation '{0}' since the provided max price '{1} USD' is lower than the
current spot price '{2} USD'" ("Error messages for Azure Spot Virtual Machines and scale
sets", learn.microsoft.com/azure/virtual-machines/error-codes-spot). It comes back from
creating the set's VMs: in a failed VM's ``ProvisioningState/failed/<code>``, in the
scale-out's operation, or as the answer to the request itself."""


def shortage_cause(code: str, message: str = "") -> ShortageCause:
    """The :class:`ShortageCause` of an ARM error code and its message."""
    if code in CAPACITY_ERRORS:
        return ShortageCause.CAPACITY
    if code in PRICE_ERRORS:
        return ShortageCause.PRICE
    if code == "QuotaExceeded" or (code in QUOTA_ERRORS and "quota" in message.lower()):
        return ShortageCause.QUOTA
    return ShortageCause.OTHER


def is_refusal(code: str, message: str = "") -> bool:
    """Whether an ARM error refuses more VMs for capacity, price or quota: asking again
    at once does not help, and the group is short (not a state conflict or a fault)."""
    return shortage_cause(code, message) is not ShortageCause.OTHER


# ------------------------------------------------------- fields the answers must hold
#
# ARM's Compute and Network specifications (azure-rest-api-specs, as generated into
# azure-mgmt-compute / azure-mgmt-network's models) mark response fields read-only
# rather than required; what spotring relies on, and why:
#
# virtualMachineScaleSets.get
#   id, location, properties        sent for every tracked resource (location:
#                                   "The geo-location where the resource lives. Required")
#   sku.capacity                    optional: "Specifies the number of virtual machines in
#                                   the scale set"; absent reads as 0
#   properties.virtualMachineProfile.priority
#                                   optional: "Specifies the priority for the virtual
#                                   machines in the scale set" (Regular, Low, Spot);
#                                   absent is Regular
#   properties.priorityMixPolicy    optional, Flexible sets only (Spot Priority Mix,
#                                   learn.microsoft.com/azure/virtual-machine-scale-sets/
#                                   spot-priority-mix): baseRegularPriorityCount and
#                                   regularPriorityPercentageAboveBase, both optional;
#                                   spotring assumes no value for an absent one
# virtualMachineScaleSetVMs.list / virtualMachines.list ($expand=instanceView)
#   value                           the page itself (ARM's list shape: {"value": [...]});
#                                   a page without it fails the listing
#   name, id                        read-only, set by the server for every resource: a
#                                   VM without them cannot be told apart, and makes the
#                                   answer malformed as a whole
#   instanceId                      Uniform: the last segment of the id, if absent
#   properties.provisioningState    "The provisioning state, which only appears in the
#                                   response": a VM without one is not usable
#   properties.instanceView         optional: a VM being created has none yet (PENDING);
#                                   a provisioned one (Succeeded, Updating) has one,
#                                   whose PowerState/* status tells running from stopped,
#                                   but "in some rare situations, the power state may not
#                                   [be] available" ("States and billing status of Azure
#                                   Virtual Machines", learn.microsoft.com/azure/
#                                   virtual-machines/states-billing): not usable (PENDING)
#   instanceView.statuses[].code    "The status code": a status without one is skipped
#   properties.virtualMachineScaleSet.id
#                                   Flexible: the set the VM belongs to ("Specifies
#                                   information about the virtual machine scale set that
#                                   the virtual machine should be assigned to"). The list
#                                   is filtered to the set by the server; a VM naming
#                                   another set, or none, is still no member
#   vmHealth, zones, tags, priority optional: no health probe, no zone, no tags, the set's
#   a status's message, time        optional (InstanceViewStatus: "The detailed status
#                                   message", "The time of the status"): a failed VM's
#                                   ProvisioningState/failed/<code> status carries the
#                                   ARM error's message and, usually, when it failed;
#                                   without a time, spotring takes the listing's
# networkInterfaces (the set's, or the resource group's for Flexible sets)
#   a NIC per VM                    optional while the VM is being created; a running
#                                   VM has a NIC with ipConfigurations[].privateIPAddress
#                                   (every VM in a VNet has a private address): without
#                                   one it is not usable
#
# One odd member costs only itself: a VM without something the table says it has is
# listed as not usable (PENDING), with one warning while it stays so. Only an answer
# broken as a whole (not JSON, no value list, a page missing, a VM without its name or
# id) fails the listing.

# ------------------------------------------------------------------- state maps

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


# ------------------------------------------------------------------ the set's view


@dataclass(frozen=True)
class _Member:
    """One VM of the set, reduced to what spotring uses."""

    name: str
    resource_id: str
    instance_id: str
    """Uniform: the set's instance id ("0", "1", ...; the id's last segment where the
    listing left it out). Flexible: not used."""
    provisioning: str
    power: str
    health: str
    size: str
    spot: bool
    zone: str
    tags: Mapping[str, str]
    created: float | None
    failure: str = ""
    """The code of ``ProvisioningState/failed/<code>``, if provisioning failed."""
    failure_message: str = ""
    failed_at: float | None = None
    """The failed status's ``time``, if it has one."""
    lacks: tuple[str, ...] = ()
    """What the listing left out that the VM has (see the table above): while it
    lacks anything, it is not usable."""

    @property
    def leaving(self) -> bool:
        return self.provisioning == "Deleting"

    @property
    def evicted(self) -> bool:
        return self.spot and self.power == "deallocated" and not self.leaving

    @property
    def never_started(self) -> bool:
        """Provisioning failed before the VM ever ran (e.g. no capacity for its size)."""
        return creation_failed(self.provisioning, self.power)


def _status(statuses: Iterable[Mapping[str, Any]], prefix: str) -> tuple[str, str]:
    """The code after ``prefix`` of the first status with it, and its message."""
    found = _find_status(statuses, prefix)
    if found is None:
        return "", ""
    return str(found["code"])[len(prefix) :], str(found.get("message") or "")


def _find_status(statuses: Iterable[Mapping[str, Any]], prefix: str) -> Mapping[str, Any] | None:
    return next((s for s in statuses if str(s["code"]).startswith(prefix)), None)


def _object(value: Any) -> Mapping[str, Any]:
    """``value`` if it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}


def _member_of(
    vm: Mapping[str, Any],
    set_spot: bool,
    set_size: str,
    set_tags: Mapping[str, str],
    set_id: str = "",
    call_name: str = "virtualMachineScaleSetVMs.list",
) -> _Member | None:
    """A VM of the set as ARM's JSON lists it (Uniform or Flexible shape), with what it
    lacks (see the table above); None for a Flexible VM (``set_id`` given) that is no
    member: its ``virtualMachineScaleSet.id`` names another set, or none. ARM ids are
    compared without case.

    Raises :class:`MalformedAnswer` for a VM without its name or id.
    """
    name, resource_id = str(vm.get("name") or ""), str(vm.get("id") or "")
    if not name or not resource_id:
        missing = "id" if name else "name"
        raise MalformedAnswer(call_name, f"a VM without its {missing} ({name or resource_id})")
    props = _object(vm.get("properties"))
    if set_id:
        named = str(_object(props.get("virtualMachineScaleSet")).get("id") or "")
        if named.lower() != set_id.lower():
            return None
    view = _object(props.get("instanceView"))
    given = view.get("statuses")
    listed: list[Any] = given if isinstance(given, list) else []
    statuses = [s for s in listed if isinstance(s, dict) and s.get("code")]
    lacks: list[str] = []
    provisioning = str(props.get("provisioningState") or "")
    power = _status(statuses, "PowerState/")[0]
    if not provisioning:
        lacks.append("its provisioning state")
    elif provisioning in ("Succeeded", "Updating") and not power:
        lacks.append("its power state")
    if len(statuses) < len(listed):
        lacks.append("a status's code")
    health = _object(_object(view.get("vmHealth")).get("status")).get("code") or ""
    size = (
        _object(vm.get("sku")).get("name")
        or _object(props.get("hardwareProfile")).get("vmSize")
        or set_size
    )
    priority = props.get("priority")
    failed = _find_status(statuses, "ProvisioningState/failed/") or {}
    failure, failure_message = _status(statuses, "ProvisioningState/failed/")
    return _Member(
        name=name,
        resource_id=resource_id,
        instance_id=str(vm.get("instanceId") or "") or resource_id.rsplit("/", 1)[-1],
        provisioning=provisioning,
        power=power,
        health=str(health).removeprefix("HealthState/"),
        size=str(size),
        spot=priority == "Spot" if priority else set_spot,
        zone=str((vm.get("zones") or [""])[0]),
        tags={**set_tags, **_object(vm.get("tags"))},
        created=_timestamp(props.get("timeCreated")),
        failure=failure,
        failure_message=failure_message,
        failed_at=_timestamp(failed.get("time")),
        lacks=tuple(lacks),
    )


_FRACTION = re.compile(r"\.(\d+)")


def _timestamp(text: Any) -> float | None:
    """Epoch seconds of ARM's ``2026-11-23T04:00:00.1234567+00:00`` (None if unreadable)."""
    if not isinstance(text, str) or not text:
        return None
    # ARM writes 7 fraction digits and sometimes "Z"; fromisoformat wants at most 6.
    text = _FRACTION.sub(lambda m: "." + m.group(1)[:6].ljust(6, "0"), text, count=1)
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def set_lifecycle(scale_set: Any) -> tuple[Lifecycle | None, str]:
    """What a scale set (azure-mgmt-compute's model of ``virtualMachineScaleSets.get``)
    launches, and why: its ``virtualMachineProfile.priority`` (Spot and the older Low
    are spot; Regular, or none, is on-demand), unless Spot Priority Mix
    (``priorityMixPolicy``) makes some VMs Regular: SPOT when its base count and
    percentage above base are both 0, ON_DEMAND when the percentage is 100, else
    None (a mixed set; each VM's own ``priority`` tells). An absent field of the mix
    policy is not guessed: the set counts as mixed.
    """
    props = scale_set.properties
    profile = props.virtual_machine_profile if props is not None else None
    given = profile.priority if profile is not None else None
    # The SDK gives its own str enum (VirtualMachinePriorityTypes.SPOT): use the value.
    priority = str(getattr(given, "value", given) or "Regular")
    if priority not in ("Spot", "Low"):
        return Lifecycle.ON_DEMAND, f"priority {priority}: on-demand VMs"
    mix = props.priority_mix_policy
    if mix is None:
        return Lifecycle.SPOT, f"priority {priority}: spot VMs"
    base = mix.base_regular_priority_count
    above = mix.regular_priority_percentage_above_base
    described = f"Spot Priority Mix (base {base}, {above}% Regular above it)"
    if above == 100:
        return Lifecycle.ON_DEMAND, f"{described}: every VM Regular"
    if base == 0 and above == 0:
        return Lifecycle.SPOT, f"{described}: every VM spot"
    return None, f"{described}: mixed, each VM's priority tells"


# ------------------------------------------------------------------ several sets


@dataclass(frozen=True)
class ScaleSetSpec:
    """One ``--group``: a scale set, its resource group, and its name in the job."""

    resource_group: str
    name: str
    label: str
    """What :meth:`AzureProvider.group_name` answers: unique within the job."""


def scale_set_specs(options: argparse.Namespace) -> list[ScaleSetSpec]:
    """The scale sets ``--group`` names (``NAME`` or ``RG/NAME``), in the order given.

    ARM names are case-insensitive, so ``rg/Workers`` and ``RG/workers`` are the same
    set: named twice, it is a :class:`ConfigurationError`. A set's label is its name,
    or ``RG/NAME`` where another set of the job has the same name.
    """
    given = getattr(options, "azure_group", None)
    values = [given] if isinstance(given, str) else list(given or [])
    default_rg = getattr(options, "azure_resource_group", None) or ""
    if not values:
        raise ConfigurationError("--group is required for --provider azure")
    pairs: list[tuple[str, str]] = []
    for value in values:
        rg, _, name = value.strip().rpartition("/")
        if "/" in rg or not name or (value.strip().count("/") and not rg):
            raise ConfigurationError(f"--group {value!r}: write NAME or RESOURCE_GROUP/NAME")
        rg = rg or default_rg
        if not rg:
            raise ConfigurationError(
                f"--group {name}: no resource group (pass --resource-group, or write"
                f" --group RESOURCE_GROUP/{name})"
            )
        pairs.append((rg, name))
    labels = group_labels(pairs, fold=str.lower)
    return [ScaleSetSpec(rg, name, label) for (rg, name), label in zip(pairs, labels, strict=True)]


class SharedClients:
    """The management clients, shared by the providers of one job's scale sets and
    closed when the last of them closes."""

    def __init__(self, compute: Any, network: Any) -> None:
        self.compute = compute
        self.network = network
        self._users = 0

    def share(self) -> SharedClients:
        """Count one more provider using the clients."""
        self._users += 1
        return self

    def release(self) -> None:
        """One provider is done with the clients; the last closes them."""
        self._users -= 1
        if self._users <= 0:
            for client in (self.compute, self.network):
                client.close()


# ------------------------------------------------------------------------ provider


class AzureProvider(CloudGroupProvider):
    """An Azure VM scale set, listed and steered through Azure Resource Manager.

    :attr:`api_calls` counts requests (each page and each retry), :attr:`api_retries`
    the repeated ones, :attr:`last_refresh_calls` those of the last listing.
    """

    name = "azure"
    description = "Azure VM scale sets (--group [RG/]NAME ... --resource-group RG)"
    slots_label_option = "--slots-tag"
    default_slots_label = DEFAULT_SLOTS_TAG
    sdk_modules = ("azure.mgmt.compute", "azure.mgmt.network", "azure.identity")
    sdk_extra = "spotring[azure]"
    needs_credentials = True
    can_remove = True

    def __init__(
        self,
        group: str,
        *,
        resource_group: str,
        subscription: str | None = None,
        endpoint: str | None = None,
        keep_evicted: bool = False,
        credential: Any | None = None,
        clients: SharedClients | None = None,
        group_name: str | None = None,
        **common: Any,
    ) -> None:
        """Make the clients; no API call. See :meth:`add_arguments` for the options.

        :param credential: an azure-core TokenCredential; by default
            ``DefaultAzureCredential`` (environment, workload or managed identity, Azure
            CLI login). An ``http://`` endpoint on loopback (a local test server) gets no
            credential at all: azure-core refuses to send a bearer token over plain HTTP.
        :param clients: the clients of another provider of the same job (same
            subscription and endpoint), shared instead of made: see
            :meth:`groups_from_options`.
        :param group_name: what :meth:`group_name` answers (default: ``group``).
        """
        if not group:
            raise ConfigurationError("--group is required for --provider azure")
        if not resource_group:
            raise ConfigurationError("--resource-group is required for --provider azure")
        super().__init__(**common)
        self.group = group
        self.resource_group = resource_group
        self.subscription = subscription or os.environ.get("AZURE_SUBSCRIPTION_ID") or ""
        if not self.subscription:
            raise ConfigurationError(
                "no Azure subscription: pass --subscription or set AZURE_SUBSCRIPTION_ID"
            )
        self.endpoint = endpoint
        self.keep_evicted = keep_evicted
        self._set: Any | None = None
        self._members: dict[str, _Member] = {}
        self._addresses: dict[str, str] = {}  # lower-case VM resource id -> private IP
        self._gpus_by_size: dict[str, int] | None = None
        self._wanted: int | None = None
        # Members whose eviction notice grew the set by one, and how many such growths
        # outlived their VM (the set kept the capacity: see keep_size).
        self._noticed: set[str] = set()
        self._growth_left = 0
        self._capacity_warnings = EpisodeWarnings(log)
        self._odd_members = EpisodeWarnings(log)
        self._left_out: dict[str, str] = {}
        self._warned_spot_restore = False
        self._group_name = group_name or group
        self._lifecycle_reason = ""
        # Capacity signals: when each failed VM was first listed (its status may carry
        # no time), the newest failure seen (kept after the VM is deleted), and the
        # newest scale-out ARM refused.
        self._failures_seen: dict[str, float] = {}
        self._newest_failure: CapacityShortage | None = None
        self._refusal: CapacityShortage | None = None
        self._scale_out: str | None = None  # the status URL of a scale-out not yet read
        self._removed: set[str] = set()
        self._closed = False
        if clients is None:
            clients = SharedClients(*self._make_clients(credential, endpoint))
        self._clients = clients.share()
        self._compute, self._network = clients.compute, clients.network

    # ----------------------------------------------------------------- options

    @classmethod
    def add_arguments(cls, group: argparse._ArgumentGroup) -> None:
        """Add ``--group``, ``--resource-group``, ``--subscription`` and the shared options."""
        group.add_argument(
            "--group",
            dest="azure_group",
            action="append",
            metavar="[RG/]NAME",
            help="scale set name, in --resource-group or in resource group RG; give it"
            " once per scale set of the job, the preferred one first",
        )
        group.add_argument(
            "--resource-group",
            dest="azure_resource_group",
            metavar="RG",
            help="the resource group of every --group NAME given without one",
        )
        group.add_argument(
            "--subscription",
            dest="azure_subscription",
            metavar="ID",
            help="subscription id (default: AZURE_SUBSCRIPTION_ID)",
        )
        group.add_argument(
            "--endpoint",
            dest="azure_endpoint",
            metavar="URL",
            help="Azure Resource Manager URL (sovereign clouds, or a test server)",
        )
        group.add_argument(
            "--keep-evicted",
            dest="azure_keep_evicted",
            action="store_true",
            help="leave spot VMs evicted with policy Deallocate in the set"
            " (default: they are failed hosts, which spotring run replaces unless"
            " --no-replace)",
        )
        cls.add_common_arguments(group, "azure")

    @classmethod
    def credential_source(cls) -> str | None:
        """Where DefaultAzureCredential would find credentials: a service principal in
        the environment, the Azure CLI's login, or a managed identity."""
        if os.environ.get("AZURE_CLIENT_ID") and os.environ.get("AZURE_TENANT_ID"):
            return "found (AZURE_CLIENT_ID / AZURE_TENANT_ID environment)"
        if (Path.home() / ".azure" / "msal_token_cache.json").is_file():
            return "found (Azure CLI login)"
        if os.environ.get("IDENTITY_ENDPOINT") or os.environ.get("MSI_ENDPOINT"):
            return "found (managed identity)"
        return None

    @classmethod
    def from_options(cls, options: argparse.Namespace, core: CoreOptions) -> AzureProvider:
        """The provider of the first (preferred) ``--group``; makes no API call."""
        return cls._from_spec(options, core, scale_set_specs(options)[0])

    @classmethod
    def groups_from_options(cls, options: argparse.Namespace, core: CoreOptions) -> list[Provider]:
        """One provider per ``--group``, in the order given, sharing one pair of
        clients (one subscription, credential and endpoint); makes no API call.

        Raises :class:`ConfigurationError` for a scale set named twice, or a ``NAME``
        without ``--resource-group``.
        """
        specs = scale_set_specs(options)
        first = cls._from_spec(options, core, specs[0])
        return [first, *(cls._from_spec(options, core, spec, first._clients) for spec in specs[1:])]

    @classmethod
    def _from_spec(
        cls,
        options: argparse.Namespace,
        core: CoreOptions,
        spec: ScaleSetSpec,
        clients: SharedClients | None = None,
    ) -> AzureProvider:
        return cls(
            spec.name,
            resource_group=spec.resource_group,
            subscription=getattr(options, "azure_subscription", None),
            endpoint=getattr(options, "azure_endpoint", None),
            keep_evicted=getattr(options, "azure_keep_evicted", False),
            clients=clients,
            group_name=spec.label,
            **cls.common_options(options, core, "azure"),
        )

    def group_name(self) -> str:
        """The scale set's name, or ``RG/NAME`` where another ``--group`` of the job
        has the same name in another resource group."""
        return self._group_name

    # ------------------------------------------------------------------ listing

    @property
    def flexible(self) -> bool:
        """Whether the set orchestrates ordinary VMs (Flexible) rather than its own."""
        assert self._set is not None
        return (self._set.properties.orchestration_mode or "Uniform") == "Flexible"

    def list_members(self) -> list[Instance]:
        """Every VM of the set with provisioning state, power state and health combined.

        Costs one get of the set and one VM list page (a steady set: two calls); the
        set's network interfaces (paged) only when a member has no known address yet;
        the resource SKU list once, when a member's slots come from its GPU count.
        """
        self._get_set()
        self._warn_about_spot_restore()
        members = self._list_vms()
        self._learn_addresses(members)
        members = [self._check_address(m) for m in members]
        self._members = {m.name: m for m in members}
        self._settle_noticed()
        self._learn_gpu_counts(members)
        self._warn_about_capacity(members)
        self._warn_about_odd_members(members)
        self._note_failures(members)
        return [self._to_instance(m) for m in members]

    def _address(self, member: _Member) -> str:
        return self._addresses.get(member.resource_id.lower(), "")

    def _check_address(self, member: _Member) -> _Member:
        """``member``, lacking its private address if it runs without a known one."""
        if member.power != "running" or self._address(member):
            return member
        return replace(member, lacks=(*member.lacks, "its private address"))

    def _warn_about_odd_members(self, members: Sequence[_Member]) -> None:
        """Warn once about each member that lacks something, and about VMs the listing
        left out, while they do."""
        lacking = {
            f"azure: VM {m.name} of scale set {self.group}": (
                f"azure: VM {m.name} of scale set {self.group} is listed without"
                f" {' and '.join(m.lacks)}; not usable until it is"
            )
            for m in members
            if m.lacks
        }
        self._odd_members.update({**lacking, **self._left_out})

    def _warn_about_spot_restore(self) -> None:
        """Warn once if the set restores evicted spot VMs by itself."""
        assert self._set is not None
        restore = self._set.properties.spot_restore_policy
        if restore is None or not restore.enabled or self._warned_spot_restore:
            return
        self._warned_spot_restore = True
        # SpotRestorePolicy.enabled: "evicted VMSS SPOT instances will be tried to be
        # restored opportunistically based on capacity availability" (the REST spec).
        log.warning(
            "azure: scale set %s restores evicted spot VMs itself (spotRestorePolicy);"
            " spotring replaces them too (a noticed VM's at once, an evicted one's unless"
            " --no-replace or --keep-evicted) and takes back what it added once the VM"
            " is gone, so the set may run more VMs than asked for a while",
            self.group,
        )

    def _to_instance(self, member: _Member) -> Instance:
        gpus = (self._gpus_by_size or {}).get(member.size)
        state = member_state(member.provisioning, member.power, member.health)
        return Instance(
            id=member.name,
            address=self._address(member),
            state=worst_state(state, InstanceState.PENDING) if member.lacks else state,
            slots=self.slots.slots(member.name, member.tags, gpus),
            lifecycle=Lifecycle.SPOT if member.spot else Lifecycle.ON_DEMAND,
            zone=member.zone,
            instance_type=member.size,
            launch_time=member.created,
            cloud_state="/".join(
                part or "-" for part in (member.provisioning, member.power, member.health)
            ),
            labels=member.tags,
            failure=self._failure(member),
        )

    def _failure(self, member: _Member) -> str:
        """Why the set will not run ``member`` again by itself ("" if it may)."""
        if member.evicted and not self.keep_evicted:
            return "spot VM evicted (deallocated)"
        if member.never_started:
            return f"provisioning failed: {member.failure or 'no reason given'}"
        return ""

    def _get_set(self) -> Any:
        def get() -> Any:
            found = self._compute.virtual_machine_scale_sets.get(self.resource_group, self.group)
            if not all(getattr(found, name, None) for name in ("id", "location", "properties")):
                raise MalformedAnswer(
                    "virtualMachineScaleSets.get", "the scale set without its id or properties"
                )
            return found

        self._set = self.call_api("virtualMachineScaleSets.get", get)
        return self._set

    @property
    def _capacity(self) -> int:
        assert self._set is not None
        return int(self._set.sku.capacity or 0) if self._set.sku else 0

    def _list_vms(self) -> list[_Member]:
        profile = self._set.properties.virtual_machine_profile if self._set else None
        set_spot = bool(profile and profile.priority == "Spot")
        set_size = (self._set.sku.name if self._set and self._set.sku else "") or ""
        # A Flexible set's VMs need not carry the set's tags (Terraform puts the slots
        # tag on the set): a VM's own tag wins, the set's fills in.
        set_tags = dict(self._set.tags or {}) if self._set else {}
        group = f"/subscriptions/{quote(self.subscription, safe='')}/resourceGroups/"
        group += quote(self.resource_group, safe="")
        if self.flexible:
            assert self._set is not None  # self.flexible reads it
            set_filter = f"'virtualMachineScaleSet/id' eq '{self._set.id}'"
            vms = self._json_pages(
                "virtualMachines.list",
                f"{group}/providers/Microsoft.Compute/virtualMachines",
                {"$filter": set_filter, "$expand": "instanceView"},
            )
        else:
            vms = self._json_pages(
                "virtualMachineScaleSetVMs.list",
                f"{group}/providers/Microsoft.Compute/virtualMachineScaleSets/"
                f"{quote(self.group, safe='')}/virtualMachines",
                {"$expand": "instanceView"},
            )
        set_id = self._set.id if self.flexible and self._set is not None else ""
        call_name = "virtualMachines.list" if self.flexible else "virtualMachineScaleSetVMs.list"
        listed = [_member_of(vm, set_spot, set_size, set_tags, set_id, call_name) for vm in vms]
        members = [m for m in listed if m is not None]
        foreign = len(listed) - len(members)  # the server's filter let them through
        self._left_out = {}
        if foreign:
            self._left_out[f"azure: VMs of other sets listed for {self.group}"] = (
                f"azure: the VM list for scale set {self.group} held {foreign} VM(s) of"
                " other scale sets, or of none; left out"
            )
        return members

    def _learn_addresses(self, members: Sequence[_Member]) -> None:
        """Private IPs from the network interfaces, for members without one yet."""
        listed = {m.resource_id.lower() for m in members}
        self._addresses = {k: v for k, v in self._addresses.items() if k in listed}
        if all(self._address(m) or not m.power for m in members):
            return
        if self.flexible:
            call_name = "networkInterfaces.list"
            nics = self._pages(
                call_name, lambda: self._network.network_interfaces.list(self.resource_group)
            )
        else:
            call_name = "networkInterfaces.listVirtualMachineScaleSetNetworkInterfaces"
            nics = self._pages(
                call_name,
                lambda: (
                    self._network.network_interfaces.list_virtual_machine_scale_set_network_interfaces(
                        self.resource_group, self.group
                    )
                ),
            )
        for nic in nics:
            props = nic.properties
            vm = props.virtual_machine if props else None
            if vm is None or not vm.id or vm.id.lower() not in listed:
                continue
            for config in props.ip_configurations or ():
                address = config.properties.private_ip_address if config.properties else None
                if address:
                    self._addresses[vm.id.lower()] = address
                    break

    def _learn_gpu_counts(self, members: Sequence[_Member]) -> None:
        """The GPU count of every VM size in the set's location, asked once."""
        if self._gpus_by_size is not None or not any(
            self.slots.needs_accelerator_count(m.name, m.tags) for m in members
        ):
            return
        location = self._set.location if self._set else ""
        skus = self._pages(
            "resourceSkus.list",
            lambda: self._compute.resource_skus.list(filter=f"location eq '{location}'"),
        )
        gpus: dict[str, int] = {}
        for sku in skus:
            if sku.resource_type != "virtualMachines" or not sku.name:
                continue
            counts = [c.value for c in sku.capabilities or () if c.name == "GPUs"]
            try:
                gpus[sku.name] = int(float(counts[0])) if counts else 0
            except ValueError:
                gpus[sku.name] = 0
        self._gpus_by_size = gpus

    # ----------------------------------------------------------------- capacity

    def group_lifecycle(self) -> Lifecycle | None:
        """SPOT or ON_DEMAND from the set's priority and Spot Priority Mix, or None for
        a set that mixes both (its members' own priority tells them apart).

        Read from the set the last refresh got (one get if there was none yet); the
        reason is logged when it changes.
        """
        if self._set is None:
            self._get_set()
        assert self._set is not None
        lifecycle, reason = set_lifecycle(self._set)
        if reason != self._lifecycle_reason:
            self._lifecycle_reason = reason
            log.info("azure: scale set %s: %s", self.group, reason)
        return lifecycle

    @property
    def lifecycle_reason(self) -> str:
        """Why :meth:`group_lifecycle` answered what it did ("" before it was asked)."""
        return self._lifecycle_reason

    def capacity_shortage(self, since: float) -> CapacityShortage | None:
        """The newest failure to add VMs to the set at or after ``since``: a VM whose
        provisioning failed (``ProvisioningState/failed/<code>`` in its instance view;
        SkuNotAvailable, AllocationFailed, ... are CAPACITY,
        SpotPriceGreaterThanProvidedMaxPrice PRICE, quota codes QUOTA), a scale-out ARM
        refused (409 ``OperationNotAllowed`` for quota), or a scale-out whose operation
        failed.

        The VMs are the ones the last listing read, the refusal the one the last
        capacity change got; the one call made is to the last scale-out's operation
        status, until it is done. A failure stays known after spotring deletes the
        failed VM.
        """
        self._read_scale_out()
        found: list[tuple[float, CapacityShortage]] = [
            (shortage.at, shortage)
            for shortage in (self._newest_failure, self._refusal)
            if shortage is not None and shortage.at is not None and shortage.at >= since
        ]
        return max(found, key=lambda pair: pair[0])[1] if found else None

    def _read_scale_out(self) -> None:
        """Read the last scale-out's operation status; its error, if it failed, is a
        refusal. ARM's status document ("Track asynchronous Azure operations",
        learn.microsoft.com/azure/azure-resource-manager/management/async-operations):
        ``status`` InProgress, then Succeeded, Failed or Canceled, and for Failed an
        ``error`` with ``code`` and ``message`` (ZonalAllocationFailed and the like,
        which no VM may show: the set may not keep the VMs it could not create)."""
        from azure.core.exceptions import HttpResponseError
        from azure.core.rest import HttpRequest
        from azure.mgmt.core.exceptions import ARMErrorFormat

        url = self._scale_out
        if url is None:
            return

        def read() -> Mapping[str, Any]:
            response = self._compute.send_request(HttpRequest("GET", url))
            if response.status_code == 404:
                return {"status": "Canceled"}  # expired: nothing more to learn
            if response.status_code != 200:
                raise HttpResponseError(response=response, error_format=ARMErrorFormat)
            return _object(response.json())

        answer = self.call_api("operations.get", read)
        status = answer.get("status")
        if status not in ("Succeeded", "Failed", "Canceled"):
            return  # InProgress, or an answer without its status: ask again later
        self._scale_out = None
        error = _object(answer.get("error"))
        if status == "Failed" and error.get("code"):
            at = _timestamp(answer.get("endTime"))
            self._note_refusal(str(error["code"]), one_line(error.get("message") or "", 600), at)

    def _note_failures(self, members: Sequence[_Member]) -> None:
        """Remember the newest VM whose provisioning failed before it ever ran."""
        now = time.time()
        failed = {m.resource_id.lower(): m for m in members if m.never_started and m.failure}
        seen = {key: self._failures_seen.get(key, now) for key in failed}
        self._failures_seen = seen
        for key, member in failed.items():
            at = member.failed_at if member.failed_at is not None else seen[key]
            if self._newest_failure is None or at > (self._newest_failure.at or 0.0):
                self._newest_failure = CapacityShortage(
                    cause=shortage_cause(member.failure, member.failure_message),
                    code=member.failure,
                    message=one_line(member.failure_message),
                    at=at,
                )

    def _note_refusal(self, code: str, message: str, at: float | None = None) -> None:
        """A capacity change ARM refused (:meth:`translate_error`), or whose operation
        failed (at ``at``, by default now)."""
        self._refusal = CapacityShortage(
            cause=shortage_cause(code, message),
            code=code,
            message=message,
            at=time.time() if at is None else at,
        )

    # ----------------------------------------------------------------- steering

    def set_target_size(self, size: int) -> None:
        """Set the set's capacity to ``size``; no call when it already is ``size``."""
        if size < 0:
            raise ConfigurationError(f"target size {size} is negative")
        if self._set is None:
            self._get_set()
        self._wanted = size
        if self._capacity != self._kept:
            self._update_capacity(self._kept)

    def replace_instance(self, instance_id: str) -> None:
        """Delete the VM named ``instance_id`` and keep the set's capacity (restored on
        the next refresh, once Azure has lowered it). A VM already being deleted, or not
        in the set, is left alone."""
        member = self._members.get(instance_id)
        if member is None:  # not in the last listing (or none yet): ask the set
            self._get_set()
            self._members = {m.name: m for m in self._list_vms()}
            member = self._members.get(instance_id)
        if member is None or member.leaving:
            return
        if self._wanted is None:
            self._wanted = self._capacity
        self._delete(member)

    def remove_instance(self, instance_id: str) -> None:
        """Delete the VM named ``instance_id`` and lower the capacity spotring keeps by
        one, so that :meth:`keep_size` does not launch another (Azure lowers the set's
        own capacity as it deletes the VM). Idempotent: asking again for a VM already
        removed does nothing, and a VM already gone (or gone meanwhile: a 404) only
        lowers the size spotring keeps, once.
        """
        if instance_id in self._removed:
            return
        member = self._members.get(instance_id)
        if member is None:  # not in the last listing (or none yet): ask the set
            self._get_set()
            self._members = {m.name: m for m in self._list_vms()}
            member = self._members.get(instance_id)
        if self._wanted is None:
            self._wanted = self._capacity
        if member is not None and not member.leaving:
            self._delete(member)
        self._removed.add(instance_id)
        self._wanted = max(0, self._wanted - 1)
        log.info(
            "azure: removed %s from scale set %s; keeping its capacity at %d",
            instance_id,
            self.group,
            self._wanted,
        )

    def _delete(self, member: _Member) -> None:
        from azure.core.exceptions import ResourceNotFoundError
        from azure.mgmt.core.tools import parse_resource_id

        def delete() -> None:
            try:
                if self.flexible:
                    # By the id the listing gave: the VM it found in the set, wherever
                    # its resource group is spelled.
                    vm = parse_resource_id(member.resource_id)
                    self._compute.virtual_machines.begin_delete(
                        vm["resource_group"], vm["name"], polling=False
                    )
                else:
                    self._compute.virtual_machine_scale_sets.begin_delete_instances(
                        self.resource_group,
                        self.group,
                        {"instanceIds": [member.instance_id]},
                        polling=False,
                    )
            except ResourceNotFoundError:
                pass  # deleted meanwhile (an eviction with policy Delete): done already

        call_name = (
            "virtualMachines.delete" if self.flexible else "virtualMachineScaleSets.deleteInstances"
        )
        self.call_api(call_name, delete)
        self._members[member.name] = replace(member, provisioning="Deleting")
        log.info("azure: deleting %s from scale set %s", member.name, self.group)

    def _warn_about_capacity(self, members: Sequence[_Member]) -> None:
        """Warn once per zone and error while the set cannot provision VMs there."""
        conditions: dict[str, str] = {}
        for member in members:
            if member.never_started and is_refusal(member.failure, member.failure_message):
                where = f"zone {member.zone}" if member.zone else self._set_location()
                conditions.setdefault(
                    f"azure: {where} {member.failure}",
                    f"azure: scale set {self.group} cannot create VMs in {where}:"
                    f" {member.failure}: {one_line(member.failure_message, 160)}",
                )
        # The failed VMs are deleted and tried again, so between attempts none may be
        # listed: the shortage lasts until the set runs as many VMs as spotring wants.
        running = sum(m.provisioning == "Succeeded" and m.power == "running" for m in members)
        if self._wanted is not None and running < self._wanted:
            conditions = {**self._capacity_warnings.active, **conditions}
        self._capacity_warnings.update(conditions)

    def _set_location(self) -> str:
        return str(self._set.location) if self._set is not None else "its location"

    @property
    def _kept(self) -> int:
        """The capacity spotring keeps: the size asked for, plus one per noticed VM
        still in the set (its replacement started early)."""
        return (self._wanted or 0) + len(self._noticed)

    def keep_size(self) -> None:
        """Hold the set at the capacity spotring keeps (:attr:`_kept`: the size asked of
        set_target_size, or kept by a replacement, plus noticed VMs still listed).

        Puts back capacity Azure took away for deleted and evicted VMs. Takes back the
        one a notice added once the noticed VM is gone, where Azure did not (a set that
        restores evicted spot VMs itself keeps its capacity); never lowers it otherwise.
        """
        if self._wanted is None or not self.can_resize or self._set is None:
            return
        capacity, kept = self._capacity, self._kept
        if capacity <= kept:
            self._growth_left = 0  # Azure took it back with the VM
        target = max(kept, capacity - self._growth_left)
        if target == capacity:
            return
        if any(m.leaving for m in self._members.values()):
            return  # a delete still runs: the set refuses a capacity change meanwhile
        if target > capacity:
            log.info("azure: scale set %s capacity %d is below %d (deleted or evicted VMs);"
                     " restoring", self.group, capacity, target)  # fmt: skip
        else:
            log.info("azure: scale set %s kept the capacity added for noticed VMs now gone;"
                     " taking it back to %d", self.group, target)  # fmt: skip
        self._growth_left = 0
        self._update_capacity(target)

    def _settle_noticed(self) -> None:
        """Forget noticed VMs that left the set or are being deleted (Azure lowers the
        capacity as it deletes a VM): their growth is due back unless Azure took it."""
        gone = {
            name
            for name in self._noticed
            if name not in self._members or self._members[name].leaving
        }
        self._noticed -= gone
        self._growth_left += len(gone)

    def _update_capacity(self, size: int) -> None:
        """Set the capacity; a scale-out's operation is read when a shortage is asked."""
        status_urls: list[str] = []

        def note_status_url(pipeline_response: Any) -> None:
            headers = pipeline_response.http_response.headers
            status_urls.append(headers.get("Azure-AsyncOperation") or "")

        self.call_api(
            "virtualMachineScaleSets.update",
            lambda: self._compute.virtual_machine_scale_sets.begin_update(
                self.resource_group,
                self.group,
                {"sku": {"capacity": size}},
                polling=False,
                raw_response_hook=note_status_url,
            ),
        )
        if size > self._capacity and status_urls and self._same_origin(status_urls[-1]):
            self._scale_out = status_urls[-1]
        if self._set is not None and self._set.sku is not None:
            self._set.sku.capacity = size
        log.info("azure: scale set %s capacity -> %d", self.group, size)

    def _same_origin(self, url: str) -> bool:
        """Whether ``url`` is on the Resource Manager spotring talks to: only there may
        the credentials' token go."""
        base = urlsplit(self.endpoint or DEFAULT_ENDPOINT)
        given = urlsplit(url)
        return (given.scheme, given.netloc.lower()) == (base.scheme, base.netloc.lower())

    def host_noticed(self, instance: Instance, notice: InterruptionNotice) -> None:
        """At a spot eviction notice, grow the set by one now, once per VM: its
        replacement starts while the VM still trains. The eviction (policy Delete), or
        spotring's delete of the deallocated VM, takes the capacity back down; where it
        does not, :meth:`keep_size` does once the VM is gone."""
        if notice.kind != "preempt" or not self.can_resize or self._set is None:
            return
        if instance.id in self._noticed or instance.id not in self._members:
            return
        if self._wanted is None:
            self._wanted = self._capacity
        self._noticed.add(instance.id)
        self._update_capacity(max(self._capacity + 1, self._kept))

    def scale_down_size(self) -> int:
        """0: a scale set has no minimum capacity of its own."""
        return 0

    def notice_watcher(self, instance: Instance) -> Mapping[str, Any] | None:
        """Every host watches Scheduled Events (Preempt, Terminate), acknowledged once
        the host has left the ring."""
        return {"watcher": "azure"}

    def describe(self) -> str:
        """``azure scale set NAME (RESOURCE_GROUP)``."""
        return f"azure scale set {self.group} ({self.resource_group})"

    def close(self) -> None:
        """Close the clients' HTTP sessions (those shared, when the last user closes)."""
        if not self._closed:
            self._closed = True
            self._clients.release()

    # -------------------------------------------------------------- API plumbing

    def _make_clients(self, credential: Any | None, endpoint: str | None) -> tuple[Any, Any]:
        try:
            from azure.mgmt.compute import ComputeManagementClient
            from azure.mgmt.network import NetworkManagementClient
        except ImportError:
            raise ConfigurationError(
                "the azure provider needs azure-mgmt-compute, azure-mgmt-network and"
                " azure-identity: pip install 'spotring[azure]'"
            ) from None
        options = client_options(endpoint)
        if "authentication_policy" in options:  # a loopback test server: no token
            credential = credential or _NoCredential()
        if credential is None:
            credential = _default_credential()
        return (
            ComputeManagementClient(credential, self.subscription, **options),
            NetworkManagementClient(credential, self.subscription, **options),
        )

    def _pages(self, call_name: str, make_pager: Callable[[], Any]) -> list[Any]:
        """Every item of a paged list, one retried call per page."""
        items: list[Any] = []
        token: str | None = None

        def fetch_page() -> tuple[list[Any], str | None]:
            pages = make_pager().by_page(continuation_token=token)
            page = list(next(pages, []))
            return page, pages.continuation_token

        while True:
            page, token = self.call_api(call_name, fetch_page)
            items.extend(page)
            if not token:
                return items

    def _json_pages(self, call_name: str, path: str, params: dict[str, str]) -> list[dict]:
        """Every item of a paged ARM list as plain JSON, one retried call per page.

        For the VM list, the bulk of every refresh: azure-mgmt-compute building its
        models from it costs about ten times the request itself. The request still
        goes through the client's pipeline (credentials, timeouts, policies).
        """
        from azure.core.exceptions import HttpResponseError
        from azure.core.rest import HttpRequest
        from azure.mgmt.core.exceptions import ARMErrorFormat

        items: list[dict] = []
        request = HttpRequest("GET", path, params={"api-version": COMPUTE_API_VERSION, **params})
        while True:

            def fetch(request: HttpRequest = request) -> dict[str, Any]:
                response = self._compute.send_request(request)
                if response.status_code != 200:
                    raise HttpResponseError(response=response, error_format=ARMErrorFormat)
                page = response.json()
                if not isinstance(page, dict) or not isinstance(page.get("value"), list):
                    # ARM always sends "value", if only [] for an empty set.
                    raise MalformedAnswer(call_name, "a page without its value list")
                return page

            page = self.call_api(call_name, fetch)
            items.extend(item for item in page["value"] if isinstance(item, dict))
            next_link = page.get("nextLink")
            if not next_link:
                return items
            request = HttpRequest("GET", str(next_link))

    def retry_delay(self, error: Exception) -> float | None:
        return _retry_after(error)

    def translate_error(self, call_name: str, error: Exception) -> ProviderError:
        from azure.core import exceptions as core

        action = _ACTION_BY_CALL[call_name]
        if _is_credential_error(error):
            return ConfigurationError(
                "no usable Azure credentials: run 'az login', set AZURE_CLIENT_ID /"
                " AZURE_TENANT_ID / AZURE_CLIENT_SECRET, or use a managed identity"
                f" ({type(error).__name__})"
            )
        # An answer that broke off has no status: not the server's refusal.
        if (
            isinstance(error, core.DecodeError)
            or not isinstance(error, core.HttpResponseError)
            or error.status_code is None
        ):
            if isinstance(error, (core.ServiceRequestError, core.ServiceResponseError, OSError)):
                shown = self.endpoint or DEFAULT_ENDPOINT
                return ProviderError(
                    f"cannot reach Azure at {shown} for {call_name}: {type(error).__name__}"
                )
            return ProviderError(
                f"{call_name} failed: {type(error).__name__}: {one_line(error, 120)}"
            )
        code, raw = _arm_error(error)
        message = one_line(raw)
        if _retry_after(error) is not None:
            return ProviderError(f"{call_name} failed after retries: {error.status_code} {code}")
        if code in ("AuthorizationFailed", "LinkedAuthorizationFailed") or error.status_code == 403:
            named = re.search(r"perform action '([^']+)'", message)
            return ConfigurationError(
                f"Azure denied {named.group(1) if named else action} ({code or 403}): allow it in"
                " the role of the identity spotring runs as (see IAM_ACTIONS in"
                " spotring.providers.azure)"
            )
        if error.status_code == 401:
            return ConfigurationError(f"Azure rejected the credentials ({code}): {message}")
        if code == "ResourceGroupNotFound":
            return ConfigurationError(
                f"resource group '{self.resource_group}' not found"
                f" in subscription {self.subscription}"
            )
        if is_refusal(code, raw):
            # A capacity, price or quota refusal: the job trains on what it has,
            # spotring asks again later, and capacity_shortage reports it.
            if call_name == "virtualMachineScaleSets.update":
                # Whole: the quota's limit, usage and what more it needs come last.
                self._note_refusal(code, one_line(raw, 600))
            return ProviderError(f"scale set '{self.group}' cannot grow: {message}")
        if code in ("SubscriptionNotFound", "InvalidSubscriptionId"):
            return ConfigurationError(f"subscription {self.subscription} not found")
        if error.status_code == 404:
            return ConfigurationError(
                f"scale set '{self.group}' not found in resource group '{self.resource_group}'"
            )
        return ConfigurationError(f"{call_name} failed: {error.status_code} {code}: {message}")


def client_options(endpoint: str | None) -> dict[str, Any]:
    """Keyword arguments for the management clients talking to ``endpoint``.

    An https endpoint (a sovereign cloud's Resource Manager) also sets the token scope,
    which the clients would otherwise leave at the public cloud's. A plain-http one is
    accepted only on loopback (a test server) and gets an authentication policy that
    adds nothing: azure-core refuses to send a bearer token over plain HTTP.
    """
    from azure.core.pipeline.policies import SansIOHTTPPolicy

    options: dict[str, Any] = {
        # Our retries (counted, --max-api-attempts, Retry-After) replace azure-core's.
        "retry_total": 0,
        "connection_timeout": CONNECTION_TIMEOUT,
        "read_timeout": READ_TIMEOUT,
    }
    if not endpoint:
        return options
    if check_endpoint(endpoint):
        options["authentication_policy"] = SansIOHTTPPolicy()
    else:
        options["credential_scopes"] = [f"https://{urlsplit(endpoint).netloc}/.default"]
    options["base_url"] = endpoint.rstrip("/")
    return options


class _NoCredential:
    """The credential of a loopback test server: the SDK wants one, nothing asks it."""

    def get_token(self, *scopes: str, **kwargs: Any) -> Any:
        from azure.core.exceptions import ClientAuthenticationError

        raise ClientAuthenticationError("no credentials are sent to a plain-http endpoint")


def _default_credential() -> Any:
    try:
        from azure.identity import DefaultAzureCredential
    except ImportError:
        raise ConfigurationError(
            "the azure provider needs azure-identity: pip install 'spotring[azure]'"
        ) from None
    # On failure it logs every credential it tried, over many lines; spotring says
    # it in one (see translate_error).
    logging.getLogger("azure.identity").setLevel(logging.ERROR)
    # No browser prompt: spotring runs unattended.
    return DefaultAzureCredential(exclude_interactive_browser_credential=True)


def _is_credential_error(error: Exception) -> bool:
    from azure.core.exceptions import ClientAuthenticationError

    # Raised by the credential while getting a token, before any request is sent
    # (azure-identity's CredentialUnavailableError is a ClientAuthenticationError).
    return isinstance(error, ClientAuthenticationError) and getattr(error, "response", None) is None


def _arm_error(error: Any) -> tuple[str, str]:
    """The ARM error code and (whole) message of an azure-core HttpResponseError."""
    if error.error is not None:
        return str(error.error.code or ""), str(error.error.message or "")
    return "", str(error.message or "")


def _retry_after(error: Exception) -> float | None:
    """Seconds to wait before retrying ``error`` (0: the backoff decides), or None."""
    from azure.core import exceptions as core

    if isinstance(error, core.DecodeError):  # a truncated or malformed answer
        return 0.0
    if isinstance(error, core.HttpResponseError) and not isinstance(
        error, core.ClientAuthenticationError
    ):
        if error.status_code is None:  # the answer broke off (a stream cut short)
            return 0.0
        status = error.status_code
        # 409: another operation on the set is still running, or a VM is marked for
        # deletion; but not a refusal, which asking again at once does not change.
        if is_refusal(*_arm_error(error)):
            return None
        if status not in (408, 409, 429) and status < 500:
            return None
        headers = getattr(getattr(error, "response", None), "headers", None) or {}
        try:
            return min(60.0, float(headers.get("Retry-After", 0) or 0))
        except ValueError:
            return 0.0
    if isinstance(error, (core.ServiceRequestError, core.ServiceResponseError)):
        return 0.0
    if isinstance(error, (OSError, ValueError)):
        return 0.0
    return None


@hookimpl
def spotring_register_providers(registry: ProviderRegistry) -> None:
    """Register :class:`AzureProvider` as ``azure``."""
    registry.add(AzureProvider)


__all__ = [
    "HEALTH_STATE_MAP",
    "IAM_ACTIONS",
    "POWER_STATE_MAP",
    "PROVISIONING_STATE_MAP",
    "AzureProvider",
    "client_options",
    "member_state",
]
