"""The composition of a ``spotring run``: controller, launcher and Horovod, wired once.

The CLI parses and reports; this module decides what a run is made of (the group's
sizing, the launcher, the worker environment) and runs it, so it can be tested
without argv.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import pluggy

from spotring.autoscaler.capacity import CapacityOptions
from spotring.autoscaler.controller import Controller
from spotring.autoscaler.groups import group_events, job_groups
from spotring.autoscaler.observers.progress import ProgressReporter
from spotring.core import ConfigurationError, ProviderError
from spotring.core.job import JobShape
from spotring.driver.launcher import SshOptions
from spotring.driver.options import DEFAULT_MAX_RESTARTS, ElasticOptions
from spotring.driver.worker_events import WorkerEvents
from spotring.providers.base import Provider

if TYPE_CHECKING:
    from spotring.autoscaler.durable_job import DurableJob
    from spotring.driver.launcher import ProcessLauncher
    from spotring.driver.ring_events import Hang, RingLoss, RingStatus, Stall

log = logging.getLogger(__name__)

EXIT_FAILURE = 1
EXIT_USAGE = 2
"""Exit statuses of ``spotring``: a failed job; bad usage or configuration."""


@dataclass(frozen=True)
class JobConfig:
    """Everything ``spotring run`` needs besides the provider."""

    command: tuple[str, ...]
    shape: JobShape
    elastic: ElasticOptions
    """Horovod's elastic settings; ``nics`` default to ``lo`` for local workers, and
    the worker environment is filled in from this process's."""
    refresh_interval: float = 10.0
    launcher: str = "auto"
    """``local``, ``ssh``, or ``auto``: local for providers that simulate hosts."""
    ssh: SshOptions = field(default_factory=SshOptions)
    worker_python: str = sys.executable
    forwarded_env: Mapping[str, str] = field(default_factory=dict)
    """``-x``/``--env`` variables, resolved to values."""
    events_path: str | None = None
    """``--events FILE``: the run's events, one JSON object per line."""
    metrics_port: int | None = None
    """``--metrics-port``: serve Prometheus metrics there (0: a free port)."""
    metrics_addr: str = "127.0.0.1"
    capacity: CapacityOptions = field(default_factory=CapacityOptions)
    prices: Mapping[str, float] = field(default_factory=dict)
    """``--price``: USD per member-hour by group name or lifecycle, over the clouds'."""
    """``--fallback-after``, ``--on-demand-base``, ``--return-after``: the capacity
    policy of a job that spans several groups."""
    backend: str = "horovod"
    """``--backend``: ``horovod``, or ``torch`` (the restart mode, or with ``in_place``
    the in-place mode)."""
    in_place: bool = False
    """``--in-place`` (``torch`` only): survivors keep running across changes."""
    max_restarts: int = DEFAULT_MAX_RESTARTS
    """``--max-restarts`` (``torch`` only): worker failures restarted before the job fails."""


@dataclass(frozen=True)
class JobOutcome:
    """How a run ended: its exit status and, for a failure, one line saying why."""

    exit_code: int
    message: str = ""


def run_job(
    config: JobConfig,
    groups: Provider | Sequence[Provider],
    pm: pluggy.PluginManager,
    reporter: ProgressReporter,
) -> JobOutcome:
    """Run the job on its ``groups`` (one provider each, in the user's order of
    preference; one provider: a job of one group) until it ends; never leaves a worker
    behind.

    Raises :class:`ConfigurationError` (or another ``ProviderError``) when the groups
    cannot be listed at start; later errors end the job and come back as the outcome.
    """
    if config.backend == "horovod":
        from spotring.driver.compat import require_horovod

        require_horovod()
    # Horovod is imported in _run_locked, not at the top: `spotring --help` stays fast.
    durable = None
    if config.elastic.durable is not None:
        from spotring.autoscaler.durable_job import DurableJob

        durable = DurableJob(config.elastic.durable, reporter.say)
    with durable.locked() if durable is not None else contextlib.nullcontext():
        return _run_locked(config, job_groups(groups), pm, reporter, durable)


