"""The site's reference pages, made from the code at build time so that they cannot drift.

An MkDocs hook (``hooks:`` in mkdocs.yml): :func:`on_files` adds one generated page per
entry of :data:`PAGES`. Each page comes from what the code itself declares:

* ``reference/cli.md``: every command and option of ``spotring``, from its argparse
  parser, each built-in provider's options included (they come from a hook);
* ``reference/hooks.md``: every ``spotring_*`` hookspec: signature, calling mode and
  docstring, grouped by the banners of ``spotring.autoscaler.hookspecs``;
* ``reference/permissions.md``: each cloud's permissions, from the providers' own lists;
* ``reference/metrics.md``: every series of the run's Prometheus registry;
* ``reference/events.md``: every event of the events file, from ``events.EVENTS``.

Nothing generated is committed; ``tests/unit/test_docs.py`` builds the site and checks that
each page lists everything its source declares.
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import NamedTuple

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

from spotring.autoscaler import cli, hookspecs
from spotring.autoscaler.observers import events
from spotring.autoscaler.observers.metrics import run_series
from spotring.autoscaler.plugins import get_plugin_manager, provider_registry
from spotring.providers import permissions

# ------------------------------------------------------------------ Markdown


def _cell(text: object) -> str:
    """``text`` on one line, its pipes escaped for a Markdown table (those in code spans
    need no escape there: Python-Markdown's tables do not split on them)."""
    parts = re.split(r"(`[^`]*`)", " ".join(str(text).split()))
    return "".join(p if p.startswith("`") else p.replace("|", r"\|") for p in parts)


def _table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(value) for value in row) + " |" for row in rows]
    return [*lines, ""]


def _rst_to_markdown(text: str) -> str:
    """A hookspec's docstring (reStructuredText) in Markdown: literals and roles become
    code spans, the ``:param NAME:`` and ``:return:`` fields a list."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    text = re.sub(r"``(.+?)``", r"`\1`", text, flags=re.DOTALL)
    lines: list[str] = []
    for line in text.splitlines():
        field = re.match(r":param (\w+):\s*(.*)|:returns?:\s*(.*)", line)
        if field is None and line.startswith(" ") and lines:
            lines[-1] += " " + line.strip()  # a field's or a bullet's next line
        elif field is None:
            lines.append(line)
        elif field.group(1):
            lines.append(f"* `{field.group(1)}`: {field.group(2)}")
        else:
            lines.append(f"* returns: {field.group(3)}")
    return "\n".join(lines)


# ----------------------------------------------------------------------- CLI


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    # argparse offers no public way to walk a parser; its actions are what it documents.
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _documented(action: argparse.Action) -> bool:
    return action.help is not argparse.SUPPRESS and not isinstance(
        action, argparse._HelpAction | argparse._SubParsersAction
    )


def _names(action: argparse.Action) -> list[str]:
    """How the page names an argument: its option strings, or a positional's metavar."""
    if action.option_strings:
        return list(action.option_strings)
    return [str(action.metavar or action.dest)]


def _default(action: argparse.Action) -> str:
    default = action.default
    if not action.option_strings or default in (None, argparse.SUPPRESS, []) or default is False:
        return ""
    if default == sys.executable:
        return "this Python (`sys.executable`)"  # not the path of the machine that built it
    return f"`{default}`"


def _help(prog: str, action: argparse.Action) -> str:
    # argparse's own expansion of %(default)s and the like.
    text = argparse.HelpFormatter(prog)._expand_help(action) if action.help else ""
    return text.replace(sys.executable, "`sys.executable`")


def _value(action: argparse.Action) -> str:
    if action.nargs == 0 or not action.option_strings:  # a positional is named by its value
        return ""
    if action.choices is not None:
        return " | ".join(f"`{choice}`" for choice in action.choices)
    metavar = action.metavar or action.dest.upper()
    return " ".join(f"`{m}`" for m in (metavar if isinstance(metavar, tuple) else [metavar]))


def _options_table(prog: str, actions: Iterable[argparse.Action]) -> list[str]:
    rows = [
        (
            ", ".join(f"`{name}`" for name in _names(action)),
            _value(action),
            _default(action),
            _help(prog, action) + (" (required)" if action.required else ""),
        )
        for action in actions
    ]
    return _table(["option", "value", "default", "what it does"], rows)


class Section(NamedTuple):
    """One part of the CLI page: a command, or a provider's options."""

    anchor: str
    title: str
    description: str
    groups: list[tuple[str, list[argparse.Action]]]
    """The argument groups that hold a documented action: (title, those actions)."""


