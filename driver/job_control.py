"""The driver's side of a job, whatever the backend: what it needs of spotring's
controller (:class:`JobController`), and how a job stopped before its end is told
(:class:`JobAborted`). Imports no Horovod: the torch backend's driver uses it too.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any, Protocol

from spotring.core import InterruptionNotice
from spotring.core.inventory import Inventory


class InventorySource(Protocol):
    """What discovery needs of spotring's controller: its latest good inventory, and
    an ear for the hosts offered to Horovod."""

    @property
    def inventory(self) -> Inventory | None:
        """The inventory of the last successful refresh; None before the first."""
        ...

    def hosts_offered(self, hosts: Collection[str]) -> None:
        """The hosts just offered to Horovod (quick: Horovod's thread, its lock held)."""
        ...


class JobAborted(RuntimeError):
    """The job was stopped before it could finish: by the controller, or a signal."""

    def __init__(self, message: str, cause: BaseException | None = None) -> None:
        super().__init__(message)
        self.cause = cause


class JobController(InventorySource, Protocol):
    """What the driver needs of spotring's controller (its ``inventory`` among it)."""

    def host_failed(self, address: str, reason: str) -> object: ...

    def host_noticed(self, address: str, notice: InterruptionNotice) -> bool: ...

    def notice_watcher(self, address: str) -> dict[str, Any] | None: ...

    def ring_formed(self, hosts: Sequence[str]) -> Sequence[str]:
        """Horovod planned a ring of ``hosts`` (on its thread; quick). Returns the hosts
        the controller took out of discovery itself (handed back to their group) that
        the ring left out: their workers are stopped like a noticed host's."""
        ...

    def wait_for_fatal_error(self, timeout: float | None = None) -> Exception | None:
        """Block until the controller stops for good; its error, or None on timeout."""
        ...
