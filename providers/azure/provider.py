"""The ``azure`` provider class: an Azure virtual machine scale set (VMSS), Uniform or
Flexible, and its registration.

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
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from spotring.core.capacity import CapacityShortage
from spotring.core.hooks import hookimpl
from spotring.core.prices import HourlyPrice
from spotring.providers.azure import prices
from spotring.providers.azure.answers import (
    Member,
    gpu_counts,
    json_object,
    member_of,
    private_addresses,
    set_lifecycle,
    timestamp,
)
from spotring.providers.azure.capacity import ShortageSignals, is_refusal
from spotring.providers.azure.client import (
    ScaleSetApi,
    SharedClients,
    credential_source,
    make_clients,
    same_origin,
    vm_list_call,
)
from spotring.providers.azure.errors import retry_after, translate_arm_error
from spotring.providers.azure.groups import ScaleSetSpec, scale_set_specs
from spotring.providers.azure.options import (
    DEFAULT_SLOTS_TAG,
    add_scale_set_arguments,
    scale_set_options,
)
from spotring.providers.azure.states import member_state
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
    one_line,
    worst_state,
)

if TYPE_CHECKING:
    from spotring.providers.base import ProviderRegistry

# The package's logger, as before it was split: events.jsonl names it as the source of
# the provider's warnings.
log = logging.getLogger(__package__)


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
        retail_prices_url: str = prices.RETAIL_PRICES_URL,
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
        :param retail_prices_url: the Azure Retail Prices API (a test server's).
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
        self._members: dict[str, Member] = {}
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
        self._shortages = ShortageSignals()
        self._scale_out: str | None = None  # the status URL of a scale-out not yet read
        self._removed: set[str] = set()
        self._closed = False
        self._retail_prices_url = retail_prices_url
        if clients is None:
            clients = SharedClients(*make_clients(credential, endpoint, self.subscription))
        self._clients = clients.share()
        self._compute, self._network = clients.compute, clients.network
        self._api = ScaleSetApi(
            clients,
            self.call_api,
            subscription=self.subscription,
            resource_group=resource_group,
            name=group,
        )

    # ----------------------------------------------------------------- options

    @classmethod
    def add_arguments(cls, group: argparse._ArgumentGroup) -> None:
        """Add ``--group``, ``--resource-group``, ``--subscription`` and the shared options."""
        add_scale_set_arguments(group)
        cls.add_common_arguments(group, "azure")

    @classmethod
    def credential_source(cls) -> str | None:
        """Where DefaultAzureCredential would find credentials: a service principal in
        the environment, the Azure CLI's login, or a managed identity."""
        return credential_source()

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
            clients=clients,
            group_name=spec.label,
            **scale_set_options(options),
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
        self._shortages.note_failures(members)
        return [self._to_instance(m) for m in members]

    def _address(self, member: Member) -> str:
        return self._addresses.get(member.resource_id.lower(), "")

    def _check_address(self, member: Member) -> Member:
        """``member``, lacking its private address if it runs without a known one."""
        if member.power != "running" or self._address(member):
            return member
        return replace(member, lacks=(*member.lacks, "its private address"))

    def _warn_about_odd_members(self, members: Sequence[Member]) -> None:
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

    def _to_instance(self, member: Member) -> Instance:
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

    def _failure(self, member: Member) -> str:
        """Why the set will not run ``member`` again by itself ("" if it may)."""
        if member.evicted and not self.keep_evicted:
            return "spot VM evicted (deallocated)"
        if member.never_started:
            return f"provisioning failed: {member.failure or 'no reason given'}"
        return ""

    def _get_set(self) -> Any:
        self._set = self._api.get()
        return self._set

    @property
    def _capacity(self) -> int:
        assert self._set is not None
        return int(self._set.sku.capacity or 0) if self._set.sku else 0

    def _list_vms(self) -> list[Member]:
        profile = self._set.properties.virtual_machine_profile if self._set else None
        set_spot = bool(profile and profile.priority == "Spot")
        set_size = (self._set.sku.name if self._set and self._set.sku else "") or ""
        # A Flexible set's VMs need not carry the set's tags (Terraform puts the slots
        # tag on the set): a VM's own tag wins, the set's fills in.
        set_tags = dict(self._set.tags or {}) if self._set else {}
        set_id = self._set.id if self.flexible and self._set is not None else ""
        vms = self._api.list_vms(set_id)
        call_name = vm_list_call(self.flexible)
        listed = [member_of(vm, set_spot, set_size, set_tags, set_id, call_name) for vm in vms]
        members = [m for m in listed if m is not None]
        foreign = len(listed) - len(members)  # the server's filter let them through
        self._left_out = {}
        if foreign:
            self._left_out[f"azure: VMs of other sets listed for {self.group}"] = (
                f"azure: the VM list for scale set {self.group} held {foreign} VM(s) of"
                " other scale sets, or of none; left out"
            )
        return members

    def _learn_addresses(self, members: Sequence[Member]) -> None:
        """Private IPs from the network interfaces, for members without one yet."""
        listed = {m.resource_id.lower() for m in members}
        self._addresses = {k: v for k, v in self._addresses.items() if k in listed}
        if all(self._address(m) or not m.power for m in members):
            return
        nics = self._api.network_interfaces(self.flexible)
        self._addresses.update(private_addresses(nics, listed))

    def _learn_gpu_counts(self, members: Sequence[Member]) -> None:
        """The GPU count of every VM size in the set's location, asked once."""
        if self._gpus_by_size is not None or not any(
            self.slots.needs_accelerator_count(m.name, m.tags) for m in members
        ):
            return
        location = self._set.location if self._set else ""
        self._gpus_by_size = gpu_counts(self._api.resource_skus(location))

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

    def hourly_price(self) -> HourlyPrice | None:
        """A VM's price for one hour from the Azure Retail Prices API: the set's size
        in its location, the spot meter for a spot set (:meth:`group_lifecycle`), the
        regular one otherwise; Linux. None when the set has no size, no meter is
        listed (:mod:`spotring.providers.azure.prices`), or the set is reached through
        ``--endpoint`` (a sovereign cloud or a test server) with the public API's URL."""
        if self.endpoint and self._retail_prices_url == prices.RETAIL_PRICES_URL:
            return None
        scale_set = self._set or self._get_set()
        size = scale_set.sku.name if scale_set.sku else None
        if not size or not scale_set.location:
            return None
        spot = self.group_lifecycle() is Lifecycle.SPOT
        usd = prices.vm_price(size, scale_set.location, spot, self._retail_prices_url)
        return None if usd is None else HourlyPrice(usd, prices.SOURCE, time.time())

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
        return self._shortages.newest(since)

    def _read_scale_out(self) -> None:
        """Read the last scale-out's operation status; its error, if it failed, is a
        refusal. ARM's status document ("Track asynchronous Azure operations",
        learn.microsoft.com/azure/azure-resource-manager/management/async-operations):
        ``status`` InProgress, then Succeeded, Failed or Canceled, and for Failed an
        ``error`` with ``code`` and ``message`` (ZonalAllocationFailed and the like,
        which no VM may show: the set may not keep the VMs it could not create)."""
        url = self._scale_out
        if url is None:
            return
        answer = self._api.operation_status(url)
        status = answer.get("status")
        if status not in ("Succeeded", "Failed", "Canceled"):
            return  # InProgress, or an answer without its status: ask again later
        self._scale_out = None
        error = json_object(answer.get("error"))
        if status == "Failed" and error.get("code"):
            at = timestamp(answer.get("endTime"))
            self._shortages.note_refusal(
                str(error["code"]), one_line(error.get("message") or "", 600), at
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

    def _delete(self, member: Member) -> None:
        self._api.delete(member, self.flexible)
        self._members[member.name] = replace(member, provisioning="Deleting")
        log.info("azure: deleting %s from scale set %s", member.name, self.group)

    def _warn_about_capacity(self, members: Sequence[Member]) -> None:
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
        status_url = self._api.set_capacity(size)
        if size > self._capacity and same_origin(status_url, self.endpoint):
            self._scale_out = status_url
        if self._set is not None and self._set.sku is not None:
            self._set.sku.capacity = size
        log.info("azure: scale set %s capacity -> %d", self.group, size)

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

    # -------------------------------------------------------------- API errors

    def retry_delay(self, error: Exception) -> float | None:
        return retry_after(error)

    def translate_error(self, call_name: str, error: Exception) -> ProviderError:
        return translate_arm_error(
            call_name,
            error,
            group=self.group,
            resource_group=self.resource_group,
            subscription=self.subscription,
            endpoint=self.endpoint,
            note_refusal=self._shortages.note_refusal,
        )


@hookimpl
def spotring_register_providers(registry: ProviderRegistry) -> None:
    """Register :class:`AzureProvider` as ``azure``."""
    registry.add(AzureProvider)
