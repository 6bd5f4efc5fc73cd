"""The provider contract: what spotring asks of a cloud instance group.

A provider plugin is a subclass of :class:`Provider` registered through the
``spotring_register_providers`` hook. spotring makes one provider object for the group
the user names and calls it from the controller's thread, never from Horovod's driver
thread, with two exceptions: ``worker_started``/``worker_exited`` (a provider that
declares ``tracks_worker_processes``) run on the launcher's threads, and
``job_finished`` on the command's thread once the controller has stopped. A provider
that shares state with those guards it with a lock.

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
import functools
import inspect
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, ClassVar

# The value types a provider reports and the errors it raises live in spotring.core;
# they are re-exported here, where plugin authors have always imported them.
from spotring.core.capacity import CapacityShortage, ShortageCause
from spotring.core.errors import ConfigurationError, ProviderError
from spotring.core.instance import (
    Instance,
    InstanceState,
    InterruptionNotice,
    Lifecycle,
    is_valid_address,
)
from spotring.core.job import hosts_for_slots
from spotring.core.options import CoreOptions
from spotring.core.prices import HourlyPrice

__all__ = [
    "CapacityShortage",
    "ConfigurationError",
    "CoreOptions",
    "Instance",
    "InstanceState",
    "InterruptionNotice",
    "Lifecycle",
    "Provider",
    "ProviderError",
    "ProviderRegistry",
    "ShortageCause",
    "hosts_for_slots",
    "is_valid_address",
]


class Provider(abc.ABC):
    """A group of instances spotring can list and steer.

    Subclasses set :attr:`name`, implement the abstract methods, and declare optional
    capabilities as class attributes (spotring consults the attribute, never probes
    for a method). They are made by :meth:`from_options` from their own command-line
    options (added in :meth:`add_arguments`, so ``spotring run --provider NAME --help``
    lists them) and spotring's :class:`CoreOptions`; they never see the rest of the
    command line.
    """

    name: ClassVar[str]
    """Short name users pass to ``--provider``; the registry's key."""
    description: ClassVar[str] = ""
    """One line shown by ``spotring providers``."""

    # ------------------------------------------------------------ capabilities

    can_resize: bool = True
    """False when :meth:`set_target_size` cannot work (e.g. the ``script`` provider
    without a resize command): spotring then never steers the group's size."""
    can_replace: bool = True
    """False when :meth:`replace_instance` cannot work: failed hosts are only left out."""
    can_remove: bool = False
    """True when :meth:`remove_instance` works: the controller may then hand a host of
    this group back (a fallback host, once a preferred group has capacity again)."""
    runs_workers_locally: ClassVar[bool] = False
    """True when the group's hosts are simulated on this machine and workers run as
    local processes (the embedded ``local`` provider, and test doubles of clouds)."""
    tracks_worker_processes: ClassVar[bool] = False
    """True when the provider wants to hear which worker process groups run on which
    host (:meth:`worker_started`, :meth:`worker_exited`): a provider that simulates
    hosts locally kills them with the host."""
    sdk_modules: ClassVar[tuple[str, ...]] = ()
    """Modules the provider needs beyond spotring's own (its cloud's SDK);
    ``spotring check`` reports the first that does not import."""
    sdk_extra: ClassVar[str] = ""
    """What to ``pip install`` for :attr:`sdk_modules`, e.g. ``spotring[aws]``."""
    needs_credentials: ClassVar[bool] = False
    """True when the provider calls an API that needs credentials: ``spotring check``
    then reports :meth:`credential_source`."""

    # -------------------------------------------------------- what it reports

    last_refresh_calls: int | None = None
    """API operations the last :meth:`list_instances` made, when the provider counts
    them (shown with each refresh); None when it does not."""
    events: Sequence[tuple[float, str]] = ()
    """What the group did by itself that the job's summary lists: (seconds since
    start, one line), e.g. the ``local`` provider's chaos."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _adapt_old_contract(cls)

    @classmethod
    def add_arguments(cls, group: argparse._ArgumentGroup) -> None:
        """Add this provider's command-line options to ``group``. Optional."""

    @classmethod
    @abc.abstractmethod
    def from_options(cls, options: argparse.Namespace, core: CoreOptions) -> Provider:
        """Make the provider from its own options and spotring's core ones.

        ``options`` holds only what this provider's :meth:`add_arguments` (and other
        plugins' ``spotring_add_provider_options`` for it) added; ``core`` is what the
        provider may read of spotring's own options. Raises :class:`ConfigurationError`
        for options that cannot work.
        """

    @classmethod
    def credential_source(cls) -> str | None:
        """Where the provider's credentials are found, e.g. ``"found (env)"``, or None
        when there are none. Never the credentials themselves, and no API call: it is
        what ``spotring check`` prints when :attr:`needs_credentials` is set. May
        import the SDK of :attr:`sdk_modules`; an exception is reported as
        credentials that could not be read."""
        return None

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

    @classmethod
    def groups_from_options(cls, options: argparse.Namespace, core: CoreOptions) -> list[Provider]:
        """One provider per group the options name, in the user's order of preference.

        A job may span several groups of one provider (``--group`` given more than
        once). The default makes one provider with :meth:`from_options`; a provider
        that takes several groups overrides this. Raises :class:`ConfigurationError`.
        """
        return [cls.from_options(options, core)]

    def group_name(self) -> str:
        """A short name for the group, unique within the job: what
        :attr:`Instance.group`, events, metrics and the report show. Default: the
        provider's name."""
        return self.name

    def group_lifecycle(self) -> Lifecycle | None:
        """What the group launches (spot or on-demand), read from its configuration,
        or None when unknown (the controller then goes by its members). May call the
        cloud (reads only); called on the controller's thread, and on the price
        book's when a ``--price`` names a lifecycle."""
        return None

    def capacity_shortage(self, since: float) -> CapacityShortage | None:
        """The newest failure to add members to the group that the cloud reported at or
        after ``since`` (epoch seconds), or None.

        Reads only, like :meth:`list_instances`; called on the controller's thread after
        a refresh while the group is below the size asked of it. Raises
        :class:`ProviderError` when the cloud cannot be asked. The default reports
        nothing: the controller then goes by the group staying below its target.
        """
        return None

    def remove_instance(self, instance_id: str) -> None:
        """Take ``instance_id`` out of the group for good and lower the group's target
        size by one (a fallback host handed back). Idempotent: a member already gone is
        not an error. Only called when :attr:`can_remove` is set."""
        raise NotImplementedError(f"{self.name} cannot remove a single member")

    def hourly_price(self) -> HourlyPrice | None:
        """The price of one of the group's members for one hour, read from the
        cloud's price API, or None when unknown (the default). Reads only; called
        on the price book's own thread (beside the controller's calls, so it must
        not disturb them: the SDK clients are thread-safe) at most once per price
        refresh; may raise (the job's :class:`~spotring.core.prices.PriceBook`
        keeps its last good answer)."""
        return None

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
        ring at a commit boundary, with nothing rolled back. The default: no watcher.
        """
        return None

    def keep_size(self) -> None:
        """Hold the group at the size spotring asked for, where the cloud lowers it by
        itself when a member is deleted or evicted (an Azure scale set does; Auto Scaling
        and managed instance groups keep their size).

        Called by the controller on its thread after each successful refresh while it
        steers a job and :attr:`can_resize` is set, never by a listing or ``spotring
        discover``. The size is the one :meth:`set_target_size` asked for, or the one a
        :meth:`replace_instance` or :meth:`host_noticed` kept. The default does nothing.
        """

    def host_noticed(self, instance: Instance, notice: InterruptionNotice) -> None:
        """``instance`` announced it will be taken and is leaving the job.

        Called on the controller thread. Providers start its replacement here where the
        cloud allows it without taking the host first; the default does nothing.
        """

    def worker_started(self, address: str, process_group: int) -> None:
        """The launcher started a worker process group on the host at ``address``.

        Called only when :attr:`tracks_worker_processes` is set; the default does
        nothing."""

    def worker_exited(self, address: str, process_group: int) -> None:
        """A worker process group on the host at ``address`` ended.

        Called only when :attr:`tracks_worker_processes` is set; the default does
        nothing."""

    def job_finished(self) -> None:
        """Called once when the training job ends, before :meth:`close`.

        Providers use it for clean-up a user asked for, e.g. scaling the group down
        (an option of their own, kept from :meth:`from_options`).
        """


def _positional_parameters(function: Callable[..., Any]) -> int | None:
    """How many positional parameters ``function`` names (None: it takes ``*args``)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        return None
    kinds = [p.kind for p in parameters]
    if inspect.Parameter.VAR_POSITIONAL in kinds:
        return None
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(kind in positional for kind in kinds)


