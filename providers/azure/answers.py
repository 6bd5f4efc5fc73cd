"""ARM's answers read into what the provider keeps: what each answer must hold (the
table below), one VM as a :class:`Member` (with what it lacks), a timestamp, the set's
lifecycle, the private addresses of its network interfaces and the GPU count of its VM
sizes."""

from __future__ import annotations

import re
from collections.abc import Container, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from spotring.providers.azure.states import creation_failed
from spotring.providers.base import Lifecycle
from spotring.providers.cloud import MalformedAnswer

# Fields the answers must hold
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


@dataclass(frozen=True)
class Member:
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


def json_object(value: Any) -> Mapping[str, Any]:
    """``value`` if it is a JSON object, else an empty one."""
    return value if isinstance(value, dict) else {}


def member_of(
    vm: Mapping[str, Any],
    set_spot: bool,
    set_size: str,
    set_tags: Mapping[str, str],
    set_id: str = "",
    call_name: str = "virtualMachineScaleSetVMs.list",
) -> Member | None:
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
    props = json_object(vm.get("properties"))
    if set_id:
        named = str(json_object(props.get("virtualMachineScaleSet")).get("id") or "")
        if named.lower() != set_id.lower():
            return None
    view = json_object(props.get("instanceView"))
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
    health = json_object(json_object(view.get("vmHealth")).get("status")).get("code") or ""
    size = (
        json_object(vm.get("sku")).get("name")
        or json_object(props.get("hardwareProfile")).get("vmSize")
        or set_size
    )
    priority = props.get("priority")
    failed = _find_status(statuses, "ProvisioningState/failed/") or {}
    failure, failure_message = _status(statuses, "ProvisioningState/failed/")
    return Member(
        name=name,
        resource_id=resource_id,
        instance_id=str(vm.get("instanceId") or "") or resource_id.rsplit("/", 1)[-1],
        provisioning=provisioning,
        power=power,
        health=str(health).removeprefix("HealthState/"),
        size=str(size),
        spot=priority == "Spot" if priority else set_spot,
        zone=str((vm.get("zones") or [""])[0]),
        tags={**set_tags, **json_object(vm.get("tags"))},
        created=timestamp(props.get("timeCreated")),
        failure=failure,
        failure_message=failure_message,
        failed_at=timestamp(failed.get("time")),
        lacks=tuple(lacks),
    )


_FRACTION = re.compile(r"\.(\d+)")


def timestamp(text: Any) -> float | None:
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


def private_addresses(nics: Iterable[Any], vm_ids: Container[str]) -> dict[str, str]:
    """The private IP of each VM in ``vm_ids`` (lower-case resource ids) that one of
    ``nics`` (azure-mgmt-network's models of a NIC list) gives, by lower-case VM id."""
    addresses: dict[str, str] = {}
    for nic in nics:
        props = nic.properties
        vm = props.virtual_machine if props else None
        if vm is None or not vm.id or vm.id.lower() not in vm_ids:
            continue
        for config in props.ip_configurations or ():
            address = config.properties.private_ip_address if config.properties else None
            if address:
                addresses[vm.id.lower()] = address
                break
    return addresses


def gpu_counts(skus: Iterable[Any]) -> dict[str, int]:
    """The GPU count of each VM size of ``skus`` (azure-mgmt-compute's models of the
    resource SKU list); 0 where it names none, or none readable."""
    gpus: dict[str, int] = {}
    for sku in skus:
        if sku.resource_type != "virtualMachines" or not sku.name:
            continue
        counts = [c.value for c in sku.capabilities or () if c.name == "GPUs"]
        try:
            gpus[sku.name] = int(float(counts[0])) if counts else 0
        except ValueError:
            gpus[sku.name] = 0
    return gpus
