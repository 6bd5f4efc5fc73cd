"""The embedded ``local`` provider: a simulated instance group on this machine.

Hosts are named ``host-0``, ``host-1``, ... and their workers run as local processes
(the launcher tells the provider which process groups run on which host). Like a cloud
group, it keeps a desired size: a host that is preempted or replaced is followed by a
new one that boots for ``--boot-seconds``. Chaos options script what a spot group does
to a job: a scale-up at a given time, hard preemptions that kill a host's workers with
SIGKILL and then report the host GONE, and noticed preemptions: the host announces its
interruption through an EC2-style metadata service on loopback
(``providers/local_metadata.py``, read by the real AWS notice watcher on the host)
``--notice-lead`` seconds before the same hard preemption.
"""

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
    ConfigurationError,
    CoreOptions,
    Instance,
    InstanceState,
    InterruptionNotice,
    Lifecycle,
    Provider,
    hosts_for_slots,
)
from spotring.providers.local_metadata import FakeImds
from spotring.providers.options import non_negative_int, non_negative_seconds

DEFAULT_NOTICE_LEAD_SECONDS = 10.0
NOTICE_POLL_SECONDS = 1.0  # as often as the AWS watcher polls a real host

log = logging.getLogger(__name__)


@dataclass
class _Host:
    name: str
    launched_at: float
    state: InstanceState = InstanceState.PENDING
    process_groups: set[int] = field(default_factory=set)
    leaving: bool = False
    """It announced its interruption: the group already counts its replacement."""


