"""The adapter that feeds spotring's inventory to Horovod's elastic driver."""

from __future__ import annotations

from horovod.runner.elastic.discovery import HostDiscovery

from spotring.autoscaler.controller import Controller


class InventoryHostDiscovery(HostDiscovery):
    """Horovod ``HostDiscovery`` answered from the controller's cached inventory.

    Horovod polls this every second under its driver lock, so it never calls the
    cloud: it returns the READY hosts of the latest good inventory. Before the first
    successful refresh it raises, which Horovod treats as a misconfiguration on its
    first call; ``spotring run`` waits for the first inventory before starting the
    driver, so that never happens in practice.
    """

    def __init__(self, controller: Controller) -> None:
        self._controller = controller

    def find_available_hosts_and_slots(self) -> dict[str, int]:
        inventory = self._controller.inventory
        if inventory is None:
            raise RuntimeError("spotring has no inventory yet")
        return inventory.hosts_and_slots()
