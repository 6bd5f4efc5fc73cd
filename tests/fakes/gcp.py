"""A fake Google Compute Engine REST API on loopback, for the GCP provider's tests.

The real ``google-cloud-compute`` clients talk to it over HTTP (``transport="rest"``,
``client_options=ClientOptions(api_endpoint=fake.url)``). Response bodies are built
from the library's own message types, so field names and value encodings (camelCase,
int64 as strings, enums as names) are the ones the REST transport parses.

Covered: managed instance groups (zonal and regional: get, listManagedInstances, resize,
recreateInstances, deleteInstances, listErrors), instance templates (global and
regional: get), zone/region operations (get, wait), instances.list with filters, an
OAuth2 token endpoint, Google's JSON error bodies, permissions and fault injection.

Capacity failures (``capacity_error``) look as Compute's reference describes them: the
member stays ``CREATING`` ("If the group fails to create this instance, it will try
again until it is successful", ManagedInstance.currentAction), without ``id`` and
``instanceStatus`` (empty "when the instance does not exist"), with the attempt's
errors in ``lastAttempt.errors.errors[]``; each failed attempt is also an item of
``listErrors`` (InstanceManagedByIgmError: ``error.code``/``message``, ``timestamp``,
``instanceActionDetails``), in no order the reference promises (shuffled by default).

Also as documented: spot preemption with termination action STOP or DELETE (the VM
torn down through ``DEPROVISIONING``, then the member NONE without a VM until the group
repairs it), IPV6_ONLY interfaces (no ``networkIP``), and listManagedInstances
refusing ``orderBy``. Not documented, for hostile tests: a member whose rows leave
fields out (``Member.dropped``).

In process::

    with FakeCompute() as fake:
        group = fake.add_group("workers", zone="us-central1-a", size=3)
        ...

As a separate process (for CLI end-to-end runs)::

    python -m tests.fakes.gcp --port 0 --state state.json

prints its URL on the first line of stdout and serves until killed; tests steer it
through the control API under ``/_fake/`` (see :class:`_Handler` and ``main``).

What the real clients do against it (google-cloud-compute 1.57, google-auth 2.62):

- ``resize()``/``recreate_instances()`` return an ExtendedOperation whose polling client
  is built WITHOUT the caller's client_options, so ``.result()`` on a RUNNING operation
  goes to compute.googleapis.com. Use the ``*_unary`` calls and a ZoneOperationsClient
  built like the others, or don't wait (``fake.operations_start_done`` answers DONE).
- ``get``, ``instances.list`` and ``operations.get`` retry 503 by themselves (deadline
  600 s); ``listManagedInstances``, ``resize`` and ``recreateInstances`` do not.
- On a 401 google-auth refreshes the credentials and retries; AnonymousCredentials
  raise ``google.auth.exceptions.InvalidOperation`` instead of Unauthorized.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import re
import secrets
import string
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from google.cloud import compute_v1

from tests.fakes.server import FakeServer, Fault, JsonHandler

API = "https://www.googleapis.com/compute/v1"
MAX_RESULTS = 500  # the real API's default and maximum page size
CAPACITY_ERRORS = (
    "ZONE_RESOURCE_POOL_EXHAUSTED",
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS",
    "QUOTA_EXCEEDED",
)
# Permissions the real API checks for each endpoint.
PERMISSIONS = {
    "instanceGroupManagers.get": "compute.instanceGroupManagers.get",
    "instanceGroupManagers.listManagedInstances": "compute.instanceGroupManagers.get",
    "instanceGroupManagers.resize": "compute.instanceGroupManagers.update",
    "instanceGroupManagers.recreateInstances": "compute.instanceGroupManagers.update",
    # deleteInstances and listErrors: "Authorization requires the following IAM permission
    # on the specified resource instanceGroupManager" (their REST reference pages).
    "instanceGroupManagers.deleteInstances": "compute.instanceGroupManagers.update",
    "instanceGroupManagers.listErrors": "compute.instanceGroupManagers.get",
    # Global and regional templates share one permission (instanceTemplates/get and
    # regionInstanceTemplates/get reference pages).
    "instanceTemplates.get": "compute.instanceTemplates.get",
    "regionInstanceTemplates.get": "compute.instanceTemplates.get",
    "instances.list": "compute.instances.list",
    "instances.get": "compute.instances.get",
    "zoneOperations.get": "compute.zoneOperations.get",
    "zoneOperations.wait": "compute.zoneOperations.get",
    "regionOperations.get": "compute.regionOperations.get",
    "regionOperations.wait": "compute.regionOperations.get",
}
# Regional MIGs are a separate collection but are checked with the same permissions.
for _api in list(PERMISSIONS):
    if _api.startswith("instanceGroupManagers."):
        PERMISSIONS["region" + _api[0].upper() + _api[1:]] = PERMISSIONS[_api]

_ZONE_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]+-[a-z]$")
_REGION_RE = re.compile(r"^[a-z]+-[a-z]+[0-9]+$")
_NAME_CHARS = string.ascii_lowercase + string.digits


def _json(message_type: Any, message: Any) -> dict[str, Any]:
    """``message`` as the REST API spells it: camelCase names, enum names, int64 as str."""
    return message_type.to_dict(
        message,
        use_integers_for_enums=False,
        preserving_proto_field_name=False,
        always_print_fields_with_no_presence=False,
    )


def _now() -> str:
    """An RFC 3339 timestamp with milliseconds, as Compute Engine writes them."""
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


class ApiError(Exception):
    """An error answered with Google's JSON error body."""

    def __init__(self, code: int, message: str, reason: str, **extra: Any) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.reason = reason
        self.extra = extra

    def body(self) -> dict[str, Any]:
        """The ``{"error": {...}}`` document the real API answers."""
        detail = {"message": self.message, "domain": "global", "reason": self.reason}
        detail.update(self.extra)
        return {"error": {"code": self.code, "message": self.message, "errors": [detail]}}


def not_found(resource: str) -> ApiError:
    """404 as the real API words it."""
    return ApiError(404, f"The resource '{resource}' was not found", "notFound")


def invalid(field_name: str, value: Any, why: str) -> ApiError:
    """400 ``invalid`` as the real API words it (``Invalid value for field ...``)."""
    return ApiError(400, f"Invalid value for field '{field_name}': '{value}'. {why}", "invalid")


# ----------------------------------------------------------------------------- state


@dataclass
class Member:
    """One managed instance and, while it exists, its VM."""

    name: str
    zone: str
    current_action: str = "NONE"
    instance_status: str | None = "RUNNING"  # None: no VM (being created, or gone)
    id: int | None = None  # the VM's id; a recreated VM gets a new one
    network_ip: str | None = None
    creation_timestamp: str | None = None
    health: list[str] = field(default_factory=list)
    last_attempt_errors: list[str] = field(default_factory=list)
    seq: int = 0  # creation order, for "newest first"
    recreate_from: int | None = None  # id of the VM a RECREATING member still has to replace
    ipv6_only: bool = False  # its VM's interface is IPV6_ONLY: no networkIP
    deleted_on_stop: bool = False  # preempted with termination action DELETE
    dropped: list[str] = field(default_factory=list)
    """Fields left out of this member's rows (listManagedInstances and instances.list), as
    a broken answer would: a test's hostile member, not a documented state."""

    @property
    def has_vm(self) -> bool:
        """Whether the VM exists (it shows in instances.list and has an id)."""
        return self.instance_status is not None and self.id is not None

    def to_dict(self) -> dict[str, Any]:
        """A plain description, for the control API."""
        data = asdict(self)
        data.pop("recreate_from")
        data.pop("deleted_on_stop")
        return data


