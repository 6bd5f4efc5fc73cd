"""The ``gcp`` provider: Compute Engine managed instance groups (MIGs), zonal or regional.

A job spans one group or several, in order of preference (``--group`` given more than
once; ``ZONE/NAME`` or ``REGION/NAME`` places a group outside ``--zone``/``--region``):
one provider object per group, sharing the clients and credentials.

spotring lists the group's members with ``listManagedInstances`` (the group's action on
each member, the VM's status, health, the last creation attempt's errors), then, for
members not seen running before, the VMs themselves with one filtered
``instances.list`` per zone (address, machine type, SPOT or preemptible, accelerators,
labels). It steers the group with ``resize``, replaces a failed host with
``recreateInstances`` (same name, new VM, group size unchanged) and hands a host back
with ``deleteInstances`` (the group's target size drops by one).

For the capacity policy it reads what the group launches from its instance template
(``instanceTemplates.get``, once per template) and why members cannot be created from
the members' ``lastAttempt.errors`` (already in the listing) or, when no member shows
one, ``listErrors`` (every page, up to a bound: the errors come in no documented order).

A member whose row or VM lacks what the API always sends (a state, a running VM's IPv4
address, as an IPv6-only VM has none) is listed as not usable, with one warning while
it stays so; only an answer broken as a whole fails a listing.

A steady group costs one call per refresh. google-cloud-compute is imported on first
use, so importing this module costs nothing without the ``gcp`` extra.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spotring.core.hooks import hookimpl
from spotring.providers.base import (
    CapacityShortage,
    ConfigurationError,
    CoreOptions,
    Instance,
    InstanceState,
    Lifecycle,
    Provider,
    ProviderError,
    ShortageCause,
)
from spotring.providers.cloud import (
    CloudGroupProvider,
    DescribeOnce,
    EpisodeWarnings,
    MalformedAnswer,
    batches,
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

PERMISSION_BY_CALL: Mapping[str, str] = {
    "instanceGroupManagers.get": "compute.instanceGroupManagers.get",
    "instanceGroupManagers.listManagedInstances": "compute.instanceGroupManagers.get",
    "instanceGroupManagers.resize": "compute.instanceGroupManagers.update",
    "instanceGroupManagers.recreateInstances": "compute.instanceGroupManagers.update",
    # Both on the group: see the methods' REST reference pages ("Authorization requires
    # the following IAM permission on the specified resource instanceGroupManager").
    "instanceGroupManagers.deleteInstances": "compute.instanceGroupManagers.update",
    "instanceGroupManagers.listErrors": "compute.instanceGroupManagers.get",
    "instances.list": "compute.instances.list",
    # Global and regional templates alike (instanceTemplates.get and
    # regionInstanceTemplates.get reference pages).
    "instanceTemplates.get": "compute.instanceTemplates.get",
}
"""The IAM permission each API call the provider makes needs, by the call's name in
errors (regional groups: the same calls of regionInstanceGroupManagers and
regionInstanceTemplates). The README's table is made from it
(:mod:`spotring.providers.permissions`)."""

IAM_PERMISSIONS: tuple[str, ...] = tuple(dict.fromkeys(PERMISSION_BY_CALL.values()))
"""Every IAM permission the provider needs; a custom role holding exactly these is
enough (terraform/gcp grants them to the driver's service account)."""

PAGE_SIZE = 500
"""Members per listManagedInstances page (the API's maximum)."""

NAMES_PER_LIST = 100
"""VM names per filtered instances.list call: keeps the filter, which travels in the
URL, a few kilobytes long."""

CALL_TIMEOUT = 20.0
"""Seconds one API call may take before it is retried: a stuck call must not hold the
controller thread for the library's 600 s default."""

# Our own retries (counted, bounded by --max-api-attempts) replace the library's: it
# retries some calls (get, instances.list) on 503 for up to 600 s, others not at all.
_CALL_OPTIONS: Mapping[str, Any] = {"timeout": CALL_TIMEOUT, "retry": None}

SHORTAGE_CAUSES: Mapping[str, ShortageCause] = {
    # "Troubleshooting resource availability errors"
    # (https://cloud.google.com/compute/docs/troubleshooting/troubleshooting-resource-availability):
    # the zone cannot accommodate the request now; unrelated to quota.
    "ZONE_RESOURCE_POOL_EXHAUSTED": ShortageCause.CAPACITY,
    "ZONE_RESOURCE_POOL_EXHAUSTED_WITH_DETAILS": ShortageCause.CAPACITY,
    # Resource quotas (https://cloud.google.com/compute/resource-usage): a project or
    # region limit, e.g. "Quota 'PREEMPTIBLE_CPUS' exceeded. Limit: 0.0 in region R."
    "QUOTA_EXCEEDED": ShortageCause.QUOTA,
}
"""Compute Engine's error codes for a VM the group could not create -> the cause. Any
other code (a bad template, a missing image, ...) is :attr:`ShortageCause.OTHER`."""

CAPACITY_ERRORS = frozenset(SHORTAGE_CAUSES)
"""lastAttempt error codes that mean the group cannot get VMs in a zone right now."""

LAUNCH_ACTIONS = frozenset(
    {"CREATING", "CREATING_WITHOUT_RETRIES", "RECREATING", "STARTING", "RESUMING"}
)
"""listErrors ``instanceActionDetails.action`` values of an attempt to get a VM running:
an error of another action (deleting, abandoning, refreshing) is no shortage."""

ERRORS_PAGE_SIZE = 500
"""listErrors items per page, the API's maximum ("Acceptable values are 0 to 500")."""

ERRORS_PAGES = 10
"""At most this many listErrors pages per shortage check. The reference gives the
errors no order (and refuses ``orderBy``), so the newest since a time may be on any
page: every page is read, up to this bound (5,000 errors)."""


def shortage_cause(code: str) -> ShortageCause:
    """The :class:`ShortageCause` of a Compute Engine error code (see
    :data:`SHORTAGE_CAUSES`); codes Google adds later that say so are read by name."""
    cause = SHORTAGE_CAUSES.get(code)
    if cause is not None:
        return cause
    if "RESOURCE_POOL_EXHAUSTED" in code:
        return ShortageCause.CAPACITY
    if "QUOTA" in code:
        return ShortageCause.QUOTA
    return ShortageCause.OTHER


_RETRYABLE_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_RATE_LIMIT_REASONS = frozenset({"rateLimitExceeded", "userRateLimitExceeded"})

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

# ------------------------------------------------------------------- state maps

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
    NONE (its VM was deleted behind the group's back: see the field table above); one
    whose VM instances.list no longer returns is GONE. Unknown strings count as PENDING."""
    if not instance_status:
        if current_action == "NONE":
            return InstanceState.GONE
        return worst_state(InstanceState.PENDING, lookup_state(CURRENT_ACTION_MAP, current_action))
    if not vm_found:
        return InstanceState.GONE
    return worst_state(*_views(current_action, instance_status, health))


def _views(current_action: str, instance_status: str, health: Sequence[str]) -> list[InstanceState]:
    """What the group's action, the VM's status and its health each say of a member."""
    return [
        lookup_state(CURRENT_ACTION_MAP, current_action),
        lookup_state(INSTANCE_STATUS_MAP, instance_status),
        *(lookup_state(HEALTH_STATE_MAP, state) for state in health),
    ]


# ------------------------------------------------------------------ the group's view


@dataclass(frozen=True)
class _Member:
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
class _Vm:
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
    def of(cls, vm: Any) -> _Vm:
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
            machine_type=_last_segment(raw.machine_type),
            launch_time=_timestamp(raw.creation_timestamp),
            labels=dict(raw.labels),
            problem=problem,
        )


_ZONE_IN_URL = re.compile(r"/zones/([^/]+)/instances/([^/]+)$")
_TEMPLATE_URL = re.compile(
    r"(?:^|/)projects/([^/]+)/(?:global|regions/([^/]+))/instanceTemplates/([^/]+)$"
)

# A zone is a region and a letter (us-central1-a); a region ends in its number.
_ZONE_FORM = re.compile(r"[a-z][-a-z0-9]*[0-9]-[a-z]")
_REGION_FORM = re.compile(r"[a-z][-a-z0-9]*[0-9]")
_GROUP_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")  # RFC 1035, as Compute names


@dataclass(frozen=True)
class GroupSpec:
    """One ``--group`` value: the MIG's name and its zone or region."""

    name: str
    zone: str | None
    region: str | None

    @property
    def location(self) -> str:
        """The zone or the region."""
        return self.zone or self.region or ""


def parse_group(text: str, zone: str | None, region: str | None) -> GroupSpec:
    """``NAME`` (in ``--zone``/``--region``), ``ZONE/NAME`` (a zonal group) or
    ``REGION/NAME`` (a regional one); a zone is told from a region by its form (it ends
    in ``-`` and a letter). Raises :class:`ConfigurationError`."""
    where, _, name = text.rpartition("/")
    if not _GROUP_NAME.fullmatch(name) or where.count("/"):
        raise ConfigurationError(
            f"--group {text!r}: expected NAME, ZONE/NAME or REGION/NAME"
            " (a group name is lowercase letters, digits and hyphens)"
        )
    if not where:
        if bool(zone) == bool(region):
            raise ConfigurationError(
                f"--group {name}: give exactly one of --zone (zonal group) or --region,"
                " or write it as ZONE/NAME or REGION/NAME"
            )
        return GroupSpec(name, zone, region)
    if _ZONE_FORM.fullmatch(where):
        return GroupSpec(name, where, None)
    if _REGION_FORM.fullmatch(where):
        return GroupSpec(name, None, where)
    raise ConfigurationError(
        f"--group {text!r}: {where!r} is neither a zone (us-central1-a) nor a region (us-central1)"
    )


def group_specs(
    texts: str | Sequence[str] | None, zone: str | None, region: str | None
) -> list[tuple[GroupSpec, str]]:
    """Every ``--group`` value parsed, in order, with its :meth:`GcpProvider.group_name`:
    the name alone where no other group has it, else ``LOCATION/NAME``. Raises
    :class:`ConfigurationError` for none, a malformed one or one given twice."""
    values = [texts] if isinstance(texts, str) else list(texts or ())
    if not values or not all(values):
        raise ConfigurationError("--group is required for --provider gcp")
    specs = [parse_group(text, zone, region) for text in values]
    labels = group_labels([(spec.location, spec.name) for spec in specs])
    return list(zip(specs, labels, strict=True))


class _Clients:
    """The REST clients, made on first use and shared by the groups of one job."""

    def __init__(self, compute: Any, credentials: Any, endpoint: str | None) -> None:
        from google.api_core.client_options import ClientOptions

        self.compute = compute
        self.credentials = credentials
        self._options = ClientOptions(api_endpoint=endpoint.rstrip("/")) if endpoint else None
        self._made: dict[str, Any] = {}

    def get(self, kind: str) -> Any:
        """The client called ``kind`` in google-cloud-compute (e.g. InstancesClient)."""
        if kind not in self._made:
            self._made[kind] = getattr(self.compute, kind)(
                transport="rest", credentials=self.credentials, client_options=self._options
            )
        return self._made[kind]

    def close(self) -> None:
        """Close every client's HTTP session (once, whichever group asks first)."""
        made, self._made = self._made, {}
        for client in made.values():
            client.transport.close()


def _last_segment(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


# ------------------------------------------------------------------------ provider


class GcpProvider(CloudGroupProvider):
    """A Compute Engine managed instance group, listed and steered through the REST API.

    :attr:`api_calls` counts requests (each page and each retry), :attr:`api_retries`
    the repeated ones, :attr:`last_refresh_calls` those of the last listing.
    """

    name = "gcp"
    description = (
        "Compute Engine managed instance groups (--group [ZONE/|REGION/]NAME, repeatable;"
        " --zone Z | --region R)"
    )
    can_remove = True
    sdk_modules = ("google.cloud.compute_v1", "google.auth")
    sdk_extra = "spotring[gcp]"
    needs_credentials = True

    def __init__(
        self,
        group: str,
        *,
        zone: str | None = None,
        region: str | None = None,
        project: str | None = None,
        endpoint: str | None = None,
        credentials: Any | None = None,
        resize_disabled_by_user: bool = False,
        label: str | None = None,
        clients: _Clients | None = None,
        **common: Any,
    ) -> None:
        """Make the clients; no API call. See :meth:`add_arguments` for the options.

        :param credentials: google-auth credentials; by default Application Default
            Credentials (GOOGLE_APPLICATION_CREDENTIALS, gcloud's login, or the VM's
            service account).
        :param resize_disabled_by_user: ``--no-resize`` was given, so an attached
            autoscaler needs no warning.
        :param label: :meth:`group_name` (default: the group's name).
        :param clients: another group's clients, to share (its credentials too).
        """
        if not group:
            raise ConfigurationError("--group is required for --provider gcp")
        if bool(zone) == bool(region):
            raise ConfigurationError(
                "--provider gcp needs exactly one of --zone (zonal group) or --region"
            )
        super().__init__(**common)
        self.group = group
        self.zone = zone
        self.region = region
        self._resize_disabled_by_user = resize_disabled_by_user
        self._record: Any | None = None  # the InstanceGroupManager, from the last get
        self._autoscaler: str | None = None
        self._members: dict[str, _Member] = {}
        self._capacity = EpisodeWarnings(log)
        self._vms: DescribeOnce[tuple[str, str, int | None], _Vm] = DescribeOnce(
            self._describe_vms, lambda vm: vm.final
        )
        self._odd = EpisodeWarnings(log)  # members listed as not usable for what they lack
        self._label = label or group
        self._listed_at: float | None = None  # when the last listing was read
        self._template_lifecycles: dict[str, Lifecycle] = {}  # template URL -> lifecycle
        self._lifecycle_warned = False
        found_project = None
        if clients is None:
            compute, credentials, found_project = _load_library(credentials, bool(project))
        self.project: str = project or found_project or ""
        if not self.project:
            raise ConfigurationError(
                "no Google Cloud project: pass --project or set GOOGLE_CLOUD_PROJECT"
            )
        self.endpoint = endpoint
        if clients is None:
            if endpoint:
                check_endpoint(endpoint)
            clients = _Clients(compute, credentials, endpoint)
        self._clients = clients
        self._compute = clients.compute
        self._groups = clients.get(
            "InstanceGroupManagersClient" if zone else "RegionInstanceGroupManagersClient"
        )
        self._instances = clients.get("InstancesClient")

    # ----------------------------------------------------------------- options

    @classmethod
    def add_arguments(cls, group: argparse._ArgumentGroup) -> None:
        """Add ``--group``, ``--zone``/``--region``, ``--project`` and the shared options."""
        group.add_argument(
            "--group",
            dest="gcp_group",
            action="append",
            metavar="[ZONE/|REGION/]NAME",
            help="managed instance group (required); give it more than once for a job that"
            " spans several groups, in order of preference. NAME is in --zone or --region;"
            " ZONE/NAME is a zonal group, REGION/NAME a regional one",
        )
        where = group.add_mutually_exclusive_group()
        where.add_argument(
            "--zone", dest="gcp_zone", metavar="ZONE", help="the zone of each zonal --group NAME"
        )
        where.add_argument(
            "--region",
            dest="gcp_region",
            metavar="REGION",
            help="the region of each regional --group NAME",
        )
        group.add_argument(
            "--project",
            dest="gcp_project",
            metavar="PROJECT",
            help="project id (default: GOOGLE_CLOUD_PROJECT or the credentials' project)",
        )
        group.add_argument(
            "--endpoint",
            dest="gcp_endpoint",
            metavar="URL",
            help="send Compute Engine calls here (a test server or private endpoint)",
        )
        cls.add_common_arguments(group, "gcp")

    @classmethod
    def credential_source(cls) -> str | None:
        """Where Application Default Credentials would come from: the file named by
        GOOGLE_APPLICATION_CREDENTIALS, gcloud's login, or this VM's service account."""
        path = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
        if path:
            return "found (GOOGLE_APPLICATION_CREDENTIALS)" if Path(path).is_file() else None
        if (Path.home() / ".config" / "gcloud" / "application_default_credentials.json").is_file():
            return "found (gcloud auth application-default login)"
        product = Path("/sys/class/dmi/id/product_name")
        if product.is_file() and "Google" in product.read_text(errors="replace"):
            return "found (this VM's service account)"
        return None

    @classmethod
    def from_options(cls, options: argparse.Namespace, core: CoreOptions) -> GcpProvider:
        """Make the provider of the one ``--group`` given; makes no API call.

        Raises :class:`ConfigurationError` without ``--group`` or with several (see
        :meth:`groups_from_options`), without a zone or region, without a project, or
        without credentials.
        """
        specs = cls._specs(options)
        if len(specs) > 1:
            raise ConfigurationError(
                f"--group is given {len(specs)} times: this command takes one group"
            )
        return cls._from_spec(*specs[0], options, core)

    @classmethod
    def groups_from_options(cls, options: argparse.Namespace, core: CoreOptions) -> list[Provider]:
        """One provider per ``--group``, in the order given, sharing one set of clients
        and credentials; makes no API call. Raises :class:`ConfigurationError` as
        :meth:`from_options` does, and for a group given twice."""
        specs = cls._specs(options)
        first = cls._from_spec(*specs[0], options, core)
        made: list[Provider] = [first]
        for spec, label in specs[1:]:
            made.append(cls._from_spec(spec, label, options, core, first))
        return made

    @classmethod
    def _specs(cls, options: argparse.Namespace) -> list[tuple[GroupSpec, str]]:
        return group_specs(
            getattr(options, "gcp_group", None),
            getattr(options, "gcp_zone", None),
            getattr(options, "gcp_region", None),
        )

    @classmethod
    def _from_spec(
        cls,
        spec: GroupSpec,
        label: str,
        options: argparse.Namespace,
        core: CoreOptions,
        sharing: GcpProvider | None = None,
    ) -> GcpProvider:
        return cls(
            spec.name,
            zone=spec.zone,
            region=spec.region,
            project=sharing.project if sharing else getattr(options, "gcp_project", None),
            endpoint=getattr(options, "gcp_endpoint", None),
            # `run`'s --no-resize (`discover` has none: it never resizes anyway).
            resize_disabled_by_user=not core.resize,
            label=label,
            clients=sharing._clients if sharing else None,
            **cls.common_options(options, core, "gcp"),
        )

    def group_name(self) -> str:
        """The group's name, or ``LOCATION/NAME`` where another group of the job has the
        same name in another zone or region."""
        return self._label

    # ------------------------------------------------------------------ listing

    def list_members(self) -> list[Instance]:
        """Every member of the group with the group's action, the VM's status and its
        health combined.

        Costs one listManagedInstances call per 500 members; for members not seen
        running before, one filtered instances.list per zone (per 100 names); and on
        the first refresh one get of the group (its autoscaler, its target size).
        """
        if self._record is None:
            self._get_group()
        assert self._record is not None  # _get_group() sets it
        members = self._list_managed()
        # An empty page looks just like an empty group; a group that wants members lists
        # them (CREATING) at once, so no members and a target size is a broken answer.
        if not members and self._record.target_size and self._get_group().target_size:
            raise MalformedAnswer(
                "instanceGroupManagers.listManagedInstances",
                f"no members, but the group's target size is {self._record.target_size}",
            )
        self._members = {m.name: m for m in members}
        self._listed_at = time.time()
        self._warn_about_capacity(members)
        vms = self._vms.get([m.key for m in members if m.vm_id is not None and not m.problem])
        instances = [self._to_instance(m, vms.get(m.key)) for m in members]
        self._warn_about_odd_members(members, vms, instances)
        return instances

    def _to_instance(self, member: _Member, vm: _Vm | None) -> Instance:
        if member.problem:  # not usable, and no VM asked for: what its fields say, or PENDING
            state = worst_state(
                InstanceState.PENDING,
                *_views(member.current_action, member.instance_status, member.health),
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
                slots=self.slots.slots(member.name, {}, None),
                zone=member.zone,
                cloud_state=self._cloud_state(member),
            )
        return Instance(
            id=member.name,
            address=vm.address,
            state=worst_state(state, InstanceState.PENDING) if vm.problem else state,
            slots=self.slots.slots(member.name, vm.labels, vm.accelerators),
            lifecycle=Lifecycle.SPOT if vm.spot else Lifecycle.ON_DEMAND,
            zone=member.zone,
            instance_type=vm.machine_type,
            launch_time=vm.launch_time,
            cloud_state=self._cloud_state(member),
            labels=vm.labels,
        )

    def _warn_about_odd_members(
        self,
        members: Sequence[_Member],
        vms: Mapping[tuple[str, str, int | None], _Vm],
        instances: Sequence[Instance],
    ) -> None:
        """Warn once per member while it is listed as not usable for what it lacks."""
        odd: dict[str, str] = {}
        for member, instance in zip(members, instances, strict=True):
            vm = vms.get(member.key)
            problem = member.problem or (vm.problem if vm is not None else "")
            if problem:
                odd[f"gcp: group {self.group} member {member.name}"] = (
                    f"gcp: group {self.group}: member {member.name} is listed as"
                    f" {instance.state.value}, not usable: {problem}"
                )
        self._odd.update(odd)

    @staticmethod
    def _cloud_state(member: _Member) -> str:
        health = ",".join(member.health) or "-"
        return f"{member.current_action or '-'}/{member.instance_status or '-'}/{health}"

    def _list_managed(self) -> list[_Member]:
        compute = self._compute
        if self.zone:
            request: Any = compute.ListManagedInstancesInstanceGroupManagersRequest(
                project=self.project, zone=self.zone, instance_group_manager=self.group
            )
        else:
            request = compute.ListManagedInstancesRegionInstanceGroupManagersRequest(
                project=self.project, region=self.region, instance_group_manager=self.group
            )
        request.max_results = PAGE_SIZE
        members: list[_Member] = []
        token = ""
        while True:
            request.page_token = token
            page, token = self.call_api(
                "instanceGroupManagers.listManagedInstances",
                lambda: self._read_members(
                    self._groups.list_managed_instances(request=request, **_CALL_OPTIONS)
                ),
            )
            members.extend(page)
            if not token:
                return members

    def _read_members(self, page: Any) -> tuple[list[_Member], str]:
        return [self._member(m) for m in page.managed_instances], page.next_page_token

    def _member(self, managed: Any) -> _Member:
        """A row of listManagedInstances (see the field table at the top of the module);
        raises :class:`MalformedAnswer` for one that names no member."""
        # The raw protobuf: proto-plus attribute access costs ~10x more, and a
        # 1,000-member group is read on every refresh.
        raw = type(managed).pb(managed)
        found = _ZONE_IN_URL.search(raw.instance)
        zone, name = found.groups() if found else (self.zone or "", raw.name)
        if not name:
            raise MalformedAnswer(
                "instanceGroupManagers.listManagedInstances", "a member without its name"
            )
        return _Member(
            name=name,
            zone=zone,
            vm_id=raw.id if raw.HasField("id") else None,
            current_action=raw.current_action,
            instance_status=raw.instance_status,
            health=tuple(h.detailed_health_state for h in raw.instance_health),
            errors=tuple((e.code, e.message) for e in raw.last_attempt.errors.errors),
            problem=_missing_field(raw, zone),
        )

    def _describe_vms(
        self, keys: Sequence[tuple[str, str, int | None]]
    ) -> dict[tuple[str, str, int | None], _Vm]:
        """The VMs behind ``keys``: one filtered instances.list per zone and 100 names."""
        by_zone: dict[str, list[str]] = {}
        for zone, name, _ in keys:
            by_zone.setdefault(zone, []).append(name)
        found: dict[tuple[str, str, int | None], _Vm] = {}
        for zone, names in sorted(by_zone.items()):
            for batch in batches(sorted(names), NAMES_PER_LIST):
                vms = self._list_vms(zone, batch)
                # One VM may have gone since the group was listed (it is GONE); all of
                # them at once is an answer without its items.
                if not vms:
                    raise MalformedAnswer(
                        "instances.list", f"none of the {len(batch)} VMs the group lists"
                    )
                for vm in vms:
                    found[(zone, vm.name, vm.vm_id)] = vm
        return found

    def _list_vms(self, zone: str, names: Sequence[str]) -> list[_Vm]:
        request = self._compute.ListInstancesRequest(
            project=self.project,
            zone=zone,
            filter=" OR ".join(f'(name = "{name}")' for name in names),
            max_results=PAGE_SIZE,
        )
        vms: list[_Vm] = []
        token = ""
        while True:
            request.page_token = token
            page, token = self.call_api(
                "instances.list",
                lambda: _read_vms(self._instances.list(request=request, **_CALL_OPTIONS)),
            )
            vms.extend(page)
            if not token:
                return vms

    def _warn_about_capacity(self, members: Sequence[_Member]) -> None:
        """Warn once per zone and error while members cannot be created there."""
        conditions: dict[str, str] = {}
        for member in members:
            for code, message in member.errors if _failing(member) else ():
                if code in CAPACITY_ERRORS:
                    # A member never created may not name its zone yet (no instance URL).
                    where = f"zone {member.zone}" if member.zone else self.location
                    conditions.setdefault(
                        f"gcp: {where} {code}",
                        f"gcp: group {self.group} cannot create VMs in {where}:"
                        f" {code}: {one_line(message, 160)}",
                    )
        self._capacity.update(conditions)

    # ---------------------------------------------------------------- capacity

    def group_lifecycle(self) -> Lifecycle | None:
        """SPOT when the group's instance template asks for spot VMs
        (``properties.scheduling.provisioningModel`` SPOT, or ``preemptible``), else
        ON_DEMAND; None when its versions' templates disagree, or the template cannot
        be read for good (warned once: the controller then goes by the members).

        Costs one get of the group if none was read yet, and one get per template
        not seen before: a template never changes (a new one replaces it).
        """
        record = self._record if self._record is not None else self._get_group()
        # versions[] "overrides the top-level instanceTemplate field" (InstanceGroupManager).
        urls = {v.instance_template for v in record.versions if v.instance_template}
        if not urls and record.instance_template:
            urls = {record.instance_template}
        if not urls:
            return None
        try:
            found = {self._template_lifecycle(url) for url in sorted(urls)}
        except ProviderError as error:
            if error.retryable:
                raise
            if not self._lifecycle_warned:
                self._lifecycle_warned = True
                log.warning(
                    "gcp: group %s: cannot read its instance template (%s); spot or"
                    " on-demand is judged by its members",
                    self.group,
                    error,
                )
            return None
        return found.pop() if len(found) == 1 else None

    def _template_lifecycle(self, url: str) -> Lifecycle:
        if url in self._template_lifecycles:
            return self._template_lifecycles[url]
        parsed = _TEMPLATE_URL.search(url)
        if parsed is None:
            raise MalformedAnswer("instanceGroupManagers.get", f"instance template URL {url!r}")
        project, region, name = parsed.groups()
        if region:
            client = self._clients.get("RegionInstanceTemplatesClient")
            where: dict[str, str] = {"region": region}
        else:
            client = self._clients.get("InstanceTemplatesClient")
            where = {}

        def get() -> Lifecycle:
            template = client.get(project=project, instance_template=name, **where, **_CALL_OPTIONS)
            # Every Scheduling field is optional: none set is a STANDARD VM.
            scheduling = template.properties.scheduling
            spot = scheduling.provisioning_model == "SPOT" or scheduling.preemptible
            return Lifecycle.SPOT if spot else Lifecycle.ON_DEMAND

        lifecycle = self.call_api("instanceTemplates.get", get)
        self._template_lifecycles[url] = lifecycle
        return lifecycle

    def capacity_shortage(self, since: float) -> CapacityShortage | None:
        """Why the group could not create members lately, or None.

        First the members of the last listing (if read at or after ``since``) whose VM
        does not exist, by their ``lastAttempt.errors``: no call. Else ``listErrors``
        (https://cloud.google.com/compute/docs/reference/rest/v1/instanceGroupManagers/listErrors),
        every page up to :data:`ERRORS_PAGES`, in whatever order it lists them: the
        newest error of a creating, recreating, starting or resuming action whose
        ``timestamp`` is at or after ``since``. Capacity and quota codes are preferred
        to others among a listing's errors. Reads only.
        """
        if self._listed_at is not None and self._listed_at >= since:
            found = [
                (code, message)
                for member in self._members.values()
                if _failing(member)
                for code, message in member.errors
            ]
            if found:
                code, message = min(
                    found, key=lambda e: shortage_cause(e[0]) is ShortageCause.OTHER
                )
                return CapacityShortage(
                    shortage_cause(code), code, one_line(message), self._listed_at
                )
        return self._listed_error(since)

    def _listed_error(self, since: float) -> CapacityShortage | None:
        compute = self._compute
        if self.zone:
            request: Any = compute.ListErrorsInstanceGroupManagersRequest(
                project=self.project, zone=self.zone, instance_group_manager=self.group
            )
        else:
            request = compute.ListErrorsRegionInstanceGroupManagersRequest(
                project=self.project, region=self.region, instance_group_manager=self.group
            )
        request.max_results = ERRORS_PAGE_SIZE
        newest: CapacityShortage | None = None
        token = ""
        for _ in range(ERRORS_PAGES):
            request.page_token = token
            # The pager answers attributes from its first page: one page per call.
            items, token = self.call_api(
                "instanceGroupManagers.listErrors",
                lambda: _page(self._groups.list_errors(request=request, **_CALL_OPTIONS)),
            )
            for item in items:
                found = _launch_error(item, since)
                if found is not None and (newest is None or (found.at or 0.0) > (newest.at or 0.0)):
                    newest = found
            if not token:
                return newest
        log.debug(
            "gcp: group %s: read the first %d listErrors pages only", self.group, ERRORS_PAGES
        )
        return newest

    # ------------------------------------------------------------------ the group

    def _get_group(self) -> Any:
        """Get the group's record: target size and any autoscaler attached to it."""
        where: dict[str, str | None] = {"zone": self.zone} if self.zone else {"region": self.region}

        def get() -> Any:
            found = self._groups.get(
                project=self.project, instance_group_manager=self.group, **_CALL_OPTIONS, **where
            )
            # Its target size decides whether an empty listing can be true (see
            # list_members): not from a record without it, or not the group's.
            if found.name != self.group or "target_size" not in found:
                raise MalformedAnswer(
                    "instanceGroupManagers.get", "the group's record without its name or size"
                )
            return found

        record = self.call_api("instanceGroupManagers.get", get)
        autoscaler = record.status.autoscaler if "status" in record else ""
        if autoscaler and not self._autoscaler:
            self.can_resize = False
            level = logging.INFO if self._resize_disabled_by_user else logging.WARNING
            log.log(
                level,
                "gcp: group %s is sized by autoscaler %s: spotring will not resize it"
                " (pass --no-resize to say so), but still recreates failed hosts",
                self.group,
                _last_segment(autoscaler),
            )
        self._autoscaler = autoscaler or None
        self.can_resize = self._autoscaler is None
        self._record = record
        return record

    def _target_size(self) -> int:
        """The group's target size, asked afresh only when the members listed do not add
        up to the one remembered (someone else resized it, or it was never asked)."""
        live = sum(1 for m in self._members.values() if not m.leaving)
        if self._record is None or self._record.target_size != live:
            self._get_group()
        assert self._record is not None  # _get_group() sets it
        return int(self._record.target_size)

    # ----------------------------------------------------------------- steering

    def set_target_size(self, size: int) -> None:
        """``resize`` the group to ``size``; no call when it already wants ``size``.

        Raises :class:`ConfigurationError` when an autoscaler sizes the group.
        """
        if size < 0:
            raise ConfigurationError(f"target size {size} is negative")
        current = self._target_size()
        if self._autoscaler:
            raise ConfigurationError(
                f"gcp: group {self.group} is sized by autoscaler"
                f" {_last_segment(self._autoscaler)}: detach it, or run with --no-resize"
            )
        if current == size:
            return
        where: dict[str, str | None] = {"zone": self.zone} if self.zone else {"region": self.region}
        self.call_api(
            "instanceGroupManagers.resize",
            lambda: self._groups.resize(
                project=self.project,
                instance_group_manager=self.group,
                size=size,
                **_CALL_OPTIONS,
                **where,
            ),
        )
        assert self._record is not None
        self._record.target_size = size
        log.info("gcp: group %s target size -> %d", self.group, size)

    def replace_instance(self, instance_id: str) -> None:
        """``recreateInstances`` for the member named ``instance_id``: the group deletes
        the VM and creates a new one with the same name, keeping its size.

        A member already being recreated or deleted, or not in the group, is left
        alone; so is one that left the group (or whose VM the group replaced) between
        the listing and the call, which the API refuses with a 400. Raises a retryable
        :class:`ProviderError` for a member whose zone the group has not said.
        """
        member = self._members.get(instance_id)
        if member is None:  # not in the last listing (or none yet): ask the group
            self._members = {m.name: m for m in self._list_managed()}
            member = self._members.get(instance_id)
        if member is None:
            log.debug("gcp: %s is not in group %s; nothing to replace", instance_id, self.group)
            return
        if member.current_action in ("RECREATING", "DELETING", "ABANDONING"):
            return
        if member.vm_id is None:  # no VM yet: the group is creating it, nothing to recreate
            log.debug("gcp: %s has no VM yet; nothing to replace", instance_id)
            return
        if not member.zone:
            raise ProviderError(
                f"gcp: cannot replace {instance_id} in group {self.group} yet: the group has"
                " not said which zone its VM is in"
            )
        path = f"zones/{member.zone}/instances/{member.name}"
        compute = self._compute
        if self.zone:
            call: Callable[[], Any] = lambda: self._groups.recreate_instances(  # noqa: E731
                project=self.project,
                zone=self.zone,
                instance_group_manager=self.group,
                instance_group_managers_recreate_instances_request_resource=(
                    compute.InstanceGroupManagersRecreateInstancesRequest(instances=[path])
                ),
                **_CALL_OPTIONS,
            )
        else:
            call = lambda: self._groups.recreate_instances(  # noqa: E731
                project=self.project,
                region=self.region,
                instance_group_manager=self.group,
                region_instance_group_managers_recreate_request_resource=(
                    compute.RegionInstanceGroupManagersRecreateRequest(instances=[path])
                ),
                **_CALL_OPTIONS,
            )
        refused: list[Exception] = []

        def recreate() -> None:
            from google.api_core import exceptions as api

            try:
                call()
            except api.BadRequest as error:  # e.g. "not a member of the managed instance group"
                refused.append(error)

        self.call_api("instanceGroupManagers.recreateInstances", recreate)
        if refused:
            if self._still_listed(member):
                raise self.translate_error("instanceGroupManagers.recreateInstances", refused[0])
            log.debug(
                "gcp: %s left group %s before its recreate; nothing to replace",
                instance_id,
                self.group,
            )
            return
        # Remember it until the next listing, so a second ask is no second recreate.
        self._members[instance_id] = _replace_action(member, "RECREATING")
        log.info("gcp: recreating %s in group %s", instance_id, self.group)

    def _still_listed(self, member: _Member) -> bool:
        """Whether a fresh listing still has ``member`` with the same VM, not leaving."""
        self._members = {m.name: m for m in self._list_managed()}
        current = self._members.get(member.name)
        return (
            current is not None
            and current.vm_id == member.vm_id
            and current.current_action not in ("RECREATING", "DELETING", "ABANDONING")
        )

    def remove_instance(self, instance_id: str) -> None:
        """``deleteInstances`` for the member named ``instance_id``: the group deletes
        the VM and "reduces the targetSize of the managed instance group by the number
        of instances that you delete" (instanceGroupManagers.deleteInstances reference).

        Idempotent: a member not in the group, or already being deleted or abandoned,
        is left alone; the request also sets ``skipInstancesOnValidationError``, so one
        that left between the listing and the call is skipped by the group instead of
        failing the call. Raises a retryable :class:`ProviderError` for a member of a
        regional group not yet placed in a zone (its URL, which the call needs, names it).
        """
        member = self._members.get(instance_id)
        if member is None:  # not in the last listing (or none yet): ask the group
            self._members = {m.name: m for m in self._list_managed()}
            member = self._members.get(instance_id)
        if member is None or member.leaving:
            log.debug("gcp: %s is not in group %s (or leaving it)", instance_id, self.group)
            return
        if not member.zone:
            raise ProviderError(
                f"gcp: cannot remove {instance_id} from group {self.group} yet: the group"
                " has not placed it in a zone"
            )
        path = f"zones/{member.zone}/instances/{member.name}"
        compute = self._compute
        if self.zone:
            call: Callable[[], Any] = lambda: self._groups.delete_instances(  # noqa: E731
                project=self.project,
                zone=self.zone,
                instance_group_manager=self.group,
                instance_group_managers_delete_instances_request_resource=(
                    compute.InstanceGroupManagersDeleteInstancesRequest(
                        instances=[path], skip_instances_on_validation_error=True
                    )
                ),
                **_CALL_OPTIONS,
            )
        else:
            call = lambda: self._groups.delete_instances(  # noqa: E731
                project=self.project,
                region=self.region,
                instance_group_manager=self.group,
                region_instance_group_managers_delete_instances_request_resource=(
                    compute.RegionInstanceGroupManagersDeleteInstancesRequest(
                        instances=[path], skip_instances_on_validation_error=True
                    )
                ),
                **_CALL_OPTIONS,
            )
        self.call_api("instanceGroupManagers.deleteInstances", call)
        # Remember it until the next listing, so a second ask is no second delete, and
        # the target size the group now has.
        self._members[instance_id] = _replace_action(member, "DELETING")
        if self._record is not None and self._record.target_size > 0:
            self._record.target_size -= 1
        log.info("gcp: removed %s from group %s (target size -1)", instance_id, self.group)

    def scale_down_size(self) -> int:
        """0: a managed instance group has no minimum size of its own."""
        return 0

    @property
    def location(self) -> str:
        """``zone Z`` or ``region R``."""
        return f"zone {self.zone}" if self.zone else f"region {self.region}"

    def notice_watcher(self, instance: Instance) -> Mapping[str, Any] | None:
        """Every host watches the metadata server: instance/preempted (a hanging GET)
        and maintenance events."""
        return {"watcher": "gcp"}

    def describe(self) -> str:
        """``gcp managed instance group NAME (PROJECT, zone Z or region R)``."""
        return f"gcp managed instance group {self.group} ({self.project}, {self.location})"

    def close(self) -> None:
        """Close the clients' HTTP sessions (shared with the job's other groups)."""
        self._clients.close()

    # -------------------------------------------------------------- API plumbing

    def retry_delay(self, error: Exception) -> float | None:
        return _retry_after(error)

    def translate_error(self, call_name: str, error: Exception) -> ProviderError:
        """A one-line ProviderError for a failed call: ConfigurationError (exit 2)
        for what the user must fix, a retryable ProviderError for the rest."""
        from google.api_core import exceptions as api
        from google.auth import exceptions as auth

        permission = PERMISSION_BY_CALL[call_name]
        where = f"project {self.project}, {self.location}"
        if isinstance(error, auth.RefreshError):
            return ConfigurationError(
                f"Google rejected the credentials: {one_line(error)}: run"
                " 'gcloud auth application-default login' or check GOOGLE_APPLICATION_CREDENTIALS"
            )
        if isinstance(error, auth.TransportError):
            return ProviderError(f"cannot reach Google's token service: {one_line(error)}")
        if not isinstance(error, api.GoogleAPICallError):
            import requests

            if isinstance(error, (requests.ConnectionError, requests.Timeout, OSError)):
                return ProviderError(
                    f"cannot reach Compute Engine at {self._endpoint_shown()} for {call_name}:"
                    f" {type(error).__name__}"
                )
            # A truncated or malformed answer: the last good inventory stays in use.
            return ProviderError(
                f"{call_name} failed: {type(error).__name__}: {one_line(error, 120)}"
            )
        message = _api_message(error)
        if _retry_after(error) is not None:
            return ProviderError(f"{call_name} failed after retries: {error.code}: {message}")
        if isinstance(error, api.Unauthorized):
            return ConfigurationError(
                f"Compute Engine rejected the credentials ({message}): refresh them with"
                " 'gcloud auth application-default login'"
            )
        if isinstance(error, api.Forbidden):
            named = re.search(r"'(compute\.[A-Za-z]+\.[A-Za-z]+)'", message)
            return ConfigurationError(
                f"permission {named.group(1) if named else permission} denied on {call_name}"
                f" ({where}): grant it to the account spotring runs as"
                " (see IAM_PERMISSIONS in spotring.providers.gcp)"
            )
        if isinstance(error, api.NotFound):
            return ConfigurationError(self._not_found(message, where))
        return ConfigurationError(f"{call_name} failed ({where}): {error.code}: {message}")

    def _not_found(self, message: str, where: str) -> str:
        resource = re.search(r"'([^']+)'", message)
        path = resource.group(1) if resource else ""
        if path.rstrip("/") == f"projects/{self.project}":
            return f"project {self.project} not found (or not visible to these credentials)"
        if re.fullmatch(r"projects/[^/]+/(zones|regions)/[^/]+", path):
            return f"{self.location} not found in project {self.project}"
        return f"managed instance group '{self.group}' not found ({where})"

    def _endpoint_shown(self) -> str:
        return self.endpoint or "https://compute.googleapis.com"


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


def _failing(member: _Member) -> bool:
    """Whether the member's last attempt failed and left it without a running VM
    (``id`` and ``instanceStatus`` are "empty when the instance does not exist")."""
    return bool(member.errors) and member.instance_status in ("", "PROVISIONING")


def _launch_error(item: Any, since: float) -> CapacityShortage | None:
    """The shortage a listErrors item reports, if it is an error of getting a VM running
    at or after ``since``."""
    raw = type(item).pb(item)
    at = _timestamp(raw.timestamp)
    action = raw.instance_action_details.action if raw.HasField("instance_action_details") else ""
    # An item without a time cannot be placed after `since`; one without a code says
    # nothing usable; an error of another action (deleting, ...) is no shortage.
    if at is None or at < since or not raw.error.code or (action and action not in LAUNCH_ACTIONS):
        return None
    return CapacityShortage(
        shortage_cause(raw.error.code), raw.error.code, one_line(raw.error.message), at
    )


def _page(pager: Any) -> tuple[list[Any], str]:
    """A pager's first page: its items and the next page's token."""
    return list(pager.items), pager.next_page_token


def _read_vms(page: Any) -> tuple[list[_Vm], str]:
    return [_Vm.of(vm) for vm in page.items], page.next_page_token


def _replace_action(member: _Member, action: str) -> _Member:
    return replace(member, current_action=action)


def _load_library(credentials: Any | None, project_given: bool) -> tuple[Any, Any, str | None]:
    """google-cloud-compute's types, the credentials and their project."""
    try:
        import google.auth
        import google.auth.exceptions
        from google.cloud import compute_v1
    except ImportError:
        raise ConfigurationError(
            "the gcp provider needs google-cloud-compute: pip install 'spotring[gcp]'"
        ) from None
    if credentials is not None:
        return compute_v1, credentials, None
    # google-auth warns when it finds no project; with --project that is just noise.
    quiet = logging.getLogger("google.auth._default")
    level = quiet.level
    if project_given:
        quiet.setLevel(logging.ERROR)
    try:
        found, project = google.auth.default(scopes=["https://www.googleapis.com/auth/compute"])
    except google.auth.exceptions.DefaultCredentialsError:
        raise ConfigurationError(
            "no Google Cloud credentials: run 'gcloud auth application-default login', set"
            " GOOGLE_APPLICATION_CREDENTIALS, or run on a VM with a service account"
        ) from None
    finally:
        quiet.setLevel(level)
    return compute_v1, found, project


def _retry_after(error: Exception) -> float | None:
    """Seconds to wait before retrying ``error`` (0: the backoff decides), or None
    when retrying cannot help."""
    from google.api_core import exceptions as api
    from google.auth import exceptions as auth

    if isinstance(error, auth.RefreshError):
        return None
    if isinstance(error, auth.TransportError):
        return 0.0
    if isinstance(error, api.GoogleAPICallError):
        reasons = {e.get("reason") for e in error.errors or () if isinstance(e, dict)}
        if error.code not in _RETRYABLE_STATUS and not (
            error.code == 403 and reasons & _RATE_LIMIT_REASONS
        ):
            return None
        header = getattr(getattr(error, "response", None), "headers", {}).get("Retry-After")
        try:
            return min(60.0, float(header)) if header else 0.0
        except ValueError:
            return 0.0
    import requests
    from google.protobuf.json_format import ParseError

    # Connection refused or reset, a timeout, a truncated or malformed response.
    if isinstance(error, (requests.RequestException, OSError, ValueError, ParseError)):
        return 0.0
    return None


def _api_message(error: Any) -> str:
    """The API's own message, without the method and URL the library prepends."""
    for detail in error.errors or ():
        if isinstance(detail, dict) and detail.get("message"):
            return one_line(detail["message"])
    return one_line(str(error.message).split(": ", 1)[-1])


def _timestamp(text: str) -> float | None:
    if not text:
        return None
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@hookimpl
def spotring_register_providers(registry: ProviderRegistry) -> None:
    """Register :class:`GcpProvider` as ``gcp``."""
    registry.add(GcpProvider)


__all__ = [
    "CURRENT_ACTION_MAP",
    "HEALTH_STATE_MAP",
    "IAM_PERMISSIONS",
    "INSTANCE_STATUS_MAP",
    "PERMISSION_BY_CALL",
    "SHORTAGE_CAUSES",
    "GcpProvider",
    "GroupSpec",
    "group_specs",
    "member_state",
    "parse_group",
    "shortage_cause",
]
