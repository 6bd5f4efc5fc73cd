"""Deprecated path of :mod:`spotring.autoscaler.observers.events` (the events file), kept so
that existing imports work: import from ``spotring.autoscaler.observers.events``."""

from spotring.autoscaler.observers.events import (
    EVENTS,
    PROVIDER_LOGGER,
    VERSION,
    EventKind,
    EventLog,
    host_record,
)

__all__ = ["EVENTS", "PROVIDER_LOGGER", "VERSION", "EventKind", "EventLog", "host_record"]
