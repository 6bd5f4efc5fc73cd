"""Deadline mode against spot availability traces (#35): cost and deadlines met.

A trace-driven simulator that runs spotring's real policy code: the
:class:`~spotring.autoscaler.controller.Controller` (its steering and capacity policy,
the decision hooks through a real plugin manager, and for deadline mode the
:class:`~spotring.autoscaler.deadline.DeadlinePlugin`) stepped on a fake clock, as the
tests drive it. Only the world is simulated: two cloud groups (:class:`SimGroup`: a
spot pool whose capacity follows a trace, an on-demand pool with no limit; a launched
host is billed from its launch and ready ``BOOT_S`` later) and the ring (its slots
train at ``RATE`` steps per slot-second; each change of the ring's hosts stalls it
``FORMATION_S``; its progress reaches the policy as ``spotring_ring_progress`` does
in a run).

Three policies per trace, same trace, same seed:

- ``deadline``: ``--deadline`` mode (spot + on-demand groups).
- ``today``: spotring's default capacity policy: fall back at the first shortage, hand
  fallback hosts back ``--return-after`` once spot returns (SkyPilot's managed jobs
  also fall back at once).
- ``on-demand``: the on-demand group alone.

Synthetic traces (``bench/run``), stated as such:

- ``advisor <5%`` ... ``advisor >20%``: each spot host interrupted at the AWS Spot
  Advisor "frequency of interruption" bucket's midpoint rate per month (2.5, 7.5, 12.5,
  17.5, 25 %), its capacity back after an exponential outage (mean 1 h: an assumption;
  the Advisor publishes no outage length).
- ``pool U/D``: the whole spot pool up for an exponential time of mean U hours, then
  down (capacity 0, or half with ``half``) for mean D hours: a pool that runs dry, as
  the paper's traces show for GPU instances in one zone.

Their workload: ``HOSTS`` hosts of one slot, ``HOURS`` of training on the full ring,
deadline ``HOURS * SLACK`` after the start, ``--restart-cost`` ``RESTART_S``; prices per
host-hour ``SPOT_USD`` and ``ON_DEMAND_USD`` (a GPU's spot price about 30 % of on-demand).

The paper's traces (``--traces DIR``): the "Can't Be Late" (NSDI '24) availability and
preemption traces, https://github.com/skypilot-org/spot-traces, not shipped here. Each
file's ``data`` is the spot instances found available at each tick of ``gap_seconds``
(that repository's README); it becomes the spot pool's capacity, for a ring of the
trace's node count (``1-node``: one host, as the paper's single instance; ``4-node``,
``16-node``: that many hosts, the count directly). The job is the paper's (``PAPER_*``),
started at ``--windows`` seeded start times per file.

    python -m bench.deadline_sim [--quick] [--traces DIR [--windows N]]
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import random
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import RESULTS, Row, format_table, row
from spotring.autoscaler.capacity import DEFAULT_FALLBACK_AFTER, CapacityOptions
from spotring.autoscaler.controller import Controller
from spotring.autoscaler.deadline import DeadlineOptions, DeadlinePolicy, deadline_plugin
from spotring.autoscaler.plugins import get_plugin_manager
from spotring.core import (
    CapacityShortage,
    CoreOptions,
    Instance,
    InstanceState,
    JobShape,
    Lifecycle,
    ShortageCause,
)
from spotring.driver.ring_events import RingStatus
from spotring.providers.base import Provider

BENCHMARK = "deadline mode, synthetic spot traces"
PAPER_BENCHMARK = "deadline mode, the Can't Be Late traces"
HOSTS = 4
HOURS = 8.0
SLACKS = (1.25, 1.5)
"""Deadline over the time the work needs on a full ring."""
RATE = 1.0
"""Steps per slot-second."""
BOOT_S = 120.0
FORMATION_S = 30.0
RESTART_S = 300.0
TICK_S = 60.0
SPOT_USD = 0.3
ON_DEMAND_USD = 1.0
START = 1_000_000.0
ADVISOR_BUCKETS = {"<5%": 0.025, "5-10%": 0.075, "10-15%": 0.125, "15-20%": 0.175, ">20%": 0.25}
ADVISOR_OUTAGE_H = 1.0
POOLS = ((6.0, 1.0, False), (2.0, 2.0, False), (1.0, 3.0, False), (3.0, 3.0, True))
"""(mean hours up, mean hours down, down to half rather than 0)."""


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


Trace = Callable[[float], int]
"""Spot hosts the pool can hold at a moment (simulated seconds since the start)."""


@dataclass
class _Host:
    id: str
    launched: float


@dataclass
class SimGroup(Provider):
    """A cloud group in simulated time: it launches up to what ``capacity`` allows
    (billed from launch, ready ``BOOT_S`` later), takes back its newest hosts when the
    capacity drops below them, and reports a capacity shortage while asked for more."""

    group: str
    lifecycle: Lifecycle
    clock: Clock
    capacity: Trace = lambda _t: 1 << 20
    boot_s: float = BOOT_S
    name = "sim"
    can_remove = True
    target: int = 0
    hosts: list[_Host] = field(default_factory=list)
    _launched: int = 0

    @classmethod
    def from_options(cls, options: argparse.Namespace, core: CoreOptions) -> SimGroup:
        raise NotImplementedError("simulated")

    def group_name(self) -> str:
        return self.group

    def group_lifecycle(self) -> Lifecycle:
        return self.lifecycle

    def advance(self) -> None:
        """The cloud acts: takes back what its capacity no longer holds, launches what
        is asked of it within its capacity."""
        room = self._room()
        while len(self.hosts) > room:
            self.hosts.pop()  # the newest go first
        while len(self.hosts) < min(self.target, room):
            self._launched += 1
            self.hosts.append(_Host(f"{self.group}-{self._launched}", self.clock.now))

    def _room(self) -> int:
        return self.capacity(self.clock.now - START)

    def list_instances(self) -> list[Instance]:
        return [
            Instance(
                host.id,
                host.id,
                InstanceState.READY
                if self.clock.now - host.launched >= self.boot_s
                else InstanceState.PENDING,
                1,
            )
            for host in self.hosts
        ]

    def set_target_size(self, size: int) -> None:
        self.target = size

    def replace_instance(self, instance_id: str) -> None:
        self.remove_instance(instance_id)
        self.target += 1

    def remove_instance(self, instance_id: str) -> None:
        self.hosts = [h for h in self.hosts if h.id != instance_id]
        self.target = max(0, self.target - 1)

    def capacity_shortage(self, since: float) -> CapacityShortage | None:
        if self.target <= self._room():
            return None
        return CapacityShortage(ShortageCause.CAPACITY, "InsufficientInstanceCapacity", "sim")

    def billed_hours(self, seconds: float) -> float:
        return len(self.hosts) * seconds / 3600


@dataclass(frozen=True)
class Outcome:
    cost: float
    finished_h: float | None
    """Hours from the start to the last step; None: not done by the deadline."""
    spot_share: float


@dataclass(frozen=True)
class Workload:
    """One job: its ring, its work, its deadline, what a change of hosts costs, prices."""

    hosts: int
    hours: float
    """Training time on the full ring."""
    deadline_h: float
    """Hours after the start."""
    restart_s: float = RESTART_S
    """``--restart-cost``: what the deadline policy budgets for a change of hosts."""
    boot_s: float = BOOT_S
    formation_s: float = FORMATION_S
    fallback_after_s: float = DEFAULT_FALLBACK_AFTER
    """``--fallback-after``: how long a group may sit below its target, with no error
    from the cloud, before it counts as short (above ``boot_s``, as a user sets it)."""
    spot_usd: float = SPOT_USD
    on_demand_usd: float = ON_DEMAND_USD
    """Per host-hour."""


def synthetic_workload(slack: float) -> Workload:
    """The synthetic rows' job: ``HOSTS`` hosts, ``HOURS`` of work, deadline ``slack`` x."""
    return Workload(HOSTS, HOURS, HOURS * slack)


