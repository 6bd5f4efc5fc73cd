"""The options of spotring's own that a provider may read, typed."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CoreOptions:
    """What ``spotring run`` / ``discover`` was asked for that a provider may use.

    Providers get this from :meth:`spotring.providers.base.Provider.from_options`
    next to a namespace holding only their own options; they never see the rest of
    the command line.
    """

    slots_per_host: int | None = None
    """``--slots-per-host``; None: the slots the group's members report."""
    num_proc: int | None = None
    """``-np``: workers to start with; None for ``spotring discover``, which has no job."""
    resize: bool = True
    """False with ``--no-resize``: spotring never changes the group's size."""

    def as_option_names(self) -> dict[str, object]:
        """These values under their command-line ``dest`` names (``no_resize``, ...):
        what a provider written for the old contract read from the namespace."""
        return {
            "slots_per_host": self.slots_per_host,
            "num_proc": self.num_proc,
            "no_resize": not self.resize,
        }
