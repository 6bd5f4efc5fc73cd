"""spotring.driver.durable: which lost rings start again (a reclaim) and which stop
the job (a broken script)."""

from __future__ import annotations

import pytest

from spotring.driver.durable import RingLossJudge, killed
from spotring.driver.launcher import WorkerExit


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
