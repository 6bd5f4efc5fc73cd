"""What spotring needs of the installed Horovod, checked before a run.

spotring drives Horovod 0.28.1 (the last release) partly through private attributes:
the elastic driver's lock and host manager, the rendezvous server's store, the worker
notification service's request handler. A different Horovod may lack them, and then a
job would fail half way through in a thread. :func:`require_horovod` checks the version
and every one of those attributes at start, and fails with one line that says what is
wrong and how to fix it. The attributes are those the two modules that hold every such
use list: :mod:`spotring.driver.horovod_internals` and
:mod:`spotring.worker_image.horovod_internals`.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence

from spotring.driver import horovod_internals as driver_internals
from spotring.worker_image import horovod_internals as worker_internals

TESTED_HOROVOD_VERSIONS: tuple[str, ...] = ("0.28.1",)

SETUP_HINT = (
    "run scripts/setup.sh, or build horovod==0.28.1 from its sdist with "
    "CMAKE_CXX_STANDARD 17 and HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1"
    " (see docs/getting-started.md)"
)

PATCHED_INTERNALS: tuple[tuple[str, str], ...] = (
    *driver_internals.INTERNALS,
    *worker_internals.INTERNALS,
)
"""(``module`` or ``module:Class``, attribute) pairs spotring reaches into."""


class HorovodSetupError(RuntimeError):
    """Horovod (or torch) is missing, unbuilt or not a version spotring works with.

    The message is one line: what is wrong and how to fix it."""


def missing_internals(internals: Sequence[tuple[str, str]] | None = None) -> list[str]:
    """The ``module[:Class].attribute`` names of ``internals`` (default:
    :data:`PATCHED_INTERNALS`) that do not exist."""
    missing = []
    for where, attribute in PATCHED_INTERNALS if internals is None else internals:
        module_name, _, class_name = where.partition(":")
        try:
            owner: object = importlib.import_module(module_name)
            if class_name:
                owner = getattr(owner, class_name)
        except (ImportError, AttributeError):
            missing.append(f"{where}.{attribute}")
            continue
        if not (hasattr(owner, attribute) or _set_in_init(owner, attribute)):
            missing.append(f"{where}.{attribute}")
    return missing


def _set_in_init(owner: object, attribute: str) -> bool:
    """Whether ``owner`` is a class whose ``__init__`` assigns ``self.attribute``."""
    init = getattr(owner, "__init__", None) if isinstance(owner, type) else None
    code = getattr(init, "__code__", None)
    return code is not None and attribute in code.co_names


def require_horovod() -> str:
    """Check torch and Horovod as ``spotring run`` needs them; returns Horovod's version.

    Raises :class:`HorovodSetupError` with one line when torch or Horovod is missing,
    Horovod was built without PyTorch, its version is not one spotring was tested with,
    or an internal spotring relies on is missing.
    """
    try:
        import torch  # noqa: F401
    except ImportError:
        raise HorovodSetupError(
            "spotring run needs torch: pip install torch (CPU: torch==2.13.0), then Horovod; "
            + SETUP_HINT
        ) from None
    try:
        import horovod
    except ImportError:
        raise HorovodSetupError(f"spotring run needs Horovod 0.28.1: {SETUP_HINT}") from None
    version = getattr(horovod, "__version__", "unknown")
    if version not in TESTED_HOROVOD_VERSIONS:
        raise HorovodSetupError(
            f"spotring works with Horovod {', '.join(TESTED_HOROVOD_VERSIONS)}, found {version}: "
            + SETUP_HINT
        )
    try:
        import horovod.torch
    except ImportError as error:
        raise HorovodSetupError(
            f"Horovod {version} was built without PyTorch support ({error}): {SETUP_HINT}"
        ) from None
    missing = missing_internals()
    if missing:
        raise HorovodSetupError(
            f"Horovod {version} lacks what spotring relies on ({', '.join(missing)}): " + SETUP_HINT
        )
    return version
