"""``spotring report FILE``: a run's events file drawn as one page.

The chart shows the ring's world size, the READY hosts and the target size over time,
with the notices, host failures and the spans the ring stood still: the ``stall``
records, each the ring's longest time without any commit around a reset (an events
file written before spotring recorded progress has none, and the page says so: its
``ring_formed.since_change_s`` measured the time to a new ring, during which the old
one may well have trained on, so it is not drawn as a stall), and, for a job of
several groups, each capacity shortage, fallback and hand-back. The page adds the cost
line (instance-hours by lifecycle, priced with ``--price-spot`` /
``--price-on-demand``), instance-hours and cost by group and lifecycle (each hour at its
group's price then, as the file's ``price`` records say, ``--price
GROUP_OR_LIFECYCLE=USD`` first: :mod:`~spotring.autoscaler.observers.cost`) with what
they would have cost on-demand, the share on spot and the cost per committed step, the
time the job spent below its target, and every event but the per-refresh ones in a
table. HTML embeds the chart; ``-o x.png`` writes
only it.
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spotring.autoscaler.observers.cost import BILLED_STATES, Cost, CostMeter
from spotring.autoscaler.observers.events import VERSION

_QUIET = frozenset({"refresh", "instance_state", "cost"})
"""Events left out of the table (there is one per refresh, state change or progress
record)."""


NO_PROGRESS_LABEL = "ring stood still: not recorded"
NO_PROGRESS_NOTE = (
    "This events file has no progress records (it was written before spotring recorded "
    "the rings' commits): when the ring stood still is not shown."
)


class ReportError(Exception):
    """The events file cannot be drawn; the message says why, in one line."""


@dataclass
class Run:
    """What the events file says, relative to the first event's time."""

    events: list[dict[str, Any]]
    start: float
    end: float
    skipped_lines: int = 0
    world: list[tuple[float, int]] = field(default_factory=list)
    ready: list[tuple[float, int]] = field(default_factory=list)
    target: list[tuple[float, int]] = field(default_factory=list)
    notices: list[tuple[float, str]] = field(default_factory=list)
    failures: list[tuple[float, str]] = field(default_factory=list)
    lost_rings: list[float] = field(default_factory=list)
    """When a ring lost every worker (a new ring resumed from a durable checkpoint)."""
    stalls: list[tuple[float, float]] = field(default_factory=list)
    has_progress: bool = False
    """Whether the file records the rings' progress (``stall`` records)."""
    instance_hours: dict[str, float] = field(default_factory=dict)
    group_hours: dict[tuple[str, str], float] = field(default_factory=dict)
    """Instance-hours by (group, lifecycle); the group is empty for a one-group job."""
    below_target_s: float = 0.0
    """Seconds the job had fewer ready hosts than its target (refresh records)."""
    shortages: list[tuple[float, str]] = field(default_factory=list)
    fallbacks: list[tuple[float, str]] = field(default_factory=list)
    returns: list[tuple[float, str]] = field(default_factory=list)


def read_events(path: str | Path) -> Run:
    """Parse an events file; a truncated or foreign line is skipped and counted."""
    try:
        lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as error:
        raise ReportError(f"cannot read {path}: {error.strerror or error}") from None
    events, skipped = [], 0
    for line in lines:
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            skipped += line.strip() != ""
            continue
        if isinstance(event, dict) and isinstance(event.get("t"), (int, float)):
            if event.get("v", VERSION) > VERSION:
                raise ReportError(f"{path} is version {event['v']}; this spotring reads {VERSION}")
            events.append(event)
        else:
            skipped += 1
    if not events:
        raise ReportError(f"{path} holds no spotring events")
    events.sort(key=lambda e: e["t"])
    run = Run(events, events[0]["t"], events[-1]["t"], skipped)
    _timelines(run)
    return run


