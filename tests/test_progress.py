"""Progress lines and the summary: what a notice came to."""

from __future__ import annotations

import io
import time

from spotring.autoscaler.progress import ProgressReporter
from spotring.providers.base import Instance, InstanceState, InterruptionNotice


def host(name: str) -> Instance:
    return Instance(id=f"i-{name}", address=name, state=InstanceState.READY)


def summary_line(out: io.StringIO) -> str:
    return next(line for line in out.getvalue().splitlines() if "interruption notices" in line)


def noticed(reporter: ProgressReporter, name: str, draining: bool = True) -> None:
    notice = InterruptionNotice("preempt", time.time() + 30)
    reporter.spotring_host_noticed(host(name), notice, draining)


def test_a_host_that_left_at_a_commit_rolled_nothing_back() -> None:
    out = io.StringIO()
    reporter = ProgressReporter(out)
    noticed(reporter, "h2")
    reporter.ring_formed(3, ["h0", "h1", "h2"])  # not yet
    reporter.ring_formed(2, ["h0", "h1"])
    reporter.summary([3, 2], True, 1.0)
    assert "host h2 left the ring at a commit, 0 steps rolled back" in out.getvalue()
    assert summary_line(out).startswith("interruption notices: h2 (preempt, 3")
    assert summary_line(out).endswith(" s ahead: left at a commit, 0 steps rolled back)")


def test_a_host_that_died_first_or_a_failure_meanwhile_is_not_called_clean() -> None:
    out = io.StringIO()
    reporter = ProgressReporter(out)
    noticed(reporter, "h1")
    noticed(reporter, "h2")
    noticed(reporter, "h3", draining=False)
    reporter.spotring_host_failed(host("h1"), "worker rank 1 exited with -9")
    reporter.ring_formed(1, ["h0"])
    reporter.summary([4, 1], True, 1.0)
    line = summary_line(out)
    assert "h1 (preempt" in line and "died before it could leave (rolled back)" in line
    assert "s ahead: left)" in line  # h2: the ring restored its last commit anyway
    assert "h3 (preempt" in line and "kept" in line
    assert "0 steps rolled back" not in out.getvalue()
