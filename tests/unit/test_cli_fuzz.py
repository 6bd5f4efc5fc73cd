"""Hostile input to the CLI: any argv exits 0 or 2 with at most one line, no traceback.

Commands that parse are not carried out (``run`` and ``discover`` are replaced by a
stub): what is tested is everything before, parsing and the provider's own checks.
"""

from __future__ import annotations

import contextlib
import io

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from spotring.autoscaler import cli

TOKENS = [
    "run", "discover", "providers", "check", "--provider", "local", "aws", "script", "nope",
    "-np", "--min-np", "--max-np", "0", "1", "2", "-3", "1e9", "x", "--", "python",
    "--slots-per-host", "--hosts", "--max-hosts", "--boot-seconds", "--preempt-at",
    "--scale-up-at", "--scale-up-to", "--group", "--region", "--list-command", "true",
    "--refresh-interval", "nan", "inf", "--blacklist-cooldown-range", "--env", "-x", "A=1",
    "1BAD", "--launcher", "ssh", "--ssh-host-key-checking", "maybe", "--log-level", "debug",
    "--target-hosts", "--reset-limit", "--control", "/nonexistent/dir/file", "", "=", "-",
]  # fmt: skip


@pytest.fixture(autouse=True)
def carry_nothing_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli.run, "run_command", lambda options, groups, pm: 0)
    monkeypatch.setattr(cli.discover, "discover", lambda groups: 0)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.sampled_from(TOKENS), st.text(max_size=8)), max_size=12))
@example(["providers", "\n"])  # a newline in an argument, echoed in the error
def test_any_argv_is_a_clean_exit(argv: list[str]) -> None:
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        try:
            code = cli.main(argv)
        except SystemExit as exit:  # --help
            code = exit.code or 0
    errors = stderr.getvalue()
    # 1 only from `spotring check` finding something missing, which is its answer.
    assert code in (0, 2) or (code == 1 and "check" in argv), (argv, code, errors)
    assert "Traceback" not in errors
    if code == 2:
        assert errors.count("\n") == 1, (argv, errors)


@pytest.mark.parametrize(
    "argv",
    [
        [*["run", "--provider", "local", "-np", "1", "--refresh-interval"], value, "--", "true"]
        for value in ("nan", "inf", "-1", "0")
    ]
    + [
        ["discover", "--provider", "local", option, value]
        for option in ("--preempt-at", "--boot-seconds", "--scale-up-at")
        for value in ("nan", "inf", "-5")
    ]
    + [["discover", "--provider", "script", "--list-command", "true", "--command-timeout", "nan"]],
)
def test_numbers_that_cannot_work_are_usage_errors(argv: list[str]) -> None:
    """nan and inf used to slip through (a Timer of inf seconds, a NaN timeout)."""
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        code = cli.main(argv)
    assert code == 2 and stderr.getvalue().count("\n") == 1, stderr.getvalue()
    assert "must" in stderr.getvalue()
