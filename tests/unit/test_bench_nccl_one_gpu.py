"""bench/nccl_one_gpu.py, the script a lent GPU runs, checked here on Gloo and the CPU
(``--cpu``): it forms, aborts and forms again, and its restore row says whether a
restore gave the commit back bit for bit. Its figures here say nothing of NCCL."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[2]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "bench.nccl_one_gpu", *args],
        capture_output=True, text=True, cwd=REPO, timeout=120,
    )  # fmt: skip


def test_on_the_cpu_every_row_is_measured_and_the_restore_is_exact(tmp_path: Path) -> None:
    output = tmp_path / "rows.json"
    done = run("--cpu", "--cycles", "3", "--megabytes", "4", "--output", str(output))
    assert done.returncode == 0, done.stderr
    rows = {r["metric"]: r for r in json.loads(output.read_text())["rows"]}
    assert rows["restored bit for bit (1 = yes)"]["met"] is True
    assert rows["MiB taken over 3 re-formations"]["met"] is True
    formation = rows["s per formation (median)"]
    assert formation["value"] > 0 and formation["anchor_value"] > 0  # the abort's
    assert rows["s per TorchState.save() (median)"]["anchor_value"] > 0  # the raw copy's


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here")
def test_without_a_gpu_it_says_so_in_one_line_and_exits_2() -> None:
    done = run("--cycles", "3")
    assert done.returncode == 2
    assert "no CUDA device here" in done.stderr.strip().splitlines()[-1]
