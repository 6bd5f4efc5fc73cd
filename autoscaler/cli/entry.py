"""The ``spotring`` console script's entry point: parse, hand the options to the
command's module, and turn what comes back into one line and an exit status."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

import pluggy

from spotring.autoscaler.cli import check, discover, providers, report, run
from spotring.autoscaler.cli.options import make_groups
from spotring.autoscaler.cli.parsing import parse
from spotring.autoscaler.cli.usage import PROG, UsageError, print_error
from spotring.autoscaler.job import EXIT_FAILURE, EXIT_USAGE
from spotring.autoscaler.plugins import get_plugin_manager
from spotring.core import ConfigurationError, ProviderError
from spotring.driver.compat import HorovodSetupError
from spotring.providers.base import Provider


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``spotring`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        pm = get_plugin_manager()
        options, provider_cls = parse(argv, pm)
    except UsageError as error:
        print_error(error)
        return EXIT_USAGE
    except Exception as error:  # a broken plugin: say which, without a traceback
        print_error(f"{PROG}: error: could not load plugins: {error}")
        return EXIT_FAILURE
    logging.basicConfig(
        level=options.log_level.upper(), format="spotring: %(levelname)s %(name)s: %(message)s"
    )
    # urllib3 warns on every connection retry (the cloud SDKs' own retries, and
    # google-auth's background lookups); spotring reports the failures that matter.
    logging.getLogger("urllib3.connectionpool").setLevel(logging.ERROR)
    if options.command == "providers":
        return providers.list_providers(pm)
    if options.command == "check":
        return check.check(pm, options.provider)
    if options.command == "report":
        return report.report(options)
    assert provider_cls is not None
    return _on_groups(options, provider_cls, pm)


def _on_groups(
    options: argparse.Namespace, provider_cls: type[Provider], pm: pluggy.PluginManager
) -> int:
    """``discover`` or ``run`` on the groups the options name; the groups are closed
    after, whatever happened."""
    command = options.command
    try:
        groups = make_groups(provider_cls, options)
    except ConfigurationError as error:
        return _failed(command, error)
    try:
        if command == "discover":
            return discover.discover(groups)
        return run.run_command(options, groups, pm)
    except UsageError as error:
        print_error(error)
        return EXIT_USAGE
    except (ProviderError, HorovodSetupError) as error:
        return _failed(command, error)
    except KeyboardInterrupt:
        print_error(f"{PROG}: interrupted")
        return 130
    finally:
        for group in groups:
            group.close()


def _failed(command: str, error: Exception) -> int:
    """One line for ``error``; exit 2 for what the user must fix
    (:class:`ConfigurationError`), 1 for the rest."""
    print_error(f"{PROG} {command}: error: {error}")
    return EXIT_USAGE if isinstance(error, ConfigurationError) else EXIT_FAILURE
