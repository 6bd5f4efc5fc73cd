"""Provider plugins: one module per built-in instance group (local, aws, ...)."""

from spotring.providers.base import (
    ConfigurationError,
    Instance,
    InstanceState,
    InterruptionNotice,
    Lifecycle,
    Provider,
    ProviderError,
    ProviderRegistry,
)

__all__ = [
    "ConfigurationError",
    "Instance",
    "InstanceState",
    "InterruptionNotice",
    "Lifecycle",
    "Provider",
    "ProviderError",
    "ProviderRegistry",
]
