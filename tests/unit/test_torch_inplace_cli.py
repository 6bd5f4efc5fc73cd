"""``spotring run --backend torch --in-place``: the options the in-place mode takes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from spotring.autoscaler.cli import main, parse
from spotring.autoscaler.cli.run import job_config
from spotring.autoscaler.plugins import get_plugin_manager

RUN = ("run", "--provider", "local", "-np", "1")
IN_PLACE = ("--backend", "torch", "--in-place")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--in-place"], "--in-place is for --backend torch"),
        (
            [*IN_PLACE, "--max-restarts", "2"],
            "--max-restarts is not supported with --backend torch --in-place",
        ),
        ([*IN_PLACE, "--reset-limit", "1"], "--reset-limit is not supported"),
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


def test_the_in_place_mode_takes_a_hang_timeout_and_durable_checkpoints(tmp_path: Path) -> None:
    """Its workers report commits and heartbeats, so hangs are judged as on Horovod's
    path; its state is written to durable storage as Horovod's is."""
    options, _ = parse(
        [*RUN, *IN_PLACE, "--hang-timeout", "30", "--checkpoint", str(tmp_path), "--", "true"],
        get_plugin_manager(load_entry_points=False),
    )
    config = job_config(options)
    assert (config.backend, config.in_place, config.elastic.hang_timeout) == ("torch", True, 30)
    assert config.elastic.durable is not None


def test_the_in_place_driver_imports_no_horovod() -> None:
    code = (
        "import sys\n"
        "import spotring.autoscaler.job, spotring.driver.torch_inplace\n"
        "import spotring.torch.inplace, spotring.torch.driver_coordinator\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'horovod'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]", done.stdout
