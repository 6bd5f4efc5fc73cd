"""The local pool and its two groups: :class:`LocalProvider` (the simulated hosts, the
spot group, its chaos and its spot capacity) and :class:`LocalOnDemandGroup` (the
on-demand group behind it), and the provider's registration."""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spotring.core.hooks import hookimpl
from spotring.providers.base import (
    CapacityShortage,
    ConfigurationError,
    CoreOptions,
    Instance,
    InstanceState,
    InterruptionNotice,
    Lifecycle,
    Provider,
    ShortageCause,
    hosts_for_slots,
)
from spotring.providers.local.control import ControlFile
from spotring.providers.local.metadata import FakeImds
from spotring.providers.options import non_negative_int, non_negative_seconds

DEFAULT_NOTICE_LEAD_SECONDS = 10.0
NOTICE_POLL_SECONDS = 1.0  # as often as the AWS watcher polls a real host

SPOT_GROUP = "local-spot"
ON_DEMAND_GROUP = "local-on-demand"
CAPACITY_CODE = "InsufficientInstanceCapacity"
"""The code of the failed Auto Scaling activity a spot launch without capacity leaves
("Could not launch Spot Instances. InsufficientInstanceCapacity - ..."): the local
group reports its own shortage the same way."""

_HOST_PREFIX = {Lifecycle.SPOT: "host-", Lifecycle.ON_DEMAND: "od-"}
_GROUP_NAME = {Lifecycle.SPOT: SPOT_GROUP, Lifecycle.ON_DEMAND: ON_DEMAND_GROUP}

log = logging.getLogger(__package__)


@dataclass
class _Host:
    name: str
    launched_at: float
    lifecycle: Lifecycle = Lifecycle.SPOT
    state: InstanceState = InstanceState.PENDING
    process_groups: set[int] = field(default_factory=set)
    leaving: bool = False
    """It announced its interruption: the group already counts its replacement."""