def _run_locked(
    config: JobConfig,
    groups: Sequence[Provider],
    pm: pluggy.PluginManager,
    reporter: ProgressReporter,
    durable: DurableJob | None,
) -> JobOutcome:
    from spotring.driver.job_control import JobAborted
    from spotring.driver.launcher import ProcessLauncher
    from spotring.driver.worker_env import worker_base_environment

    shape = config.shape
    cooldown = config.elastic.cooldown_range
    readmit_after = float(cooldown[0]) if cooldown else None
    controller = Controller(
        groups,
        pm.hook,
        job=shape,
        refresh_interval=config.refresh_interval,
        readmit_after=readmit_after,
        capacity=config.capacity,
        prices=config.prices,
    )
    if durable is not None:  # a lost checkpoint lock stops the job
        durable.stop_job_with(controller.fail)
    local = config.launcher == "local" or (
        config.launcher == "auto" and any(g.runs_workers_locally for g in groups)
    )
    launcher = ProcessLauncher(
        remote=not local,
        ssh=config.ssh,
        python=config.worker_python,
        host_alias=controller.instance_id,
    )
    for group in groups:
        if group.tracks_worker_processes:
            launcher.add_listener(_ProviderProcesses(group))
    plugins = contextlib.ExitStack()  # the run's own: unregistered and closed at its end
    try:
        _register_run_plugins(plugins, config, groups, pm, reporter, controller)
    except BaseException:
        plugins.close()
        raise
    # The preferred group's provider (its name is the job's provider's).
    pm.hook.spotring_job_started.call_historic(
        kwargs={"provider": groups[0], "job": shape, "groups": groups}
    )
    elastic = dataclasses.replace(
        config.elastic,
        nics=config.elastic.nics or (("lo",) if local else ()),
        worker_env={
            **worker_base_environment(os.environ, config.forwarded_env),
            **(durable.worker_env() if durable is not None else {}),
        },
    )

    # The driver knows no plugin manager: the rings' events reach the plugins (the
    # progress lines, the events file, the metrics among them) through this adapter.
    backend = _backend(
        config, controller, launcher, elastic, PluginRingEvents(pm.hook), durable, local
    )
    started = time.monotonic()
    reporter.restarts_workers = config.backend == "torch" and not config.in_place
    pm.register(reporter, name="spotring.progress")
    controller.start()
    outcome: JobOutcome | None = None
    try:
        inventory = controller.wait_for_inventory(elastic.start_timeout)
        reporter.started(inventory)
        try:
            backend.run()
            outcome = JobOutcome(0)
        except JobAborted as aborted:
            if isinstance(aborted.cause, KeyboardInterrupt):
                raise aborted.cause from None  # every worker is stopped by now
            code = EXIT_USAGE if isinstance(aborted.cause, ConfigurationError) else EXIT_FAILURE
            outcome = JobOutcome(code, str(aborted))
        except RuntimeError as error:
            outcome = JobOutcome(EXIT_FAILURE, " ".join(str(error).split()))
    finally:
        controller.stop()
        launcher.close()
        pm.unregister(reporter)
        for group in groups:
            _finish(group)
        code = outcome.exit_code if outcome is not None else _exit_status(sys.exc_info()[1])
        with plugins:  # then closed and unregistered
            pm.hook.spotring_job_finished(
                ok=code == 0,
                exit_code=code,
                seconds=time.monotonic() - started,
                world_sizes=list(backend.world_sizes),
            )
    reporter.summary(
        backend.world_sizes,
        outcome.exit_code == 0,
        time.monotonic() - started,
        group_events(groups),
    )
    if durable is not None and outcome.exit_code != 0 and not durable.lost:
        newest = durable.newest()
        if newest is not None:
            reporter.say(
                f"checkpoints kept in {durable.options.uri}: run the same command again to "
                f"resume from commit {newest['commits']}"
            )
    return outcome


class _Backend(Protocol):
    """What the run needs of a backend's driver."""

    @property
    def world_sizes(self) -> list[int]:
        """The size of every ring (attempt) so far, in order."""
        ...

    def run(self) -> None:
        """Run the job to its end; raises ``RuntimeError`` (failed) or ``JobAborted``."""
        ...


def _backend(
    config: JobConfig,
    controller: Controller,
    launcher: ProcessLauncher,
    elastic: ElasticOptions,
    events: PluginRingEvents,
    durable: DurableJob | None,
    local: bool,
) -> _Backend:
    """The driver of ``config.backend``, built (its listeners on the launcher) before
    the controller starts."""
    if config.backend == "torch" and config.in_place:
        from spotring.driver.torch_inplace import TorchInplaceDriver

        return TorchInplaceDriver(
            config.command, controller, launcher, config.shape, elastic, events, local=local
        )
    if config.backend == "torch":
        from spotring.driver.torch_restart import TorchRestartDriver

        return TorchRestartDriver(
            config.command, controller, launcher, config.shape, elastic, events,
            max_restarts=config.max_restarts, local=local,
        )  # fmt: skip
    return _HorovodBackend(
        config.command, controller, launcher, config.shape, elastic, events, durable
    )


