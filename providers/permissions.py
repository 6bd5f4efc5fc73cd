"""The cloud permission tables of the docs, made from each provider's own list.

Each cloud provider keeps one mapping from the API calls it makes to the permission each
needs (``IAM_ACTION_BY_OPERATION`` in :mod:`spotring.providers.aws`,
``PERMISSION_BY_CALL`` in :mod:`spotring.providers.gcp`, ``ACTION_BY_CALL`` in
:mod:`spotring.providers.azure`). :func:`permission_markdown` turns one into Markdown
(for AWS with the least-privilege policy document of
:func:`spotring.providers.aws.iam_policy`); the docs site's generated reference page
(``docs/gen_reference.py``) writes each cloud's at build time, so the tables cannot
drift from the code.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence

from spotring.providers import azure
from spotring.providers.aws import permissions as aws
from spotring.providers.gcp import permissions as gcp

AWS_GROUP_ARN = (
    "arn:aws:autoscaling:REGION:ACCOUNT_ID:autoScalingGroup:*:autoScalingGroupName/GROUP"
)
"""The group ARN the docs' AWS policy shows, for the reader to fill in."""


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
