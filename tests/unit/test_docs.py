"""The docs site builds (``mkdocs build --strict``: no broken link, no page left out of
the nav), offline, and its generated reference pages list everything the code declares:
every command and option of the parser, every hookspec, every cloud's permissions,
every metric and every event. What each page must list is read here from the code
itself, not from the generator, so a generator that skips something fails."""

from __future__ import annotations

import argparse
import html
import inspect
import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from spotring.autoscaler import cli, hookspecs
from spotring.autoscaler.observers.events import EVENTS, EventLog
from spotring.autoscaler.observers.metrics import run_series
from spotring.autoscaler.plugins import get_plugin_manager, provider_registry
from spotring.core import (
    CapacityShortage,
    Instance,
    InstanceState,
    InterruptionNotice,
    Inventory,
    JobShape,
    Lifecycle,
    ShortageCause,
)
from spotring.core.prices import HourlyPrice
from spotring.driver.ring_progress import Hang, RingStatus, Stall
from spotring.providers import permissions
from tests.conftest import REPO
from tests.fakes.scripted import ScriptedProvider


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built as scripts/test.sh builds it."""
    out = tmp_path_factory.mktemp("site")
    build = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)],
        cwd=REPO,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert build.returncode == 0, build.stderr
    return out


def page(site: Path, name: str) -> str:
    return (site / name / "index.html").read_text(encoding="utf-8")


def section(text: str, anchor: str) -> str:
    """The HTML of the heading with id ``anchor`` up to the next heading of its level
    or above."""
    match = re.search(rf'<h([1-6]) id="{re.escape(anchor)}"', text)
    assert match is not None, f"no section #{anchor}"
    level = int(match.group(1))
    end = re.compile(rf"<h[1-{level}][ >]").search(text, match.end())
    return text[match.start() : end.start() if end else len(text)]


def code(name: str) -> str:
    return f"<code>{html.escape(name, quote=False)}</code>"


# ------------------------------------------------------------------- README


README_LIMIT = 200
"""README.md holds what a newcomer needs in the first five minutes; the rest is on the site."""


def test_the_readme_has_the_two_commands_and_ci_runs_its_test_command() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= README_LIMIT
    first_block = re.search(r"```bash\n(.*?)```", readme, re.DOTALL)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["scripts/demo.sh", "scripts/test.sh"]
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert ci[-1] == "exec scripts/test.sh", "CI runs the README's test command"


def test_the_readmes_links_reach_the_site_pages_and_their_sections(site: Path) -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\((docs/[^)#]+\.md)(?:#([^)]+))?\)", readme)
    assert len(links) > 10
    for source, anchor in links:
        assert (REPO / source).is_file(), source
        built = Path(source).relative_to("docs").with_suffix("")
        if not anchor:
            continue
        text = (site / built / "index.html").read_text(encoding="utf-8")
        assert f'id="{anchor}"' in text, f"{source}#{anchor}: no such section"
    own = re.findall(r"\]\(#([^)]+)\)", readme)
    headings = {
        re.sub(r"[^a-z0-9 -]", "", h.lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", readme, re.M)
    }
    assert set(own) <= headings, set(own) - headings


# ---------------------------------------------------------------------- CLI


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _names(actions: list[argparse.Action]) -> list[list[str]]:
    """Each documented argument's names: its option strings, or a positional's metavar."""
    return [
        list(action.option_strings) or [str(action.metavar or action.dest)]
        for action in actions
        if action.help is not argparse.SUPPRESS
        and not isinstance(action, argparse._HelpAction | argparse._SubParsersAction)
    ]


def expected_cli_sections() -> dict[str, list[list[str]]]:
    """Every argument of the parser, by the anchor of the page section that must list it."""
    parser = cli.build_parser()
    commands = _subcommands(parser)
    sections = {"spotring": _names(parser._actions)}
    sections |= {name: _names(command._actions) for name, command in commands.items()}
    plain = {(tuple(action.option_strings), action.dest) for action in commands["run"]._actions}
    pm = get_plugin_manager(load_entry_points=False)
    for provider in provider_registry(pm):
        run = _subcommands(cli.build_parser(pm, provider))["run"]
        added = [a for a in run._actions if (tuple(a.option_strings), a.dest) not in plain]
        sections[f"provider-{provider.name}"] = _names(added)
    return sections


def test_the_site_builds_strictly_and_offline(site: Path) -> None:
    home = page(site, ".")
    assert "fonts.googleapis.com" not in home and "fonts.gstatic.com" not in home


def test_every_command_and_option_is_on_the_cli_page(site: Path) -> None:
    text = page(site, "reference/cli")
    sections = expected_cli_sections()
    assert {"run", "discover", "report", "provider-aws", "provider-local"} <= sections.keys()
    for anchor, arguments in sections.items():
        body = section(text, anchor)
        for first, *aliases in arguments:
            assert f"<td>{code(first)}" in body, f"{first} is not in #{anchor}"
            for alias in aliases:
                assert code(alias) in body, f"{alias} is not in #{anchor}"


# -------------------------------------------------------------------- hooks


def test_every_hookspec_is_on_the_hooks_page_with_its_mode_and_parameters(site: Path) -> None:
    text = page(site, "reference/hooks")
    pm = get_plugin_manager(load_entry_points=False)
    specs = {
        name: spec
        for name, spec in inspect.getmembers(hookspecs, inspect.isfunction)
        if name.startswith("spotring_")
    }
    assert len(specs) > 20
    for name, spec in specs.items():
        body = re.sub(r"<[^>]+>", "", section(text, name))  # the signature is highlighted
        for parameter in inspect.signature(spec).parameters:
            assert f"{parameter}:" in body, f"{name}: {parameter} is missing"
        firstresult = getattr(pm.hook, name).spec.opts.get("firstresult")
        assert ("firstresult" in body) == bool(firstresult), name
        assert ("historic" in body) == bool(getattr(pm.hook, name).spec.opts.get("historic"))


# -------------------------------------------------------------- permissions


@pytest.mark.parametrize("cloud", sorted(permissions.MARKDOWN))
def test_each_clouds_permissions_are_on_the_permissions_page(site: Path, cloud: str) -> None:
    body = section(page(site, "reference/permissions"), cloud)
    table = permissions.permission_markdown(cloud)
    granted = re.findall(r"^\| `([^`]+)` \|", table, re.MULTILINE)
    assert granted
    for permission in granted:
        assert f"<td>{code(permission)}</td>" in body, f"{cloud}: {permission} is missing"


# ------------------------------------------------------------------ metrics


def test_every_metric_is_on_the_metrics_page(site: Path) -> None:
    text = page(site, "reference/metrics")
    families = list(run_series().registry.collect())
    assert len(families) > 10
    for family in families:
        exposed = f"{family.name}_total" if family.type == "counter" else family.name
        row = re.search(rf"<tr>\s*<td>{code(exposed)}</td>(.*?)</tr>", text, re.DOTALL)
        assert row is not None, f"{exposed} is missing"
        assert family.type in row.group(1) and html.escape(
            family.documentation, quote=False
        ) in row.group(1)
        labels = {label for sample in family.samples for label in sample.labels} - {"le"}
        assert all(code(label) in row.group(1) for label in labels), exposed


# ------------------------------------------------------------------- events


def test_every_event_and_field_is_on_the_events_page(site: Path) -> None:
    text = page(site, "reference/events")
    for name, kind in EVENTS.items():
        body = section(text, name)
        for field in kind.fields:
            assert f"<td>{code(field)}</td>" in body, f"{name}.{field} is missing"


def write_every_event(path: Path) -> list[dict]:
    """Every event the log hears, through the plugin manager as in a run; its lines."""
    log = EventLog(path)
    pm = get_plugin_manager(load_entry_points=False)
    pm.register(log)
    hook = pm.hook
    host = Instance("i-a", "a", InstanceState.READY, 2, Lifecycle.SPOT, "z", "t", group="spot")
    job = JobShape(num_proc=4, min_num_proc=2, max_num_proc=8)
    groups = [ScriptedProvider(), ScriptedProvider()]  # a job of several: `groups` written
    hook.spotring_job_started.call_historic(
        kwargs={"provider": groups[0], "job": job, "groups": groups}
    )
    listed = Inventory(instances=(host,), generation=1)
    hook.spotring_refreshed(inventory=listed, seconds=0.1, calls=1, error=None, target=1)
    hook.spotring_refreshed(inventory=Inventory(), seconds=0.1, calls=1, error=None, target=1)
    hook.spotring_refreshed(inventory=None, seconds=0.1, calls=None, error="boom", target=None)
    hook.spotring_inventory_changed(added=[host], removed=[], ready=[host])
    hook.spotring_host_noticed(
        instance=host, notice=InterruptionNotice("preempt", 1.0), draining=True
    )
    hook.spotring_host_failed(instance=host, reason="worker rank 0 exited with -9")
    logging.getLogger("spotring.providers.test").warning("the pool ran dry")
    hook.spotring_ring_formed(size=2, hosts=["a"])
    hook.spotring_ring_progress(status=RingStatus(1, 2, 10, 0.5, "a[0]"))
    hook.spotring_ring_stalled(stall=Stall(2, 1000.0, 1000.5))
    hook.spotring_ring_hung(hang=Hang(ring=2, host="a", local_rank=0, idle_s=30, member_idle_s=31))
    hook.spotring_ring_lost(
        size=2,
        why="every worker was killed",
        checkpoint={"commits": 5, "age_seconds": 1.0, "name": "c5"},
        lost={"commits": 1, "seconds": 0.5},
    )
    hook.spotring_capacity_shortage(
        group="spot", shortage=CapacityShortage(ShortageCause.CAPACITY, "Code", "no room", 1.0)
    )
    hook.spotring_fell_back(from_group="spot", to_group="od", hosts=1)
    hook.spotring_returned(instance=host, group="od", seconds=600.0)
    hook.spotring_group_demoted(group="spot", until=2000.0)
    hook.spotring_price_changed(
        group="spot", lifecycle=Lifecycle.SPOT, price=HourlyPrice(0.1, "--price", 1.0)
    )
    hook.spotring_deadline_decided(
        mode="catch-up", reason="behind", done=5, total=100, projected_finish=3000.0,
        slack_s=60.0, deadline=4000.0,
    )  # fmt: skip
    hook.spotring_job_finished(ok=True, exit_code=0, seconds=9.0, world_sizes=[2, 1])
    log.close()
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_declared_events_are_what_the_log_writes(tmp_path: Path) -> None:
    written: dict[str, set[str]] = {}
    for record in write_every_event(tmp_path / "events.jsonl"):
        assert {"v", "t", "event"} <= record.keys()
        fields = record.keys() - {"v", "t", "event"}
        declared = EVENTS.get(record["event"])
        assert declared is not None, f"{record['event']} is not declared in EVENTS"
        assert fields <= declared.fields.keys(), f"{record['event']}: undeclared {fields}"
        written.setdefault(record["event"], set()).update(fields)
    assert written.keys() == EVENTS.keys()
    for name, fields in written.items():
        assert fields == EVENTS[name].fields.keys(), f"{name}: declared but never written"
