"""``spotring providers``: the installed providers, one line each."""

from __future__ import annotations

import pluggy

from spotring.autoscaler.cli.usage import AddCommand
from spotring.autoscaler.plugins import provider_registry


def add_parser(add_command: AddCommand) -> None:
    """The ``providers`` command's parser."""
    add_command("providers", help="list the installed providers")


def list_providers(pm: pluggy.PluginManager) -> int:
    """Print each provider's name, description and module."""
    registry = provider_registry(pm)
    width = max((len(name) for name in registry.names()), default=0)
    for provider in registry:
        print(f"{provider.name:<{width}}  {provider.description}  ({provider.__module__})")
    return 0
