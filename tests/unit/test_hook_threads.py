"""The thread contract of the hooks (``spotring.autoscaler.hookspecs``): every hook is
called through the plugin manager, on the thread its spec names. Each test records the
thread every hook ran on."""

from __future__ import annotations

import io
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from spotring.autoscaler.cli import build_parser
from spotring.autoscaler.controller import Controller, ControllerError
from spotring.autoscaler.hookspecs import hookimpl
from spotring.autoscaler.observers.progress import ProgressReporter
from spotring.autoscaler.plugins import get_plugin_manager, provider_registry
from spotring.core import Instance, InterruptionNotice, JobShape
from spotring.driver.options import ElasticOptions
from tests.fakes.scripted import ScriptedProvider, instance
from tests.fakes.store_signing import JOB_KEY

JOB = JobShape(num_proc=2, min_num_proc=1, max_num_proc=4, target_hosts=3)
CONTROLLER = "spotring-controller"
LAUNCHER = "spotring-output"  # the launcher's thread that reads a worker's output
HOROVOD = "horovod-driver"
PROGRESS = "spotring-progress"


class ThreadRecorder:
    """Implements every hook; records the threads each one ran on."""

    def __init__(self) -> None:
        self.threads: dict[str, set[str]] = {}

    def _saw(self, hook: str) -> None:
        self.threads.setdefault(hook, set()).add(threading.current_thread().name)

    @hookimpl
    def spotring_register_providers(self, registry: Any) -> None:
        self._saw("spotring_register_providers")

    @hookimpl
    def spotring_add_provider_options(self, provider: Any, group: Any) -> None:
        self._saw("spotring_add_provider_options")

    @hookimpl
    def spotring_target_size(self, inventory: Any, job: Any, current_target: Any) -> None:
        self._saw("spotring_target_size")

    @hookimpl
    def spotring_replace_host(self, instance: Any, reason: Any, job: Any) -> None:
        self._saw("spotring_replace_host")

    @hookimpl
    def spotring_drain_on_notice(self, instance: Any, notice: Any, job: Any) -> None:
        self._saw("spotring_drain_on_notice")

    @hookimpl
    def spotring_inventory_changed(self, added: Any, removed: Any, ready: Any) -> None:
        self._saw("spotring_inventory_changed")

    @hookimpl
    def spotring_refreshed(
        self, inventory: Any, seconds: Any, calls: Any, error: Any, target: Any
    ) -> None:
        self._saw("spotring_refreshed")

    @hookimpl
    def spotring_host_noticed(self, instance: Any, notice: Any, draining: Any) -> None:
        self._saw("spotring_host_noticed")

    @hookimpl
    def spotring_host_failed(self, instance: Any, reason: Any) -> None:
        self._saw("spotring_host_failed")

    @hookimpl
    def spotring_job_started(self, provider: Any, job: Any) -> None:
        self._saw("spotring_job_started")

    @hookimpl
    def spotring_job_finished(
        self, ok: Any, exit_code: Any, seconds: Any, world_sizes: Any
    ) -> None:
        self._saw("spotring_job_finished")

    @hookimpl
    def spotring_ring_formed(self, size: Any, hosts: Any) -> None:
        self._saw("spotring_ring_formed")

    @hookimpl
    def spotring_ring_progress(self, status: Any) -> None:
        self._saw("spotring_ring_progress")

    @hookimpl
    def spotring_ring_idle(self, seconds: Any) -> None:
        self._saw("spotring_ring_idle")

    @hookimpl
    def spotring_ring_stalled(self, stall: Any) -> None:
        self._saw("spotring_ring_stalled")

    @hookimpl
    def spotring_ring_hung(self, hang: Any) -> None:
        self._saw("spotring_ring_hung")

    @hookimpl
    def spotring_ring_lost(self, size: int, why: str, checkpoint: Any, lost: Any) -> None:
        self._saw("spotring_ring_lost")


