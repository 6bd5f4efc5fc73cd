"""The torch backend's restart mode: unchanged ``torchrun`` scripts on spotring's hosts.

Each attempt starts every worker through the same :class:`ProcessLauncher` as the
Horovod path, with the variables torchrun's ``LocalElasticAgent._start_workers`` sets
(``torch/distributed/elastic/agent/server/local_elastic_agent.py``), so a script that
calls ``init_process_group()`` from the environment and loads its own checkpoint runs
as under torchrun. On a membership change (a worker exits non-zero, a ring host leaves
the inventory or announces its interruption, a host joins while the ring is below
``--max-np``) every worker is stopped (SIGTERM, then torchrun's 30 s before SIGKILL, so
the script's checkpoint on SIGTERM can complete) and the next attempt starts on the
hosts the inventory gives then.

As torchrun's agent does, only failures count against ``--max-restarts``
(``SimpleElasticAgent._invoke_run``: "membership changes do not count as retries"),
and ``TORCHELASTIC_RESTART_COUNT`` is the failures restarted so far. Unlike torchrun,
each attempt's rank 0 serves the group's store on a FRESH port (``MASTER_PORT``):
torchrun's agent reuses one store across attempts without a per-attempt prefix, so a
restarted rank can read a dead worker's Gloo address (docs/torch.md).

For ``python SCRIPT ...`` (and ``-m MODULE``), each attempt's workers were started
ahead (:class:`_WarmSlots`, :mod:`spotring.worker_image.torch_warm_start`): the
interpreter is up and torch imported when the attempt hands them its variables. A
failed worker takes its host out of the job only when it was killed or cut off
(:func:`host_lost`): a script failing by itself replaces no host.
"""

from __future__ import annotations

import enum
import logging
import os
import queue
import re
import secrets
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from spotring.core.job import JobShape
from spotring.driver.job_control import JobAborted, JobController
from spotring.driver.launcher import (
    LAUNCH_FAILED_EXIT,
    ProcessLauncher,
    WarmWorker,
    WorkerSpec,
)
from spotring.driver.options import DEFAULT_MAX_RESTARTS, ElasticOptions
from spotring.driver.ring_events import RingEvents
from spotring.driver.torch_workers import (
    NoticeToController,
    TorchJobFailed,
    omp_threads,
    worker_base_env,
)
from spotring.driver.warm_pool import SLOW_START_SECONDS
from spotring.worker_image.torch_warm_start import PORT_TAKEN_EXIT

log = logging.getLogger(__name__)

WARM_RANK = -1
"""The rank of a worker started ahead, until its attempt gives it one."""

ROLE = "default"
"""torchrun's role name (``--role``'s default): one role, so role ranks are ranks."""

POLL_SECONDS = 0.2
"""How often an attempt looks at the inventory for a membership change."""

WARM_MODULE = "spotring.worker_image.torch_warm_start"
"""Runs the user's script in a worker started ahead of its attempt."""

WARM_DELAY_SECONDS = 3.0
"""How long after an attempt starts its hosts' workers for the next one are started:
not at once, so they do not compete with the attempt's own start (the group's
formation, the checkpoint's load) for the host's CPUs."""

STOP_GRACE_SECONDS = 30.0
"""What a stopped worker gets between SIGTERM and SIGKILL: torchrun's agent's 30 s
(``LocalElasticAgent._shutdown``'s timeout, torch 2.13), so a script's checkpoint on
SIGTERM has as long as under torchrun (the Horovod path's workers get 5 s)."""

PORT_RETRIES = 5
"""Attempts whose rank 0 found the store's port taken on its host (it is picked free
on the driver) that do not count against ``--max-restarts``; later ones do."""

_PYTHON = re.compile(r"python[0-9.]*")


@dataclass(frozen=True)
class Slot:
    """One worker of an attempt: where it runs and the ranks torchrun would give it."""

    host: str
    local_rank: int
    rank: int
    group_rank: int
    """The host's index among the attempt's hosts (torchrun's node rank)."""
    local_world_size: int


