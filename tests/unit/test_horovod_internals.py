"""Horovod's internals are touched in one module per side, and each one is checked.

spotring relies on private attributes of Horovod 0.28.1 and replaces some of its
methods. Every such use is a function of :mod:`spotring.driver.horovod_internals`
(the driver side) or :mod:`spotring.worker_image.horovod_internals` (the worker side),
whose ``INTERNALS`` tables :mod:`spotring.driver.compat` checks before a run. This test
reads the product's source with ``ast`` (as ``tests/unit/test_layers.py`` does) and fails
when:

* a module other than those two reaches a private attribute that is Horovod's: on an
  object of unknown type (``x._name``, ``getattr(x, "_name")``) one whose name Horovod's
  source uses or spotring's own classes do not define; on ``self`` in a class derived
  from one of Horovod's, one that Horovod's class knows; or a private method of
  Horovod's class overridden in such a class;
* a module other than those two assigns to an attribute of a Horovod module or class it
  imported (``mpi_ops.init = ...``);
* one of the two touches a private attribute its ``INTERNALS`` does not list;
* an ``INTERNALS`` entry is missing from the installed Horovod, or compat's list is not
  the two tables.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]

INTERNALS_MODULES = ("driver/horovod_internals.py", "worker_image/horovod_internals.py")
"""The two modules allowed to touch Horovod's internals (paths relative to the repo)."""

NOT_HOROVOD: dict[str, str] = {
    "_exit": "os._exit: the documented way to end a process without cleanup",
    "_ArgumentGroup": "argparse's type of add_argument_group's result, for annotations",
    "_group_actions": "argparse: the options of a group, to name them (autoscaler/cli.py)",
    "_foreach_copy_": "torch's fused copy of many tensors (worker_image/state.py)",
    "_set_pg_timeout": "torch.distributed's setter of a formed group's timeout: the in-place "
    "group connects under a short one, then takes the collectives' (torch_state/inplace.py)",
    "_world": "torch.distributed's registry: its group_count reset after a failed "
    "init_process_group, as destroy_process_group resets it (torch_state/inplace.py)",
    "_sock": "socket.SocketIO._sock: the socket under a buffered reader, for its timeout",
    "_metadata": "torch's state_dict() keeps each module's version there; a checkpoint keeps "
    "it (checkpoint/payload.py)",
    "_http": "google.cloud Client._http, the requests session its calls go through: the "
    "storage library hands back no answer's headers, and a lock's age is read from the "
    "store's Date there (checkpoint/gcs.py)",
    **dict.fromkeys(
        ("_asdict", "_fields", "_make", "_replace"),
        "a named tuple's public API (collections.namedtuple, urllib.parse's results)",
    ),
}
"""Private attributes of other libraries that spotring uses on purpose, and why."""


_PACKAGE_DIR = re.compile(r'^"spotring\.[a-z_]+" = "([a-z_]+)"$', re.MULTILINE)


def _folders(repo: Path) -> list[str]:
    """The product's folders, as pyproject.toml's package-dir maps spotring's packages
    to them (read as scripts/test.sh reads it: Python 3.10 has no TOML reader)."""
    folders = sorted(set(_PACKAGE_DIR.findall((repo / "pyproject.toml").read_text())))
    assert folders, "no package-dir in pyproject.toml"
    return folders


def _product(repo: Path) -> Iterator[tuple[str, ast.Module]]:
    for folder in _folders(repo):
        for path in sorted((repo / folder).rglob("*.py")):
            yield path.relative_to(repo).as_posix(), ast.parse(path.read_text(), str(path))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _horovod_names() -> frozenset[str]:
    """Every private name Horovod's source defines or reaches (read, not imported)."""
    spec = importlib.util.find_spec("horovod")
    assert spec is not None and spec.submodule_search_locations
    names = set()
    for root in spec.submodule_search_locations:
        for path in Path(root).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_bytes())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    names.add(node.name)
                elif isinstance(node, ast.Attribute):
                    names.add(node.attr)
                elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    names.add(node.id)
    return frozenset(filter(_private, names))


