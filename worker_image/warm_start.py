"""Worker side of a warm join: a worker started ahead waits in ``hvd.init`` for its slot.

spotring's launcher starts a READY host's workers before Horovod hears of the host
(:mod:`spotring.driver.warm_pool`). Each runs the user's script as usual up to
``hvd.init``: the interpreter, the torch and Horovod imports, whatever the script does
before ``init``. There this hold stops it and pays ahead what a torch script pays
just after ``init`` (CUDA's initialisation, torch's lazy imports). Then it tells its
supervisor "ready" on the channel the supervisor gave it (a socket whose descriptor
is in :data:`WARM_FD_ENV`) and waits for the slot's environment
(``HOROVOD_RANK``, ``HOROVOD_SIZE``, ...), which the driver sends when Horovod places the
host in a ring. Then ``init`` runs exactly as in a worker started at that moment.

The hold wraps ``HorovodBasics.init``, to which every framework's ``hvd.init`` is
bound, as soon as ``horovod.common.basics`` is imported: no ``init`` can run in a warm
worker before it has its slot. (Run without a slot, Horovod would form a ring of one
and train alone.) If the hold cannot be installed, the worker exits at once and the
host is started cold instead.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import socket
import sys
import threading
from collections.abc import Callable
from types import ModuleType
from typing import Any

from spotring.worker_image import horovod_internals
from spotring.worker_image.after_import import call_after_import
from spotring.worker_image.wire import JOB_KEY_ENV, JOB_KEY_FD_ENV, WARM_READY_MARKER
from spotring.worker_image.wire import WARM_FD_ENV as WARM_FD_ENV  # re-exported

log = logging.getLogger(__name__)

READY = b"ready\n"
"""What a held worker writes on its channel."""

READY_MARKER = WARM_READY_MARKER

MAX_SLOT_BYTES = 1 << 16
"""The slot's environment is a few hundred bytes: a longer line is not one."""

CANNOT_HOLD_EXIT = 3
"""A warm worker that could not install the hold exits with this, before any ``init``."""

_channel_lock = threading.Lock()
_channel_fd: int | None = None


def hold_until_assigned(init: Callable[..., Any]) -> Callable[..., Any]:
    """``init``, which in a warm worker first waits for the slot's environment."""

    def init_when_assigned(*args: Any, **kwargs: Any) -> Any:
        channel = take_channel()
        if channel is not None:
            with channel:
                os.environ.update(wait_for_slot(channel))
        return init(*args, **kwargs)

    init_when_assigned.__wrapped__ = init  # type: ignore[attr-defined]  # as functools.wraps
    return init_when_assigned


def take_channel() -> socket.socket | None:
    """The channel to the supervisor, the first time only (later inits are resets;
    the torch backend's warm worker takes it itself: ``torch_warm_start``)."""
    global _channel_fd
    with _channel_lock:
        fd, _channel_fd = _channel_fd, None
    return socket.socket(fileno=fd) if fd is not None else None


def wait_for_slot(channel: socket.socket) -> dict[str, str]:
    """Say "ready" on ``channel`` and wait for the slot's environment (never the job
    key, which the worker read at its start).

    Ends the process when the channel closes first: the supervisor is stopping this
    worker (its host left before Horovod placed it in a ring).
    """
    _warm_up_torch()
    channel.sendall(READY)
    line = bytearray()
    while not line.endswith(b"\n") and len(line) <= MAX_SLOT_BYTES:
        chunk = channel.recv(4096)
        if not chunk:
            raise SystemExit("spotring: this warm worker was stopped before it joined the job")
        line += chunk
    env = json.loads(line)
    if not isinstance(env, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise SystemExit("spotring: the slot's environment is not a map of strings")
    # Whatever the sender: the key never goes into os.environ (nor so to children).
    env.pop(JOB_KEY_ENV, None)
    env.pop(JOB_KEY_FD_ENV, None)
    return env


def _warm_up_torch() -> None:
    """Pay ahead what a torch training script pays right after ``hvd.init``.

    ``torch._dynamo``, which torch imports when the script builds its first optimizer
    (1.2 s on an idle 2-core machine, 3-4 s beside a training ring); and torch's CUDA
    state on GPU hosts (``torch.cuda.init``: the driver and the device count; a
    device's context is made when the script first uses that device, so the script
    still picks its own).
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return
    try:
        importlib.import_module("torch._dynamo")
        if torch.cuda.is_available():
            torch.cuda.init()
    except Exception as error:  # the script meets it again after init, and says so
        log.warning("spotring: torch not warmed up ahead: %s", error)


def install(basics: ModuleType) -> None:
    """Hold ``HorovodBasics.init`` of ``horovod.common.basics`` (``basics``)."""
    horovod_internals.wrap_basics_init(basics, hold_until_assigned)


def install_when_imported(channel_fd: int) -> None:
    """In a warm worker: hold Horovod's ``init`` from the moment Horovod is imported,
    until the slot's environment arrives on ``channel_fd`` (from :data:`WARM_FD_ENV`,
    which the caller removes from the environment: the script's own child processes
    are no warm workers).

    Exits the process with :data:`CANNOT_HOLD_EXIT` when the hold cannot be installed.
    """
    global _channel_fd
    os.set_inheritable(channel_fd, False)
    _channel_fd = channel_fd

    def on_import(basics: ModuleType) -> None:
        try:
            install(basics)
        except Exception as error:
            print(f"spotring: a warm worker cannot wait for its slot: {error}", file=sys.stderr)
            sys.stderr.flush()
            os._exit(CANNOT_HOLD_EXIT)

    call_after_import("horovod.common.basics", on_import)
