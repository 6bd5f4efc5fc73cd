"""Stopping Horovod's driver never waits without a bound (it runs on Ctrl-C's thread)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from spotring.driver.elastic import _Stopper


class Registry:
    """Horovod's ``WorkerStateRegistry`` in a reset: one of its 3 workers recorded."""

    def __init__(self) -> None:
        self._barrier = threading.Barrier(3)


class StuckDriver:
    """Horovod's ``ElasticDriver`` as a stop finds it when its discovery thread is in a
    host-change notice to a worker that does not answer: ``stop`` sets the shutdown,
    then joins that thread (here: never returns), which holds the hosts lock."""

    def __init__(self) -> None:
        self._wait_hosts_cond = threading.Condition()
        self._shutdown = threading.Event()
        self._worker_registry = Registry()
        self.release = threading.Event()
        self.stopped_with: list[str | None] = []

    def stop(self, error_message: str | None = None) -> None:
        self.stopped_with.append(error_message)
        self._shutdown.set()
        self.release.wait(60)

    def finished(self) -> bool:
        return self._shutdown.is_set()


def _spotrings(horovods_exit: Callable[..., None]) -> Any:
    """The stuck driver as spotring's subclass of Horovod's (its ``_handle_worker_exit``
    routed to the override), with ``horovods_exit`` as Horovod's own step."""
    from spotring.driver.horovod_driver import SpotringElasticDriver

    class Driver(StuckDriver, SpotringElasticDriver):
        horovod_handle_worker_exit = horovods_exit

    return Driver()


def _hold(cond: threading.Condition, release: threading.Event) -> threading.Thread:
    held = threading.Event()

    def hold() -> None:
        with cond:
            held.set()
            release.wait(60)

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert held.wait(5)
    return thread


def test_a_stop_returns_while_horovods_stop_hangs_and_its_lock_is_held(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_Stopper, "STOP_WAIT_SECONDS", 0.3)
    driver = StuckDriver()
    _hold(driver._wait_hosts_cond, driver.release)
    stopper = _Stopper(driver)  # type: ignore[arg-type]
    caller = threading.Thread(target=stopper.stop, args=("interrupted",))
    try:
        caller.start()
        caller.join(5)
        assert not caller.is_alive(), "the stop waited for Horovod's driver"
        # What stops the workers happened, and the reason is kept.
        assert driver.finished() and driver.stopped_with == ["interrupted"]
        assert stopper.reason == "interrupted"
    finally:
        driver.release.set()


def test_a_stop_wakes_a_wait_for_slots(monkeypatch: pytest.MonkeyPatch) -> None:
    """A thread waiting for slots (the start, a resume) hears the shutdown at once."""
    monkeypatch.setattr(_Stopper, "STOP_WAIT_SECONDS", 0.3)
    driver = StuckDriver()
    woken = threading.Event()

    def wait_for_slots() -> None:
        with driver._wait_hosts_cond:
            while not driver.finished():
                driver._wait_hosts_cond.wait(60)
            woken.set()

    waiter = threading.Thread(target=wait_for_slots, daemon=True)
    waiter.start()
    try:
        _Stopper(driver).stop("interrupted")  # type: ignore[arg-type]
        assert woken.wait(5)
    finally:
        driver.release.set()


def test_a_stop_releases_a_worker_exit_waiting_at_the_reset_barrier(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A dead worker's exit waits at the reset's barrier for the others, which a stopped
    job never records: Horovod's results join that thread, so Ctrl-C there hung."""
    monkeypatch.setattr(_Stopper, "STOP_WAIT_SECONDS", 0.3)
    outcome: list[str] = []

    def record_failure(self: Any, slot_info: object, exit_code: int, timestamp: float) -> None:
        self._worker_registry._barrier.wait()  # as Horovod's _record_state does
        outcome.append("recorded")

    driver = _spotrings(record_failure)
    exit_thread = threading.Thread(
        target=lambda: outcome.append(str(driver._handle_worker_exit(None, -9, 0.0))),
        daemon=True,
    )
    exit_thread.start()
    try:
        _Stopper(driver).stop("interrupted")  # type: ignore[arg-type]
        exit_thread.join(5)
        assert not exit_thread.is_alive(), "the exit still waits at the barrier"
        assert outcome == ["None"]  # ended quietly: no BrokenBarrierError escaped
    finally:
        driver.release.set()


def test_an_exit_meeting_a_broken_barrier_before_the_stop_still_raises() -> None:
    def record_failure(self: Any, slot_info: object, exit_code: int, timestamp: float) -> None:
        raise threading.BrokenBarrierError

    driver = _spotrings(record_failure)
    with pytest.raises(threading.BrokenBarrierError):
        driver._handle_worker_exit(None, -9, 0.0)