def assign_ranks(hosts_and_slots: Mapping[str, int], max_workers: int) -> list[Slot]:
    """Ranks over the hosts' slots, in the inventory's order, up to ``max_workers``:
    consecutive ranks per host (as torchrun's node ranks give), each host's local
    ranks from 0. A host left without a slot is not in the attempt."""
    taken: list[tuple[str, int]] = []
    for host, slots in hosts_and_slots.items():
        share = min(slots, max_workers - sum(n for _, n in taken))
        if share > 0:
            taken.append((host, share))
    result: list[Slot] = []
    for group_rank, (host, share) in enumerate(taken):
        for local_rank in range(share):
            result.append(Slot(host, local_rank, len(result), group_rank, share))
    return result


@dataclass(frozen=True)
class Attempt:
    """What every worker of one attempt shares."""

    world_size: int
    group_world_size: int
    master_addr: str
    master_port: int
    run_id: str
    restart_count: int
    max_restarts: int


def torchrun_env(slot: Slot, attempt: Attempt, omp_num_threads: str | None) -> dict[str, str]:
    """The variables torchrun's agent sets for ``slot``'s worker (torch 2.13's
    ``LocalElasticAgent._start_workers``), with ``OMP_NUM_THREADS`` as ``torchrun``
    sets it (1 with several workers per host, unless the user set it)."""
    env = {
        "RANK": str(slot.rank),
        "LOCAL_RANK": str(slot.local_rank),
        "GROUP_RANK": str(slot.group_rank),
        "ROLE_RANK": str(slot.rank),
        "ROLE_NAME": ROLE,
        "LOCAL_WORLD_SIZE": str(slot.local_world_size),
        "WORLD_SIZE": str(attempt.world_size),
        "GROUP_WORLD_SIZE": str(attempt.group_world_size),
        "ROLE_WORLD_SIZE": str(attempt.world_size),
        "MASTER_ADDR": attempt.master_addr,
        "MASTER_PORT": str(attempt.master_port),
        "TORCHELASTIC_RESTART_COUNT": str(attempt.restart_count),
        "TORCHELASTIC_MAX_RESTARTS": str(attempt.max_restarts),
        "TORCHELASTIC_RUN_ID": attempt.run_id,
        # The worker's rank 0 creates the store (env://): no agent store to reuse.
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": os.environ.get("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"),
    }
    threads = omp_threads(slot.local_world_size, omp_num_threads)
    if threads is not None:
        env["OMP_NUM_THREADS"] = threads
    return env


def warm_command(command: Sequence[str]) -> tuple[str, ...] | None:
    """``command`` run through :data:`WARM_MODULE` (its workers can be started ahead of
    their attempt; its rank 0 checks the store's port on its host first); None when it
    is not ``python SCRIPT ...`` or ``python -m MODULE ...`` (an interpreter option, a
    shell script: run as given, started cold each attempt)."""
    if len(command) < 2 or not _PYTHON.fullmatch(os.path.basename(command[0])):
        return None
    first = command[1]
    if (first == "-m" and len(command) > 2) or not first.startswith("-"):
        return (command[0], "-m", WARM_MODULE, *command[1:])
    return None


def free_port(address: str, used: Iterable[int], pick: Callable[[str], int] | None = None) -> int:
    """A port free on ``address`` now and not one in ``used`` (the earlier attempts'):
    ``pick(address)`` (default: the kernel's choice of a free port) until one is new."""
    used = set(used)
    while True:
        port = (pick or _kernel_port)(address)
        if port not in used:
            return port


def _kernel_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((address, 0))
        return int(probe.getsockname()[1])


