"""``spotring run --backend`` and ``--max-restarts``: what each backend takes."""

from __future__ import annotations

import subprocess
import sys

import pytest

from spotring.autoscaler.cli import main, parse
from spotring.autoscaler.cli.run import job_config
from spotring.autoscaler.plugins import get_plugin_manager
from spotring.driver.options import DEFAULT_MAX_RESTARTS

RUN = ("run", "--provider", "local", "-np", "1")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-restarts", "2"], "--max-restarts is for --backend torch"),
        (["--backend", "torch", "--checkpoint", "s3://b/p"], "--checkpoint is not supported"),
        (["--backend", "torch", "--hang-timeout", "30"], "--hang-timeout is not supported"),
        (["--backend", "torch", "--reset-limit", "1"], "--reset-limit is not supported"),
        (["--backend", "torch", "--max-restarts", "-1"], "--max-restarts"),
        (["--backend", "mpi"], "--backend"),
    ],
)
def test_bad_combinations_are_one_line_and_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([*RUN, *args, "--", "true"])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert message in err


@pytest.mark.parametrize(
    ("args", "backend", "restarts"),
    [
        ([], "horovod", 0),
        (["--backend", "torch"], "torch", DEFAULT_MAX_RESTARTS),
        (["--backend", "torch", "--max-restarts", "0"], "torch", 0),
    ],
)
def test_the_job_config_carries_the_backend(args: list[str], backend: str, restarts: int) -> None:
    options, _ = parse([*RUN, *args, "--", "true"], get_plugin_manager(load_entry_points=False))
    config = job_config(options)
    assert (config.backend, config.max_restarts) == (backend, restarts)


def test_the_torch_backend_imports_no_horovod() -> None:
    """``--backend torch`` serves those who left Horovod: what its run imports (the CLI,
    the job, the restart-mode driver, the launcher, the observers) loads no Horovod."""
    code = (
        "import sys\n"
        "import spotring.autoscaler.cli, spotring.autoscaler.job\n"
        "import spotring.driver.torch_restart, spotring.autoscaler.observers.events\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'horovod'))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert result.stdout.strip() == "[]", result.stdout
