"""How the controller calls providers and hooks: a ``ProviderError`` passes through,
anything else (a provider's or plugin's bug) becomes a :class:`ControllerError` that
names the call, so the controller's thread stops with one message instead of dying.

The controller and its rooms (steering, replacements, notice watchers) call through
here, and every hook through the plugin manager's relay (``pm.hook``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

import pluggy

from spotring.core import ProviderError

log = logging.getLogger(__name__)

T = TypeVar("T")

__all__ = ["ControllerError", "call", "emit", "unexpected"]


class ControllerError(ProviderError):
    """A provider or plugin raised something other than a :class:`ProviderError`: a bug.

    Not retryable; the message names where it happened."""

    retryable = False


def call(what: str, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Call a provider or decision hook; a non-ProviderError becomes ControllerError."""
    try:
        return function(*args, **kwargs)
    except ProviderError:
        raise
    except Exception as error:
        raise unexpected(what, error) from error


def emit(hook: pluggy.HookRelay, name: str, **kwargs: Any) -> None:
    """Call the event hook ``name`` through the plugin manager. spotring's manager
    isolates the plugins (one plugin's exception is logged once and the others
    still hear the event); with a bare pluggy manager an exception stops the
    controller as a plugin's bug."""
    call(f"the {name} hook", getattr(hook, name), **kwargs)


def unexpected(what: str, error: Exception) -> ControllerError:
    """``error``, raised while doing ``what``, as the controller's one-line error."""
    log.debug("unexpected error while %s", what, exc_info=error)
    return ControllerError(f"{what} failed unexpectedly: {type(error).__name__}: {error}")