class Outcome(enum.Enum):
    """How an attempt ended."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CHANGED = "membership changed"
    PORT_TAKEN = "store port taken"
    """Rank 0 found its ``MASTER_PORT`` taken on its host, before the script ran."""


class TorchRestartDriver:
    """Runs ``command`` in attempts of every worker, restarting all on a change.

    :param local: the workers run on this machine (the ``local`` provider): the
        group's store is on 127.0.0.1; otherwise on rank 0's host address, on a port
        free on this machine and unused by earlier attempts (rank 0 checks it on its
        host before the script runs, for ``python SCRIPT`` commands: :data:`PORT_RETRIES`).
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
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        local: bool = False,
    ) -> None:
        self._command = tuple(command)
        self._controller = controller
        self._launcher = launcher
        self._job = job
        self._options = options
        self._events = events
        self._max_restarts = max_restarts
        self._local = local
        self._run_id = uuid.uuid4().hex
        self._job_key = secrets.token_bytes(32)  # verifies the supervisors' notice lines
        self._ports: list[int] = []
        self.world_sizes: list[int] = []
        launcher.add_listener(NoticeToController(controller))
        wrapped = warm_command(command)
        self._argv = wrapped or self._command
        self._wrapped = wrapped is not None  # its rank 0 checks the store's port
        warm = self._wrapped and options.warm_start
        self._warm = _WarmSlots(launcher, self._warm_spec) if warm else None

    def run(self) -> None:
        """Attempts until every worker of one exits 0. Raises :class:`TorchJobFailed`
        (no restart left, no hosts in time) or ``JobAborted`` (the controller's fatal
        error, or Ctrl-C once every worker is stopped)."""
        try:
            self._run_attempts()
        finally:
            if self._warm is not None:
                self._warm.close()

    def _run_attempts(self) -> None:
        failures = ports_taken = 0
        timeout = self._options.start_timeout
        while True:
            slots = assign_ranks(self._wait_for_slots(timeout), self._job.max_num_proc)
            outcome, why = self._run_attempt(slots, failures)
            if outcome is Outcome.SUCCEEDED:
                return
            if outcome is Outcome.PORT_TAKEN and ports_taken < PORT_RETRIES:
                ports_taken += 1  # not the script's failure: the next port may be free
            elif outcome is not Outcome.CHANGED:
                if failures >= self._max_restarts:
                    raise TorchJobFailed(f"{why}; no restart left (--max-restarts {failures})")
                failures += 1
            log.info("restarting every worker: %s", why)
            timeout = self._options.elastic_timeout

    def _wait_for_slots(self, timeout: float) -> dict[str, int]:
        """The inventory's hosts once they have ``--min-np`` slots (``timeout`` s)."""
        waited = 0.0
        while True:
            hosts = self._hosts_now()
            if self._warm is not None:
                self._warm.refill(hosts)
            if sum(hosts.values()) >= self._job.min_num_proc:
                return hosts
            if waited >= timeout:
                raise TorchJobFailed(
                    f"fewer than --min-np {self._job.min_num_proc} slots for {timeout:g} s"
                )
            self._check_fatal(POLL_SECONDS)
            waited += POLL_SECONDS

    def _check_fatal(self, timeout: float) -> None:

        error = self._controller.wait_for_fatal_error(timeout=timeout)
        if error is not None:
            raise JobAborted(str(error), error)

    def _run_attempt(self, slots: list[Slot], failures: int) -> tuple[Outcome, str]:
        hosts = list(dict.fromkeys(slot.host for slot in slots))
        master = "127.0.0.1" if self._local else hosts[0]
        port = free_port("127.0.0.1" if self._local else "", self._ports)
        self._ports.append(port)
        attempt = Attempt(
            len(slots), len(hosts), master, port, self._run_id, failures, self._max_restarts
        )
        self._controller.hosts_offered(hosts)
        self._controller.ring_formed(hosts)
        self.world_sizes.append(len(slots))
        self._events.ring_formed(len(slots), sorted(hosts))
        log.info("attempt with %d workers on %s (restart %d, store port %d)",
                 len(slots), ", ".join(hosts), failures, port)  # fmt: skip
        stop = threading.Event()
        exits: queue.Queue[tuple[Slot, int]] = queue.Queue()
        threads = [
            threading.Thread(
                target=self._run_worker,
                args=(self._spec(slot, attempt), stop, exits, slot, self._take_warm(slot)),
                name=f"spotring-torch-{slot.rank}",
                daemon=True,
            )
            for slot in slots
        ]
        for thread in threads:
            thread.start()
        try:
            return self._watch(set(hosts), len(slots), exits)
        except KeyboardInterrupt as interrupt:
            raise JobAborted("interrupted", interrupt) from None
        finally:
            stop.set()
            for thread in threads:  # the launcher's grace, then its SIGKILL
                thread.join(STOP_GRACE_SECONDS + 5.0)

    def _run_worker(
        self, spec: WorkerSpec, stop: threading.Event, exits: queue.Queue[tuple[Slot, int]],
        slot: Slot, warm: WarmWorker | None,
    ) -> None:  # fmt: skip
        exit_code, _ = self._launcher(spec, [stop], warm)  # never raises
        exits.put((slot, exit_code))

    def _take_warm(self, slot: Slot) -> WarmWorker | None:
        return self._warm.take(slot.host, slot.local_rank) if self._warm is not None else None

    def _spec(self, slot: Slot, attempt: Attempt) -> WorkerSpec:
        env = torchrun_env(slot, attempt, os.environ.get("OMP_NUM_THREADS"))
        return self._worker_spec(slot.host, slot.local_rank, slot.rank, env)

    def _warm_spec(self, host: str, local_rank: int, slots: int) -> WorkerSpec:
        """A worker for ``host[local_rank]`` started ahead: what every attempt gives
        it, and the threads torch takes at import as if the host's ``slots`` join."""
        threads = omp_threads(slots, os.environ.get("OMP_NUM_THREADS"))
        env = {"OMP_NUM_THREADS": threads} if threads is not None else {}
        return self._worker_spec(host, local_rank, WARM_RANK, env)

    def _worker_spec(
        self, host: str, local_rank: int, rank: int, env: Mapping[str, str]
    ) -> WorkerSpec:
        base = worker_base_env(self._options, self._job_key)
        return WorkerSpec(
            host=host,
            local_rank=local_rank,
            rank=rank,
            argv=self._argv,
            env={**base, **env},
            cwd=os.getcwd(),
            notices=self._controller.notice_watcher(host),
            stop_grace=STOP_GRACE_SECONDS,
        )

    def _watch(
        self, ring: set[str], size: int, exits: queue.Queue[tuple[Slot, int]]
    ) -> tuple[Outcome, str]:
        """Until every worker exits 0, one fails, or the membership changes."""
        succeeded = 0
        started = time.monotonic()
        while True:
            try:
                slot, exit_code = exits.get(timeout=POLL_SECONDS)
            except queue.Empty:
                self._check_fatal(0)
                if succeeded:
                    # The training ended: a restart now would run its end again. A host
                    # lost with a worker still running shows in that worker's exit.
                    continue
                hosts = self._hosts_now()
                if self._warm is not None:
                    settling = time.monotonic() - started < WARM_DELAY_SECONDS
                    self._warm.refill(hosts, later=ring if settling else set())
                    if not all(self._warm.ready(host) for host in hosts):
                        # A join waits, the ring training on, until every host's
                        # workers for the next attempt wait for their slots.
                        hosts = {host: n for host, n in hosts.items() if host in ring}
                change = membership_change(ring, size, hosts, self._job.max_num_proc)
                if change:
                    return Outcome.CHANGED, change
                continue
            if exit_code == PORT_TAKEN_EXIT and slot.rank == 0 and self._wrapped:
                return Outcome.PORT_TAKEN, f"the store's port was taken on {slot.host}"
            if exit_code != 0:
                why = f"worker rank {slot.rank} on {slot.host} exited with {exit_code}"
                if host_lost(exit_code):
                    # Out of the job now, not at the next refresh: the next attempt must
                    # not plan on it, and the controller starts its replacement.
                    self._controller.host_failed(slot.host, why)
                else:
                    log.info("%s; its host stays in the job: its worker was neither killed "
                             "nor cut off (the script failed, not the host)", why)  # fmt: skip
                return Outcome.FAILED, why
            succeeded += 1
            if succeeded == size:
                return Outcome.SUCCEEDED, ""

    def _hosts_now(self) -> dict[str, int]:
        """The READY hosts' slots in the controller's latest inventory."""
        inventory = self._controller.inventory
        return inventory.hosts_and_slots() if inventory is not None else {}


