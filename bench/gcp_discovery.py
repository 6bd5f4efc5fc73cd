"""GCP discovery: what keeping Horovod's host list current costs on a managed instance group.

Both sides talk to the fake Compute Engine REST server (tests/fakes/gcp.py), which runs
in a thread of this process and counts every request it serves; how each side is
measured: bench/cloud_discovery.py.

spotring: the GCP provider's ``list_instances``: listManagedInstances, plus a filtered
instances.list per zone and 100 names for members not seen running before.

anchor: the discovery script a horovodrun user writes for a MIG (:data:`SCRIPT`): list
the managed instances, then get each running VM for its address, one call per VM.

Sizes: 64 and 1,000 members (zonal group; the real API answers listManagedInstances
of a default, PAGELESS group in one response).

    python -m bench.gcp_discovery [--quick]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from bench.cloud_discovery import measure_group
from bench.common import Row, format_table

BENCHMARK = "gcp discovery"
ZONE = "us-central1-a"
SIZES = (64, 1000)

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


def measure_size(fake: Any, size: int, script: Path, quick: bool) -> list[Row]:
    from google.auth.credentials import AnonymousCredentials

    from spotring.providers.gcp import GcpProvider

    group = f"bench-{size}"
    fake.add_group(group, zone=ZONE, size=size)
    provider = GcpProvider(
        group,
        zone=ZONE,
        project=fake.project,
        endpoint=fake.url,
        credentials=AnonymousCredentials(),
        slots_per_host=1,
    )
    return measure_group(
        BENCHMARK,
        size,
        provider,
        [str(script), fake.url, fake.project, ZONE, group],
        lambda: len(fake.requests),
        anchor="list + get per VM script",
        calls_target="<= 1",
        cpu_target="< 20 ms" if size <= 64 else "",
        quick=quick,
    )


def measure(quick: bool = False) -> list[Row]:
    """The rows of ``bench/run``: 64 and 1,000 members, spotring vs the script."""
    from tests.fakes.gcp import FakeCompute

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
