"""Usage errors: bad command-line input, reported as one line with exit status 2."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from typing import NoReturn

PROG = "spotring"

AddCommand = Callable[..., argparse.ArgumentParser]
"""How a command's module adds its parser: the ``add_parser`` of the parser's
subcommands (``add_command("run", help=...)``)."""


class UsageError(Exception):
    """Bad command-line input: reported as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """An argparse parser whose errors are :class:`UsageError` (argparse's own print a
    usage block and exit)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: error: {message}")


def print_error(message: object) -> None:
    """Print ``message`` to stderr as one line: control characters from the user's
    input (a newline in an argument or a group name) are shown escaped."""
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in str(message))
    print(text, file=sys.stderr)
