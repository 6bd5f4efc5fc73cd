"""Chaos soak: sustained spot churn against one job; nothing durable lost, nothing left behind.

The example workload (``examples/train_digits.py --audit-samples``) trains under
``spotring run --checkpoint DIR`` (a directory in the soak's work dir, a checkpoint at
most every ``--checkpoint-every`` seconds, default 5) while a schedule, for
``--minutes`` (default 10):

- hard-kills a random worker every ``--kill-every`` seconds (30),
- preempts a host every ``--preempt-every`` seconds (45): on the local provider with a
  notice through its metadata service first; on AWS by terminating the instance (its
  worker killed at the same moment), the group launching a replacement,
- scales the group between 4 and 6 hosts every ``--scale-every`` seconds (60),
- hard-kills every host at once every ``--preempt-all-every`` seconds (120): the local
  provider's ``preempt all``; on AWS every worker killed and every instance of the group
  terminated, as when a capacity pool is reclaimed. No worker is spared: every host is
  spot, and a ring left with no survivor starts again from the newest durable
  checkpoint.

``--cloud local`` runs the embedded local group (4 to 6 hosts). ``--cloud aws`` runs an
Auto Scaling group in a moto server that spotring reaches only through a fault proxy
(``tests/fakes/fault_proxy.py``) making ``--fault-rate`` (30%) of its API calls throttle,
fail with a 5xx, hang past the client's timeout or drop the connection; the schedule
itself talks to moto directly. Workers are local processes either way.

Then the schedule stops, the job is asked to finish at its next epoch end (the
example's ``--stop-file``), and the soak reports:

- committed steps lost at ordinary resets, where a ring re-forms around survivors
  (must be 0);
- for each whole-ring loss (the driver's ``ring_lost`` event; the first resume of rank 0
  after it is the new ring's start): the step of the newest complete durable
  checkpoint read just before the soak issued ``preempt all``, which the resume must not
  be behind ("committed-and-durable steps lost", must be 0), and, separately, the
  committed steps (and seconds of training) lost since that checkpoint, bounded by
  ``--checkpoint-every``; every ``preempt all`` must end in a resume;
- every sample of every completed epoch processed exactly once (the example counts each
  sample's passes in its committed state, which the checkpoints hold too);
- resets, the stalls of ordinary resets and of whole-ring resumes, the driver's RSS and
  open file descriptors after the first minute and at the end, worker processes left
  after the job (must be 0), and whether the job finished.

Written to ``bench/results/soak-<cloud>.json``; it runs from here, never in CI.

    bench/soak [--minutes 10] [--cloud local|aws] [--seed 0] [--preempt-all-every 120]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench.common import FAKE_CREDENTIALS, REGION, REPO, RESULTS

BIN = Path(sys.executable).parent
EXAMPLE = REPO / "examples" / "train_digits.py"
STEP_SECONDS = 0.05
MIN_HOSTS, START_HOSTS, MAX_HOSTS = 4, 5, 6
WARM_UP_SECONDS = 60.0  # the driver's memory is taken as a baseline after this
FINISH_TIMEOUT = 300.0
RSS_GROWTH_BOUND_MIB = 64.0
FD_GROWTH_BOUND = 32


# --------------------------------------------------------------------------- chaos


class Chaos:
    """What the schedule can do to a running job; one subclass per kind of group."""

    name = ""

    def start(self, workdir: Path) -> None:
        """Bring up what the group needs (servers, the group itself)."""

    def stop(self) -> None:
        """Tear it down."""

    def spotring_args(self, workdir: Path) -> list[str]:
        raise NotImplementedError

    def preempt(self, rng: random.Random, workers: list[psutil.Process]) -> str:
        raise NotImplementedError

    def preempt_all(self, workers: list[psutil.Process]) -> str:
        """Hard-kill every host of the group at once (a reclaimed capacity pool)."""
        raise NotImplementedError

    def scale(self, size: int) -> str:
        """Resize the group to ``size`` (the group picks the hosts that go)."""
        raise NotImplementedError

    def report(self) -> dict[str, Any]:
        """Figures of the group's side (API faults injected, ...)."""
        return {}


