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