class FakeGroup:
    """A managed instance group. Its setters are for tests; all of them are thread safe."""

    def __init__(
        self,
        fake: FakeCompute,
        name: str,
        *,
        zone: str | None,
        region: str | None,
        zones: list[str],
        base_instance_name: str,
        provisioning_model: str,
        machine_type: str,
        accelerators: int,
        accelerator_type: str,
        labels: dict[str, str],
        autoscaler: str | None,
        list_managed_instances_results: str,
        template_region: str | None = None,
        termination_action: str = "STOP",
    ) -> None:
        self._fake = fake
        self.name = name
        self.zone = zone
        self.region = region
        self.zones = zones
        self.base_instance_name = base_instance_name
        self.provisioning_model = provisioning_model
        self.machine_type = machine_type
        self.accelerators = accelerators
        self.accelerator_type = accelerator_type
        self.labels = labels
        self.autoscaler = autoscaler
        # Real default is PAGELESS: maxResults/pageToken are ignored and everything comes
        # back in one response. PAGINATED pages like other list calls.
        self.list_managed_instances_results = list_managed_instances_results
        self.id = fake._new_id()
        self.creation_timestamp = _now()
        self.target_size = 0
        self.members: list[Member] = []
        self.auto_advance = True
        self.auto_repair = True  # a MIG recreates VMs that stopped or terminated
        self.capacity_errors: dict[str, str] = {}
        # listErrors items (InstanceManagedByIgmError as JSON), oldest first.
        self.errors: list[dict[str, Any]] = []
        # None: a global instance template; else the region of a regional one.
        self.template_region = template_region
        self.template_id = fake._new_id()
        # Scheduling.instanceTerminationAction of a spot VM: STOP, or DELETE as
        # terraform/gcp sets it ("Compute Engine deletes the Spot VM on preemption").
        self.termination_action = termination_action
        # listErrors names no order ("The filter and orderBy query parameters are not
        # supported"): "shuffled" (the default, seeded), "newest" or "oldest" first.
        self.errors_order = "shuffled"

    # ------------------------------------------------------------------ addresses

    @property
    def location(self) -> str:
        """``zones/Z`` or ``regions/R``."""
        return f"zones/{self.zone}" if self.zone else f"regions/{self.region}"

    @property
    def resource(self) -> str:
        """``projects/P/zones/Z/instanceGroupManagers/NAME`` (or regions/R)."""
        return f"projects/{self._fake.project}/{self.location}/instanceGroupManagers/{self.name}"

    @property
    def self_link(self) -> str:
        """The group's full URL."""
        return f"{API}/{self.resource}"

    def instance_url(self, member: Member) -> str:
        """The member's full instance URL."""
        return f"{API}/projects/{self._fake.project}/zones/{member.zone}/instances/{member.name}"

    # ------------------------------------------------------------------ test setters

    def member(self, name: str) -> Member:
        """The member called ``name`` (KeyError if there is none)."""
        with self._fake._lock:
            for m in self.members:
                if m.name == name:
                    return m
        raise KeyError(name)

    def names(self) -> list[str]:
        """The members' names, in creation order."""
        with self._fake._lock:
            return [m.name for m in self.members]

    def add_member(
        self,
        name: str | None = None,
        *,
        zone: str | None = None,
        current_action: str = "NONE",
        instance_status: str | None = "RUNNING",
        health: Iterable[str] = (),
        last_attempt_errors: Iterable[str] = (),
        grow_target: bool = True,
        ipv6_only: bool = False,
        dropped: Iterable[str] = (),
    ) -> Member:
        """Add a member (a running VM unless told otherwise); grows targetSize to match."""
        with self._fake._lock:
            if name is not None:
                self._fake._names.add(name)
            member = Member(
                name=name or self._fake._new_name(self.base_instance_name),
                zone=zone or self._next_zone(),
                current_action=current_action,
                instance_status=instance_status,
                health=list(health),
                last_attempt_errors=list(last_attempt_errors),
                seq=self._fake._new_seq(),
                ipv6_only=ipv6_only,
                dropped=list(dropped),
            )
            if instance_status is not None:
                self._fake._new_vm(member)
            self.members.append(member)
            if grow_target:
                self.target_size += 1
            return member

    def set_member(
        self,
        name: str,
        *,
        current_action: str | None = None,
        instance_status: str | None = None,
        health: Iterable[str] | None = None,
        last_attempt_errors: Iterable[str] | None = None,
        no_vm: bool = False,
        dropped: Iterable[str] | None = None,
    ) -> Member:
        """Overwrite a member's state; ``no_vm=True`` drops its VM (no id, no status);
        ``dropped`` names fields its rows leave out (see :attr:`Member.dropped`)."""
        with self._fake._lock:
            member = self.member(name)
            if current_action is not None:
                member.current_action = current_action
            if no_vm:
                member.instance_status = None
                member.id = None
            elif instance_status is not None:
                if not member.has_vm:
                    self._fake._new_vm(member)
                member.instance_status = instance_status
            if health is not None:
                member.health = list(health)
            if last_attempt_errors is not None:
                member.last_attempt_errors = list(last_attempt_errors)
            if dropped is not None:
                member.dropped = list(dropped)
            return member

    def remove_member(self, name: str, *, shrink_target: bool = True) -> None:
        """The member and its VM vanish at once (like deleteInstances); targetSize shrinks."""
        with self._fake._lock:
            self.members.remove(self.member(name))
            if shrink_target:
                self.target_size = max(0, self.target_size - 1)

    def delete_vm(self, name: str) -> Member:
        """The VM is deleted behind the MIG's back: it recreates it under the same name."""
        with self._fake._lock:
            member = self.member(name)
            member.instance_status = None
            member.id = None
            member.current_action = "RECREATING"
            member.recreate_from = None
            return member

    def preempt(self, name: str) -> Member:
        """Spot preemption: the VM stops, then the MIG recreates it.

        With ``advance()`` and termination action STOP: STOPPING -> TERMINATED ->
        RECREATING (old VM, TERMINATED) -> RECREATING (new id, PROVISIONING) -> NONE,
        RUNNING. With DELETE (terraform/gcp): STOPPING -> DEPROVISIONING -> the VM is
        deleted and the member is NONE without id or status until the MIG repairs it
        ("About repairing VMs in a MIG": it recreates a VM "deleted by an action not
        initiated by the MIG", e.g. the preemption of a Spot VM) -> RECREATING (no VM)
        -> RECREATING (new id, PROVISIONING) -> NONE, RUNNING.
        """
        with self._fake._lock:
            member = self.member(name)
            member.instance_status = "STOPPING"
            member.current_action = "NONE"
            member.deleted_on_stop = self.termination_action == "DELETE"
            return member

    def capacity_error(self, zone: str, code: str = "ZONE_RESOURCE_POOL_EXHAUSTED") -> None:
        """While set, members being created in ``zone`` stay CREATING with this error
        (no VM, ``lastAttempt.errors``), and each failed attempt is a listErrors item."""
        with self._fake._lock:
            self.capacity_errors[zone] = code

    def clear_capacity_error(self, zone: str | None = None) -> None:
        """Capacity is back in ``zone`` (or everywhere)."""
        with self._fake._lock:
            if zone is None:
                self.capacity_errors.clear()
            else:
                self.capacity_errors.pop(zone, None)

    def add_error(
        self,
        code: str,
        *,
        action: str | None = "CREATING",
        instance: str | None = None,
        timestamp: str | None = None,
        message: str | None = None,
    ) -> dict[str, Any]:
        """Append a listErrors item; ``action`` None leaves ``instanceActionDetails``
        out ("May be null, if the error was not caused by an action on an instance")."""
        with self._fake._lock:
            zone = self.zones[0]
            error = compute_v1.InstanceManagedByIgmError(
                error=compute_v1.InstanceManagedByIgmErrorManagedInstanceError(
                    code=code,
                    message=message or _capacity_message(code, self._fake.project, zone),
                ),
                timestamp=timestamp or _now(),
            )
            if action is not None:
                details = compute_v1.InstanceManagedByIgmErrorInstanceActionDetails(
                    action=action,
                    version=compute_v1.ManagedInstanceVersion(instance_template=self._template()),
                )
                if instance:
                    details.instance = instance
                error.instance_action_details = details
            item = _json(compute_v1.InstanceManagedByIgmError, error)
            self.errors.append(item)
            return item

    def advance(self, steps: int = 1) -> None:
        """Move every in-flight member ``steps`` stages on (see the module's docs)."""
        with self._fake._lock:
            for _ in range(steps):
                for member in list(self.members):
                    self._advance(member)

    def is_stable(self) -> bool:
        """No member in flight and as many members as the target size."""
        with self._fake._lock:
            return len(self.members) == self.target_size and all(
                m.current_action == "NONE" and m.instance_status == "RUNNING" for m in self.members
            )

    # ------------------------------------------------------------------ MIG behaviour

    def _next_zone(self) -> str:
        if self.zone:
            return self.zone
        # Even distribution (the regional default): the zone with the fewest members.
        counts = {z: 0 for z in self.zones}
        for m in self.members:
            if m.zone in counts and m.current_action != "DELETING":
                counts[m.zone] += 1
        return min(self.zones, key=lambda z: counts[z])

    def _try_create_vm(self, member: Member, status: str) -> None:
        code = self.capacity_errors.get(member.zone)
        if code:
            action = member.current_action
            member.instance_status = None
            member.id = None
            member.last_attempt_errors = [code]
            self.add_error(
                code,
                action=action,
                instance=self.instance_url(member),
                message=_capacity_message(code, self._fake.project, member.zone),
            )
            return
        self._fake._new_vm(member)
        member.instance_status = status
        member.last_attempt_errors = []

    def _advance(self, m: Member) -> None:
        if m.current_action in ("CREATING", "CREATING_WITHOUT_RETRIES"):
            if not m.has_vm or m.instance_status == "PROVISIONING":
                if m.has_vm:
                    m.instance_status = "STAGING"
                else:
                    self._try_create_vm(m, "STAGING")
            else:
                m.current_action, m.instance_status = "NONE", "RUNNING"
        elif m.current_action in ("DELETING", "ABANDONING"):
            self.members.remove(m)
        elif m.current_action == "RECREATING":
            if not m.has_vm or (m.recreate_from is not None and m.id == m.recreate_from):
                m.recreate_from = None
                self._try_create_vm(m, "PROVISIONING")
            else:
                m.current_action, m.instance_status = "NONE", "RUNNING"
        elif m.current_action != "NONE":
            # RESTARTING, REFRESHING, VERIFYING, ...: done in one stage.
            m.current_action = "NONE"
            if m.has_vm:
                m.instance_status = "RUNNING"
        elif not m.has_vm:  # its VM was deleted behind the group's back: repaired
            if self.auto_repair:
                m.current_action = "RECREATING"
                m.recreate_from = None
        elif m.instance_status == "STOPPING" and m.deleted_on_stop:
            # Instance.Status DEPROVISIONING: "The instance is halted and we are
            # performing tear down tasks like network deprogramming, releasing quota, IP,
            # tearing down disks etc."
            m.instance_status = "DEPROVISIONING"
        elif m.instance_status == "DEPROVISIONING":
            m.instance_status, m.id, m.deleted_on_stop = None, None, False
        elif m.instance_status in ("STOPPING", "SUSPENDING"):
            m.instance_status = "TERMINATED" if m.instance_status == "STOPPING" else "SUSPENDED"
        elif m.instance_status in ("PROVISIONING", "STAGING", "REPAIRING"):
            m.instance_status = "RUNNING"
        elif m.instance_status in ("TERMINATED", "STOPPED") and self.auto_repair:
            m.current_action = "RECREATING"
            m.recreate_from = m.id

    def _resize(self, size: int) -> None:
        active = [m for m in self.members if m.current_action not in ("DELETING", "ABANDONING")]
        self.target_size = size
        if size > len(active):
            for _ in range(size - len(active)):
                self.add_member(current_action="CREATING", instance_status=None, grow_target=False)
        elif size < len(active):
            for m in sorted(active, key=lambda m: m.seq, reverse=True)[: len(active) - size]:
                if m.has_vm:
                    m.current_action = "DELETING"
                else:
                    self.members.remove(m)  # nothing was created yet: nothing to delete

    def _recreate(self, urls: list[Any]) -> None:
        if not urls:
            raise ApiError(400, "Required field 'instances' not specified", "required")
        targets = []
        for i, url in enumerate(urls):
            match = re.search(r"(?:^|/)zones/([^/]+)/instances/([^/]+)$", str(url))
            member = None
            if match:
                zone, name = match.groups()
                member = next((m for m in self.members if m.name == name and m.zone == zone), None)
            if member is None:
                # Wording guessed; the real API answers 400 for non-members.
                raise invalid(
                    f"instances[{i}]",
                    url,
                    "Instance is not a member of the managed instance group.",
                )
            targets.append(member)
        for m in targets:
            if m.current_action in ("RECREATING", "DELETING", "ABANDONING"):
                continue
            if m.has_vm:
                m.current_action = "RECREATING"
                m.recreate_from = m.id

    def _delete_instances(self, urls: list[Any], skip_invalid: bool) -> None:
        """deleteInstances: "Flags the specified instances in the managed instance group
        for immediate deletion ... This method reduces the targetSize of the managed
        instance group by the number of instances that you delete." Members not in the
        group, or already being deleted or abandoned, fail the call unless
        skipInstancesOnValidationError; a URL in another zone always fails."""
        if not urls:
            raise ApiError(400, "Required field 'instances' not specified", "required")
        targets = []
        for i, url in enumerate(urls):
            match = re.search(r"(?:^|/)zones/([^/]+)/instances/([^/]+)$", str(url))
            if not match or match.group(1) not in self.zones:
                raise invalid(
                    f"instances[{i}]", url, "Instance is not in the managed instance group's zone."
                )
            zone, name = match.groups()
            member = next((m for m in self.members if m.name == name and m.zone == zone), None)
            if member is None or member.current_action in ("DELETING", "ABANDONING"):
                if skip_invalid:
                    continue
                # Wording guessed; the reference says only that "the operation fails".
                raise invalid(
                    f"instances[{i}]",
                    url,
                    "Instance is not a member of the managed instance group"
                    " or is already being deleted.",
                )
            targets.append(member)
        for m in targets:
            self.target_size = max(0, self.target_size - 1)
            if m.has_vm:
                m.current_action = "DELETING"
            else:
                self.members.remove(m)  # never created: nothing to delete

    # ------------------------------------------------------------------ REST shapes

    def managed_instance(self, m: Member) -> dict[str, Any]:
        """The member as listManagedInstances returns it.

        As Compute's reference for ManagedInstance says: ``name`` always exists;
        ``id`` and ``instanceStatus`` "are empty when the instance does not exist" (a
        member being created, or whose creation failed); ``instance``, the URL, "can
        exist even if the instance has not yet been created": here it is sent once the
        VM exists or while a recreate replaces one, not for a VM never created.
        """
        mi = compute_v1.ManagedInstance(
            name=m.name,
            current_action=m.current_action,
            version=compute_v1.ManagedInstanceVersion(instance_template=self._template()),
        )
        if m.has_vm or m.current_action in ("RECREATING", "NONE"):
            mi.instance = self.instance_url(m)
        if m.has_vm:
            mi.id = m.id
            mi.instance_status = m.instance_status
        if m.health:
            check = f"{API}/projects/{self._fake.project}/global/healthChecks/{self.name}-hc"
            mi.instance_health = [
                compute_v1.ManagedInstanceInstanceHealth(
                    detailed_health_state=h, health_check=check
                )
                for h in m.health
            ]
        if m.last_attempt_errors:
            mi.last_attempt = compute_v1.ManagedInstanceLastAttempt(
                errors=compute_v1.ManagedInstanceLastAttemptErrors(
                    errors=[
                        compute_v1.Errors(
                            code=code,
                            message=_capacity_message(code, self._fake.project, m.zone),
                        )
                        for code in m.last_attempt_errors
                    ]
                )
            )
        return _dropping(_json(compute_v1.ManagedInstance, mi), m.dropped)

    def instance(self, m: Member) -> dict[str, Any]:
        """The member's VM as instances.list returns it."""
        project = self._fake.project
        zone_url = f"{API}/projects/{project}/zones/{m.zone}"
        inst = compute_v1.Instance(
            kind="compute#instance",
            id=m.id,
            name=m.name,
            zone=zone_url,
            machine_type=f"{zone_url}/machineTypes/{self.machine_type}",
            status=m.instance_status,
            creation_timestamp=m.creation_timestamp,
            self_link=self.instance_url(m),
            network_interfaces=[_network_interface(m, project)],
            labels=dict(self.labels),
            metadata=compute_v1.Metadata(
                kind="compute#metadata",
                items=[compute_v1.Items(key="created-by", value=self.resource)],
            ),
        )
        scheduling = _scheduling(
            self.provisioning_model, self.accelerators, self.termination_action
        )
        if scheduling is not None:
            inst.scheduling = scheduling
        if self.accelerators:
            inst.guest_accelerators = [
                compute_v1.AcceleratorConfig(
                    accelerator_type=f"{zone_url}/acceleratorTypes/{self.accelerator_type}",
                    accelerator_count=self.accelerators,
                )
            ]
        return _dropping(_json(compute_v1.Instance, inst), m.dropped)

    @property
    def template_name(self) -> str:
        """The instance template's name."""
        return f"{self.name}-template"

    def _template(self) -> str:
        where = f"regions/{self.template_region}" if self.template_region else "global"
        return f"{API}/projects/{self._fake.project}/{where}/instanceTemplates/{self.template_name}"

    def template(self) -> dict[str, Any]:
        """The group's instance template as instanceTemplates.get (or
        regionInstanceTemplates.get) returns it.

        ``properties.scheduling`` is as the reference's Scheduling says: SPOT is
        ``provisioningModel: SPOT``; ``PREEMPTIBLE`` here is the older form,
        ``preemptible: true`` without a provisioning model; ``None`` leaves scheduling
        out (a STANDARD VM: every Scheduling field is optional).
        """
        props = compute_v1.InstanceProperties(
            machine_type=self.machine_type,  # a global template names the type bare
            labels=dict(self.labels),
        )
        scheduling = _scheduling(
            self.provisioning_model, self.accelerators, self.termination_action
        )
        if scheduling is not None:
            props.scheduling = scheduling
        if self.accelerators:
            props.guest_accelerators = [
                compute_v1.AcceleratorConfig(
                    accelerator_type=self.accelerator_type, accelerator_count=self.accelerators
                )
            ]
        template = compute_v1.InstanceTemplate(
            kind="compute#instanceTemplate",
            id=self.template_id,
            name=self.template_name,
            creation_timestamp=self.creation_timestamp,
            properties=props,
            self_link=self._template(),
        )
        if self.template_region:
            template.region = f"{API}/projects/{self._fake.project}/regions/{self.template_region}"
        return _json(compute_v1.InstanceTemplate, template)

    def record(self) -> dict[str, Any]:
        """The group as instanceGroupManagers.get returns it."""
        counts = {a: 0 for a in _ACTION_FIELDS.values()}
        for m in self.members:
            key = _ACTION_FIELDS.get(m.current_action)
            if key:
                counts[key] += 1
        location_url = f"{API}/projects/{self._fake.project}/{self.location}"
        igm = compute_v1.InstanceGroupManager(
            kind="compute#instanceGroupManager",
            id=self.id,
            creation_timestamp=self.creation_timestamp,
            name=self.name,
            base_instance_name=self.base_instance_name,
            instance_template=self._template(),
            versions=[compute_v1.InstanceGroupManagerVersion(instance_template=self._template())],
            instance_group=f"{location_url}/instanceGroups/{self.name}",
            target_size=self.target_size,
            current_actions=compute_v1.InstanceGroupManagerActionsSummary(**counts),
            status=compute_v1.InstanceGroupManagerStatus(
                is_stable=self.is_stable(),
                version_target=compute_v1.InstanceGroupManagerStatusVersionTarget(is_reached=True),
                stateful=compute_v1.InstanceGroupManagerStatusStateful(has_stateful_config=False),
            ),
            list_managed_instances_results=self.list_managed_instances_results,
            fingerprint=base64.b64encode(self.id.to_bytes(8, "big")).decode(),
            self_link=self.self_link,
        )
        if self.autoscaler:
            igm.status.autoscaler = self.autoscaler
        if self.zone:
            igm.zone = location_url
        else:
            igm.region = location_url
            igm.distribution_policy = compute_v1.DistributionPolicy(
                target_shape="EVEN",
                zones=[
                    compute_v1.DistributionPolicyZoneConfiguration(
                        zone=f"{API}/projects/{self._fake.project}/zones/{z}"
                    )
                    for z in self.zones
                ],
            )
        return _json(compute_v1.InstanceGroupManager, igm)

    def to_dict(self) -> dict[str, Any]:
        """A plain description with members, for the control API."""
        with self._fake._lock:
            return {
                "name": self.name,
                "zone": self.zone,
                "region": self.region,
                "zones": self.zones,
                "target_size": self.target_size,
                "auto_advance": self.auto_advance,
                "auto_repair": self.auto_repair,
                "autoscaler": self.autoscaler,
                "capacity_errors": dict(self.capacity_errors),
                "errors": list(self.errors),
                "template_region": self.template_region,
                "termination_action": self.termination_action,
                "errors_order": self.errors_order,
                "list_managed_instances_results": self.list_managed_instances_results,
                "members": [m.to_dict() for m in self.members],
            }


