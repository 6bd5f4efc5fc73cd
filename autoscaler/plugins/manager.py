"""The plugin manager: finds provider plugins and the hooks they implement."""

from __future__ import annotations

import functools
import importlib
import logging
import os
import sys
import threading
from collections.abc import Iterable

import pluggy

from spotring.autoscaler import hookspecs
from spotring.autoscaler.plugins.builtins import BUILTIN_PLUGINS, OWN_PLUGINS
from spotring.autoscaler.plugins.isolation import isolated, isolated_wrapper
from spotring.providers.base import ProviderRegistry

log = logging.getLogger("spotring.autoscaler.plugins")  # the name it always logged under

__all__ = [
    "DISABLE_ENV",
    "ENTRY_POINT_GROUP",
    "TRACE_ENV",
    "SpotringPluginManager",
    "get_plugin_manager",
    "provider_registry",
]

ENTRY_POINT_GROUP = "spotring.providers"
"""Entry-point group third-party provider plugins register under."""

TRACE_ENV = "SPOTRING_TRACE_HOOKS"
"""Set to 1 to print every hook call and result to stderr."""

DISABLE_ENV = "SPOTRING_DISABLE_PLUGINS"
"""Comma-separated names to skip: provider names, as ``spotring providers`` shows them,
or plugin names (an entry point's name, a built-in's module name)."""


class SpotringPluginManager(pluggy.PluginManager):
    """A pluggy manager that takes only ``spotring_``-prefixed functions as hooks, and
    isolates the plugins of an event hook (:func:`spotring.autoscaler.hookspecs.event`)
    from one another.

    An implementation of an event hook that raises, a ``wrapper=True`` one included, is
    logged once per plugin and hook (then at debug level, with its traceback) and the
    call goes on: the other plugins still hear the event, and the caller never sees the
    error. The isolation is part of each implementation as the manager registers it, so
    it holds however the hook is called (``pm.hook.NAME(...)``, ``call_historic``, a
    subset caller) and under tracing. Registration and decision hooks are not isolated:
    their errors reach the caller.
    """

    disabled: frozenset[str] = frozenset()
    """Provider names that :func:`provider_registry` leaves out."""

    def __init__(self, project_name: str) -> None:
        super().__init__(project_name)
        self._broken: set[tuple[str, str]] = set()
        self._broken_lock = threading.Lock()

    def parse_hookimpl_opts(self, plugin: object, name: str) -> pluggy.HookimplOpts | None:
        if not name.startswith("spotring_"):
            return None
        return super().parse_hookimpl_opts(plugin, name)

    def _verify_hook(self, hook: pluggy.HookCaller, hookimpl: pluggy.HookImpl) -> None:
        # pluggy checks every implementation against its spec here, whichever comes
        # first and before a historic hook's calls are replayed to it: the one place
        # where each event implementation is seen exactly as it will be called.
        super()._verify_hook(hook, hookimpl)
        spec = hook.spec
        if spec is None or not hookspecs.is_event(spec.function):
            return
        if getattr(hookimpl.function, "spotring_isolated", False):
            return
        report = functools.partial(self._report, hookimpl.plugin_name, hook.name)
        if hookimpl.wrapper or hookimpl.hookwrapper:
            hookimpl.function = isolated_wrapper(hookimpl.function, report)  # type: ignore[misc]  # pluggy's Final
        else:
            hookimpl.function = isolated(hookimpl.function, report)  # type: ignore[misc]  # pluggy's Final

    def _report(self, plugin_name: str, hook_name: str, error: Exception) -> None:
        with self._broken_lock:
            first = (plugin_name, hook_name) not in self._broken
            self._broken.add((plugin_name, hook_name))
        if first:
            log.error(
                "plugin %s failed in %s: %s: %s (not logged again)",
                plugin_name,
                hook_name,
                type(error).__name__,
                error,
            )
        log.debug("plugin %s failed in %s", plugin_name, hook_name, exc_info=error)


def get_plugin_manager(
    disable: Iterable[str] = (), *, load_entry_points: bool = True
) -> SpotringPluginManager:
    """Build a plugin manager with the built-in and installed plugins registered.

    :param disable: names to skip, on top of those in ``$SPOTRING_DISABLE_PLUGINS``:
        a provider's name (as ``spotring providers`` shows it) leaves that provider out,
        and a plugin that offers no other provider is not registered at all; a plugin's
        name (its entry point's, or a built-in's module name) skips the plugin.
    :param load_entry_points: load third-party plugins from the ``spotring.providers``
        entry-point group (tests turn this off for isolation).
    """
    pm = SpotringPluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    disabled = {name.strip() for name in disable if name.strip()} | {
        name.strip() for name in os.environ.get(DISABLE_ENV, "").split(",") if name.strip()
    }
    # spotring's own hook implementations cannot be disabled; its policy's are
    # trylast, so a plugin's answer comes first.
    for name in disabled - {name for name, _ in OWN_PLUGINS}:
        pm.set_blocked(name)
    for name, module_name in OWN_PLUGINS:
        pm.register(importlib.import_module(module_name), name=name)
    for module_name in BUILTIN_PLUGINS:
        if pm.is_blocked(module_name):
            continue
        __import__(module_name)
        pm.register(sys.modules[module_name], name=module_name)
    if load_entry_points:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    if disabled:
        pm.disabled = frozenset(disabled)
        for offering, offered in _providers_by_plugin(pm).items():
            if offered and offered <= pm.disabled:
                pm.unregister(offering)
    pm.check_pending()
    if os.environ.get(TRACE_ENV) == "1":
        pm.trace.root.setwriter(lambda message: print(message, end="", file=sys.stderr))
        pm.enable_tracing()
    return pm


def _providers_by_plugin(pm: pluggy.PluginManager) -> dict[object, set[str]]:
    """The names of the providers each plugin registers, asked of one plugin at a time."""
    offered = {}
    for impl in pm.hook.spotring_register_providers.get_hookimpls():
        others = [plugin for plugin in pm.get_plugins() if plugin is not impl.plugin]
        registry = ProviderRegistry()
        pm.subset_hook_caller("spotring_register_providers", others)(registry=registry)
        offered[impl.plugin] = set(registry.names())
    return offered


def provider_registry(pm: pluggy.PluginManager) -> ProviderRegistry:
    """Collect every provider the registered plugins offer, less the disabled ones."""
    registry = ProviderRegistry()
    pm.hook.spotring_register_providers(registry=registry)
    disabled = pm.disabled if isinstance(pm, SpotringPluginManager) else frozenset()
    if not disabled.intersection(registry.names()):
        return registry
    kept = ProviderRegistry()
    for provider in registry:
        if provider.name not in disabled:
            kept.add(provider)
    return kept
