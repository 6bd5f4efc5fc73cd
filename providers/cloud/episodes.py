"""Warnings about a condition (no capacity in a zone, an odd member) once when it
starts and once when it clears, not on every refresh."""

from __future__ import annotations

import logging
from collections.abc import Mapping

log = logging.getLogger(__package__)


class EpisodeWarnings:
    """Warn when a condition starts, say so when it ends, stay quiet in between.

    Each refresh passes every condition that holds now, keyed (e.g. by zone) with its
    message; a key seen on the last refresh is not warned about again.
    """

    def __init__(self, logger: logging.Logger = log) -> None:
        self._logger = logger
        self.active: dict[str, str] = {}

    def update(self, conditions: Mapping[str, str]) -> None:
        """Record the conditions of this refresh, logging the ones that start or end."""
        for key, message in conditions.items():
            if key not in self.active:
                self._logger.warning("%s", message)
        for key in self.active.keys() - conditions.keys():
            self._logger.info("%s: resolved", key)
        self.active = dict(conditions)
