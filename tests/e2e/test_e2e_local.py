"""End to end: `spotring run --provider local` with real Horovod workers.

These run the digits example through the CLI, as a user would, and check the
committed-step log rank 0 writes: every resume starts from the last commit (nothing
committed is lost, nothing beyond it is replayed) and the ring has the size it should.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.e2e.support import (
    assert_every_sample_once,
    assert_no_committed_step_lost,
    commits,
    job_output,
    read_events,
    running_job,
    wait_for_events,
    worker_pids,
)

pytestmark = pytest.mark.e2e

SPOTRING = str(Path(sys.executable).with_name("spotring"))
JOB_TIMEOUT = 300


def job(repo: Path, events: Path, *train_args: str) -> list[str]:
    return [
        "--",
        sys.executable,
        str(repo / "examples" / "train_digits.py"),
        "--events",
        str(events),
        *train_args,
    ]


def test_the_demo_shows_every_event_it_promises(repo: Path, tmp_path: Path) -> None:
    """The demo's job (``examples/demo.py``, which ``scripts/demo.sh`` runs; its short
    schedule): each chaos step waits for the training's progress, so the summary shows
    every event the demo advertises on any machine: the join, the notice with nothing
    rolled back, the hard kill, the whole-ring loss resumed from a checkpoint, the
    finish. The run's events file and metrics tell the same story as its lines."""
    port = free_port()
    argv = [sys.executable, str(repo / "examples" / "demo.py"), "--quick", "--dir", str(tmp_path)]
    scraped: list[str] = []
    with running_job(
        [*argv, "--metrics-port", str(port)], cwd=tmp_path, env=dict(os.environ)
    ) as process:
        scraper = threading.Thread(target=scrape, args=(process, port, scraped), daemon=True)
        scraper.start()
        log = job_output(process, JOB_TIMEOUT)
        scraper.join(timeout=10)
    assert process.returncode == 0, log[-4000:]
    for step in (" at size 2: growing the group to 3 hosts",
                 " at size 3: the newest host announces its interruption",
                 " at size 3: preempting the newest host without notice (SIGKILL)",
                 " at size 3: preempting every host at once",
                 ": asking the training to finish at the epoch's end"):  # fmt: skip
        assert f"demo: 20 commits{step}" in log, step
    summary = log[log.index("spotring summary") :]
    assert "job finished in" in summary
    sizes = [int(s) for s in summary.split("world sizes: ")[1].splitlines()[0].split(" -> ")]
    assert sizes[:2] == [2, 3], sizes  # the join
    noticed = re.search(r"interruption notices: (host-\d+) \(preempt, \d+ s ahead: left at a "
                        r"commit, 0 steps rolled back\)", summary)  # fmt: skip
    assert noticed, summary
    failed = summary.split("failed hosts: ")[1].splitlines()[0].split(", ")
    assert noticed.group(1) not in failed
    # The kill, then the reclaim (the noticed host's deadline came after it had left).
    killed = re.findall(r"chaos: preempted (host-\d+) \(SIGKILL to its workers\)", summary)
    killed = [host for host in killed if host != noticed.group(1)]
    assert len(killed) >= 3 and killed[0] in failed, summary
    assert "rings lost and resumed from durable checkpoints: commit " in summary
    accuracy = float(log.split("training done: ")[1].split("test accuracy ")[1].split()[0])
    assert accuracy > 0.8

    story = read_events(tmp_path / "demo-events.jsonl")
    assert [e["size"] for e in story if e["event"] == "ring_formed"] == sizes
    membership = [e for e in story if e["event"] == "membership"]
    assert f"membership changes: {len(membership)}" in summary
    assert [e for e in story if e["event"] == "ring_lost"]
    assert story[-1]["event"] == "job_finished" and story[-1]["ok"]
    assert story[-1]["world_sizes"] == sizes
    assert any("spotring_world_size 3.0" in text for text in scraped), scraped[-1:]
    assert any('spotring_hosts{state="ready"} 3.0' in text for text in scraped)
    for series in ("spotring_resets_total", "spotring_refresh_duration_seconds_count",
                   'spotring_instance_seconds_total{lifecycle="spot"}'):  # fmt: skip
        assert series in scraped[-1], series


def scrape(process: subprocess.Popen[str], port: int, scraped: list[str]) -> None:
    """Read the job's metrics twice a second while it runs."""
    while process.poll() is None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as answer:
                scraped.append(answer.read().decode())
        except OSError:
            pass  # not serving yet, or no longer
        time.sleep(0.5)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.parametrize("state", ["spotring", "horovod"])