_ACTION_FIELDS = {
    "ABANDONING": "abandoning",
    "CREATING": "creating",
    "CREATING_WITHOUT_RETRIES": "creating_without_retries",
    "DELETING": "deleting",
    "NONE": "none",
    "RECREATING": "recreating",
    "REFRESHING": "refreshing",
    "RESTARTING": "restarting",
    "RESUMING": "resuming",
    "STARTING": "starting",
    "STOPPING": "stopping",
    "SUSPENDING": "suspending",
    "VERIFYING": "verifying",
}


def _scheduling(
    model: str | None, accelerators: int, termination_action: str = "STOP"
) -> compute_v1.Scheduling | None:
    """A VM's or template's Scheduling for ``model`` (see :meth:`FakeGroup.template`)."""
    if model is None:
        return None
    scheduling = compute_v1.Scheduling(
        preemptible=model in ("SPOT", "PREEMPTIBLE"),
        automatic_restart=model == "STANDARD",
        on_host_maintenance="TERMINATE" if accelerators or model != "STANDARD" else "MIGRATE",
    )
    if model != "PREEMPTIBLE":
        scheduling.provisioning_model = model
    if model == "SPOT":
        scheduling.instance_termination_action = termination_action
    return scheduling


def _network_interface(m: Member, project: str) -> compute_v1.NetworkInterface:
    """The VM's nic0. NetworkInterface.stackType IPV6_ONLY: "The network interface will
    be assigned IPv6 addresses" only, so no ``networkIP`` (the IPv4 address) but an
    ``ipv6Address``."""
    nic = compute_v1.NetworkInterface(
        name="nic0", network=f"{API}/projects/{project}/global/networks/default"
    )
    if m.ipv6_only:
        nic.stack_type = "IPV6_ONLY"
        nic.ipv6_access_type = "INTERNAL"
        nic.ipv6_address = f"fd20:0:0:1::{m.seq:x}"
    else:
        nic.network_i_p = m.network_ip
    return nic