def _groups(parser: argparse.ArgumentParser) -> list[tuple[str, list[argparse.Action]]]:
    groups = []
    for group in parser._action_groups:
        actions = [action for action in group._group_actions if _documented(action)]
        if actions:
            groups.append((str(group.title), actions))
    return groups


def command_sections() -> list[Section]:
    """``spotring`` and each of its commands, with their own options."""
    parser = cli.build_parser()
    sections = [Section("spotring", "spotring", parser.description or "", _groups(parser))]
    for name, command in _subcommands(parser).items():
        sections.append(
            Section(name, f"spotring {name}", command.description or "", _groups(command))
        )
    return sections


def provider_sections() -> list[Section]:
    """Each built-in provider (no installed plugin's) with the options it adds to
    ``spotring run`` and ``spotring discover``: the groups its parser has beyond the
    plain one's."""
    pm = get_plugin_manager(load_entry_points=False)
    plain = {title for title, _ in _groups(_subcommands(cli.build_parser())["run"])}
    sections = []
    for provider in provider_registry(pm):
        run = _subcommands(cli.build_parser(pm, provider))["run"]
        added = [(title, actions) for title, actions in _groups(run) if title not in plain]
        name = provider.name
        about = f"{provider.description[:1].upper()}{provider.description[1:]}."
        sections.append(Section(f"provider-{name}", f"--provider {name}", about, added))
    return sections


def cli_markdown() -> str:
    """Every command and option of ``spotring``, each built-in provider's included."""
    lines = [
        "# Command line",
        "",
        "Generated from `spotring`'s own parser (`spotring.autoscaler.cli.build_parser`).",
        "`spotring COMMAND --help` prints the same; `spotring run --provider NAME --help`",
        "adds that provider's options ([below](#provider-options)).",
        "",
    ]
    for section in command_sections():
        lines += [f"## {section.title} {{#{section.anchor}}}", "", section.description, ""]
        for title, actions in section.groups:
            lines += [f"**{title}**", ""]
            lines += _options_table(section.title, actions)
    lines += [
        "## Provider options {#provider-options}",
        "",
        "Each provider adds options of its own to `spotring run` and `spotring discover`,",
        "after `--provider NAME` (through the `spotring_add_provider_options` hook).",
        "",
    ]
    for section in provider_sections():
        lines += [f"### {section.title} {{#{section.anchor}}}", "", section.description, ""]
        for _, actions in section.groups:
            lines += _options_table(f"{cli.PROG} run", actions)
    return "\n".join(lines)


# --------------------------------------------------------------------- hooks


def _hookspecs() -> dict[str, Callable[..., object]]:
    """Every hookspec, by name, in the order the module declares them."""
    return {
        name: spec
        for name, spec in vars(hookspecs).items()
        if name.startswith("spotring_") and inspect.isfunction(spec)
    }


def _hook_sections() -> dict[str, str]:
    """Each hook's stage: the banner comment (``# ---- stage``) above it in the module."""
    stage, stages = "", {}
    for line in inspect.getsource(hookspecs).splitlines():
        banner = re.match(r"# -{4,}\s*(.+?)\s*$", line)
        hook = re.match(r"def (spotring_\w+)\(", line)
        if banner:
            stage = banner.group(1)
        elif hook:
            stages[hook.group(1)] = stage
    return stages


def _signature(name: str, spec: Callable[..., object]) -> str:
    # The annotations are the module's strings (postponed evaluation): shown as written.
    signature = inspect.signature(spec)
    params = ", ".join(
        f"{p.name}: {p.annotation}" if p.annotation is not p.empty else p.name
        for p in signature.parameters.values()
    )
    return f"def {name}({params}) -> {signature.return_annotation}"


def _calling_mode(opts: Mapping[str, object], spec: Callable[..., object]) -> str:
    """How the plugin manager calls a hook, from its spec's options."""
    if opts.get("firstresult"):
        return "decision (`firstresult`): stops at the first non-None result"
    if hookspecs.is_event(spec):
        historic = ", `historic`: a plugin registered later hears it then"
        return f"event{historic if opts.get('historic') else ''}; isolated, results ignored"
    return "every implementation is called; an error reaches the caller"