def _horovod_imports(tree: ast.Module) -> dict[str, str]:
    """Local name -> the Horovod module or object it is bound to, for every import of
    Horovod in ``tree`` (wherever it is)."""
    bound = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "horovod":
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:
                        bound["horovod"] = "horovod"
        elif (
            isinstance(node, ast.ImportFrom)
            and not node.level
            and node.module
            and node.module.split(".")[0] == "horovod"
        ):
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return bound


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return None if base is None else f"{base}.{node.attr}"
    return None


def _resolve(dotted: str) -> object:
    """The Horovod object named ``dotted`` (a module, or an attribute path in one)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for part in parts[cut:]:
            found = getattr(found, part)
        return found
    raise ImportError(dotted)


@dataclass
class _Class:
    path: str
    node: ast.ClassDef
    imports: dict[str, str]
    horovod_bases: list[type] = field(default_factory=list)


def _classes(trees: list[tuple[str, ast.Module]]) -> dict[int, _Class]:
    """Every class of the product (by id of its node), with the Horovod classes it
    derives from, directly or through spotring's own classes."""
    classes: dict[int, _Class] = {}
    by_name: dict[str, list[_Class]] = {}
    for path, tree in trees:
        imports = _horovod_imports(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                found = _Class(path, node, imports)
                classes[id(node)] = found
                by_name.setdefault(node.name, []).append(found)

    def horovod_bases(cls: _Class, seen: frozenset[int]) -> list[type]:
        bases = []
        for base in cls.node.bases:
            dotted = _dotted(base)
            if dotted is None:
                continue
            root, _, rest = dotted.partition(".")
            if root in cls.imports:
                target = cls.imports[root] + ("." + rest if rest else "")
                resolved = _resolve(target)
                if isinstance(resolved, type):
                    bases.append(resolved)
            elif not rest:
                for own in by_name.get(root, []):
                    if id(own.node) not in seen:
                        bases += horovod_bases(own, seen | {id(own.node)})
        return bases

    for cls in classes.values():
        cls.horovod_bases = horovod_bases(cls, frozenset({id(cls.node)}))
    return classes


def _knows(classes: list[type], name: str) -> bool:
    """Whether one of Horovod's ``classes`` (or a Horovod class they derive from) has
    ``name``, or uses it in one of its methods (an attribute it sets there)."""
    for cls in classes:
        for owner in cls.__mro__:
            if not owner.__module__.startswith("horovod"):
                continue
            if name in vars(owner):
                return True
            for value in vars(owner).values():
                for function in (
                    value,
                    getattr(value, "__func__", None),
                    getattr(value, "fget", None),
                    getattr(value, "fset", None),
                ):
                    code = getattr(function, "__code__", None)
                    if code is not None and name in code.co_names:
                        return True
    return False


def _spotring_owned(trees: list[tuple[str, ast.Module]], classes: dict[int, _Class]) -> set[str]:
    """Private names spotring's own classes define (methods, class attributes, what
    their methods set on ``self``); markers spotring sets are named ``_spotring...``."""
    owned = set()
    for cls in classes.values():
        if cls.horovod_bases:
            continue
        for node in ast.walk(cls.node):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                owned.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                owned.add(node.id)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in _selves(cls.node)
            ):
                owned.add(node.attr)
    return {name for name in owned if _private(name)}


def _spotring_marker(name: str) -> bool:
    """Whether ``name`` is one of spotring's markers (on functions it made)."""
    return name.startswith("_spotring")


def _selves(cls: ast.ClassDef) -> set[str]:
    """The names its methods call the instance (or class) by: ``self``, ``cls``, and
    any name given ``self`` (``hooks = self``, for the functions a method makes)."""
    selves = {"self", "cls"}
    for node in ast.walk(cls):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            selves.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return selves


