"""Discovery: what keeping Horovod's host list current costs, spotring vs a discovery script.

Everything runs against one moto server on loopback (in a thread of this process),
with an Auto Scaling group whose members moto launches.

spotring: one refresh is ``Controller.refresh()`` (the AWS provider's
``list_instances`` -- DescribeAutoScalingGroups + DescribeInstances per 200 ids -- and
the new ``Inventory``), called on this thread, whose CPU ``time.thread_time`` counts
(moto's CPU is in this process too, on its own threads, so ``process_time`` would
charge moto's work to spotring). Horovod's 1 s polls read the cached inventory through
``InventoryHostDiscovery``.

anchor: the classic horovodrun discovery script (:func:`bench.common.
classic_discovery_script`): ``aws autoscaling describe-auto-scaling-groups`` then
``aws ec2 describe-instances`` with the AWS CLI, run as a subprocess; its CPU is the
children's rusage. Horovod runs it on every 1 s poll through ``HostDiscoveryScript``.

API calls are counted at the server (every request moto serves), and by the provider.

(a) cost at 64 instances -- targets: < 20 ms CPU per refresh; steady state <= 0.1 cloud
    API calls/s (spotring refreshes every ``--refresh-interval``, default 10 s; the script
    runs on every poll); a Horovod poll of spotring in microseconds.
(b) scale at 100, 1,000 (and 5,000 in full mode) instances -- target: 1,000 instances
    in < 2 s with a bounded number of paginated calls (1 + ceil(N / 200)). moto itself
    needs seconds per call at these sizes (its CPU is measured: the process's CPU minus
    the client thread's), so the wall time against moto is moto's, not spotring's or
    AWS's: the row held to the target is spotring's client-side CPU per refresh (a floor
    for its wall time on any endpoint), next to the raw wall times and, in ``extra``,
    wall time minus moto's CPU (which on a loaded machine still includes waiting for a
    core).

    python -m bench.discovery [--quick]
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import signal
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.common import (
    REGION,
    MotoServer,
    Row,
    awscli_env,
    classic_discovery_script,
    find_awscli,
    format_table,
    moto_server,
    row,
)
from spotring.autoscaler.cli import DEFAULT_REFRESH_INTERVAL

COST = "discovery, 64 instances"
SCALE = "discovery scale"
COST_SIZE = 64
HOROVOD_POLL_S = 1.0  # horovod.runner.elastic.driver.DISCOVER_HOSTS_FREQUENCY_SECS
API_CALLS_TARGET = 0.1  # cloud API calls/s, steady state
CREATE_BUDGET_S = 120.0  # give up growing a moto group after this long
# moto's refresh of 5,000 members took 17x its refresh of 1,000 (108 s vs 6.5 s, idle
# 2-core machine); skip 5,000 when that predicts more than the budget, to bound a run.
MOTO_5000_FACTOR = 20.0
REFRESH_5000_BUDGET_S = 200.0
# The script's DescribeInstances with 5,000 --instance-ids did not finish within 300 s
# on moto (1,000 ids: 8-18 s): moto's cost grows much faster than the id count.
SCRIPT_5000_FACTOR = 40.0
SCRIPT_5000_BUDGET_S = 120.0
SCRIPT_TIMEOUT_S = 300.0
SAMPLE_KEYS = ("wall", "cpu", "moto_cpu", "calls", "requests", "hosts")
CPU_NOTE = (
    "the 2 s target is wall time against AWS, which this machine cannot reach: against moto"
    " the wall time is moto's (seconds of its own CPU per call at this size) and this"
    " machine's load (both in 'extra'). The client-side CPU is the part spotring owns and a"
    " floor for its wall time anywhere; AWS adds its latency for the calls, made one after"
    " another."
)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Spotring:
    """spotring's refresh path against the group: provider, controller, discovery adapter."""

    def __init__(self, server: MotoServer, group: str) -> None:
        from spotring.autoscaler.controller import Controller
        from spotring.driver.discovery import InventoryHostDiscovery
        from spotring.providers.aws import AwsProvider

        # One slot per host, like the script; so no DescribeInstanceTypes either.
        self.provider = AwsProvider(
            group,
            region=REGION,
            endpoint_url=server.url,
            slots_per_host=1,
            session=server.session(),
        )
        # Not started: refresh() on this thread is what the controller thread runs.
        self.controller = Controller(self.provider, refresh_interval=DEFAULT_REFRESH_INTERVAL)
        self.discovery = InventoryHostDiscovery(self.controller)
        self.server = server

    def refresh(self) -> dict[str, float]:
        """One refresh: wall s, client CPU s, moto CPU s, API calls (provider, server)."""
        requests = self.server.requests
        cpu, process = time.thread_time(), time.process_time()
        start = time.perf_counter()
        if not self.controller.refresh():
            raise RuntimeError(f"spotring refresh failed: {self.controller.last_error}")
        wall = time.perf_counter() - start
        client = time.thread_time() - cpu
        return {
            "wall": wall,
            "cpu": client,
            "moto_cpu": max(0.0, time.process_time() - process - client),
            "calls": float(self.provider.last_refresh_calls),
            "requests": float(self.server.requests - requests),
            "hosts": float(len(self.discovery.find_available_hosts_and_slots())),
        }

    def close(self) -> None:
        self.provider.close()