def _timelines(run: Run) -> None:
    below_since: float | None = None
    for event in run.events:
        at, kind = event["t"] - run.start, event.get("event")
        if kind == "ring_formed":
            run.world.append((at, int(event.get("size", 0))))
        elif kind == "stall":
            start, end = event.get("start"), event.get("end")
            if isinstance(start, (int, float)) and isinstance(end, (int, float)) and end >= start:
                run.stalls.append((start - run.start, end - run.start))
        elif kind == "job_started":
            run.has_progress = run.has_progress or event.get("progress") is True
        elif kind == "refresh" and event.get("error") is None:
            run.ready.append((at, int(event.get("ready", 0))))
            if isinstance(event.get("target"), int):
                run.target.append((at, event["target"]))
                below = int(event.get("ready", 0)) < event["target"]
                if below and below_since is None:
                    below_since = at
                elif not below and below_since is not None:
                    run.below_target_s += at - below_since
                    below_since = None
        elif kind == "capacity_shortage":
            run.shortages.append((at, f"{event.get('group')} {event.get('code')}"))
        elif kind == "fell_back":
            hosts = event.get("hosts")
            run.fallbacks.append((at, f"{event.get('from')} -> {event.get('to')} ({hosts})"))
        elif kind == "returned":
            run.returns.append((at, f"{event.get('host')} back from {event.get('group')}"))
        elif kind == "membership":
            run.ready.append((at, len(event.get("ready", ()))))
        elif kind == "notice":
            run.notices.append((at, f"{event.get('host')} {event.get('kind')}"))
        elif kind == "host_failed":
            run.failures.append((at, str(event.get("host"))))
        elif kind == "ring_lost":
            run.lost_rings.append(at)
            run.world.append((at, 0))  # no worker until the next ring forms
        elif kind == "progress":
            run.has_progress = True
        elif kind == "job_finished":
            run.world.append((at, 0))
    end = run.end - run.start
    if below_since is not None:
        run.below_target_s += end - below_since
    run.group_hours = dict(replay_cost(run).hours)
    for (_, lifecycle), hours in run.group_hours.items():
        run.instance_hours[lifecycle] = run.instance_hours.get(lifecycle, 0.0) + hours


def replay_cost(run: Run, overrides: Mapping[str, float] | None = None) -> Cost:
    """The run's cost from its events: the billed members of its ``instance_state``
    records at the prices of its ``price`` records, ``overrides`` (``--price``) first."""
    meter = CostMeter(overrides)
    billed: dict[str, tuple[str, str]] = {}  # id -> (group, lifecycle), as first billed
    for event in run.events:
        at, kind = event["t"], event.get("event")
        if kind == "price":
            usd = event.get("usd")
            usd = float(usd) if isinstance(usd, (int, float)) else None
            meter.price(at, str(event.get("group") or ""), event.get("lifecycle"), usd)
        elif kind == "progress" and isinstance(event.get("steps"), int):
            epochs = event.get("epochs")
            epochs = float(epochs) if isinstance(epochs, (int, float)) else None
            samples = event.get("samples")
            samples = samples if isinstance(samples, int) else None
            meter.progress(int(event.get("ring") or 0), event["steps"], epochs, samples)
        elif kind == "instance_state":
            iid, state = str(event.get("id")), event.get("state")
            if state in BILLED_STATES and iid not in billed:
                group = str(event.get("group") or "")
                billed[iid] = (group, str(event.get("lifecycle") or "on-demand"))
            elif state not in BILLED_STATES and iid in billed:
                del billed[iid]
            else:
                continue
            meter.members(at, Counter(billed.values()))
    return meter.cost(run.end)


def cost_line(run: Run, price_spot: float | None, price_on_demand: float | None) -> str:
    """Instance-hours by lifecycle, and what they cost and saved at the given prices."""
    spot = run.instance_hours.get("spot", 0.0)
    on_demand = run.instance_hours.get("on-demand", 0.0)
    line = f"{spot:.3f} spot and {on_demand:.3f} on-demand instance-hours"
    if price_spot is None or price_on_demand is None:
        return line + " (give --price-spot and --price-on-demand for the cost)"
    cost = spot * price_spot + on_demand * price_on_demand
    all_on_demand = (spot + on_demand) * price_on_demand
    saved = all_on_demand - cost
    share = f" ({saved / all_on_demand:.0%})" if all_on_demand else ""
    return (
        f"{line}: ${cost:.2f} at ${price_spot:g}/h spot and ${price_on_demand:g}/h on-demand;"
        f" on demand only: ${all_on_demand:.2f}, saved ${saved:.2f}{share}"
    )