def test_hard_kill_with_host_still_listed_recovers_without_gloo_timeout(
    repo: Path, tmp_path: Path, state: str
) -> None:
    """With spotring's TorchState and with hvd.elastic.TorchState: the abort is the
    launcher's, not the state object's."""
    events = tmp_path / "events.jsonl"
    env = dict(os.environ, HOROVOD_GLOO_TIMEOUT_SECONDS="120")  # a stall would show
    with running_job(
        [
            SPOTRING,
            "--log-level",
            "info",
            "run",
            "--provider",
            "local",
            "-np",
            "4",
            "--min-np",
            "3",
            "--max-np",
            "4",
            "--hosts",
            "4",
            "--refresh-interval",
            "60",  # the provider will not notice anything itself
            "--boot-seconds",
            "3600",  # and no replacement arrives during the test
            *job(repo, events, "--epochs", "6", "--step-seconds", "0.05", "--state", state),
            "--audit-samples",
        ],
        cwd=tmp_path,
        env=env,
    ) as process:
        # Not rank 0: it writes the step log this test reads.
        victim, host = wait_for_worker(process.pid, events, min_step=10)
        killed_at = time.time()
        os.kill(victim, signal.SIGKILL)
        output = job_output(process, JOB_TIMEOUT)
    assert process.returncode == 0, output[-4000:]
    recorded = read_events(events)
    assert_no_committed_step_lost(recorded)
    assert_every_sample_once(recorded)
    assert recorded[-1]["event"] == "done" and recorded[-1]["size"] == 3
    assert f"host {host} failed" in output
    # The driver told every survivor before Horovod recorded the failure. (Which of
    # them was still blocked, if either, is a race; the timeout check below is not.)
    assert f"told 3 peers of {host}[0] that it died" in output
    assert "Timed out waiting" not in output, output[-30000:]
    resumed = [e for e in recorded if e["time"] > killed_at and e["event"] == "resume"]
    assert resumed and resumed[0]["size"] == 3


def wait_for_worker(driver_pid: int, events: Path, min_step: int) -> tuple[int, str]:
    """(pid, host) of a worker not on rank 0's host (rank 0 writes the events) once
    rank 0 committed ``min_step`` at size 4, with no reset since the first ring."""
    deadline = time.monotonic() + JOB_TIMEOUT
    while time.monotonic() < deadline:
        recorded = read_events(events)
        if any(e["event"] == "resume" and e["step"] > 0 for e in recorded):
            raise AssertionError("a reset happened before the kill")
        if any(
            e["event"] == "commit" and e["size"] == 4 and e["step"] >= min_step for e in recorded
        ):
            rank0_host = next(e["host"] for e in recorded if e["event"] == "resume")
            for pid, environ in worker_pids(driver_pid):
                if environ["HOROVOD_HOSTNAME"] != rank0_host:
                    return pid, environ["HOROVOD_HOSTNAME"]
        time.sleep(0.2)
    raise AssertionError(f"no commit of step {min_step} at size 4")


@pytest.mark.parametrize("state", ["spotring", "horovod"])
def test_noticed_preemption_leaves_at_a_commit_with_nothing_rolled_back(
    repo: Path, tmp_path: Path, state: str
) -> None:
    """The host hears its notice through the (fake) metadata service, the real AWS
    watcher reports it, and the ring re-forms without it at the next commit: the
    survivors resume exactly where they committed. With spotring's TorchState and
    with plain hvd.elastic.TorchState."""
    events, control = tmp_path / "events.jsonl", tmp_path / "control"
    argv = [
        *(SPOTRING, "--log-level", "info", "run", "--provider", "local"),
        *("-np", "3", "--min-np", "2", "--max-np", "3", "--hosts", "3"),
        *("--refresh-interval", "0.5", "--boot-seconds", "3600", "--control", str(control)),
        *("--notice-lead", "600"),  # the deadline never comes: the host must leave by itself
        *job(repo, events, "--epochs", "5", "--step-seconds", "0.05", "--state", state),
        "--audit-samples",
    ]
    with running_job(argv, cwd=tmp_path, env=dict(os.environ)) as process:
        wait_for_events(process, events, commits(size=3, steps=10), "10 commits at size 3")
        control.write_text("notice host-2\n")
        log = job_output(process, JOB_TIMEOUT)
    assert process.returncode == 0, log[-4000:]
    recorded = read_events(events)
    assert recorded[-1]["event"] == "done" and recorded[-1]["size"] == 2
    # The ring shrank without a sync: each sampler must still split the epoch anew.
    assert_every_sample_once(recorded)
    resumes = [i for i, e in enumerate(recorded) if e["event"] == "resume" and e["size"] == 2]
    assert len(resumes) == 1, recorded
    last_commit = max(e["step"] for e in recorded[: resumes[0]] if e["event"] == "commit")
    assert recorded[resumes[0]]["step"] == last_commit, "steps were rolled back"
    assert "host host-2 announced preempt" in log
    assert "host-2 has left the ring; stopping its workers" in log
    assert "failed hosts: none" in log
    assert "host host-2 left the ring at a commit, 0 steps rolled back" in log
    assert "interruption notices: host-2 (preempt" in log
    assert "chaos: preempted host-2" not in log  # it left long before its deadline
    assert "Traceback" not in log and "terminate called" not in log


