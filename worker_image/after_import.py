"""Run code in a worker right after a module of the user's script is first imported."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``callback(module)`` right after the module ``name`` is first executed."""

    def __init__(self, name: str, callback: Callable[[ModuleType], None]) -> None:
        self._name = name
        self._callback = callback

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self._name:
            return None
        sys.meta_path.remove(self)  # once
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        loader, callback = spec.loader, self._callback
        exec_module = loader.exec_module

        def exec_then_call(module: ModuleType) -> None:
            exec_module(module)
            callback(module)

        loader.exec_module = exec_then_call  # type: ignore[method-assign]  # patching the loader
        return spec


def call_after_import(name: str, callback: Callable[[ModuleType], None]) -> None:
    """Call ``callback(module)`` once the module ``name`` has been executed: now if it
    already was, else right after its first import (before the importer sees it)."""
    if name in sys.modules:
        callback(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, callback))
