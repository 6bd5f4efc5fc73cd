"""GCP discovery: what keeping Horovod's host list current costs on a managed instance group.

Both sides talk to the fake Compute Engine REST server (tests/gcp_fake.py), which runs
in a thread of this process and counts every request it serves.

spotring: one refresh is ``Controller.refresh()`` (the GCP provider's
``list_instances``: listManagedInstances, plus a filtered instances.list per zone and
100 names for members not seen running before), timed on this thread, whose CPU
``time.thread_time`` counts (the fake's CPU is on its own threads).

anchor: the discovery script a horovodrun user writes for a MIG (:data:`SCRIPT`): list
the managed instances, then get each running VM for its address, one call per VM;
run as a subprocess, as Horovod runs it on every 1 s poll. Its CPU is the child's
rusage (interpreter and library start-up included: Horovod pays them every poll).

Sizes: 64 and 1,000 members (zonal group; the real API answers listManagedInstances
of a default, PAGELESS group in one response).

    python -m bench.gcp_discovery [--quick]
"""

from __future__ import annotations

import argparse
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import Row, format_table, row
from spotring.autoscaler.cli import DEFAULT_REFRESH_INTERVAL

BENCHMARK = "gcp discovery"
ZONE = "us-central1-a"
SIZES = (64, 1000)
HOROVOD_POLL_S = 1.0  # horovod.runner.elastic.driver.DISCOVER_HOSTS_FREQUENCY_SECS

SCRIPT = """\
import sys
from google.api_core.client_options import ClientOptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import compute_v1

endpoint, project, zone, group = sys.argv[1:5]
options = dict(
    transport="rest",
    credentials=AnonymousCredentials(),
    client_options=ClientOptions(api_endpoint=endpoint),
)
groups = compute_v1.InstanceGroupManagersClient(**options)
instances = compute_v1.InstancesClient(**options)
for member in groups.list_managed_instances(
    project=project, zone=zone, instance_group_manager=group
):
    if member.current_action == "NONE" and member.instance_status == "RUNNING":
        name = member.instance.rsplit("/", 1)[-1]
        vm = instances.get(project=project, zone=zone, instance=name)
        print(f"{vm.network_interfaces[0].network_i_p}:1")
"""
"""The anchor: a host-discovery script for horovodrun, in the style of Google's samples."""


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Spotring:
    """spotring's refresh path: provider, controller, Horovod's discovery adapter."""

    def __init__(self, fake: Any, group: str) -> None:
        from google.auth.credentials import AnonymousCredentials

        from spotring.autoscaler.controller import Controller
        from spotring.driver.discovery import InventoryHostDiscovery
        from spotring.providers.gcp import GcpProvider

        self.provider = GcpProvider(
            group,
            zone=ZONE,
            project=fake.project,
            endpoint=fake.url,
            credentials=AnonymousCredentials(),
            slots_per_host=1,
        )
        # Not started: refresh() on this thread is what the controller thread runs.
        self.controller = Controller(self.provider, refresh_interval=DEFAULT_REFRESH_INTERVAL)
        self.discovery = InventoryHostDiscovery(self.controller)
        self.fake = fake

    def refresh(self) -> dict[str, float]:
        """One refresh: wall s, client CPU s, requests the server saw, hosts found."""
        before = len(self.fake.requests)
        cpu = time.thread_time()
        start = time.perf_counter()
        if not self.controller.refresh():
            raise RuntimeError(f"spotring refresh failed: {self.controller.last_error}")
        return {
            "wall": time.perf_counter() - start,
            "cpu": time.thread_time() - cpu,
            "calls": float(len(self.fake.requests) - before),
            "hosts": float(len(self.discovery.find_available_hosts_and_slots())),
        }

    def close(self) -> None:
        self.provider.close()


def run_script(fake: Any, group: str, script: Path) -> dict[str, float]:
    """One run of the anchor script, as Horovod runs it on a poll."""
    before = len(fake.requests)
    cpu = _children_cpu()
    start = time.perf_counter()
    result = subprocess.run(
        [sys.executable, str(script), fake.url, fake.project, ZONE, group],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return {
        "wall": time.perf_counter() - start,
        "cpu": _children_cpu() - cpu,
        "calls": float(len(fake.requests) - before),
        "hosts": float(len(result.stdout.splitlines())),
    }


def _median(samples: list[dict[str, float]], key: str) -> float:
    return statistics.median(s[key] for s in samples)


def measure_size(fake: Any, size: int, script: Path, quick: bool) -> list[Row]:
    group = f"bench-{size}"
    fake.add_group(group, zone=ZONE, size=size)
    ours = Spotring(fake, group)
    try:
        first = ours.refresh()
        steady = [ours.refresh() for _ in range(3 if quick else 10)]
    finally:
        ours.close()
    theirs = [run_script(fake, group, script) for _ in range(1 if quick or size > 100 else 3)]
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
    name = f"{BENCHMARK}, {size} members"
    anchor = "list + get per VM script"
    return [
        row(name, "API calls per refresh", _median(steady, "calls"), anchor,
            _median(theirs, "calls"), "<= 1", extra),
        row(name, "CPU ms per refresh", _median(steady, "cpu") * 1e3, anchor,
            _median(theirs, "cpu") * 1e3, "< 20 ms" if size <= 64 else "", extra),
        row(name, "wall ms per refresh (fake)", _median(steady, "wall") * 1e3, anchor,
            _median(theirs, "wall") * 1e3, "", extra),
    ]  # fmt: skip


def measure(quick: bool = False) -> list[Row]:
    """The rows of ``bench/run``: 64 and 1,000 members, spotring vs the script."""
    from tests.gcp_fake import FakeCompute

    rows: list[Row] = []
    with FakeCompute() as fake, tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "discover_mig.py"
        script.write_text(SCRIPT)
        for size in SIZES:
            rows.extend(measure_size(fake, size, script, quick))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    print(format_table(measure(parser.parse_args().quick)))


if __name__ == "__main__":
    main()
