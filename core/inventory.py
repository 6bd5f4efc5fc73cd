"""Inventory: an immutable snapshot of a group's members, as last listed."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from spotring.core.instance import Instance, InstanceState


@dataclass(frozen=True)
class Inventory:
    """The group as of one successful refresh, minus the hosts spotring took out.

    Snapshots are immutable, so the discovery adapter can hand one to Horovod's driver
    thread without a lock while the controller builds the next.
    """

    instances: tuple[Instance, ...] = ()
    generation: int = 0
    """Increments with every refresh that succeeded."""
    refreshed_at: float = 0.0
    """Monotonic time of the refresh that produced this snapshot."""
    excluded: frozenset[str] = field(default_factory=frozenset)
    """Ids of members spotring took out of the job (failed workers, notices)."""

    @cached_property  # snapshots never change; Horovod reads this every second
    def ready(self) -> tuple[Instance, ...]:
        """Members Horovod may place workers on, in a stable order."""
        return tuple(i for i in self.instances if i.is_ready and i.id not in self.excluded)

    def hosts_and_slots(self) -> dict[str, int]:
        """``{address: slots}`` of the ready members: what Horovod's discovery returns."""
        return {i.address: i.slots for i in self.ready}

    def by_address(self, address: str) -> Instance | None:
        return next((i for i in self.instances if i.address == address), None)

    def by_id(self, instance_id: str) -> Instance | None:
        return next((i for i in self.instances if i.id == instance_id), None)

    def count(self, *states: InstanceState) -> int:
        return sum(1 for i in self.instances if i.state in states)

    def with_excluded(self, ids: Iterable[str]) -> Inventory:
        """A copy with more members taken out of the job."""
        return Inventory(
            self.instances, self.generation, self.refreshed_at, self.excluded | frozenset(ids)
        )

    @staticmethod
    def format_hosts(hosts: Mapping[str, int]) -> str:
        """Hosts as ``host:slots`` lines, the format of horovodrun's discovery scripts."""
        return "".join(f"{host}:{slots}\n" for host, slots in hosts.items())