class LocalChaos(Chaos):
    """The embedded local group, steered through its ``--control`` file."""

    name = "local"

    def __init__(self) -> None:
        self._control: Path | None = None

    def spotring_args(self, workdir: Path) -> list[str]:
        self._control = workdir / "control"
        self._control.touch()
        return [
            *("--provider", "local", "--hosts", str(START_HOSTS), "--max-hosts", str(MAX_HOSTS)),
            *("--boot-seconds", "3", "--notice-lead", "10", "--control", str(self._control)),
        ]

    def _command(self, line: str) -> None:
        assert self._control is not None
        with self._control.open("a") as stream:
            stream.write(line + "\n")

    def preempt(self, rng: random.Random, workers: list[psutil.Process]) -> str:
        self._command("notice")  # the newest READY host; preempted 10 s later
        return "notice (newest host), preempted 10 s later"

    def preempt_all(self, workers: list[psutil.Process]) -> str:
        self._command("preempt all")  # SIGKILL to every READY host's workers, then GONE
        return f"preempt all ({len(workers)} workers running)"

    def scale(self, size: int) -> str:
        self._command(f"scale {size}")  # the local group removes its newest hosts
        return f"scale to {size}"


class AwsChaos(Chaos):
    """An Auto Scaling group in moto, behind a proxy that fails ``rate`` of spotring's calls."""

    name = "aws"

    def __init__(self, rate: float, seed: int) -> None:
        self._rate = rate
        self._seed = seed
        self._moto: Any = None
        self._proxy: Any = None
        self._autoscaling: Any = None
        self._ec2: Any = None

    def start(self, workdir: Path) -> None:
        from moto.server import ThreadedMotoServer

        from tests.fakes.aws import create_group
        from tests.fakes.fault_proxy import FaultProxy

        os.environ.update(FAKE_CREDENTIALS)
        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # a line per request otherwise
        self._moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        self._moto.start()
        host, port = self._moto.get_host_and_port()
        url = f"http://{host}:{port}"
        create_group("soak", size=START_HOSTS, min_size=1, max_size=MAX_HOSTS, endpoint_url=url)
        self._proxy = FaultProxy(url, flavour="aws", seed=self._seed)
        self._proxy.set_rate(self._rate, kinds=["throttle", "server_error", "hang", "drop"])
        self._proxy.start()
        import boto3

        self._autoscaling = boto3.client("autoscaling", region_name=REGION, endpoint_url=url)
        self._ec2 = boto3.client("ec2", region_name=REGION, endpoint_url=url)

    def stop(self) -> None:
        if self._proxy is not None:
            self._proxy.stop()
        if self._moto is not None:
            self._moto.stop()

    def spotring_args(self, workdir: Path) -> list[str]:
        return [
            *("--provider", "aws", "--group", "soak", "--region", REGION),
            *("--endpoint-url", self._proxy.url, "--launcher", "local"),
        ]

    def preempt(self, rng: random.Random, workers: list[psutil.Process]) -> str:
        if not workers:
            return "preempt: no worker"
        victim = rng.choice(workers)
        address = _environ(victim).get("HOROVOD_HOSTNAME", "")
        instance = self._instance_at(address)
        with contextlib.suppress(psutil.Error):
            victim.kill()
        if instance is None:
            return f"preempt {address}: not found"
        self._autoscaling.terminate_instance_in_auto_scaling_group(
            InstanceId=instance, ShouldDecrementDesiredCapacity=False
        )
        return f"preempt {instance} ({address}): killed and terminated"

    def preempt_all(self, workers: list[psutil.Process]) -> str:
        # Every worker dies at the same moment, then every instance goes; the group
        # launches replacements for all of them.
        for victim in workers:
            with contextlib.suppress(psutil.Error):
                victim.kill()
        (group,) = self._autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=["soak"])[
            "AutoScalingGroups"
        ]
        instances = [i["InstanceId"] for i in group["Instances"]]
        for instance in instances:
            self._autoscaling.terminate_instance_in_auto_scaling_group(
                InstanceId=instance, ShouldDecrementDesiredCapacity=False
            )
        return f"preempt all: {len(workers)} workers killed, {len(instances)} instances terminated"

    def scale(self, size: int) -> str:
        self._autoscaling.set_desired_capacity(AutoScalingGroupName="soak", DesiredCapacity=size)
        return f"scale to {size}"

    def _instance_at(self, address: str) -> str | None:
        found = self._ec2.describe_instances(
            Filters=[{"Name": "private-ip-address", "Values": [address]}]
        )["Reservations"]
        return found[0]["Instances"][0]["InstanceId"] if found else None

    def report(self) -> dict[str, Any]:
        if self._proxy is None:
            return {}
        kinds = [entry.fault for entry in self._proxy.hits()]
        return {
            "api calls": len(self._proxy.log),
            "api faults injected": {kind: kinds.count(kind) for kind in sorted(set(kinds))},
        }


