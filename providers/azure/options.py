"""The options ``spotring run --provider azure`` adds (besides the shared ones of every
cloud group), and the provider's keyword arguments read from them."""

from __future__ import annotations

import argparse
from typing import Any

DEFAULT_SLOTS_TAG = "spotring-slots"


def add_scale_set_arguments(group: argparse._ArgumentGroup) -> None:
    """Add ``--group``, ``--resource-group``, ``--subscription``, ``--endpoint`` and
    ``--keep-evicted``."""
    group.add_argument(
        "--group",
        dest="azure_group",
        action="append",
        metavar="[RG/]NAME",
        help="scale set name, in --resource-group or in resource group RG; give it"
        " once per scale set of the job, the preferred one first",
    )
    group.add_argument(
        "--resource-group",
        dest="azure_resource_group",
        metavar="RG",
        help="the resource group of every --group NAME given without one",
    )
    group.add_argument(
        "--subscription",
        dest="azure_subscription",
        metavar="ID",
        help="subscription id (default: AZURE_SUBSCRIPTION_ID)",
    )
    group.add_argument(
        "--endpoint",
        dest="azure_endpoint",
        metavar="URL",
        help="Azure Resource Manager URL (sovereign clouds, or a test server)",
    )
    group.add_argument(
        "--keep-evicted",
        dest="azure_keep_evicted",
        action="store_true",
        help="leave spot VMs evicted with policy Deallocate in the set"
        " (default: they are failed hosts, which spotring run replaces unless"
        " --no-replace)",
    )


def scale_set_options(options: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of ``AzureProvider`` that every scale set of the job shares:
    ``subscription``, ``endpoint`` and ``keep_evicted``."""
    return {
        "subscription": getattr(options, "azure_subscription", None),
        "endpoint": getattr(options, "azure_endpoint", None),
        "keep_evicted": getattr(options, "azure_keep_evicted", False),
    }