def _dropping(resource: dict[str, Any], fields: Iterable[str]) -> dict[str, Any]:
    """``resource`` without ``fields`` (dotted paths into nested objects and lists)."""
    for path in fields:
        _drop(resource, path.split("."))
    return resource


def _drop(value: Any, path: list[str]) -> None:
    if isinstance(value, list):
        for item in value:
            _drop(item, path)
    elif isinstance(value, dict) and path:
        if len(path) == 1:
            value.pop(path[0], None)
        elif path[0] in value:
            _drop(value[path[0]], path[1:])


def _capacity_message(code: str, project: str, zone: str) -> str:
    if code.startswith("ZONE_RESOURCE_POOL_EXHAUSTED"):
        return (
            # "projects/p" rather than the real project: test_gcp_provider.py pins it.
            f"The zone 'projects/p/zones/{zone}' does not have enough resources available "
            "to fulfill the request.  Try a different zone, or try again later."
        )
    if code == "QUOTA_EXCEEDED":
        region = zone.rsplit("-", 1)[0]
        return f"Quota 'PREEMPTIBLE_CPUS' exceeded.  Limit: 0.0 in region {region}."
    return code


# ----------------------------------------------------------------------------- log/faults


@dataclass
class RecordedRequest:
    """One request the fake received (control API requests are not recorded)."""

    method: str
    path: str
    query: dict[str, str]
    body: Any
    api: str | None  # e.g. "instanceGroupManagers.resize", "oauth2.token"; None: unknown
    status: int | None = None  # None: no answer (a dropped connection)
    fault: str | None = None  # the injected fault's kind, if one hit this request
    authorization: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return asdict(self)


_FAULT_BODIES = {
    400: ("Invalid request (injected)", "invalid"),
    401: ("Request had invalid authentication credentials.", "authError"),
    403: ("Forbidden (injected)", "forbidden"),
    404: ("The resource was not found (injected)", "notFound"),
    409: ("The resource is not ready (injected)", "resourceNotReady"),
    429: (
        "Quota exceeded for quota metric 'Read requests' and limit 'Read requests per "
        "minute' of service 'compute.googleapis.com'.",
        "rateLimitExceeded",
    ),
    500: ("Internal Error", "backendError"),
    502: ("Bad Gateway", "backendError"),
    503: ("Internal error. Please try again or contact Google Support.", "backendError"),
    504: ("Deadline exceeded", "backendError"),
}