# ------------------------------------------------------------------------ the run


@dataclass
class Sample:
    at: float
    rss_mib: float
    fds: int


@dataclass(frozen=True)
class Cut:
    """A ``preempt all`` the soak issued: when (epoch seconds), and the newest complete
    durable checkpoint just before it (the script's step in it, its name), if any."""

    time: float
    durable_step: int | None
    checkpoint: str | None


@dataclass
class Soak:
    chaos: Chaos
    minutes: float
    seed: int
    kill_every: float
    preempt_every: float
    scale_every: float
    preempt_all_every: float = 120.0
    checkpoint_every: float = 5.0
    actions: list[tuple[float, str, str]] = field(default_factory=list)  # (at, kind, what)
    samples: list[Sample] = field(default_factory=list)
    cuts: list[Cut] = field(default_factory=list)
    checkpoints: Path = field(default_factory=Path)  # the job's --checkpoint directory

    def run(self, workdir: Path) -> dict[str, Any]:
        rng = random.Random(self.seed)
        self.chaos.start(workdir)
        try:
            return self._run(workdir, rng)
        finally:
            self.chaos.stop()

    def _run(self, workdir: Path, rng: random.Random) -> dict[str, Any]:
        events, stop_file = workdir / "rank0.jsonl", workdir / "stop"
        self.checkpoints = workdir / "ckpt"
        argv = [
            str(BIN / "spotring"),
            "run",
            *self.chaos.spotring_args(workdir),
            *("--refresh-interval", "1", "--events", str(workdir / "driver.jsonl")),
            *("--checkpoint", str(self.checkpoints)),
            *("--checkpoint-every", f"{self.checkpoint_every:g}"),
            *("-np", str(START_HOSTS), "--min-np", "2", "--max-np", str(MAX_HOSTS), "--"),
            *(str(BIN / "python"), str(EXAMPLE), "--events", str(events)),
            *("--epochs", "1000000", "--step-seconds", str(STEP_SECONDS)),
            *("--audit-samples", "--stop-file", str(stop_file)),
        ]
        with (workdir / "spotring.log").open("w") as output:
            job = subprocess.Popen(argv, stdout=output, stderr=subprocess.STDOUT, cwd=workdir)
        began = time.monotonic()
        driver = psutil.Process(job.pid)
        sampling = threading.Event()
        sampler = threading.Thread(target=self._sample, args=(driver, sampling), daemon=True)
        sampler.start()
        finished = False
        try:
            _wait_until(lambda: _commits(events) > 0 or job.poll() is not None, 300)
            durable_step(self.checkpoints)  # imports torch now rather than at the first cut
            self._schedule(job, rng, began + self.minutes * 60)
            sampling.set()  # the end figures: before the job winds down
            stop_file.touch()
            try:
                job.wait(FINISH_TIMEOUT)
                finished = job.returncode == 0
            except subprocess.TimeoutExpired:
                job.send_signal(signal.SIGINT)
                job.wait(30)
        finally:
            sampling.set()
            if job.poll() is None:  # interrupted: stop it as a scheduler would
                job.send_signal(signal.SIGTERM)
                try:
                    job.wait(30)
                except subprocess.TimeoutExpired:
                    job.kill()
                    job.wait()
        leftover = _leftover_processes(workdir)
        return self._report(workdir, events, job.returncode, finished, leftover, began)

    def _schedule(self, job: subprocess.Popen[bytes], rng: random.Random, until: float) -> None:
        """Run the chaos schedule until ``until`` (or until the job ends)."""
        now = time.monotonic()
        every = {"kill": self.kill_every, "preempt": self.preempt_every,
                 "scale": self.scale_every, "preempt all": self.preempt_all_every}  # fmt: skip
        due = {kind: now + seconds for kind, seconds in every.items()}
        sizes = [MAX_HOSTS, MIN_HOSTS]
        while job.poll() is None:
            kind = min(due, key=due.__getitem__)
            if due[kind] >= until:
                return
            time.sleep(max(0.0, due[kind] - time.monotonic()))
            if job.poll() is not None:
                return
            workers = _workers(job.pid)  # no worker spared: every host is spot
            if kind == "kill":
                did = self._kill(rng, workers)
            elif kind == "preempt":
                did = self.chaos.preempt(rng, workers)
            elif kind == "scale":
                did = self.chaos.scale(sizes[0])
                sizes.reverse()
            else:
                # What the new ring may not be behind: the newest complete checkpoint
                # before the cut (a newer one may still be written before it lands).
                step, name = durable_step(self.checkpoints)
                self.cuts.append(Cut(time.time(), step, name))
                did = self.chaos.preempt_all(workers)
                did += f"; newest durable checkpoint: step {step} ({name})"
            due[kind] += every[kind]
            skipped = did.startswith(("kill: no worker", "preempt: no worker"))
            self.actions.append((time.monotonic(), "skipped" if skipped else kind, did))
            print(f"soak [{time.monotonic() - now:6.1f}s] {did}", flush=True)

    @staticmethod
    def _kill(rng: random.Random, workers: list[psutil.Process]) -> str:
        if not workers:
            return "kill: no worker running"
        victim = rng.choice(workers)
        host = _environ(victim).get("HOROVOD_HOSTNAME", "?")
        with contextlib.suppress(psutil.Error):
            victim.kill()
        return f"kill -9 the worker on {host}"

    def _sample(self, driver: psutil.Process, done: threading.Event) -> None:
        while not done.wait(1.0):
            try:
                if driver.status() == psutil.STATUS_ZOMBIE:
                    return
                rss = driver.memory_info().rss / 2**20
                self.samples.append(Sample(time.monotonic(), rss, driver.num_fds()))
            except psutil.Error:
                return

    def _report(
        self,
        workdir: Path,
        events: Path,
        exit_code: int | None,
        finished: bool,
        leftover: list[str],
        began: float,
    ) -> dict[str, Any]:
        recorded = _read_jsonl(events)
        driver_events = _read_jsonl(workdir / "driver.jsonl")
        ring_losses = [e for e in driver_events if e["event"] == "ring_lost"]
        lost_times = [e["t"] for e in ring_losses]
        lost, resumes = steps_lost(recorded, lost_times)
        wholes = whole_ring_losses(recorded, ring_losses, self.cuts)
        audits = epoch_audits(recorded)
        exact = [a for a in audits.values() if a["once"] == a["samples"]]
        stalls = stall_seconds(recorded, lost_times)
        whole_stalls = [w["stall s"] for w in wholes if w["stall s"] is not None]
        warm = [s for s in self.samples if s.at >= began + WARM_UP_SECONDS] or self.samples
        first, last = (warm[0], warm[-1]) if warm else (Sample(0, 0, 0), Sample(0, 0, 0))
        kinds = [kind for _, kind, _ in self.actions]  # "skipped": no worker was running
        seconds_lost = [w["seconds lost"] for w in wholes if w["seconds lost"] is not None]
        return {
            "cloud": self.chaos.name,
            "minutes": self.minutes,
            "seed": self.seed,
            "job finished": finished,
            "exit code": exit_code,
            "committed steps": max(
                (e["step"] for e in recorded if e["event"] == "commit"), default=0
            ),
            "committed steps lost": lost,
            "resets": resumes - 1 if resumes else 0,
            "checkpoint every s": self.checkpoint_every,
            "preempt all issued": len(self.cuts),
            "rings lost and resumed": len(wholes),
            "ring losses without a resume": len(ring_losses)
            - sum(len(w["ring_lost"]) for w in wholes),
            "durable steps lost at whole-ring losses": sum(w["durable steps lost"] for w in wholes),
            "steps lost to whole-ring losses": sum(w["steps lost"] for w in wholes),
            "training s lost to a whole-ring loss, max": round(max(seconds_lost, default=0.0), 2),
            "whole-ring losses": wholes,
            "epochs completed": len(audits),
            "epochs with every sample exactly once": len(exact),
            "worst epoch": _worst(audits),
            "longest stall s": round(max(stalls, default=0.0), 2),
            "median reset stall s": round(statistics.median(stalls), 2) if stalls else 0.0,
            "longest whole-ring resume stall s": round(max(whole_stalls, default=0.0), 2),
            "driver RSS MiB (after 1 min -> end)": [
                round(first.rss_mib, 1),
                round(last.rss_mib, 1),
            ],
            "driver RSS MiB max": round(max((s.rss_mib for s in self.samples), default=0), 1),
            "driver open fds (after 1 min -> end)": [first.fds, last.fds],
            "driver open fds max": max((s.fds for s in self.samples), default=0),
            "processes left": leftover,
            "chaos": {kind: kinds.count(kind) for kind in sorted(set(kinds))},
            **self.chaos.report(),
            "workdir": str(workdir),
        }


