"""What both modes of the torch backend's driver share: how a job fails, a worker's
base environment, ``OMP_NUM_THREADS`` as torchrun sets it, and notices to the
controller (:mod:`.torch_restart`, :mod:`.torch_inplace`)."""

from __future__ import annotations

from spotring.core import InterruptionNotice
from spotring.driver.job_control import JobController
from spotring.driver.options import ElasticOptions
from spotring.driver.worker_events import WorkerEvents
from spotring.worker_image import wire
from spotring.worker_image.notices import Notice


class TorchJobFailed(RuntimeError):
    """The job failed: a worker failed with no restart left, or hosts never came."""


def worker_base_env(options: ElasticOptions, job_key: bytes) -> dict[str, str]:
    """Every torch worker's environment before its mode's own variables: the job's
    (``-x``), unbuffered output, Gloo's and NCCL's interfaces from
    ``--network-interface``, and the job key (which the launcher sends on the
    supervisor's stdin, never in an environment block)."""
    env = {**options.worker_env, "PYTHONUNBUFFERED": "1"}
    if options.nics:
        env["GLOO_SOCKET_IFNAME"] = options.nics[0]
        env["NCCL_SOCKET_IFNAME"] = ",".join(options.nics)
    env[wire.JOB_KEY_ENV] = job_key.hex()
    return env


def omp_threads(local_world_size: int, given: str | None) -> str | None:
    """``OMP_NUM_THREADS`` as ``torchrun`` sets it: the user's (``given``), else 1 with
    several workers per host, else unset (None)."""
    if given is not None:
        return given
    return "1" if local_world_size > 1 else None


class NoticeToController(WorkerEvents):
    """A verified interruption notice takes the host out of the inventory (the
    controller drains it); the attempt's next look sees it leave and restarts while
    the noticed host's worker still runs."""

    def __init__(self, controller: JobController) -> None:
        self._controller = controller

    def worker_noticed(self, host: str, notice: Notice) -> None:
        self._controller.host_noticed(host, InterruptionNotice(notice.kind, notice.deadline))
