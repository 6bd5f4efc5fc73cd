"""spotring.worker_image.after_import: every callback registered for a module runs
after its first import (the progress counter and the durable checkpoints both wait for
horovod.common.elastic; with one finder each, only the first ever ran)."""

from __future__ import annotations

import sys
from pathlib import Path
from types import ModuleType

import pytest

from spotring.worker_image.after_import import call_after_import


def test_every_callback_for_a_module_runs_after_its_import_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "spotring_probe_module.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "spotring_probe_module", raising=False)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    seen: list[tuple[str, int]] = []

    def first(module: ModuleType) -> None:
        seen.append(("first", module.VALUE))

    def second(module: ModuleType) -> None:
        seen.append(("second", module.VALUE))

    call_after_import("spotring_probe_module", first)
    call_after_import("spotring_probe_module", second)
    assert seen == []
    import spotring_probe_module  # type: ignore[import-not-found]  # made above  # noqa: F401

    assert seen == [("first", 42), ("second", 42)]
    call_after_import("spotring_probe_module", first)  # already imported: at once
    assert seen[-1] == ("first", 42)
    monkeypatch.delitem(sys.modules, "spotring_probe_module")
