"""Driver overhead: CPU and memory of the discovery side of an elastic Horovod driver.

Set-up, at 64 and 1,000 hosts: an Auto Scaling group on a moto server in this process;
a driver process (a subprocess, so moto's CPU is not charged to it) that does what a
Horovod elastic driver's discovery does, for a fixed window after start-up:

- spotring: ``Controller`` with the AWS provider against moto, refresh interval 1 s
  (the refresh thread), and ``horovod.runner.elastic.discovery.HostManager`` over
  ``InventoryHostDiscovery`` updated every 1 s as Horovod's driver thread does
  (``ElasticDriver._discover_hosts``: update, then wait 1 s);
- anchor: the same ``HostManager`` loop over ``HostDiscoveryScript`` with the classic
  two-call AWS CLI script (what ``horovodrun --host-discovery-script`` runs: each poll
  spawns a middleman process that runs the script);
- floor (reported in ``extra``): an idle Python process that imported the same Horovod
  module.

No workers run: the figures are the discovery side's cost alone, which is all that
differs between the two drivers. CPU is the driver process's own plus its reaped
children's (the script's shells and AWS CLI processes), per minute of window. RSS is
the driver process's at the end of the window; the script's child processes' peak is
in ``extra``. At 1,000 hosts moto needs seconds per refresh, so refreshes (and script
polls) run back to back rather than every second; the counts are in ``extra``.

    python -m bench.driver_overhead [--quick]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import (
    REGION,
    REPO,
    MotoServer,
    Row,
    awscli_env,
    classic_discovery_script,
    find_awscli,
    format_table,
    moto_server,
    row,
)

BENCHMARK = "driver overhead"
HOROVOD_POLL_S = 1.0  # horovod.runner.elastic.driver.DISCOVER_HOSTS_FREQUENCY_SECS
REFRESH_INTERVAL_S = 1.0
SETUP_TIMEOUT_S = 180.0  # imports + the first listing of a 1,000-member group on moto
WINDOW_CAP_S = 120.0


# ------------------------------------------------------------------- the child


def _status_mib(field: str) -> float:
    """A memory figure of this process from /proc/self/status (VmRSS, VmHWM), in MiB.

    Not ``ru_maxrss``: Linux carries it across exec, so a child started from the big
    benchmark process would report the parent's peak.
    """
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def child(
    variant: str, group: str, endpoint: str, script: str, seconds: float, min_cycles: int
) -> None:
    """The driver process: set up, then poll discovery every 1 s for ``seconds``, and
    on until ``min_cycles`` refreshes (spotring) or script runs (anchor) completed.

    Prints ``START`` and ``END`` around the window (the parent counts moto's requests
    between them), then one JSON line of figures.
    """
    from horovod.runner.elastic.discovery import HostDiscovery, HostDiscoveryScript, HostManager

    stats: dict[str, Any] = {"variant": variant}
    controller = None
    discovery: HostDiscovery | None = None
    if variant == "spotring":
        from bench.common import fake_session
        from spotring.autoscaler.controller import Controller
        from spotring.driver.discovery import InventoryHostDiscovery
        from spotring.providers.aws import AwsProvider

        provider = AwsProvider(
            group, region=REGION, endpoint_url=endpoint, slots_per_host=1, session=fake_session()
        )
        controller = Controller(provider, refresh_interval=REFRESH_INTERVAL_S)
        controller.start()
        controller.wait_for_inventory(SETUP_TIMEOUT_S)
        discovery = InventoryHostDiscovery(controller)
    elif variant == "script":
        discovery = HostDiscoveryScript(script, 1)

    manager = HostManager(discovery) if discovery is not None else None
    lock = threading.Condition()  # the driver's _wait_hosts_cond, held during a poll
    if manager is not None:
        manager.update_available_hosts()
        stats["hosts"] = len(manager.current_hosts.available_hosts)
    refreshes = controller.refreshes if controller else 0
    calls = sum(g.api_calls for g in controller.groups) if controller else 0

    print("START", flush=True)
    cpu_self, cpu_children = _cpu(resource.RUSAGE_SELF), _cpu(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    polls: list[float] = []
    stop = threading.Event()

    def cycles() -> int:
        """Complete refreshes (spotring) or script runs (anchor) in the window so far."""
        if controller is not None:
            return controller.refreshes - refreshes
        return len(polls) if manager is not None else min_cycles

    # Whole cycles, or moto's seconds-long refreshes at 1,000 hosts would fall outside.
    while (time.perf_counter() - start < seconds or cycles() < min_cycles) and (
        time.perf_counter() - start < WINDOW_CAP_S
    ):
        if manager is not None:
            began = time.perf_counter()
            with lock:
                manager.update_available_hosts()
            polls.append(time.perf_counter() - began)
        stop.wait(HOROVOD_POLL_S)
    window = time.perf_counter() - start
    cpu_self = _cpu(resource.RUSAGE_SELF) - cpu_self
    cpu_children = _cpu(resource.RUSAGE_CHILDREN) - cpu_children
    print("END", flush=True)

    stats |= {
        "window_s": window,
        "cpu_self_s": cpu_self,
        "cpu_children_s": cpu_children,
        "rss_mib": _status_mib("VmRSS"),
        "peak_rss_mib": _status_mib("VmHWM"),
        "children_max_rss_mib": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024,
        "polls": len(polls),
        "poll_max_s": max(polls, default=0.0),
        "poll_median_s": sorted(polls)[len(polls) // 2] if polls else 0.0,
    }
    if controller is not None:
        stats["refreshes"] = controller.refreshes - refreshes
        stats["provider_calls"] = sum(g.api_calls for g in controller.groups) - calls
    print(json.dumps(stats), flush=True)
    # Do not wait for a refresh in flight (seconds at 1,000 hosts on moto): nothing to save.
    os._exit(0)


# ------------------------------------------------------------------ the parent


def _run_child(
    server: MotoServer, variant: str, group: str, script: Path, seconds: float, min_cycles: int
) -> dict[str, Any]:
    """Run one driver process; its figures plus the API calls moto served in its window."""
    env = awscli_env(server.url) if variant == "script" else dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "bench.driver_overhead", "--child", variant]
    command += ["--group", group, "--endpoint", server.url, "--script", str(script)]
    command += ["--seconds", str(seconds), "--min-cycles", str(min_cycles)]
    # A session of its own, so a timeout can end the whole tree (middlemen, CLI runs).
    proc = subprocess.Popen(
        command, stdout=subprocess.PIPE, text=True, env=env, cwd=REPO, start_new_session=True
    )
    limit = SETUP_TIMEOUT_S + WINDOW_CAP_S + 60
    timer = threading.Timer(limit, os.killpg, (proc.pid, signal.SIGKILL))
    timer.start()
    try:
        assert proc.stdout is not None
        marks: dict[str, int] = {}
        result: dict[str, Any] | None = None
        for line in proc.stdout:
            line = line.strip()
            if line in ("START", "END"):
                marks[line] = server.requests
            elif line.startswith("{"):
                result = json.loads(line)
        proc.wait()
    finally:
        timer.cancel()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if result is None or proc.returncode != 0:
        raise RuntimeError(f"driver process ({variant}, {group}) failed: exit {proc.returncode}")
    result["api_calls"] = marks.get("END", 0) - marks.get("START", 0)
    return result


def _per_minute(result: dict[str, Any]) -> float:
    return (result["cpu_self_s"] + result["cpu_children_s"]) / result["window_s"] * 60


def _summary(result: dict[str, Any]) -> dict[str, Any]:
    """The figures behind a row, for its ``extra``."""
    keys = ("window_s", "cpu_self_s", "cpu_children_s", "polls", "poll_median_s", "poll_max_s")
    out: dict[str, Any] = {k: round(result[k], 3) for k in keys}
    out["API calls/s"] = round(result["api_calls"] / result["window_s"], 3)
    out["peak RSS MiB"] = round(result["peak_rss_mib"], 1)
    out["largest child peak RSS MiB"] = round(result["children_max_rss_mib"], 1)
    cpu = result["cpu_self_s"] + result["cpu_children_s"]
    if "refreshes" in result:
        # moto sets the pace at 1,000 hosts: CPU per refresh carries over to real AWS.
        out["refreshes"] = result["refreshes"]
        if result["refreshes"]:
            out["CPU s per refresh"] = round(cpu / result["refreshes"], 4)
    elif result["polls"]:
        out["CPU s per poll"] = round(cpu / result["polls"], 4)
    if "hosts" in result:
        out["hosts discovered"] = result["hosts"]
    return out


def measure(quick: bool = False) -> list[Row]:
    """CPU s per minute and RSS MiB of a spotring driver vs a discovery-script driver."""
    seconds = 6.0 if quick else 20.0
    cycles = 1 if quick else 2  # at least this many refreshes / script runs per window
    aws = find_awscli()
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="spotring-bench-") as folder, moto_server() as server:
        idle = _run_child(server, "idle", "-", Path(os.devnull), 1.0 if quick else 3.0, 0)
        floor = {
            "idle python + horovod import: RSS MiB": round(idle["rss_mib"], 1),
            "idle peak RSS MiB": round(idle["peak_rss_mib"], 1),
            "idle CPU s per minute": round(_per_minute(idle), 3),
        }
        for size in (64, 1000):
            group = f"driver-{size}"
            members, created_s = server.create_group(group, size)
            script = Path(folder) / f"discover-{group}.sh"
            script.write_text(classic_discovery_script(aws or ["aws"], group, server.url))
            script.chmod(0o755)
            ours = _run_child(server, "spotring", group, script, seconds, cycles)
            theirs = _run_child(server, "script", group, script, seconds, cycles) if aws else None
            extra: dict[str, Any] = {
                "hosts": members,
                "moto create s": round(created_s, 1),
                "set-up": (
                    f"driver subprocess, HostManager.update_available_hosts every"
                    f" {HOROVOD_POLL_S:g} s for {seconds:g} s and at least {cycles} refresh(es)"
                    f" / script run(s); spotring refresh interval {REFRESH_INTERVAL_S:g} s;"
                    " moto in the parent process; no workers"
                ),
                "spotring": _summary(ours),
                "floor": floor,
            }
            if theirs is not None:
                extra["script"] = _summary(theirs)
            else:
                extra["note"] = "no AWS CLI found: anchor not measured"
            nan = float("nan")
            anchor = "horovod + discovery script"
            rows.append(
                row(BENCHMARK, f"CPU s per minute, {size} hosts", _per_minute(ours), anchor,
                    _per_minute(theirs) if theirs else nan, "", extra)
            )  # fmt: skip
            rows.append(
                row(BENCHMARK, f"RSS MiB, {size} hosts", ours["rss_mib"], anchor,
                    theirs["rss_mib"] if theirs else nan, "", extra)
            )  # fmt: skip
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter windows")
    parser.add_argument("--child", choices=("spotring", "script", "idle"), help=argparse.SUPPRESS)
    parser.add_argument("--group", help=argparse.SUPPRESS)
    parser.add_argument("--endpoint", help=argparse.SUPPRESS)
    parser.add_argument("--script", help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=8.0, help=argparse.SUPPRESS)
    parser.add_argument("--min-cycles", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child, args.group, args.endpoint, args.script, args.seconds, args.min_cycles)
    else:
        print(format_table(measure(quick=args.quick)))


if __name__ == "__main__":
    main()
