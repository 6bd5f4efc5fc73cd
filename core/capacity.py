"""A cloud's report that it could not add members to a group: the capacity contract.

Providers turn their cloud's own signals (a failed Auto Scaling activity, a managed
instance's creation errors, an ARM allocation failure) into :class:`CapacityShortage`
records; the controller's capacity policy reads them to fall back to the next group.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class ShortageCause(enum.Enum):
    """Why the cloud could not launch a member, as far as spotring needs to know."""

    CAPACITY = "capacity"
    """The cloud has no capacity of that kind there now (spot pool, zone, SKU)."""
    QUOTA = "quota"
    """The account's quota or limit is reached: more asking does not help."""
    PRICE = "price"
    """The spot price is above the group's maximum price."""
    OTHER = "other"
    """Any other launch failure the cloud reports for the group."""


@dataclass(frozen=True)
class CapacityShortage:
    """The newest launch failure a group's cloud reported."""

    cause: ShortageCause
    code: str
    """The cloud's own code, e.g. ``InsufficientInstanceCapacity``,
    ``ZONE_RESOURCE_POOL_EXHAUSTED``, ``SkuNotAvailable``."""
    message: str = ""
    """The cloud's message, on one line."""
    at: float | None = None
    """Epoch seconds at which the cloud reported it, if it says."""

    def describe(self) -> str:
        """One line for logs and events: ``capacity (Code): message``."""
        text = f"{self.cause.value} ({self.code})"
        return f"{text}: {self.message}" if self.message else text