def group_cost_line(run: Run, prices: Mapping[str, float]) -> str:
    """Instance-hours and cost by group and lifecycle, each hour at its group's price
    then (the events file's ``price`` records), ``prices`` (``--price
    GROUP_OR_LIFECYCLE=USD``) first; what they would have cost on-demand, the share on
    spot and the cost per committed step. 'no prices given' without any price."""
    cost = replay_cost(run, prices)
    if not cost.hours:
        return "no instances recorded"
    parts = []
    for key, hours in sorted(cost.hours.items()):
        group, lifecycle = key
        name = f"{group} ({lifecycle})" if group else lifecycle
        usd = cost.usd.get(key)
        if usd is None:
            parts.append(f"{name}: {hours:.3f} h")
        else:
            at = f" at ${usd / hours:g}/h" if hours else ""
            parts.append(f"{name}: {hours:.3f} h, ${usd:.2f}{at}")
    line = "; ".join(parts)
    if not cost.usd:
        return f"{line} (no prices given: --price GROUP_OR_LIFECYCLE=USD_PER_HOUR)"
    unpriced = sum(1 for key in cost.hours if key not in cost.usd)
    if unpriced:
        line += f"; ${cost.total_usd:.2f} for those priced (no price for {unpriced})"
    else:
        line += f"; total ${cost.total_usd:.2f}"
    if cost.all_on_demand_usd:
        all_on_demand = cost.all_on_demand_usd
        saved = (all_on_demand - cost.total_usd) / all_on_demand
        line += f"; all on-demand ${all_on_demand:.2f} (saved {saved:.0%})"
    if cost.spot_share is not None:
        line += f"; {cost.spot_share:.0%} of the hours on spot"
    if cost.per_step_usd is not None:
        line += f"; ${cost.per_step_usd:.6g} per committed step ({cost.steps} steps)"
    if cost.per_epoch_usd is not None and cost.epochs is not None:
        line += f"; ${cost.per_epoch_usd:.6g} per epoch ({cost.epochs:.3g} epochs)"
    if cost.per_sample_usd is not None:
        line += f"; ${cost.per_sample_usd:.6g} per sample ({cost.samples} samples)"
    elif cost.steps and cost.samples is None:
        line += "; cost per sample unknown (no worker committed an elastic sampler)"
    return line


def chart_png(run: Run) -> bytes:
    """The timeline chart as PNG bytes."""
    try:
        import matplotlib
    except ImportError:
        raise ReportError("the report needs matplotlib: pip install 'spotring[report]'") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(12, 4.5), dpi=100)
    for series, label, style in (
        (run.world, "world size (workers in the ring)", {"color": "tab:blue", "lw": 2}),
        (run.ready, "READY hosts", {"color": "tab:green"}),
        (run.target, "target hosts", {"color": "tab:gray", "ls": "--"}),
    ):
        if series:
            xs, ys = zip(*_extend(series, run.end - run.start), strict=True)
            axes.step(xs, ys, where="post", label=label, **style)
    for start, end in run.stalls:
        axes.axvspan(start, end, color="tab:red", alpha=0.12, lw=0)
    for at, _ in run.notices:
        axes.axvline(at, color="tab:orange", ls=":", lw=1.5)
    for at, _ in run.failures:
        axes.axvline(at, color="tab:red", ls="-", lw=1)
    for at in run.lost_rings:
        axes.axvline(at, color="tab:purple", ls="--", lw=2)
    for at, _ in run.fallbacks:
        axes.axvline(at, color="tab:brown", ls="-.", lw=1.5)
    for at, _ in run.returns:
        axes.axvline(at, color="tab:olive", ls="-.", lw=1.5)
    handles, _ = axes.get_legend_handles_labels()
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles += [
        Line2D([], [], color="tab:orange", ls=":", label="interruption notice"),
        Line2D([], [], color="tab:red", label="host failure"),
        Line2D(
            [], [], color="tab:purple", ls="--", lw=2, label="ring lost: resumed from a checkpoint"
        ),
        *(
            [
                Line2D([], [], color="tab:brown", ls="-.", label="fell back to a later group"),
                Line2D([], [], color="tab:olive", ls="-.", label="host handed back"),
            ]
            if run.fallbacks or run.returns
            else []
        ),
        Patch(
            color="tab:red",
            alpha=0.12 if run.has_progress else 0.0,
            label="ring stood still (no commit)" if run.has_progress else NO_PROGRESS_LABEL,
        ),
    ]
    axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    axes.set_xlabel("seconds since the run started")
    axes.set_ylabel("count")
    axes.set_ylim(bottom=0)
    from matplotlib.ticker import MaxNLocator

    axes.yaxis.set_major_locator(MaxNLocator(integer=True))
    axes.grid(alpha=0.3)
    buffer = io.BytesIO()
    figure.tight_layout()
    figure.savefig(buffer, format="png")
    plt.close(figure)
    return buffer.getvalue()


