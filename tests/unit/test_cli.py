"""The command line: usage errors, help, discover's output format."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from spotring.autoscaler.cli import main


def spotring(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run the installed console script, as a user would."""
    exe = Path(sys.executable).with_name("spotring")
    return subprocess.run(
        [str(exe), *args], capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["run", "--provider", "local", "-np", "3", "--min-np", "4", "--", "true"],
            "--min-np <= -np",
        ),
        (["run", "--provider", "local", "-np", "0", "--", "true"], "at least 1"),
        (["run", "--provider", "local", "-np", "two", "--", "true"], "whole number"),
        (["run", "--provider", "local", "-np", "2"], "missing the training command"),
        (["run", "--provider", "nope", "-np", "2", "--", "true"], "unknown provider 'nope'"),
        (["run", "-np", "2", "--", "true"], "--provider"),
        (["run", "--provider", "local", "-np", "2", "--bogus", "--", "true"], "unrecognized"),
        # A mistyped option before -np is named, not read as the start of a command.
        (
            ["run", "--provider", "local", "--hostz", "2", "-np", "2", "--", "true"],
            "unrecognized arguments: --hostz",
        ),
        (
            [
                "run",
                "--provider",
                "local",
                "-np",
                "1",
                "--blacklist-cooldown-range",
                "9",
                "1",
                "--",
                "true",
            ],
            "MIN <= MAX",
        ),
        (["discover", "--provider", "local", "--hosts", "99", "--max-hosts", "4"], "--hosts"),
        ([], "required"),
        (
            ["run", "--provider", "local", "-np", "1", "-x", "SPOTRING_NOT_SET", "--", "true"],
            "--env SPOTRING_NOT_SET: not set",
        ),
        (
            ["run", "--provider", "local", "-np", "1", "--checkpoint", "s3://", "--", "true"],
            "--checkpoint",
        ),
        (["report", "x.jsonl", "--price", "od"], "GROUP_OR_LIFECYCLE=USD_PER_HOUR"),
        (["report", "x.jsonl", "--price", "od=-1"], "must not be negative"),
        (
            ["run", "--provider", "local", "-np", "1", "--fallback-after", "-1", "--", "true"],
            "--fallback-after: must not be negative",
        ),
        (
            ["run", "--provider", "local", "-np", "1", "--return-after", "soon", "--", "true"],
            "--return-after",
        ),
        (
            ["run", "--provider", "local", "-np", "1", "--probe-after", "0", "--", "true"],
            "--probe-after: must be a positive number",
        ),
        (
            ["run", "--provider", "local", "-np", "1", "--on-demand-base", "1.5", "--", "true"],
            "--on-demand-base: expected a whole number",
        ),
        (
            ["run", "--provider", "local", "-np", "1", "--checkpoint", "ftp://x/y", "--", "true"],
            "--checkpoint",
        ),
        (
            [
                *("run", "--provider", "script", "--list-command", "true", "-np", "1"),
                *("--on-demand-base", "1", "--", "true"),
            ],
            "spotring run: error: --on-demand-base needs a job of several groups",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1, err
    assert message in err
    assert "Traceback" not in err


def test_run_help_lists_provider_options() -> None:
    result = spotring("run", "--provider", "local", "--help")
    assert result.returncode == 0
    for option in [
        "--preempt-at",
        "--scale-up-at",
        "--boot-seconds",
        "-np",
        "--min-np",
        "--max-np",
        "--slots-per-host",
        "--reset-limit",
        "--blacklist-cooldown-range",
        "--elastic-timeout",
        "--network-interface",
    ]:
        assert option in result.stdout, option
    plain = spotring("run", "--help")
    assert plain.returncode == 0 and "--preempt-at" not in plain.stdout


def test_providers_lists_builtins() -> None:
    result = spotring("providers")
    assert result.returncode == 0
    names = [line.split()[0] for line in result.stdout.splitlines()]
    assert names == sorted(names)
    assert {"aws", "local", "script"} <= set(names)


def test_discover_prints_horovodrun_format() -> None:
    result = spotring("discover", "--provider", "local", "--hosts", "3", "--slots", "2")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "host-0:2\nhost-1:2\nhost-2:2\n"


def test_command_after_dashes_keeps_its_own_flags() -> None:
    from spotring.autoscaler.cli import parse
    from spotring.autoscaler.plugins import get_plugin_manager

    options, _ = parse(
        ["run", "--provider", "local", "-np", "2", "--", "python", "t.py", "--min-np", "9"],
        get_plugin_manager(load_entry_points=False),
    )
    assert options.job == ["python", "t.py", "--min-np", "9"]
    assert (options.min_num_proc, options.max_num_proc) == (2, 2)
