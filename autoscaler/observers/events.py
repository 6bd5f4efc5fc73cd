"""``spotring run --events FILE``: what the job did, one JSON object per line.

Every line has ``v`` (the format's version, :data:`VERSION`), ``t`` (epoch seconds) and
``event``; the rest depends on the event: :data:`EVENTS` declares every event and its
fields (the docs' events page is made from it, and a test checks what the log writes
against it). The file is line-buffered: a crash loses at most the line being written.
The log is a plugin: it hears the job's, the controller's and the rings' events through
the same hooks a third-party plugin would; they come on several threads, and each line
is written whole under a lock.

``spotring report FILE`` (:mod:`spotring.autoscaler.observers.report`) reads it back.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from spotring.autoscaler.groups import group_names
from spotring.autoscaler.observers.cost import LiveCost
from spotring.core import CapacityShortage, Instance, InstanceState, InterruptionNotice, Lifecycle
from spotring.core.hooks import hookimpl
from spotring.core.inventory import Inventory
from spotring.core.job import JobShape
from spotring.core.prices import HourlyPrice
from spotring.driver.ring_events import Hang, RingStatus, Stall
from spotring.providers.base import Provider

VERSION = 1
"""Bumped when a field changes meaning or goes away; new fields do not bump it."""

PROVIDER_LOGGER = "spotring.providers"


@dataclass(frozen=True)
class EventKind:
    """One kind of line of the events file: when it is written, and each field it may
    have besides ``v``, ``t`` and ``event``, with what the field holds."""

    when: str
    fields: Mapping[str, str]


EVENTS: Mapping[str, EventKind] = {
    "job_started": EventKind(
        "once, as a run starts",
        {
            "provider": "the provider's name",
            "np": "worker processes to start with (`-np`)",
            "min_np": "fewest workers to keep training (`--min-np`)",
            "max_np": "most workers to scale up to (`--max-np`)",
            "progress": "true: the file has `progress` and `stall` records",
            "groups": "a job of several groups only: their names, most preferred first",
        },
    ),
    "refresh": EventKind(
        "after every listing of the group, successful or not",
        {
            "seconds": "how long the listing took",
            "calls": "cloud API requests it made, where the provider counts them, else null",
            "error": "the failure's message; null when the listing worked",
            "hosts": "members by state (`{state: count}`)",
            "ready": "members Horovod may use",
            "target": "the group size spotring asks for; null before it asked",
        },
    ),
    "instance_state": EventKind(
        "a member's state changed (one no longer listed has only `id` and `state: gone`)",
        {
            "id": "the cloud's id of the member",
            "address": "the address workers are reached at",
            "state": "`pending`, `ready`, `draining`, `terminating` or `gone`",
            "lifecycle": "`spot` or `on-demand`",
            "group": "the group it belongs to (empty for a job of one group)",
            "slots": "worker processes it runs",
            "zone": "its zone, where the cloud says",
            "instance_type": "its instance type, where the cloud says",
        },
    ),
    "membership": EventKind(
        "the set of READY hosts changed",
        {
            "added": "addresses that became READY",
            "removed": "addresses that stopped being READY",
            "ready": "every READY address after the change",
        },
    ),
    "notice": EventKind(
        "a host announced its interruption",
        {
            "host": "its address",
            "id": "its instance id",
            "kind": "`preempt`, `terminate` or `rebalance`",
            "deadline": "epoch seconds the cloud gave, or null",
            "draining": "whether the host left the job at once",
        },
    ),
    "host_failed": EventKind(
        "a host was taken out of the job",
        {
            "host": "its address",
            "id": "its instance id",
            "reason": "why, e.g. `worker rank 2 exited with -9` (`hung: ...` after a `hang`)",
        },
    ),
    "provider_warning": EventKind(
        "the provider warned (a capacity shortage, an eviction, ...)",
        {"source": "the logger that warned", "message": "the warning"},
    ),
    "ring_formed": EventKind(
        "Horovod assigned ranks: the first ring, and one per reset",
        {
            "size": "the ring's workers",
            "hosts": "its hosts' addresses",
            "since_change_s": "seconds from the last membership change, failure or notice to"
            " this ring (the old ring may have trained meanwhile: see `stall`); null if none",
        },
    ),
    "progress": EventKind(
        "the current ring's progress, as it forms and every 10 s",
        {
            "ring": "its generation: 1, then +1 per reset",
            "size": "its workers",
            "steps": "the most commits any member made since it formed",
            "idle_s": "seconds since its last commit (or its formation)",
            "slowest": "`host[local_rank]` of the member whose last commit is oldest",
            "epochs": "the job's epochs (epoch + the elastic sampler's share of the dataset"
            " processed) at its latest commit; null: no sampler committed",
            "samples": "the job's samples (epoch x the dataset's length + the samples"
            " processed in it) at that commit; null: no sampler committed",
        },
    ),
    "stall": EventKind(
        "once per reset, once the new ring commits: its longest time without any commit",
        {
            "ring": "the generation whose first commit ended it",
            "start": "epoch seconds it began",
            "end": "epoch seconds it ended",
            "seconds": "how long it lasted",
        },
    ),
    "hang": EventKind(
        "`--hang-timeout` ran out: the member that holds the ring up is failed",
        {
            "ring": "the ring's generation",
            "host": "the member's host",
            "local_rank": "the member's local rank on it",
            "idle_s": "the ring's seconds without progress",
            "member_idle_s": "the member's",
            "reason": "also the `host_failed` reason, which starts `hung:`",
        },
    ),
    "ring_lost": EventKind(
        "with `--checkpoint`, every worker of the ring was lost: a new ring resumes from"
        " durable storage",
        {
            "size": "workers the lost ring had",
            "why": "what ended it, in a few words",
            "resumed_from": "the checkpoint resumed from (`commits`, `age_seconds`, `name`);"
            " null when there is none or the store could not be read",
            "lost": "what the resume loses: `commits` and `seconds` (null when no commit was"
            " reported)",
        },
    ),
    "job_finished": EventKind(
        "once, after the job ended and everything stopped",
        {
            "ok": "whether the job succeeded",
            "exit_code": "the exit status of `spotring run`",
            "seconds": "how long the run took",
            "world_sizes": "the size of every ring Horovod formed, in order",
            "resets": "rings formed after the first",
            "cost": "the job's cost at its end, as a `cost` record holds it",
        },
    ),
    "capacity_shortage": EventKind(
        "a group of the job was found short",
        {
            "group": "the group's name",
            "cause": "`capacity`, `quota`, `price` or `other`",
            "code": "the cloud's code (`BelowTarget`: below its size too long, no code)",
            "message": "the cloud's message",
            "at": "epoch seconds the cloud reported it, or null",
        },
    ),
    "fell_back": EventKind(
        "a short group's shortfall is asked of a later group",
        {
            "from": "the short group",
            "to": "the group asked instead",
            "hosts": "how many hosts of the short group's share it is asked for",
        },
    ),
    "returned": EventKind(
        "a fallback host left the ring and was handed back",
        {
            "host": "its address",
            "id": "its instance id",
            "group": "the group it left",
            "in_group_s": "how long it had been in that group",
        },
    ),
    "group_demoted": EventKind(
        "a group was preempted 3 times within an hour: it is asked after the others",
        {"group": "the group's name", "until": "epoch seconds the demotion ends"},
    ),
    "deadline": EventKind(
        "the deadline policy (`--deadline`) changed its mode",
        {
            "mode": "`spot`, `catch-up`, `safety-net` or `done`",
            "reason": "why, in a few words",
            "done": "steps the rings committed so far (epochs with `--total-epochs`)",
            "total": "`--total-steps` (or `--total-epochs`)",
            "projected_finish": "epoch seconds the rest is done at the ring's size; null: "
            "no progress",
            "slack_s": "seconds the job may still stand still and finish on a full ring; null: "
            "rate unknown yet",
            "deadline": "epoch seconds",
        },
    ),
    "price": EventKind(
        "a group's price per member-hour was first read or changed (its cloud's, or `--price`)",
        {
            "group": "the group's name",
            "lifecycle": "`spot` or `on-demand`, where the group says; else null",
            "usd": "USD per member-hour; null: unknown (not counted in the cost)",
            "source": "where it came from: `aws:DescribeSpotPriceHistory`, `--price`, ...",
            "read_at": "epoch seconds it was read",
        },
    ),
    "cost": EventKind(
        "the job's cost so far: with each `progress` record and after a `price` (the"
        " last one is `job_finished`'s `cost`)",
        {
            "usd": "USD so far: each billed member-hour (pending, ready, draining) at its"
            " group's price then",
            "by_group": "`[{group, lifecycle, hours, usd}]` (`usd` null: no price known)",
            "unpriced_hours": "instance-hours of groups whose price was unknown",
            "all_on_demand_usd": "what the same hours would have cost on-demand (the job's"
            " on-demand price); null without one",
            "spot_share": "the time-weighted share of instance-hours on spot",
            "steps": "steps the rings committed (each ring's most commits, summed)",
            "usd_per_step": "USD per committed step; null before one or while hours are unpriced",
            "epochs": "epochs trained in this run (the job's epochs at the latest commit less"
            " at the first reported); null: no sampler committed",
            "usd_per_epoch": "USD per epoch trained; null before any or while hours are unpriced",
            "samples": "samples trained in this run, counted as `epochs` are; null: no"
            " sampler committed",
            "usd_per_sample": "USD per sample trained (6 significant digits); null before"
            " any, without a sampler or while hours are unpriced",
        },
    ),
}
"""Every event the log writes, by name."""


def host_record(instance: Instance) -> dict[str, Any]:
    """An instance as the events file shows it."""
    return {
        "id": instance.id,
        "address": instance.address,
        "state": instance.state.value,
        "lifecycle": instance.lifecycle.value,
        "group": instance.group,
        "slots": instance.slots,
        "zone": instance.zone,
        "instance_type": instance.instance_type,
    }


class EventLog:
    """Writes the events of one run to ``path`` (appending)."""

    def __init__(self, path: str | Path) -> None:
        self._stream: IO[str] = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115
        self._lock = threading.Lock()
        self._states: dict[str, InstanceState] = {}  # instance id -> state last written
        self._last_change: float | None = None  # monotonic time of the last host change
        self._cost = LiveCost()
        # Providers warn through logging (capacity shortages, evictions, ...): keep those.
        self._warnings = _ProviderWarnings(self)
        logging.getLogger(PROVIDER_LOGGER).addHandler(self._warnings)

    def write(self, event: str, **fields: Any) -> None:
        """One line: ``{"v", "t", "event", **fields}``."""
        record = {"v": VERSION, "t": round(time.time(), 3), "event": event, **fields}
        line = json.dumps(record, separators=(",", ":"), default=str)
        with self._lock:
            if not self._stream.closed:
                self._stream.write(line + "\n")

    def close(self) -> None:
        logging.getLogger(PROVIDER_LOGGER).removeHandler(self._warnings)
        with self._lock:
            self._stream.close()

    # ------------------------------------------------------- the job and the ring

    @hookimpl
    def spotring_job_started(
        self, provider: Provider, job: JobShape, groups: Sequence[Provider]
    ) -> None:
        # progress: this file records the rings' progress and stalls (older ones do not);
        # groups: a job of several only, most preferred first.
        several = {"groups": group_names(groups)} if len(groups) > 1 else {}
        self.write(
            "job_started",
            provider=provider.name,
            np=job.num_proc,
            min_np=job.min_num_proc,
            max_np=job.max_num_proc,
            progress=True,
            **several,
        )

    @hookimpl
    def spotring_ring_formed(self, size: int, hosts: Sequence[str]) -> None:
        """Horovod assigned ranks for a new ring (a reset, after the first)."""
        since = None if self._last_change is None else time.monotonic() - self._last_change
        self.write(
            "ring_formed",
            size=size,
            hosts=list(hosts),
            since_change_s=None if since is None else round(since, 3),
        )

    @hookimpl
    def spotring_ring_progress(self, status: RingStatus) -> None:
        """The current ring's progress (as it forms, then every 10 s)."""
        self.write(
            "progress",
            ring=status.ring,
            size=status.size,
            steps=status.steps,
            idle_s=status.idle_s,
            slowest=status.slowest,
            epochs=status.epochs,
            samples=status.samples,
        )
        self._cost.progressed(status)
        self.write("cost", **self._cost.cost().record())

    @hookimpl
    def spotring_ring_stalled(self, stall: Stall) -> None:
        """The ring's longest time without a commit around a reset."""
        self.write(
            "stall",
            ring=stall.ring,
            start=stall.start,
            end=stall.end,
            seconds=round(stall.seconds, 3),
        )

    @hookimpl
    def spotring_ring_lost(
        self, size: int, why: str, checkpoint: dict[str, Any] | None, lost: dict[str, Any]
    ) -> None:
        """Every worker of the ring was lost; a new ring resumes from ``checkpoint``."""
        self.write("ring_lost", size=size, why=why, resumed_from=checkpoint, lost=lost)

    @hookimpl
    def spotring_ring_hung(self, hang: Hang) -> None:
        """A ring made no progress for ``--hang-timeout``: its slowest member is failed."""
        self.write(
            "hang",
            ring=hang.ring,
            host=hang.host,
            local_rank=hang.local_rank,
            idle_s=hang.idle_s,
            member_idle_s=hang.member_idle_s,
            reason=hang.reason,
        )

    @hookimpl
    def spotring_job_finished(
        self, ok: bool, exit_code: int, seconds: float, world_sizes: Sequence[int]
    ) -> None:
        self.write(
            "job_finished",
            ok=ok,
            exit_code=exit_code,
            seconds=round(seconds, 3),
            world_sizes=list(world_sizes),
            resets=max(0, len(world_sizes) - 1),
            cost=self._cost.cost().record(),
        )

    # --------------------------------------------------------- the controller

    @hookimpl
    def spotring_refreshed(
        self,
        inventory: Inventory | None,
        seconds: float,
        calls: int | None,
        error: str | None,
        target: int | None,
    ) -> None:
        counts: dict[str, int] = {}
        if inventory is not None and error is None:
            self._cost.listed(inventory)
            for instance in inventory.instances:
                counts[instance.state.value] = counts.get(instance.state.value, 0) + 1
                if self._states.get(instance.id) is not instance.state:
                    self._states[instance.id] = instance.state
                    self.write("instance_state", **host_record(instance))
            listed = {i.id for i in inventory.instances}
            for gone in [i for i in self._states if i not in listed]:
                if self._states.pop(gone) is not InstanceState.GONE:
                    self.write("instance_state", id=gone, state=InstanceState.GONE.value)
        self.write(
            "refresh",
            seconds=round(seconds, 4),
            calls=calls,
            error=error,
            hosts=counts,
            ready=len(inventory.ready) if inventory is not None else 0,
            target=target,
        )

    @hookimpl
    def spotring_inventory_changed(
        self, added: Sequence[Instance], removed: Sequence[Instance], ready: Sequence[Instance]
    ) -> None:
        self._last_change = time.monotonic()
        self.write(
            "membership",
            added=[i.address for i in added],
            removed=[i.address for i in removed],
            ready=[i.address for i in ready],
        )

    @hookimpl
    def spotring_host_failed(self, instance: Instance, reason: str) -> None:
        self._last_change = time.monotonic()
        self.write("host_failed", host=instance.address, id=instance.id, reason=reason)

    @hookimpl
    def spotring_host_noticed(
        self, instance: Instance, notice: InterruptionNotice, draining: bool
    ) -> None:
        self._last_change = time.monotonic()
        self.write(
            "notice",
            host=instance.address,
            id=instance.id,
            kind=notice.kind,
            deadline=notice.deadline,
            draining=draining,
        )

    # ------------------------------------------------------------- capacity

    @hookimpl
    def spotring_capacity_shortage(self, group: str, shortage: CapacityShortage) -> None:
        self.write(
            "capacity_shortage",
            group=group,
            cause=shortage.cause.value,
            code=shortage.code,
            message=shortage.message,
            at=shortage.at,
        )

    @hookimpl
    def spotring_fell_back(self, from_group: str, to_group: str, hosts: int) -> None:
        self.write("fell_back", **{"from": from_group, "to": to_group, "hosts": hosts})

    @hookimpl
    def spotring_returned(self, instance: Instance, group: str, seconds: float) -> None:
        self._last_change = time.monotonic()
        self.write(
            "returned",
            host=instance.address,
            id=instance.id,
            group=group,
            in_group_s=round(seconds, 3),
        )

    @hookimpl
    def spotring_group_demoted(self, group: str, until: float) -> None:
        self.write("group_demoted", group=group, until=round(until, 3))

    @hookimpl
    def spotring_price_changed(
        self, group: str, lifecycle: Lifecycle | None, price: HourlyPrice | None
    ) -> None:
        self._cost.priced(group, lifecycle, price)
        self.write(
            "price",
            group=group,
            lifecycle=None if lifecycle is None else lifecycle.value,
            usd=None if price is None else price.usd,
            source=None if price is None else price.source,
            read_at=None if price is None else round(price.read_at, 3),
        )
        self.write("cost", **self._cost.cost().record())

    @hookimpl
    def spotring_deadline_decided(
        self,
        mode: str,
        reason: str,
        done: int,
        total: int,
        projected_finish: float | None,
        slack_s: float | None,
        deadline: float,
    ) -> None:
        self.write(
            "deadline",
            mode=mode,
            reason=reason,
            done=done,
            total=total,
            projected_finish=projected_finish,
            slack_s=slack_s,
            deadline=round(deadline, 3),
        )


class _ProviderWarnings(logging.Handler):
    """Writes the providers' warnings (capacity shortages, evictions) as events."""

    def __init__(self, log: EventLog) -> None:
        super().__init__(logging.WARNING)
        self._log = log

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._log.write("provider_warning", source=record.name, message=record.getMessage())
        except Exception:  # a log handler must never raise into the code that logs
            self.handleError(record)