def simulate(trace: Trace, policy: str, work: Workload, seed: int) -> Outcome:
    """One job on ``trace`` under ``policy`` (``deadline``, ``today``, ``on-demand``)."""
    random.seed(seed)  # the capacity policy's backoff jitter
    clock = Clock()
    total = int(work.hours * 3600 * RATE * work.hosts)
    deadline = START + work.deadline_h * 3600
    spot = SimGroup("spot", Lifecycle.SPOT, clock, trace, work.boot_s)
    od = SimGroup("od", Lifecycle.ON_DEMAND, clock, boot_s=work.boot_s)
    groups = [od] if policy == "on-demand" else [spot, od]
    pm = get_plugin_manager(load_entry_points=False)
    job = JobShape(num_proc=work.hosts, min_num_proc=1, max_num_proc=work.hosts)
    prices = {Lifecycle.SPOT.value: work.spot_usd, Lifecycle.ON_DEMAND.value: work.on_demand_usd}
    controller = Controller(
        groups, pm.hook, job=job, replace_grace=0.0,
        capacity=CapacityOptions(fallback_after=work.fallback_after_s), capacity_clock=clock,
        prices=prices,
    )  # fmt: skip
    deadline_policy = None
    if policy == "deadline":
        options = DeadlineOptions(deadline, total, work.hosts, work.restart_s)
        deadline_policy = DeadlinePolicy(options, clock=clock)
    ring = _Ring(formation_s=work.formation_s)
    cost = spot_hours = all_hours = 0.0
    with deadline_plugin(pm, deadline_policy):
        while clock.now < deadline and ring.done < total:
            for group in groups:
                group.advance()
            controller.step()
            inventory = controller.inventory
            hosts = sorted(i.address for i in inventory.ready) if inventory else []
            if ring.reform(hosts, clock.now):
                controller.ring_formed(hosts)
            controller.hosts_offered(hosts)
            spot_hours += spot.billed_hours(TICK_S)
            all_hours += spot.billed_hours(TICK_S) + od.billed_hours(TICK_S)
            cost += (
                spot.billed_hours(TICK_S) * work.spot_usd
                + od.billed_hours(TICK_S) * work.on_demand_usd
            )
            ring.train(clock.now, TICK_S)
            clock.now += TICK_S
            pm.hook.spotring_ring_progress(status=ring.status())  # what it committed by now
    finished = (clock.now - START) / 3600 if ring.done >= total else None
    return Outcome(cost, finished, spot_hours / all_hours if all_hours else 0.0)