def hooks_markdown() -> str:
    """Every hookspec: its signature, calling mode and docstring, by stage."""
    lines = [
        "# Hooks",
        "",
        "Generated from `spotring.autoscaler.hookspecs`; see also",
        "[Writing a provider plugin](../plugins.md).",
        "",
        _rst_to_markdown(inspect.cleandoc(hookspecs.__doc__ or "").split("\n\n", 1)[1]),
        "",
    ]
    hook = get_plugin_manager(load_entry_points=False).hook
    stages = _hook_sections()
    stage = None
    for name, spec in _hookspecs().items():
        if stages.get(name) != stage:
            stage = stages.get(name)
            lines += [f"## {str(stage).capitalize()}", ""]
        lines += [
            f"### {name} {{#{name}}}",
            "",
            "```python",
            _signature(name, spec),
            "```",
            "",
            f"*{_calling_mode(getattr(hook, name).spec.opts, spec)}*",
            "",
            _rst_to_markdown(inspect.cleandoc(spec.__doc__ or "")),
            "",
        ]
    return "\n".join(lines)


# --------------------------------------------------------------- permissions

CLOUD_TITLES: Mapping[str, str] = {"aws": "AWS", "gcp": "GCP", "azure": "Azure"}


def permissions_markdown() -> str:
    """Each cloud's permissions, from the providers' own lists."""
    lines = [
        "# Cloud permissions",
        "",
        "Exactly what each cloud provider calls, and the permission each call needs,",
        "generated from the provider's own list (`spotring.providers.permissions`).",
        "Each cloud's page says how to grant them.",
        "",
    ]
    for cloud in permissions.MARKDOWN:
        title = CLOUD_TITLES.get(cloud, cloud)
        lines += [
            f"## {title} {{#{cloud}}}",
            "",
            f"[How to grant them](../providers/{cloud}.md).",
            "",
            permissions.permission_markdown(cloud),
        ]
    return "\n".join(lines)


# ------------------------------------------------------------------- metrics


def _metric_rows() -> list[tuple[str, str, str, tuple[str, ...]]]:
    """``(name as exposed, type, help, labels)`` of every series of the run's registry."""
    rows = []
    for collector in run_series().collectors():  # built as a run builds them, unserved
        family = next(iter(collector.describe()))
        exposed = f"{family.name}_total" if family.type == "counter" else family.name
        # prometheus_client keeps a series' label names only here.
        labels = tuple(collector._labelnames)
        rows.append((exposed, family.type, family.documentation, labels))
    return rows


def metrics_markdown() -> str:
    """Every Prometheus series ``spotring run --metrics-port`` serves."""
    lines = [
        "# Metrics",
        "",
        "Served by `spotring run --metrics-port PORT` (on `--metrics-addr`, default",
        "127.0.0.1) while the job runs; generated from the run's Prometheus registry",
        "(`spotring.autoscaler.observers.metrics.run_series`). A histogram also has",
        "`_bucket`, `_sum` and `_count` series, a counter a `_created` one.",
        "",
    ]
    rows = [
        (f"`{name}`", kind, ", ".join(f"`{label}`" for label in labels), text)
        for name, kind, text, labels in _metric_rows()
    ]
    return "\n".join(lines + _table(["series", "type", "labels", "what it counts"], rows))


# -------------------------------------------------------------------- events


def events_markdown() -> str:
    """Every event of the events file and its fields."""
    lines = [
        "# Events",
        "",
        "`spotring run --events FILE` appends one JSON object per line, line-buffered (a",
        "crash loses at most the line being written); `spotring report FILE` draws it.",
        f"Every line has `v` (the format's version, now {events.VERSION}: a new field does",
        "not change it, a changed or removed one does), `t` (epoch seconds) and `event`,",
        "one of those below. Generated from `spotring.autoscaler.observers.events.EVENTS`.",
        "",
    ]
    for name, kind in events.EVENTS.items():
        lines += [f"## {name} {{#{name}}}", "", f"{kind.when[:1].upper()}{kind.when[1:]}.", ""]
        lines += _table(["field", "holds"], ((f"`{f}`", text) for f, text in kind.fields.items()))
    return "\n".join(lines)


# ---------------------------------------------------------------- the hook

PAGES: Mapping[str, Callable[[], str]] = {
    "reference/cli.md": cli_markdown,
    "reference/hooks.md": hooks_markdown,
    "reference/permissions.md": permissions_markdown,
    "reference/metrics.md": metrics_markdown,
    "reference/events.md": events_markdown,
}
"""Each generated page, by its path under docs/."""


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """MkDocs' hook: add the generated reference pages to the site's files."""
    for path, render in PAGES.items():
        files.append(File.generated(config, path, content=render()))
    return files
