"""The cloud permission tables of the docs, made from each provider's own list.

Each cloud provider keeps one mapping from the API calls it makes to the permission each
needs (``IAM_ACTION_BY_OPERATION`` in :mod:`spotring.providers.aws`,
``PERMISSION_BY_CALL`` in :mod:`spotring.providers.gcp`, ``ACTION_BY_CALL`` in
:mod:`spotring.providers.azure`). :func:`permission_markdown` turns one into Markdown
(for AWS with the least-privilege policy document of
:func:`spotring.providers.aws.iam_policy`), for the README now and the reference pages
of a docs site later; :func:`render` puts each cloud's between its markers in a text::

    <!-- permissions:gcp -->
    (generated)
    <!-- /permissions:gcp -->

so the tables cannot drift from the code. ``python -m spotring.providers.permissions
[--check] [README.md]`` rewrites a file's tables, or with ``--check`` only says whether
they are current (exit 1 when not); the test suite runs the check.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from spotring.providers import azure
from spotring.providers.aws import permissions as aws
from spotring.providers.gcp import permissions as gcp

AWS_GROUP_ARN = (
    "arn:aws:autoscaling:REGION:ACCOUNT_ID:autoScalingGroup:*:autoScalingGroupName/GROUP"
)
"""The group ARN the README's AWS policy shows, for the reader to fill in."""

_MARKERS = re.compile(r"(<!-- permissions:(\w+) -->\n)(.*?)(<!-- /permissions:\2 -->)", re.DOTALL)


def _calls_by_permission(by_call: Mapping[str, str]) -> dict[str, list[str]]:
    """``{call: permission}`` turned around, in the order the permissions first appear."""
    calls: dict[str, list[str]] = {}
    for call, permission in by_call.items():
        calls.setdefault(permission, []).append(call)
    return calls


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _code(names: Sequence[str]) -> str:
    return ", ".join(f"`{name}`" for name in names)


def aws_markdown() -> str:
    """The AWS actions (the calls that need each, the resource each may be limited to)
    and the policy document :func:`spotring.providers.aws.iam_policy` writes."""
    rows = [
        [
            f"`{action}`",
            _code(calls),
            "the group's ARN" if action in aws.IAM_STEERING_ACTIONS else '`"*"` only',
        ]
        for action, calls in _calls_by_permission(aws.IAM_ACTION_BY_OPERATION).items()
    ]
    policy = json.dumps(aws.iam_policy(AWS_GROUP_ARN), indent=2)
    return _table(["action", "for", "resource"], rows) + f"\n```json\n{policy}\n```\n"


def gcp_markdown() -> str:
    """The Compute Engine permissions and the calls that need each."""
    rows = [
        [f"`{permission}`", _code(calls)]
        for permission, calls in _calls_by_permission(gcp.PERMISSION_BY_CALL).items()
    ]
    return _table(["permission", "for"], rows)


def azure_markdown() -> str:
    """The Azure actions and the calls that need each."""
    rows = [
        [f"`{action}`", _code(calls)]
        for action, calls in _calls_by_permission(azure.ACTION_BY_CALL).items()
    ]
    return _table(["action", "for"], rows)


MARKDOWN: Mapping[str, Callable[[], str]] = {
    "aws": aws_markdown,
    "gcp": gcp_markdown,
    "azure": azure_markdown,
}
"""Each cloud's permission Markdown, by the name its markers use."""


def permission_markdown(cloud: str) -> str:
    """The permission Markdown of ``cloud`` (a key of :data:`MARKDOWN`)."""
    return MARKDOWN[cloud]()


def render(text: str) -> str:
    """``text`` with each cloud's permission Markdown between its markers.

    Raises ValueError when a cloud's markers are missing or repeated, or name no cloud.
    """
    found = [match.group(2) for match in _MARKERS.finditer(text)]
    unknown = sorted(set(found) - MARKDOWN.keys())
    if unknown:
        raise ValueError(f"permission markers for no known cloud: {', '.join(unknown)}")
    for cloud in MARKDOWN:
        if found.count(cloud) != 1:
            raise ValueError(
                f"expected one pair of permissions:{cloud} markers, found {found.count(cloud)}"
            )
    return _MARKERS.sub(lambda m: m.group(1) + permission_markdown(m.group(2)) + m.group(4), text)


def main(argv: Sequence[str] | None = None) -> int:
    """Rewrite (or ``--check``) the permission tables of a Markdown file; returns the
    exit status: 0 done or current, 1 not current, 2 bad usage or file."""
    parser = argparse.ArgumentParser(
        prog="python -m spotring.providers.permissions",
        description="Write each cloud provider's permission table into a Markdown file.",
    )
    parser.add_argument("file", nargs="?", default="README.md", type=Path)
    parser.add_argument(
        "--check", action="store_true", help="change nothing; exit 1 if the tables are stale"
    )
    args = parser.parse_args(argv)
    try:
        text = args.file.read_text(encoding="utf-8")
        rendered = render(text)
    except (OSError, ValueError) as error:
        print(f"{parser.prog}: {args.file}: {error}", file=sys.stderr)
        return 2
    if rendered == text:
        return 0
    if args.check:
        print(
            f"{args.file}: the permission tables differ from the providers' lists: run"
            f" {parser.prog} {args.file}",
            file=sys.stderr,
        )
        return 1
    args.file.write_text(rendered, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
