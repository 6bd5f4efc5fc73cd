"""The errors a provider raises, which the controller and the CLI act on."""

from __future__ import annotations


class ProviderError(Exception):
    """A provider could not do what was asked. Raised for every cloud API failure."""

    retryable: bool = True
    """Whether trying again later may succeed (throttling, 5xx, network)."""


class ConfigurationError(ProviderError):
    """The request can never succeed as configured: missing group, bad credentials,
    missing permissions. The message names what the user must fix."""

    retryable = False
