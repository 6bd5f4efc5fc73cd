"""spotring's seam to Horovod (driver/horovod_driver.py): one subclass whose overrides are
the whole list of what spotring changes in Horovod's elastic driver, reached from
Horovod's private steps by routing, not by patching a driver after it is made."""

from __future__ import annotations

import inspect
from typing import Any

from horovod.runner.elastic.driver import ElasticDriver
from horovod.runner.elastic.registration import WorkerStateRegistry

from spotring.core.job import JobShape
from spotring.driver import horovod_driver
from spotring.driver.horovod_driver import SpotringElasticDriver, SpotringWorkerStateRegistry
from spotring.driver.launcher import ProcessLauncher
from spotring.driver.options import DurableOptions, ElasticOptions
from spotring.driver.ring_side import RingSide
from tests.unit.quiet_controller import QuietController

OVERRIDES = {
    "register_worker_server",
    "get_slot_info",
    "record_ready",
    "handle_worker_exit",
    "notify_workers_host_changes",
    "update_host_assignments",
}


def _own_methods(cls: type) -> set[str]:
    return {name for name, value in vars(cls).items() if inspect.isfunction(value)}


def test_the_overrides_are_the_list_the_module_gives() -> None:
    """Every method of the subclass that takes one of Horovod's steps is in the list (a
    new change is a new override, named in the module's docstring); besides them it
    has only the replay the coordinator's registration starts."""
    own = {m for m in _own_methods(SpotringElasticDriver) if not m.startswith("horovod_")}
    own.discard("__init__")
    routed = {"_handle_worker_exit", "_notify_workers_host_changes", "_update_host_assignments"}
    assert own - routed == OVERRIDES | {"replay_host_changes"}
    assert all(hasattr(ElasticDriver, name) or hasattr(ElasticDriver, f"_{name}")
               for name in OVERRIDES)  # fmt: skip
    for name in OVERRIDES:
        assert f"SpotringElasticDriver.{name}`" in (horovod_driver.__doc__ or ""), name


def test_horovods_private_steps_reach_the_overrides_and_horovods_own_stay_callable() -> None:
    assert SpotringElasticDriver.horovod_handle_worker_exit is ElasticDriver._handle_worker_exit
    assert (
        SpotringElasticDriver.horovod_notify_workers_host_changes
        is ElasticDriver._notify_workers_host_changes
    )
    assert (
        SpotringElasticDriver.horovod_update_host_assignments
        is ElasticDriver._update_host_assignments
    )
    assert (
        SpotringWorkerStateRegistry.horovod_workers_recorded
        is WorkerStateRegistry._on_workers_recorded
    )
    driver: Any = SpotringElasticDriver.__new__(SpotringElasticDriver)  # no threads
    heard: list[tuple[str, tuple[Any, ...]]] = []
    driver.handle_worker_exit = lambda *args: heard.append(("exit", args))
    driver.notify_workers_host_changes = lambda *args: heard.append(("notify", args))
    driver.update_host_assignments = lambda *args: heard.append(("assign", args))
    driver._handle_worker_exit("slot", 1, 2.0)
    driver._notify_workers_host_changes("hosts", 3)
    driver._update_host_assignments("hosts")
    assert heard == [("exit", ("slot", 1, 2.0)), ("notify", ("hosts", 3)), ("assign", ("hosts",))]


def _driver(options: ElasticOptions) -> tuple[SpotringElasticDriver, ProcessLauncher]:
    launcher = ProcessLauncher(remote=False)
    job = JobShape(num_proc=2, min_num_proc=1, max_num_proc=2, resize=True)
    # No host in the inventory: Horovod's discovery thread finds none, nothing starts.
    ring = RingSide(QuietController(), launcher, job, options)
    ring.tracker.start(address="127.0.0.1", job_key=ring.job_key)  # Horovod's stop stops it
    return SpotringElasticDriver(ring, job, options), launcher


def test_with_durable_checkpoints_the_registry_resumes_lost_rings() -> None:
    driver, launcher = _driver(ElasticOptions(durable=DurableOptions("/tmp/x"), reset_limit=4))
    try:
        registry: Any = driver._worker_registry
        assert isinstance(registry, SpotringWorkerStateRegistry)
        assert registry.lost_rings is driver.lost_rings is not None
        assert registry._reset_limit == 4
    finally:
        driver.stop()
        launcher.close()