def test_notice_too_short_to_drain_falls_back_to_the_hard_kill_path(
    repo: Path, tmp_path: Path
) -> None:
    events, control = tmp_path / "events.jsonl", tmp_path / "control"
    argv = [
        *(SPOTRING, "run", "--provider", "local", "-np", "3", "--min-np", "2", "--max-np", "3"),
        *("--hosts", "3", "--refresh-interval", "0.5", "--boot-seconds", "3600"),
        *("--control", str(control), "--notice-lead", "0"),
        *job(repo, events, "--epochs", "4", "--step-seconds", "0.05"),
    ]
    with running_job(argv, cwd=tmp_path, env=dict(os.environ)) as process:
        wait_for_events(process, events, commits(size=3, steps=10), "10 commits at size 3")
        control.write_text("notice host-2\n")
        log = job_output(process, JOB_TIMEOUT)
    assert process.returncode == 0, log[-4000:]
    recorded = read_events(events)
    assert_no_committed_step_lost(recorded)
    assert recorded[-1]["event"] == "done" and recorded[-1]["size"] == 2
    assert "chaos: preempted host-2" in log


DIES_AT_START = """\
import os, runpy, signal, sys
from pathlib import Path

marker, script = Path(sys.argv[1]), sys.argv[2]
if os.environ.get("HOROVOD_HOSTNAME") == "host-2" and not marker.exists():
    marker.touch()
    os.kill(os.getpid(), signal.SIGKILL)  # before it ever reaches hvd.init
sys.argv = sys.argv[2:]
runpy.run_path(script, run_name="__main__")
"""


@pytest.mark.parametrize("start", ["cold", "warm"])
def test_a_worker_dying_before_it_joins_costs_a_retry_not_the_job(
    repo: Path, tmp_path: Path, start: str
) -> None:
    """The group grows; the new host's worker dies before it reaches hvd.init.

    Cold (``--cold-start``): the running workers already wait for its address in the
    new ring's formation. The rendezvous server answers them with an empty one at once
    (not after Gloo's 30 s timeout), they fail that ring, join the next one without
    it, and carry on from their last commit: with stock Horovod they died of
    std::terminate and took the job. Warm (the default): it died while started ahead,
    so the ring never waited for it; the host joins with a worker started cold."""
    events, control, marker = tmp_path / "events.jsonl", tmp_path / "control", tmp_path / "died"
    wrapper = tmp_path / "dies_at_start.py"
    wrapper.write_text(DIES_AT_START)
    argv = [
        *(SPOTRING, "run", "--provider", "local", "-np", "2", "--min-np", "2", "--max-np", "3"),
        *("--hosts", "2", "--refresh-interval", "0.5", "--boot-seconds", "1"),
        *("--control", str(control), *(["--cold-start"] if start == "cold" else []), "--"),
        *(sys.executable, str(wrapper), str(marker), str(repo / "examples" / "train_digits.py")),
        *("--events", str(events), "--epochs", "4", "--step-seconds", "0.05"),
    ]
    with running_job(argv, cwd=tmp_path, env=dict(os.environ)) as process:
        wait_for_events(process, events, commits(size=2, steps=10), "10 commits at size 2")
        control.write_text("scale 3\n")
        log = job_output(process, JOB_TIMEOUT)
    assert marker.exists(), "the new host's worker never started"
    assert process.returncode == 0, log[-4000:]
    assert "terminate called" not in log
    if start == "cold":
        assert "joining the next one" in log
        assert "Wait timeout" not in log, "the survivors waited out Gloo's timeout"
    else:
        assert "a worker started ahead on host-2 ended before it reached hvd.init" in log
        assert "joining the next one" not in log  # no ring waited for the dead worker
    recorded = read_events(events)
    assert_no_committed_step_lost(recorded)
    assert recorded[-1]["event"] == "done" and recorded[-1]["size"] == 3