class LocalProvider(Provider):
    """A group of simulated spot hosts whose workers are local processes.

    It owns the simulated pool (hosts, chaos, control file) and is its spot group;
    :attr:`on_demand` is the on-demand group behind it, which shares the pool.
    """

    name = "local"
    description = (
        "simulated spot group on this machine (host-0, host-1, ...) with an on-demand "
        "group behind it (od-0, ...), with chaos options"
    )
    runs_workers_locally = True
    tracks_worker_processes = True  # a preempted host's workers are killed with it
    can_remove = True

    def __init__(
        self,
        hosts: int,
        *,
        slots: int = 1,
        max_hosts: int = 64,
        boot_seconds: float = 0.0,
        scale_up_at: float | None = None,
        scale_up_to: int | None = None,
        preempt_at: Sequence[float] = (),
        preempt_host: str | None = None,
        notice_at: Sequence[float] = (),
        notice_lead: float = DEFAULT_NOTICE_LEAD_SECONDS,
        control: str | None = None,
        spot_capacity: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if hosts < 0 or hosts > max_hosts:
            raise ConfigurationError(f"--hosts must be between 0 and --max-hosts ({max_hosts})")
        if (scale_up_at is None) != (scale_up_to is None):
            raise ConfigurationError("--scale-up-at and --scale-up-to go together")
        if scale_up_to is not None and not 0 <= scale_up_to <= max_hosts:
            raise ConfigurationError(f"--scale-up-to must be between 0 and {max_hosts}")
        if spot_capacity is not None and spot_capacity < 0:
            raise ConfigurationError("--spot-capacity must not be negative")
        self._clock = clock
        self._started = clock()
        self._wall_started = time.time()
        self._slots = slots
        self._max_hosts = max_hosts
        self._boot_seconds = boot_seconds
        self._scale_up = (
            (scale_up_at, scale_up_to)
            if scale_up_at is not None and scale_up_to is not None  # both or neither, above
            else None
        )
        self._lock = threading.Lock()
        self._hosts: dict[str, _Host] = {}
        self._next_index = dict.fromkeys(Lifecycle, 0)
        self._desired = {Lifecycle.SPOT: hosts, Lifecycle.ON_DEMAND: 0}
        self._spot_capacity = spot_capacity
        self._shortage: CapacityShortage | None = None  # the newest failed spot launch
        self._short = False  # the last launch attempt found no spot capacity
        self._notice_lead = notice_lead
        self._imds: FakeImds | None = None
        self._closed = False
        self._timers = [
            threading.Timer(delay, self.preempt, kwargs={"name": preempt_host})
            for delay in sorted(preempt_at)
        ] + [
            threading.Timer(delay, self.notice, kwargs={"name": preempt_host})
            for delay in sorted(notice_at)
        ]
        self._control = ControlFile(Path(control)) if control else None
        self.events: list[tuple[float, str]] = []
        """(seconds since start, what happened), for summaries and tests: the pool's
        chaos and the spot group's hosts (the on-demand group keeps its own)."""
        self.on_demand = LocalOnDemandGroup(self)
        """The on-demand group behind this spot group, in the same pool."""
        self._maintain()
        for host in self._hosts.values():
            host.state = InstanceState.READY  # the group exists before the job starts
        for timer in self._timers:
            timer.daemon = True
            timer.start()

    # ------------------------------------------------------------ construction

    @classmethod
    def add_arguments(cls, group: argparse._ArgumentGroup) -> None:
        group.add_argument(
            "--hosts",
            type=non_negative_int,
            default=None,
            help="hosts the group starts with (default: enough for -np)",
        )
        group.add_argument(
            "--max-hosts",
            type=non_negative_int,
            default=64,
            help="largest size the group may reach (default: 64)",
        )
        group.add_argument(
            "--boot-seconds",
            type=non_negative_seconds,
            default=5.0,
            help="seconds a host launched during the job (scale-up, replacement) stays "
            "PENDING before it is READY (default: 5)",
        )
        group.add_argument(
            "--spot-capacity",
            type=non_negative_int,
            metavar="N",
            help="the most spot hosts the pool can supply (default: no limit): a launch "
            "beyond N fails for capacity, as a spot pool that ran dry, and the job falls "
            "back to the on-demand group (od-0, ...)",
        )
        group.add_argument(
            "--scale-up-at",
            type=non_negative_seconds,
            metavar="SECONDS",
            help="chaos: SECONDS after start, grow the group to --scale-up-to hosts",
        )
        group.add_argument(
            "--scale-up-to", type=non_negative_int, metavar="N", help="chaos: size to grow to"
        )
        group.add_argument(
            "--preempt-at",
            type=non_negative_seconds,
            action="append",
            default=[],
            metavar="SECONDS",
            help="chaos: SECONDS after start, preempt a host: SIGKILL its workers, then report "
            "it GONE (repeatable)",
        )
        group.add_argument(
            "--notice-at",
            type=non_negative_seconds,
            action="append",
            default=[],
            metavar="SECONDS",
            help="chaos: SECONDS after start, announce a host's interruption through its "
            "metadata service, then preempt it --notice-lead seconds later (repeatable)",
        )
        group.add_argument(
            "--notice-lead",
            type=non_negative_seconds,
            default=DEFAULT_NOTICE_LEAD_SECONDS,
            metavar="SECONDS",
            help="chaos: seconds between a notice and the SIGKILL (default: "
            f"{DEFAULT_NOTICE_LEAD_SECONDS:.0f}; EC2 gives 120, GCP and Azure 30)",
        )
        group.add_argument(
            "--preempt-host",
            metavar="NAME",
            help="chaos: which spot host to preempt or notice (default: the newest READY one)",
        )
        group.add_argument(
            "--control",
            metavar="FILE",
            help="chaos on demand: each refresh runs the lines appended to FILE since the "
            "last: 'preempt [HOST|all]', 'notice [HOST|all]', 'scale N' (resize the spot "
            "group) or 'spot-capacity N|unlimited' (tests trigger chaos on training "
            "progress)",
        )

    @classmethod
    def from_options(cls, options: argparse.Namespace, core: CoreOptions) -> LocalProvider:
        slots = core.slots_per_host or 1
        hosts = options.hosts
        if hosts is None:  # `discover` has no -np: one host
            hosts = hosts_for_slots(core.num_proc, slots) if core.num_proc else 1
        return cls(
            hosts,
            slots=slots,
            max_hosts=options.max_hosts,
            boot_seconds=options.boot_seconds,
            scale_up_at=options.scale_up_at,
            scale_up_to=options.scale_up_to,
            preempt_at=options.preempt_at,
            preempt_host=options.preempt_host,
            notice_at=options.notice_at,
            notice_lead=options.notice_lead,
            control=options.control,
            spot_capacity=getattr(options, "spot_capacity", None),
        )

    @classmethod
    def groups_from_options(cls, options: argparse.Namespace, core: CoreOptions) -> list[Provider]:
        """The spot group, then the on-demand group behind it (one pool)."""
        spot = cls.from_options(options, core)
        return [spot, spot.on_demand]

    # ---------------------------------------------------------------- contract

    def list_instances(self) -> list[Instance]:
        return self._list(Lifecycle.SPOT)

    def set_target_size(self, size: int) -> None:
        self._set_target(Lifecycle.SPOT, size)

    def replace_instance(self, instance_id: str) -> None:
        self._replace(Lifecycle.SPOT, instance_id)

    def remove_instance(self, instance_id: str) -> None:
        self._remove(Lifecycle.SPOT, instance_id)

    def group_name(self) -> str:
        return SPOT_GROUP

    def group_lifecycle(self) -> Lifecycle:
        return Lifecycle.SPOT

    def capacity_shortage(self, since: float) -> CapacityShortage | None:
        """The newest spot launch that found no capacity, if at or after ``since``."""
        with self._lock:
            shortage = self._shortage
        if shortage is None or shortage.at is None or shortage.at < since:
            return None
        return shortage

    def size_limits(self) -> tuple[int, int]:
        return (0, self._max_hosts)

    def describe(self) -> str:
        return self._describe(Lifecycle.SPOT)

    def notice_watcher(self, instance: Instance) -> Mapping[str, Any] | None:
        """The real AWS watcher, pointed at the host's part of the loopback service."""
        with self._lock:
            if self._imds is None:
                self._imds = FakeImds().start()
            endpoint = self._imds.endpoint(instance.id)
        return {"watcher": "aws", "endpoint": endpoint, "interval": NOTICE_POLL_SECONDS}

    def host_noticed(self, instance: Instance, notice: InterruptionNotice) -> None:
        """Launch the host's replacement now, as a cloud group may (for a rebalance
        recommendation too: the host keeps training until its real notice)."""
        with self._lock:
            host = self._hosts.get(instance.id)
            if host is None or host.leaving:
                return
            host.leaving = True
            self._maintain()

    def close(self) -> None:
        """Stop the pool: both groups' hosts and workers go. Idempotent (each group of
        the job may be closed)."""
        for timer in self._timers:
            timer.cancel()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for host in self._hosts.values():
                self._kill(host, signal.SIGKILL)
            if self._imds is not None:
                self._imds.stop()

    # ------------------------------------------------------- local processes

    def worker_started(self, address: str, process_group: int) -> None:
        """The launcher started a worker process group on ``address`` (either group)."""
        with self._lock:
            host = self._hosts.get(address)
            if host is None or host.state is not InstanceState.READY:
                # Started on a host that is already going: it goes with it.
                _killpg(process_group, signal.SIGKILL)
                return
            host.process_groups.add(process_group)

    def worker_exited(self, address: str, process_group: int) -> None:
        """A worker process group on ``address`` ended."""
        with self._lock:
            host = self._hosts.get(address)
            if host is not None:
                host.process_groups.discard(process_group)

    # ------------------------------------------------------------------ chaos

    def preempt(self, name: str | None = None) -> str | None:
        """Hard-preempt a spot host: SIGKILL its workers, then report it GONE.

        Without ``name``, takes the newest READY spot host when there is a choice.
        Returns the host's name, or None when there was nothing to preempt (an
        on-demand host is never preempted).
        """
        with self._lock:
            host = self._pick(name)
            if host is None:
                self._note(f"chaos: nothing to preempt ({name or 'no READY host'})")
                return None
            self._note(f"chaos: preempted {host.name} (SIGKILL to its workers)")
            self._kill(host, signal.SIGKILL)
            host.state = InstanceState.GONE
            if self._imds is not None:
                self._imds.forget(host.name)
            return host.name

    def notice(self, name: str | None = None, lead: float | None = None) -> str | None:
        """Announce a spot host's interruption on its metadata service; preempt it
        ``lead`` seconds later (default ``--notice-lead``). Returns the host's name, or
        None."""
        lead = self._notice_lead if lead is None else lead
        with self._lock:
            host = self._pick(name)
            if host is None:
                self._note(f"chaos: nothing to notice ({name or 'no READY host'})")
                return None
            if self._imds is None:
                self._imds = FakeImds().start()
            self._imds.announce_interruption(host.name, time.time() + lead)
            self._note(f"chaos: interruption notice to {host.name}, {lead:g} s ahead")
            timer = threading.Timer(lead, self.preempt, kwargs={"name": host.name})
            timer.daemon = True
            self._timers.append(timer)
            timer.start()
            return host.name

    def preempt_all(self) -> list[str]:
        """Hard-preempt every READY spot host at once (a reclaimed capacity pool);
        their names."""
        with self._lock:
            names = [h.name for h in self._spot_hosts() if h.state is InstanceState.READY]
        return [name for name in names if self.preempt(name) is not None]

    def notice_all(self, lead: float | None = None) -> list[str]:
        """Announce the interruption of every READY spot host not already leaving, each
        preempted ``lead`` seconds later; their names."""
        with self._lock:
            names = [
                h.name
                for h in self._spot_hosts()
                if h.state is InstanceState.READY and not h.leaving
            ]
        return [name for name in names if self.notice(name, lead) is not None]

    def set_spot_capacity(self, capacity: int | None) -> None:
        """The most spot hosts the pool can supply from now on (None: no limit).

        Lowering it below the spot hosts that exist preempts none of them: it only makes
        further launches fail, as a spot pool that ran dry leaves running instances
        alone (``preempt`` and ``notice`` take hosts away). Raising it lets the spot
        group launch what it still lacks at the next refresh.
        """
        if capacity is not None and capacity < 0:
            raise ConfigurationError("spot capacity must not be negative")
        with self._lock:
            self._spot_capacity = capacity
            shown = "unlimited" if capacity is None else str(capacity)
            self._note(f"chaos: spot capacity {shown}")
            self._maintain()

    def _pick(self, name: str | None) -> _Host | None:
        """Spot host ``name``, or the newest READY one not already leaving (lock held)."""
        if name is not None:
            host = self._hosts.get(name)
            if host is None or host.lifecycle is not Lifecycle.SPOT:
                return None
            return host if host.state is not InstanceState.GONE else None
        ready = [h for h in self._spot_hosts() if h.state is InstanceState.READY and not h.leaving]
        return ready[-1] if ready else None

    def _run_control_commands(self) -> None:
        """Run the lines appended to the ``--control`` file since the last refresh."""
        if self._control is None:
            return
        for line in self._control.new_lines():
            words = line.split()
            if not words:
                continue
            if words[0] in ("preempt", "notice") and words[1:] == ["all"]:
                (self.preempt_all if words[0] == "preempt" else self.notice_all)()
            elif words[0] in ("preempt", "notice") and len(words) <= 2:
                chaos = self.preempt if words[0] == "preempt" else self.notice
                chaos(words[1] if len(words) == 2 else None)
            elif words[0] == "scale" and len(words) == 2 and words[1].isdigit():
                with self._lock:
                    self._note(f"chaos: group scaled to {words[1]} hosts")
                    self._resize(Lifecycle.SPOT, min(int(words[1]), self._max_hosts))
            elif words[0] == "spot-capacity" and len(words) == 2 and words[1].isdigit():
                self.set_spot_capacity(int(words[1]))
            elif words[0] == "spot-capacity" and words[1:] == ["unlimited"]:
                self.set_spot_capacity(None)
            else:
                log.warning("local provider: ignoring control line %r", line)

    # ------------------------------------------- one group of the pool (either)

    def _list(self, lifecycle: Lifecycle) -> list[Instance]:
        self._run_control_commands()
        now = self._clock()
        with self._lock:
            if self._scale_up and now - self._started >= self._scale_up[0]:
                target = self._scale_up[1]
                self._scale_up = None
                self._note(f"chaos: group scaled up to {target} hosts")
                self._resize(Lifecycle.SPOT, target)
            self._maintain()
            for host in self._hosts.values():
                if (
                    host.state is InstanceState.PENDING
                    and self._clock() - host.launched_at >= self._boot_seconds
                ):
                    host.state = InstanceState.READY
            mine = [h for h in self._hosts.values() if h.lifecycle is lifecycle]
            instances = [self._instance(host) for host in mine]
            # A GONE host is reported once, then forgotten, as clouds do.
            for host in mine:
                if host.state is InstanceState.GONE:
                    del self._hosts[host.name]
            return instances

    def _set_target(self, lifecycle: Lifecycle, size: int) -> None:
        if not 0 <= size <= self._max_hosts:
            raise ConfigurationError(f"target size {size} outside [0, {self._max_hosts}]")
        with self._lock:
            self._resize(lifecycle, size)
            self._maintain()

    def _replace(self, lifecycle: Lifecycle, instance_id: str) -> None:
        with self._lock:
            host = self._member(lifecycle, instance_id)
            if host is None:
                return
            self._terminate(host, signal.SIGTERM)
            self._note(f"replacing {host.name}", lifecycle)

    def _remove(self, lifecycle: Lifecycle, instance_id: str) -> None:
        """Stop the host as a scale-in does (SIGTERM to its workers) and lower the
        group's size by one; nothing for a host already gone or of the other group."""
        with self._lock:
            host = self._member(lifecycle, instance_id)
            if host is None:
                return
            self._terminate(host, signal.SIGTERM)
            self._desired[lifecycle] = max(0, self._desired[lifecycle] - 1)
            self._note(
                f"removed {host.name} ({_GROUP_NAME[lifecycle]} now holds "
                f"{self._desired[lifecycle]})",
                lifecycle,
            )

    def _describe(self, lifecycle: Lifecycle) -> str:
        with self._lock:
            live = len(self._live(lifecycle))
        kind = "spot" if lifecycle is Lifecycle.SPOT else "on-demand"
        return f"local {kind} group ({live} hosts)"

    # ---------------------------------------------------------------- helpers

    def _instance(self, host: _Host) -> Instance:
        return Instance(
            id=host.name,
            address=host.name,
            state=host.state,
            slots=self._slots,
            lifecycle=host.lifecycle,
            zone="local",
            instance_type="process",
            launch_time=time.time() - (self._clock() - host.launched_at),
            cloud_state=host.state.value,
            group=_GROUP_NAME[host.lifecycle],
        )

    def _member(self, lifecycle: Lifecycle, instance_id: str) -> _Host | None:
        """The group's host ``instance_id`` while it still runs (lock held)."""
        host = self._hosts.get(instance_id)
        if host is None or host.lifecycle is not lifecycle:
            return None
        if host.state in (InstanceState.TERMINATING, InstanceState.GONE):
            return None
        return host

    def _spot_hosts(self) -> list[_Host]:
        return [h for h in self._hosts.values() if h.lifecycle is Lifecycle.SPOT]

    def _live(self, lifecycle: Lifecycle) -> list[_Host]:
        """Hosts a group counts towards its size: not gone and not leaving."""
        return [
            h
            for h in self._hosts.values()
            if h.lifecycle is lifecycle
            and h.state in (InstanceState.PENDING, InstanceState.READY)
            and not h.leaving
        ]

    def _resize(self, lifecycle: Lifecycle, size: int) -> None:
        self._desired[lifecycle] = size
        for host in reversed(self._live(lifecycle)[size:]):
            self._terminate(host, signal.SIGTERM)

    def _maintain(self) -> None:
        """Launch hosts until each group holds its desired size, as a cloud group does;
        spot launches beyond the pool's spot capacity fail, and are recorded."""
        for lifecycle in Lifecycle:
            missing = self._desired[lifecycle] - len(self._live(lifecycle))
            launch = missing
            if lifecycle is Lifecycle.SPOT:
                launch = min(missing, self._spot_room())
                self._spot_launches(missing, launch)
            for _ in range(max(0, launch)):
                name = f"{_HOST_PREFIX[lifecycle]}{self._next_index[lifecycle]}"
                self._next_index[lifecycle] += 1
                self._hosts[name] = _Host(name, self._clock(), lifecycle)

    def _spot_room(self) -> int:
        """Spot hosts the pool can still launch: a host that is leaving still holds its
        capacity until it is gone."""
        if self._spot_capacity is None:
            return self._max_hosts
        held = sum(h.state is not InstanceState.GONE for h in self._spot_hosts())
        return max(0, self._spot_capacity - held)

    def _spot_launches(self, missing: int, launched: int) -> None:
        """Record a spot launch attempt that found no capacity for some hosts (lock held).

        Each attempt is a new failure with its own time, as each failed Auto Scaling
        activity is; the log hears of the first of a run of them.
        """
        if missing <= launched:
            if self._short and launched > 0:
                self._note(f"{SPOT_GROUP}: spot capacity again: launching {launched} host(s)")
            self._short = False  # the next failure starts a new run of them
            return
        wanted = self._desired[Lifecycle.SPOT]
        self._shortage = CapacityShortage(
            ShortageCause.CAPACITY,
            CAPACITY_CODE,
            f"Could not launch Spot Instances: no spot capacity for {missing - launched} "
            f"of the {wanted} hosts asked (local pool: spot capacity {self._spot_capacity})",
            self._wall_started + (self._clock() - self._started),
        )
        if not self._short:
            self._short = True
            self._note(f"{SPOT_GROUP}: {self._shortage.describe()}", level=logging.WARNING)

    def _terminate(self, host: _Host, sig: signal.Signals) -> None:
        self._kill(host, sig)
        host.state = InstanceState.GONE

    def _kill(self, host: _Host, sig: signal.Signals) -> None:
        for group in list(host.process_groups):
            _killpg(group, sig)

    def _note(
        self, what: str, lifecycle: Lifecycle = Lifecycle.SPOT, level: int = logging.INFO
    ) -> None:
        events = self.events if lifecycle is Lifecycle.SPOT else self.on_demand.events
        events.append((self._clock() - self._started, what))
        log.log(level, "%s", what)


class LocalOnDemandGroup(Provider):
    """The on-demand group behind a local spot group: hosts ``od-0``, ``od-1``, ... in
    the same simulated pool, never short of capacity and never preempted by chaos.

    Made by :meth:`LocalProvider.groups_from_options` (it is not registered itself):
    every call goes to the pool its spot group owns.
    """

    name = "local"
    description = "the on-demand group behind the local spot group (od-0, od-1, ...)"
    runs_workers_locally = True
    tracks_worker_processes = True
    can_remove = True

    def __init__(self, pool: LocalProvider) -> None:
        self._pool = pool
        self.events: list[tuple[float, str]] = []
        """(seconds since the pool started, what happened to this group's hosts)."""

    @classmethod
    def from_options(cls, options: argparse.Namespace, core: CoreOptions) -> LocalOnDemandGroup:
        return LocalProvider.from_options(options, core).on_demand

    def list_instances(self) -> list[Instance]:
        return self._pool._list(Lifecycle.ON_DEMAND)

    def set_target_size(self, size: int) -> None:
        self._pool._set_target(Lifecycle.ON_DEMAND, size)

    def replace_instance(self, instance_id: str) -> None:
        self._pool._replace(Lifecycle.ON_DEMAND, instance_id)

    def remove_instance(self, instance_id: str) -> None:
        self._pool._remove(Lifecycle.ON_DEMAND, instance_id)

    def group_name(self) -> str:
        return ON_DEMAND_GROUP

    def group_lifecycle(self) -> Lifecycle:
        return Lifecycle.ON_DEMAND

    def size_limits(self) -> tuple[int, int]:
        return self._pool.size_limits()

    def describe(self) -> str:
        return self._pool._describe(Lifecycle.ON_DEMAND)

    def host_noticed(self, instance: Instance, notice: InterruptionNotice) -> None:
        self._pool.host_noticed(instance, notice)

    def worker_started(self, address: str, process_group: int) -> None:
        self._pool.worker_started(address, process_group)

    def worker_exited(self, address: str, process_group: int) -> None:
        self._pool.worker_exited(address, process_group)

    def close(self) -> None:
        self._pool.close()


def _killpg(process_group: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process_group, sig)


@hookimpl
def spotring_register_providers(registry) -> None:
    registry.add(LocalProvider)
