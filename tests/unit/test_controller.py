"""Controller and discovery adapter: cache, failures keep the last good inventory."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace

import pytest

from spotring.autoscaler import hookimpl
from spotring.autoscaler.controller import Backoff, Controller, ControllerError
from spotring.autoscaler.plugins import get_plugin_manager
from spotring.autoscaler.policy import JobShape
from spotring.driver.discovery import InventoryHostDiscovery
from spotring.providers.base import (
    ConfigurationError,
    Instance,
    InstanceState,
    InterruptionNotice,
    ProviderError,
    hosts_for_slots,
)
from tests.fakes.scripted import ScriptedProvider, instance

JOB = JobShape(num_proc=2, min_num_proc=1, max_num_proc=3)


class Recorder:
    """A plugin that records the controller's events."""

    def __init__(self) -> None:
        self.changes: list[tuple[list[str], list[str]]] = []
        self.failed: list[tuple[str, str]] = []
        self.threads: set[str] = set()

    @hookimpl
    def spotring_inventory_changed(self, added, removed, ready) -> None:  # type: ignore[no-untyped-def]
        self.threads.add(threading.current_thread().name)
        self.changes.append(([i.address for i in added], [i.address for i in removed]))

    @hookimpl
    def spotring_host_failed(self, instance, reason) -> None:  # type: ignore[no-untyped-def]
        self.threads.add(threading.current_thread().name)
        self.failed.append((instance.address, reason))


def make_controller(provider: ScriptedProvider, *plugins: object, **kwargs: object) -> Controller:
    pm = get_plugin_manager(load_entry_points=False)
    for plugin in plugins:
        pm.register(plugin)
    kwargs.setdefault("refresh_interval", 0.01)
    return Controller(provider, pm.hook, **kwargs)  # type: ignore[arg-type]