def test_a_joining_host_is_offered_once_its_worker_waits_in_init(
    repo: Path, tmp_path: Path
) -> None:
    """The new host's worker starts while the ring trains on; Horovod hears of the host
    only once that worker waits in hvd.init, and hands it its rank at the reset."""
    events, control, stop = tmp_path / "events.jsonl", tmp_path / "control", tmp_path / "stop"
    argv = [
        *(SPOTRING, "--log-level", "info", "run", "--provider", "local"),
        *("-np", "2", "--min-np", "2", "--max-np", "3", "--hosts", "2"),
        *("--refresh-interval", "0.5", "--boot-seconds", "1", "--control", str(control)),
        *job(repo, events, "--epochs", "40", "--step-seconds", "0.05"),
        *("--audit-samples", "--stop-file", str(stop)),
    ]
    with running_job(argv, cwd=tmp_path, env=dict(os.environ)) as process:
        wait_for_events(process, events, commits(size=2, steps=10), "10 commits at size 2")
        control.write_text("scale 3\n")
        wait_for_events(process, events, commits(size=3, steps=5), "5 commits at size 3")
        stop.touch()
        log = job_output(process, JOB_TIMEOUT)
    assert process.returncode == 0, log[-4000:]
    started = log.index("host host-2: started 1 workers ahead of its join")
    offered = log.index("host host-2: its workers wait in hvd.init; offered to Horovod")
    grown = log.index("ring of 3 workers")
    assert started < offered < grown
    assert "the worker started ahead on host-2[0] joins as rank 2\n" in log
    recorded = read_events(events)
    assert_no_committed_step_lost(recorded)
    assert_every_sample_once(recorded)
    assert recorded[-1]["event"] == "done" and recorded[-1]["size"] == 3


WAITS_FOR_TRAINING = """import os, runpy, sys, time
from pathlib import Path

events, script = Path(sys.argv[1]), sys.argv[2]
if os.environ.get("HOROVOD_HOSTNAME") in ("host-2", "host-3"):
    while "commit" not in (events.read_text() if events.exists() else ""):
        time.sleep(0.1)  # the first ring forms on host-0 and host-1
sys.argv = sys.argv[2:]
runpy.run_path(script, run_name="__main__")
"""


def test_workers_started_ahead_on_spare_hosts_are_stopped_when_the_host_leaves(
    repo: Path, tmp_path: Path
) -> None:
    """With more hosts than --max-np, the spares' workers wait in hvd.init. One spare
    announces its interruption: its worker is stopped at once. The other's is
    stopped when the job ends: no process is left behind."""
    events, control = tmp_path / "events.jsonl", tmp_path / "control"
    wrapper = tmp_path / "waits_for_training.py"
    wrapper.write_text(WAITS_FOR_TRAINING)
    argv = [
        *(SPOTRING, "--log-level", "info", "run", "--provider", "local"),
        *("-np", "2", "--min-np", "2", "--max-np", "2", "--hosts", "4", "--no-resize"),
        *("--refresh-interval", "0.5", "--boot-seconds", "3600", "--control", str(control)),
        *("--notice-lead", "600", "--"),  # host-2 leaves by itself, long before its deadline
        *(sys.executable, str(wrapper), str(events), str(repo / "examples" / "train_digits.py")),
        *("--events", str(events), "--epochs", "4", "--step-seconds", "0.05"),
    ]
    with running_job(argv, cwd=tmp_path, env=dict(os.environ)) as process:
        wait_for_events(process, events, commits(size=2, steps=10), "10 commits at size 2")
        assert worker_pids(process.pid, HOROVOD_HOSTNAME="host-2")
        control.write_text("notice host-2\n")
        deadline = time.monotonic() + 60
        while worker_pids(process.pid, HOROVOD_HOSTNAME="host-2"):
            assert time.monotonic() < deadline, "host-2's worker still runs"
            time.sleep(0.2)
        assert worker_pids(process.pid, HOROVOD_HOSTNAME="host-3"), "host-3's was stopped too"
        log = job_output(process, JOB_TIMEOUT)
    assert process.returncode == 0, log[-4000:]
    assert "host host-2 left: stopped its 1 workers started ahead" in log
    assert "ring of 3" not in log and "failed hosts: none" in log
    left = [p for p in psutil.process_iter(["cmdline"]) if str(events) in (p.info["cmdline"] or [])]
    assert not [p for p in left if p.status() != psutil.STATUS_ZOMBIE], "workers left behind"
    recorded = read_events(events)
    assert recorded[-1]["event"] == "done" and recorded[-1]["size"] == 2


