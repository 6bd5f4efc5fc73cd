"""google-cloud-compute for the ``gcp`` provider: the library and credentials, loaded on
first use; the REST clients a job's groups share; the bounds on each call; and
:class:`GroupApi`, one group's calls (zonal or regional alike), each answer paged
through and read inside its call."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

from spotring.providers.base import ConfigurationError, Lifecycle
from spotring.providers.cloud import MalformedAnswer, batches
from spotring.providers.gcp.records import TEMPLATE_URL, Member, Vm, member_of

# The package's logger: the name spotring's GCP logs have always carried.
log = logging.getLogger(__package__)

T = TypeVar("T")

# ----------------------------------------------------------------------- limits

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
CALL_OPTIONS: Mapping[str, Any] = {"timeout": CALL_TIMEOUT, "retry": None}
"""The keyword arguments of every call: :data:`CALL_TIMEOUT`, and no library retries."""

ERRORS_PAGE_SIZE = 500
"""listErrors items per page, the API's maximum ("Acceptable values are 0 to 500")."""

ERRORS_PAGES = 10
"""At most this many listErrors pages per shortage check. The reference gives the
errors no order (and refuses ``orderBy``), so the newest since a time may be on any
page: every page is read, up to this bound (5,000 errors)."""

# ------------------------------------------------------------ library, credentials


def load_library(credentials: Any | None, project_given: bool) -> tuple[Any, Any, str | None]:
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


def default_credentials_source() -> str | None:
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


class Clients:
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


# --------------------------------------------------------------- one group's calls


class CallApi(Protocol):
    """:meth:`spotring.providers.cloud.CloudGroupProvider.call_api`: one call, retried,
    counted, its last failure translated."""

    def __call__(self, call_name: str, call: Callable[[], T]) -> T: ...