def verdict(result: dict[str, Any]) -> list[tuple[str, str, str, bool]]:
    """(figure, value, bound, met) for each promise the soak checks."""
    rss = result["driver RSS MiB (after 1 min -> end)"]
    fds = result["driver open fds (after 1 min -> end)"]
    epochs, exact = result["epochs completed"], result["epochs with every sample exactly once"]
    cuts, resumed = result.get("preempt all issued", 0), result.get("rings lost and resumed", 0)
    durable_lost = result.get("durable steps lost at whole-ring losses", 0)
    every = result.get("checkpoint every s")
    return [
        ("job finished", str(result["job finished"]), "True", result["job finished"]),
        ("committed steps lost at resets", str(result["committed steps lost"]), "0",
         result["committed steps lost"] == 0),
        ("committed-and-durable steps lost", str(durable_lost), "0", durable_lost == 0),
        ("preempt all -> ring lost and resumed", f"{resumed} of {cuts}", "all",
         resumed >= cuts),
        ("steps lost to whole-ring losses", str(result.get("steps lost to whole-ring losses", 0)),
         "-", True),
        ("training s lost to a whole-ring loss, max",
         str(result.get("training s lost to a whole-ring loss, max", 0.0)),
         f"~ {every:g} (--checkpoint-every) + a write" if every else "-", True),
        ("epochs with every sample exactly once", f"{exact} of {epochs}", "all",
         epochs > 0 and exact == epochs),
        ("worker processes left", str(len(result["processes left"])), "0",
         not result["processes left"]),
        ("driver RSS growth MiB", f"{rss[1] - rss[0]:+.1f}", f"< {RSS_GROWTH_BOUND_MIB:g}",
         rss[1] - rss[0] < RSS_GROWTH_BOUND_MIB),
        ("driver fd growth", f"{fds[1] - fds[0]:+d}", f"< {FD_GROWTH_BOUND}",
         fds[1] - fds[0] < FD_GROWTH_BOUND),
        ("resets", str(result["resets"]), "-", True),
        ("longest stall s", str(result["longest stall s"]), "-", True),
        ("median reset stall s", str(result["median reset stall s"]), "-", True),
        ("longest whole-ring resume stall s",
         str(result.get("longest whole-ring resume stall s", 0.0)), "-", True),
    ]  # fmt: skip


