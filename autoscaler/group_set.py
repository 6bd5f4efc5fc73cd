"""GroupSet: the groups of one job, in preference order, as one provider.

The controller steers a :class:`GroupSet` as it steers any provider: the listing is
every group's members (each named with its group and, where the group says, its
lifecycle), and a member's steering goes to its own group. The job's size is split
across the groups by the capacity policy (:mod:`spotring.autoscaler.capacity`) on the
controller's thread; with one group, a GroupSet is that group, call for call.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

from spotring.core import (
    CapacityShortage,
    ConfigurationError,
    CoreOptions,
    Instance,
    InterruptionNotice,
    Lifecycle,
)
from spotring.providers.base import Provider

__all__ = ["GroupSet"]


class GroupSet(Provider):
    """The providers of one job's groups, in the user's order of preference.

    :param groups: one provider per group (``Provider.groups_from_options``); their
        ``group_name()`` must differ.
    """

    name = "groups"

    def __init__(self, groups: Sequence[Provider]) -> None:
        if not groups:
            raise ConfigurationError("a job needs at least one group")
        names = [group.group_name() for group in groups]
        if len(set(names)) != len(names):
            raise ConfigurationError(f"group names must differ: {', '.join(names)}")
        self.groups: tuple[Provider, ...] = tuple(groups)
        self._by_name = dict(zip(names, self.groups, strict=True))
        self._member_group: dict[str, Provider] = {}  # instance id -> its group
        self._lifecycles: dict[str, Lifecycle | None] = {}
        self.total: int | None = None
        """The job's size as last asked (:meth:`set_target_size`)."""
        first = self.groups[0]
        # What the job is made of is what its groups are made of.
        self.name = first.name  # type: ignore[misc]  # an instance's own name: the provider's
        self.description = first.description  # type: ignore[misc]  # likewise
        self.runs_workers_locally = any(g.runs_workers_locally for g in self.groups)  # type: ignore[misc]  # likewise
        self.tracks_worker_processes = any(g.tracks_worker_processes for g in self.groups)  # type: ignore[misc]  # likewise

    @classmethod
    def from_options(cls, options: argparse.Namespace, core: CoreOptions) -> GroupSet:
        raise ConfigurationError("a GroupSet is made from its groups, not from options")

    @property
    def several(self) -> bool:
        """Whether the job spans more than one group (the capacity policy steers it)."""
        return len(self.groups) > 1

    def group(self, name: str) -> Provider:
        """The group named ``name``."""
        return self._by_name[name]

    def names(self) -> list[str]:
        """The groups' names, in the user's order."""
        return list(self._by_name)

    def lifecycle(self, name: str) -> Lifecycle | None:
        """What ``name`` launches, as its provider says (asked once), or None."""
        if name not in self._lifecycles:
            self._lifecycles[name] = self._by_name[name].group_lifecycle()
        return self._lifecycles[name]

    # ---------------------------------------------------------- capabilities

    @property  # type: ignore[override]  # a property over the class attribute
    def can_resize(self) -> bool:
        return any(group.can_resize for group in self.groups)

    @property  # type: ignore[override]
    def can_replace(self) -> bool:
        return any(group.can_replace for group in self.groups)

    @property  # type: ignore[override]
    def can_remove(self) -> bool:
        return any(group.can_remove for group in self.groups)

    @property  # type: ignore[override]
    def last_refresh_calls(self) -> int | None:
        calls = [group.last_refresh_calls for group in self.groups]
        known = [c for c in calls if c is not None]
        return sum(known) if known else None

    @property  # type: ignore[override]
    def events(self) -> Sequence[tuple[float, str]]:
        return sorted(event for group in self.groups for event in group.events)

    # -------------------------------------------------------------- listing

    def list_instances(self) -> list[Instance]:
        """Every group's members, in the groups' order; each named with its group,
        and with the group's lifecycle where the group declares one."""
        if not self.several:
            members = list(self.groups[0].list_instances())
            self._member_group = {m.id: self.groups[0] for m in members}
            return members
        listed: list[Instance] = []
        owners: dict[str, Provider] = {}
        for name, group in self._by_name.items():
            lifecycle = self.lifecycle(name)
            for member in group.list_instances():
                changes: dict[str, Any] = {"group": name}
                if lifecycle is not None:
                    changes["lifecycle"] = lifecycle
                listed.append(replace(member, **changes))
                owners[member.id] = group
        self._member_group = owners
        return listed

    def _owner(self, instance_id: str) -> Provider | None:
        return self._member_group.get(instance_id)

    def group_of(self, instance_id: str) -> str | None:
        """The name of the group ``instance_id`` was last listed in."""
        owner = self._owner(instance_id)
        return None if owner is None else owner.group_name()

    # -------------------------------------------------------------- steering

    def set_target_size(self, size: int) -> None:
        """Record the job's size. With one group, ask it of the group; with several,
        the controller's capacity policy splits it (:meth:`set_group_size`)."""
        self.total = size
        if not self.several:
            self.groups[0].set_target_size(size)

    def set_group_size(self, name: str, size: int) -> None:
        """Ask the group ``name`` to hold ``size`` members."""
        self._by_name[name].set_target_size(size)

    def replace_instance(self, instance_id: str) -> None:
        owner = self._owner(instance_id)
        if owner is None:  # not listed (any more): replacing it is idempotent
            if not self.several:
                self.groups[0].replace_instance(instance_id)
            return
        owner.replace_instance(instance_id)

    def remove_instance(self, instance_id: str) -> None:
        owner = self._owner(instance_id) or (None if self.several else self.groups[0])
        if owner is not None:
            owner.remove_instance(instance_id)

    def host_noticed(self, instance: Instance, notice: InterruptionNotice) -> None:
        owner = self._owner(instance.id)
        if owner is not None:
            owner.host_noticed(instance, notice)

    def notice_watcher(self, instance: Instance) -> Mapping[str, Any] | None:
        owner = self._owner(instance.id)
        return None if owner is None else owner.notice_watcher(instance)

    def keep_size(self) -> None:
        for group in self.groups:
            if group.can_resize:
                group.keep_size()

    def capacity_shortage(self, since: float) -> CapacityShortage | None:
        """The first group's (a one-group job's) shortage; the controller asks each
        group of several itself."""
        return self.groups[0].capacity_shortage(since)

    def size_limits(self) -> tuple[int, int] | None:
        if not self.several:
            return self.groups[0].size_limits()
        limits = [group.size_limits() for group in self.groups]
        if any(limit is None for limit in limits):
            return None
        return (
            sum(limit[0] for limit in limits if limit is not None),
            sum(limit[1] for limit in limits if limit is not None),
        )

    def group_limits(self) -> dict[str, int]:
        """The most members each group can hold, where it says."""
        limits = {}
        for name, group in self._by_name.items():
            limit = group.size_limits()
            if limit is not None:
                limits[name] = limit[1]
        return limits

    # ------------------------------------------------------------- the rest

    def group_name(self) -> str:
        return "+".join(self._by_name)

    def group_lifecycle(self) -> Lifecycle | None:
        return self.groups[0].group_lifecycle() if not self.several else None

    def describe(self) -> str:
        if not self.several:
            return self.groups[0].describe()
        described = (f"{group.describe()} [{name}]" for name, group in self._by_name.items())
        return " then ".join(described)

    def close(self) -> None:
        for group in self.groups:
            group.close()

    def worker_started(self, address: str, process_group: int) -> None:
        for group in self.groups:
            if group.tracks_worker_processes:
                group.worker_started(address, process_group)

    def worker_exited(self, address: str, process_group: int) -> None:
        for group in self.groups:
            if group.tracks_worker_processes:
                group.worker_exited(address, process_group)

    def job_finished(self) -> None:
        for group in self.groups:
            group.job_finished()
