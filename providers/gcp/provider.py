"""The ``gcp`` provider class, composed of the package's rooms, and its registration."""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from spotring.core.hooks import hookimpl
from spotring.core.prices import HourlyPrice
from spotring.providers.base import (
    CapacityShortage,
    ConfigurationError,
    CoreOptions,
    Instance,
    Lifecycle,
    Provider,
    ProviderError,
)
from spotring.providers.cloud import (
    CloudGroupProvider,
    DescribeOnce,
    EpisodeWarnings,
    MalformedAnswer,
    check_endpoint,
)
from spotring.providers.gcp import capacity, errors, prices, records
from spotring.providers.gcp.client import (
    CALL_TIMEOUT,
    Clients,
    GroupApi,
    default_credentials_source,
    load_library,
)
from spotring.providers.gcp.groups import GroupSpec
from spotring.providers.gcp.options import add_gcp_arguments, given_groups
from spotring.providers.gcp.records import Member, Vm

if TYPE_CHECKING:
    from spotring.providers.base import ProviderRegistry

# The package's logger: the name spotring's GCP logs have always carried.
log = logging.getLogger(__package__)


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
        clients: Clients | None = None,
        catalog_endpoint: str | None = None,
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
        :param catalog_endpoint: the Cloud Billing Catalog API (a test server's).
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
        self._members: dict[str, Member] = {}
        self._capacity = EpisodeWarnings(log)
        self._odd = EpisodeWarnings(log)  # members listed as not usable for what they lack
        self._label = label or group
        self._listed_at: float | None = None  # when the last listing was read
        self._lifecycle_warned = False
        self._catalog_endpoint = catalog_endpoint
        self._catalog: Any | None = None  # the CloudCatalogClient, made on first use
        found_project = None
        if clients is None:
            compute, credentials, found_project = load_library(credentials, bool(project))
        self.project: str = project or found_project or ""
        if not self.project:
            raise ConfigurationError(
                "no Google Cloud project: pass --project or set GOOGLE_CLOUD_PROJECT"
            )
        self.endpoint = endpoint
        if clients is None:
            if endpoint:
                check_endpoint(endpoint)
            clients = Clients(compute, credentials, endpoint)
        self._clients = clients
        self._api = GroupApi(
            clients, self.call_api, project=self.project, group=group, zone=zone, region=region
        )
        self._vms: DescribeOnce[tuple[str, str, int | None], Vm] = DescribeOnce(
            self._api.describe_vms, lambda vm: vm.final
        )

    # ----------------------------------------------------------------- options

    @classmethod
    def add_arguments(cls, group: argparse._ArgumentGroup) -> None:
        """Add ``--group``, ``--zone``/``--region``, ``--project`` and the shared options."""
        add_gcp_arguments(group)
        cls.add_common_arguments(group, "gcp")

    @classmethod
    def credential_source(cls) -> str | None:
        """Where Application Default Credentials would come from: the file named by
        GOOGLE_APPLICATION_CREDENTIALS, gcloud's login, or this VM's service account."""
        return default_credentials_source()

    @classmethod
    def from_options(cls, options: argparse.Namespace, core: CoreOptions) -> GcpProvider:
        """Make the provider of the one ``--group`` given; makes no API call.

        Raises :class:`ConfigurationError` without ``--group`` or with several (see
        :meth:`groups_from_options`), without a zone or region, without a project, or
        without credentials.
        """
        specs = given_groups(options)
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
        specs = given_groups(options)
        first = cls._from_spec(*specs[0], options, core)
        made: list[Provider] = [first]
        for spec, label in specs[1:]:
            made.append(cls._from_spec(spec, label, options, core, first))
        return made

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
        members = self._api.managed_instances()
        # An empty page looks just like an empty group; a group that wants members lists
        # them (CREATING) at once, so no members and a target size is a broken answer.
        if not members and self._record.target_size and self._get_group().target_size:
            raise MalformedAnswer(
                "instanceGroupManagers.listManagedInstances",
                f"no members, but the group's target size is {self._record.target_size}",
            )
        self._members = {m.name: m for m in members}
        self._listed_at = time.time()
        self._capacity.update(capacity.capacity_conditions(self.group, self.location, members))
        vms = self._vms.get([m.key for m in members if m.vm_id is not None and not m.problem])
        instances = [records.instance_of(m, vms.get(m.key), self.slots) for m in members]
        self._odd.update(records.odd_members(self.group, members, vms, instances))
        return instances

    # ---------------------------------------------------------------- capacity

    def group_lifecycle(self) -> Lifecycle | None:
        """SPOT when the group's instance template asks for spot VMs
        (``properties.scheduling.provisioningModel`` SPOT, or ``preemptible``), else
        ON_DEMAND; None when its versions' templates disagree, or the template cannot
        be read for good (warned once: the controller then goes by the members).

        Costs one get of the group if none was read yet, and one get per template
        not seen before: a template never changes (a new one replaces it).
        """
        urls = self._template_urls()
        if not urls:
            return None
        try:
            found = {self._api.template_lifecycle(url) for url in sorted(urls)}
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

    def _template_urls(self) -> set[str]:
        """The instance templates the group launches from (one get of the group if none
        was read yet)."""
        record = self._record if self._record is not None else self._get_group()
        # versions[] "overrides the top-level instanceTemplate field" (InstanceGroupManager).
        urls = {v.instance_template for v in record.versions if v.instance_template}
        if not urls and record.instance_template:
            urls = {record.instance_template}
        return urls

    def hourly_price(self) -> HourlyPrice | None:
        """A VM's price for one hour from the Cloud Billing Catalog: the machine type of
        the group's template (machineTypes.get: vCPUs, memory) at its family's Core and
        Ram SKUs for the region, spot or on-demand as the template asks
        (:mod:`spotring.providers.gcp.prices`). None when the group's templates differ,
        name no machine type, the catalog lists no such SKUs, or the group is reached
        through ``--endpoint`` (a test or private endpoint) and no catalog endpoint was
        given."""
        if self.endpoint and not self._catalog_endpoint:
            return None
        urls = self._template_urls()
        if len(urls) != 1:
            return None
        lifecycle, machine_type = self._api.template(urls.pop())
        zone = self.zone or self._a_zone()
        if not machine_type or not zone:
            return None
        vcpus, memory_mb = self._api.machine_type(zone, machine_type)
        if self._catalog is None:
            self._catalog = prices.catalog_client(self._clients.credentials, self._catalog_endpoint)
        catalog = self._catalog
        region = zone.rsplit("-", 1)[0]
        usd = self.call_api(
            "services.skus.list",
            lambda: prices.machine_price(
                prices.sku_pages(catalog, CALL_TIMEOUT),
                machine_type,
                region,
                lifecycle is Lifecycle.SPOT,
                vcpus,
                memory_mb / 1024,
            ),
        )
        return None if usd is None else HourlyPrice(usd, prices.SOURCE, time.time())

    def _a_zone(self) -> str | None:
        """A zone of a regional group: its distribution policy's first, else a member's."""
        record = self._record if self._record is not None else self._get_group()
        for zone in record.distribution_policy.zones:
            if zone.zone:
                return zone.zone.rsplit("/", 1)[-1]
        return next((m.zone for m in self._members.values() if m.zone), None)

    def capacity_shortage(self, since: float) -> CapacityShortage | None:
        """Why the group could not create members lately, or None.

        First the members of the last listing (if read at or after ``since``) whose VM
        does not exist, by their ``lastAttempt.errors``: no call. Else ``listErrors``
        (https://cloud.google.com/compute/docs/reference/rest/v1/instanceGroupManagers/listErrors),
        every page up to :data:`~spotring.providers.gcp.client.ERRORS_PAGES`, in whatever
        order it lists them: the newest error of a creating, recreating, starting or
        resuming action whose ``timestamp`` is at or after ``since``. Capacity and quota
        codes are preferred to others among a listing's errors. Reads only.
        """
        if self._listed_at is not None and self._listed_at >= since:
            found = capacity.members_shortage(self._members.values(), self._listed_at)
            if found is not None:
                return found
        return capacity.newest_launch_error(self._api.error_pages(), since)

    # ------------------------------------------------------------------ the group

    def _get_group(self) -> Any:
        """Get the group's record: target size and any autoscaler attached to it."""
        record = self._api.get()
        autoscaler = record.status.autoscaler if "status" in record else ""
        if autoscaler and not self._autoscaler:
            self.can_resize = False
            level = logging.INFO if self._resize_disabled_by_user else logging.WARNING
            log.log(
                level,
                "gcp: group %s is sized by autoscaler %s: spotring will not resize it"
                " (pass --no-resize to say so), but still recreates failed hosts",
                self.group,
                records.last_segment(autoscaler),
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
                f" {records.last_segment(self._autoscaler)}: detach it, or run with --no-resize"
            )
        if current == size:
            return
        self._api.resize(size)
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
            self._members = {m.name: m for m in self._api.managed_instances()}
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
        refused = self._api.recreate(f"zones/{member.zone}/instances/{member.name}")
        if refused is not None:
            if self._still_listed(member):
                raise self.translate_error("instanceGroupManagers.recreateInstances", refused)
            log.debug(
                "gcp: %s left group %s before its recreate; nothing to replace",
                instance_id,
                self.group,
            )
            return
        # Remember it until the next listing, so a second ask is no second recreate.
        self._members[instance_id] = records.replace_action(member, "RECREATING")
        log.info("gcp: recreating %s in group %s", instance_id, self.group)

    def _still_listed(self, member: Member) -> bool:
        """Whether a fresh listing still has ``member`` with the same VM, not leaving."""
        self._members = {m.name: m for m in self._api.managed_instances()}
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
            self._members = {m.name: m for m in self._api.managed_instances()}
            member = self._members.get(instance_id)
        if member is None or member.leaving:
            log.debug("gcp: %s is not in group %s (or leaving it)", instance_id, self.group)
            return
        if not member.zone:
            raise ProviderError(
                f"gcp: cannot remove {instance_id} from group {self.group} yet: the group"
                " has not placed it in a zone"
            )
        self._api.delete(f"zones/{member.zone}/instances/{member.name}")
        # Remember it until the next listing, so a second ask is no second delete, and
        # the target size the group now has.
        self._members[instance_id] = records.replace_action(member, "DELETING")
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
        if self._catalog is not None:
            self._catalog.transport.close()

    # -------------------------------------------------------------- API plumbing

    def retry_delay(self, error: Exception) -> float | None:
        return errors.retry_after(error)

    def translate_error(self, call_name: str, error: Exception) -> ProviderError:
        """A one-line ProviderError for a failed call: ConfigurationError (exit 2)
        for what the user must fix, a retryable ProviderError for the rest."""
        return errors.translate_error(
            call_name,
            error,
            project=self.project,
            location=self.location,
            group=self.group,
            endpoint=self.endpoint,
        )


@hookimpl
def spotring_register_providers(registry: ProviderRegistry) -> None:
    """Register :class:`GcpProvider` as ``gcp``."""
    registry.add(GcpProvider)


__all__ = ["GcpProvider", "spotring_register_providers"]
