"""Object store emulators for the checkpoint tests, started once per session.

Each fixture yields a :class:`Backend`: how to name a fresh prefix in it and the
environment its SDK needs to find the emulator (set per test with monkeypatch):

- ``local_backend``: a temporary directory.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

BACKENDS = ("local",)
"""Every backend, in the order the parametrized tests run them."""

_serial = itertools.count()


@dataclass
class Backend:
    """One object store the tests can open stores in."""

    name: str
    base: str
    """URI of the bucket, container or directory; each test works under a prefix of it."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment the store's SDK needs (endpoint, emulator credentials)."""

    def uri(self, label: str = "t") -> str:
        """A URI under ``base`` no other call returns."""
        return f"{self.base}/{label}-{next(_serial)}"


@pytest.fixture(scope="session")
def local_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    root: Path = tmp_path_factory.mktemp("checkpoints")
    yield Backend("local", str(root))
