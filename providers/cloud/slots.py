"""A member's slot count: ``--slots-per-host``, a label (or tag), or its accelerators."""

from __future__ import annotations

import logging
from collections.abc import Mapping

log = logging.getLogger(__package__)


class SlotResolver:
    """A member's slot count: ``--slots-per-host``, else its label (or tag), else the
    number of accelerators attached, else 1.

    A label that is not a positive integer is warned about once per member and
    ignored, not fatal: one mislabelled VM must not stop a job.
    """

    def __init__(self, slots_per_host: int | None, label: str, what: str = "label") -> None:
        self.slots_per_host = slots_per_host
        self.label = label
        self.what = what
        self._warned: set[str] = set()

    def from_label(self, member: str, labels: Mapping[str, str]) -> int | None:
        """The slots the member's label gives, or None (absent or not a positive int)."""
        value = labels.get(self.label)
        if value is None:
            return None
        try:
            slots = int(value)
        except ValueError:
            slots = 0
        if slots >= 1:
            return slots
        if member not in self._warned:
            self._warned.add(member)
            log.warning(
                "instance %s: %s %s=%r is not a positive integer; using the accelerator count",
                member,
                self.what,
                self.label,
                value,
            )
        return None

    def needs_accelerator_count(self, member: str, labels: Mapping[str, str]) -> bool:
        """Whether the accelerator count decides this member's slots."""
        return self.slots_per_host is None and self.from_label(member, labels) is None

    def slots(self, member: str, labels: Mapping[str, str], accelerators: int | None) -> int:
        """The member's slots; ``accelerators`` None or 0 means one slot."""
        if self.slots_per_host is not None:
            return self.slots_per_host
        labelled = self.from_label(member, labels)
        if labelled is not None:
            return labelled
        return max(1, accelerators or 0)
