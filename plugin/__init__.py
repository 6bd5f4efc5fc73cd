"""Everything a spotring plugin needs, in one import: ``from spotring.plugin import ...``.

A provider plugin subclasses :class:`Provider`, reports :class:`Instance` records in
an :class:`InstanceState`, raises :class:`ProviderError` (or
:class:`ConfigurationError` for what the user must fix) and registers the class with
:data:`hookimpl` on ``spotring_register_providers(registry)``; a cloud group's
provider may build on :class:`CloudGroupProvider`, and its tests on the conformance
kit's :class:`ProviderContract`. A policy or event plugin marks its functions with
:data:`hookimpl` too, and reads the values the hooks pass (:class:`JobShape`,
:class:`Inventory`, :class:`GroupStatus`, :class:`InterruptionNotice`,
:class:`CapacityShortage`, the rings' :class:`RingStatus`, :class:`Stall` and
:class:`Hang`). The hooks themselves are listed, with their contracts, in the docs'
hook reference (from ``spotring.autoscaler.hookspecs``).

The value types, the errors and the provider contract import nothing but themselves;
what stands on higher floors (the controller's :class:`GroupStatus`, the cloud base,
the conformance kit, which needs pytest, and the rings' types) is imported on first
use. So a plugin module that the hosts import (a notice watcher's) may import this
module without loading the controller.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from spotring.core import (
    CapacityShortage,
    ConfigurationError,
    CoreOptions,
    Instance,
    InstanceState,
    InterruptionNotice,
    Inventory,
    JobShape,
    Lifecycle,
    ProviderError,
    ShortageCause,
    hookimpl,
    is_valid_address,
)
from spotring.providers.base import Provider, ProviderRegistry

if TYPE_CHECKING:
    from spotring.autoscaler.capacity import GroupStatus
    from spotring.driver.ring_events import Hang, RingStatus, Stall
    from spotring.providers.cloud import CloudGroupProvider
    from spotring.providers.conformance import ProviderContract

_ON_FIRST_USE: dict[str, str] = {
    "GroupStatus": "spotring.autoscaler.capacity",
    "CloudGroupProvider": "spotring.providers.cloud",
    "ProviderContract": "spotring.providers.conformance",
    "RingStatus": "spotring.driver.ring_progress",
    "Stall": "spotring.driver.ring_progress",
    "Hang": "spotring.driver.ring_progress",
}
"""Names imported from their modules when first asked for (PEP 562)."""

__all__ = [
    "CapacityShortage",
    "CloudGroupProvider",
    "ConfigurationError",
    "CoreOptions",
    "GroupStatus",
    "Hang",
    "Instance",
    "InstanceState",
    "InterruptionNotice",
    "Inventory",
    "JobShape",
    "Lifecycle",
    "Provider",
    "ProviderContract",
    "ProviderError",
    "ProviderRegistry",
    "RingStatus",
    "ShortageCause",
    "Stall",
    "hookimpl",
    "is_valid_address",
]


def __getattr__(name: str) -> Any:
    module = _ON_FIRST_USE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # asked once
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
