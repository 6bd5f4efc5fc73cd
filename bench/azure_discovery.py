"""Azure discovery: what keeping Horovod's host list current costs on a VM scale set.

Both sides talk to the fake ARM server (tests/fakes/azure.py), which runs in a thread of
this process and counts every request it serves; how each side is measured:
bench/cloud_discovery.py.

spotring: the Azure provider's ``list_instances`` on a Flexible scale set (the default
for new ones): the set's GET and its VMs with their instance view (paged), plus the
resource group's NICs (paged) only while some member's address is still unknown.

anchor: the discovery script a horovodrun user writes for the set (:data:`SCRIPT`):
list its VMs with their instance view, then get each running VM's NIC for its
address, one call per VM.

Sizes: 64 and 1,000 VMs. The fake pages lists at 100 items (ARM's page sizes are the
resource provider's choice), so a listing of N VMs costs ceil(N / 100) calls on both
sides. spotring reads the VM list as plain JSON through the client's pipeline:
azure-mgmt-compute's models would cost about ten times the request (50 ms of CPU per
refresh at 64 VMs instead of 10).

    python -m bench.azure_discovery [--quick]
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path
from typing import Any

from bench.cloud_discovery import measure_group
from bench.common import Row, format_table

BENCHMARK = "azure discovery"
RESOURCE_GROUP = "rg"
SIZES = (64, 1000)

SCRIPT = """\
import sys
from azure.core.pipeline.policies import SansIOHTTPPolicy
from azure.mgmt.compute import ComputeManagementClient
from azure.mgmt.network import NetworkManagementClient

class NoCredential:  # the loopback fake asks for no token
    def get_token(self, *scopes, **kwargs):
        raise RuntimeError("not used")


endpoint, subscription, resource_group, scale_set_id = sys.argv[1:5]
options = dict(base_url=endpoint, authentication_policy=SansIOHTTPPolicy())
compute = ComputeManagementClient(NoCredential(), subscription, **options)
network = NetworkManagementClient(NoCredential(), subscription, **options)
vms = compute.virtual_machines.list(
    resource_group,
    filter=f"'virtualMachineScaleSet/id' eq '{scale_set_id}'",
    expand="instanceView",
)
for vm in vms:
    codes = [s.code for s in vm.instance_view.statuses]
    if vm.provisioning_state == "Succeeded" and "PowerState/running" in codes:
        nic_name = vm.network_profile.network_interfaces[0].id.rsplit("/", 1)[-1]
        nic = network.network_interfaces.get(resource_group, nic_name)
        print(f"{nic.ip_configurations[0].private_ip_address}:1")
"""
"""The anchor: a host-discovery script for horovodrun, in the style of Azure's samples."""


def measure_size(fake: Any, size: int, script: Path, quick: bool) -> list[Row]:
    from spotring.providers.azure import AzureProvider

    group = f"bench-{size}"
    scale_set = fake.add_scale_set(group, resource_group=RESOURCE_GROUP, capacity=size)
    scale_set.auto_advance = False  # a steady group: nothing joins or leaves
    provider = AzureProvider(
        group,
        resource_group=RESOURCE_GROUP,
        subscription=fake.subscription,
        endpoint=fake.url,
        slots_per_host=1,
    )
    pages = math.ceil(size / fake.page_size)
    return measure_group(
        BENCHMARK,
        size,
        provider,
        [str(script), fake.url, fake.subscription, RESOURCE_GROUP, scale_set.id],
        lambda: len(fake.requests),
        anchor="list + NIC get per VM script",
        calls_target=f"<= {1 + pages}",  # the set's GET and the VM list's pages
        cpu_target="< 20 ms" if size <= 64 else "",
        quick=quick,
    )


def measure(quick: bool = False) -> list[Row]:
    """The rows of ``bench/run``: 64 and 1,000 VMs, spotring vs the script."""
    from tests.fakes.azure import FakeArm

    rows: list[Row] = []
    with FakeArm() as fake, tempfile.TemporaryDirectory() as folder:
        script = Path(folder) / "discover_vmss.py"
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
