"""What says a scale set cannot grow: the ARM error codes of a shortage (capacity, price,
quota), their :class:`ShortageCause`, and :class:`ShortageSignals`, the newest failed
VM and refused scale-out as a :class:`CapacityShortage`."""

from __future__ import annotations

import time
from collections.abc import Sequence

from spotring.core.capacity import CapacityShortage, ShortageCause
from spotring.providers.azure.answers import Member
from spotring.providers.cloud import one_line

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


class ShortageSignals:
    """The newest failures to add VMs to one set: a VM whose provisioning failed before
    it ever ran (kept after the VM is deleted), and a scale-out ARM refused or whose
    operation failed."""

    def __init__(self) -> None:
        # When each failed VM was first listed: its status may carry no time.
        self._failures_seen: dict[str, float] = {}
        self._newest_failure: CapacityShortage | None = None
        self._refusal: CapacityShortage | None = None

    def note_failures(self, members: Sequence[Member]) -> None:
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

    def note_refusal(self, code: str, message: str, at: float | None = None) -> None:
        """A capacity change ARM refused, or whose operation failed (at ``at``, by
        default now)."""
        self._refusal = CapacityShortage(
            cause=shortage_cause(code, message),
            code=code,
            message=message,
            at=time.time() if at is None else at,
        )

    def newest(self, since: float) -> CapacityShortage | None:
        """The newest failed VM or refusal at or after ``since``."""
        found: list[tuple[float, CapacityShortage]] = [
            (shortage.at, shortage)
            for shortage in (self._newest_failure, self._refusal)
            if shortage is not None and shortage.at is not None and shortage.at >= since
        ]
        return max(found, key=lambda pair: pair[0])[1] if found else None
