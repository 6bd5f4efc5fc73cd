"""The plugin manager: finds provider plugins and the hooks they implement."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator

import pluggy

from spotring.autoscaler import hookspecs, policy
from spotring.providers.base import Provider

ENTRY_POINT_GROUP = "spotring.providers"
"""Entry-point group third-party provider plugins register under."""

BUILTIN_PLUGINS: tuple[str, ...] = (
    "spotring.providers.local",
    "spotring.providers.aws",
    "spotring.providers.gcp",
    "spotring.providers.azure",
    "spotring.providers.script",
)
"""Modules of the built-in plugins, registered exactly as entry-point plugins are."""

TRACE_ENV = "SPOTRING_TRACE_HOOKS"
"""Set to 1 to print every hook call and result to stderr."""

DISABLE_ENV = "SPOTRING_DISABLE_PLUGINS"
"""Comma-separated plugin names (entry-point names or built-in module names) to skip."""

hookimpl = hookspecs.hookimpl


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


class SpotringPluginManager(pluggy.PluginManager):
    """A pluggy manager that takes only ``spotring_``-prefixed functions as hooks."""

    def parse_hookimpl_opts(self, plugin: object, name: str) -> pluggy.HookimplOpts | None:
        if not name.startswith("spotring_"):
            return None
        return super().parse_hookimpl_opts(plugin, name)


def get_plugin_manager(
    disable: Iterable[str] = (), *, load_entry_points: bool = True
) -> SpotringPluginManager:
    """Build a plugin manager with the built-in and installed plugins registered.

    :param disable: plugin names to skip, on top of those in ``$SPOTRING_DISABLE_PLUGINS``.
    :param load_entry_points: load third-party plugins from the ``spotring.providers``
        entry-point group (tests turn this off for isolation).
    """
    pm = SpotringPluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    blocked = set(disable) | {
        name.strip() for name in os.environ.get(DISABLE_ENV, "").split(",") if name.strip()
    }
    for name in blocked:
        pm.set_blocked(name)
    # spotring's own hook implementations (below, and its default policy) cannot be
    # disabled; the policy's are trylast, so a plugin's answer comes first.
    pm.register(sys.modules[__name__], name=__name__)
    pm.register(policy, name=policy.__name__)
    for module_name in BUILTIN_PLUGINS:
        if pm.is_blocked(module_name):
            continue
        __import__(module_name)
        pm.register(sys.modules[module_name], name=module_name)
    if load_entry_points:
        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    pm.check_pending()
    if os.environ.get(TRACE_ENV) == "1":
        pm.trace.root.setwriter(lambda message: print(message, end="", file=sys.stderr))
        pm.enable_tracing()
    return pm


def provider_registry(pm: pluggy.PluginManager) -> ProviderRegistry:
    """Collect every provider the registered plugins offer."""
    registry = ProviderRegistry()
    pm.hook.spotring_register_providers(registry=registry)
    return registry


@hookimpl
def spotring_add_provider_options(provider: type[Provider], group: object) -> None:
    """spotring's own implementation: the provider's ``add_arguments``."""
    provider.add_arguments(group)  # type: ignore[arg-type]
