"""Run code in a worker right after a module of the user's script is first imported."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs each of its callbacks with the module ``name`` right after it is first
    executed. One finder per name: the import system asks only the first finder that
    answers, so a second finder for the same name would never run."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.callbacks: list[Callable[[ModuleType], None]] = []

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # once
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader, callbacks = spec.loader, self.callbacks
        exec_module = loader.exec_module

        def exec_then_call(module: ModuleType) -> None:
            exec_module(module)
            for callback in callbacks:
                callback(module)

        loader.exec_module = exec_then_call  # type: ignore[method-assign]  # patching the loader
        return spec


def call_after_import(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(module)`` once the module ``name`` has been executed: now if it
    already was, else right after its first import (before the importer sees it), after
    the callbacks registered for it before."""
    if name in sys.modules:
        callback(sys.modules[name])
        return
    for finder in sys.meta_path:
        if isinstance(finder, _AfterImport) and finder.name == name:
            finder.callbacks.append(callback)
            return
    finder = _AfterImport(name)
    finder.callbacks.append(callback)
    sys.meta_path.insert(0, finder)