class LocalProvider(Provider):
    """A group of simulated spot hosts whose workers are local processes."""

    name = "local"
    description = "simulated spot group on this machine (host-0, host-1, ...), with chaos options"
    runs_workers_locally = True
    tracks_worker_processes = True  # a preempted host's workers are killed with it

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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if hosts < 0 or hosts > max_hosts:
            raise ConfigurationError(f"--hosts must be between 0 and --max-hosts ({max_hosts})")
        if (scale_up_at is None) != (scale_up_to is None):
            raise ConfigurationError("--scale-up-at and --scale-up-to go together")
        if scale_up_to is not None and not 0 <= scale_up_to <= max_hosts:
            raise ConfigurationError(f"--scale-up-to must be between 0 and {max_hosts}")
        self._clock = clock
        self._started = clock()
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
        self._next_index = 0
        self._desired = hosts
        self._notice_lead = notice_lead
        self._imds: FakeImds | None = None
        self._timers = [
            threading.Timer(delay, self.preempt, kwargs={"name": preempt_host})
            for delay in sorted(preempt_at)
        ] + [
            threading.Timer(delay, self.notice, kwargs={"name": preempt_host})
            for delay in sorted(notice_at)
        ]
        self._control = Path(control) if control else None
        self._control_offset = 0
        self.events: list[tuple[float, str]] = []
        """(seconds since start, what happened), for summaries and tests."""
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
            help="chaos: which host to preempt or notice (default: the newest READY host)",
        )
        group.add_argument(
            "--control",
            metavar="FILE",
            help="chaos on demand: each refresh runs the lines appended to FILE since the "
            "last: 'preempt [HOST|all]', 'notice [HOST|all]' or 'scale N' (tests trigger "
            "chaos on training progress)",
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
        )

    # ---------------------------------------------------------------- contract

    def list_instances(self) -> list[Instance]:
        self._run_control_commands()
        now = self._clock()
        with self._lock:
            if self._scale_up and now - self._started >= self._scale_up[0]:
                target = self._scale_up[1]
                self._scale_up = None
                self._note(f"chaos: group scaled up to {target} hosts")
                self._resize(target)
            self._maintain()
            for host in self._hosts.values():
                if (
                    host.state is InstanceState.PENDING
                    and self._clock() - host.launched_at >= self._boot_seconds
                ):
                    host.state = InstanceState.READY
            instances = [self._instance(host) for host in self._hosts.values()]
            # A GONE host is reported once, then forgotten, as clouds do.
            for name in [n for n, h in self._hosts.items() if h.state is InstanceState.GONE]:
                del self._hosts[name]
            return instances

    def set_target_size(self, size: int) -> None:
        if not 0 <= size <= self._max_hosts:
            raise ConfigurationError(f"target size {size} outside [0, {self._max_hosts}]")
        with self._lock:
            self._resize(size)
            self._maintain()

    def replace_instance(self, instance_id: str) -> None:
        with self._lock:
            host = self._hosts.get(instance_id)
            if host is None or host.state in (InstanceState.TERMINATING, InstanceState.GONE):
                return
            self._terminate(host, signal.SIGTERM)
            self._note(f"replacing {host.name}")

    def size_limits(self) -> tuple[int, int]:
        return (0, self._max_hosts)

    def describe(self) -> str:
        return f"local group ({len(self._live())} hosts)"

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
        for timer in self._timers:
            timer.cancel()
        with self._lock:
            for host in self._hosts.values():
                self._kill(host, signal.SIGKILL)
            if self._imds is not None:
                self._imds.stop()

    # ------------------------------------------------------- local processes

    def worker_started(self, address: str, process_group: int) -> None:
        """The launcher started a worker process group on ``address``."""
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
        """Hard-preempt a host: SIGKILL its workers, then report it GONE.

        Without ``name``, takes the newest READY host when there is a choice. Returns
        the host's name, or None when there was nothing to preempt.
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
        """Announce a host's interruption on its metadata service; preempt it ``lead``
        seconds later (default ``--notice-lead``). Returns the host's name, or None."""
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
        """Hard-preempt every READY host at once (a reclaimed capacity pool); their
        names."""
        with self._lock:
            names = [h.name for h in self._hosts.values() if h.state is InstanceState.READY]
        return [name for name in names if self.preempt(name) is not None]

    def notice_all(self, lead: float | None = None) -> list[str]:
        """Announce the interruption of every READY host not already leaving, each
        preempted ``lead`` seconds later; their names."""
        with self._lock:
            names = [
                h.name
                for h in self._hosts.values()
                if h.state is InstanceState.READY and not h.leaving
            ]
        return [name for name in names if self.notice(name, lead) is not None]

    def _pick(self, name: str | None) -> _Host | None:
        """Host ``name``, or the newest READY one not already leaving (lock held)."""
        if name is not None:
            host = self._hosts.get(name)
            return host if host is not None and host.state is not InstanceState.GONE else None
        ready = [
            h for h in self._hosts.values() if h.state is InstanceState.READY and not h.leaving
        ]
        return ready[-1] if ready else None

    def _run_control_commands(self) -> None:
        """Run the lines appended to the ``--control`` file since the last refresh."""
        if self._control is None:
            return
        try:
            with self._control.open("rb") as stream:
                stream.seek(self._control_offset)
                data = stream.read()
        except FileNotFoundError:
            return
        complete = data[: data.rfind(b"\n") + 1]  # a line still being written waits
        self._control_offset += len(complete)
        for line in complete.decode(errors="replace").splitlines():
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
                    self._resize(min(int(words[1]), self._max_hosts))
            else:
                log.warning("local provider: ignoring control line %r", line)

    # ---------------------------------------------------------------- helpers

    def _instance(self, host: _Host) -> Instance:
        return Instance(
            id=host.name,
            address=host.name,
            state=host.state,
            slots=self._slots,
            lifecycle=Lifecycle.SPOT,
            zone="local",
            instance_type="process",
            launch_time=time.time() - (self._clock() - host.launched_at),
            cloud_state=host.state.value,
        )

    def _live(self) -> list[_Host]:
        """Hosts the group counts towards its size: not gone and not leaving."""
        return [
            h
            for h in self._hosts.values()
            if h.state in (InstanceState.PENDING, InstanceState.READY) and not h.leaving
        ]

    def _resize(self, size: int) -> None:
        self._desired = size
        for host in reversed(self._live()[size:]):
            self._terminate(host, signal.SIGTERM)

    def _maintain(self) -> None:
        """Launch hosts until the group holds its desired size, as a cloud group does."""
        for _ in range(self._desired - len(self._live())):
            name = f"host-{self._next_index}"
            self._next_index += 1
            self._hosts[name] = _Host(name, self._clock())

    def _terminate(self, host: _Host, sig: signal.Signals) -> None:
        self._kill(host, sig)
        host.state = InstanceState.GONE

    def _kill(self, host: _Host, sig: signal.Signals) -> None:
        for group in list(host.process_groups):
            _killpg(group, sig)

    def _note(self, what: str) -> None:
        self.events.append((self._clock() - self._started, what))
        log.info("%s", what)


def _killpg(process_group: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process_group, sig)


@hookimpl
def spotring_register_providers(registry) -> None:
    registry.add(LocalProvider)
