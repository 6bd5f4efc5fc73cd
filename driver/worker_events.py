"""What the launcher tells of the workers it runs: one typed interface.

Each ring-side object that follows workers (the failure and notice routers, the progress
tracker, the ring-loss judge, a provider that tracks its worker processes) subclasses
:class:`WorkerEvents` and overrides the events it needs; the rest are no-ops. The
launcher calls them on its own threads (one per slot, and one per output pump); a
listener that raises is logged and does not keep the event from the others.
"""

from __future__ import annotations

from dataclasses import dataclass

from spotring.worker_image.notices import Notice


@dataclass(frozen=True)
class WorkerExit:
    """How a worker process ended."""

    host: str
    local_rank: int
    rank: int
    exit_code: int
    stopped: bool
    """True when spotring/Horovod stopped the worker (host removed, job over)."""
    reason: str = ""
    """Why spotring failed a worker it stopped (:meth:`ProcessLauncher.fail_worker`)."""

    @property
    def failed(self) -> bool:
        """A failure is an error exit that nobody asked for."""
        return self.exit_code != 0 and not self.stopped


class WorkerEvents:
    """The launcher's events about the processes it starts; each a no-op here."""

    def process_started(self, host: str, process_group: int) -> None:
        """A process group started on ``host``: a worker, or one started ahead of its
        join (warm)."""

    def process_exited(self, host: str, process_group: int) -> None:
        """That process group is gone (told once)."""

    def worker_started(self, host: str, process_group: int) -> None:
        """A process group now runs one of Horovod's slots on ``host``."""

    def slot_started(self, host: str, local_rank: int) -> None:
        """The slot ``local_rank`` of ``host`` has a worker (told with
        :meth:`worker_started`)."""

    def worker_exited(self, exit: WorkerExit, process_group: int) -> None:
        """A slot's worker ended (``process_group`` -1: it never started)."""

    def worker_noticed(self, host: str, notice: Notice) -> None:
        """A worker's supervisor relayed ``host``'s interruption notice (verified)."""

    def worker_progress(
        self,
        host: str,
        local_rank: int,
        commits: int,
        age_s: float,
        beat_s: float | None,
        epochs: float | None = None,
        samples: int | None = None,
    ) -> None:
        """A worker's verified progress: its commits, the age of the last, the age of its
        last heartbeat (None for a worker that never beat), and the job's epochs and
        samples at the last commit, from its state's elastic sampler (None: it has none)."""
