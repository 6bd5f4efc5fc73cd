"""A restart-mode worker started ahead of its attempt: interpreter up, torch imported.

The torch backend's restart mode (:mod:`spotring.driver.torch_restart`) runs the
user's ``python SCRIPT ARG...`` or ``python -m MODULE ARG...`` as::

    python -m spotring.worker_image.torch_warm_start SCRIPT ARG...
    python -m spotring.worker_image.torch_warm_start -m MODULE ARG...

Started warm (the supervisor's channel, which ``sitecustomize`` handed to
:mod:`spotring.worker_image.warm_start`), it imports torch and warms it up as a Horovod
warm worker does, says "ready" and waits for its attempt's environment (``RANK``,
``WORLD_SIZE``, ``MASTER_PORT``, ...: what torchrun's agent sets), which arrives as a
JSON line on that channel, never in argv. Started cold (no channel: no worker was
started ahead, or it died), it goes on at once. Either way, rank 0 first checks that
the group's store port is free on its host (:data:`PORT_TAKEN_EXIT`), then the script
runs unchanged, as ``python SCRIPT`` would run it: ``__main__``, ``sys.argv`` as given,
the script's directory first on ``sys.path``.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import socket
import sys
from collections.abc import Mapping
from typing import NoReturn

from spotring.worker_image import warm_start

USAGE_EXIT = 2
"""As ``python`` exits for a script it cannot open."""

PORT_TAKEN_EXIT = 75
"""Rank 0 found its ``MASTER_PORT`` taken on this host (the driver picks it free on its
own machine), before the script ran: the driver retries the attempt on another port
(sysexits' ``EX_TEMPFAIL``)."""


def main(argv: list[str]) -> None:
    """Wait for the attempt's environment if started warm, then run ``argv``'s script
    (``SCRIPT ARG...`` or ``-m MODULE ARG...``) in this interpreter."""
    if not argv or (argv[0] == "-m" and len(argv) < 2):
        _usage("expected SCRIPT [ARG...] or -m MODULE [ARG...]")
    channel = warm_start.take_channel()
    if channel is not None:
        _import_torch()
        with channel:
            given = warm_start.wait_for_slot(channel)  # warms torch up first
        os.environ.update(given)
        _apply_threads(given)
    _check_store_port()
    if argv[0] == "-m":
        sys.argv = [argv[1], *argv[2:]]  # run_module puts the module's file first
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        return
    script = argv[0]
    if not os.path.isfile(script):
        _usage(f"can't open file {os.path.abspath(script)!r}: no such file")
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.realpath(script))  # as `python SCRIPT` does
    runpy.run_path(script, run_name="__main__")


def _import_torch() -> None:
    """Pay ahead what a worker started with its attempt pays before its script's first
    line: ``import torch`` (seconds). Without torch here, nothing: the script says so."""
    with contextlib.suppress(ImportError):
        import torch  # noqa: F401


def _apply_threads(given: Mapping[str, str]) -> None:
    """torch read ``OMP_NUM_THREADS`` when it was imported ahead: a different value
    given with the attempt (its host's worker count changed) is applied now."""
    threads = given.get("OMP_NUM_THREADS", "")
    torch = sys.modules.get("torch")
    if torch is not None and threads.isdigit() and int(threads) > 0:
        torch.set_num_threads(int(threads))


def _check_store_port() -> None:
    """On rank 0, whose script's ``init_process_group`` serves the group's store on
    ``MASTER_PORT`` on this host: end with :data:`PORT_TAKEN_EXIT` if the port is
    taken here, rather than let the script fail with ``EADDRINUSE``."""
    port = os.environ.get("MASTER_PORT", "")
    if os.environ.get("RANK") != "0" or not port.isdigit():
        return
    error = _bind_error(int(port))
    if error is not None:
        print(f"spotring: the store's port {port} is taken on this host ({error}); "
              "the attempt is started again on another", file=sys.stderr)  # fmt: skip
        raise SystemExit(PORT_TAKEN_EXIT)


def _bind_error(port: int) -> OSError | None:
    """Why ``port`` cannot be bound as torch's ``TCPStore`` binds it (c10d's
    ``SocketListenOp``: ``SO_REUSEADDR``, the IPv6 wildcard as a dual-stack socket,
    else IPv4's); None when it can."""
    error: OSError | None = None
    for family, address in ((socket.AF_INET6, "::"), (socket.AF_INET, "")):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                if family == socket.AF_INET6:
                    probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
                probe.bind((address, port))
                return None
        except OSError as failed:  # no IPv6 on this host, or taken
            error = failed
    return error


def _usage(message: str) -> NoReturn:
    print(f"spotring torch_warm_start: {message}", file=sys.stderr)
    raise SystemExit(USAGE_EXIT)


if __name__ == "__main__":
    main(sys.argv[1:])
