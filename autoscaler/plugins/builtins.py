"""The plugins spotring registers itself: the built-in providers, and its own hook
implementations (the provider's options; its answers to the decision hooks, in
:mod:`~spotring.autoscaler.plugins.policy`)."""

from __future__ import annotations

import argparse

from spotring.core.hooks import hookimpl
from spotring.providers.base import Provider

__all__ = ["BUILTIN_PLUGINS", "OWN_PLUGINS", "spotring_add_provider_options"]

BUILTIN_PLUGINS: tuple[str, ...] = (
    "spotring.providers.local",
    "spotring.providers.aws",
    "spotring.providers.gcp",
    "spotring.providers.azure",
    "spotring.providers.script",
)
"""Modules of the built-in plugins, registered exactly as entry-point plugins are."""

OWN_PLUGINS: tuple[tuple[str, str], ...] = (
    ("spotring.autoscaler.plugins", __name__),
    ("spotring.autoscaler.policy", "spotring.autoscaler.plugins.policy"),
)
"""spotring's own hook implementations: (the name each is registered under, its module).
They cannot be disabled; the names are those they had before the plugin machinery
became a package, so that tracing, error lines and ``pm.get_plugin`` see no change."""


@hookimpl
def spotring_add_provider_options(provider: type[Provider], group: argparse._ArgumentGroup) -> None:
    """spotring's own implementation: the provider's ``add_arguments``."""
    provider.add_arguments(group)