def format_verdict(result: dict[str, Any]) -> str:
    rows = [("figure", "value", "bound", "met")] + [
        (name, value, bound, "yes" if met else "NO") for name, value, bound, met in verdict(result)
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


# ------------------------------------------------------------------ the figures


def steps_lost(
    recorded: list[dict[str, Any]], ring_lost_times: Sequence[float] = ()
) -> tuple[int, int]:
    """(committed steps lost at ordinary resets, resumes) from rank 0's events.

    A resume one step past rank 0's last commit is no loss (another rank may hold that
    commit when a peer's death broke the allreduce on some ranks only); a resume before
    it loses the difference. The first resume after each of ``ring_lost_times`` (the
    driver's ``ring_lost`` events) starts a ring with no survivor, from a durable
    checkpoint: :func:`whole_ring_losses` judges those; the count goes on from there.
    """
    whole = _whole_ring_resumes(recorded, ring_lost_times)
    last_commit, lost, resumes = 0, 0, 0
    for index, event in enumerate(recorded):
        if event["event"] == "resume":
            resumes += 1
            if index in whole:
                last_commit = event["step"]
            else:
                lost += max(0, last_commit - event["step"])
        elif event["event"] == "commit":
            last_commit = max(last_commit, event["step"])
    return lost, resumes


def whole_ring_losses(
    recorded: list[dict[str, Any]], ring_losses: list[dict[str, Any]], cuts: Sequence[Cut]
) -> list[dict[str, Any]]:
    """One record per ring resumed after a whole-ring loss.

    ``ring_losses`` are the driver's ``ring_lost`` events, ``cuts`` the ``preempt all``
    the soak issued. The resume must not be behind the newest durable checkpoint of the
    last cut before the loss (``durable steps lost``: 0); ``steps lost`` counts the
    commits since that checkpoint, ``seconds lost`` the training they took (from the
    first commit of the resumed step to the last commit before the loss), ``stall s``
    the time from that last commit to the new ring's first.
    """
    times = [e["t"] for e in ring_losses]
    whole = _whole_ring_resumes(recorded, times)
    found: list[dict[str, Any]] = []
    last_commit, last_time = 0, None
    committed_at: dict[int, float] = {}  # step -> its first commit since the last rollback
    previous = float("-inf")  # the time of the previous whole-ring resume
    waiting: tuple[dict[str, Any], float] | None = None  # a resume's record, its last commit
    for index, event in enumerate(recorded):
        if event["event"] == "commit":
            if waiting is not None:
                record, before = waiting
                record["stall s"] = round(event["time"] - before, 2)
                waiting = None
            last_commit = max(last_commit, event["step"])
            last_time = event["time"]
            committed_at.setdefault(event["step"], event["time"])
        elif event["event"] == "resume":
            step = event["step"]
            if index in whole:
                losses = [e for e, t in zip(ring_losses, times, strict=True)
                          if previous < t < event["time"]]  # fmt: skip
                cut = next((c for c in reversed(cuts) if previous < c.time < losses[0]["t"]), None)
                durable = cut.durable_step if cut is not None else None
                since = committed_at.get(step)
                seconds = None
                if last_commit <= step:
                    seconds = 0.0
                elif since is not None and last_time is not None:
                    seconds = round(last_time - since, 2)
                record = {
                    "ring lost at": losses[0]["t"],
                    "preempt all at": cut.time if cut is not None else None,
                    "durable step before": durable,
                    "durable checkpoint before": cut.checkpoint if cut is not None else None,
                    "last commit before": last_commit,
                    "resumed at step": step,
                    "durable steps lost": max(0, (durable or 0) - step),
                    "steps lost": max(0, last_commit - step),
                    "seconds lost": seconds,
                    "stall s": None,
                    "ring_lost": [
                        {"why": e.get("why"), "resumed_from": e.get("resumed_from")} for e in losses
                    ],
                }
                found.append(record)
                if last_time is not None:
                    waiting = (record, last_time)
                previous = event["time"]
                last_commit = step
            for later in [s for s in committed_at if s > step]:  # rolled back: done again
                del committed_at[later]
    return found


def durable_step(directory: Path) -> tuple[int | None, str | None]:
    """The script's step in the newest complete checkpoint in ``directory``, and its
    name; (None, None) when there is none yet."""
    from spotring.checkpoint import Checkpoints, open_store
    from spotring.worker_image.durable import deserialize

    if not directory.is_dir():
        return None, None
    loaded = Checkpoints(open_store(str(directory)), job_id="soak").load_latest()
    if loaded is None:
        return None, None
    info, payload = loaded
    return int(deserialize(payload)["attributes"]["step"]), info.name


def _whole_ring_resumes(
    recorded: list[dict[str, Any]], ring_lost_times: Sequence[float]
) -> set[int]:
    """The indices in ``recorded`` of the first resume after each ring loss."""
    resumes = [(i, e["time"]) for i, e in enumerate(recorded) if e["event"] == "resume"]
    found = set()
    for lost_at in ring_lost_times:
        first = next((i for i, at in resumes if at > lost_at), None)
        if first is not None:
            found.add(first)
    return found


def epoch_audits(recorded: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    """The last audit of each epoch (an epoch rolled back past its end is audited again)."""
    return {e["epoch"]: e for e in recorded if e["event"] == "epoch_audit"}


def stall_seconds(
    recorded: list[dict[str, Any]], ring_lost_times: Sequence[float] = ()
) -> list[float]:
    """For each ordinary reset (not the resume after a whole-ring loss, which
    :func:`whole_ring_losses` times): the gap between the last commit before it and
    the first after."""
    whole = _whole_ring_resumes(recorded, ring_lost_times)
    stalls: list[float] = []
    last_commit, resumed = None, False
    for index, event in enumerate(recorded):
        if event["event"] == "resume":
            resumed = last_commit is not None and index not in whole
        elif event["event"] == "commit":
            if resumed and last_commit is not None:
                stalls.append(event["time"] - last_commit)
                resumed = False
            last_commit = event["time"]
    return stalls


def _worst(audits: dict[int, dict[str, Any]]) -> dict[str, Any] | None:
    bad = [a for a in audits.values() if a["once"] != a["samples"]]
    return max(bad, key=lambda a: a["missing"] + a["repeated"]) if bad else None


# ------------------------------------------------------------------------ helpers


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _commits(events: Path) -> int:
    return sum(1 for e in _read_jsonl(events) if e["event"] == "commit")


def _wait_until(condition: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("the job did not start training")
        time.sleep(0.5)


def _environ(process: psutil.Process) -> dict[str, str]:
    try:
        return process.environ()
    except psutil.Error:
        return {}


def _workers(driver_pid: int) -> list[psutil.Process]:
    """The job's training processes (not their supervisors)."""
    found = []
    with contextlib.suppress(psutil.Error):
        for child in psutil.Process(driver_pid).children(recursive=True):
            with contextlib.suppress(psutil.Error):
                if str(EXAMPLE) in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                    found.append(child)
    return found


def _leftover_processes(workdir: Path, grace: float = 10.0) -> list[str]:
    """The job's processes still alive ``grace`` seconds after it ended: those started
    in ``workdir`` (supervisors, workers) or naming it on their command line."""

    def alive() -> list[psutil.Process]:
        found = []
        for process in psutil.process_iter(["cmdline", "status", "cwd"]):
            mine = process.info["cwd"] == str(workdir) or str(workdir) in " ".join(
                process.info["cmdline"] or ()
            )
            if mine and process.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(process)
        return found

    _, still = psutil.wait_procs(alive(), timeout=grace)
    return [f"{p.pid} {' '.join(p.cmdline()[:3])}" for p in still if p.is_running()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/soak", description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=10.0)
    parser.add_argument("--cloud", choices=["local", "aws"], default="local")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kill-every", type=float, default=30.0, metavar="SECONDS")
    parser.add_argument("--preempt-every", type=float, default=45.0, metavar="SECONDS")
    parser.add_argument("--scale-every", type=float, default=60.0, metavar="SECONDS")
    parser.add_argument(
        "--preempt-all-every",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="hard-kill every host at once this often (default: 120)",
    )
    parser.add_argument(
        "--checkpoint-every",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help="the job's --checkpoint-every (default: 5)",
    )
    parser.add_argument("--fault-rate", type=float, default=0.3, help="aws: API calls failed")
    args = parser.parse_args(argv)
    intervals = (args.kill_every, args.preempt_every, args.scale_every, args.preempt_all_every)
    if args.minutes <= 0 or min(*intervals, args.checkpoint_every) <= 0:
        parser.error("--minutes and the intervals must be positive")
    if not 0 <= args.fault_rate < 1:
        parser.error("--fault-rate must be in [0, 1)")
    chaos = LocalChaos() if args.cloud == "local" else AwsChaos(args.fault_rate, args.seed)
    soak = Soak(chaos, args.minutes, args.seed, args.kill_every, args.preempt_every,
                args.scale_every, args.preempt_all_every, args.checkpoint_every)  # fmt: skip
    # SIGTERM unwinds like Ctrl-C, so the job is stopped and the servers torn down.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    workdir = Path(tempfile.mkdtemp(prefix=f"spotring-soak-{args.cloud}-"))
    print(f"soak: the job's logs go to {workdir}", flush=True)
    try:
        result = soak.run(workdir)
    except KeyboardInterrupt:
        print("soak: interrupted; the job was stopped", file=sys.stderr)
        return 130
    result["actions"] = [(round(at, 1), did) for at, _, did in soak.actions]
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"soak-{args.cloud}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(format_verdict(result))
    print(f"\n{json.dumps({k: v for k, v in result.items() if k != 'actions'}, indent=2)}")
    print(f"written to {out.relative_to(REPO)}")
    return 0 if all(met for *_, met in verdict(result)) else 1


if __name__ == "__main__":
    sys.exit(main())