class GroupApi:
    """The calls of one managed instance group, zonal or regional: each made through
    ``call_api`` (so retried and counted), each answer read inside its call (so one that
    cannot be read is a failure of that call), every page followed."""

    def __init__(
        self,
        clients: Clients,
        call_api: CallApi,
        *,
        project: str,
        group: str,
        zone: str | None,
        region: str | None,
    ) -> None:
        self._clients = clients
        self._compute = clients.compute
        self._call_api = call_api
        self.project = project
        self.group = group
        self.zone = zone
        self.region = region
        self._where: dict[str, str | None] = {"zone": zone} if zone else {"region": region}
        self._groups = clients.get(
            "InstanceGroupManagersClient" if zone else "RegionInstanceGroupManagersClient"
        )
        self._instances = clients.get("InstancesClient")
        self._templates: dict[str, tuple[Lifecycle, str]] = {}  # URL -> lifecycle, type

    def get(self) -> Any:
        """The group's record (InstanceGroupManager): target size, autoscaler, versions."""

        def get() -> Any:
            found = self._groups.get(
                project=self.project,
                instance_group_manager=self.group,
                **CALL_OPTIONS,
                **self._where,
            )
            # Its target size decides whether an empty listing can be true (see
            # GcpProvider.list_members): not from a record without it, or not the group's.
            if found.name != self.group or "target_size" not in found:
                raise MalformedAnswer(
                    "instanceGroupManagers.get", "the group's record without its name or size"
                )
            return found

        return self._call_api("instanceGroupManagers.get", get)

    def managed_instances(self) -> list[Member]:
        """Every member, by listManagedInstances (:data:`PAGE_SIZE` a page)."""
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
        members: list[Member] = []
        token = ""
        while True:
            request.page_token = token
            page, token = self._call_api(
                "instanceGroupManagers.listManagedInstances",
                lambda: self._read_members(
                    self._groups.list_managed_instances(request=request, **CALL_OPTIONS)
                ),
            )
            members.extend(page)
            if not token:
                return members

    def _read_members(self, page: Any) -> tuple[list[Member], str]:
        return [member_of(m, self.zone) for m in page.managed_instances], page.next_page_token

    def describe_vms(
        self, keys: Sequence[tuple[str, str, int | None]]
    ) -> dict[tuple[str, str, int | None], Vm]:
        """The VMs behind ``keys``: one filtered instances.list per zone and 100 names."""
        by_zone: dict[str, list[str]] = {}
        for zone, name, _ in keys:
            by_zone.setdefault(zone, []).append(name)
        found: dict[tuple[str, str, int | None], Vm] = {}
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

    def _list_vms(self, zone: str, names: Sequence[str]) -> list[Vm]:
        request = self._compute.ListInstancesRequest(
            project=self.project,
            zone=zone,
            filter=" OR ".join(f'(name = "{name}")' for name in names),
            max_results=PAGE_SIZE,
        )
        vms: list[Vm] = []
        token = ""
        while True:
            request.page_token = token
            page, token = self._call_api(
                "instances.list",
                lambda: _read_vms(self._instances.list(request=request, **CALL_OPTIONS)),
            )
            vms.extend(page)
            if not token:
                return vms

    def template_lifecycle(self, url: str) -> Lifecycle:
        """SPOT or ON_DEMAND, as the instance template at ``url`` asks; each template is
        asked once (a template never changes: a new one replaces it)."""
        return self.template(url)[0]

    def template(self, url: str) -> tuple[Lifecycle, str]:
        """What the instance template at ``url`` launches: SPOT or ON_DEMAND, and its
        machine type's name ("" if it names none); each template is asked once."""
        if url in self._templates:
            return self._templates[url]
        parsed = TEMPLATE_URL.search(url)
        if parsed is None:
            raise MalformedAnswer("instanceGroupManagers.get", f"instance template URL {url!r}")
        project, region, name = parsed.groups()
        if region:
            client = self._clients.get("RegionInstanceTemplatesClient")
            where: dict[str, str] = {"region": region}
        else:
            client = self._clients.get("InstanceTemplatesClient")
            where = {}

        def get() -> tuple[Lifecycle, str]:
            template = client.get(project=project, instance_template=name, **where, **CALL_OPTIONS)
            # Every Scheduling field is optional: none set is a STANDARD VM.
            scheduling = template.properties.scheduling
            spot = scheduling.provisioning_model == "SPOT" or scheduling.preemptible
            # InstanceProperties.machineType: the name, e.g. "n2-standard-8" (optional).
            machine_type = template.properties.machine_type.rsplit("/", 1)[-1]
            return (Lifecycle.SPOT if spot else Lifecycle.ON_DEMAND), machine_type

        facts = self._call_api("instanceTemplates.get", get)
        self._templates[url] = facts
        return facts

    def machine_type(self, zone: str, name: str) -> tuple[int, int]:
        """The machine type ``name``'s vCPUs and memory (MiB) in ``zone``
        (machineTypes.get: ``guestCpus``, ``memoryMb``)."""
        client = self._clients.get("MachineTypesClient")

        def get() -> tuple[int, int]:
            found = client.get(project=self.project, zone=zone, machine_type=name, **CALL_OPTIONS)
            return int(found.guest_cpus), int(found.memory_mb)

        return self._call_api("machineTypes.get", get)

    def error_pages(self) -> Iterator[list[Any]]:
        """listErrors' items, a page at a time, up to :data:`ERRORS_PAGES` pages."""
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
        token = ""
        for _ in range(ERRORS_PAGES):
            request.page_token = token
            # The pager answers attributes from its first page: one page per call.
            items, token = self._call_api(
                "instanceGroupManagers.listErrors",
                lambda: _first_page(self._groups.list_errors(request=request, **CALL_OPTIONS)),
            )
            yield items
            if not token:
                return
        log.debug(
            "gcp: group %s: read the first %d listErrors pages only", self.group, ERRORS_PAGES
        )

    def resize(self, size: int) -> None:
        """``resize`` the group to ``size``."""
        self._call_api(
            "instanceGroupManagers.resize",
            lambda: self._groups.resize(
                project=self.project,
                instance_group_manager=self.group,
                size=size,
                **CALL_OPTIONS,
                **self._where,
            ),
        )

    def recreate(self, path: str) -> Exception | None:
        """``recreateInstances`` for the VM at ``path`` (``zones/Z/instances/NAME``); the
        API's refusal (a 400, e.g. "not a member of the managed instance group") is
        returned, not raised, for the caller to judge."""
        compute = self._compute
        if self.zone:
            call: Callable[[], Any] = lambda: self._groups.recreate_instances(  # noqa: E731
                project=self.project,
                zone=self.zone,
                instance_group_manager=self.group,
                instance_group_managers_recreate_instances_request_resource=(
                    compute.InstanceGroupManagersRecreateInstancesRequest(instances=[path])
                ),
                **CALL_OPTIONS,
            )
        else:
            call = lambda: self._groups.recreate_instances(  # noqa: E731
                project=self.project,
                region=self.region,
                instance_group_manager=self.group,
                region_instance_group_managers_recreate_request_resource=(
                    compute.RegionInstanceGroupManagersRecreateRequest(instances=[path])
                ),
                **CALL_OPTIONS,
            )
        refused: list[Exception] = []

        def recreate() -> None:
            from google.api_core import exceptions as api

            try:
                call()
            except api.BadRequest as error:  # e.g. "not a member of the managed instance group"
                refused.append(error)

        self._call_api("instanceGroupManagers.recreateInstances", recreate)
        return refused[0] if refused else None

    def delete(self, path: str) -> None:
        """``deleteInstances`` for the VM at ``path``, skipping it if it is no member by
        then (``skipInstancesOnValidationError``)."""
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
                **CALL_OPTIONS,
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
                **CALL_OPTIONS,
            )
        self._call_api("instanceGroupManagers.deleteInstances", call)


def _first_page(pager: Any) -> tuple[list[Any], str]:
    """A pager's first page: its items and the next page's token."""
    return list(pager.items), pager.next_page_token


def _read_vms(page: Any) -> tuple[list[Vm], str]:
    return [Vm.of(vm) for vm in page.items], page.next_page_token


__all__ = [
    "CALL_OPTIONS",
    "CALL_TIMEOUT",
    "ERRORS_PAGES",
    "ERRORS_PAGE_SIZE",
    "NAMES_PER_LIST",
    "PAGE_SIZE",
    "CallApi",
    "Clients",
    "GroupApi",
    "default_credentials_source",
    "load_library",
]
