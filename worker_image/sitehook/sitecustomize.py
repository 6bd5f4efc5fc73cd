"""Run by Python at start-up in every worker process spotring's launcher starts.

The launcher puts this directory first on ``PYTHONPATH`` and sets
``SPOTRING_PEER_ABORT=1``; here the peer-failure abort is installed for whenever the
script imports ``horovod.torch``, whatever state class it uses. Then the next
``sitecustomize`` on the path (the environment's own, if any) runs as it would have.
In a worker started ahead of its join (``SPOTRING_WARM_FD`` set), Horovod's ``init``
is held until the driver sends the worker its slot (``spotring.worker_image.warm_start``).
"""

import os
import sys


def _prepare_worker() -> None:
    warm_fd = os.environ.pop("SPOTRING_WARM_FD", "")  # warm_start.WARM_FD_ENV
    if warm_fd:
        try:
            from spotring.worker_image import warm_start

            warm_start.install_when_imported(int(warm_fd))
        except Exception as error:  # no init may run without its slot: end here
            print(f"spotring: a warm worker cannot wait for its slot: {error}", file=sys.stderr)
            sys.stderr.flush()
            os._exit(3)  # warm_start.CANNOT_HOLD_EXIT
    if os.environ.get("SPOTRING_PEER_ABORT") != "1":
        return
    try:
        from spotring.worker_image import peer_abort

        peer_abort.install_when_imported()
    except Exception as error:  # never stop the user's script over this
        print(f"spotring: fast peer-failure abort not installed: {error}", file=sys.stderr)


def _run_next_sitecustomize() -> None:
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_prepare_worker()
_run_next_sitecustomize()
