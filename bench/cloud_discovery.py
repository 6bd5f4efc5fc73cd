"""What the GCP and Azure discovery benchmarks share: one group, measured both ways.

spotring: one refresh is ``Controller.refresh()`` (the provider's ``list_instances``
and the new inventory), timed on this thread, whose CPU ``time.thread_time`` counts
(the fake server's CPU is on its own threads).

anchor: the discovery script a horovodrun user writes for the group, run as a
subprocess as Horovod runs it on every 1 s poll. Its CPU is the child's rusage
(interpreter and library start-up included: Horovod pays them every poll).

API calls are counted at the fake server (every request it serves).
"""

from __future__ import annotations

import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from bench.common import Row, row
from spotring.autoscaler.cli import DEFAULT_REFRESH_INTERVAL

HOROVOD_POLL_S = 1.0  # horovod.runner.elastic.driver.DISCOVER_HOSTS_FREQUENCY_SECS

Sample = dict[str, float]
"""One refresh or script run: wall s, CPU s, calls the server saw, hosts found."""


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Refresher:
    """spotring's refresh path: provider, controller, Horovod's discovery adapter."""

    def __init__(self, provider: Any, requests_seen: Callable[[], int]) -> None:
        from spotring.autoscaler.controller import Controller
        from spotring.driver.discovery import InventoryHostDiscovery

        self.provider = provider
        # Not started: refresh() on this thread is what the controller thread runs.
        self.controller = Controller(provider, refresh_interval=DEFAULT_REFRESH_INTERVAL)
        self.discovery = InventoryHostDiscovery(self.controller)
        self.requests_seen = requests_seen

    def refresh(self) -> Sample:
        """One refresh, measured."""
        before = self.requests_seen()
        cpu = time.thread_time()
        start = time.perf_counter()
        if not self.controller.refresh():
            raise RuntimeError(f"spotring refresh failed: {self.controller.last_error}")
        return {
            "wall": time.perf_counter() - start,
            "cpu": time.thread_time() - cpu,
            "calls": float(self.requests_seen() - before),
            "hosts": float(len(self.discovery.find_available_hosts_and_slots())),
        }


def run_script(argv: Sequence[str], requests_seen: Callable[[], int]) -> Sample:
    """One run of an anchor script (``python argv...``), as Horovod runs it on a poll."""
    before = requests_seen()
    cpu = _children_cpu()
    start = time.perf_counter()
    result = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=600)
    if result.returncode != 0:
        raise RuntimeError(f"anchor script failed: {result.stderr.strip()[-2000:]}")
    return {
        "wall": time.perf_counter() - start,
        "cpu": _children_cpu() - cpu,
        "calls": float(requests_seen() - before),
        "hosts": float(len(result.stdout.splitlines())),
    }


def _median(samples: list[Sample], key: str) -> float:
    return statistics.median(s[key] for s in samples)


def measure_group(
    benchmark: str,
    size: int,
    provider: Any,
    script_argv: Sequence[str],
    requests_seen: Callable[[], int],
    *,
    anchor: str,
    calls_target: str,
    cpu_target: str = "",
    quick: bool,
) -> list[Row]:
    """Rows for one group of ``size`` members: calls, CPU and wall per refresh."""
    ours = Refresher(provider, requests_seen)
    try:
        first = ours.refresh()
        steady = [ours.refresh() for _ in range(3 if quick else 10)]
    finally:
        provider.close()
    runs = 1 if quick or size > 100 else 3
    theirs = [run_script(script_argv, requests_seen) for _ in range(runs)]
    extra = {
        "members": size,
        "spotring first refresh calls": int(first["calls"]),
        "spotring first refresh wall s": round(first["wall"], 3),
        "spotring hosts found": int(_median(steady, "hosts")),
        "script hosts found": int(_median(theirs, "hosts")),
        "spotring calls per hour (default interval)": round(
            3600 / DEFAULT_REFRESH_INTERVAL * _median(steady, "calls")
        ),
        "script calls per hour (1 poll/s)": round(3600 / HOROVOD_POLL_S * _median(theirs, "calls")),
    }
    name = f"{benchmark}, {size} members"
    return [
        row(name, "API calls per refresh", _median(steady, "calls"), anchor,
            _median(theirs, "calls"), calls_target, extra),
        row(name, "CPU ms per refresh", _median(steady, "cpu") * 1e3, anchor,
            _median(theirs, "cpu") * 1e3, cpu_target, extra),
        row(name, "wall ms per refresh (fake)", _median(steady, "wall") * 1e3, anchor,
            _median(theirs, "wall") * 1e3, "", extra),
    ]  # fmt: skip
