"""Wrapping a method of Horovod's ``State`` and of every subclass that overrides it.

A training script may use ``hvd.elastic.TorchState``, spotring's ``TorchState`` or its
own subclass, defined before or after spotring's hooks are installed (the hooks go in
when the script imports Horovod). Wrapping ``State.<method>`` alone would miss every
override, so each class that defines the method gets its own wrapper: the ones that
exist now, and through ``State.__init_subclass__`` the ones defined later. Wrappers
that must act once per call (an override calling ``super().commit()``) keep their own
depth count.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

Wrap = Callable[[Callable[..., Any]], Callable[..., Any]]


def wrap_in_state_classes(elastic: ModuleType, method: str, wrap: Wrap) -> None:
    """Replace ``method`` of ``elastic.State`` and of each subclass that defines its
    own, now and for subclasses defined later, by ``wrap(original)``."""
    state = elastic.State
    setattr(state, method, wrap(state.__dict__[method]))
    previous = state.__dict__.get("__init_subclass__")

    def __init_subclass__(cls: Any, **kwargs: Any) -> None:
        if previous is not None:
            previous.__func__(cls, **kwargs)
        else:
            super(state, cls).__init_subclass__(**kwargs)
        if method in cls.__dict__:
            setattr(cls, method, wrap(cls.__dict__[method]))

    state.__init_subclass__ = classmethod(__init_subclass__)
    for subclass in _subclasses(state):  # defined before the hook was installed
        if method in subclass.__dict__:
            setattr(subclass, method, wrap(subclass.__dict__[method]))


def _subclasses(cls: type) -> list[type]:
    found, stack = [], list(cls.__subclasses__())
    while stack:
        sub = stack.pop()
        found.append(sub)
        stack.extend(sub.__subclasses__())
    return found
