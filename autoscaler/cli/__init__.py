"""The ``spotring`` command line: it parses and reports; what a job is made of is
:mod:`spotring.autoscaler.composition`'s, and running it :mod:`spotring.autoscaler.job`'s.

* :mod:`~spotring.autoscaler.cli.entry`: :func:`main`, the console script;
* :mod:`~spotring.autoscaler.cli.parsing`: the two passes over argv (the provider's
  options come from a hook), :mod:`~spotring.autoscaler.cli.parser` the parser;
* :mod:`~spotring.autoscaler.cli.options`: the provider's options apart from spotring's;
* :mod:`~spotring.autoscaler.cli.usage`: bad input, one line on stderr and exit 2,
  never a traceback;
* a module per command, its options and what it does: ``run``, ``discover``,
  ``providers``, ``report``, ``check``.

Every name imported from ``spotring.autoscaler.cli`` before it became a package is
importable from it still.
"""

from spotring.autoscaler.cli.entry import main
from spotring.autoscaler.cli.options import (
    core_options,
    make_groups,
    make_provider,
    provider_options,
)
from spotring.autoscaler.cli.parser import build_parser
from spotring.autoscaler.cli.parsing import parse
from spotring.autoscaler.cli.run import DEFAULT_REFRESH_INTERVAL
from spotring.autoscaler.cli.usage import PROG, UsageError
from spotring.autoscaler.composition import job_id

__all__ = [
    "DEFAULT_REFRESH_INTERVAL",
    "PROG",
    "UsageError",
    "build_parser",
    "core_options",
    "job_id",
    "main",
    "make_groups",
    "make_provider",
    "parse",
    "provider_options",
]
