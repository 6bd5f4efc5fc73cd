"""Deprecated path of :mod:`spotring.autoscaler.observers.metrics` (the Prometheus metrics), kept so
that existing imports work: import from ``spotring.autoscaler.observers.metrics``."""

from spotring.autoscaler.observers.metrics import (
    Metrics,
    RunSeries,
    run_series,
)

__all__ = ["Metrics", "RunSeries", "run_series"]
