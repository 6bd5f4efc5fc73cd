"""The floors: every import of spotring points down (or stays in its own package).

    plugin                      the one import for plugin authors, on top
    autoscaler                  the controller
    driver                      the Horovod side
    torch                       the training scripts' public import (TorchState)
    providers | worker_image    beside each other: neither imports the other
    checkpoint                  durable checkpoint storage (workers and driver use it)
    core                        shared value types and hook markers: imports no spotring

Every import statement counts, wherever it is: at module level, inside a function,
under ``if TYPE_CHECKING:``, relative or absolute, and ``importlib.import_module`` /
``__import__`` of a constant name. The test reads the source with ``ast``; it imports
nothing, so it needs neither torch nor Horovod.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

FLOORS: dict[str, int] = {
    "spotring.core": 0,
    "spotring.checkpoint": 1,
    "spotring.providers": 2,
    "spotring.worker_image": 2,
    "spotring.torch": 3,
    "spotring.driver": 4,
    "spotring.autoscaler": 5,
    "spotring.plugin": 6,
}
"""Each top-level package of spotring and its floor: a package imports only its own
modules and those of packages on lower floors."""

FOLDERS: dict[str, str] = {
    "spotring.core": "core",
    "spotring.checkpoint": "checkpoint",
    "spotring.providers": "providers",
    "spotring.worker_image": "worker_image",
    "spotring.torch": "torch_state",
    "spotring.driver": "driver",
    "spotring.autoscaler": "autoscaler",
    "spotring.plugin": "plugin",
}


def _modules(package: str) -> Iterator[tuple[str, Path]]:
    root = REPO / FOLDERS[package]
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        yield ".".join([package, *parts]), path


def _imports(module: str, path: Path) -> Iterator[tuple[int, str]]:
    """(line, imported name) of every import in ``path``, relative ones resolved.

    ``from a import b`` yields ``a.b`` (``b`` may be a module of ``a``)."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".")
                keep = len(parts) - node.level + (1 if is_package else 0)
                base = ".".join(parts[:keep] + ([base] if base else []))
            for alias in node.names:
                yield node.lineno, f"{base}.{alias.name}" if alias.name != "*" else base
        elif (
            isinstance(node, ast.Call)
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
            and (
                (isinstance(node.func, ast.Name) and node.func.id == "__import__")
                or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
                or (isinstance(node.func, ast.Name) and node.func.id == "import_module")
            )
        ):
            yield node.lineno, node.args[0].value


def _package_of(name: str) -> str | None:
    """The top-level spotring package ``name`` is in; None outside spotring."""
    parts = name.split(".")
    if parts[0] != "spotring":
        return None
    return ".".join(parts[:2])


def upward_imports(floors: dict[str, int] = FLOORS) -> list[str]:
    """Every import that leaves its package for one not below it, as
    ``file:line: importer -> imported`` lines."""
    found = []
    for package in floors:
        for module, path in _modules(package):
            for line, name in _imports(module, path):
                target = _package_of(name)
                if target is None or target == package:
                    continue
                where = f"{path.relative_to(REPO)}:{line}: {module} -> {name}"
                if target not in floors:
                    found.append(f"{where} (not a package of spotring's floors)")
                elif floors[target] >= floors[package]:
                    found.append(f"{where} (floor {floors[target]} from floor {floors[package]})")
    return found


def test_every_import_points_down() -> None:
    assert upward_imports() == []


def test_the_floors_are_every_package_of_the_distribution() -> None:
    tomllib = pytest.importorskip("tomllib")
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == FOLDERS
    assert {name.split(".")[0] + "." + name.split(".")[1] for name in config["packages"]} == set(
        FLOORS
    )


def test_core_imports_nothing_of_spotring() -> None:
    for module, path in _modules("spotring.core"):
        outside = [n for _, n in _imports(module, path) if n.split(".")[0] == "spotring"]
        assert all(_package_of(n) == "spotring.core" for n in outside), (module, outside)