def _accesses(tree: ast.Module) -> Iterator[tuple[ast.AST, ast.expr, str, ast.ClassDef | None]]:
    """(node, receiver, attribute, innermost class) of every attribute access in
    ``tree``: ``x.name`` and ``getattr``/``setattr``/``hasattr``/``delattr(x, "name")``."""

    def walk(node: ast.AST, cls: ast.ClassDef | None) -> Iterator[Any]:
        for child in ast.iter_child_nodes(node):
            inner = child if isinstance(child, ast.ClassDef) else cls
            if isinstance(child, ast.Attribute):
                yield child, child.value, child.attr, cls
            elif (
                isinstance(child, ast.Call)
                and isinstance(child.func, ast.Name)
                and child.func.id in ("getattr", "setattr", "hasattr", "delattr")
                and len(child.args) >= 2
                and isinstance(child.args[1], ast.Constant)
                and isinstance(child.args[1].value, str)
            ):
                yield child, child.args[0], child.args[1].value, cls
            yield from walk(child, inner)

    yield from walk(tree, None)


def private_uses(repo: Path = REPO) -> list[str]:
    """Every use of Horovod's internals outside the two internals modules, as
    ``path:line: what (why)`` lines."""
    everything = list(_product(repo))
    trees = [(path, tree) for path, tree in everything if path not in INTERNALS_MODULES]
    classes = _classes(everything)
    owned = _spotring_owned(everything, classes)
    horovod_names = _horovod_names()
    found = []
    for path, tree in trees:
        imports = _horovod_imports(tree)
        for node, receiver, name, cls_node in _accesses(tree):
            where = f"{path}:{getattr(node, 'lineno', 0)}: {ast.unparse(node)[:80]}"
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(receiver, ast.Name)
                and receiver.id in imports
            ):
                found.append(f"{where} (assigns to Horovod's {imports[receiver.id]})")
                continue
            if not _private(name) or name in NOT_HOROVOD or _spotring_marker(name):
                continue
            cls = classes.get(id(cls_node)) if cls_node is not None else None
            if cls and isinstance(receiver, ast.Name) and receiver.id in _selves(cls.node):
                if cls.horovod_bases and _knows(cls.horovod_bases, name):
                    found.append(f"{where} (Horovod's {cls.horovod_bases[0].__name__}.{name})")
            elif name in horovod_names or name not in owned:
                found.append(f"{where} (not an attribute of spotring's own)")
        for cls in (classes[id(n)] for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            if not cls.horovod_bases:
                continue
            for statement in cls.node.body:
                defined = []
                if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    defined = [statement.name]
                elif isinstance(statement, (ast.Assign, ast.AnnAssign)):
                    if isinstance(statement, ast.Assign):
                        targets = statement.targets
                    else:
                        targets = [statement.target]
                    defined = [t.id for t in targets if isinstance(t, ast.Name)]
                for name in defined:
                    if _private(name) and _knows(cls.horovod_bases, name):
                        found.append(
                            f"{path}:{statement.lineno}: {cls.node.name}.{name} (overrides "
                            f"Horovod's {cls.horovod_bases[0].__name__}.{name})"
                        )
    return found


def _internals_table(path: Path) -> tuple[tuple[str, str], ...]:
    """The ``INTERNALS`` of the module at ``path`` (it imports nothing but the
    standard library, so it loads from anywhere)."""
    spec = importlib.util.spec_from_file_location(f"_internals_of_{path.parent.name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    table: tuple[tuple[str, str], ...] = module.INTERNALS
    return table


def unlisted_internals(repo: Path = REPO) -> list[str]:
    """The private attributes an internals module touches that its ``INTERNALS`` does
    not list, as ``path:line: what`` lines."""
    found = []
    for module in INTERNALS_MODULES:
        path = repo / module
        listed = {attribute for _, attribute in _internals_table(path)}
        for node, _receiver, name, _cls in _accesses(ast.parse(path.read_text())):
            if _private(name) and name not in listed:
                where = f"{module}:{getattr(node, 'lineno', 0)}: {ast.unparse(node)[:80]}"
                found.append(f"{where} (not in its INTERNALS)")
    return found


def _internals_modules() -> tuple[ModuleType, ModuleType]:
    from spotring.driver import horovod_internals as driver_side
    from spotring.worker_image import horovod_internals as worker_side

    return driver_side, worker_side


# ------------------------------------------------------------- the tests


def test_no_module_but_the_two_touches_horovods_internals() -> None:
    pytest.importorskip("horovod.torch")
    assert private_uses() == []


def test_the_internals_modules_list_every_private_attribute_they_touch() -> None:
    assert unlisted_internals() == []


def test_compat_checks_exactly_the_two_tables() -> None:
    from spotring.driver import compat

    driver_side, worker_side = _internals_modules()
    both = (*driver_side.INTERNALS, *worker_side.INTERNALS)
    assert both == compat.PATCHED_INTERNALS
    assert len(set(compat.PATCHED_INTERNALS)) == len(compat.PATCHED_INTERNALS)
    for module in INTERNALS_MODULES:
        assert _internals_table(REPO / module) in (driver_side.INTERNALS, worker_side.INTERNALS)


def test_every_listed_internal_exists_in_the_installed_horovod() -> None:
    pytest.importorskip("horovod.torch")
    from spotring.driver.compat import missing_internals

    for module in _internals_modules():
        assert missing_internals(module.INTERNALS) == [], module.__name__


def test_the_internals_modules_import_neither_horovod_nor_torch() -> None:
    """compat imports both tables, and ``spotring --help`` imports compat."""
    code = (
        "import sys\n"
        "import spotring.driver.compat\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('horovod', 'torch')))\n"
    )
    import subprocess

    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.strip() == "[]"


def test_an_unchecked_use_is_found(tmp_path: Path) -> None:
    """The walk finds each kind of use: outside the internals modules, and unlisted in
    one."""
    pytest.importorskip("horovod.torch")
    (tmp_path / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    for folder in _folders(REPO):
        (tmp_path / folder).mkdir()
    for module in INTERNALS_MODULES:
        (tmp_path / module).write_text((REPO / module).read_text())
    (tmp_path / "driver" / "uses.py").write_text(
        "from horovod.runner.common.util.network import BasicClient\n"
        "from horovod.runner.http.http_server import RendezvousServer\n"
        "import horovod.torch.mpi_ops as mpi_ops\n"
        "\n"
        "class Own:\n"
        "    def __init__(self):\n"
        "        self._mine = 1\n"
        "\n"
        "class Tracker(RendezvousServer):\n"
        "    def start(self):\n"
        "        self._ours = 1\n"  # not Horovod's: fine
        "        return self._httpd\n"  # Horovod's attribute
        "\n"
        "class Client(BasicClient):\n"
        "    def _probe(self, addresses):\n"  # overrides a private method
        "        return {}\n"
        "\n"
        "def f(driver, own):\n"
        "    own._mine\n"  # spotring's own: fine
        "    driver._wait_hosts_cond\n"  # Horovod's
        "    getattr(driver, '_host_manager', None)\n"  # Horovod's, as a string
        "    driver._no_such_thing\n"  # nobody's in spotring
        "    mpi_ops.init = None\n"  # a public name of Horovod's, replaced
    )
    with (tmp_path / "worker_image" / "horovod_internals.py").open("a") as module:
        module.write("\n\ndef unlisted(state):\n    return state._rank\n")
    found = private_uses(tmp_path)
    assert [line.split(": ", 1)[1].split(" (")[0] for line in found] == [
        "self._httpd",
        "driver._wait_hosts_cond",
        "getattr(driver, '_host_manager', None)",
        "driver._no_such_thing",
        "mpi_ops.init",
        "Client._probe",
    ], found
    assert unlisted_internals(tmp_path) == [
        "worker_image/horovod_internals.py:"
        f"{len((tmp_path / 'worker_image/horovod_internals.py').read_text().splitlines())}: "
        "state._rank (not in its INTERNALS)"
    ]
