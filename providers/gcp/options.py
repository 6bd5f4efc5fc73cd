"""The ``gcp`` provider's own command-line options, and the groups they name."""

from __future__ import annotations

import argparse

from spotring.providers.gcp.groups import GroupSpec, group_specs


def add_gcp_arguments(group: argparse._ArgumentGroup) -> None:
    """Add ``--group``, ``--zone``/``--region``, ``--project`` and ``--endpoint`` (the
    options every cloud provider shares are added by
    :meth:`~spotring.providers.cloud.CloudGroupProvider.add_common_arguments`)."""
    group.add_argument(
        "--group",
        dest="gcp_group",
        action="append",
        metavar="[ZONE/|REGION/]NAME",
        help="managed instance group (required); give it more than once for a job that"
        " spans several groups, in order of preference. NAME is in --zone or --region;"
        " ZONE/NAME is a zonal group, REGION/NAME a regional one",
    )
    where = group.add_mutually_exclusive_group()
    where.add_argument(
        "--zone", dest="gcp_zone", metavar="ZONE", help="the zone of each zonal --group NAME"
    )
    where.add_argument(
        "--region",
        dest="gcp_region",
        metavar="REGION",
        help="the region of each regional --group NAME",
    )
    group.add_argument(
        "--project",
        dest="gcp_project",
        metavar="PROJECT",
        help="project id (default: GOOGLE_CLOUD_PROJECT or the credentials' project)",
    )
    group.add_argument(
        "--endpoint",
        dest="gcp_endpoint",
        metavar="URL",
        help="send Compute Engine calls here (a test server or private endpoint)",
    )


def given_groups(options: argparse.Namespace) -> list[tuple[GroupSpec, str]]:
    """The ``--group`` values given, parsed, each with its name in the job (see
    :func:`~spotring.providers.gcp.groups.group_specs`)."""
    return group_specs(
        getattr(options, "gcp_group", None),
        getattr(options, "gcp_zone", None),
        getattr(options, "gcp_region", None),
    )


__all__ = ["add_gcp_arguments", "given_groups"]