def test_a_hung_worker_is_failed_in_training_and_while_a_ring_forms(
    repo: Path, tmp_path: Path
) -> None:
    """One job, --hang-timeout 5, three workers that hang, each failed alone, killed,
    and the ring re-formed without it; the job finishes.

    1. SIGSTOP in training: a worker alive, its sockets open, making no progress (a
       stuck filesystem, a wedged GPU). Its peers wait in a collective with the same
       last commit; its heartbeat stops while theirs go on.
    2. SIGSTOP while a ring forms: a new host's worker, started when the ring is planned
       with it (--cold-start), is stopped before it asks for its rank; its peers did.
    3. A worker that hangs before its commit, alive (it sleeps): its peers made one more.

    Failed hosts are not replaced: a replacement's cold start may outlast the timeout."""
    events, control, stop = tmp_path / "events.jsonl", tmp_path / "control", tmp_path / "stop"
    hang, run_events = tmp_path / "hang", tmp_path / "run.jsonl"
    argv = [
        *(SPOTRING, "--log-level", "info", "run", "--provider", "local"),
        *("-np", "4", "--min-np", "2", "--max-np", "4", "--hosts", "4", "--cold-start"),
        *("--refresh-interval", "0.5", "--boot-seconds", "1", "--control", str(control)),
        *("--no-replace", "--hang-timeout", "5", "--events", str(run_events)),
        *job(repo, events, "--epochs", "100", "--step-seconds", "0.05"),
        *("--stop-file", str(stop), "--hang-file", str(hang)),
    ]
    with running_job(argv, cwd=tmp_path, env=dict(os.environ)) as process:
        in_training, host = wait_for_worker(process.pid, events, min_step=10)
        os.kill(in_training, signal.SIGSTOP)
        wait_for_events(process, events, trained_after_failures(run_events, 1), "a new ring")
        control.write_text("scale 5\n")  # host-4 joins
        forming = wait_for_worker_on(process, "host-4")
        os.kill(forming, signal.SIGSTOP)
        wait_for_events(process, events, trained_after_failures(run_events, 2), "a new ring")
        hang.touch()  # the last rank sleeps before its next commit
        wait_for_events(process, events, trained_after_failures(run_events, 3), "a new ring")
        stop.touch()
        log = job_output(process, JOB_TIMEOUT)
    assert process.returncode == 0, log[-4000:]
    assert not hang.exists(), "no worker hung"
    story = read_events(run_events)
    hangs = [e for e in story if e["event"] == "hang"]
    assert [e["host"] for e in hangs][:2] == [host, "host-4"], hangs
    assert "its worker stopped beating" in hangs[0]["reason"]
    assert "its worker never asked for its rank (its peers did" in hangs[1]["reason"]
    assert re.search(r"it made (\d+) commits in this ring, its peers", hangs[2]["reason"])
    assert all(e["idle_s"] >= 5 for e in hangs)
    failed = [(e["host"], e["reason"]) for e in story if e["event"] == "host_failed"]
    assert failed == [(e["host"], e["reason"]) for e in hangs], failed  # each alone
    for pid in (in_training, forming):  # SIGKILL reached the stopped processes
        assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    recorded = read_events(events)
    assert_no_committed_step_lost(recorded)
    assert recorded[-1]["event"] == "done" and recorded[-1]["size"] == 2


def wait_for_worker_on(process: subprocess.Popen[str], host: str) -> int:
    """The pid of the first worker started on ``host``, as soon as it runs."""
    deadline = time.monotonic() + JOB_TIMEOUT
    while time.monotonic() < deadline:
        found = worker_pids(process.pid, HOROVOD_HOSTNAME=host)
        if found:
            return found[0][0]
        assert process.poll() is None, "the job ended first"
        time.sleep(0.05)
    raise AssertionError(f"no worker on {host}")


def trained_after_failures(run_events: Path, failures: int) -> Callable[[list[dict]], bool]:
    """A ``done`` for :func:`wait_for_events`: 5 commits since the job's ``failures``-th
    host failure."""

    def done(recorded: list[dict]) -> bool:
        failed = [e["t"] for e in read_events(run_events) if e["event"] == "host_failed"]
        if len(failed) < failures:
            return False
        since = failed[failures - 1]
        return sum(e["event"] == "commit" and e["time"] > since for e in recorded) >= 5

    return done
