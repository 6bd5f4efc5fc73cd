"""The demo ``scripts/demo.sh`` runs: elastic training through everything spot does.

``spotring run`` trains ``examples/train_digits.py`` on the local provider's simulated
spot hosts, with durable checkpoints, while this script plays a spot market on it
through the provider's ``--control`` file. Each step waits for the training's own
progress (rank 0's committed steps, and the ring it expects to have formed), never for
the clock, so it happens on a fast machine and a slow one alike:

1. ``join``: the group grows from 2 hosts to 3; the new host joins the ring.
2. ``notice``: the newest host announces its interruption (as an EC2 spot instance
   does, through its metadata service): it leaves at the next commit, nothing rolled
   back, and its replacement joins.
3. ``kill``: the newest host is preempted without notice (SIGKILL): the ring rolls back
   to its last commit, and a replacement joins.
4. ``reclaim``: every host is hard-killed at once (a spot pool reclaimed): a new ring on
   fresh hosts resumes from the newest durable checkpoint.
5. ``finish``: training ends at the next epoch end.

The training runs until the last step asks it to stop; a step that does not come
within its time ends the run too, with a non-zero status. ``--quick`` runs a shorter
schedule (``tests/e2e/test_e2e_local.py`` runs it); arguments it does not know go to
``spotring run``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Step:
    """One chaos step: once the ring has formed at ``size`` (any size: None) since the
    step before, and trained the schedule's commits on it, write ``control``."""

    name: str
    size: int | None
    control: str
    says: str


STEPS = (
    Step("join", 2, "scale 3", "growing the group to 3 hosts"),
    Step("notice", 3, "notice", "the newest host announces its interruption"),
    Step("kill", 3, "preempt", "preempting the newest host without notice (SIGKILL)"),
    Step("reclaim", 3, "preempt all", "preempting every host at once"),
    Step("finish", None, "", "asking the training to finish at the epoch's end"),
)
"""What happens, in order: each ``size`` is the ring the step before leads to."""


@dataclass(frozen=True)
class Schedule:
    """How long each part of the demo takes."""

    commits: int
    """Commits each step waits for on the ring it waits for."""
    boot_seconds: float
    """How long a new host boots (``--boot-seconds``)."""
    checkpoint_every: float
    step_timeout: float
    """The longest a step waits before the demo gives up."""


FULL = Schedule(commits=150, boot_seconds=5, checkpoint_every=5, step_timeout=180)
QUICK = Schedule(commits=20, boot_seconds=1, checkpoint_every=2, step_timeout=120)

STEP_SECONDS = 0.05
"""The training's sleep per step, to stretch it over the steps."""


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the short schedule (tests)")
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path.cwd(),
        help="where the run's events (demo-events.jsonl) and checkpoints (demo-ckpt/) go",
    )
    args, spotring_args = parser.parse_known_args(argv)
    schedule = QUICK if args.quick else FULL
    with tempfile.TemporaryDirectory(prefix="spotring-demo-") as scratch:
        work = Path(scratch)
        control, stop, progress = work / "control", work / "stop", work / "train.jsonl"
        control.touch()
        command = job_command(schedule, args.dir, control, stop, progress, spotring_args)
        job = subprocess.Popen(command)
        try:
            finished = play(schedule, progress, control, stop, job)
        except KeyboardInterrupt:  # spotring had it too: it stops every worker
            finished = False
        status = job.wait()
    return status if finished else status or 1


def job_command(
    schedule: Schedule,
    directory: Path,
    control: Path,
    stop: Path,
    progress: Path,
    spotring_args: Sequence[str],
) -> list[str]:
    """``spotring run`` of the demo's job, on a fresh start (no old checkpoint)."""
    events, checkpoints = directory / "demo-events.jsonl", directory / "demo-ckpt"
    events.unlink(missing_ok=True)
    shutil.rmtree(checkpoints, ignore_errors=True)  # the job would resume from an old run's
    python = sys.executable
    return [
        *(str(Path(python).with_name("spotring")), "run", "--provider", "local"),
        *("-np", "2", "--min-np", "1", "--max-np", "4", "--refresh-interval", "1"),
        *("--boot-seconds", str(schedule.boot_seconds), "--control", str(control)),
        *("--checkpoint", str(checkpoints), "--checkpoint-every", str(schedule.checkpoint_every)),
        *("--events", str(events), *spotring_args, "--"),
        *(python, str(EXAMPLES / "train_digits.py"), "--epochs", "10000"),
        *("--step-seconds", str(STEP_SECONDS), "--events", str(progress)),
        *("--stop-file", str(stop)),
    ]


def play(
    schedule: Schedule, progress: Path, control: Path, stop: Path, job: subprocess.Popen[bytes]
) -> bool:
    """Run the steps on the job's progress; whether every one came in time. The
    training is asked to stop either way."""
    events = rank0_events(progress)
    try:
        for step in STEPS:
            deadline = time.monotonic() + schedule.step_timeout
            resumed, commits = False, 0
            while not (resumed and commits >= schedule.commits):
                event = next(events)
                if event is None:  # nothing new
                    if job.poll() is not None or time.monotonic() > deadline:
                        say(f"no {step.name} step: the ring did not train "
                            f"{schedule.commits} commits{at(step.size)} in time")  # fmt: skip
                        return False
                    continue
                if event["event"] == "resume" and step.size in (None, event["size"]):
                    resumed, commits = True, 0
                elif event["event"] == "commit" and resumed:
                    commits += 1
            say(f"{commits} commits{at(step.size)}: {step.says}")
            if step.control:
                with control.open("a") as stream:
                    stream.write(step.control + "\n")
        return True
    finally:
        stop.touch()


def rank0_events(path: Path) -> Iterator[dict | None]:
    """Rank 0's events as the training writes them to ``path``, one at a time; None
    after 0.2 s without one."""
    seen = 0
    while True:
        try:
            lines = path.read_text().splitlines(keepends=True)[seen:]
        except FileNotFoundError:
            lines = []
        complete = [line for line in lines if line.endswith("\n")]  # one being written waits
        for line in complete:
            seen += 1
            yield json.loads(line)
        if not complete:
            time.sleep(0.2)
            yield None


def at(size: int | None) -> str:
    return "" if size is None else f" at size {size}"


def say(text: str) -> None:
    print(f"demo: {text}", flush=True)


if __name__ == "__main__":
    sys.exit(main())
