"""``spotring run --order price``: the groups before the last tried cheapest per slot first,
demotion still applied, the last group still last; through a real controller and plugin
manager, with prices from the job's price book (``--price``)."""

from __future__ import annotations

from spotring.autoscaler import hookimpl
from spotring.autoscaler.capacity import GroupStatus, default_order
from spotring.autoscaler.controller import Controller
from spotring.autoscaler.plugins import get_plugin_manager
from spotring.autoscaler.plugins.policy import PriceOrder, before_defaults
from spotring.core import JobShape, Lifecycle
from tests.unit.test_group_set import Pool

JOB = JobShape(num_proc=2, min_num_proc=1, max_num_proc=2)


def status(name: str, position: int, usd: float | None, demoted: bool = False) -> GroupStatus:
    return GroupStatus(
        name, Lifecycle.SPOT, position, 0, 0, 0, False, None, 0.0, 0.0, 0,
        3600.0 if demoted else 0.0, usd,
    )  # fmt: skip


def test_cheapest_first_unknown_after_known_the_last_stays_last() -> None:
    groups = [status("a", 0, 0.5), status("b", 1, None), status("c", 2, 0.2),
              status("d", 3, 0.2), status("od", 4, 0.1)]  # fmt: skip
    assert default_order(groups) == ["a", "b", "c", "d", "od"]
    assert default_order(groups, by_price=True) == ["c", "d", "a", "b", "od"]


def test_a_demoted_group_comes_after_the_others_however_cheap() -> None:
    groups = [status("a", 0, 0.5), status("c", 1, 0.1, demoted=True), status("b", 2, 0.3),
              status("od", 3, 1.0)]  # fmt: skip
    assert default_order(groups, by_price=True) == ["b", "a", "c", "od"]


class Seen:
    def __init__(self) -> None:
        self.prices: dict[str, float | None] = {}

    @hookimpl
    def spotring_fall_back(self, group: GroupStatus) -> None:
        self.prices[group.name] = group.usd_per_slot


class Reverse:
    @hookimpl
    def spotring_order_groups(self, groups: list[GroupStatus]) -> list[str]:
        return [g.name for g in reversed(groups)]


def steer(*plugins: object, order_price: bool = True) -> tuple[Pool, Pool, Pool]:
    dear = Pool("dear", Lifecycle.SPOT, capacity=0)  # short at once: the next is asked
    cheap = Pool("cheap", Lifecycle.SPOT, capacity=10)
    od = Pool("od", Lifecycle.ON_DEMAND, capacity=10)
    pm = get_plugin_manager(load_entry_points=False)
    for plugin in plugins:
        pm.register(plugin)
    prices = {"dear": 0.9, "cheap": 0.2, "on-demand": 1.0}
    controller = Controller([dear, cheap, od], pm.hook, job=JOB, prices=prices)
    if order_price:
        with before_defaults(pm, PriceOrder(), PriceOrder.NAME):
            controller.step()
            controller.step()
    else:
        controller.step()
        controller.step()
    return dear, cheap, od


def test_the_cheaper_group_is_asked_first() -> None:
    dear, cheap, od = steer()
    assert cheap.targets[0] == 2 and dear.targets == [0] and od.targets == [0]


def test_without_it_the_users_order() -> None:
    dear, cheap, _od = steer(order_price=False)
    assert dear.targets[0] == 2 and cheap.targets[0] == 0


def test_the_hooks_see_each_groups_price_per_slot() -> None:
    seen = Seen()
    steer(seen, order_price=False)  # dear is short: its shortfall asked of the next
    assert seen.prices == {"cheap": 0.2}


def test_a_plugins_order_still_wins() -> None:
    _dear, cheap, od = steer(Reverse())
    assert od.targets[0] == 2 and cheap.targets[0] == 0
