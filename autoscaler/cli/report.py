"""``spotring report FILE``: a run's events file drawn as one page
(:mod:`spotring.autoscaler.observers.report` draws it)."""

from __future__ import annotations

import argparse

from spotring.autoscaler.cli.usage import PROG, AddCommand, print_error
from spotring.autoscaler.job import EXIT_USAGE
from spotring.providers.options import non_negative_seconds


def add_parser(add_command: AddCommand) -> None:
    """The ``report`` command's parser."""
    report = add_command(
        "report",
        help="draw a run's --events file: sizes over time, notices, failures, stalls, cost",
        description="Render the events file of a spotring run as a self-contained HTML "
        "report, or as a PNG chart when OUT ends in .png.",
    )
    report.add_argument("events", metavar="FILE", help="the events file of a run")
    report.add_argument(
        "-o", "--output", default="report.html", metavar="OUT", help="default: report.html"
    )
    report.add_argument(
        "--price-spot",
        type=non_negative_seconds,
        metavar="USD",
        help="price of a spot instance-hour, for the cost line",
    )
    report.add_argument(
        "--price",
        dest="prices",
        type=price_override,
        action="append",
        default=[],
        metavar="GROUP_OR_LIFECYCLE=USD_PER_HOUR",
        help="price of an instance-hour of a group (by name) or a lifecycle (spot, "
        "on-demand), for the cost by group (repeatable; a group's price wins)",
    )
    report.add_argument(
        "--price-on-demand",
        type=non_negative_seconds,
        metavar="USD",
        help="price of an on-demand instance-hour, for the cost line and the savings",
    )


def price_override(text: str) -> tuple[str, float]:
    """``NAME=USD``: a group's or a lifecycle's price of an instance-hour (``--price`` of
    ``report`` and ``run``)."""
    name, equals, value = text.partition("=")
    if not equals or not name.strip():
        raise argparse.ArgumentTypeError(f"expected GROUP_OR_LIFECYCLE=USD_PER_HOUR, got {text!r}")
    return name.strip(), non_negative_seconds(value)


def report(options: argparse.Namespace) -> int:
    """Write the report; an events file that cannot be drawn is a usage error."""
    from spotring.autoscaler.observers.report import ReportError, write_report

    try:
        print(write_report(options.events, options.output, options.price_spot,
                           options.price_on_demand, dict(options.prices)))  # fmt: skip
    except ReportError as error:
        print_error(f"{PROG} report: error: {error}")
        return EXIT_USAGE
    return 0
