"""Which of the driver's environment variables a worker gets.

horovodrun forwards the driver's whole environment as ``K=V`` arguments on every
worker's command line, cloud credentials included, where ``ps`` shows them. spotring
forwards only what a worker needs, plus what the user names (``-x NAME`` or
``--env NAME=VALUE``, as with mpirun), and hands it over through the supervisor's stdin
(see ``spotring.worker_image.supervisor``), never through argv.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

FORWARDED_NAMES: frozenset[str] = frozenset(
    {"PATH", "HOME", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ", "TMPDIR", "VIRTUAL_ENV"}
)
"""Forwarded by exact name: what a process expects to find, and no secret."""

FORWARDED_PREFIXES: tuple[str, ...] = (
    "HOROVOD_",
    "PYTHON",
    "LC_",
    "CUDA_",
    "NCCL_",
    "GLOO_",
    "OMP_",
    "TORCH_",
)
"""Forwarded by prefix: Horovod's, Python's, locale, and CUDA/NCCL/Gloo/OpenMP/torch
settings."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def parse_forwarded(items: Iterable[str], environ: Mapping[str, str]) -> dict[str, str]:
    """Resolve ``-x NAME`` / ``--env NAME[=VALUE]`` items to values.

    ``NAME`` takes the driver's value; ``NAME=VALUE`` sets one. Raises ``ValueError``
    for a malformed item or a ``NAME`` the driver's environment does not have.
    """
    forwarded: dict[str, str] = {}
    for item in items:
        name, has_value, value = item.partition("=")
        if not _NAME.fullmatch(name):
            raise ValueError(f"--env {item!r}: expected NAME or NAME=VALUE")
        if has_value:
            forwarded[name] = value
        elif name in environ:
            forwarded[name] = environ[name]
        else:
            raise ValueError(f"--env {name}: not set in spotring's environment")
    return forwarded


def worker_base_environment(
    environ: Mapping[str, str], forwarded: Mapping[str, str] = {}
) -> dict[str, str]:
    """The allow-listed part of ``environ``, plus the user's ``forwarded`` variables."""
    base = {
        name: value
        for name, value in environ.items()
        if name in FORWARDED_NAMES or name.startswith(FORWARDED_PREFIXES)
    }
    base.update(forwarded)
    return base