def _extend(series: list[tuple[float, int]], end: float) -> list[tuple[float, int]]:
    return [*series, (max(end, series[-1][0]), series[-1][1])]


def render_html(run: Run, png: bytes, cost: str, by_group: str = "") -> str:
    """A self-contained page: chart, cost line, table of events."""
    rows = "\n".join(
        f"<tr><td>{event['t'] - run.start:8.1f}</td><td>{html.escape(str(event['event']))}"
        f"</td><td>{html.escape(_details(event))}</td></tr>"
        for event in run.events
        if event.get("event") not in _QUIET
    )
    note = f"<p>{run.skipped_lines} unreadable line(s) skipped.</p>" if run.skipped_lines else ""
    if not run.has_progress:
        note += f'<p class="no-progress">{html.escape(NO_PROGRESS_NOTE)}</p>'
    stood = sum(end - start for start, end in run.stalls)
    stalls = f"; the ring stood still {stood:.1f} s in {len(run.stalls)} stall(s)"
    chart = base64.b64encode(png).decode()
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>spotring run report</title>
<style>body{{font-family:sans-serif;margin:2em}}td{{padding:0 1em 0 0;vertical-align:top}}
th{{text-align:left}}table{{border-collapse:collapse;font-size:90%}}</style></head>
<body><h1>spotring run report</h1>
<p>{len(run.world) and max(s for _, s in run.world)} workers at most;
{len(run.notices)} notice(s), {len(run.failures)} host failure(s),
{max(0, sum(1 for e in run.events if e.get("event") == "ring_formed") - 1)} reset(s)
in {run.end - run.start:.0f} s{stalls if run.has_progress else ""}.</p>
<img alt="world size, READY and target hosts over time" src="data:image/png;base64,{chart}">
<h2>Cost</h2><p class="cost">{html.escape(cost)}</p>
<p class="groups">By group: {html.escape(by_group)}</p>
<p class="capacity">Below target {run.below_target_s:.0f} s; {len(run.shortages)} capacity
shortage(s), {len(run.fallbacks)} fallback(s), {len(run.returns)} host(s) handed back.</p>
{note}
<h2>Events</h2><table><tr><th>s</th><th>event</th><th>details</th></tr>
{rows}
</table></body></html>
"""


def _details(event: dict[str, Any]) -> str:
    return ", ".join(
        f"{key}={value}" for key, value in event.items() if key not in ("v", "t", "event")
    )


def write_report(
    events: str | Path,
    output: str | Path,
    price_spot: float | None = None,
    price_on_demand: float | None = None,
    prices: Mapping[str, float] | None = None,
) -> str:
    """Write the report of ``events`` to ``output`` (.png: the chart only). Returns a
    line saying what was written.

    ``prices``: USD per instance-hour by group name or lifecycle (``spot``,
    ``on-demand``); ``price_spot`` / ``price_on_demand`` count as the lifecycles'."""
    run = read_events(events)
    png = chart_png(run)
    path = Path(output)
    try:
        if path.suffix.lower() == ".png":
            path.write_bytes(png)
        else:
            every = dict(prices or {})
            if price_spot is not None:
                every.setdefault("spot", price_spot)
            if price_on_demand is not None:
                every.setdefault("on-demand", price_on_demand)
            cost = cost_line(run, price_spot, price_on_demand)
            path.write_text(render_html(run, png, cost, group_cost_line(run, every)))
    except OSError as error:
        raise ReportError(f"cannot write {output}: {error.strerror or error}") from None
    return f"wrote {path} ({len(run.events)} events, {run.end - run.start:.0f} s)"
