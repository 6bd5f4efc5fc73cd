"""Hook specifications: every way a plugin can extend spotring.

Plugins implement these with ``@spotring.autoscaler.hookimpl`` and are found through the
``spotring.providers`` entry-point group. Only functions whose names start with
``spotring_`` are taken as hook implementations.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from spotring.autoscaler.plugins import ProviderRegistry
    from spotring.providers.base import Instance, Provider

PROJECT = "spotring"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)
"""Marks a plugin's function as an implementation of one of the hooks below."""


# -------------------------------------------------------------------- registration


@hookspec
def spotring_register_providers(registry: ProviderRegistry) -> None:
    """Register provider classes.

    Called once, when the plugin manager is built, on every plugin.

    :param registry: call ``registry.add(ProviderClass)`` for each provider the plugin
        offers; the class's ``name`` attribute is the key users pass to ``--provider``.
        Adding a second provider under a name already taken raises ``ValueError``.
    """


# ---------------------------------------------------------------- command line


@hookspec
def spotring_add_provider_options(provider: type[Provider], group: argparse._ArgumentGroup) -> None:
    """Add command-line options for ``provider``.

    Called when ``spotring run`` or ``spotring discover`` builds its parser for the
    chosen provider, so ``spotring run --provider NAME --help`` shows the options.
    spotring's own implementation calls ``provider.add_arguments(group)``; other plugins
    may add options that they read back in their own hooks.

    :param provider: the provider class the user chose.
    :param group: the argument group to add options to.
    """


# ---------------------------------------------------------------------- events


@hookspec
def spotring_inventory_changed(
    added: Sequence[Instance], removed: Sequence[Instance], ready: Sequence[Instance]
) -> None:
    """The set of READY instances changed.

    Called on the controller thread after a refresh that changed membership; keep it
    quick. Return values are ignored.

    :param added: instances that became READY.
    :param removed: instances that stopped being READY (gone, draining, failed).
    :param ready: every READY instance after the change.
    """


@hookspec
def spotring_host_failed(instance: Instance, reason: str) -> None:
    """A host was taken out of the job because a worker on it failed or it was preempted.

    Called on the thread that learned of the failure, before the provider is asked to
    replace the instance. Return values are ignored.

    :param instance: the instance as last listed.
    :param reason: a short human explanation, e.g. ``"worker exited with -9"``.
    """
