"""The elastic options of a job, importable without Horovod (the CLI builds them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from spotring.worker_image import wire

if TYPE_CHECKING:
    from spotring.checkpoint.store import ObjectStore


BACKENDS = ("horovod", "torch")
"""``--backend``: Horovod's elastic driver, or the torch backend's restart mode
(:mod:`spotring.driver.torch_restart`)."""

DEFAULT_MAX_RESTARTS = 3
"""``--max-restarts``' default with ``--backend torch``. torchrun's is 0; a spot job
expects reclaims."""


@dataclass(frozen=True)
class DurableOptions:
    """``--checkpoint`` and its settings: where the workers write durable copies of
    their commits, how often, how many are kept, and the job they belong to."""

    uri: str
    every: float = 60.0
    keep: int = 3
    job_id: str = ""
    """Names the job in the checkpoints and the prefix's lock: the same command run
    again is the same job (it resumes), another command is refused the prefix."""
    store: ObjectStore | None = field(default=None, compare=False, repr=False)
    """The store ``uri`` names, as the options' composition opened it, for the driver's
    own use (its lock, the newest checkpoint); None: opened where first needed. The
    workers open theirs from ``uri``."""

    def worker_env(self) -> dict[str, str]:
        """What each worker is told (names from :mod:`spotring.worker_image.wire`;
        nothing secret: the hosts' own identities reach the storage)."""
        return {
            wire.CHECKPOINT_URI_ENV: self.uri,
            wire.CHECKPOINT_EVERY_ENV: repr(self.every),
            wire.CHECKPOINT_KEEP_ENV: str(self.keep),
            wire.JOB_ID_ENV: self.job_id,
        }


@dataclass(frozen=True)
class ElasticOptions:
    """The elastic options of ``horovodrun``, by the same names, and the worker env.

    The worker counts (``-np``, ``--min-np``, ``--max-np``) are the job's
    :class:`~spotring.core.JobShape`, which the controller sizes by too.
    """

    reset_limit: int | None = None
    cooldown_range: tuple[int, int] | None = None
    elastic_timeout: int = 600
    start_timeout: int = 120
    nics: tuple[str, ...] = ()
    verbose: int = 0
    warm_start: bool = True
    """Start a READY host's workers before it joins (:mod:`spotring.driver.warm_pool`)."""
    hang_timeout: float | None = None
    """``--hang-timeout``: fail the member that holds up a ring that made no progress
    (no commit) for this many seconds since its last commit or its planning; None: off."""
    durable: DurableOptions | None = None
    """``--checkpoint``: durable copies of the commits, and a ring that lost every
    member starts again from the newest (:mod:`spotring.driver.durable`)."""
    worker_env: Mapping[str, str] = field(default_factory=dict)
    """The allow-listed and user-forwarded environment every worker starts from."""
