"""The provider contract: what spotring asks of a cloud instance group.

A provider plugin is a subclass of :class:`Provider` registered through the
``spotring_register_providers`` hook. spotring makes one provider object for the group
the user names and calls it from a single controller thread, never from Horovod's
driver thread.

Invariants every provider keeps (the conformance kit in
``spotring.providers.conformance`` checks them):

* ``list_instances`` returns every member of the group, each exactly once, with an id
  that is unique and stable for the member's life. A member the cloud still lists but
  that can no longer run work is reported with a non-READY state, never dropped
  silently while it still holds a Horovod slot.
* Any failure to learn the group's membership raises :class:`ProviderError`. A provider
  never returns an empty list because a call failed: an empty list means the group
  really is empty.
* ``list_instances`` only reads: it never changes the group, whatever it finds
  (``spotring discover`` calls nothing else). A member the group will not replace by
  itself is reported with :attr:`Instance.failure`; acting on it is the controller's
  decision.
* ``set_target_size`` and ``replace_instance`` are idempotent: calling them twice with
  the same argument has the effect of calling them once.
* Providers never import Horovod.
"""

from __future__ import annotations

import abc
import argparse
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

# The value types a provider reports and the errors it raises live in spotring.core;
# they are re-exported here, where plugin authors have always imported them.
from spotring.core.errors import ConfigurationError, ProviderError
from spotring.core.instance import (
    Instance,
    InstanceState,
    InterruptionNotice,
    Lifecycle,
    is_valid_address,
)
from spotring.core.job import hosts_for_slots

__all__ = [
    "ConfigurationError",
    "Instance",
    "InstanceState",
    "InterruptionNotice",
    "Lifecycle",
    "Provider",
    "ProviderError",
    "ProviderRegistry",
    "hosts_for_slots",
    "is_valid_address",
]


class Provider(abc.ABC):
    """A group of instances spotring can list and steer.

    Subclasses set :attr:`name`, implement the abstract methods, and declare optional
    capabilities as class attributes. They are constructed by :meth:`from_options` with
    the parsed command line, so ``spotring run --provider NAME --help`` can list the
    options a provider added in :meth:`add_arguments`.
    """

    name: ClassVar[str]
    """Short name users pass to ``--provider``; the registry's key."""
    description: ClassVar[str] = ""
    """One line shown by ``spotring providers``."""
    supports_interruption_notices: ClassVar[bool] = False
    """True when :attr:`Instance.notice` is filled in by :meth:`list_instances`."""
    can_resize: bool = True
    """False when :meth:`set_target_size` cannot work (e.g. the ``script`` provider
    without a resize command): spotring then never steers the group's size."""
    can_replace: bool = True
    """False when :meth:`replace_instance` cannot work: failed hosts are only left out."""
    runs_workers_locally: ClassVar[bool] = False
    """True when the group's hosts are simulated on this machine and workers run as
    local processes (the embedded ``local`` provider, and test doubles of clouds)."""

    @classmethod
    def add_arguments(cls, group: argparse._ArgumentGroup) -> None:
        """Add this provider's command-line options to ``group``. Optional."""

    @classmethod
    @abc.abstractmethod
    def from_options(cls, options: argparse.Namespace) -> Provider:
        """Make the provider from parsed command-line options.

        Raises :class:`ConfigurationError` for options that cannot work.
        """

    @abc.abstractmethod
    def list_instances(self) -> Sequence[Instance]:
        """Every member of the group with its state.

        Raises :class:`ProviderError` on any failure; never returns an empty list
        because a call failed.
        """

    @abc.abstractmethod
    def set_target_size(self, size: int) -> None:
        """Ask the group to hold ``size`` members. Idempotent.

        The provider clamps nothing silently: a size outside what the group allows
        raises :class:`ConfigurationError` naming the limit.
        """

    @abc.abstractmethod
    def replace_instance(self, instance_id: str) -> None:
        """Take ``instance_id`` out of service and have the group launch a replacement.

        Idempotent: replacing a member already being replaced, or already gone, is not
        an error.
        """

    def size_limits(self) -> tuple[int, int] | None:
        """The group's own (min, max) size, if it has one. Optional."""
        return None

    def describe(self) -> str:
        """A short human description of the group, for progress lines."""
        return self.name

    def close(self) -> None:
        """Release resources (clients, simulated hosts). Called once at the end."""

    def notice_watcher(self, instance: Instance) -> Mapping[str, Any] | None:
        """The interruption-notice watcher the supervisor on ``instance`` runs, or None.

        ``{"watcher": NAME, **options}``: a built-in watcher of
        ``spotring.worker_image.notices`` (``aws``, ``gcp``, ``azure``) or
        ``"package.module:Class"`` of the plugin's own, importable on the hosts, made
        with the options as keyword arguments. Its notices take the host out of the
        ring at a commit boundary, with nothing rolled back.
        """
        return None

    def keep_size(self) -> None:
        """Hold the group at the size spotring asked for, where the cloud lowers it by
        itself when a member is deleted or evicted (an Azure scale set does; Auto Scaling
        and managed instance groups keep their size).

        Called by the controller on its thread after each successful refresh while it
        steers a job, never by a listing or ``spotring discover``. The size is the one
        :meth:`set_target_size` asked for, or the one a :meth:`replace_instance` or
        :meth:`host_noticed` kept. The default does nothing.
        """

    def host_noticed(self, instance: Instance, notice: InterruptionNotice) -> None:
        """``instance`` announced it will be taken and is leaving the job.

        Called on the controller thread. Providers start its replacement here where the
        cloud allows it without taking the host first; the default does nothing.
        """

    def job_finished(self, options: argparse.Namespace) -> None:
        """Called once when the training job ends, before :meth:`close`.

        Providers use it for clean-up a user asked for, e.g. scaling the group down.
        """


class ProviderRegistry:
    """Provider classes by name, filled through ``spotring_register_providers``."""

    def __init__(self) -> None:
        self._providers: dict[str, type[Provider]] = {}

    def add(self, provider: type[Provider]) -> None:
        """Register ``provider`` under its ``name``.

        Raises ``TypeError`` for a class that is not a :class:`Provider` and
        ``ValueError`` for a name already taken.
        """
        if not (isinstance(provider, type) and issubclass(provider, Provider)):
            raise TypeError(f"{provider!r} is not a spotring Provider subclass")
        name = getattr(provider, "name", None)
        if not isinstance(name, str) or not name:
            raise TypeError(f"{provider.__qualname__} has no 'name' class attribute")
        if name in self._providers and self._providers[name] is not provider:
            taken = self._providers[name]
            raise ValueError(
                f"provider name {name!r} is taken by {taken.__module__}.{taken.__qualname__}"
            )
        self._providers[name] = provider

    def get(self, name: str) -> type[Provider]:
        """The provider registered as ``name``; ``KeyError`` naming the choices if none."""
        try:
            return self._providers[name]
        except KeyError:
            choices = ", ".join(sorted(self._providers)) or "none installed"
            raise KeyError(f"unknown provider {name!r} (choose from: {choices})") from None

    def names(self) -> list[str]:
        return sorted(self._providers)

    def __iter__(self) -> Iterator[type[Provider]]:
        return iter(self._providers[name] for name in self.names())

    def __contains__(self, name: object) -> bool:
        return name in self._providers