def fault_error(status: int) -> ApiError:
    """The error an injected fault with ``status`` answers."""
    message, reason = _FAULT_BODIES.get(status, (f"Injected error {status}", "backendError"))
    return ApiError(status, message, reason)


# ----------------------------------------------------------------------------- the server


class FakeCompute(FakeServer[RecordedRequest]):
    """The fake Compute Engine API; ``start()`` serves it on 127.0.0.1 on a free port
    (``url`` is the clients' api_endpoint).

    Faults (``fail_next``, ``fail_rate``) hit compute calls, never the token endpoint; a
    fault's ``match`` is a substring of the path.
    """

    thread_name = "gcp-fake"

    def __init__(self, project: str = "test-project", *, seed: int | None = 0) -> None:
        super().__init__(seed=seed)
        self.project = project
        self.projects = {project}
        self.require_auth = False
        # Real mutating calls answer a RUNNING operation that a later GET finds DONE.
        # True: answer DONE at once (the ExtendedOperation then never polls).
        self.operations_start_done = False
        self.groups: dict[tuple[str, str], FakeGroup] = {}  # (location, name)
        self.tokens: set[str] = set()
        self.refresh_token = "fake-refresh-" + secrets.token_hex(8)
        self.client_id = "fake-client.apps.googleusercontent.com"
        self.client_secret = "fake-secret"
        self._rng = random.Random(seed)
        self._operations: dict[tuple[str, str], dict[str, Any]] = {}
        self._pages: dict[str, list[dict[str, Any]]] = {}
        self._names: set[str] = set()
        self._seq = 0
        self._next_ip = 2

    # ------------------------------------------------------------------ setup

    def add_group(
        self,
        name: str,
        *,
        zone: str | None = None,
        region: str | None = None,
        zones: list[str] | None = None,
        size: int = 0,
        base_instance_name: str | None = None,
        provisioning_model: str | None = "SPOT",
        machine_type: str = "n1-standard-4",
        accelerators: int = 0,
        accelerator_type: str = "nvidia-tesla-t4",
        labels: dict[str, str] | None = None,
        autoscaler: str | None = None,
        list_managed_instances_results: str = "PAGELESS",
        template_region: str | None = None,
        termination_action: str = "STOP",
    ) -> FakeGroup:
        """A zonal (``zone``) or regional (``region``) group with ``size`` RUNNING members.

        ``provisioning_model``: SPOT, STANDARD, PREEMPTIBLE (``preemptible: true`` only)
        or None (no scheduling at all); ``template_region``: the group's instance
        template is regional (else global); ``termination_action``: what preempting a
        spot VM does, STOP or DELETE (see :meth:`FakeGroup.preempt`)."""
        if (zone is None) == (region is None):
            raise ValueError("give exactly one of zone and region")
        with self._lock:
            group = FakeGroup(
                self,
                name,
                zone=zone,
                region=region,
                zones=[zone] if zone else list(zones or [f"{region}-a", f"{region}-b"]),
                base_instance_name=base_instance_name or name,
                provisioning_model=provisioning_model,
                machine_type=machine_type,
                accelerators=accelerators,
                accelerator_type=accelerator_type,
                labels=dict(labels or {}),
                autoscaler=autoscaler,
                list_managed_instances_results=list_managed_instances_results,
                template_region=template_region,
                termination_action=termination_action,
            )
            self.groups[(group.location, name)] = group
            for _ in range(size):
                group.add_member()
            return group

    def group(self, name: str) -> FakeGroup:
        """The group called ``name`` (in any location)."""
        with self._lock:
            for (_, n), group in self.groups.items():
                if n == name:
                    return group
        raise KeyError(name)

    def load_state(self, state: dict[str, Any]) -> None:
        """Set up from a state document (see ``main``'s ``--state``)."""
        with self._lock:
            if "project" in state:
                self.projects.discard(self.project)
                self.project = state["project"]
                self.projects.add(self.project)
            self.projects.update(state.get("extra_projects", []))
            self.require_auth = bool(state.get("require_auth", self.require_auth))
            self.operations_start_done = bool(
                state.get("operations_start_done", self.operations_start_done)
            )
            self.denied.update(state.get("denied", []))
            for spec in state.get("groups", []):
                self._group_from_spec(dict(spec))

    def _group_from_spec(self, spec: dict[str, Any]) -> FakeGroup:
        members = spec.pop("members", None)
        target_size = spec.pop("target_size", None)
        auto_advance = spec.pop("auto_advance", True)
        auto_repair = spec.pop("auto_repair", True)
        capacity_errors = spec.pop("capacity_errors", {})
        if members is not None:
            spec["size"] = 0
        name = spec.pop("name")
        group = self.add_group(name, **spec)
        for m in members or []:
            group.add_member(**m)
        if target_size is not None:
            group.target_size = int(target_size)
        group.auto_advance = bool(auto_advance)
        group.auto_repair = bool(auto_repair)
        group.capacity_errors.update(capacity_errors)
        return group

    def write_credentials(
        self, path: str | Path, kind: str = "external_account_authorized_user"
    ) -> Path:
        """Write a credentials file whose token endpoint is this fake (see ``credentials_info``)."""
        path = Path(path)
        path.write_text(json.dumps(self.credentials_info(kind), indent=2))
        return path

    def credentials_info(self, kind: str = "external_account_authorized_user") -> dict[str, str]:
        """A credentials document that refreshes against ``/token`` with a refresh token.

        ``external_account_authorized_user`` (the default) keeps its ``token_url``, so
        GOOGLE_APPLICATION_CREDENTIALS + ``google.auth.default()`` reach the fake.
        ``authorized_user`` files do NOT: google-auth replaces their ``token_uri`` with
        https://oauth2.googleapis.com/token; pass its fields to
        ``google.oauth2.credentials.Credentials(..., token_uri=...)`` by hand instead.
        """
        common = {
            "type": kind,
            "client_id": self.client_id,
            "client_secret": self.client_secret,
            "refresh_token": self.refresh_token,
            "quota_project_id": self.project,
        }
        if kind == "authorized_user":
            return {**common, "token_uri": f"{self.url}/token"}
        if kind == "external_account_authorized_user":
            return {
                **common,
                "audience": "//iam.googleapis.com/locations/global/workforcePools/"
                "fake-pool/providers/fake-provider",
                "token_url": f"{self.url}/token",
            }
        raise ValueError(f"unknown credentials kind {kind!r}")

    # ------------------------------------------------------------------ internals

    def _new_id(self) -> int:
        with self._lock:
            return self._rng.randrange(10**18, 2**63)

    def _new_seq(self) -> int:
        with self._lock:
            self._seq += 1
            return self._seq

    def _new_name(self, base: str) -> str:
        with self._lock:
            while True:
                name = f"{base}-" + "".join(self._rng.choice(_NAME_CHARS) for _ in range(4))
                if name not in self._names:
                    self._names.add(name)
                    return name

    def _new_vm(self, member: Member) -> None:
        """Give ``member`` a new VM: new id, address and creation time."""
        with self._lock:
            member.id = self._new_id()
            n = self._next_ip
            self._next_ip += 1
            member.network_ip = f"10.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}"
            member.creation_timestamp = _now()
            if member.instance_status is None:
                member.instance_status = "PROVISIONING"

    def _new_operation(self, group: FakeGroup, op_type: str) -> dict[str, Any]:
        now = _now()
        name = (
            f"operation-{int(time.time() * 1000)}-{secrets.token_hex(7)[:13]}"
            f"-{secrets.token_hex(4)}-{secrets.token_hex(4)}"
        )
        location = f"{API}/projects/{self.project}/{group.location}"
        op = compute_v1.Operation(
            kind="compute#operation",
            id=self._new_id(),
            name=name,
            operation_type=op_type,
            target_link=group.self_link,
            target_id=group.id,
            status=compute_v1.Operation.Status.RUNNING,
            user="fake-user@example.com",
            progress=0,
            insert_time=now,
            start_time=now,
            self_link=f"{location}/operations/{name}",
        )
        if group.zone:
            op.zone = location
        else:
            op.region = location
        data = _json(compute_v1.Operation, op)
        self._operations[(group.location, name)] = data
        if self.operations_start_done:
            _finish(data)
        return dict(data)

    # ------------------------------------------------------------------ request handling

    def handle(
        self, method: str, path: str, query: dict[str, str], body: Any, headers: Any
    ) -> tuple[int, dict[str, Any]]:
        """Answer one compute or token request (ApiError becomes an error body)."""
        if path == "/token":
            return self._token(body, headers)
        route = _route(method, path)
        if route is None:
            raise ApiError(404, f"Not Found: {method} {path}", "notFound")
        api, params = route
        self._check_auth(headers)
        with self._lock:
            return 200, self._dispatch(api, params, query, body)

    def _check_auth(self, headers: Any) -> None:
        if not self.require_auth:
            return
        auth = headers.get("Authorization") or ""
        token = auth[len("Bearer ") :] if auth.startswith("Bearer ") else None
        with self._lock:
            if token in self.tokens:
                return
        first = (
            "Request is missing required authentication credential."
            if token is None
            else "Request had invalid authentication credentials."
        )
        raise ApiError(
            401,
            f"{first} Expected OAuth 2 access token, login cookie or other valid "
            "authentication credential. See "
            "https://developers.google.com/identity/sign-in/web/devconsole-project.",
            "required" if token is None else "authError",
            location="Authorization",
            locationType="header",
        )

    def _token(self, form: Any, headers: Any) -> tuple[int, dict[str, Any]]:
        form = form if isinstance(form, dict) else {}
        client_id, client_secret = form.get("client_id"), form.get("client_secret")
        basic = headers.get("Authorization") or ""
        if basic.startswith("Basic "):  # how google.oauth2.sts sends the client
            decoded = base64.b64decode(basic[len("Basic ") :]).decode()
            client_id, _, client_secret = decoded.partition(":")
        if form.get("grant_type") != "refresh_token":
            return 400, {"error": "unsupported_grant_type", "error_description": "Bad grant"}
        if (client_id, client_secret) != (self.client_id, self.client_secret):
            return 401, {"error": "invalid_client", "error_description": "Unauthorized"}
        if form.get("refresh_token") != self.refresh_token:
            return 400, {"error": "invalid_grant", "error_description": "Bad Request"}
        token = "ya29.fake-" + secrets.token_urlsafe(24)
        with self._lock:
            self.tokens.add(token)
        return 200, {
            "access_token": token,
            "expires_in": 3599,
            "scope": "https://www.googleapis.com/auth/cloud-platform",
            "token_type": "Bearer",
        }

    def _check_location(self, params: dict[str, str]) -> None:
        project = params["project"]
        if project not in self.projects:
            raise not_found(f"projects/{project}")
        # The real API answers 400 "Invalid value for field 'zone'" (reason invalid) for a
        # zone or region that does not exist; a name of the real form counts as existing.
        zone, region = params.get("zone"), params.get("region")
        known_zones = {z for g in self.groups.values() for z in g.zones}
        if zone is not None and not (_ZONE_RE.match(zone) or zone in known_zones):
            raise invalid("zone", zone, "Unknown zone.")
        if region is not None and not _REGION_RE.match(region):
            raise invalid("region", region, "Unknown region.")

    def _check_permission(self, api: str, resource: str) -> None:
        permission = PERMISSIONS[api]
        if permission in self.denied:
            raise ApiError(403, f"Required '{permission}' permission for '{resource}'", "forbidden")

    def _dispatch(
        self, api: str, params: dict[str, str], query: dict[str, str], body: Any
    ) -> dict[str, Any]:
        if api.endswith("nstanceTemplates.get"):
            return self._get_template(api, params)
        self._check_location(params)
        project = params["project"]
        location = f"zones/{params['zone']}" if "zone" in params else f"regions/{params['region']}"
        if api == "instances.list":
            self._check_permission(api, f"projects/{project}")
            if project != self.project:  # groups live in the main project only
                return {"kind": "compute#instanceList"}
            return self._list_instances(params["zone"], query)
        if api == "instances.get":
            resource = f"projects/{project}/zones/{params['zone']}/instances/{params['instance']}"
            self._check_permission(api, resource)
            for group in self.groups.values():
                for m in group.members:
                    if (m.name, m.zone) == (params["instance"], params["zone"]) and m.has_vm:
                        return group.instance(m)
            raise not_found(resource)
        if api.endswith("Operations.get") or api.endswith("Operations.wait"):
            resource = f"projects/{project}/{location}/operations/{params['operation']}"
            self._check_permission(api, resource)
            op = self._operations.get((location, params["operation"]))
            if op is None or project != self.project:
                raise not_found(resource)
            _finish(op)  # the fake's operations are done by the first look
            return dict(op)
        resource = f"projects/{project}/{location}/instanceGroupManagers/{params['igm']}"
        self._check_permission(api, resource)
        group = self.groups.get((location, params["igm"]))
        if group is None or project != self.project:
            raise not_found(resource)
        method = api.split(".", 1)[1]
        if method == "get":
            return group.record()
        if method == "listManagedInstances":
            return self._list_managed(group, query)
        if method == "resize":
            size = _int_param(query, "size", None)
            if size is None:
                raise ApiError(400, "Required field 'size' not specified", "required")
            if size < 0:
                raise invalid("size", size, "Must be greater than or equal to 0")
            if size != group.target_size:
                group._resize(size)
            return self._new_operation(group, f"compute.{api}")
        if method == "recreateInstances":
            urls = body.get("instances", []) if isinstance(body, dict) else []
            group._recreate(urls)
            return self._new_operation(group, f"compute.{api}")
        if method == "deleteInstances":
            body = body if isinstance(body, dict) else {}
            group._delete_instances(
                body.get("instances", []), bool(body.get("skipInstancesOnValidationError"))
            )
            return self._new_operation(group, f"compute.{api}")
        if method == "listErrors":
            return self._list_errors(group, query)
        raise AssertionError(api)

    def _get_template(self, api: str, params: dict[str, str]) -> dict[str, Any]:
        project, name, region = params["project"], params["template"], params.get("region")
        where = f"regions/{region}" if region else "global"
        resource = f"projects/{project}/{where}/instanceTemplates/{name}"
        if project not in self.projects:
            raise not_found(f"projects/{project}")
        self._check_permission(api, resource)
        for group in self.groups.values():
            if (group.template_name, group.template_region, project) == (
                name,
                region,
                self.project,
            ):
                return group.template()
        raise not_found(resource)

    def _list_errors(self, group: FakeGroup, query: dict[str, str]) -> dict[str, Any]:
        """listErrors: "The filter and orderBy query parameters are not supported." The
        reference names no order: the group's ``errors_order`` decides."""
        if query.get("pageToken"):
            return self._next_page(query["pageToken"], query, "items")
        if query.get("filter") or query.get("orderBy"):
            raise invalid("filter", query.get("filter") or query.get("orderBy"), "Not supported.")
        items = list(group.errors)
        if group.errors_order == "newest":
            items.reverse()
        elif group.errors_order == "shuffled":
            self._rng.shuffle(items)
        return self._first_page(items, query, "items")

    def _list_managed(self, group: FakeGroup, query: dict[str, str]) -> dict[str, Any]:
        # "The orderBy query parameter is not supported" (listManagedInstances reference).
        if query.get("orderBy"):
            raise invalid("orderBy", query["orderBy"], "Not supported.")
        token = query.get("pageToken")
        paged = group.list_managed_instances_results == "PAGINATED"
        if paged and token:
            return self._next_page(token, query, "managedInstances")
        # Advance on a listing's first request only, so its pages show one consistent state.
        if group.auto_advance:
            group.advance()
        items = [group.managed_instance(m) for m in group.members]
        items = _filter_and_order(items, query)
        if not paged:
            _page_size(query)  # still validated
            return {"managedInstances": items} if items else {}
        return self._first_page(items, query, "managedInstances")

    def _list_instances(self, zone: str, query: dict[str, str]) -> dict[str, Any]:
        if query.get("pageToken"):
            page = self._next_page(query["pageToken"], query, "items")
        else:
            items = [
                group.instance(m)
                for group in self.groups.values()
                for m in sorted(group.members, key=lambda m: m.seq)
                if m.zone == zone and m.has_vm
            ]
            page = self._first_page(_filter_and_order(items, query), query, "items")
        base = f"{API}/projects/{self.project}/zones/{zone}/instances"
        return {"kind": "compute#instanceList", "id": base, "selfLink": base, **page}

    def _first_page(
        self, items: list[dict[str, Any]], query: dict[str, str], key: str
    ) -> dict[str, Any]:
        size = _page_size(query)
        page, rest = items[:size], items[size:]
        result: dict[str, Any] = {key: page} if page else {}
        if rest:
            # Later pages come from this snapshot, like the real API's consistent paging.
            token = secrets.token_urlsafe(16)
            self._pages[token] = rest
            result["nextPageToken"] = token
        return result

    def _next_page(self, token: str, query: dict[str, str], key: str) -> dict[str, Any]:
        items = self._pages.pop(token, None)
        if items is None:
            raise invalid("pageToken", token, "Invalid page token.")
        return self._first_page(items, query, key)


