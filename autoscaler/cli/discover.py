"""``spotring discover``: the groups' READY hosts, as horovodrun's
``--host-discovery-script`` prints them."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import pluggy

from spotring.autoscaler.cli.options import add_provider_options
from spotring.autoscaler.cli.usage import AddCommand
from spotring.autoscaler.groups import list_members
from spotring.core.inventory import Inventory
from spotring.providers.base import Provider
from spotring.providers.options import positive_int


def add_parser(
    add_command: AddCommand,
    pm: pluggy.PluginManager | None,
    provider: type[Provider] | None,
) -> None:
    """The ``discover`` command's parser."""
    discover = add_command(
        "discover",
        help="print host:slots lines for horovodrun --host-discovery-script",
        description="Print the group's READY hosts as host:slots lines, the format "
        "horovodrun's --host-discovery-script expects.",
    )
    add_provider_options(discover, pm, provider)
    discover.add_argument(
        "--slots-per-host",
        "--slots",
        dest="slots_per_host",
        type=positive_int,
        metavar="N",
        help="slots per host (default: from the provider)",
    )


def discover(groups: Sequence[Provider]) -> int:
    """One listing, printed as horovodrun's discovery script format.

    A failed listing exits non-zero with nothing on stdout: horovodrun keeps its last
    host set when the script fails, instead of seeing "no hosts".
    """
    inventory = Inventory(tuple(list_members(groups, {})))
    sys.stdout.write(Inventory.format_hosts(inventory.hosts_and_slots()))
    return 0