class Script:
    """The classic discovery script, written to a temporary file."""

    def __init__(self, server: MotoServer, group: str, aws: Sequence[str], folder: Path) -> None:
        self.path = folder / f"discover-{group}.sh"
        self.path.write_text(classic_discovery_script(aws, group, server.url))
        self.path.chmod(0o755)
        self.env = awscli_env(server.url)
        self.server = server

    def run(self, timeout: float = SCRIPT_TIMEOUT_S) -> dict[str, float]:
        """One run as a plain subprocess: wall s, children's CPU s, moto CPU s, API calls.

        Past ``timeout`` the script and its AWS CLI processes are killed and every
        figure but ``timed_out`` is NaN.
        """
        requests = self.server.requests
        children, process = _children_cpu(), time.process_time()
        start = time.perf_counter()
        # A session of its own, so a timeout ends the AWS CLI processes too.
        proc = subprocess.Popen(
            [str(self.path)],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return {**dict.fromkeys(SAMPLE_KEYS, math.nan), "timed_out": float(timeout)}
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(f"discovery script failed: {err.strip()[-500:]}")
        return {
            "wall": wall,
            "cpu": _children_cpu() - children,
            # This thread sleeps in wait(): the process's CPU is moto's.
            "moto_cpu": time.process_time() - process,
            "calls": float(self.server.requests - requests),
            "requests": float(self.server.requests - requests),
            "hosts": float(len([line for line in out.splitlines() if line.strip()])),
            "timed_out": 0.0,
        }


def _median(samples: Sequence[dict[str, float]], key: str) -> float:
    return statistics.median(s[key] for s in samples)


def _time_per_call(fn: Callable[[], object], budget_s: float = 0.3) -> float:
    """Seconds per call of a fast function, timed in batches for ``budget_s``."""
    fn()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < budget_s:
        for _ in range(1000):
            fn()
        calls += 1000
    return (time.perf_counter() - start) / calls


def _horovod_polls(script: Script, rounds: int) -> list[dict[str, float]]:
    """Horovod's own poll of the script: ``HostDiscoveryScript`` (spawns a middleman)."""
    from horovod.runner.elastic.discovery import HostDiscoveryScript

    discovery = HostDiscoveryScript(str(script.path), 1)
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(script.env)  # safe_shell_exec passes this process's env on
    try:
        samples = []
        for _ in range(rounds):
            children = _children_cpu()
            start = time.perf_counter()
            hosts = discovery.find_available_hosts_and_slots()
            samples.append(
                {
                    "wall": time.perf_counter() - start,
                    "cpu": _children_cpu() - children,
                    "hosts": float(len(hosts)),
                }
            )
        return samples
    finally:
        os.environ.clear()
        os.environ.update(saved)


def measure_cost(
    server: MotoServer, aws: Sequence[str] | None, folder: Path, quick: bool
) -> list[Row]:
    """(a): one 64-instance group, spotring's refresh and poll vs the script's."""
    members, created_s = server.create_group("cost", COST_SIZE)
    ours = Spotring(server, "cost")
    try:
        ours.refresh()  # warm-up: connections, botocore's lazy parsers
        spot = [ours.refresh() for _ in range(3 if quick else 15)]
        poll_s = _time_per_call(ours.discovery.find_available_hosts_and_slots)
    finally:
        ours.close()
    calls = _median(spot, "calls")
    base_extra: dict[str, Any] = {
        "instances": members,
        "moto create s": round(created_s, 2),
        "spotring refreshes": len(spot),
        "spotring hosts found": int(_median(spot, "hosts")),
    }

    if aws is None:
        note = "no AWS CLI found (aws on PATH, or SPOTRING_BENCH_AWS): anchor not measured"
        nan = math.nan
        return [
            row(COST, "CPU ms per refresh", _median(spot, "cpu") * 1e3, "aws cli script", nan,
                "< 20 ms", base_extra | {"note": note}),
        ]  # fmt: skip

    script = Script(server, "cost", aws, folder)
    # Horovod's polls first: they also warm the page cache for the CLI's many files.
    polls = _horovod_polls(script, 1 if quick else 4)
    theirs = [script.run() for _ in range(2 if quick else 6)]
    script_calls = _median(theirs, "calls")
    extra = base_extra | {
        "script runs": len(theirs),
        "script hosts found": int(_median(theirs, "hosts")),
        "aws cli": " ".join(aws),
    }

    # Steady-state API rate. spotring: refreshes every interval; Horovod's polls read
    # the cache. Script: Horovod runs it on every poll (nominally 1/s; its loop sleeps
    # 1 s after each poll, so the real period is 1 s + the script's run time).
    spot_rate = calls / DEFAULT_REFRESH_INTERVAL
    script_rate = script_calls / HOROVOD_POLL_S
    poll_period = HOROVOD_POLL_S + _median(polls, "wall")
    rate_extra = extra | {
        "spotring calls per refresh": calls,
        "spotring refresh interval s": DEFAULT_REFRESH_INTERVAL,
        "spotring calls per hour": round(3600 / DEFAULT_REFRESH_INTERVAL * calls),
        "script calls per run": script_calls,
        "script calls per hour (1 poll/s)": round(3600 / HOROVOD_POLL_S * script_calls),
        "script poll period s (1 s + run, measured)": round(poll_period, 2),
        "script calls per hour at that period": round(3600 / poll_period * script_calls),
        "refresh interval for <= 0.1 calls/s": f"{calls / API_CALLS_TARGET:g} s",
        "note": (
            f"at the default --refresh-interval {DEFAULT_REFRESH_INTERVAL:g} s spotring makes "
            f"{spot_rate:g} calls/s; it meets <= {API_CALLS_TARGET:g}/s from "
            f"--refresh-interval {calls / API_CALLS_TARGET:g} s"
        ),
    }
    return [
        row(COST, "CPU ms per refresh", _median(spot, "cpu") * 1e3, "aws cli script",
            _median(theirs, "cpu") * 1e3, "< 20 ms", extra),
        row(COST, "wall ms per refresh (moto)", _median(spot, "wall") * 1e3, "aws cli script",
            _median(theirs, "wall") * 1e3, "",
            extra | {"spotring moto CPU ms": round(_median(spot, "moto_cpu") * 1e3, 1),
                     "script moto CPU ms": round(_median(theirs, "moto_cpu") * 1e3, 1)}),
        row(COST, "API calls per refresh", calls, "aws cli script", script_calls, "", extra),
        row(COST, "API calls/s, steady state", spot_rate, "aws cli script", script_rate,
            f"<= {API_CALLS_TARGET:g}", rate_extra),
        row(COST, "ms per Horovod poll", poll_s * 1e3, "HostDiscoveryScript",
            _median(polls, "wall") * 1e3, "< 1 ms",
            extra | {"spotring us per poll": round(poll_s * 1e6, 2),
                     "script poll children CPU ms": round(_median(polls, "cpu") * 1e3, 1),
                     "script polls": len(polls)}),
    ]  # fmt: skip


def measure_scale(
    server: MotoServer, aws: Sequence[str] | None, folder: Path, quick: bool
) -> list[Row]:
    """(b): refresh wall time and API calls of 100, 1,000 (, 5,000) member groups."""
    rows: list[Row] = []
    sizes = (100, 1000) if quick else (100, 1000, 5000)
    walls: dict[int, float] = {}  # size -> spotring's refresh wall time against moto
    script_walls: dict[int, float] = {}  # size -> the script's
    for size in sizes:
        group = f"scale-{size}"
        bound = 1 + math.ceil(size / 200)
        predicted = walls.get(1000, 0.0) * MOTO_5000_FACTOR if size == 5000 else 0.0
        if predicted > REFRESH_5000_BUDGET_S:
            # moto's time per refresh grows faster than the group: ~17x from 1,000 to 5,000.
            extra = {
                "skipped": f"moto would need about {predicted:.0f} s per refresh (from the"
                f" 1,000 group's {walls[1000]:.1f} s x {MOTO_5000_FACTOR:g}); budget"
                f" {REFRESH_5000_BUDGET_S:.0f} s"
            }
            rows.append(row(SCALE, f"refresh wall s (moto), {size}", math.nan, "aws cli script",
                            math.nan, "", extra))  # fmt: skip
            continue
        members, created_s = server.create_group(
            group, size, step=1000 if size > 1000 else None, budget_s=CREATE_BUDGET_S
        )
        extra: dict[str, Any] = {"instances": members, "moto create s": round(created_s, 1)}
        if members < size:
            extra["skipped"] = (
                f"moto launched only {members} of {size} instances in {created_s:.0f} s"
                f" (budget {CREATE_BUDGET_S:.0f} s)"
            )
            rows.append(row(SCALE, f"refresh wall s (moto), {size}", math.nan, "aws cli script",
                            math.nan, "", extra))  # fmt: skip
            continue
        ours = Spotring(server, group)
        try:
            if size < 1000 or (size == 1000 and not quick):
                ours.refresh()  # warm-up; at 5,000 one moto refresh takes minutes
            spot = [ours.refresh() for _ in range(1 if quick or size > 1000 else 2)]
        finally:
            ours.close()
        walls[size] = _median(spot, "wall")
        script_predicted = script_walls.get(1000, 0.0) * SCRIPT_5000_FACTOR
        if aws is None:
            theirs = [dict.fromkeys(SAMPLE_KEYS, math.nan)]
        elif size == 5000 and script_predicted > SCRIPT_5000_BUDGET_S:
            # Killing it on a timeout would not stop moto, whose request thread would
            # go on burning a core through the benchmarks that follow.
            theirs = [dict.fromkeys(SAMPLE_KEYS, math.nan)]
            extra["script skipped"] = (
                f"moto would need about {script_predicted:.0f} s (the 1,000 group's"
                f" {script_walls[1000]:.1f} s x {SCRIPT_5000_FACTOR:g}) to answer the script's"
                f" DescribeInstances with 5,000 --instance-ids; budget"
                f" {SCRIPT_5000_BUDGET_S:.0f} s"
            )
        else:
            theirs = [Script(server, group, aws, folder).run()]
            script_walls[size] = _median(theirs, "wall")
        extra |= {
            "spotring wall s (moto)": round(_median(spot, "wall"), 3),
            "spotring client CPU s": round(_median(spot, "cpu"), 3),
            "spotring moto CPU s": round(_median(spot, "moto_cpu"), 3),
            "spotring calls": _median(spot, "calls"),
            "spotring hosts found": int(_median(spot, "hosts")),
            "script wall s (moto)": round(_median(theirs, "wall"), 3),
            "script CPU s": round(_median(theirs, "cpu"), 3),
            "script moto CPU s": round(_median(theirs, "moto_cpu"), 3),
            "script hosts found": _median(theirs, "hosts"),
            "call bound 1 + ceil(N/200)": bound,
        }
        spot_net = statistics.median(s["wall"] - s["moto_cpu"] for s in spot)
        their_net = statistics.median(s["wall"] - s["moto_cpu"] for s in theirs)
        extra |= {
            "spotring wall - moto CPU s": round(spot_net, 3),
            "script wall - moto CPU s": round(their_net, 3),
        }
        target = "< 2 s" if size == 1000 else ""
        rows.append(
            row(SCALE, f"refresh wall s (moto), {size}", _median(spot, "wall"),
                "aws cli script", _median(theirs, "wall"), "", extra)
        )  # fmt: skip
        rows.append(
            row(SCALE, f"refresh client CPU s, {size}", _median(spot, "cpu"),
                "aws cli script", _median(theirs, "cpu"), target,
                extra | {"note": CPU_NOTE} if target else extra)
        )  # fmt: skip
        rows.append(
            row(SCALE, f"API calls per refresh, {size}", _median(spot, "calls"),
                "aws cli script", _median(theirs, "calls"), f"<= {bound}", extra)
        )  # fmt: skip
    if quick:
        print("   discovery scale: 5,000 instances skipped in quick mode", flush=True)
    return rows


def measure(quick: bool = False) -> list[Row]:
    """Rows for (a) discovery cost at 64 instances and (b) discovery scale."""
    aws = find_awscli()
    with tempfile.TemporaryDirectory(prefix="spotring-bench-") as folder, moto_server() as server:
        rows = measure_cost(server, aws, Path(folder), quick)
        rows += measure_scale(server, aws, Path(folder), quick)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, no 5,000 group")
    print(format_table(measure(quick=parser.parse_args().quick)))


if __name__ == "__main__":
    main()
