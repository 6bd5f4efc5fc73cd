"""The value types every part of spotring shares, and the hook markers.

The bottom floor: the controller (``spotring.autoscaler``), the Horovod side
(``spotring.driver``), the providers and the worker-side code all stand on it, and it
imports nothing of spotring.
"""

from spotring.core.capacity import CapacityShortage, ShortageCause
from spotring.core.errors import ConfigurationError, ProviderError
from spotring.core.hooks import PROJECT, hookimpl, hookspec
from spotring.core.instance import (
    Instance,
    InstanceState,
    InterruptionNotice,
    Lifecycle,
    is_valid_address,
)
from spotring.core.inventory import Inventory
from spotring.core.job import JobShape, hosts_for_slots
from spotring.core.options import CoreOptions

__all__ = [
    "PROJECT",
    "CapacityShortage",
    "ConfigurationError",
    "CoreOptions",
    "Instance",
    "InstanceState",
    "InterruptionNotice",
    "Inventory",
    "JobShape",
    "Lifecycle",
    "ProviderError",
    "ShortageCause",
    "hookimpl",
    "hookspec",
    "hosts_for_slots",
    "is_valid_address",
]
