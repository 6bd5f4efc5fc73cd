"""A controller for driver tests (:class:`spotring.driver.job_control.JobController`):
an inventory the test sets and may grow, no notices, no fatal error; it records the
hosts the driver says failed."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


class Inventory:
    """The hosts and slots the test puts in ``hosts``."""

    def __init__(self, hosts: Mapping[str, int]) -> None:
        self.hosts = dict(hosts)

    def hosts_and_slots(self) -> dict[str, int]:
        return dict(self.hosts)


class QuietController:
    """Answers little; ``hosts``: the inventory's (none: a driver that starts nothing)."""

    def __init__(self, hosts: Mapping[str, int] | None = None) -> None:
        self.inventory = Inventory(hosts or {})
        self.failed: list[str] = []

    def host_failed(self, address: str, reason: str) -> None:
        self.failed.append(address)

    def host_noticed(self, address: str, notice: Any) -> bool:
        return False

    def notice_watcher(self, address: str) -> None:
        return None

    def ring_formed(self, hosts: Sequence[str]) -> Sequence[str]:
        return []

    def hosts_offered(self, hosts: Any) -> None:
        pass

    def wait_for_fatal_error(self, timeout: float | None = None) -> None:
        return None