def _finish(op: dict[str, Any]) -> None:
    if op.get("status") != "DONE":
        op["status"] = "DONE"
        op["progress"] = 100
        op["endTime"] = _now()


def _int_param(query: dict[str, str], name: str, default: int | None) -> int | None:
    value = query.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError:
        raise invalid(name, value, "Must be an integer.") from None


def _page_size(query: dict[str, str]) -> int:
    size = _int_param(query, "maxResults", 0) or MAX_RESULTS
    if size < 0 or size > MAX_RESULTS:
        raise invalid("maxResults", size, f"Must be less than or equal to {MAX_RESULTS}")
    return size


_ROUTES: list[tuple[str, re.Pattern[str], str]] = []


def _add_route(method: str, template: str, api: str) -> None:
    pattern = re.sub(r"\{(\w+)\}", r"(?P<\1>[^/]+)", template)
    _ROUTES.append((method, re.compile(f"^/compute/v1/{pattern}$"), api))


for _scope, _prefix in (("zones/{zone}", ""), ("regions/{region}", "region")):
    _igm = f"projects/{{project}}/{_scope}/instanceGroupManagers/{{igm}}"
    _name = f"{_prefix}InstanceGroupManagers" if _prefix else "instanceGroupManagers"
    _add_route("GET", _igm, f"{_name}.get")
    for _verb in ("listManagedInstances", "resize", "recreateInstances", "deleteInstances"):
        _add_route("POST", f"{_igm}/{_verb}", f"{_name}.{_verb}")
    _add_route("GET", f"{_igm}/listErrors", f"{_name}.listErrors")
    _ops = f"{_prefix}Operations" if _prefix else "zoneOperations"
    _add_route("GET", f"projects/{{project}}/{_scope}/operations/{{operation}}", f"{_ops}.get")
    _add_route(
        "POST", f"projects/{{project}}/{_scope}/operations/{{operation}}/wait", f"{_ops}.wait"
    )