@dataclass
class _Ring:
    """The ring as Horovod would run it: re-formed on every change of hosts."""

    generation: int = 0
    hosts: tuple[str, ...] = ()
    steps: float = 0.0
    done_before: float = 0.0
    formed_at: float = 0.0
    formation_s: float = FORMATION_S

    @property
    def done(self) -> float:
        return self.done_before + self.steps

    def reform(self, hosts: list[str], now: float) -> bool:
        if tuple(hosts) == self.hosts:
            return False
        self.generation += 1
        self.done_before += self.steps
        self.hosts, self.steps, self.formed_at = tuple(hosts), 0.0, now
        return True

    def train(self, now: float, seconds: float) -> None:
        training = min(seconds, max(0.0, now + seconds - self.formed_at - self.formation_s))
        self.steps += RATE * len(self.hosts) * training

    def status(self) -> RingStatus:
        return RingStatus(self.generation, len(self.hosts), int(self.steps), 0.0, "")


# ------------------------------------------------------------------ traces


def advisor_trace(monthly: float, seed: int) -> Trace:
    """Each of ``HOSTS`` spot hosts interrupted at ``monthly`` per month, back after an
    exponential outage of mean :data:`ADVISOR_OUTAGE_H`."""
    rng = random.Random(seed)
    horizon = HOURS * max(SLACKS) * 3600
    outages: list[tuple[float, float]] = []
    for _ in range(HOSTS):
        t = rng.expovariate(monthly / (30 * 86400))
        while t < horizon:
            back = t + rng.expovariate(1 / (ADVISOR_OUTAGE_H * 3600))
            outages.append((t, back))
            t = back + rng.expovariate(monthly / (30 * 86400))
    return lambda t: HOSTS - sum(1 for start, end in outages if start <= t < end)


def pool_trace(up_h: float, down_h: float, half: bool, seed: int) -> Trace:
    """The pool up for an exponential time of mean ``up_h`` hours, then down (to 0, or
    half with ``half``) for one of mean ``down_h``; it starts up."""
    rng = random.Random(seed)
    horizon = HOURS * max(SLACKS) * 3600
    downs: list[tuple[float, float]] = []
    t = rng.expovariate(1 / (up_h * 3600))
    while t < horizon:
        end = t + rng.expovariate(1 / (down_h * 3600))
        downs.append((t, end))
        t = end + rng.expovariate(1 / (up_h * 3600))
    low = HOSTS // 2 if half else 0
    return lambda t: low if any(start <= t < end for start, end in downs) else HOSTS


def traces(seeds: int) -> Iterator[tuple[str, int, Trace]]:
    for seed in range(seeds):
        for bucket, monthly in ADVISOR_BUCKETS.items():
            yield f"advisor {bucket}", seed, advisor_trace(monthly, seed)
        for up_h, down_h, half in POOLS:
            name = f"pool {up_h:g}h/{down_h:g}h{' half' if half else ''}"
            yield name, seed, pool_trace(up_h, down_h, half, seed)


