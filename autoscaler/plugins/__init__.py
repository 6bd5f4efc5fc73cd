"""spotring's plugin machinery, a room of its own:

* :mod:`~spotring.autoscaler.plugins.manager`: the plugin manager factory
  (:func:`get_plugin_manager`), the provider registry it fills, the disable list and
  hook tracing;
* :mod:`~spotring.autoscaler.plugins.isolation`: an event hook's implementations kept
  from one another's failures;
* :mod:`~spotring.autoscaler.plugins.builtins`: the plugins spotring registers itself
  (the built-in providers, its own hook implementations);
* :mod:`~spotring.autoscaler.plugins.policy`: spotring's own answers to the decision
  hooks, registered ``trylast``.

The hook specifications are :mod:`spotring.autoscaler.hookspecs`. A plugin author
imports what a plugin needs from :mod:`spotring.plugin`.
"""

from spotring.autoscaler.plugins.builtins import BUILTIN_PLUGINS
from spotring.autoscaler.plugins.manager import (
    DISABLE_ENV,
    ENTRY_POINT_GROUP,
    TRACE_ENV,
    SpotringPluginManager,
    get_plugin_manager,
    provider_registry,
)
from spotring.core.hooks import hookimpl
from spotring.providers.base import ProviderRegistry

__all__ = [
    "BUILTIN_PLUGINS",
    "DISABLE_ENV",
    "ENTRY_POINT_GROUP",
    "TRACE_ENV",
    "ProviderRegistry",
    "SpotringPluginManager",
    "get_plugin_manager",
    "hookimpl",
    "provider_registry",
]
