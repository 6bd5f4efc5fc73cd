"""Deprecated path of :mod:`spotring.autoscaler.observers.progress` (the progress lines
and the summary), kept so that existing imports work: import from there."""

from spotring.autoscaler.observers.progress import (
    ProgressReporter,
)

__all__ = ["ProgressReporter"]
