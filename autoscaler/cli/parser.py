"""The ``spotring`` parser: spotring's own options and each command's, which the
command's module declares."""

from __future__ import annotations

import argparse

import pluggy

from spotring.autoscaler.cli import check, discover, providers, report, run
from spotring.autoscaler.cli.usage import PROG, Parser
from spotring.providers.base import Provider


def build_parser(
    pm: pluggy.PluginManager | None = None,
    provider: type[Provider] | None = None,
    command_after_dashes: bool = False,
) -> argparse.ArgumentParser:
    """The full parser, with ``provider``'s options when one is given.

    ``command_after_dashes``: the training command was split off at ``--``, so ``run``
    takes no positional command; otherwise argparse's catch-all positional would
    swallow a mistyped option and everything after it (``--hostz 2 -np 1`` read as a
    command, then "-np is required").
    """
    parser = Parser(prog=PROG, description="Elastic Horovod training on spot capacity.")
    parser.add_argument(
        "--log-level",
        default="warning",
        choices=["debug", "info", "warning", "error"],
        help="controller log level (default: warning)",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    commands.required = True
    run.add_parser(commands.add_parser, pm, provider, command_after_dashes)
    discover.add_parser(commands.add_parser, pm, provider)
    providers.add_parser(commands.add_parser)
    report.add_parser(commands.add_parser)
    check.add_parser(commands.add_parser)
    return parser
