"""bench/deadline_sim's reader of the Can't Be Late traces (github.com/skypilot-org/spot-traces):
the file's shape as that repository's README documents it ({"metadata": {"gap_seconds": G},
"data": [available instances per tick]}), mapped onto the spot pool's capacity; bad input is a
one-line usage error. No simulation runs here."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import deadline_sim


def _write(root: Path, relative: str, document: object) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document))
    return path


def test_capacity_follows_the_ticks_from_the_start_chosen(tmp_path: Path) -> None:
    _write(tmp_path, "availability/16-node/aws/z.json",
           {"metadata": {"gap_seconds": 300}, "data": [12, 9, 0, 4]})  # fmt: skip
    (trace,) = deadline_sim.read_traces(tmp_path)
    assert trace.nodes == 16  # the N-node directory, not the most ever available (12)
    assert trace.family == "availability/16-node/aws"
    capacity = trace.capacity(1)
    assert [capacity(t) for t in (0, 299, 300, 600, 900, 10_000)] == [9, 9, 0, 4, 4, 4]


def test_node_count_without_a_directory_is_the_most_available(tmp_path: Path) -> None:
    _write(tmp_path, "z.json", {"metadata": {"gap_seconds": 60}, "data": [0, 3, 2]})
    assert deadline_sim.read_traces(tmp_path)[0].nodes == 3


@pytest.mark.parametrize(
    "document",
    [
        {"data": [1, 0]},
        {"metadata": {"gap_seconds": 0}, "data": [1]},
        {"metadata": {"gap_seconds": 300}, "data": []},
        {"metadata": {"gap_seconds": 300}, "data": [1, -1]},
        {"metadata": {"gap_seconds": 300}, "data": [1, 0.5]},
        [1, 0],
    ],
)
def test_a_bad_file_is_a_usage_error(
    tmp_path: Path, document: object, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(tmp_path, "1-node/bad.json", document)
    with pytest.raises(SystemExit) as exit_:
        deadline_sim.main(["--traces", str(tmp_path)])
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert "bad.json" in error and "Traceback" not in error


def test_a_directory_without_traces_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        deadline_sim.main(["--traces", str(tmp_path / "missing")])
    assert exit_.value.code == 2
    assert "no spot-traces JSON files" in capsys.readouterr().err
