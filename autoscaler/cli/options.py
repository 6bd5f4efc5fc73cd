"""The provider's options: added to a command's parser from the
``spotring_add_provider_options`` hook, and read back apart from spotring's own, so a
provider never sees the whole command line."""

from __future__ import annotations

import argparse
import warnings

import pluggy

from spotring.autoscaler.composition import compose_groups
from spotring.core import ConfigurationError, CoreOptions
from spotring.providers.base import Provider

__all__ = [
    "add_provider_options",
    "core_options",
    "make_groups",
    "make_provider",
    "provider_options",
]

_PROVIDER_DESTS = "_spotring_provider_dests"
"""Where the parsed options keep the names of the provider's own options."""


def add_provider_options(
    parser: argparse.ArgumentParser,
    pm: pluggy.PluginManager | None,
    provider: type[Provider] | None,
) -> None:
    """``--provider NAME``, and that provider's options in a group of their own."""
    parser.add_argument("--provider", required=True, metavar="NAME", help="instance group provider")
    if provider is not None and pm is not None:
        group = parser.add_argument_group(f"{provider.name} provider options")
        pm.hook.spotring_add_provider_options(provider=provider, group=group)
        # What the provider gets of the parsed options: only these (provider_options).
        own = tuple(action.dest for action in group._group_actions)
        parser.set_defaults(**{_PROVIDER_DESTS: own})


def provider_options(options: argparse.Namespace) -> argparse.Namespace:
    """The provider's own options of ``options``: what its option group added."""
    own = getattr(options, _PROVIDER_DESTS, ())
    return argparse.Namespace(**{dest: getattr(options, dest) for dest in own})


def core_options(options: argparse.Namespace) -> CoreOptions:
    """What a provider may read of spotring's own options (``run`` or ``discover``)."""
    return CoreOptions(
        slots_per_host=options.slots_per_host,
        num_proc=getattr(options, "num_proc", None),  # `discover` has no -np
        resize=not getattr(options, "no_resize", False),  # nor --no-resize
    )


def make_groups(provider: type[Provider], options: argparse.Namespace) -> tuple[Provider, ...]:
    """The job's groups (:func:`~spotring.autoscaler.composition.compose_groups`), made
    from the provider's own options of ``options`` and the typed core ones."""
    return compose_groups(provider, provider_options(options), core_options(options))


def make_provider(provider: type[Provider], options: argparse.Namespace) -> Provider:
    """The provider of a job of one group. Deprecated: :func:`make_groups` (a job may
    have several groups, which no one provider stands for); several are a
    :class:`ConfigurationError` here."""
    warnings.warn(
        "spotring.autoscaler.cli.make_provider is deprecated: use make_groups",
        DeprecationWarning,
        stacklevel=2,
    )
    groups = make_groups(provider, options)
    if len(groups) > 1:
        raise ConfigurationError("a job of several groups has no one provider: use make_groups")
    return groups[0]
