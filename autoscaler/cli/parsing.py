"""Parsing ``spotring``'s argv in two passes: the first finds ``--provider``, the second
builds the full parser with that provider's options (added through the
``spotring_add_provider_options`` hook), so ``spotring run --provider NAME --help``
lists them."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import pluggy

from spotring.autoscaler.cli import run
from spotring.autoscaler.cli.parser import build_parser
from spotring.autoscaler.cli.usage import PROG, Parser, UsageError
from spotring.autoscaler.plugins import provider_registry
from spotring.providers.base import Provider


def parse(
    argv: Sequence[str], pm: pluggy.PluginManager
) -> tuple[argparse.Namespace, type[Provider] | None]:
    """Parse ``argv`` in two passes; returns the options and the chosen provider class.
    Raises :class:`UsageError` for bad input."""
    command_args, job = _split_job(list(argv))
    probe = Parser(prog=PROG, add_help=False)
    probe.add_argument("--provider")
    known, _ = probe.parse_known_args(command_args)
    provider_cls: type[Provider] | None = None
    if known.provider is not None:
        try:
            provider_cls = provider_registry(pm).get(known.provider)
        except KeyError as error:
            raise UsageError(f"{PROG}: error: {error.args[0]}") from None
    options = build_parser(pm, provider_cls, job is not None).parse_args(command_args)
    if options.command == "run":
        run.finish_options(options, job)
    return options, provider_cls


def _split_job(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """The command's arguments, and the training command after ``--`` (None without)."""
    if "--" in argv:
        index = argv.index("--")
        return argv[:index], argv[index + 1 :]
    return argv, None