class _HorovodBackend:
    """Horovod's elastic driver and the ring side around it."""

    def __init__(
        self,
        command: Sequence[str],
        controller: Controller,
        launcher: ProcessLauncher,
        shape: JobShape,
        elastic: ElasticOptions,
        events: PluginRingEvents,
        durable: DurableJob | None,
    ) -> None:
        from spotring.driver.ring_side import RingSide

        self._args = (command, controller, launcher, shape, elastic)
        self._ring = RingSide(controller, launcher, shape, elastic, events, durable)

    @property
    def world_sizes(self) -> list[int]:
        return self._ring.world_sizes

    def run(self) -> None:
        from spotring.driver.elastic import run_elastic

        run_elastic(*self._args, self._ring)


def _register_run_plugins(
    stack: contextlib.ExitStack,
    config: JobConfig,
    groups: Sequence[Provider],
    pm: pluggy.PluginManager,
    reporter: ProgressReporter,
    controller: Controller | None = None,
) -> None:
    """Register the run's events file and metrics endpoint, as asked, as plugins; each
    is unregistered and closed when ``stack`` closes. ConfigurationError (exit 2, one
    line) when the file cannot be written or the port taken."""
    option = "--events"
    try:
        if config.events_path is not None:
            from spotring.autoscaler.observers.events import EventLog

            events = EventLog(config.events_path)
            stack.enter_context(contextlib.closing(events))
            _register(stack, pm, events, "spotring.events")
        option = "--metrics-port"
        if config.metrics_port is not None:
            from spotring.autoscaler.observers.metrics import Metrics

            capacity = (lambda: controller.capacity_status) if controller is not None else None
            metrics = Metrics(config.metrics_port, config.metrics_addr, groups[0].name, capacity)
            stack.enter_context(contextlib.closing(metrics))
            _register(stack, pm, metrics, "spotring.metrics")
            reporter.say(f"metrics on http://{config.metrics_addr}:{metrics.port}/metrics")
    except OSError as error:
        raise ConfigurationError(f"{option}: {error.strerror or error}") from None


def _register(
    stack: contextlib.ExitStack, pm: pluggy.PluginManager, plugin: object, name: str
) -> None:
    if pm.register(plugin, name=name) is not None:  # None: disabled by name
        stack.callback(pm.unregister, plugin)


class PluginRingEvents:
    """The rings' events (:class:`~spotring.driver.ring_events.RingEvents`) as the
    plugins' ``spotring_ring_*`` hooks, called on the thread each event comes on (the
    one its hookspec names)."""

    def __init__(self, hook: pluggy.HookRelay) -> None:
        self._hook = hook

    def ring_formed(self, size: int, hosts: Sequence[str]) -> None:
        self._hook.spotring_ring_formed(size=size, hosts=hosts)

    def ring_progress(self, status: RingStatus) -> None:
        self._hook.spotring_ring_progress(status=status)

    def ring_idle(self, seconds: float) -> None:
        self._hook.spotring_ring_idle(seconds=seconds)

    def ring_stalled(self, stall: Stall) -> None:
        self._hook.spotring_ring_stalled(stall=stall)

    def ring_hung(self, hang: Hang) -> None:
        self._hook.spotring_ring_hung(hang=hang)

    def ring_lost(self, loss: RingLoss) -> None:
        self._hook.spotring_ring_lost(
            size=loss.size, why=loss.why, checkpoint=loss.checkpoint, lost=loss.lost
        )


def _exit_status(error: BaseException | None) -> int:
    """The exit status ``spotring run`` will have for ``error`` escaping the job."""
    if isinstance(error, KeyboardInterrupt):
        return 130
    if isinstance(error, ConfigurationError):
        return EXIT_USAGE
    return EXIT_FAILURE


def _finish(provider: Provider) -> None:
    """The provider's end-of-job clean-up; its failure is reported, not raised over
    the job's own outcome."""
    try:
        provider.job_finished()
    except ProviderError as error:
        log.warning("%s: clean-up at the end of the job failed: %s", provider.describe(), error)


class _ProviderProcesses(WorkerEvents):
    """Tells a provider that simulates hosts which process groups run on which host."""

    def __init__(self, provider: Provider) -> None:
        self._provider = provider

    def process_started(self, host: str, process_group: int) -> None:
        self._provider.worker_started(host, process_group)

    def process_exited(self, host: str, process_group: int) -> None:
        self._provider.worker_exited(host, process_group)
