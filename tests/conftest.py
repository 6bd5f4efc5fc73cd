"""Shared fixtures."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def pytest_configure(config: pytest.Config) -> None:
    """Let the jobs the tests start take Ctrl-C. A shell starts a background job with
    SIGINT ignored, children inherit that, and the interruption tests would signal a
    driver that ignores it; a handler here is reset to the default in each child."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def repo() -> Path:
    """The repository root."""
    return REPO


@pytest.fixture
def python() -> str:
    """The interpreter of the project's venv (the one running the tests)."""
    return sys.executable


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``-n 2 --dist loadgroup``, as scripts/test.sh runs the suite)
    every end-to-end test goes to one worker and runs one at a time, as without xdist:
    their timing is part of what they check. The rest runs beside them on the other."""
    for item in items:
        if item.get_closest_marker("e2e") is not None:
            item.add_marker(pytest.mark.xdist_group("e2e"))
