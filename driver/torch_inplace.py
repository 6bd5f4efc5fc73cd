"""The torch backend's in-place mode: the driver of ``spotring run --backend torch --in-place``.

The workers run a script built on :mod:`spotring.torch.inplace`: their processes live
across membership changes, and each *generation* (one process group) forms through the
driver's coordinator (:class:`~spotring.driver.torch_group_server.GroupServer`). This
driver starts a worker for every slot the inventory offers (up to ``--max-np``), and
decides the generations:

* **A member dies** (its process exits non-zero), or **hangs** (the progress tracker's
  judgment, as on the Horovod path): the generation is abandoned, so every survivor's
  pending collective fails at once and it rolls back to its last commit; the next
  generation is published at once with the survivors (and any joiner ready), and the
  dead member's host leaves the job (the controller replaces it).
* **A worker joins** (a new host's, started as soon as the inventory lists it): it
  imports torch and builds its model while the group trains on, then asks for its
  membership; only then is the next generation published, without abandoning the
  current one. Its members move over at their next commit (nothing rolled back), and
  the joiner is synced from them.
* **A host leaves** while its workers still run (its interruption notice, a hand-back
  to its group): the next generation is published without it, again without
  abandoning; its workers leave at their next commit, and are stopped once they ask
  for a membership they will not get. Nothing is rolled back.
* Every member exiting 0 ends the job. A member that ends in an older generation than
  the newest published (a joiner came as the training ended) never forms the newest:
  it is abandoned, and workers asking for a membership then are stopped.

Failures never count against a limit here: a survivor loses only the steps since its
last commit. Fewer than ``--min-np`` workers left: the driver waits
``--elastic-timeout`` for more, then fails the job.
"""

from __future__ import annotations

import logging
import os
import queue
import secrets
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from spotring.core.job import JobShape
from spotring.core.queues import taken
from spotring.driver.job_control import JobAborted, JobController
from spotring.driver.launcher import STOP_GRACE_SECONDS, ProcessLauncher, WorkerSpec
from spotring.driver.options import ElasticOptions
from spotring.driver.ring_events import Hang, RingEvents
from spotring.driver.ring_progress import RingProgress
from spotring.driver.torch_group_server import GroupServer
from spotring.driver.torch_workers import (
    NoticeToController,
    TorchJobFailed,
    omp_threads,
    worker_base_env,
)
from spotring.worker_image import wire
from spotring.worker_image.supervisor import local_address_towards

log = logging.getLogger(__name__)


POLL_SECONDS = 0.2
"""How often the driver looks at the inventory when nothing woke it."""
JOIN_BATCH_SECONDS = 5.0
"""How long workers ready to join wait for the others still starting, so that hosts
that came together join in one generation."""


@dataclass
class _Worker:
    name: str
    host: str
    local_rank: int
    stop: threading.Event = field(default_factory=threading.Event)
    leaving: str = ""
    """Why it is being stopped on purpose (its exit is then no failure); "" if not."""
    ready_since: float | None = None
    """When it first asked for a membership it had not been given (it is ready)."""


