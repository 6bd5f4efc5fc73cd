"""Run by Python at start-up in every worker process spotring's launcher starts.

The launcher puts this directory first on ``PYTHONPATH`` and sets
``SPOTRING_PEER_ABORT=1``; here the peer-failure abort is installed for whenever the
script imports ``horovod.torch``, whatever state class it uses. Its job key is read
now, before the script runs, from the pipe the supervisor handed down (descriptor
``SPOTRING_JOB_KEY_FD``), which is then closed. Then the next ``sitecustomize`` on the
path (the environment's own, if any) runs as it would have.
In a worker started ahead of its join (``SPOTRING_WARM_FD`` set), Horovod's ``init``
is held until the driver sends the worker its slot (``spotring.worker_image.warm_start``).
With ``SPOTRING_PROGRESS_FD``, the state's commits are counted into the supervisor's
shared page (``spotring.worker_image.progress``); the descriptor is closed here too.
With ``SPOTRING_CHECKPOINT_URI``, rank 0 copies commits to durable storage and a ring
without state loads the newest (``spotring.worker_image.durable``).
"""

import contextlib
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
    if os.environ.get("SPOTRING_PROGRESS_FD"):  # progress.PROGRESS_FD_ENV
        try:
            from spotring.worker_image import progress

            progress.install_when_imported()  # maps the page, closes its descriptor
        except Exception as error:  # never stop the user's script over this
            print(f"spotring: commits not counted: {error}", file=sys.stderr)
            fd = os.environ.pop("SPOTRING_PROGRESS_FD", "")
            if fd.isdigit():
                with contextlib.suppress(OSError):
                    os.close(int(fd))
    if os.environ.get("SPOTRING_CHECKPOINT_URI"):  # durable.URI_ENV
        try:
            from spotring.worker_image import durable

            durable.install_when_imported()
        except Exception as error:  # the job runs; its commits are not made durable
            print(f"spotring durable: not installed, no durable checkpoints: {error}",
                  file=sys.stderr)  # fmt: skip
    key_fd = os.environ.get("SPOTRING_JOB_KEY_FD", "")  # peer_abort.JOB_KEY_FD_ENV
    if not key_fd and os.environ.get("SPOTRING_PEER_ABORT") != "1":
        return
    try:
        from spotring.worker_image import peer_abort

        # Before the script runs: its children must not inherit the key's pipe.
        peer_abort.take_job_key()
        if os.environ.get("SPOTRING_PEER_ABORT") == "1":
            peer_abort.install_when_imported()
    except Exception as error:  # never stop the user's script over this
        print(f"spotring: fast peer-failure abort not installed: {error}", file=sys.stderr)
        if key_fd.isdigit() and os.environ.pop("SPOTRING_JOB_KEY_FD", ""):
            with contextlib.suppress(OSError):
                os.close(int(key_fd))  # unread: no child may read the key from it


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
