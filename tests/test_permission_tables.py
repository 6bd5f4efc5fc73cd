"""The README's permission tables are made from the providers' own lists
(spotring.providers.permissions), so they cannot drift."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from spotring.providers import aws, azure, gcp, permissions

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_readme_tables_are_the_providers_lists() -> None:
    text = README.read_text(encoding="utf-8")
    assert permissions.render(text) == text, (
        "README.md's permission tables are stale: run python -m spotring.providers.permissions"
    )


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
    text = README.read_text(encoding="utf-8")
    grown = {**gcp.PERMISSION_BY_CALL, "instances.get": "compute.instances.get"}
    monkeypatch.setattr(gcp.permissions, "PERMISSION_BY_CALL", grown)
    assert "| `compute.instances.get` | `instances.get` |" in permissions.render(text)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("no markers at all\n", "expected one pair of permissions:aws markers, found 0"),
        (
            "<!-- permissions:aws -->\n<!-- /permissions:aws -->\n" * 2,
            "expected one pair of permissions:aws markers, found 2",
        ),
        ("<!-- permissions:ibm -->\n<!-- /permissions:ibm -->\n", "for no known cloud: ibm"),
    ],
)
def test_markers_missing_or_wrong_are_refused(text: str, problem: str) -> None:
    with pytest.raises(ValueError, match=re.escape(problem)):
        permissions.render(text)


def test_the_command_writes_checks_and_refuses_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = "".join(
        f"# {cloud}\n<!-- permissions:{cloud} -->\n| old |\n<!-- /permissions:{cloud} -->\n"
        for cloud in permissions.MARKDOWN
    )
    page = tmp_path / "page.md"
    page.write_text(stale)

    assert permissions.main(["--check", str(page)]) == 1
    assert page.read_text() == stale, "--check changes nothing"
    assert permissions.main([str(page)]) == 0
    assert permissions.main(["--check", str(page)]) == 0
    assert "| old |" not in page.read_text() and "`compute.instances.list`" in page.read_text()

    capsys.readouterr()
    assert permissions.main([str(tmp_path / "missing.md")]) == 2
    (tmp_path / "bare.md").write_text("nothing here\n")
    assert permissions.main([str(tmp_path / "bare.md")]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 2 and all("Traceback" not in line for line in errors)