_add_route("GET", "projects/{project}/zones/{zone}/instances", "instances.list")
_add_route("GET", "projects/{project}/global/instanceTemplates/{template}", "instanceTemplates.get")
_add_route(
    "GET",
    "projects/{project}/regions/{region}/instanceTemplates/{template}",
    "regionInstanceTemplates.get",
)
# Only the benchmark's anchor script (a get per VM) uses it; spotring lists.
_add_route("GET", "projects/{project}/zones/{zone}/instances/{instance}", "instances.get")


def _route(method: str, path: str) -> tuple[str, dict[str, str]] | None:
    for m, pattern, api in _ROUTES:
        match = pattern.match(path)
        if match and m == method:
            return api, {k: unquote(v) for k, v in match.groupdict().items()}
    return None


def _api_name(method: str, path: str) -> str | None:
    if path == "/token":
        return "oauth2.token"
    route = _route(method, path)
    return route[0] if route else None


# ----------------------------------------------------------------------------- filters

_TOKEN_RE = re.compile(r'\s*(\(|\)|"(?:[^"\\]|\\.)*"|!=|=|[^\s()=!"]+)')


def _tokenize(text: str) -> list[str]:
    tokens, pos, text = [], 0, text.strip()
    while pos < len(text):
        match = _TOKEN_RE.match(text, pos)
        if not match:
            raise ValueError(text[pos:])
        tokens.append(match.group(1))
        pos = match.end()
        while pos < len(text) and text[pos].isspace():
            pos += 1
    return tokens


Predicate = Callable[[dict[str, Any]], bool]


def parse_filter(text: str) -> Predicate:
    """Compile a Compute Engine list filter (the subset the fake supports).

    ``field = value``, ``!=``, ``eq``/``ne`` (RE2 full match), values quoted or bare,
    dotted fields (``labels.role``, ``scheduling.provisioningModel``), parentheses,
    ``AND`` (or juxtaposition), ``OR`` and ``NOT``. Raises ValueError for anything else.
    """
    tokens = _tokenize(text)
    pos = 0

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take() -> str:
        nonlocal pos
        if pos >= len(tokens):
            raise ValueError("unexpected end")
        pos += 1
        return tokens[pos - 1]

    def disjunction() -> Predicate:
        terms = [conjunction()]
        while peek() == "OR":
            take()
            terms.append(conjunction())
        return terms[0] if len(terms) == 1 else lambda r: any(t(r) for t in terms)

    def conjunction() -> Predicate:
        terms = [term()]
        while peek() not in (None, ")", "OR"):
            if peek() == "AND":
                take()
            terms.append(term())
        return terms[0] if len(terms) == 1 else lambda r: all(t(r) for t in terms)

    def term() -> Predicate:
        token = take()
        if token == "(":
            inner = disjunction()
            if take() != ")":
                raise ValueError("missing )")
            return inner
        if token == "NOT":
            inner = term()
            return lambda r: not inner(r)
        if not re.fullmatch(r"[A-Za-z][\w.]*", token):
            raise ValueError(token)
        op, raw = take(), take()
        if op not in ("=", "!=", "eq", "ne") or raw in ("(", ")", "=", "!="):
            raise ValueError(op)
        value = json.loads(raw) if raw.startswith('"') else raw
        path = token.split(".")
        if op in ("eq", "ne"):
            regex = re.compile(value)
            positive = op == "eq"
            return lambda r: positive == bool(regex.fullmatch(_field_text(r, path)))
        positive = op == "="
        return lambda r: positive == (_field_text(r, path) == value)

    predicate = disjunction()
    if pos != len(tokens):
        raise ValueError(tokens[pos])
    return predicate


def _field_text(resource: dict[str, Any], path: list[str]) -> str:
    value: Any = resource
    for part in path:
        value = value.get(part) if isinstance(value, dict) else None
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def _filter_and_order(items: list[dict[str, Any]], query: dict[str, str]) -> list[dict[str, Any]]:
    text = query.get("filter")
    if text:
        try:
            predicate = parse_filter(text)
        except (ValueError, re.error):
            raise invalid("filter", text, "Invalid list filter expression.") from None
        items = [i for i in items if predicate(i)]
    order = (query.get("orderBy") or "").strip()
    # The real API sorts only by name or by creationTimestamp desc.
    if order == "name":
        items = sorted(items, key=lambda i: i.get("name", ""))
    elif order == "creationTimestamp desc":
        items = sorted(items, key=lambda i: i.get("creationTimestamp", ""), reverse=True)
    elif order:
        raise invalid("orderBy", order, "Unsupported order by field.")
    return items


# ----------------------------------------------------------------------------- HTTP


