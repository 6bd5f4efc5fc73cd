"""spotring.driver.durable: which lost rings start again (a reclaim) and which stop
the job (a broken script)."""

from __future__ import annotations

import pytest

from spotring.core import Instance, InstanceState, Inventory
from spotring.driver.durable import RingLossJudge, killed
from spotring.driver.launcher import WorkerExit
from spotring.driver.ring_side import NoticeRouter as _NoticeRouter
from spotring.worker_image.notices import Notice


@pytest.mark.parametrize(
    ("exit_code", "reclaim"),
    [(-9, True), (-15, True), (137, True), (255, True), (1, False), (2, False), (0, False)],
)
def test_a_signal_or_a_lost_connection_is_a_reclaim(exit_code: int, reclaim: bool) -> None:
    assert killed(exit_code) is reclaim


def test_a_ring_is_reclaimed_when_any_member_was_killed() -> None:
    judge = RingLossJudge()
    judge.worker_exited(WorkerExit("a", 0, 0, 1, stopped=False), 0)
    judge.worker_exited(WorkerExit("b", 0, 1, 1, stopped=False), 0)
    assert not judge.reclaimed([("a", 0), ("b", 0)])  # both failed by themselves
    judge.worker_exited(WorkerExit("b", 0, 1, -9, stopped=False), 0)
    assert judge.reclaimed([("a", 0), ("b", 0)])


class _Group:
    """The controller as the notice router sees it: its inventory; every notice drains."""

    def __init__(self, *hosts: str) -> None:
        self.inventory = Inventory(tuple(Instance(h, h, InstanceState.READY) for h in hosts))

    def host_noticed(self, address: str, notice: object) -> bool:
        return True

    def ring_formed(self, hosts: list[str]) -> list[str]:
        return []

    def stop_workers_on(self, host: str) -> None:
        pass  # the launcher's part: none run here


def _router(group: _Group, min_workers: int) -> tuple[_NoticeRouter, list[str]]:
    flushes: list[str] = []
    router = _NoticeRouter(
        group,  # type: ignore[arg-type]
        group,  # type: ignore[arg-type]  # as the launcher
        lambda: flushes.append("flush"),
        min_workers,
    )
    return router, flushes


def _notice(kind: str = "terminate") -> Notice:
    return Notice(kind, None, kind)


def test_the_first_notice_after_which_the_ring_cannot_go_on_asks_for_the_flush() -> None:
    """Two hosts, --min-np 2, both reclaimed: the second notice may reach the driver
    only after the ring stopped for the first (when no commit is left to write), so the
    first one asks for it."""
    router, flushes = _router(_Group("a", "b"), min_workers=2)
    router.ring_formed(2, ["a", "b"])
    router.worker_noticed("a", _notice())
    assert flushes == ["flush"]


def test_a_notice_leaving_enough_hosts_asks_for_no_flush() -> None:
    router, flushes = _router(_Group("a", "b", "spare"), min_workers=2)
    router.ring_formed(2, ["a", "b"])
    router.worker_noticed("a", _notice())
    router.worker_noticed("a", _notice("rebalance"))
    assert flushes == []
    router.worker_noticed("b", _notice("rebalance"))  # a risk, not a reclaim
    assert flushes == []
    router.worker_noticed("b", _notice())  # a and b leave: spare has no state
    assert flushes == ["flush"]


def test_a_ring_formed_of_reclaimed_hosts_only_asks_again() -> None:
    """The store a ring forms on no longer holds the request: a ring whose hosts all
    announced a reclaim (one stays while nobody else can carry on) asks again."""
    router, flushes = _router(_Group("a", "b", "c"), min_workers=1)
    router.ring_formed(3, ["a", "b", "c"])
    router.worker_noticed("a", _notice())
    router.worker_noticed("b", _notice())
    assert flushes == []
    router.ring_formed(2, ["b", "c"])
    assert flushes == []
    router.worker_noticed("c", _notice())
    assert flushes == ["flush"]
    router.ring_formed(2, ["b", "c"])
    assert flushes == ["flush", "flush"]
    router.ring_formed(1, ["d"])
    assert flushes == ["flush", "flush"]
