"""Controller and discovery adapter: cache, failures keep the last good inventory."""

from __future__ import annotations

import pytest

from spotring.autoscaler import hookimpl
from spotring.autoscaler.controller import Backoff, Controller, hosts_for_slots
from spotring.autoscaler.plugins import get_plugin_manager
from spotring.driver.discovery import InventoryHostDiscovery
from spotring.providers.base import ConfigurationError, InstanceState, ProviderError
from tests.fakes import ScriptedProvider, instance


class Recorder:
    """A plugin that records the controller's events."""

    def __init__(self) -> None:
        self.changes: list[tuple[list[str], list[str]]] = []
        self.failed: list[tuple[str, str]] = []

    @hookimpl
    def spotring_inventory_changed(self, added, removed, ready) -> None:  # type: ignore[no-untyped-def]
        self.changes.append(([i.address for i in added], [i.address for i in removed]))

    @hookimpl
    def spotring_host_failed(self, instance, reason) -> None:  # type: ignore[no-untyped-def]
        self.failed.append((instance.address, reason))


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
    pm = get_plugin_manager(load_entry_points=False)
    pm.register(recorder)
    return Controller(provider, pm.hook, refresh_interval=0.01, replace_grace=0)


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
    provider.members = [instance("a"), instance("b", slots=2), instance("c")]
    controller.refresh()
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
    assert recorder.failed == [("b", "worker exited with -9")]
    # A second report of the same failure is not a second replacement.
    controller.host_failed("b", "again")
    controller._replace_pending()
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
    original = provider.replace_instance

    def failing(instance_id: str) -> None:
        raise ProviderError("throttled")

    provider.replace_instance = failing  # type: ignore[method-assign]
    controller._replace_pending()
    assert provider.replaced == []
    provider.replace_instance = original  # type: ignore[method-assign]
    controller._replace_pending()
    assert provider.replaced == ["i-a"]


def test_unknown_host_failure_is_ignored(controller: Controller) -> None:
    controller.refresh()
    assert controller.host_failed("nowhere", "?") is None
    assert controller.inventory.hosts_and_slots() == {"a": 1, "b": 2}


def test_thread_waits_for_first_inventory_and_steers(provider: ScriptedProvider) -> None:
    controller = Controller(provider, refresh_interval=0.01, target_size=3)
    controller.start()
    try:
        inventory = controller.wait_for_inventory(timeout=5)
    finally:
        controller.stop()
    assert inventory.hosts_and_slots() == {"a": 1, "b": 2}
    assert provider.targets == [3]


def test_configuration_error_surfaces_at_once(provider: ScriptedProvider) -> None:
    provider.error = ConfigurationError("group 'x' not found")
    controller = Controller(provider, refresh_interval=0.01)
    controller.start()
    try:
        with pytest.raises(ConfigurationError, match="not found"):
            controller.wait_for_inventory(timeout=30)
    finally:
        controller.stop()


def test_transient_errors_time_out_with_the_last_error(provider: ScriptedProvider) -> None:
    provider.error = ProviderError("503 from the API")
    controller = Controller(provider, refresh_interval=0.01, backoff=Backoff(base=0.01, cap=0.02))
    controller.start()
    try:
        with pytest.raises(ProviderError, match="503"):
            controller.wait_for_inventory(timeout=0.3)
    finally:
        controller.stop()
    assert provider.list_calls >= 2, "refresh must be retried"


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
    controller = Controller(provider, refresh_interval=0.01, replace_grace=60)
    controller.refresh()
    for host in ("a", "b"):
        controller.host_failed(host, "exit 1")
    assert controller._replace_pending() == pytest.approx(60, abs=1)
    controller.stop()  # the job ended: nothing is due any more
    controller._replace_pending()
    assert provider.replaced == []
