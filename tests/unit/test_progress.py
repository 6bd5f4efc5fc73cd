"""Progress lines and the summary: what a notice came to."""

from __future__ import annotations

import io
import time

import pluggy

from spotring.autoscaler.groups import describe_groups
from spotring.autoscaler.observers.progress import ProgressReporter
from spotring.autoscaler.plugins import get_plugin_manager
from spotring.core import Inventory, JobShape
from spotring.providers.base import Instance, InstanceState, InterruptionNotice
from tests.fakes.scripted import ScriptedProvider


def host(name: str) -> Instance:
    return Instance(id=f"i-{name}", address=name, state=InstanceState.READY)


def summary_line(out: io.StringIO) -> str:
    return next(line for line in out.getvalue().splitlines() if "interruption notices" in line)


def plugged(reporter: ProgressReporter) -> pluggy.HookRelay:
    """The hooks, with the reporter registered: it hears everything through them."""
    pm = get_plugin_manager(load_entry_points=False)
    pm.register(reporter)
    return pm.hook


def noticed(hook: pluggy.HookRelay, name: str, draining: bool = True) -> None:
    notice = InterruptionNotice("preempt", time.time() + 30)
    hook.spotring_host_noticed(instance=host(name), notice=notice, draining=draining)


def test_a_host_that_left_at_a_commit_rolled_nothing_back() -> None:
    out = io.StringIO()
    reporter = ProgressReporter(out)
    hook = plugged(reporter)
    noticed(hook, "h2")
    hook.spotring_ring_formed(size=3, hosts=["h0", "h1", "h2"])  # not yet
    hook.spotring_ring_formed(size=2, hosts=["h0", "h1"])
    reporter.summary([3, 2], True, 1.0)
    assert "host h2 left the ring at a commit, 0 steps rolled back" in out.getvalue()
    assert summary_line(out).startswith("interruption notices: h2 (preempt, 3")
    assert summary_line(out).endswith(" s ahead: left at a commit, 0 steps rolled back)")


def test_a_host_that_died_first_or_a_failure_meanwhile_is_not_called_clean() -> None:
    out = io.StringIO()
    reporter = ProgressReporter(out)
    hook = plugged(reporter)
    noticed(hook, "h1")
    noticed(hook, "h2")
    noticed(hook, "h3", draining=False)
    hook.spotring_host_failed(instance=host("h1"), reason="worker rank 1 exited with -9")
    hook.spotring_ring_formed(size=1, hosts=["h0"])
    reporter.summary([4, 1], True, 1.0)
    line = summary_line(out)
    assert "h1 (preempt" in line and "died before it could leave (rolled back)" in line
    assert "s ahead: left)" in line  # h2: the ring restored its last commit anyway
    assert "h3 (preempt" in line and "kept" in line
    assert "0 steps rolled back" not in out.getvalue()


def test_the_first_inventory_names_the_groups_the_job_started_on() -> None:
    """The reporter hears the job's groups with ``spotring_job_started``."""
    out = io.StringIO()
    reporter = ProgressReporter(out)
    hook = plugged(reporter)
    groups = [ScriptedProvider(), ScriptedProvider()]
    job = JobShape(num_proc=1, min_num_proc=1, max_num_proc=1)
    hook.spotring_job_started.call_historic(
        kwargs={"provider": groups[0], "job": job, "groups": groups}
    )
    reporter.started(Inventory(instances=(host("h0"),)))
    assert f"] {describe_groups(groups)}: 1 members, 1 ready (h0:1)\n" in out.getvalue()


def test_in_restart_mode_a_noticed_host_is_not_said_to_roll_nothing_back() -> None:
    """``--backend torch`` restarts every worker from the script's own checkpoint: the
    steps since it are redone, so the line does not promise 0 rolled back."""
    out = io.StringIO()
    reporter = ProgressReporter(out)
    reporter.restarts_workers = True
    hook = plugged(reporter)
    noticed(hook, "h2")
    hook.spotring_ring_formed(size=2, hosts=["h0", "h1"])
    reporter.summary([3, 2], True, 1.0)
    assert "announced preempt" in out.getvalue() and "every worker restarts" in out.getvalue()
    assert "host h2 left the ring" in out.getvalue()
    assert "0 steps rolled back" not in out.getvalue()
