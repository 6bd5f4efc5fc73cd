"""Deprecated path of :mod:`spotring.autoscaler.cli.check` (``spotring check``), kept so
that existing imports work: import from there."""

from spotring.autoscaler.cli.check import Finding, check_provider, check_training, run_check

__all__ = ["Finding", "check_provider", "check_training", "run_check"]
