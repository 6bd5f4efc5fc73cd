"""Details of group members (address, type, zone, spot-ness), asked for once while a
VM runs, so a steady group costs one call per refresh."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)
D = TypeVar("D")


class DescribeOnce(Generic[K, D]):
    """Details of group members, described once and remembered while they stay valid.

    ``describe(keys)`` fetches details for members not remembered (in as few calls as
    the cloud allows) and returns them by key; a key it leaves out is a member the
    cloud no longer knows. ``keep(detail)`` says whether a detail may be reused next
    time (typically: the VM is running, so its address and type are final). Key a
    member by whatever changes when the cloud puts a new VM in its place (an id, or
    a name and an id where names are reused).
    """

    def __init__(
        self, describe: Callable[[Sequence[K]], Mapping[K, D]], keep: Callable[[D], bool]
    ) -> None:
        self._describe = describe
        self._keep = keep
        self._known: dict[K, D] = {}

    def get(self, keys: Sequence[K]) -> dict[K, D]:
        """Details of ``keys``: remembered ones, plus one ``describe`` of the rest."""
        missing = [k for k in keys if k not in self._known]
        fresh = self._describe(missing) if missing else {}
        details: dict[K, D] = {}
        for key in keys:
            detail = self._known[key] if key in self._known else fresh.get(key)
            if detail is not None:
                details[key] = detail
        # Forget members that left or stopped running: the next VM gets described anew.
        self._known = {k: d for k, d in details.items() if self._keep(d)}
        return details

    def __len__(self) -> int:
        return len(self._known)


def batches(items: Sequence[T], size: int) -> Iterator[Sequence[T]]:
    """``items`` in consecutive slices of at most ``size``."""
    for start in range(0, len(items), size):
        yield items[start : start + size]
