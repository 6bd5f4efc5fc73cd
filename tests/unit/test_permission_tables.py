"""The docs' permission tables are made from the providers' own lists
(spotring.providers.permissions; the reference page writes them at build time, and
tests/unit/test_docs.py checks they are on it), so they cannot drift."""

from __future__ import annotations

import json
import re

import pytest

from spotring.providers import aws, azure, gcp, permissions


def test_each_table_names_every_permission_and_the_calls_that_need_it() -> None:
    for markdown, by_call in [
        (permissions.aws_markdown(), aws.IAM_ACTION_BY_OPERATION),
        (permissions.gcp_markdown(), gcp.PERMISSION_BY_CALL),
        (permissions.azure_markdown(), azure.ACTION_BY_CALL),
    ]:
        rows = {
            m.group(1): m.group(2)
            for m in re.finditer(r"^\| `([^`]+)` \| ([^|]+) \|", markdown, re.MULTILINE)
        }
        assert rows.keys() == set(by_call.values())
        for call, permission in by_call.items():
            assert f"`{call}`" in rows[permission]


def test_the_aws_policy_is_iam_policy_and_only_steering_takes_the_group() -> None:
    markdown = permissions.aws_markdown()
    block = re.search(r"```json\n(.*?)```", markdown, re.DOTALL)
    assert block is not None
    assert json.loads(block.group(1)) == aws.iam_policy(permissions.AWS_GROUP_ARN)
    scoped = re.findall(r"^\| `([^`]+)` \|[^|]+\| the group's ARN \|$", markdown, re.MULTILINE)
    assert scoped == list(aws.IAM_STEERING_ACTIONS)


def test_a_changed_list_changes_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    grown = {**gcp.PERMISSION_BY_CALL, "instances.get": "compute.instances.get"}
    monkeypatch.setattr(gcp.permissions, "PERMISSION_BY_CALL", grown)
    assert "| `compute.instances.get` | `instances.get` |" in permissions.permission_markdown("gcp")
