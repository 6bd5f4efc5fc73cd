"""bench/torchft_anchor.py without torchft: its rows say why they were skipped, and its
summary of made-up runs (no torchft process starts here)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from bench import torchft_anchor
from bench.torchft_anchor import FtOutcome


def test_rows_say_why_they_were_skipped_without_the_venv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torchft_anchor, "VENV", tmp_path / "absent")
    rows = torchft_anchor.bench_rows("kills", 0.3, "join", 0.25, runs=1)
    assert len(rows) == 2 * len(torchft_anchor.VARIANTS)
    for kill_row in rows[::2]:
        assert math.isnan(kill_row["anchor_value"])
        assert "run bench/torchft_env.sh" in kill_row["extra"]["skipped"]


def test_summary_takes_medians_of_the_runs_that_got_there_and_lists_failures() -> None:
    crashed = "replica0 exited: AssertionError (ddp.py:76)"
    outcomes = [
        FtOutcome(recovery=5.1, lost=0, join_stall=0.1, join_seconds=4.0, healed_at=90),
        FtOutcome(failure=crashed),
        FtOutcome(recovery=5.3, lost=0, join_stall=0.3, join_seconds=6.0, healed_at=110),
    ]
    figures = torchft_anchor.summary(outcomes)
    assert figures["kill -> next step s"] == pytest.approx(5.2)
    assert figures["join stall s"] == pytest.approx(0.2)
    assert figures["healed at step"] == 100
    assert figures["runs that failed"] == 1
    assert figures["failures"] == [crashed]
    assert math.isnan(torchft_anchor.summary([FtOutcome(failure=crashed)])["steps lost"])


def test_progress_lines_parse_and_a_torn_last_line_is_left_out(tmp_path: Path) -> None:
    progress = tmp_path / "steps.0.0"
    progress.write_text("35 1000.5 1 4\n36 1001.0 0 4\n37 100")
    assert torchft_anchor._steps(progress) == [
        torchft_anchor.Step(35, 1000.5, True, 4),
        torchft_anchor.Step(36, 1001.0, False, 4),
    ]
