"""How the driver tells its workers of a host change (driver/horovod_driver.py)."""

from __future__ import annotations

import pytest


class Driver:
    """The parts of Horovod's ElasticDriver the announcement reads."""

    def __init__(self, ring: list[str], max_np: int) -> None:
        self._host_assignments = {host: [0] for host in ring}
        self.max_np = max_np

    def _get_host_assignments(self, current_hosts: list[str]) -> tuple[dict[str, list[int]], None]:
        if len(current_hosts) < 2:
            raise ValueError("Requested more processes than there are available slots")
        return {host: [0] for host in current_hosts[: self.max_np]}, None


@pytest.mark.parametrize(
    ("available", "heard", "told"),
    [
        # od-0 leaves and host-2, waiting beyond --max-np, takes its slot: the new
        # member needs the sync, so the survivors must not skip it.
        (["host-0", "host-1", "od-1", "host-2"], "removed", "mixed"),
        (["host-0", "host-1", "od-1"], "removed", "removed"),  # a removal only
        (["host-0", "host-1", "od-1", "host-2"], "mixed", "mixed"),
        (["host-0"], "removed", "removed"),  # too few for a ring
    ],
)
def test_a_removal_that_lets_a_waiting_host_join_is_told_as_an_addition_too(
    available: list[str], heard: str, told: str
) -> None:
    from horovod.runner.elastic.worker import HostUpdateResult

    from spotring.driver.horovod_driver import announced_change

    driver = Driver(["host-0", "host-1", "od-0", "od-1"], max_np=4)
    assert announced_change(driver, available, HostUpdateResult[heard]) == HostUpdateResult[told]
