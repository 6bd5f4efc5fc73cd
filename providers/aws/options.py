"""The AWS provider's command-line options: adding them, reading them back, and a
``--group`` argument's region and name."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass

from spotring.providers.base import ConfigurationError

DEFAULT_SLOTS_TAG = "spotring:slots"
"""The instance tag holding a host's slot count (``--slots-tag``'s default)."""

_REGION_NAME = re.compile(r"[a-z]{2}(-[a-z]+)+-\d+")
"""An AWS region name (us-east-1, us-gov-west-1, ap-southeast-4, ...): what may stand
before the ``/`` of ``--group REGION/NAME``. A group name may itself hold a ``/``
(API_CreateAutoScalingGroup allows any printable character), so a prefix that is no
region name leaves the whole argument as the name."""


def add_aws_arguments(group: argparse._ArgumentGroup) -> None:
    """Add ``--group``, ``--region``, ``--profile`` and ``--endpoint-url``."""
    group.add_argument(
        "--group",
        dest="aws_group",
        action="append",
        metavar="[REGION/]NAME",
        help="Auto Scaling group name (required); give it again for more groups, in"
        " order of preference (spot first, on-demand last); REGION/NAME for a group in"
        " another region than --region",
    )
    group.add_argument(
        "--region",
        dest="aws_region",
        metavar="REGION",
        help="AWS region (default: AWS_REGION / AWS_DEFAULT_REGION / the profile's)",
    )
    group.add_argument(
        "--profile",
        dest="aws_profile",
        metavar="PROFILE",
        help="named profile from ~/.aws/config (default: AWS_PROFILE or the default chain)",
    )
    group.add_argument(
        "--endpoint-url",
        dest="aws_endpoint_url",
        metavar="URL",
        help="send Auto Scaling and EC2 calls here (a test server or VPC endpoint)",
    )


@dataclass(frozen=True)
class AwsOptions:
    """The options :func:`add_aws_arguments` adds, as parsed."""

    groups: tuple[str, ...]
    """Each ``--group`` as given (``NAME`` or ``REGION/NAME``), in order."""
    region: str | None
    profile: str | None
    endpoint_url: str | None

    @classmethod
    def read(cls, options: argparse.Namespace) -> AwsOptions:
        """The AWS options of ``options``; an option not there is not given."""
        names = getattr(options, "aws_group", None) or []
        if isinstance(names, str):  # a namespace made by hand, not by our parser
            names = [names]
        return cls(
            groups=tuple(names),
            region=getattr(options, "aws_region", None),
            profile=getattr(options, "aws_profile", None),
            endpoint_url=getattr(options, "aws_endpoint_url", None),
        )


def parse_group(argument: str) -> tuple[str | None, str]:
    """``--group`` ``NAME`` -> (None, NAME); ``REGION/NAME`` -> (REGION, NAME).

    Raises :class:`ConfigurationError` for an empty name."""
    region, slash, name = argument.partition("/")
    if not slash or not _REGION_NAME.fullmatch(region):
        region, name = "", argument
    if not name.strip():
        raise ConfigurationError(f"--group {argument!r} names no Auto Scaling group")
    return region or None, name
