"""A job's groups: one provider per group, in the user's order of preference.

A provider is one group's client. A job of several groups (``--group`` given more
than once) is a list of them, which the controller lists and steers group by group
(its capacity steering, :mod:`spotring.autoscaler.steering`, splits the job's size
across them). What is asked of all of a job's groups at once is here, once: their
names and description, every group's members in one listing, their summed limits and
their events. A job of one group is that group, call for call.
"""

from __future__ import annotations

from collections.abc import MutableMapping, Sequence
from dataclasses import replace
from typing import Any

from spotring.core import ConfigurationError, Instance, Lifecycle
from spotring.providers.base import Provider

__all__ = [
    "describe_groups",
    "group_events",
    "group_names",
    "job_groups",
    "job_size_limits",
    "list_members",
    "refresh_calls",
]


def job_groups(groups: Provider | Sequence[Provider]) -> tuple[Provider, ...]:
    """``groups`` as a tuple; one provider is a job of one group.

    Raises :class:`ConfigurationError` for no group, or for groups whose
    ``group_name()`` is not unique (a member's group is known by its name)."""
    made = (groups,) if isinstance(groups, Provider) else tuple(groups)
    if not made:
        raise ConfigurationError("a job needs at least one group")
    names = group_names(made)
    if len(set(names)) != len(names):
        raise ConfigurationError(f"group names must differ: {', '.join(names)}")
    return made


def group_names(groups: Sequence[Provider]) -> list[str]:
    """The groups' names, in the user's order."""
    return [group.group_name() for group in groups]


def describe_groups(groups: Sequence[Provider]) -> str:
    """A short description of the job's groups, for progress lines and logs."""
    if len(groups) == 1:
        return groups[0].describe()
    return " then ".join(f"{group.describe()} [{group.group_name()}]" for group in groups)


def list_members(
    groups: Sequence[Provider], lifecycles: MutableMapping[str, Lifecycle | None]
) -> list[Instance]:
    """Every group's members, in the groups' order. With several groups each member
    is named with its group and, where the group declares one, its lifecycle; each
    group's lifecycle is asked once (``group_lifecycle``, kept in ``lifecycles``).
    Raises what a group's listing raises."""
    if len(groups) == 1:
        return list(groups[0].list_instances())
    listed: list[Instance] = []
    for group in groups:
        name = group.group_name()
        if name not in lifecycles:
            lifecycles[name] = group.group_lifecycle()
        changes: dict[str, Any] = {"group": name}
        if lifecycles[name] is not None:
            changes["lifecycle"] = lifecycles[name]
        listed += [replace(member, **changes) for member in group.list_instances()]
    return listed


def job_size_limits(groups: Sequence[Provider]) -> tuple[int, int] | None:
    """The job's (min, max) size: its groups' limits summed; None when a group has
    none."""
    limits = [group.size_limits() for group in groups]
    if any(limit is None for limit in limits):
        return None
    return (
        sum(limit[0] for limit in limits if limit is not None),
        sum(limit[1] for limit in limits if limit is not None),
    )


def refresh_calls(groups: Sequence[Provider]) -> int | None:
    """API operations the groups' last listings made, where any counts them."""
    known = [g.last_refresh_calls for g in groups if g.last_refresh_calls is not None]
    return sum(known) if known else None


def group_events(groups: Sequence[Provider]) -> list[tuple[float, str]]:
    """What the groups did by themselves (:attr:`Provider.events`), in time order."""
    return sorted(event for group in groups for event in group.events)
