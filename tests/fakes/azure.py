"""A fake Azure Resource Manager (ARM) REST API on loopback, for the Azure provider's tests.

The real ``azure-mgmt-compute`` and ``azure-mgmt-network`` clients talk to it over plain
HTTP::

    from azure.core.pipeline.policies import SansIOHTTPPolicy

    with FakeArm() as fake:
        workers = fake.add_scale_set("workers", mode="Uniform", capacity=3)
        compute = ComputeManagementClient(
            credential, fake.subscription, base_url=fake.url,
            authentication_policy=SansIOHTTPPolicy(), polling_interval=0,
        )
        compute.virtual_machine_scale_sets.get("rg", "workers").sku.capacity  # 3

``credential`` is never asked for a token (the SansIOHTTPPolicy replaces the bearer-token
policy, which would refuse plain http); any object will do, but not None.

Response bodies are built from the SDK's own model classes (``azure.mgmt.compute.models``,
``azure.mgmt.network.models``) and written with the SDK's JSON encoder, so field names
(camelCase, ``properties`` envelopes) are the ones the SDK reads back.

Covered: VM scale sets in both orchestration modes (get, update = capacity, delete
instances), their VMs (Uniform: ``virtualMachineScaleSets/{vmss}/virtualMachines``;
Flexible: ordinary ``virtualMachines`` filtered by ``virtualMachineScaleSet/id``), VM delete,
NICs (per scale set and per resource group), the resource SKU list, long-running
operations, ARM error bodies, RBAC denials, throttling and fault injection; and the
capacity signals: a VM whose provisioning failed (``provisioningState`` Failed, no power
state or the one ``capacity_error(power_state=...)`` gives, an instance view status
``ProvisioningState/failed/<code>`` with ARM's message and, unless the test leaves it out,
its ``time``; the scale-out's operation ends Failed with the code), a scale-out refused
with 409 ``OperationNotAllowed`` beyond a vCPU quota (``fake.set_quota``), a spot max price
below the spot price (``SpotPriceGreaterThanProvidedMaxPrice``), and Spot Priority Mix
(``priorityMixPolicy`` on a Flexible set, each VM with its own ``priority``). Documented
states: a VM being created passes through ``PowerState/stopped``
(``fake.stopped_while_creating``), as does one started from deallocated (``start``); 409
``OperationNotAllowed`` state conflicts (``state_conflict``); ``spotRestorePolicy``
(``spot_restore``); the Flexible VM list's ``$expand=instanceView`` refused without a
``$filter``, and a server that ignores the filter (``fake.vm_filter_ignored``).

What the installed SDKs do against it (azure-mgmt-compute 39.0.0, azure-mgmt-network 33.1.0,
azure-core 1.41.0; all checked by tests/providers/test_azure_fake.py):

- api-versions: compute ``2026-04-01`` (resource SKUs ``2021-07-01``); network
  ``2026-03-01`` for ``network_interfaces.list`` but ``2018-10-01`` for
  ``list_virtual_machine_scale_set_network_interfaces``. The fake accepts any version and
  records it (``RecordedRequest.api_version``); a request without one answers 400
  ``MissingApiVersionParameter`` like ARM.
- Paging: the SDK follows ``nextLink`` verbatim (it adds no api-version), so the fake's
  nextLinks carry the first request's query plus ``$skiptoken``.
- ``begin_update`` accepts only 200 from the PATCH (anything else raises), so the PATCH
  answers 200 with the scale set (provisioningState ``Updating``) and an
  ``Azure-AsyncOperation`` header. ``.result()`` polls that URL until ``Succeeded`` and then
  GETs the scale set again (a PATCH's final GET is its own URL): one update costs
  PATCH + ``lro_in_progress_polls + 1`` operation GETs + one scale set GET.
- ``begin_delete_instances`` (POST) accepts 200/202: the fake answers 202 with
  ``Azure-AsyncOperation`` and ``Location``; the poller polls Azure-AsyncOperation and, for a
  POST, finishes with a GET of ``Location`` (answered 200, empty body).
- ``virtual_machines.begin_delete`` accepts 200/202/204: 202 with both headers; the poller
  polls Azure-AsyncOperation and does no final GET. Deleting a VM that does not exist answers
  204 (ARM deletes are idempotent), which ``.result()`` takes as done.
- The poller sleeps ``Retry-After`` between polls when the status answer has one, else the
  client's ``polling_interval`` (default 30 s!). A ``Retry-After: 0`` counts as absent. Build
  test clients with ``polling_interval=0``, or set ``fake.lro_retry_after`` (seconds; a
  fraction goes on status answers only, because the SDK parses the initial answer's
  Retry-After with ``int()`` and a fraction there raises ValueError).
- azure-core's RetryPolicy retries by itself, at most 3 times for error statuses
  (``retry_status=3``; ``retry_total`` is 10): any answer >= 400 that has ``Retry-After``
  (whatever the method and status, so every 429 from ARM), GET/PUT/DELETE on
  408/429/500/502/503/504, POST/PATCH only on 500/503/504; a dropped connection is retried
  for GET/PUT/DELETE, not for POST/PATCH. It sleeps ``Retry-After`` when there is one, else
  an exponential backoff (0 s before the first retry, then 1.6 s and 3.2 s with the default
  ``retry_backoff_factor=0.8``). Pass ``retry_total=0`` to the client to see every error.
- 404 raises ``azure.core.exceptions.ResourceNotFoundError``, 409
  ``ResourceExistsError``, 401 ``ClientAuthenticationError``, anything else
  ``HttpResponseError``; all carry ``.status_code`` and ``.error.code`` /
  ``.error.message`` parsed from the ARM error body.

Guesses (not checked against Azure): the exact wording of messages other than the
ResourceGroupNotFound/ResourceNotFound/AuthorizationFailed ones; the 400 answered for VMSS VM
and VMSS NIC lists of a Flexible set; the 400 for unknown instance ids in delete_instances
(which, for Flexible sets, takes VM names); how capacity errors show (allocation errors: the
update's operation ends Failed and the new VMs stay, Failed, counted in the capacity; quota:
409 on the PATCH); a Delete-policy eviction removing the VM at once; NIC names of Flexible
members (``{vm}-nic0``); the page size (``fake.page_size``, 100); which VMs Spot Priority
Mix makes Regular (the base first, then the percentage, rounded down), and an absent
percentage counting as 0; quotas counted per location across the fake's sets; the wording of
the 400 for ``$expand`` without ``$filter``; when a set answers a state conflict; a restored
spot VM appearing at once under a new name.
"""

from __future__ import annotations

import enum
import json
import random
import re
import traceback
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any
from urllib.parse import parse_qs, quote, unquote, urlencode, urlsplit

from azure.mgmt.compute import models as cm
from azure.mgmt.compute._utils.model_base import SdkJSONEncoder
from azure.mgmt.network import models as nm

from tests.fakes import server as fake_server

SUBSCRIPTION = "00000000-0000-0000-0000-000000000000"
PAGE_SIZE = 100  # the fake's choice; ARM's page sizes are per resource provider
_VMSS_VMS_READ = "Microsoft.Compute/virtualMachineScaleSets/virtualMachines/read"
# The RBAC action ARM checks for each API (``fake.deny(action)`` makes its calls 403).
PERMISSIONS = {
    "virtualMachineScaleSets.get": "Microsoft.Compute/virtualMachineScaleSets/read",
    "virtualMachineScaleSets.update": "Microsoft.Compute/virtualMachineScaleSets/write",
    "virtualMachineScaleSets.deleteInstances": (
        "Microsoft.Compute/virtualMachineScaleSets/delete/action"
    ),
    "virtualMachineScaleSetVMs.list": _VMSS_VMS_READ,
    "virtualMachineScaleSetVMs.get": _VMSS_VMS_READ,
    "virtualMachines.list": "Microsoft.Compute/virtualMachines/read",
    "virtualMachines.get": "Microsoft.Compute/virtualMachines/read",
    "virtualMachines.delete": "Microsoft.Compute/virtualMachines/delete",
    "networkInterfaces.listVirtualMachineScaleSetNetworkInterfaces": (
        "Microsoft.Compute/virtualMachineScaleSets/networkInterfaces/read"
    ),
    "networkInterfaces.list": "Microsoft.Network/networkInterfaces/read",
    "networkInterfaces.get": "Microsoft.Network/networkInterfaces/read",
    "resourceSkus.list": "Microsoft.Compute/skus/read",
    "operations.get": "Microsoft.Compute/locations/operations/read",
}
# Capacity errors: code -> (when it is raised by default, message template).
CAPACITY_ERRORS = {
    "SkuNotAvailable": (
        "operation",
        "The requested VM size for resource 'Following SKUs have failed for Capacity "
        "Restrictions: {size}' is currently not available in location '{location}'. Please try "
        "another size or deploy to a different location or different zone. See "
        "https://aka.ms/azureskunotavailable for details.",
    ),
    "AllocationFailed": (
        "operation",
        "Allocation failed. We do not have sufficient capacity for the requested VM size in "
        "this region. Read more about improving likelihood of allocation success at "
        "http://aka.ms/allocation-guidance",
    ),
    "ZonalAllocationFailed": (
        "operation",
        "Allocation failed. We do not have sufficient capacity for the requested VM size in "
        "this zone. Read more about improving likelihood of allocation success at "
        "http://aka.ms/allocation-guidance",
    ),
    "OverconstrainedAllocationRequest": (
        "operation",
        "Allocation failed. VM(s) with the following constraints cannot be allocated, because "
        "the condition is too restrictive. Please remove some constraints and try again.",
    ),
    # "Error messages for Azure Spot Virtual Machines and scale sets"
    # (learn.microsoft.com/azure/virtual-machines/error-codes-spot).
    "SpotPriceGreaterThanProvidedMaxPrice": (
        "operation",
        "Unable to perform operation 'Create VM' since the provided max price '{max_price} USD' "
        "is lower than the current spot price '{spot_price} USD' for Azure Spot Virtual Machine "
        "size '{size}'.",
    ),
    "OperationNotAllowed": (
        "request",
        "Operation could not be completed as it results in exceeding approved {quota} quota. "
        "Additional details - Deployment Model: Resource Manager, Location: {location}, Current "
        "Limit: {limit}, Current Usage: {usage}, Additional Required: {cores}, (Minimum) New "
        "Limit Required: {needed}. Submit a request for Quota increase at "
        "https://aka.ms/ProdportalCRP/#blade/Microsoft_Azure_Capacity/UsageAndQuota.ReactView",
    ),
}

