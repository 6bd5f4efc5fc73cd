"""A job's ``--group`` values: each given once, and what the job calls each."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from spotring.providers.base import ConfigurationError


def refuse_repeated_groups(
    groups: Sequence[tuple[str, str]], fold: Callable[[str], str] = str
) -> None:
    """Raise :class:`ConfigurationError` when one of a job's groups, ``(location,
    name)``, is given twice; ``fold`` makes names equal (``str.lower`` where the cloud
    ignores case)."""
    seen: set[tuple[str, str]] = set()
    for location, name in groups:
        key = (fold(location), fold(name))
        if key in seen:
            raise ConfigurationError(f"--group {location}/{name} is given more than once")
        seen.add(key)


def group_labels(groups: Sequence[tuple[str, str]], fold: Callable[[str], str] = str) -> list[str]:
    """What each of a job's groups, ``(location, name)`` in ``--group`` order, is called
    in it: the name alone where no other group has that name, else ``LOCATION/NAME``.
    Raises :class:`ConfigurationError` for a group given twice (see
    :func:`refuse_repeated_groups`)."""
    refuse_repeated_groups(groups, fold)
    names = [fold(name) for _, name in groups]
    return [
        name if names.count(fold(name)) == 1 else f"{location}/{name}" for location, name in groups
    ]
