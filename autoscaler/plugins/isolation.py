"""The isolation of an event hook's implementations: one that raises is reported and
the call goes on (:class:`~spotring.autoscaler.plugins.manager.SpotringPluginManager`
wraps each as it registers it)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Generator
from typing import Any

__all__ = ["isolated", "isolated_wrapper"]


def isolated(function: Callable[..., Any], report: Callable[[Exception], None]) -> Any:
    """``function``, reporting an exception instead of raising it (result: None)."""

    @functools.wraps(function)
    def isolated(*args: Any) -> Any:
        try:
            return function(*args)
        except Exception as error:
            report(error)
            return None

    isolated.spotring_isolated = True  # type: ignore[attr-defined]  # a marker on the wrapper
    return isolated


def isolated_wrapper(function: Callable[..., Any], report: Callable[[Exception], None]) -> Any:
    """A wrapper implementation (a generator) whose own failures are reported: one that
    fails before its ``yield`` is left out of the call; one that fails after it leaves
    the result as the inner implementations made it."""

    @functools.wraps(function)
    def isolated(*args: Any) -> Generator[None, Any, Any]:
        try:
            inner = function(*args)
            next(inner)
        except Exception as error:  # StopIteration too: a wrapper that did not yield
            report(error)
            return (yield)
        try:
            result = yield
        except BaseException as error:  # the inner call failed: the wrapper may handle it
            try:
                inner.throw(error)
            except StopIteration as stop:
                return stop.value
            raise RuntimeError(f"{function.__qualname__} did not stop after its yield") from None
        try:
            inner.send(result)
        except StopIteration as stop:
            return stop.value
        except Exception as error:
            report(error)
            return result
        inner.close()
        report(RuntimeError("a wrapper must yield once"))
        return result

    isolated.spotring_isolated = True  # type: ignore[attr-defined]  # a marker on the wrapper
    return isolated