_HEALTH = ("healthy", "unhealthy", "unknown")
_PROVISIONING_DISPLAY = {
    "succeeded": "Provisioning succeeded",
    "creating": "Creating",
    "updating": "Updating",
    "deleting": "Deleting",
    "failed": "Provisioning failed",
}


class _Keep(enum.Enum):
    KEEP = 0


KEEP = _Keep.KEEP  # "leave as it is" for set_member's optional fields


def _wire(model: Any) -> dict[str, Any]:
    """``model`` as the REST API spells it (read-only fields included)."""
    return json.loads(json.dumps(model, cls=SdkJSONEncoder, exclude_readonly=False))


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _iso(when: datetime) -> str:
    return when.isoformat().replace("+00:00", "Z")


class ArmError(Exception):
    """An error answered with ARM's ``{"error": {"code", "message"}}`` body."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        target: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.target = target
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        """The JSON document ARM answers."""
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.target:
            error["target"] = self.target
        return {"error": error}


def resource_group_not_found(rg: str) -> ArmError:
    """404 ``ResourceGroupNotFound`` as ARM words it."""
    return ArmError(404, "ResourceGroupNotFound", f"Resource group '{rg}' could not be found.")


def resource_not_found(resource_type: str, name: str, rg: str) -> ArmError:
    """404 ``ResourceNotFound`` as ARM words it (``resource_type``: ``Microsoft.X/ys``)."""
    return ArmError(
        404,
        "ResourceNotFound",
        f"The Resource '{resource_type}/{name}' under resource group '{rg}' was not found. "
        "For more details please go to https://aka.ms/ARMResourceNotFoundFix",
    )


def invalid_parameter(message: str, target: str | None = None) -> ArmError:
    """400 ``InvalidParameter``."""
    return ArmError(400, "InvalidParameter", message, target=target)


# ----------------------------------------------------------------------------- state


@dataclass
class Member:
    """One VM of a scale set (its NIC comes with it)."""

    name: str
    id: str  # the VM's resource id
    nic_id: str  # its NIC's resource id
    nic_name: str
    instance_id: str | None  # Uniform: "0", "1", ...; Flexible: None
    private_ip: str
    vm_id: str  # properties.vmId, a GUID
    computer_name: str
    provisioning_state: str = "Succeeded"
    power_state: str | None = "running"  # None: no power state yet (being created)
    health: str | None = None  # None, or "healthy" / "unhealthy" / "unknown"
    error_code: str | None = None  # why provisioning failed
    # When provisioning failed: the failed status's ``time`` (InstanceViewStatus.time,
    # optional in the REST reference; None leaves it out).
    failed_at: datetime | None = None
    starting: bool = False  # being started from deallocated (see FakeScaleSet.start)
    priority: str | None = None  # Flexible sets with Spot Priority Mix: Spot or Regular
    zone: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    mac_address: str = ""
    time_created: datetime = field(default_factory=_now)
    seq: int = 0  # creation order, for "newest first"

    @property
    def key(self) -> str:
        """The instance id (Uniform) or the VM name (Flexible)."""
        return self.instance_id if self.instance_id is not None else self.name

    @property
    def has_instance_view(self) -> bool:
        """A VM being created has no instance view until it has a power state (it has no
        statuses to report; ``fake.creating_instance_view`` gives it one with only
        ProvisioningState/creating)."""
        return self.provisioning_state != "Creating" or self.power_state is not None

    @property
    def has_nic(self) -> bool:
        """Its network interface is made while the VM is created: none before."""
        return self.provisioning_state != "Creating"

    def to_dict(self) -> dict[str, Any]:
        """A plain description."""
        data = asdict(self)
        data["time_created"] = _iso(self.time_created)
        return data


@dataclass
class Operation:
    """A long-running operation; its status URL answers InProgress, then Succeeded/Failed."""

    id: str
    api: str
    scale_set: FakeScaleSet | None
    api_version: str
    in_progress_polls: int
    polls: int = 0
    done: bool = False
    error: tuple[str, str] | None = None  # (code, message) when it ends Failed
    start_time: datetime = field(default_factory=_now)
    end_time: datetime | None = None

    def finish(self) -> None:
        """Mark it done."""
        if not self.done:
            self.done = True
            self.end_time = _now()

    @property
    def status(self) -> str:
        """``InProgress``, ``Succeeded`` or ``Failed``."""
        if not self.done:
            return "InProgress"
        return "Failed" if self.error else "Succeeded"

    def body(self) -> dict[str, Any]:
        """The Azure-AsyncOperation status document."""
        body: dict[str, Any] = {
            "startTime": _iso(self.start_time),
            "status": self.status,
            "name": self.id,
        }
        if self.end_time is not None:
            body["endTime"] = _iso(self.end_time)
        if self.done and self.error:
            body["error"] = {"code": self.error[0], "message": self.error[1]}
        return body


class FakeScaleSet:
    """A VM scale set. Its setters are for tests; all of them are thread safe."""

    def __init__(
        self,
        fake: FakeArm,
        name: str,
        *,
        resource_group: str,
        mode: str,
        vm_size: str,
        priority: str,
        eviction_policy: str,
        max_price: float,
        tags: dict[str, str],
        vm_tags: dict[str, str],
        zones: list[str],
        location: str,
        nic_config: str,
        priority_mix: tuple[int | None, int | None] | None = None,
        spot_restore: bool = False,
    ) -> None:
        if mode not in ("Uniform", "Flexible"):
            raise ValueError(f"mode must be Uniform or Flexible, not {mode!r}")
        if priority not in ("Spot", "Regular", "Low"):
            raise ValueError(f"unknown priority {priority!r}")
        if eviction_policy not in ("Delete", "Deallocate"):
            raise ValueError(f"unknown eviction policy {eviction_policy!r}")
        if priority_mix is not None and (mode != "Flexible" or priority != "Spot"):
            # "Spot Priority Mix is available only for Flexible orchestration" with Spot
            # priority (learn.microsoft.com/azure/virtual-machine-scale-sets/spot-priority-mix).
            raise ValueError("a priority mix needs a Flexible set of Spot priority")
        self._fake = fake
        self.name = name
        self.resource_group = resource_group
        self.mode = mode
        self.vm_size = vm_size
        self.priority = priority
        self.eviction_policy = eviction_policy
        self.max_price = max_price
        self.tags = tags
        self.vm_tags = vm_tags
        self.zones = zones
        self.location = location
        self.nic_config = nic_config
        # Spot Priority Mix: (baseRegularPriorityCount, regularPriorityPercentageAboveBase),
        # either None to leave it out of the answer (both are optional).
        self.priority_mix = priority_mix
        # spotRestorePolicy.enabled: "evicted VMSS SPOT instances will be tried to be
        # restored opportunistically based on capacity availability" (SpotRestorePolicy in
        # the Compute REST spec); see evict.
        self.spot_restore = spot_restore
        self.capacity = 0
        self.members: list[Member] = []
        self.auto_advance = True
        self.unique_id = str(uuid.UUID(int=fake._rng.getrandbits(128)))
        self.time_created = _now()
        self.capacity_error_code: str | None = None
        self.capacity_error_when = "operation"
        self.failed_power_state: str | None = None  # a failed creation's power state
        self._conflicts = 0  # capacity updates still to refuse (state_conflict)
        self._next_instance_id = 0

    # ------------------------------------------------------------------ addresses

    @property
    def uniform(self) -> bool:
        """Whether the orchestration mode is Uniform."""
        return self.mode == "Uniform"

    @property
    def id(self) -> str:
        """``/subscriptions/S/resourceGroups/RG/providers/Microsoft.Compute/...``."""
        return (
            f"/subscriptions/{self._fake.subscription}/resourceGroups/{self.resource_group}"
            f"/providers/Microsoft.Compute/virtualMachineScaleSets/{self.name}"
        )

    @property
    def provisioning_state(self) -> str:
        """``Updating`` while an operation on the set is in flight, else ``Succeeded``."""
        with self._fake._lock:
            pending = any(
                op.scale_set is self and not op.done for op in self._fake._operations.values()
            )
            return "Updating" if pending else "Succeeded"

    def _ref(self, resource_id: str) -> str:
        """A reference to ``resource_id`` as other resources spell it (see reference_rg_upper)."""
        if not self._fake.reference_rg_upper:
            return resource_id
        prefix = f"/resourceGroups/{self.resource_group}/"
        return resource_id.replace(prefix, f"/resourceGroups/{self.resource_group.upper()}/", 1)

    # ------------------------------------------------------------------ test setters

    def member(self, key: str) -> Member:
        """The member with instance id or name ``key`` (KeyError if none)."""
        with self._fake._lock:
            for m in self.members:
                if key in (m.instance_id, m.name):
                    return m
        raise KeyError(key)

    def keys(self) -> list[str]:
        """The members' keys (instance ids or VM names), oldest first."""
        with self._fake._lock:
            return [m.key for m in self.members]

    def add_member(
        self,
        name: str | None = None,
        *,
        provisioning_state: str = "Succeeded",
        power_state: str | None = "running",
        health: str | None = None,
        zone: str | None = None,
        tags: dict[str, str] | None = None,
        grow_capacity: bool = True,
        priority: str | None = None,
    ) -> Member:
        """Add a member (a running VM unless told otherwise); grows the capacity to match.

        ``name`` only for Flexible sets (default ``{vmss}_{8 hex}``). ``priority``: the
        VM's own (Spot or Regular), by default what the set's priority mix gives it.
        """
        with self._fake._lock:
            fake = self._fake
            if self.uniform:
                if name is not None:
                    raise ValueError("Uniform members are named {vmss}_{instanceId}")
                iid: str | None = str(self._next_instance_id)
                self._next_instance_id += 1
                name = f"{self.name}_{iid}"
                resource_id = f"{self.id}/virtualMachines/{iid}"
                nic_name = self.nic_config
                nic_id = f"{resource_id}/networkInterfaces/{nic_name}"
                computer_name = f"{self.name[:9]}{_base36(int(iid), 6)}"
            else:
                iid = None
                name = name or fake._new_name(self.name)
                fake._names.add(name.lower())
                rg_path = f"/subscriptions/{fake.subscription}/resourceGroups/{self.resource_group}"
                resource_id = f"{rg_path}/providers/Microsoft.Compute/virtualMachines/{name}"
                nic_name = f"{name}-{self.nic_config}"
                nic_id = f"{rg_path}/providers/Microsoft.Network/networkInterfaces/{nic_name}"
                computer_name = self.name[:9] + "".join(
                    fake._rng.choice("0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(6)
                )
            member = Member(
                name=name,
                id=resource_id,
                nic_id=nic_id,
                nic_name=nic_name,
                instance_id=iid,
                private_ip=fake._new_ip(),
                vm_id=str(uuid.UUID(int=fake._rng.getrandbits(128))),
                computer_name=computer_name,
                provisioning_state=provisioning_state,
                power_state=_power(power_state),
                health=_health(health),
                zone=zone or self._next_zone(),
                tags=dict(self.vm_tags if tags is None else tags),
                priority=priority or self._mix_priority(),
                mac_address="00-0D-3A-"
                + "-".join(f"{fake._rng.randrange(256):02X}" for _ in "xyz"),
                seq=fake._new_seq(),
            )
            self.members.append(member)
            if grow_capacity:
                self.capacity += 1
            return member

    def set_member(
        self,
        key: str,
        *,
        provisioning_state: str | None = None,
        power_state: str | _Keep | None = KEEP,
        health: str | _Keep | None = KEEP,
        error_code: str | _Keep | None = KEEP,
        failed_at: datetime | _Keep | None = KEEP,
    ) -> Member:
        """Overwrite a member's state. ``power_state``/``health`` accept ``running`` or
        ``PowerState/running`` (``healthy`` or ``HealthState/healthy``); None removes them.
        ``failed_at``: the time of a failed VM's status (None: no time)."""
        with self._fake._lock:
            member = self.member(key)
            if provisioning_state is not None:
                member.provisioning_state = provisioning_state
            if power_state is not KEEP:
                member.power_state = _power(power_state)
            if health is not KEEP:
                member.health = _health(health)
            if error_code is not KEEP:
                member.error_code = error_code
            if failed_at is not KEEP:
                member.failed_at = failed_at
            return member

    def evict(self, key: str) -> Member:
        """Spot eviction, as Azure does it for the set's eviction policy.

        ``Deallocate``: the VM stays, ``PowerState/deallocated`` (capacity unchanged).
        ``Delete``: the VM (and its NIC) is gone at once and the capacity drops by one;
        with ``spot_restore`` the capacity stays and a VM is created in its place (guessed:
        at once, with a new name).
        """
        with self._fake._lock:
            member = self.member(key)
            if self.eviction_policy == "Deallocate":
                member.provisioning_state = "Succeeded"
                member.power_state = "deallocated"
            elif self.spot_restore:
                self.members.remove(member)
                self.add_member(
                    provisioning_state="Creating", power_state=None, grow_capacity=False
                )
            else:
                self.members.remove(member)
                self.capacity = max(0, self.capacity - 1)
            return member

    def start(self, key: str) -> Member:
        """Its owner starts a deallocated VM: ``Updating``, with the brief
        ``PowerState/stopped`` "while starting a VM from Deallocated state" ("States and
        billing status of Azure Virtual Machines", learn.microsoft.com/azure/
        virtual-machines/states-billing); running on the next advance."""
        with self._fake._lock:
            member = self.member(key)
            member.provisioning_state = "Updating"
            member.power_state = "stopped"
            member.starting = True
            return member

    def state_conflict(self, times: int = 1) -> None:
        """The next ``times`` capacity updates answer 409 ``OperationNotAllowed`` for a
        state conflict, as Compute words it: "Operation '{0}' is not allowed on VM '{1}'
        since the VM is marked for deletion. You can only retry the Delete operation (or
        wait for an ongoing one to complete)." ("Azure Virtual Machine Error Messages",
        MicrosoftDocs/azure-docs). Guessed: when the set answers it for a VM of its own."""
        with self._fake._lock:
            self._conflicts = times

    def remove_member(self, key: str, *, shrink_capacity: bool = True) -> None:
        """The member vanishes at once; the capacity drops by one."""
        with self._fake._lock:
            self.members.remove(self.member(key))
            if shrink_capacity:
                self.capacity = max(0, self.capacity - 1)

    def capacity_error(
        self,
        code: str = "SkuNotAvailable",
        *,
        when: str | None = None,
        power_state: str | None = None,
    ) -> None:
        """While set, growing the set fails with ARM error ``code``.

        ``when="operation"`` (default for allocation errors such as SkuNotAvailable,
        AllocationFailed): the update is accepted, the new members are Creating and then go
        ``Failed`` (``ProvisioningState/failed/{code}``) on the next advance, and the update's
        operation ends ``Failed`` with ``code``. ``when="request"`` (default for the quota error
        ``OperationNotAllowed``): the PATCH itself answers 409 and nothing changes.

        ``power_state``: what the failed VMs' instance view says besides (None: no power
        state). ProvisioningState is "the most recent provisioning state" and the power state
        a separate one ("States and billing status of Azure Virtual Machines"); a VM whose
        creation failed may show one that is not running (kubernetes/autoscaler#5767).
        """
        default_when = CAPACITY_ERRORS.get(code, ("operation", ""))[0]
        when = when or default_when
        if when not in ("operation", "request"):
            raise ValueError(f"when must be operation or request, not {when!r}")
        with self._fake._lock:
            self.capacity_error_code = code
            self.capacity_error_when = when
            self.failed_power_state = _power(power_state)

    def clear_capacity_error(self) -> None:
        """Capacity is back."""
        with self._fake._lock:
            self.capacity_error_code = None

    def advance(self, steps: int = 1) -> None:
        """Move every in-flight member ``steps`` stages on, and finish pending operations.

        Creating -> Creating + PowerState/stopped (``fake.stopped_while_creating``) ->
        Succeeded + PowerState/starting (or Failed under capacity_error) -> PowerState/running;
        Updating -> Succeeded (running, after start); Deleting -> gone; PowerState/stopping ->
        stopped; deallocating -> deallocated.
        """
        with self._fake._lock:
            for _ in range(steps):
                for member in list(self.members):
                    self._advance(member)
                for op in self._fake._operations.values():
                    if op.scale_set is self:
                        op.finish()

    def is_stable(self) -> bool:
        """As many members as the capacity, all Succeeded and running."""
        with self._fake._lock:
            return len(self.members) == self.capacity and all(
                m.provisioning_state == "Succeeded" and m.power_state == "running"
                for m in self.members
            )

    def to_dict(self) -> dict[str, Any]:
        """A plain description with members."""
        with self._fake._lock:
            return {
                "name": self.name,
                "resource_group": self.resource_group,
                "mode": self.mode,
                "capacity": self.capacity,
                "vm_size": self.vm_size,
                "priority": self.priority,
                "eviction_policy": self.eviction_policy,
                "members": [m.to_dict() for m in self.members],
            }

    # ------------------------------------------------------------------ behaviour

    def _next_zone(self) -> str | None:
        if not self.zones:
            return None
        counts = {z: 0 for z in self.zones}
        for m in self.members:
            if m.zone in counts and m.provisioning_state != "Deleting":
                counts[m.zone] += 1
        return min(self.zones, key=lambda z: counts[z])

    def _advance(self, m: Member) -> None:
        state = m.provisioning_state
        if state == "Creating":
            if self.capacity_error_code and self.capacity_error_when == "operation":
                m.provisioning_state = "Failed"
                m.error_code = self.capacity_error_code
                m.power_state = self.failed_power_state
                m.failed_at = _now()
            elif m.power_state is None and self._fake.stopped_while_creating:
                m.power_state = "stopped"
            else:
                m.provisioning_state = "Succeeded"
                m.power_state = "starting"
        elif state == "Deleting":
            self.members.remove(m)
        elif state == "Updating":
            m.provisioning_state = "Succeeded"
            if m.starting:
                m.power_state, m.starting = "running", False
        elif state == "Succeeded" and m.power_state in ("starting", "stopping", "deallocating"):
            m.power_state = {"starting": "running", "stopping": "stopped"}.get(
                m.power_state, "deallocated"
            )

    def _active(self) -> list[Member]:
        return [m for m in self.members if m.provisioning_state != "Deleting"]

    def _mix_priority(self) -> str | None:
        """A new VM's priority under Spot Priority Mix (None: no mix, the set's).

        The base count of VMs is Regular, then the percentage above base (an absent
        one counts as 0: a guess, the reference gives no default)."""
        if self.priority_mix is None:
            return None
        base = self.priority_mix[0] or 0
        percent = self.priority_mix[1] or 0
        active = self._active()
        regular = sum(m.priority == "Regular" for m in active)
        if regular < base:
            return "Regular"
        above, regular_above = len(active) - base, regular - base
        return "Regular" if regular_above < percent * (above + 1) // 100 else "Spot"

    @property
    def quota_name(self) -> str:
        """The vCPU quota the set's VMs count against: ``LowPriorityCores`` for spot
        ("Spot vCPU quota"), else the VM size's family (``standardNCASv3_T4Family``)."""
        if self.priority in ("Spot", "Low"):
            return "LowPriorityCores"
        return str((self._fake.sku(self.vm_size) or {}).get("family") or "Total Regional")

    @property
    def vcpus(self) -> int:
        """vCPUs of one VM of the set."""
        return int((self._fake.sku(self.vm_size) or {}).get("vcpus") or 4)

    def _check_quota(self, adding: int) -> None:
        """409 OperationNotAllowed when ``adding`` VMs would exceed the set's quota."""
        limit = self._fake.quotas.get(self.quota_name)
        if limit is None or adding <= 0:
            return
        usage = sum(
            len(s._active()) * s.vcpus
            for s in self._fake.scale_sets.values()
            if s.quota_name == self.quota_name and s.location == self.location
        )
        cores = adding * self.vcpus
        if usage + cores > limit:
            template = CAPACITY_ERRORS["OperationNotAllowed"][1]
            message = template.format(
                quota=self.quota_name,
                location=self.location,
                limit=limit,
                usage=usage,
                cores=cores,
                needed=usage + cores,
            )
            raise ArmError(409, "OperationNotAllowed", message)

    def _resize(self, capacity: int) -> None:
        active = self._active()
        growing = capacity > len(active)
        if growing and self.capacity_error_code and self.capacity_error_when == "request":
            raise ArmError(409, self.capacity_error_code, self._capacity_message())
        if growing:
            self._check_quota(capacity - len(active))
        self.capacity = capacity
        if capacity > len(active):
            for _ in range(capacity - len(active)):
                self.add_member(
                    provisioning_state="Creating", power_state=None, grow_capacity=False
                )
        elif capacity < len(active):
            # The Default scale-in policy: highest instance ids (newest) first.
            for m in sorted(active, key=lambda m: m.seq, reverse=True)[: len(active) - capacity]:
                m.provisioning_state = "Deleting"

    def _capacity_message(self) -> str:
        code = self.capacity_error_code or ""
        template = CAPACITY_ERRORS.get(code, ("", code))[1]
        sku = self._fake.sku(self.vm_size)
        cores = sku["vcpus"] if sku else 4
        return template.format(
            size=self.vm_size,
            location=self.location,
            quota=self.quota_name,
            cores=cores,
            limit=0,
            usage=0,
            needed=cores,
            max_price=self.max_price,
            spot_price=round(self.max_price * 1.5, 4),
        )

    # ------------------------------------------------------------------ REST shapes

    def record(self) -> dict[str, Any]:
        """The scale set as ``virtualMachineScaleSets.get`` returns it."""
        flexible = not self.uniform
        ip_config = cm.VirtualMachineScaleSetIPConfiguration(
            name="ipconfig1",
            properties=cm.VirtualMachineScaleSetIPConfigurationProperties(
                subnet=cm.ApiEntityReference(id=self._fake.subnet_id(self.resource_group)),
                primary=True,
                private_ip_address_version="IPv4",
            ),
        )
        profile = cm.VirtualMachineScaleSetVMProfile(
            os_profile=cm.VirtualMachineScaleSetOSProfile(
                computer_name_prefix=self.name[:9], admin_username="azureuser"
            ),
            network_profile=cm.VirtualMachineScaleSetNetworkProfile(
                network_interface_configurations=[
                    cm.VirtualMachineScaleSetNetworkConfiguration(
                        name=self.nic_config,
                        properties=cm.VirtualMachineScaleSetNetworkConfigurationProperties(
                            primary=True,
                            enable_accelerated_networking=True,
                            ip_configurations=[ip_config],
                            delete_option="Delete" if flexible else None,
                        ),
                    )
                ],
                network_api_version="2020-11-01" if flexible else None,
            ),
            priority=self.priority,
        )
        if self.priority in ("Spot", "Low"):
            profile.eviction_policy = self.eviction_policy
            profile.billing_profile = cm.BillingProfile(max_price=self.max_price)
        restore = cm.SpotRestorePolicy(enabled=True, restore_timeout="PT1H")
        props = cm.VirtualMachineScaleSetProperties(
            orchestration_mode=self.mode,
            virtual_machine_profile=profile,
            provisioning_state=self.provisioning_state,
            unique_id=self.unique_id,
            priority_mix_policy=self._mix_policy(),
            time_created=self.time_created,
            single_placement_group=False,
            platform_fault_domain_count=1,
            scale_in_policy=cm.ScaleInPolicy(rules=["Default"]),
            spot_restore_policy=restore if self.spot_restore else None,
        )
        if self.uniform:
            props.upgrade_policy = cm.UpgradePolicy(mode="Manual")
            props.overprovision = False
        vmss = cm.VirtualMachineScaleSet(
            id=self.id,
            name=self.name,
            type="Microsoft.Compute/virtualMachineScaleSets",
            location=self.location,
            tags=dict(self.tags) or None,
            sku=cm.Sku(name=self.vm_size, tier="Standard", capacity=self.capacity),
            properties=props,
        )
        if self.zones:
            vmss.zones = list(self.zones)
        return _wire(vmss)

    def _mix_policy(self) -> Any:
        if self.priority_mix is None:
            return None
        base, percent = self.priority_mix
        policy = cm.PriorityMixPolicy()
        if base is not None:
            policy.base_regular_priority_count = base
        if percent is not None:
            policy.regular_priority_percentage_above_base = percent
        return policy

    def _statuses(self, m: Member) -> list[Any]:
        state = m.provisioning_state
        if state == "Failed" and m.error_code:
            code = m.error_code
            provisioning = cm.InstanceViewStatus(
                code=f"ProvisioningState/failed/{code}",
                level="Error",
                display_status="Provisioning failed",
                message=self._capacity_message()
                if code == self.capacity_error_code
                else f"The operation failed with {code}.",
                time=m.failed_at,
            )
        else:
            provisioning = cm.InstanceViewStatus(
                code=f"ProvisioningState/{state.lower()}",
                level="Info",
                display_status=_PROVISIONING_DISPLAY.get(state.lower(), state),
            )
            if state == "Succeeded":
                provisioning.time = m.time_created
        statuses = [provisioning]
        if m.power_state:
            statuses.append(
                cm.InstanceViewStatus(
                    code=f"PowerState/{m.power_state}",
                    level="Info",
                    display_status=f"VM {m.power_state}",
                )
            )
        return statuses

    def _has_instance_view(self, m: Member) -> bool:
        return m.has_instance_view or self._fake.creating_instance_view

    def _health(self, m: Member) -> Any:
        if m.health is None:
            return None
        return cm.VirtualMachineHealthStatus(
            status=cm.InstanceViewStatus(
                code=f"HealthState/{m.health}",
                level="Info",
                display_status=f"The VM reported {m.health} health",
            )
        )

    def _nic_ref(self, m: Member) -> Any:
        return cm.NetworkProfile(
            network_interfaces=[
                cm.NetworkInterfaceReference(
                    id=self._ref(m.nic_id),
                    properties=cm.NetworkInterfaceReferenceProperties(
                        primary=True, delete_option=None if self.uniform else "Delete"
                    ),
                )
            ]
        )

    def vm(self, m: Member, *, instance_view: bool = False) -> dict[str, Any]:
        """The member as its VM list returns it (Uniform or Flexible shape)."""
        zones = [m.zone] if m.zone else None
        os_profile = cm.OSProfile(computer_name=m.computer_name, admin_username="azureuser")
        if self.uniform:
            props = cm.VirtualMachineScaleSetVMProperties(
                latest_model_applied=True,
                vm_id=m.vm_id,
                provisioning_state=m.provisioning_state,
                time_created=m.time_created,
                os_profile=os_profile,
                network_profile=self._nic_ref(m),
            )
            if instance_view and self._has_instance_view(m):
                props.instance_view = cm.VirtualMachineScaleSetVMInstanceView(
                    computer_name=m.computer_name,
                    os_name="ubuntu",
                    platform_fault_domain=0,
                    statuses=self._statuses(m),
                    vm_health=self._health(m),
                )
            return _wire(
                cm.VirtualMachineScaleSetVM(
                    id=m.id,
                    name=m.name,
                    type="Microsoft.Compute/virtualMachineScaleSets/virtualMachines",
                    location=self.location,
                    tags=dict(m.tags) or None,
                    instance_id=m.instance_id,
                    sku=cm.Sku(name=self.vm_size, tier="Standard"),
                    zones=zones,
                    properties=props,
                )
            )
        vprops = cm.VirtualMachineProperties(
            virtual_machine_scale_set=cm.SubResource(id=self._ref(self.id)),
            hardware_profile=cm.HardwareProfile(vm_size=self.vm_size),
            provisioning_state=m.provisioning_state,
            vm_id=m.vm_id,
            time_created=m.time_created,
            os_profile=os_profile,
            network_profile=self._nic_ref(m),
            priority=m.priority or self.priority,
        )
        if vprops.priority in ("Spot", "Low"):
            vprops.eviction_policy = self.eviction_policy
            vprops.billing_profile = cm.BillingProfile(max_price=self.max_price)
        if instance_view and self._has_instance_view(m):
            vprops.instance_view = cm.VirtualMachineInstanceView(
                computer_name=m.computer_name,
                os_name="ubuntu",
                statuses=self._statuses(m),
                vm_health=self._health(m),
            )
        return _wire(
            cm.VirtualMachine(
                id=m.id,
                name=m.name,
                type="Microsoft.Compute/virtualMachines",
                location=self.location,
                tags=dict(m.tags) or None,
                zones=zones,
                properties=vprops,
            )
        )

    def nic(self, m: Member) -> dict[str, Any]:
        """The member's NIC as the network list calls return it."""
        nic = nm.NetworkInterface(
            id=m.nic_id,
            name=m.nic_name,
            type="Microsoft.Network/networkInterfaces",
            location=self.location,
            properties=nm.NetworkInterfacePropertiesFormat(
                provisioning_state="Succeeded",
                virtual_machine=nm.SubResource(id=self._ref(m.id)),
                primary=True,
                mac_address=m.mac_address,
                enable_accelerated_networking=True,
                enable_ip_forwarding=False,
                nic_type="Standard",
                ip_configurations=[
                    nm.NetworkInterfaceIPConfiguration(
                        id=f"{m.nic_id}/ipConfigurations/ipconfig1",
                        name="ipconfig1",
                        type="Microsoft.Network/networkInterfaces/ipConfigurations",
                        properties=nm.NetworkInterfaceIPConfigurationPropertiesFormat(
                            private_ip_address=m.private_ip,
                            private_ip_allocation_method="Dynamic",
                            private_ip_address_version="IPv4",
                            primary=True,
                            provisioning_state="Succeeded",
                            subnet=nm.Subnet(id=self._fake.subnet_id(self.resource_group)),
                        ),
                    )
                ],
            ),
        )
        if not self.uniform and m.tags:
            nic.tags = dict(m.tags)
        return _wire(nic)


def _power(value: str | None) -> str | None:
    if value is None:
        return None
    return value.split("/", 1)[1] if value.startswith("PowerState/") else value


def _health(value: str | None) -> str | None:
    if value is None:
        return None
    value = value.split("/", 1)[1] if value.startswith("HealthState/") else value
    if value not in _HEALTH:
        raise ValueError(f"health must be one of {_HEALTH}, not {value!r}")
    return value


def _base36(n: int, width: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while n:
        n, r = divmod(n, 36)
        out = digits[r] + out
    return out.rjust(width, "0")


# ----------------------------------------------------------------------------- log/faults


@dataclass
class RecordedRequest:
    """One request the fake received."""

    method: str
    path: str
    query: dict[str, str]  # decoded; keys as sent ("api-version", "$expand", "$skiptoken")
    body: Any
    api: str | None  # e.g. "virtualMachineScaleSets.update"; None: no such route
    api_version: str | None
    client_request_id: str | None = None
    status: int | None = None  # None: no answer (a dropped connection)
    fault: str | None = None  # the injected fault's kind, if one hit this request

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)


@dataclass
class Fault(fake_server.Fault):
    """An injected fault: ``error`` (an ARM error), ``drop`` or ``hang``; ``match`` is an
    API name (e.g. "virtualMachineScaleSets.get") or a path substring."""

    retry_after: float | None = None  # an error's Retry-After (a 429 always has one)


_FAULT_BODIES = {
    400: ("BadRequest", "The request is invalid (injected)."),
    401: (
        "AuthenticationFailed",
        "Authentication failed. The 'Authorization' header is missing.",
    ),
    403: ("AuthorizationFailed", "The client does not have authorization (injected)."),
    404: ("NotFound", "The resource was not found (injected)."),
    409: ("Conflict", "The request conflicts with the resource's state (injected)."),
    429: (
        "TooManyRequests",
        "The request is being throttled as the limit has been reached for operation type - "
        "Read_30Min. For more information, see - https://aka.ms/throttling",
    ),
    500: (
        "InternalServerError",
        "An internal server error occurred. Please retry later. If the problem persists, "
        "contact support.",
    ),
    502: ("BadGateway", "The gateway did not receive a response from the service (injected)."),
    503: ("ServiceUnavailable", "The service is temporarily unavailable (injected)."),
    504: ("GatewayTimeout", "The gateway did not receive a response in time (injected)."),
}


def fault_error(status: int, retry_after: float | None = None) -> ArmError:
    """The error an injected fault with ``status`` answers.

    A 429 always carries ``Retry-After`` (1 s unless ``retry_after`` says otherwise).
    """
    code, message = _FAULT_BODIES.get(status, ("InternalServerError", f"Injected {status}."))
    if status == 429 and retry_after is None:
        retry_after = 1
    headers = {"Retry-After": _seconds(retry_after)} if retry_after is not None else {}
    return ArmError(status, code, message, headers=headers)


def _seconds(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


# ----------------------------------------------------------------------------- routes

_SUB = "/subscriptions/{subscription}"
_RG = _SUB + "/resourceGroups/{rg}"
_VMSS = _RG + "/providers/Microsoft.Compute/virtualMachineScaleSets/{vmss}"
_ROUTES: list[tuple[str, re.Pattern[str], str]] = []


def _add_route(method: str, template: str, api: str) -> None:
    pattern = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", template)
    _ROUTES.append((method, re.compile(f"^{pattern}/?$", re.IGNORECASE), api))


_add_route("GET", _VMSS, "virtualMachineScaleSets.get")
_add_route("PATCH", _VMSS, "virtualMachineScaleSets.update")
_add_route("POST", _VMSS + "/delete", "virtualMachineScaleSets.deleteInstances")
_add_route("GET", _VMSS + "/virtualMachines", "virtualMachineScaleSetVMs.list")
_add_route("GET", _VMSS + "/virtualMachines/{instance}", "virtualMachineScaleSetVMs.get")
_add_route(
    "GET",
    _VMSS + "/networkInterfaces",
    "networkInterfaces.listVirtualMachineScaleSetNetworkInterfaces",
)
_add_route("GET", _RG + "/providers/Microsoft.Compute/virtualMachines", "virtualMachines.list")
_add_route("GET", _RG + "/providers/Microsoft.Compute/virtualMachines/{vm}", "virtualMachines.get")
_add_route(
    "DELETE", _RG + "/providers/Microsoft.Compute/virtualMachines/{vm}", "virtualMachines.delete"
)
_add_route("GET", _RG + "/providers/Microsoft.Network/networkInterfaces", "networkInterfaces.list")
_add_route(
    "GET", _RG + "/providers/Microsoft.Network/networkInterfaces/{nic}", "networkInterfaces.get"
)
_add_route("GET", _SUB + "/providers/Microsoft.Compute/skus", "resourceSkus.list")
_add_route(
    "GET",
    _SUB + "/providers/Microsoft.Compute/locations/{location}/operations/{operation}",
    "operations.get",
)


def _route(method: str, path: str) -> tuple[str, dict[str, str]] | None:
    for m, pattern, api in _ROUTES:
        match = pattern.match(path)
        if match and m == method:
            return api, {k: unquote(v) for k, v in match.groupdict().items()}
    return None


_VM_FILTER_RE = re.compile(
    r"^\s*'?virtualMachineScaleSet/id'?\s+eq\s+'?(?P<id>[^']+?)'?\s*$", re.IGNORECASE
)
_SKU_FILTER_RE = re.compile(r"^\s*location\s+eq\s+'(?P<location>[^']*)'\s*$", re.IGNORECASE)


# ----------------------------------------------------------------------------- HTTP


class _Handler(fake_server.JsonHandler):
    """ARM calls; see :meth:`FakeArm.handle`."""

    def extra_headers(self) -> dict[str, str]:
        return {"x-ms-request-id": str(uuid.uuid4())}

    def serve(self) -> None:
        fake: FakeArm = self.server.owner
        split = urlsplit(self.path)
        path = split.path
        query = {k: v[0] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        body = self.read_body()
        route = _route(self.command, path)
        api = route[0] if route else None
        record = RecordedRequest(
            method=self.command,
            path=path,
            query=query,
            body=body,
            api=api,
            api_version=query.get("api-version"),
            client_request_id=self.headers.get("x-ms-client-request-id"),
        )
        fake._record(record)
        if self.apply_fault(record, fake._take_fault(path, api), _fault_answer):
            return
        headers: dict[str, str] = {}
        try:
            status, answer, headers = fake.handle(self.command, path, query, body, route)
        except ArmError as error:
            status, answer, headers = error.status, error.body(), error.headers
        except Exception:  # a bug in the fake: answer, so the client does not hang
            traceback.print_exc()
            error = ArmError(500, "InternalServerError", "Internal error in the fake (see stderr)")
            status, answer = error.status, error.body()
        record.status = status
        self.send_json(status, answer, headers)


def _fault_answer(fault: fake_server.Fault) -> tuple[int, Any, dict[str, str]]:
    assert isinstance(fault, Fault)
    error = fault_error(fault.status, fault.retry_after)
    return error.status, error.body(), error.headers


# ----------------------------------------------------------------------------- the server

_DEFAULT_SKUS = (
    # name, vCPUs, memory GB, GPUs, family
    ("Standard_NC4as_T4_v3", 4, 28, 1, "standardNCASv3_T4Family"),
    ("Standard_NC8as_T4_v3", 8, 56, 1, "standardNCASv3_T4Family"),
    ("Standard_NC16as_T4_v3", 16, 110, 1, "standardNCASv3_T4Family"),
    ("Standard_NC64as_T4_v3", 64, 440, 4, "standardNCASv3_T4Family"),
    ("Standard_NC24ads_A100_v4", 24, 220, 1, "StandardNCADSA100v4Family"),
    ("Standard_ND96asr_v4", 96, 900, 8, "standardNDASv4_A100Family"),
    ("Standard_D4s_v5", 4, 16, 0, "standardDSv5Family"),
)


class FakeArm(fake_server.FakeServer[RecordedRequest]):
    """The fake ARM API; ``start()`` serves it on 127.0.0.1 on a free port (``url`` is the
    clients' ``base_url``).

    Faults (``fail_next``, ``fail_rate``): a fault's ``match`` is an API name
    (``virtualMachineScaleSets.get``, see PERMISSIONS) or a path substring; an ``error``
    answers an ARM error body and, with ``retry_after=`` (seconds), ``Retry-After`` (a 429
    always has one).
    """

    handler_class = _Handler
    fault_type = Fault
    thread_name = "azure-fake"

    def __init__(
        self, subscription: str = SUBSCRIPTION, location: str = "eastus", *, seed: int | None = 0
    ) -> None:
        super().__init__(seed=seed)
        self.subscription = subscription
        self.location = location
        self.page_size = PAGE_SIZE
        # Status GETs answered InProgress before an operation is done.
        self.lro_in_progress_polls = 1
        # Retry-After (seconds) on operation answers; None: none (the poller then sleeps
        # its polling_interval).
        self.lro_retry_after: float | None = None
        # True: references to other resources (a Flexible VM's virtualMachineScaleSet.id, a
        # NIC's virtualMachine.id, a VM's NIC ids) spell the resource group in upper case,
        # as Azure often does. Compare ARM ids case-insensitively.
        self.reference_rg_upper = False
        # True: a VM being created lists an instance view with only its
        # ProvisioningState/creating status (and no PowerState yet); False: none at all.
        # The REST reference allows both (instanceView and its statuses are optional).
        self.creating_instance_view = False
        # True: a VM being created passes through ProvisioningState/creating with
        # PowerState/stopped: "The Stopped state may also be observed briefly during VM
        # creation" ("States and billing status of Azure Virtual Machines").
        self.stopped_while_creating = True
        # True: the resource group's VM list ignores its $filter and answers every VM of
        # the group (a server-side filter spotring must not rely on alone).
        self.vm_filter_ignored = False
        # vCPU quotas by name (LowPriorityCores, a VM family): a scale-out beyond one
        # answers 409 OperationNotAllowed, as ARM does. None set: no limit.
        self.quotas: dict[str, int] = {}
        self.client_id = "11111111-1111-1111-1111-111111111111"
        self.object_id = "22222222-2222-2222-2222-222222222222"
        self.scale_sets: dict[tuple[str, str], FakeScaleSet] = {}  # (rg lower, name lower)
        self.resource_groups: dict[str, str] = {}  # lower -> as created
        self.skus: list[dict[str, Any]] = []
        self._rng = random.Random(seed)
        self._operations: dict[str, Operation] = {}
        self._pages: dict[str, list[dict[str, Any]]] = {}
        self._names: set[str] = set()
        self._seq = 0
        self._next_ip = 4
        for name, vcpus, memory, gpus, family in _DEFAULT_SKUS:
            self.add_sku(name, vcpus=vcpus, memory_gb=memory, gpus=gpus, family=family)
        self.skus.append(
            {
                "resource_type": "disks",
                "name": "Premium_LRS",
                "tier": "Premium",
                "locations": [location],
                "zones": ["1", "2", "3"],
                "capabilities": {"MaxSizeGiB": "4", "MinSizeGiB": "0"},
                "restricted": False,
            }
        )

    # ------------------------------------------------------------------ setup

    def add_resource_group(self, name: str) -> str:
        """Create an (empty) resource group; returns its name."""
        with self._lock:
            return self.resource_groups.setdefault(name.lower(), name)

    def add_scale_set(
        self,
        name: str,
        *,
        resource_group: str = "rg",
        mode: str = "Flexible",
        capacity: int = 0,
        vm_size: str = "Standard_NC4as_T4_v3",
        priority: str = "Spot",
        eviction_policy: str = "Delete",
        max_price: float = -1,
        tags: dict[str, str] | None = None,
        vm_tags: dict[str, str] | None = None,
        zones: Iterable[str] | None = None,
        location: str | None = None,
        nic_config: str = "nic0",
        priority_mix: tuple[int | None, int | None] | None = None,
        spot_restore: bool = False,
    ) -> FakeScaleSet:
        """A scale set with ``capacity`` members, all Succeeded and ``PowerState/running``.

        ``priority_mix``: Spot Priority Mix (a Flexible Spot set), ``(base regular count,
        regular percentage above base)``, None for a field left out. ``spot_restore``:
        ``spotRestorePolicy`` enabled (see FakeScaleSet.evict)."""
        with self._lock:
            rg = self.add_resource_group(resource_group)
            if (rg.lower(), name.lower()) in self.scale_sets:
                raise ValueError(f"scale set {rg}/{name} exists")
            scale_set = FakeScaleSet(
                self,
                name,
                resource_group=rg,
                mode=mode,
                vm_size=vm_size,
                priority=priority,
                eviction_policy=eviction_policy,
                max_price=max_price,
                tags=dict(tags or {}),
                vm_tags=dict(vm_tags or {}),
                zones=[str(z) for z in zones or ()],
                location=location or self.location,
                nic_config=nic_config,
                priority_mix=priority_mix,
                spot_restore=spot_restore,
            )
            self.scale_sets[(rg.lower(), name.lower())] = scale_set
            for _ in range(capacity):
                scale_set.add_member()
            return scale_set

    def set_quota(self, name: str, cores: int | None) -> None:
        """Limit the vCPUs of quota ``name`` (``LowPriorityCores``, a VM family) in use
        across the sets of a location; None lifts it."""
        with self._lock:
            if cores is None:
                self.quotas.pop(name, None)
            else:
                self.quotas[name] = cores

    def scale_set(self, name: str, resource_group: str = "rg") -> FakeScaleSet:
        """The scale set ``resource_group/name`` (KeyError if none)."""
        with self._lock:
            return self.scale_sets[(resource_group.lower(), name.lower())]

    def advance(self, steps: int = 1) -> None:
        """``advance`` every scale set."""
        with self._lock:
            for scale_set in self.scale_sets.values():
                scale_set.advance(steps)

    def add_sku(
        self,
        name: str,
        *,
        vcpus: int,
        memory_gb: float,
        gpus: int = 0,
        family: str = "",
        locations: Iterable[str] | None = None,
        zones: Iterable[str] = ("1", "2", "3"),
        restricted: bool = False,
    ) -> None:
        """Add a ``virtualMachines`` entry to the resource SKU list (GPUs capability if > 0).

        ``restricted``: a ``Location`` restriction, ``NotAvailableForSubscription``.
        """
        with self._lock:
            capabilities = {
                "vCPUs": str(vcpus),
                "vCPUsAvailable": str(vcpus),
                "MemoryGB": f"{memory_gb:g}",
                "HyperVGenerations": "V1,V2",
                "CpuArchitectureType": "x64",
                "LowPriorityCapable": "True",
                "AcceleratedNetworkingEnabled": "True",
            }
            if gpus:
                capabilities["GPUs"] = str(gpus)
            self.skus.append(
                {
                    "resource_type": "virtualMachines",
                    "name": name,
                    "tier": "Standard",
                    "family": family,
                    "vcpus": vcpus,
                    "locations": list(locations or [self.location]),
                    "zones": list(zones),
                    "capabilities": capabilities,
                    "restricted": restricted,
                }
            )

    def sku(self, name: str) -> dict[str, Any] | None:
        """The virtualMachines SKU entry called ``name``, if any."""
        with self._lock:
            for sku in self.skus:
                if (
                    sku["resource_type"] == "virtualMachines"
                    and sku["name"].lower() == name.lower()
                ):
                    return sku
        return None

    def subnet_id(self, resource_group: str) -> str:
        """The subnet every NIC of ``resource_group`` sits in."""
        return (
            f"/subscriptions/{self.subscription}/resourceGroups/{resource_group}/providers/"
            f"Microsoft.Network/virtualNetworks/{resource_group}-vnet/subnets/default"
        )

    # ------------------------------------------------------------------ operations

    @property
    def operations(self) -> list[Operation]:
        """Every long-running operation started so far."""
        with self._lock:
            return list(self._operations.values())

    # ------------------------------------------------------------------ internals

    def _new_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _new_name(self, base: str) -> str:
        while True:
            name = f"{base}_{self._rng.getrandbits(32):08x}"
            if name.lower() not in self._names:
                return name

    def _new_ip(self) -> str:
        while True:
            n = self._next_ip
            self._next_ip += 1
            if 4 <= n & 255 <= 254:
                return f"10.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}"

    def _new_operation(
        self, api: str, scale_set: FakeScaleSet | None, api_version: str
    ) -> Operation:
        op = Operation(
            id=str(uuid.UUID(int=self._rng.getrandbits(128))),
            api=api,
            scale_set=scale_set,
            api_version=api_version,
            in_progress_polls=self.lro_in_progress_polls,
        )
        if op.in_progress_polls <= 0:
            op.finish()
        self._operations[op.id] = op
        return op

    def _lro_headers(self, op: Operation, location: str, *, with_location: bool) -> dict[str, str]:
        base = (
            f"{self.url}/subscriptions/{self.subscription}/providers/Microsoft.Compute/"
            f"locations/{location}/operations/{op.id}"
        )
        headers = {"Azure-AsyncOperation": f"{base}?p={op.id}&api-version={op.api_version}"}
        if with_location:
            headers["Location"] = f"{base}?p={op.id}&monitor=true&api-version={op.api_version}"
        # The SDK parses the initial answer's Retry-After as an int (a fraction raises
        # ValueError), and only status answers' Retry-After times the polls.
        if self.lro_retry_after is not None and float(self.lro_retry_after).is_integer():
            headers["Retry-After"] = _seconds(self.lro_retry_after)
        return headers

    def _check_permission(self, api: str, scope: str) -> None:
        action = PERMISSIONS[api]
        if action in self.denied:
            raise ArmError(
                403,
                "AuthorizationFailed",
                f"The client '{self.client_id}' with object id '{self.object_id}' does not have "
                f"authorization to perform action '{action}' over scope '{scope}' or the scope "
                "is invalid. If access was recently granted, please refresh your credentials.",
            )

    def _resource_group(self, rg: str) -> str:
        try:
            return self.resource_groups[rg.lower()]
        except KeyError:
            raise resource_group_not_found(rg) from None

    def _find_set(self, rg: str, name: str) -> FakeScaleSet:
        rg = self._resource_group(rg)
        scale_set = self.scale_sets.get((rg.lower(), name.lower()))
        if scale_set is None:
            raise resource_not_found("Microsoft.Compute/virtualMachineScaleSets", name, rg)
        return scale_set

    def _find_flexible_vm(self, rg: str, name: str) -> tuple[FakeScaleSet, Member] | None:
        for scale_set in self.scale_sets.values():
            if scale_set.resource_group.lower() != rg.lower() or scale_set.uniform:
                continue
            for m in scale_set.members:
                if m.name.lower() == name.lower():
                    return scale_set, m
        return None

    # ------------------------------------------------------------------ request handling

    def handle(
        self,
        method: str,
        path: str,
        query: dict[str, str],
        body: Any,
        route: tuple[str, dict[str, str]] | None = None,
    ) -> tuple[int, Any, dict[str, str]]:
        """Answer one request: (status, JSON body or None, extra headers).

        Raises ArmError for error answers.
        """
        route = route or _route(method, path)
        if route is None:
            raise ArmError(404, "NotFound", f"The fake has no route for {method} {path}.")
        api, params = route
        if not query.get("api-version"):
            raise ArmError(
                400,
                "MissingApiVersionParameter",
                "The api-version query parameter (?api-version=) is required for all requests.",
            )
        with self._lock:
            # ARM evaluates RBAC on the request's scope before looking at the resource.
            self._check_permission(api, path)
            if params["subscription"].lower() != self.subscription.lower():
                raise ArmError(
                    404,
                    "SubscriptionNotFound",
                    f"The subscription '{params['subscription']}' could not be found.",
                )
            return self._dispatch(api, params, path, query, body)

    def _dispatch(
        self, api: str, params: dict[str, str], path: str, query: dict[str, str], body: Any
    ) -> tuple[int, Any, dict[str, str]]:
        if api == "operations.get":
            return self._operation_status(params["operation"], query)
        if query.get("$skiptoken") and api.split(".")[1].startswith("list"):
            # A later page of a listing: served from the first page's snapshot.
            return 200, self._next_page(path, query), {}
        if api == "resourceSkus.list":
            return 200, self._list_skus(path, query), {}
        rg = self._resource_group(params["rg"])
        if api == "virtualMachines.list":
            return 200, self._list_flexible_vms(rg, path, query), {}
        if api == "networkInterfaces.list":
            return 200, self._list_rg_nics(rg, path, query), {}
        if api == "networkInterfaces.get":
            return 200, self._get_flexible_nic(rg, params["nic"]), {}
        if api == "virtualMachines.get":
            found = self._find_flexible_vm(rg, params["vm"])
            if found is None:
                raise resource_not_found("Microsoft.Compute/virtualMachines", params["vm"], rg)
            expand = query.get("$expand", "").lower() == "instanceview"
            return 200, found[0].vm(found[1], instance_view=expand), {}
        if api == "virtualMachines.delete":
            return self._delete_vm(rg, params["vm"], query)
        scale_set = self._find_set(rg, params["vmss"])
        if api == "virtualMachineScaleSets.get":
            return 200, scale_set.record(), {}
        if api == "virtualMachineScaleSets.update":
            return self._update(scale_set, body, query)
        if api == "virtualMachineScaleSets.deleteInstances":
            return self._delete_instances(scale_set, body, query)
        if not scale_set.uniform:
            # Guessed wording: Flexible sets have no VMSS VM or VMSS NIC collections.
            raise ArmError(
                400,
                "OperationNotAllowed",
                f"The operation is not supported for Virtual Machine Scale Set "
                f"'{scale_set.name}' with orchestration mode 'Flexible'. Use the Virtual "
                "Machine APIs instead.",
            )
        if api == "virtualMachineScaleSetVMs.list":
            return 200, self._list_uniform_vms(scale_set, path, query), {}
        if api == "virtualMachineScaleSetVMs.get":
            try:
                member = next(m for m in scale_set.members if m.instance_id == params["instance"])
            except StopIteration:
                raise resource_not_found(
                    "Microsoft.Compute/virtualMachineScaleSets",
                    f"{scale_set.name}/virtualMachines/{params['instance']}",
                    rg,
                ) from None
            expand = query.get("$expand", "").lower() == "instanceview"
            return 200, scale_set.vm(member, instance_view=expand), {}
        if api == "networkInterfaces.listVirtualMachineScaleSetNetworkInterfaces":
            items = [scale_set.nic(m) for m in scale_set.members if m.has_nic]
            return 200, self._page(items, path, query), {}
        raise AssertionError(api)

    def _operation_status(self, op_id: str, query: dict[str, str]) -> tuple[int, Any, dict]:
        op = self._operations.get(op_id)
        if op is None:
            raise ArmError(404, "NotFound", f"The operation '{op_id}' was not found.")
        op.polls += 1
        if op.polls > op.in_progress_polls:
            op.finish()
        location = op.scale_set.location if op.scale_set else self.location
        if query.get("monitor", "").lower() == "true":
            # The Location URL: 202 while running, then the operation's result.
            if not op.done:
                return 202, None, self._lro_headers(op, location, with_location=True)
            if op.error:
                raise ArmError(409, op.error[0], op.error[1])
            return 200, None, {}
        headers = {}
        if not op.done and self.lro_retry_after is not None:
            headers["Retry-After"] = _seconds(self.lro_retry_after)
        return 200, op.body(), headers

    def _update(
        self, scale_set: FakeScaleSet, body: Any, query: dict[str, str]
    ) -> tuple[int, Any, dict]:
        if not isinstance(body, dict):
            raise ArmError(400, "InvalidRequestContent", "The request content was invalid.")
        capacity = (body.get("sku") or {}).get("capacity")
        bad = not isinstance(capacity, int) or isinstance(capacity, bool) or capacity < 0
        if capacity is not None and bad:
            raise invalid_parameter(
                f"The value {capacity!r} of parameter 'sku.capacity' is out of range. "
                "The value must be between 0 and 1000, inclusive.",
                "sku.capacity",
            )
        growing = capacity is not None and capacity > len(scale_set._active())
        if capacity is not None and scale_set._conflicts:
            scale_set._conflicts -= 1
            busy = next((m for m in scale_set.members if m.provisioning_state == "Deleting"), None)
            raise ArmError(
                409,
                "OperationNotAllowed",
                f"Operation 'Update' is not allowed on VM '{(busy or scale_set.members[0]).name}'"
                " since the VM is marked for deletion. You can only retry the Delete operation"
                " (or wait for an ongoing one to complete).",
            )
        if capacity is not None:
            scale_set._resize(capacity)  # may raise a request-time capacity error
        if isinstance(body.get("tags"), dict):
            scale_set.tags = dict(body["tags"])
        op = self._new_operation(
            "virtualMachineScaleSets.update", scale_set, query.get("api-version", "")
        )
        if growing and scale_set.capacity_error_code:
            op.error = (scale_set.capacity_error_code, scale_set._capacity_message())
        headers = self._lro_headers(op, scale_set.location, with_location=False)
        return 200, scale_set.record(), headers

    def _delete_instances(
        self, scale_set: FakeScaleSet, body: Any, query: dict[str, str]
    ) -> tuple[int, Any, dict]:
        ids = body.get("instanceIds") if isinstance(body, dict) else None
        if not ids or not isinstance(ids, list):
            raise invalid_parameter(
                "The list of instance ids is required for this operation.", "instanceIds"
            )
        targets = []
        for iid in ids:
            iid = str(iid)
            member = next(
                (
                    m
                    for m in scale_set.members
                    if (
                        m.instance_id == iid if scale_set.uniform else m.name.lower() == iid.lower()
                    )
                ),
                None,
            )
            if member is None:
                raise invalid_parameter(
                    f"The provided instanceId {iid} is not an active Virtual Machine Scale Set "
                    "VM instanceId.",
                    "instanceIds",
                )
            targets.append(member)
        for m in targets:
            if m.provisioning_state != "Deleting":
                m.provisioning_state = "Deleting"
                scale_set.capacity = max(0, scale_set.capacity - 1)
        op = self._new_operation(
            "virtualMachineScaleSets.deleteInstances", scale_set, query.get("api-version", "")
        )
        return 202, None, self._lro_headers(op, scale_set.location, with_location=True)

    def _delete_vm(self, rg: str, name: str, query: dict[str, str]) -> tuple[int, Any, dict]:
        found = self._find_flexible_vm(rg, name)
        if found is None:
            return 204, None, {}  # ARM deletes are idempotent
        scale_set, member = found
        if member.provisioning_state != "Deleting":
            member.provisioning_state = "Deleting"
            scale_set.capacity = max(0, scale_set.capacity - 1)
        op = self._new_operation("virtualMachines.delete", scale_set, query.get("api-version", ""))
        return 202, None, self._lro_headers(op, scale_set.location, with_location=True)

    def _list_uniform_vms(
        self, scale_set: FakeScaleSet, path: str, query: dict[str, str]
    ) -> dict[str, Any]:
        # Advance on a listing's first request only, so its pages show one consistent state.
        if scale_set.auto_advance:
            scale_set.advance()
        expand = query.get("$expand", "").lower() == "instanceview"
        items = [scale_set.vm(m, instance_view=expand) for m in scale_set.members]
        return self._page(items, path, query)

    def _list_flexible_vms(self, rg: str, path: str, query: dict[str, str]) -> dict[str, Any]:
        text = query.get("$filter")
        expand = query.get("$expand", "").lower() == "instanceview"
        if expand and not text:
            # "'instanceView' enables fetching run time status of all Virtual Machines, this
            # can only be specified if a valid $filter option is specified" (Virtual Machines
            # - List, $expand). The wording of the refusal is a guess.
            raise invalid_parameter(
                "The $expand value 'instanceView' can only be specified with a valid $filter.",
                "$expand",
            )
        wanted: str | None = None
        if text and not self.vm_filter_ignored:
            match = _VM_FILTER_RE.match(text)
            if not match:
                raise invalid_parameter(
                    f"The $filter '{text}' is not supported. Supported: "
                    "'virtualMachineScaleSet/id' eq <scale set id>.",
                    "$filter",
                )
            wanted = match["id"].lower()
        sets = [
            s
            for s in self.scale_sets.values()
            if s.resource_group.lower() == rg.lower()
            and not s.uniform
            and (wanted is None or s.id.lower() == wanted)
        ]
        for s in sets:
            if s.auto_advance:
                s.advance()
        pairs = sorted(((m, s) for s in sets for m in s.members), key=lambda p: p[0].seq)
        items = [s.vm(m, instance_view=expand) for m, s in pairs]
        return self._page(items, path, query)

    def _list_rg_nics(self, rg: str, path: str, query: dict[str, str]) -> dict[str, Any]:
        pairs = [
            (m, s)
            for s in self.scale_sets.values()
            if s.resource_group.lower() == rg.lower() and not s.uniform
            for m in s.members
            if m.has_nic
        ]
        items = [s.nic(m) for m, s in sorted(pairs, key=lambda p: p[0].seq)]
        return self._page(items, path, query)

    def _get_flexible_nic(self, rg: str, name: str) -> dict[str, Any]:
        for s in self.scale_sets.values():
            if s.resource_group.lower() == rg.lower() and not s.uniform:
                for m in s.members:
                    if m.nic_name.lower() == name.lower():
                        return s.nic(m)
        raise resource_not_found("Microsoft.Network/networkInterfaces", name, rg)

    def _list_skus(self, path: str, query: dict[str, str]) -> dict[str, Any]:
        location: str | None = None
        text = query.get("$filter")
        if text:
            match = _SKU_FILTER_RE.match(text)
            if not match:
                raise invalid_parameter(
                    f"The $filter '{text}' is not supported. Supported: location eq '<location>'.",
                    "$filter",
                )
            location = match["location"].lower()
        items = []
        for sku in self.skus:
            locations = [loc for loc in sku["locations"] if location in (None, loc.lower())]
            if not locations:
                continue
            model = cm.ResourceSku(
                resource_type=sku["resource_type"],
                name=sku["name"],
                tier=sku["tier"],
                locations=locations,
                location_info=[
                    cm.ResourceSkuLocationInfo(location=loc, zones=list(sku["zones"]))
                    for loc in locations
                ],
                capabilities=[
                    cm.ResourceSkuCapabilities(name=k, value=v)
                    for k, v in sku["capabilities"].items()
                ],
                restrictions=[],
            )
            if sku["resource_type"] == "virtualMachines":
                model.size = sku["name"].split("_", 1)[-1]
                model.family = sku["family"]
            if sku["restricted"]:
                model.restrictions = [
                    cm.ResourceSkuRestrictions(
                        type="Location",
                        values_property=list(locations),
                        restriction_info=cm.ResourceSkuRestrictionInfo(locations=list(locations)),
                        reason_code="NotAvailableForSubscription",
                    )
                ]
            items.append(_wire(model))
        return self._page(items, path, query)

    def _page(
        self, items: list[dict[str, Any]], path: str, query: dict[str, str]
    ) -> dict[str, Any]:
        page, rest = items[: self.page_size], items[self.page_size :]
        result: dict[str, Any] = {"value": page}
        if rest:
            # Later pages come from this snapshot. The SDK follows nextLink verbatim, so it
            # carries the first request's query (api-version included).
            token = uuid.uuid4().hex
            self._pages[token] = rest
            next_query = {k: v for k, v in query.items() if k != "$skiptoken"}
            next_query["$skiptoken"] = token
            result["nextLink"] = (
                f"{self.url}{quote(path)}?{urlencode(next_query, quote_via=quote, safe=chr(36))}"
            )
        return result

    def _next_page(self, path: str, query: dict[str, str]) -> dict[str, Any]:
        items = self._pages.pop(query["$skiptoken"], None)
        if items is None:
            raise invalid_parameter("The $skiptoken is invalid or expired.", "$skiptoken")
        return self._page(items, path, query)