def test_no_module_imports_itself_back() -> None:
    """No cycle between modules either: within a package the imports form a DAG."""
    modules = {m: p for package in FLOORS for m, p in _modules(package)}
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        edges = set()
        for _, name in _imports(module, path):
            # ``from pkg import mod`` names a module; ``from mod import Class`` does not.
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module and not module.startswith(name + "."):
                edges.add(name)
        graph[module] = edges
    done: set[str] = set()

    def visit(module: str, stack: list[str]) -> None:
        if module in stack:
            cycle = [*stack[stack.index(module) :], module]
            pytest.fail("import cycle: " + " -> ".join(cycle))
        if module in done:
            return
        for target in sorted(graph[module]):
            visit(target, [*stack, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


def test_an_upward_import_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk sees imports inside functions and under TYPE_CHECKING, and relative ones."""
    for folder in FOLDERS.values():
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "core" / "a.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n"
        "    from spotring.providers.base import Provider\n"
    )
    (tmp_path / "providers" / "b.py").write_text("def f():\n    import spotring.worker_image.x\n")
    (tmp_path / "driver" / "c.py").write_text("from ..autoscaler import controller\n")
    (tmp_path / "worker_image" / "d.py").write_text("from spotring.core import Instance\n")
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    found = upward_imports()
    assert [line.split(":")[0] for line in found] == [
        "core/a.py",
        "providers/b.py",
        "driver/c.py",
    ], found


def test_the_public_import_paths_still_work() -> None:
    """What users and plugin authors write keeps working after the move to core."""
    import spotring.core as core
    from spotring.autoscaler import hookimpl
    from spotring.autoscaler.plugins import ProviderRegistry
    from spotring.autoscaler.policy import JobShape
    from spotring.providers import base

    assert hookimpl is core.hookimpl
    assert JobShape is core.JobShape
    assert ProviderRegistry is base.ProviderRegistry
    for name in ("Instance", "InstanceState", "InterruptionNotice", "ProviderError"):
        assert getattr(base, name) is getattr(core, name)


@pytest.mark.parametrize(
    ("old", "new", "names"),
    [
        ("cli", "cli.entry", ["main"]),  # the console script: spotring.autoscaler.cli:main
        ("cli", "cli.parser", ["build_parser"]),
        ("cli", "cli.parsing", ["parse"]),
        ("cli", "cli.options", ["core_options", "make_groups", "make_provider"]),
        ("cli", "cli.run", ["DEFAULT_REFRESH_INTERVAL"]),
        ("cli", "cli.usage", ["PROG", "UsageError"]),
        ("check", "cli.check", ["Finding", "check_provider", "run_check"]),
        ("events", "observers.events", ["EVENTS", "VERSION", "EventLog"]),
        ("metrics", "observers.metrics", ["Metrics"]),
        ("progress", "observers.progress", ["ProgressReporter"]),
        ("report", "observers.report", ["ReportError", "read_events", "write_report"]),
        ("plugins", "plugins.manager", ["get_plugin_manager", "provider_registry"]),
        ("plugins", "plugins.builtins", ["BUILTIN_PLUGINS"]),
        ("policy", "plugins.policy", ["JobShape", "size_bounds", "spotring_target_size"]),
    ],
)
def test_the_old_module_paths_still_work(old: str, new: str, names: list[str]) -> None:
    """The autoscaler's rooms moved modules; their old paths re-export the same objects."""
    import importlib

    moved = importlib.import_module(f"spotring.autoscaler.{old}")
    home = importlib.import_module(f"spotring.autoscaler.{new}")
    for name in names:
        assert getattr(moved, name) is getattr(home, name), f"{old}.{name}"


def test_torch_state_has_a_short_public_import() -> None:
    pytest.importorskip("horovod.torch")
    from spotring.driver.state import TorchState as old_path
    from spotring.torch import TorchState
    from spotring.worker_image.state import TorchState as home

    assert TorchState is old_path is home