class _Handler(JsonHandler):
    """Compute calls under /compute/v1/, the token endpoint, and the control API.

    Control API (JSON in, JSON out):

    - ``GET /_fake/state``: every group with its members.
    - ``POST /_fake/groups``: add a group (a group spec of the state file).
    - ``GET|PATCH /_fake/groups/{g}``: read; set ``auto_advance``, ``auto_repair``,
      ``autoscaler``, ``target_size``, ``list_managed_instances_results``,
      ``termination_action``, ``errors_order``.
    - ``POST /_fake/groups/{g}/members``: add members: ``{"count": n}`` or ``add_member``
      keywords (``name``, ``zone``, ``current_action``, ``instance_status``, ...).
    - ``PATCH /_fake/groups/{g}/members/{m}``: ``set_member`` keywords.
    - ``DELETE /_fake/groups/{g}/members/{m}``: the VM is gone and the MIG recreates it
      (``?mode=delete_vm``, the default), ``?mode=preempt`` or ``?mode=remove`` (the
      member vanishes and the target size shrinks).
    - ``POST /_fake/groups/{g}/members/{m}/preempt``: spot preemption.
    - ``POST /_fake/groups/{g}/advance``: ``{"steps": n}``.
    - ``POST /_fake/groups/{g}/errors``: a listErrors item (``add_error`` keywords).
    - ``POST|DELETE /_fake/groups/{g}/capacity_error``: ``{"zone": z, "code": c}``;
      DELETE clears (``?zone=z`` for one zone).
    - ``POST /_fake/faults``: ``fail_next`` keywords (``count``, ``status``, ``match``,
      ``kind``, ``seconds``), or ``{"rate": p, "kinds": [...], "seed": s}``;
      ``DELETE /_fake/faults`` clears them.
    - ``POST /_fake/deny`` ``{"permissions": [...]}``; ``DELETE /_fake/deny`` allows all.
    - ``GET /_fake/requests`` (``?since=N``: from the Nth on); ``DELETE`` clears.
    - ``PATCH /_fake/config``: ``require_auth``, ``operations_start_done``.
    - ``GET /_fake/credentials``: the authorized_user credentials document.
    """

    content_type = "application/json; charset=UTF-8"

    def serve(self) -> None:
        fake: FakeCompute = self.server.owner
        split = urlsplit(self.path)
        path = split.path
        query = {k: v[0] for k, v in parse_qs(split.query, keep_blank_values=True).items()}
        body = self.read_body()
        if path.startswith("/_fake/"):
            try:
                status, answer = _control(fake, self.command, path, query, body)
            except KeyError as exc:
                status, answer = 404, {"error": f"not found: {exc}"}
            except (ValueError, TypeError) as exc:
                status, answer = 400, {"error": f"{type(exc).__name__}: {exc}"}
            self.send_json(status, answer)
            return
        record = RecordedRequest(
            method=self.command,
            path=path,
            query=query,
            body=body,
            api=_api_name(self.command, path),
            authorization=self.headers.get("Authorization"),
        )
        fake._record(record)
        fault = fake._take_fault(path) if path != "/token" else None
        if self.apply_fault(record, fault, _fault_answer):
            return
        try:
            status, answer = fake.handle(self.command, path, query, body, self.headers)
        except ApiError as error:
            status, answer = error.code, error.body()
        except Exception:  # a bug in the fake: answer, so the client does not hang
            traceback.print_exc()
            error = ApiError(500, "Internal error in the fake (see its stderr)", "backendError")
            status, answer = error.code, error.body()
        record.status = status
        self.send_json(status, answer)


FakeCompute.handler_class = _Handler


def _fault_answer(fault: Fault) -> tuple[int, Any, dict[str, str]]:
    error = fault_error(fault.status)
    return error.code, error.body(), {}


def _control(
    fake: FakeCompute, method: str, path: str, query: dict[str, str], body: Any
) -> tuple[int, Any]:
    """The control API (see :class:`_Handler`)."""
    body = body if isinstance(body, dict) else {}
    parts = [unquote(p) for p in path.split("/")[2:] if p]
    with fake._lock:
        if parts == ["state"] and method == "GET":
            return 200, {
                "project": fake.project,
                "groups": [g.to_dict() for g in fake.groups.values()],
            }
        if parts == ["groups"] and method == "POST":
            return 200, fake._group_from_spec(body).to_dict()
        if parts and parts[0] == "groups" and len(parts) >= 2:
            return _control_group(fake.group(parts[1]), method, parts[2:], query, body)
        if parts == ["faults"]:
            if method == "DELETE":
                fake.clear_faults()
            elif "rate" in body:
                fake.fail_rate(
                    float(body["rate"]),
                    body.get("kinds", [503]),
                    seed=body.get("seed"),
                    match=body.get("match"),
                    seconds=float(body.get("seconds", 30.0)),
                )
            else:
                fake.fail_next(**body)
            return 200, {}
        if parts == ["deny"]:
            if method == "DELETE":
                fake.allow()
            else:
                fake.deny(*body.get("permissions", []))
            return 200, {"denied": sorted(fake.denied)}
        if parts == ["requests"]:
            if method == "DELETE":
                fake.clear_requests()
                return 200, []
            since = int(query.get("since", 0))
            return 200, [r.to_dict() for r in fake.requests[since:]]
        if parts == ["config"] and method == "PATCH":
            for key in ("require_auth", "operations_start_done"):
                if key in body:
                    setattr(fake, key, bool(body[key]))
            return 200, {}
        if parts == ["credentials"] and method == "GET":
            return 200, fake.credentials_info(query.get("kind", "external_account_authorized_user"))
    return 404, {"error": f"no control endpoint {method} {path}"}


def _control_group(
    group: FakeGroup, method: str, rest: list[str], query: dict[str, str], body: dict[str, Any]
) -> tuple[int, Any]:
    if not rest:
        if method == "PATCH":
            for key in ("auto_advance", "auto_repair"):
                if key in body:
                    setattr(group, key, bool(body[key]))
            for key in (
                "autoscaler",
                "list_managed_instances_results",
                "termination_action",
                "errors_order",
            ):
                if key in body:
                    setattr(group, key, body[key])
            if "target_size" in body:
                group.target_size = int(body["target_size"])
        return 200, group.to_dict()
    if rest == ["members"] and method == "POST":
        count = int(body.pop("count", 1))
        added = [group.add_member(**body) for _ in range(count)]
        return 200, [m.to_dict() for m in added]
    if rest[0] == "members" and len(rest) >= 2:
        name = rest[1]
        if len(rest) == 3 and rest[2] == "preempt" and method == "POST":
            return 200, group.preempt(name).to_dict()
        if method == "PATCH":
            return 200, group.set_member(name, **body).to_dict()
        if method == "DELETE":
            mode = query.get("mode", "delete_vm")
            if mode == "remove":
                group.remove_member(name)
                return 200, {}
            if mode == "preempt":
                return 200, group.preempt(name).to_dict()
            if mode == "delete_vm":
                return 200, group.delete_vm(name).to_dict()
            raise ValueError(f"unknown mode {mode!r}")
        if method == "GET":
            return 200, group.member(name).to_dict()
    if rest == ["errors"] and method == "POST":
        return 200, group.add_error(**body)
    if rest == ["advance"] and method == "POST":
        group.advance(int(body.get("steps", 1)))
        return 200, group.to_dict()
    if rest == ["capacity_error"]:
        if method == "DELETE":
            group.clear_capacity_error(query.get("zone"))
        else:
            group.capacity_error(body["zone"], body.get("code", "ZONE_RESOURCE_POOL_EXHAUSTED"))
        return 200, group.to_dict()
    return 404, {"error": f"no control endpoint {method} {'/'.join(rest)}"}


def main(argv: list[str] | None = None) -> int:
    """Serve the fake until killed; print its URL on stdout's first line.

    ``--state FILE.json``::

        {"project": "test-project", "require_auth": false, "denied": [],
         "operations_start_done": false,
         "groups": [
           {"name": "workers", "zone": "us-central1-a", "size": 3,
            "provisioning_model": "SPOT", "accelerators": 1, "labels": {"role": "w"},
            "autoscaler": null, "auto_advance": true,
            "list_managed_instances_results": "PAGELESS"},
           {"name": "rworkers", "region": "us-central1",
            "zones": ["us-central1-a", "us-central1-b"],
            "members": [{"name": "rworkers-abcd", "zone": "us-central1-b",
                         "current_action": "CREATING", "instance_status": null}],
            "target_size": 2}]}

    Group keys are ``add_group``'s keywords plus ``members`` (``add_member`` keywords;
    replaces ``size``), ``target_size``, ``auto_advance``, ``auto_repair`` and
    ``capacity_errors`` (``{zone: code}``).
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--state", type=Path, help="JSON state file")
    parser.add_argument("--project", default="test-project")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--require-auth", action="store_true")
    parser.add_argument("--credentials", type=Path, help="write authorized_user JSON here")
    args = parser.parse_args(argv)
    fake = FakeCompute(args.project, seed=args.seed)
    if args.state:
        fake.load_state(json.loads(args.state.read_text()))
    if args.require_auth:
        fake.require_auth = True
    fake.start(args.port)
    if args.credentials:
        fake.write_credentials(args.credentials)
    print(fake.url, flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        fake.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