class TorchInplaceDriver:
    """Runs ``command`` as in-place torch workers (see the module).

    :param local: the workers run on this machine (the ``local`` provider): the
        coordinator listens on 127.0.0.1 only.
    """

    def __init__(
        self,
        command: Sequence[str],
        controller: JobController,
        launcher: ProcessLauncher,
        job: JobShape,
        options: ElasticOptions,
        events: RingEvents,
        *,
        local: bool = False,
    ) -> None:
        self._command = tuple(command)
        self._controller = controller
        self._launcher = launcher
        self._job = job
        self._options = options
        self._events = events
        self._local = local
        self._job_key = secrets.token_bytes(32)
        self._server = GroupServer(
            self._job_key, "127.0.0.1" if local else "0.0.0.0", on_asked=self._asked
        )
        self._progress = RingProgress(options.hang_timeout, events)
        launcher.add_listener(self._progress)
        launcher.add_listener(NoticeToController(controller))
        self._wake = threading.Event()
        self._exits: queue.Queue[tuple[str, int]] = queue.Queue()
        self._hangs: queue.Queue[Hang] = queue.Queue()
        self._workers: dict[str, _Worker] = {}
        self._threads: list[threading.Thread] = []
        self._members: list[str] = []
        self._count = 0
        self._address = ""
        self.world_sizes: list[int] = []

    # ------------------------------------------------------------------ the run

    def run(self) -> None:
        """Generations until every member of one exits 0. Raises
        :class:`TorchJobFailed` (too few workers for too long, a worker failing after the
        training ended) or ``JobAborted`` (the controller's fatal error, Ctrl-C)."""
        self._server.start()
        self._progress.start(self._hangs.put)
        try:
            self._loop()
        except KeyboardInterrupt as interrupt:
            raise JobAborted("interrupted", interrupt) from None
        finally:
            self._stop_all()
            self._progress.close()
            self._server.close()

    def _loop(self) -> None:
        short_since: float | None = time.monotonic()  # below --min-np since
        broken = False  # the current generation lost a member: abandon it
        finishing = False
        while True:
            error = self._controller.wait_for_fatal_error(timeout=0)
            if error is not None:
                raise JobAborted(str(error), error)
            broken |= self._take_hangs()
            for name, code in taken(self._exits):
                worker = self._workers.pop(name)
                received = self._server.received(name)
                self._server.forget(name)
                if name not in self._members:
                    continue
                self._members.remove(name)
                if code == 0:
                    finishing = True
                    if received < self._server.latest:
                        # It trained to the end before moving over to the newest
                        # generation, which waits for it: its joiners stop waiting now.
                        self._server.abandon()
                elif finishing:
                    raise TorchJobFailed(f"{_describe(worker)} exited with {code} at the end")
                else:
                    broken = True  # whatever the reason: its peers cannot go on with it
                    if not worker.leaving:
                        why = f"{_describe(worker)} exited with {code}"
                        log.info("%s: its generation is given up", why)
                        self._controller.host_failed(worker.host, why)
                        self._leave_host(worker.host, "its host failed")
            if finishing:
                self._stop_others("the training ended")
                if not self._members:
                    return
                self._wake.wait(POLL_SECONDS)
                self._wake.clear()
                continue
            hosts = self._hosts_now()
            self._start_workers(hosts)
            departed = self._departed(hosts)
            if self._decide(broken, departed):
                broken = False
                short_since = None
            elif broken and self._server.latest >= 0:
                self._server.abandon()  # survivors roll back now, and wait for more workers
            if len(self._members) >= self._job.min_num_proc:
                short_since = None
            elif short_since is None:
                short_since = time.monotonic()
            else:
                limit = (self._options.start_timeout if self._server.latest < 0
                         else self._options.elastic_timeout)  # fmt: skip
                if time.monotonic() - short_since > limit:
                    raise TorchJobFailed(
                        f"fewer than --min-np {self._job.min_num_proc} workers for {limit:g} s"
                    )
            self._stop_leavers()
            self._wake.wait(POLL_SECONDS)
            self._wake.clear()

    def _decide(self, broken: bool, departed: set[str]) -> bool:
        """Publish the next generation if one is due and possible; whether it was."""
        ready = self._ready()
        starting = [w for w in self._candidates() if w.ready_since is None]
        keep = [m for m in self._members if m not in departed]
        # Nobody stays to carry the state on: each commit is made durable before the
        # training goes on, so what the leaving hosts take with them is in storage.
        self._server.flush = bool(self._members) and not keep
        batch_done = not starting or any(
            time.monotonic() - (w.ready_since or 0) > JOIN_BATCH_SECONDS for w in ready
        )
        room = self._job.max_num_proc - len(keep)
        joining = [w.name for w in ready][: max(room, 0)] if batch_done else []
        if not (broken or departed or joining):
            return False
        if departed and not keep and joining:
            # Nobody stays: the joiners first join the leaving members, who hand them the
            # state in place; those leave in the generation after (the next call).
            self._publish(self._members + joining, abandon=broken, leaving=set())
            return True
        members = keep + joining
        if len(members) < self._job.min_num_proc:
            return False
        self._publish(members, abandon=broken, leaving=departed)
        return True

    def _publish(self, members: list[str], *, abandon: bool, leaving: set[str]) -> None:
        for name in leaving:
            self._workers[name].leaving = self._workers[name].leaving or "its host left"
        hosts = list(dict.fromkeys(self._workers[m].host for m in members))
        generation = self._server.publish(members, self._coordinator_address(), abandon=abandon)
        self._members = members
        self._controller.hosts_offered(hosts)
        self._controller.ring_formed(hosts)
        self.world_sizes.append(len(members))
        self._progress.ring_formed(len(members), hosts)
        self._events.ring_formed(len(members), sorted(hosts))
        log.info("generation %d: %d workers on %s%s", generation, len(members),
                 ", ".join(hosts), " (the last one given up)" if abandon else "")  # fmt: skip

    # ------------------------------------------------------------------ workers

    def _start_workers(self, hosts: Mapping[str, int]) -> None:
        """A worker for each slot of the inventory's hosts without one, up to
        ``--max-np`` workers that are not leaving."""
        running = {(w.host, w.local_rank) for w in self._workers.values()}
        # Workers of hosts that left (noticed, still training) take no room: their
        # replacements start now, while they finish.
        count = sum(1 for w in self._workers.values() if not w.leaving and w.host in hosts)
        for host, slots in hosts.items():
            for local_rank in range(slots):
                if count >= self._job.max_num_proc:
                    return
                if (host, local_rank) not in running:
                    self._start(host, local_rank, slots)
                    count += 1

    def _start(self, host: str, local_rank: int, local_size: int) -> None:
        name = f"w{self._count}"
        self._count += 1
        worker = _Worker(name, host, local_rank)
        self._workers[name] = worker
        self._server.admit(name)
        spec = self._spec(worker, local_size)
        thread = threading.Thread(
            target=self._run_worker, args=(spec, worker), name=f"spotring-torch-{name}", daemon=True
        )
        self._threads.append(thread)
        thread.start()

    def _run_worker(self, spec: WorkerSpec, worker: _Worker) -> None:
        exit_code, _ = self._launcher(spec, [worker.stop])  # never raises
        self._exits.put((worker.name, exit_code))
        self._wake.set()

    def _spec(self, worker: _Worker, local_size: int) -> WorkerSpec:
        env = worker_base_env(self._options, self._job_key)
        env["LOCAL_RANK"] = str(worker.local_rank)
        env["LOCAL_WORLD_SIZE"] = str(local_size)
        threads = omp_threads(local_size, os.environ.get("OMP_NUM_THREADS"))
        if threads is not None:
            env["OMP_NUM_THREADS"] = threads
        # ProcessGroupNCCL must abort its communicator, not end the process (docs/torch.md).
        env.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
        env[wire.TORCH_COORDINATOR_ENV] = (
            f"{self._coordinator_address(worker.host)}:{self._server.port}"
        )
        env[wire.TORCH_WORKER_ENV] = worker.name
        return WorkerSpec(
            host=worker.host,
            local_rank=worker.local_rank,
            rank=-1,
            argv=self._command,
            env=env,
            cwd=os.getcwd(),
            notices=self._controller.notice_watcher(worker.host),
        )

    def _coordinator_address(self, towards: str | None = None) -> str:
        """Where workers reach this driver: 127.0.0.1 for local workers, else this
        machine's address on its route to the first worker host."""
        if self._local:
            return "127.0.0.1"
        if not self._address and towards is not None:
            self._address = local_address_towards(towards) or ""
        if not self._address:
            raise TorchJobFailed(f"no route from the driver to {towards}")
        return self._address

    def _asked(self, name: str) -> None:
        """A worker waits for a membership (the server's thread)."""
        worker = self._workers.get(name)
        if worker is None:
            return
        if worker.ready_since is None:
            worker.ready_since = time.monotonic()
        self._progress.slot_asked(worker.host, worker.local_rank)
        self._wake.set()

    def _candidates(self) -> list[_Worker]:
        """Workers that may join: not members, not leaving."""
        return [w for w in self._workers.values() if w.name not in self._members and not w.leaving]

    def _ready(self) -> list[_Worker]:
        """Workers ready to join (asking, not members, not leaving), oldest first."""
        waiting = self._server.waiting()
        ready = [w for w in self._candidates() if w.name in waiting]
        return sorted(ready, key=lambda w: w.ready_since or 0)

    def _departed(self, hosts: Mapping[str, int]) -> set[str]:
        """Members whose host left the inventory (noticed, handed back, gone); other
        workers there are stopped now."""
        departed = set()
        for worker in self._workers.values():
            if worker.host in hosts or worker.leaving:
                continue
            if worker.name in self._members:
                departed.add(worker.name)
            else:
                worker.leaving = "its host left"
                worker.stop.set()
        return departed

    def _leave_host(self, host: str, why: str) -> None:
        for worker in self._workers.values():
            if worker.host == host and not worker.leaving:
                worker.leaving = why
                if worker.name not in self._members:
                    worker.stop.set()

    def _stop_leavers(self) -> None:
        """Stop leaving workers once out of the group (asking for what they won't get)."""
        waiting = self._server.waiting()
        for worker in self._workers.values():
            if worker.leaving and worker.name not in self._members and worker.name in waiting:
                worker.stop.set()

    def _stop_others(self, why: str) -> None:
        """Stop the workers that will not end the training: those not members, and
        members asking for a generation (none comes after the end)."""
        waiting = self._server.waiting()
        self._members = [m for m in self._members if m not in waiting]
        for worker in self._workers.values():
            if worker.name not in self._members and not worker.stop.is_set():
                worker.leaving = why
                worker.stop.set()

    def _take_hangs(self) -> bool:
        """Fail the hung members the tracker named; whether any was a member."""
        failed = False
        for hang in taken(self._hangs):
            for worker in list(self._workers.values()):
                if (worker.host, worker.local_rank) == (hang.host, hang.local_rank):
                    log.warning("%s: %s", _describe(worker), hang.reason)
                    self._controller.host_failed(worker.host, hang.reason)
                    worker.leaving = "hung"
                    worker.stop.set()
                    if worker.name in self._members:
                        self._members.remove(worker.name)
                        failed = True
        return failed

    def _hosts_now(self) -> dict[str, int]:
        inventory = self._controller.inventory
        return inventory.hosts_and_slots() if inventory is not None else {}

    def _stop_all(self) -> None:
        for worker in self._workers.values():
            worker.stop.set()
        for thread in self._threads:  # the launcher's grace, then its SIGKILL
            thread.join(STOP_GRACE_SECONDS + 5.0)


def _describe(worker: _Worker) -> str:
    return f"worker {worker.host}[{worker.local_rank}]"
