"""The controller owns the job's price book: the book's thread reads the groups'
prices, the controller learns the groups' slots per host from each listing and
announces each price as it changes, never waiting on a price API; ``--price`` names
a group or a lifecycle, else it is refused."""

from __future__ import annotations

import threading

import pytest

from spotring.autoscaler import hookimpl
from spotring.autoscaler.composition import check_prices
from spotring.autoscaler.controller import Controller
from spotring.autoscaler.plugins import get_plugin_manager
from spotring.core import ConfigurationError, JobShape, Lifecycle
from spotring.core.prices import HourlyPrice
from tests.fakes.scripted import ScriptedProvider, instance

JOB = JobShape(num_proc=2, min_num_proc=1, max_num_proc=4)


class PricedGroup(ScriptedProvider):
    """A group whose cloud quotes the prices it is given, one per reading."""

    def __init__(self, name: str, lifecycle: Lifecycle, quotes: list[float | None]) -> None:
        super().__init__([instance(f"{name}-1", slots=2)])
        self.name_, self.lifecycle, self.quotes = name, lifecycle, quotes

    def group_name(self) -> str:
        return self.name_

    def group_lifecycle(self) -> Lifecycle:
        return self.lifecycle

    def hourly_price(self) -> HourlyPrice | None:
        usd = self.quotes.pop(0) if self.quotes else None
        return None if usd is None else HourlyPrice(usd, "cloud", 0.0)


class Prices:
    def __init__(self) -> None:
        self.heard: list[tuple[str, str | None, float | None, str | None]] = []

    @hookimpl
    def spotring_price_changed(self, group, lifecycle, price) -> None:  # type: ignore[no-untyped-def]
        self.heard.append(
            (group, lifecycle and lifecycle.value, price and price.usd, price and price.source)
        )


def controller_of(groups: list[PricedGroup], prices: dict[str, float], heard: Prices) -> Controller:
    pm = get_plugin_manager(load_entry_points=False)
    pm.register(heard)
    return Controller(groups, pm.hook, job=JOB, prices=prices, price_refresh=0.0)


def test_each_groups_price_is_announced_once_per_change_with_its_source() -> None:
    spot = PricedGroup("spot-g", Lifecycle.SPOT, [0.1, 0.1, 0.2])
    on_demand = PricedGroup("od-g", Lifecycle.ON_DEMAND, [0.9])
    heard = Prices()
    controller = controller_of([spot, on_demand], {"on-demand": 1.0}, heard)
    controller.prices.groups_listed()  # as after the job's first listing
    for _ in range(3):
        controller.prices.read_due()  # what the book's thread does
        assert controller.refresh()
    assert heard.heard == [
        ("spot-g", "spot", 0.1, "cloud"),
        ("od-g", "on-demand", 1.0, "--price"),
        ("spot-g", "spot", 0.2, "cloud"),
    ]
    assert controller.prices.per_slot("spot-g") == 0.1  # 0.2 over its hosts' 2 slots
    assert on_demand.quotes == [0.9]  # overridden: its cloud is never asked


class BlockingGroup(PricedGroup):
    """A group whose price API does not answer until it is released."""

    def __init__(self) -> None:
        super().__init__("slow", Lifecycle.SPOT, [0.3])
        self.asked, self.release = threading.Event(), threading.Event()

    def hourly_price(self) -> HourlyPrice | None:
        self.asked.set()
        self.release.wait()
        return super().hourly_price()


def test_a_price_api_that_blocks_does_not_delay_the_controllers_refresh() -> None:
    group = BlockingGroup()
    heard = Prices()
    controller = controller_of([group], {}, heard)
    refreshed = threading.Event()

    def refresh_twice() -> None:
        assert controller.refresh() and controller.refresh()
        refreshed.set()

    controller.prices.groups_listed()  # as after the job's first listing
    controller.prices.start()
    try:
        assert group.asked.wait(10)
        threading.Thread(target=refresh_twice, daemon=True).start()
        assert refreshed.wait(10), "the controller's refresh waited on the price API"
        assert controller.refreshes == 2 and heard.heard == []  # not read yet: not told
    finally:
        controller.prices.stop(wait=0)
        group.release.set()
        controller.prices.stop(wait=10)
    assert controller.refresh()
    assert heard.heard[-1] == ("slow", "spot", 0.3, "cloud")  # the last good price, once read


def test_the_price_books_thread_runs_and_stops_with_the_controllers() -> None:
    controller = controller_of([PricedGroup("g", Lifecycle.SPOT, [])], {}, Prices())
    controller.start()
    controller.stop()
    thread = controller.prices._thread
    assert thread is not None and not thread.is_alive()


def test_a_listing_only_reads_no_price() -> None:
    group = PricedGroup("g", Lifecycle.SPOT, [0.1])
    heard = Prices()
    pm = get_plugin_manager(load_entry_points=False)
    pm.register(heard)
    assert Controller([group], pm.hook, job=None).refresh()
    assert heard.heard == [] and group.quotes == [0.1]


def test_a_price_override_must_name_a_group_or_a_lifecycle() -> None:
    groups = [PricedGroup("a", Lifecycle.SPOT, []), PricedGroup("b", Lifecycle.ON_DEMAND, [])]
    check_prices({"a": 0.1, "on-demand": 1.0}, groups)
    with pytest.raises(ConfigurationError, match=r"--price spto=\.\.\.: no group or lifecycle"):
        check_prices({"spto": 0.1}, groups)


def test_no_price_is_asked_before_the_groups_were_listed() -> None:
    """A job whose group is not there stops with its one line, not a price warning
    first: the controller's book asks nothing until a listing went through."""
    group = PricedGroup("spot-g", Lifecycle.SPOT, [0.1])
    controller = controller_of([group], {}, Prices())
    controller.prices.read_due()
    assert group.quotes == [0.1]  # not asked
    assert controller.refresh()
    controller.prices.read_due()
    assert group.quotes == []  # asked once listed
