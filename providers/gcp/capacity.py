"""Why a managed instance group cannot create VMs: Compute Engine's error codes ->
:class:`CapacityShortage`, read from the members' last creation attempts (already in
a listing) or from the group's ``listErrors``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from spotring.providers.base import CapacityShortage, ShortageCause
from spotring.providers.cloud import one_line
from spotring.providers.gcp.records import Member, timestamp

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


def capacity_conditions(group: str, location: str, members: Sequence[Member]) -> dict[str, str]:
    """The warning of each zone and capacity error where members cannot be created now,
    by zone and code (for :class:`~spotring.providers.cloud.EpisodeWarnings`: once
    while it lasts); ``location`` says where a member that names no zone yet is."""
    conditions: dict[str, str] = {}
    for member in members:
        for code, message in member.errors if _failing(member) else ():
            if code in CAPACITY_ERRORS:
                # A member never created may not name its zone yet (no instance URL).
                where = f"zone {member.zone}" if member.zone else location
                conditions.setdefault(
                    f"gcp: {where} {code}",
                    f"gcp: group {group} cannot create VMs in {where}:"
                    f" {code}: {one_line(message, 160)}",
                )
    return conditions


def members_shortage(members: Iterable[Member], listed_at: float) -> CapacityShortage | None:
    """The shortage the members listed at ``listed_at`` show by their ``lastAttempt.errors``
    where their VM does not exist, capacity and quota codes first; None without one."""
    found = [
        (code, message) for member in members if _failing(member) for code, message in member.errors
    ]
    if not found:
        return None
    code, message = min(found, key=lambda e: shortage_cause(e[0]) is ShortageCause.OTHER)
    return CapacityShortage(shortage_cause(code), code, one_line(message), listed_at)


def newest_launch_error(pages: Iterable[Sequence[Any]], since: float) -> CapacityShortage | None:
    """The newest error of getting a VM running at or after ``since`` on ``listErrors``'
    pages (items in no documented order), or None."""
    newest: CapacityShortage | None = None
    for items in pages:
        for item in items:
            found = _launch_error(item, since)
            if found is not None and (newest is None or (found.at or 0.0) > (newest.at or 0.0)):
                newest = found
    return newest


def _failing(member: Member) -> bool:
    """Whether the member's last attempt failed and left it without a running VM
    (``id`` and ``instanceStatus`` are "empty when the instance does not exist")."""
    return bool(member.errors) and member.instance_status in ("", "PROVISIONING")


def _launch_error(item: Any, since: float) -> CapacityShortage | None:
    """The shortage a listErrors item reports, if it is an error of getting a VM running
    at or after ``since``."""
    raw = type(item).pb(item)
    at = timestamp(raw.timestamp)
    action = raw.instance_action_details.action if raw.HasField("instance_action_details") else ""
    # An item without a time cannot be placed after `since`; one without a code says
    # nothing usable; an error of another action (deleting, ...) is no shortage.
    if at is None or at < since or not raw.error.code or (action and action not in LAUNCH_ACTIONS):
        return None
    return CapacityShortage(
        shortage_cause(raw.error.code), raw.error.code, one_line(raw.error.message), at
    )


__all__ = [
    "CAPACITY_ERRORS",
    "LAUNCH_ACTIONS",
    "SHORTAGE_CAUSES",
    "capacity_conditions",
    "members_shortage",
    "newest_launch_error",
    "shortage_cause",
]