def host_lost(exit_code: int) -> bool:
    """Whether the exit of a worker that ended by itself (not stopped by spotring) says
    that its host, not the script, failed: it was SIGKILLed (a preemption without notice takes
    the machine and everything on it at once; the local provider's does the same to
    the host's processes; the kernel's OOM killer too) or cut off (the launcher's and
    ssh's 255: the host could not be reached, or its connection dropped). A script that
    fails by itself raises or exits: 1, or its own code, with the host still there."""
    return exit_code in (-signal.SIGKILL, 128 + signal.SIGKILL, LAUNCH_FAILED_EXIT)


def membership_change(
    ring: set[str], size: int, hosts_now: Mapping[str, int], max_workers: int
) -> str:
    """Why an attempt of ``size`` workers on ``ring`` must restart given the hosts
    the inventory offers now; "" when it need not. A host that left (gone, failed,
    or draining after its notice) ends it; so does a new host while below ``max_workers``."""
    left = sorted(ring - hosts_now.keys())
    if left:
        return f"{', '.join(left)} left"
    joined = sorted(set(hosts_now) - ring)
    if joined and size < max_workers:
        return f"{', '.join(joined)} joined"
    return ""


class _WarmSlots:
    """A worker started ahead (:meth:`ProcessLauncher.prestart`) for each slot of the
    READY hosts, for the next attempt to take; the launcher hands each its attempt's
    environment, or starts its slot cold if it has died
    (:meth:`ProcessLauncher.__call__`). The Horovod path's
    :class:`~spotring.driver.warm_pool.WarmPool` offers a host to Horovod once; here
    every attempt takes every worker, and the pool is refilled for the next one.

    :param make_spec: ``(host, local_rank, host's slots)`` -> the worker to start ahead.
    """

    def __init__(
        self, launcher: ProcessLauncher, make_spec: Callable[[str, int, int], WorkerSpec]
    ) -> None:
        self._launcher = launcher
        self._make_spec = make_spec
        self._workers: dict[tuple[str, int], WarmWorker | None] = {}  # None: could not start
        self._since: dict[str, float] = {}

    def refill(
        self, hosts: Mapping[str, int], later: set[str] | frozenset[str] = frozenset()
    ) -> None:
        """Stop the workers of slots no longer in ``hosts``; start one for every slot
        of ``hosts`` without one, except on the hosts in ``later``."""
        for key in [key for key in self._workers if key[1] >= hosts.get(key[0], 0)]:
            worker = self._workers.pop(key)
            if worker is not None:
                worker.stop()
        for host in [host for host in self._since if host not in hosts]:
            del self._since[host]
        for host, slots in hosts.items():
            if host in later:
                continue
            for local_rank in range(slots):
                if (host, local_rank) not in self._workers:
                    self._workers[host, local_rank] = self._start(host, local_rank, slots)
                    self._since.setdefault(host, time.monotonic())

    def _start(self, host: str, local_rank: int, slots: int) -> WarmWorker | None:
        try:
            return self._launcher.prestart(self._make_spec(host, local_rank, slots))
        except (OSError, ValueError) as error:  # the cold start meets it too, and reports it
            log.warning("cannot start a worker ahead on %s: %s", host, error)
            return None

    def ready(self, host: str) -> bool:
        """Whether ``host``'s workers started ahead wait for their slot (or ended, or
        could not start: those slots start cold), or have been starting for longer
        than :data:`~spotring.driver.warm_pool.SLOW_START_SECONDS`."""
        since = self._since.get(host)
        if since is None:
            return False
        workers = [w for (h, _), w in self._workers.items() if h == host and w is not None]
        waiting = all(worker.held or worker.exited for worker in workers)
        return waiting or time.monotonic() - since > SLOW_START_SECONDS

    def take(self, host: str, local_rank: int) -> WarmWorker | None:
        """The worker started ahead for this slot (None: start it cold); taken once."""
        worker = self._workers.pop((host, local_rank), None)
        if not any(h == host for h, _ in self._workers):
            self._since.pop(host, None)
        return worker

    def close(self) -> None:
        """Stop every worker not taken."""
        for worker in self._workers.values():
            if worker is not None:
                worker.stop()
        self._workers.clear()
        self._since.clear()