def _adapt_old_contract(cls: type[Provider]) -> None:
    """Keep a provider written for the old contract working, with a DeprecationWarning.

    The old ``from_options(cls, options)`` got the whole parsed command line: it now
    gets a namespace of its own options plus the core ones under their option names
    (:meth:`CoreOptions.as_option_names`). The old ``job_finished(self, options)``
    gets an empty namespace (no provider read it).
    """
    made = cls.__dict__.get("from_options")
    if isinstance(made, classmethod) and _positional_parameters(made.__func__) == 2:
        cls.from_options = _old_from_options(made.__func__)  # type: ignore[method-assign]  # adapting an old plugin class
        _warn_old(cls, "from_options(cls, options)", "from_options(cls, options, core)")
    finished = cls.__dict__.get("job_finished")
    if callable(finished) and _positional_parameters(finished) == 2:
        cls.job_finished = _old_job_finished(finished)  # type: ignore[method-assign]  # adapting an old plugin class
        _warn_old(cls, "job_finished(self, options)", "job_finished(self)")


def _old_from_options(function: Callable[..., Provider]) -> Any:
    @functools.wraps(function)
    def from_options(
        cls: type[Provider], options: argparse.Namespace, core: CoreOptions | None = None
    ) -> Provider:
        if core is not None:  # called by spotring; without core, by an old-style caller
            options = argparse.Namespace(**{**core.as_option_names(), **vars(options)})
        return function(cls, options)

    return classmethod(from_options)


def _old_job_finished(function: Callable[[Provider, Any], None]) -> Callable[..., None]:
    @functools.wraps(function)
    def job_finished(self: Provider, options: Any = None) -> None:
        function(self, argparse.Namespace() if options is None else options)

    return job_finished


def _warn_old(cls: type[Provider], old: str, new: str) -> None:
    warnings.warn(
        f"{cls.__module__}.{cls.__qualname__}: {old} is the old provider contract; "
        f"write {new} (see docs/plugins.md, 'Writing a provider plugin')",
        DeprecationWarning,
        stacklevel=5,  # the class statement (under ABCMeta.__new__, __init_subclass__)
    )


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