# ------------------------------------------------------------ the paper's traces


PAPER_HOURS = 48.0
PAPER_DEADLINES_H = (52.0, 70.0)
PAPER_CHANGEOVER_S = 0.2 * 3600
"""The paper's settings as far as found (docs/cost.md): 48 h of work, deadlines 52 h
and 70 h, a changeover delay of 0.2 h (here boot + ring formation, and the policy's
``--restart-cost``)."""
PAPER_BOOT_S = PAPER_CHANGEOVER_S - FORMATION_S
"""A spot host's boot: ``--fallback-after`` waits the default's margin past it, as a
user sets it above the time a host takes to come up (at the default 300 s, below the
boot, every launch would count as a shortage and buy on-demand)."""
PAPER_SPOT_USD = 0.918
PAPER_ON_DEMAND_USD = 3.06
"""p3.2xlarge (1 V100) on-demand per hour in us-east-1; spot at 30 % of it (the ratio
is what the savings depend on)."""
PAPER_WINDOWS = 1
"""Start times drawn per trace file (seeded), as the paper draws job start times."""
_NODES = re.compile(r"^(\d+)-node$")


@dataclass(frozen=True)
class SpotTrace:
    """One spot-traces file (github.com/skypilot-org/spot-traces): the spot instances
    available at each tick of ``gap_s`` seconds, out of ``nodes`` asked for."""

    name: str
    """Its path under the directory given, e.g. ``availability/1-node/aws-.../x.json``."""
    family: str
    """Its directory: the traces collected together."""
    gap_s: float
    available: tuple[int, ...]
    nodes: int

    @property
    def hours(self) -> float:
        return len(self.available) * self.gap_s / 3600

    def capacity(self, start_tick: int) -> Trace:
        """The spot pool's capacity from tick ``start_tick`` on: the instances the trace
        found available then (a tick past the trace's end: its last value)."""
        last = len(self.available) - 1
        return lambda t: self.available[min(last, start_tick + int(t // self.gap_s))]


def read_trace(path: Path, root: Path) -> SpotTrace:
    """One trace file: ``{"metadata": {"gap_seconds": G}, "data": [available, ...]}``.
    The ring's size is the trace's node count, from an ``N-node`` directory on its
    path, else the most instances it ever found. ValueError: not such a file."""
    try:
        document = json.loads(path.read_text())
        gap = float(document["metadata"]["gap_seconds"])
        data = document["data"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path}: not a spot-traces file ({exc})") from None
    if not gap > 0 or not isinstance(data, list) or not data:
        raise ValueError(f"{path}: gap_seconds must be > 0 and data a non-empty list")
    if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in data):
        raise ValueError(f"{path}: data must hold counts of instances (integers >= 0)")
    relative = path.relative_to(root)
    counts = [int(m.group(1)) for part in relative.parts if (m := _NODES.match(part))]
    nodes = counts[-1] if counts else max(data)
    if nodes < 1:
        raise ValueError(f"{path}: no node count (no N-node directory, never available)")
    return SpotTrace(str(relative), str(relative.parent), gap, tuple(data), nodes)


def read_traces(root: Path) -> list[SpotTrace]:
    """Every ``*.json`` under ``root``, sorted by path. ValueError: none, or a bad one."""
    paths = sorted(root.rglob("*.json")) if root.is_dir() else []
    if not paths:
        raise ValueError(f"{root}: no spot-traces JSON files under it")
    return [read_trace(path, root) for path in paths]


def paper_workload(trace: SpotTrace, deadline_h: float) -> Workload:
    """The paper's job on a ring of the trace's node count."""
    return Workload(
        trace.nodes, PAPER_HOURS, deadline_h, restart_s=PAPER_CHANGEOVER_S,
        boot_s=PAPER_BOOT_S, fallback_after_s=PAPER_BOOT_S + DEFAULT_FALLBACK_AFTER,
        spot_usd=PAPER_SPOT_USD,
        on_demand_usd=PAPER_ON_DEMAND_USD,
    )  # fmt: skip


def run_paper(traces: list[SpotTrace], windows: int) -> tuple[list[dict[str, Any]], list[str]]:
    """Every trace long enough for a deadline, ``windows`` start times each, every
    policy: one record each (``slack``: the deadline over the work). Also the traces
    skipped, with why."""
    records: list[dict[str, Any]] = []
    skipped: list[str] = []
    on_demand: dict[Workload, Outcome] = {}  # on-demand ignores the trace
    for trace in traces:
        for deadline_h in PAPER_DEADLINES_H:
            ticks = math.ceil(deadline_h * 3600 / trace.gap_s) + 1
            if ticks > len(trace.available):
                skipped.append(f"{trace.name}: {trace.hours:.0f} h < {deadline_h:g} h")
                continue
            work = paper_workload(trace, deadline_h)
            rng = random.Random(trace.name)
            for window in range(windows):
                start = rng.randrange(len(trace.available) - ticks + 1)
                for policy in POLICIES:
                    if policy == "on-demand" and work in on_demand:
                        outcome = on_demand[work]
                    else:
                        outcome = simulate(trace.capacity(start), policy, work, window)
                    if policy == "on-demand":
                        on_demand[work] = outcome
                    records.append(
                        {"trace": trace.family, "file": trace.name, "start_tick": start,
                         "seed": window, "slack": round(deadline_h / PAPER_HOURS, 3),
                         "hosts": trace.nodes, "policy": policy,
                         "cost": round(outcome.cost, 3), "finished_h": outcome.finished_h,
                         "spot_share": round(outcome.spot_share, 3)}
                    )  # fmt: skip
    return records, skipped


# ------------------------------------------------------------------ the rows


POLICIES = ("deadline", "today", "on-demand")


def run_all(seeds: int) -> list[dict[str, Any]]:
    """Every trace, slack and policy: one record each."""
    records = []
    for name, seed, trace in traces(seeds):
        for slack in SLACKS:
            for policy in POLICIES:
                outcome = simulate(trace, policy, synthetic_workload(slack), seed)
                records.append(
                    {"trace": name, "seed": seed, "slack": slack, "policy": policy,
                     "cost": round(outcome.cost, 3), "finished_h": outcome.finished_h,
                     "spot_share": round(outcome.spot_share, 3)}
                )  # fmt: skip
    return records


def summarize(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per trace family and slack: cost per policy, deadlines met, and the two targets
    (every deadline met where on-demand meets it; cost <= today's on every trace)."""
    runs: dict[tuple[str, float, str, int], dict[str, dict[str, Any]]] = {}
    for record in records:
        key = (record["trace"], record["slack"], record.get("file", ""), record["seed"])
        runs.setdefault(key, {})[record["policy"]] = record
    table: dict[tuple[str, float], dict[str, Any]] = {}
    for (trace, slack, _file, _seed), by_policy in runs.items():
        line = table.setdefault(
            (trace, slack),
            {"trace": trace, "slack": slack, "runs": 0, "missed_where_od_met": 0,
             "dearer_than_today": 0, **{f"{p}_cost": 0.0 for p in POLICIES},
             **{f"{p}_met": 0 for p in POLICIES}, "saved_vs_od": []},
        )  # fmt: skip
        line["runs"] += 1
        line["saved_vs_od"].append(
            1 - by_policy["deadline"]["cost"] / by_policy["on-demand"]["cost"]
        )
        for policy, record in by_policy.items():
            line[f"{policy}_cost"] += record["cost"]
            line[f"{policy}_met"] += record["finished_h"] is not None
        od_met = by_policy["on-demand"]["finished_h"] is not None
        if od_met and by_policy["deadline"]["finished_h"] is None:
            line["missed_where_od_met"] += 1
        if by_policy["deadline"]["cost"] > by_policy["today"]["cost"] + 1e-9:
            line["dearer_than_today"] += 1
    for line in table.values():
        for policy in POLICIES:
            line[f"{policy}_cost"] = round(line[f"{policy}_cost"] / line["runs"], 2)
        saved = line.pop("saved_vs_od")
        line["saved_vs_od_range"] = [round(min(saved), 3), round(max(saved), 3)]
    return list(table.values())


def side_by_side(lines: list[dict[str, Any]]) -> str:
    """The summary as a table: mean cost per policy and their ratios, deadlines met."""
    width = max([22, *(len(line["trace"]) + 2 for line in lines)])
    out = [
        f"{'trace':<{width}}{'slack':>6}{'runs':>5}  {'deadline $':>10}{'today $':>9}"
        f"{'od $':>9}{'dl/today':>9}{'dl/od':>7}  {'met dl/today/od':>16}"
        f"{'missed*':>8}{'dearer':>7}  {'saved vs od':>11}"
    ]
    for line in lines:
        dl, today, od = (line[f"{p}_cost"] for p in POLICIES)
        met = "/".join(str(line[f"{p}_met"]) for p in POLICIES)
        out.append(
            f"{line['trace']:<{width}}{line['slack']:>6}{line['runs']:>5}  {dl:>10.2f}{today:>9.2f}"
            f"{od:>9.2f}{dl / today:>9.2f}{dl / od:>7.2f}  {met:>16}"
            f"{line['missed_where_od_met']:>8}{line['dearer_than_today']:>7}"
            f"  {'{:.0%}-{:.0%}'.format(*line['saved_vs_od_range']):>11}"
        )
    out.append("missed*: deadlines the deadline policy missed where always-on-demand met them")
    out.append("dearer: traces where the deadline policy cost more than today's policy")
    out.append("saved vs od: the deadline policy's saving on always-on-demand, lowest-highest run")
    return "\n".join(out)


def measure(
    quick: bool, traces: list[SpotTrace] | None = None, windows: int = PAPER_WINDOWS
) -> list[Row]:
    """bench/run's rows: per slack, the deadline policy's mean cost against today's
    policy and against always-on-demand, over every synthetic trace; with ``traces``
    (the paper's), the same per deadline over those."""
    records = run_all(seeds=1 if quick else 5)
    name = "deadline_sim-quick" if quick else "deadline_sim"  # --quick keeps the full table
    rows = _report(records, name, f"{BENCHMARK}, deadline {{}}x the work")
    if traces:
        paper, skipped = run_paper(traces, windows)
        rows += _report(paper, "deadline_sim-paper", PAPER_BENCHMARK + ", deadline {}x", skipped)
    return rows


def _report(
    records: list[dict[str, Any]], name: str, title: str, skipped: list[str] | None = None
) -> list[Row]:
    """Write ``bench/results/<name>.{json,txt}``, print the table, return the rows."""
    lines = summarize(records)
    RESULTS.mkdir(parents=True, exist_ok=True)
    table = side_by_side(lines)
    if skipped:
        table += "\nskipped (shorter than the deadline):\n  " + "\n  ".join(skipped)
    (RESULTS / f"{name}.json").write_text(
        json.dumps({"records": records, "summary": lines, "skipped": skipped or []}, indent=1)
        + "\n"
    )
    (RESULTS / f"{name}.txt").write_text(table + "\n")
    print(table)
    rows = []
    for slack in sorted({r["slack"] for r in records}):
        mine = [r for r in records if r["slack"] == slack]
        cost = {p: _mean(r["cost"] for r in mine if r["policy"] == p) for p in POLICIES}
        met = {p: sum(r["finished_h"] is not None for r in mine if r["policy"] == p)
               for p in POLICIES}  # fmt: skip
        missed = sum(line["missed_where_od_met"] for line in lines if line["slack"] == slack)
        dearer = sum(line["dearer_than_today"] for line in lines if line["slack"] == slack)
        extra = {"deadlines_met": met, "runs": len(mine) // len(POLICIES),
                 "missed_where_on_demand_met": missed, "dearer_than_today": dearer}  # fmt: skip
        rows.append(row(title.format(slack), "mean cost, USD", cost["deadline"],
                        "today's policy", cost["today"], "<= 1x", extra))  # fmt: skip
        rows.append(row(title.format(slack), "mean cost, USD", cost["deadline"],
                        "always on-demand", cost["on-demand"], "<= 1x", extra))  # fmt: skip
    return rows


def _mean(values: Iterator[float] | Any) -> float:
    values = list(values)
    return sum(values) / len(values) if values else math.nan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="one seed per synthetic trace")
    parser.add_argument(
        "--traces", type=Path, metavar="DIR",
        help="also run the paper's traces: a directory of spot-traces JSON files "
        "(github.com/skypilot-org/spot-traces)",
    )  # fmt: skip
    parser.add_argument(
        "--windows", type=int, default=PAPER_WINDOWS, metavar="N",
        help=f"start times per trace file (default {PAPER_WINDOWS})",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.windows < 1:
        parser.error("--windows must be at least 1")
    traces = None
    if args.traces is not None:
        try:
            traces = read_traces(args.traces)
        except ValueError as exc:
            parser.error(str(exc))
    logging.getLogger("spotring").setLevel(logging.ERROR)  # each fallback is a warning
    print(format_table(measure(args.quick, traces, args.windows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
