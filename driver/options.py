"""The elastic options of a job, importable without Horovod (the CLI builds them)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


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
    """``--hang-timeout``: fail the slowest member of a ring that made no progress (no
    commit) for this many seconds since its last commit or its formation; None: off."""
    worker_env: Mapping[str, str] = field(default_factory=dict)
    """The allow-listed and user-forwarded environment every worker starts from."""