def eventually(condition: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def on_thread(name: str, function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)`` on a thread called ``name``; its result."""
    results: list[Any] = []
    thread = threading.Thread(target=lambda: results.append(function(*args)), name=name)
    thread.start()
    thread.join()
    return results[0]


class WatchedProvider(ScriptedProvider):
    """Records the threads its notice watchers are asked for on."""

    def __init__(self, members: list[Instance]) -> None:
        super().__init__(members)
        self.watcher_threads: list[str] = []

    def notice_watcher(self, instance: Instance) -> dict[str, Any]:
        self.watcher_threads.append(threading.current_thread().name)
        return {"watcher": "aws", "host": instance.id}


def test_configuration_hooks_run_on_the_thread_that_asks() -> None:
    pm = get_plugin_manager(load_entry_points=False)
    recorder = ThreadRecorder()
    pm.register(recorder)
    on_thread("cli", provider_registry, pm)
    on_thread("cli", build_parser, pm, ScriptedProvider)
    assert recorder.threads == {
        "spotring_register_providers": {"cli"},
        "spotring_add_provider_options": {"cli"},
    }


def test_the_controllers_hooks_run_on_its_thread_the_drain_decision_on_the_launchers() -> None:
    provider = WatchedProvider([instance("a"), instance("b", slots=2)])
    pm = get_plugin_manager(load_entry_points=False)
    recorder = ThreadRecorder()
    pm.register(recorder)
    controller = Controller(provider, pm.hook, job=JOB, refresh_interval=0.01, replace_grace=0)
    controller.start()
    try:
        controller.wait_for_inventory(timeout=5)
        on_thread(LAUNCHER, controller.host_noticed, "b", InterruptionNotice("preempt", None))
        on_thread(LAUNCHER, controller.host_failed, "a", "worker rank 0 exited with -9")
        # Horovod's thread starts a worker: its notice watcher, asked for on the
        # controller's thread when the host was listed, is handed out from there.
        watcher = on_thread(HOROVOD, controller.notice_watcher, "a")
        eventually(lambda: provider.noticed and provider.replaced)
    finally:
        controller.stop()
    assert watcher == {"watcher": "aws", "host": "i-a"}
    assert set(provider.watcher_threads) == {CONTROLLER}
    assert recorder.threads == {
        "spotring_target_size": {CONTROLLER},
        "spotring_replace_host": {CONTROLLER},
        "spotring_drain_on_notice": {LAUNCHER},
        "spotring_inventory_changed": {CONTROLLER},
        "spotring_refreshed": {CONTROLLER},
        "spotring_host_noticed": {CONTROLLER},
        "spotring_host_failed": {CONTROLLER},
    }


def test_a_drain_hook_that_raises_stops_the_job_with_its_message() -> None:
    class BrokenDrain:
        @hookimpl
        def spotring_drain_on_notice(self, instance: Any, notice: Any, job: Any) -> bool:
            raise ZeroDivisionError("division by zero")

    provider = ScriptedProvider([instance("a"), instance("b")])
    pm = get_plugin_manager(load_entry_points=False)
    pm.register(BrokenDrain())
    controller = Controller(provider, pm.hook, job=JOB, refresh_interval=0.01)
    controller.start()
    try:
        controller.wait_for_inventory(timeout=5)
        drained = on_thread(LAUNCHER, controller.host_noticed, "b", InterruptionNotice("preempt"))
        error = controller.wait_for_fatal_error(timeout=5)
        eventually(lambda: controller._thread is not None and not controller._thread.is_alive())
    finally:
        controller.stop()
    assert drained is False
    assert isinstance(error, ControllerError)
    assert "spotring_drain_on_notice hook failed unexpectedly: ZeroDivisionError" in str(error)
    inventory = controller.inventory
    assert inventory is not None and [i.address for i in inventory.ready] == ["a", "b"]


def test_the_jobs_hooks_run_on_its_thread_the_rings_on_horovods_and_the_trackers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run whose Horovod forms two rings, the second of which commits once and then
    hangs: each hook on the thread its spec names."""
    from horovod.runner.common.util.hosts import SlotInfo

    from spotring.autoscaler.job import JobConfig, run_job
    from spotring.driver import elastic
    from spotring.driver.durable import RingLoss

    def fake_run_elastic(
        command: Any, controller: Any, launcher: Any, job: Any, options: Any, ring: Any
    ) -> None:
        rings, progress = ring.tracker, ring.progress
        rings.start(address="127.0.0.1", job_key=JOB_KEY)
        progress.start(lambda hang: None)
        try:
            plan = [SlotInfo("a", 0, 0, 0, 1, 1, 1)]
            progress.slot_started("a", 0)
            on_thread(HOROVOD, rings.init, plan)
            progress.worker_progress("a", 0, 1, 0.0)
            on_thread(HOROVOD, ring.ring_lost, RingLoss(1, "every worker died"))
            on_thread(HOROVOD, rings.init, plan)  # a reset
            time.sleep(0.1)
            progress.worker_progress("a", 0, 2, 0.0)  # ends the stall; then it hangs
            eventually(lambda: "spotring_ring_hung" in recorder.threads)
        finally:
            progress.close()
            rings.stop()

    monkeypatch.setattr(elastic, "run_elastic", fake_run_elastic)
    pm = get_plugin_manager(load_entry_points=False)
    recorder = ThreadRecorder()
    pm.register(recorder)
    config = JobConfig(
        command=("true",),
        shape=JobShape(num_proc=1, min_num_proc=1, max_num_proc=1, resize=False),
        elastic=ElasticOptions(start_timeout=5, hang_timeout=2.0),
        refresh_interval=0.05,
    )
    provider = ScriptedProvider([instance("a")])
    outcome = run_job(config, provider, pm, ProgressReporter(io.StringIO()))
    assert outcome.exit_code == 0
    job = threading.current_thread().name
    assert recorder.threads == {
        "spotring_job_started": {job},
        "spotring_refreshed": {CONTROLLER},
        "spotring_target_size": {CONTROLLER},
        "spotring_inventory_changed": {CONTROLLER},
        "spotring_ring_formed": {HOROVOD},
        "spotring_ring_progress": {PROGRESS},
        "spotring_ring_idle": {PROGRESS},
        "spotring_ring_stalled": {PROGRESS},
        "spotring_ring_hung": {PROGRESS},
        "spotring_ring_lost": {HOROVOD},
        "spotring_job_finished": {job},
    }