def eventually(condition: Callable[[], object], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


@pytest.fixture
def provider() -> ScriptedProvider:
    return ScriptedProvider(
        [instance("a"), instance("b", slots=2), instance("c", InstanceState.PENDING)]
    )


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()


@pytest.fixture
def controller(provider: ScriptedProvider, recorder: Recorder) -> Controller:
    return make_controller(provider, recorder, job=JOB, replace_grace=0)


def test_discovery_answers_ready_hosts_from_cache(
    controller: Controller, provider: ScriptedProvider
) -> None:
    discovery = InventoryHostDiscovery(controller)
    with pytest.raises(RuntimeError, match="no inventory"):
        discovery.find_available_hosts_and_slots()
    assert controller.refresh()
    calls = provider.list_calls
    for _ in range(5):
        assert discovery.find_available_hosts_and_slots() == {"a": 1, "b": 2}
    assert provider.list_calls == calls, "discovery must not call the cloud"


def test_failed_refresh_keeps_last_good_inventory(
    controller: Controller, provider: ScriptedProvider
) -> None:
    discovery = InventoryHostDiscovery(controller)
    controller.refresh()
    provider.error = ProviderError("throttled")
    provider.members = []
    assert not controller.refresh()
    assert discovery.find_available_hosts_and_slots() == {"a": 1, "b": 2}
    assert controller.last_error is provider.error
    provider.error = None
    provider.members = [instance("a")]
    assert controller.refresh()
    assert discovery.find_available_hosts_and_slots() == {"a": 1}


def test_an_empty_group_is_reported_empty(
    controller: Controller, provider: ScriptedProvider
) -> None:
    controller.refresh()
    provider.members = []
    assert controller.refresh()
    assert InventoryHostDiscovery(controller).find_available_hosts_and_slots() == {}


def test_pending_host_joins_when_ready(
    controller: Controller, provider: ScriptedProvider, recorder: Recorder
) -> None:
    controller.refresh()
    controller._announce()
    provider.members = [instance("a"), instance("b", slots=2), instance("c")]
    controller.refresh()
    controller._announce()
    assert controller.inventory.hosts_and_slots() == {"a": 1, "b": 2, "c": 1}
    assert recorder.changes == [(["a", "b"], []), (["c"], [])]


def test_failed_host_leaves_at_once_and_is_replaced(
    controller: Controller, provider: ScriptedProvider, recorder: Recorder
) -> None:
    controller.refresh()
    failed = controller.host_failed("b", "worker exited with -9")
    assert failed is not None and failed.id == "i-b"
    # Gone from discovery before the cloud notices anything.
    assert controller.inventory.hosts_and_slots() == {"a": 1}
    # A second report of the same failure is not a second replacement.
    controller.host_failed("b", "again")
    controller._take_failed_hosts()
    assert recorder.failed == [("b", "worker exited with -9")]
    controller._replace_due()
    assert provider.replaced == ["i-b"]
    # The cloud still lists it as READY for a while: it stays out.
    controller.refresh()
    assert "b" not in controller.inventory.hosts_and_slots()
    # Once the cloud stops listing it, the exclusion is forgotten.
    provider.members = [instance("a")]
    controller.refresh()
    assert controller.inventory.excluded == frozenset()


def test_replacement_is_retried_after_a_provider_error(
    controller: Controller, provider: ScriptedProvider
) -> None:
    controller.refresh()
    controller.host_failed("a", "boom")
    controller._take_failed_hosts()
    original = provider.replace_instance

    def failing(instance_id: str) -> None:
        raise ProviderError("throttled")

    provider.replace_instance = failing  # type: ignore[method-assign]
    controller._replace_due()
    assert provider.replaced == []
    provider.replace_instance = original  # type: ignore[method-assign]
    controller._replacements._due["i-a"] = 0.0  # due again now
    controller._replace_due()
    assert provider.replaced == ["i-a"]


def test_no_replace_keeps_the_host(provider: ScriptedProvider) -> None:
    job = JobShape(num_proc=2, min_num_proc=1, max_num_proc=3, replace_failed=False)
    controller = make_controller(provider, job=job, replace_grace=0)
    controller.refresh()
    controller.host_failed("a", "boom")
    controller._take_failed_hosts()
    assert controller._replace_due() is None and provider.replaced == []


def test_unknown_host_failure_is_ignored(controller: Controller) -> None:
    controller.refresh()
    assert controller.host_failed("nowhere", "?") is None
    assert controller.inventory.hosts_and_slots() == {"a": 1, "b": 2}


def test_failed_host_is_readmitted_after_the_cooldown(provider: ScriptedProvider) -> None:
    job = JobShape(num_proc=2, min_num_proc=1, max_num_proc=3, replace_failed=False)
    controller = make_controller(provider, job=job, readmit_after=0.3, refresh_interval=3600)
    controller.start()
    try:
        controller.wait_for_inventory(timeout=5)
        controller.host_failed("b", "exit 1")
        assert controller.inventory.hosts_and_slots() == {"a": 1}
        # Back after the cooldown, well before the next scheduled refresh (an hour).
        eventually(lambda: controller.inventory.hosts_and_slots() == {"a": 1, "b": 2})
    finally:
        controller.stop()


def test_events_reach_plugins_on_the_controller_thread(
    provider: ScriptedProvider, recorder: Recorder
) -> None:
    controller = make_controller(provider, recorder, job=JOB, replace_grace=3600)
    controller.start()
    try:
        controller.wait_for_inventory(timeout=5)
        failing_thread = threading.Thread(target=controller.host_failed, args=("a", "x"))
        failing_thread.start()
        failing_thread.join()
        eventually(lambda: recorder.failed and len(recorder.changes) == 2)
    finally:
        controller.stop()
    assert recorder.threads == {"spotring-controller"}
    assert recorder.changes == [(["a", "b"], []), ([], ["a"])]


def test_a_broken_event_plugin_is_logged_once_and_others_still_hear(
    provider: ScriptedProvider, recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken:
        @hookimpl
        def spotring_inventory_changed(self, added, removed, ready) -> None:  # type: ignore[no-untyped-def]
            raise KeyError("oops")

    controller = make_controller(provider, Broken(), recorder, job=JOB)
    controller.refresh()
    controller._announce()
    provider.members = [instance("a")]
    controller.refresh()
    controller._announce()
    assert recorder.changes == [(["a", "b"], []), ([], ["b"])]
    assert caplog.text.count("failed in spotring_inventory_changed: KeyError") == 1


def test_events_go_through_the_plugin_manager_traced_and_wrapped(
    provider: ScriptedProvider,
    recorder: Recorder,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    class Wrapper:
        def __init__(self) -> None:
            self.around: list[str] = []

        @hookimpl(wrapper=True)
        def spotring_inventory_changed(self, added, removed, ready):  # type: ignore[no-untyped-def]
            self.around.append("before")
            result = yield
            self.around.append("after")
            return result

    monkeypatch.setenv("SPOTRING_TRACE_HOOKS", "1")
    wrapper = Wrapper()
    controller = make_controller(provider, wrapper, recorder, job=JOB)
    controller.refresh()
    controller._announce()
    assert wrapper.around == ["before", "after"]
    assert recorder.changes == [(["a", "b"], [])]
    assert "spotring_inventory_changed" in capsys.readouterr().err


def test_a_broken_wrapper_or_late_historic_plugin_is_isolated_too(
    provider: ScriptedProvider, recorder: Recorder, caplog: pytest.LogCaptureFixture
) -> None:
    class BrokenWrapper:
        @hookimpl(wrapper=True)
        def spotring_inventory_changed(self, added, removed, ready):  # type: ignore[no-untyped-def]
            raise KeyError("before its yield")
            yield

        @hookimpl(wrapper=True)
        def spotring_host_failed(self, instance, reason):  # type: ignore[no-untyped-def]
            yield
            raise KeyError("after its yield")

    class BrokenLate:
        @hookimpl
        def spotring_job_started(self, provider, job) -> None:  # type: ignore[no-untyped-def]
            raise KeyError("historic")

    pm = get_plugin_manager(load_entry_points=False)
    pm.register(BrokenWrapper())
    pm.register(recorder)
    controller = Controller(provider, pm.hook, job=JOB, replace_grace=0)
    controller.refresh()
    controller._announce()
    controller.host_failed("a", "worker rank 0 exited with 1")
    controller._take_failed_hosts()
    assert recorder.changes == [(["a", "b"], [])]
    assert recorder.failed == [("a", "worker rank 0 exited with 1")]
    pm.hook.spotring_job_started.call_historic(
        kwargs={"provider": provider, "job": JOB, "groups": [provider]}
    )
    pm.register(BrokenLate())  # hears the job's start now, and fails: logged, not raised
    assert "failed in spotring_inventory_changed: KeyError" in caplog.text
    assert "failed in spotring_host_failed: KeyError" in caplog.text
    assert "failed in spotring_job_started: KeyError" in caplog.text


def test_thread_waits_for_first_inventory_and_steers(provider: ScriptedProvider) -> None:
    job = JobShape(num_proc=2, min_num_proc=1, max_num_proc=4, target_hosts=3)
    controller = make_controller(provider, job=job)
    controller.start()
    try:
        inventory = controller.wait_for_inventory(timeout=5)
        eventually(lambda: provider.targets)
    finally:
        controller.stop()
    assert inventory.hosts_and_slots() == {"a": 1, "b": 2}
    assert provider.targets == [3]


def test_sizing_uses_the_slots_the_hosts_have(provider: ScriptedProvider) -> None:
    provider.members = [instance(f"gpu{n}", slots=4) for n in range(2)]
    job = JobShape(num_proc=16, min_num_proc=8, max_num_proc=16)
    controller = make_controller(provider, job=job)
    controller.step()
    assert provider.targets == [4], "16 workers at 4 slots per host need 4 hosts"
    # Later the group is kept within what --min-np/--max-np need: 2..4 hosts.
    provider.members = [instance(f"gpu{n}", slots=4) for n in range(6)]
    controller.step()
    assert provider.targets == [4, 4] or provider.targets == [4]
    controller._steering.target = 1  # e.g. someone resized the group under us
    controller.step()
    assert provider.targets[-1] == 4
    job = JobShape(num_proc=16, min_num_proc=8, max_num_proc=16, resize=False)
    fixed = make_controller(provider, job=job)
    fixed.step()
    assert provider.targets[-1] == 4 and fixed.target_size is None


def test_a_group_that_outgrew_max_np_is_shrunk(provider: ScriptedProvider) -> None:
    provider.members = [instance(f"h{n}", slots=2) for n in range(5)]
    controller = make_controller(provider, job=JobShape(num_proc=4, min_num_proc=2, max_num_proc=6))
    controller.step()
    assert provider.targets == [3]  # 5 hosts, but 6 workers at 2 slots need only 3


def test_configuration_error_surfaces_at_once(provider: ScriptedProvider) -> None:
    provider.error = ConfigurationError("group 'x' not found")
    controller = make_controller(provider)
    controller.start()
    try:
        began = time.monotonic()
        with pytest.raises(ConfigurationError, match="not found"):
            controller.wait_for_inventory(timeout=30)
        assert time.monotonic() - began < 5
    finally:
        controller.stop()


class LimitsFail(ScriptedProvider):
    def size_limits(self) -> tuple[int, int]:
        raise ConfigurationError("auto scaling group 'x' not found")


def test_an_error_while_steering_stops_the_controller_with_its_message() -> None:
    provider = LimitsFail([instance("a")])
    controller = make_controller(provider, job=JOB)
    controller.start()
    try:
        error = controller.wait_for_fatal_error(timeout=10)
    finally:
        controller.stop()
    assert isinstance(error, ConfigurationError) and "not found" in str(error)
    assert controller._thread is not None and not controller._thread.is_alive()


class Buggy(ScriptedProvider):
    def list_instances(self) -> list[Instance]:
        raise KeyError("InstanceId")


def test_a_providers_bug_is_not_retried_forever() -> None:
    controller = make_controller(Buggy())
    controller.start()
    try:
        with pytest.raises(
            ControllerError, match="listing the group failed unexpectedly: KeyError"
        ):
            controller.wait_for_inventory(timeout=30)
    finally:
        controller.stop()


def test_a_broken_decision_hook_stops_the_controller(provider: ScriptedProvider) -> None:
    class BadPolicy:
        @hookimpl
        def spotring_target_size(self, inventory, job, current_target) -> int:  # type: ignore[no-untyped-def]
            raise ZeroDivisionError("division by zero")

    controller = make_controller(provider, BadPolicy(), job=JOB)
    controller.start()
    try:
        error = controller.wait_for_fatal_error(timeout=10)
    finally:
        controller.stop()
    assert isinstance(error, ControllerError)
    assert "spotring_target_size hook failed unexpectedly: ZeroDivisionError" in str(error)


def test_a_plugins_answer_comes_before_spotrings(provider: ScriptedProvider) -> None:
    class Fixed:
        @hookimpl
        def spotring_target_size(self, inventory, job, current_target) -> int:  # type: ignore[no-untyped-def]
            return 7

    controller = make_controller(provider, Fixed(), job=JOB)
    controller.step()
    assert provider.targets == [7]


def test_a_member_with_an_unusable_address_is_left_out(provider: ScriptedProvider) -> None:
    provider.members = [instance("a"), instance("-oProxyCommand=evil"), instance("b c")]
    controller = make_controller(provider)
    controller.refresh()
    assert controller.inventory.hosts_and_slots() == {"a": 1}


def test_transient_errors_time_out_with_the_last_error(provider: ScriptedProvider) -> None:
    provider.error = ProviderError("503 from the API")
    controller = make_controller(provider, backoff=Backoff(base=0.01, cap=0.02))
    controller.start()
    try:
        with pytest.raises(ProviderError, match="503"):
            controller.wait_for_inventory(timeout=0.3)
    finally:
        controller.stop()
    assert provider.list_calls >= 2, "refresh must be retried"
    assert controller.wait_for_fatal_error(timeout=0) is None


def test_backoff_grows_to_its_cap_with_jitter() -> None:
    backoff = Backoff(base=1.0, cap=8.0)
    assert backoff.delay(1, rng=lambda: 1.0) == 1.0
    assert backoff.delay(3, rng=lambda: 1.0) == 4.0
    assert backoff.delay(10, rng=lambda: 1.0) == 8.0
    assert backoff.delay(10, rng=lambda: 0.0) == 4.0


def test_hosts_for_slots() -> None:
    assert hosts_for_slots(4, 1) == 4
    assert hosts_for_slots(5, 2) == 3
    assert hosts_for_slots(1, 8) == 1


def test_no_host_is_replaced_when_the_whole_job_fails_within_the_grace(
    provider: ScriptedProvider,
) -> None:
    controller = make_controller(provider, job=JOB, replace_grace=60)
    controller.refresh()
    for host in ("a", "b"):
        controller.host_failed(host, "exit 1")
    controller._take_failed_hosts()
    assert controller._replace_due() == pytest.approx(60, abs=1)
    controller.stop()  # the job ended: nothing is due any more
    controller._replace_due()
    assert provider.replaced == []


class NoticeRecorder:
    def __init__(self) -> None:
        self.heard: list[tuple[str, str, bool, str]] = []

    @hookimpl
    def spotring_host_noticed(self, instance, notice, draining) -> None:  # type: ignore[no-untyped-def]
        self.heard.append(
            (instance.address, notice.kind, draining, threading.current_thread().name)
        )


def test_a_noticed_host_drains_at_once_and_its_replacement_is_asked_for(
    provider: ScriptedProvider,
) -> None:
    recorder = NoticeRecorder()
    controller = make_controller(provider, recorder, job=JOB)
    assert controller.refresh()
    deadline = time.time() + 120
    assert controller.host_noticed("b", InterruptionNotice("preempt", deadline))
    # Discovery drops it before the controller thread runs at all.
    inventory = controller.inventory
    assert inventory is not None and inventory.hosts_and_slots() == {"a": 1}
    b = inventory.by_address("b")
    assert b is not None and b.state is InstanceState.DRAINING and b.notice.deadline == deadline
    assert controller.refresh()  # still draining after the next listing
    assert controller.inventory.hosts_and_slots() == {"a": 1}  # type: ignore[union-attr]

    controller.start()
    try:
        eventually(lambda: provider.noticed == [("i-b", "preempt")])
        eventually(lambda: recorder.heard)
        assert recorder.heard == [("b", "preempt", True, "spotring-controller")]
        # The same notice from the host's other worker changes nothing.
        assert controller.host_noticed("b", InterruptionNotice("preempt", deadline))
        time.sleep(0.1)
        assert len(recorder.heard) == 1
        # Once the cloud no longer lists it, the notice is forgotten.
        provider.members = [m for m in provider.members if m.address != "b"]
        eventually(lambda: controller.inventory.by_address("b") is None)  # type: ignore[union-attr]
    finally:
        controller.stop()
    assert not controller._membership._notices


@pytest.mark.parametrize("drain_on_rebalance", [False, True])
def test_a_rebalance_recommendation_drains_only_when_asked(
    provider: ScriptedProvider, drain_on_rebalance: bool
) -> None:
    job = JobShape(
        num_proc=2, min_num_proc=1, max_num_proc=3, drain_on_rebalance=drain_on_rebalance
    )
    controller = make_controller(provider, job=job)
    assert controller.refresh()
    drained = controller.host_noticed("b", InterruptionNotice("rebalance"))
    assert drained is drain_on_rebalance
    ready = controller.inventory.hosts_and_slots()  # type: ignore[union-attr]
    assert ("b" in ready) is not drain_on_rebalance
    controller._take_noticed_hosts()
    assert provider.noticed == [("i-b", "rebalance")]  # a replacement starts early either way


# ------------------------------------------------- members the cloud reports failed


def _evicted(name: str) -> Instance:
    return replace(instance(name, InstanceState.GONE), failure="spot VM evicted (deallocated)")


@pytest.mark.parametrize("replace_failed", [True, False])
def test_a_member_the_cloud_reports_failed_is_replaced_only_by_decision(
    provider: ScriptedProvider, recorder: Recorder, replace_failed: bool
) -> None:
    job = JobShape(num_proc=2, min_num_proc=1, max_num_proc=3, replace_failed=replace_failed)
    controller = make_controller(provider, recorder, job=job, replace_grace=60)
    controller.step()
    provider.members[0] = _evicted("a")

    for _ in range(3):
        controller.step()

    # Once, at once (no grace: the cloud said so, not a failing job), unless --no-replace.
    assert provider.replaced == (["i-a"] if replace_failed else [])
    assert recorder.failed == [("a", "spot VM evicted (deallocated)")]


def test_a_listing_without_a_job_never_replaces(
    provider: ScriptedProvider, recorder: Recorder
) -> None:
    provider.members[0] = _evicted("a")
    controller = make_controller(provider, recorder)  # as for `spotring discover`

    controller.step()

    assert provider.replaced == [] and provider.targets == []


def test_keep_size_is_asked_only_while_steering(provider: ScriptedProvider) -> None:
    calls: list[str] = []
    provider.keep_size = lambda: calls.append("keep")  # type: ignore[method-assign]

    make_controller(provider).step()
    assert calls == []
    make_controller(provider, job=JOB).step()
    assert calls == ["keep"]


class StuckProvider(ScriptedProvider):
    """A provider whose listing blocks until released (a cloud call in its retries)."""

    def __init__(self) -> None:
        super().__init__([instance("a")])
        self.entered = threading.Event()
        self.release = threading.Event()

    def list_instances(self) -> list[Instance]:
        if self.list_calls:
            self.entered.set()
            self.release.wait(60)
        return super().list_instances()


def test_stop_does_not_wait_out_a_provider_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """A stop (Ctrl-C included) waits for the controller thread a bounded time only."""
    monkeypatch.setattr(Controller, "STOP_WAIT_SECONDS", 0.2)
    provider = StuckProvider()
    controller = make_controller(provider, job=JOB)
    controller.start()
    try:
        assert provider.entered.wait(10), "the controller never listed again"
        stopper = threading.Thread(target=controller.stop)
        stopper.start()
        stopper.join(5)
        assert not stopper.is_alive(), "stop() waited for the provider call"
    finally:
        provider.release.set()
