"""Taking what other threads reported: a loop's tick takes every item queued so far."""

from __future__ import annotations

import queue
from collections.abc import Iterator
from typing import Protocol, TypeVar

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class _Takes(Protocol[T_co]):
    def get_nowait(self) -> T_co: ...


def taken(reported: _Takes[T]) -> Iterator[T]:
    """What other threads put in ``reported`` (a ``queue.Queue`` or ``SimpleQueue``),
    taken in order until it is empty."""
    while True:
        try:
            yield reported.get_nowait()
        except queue.Empty:
            return
