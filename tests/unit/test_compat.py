"""The Horovod check before a run: missing, wrong version, unbuilt, internals gone."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path

import pytest

from spotring.driver import compat
from spotring.driver.compat import HorovodSetupError, missing_internals, require_horovod


def test_the_installed_horovod_passes() -> None:
    assert require_horovod() == "0.28.1"
    assert missing_internals() == []


def test_missing_horovod_is_one_line_with_the_way_to_get_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "horovod", None)  # import horovod -> ImportError
    with pytest.raises(HorovodSetupError) as error:
        require_horovod()
    message = str(error.value)
    assert "\n" not in message and "Horovod 0.28.1" in message and "scripts/setup.sh" in message


def test_an_untested_version_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "horovod", types.SimpleNamespace(__version__="0.27.0"))
    with pytest.raises(HorovodSetupError, match=r"found 0\.27\.0"):
        require_horovod()


def test_a_missing_internal_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from horovod.runner.elastic.driver import ElasticDriver

    assert (
        missing_internals([("horovod.runner.elastic.driver:ElasticDriver", "_wait_hosts_cond")])
        == []
    )
    monkeypatch.delattr(ElasticDriver, "get_worker_client")
    monkeypatch.setattr(
        compat,
        "PATCHED_INTERNALS",
        (*compat.PATCHED_INTERNALS, ("horovod.torch.mpi_ops", "no_such_function")),
    )
    with pytest.raises(HorovodSetupError) as error:
        require_horovod()
    assert "ElasticDriver.get_worker_client" in str(error.value)
    assert "horovod.torch.mpi_ops.no_such_function" in str(error.value)


def test_run_without_horovod_exits_with_one_line(tmp_path: Path) -> None:
    hidden = tmp_path / "hidden" / "horovod"
    hidden.mkdir(parents=True)
    (hidden / "__init__.py").write_text("raise ImportError('No module named horovod')\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "spotring.autoscaler.cli",
            "run",
            "--provider",
            "local",
            "-np",
            "1",
            "--",
            "true",
        ],
        env={"PYTHONPATH": str(hidden.parent), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("spotring run: error: spotring run needs Horovod 0.28.1")
