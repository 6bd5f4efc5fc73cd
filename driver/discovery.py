"""The adapter that feeds spotring's inventory to Horovod's elastic driver."""

from __future__ import annotations

from horovod.runner.elastic.discovery import HostDiscovery

from spotring.driver.job_control import InventorySource
from spotring.driver.warm_pool import WarmPool


class InventoryHostDiscovery(HostDiscovery):
    """Horovod ``HostDiscovery`` answered from the controller's cached inventory.

    Horovod polls this every second under its driver lock, so it never calls the
    cloud: it returns the READY hosts of the latest good inventory. Before the first
    successful refresh it raises, which Horovod treats as a misconfiguration on its
    first call; ``spotring run`` waits for the first inventory before starting the
    driver, so that never happens in practice.

    With a :class:`~spotring.driver.warm_pool.WarmPool`, a READY host is offered only
    once the workers started ahead for it wait in ``hvd.init``.
    """

    def __init__(self, controller: InventorySource, warm_pool: WarmPool | None = None) -> None:
        self._controller = controller
        self._warm_pool = warm_pool

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        inventory = self._controller.inventory
        if inventory is None:
            raise RuntimeError("spotring has no inventory yet")
        available = inventory.hosts_and_slots()
        offered = available if self._warm_pool is None else self._warm_pool.offer(available)
        self._controller.hosts_offered(offered.keys())
        return offered
