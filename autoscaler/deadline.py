"""``spotring run --deadline WHEN``: buy on-demand hosts only when the job must, to finish
in time.

The policy is the uniform-progress policy of "Can't Be Late: Optimizing Spot Instance
Savings under Deadlines" (Wu et al., NSDI '24, section 4; the rules as SkyPilot's
research simulator states them, ``sky_spot/strategies`` of
github.com/Michaelvll/skypilot-spot-strategy), stated for a ring of many hosts:

* **Uniform progress.** The job should have done ``ep(t) = W (t - start) / (D - start)``
  of its ``W`` steps by ``t`` (``D`` the deadline). While it has (``cp(t) >= ep(t)``), a
  short spot group's shortfall is *not* asked of an on-demand group: the job waits for
  spot, training smaller or not at all. On-demand hosts it holds are kept while spot
  is short (handing one back saves only if spot returns before the job ends, and costs
  a restart for sure: :meth:`DeadlinePlugin.spotring_fall_back_hosts`) and handed back
  once spot can take their place. Once it is behind, it is (mode ``catch-up``): the
  on-demand group is asked for what closes the gap (:meth:`DeadlinePolicy.hosts_to_finish`,
  with a restart's time of headroom), not the whole shortfall.
* **Hysteresis.** Having fallen behind, the job keeps its on-demand hosts until it is
  ahead of where it should be ``2d`` later (``cp(t) >= ep(t + 2d)``, ``d`` the cost of a
  restart: ``--restart-cost``), so a spot pool that flickers does not swap hosts back
  and forth.
* **Safety net.** When the time left is down to the time the rest needs on a full ring
  plus ``2d`` (``D - t < C(t) + 2d``), the job goes on-demand for the rest (mode
  ``safety-net``, for good): the on-demand groups are asked first, and spot hosts are
  handed back once they are replaced.

``C(t)``, the time the rest needs, is projected from the measured rate: steps per
slot-second of training (a ring of more slots makes more steps), each ring's from its
first commit, times the job's ``-np`` slots. As in the paper, ``C(t)`` is the compute
the rest needs, and a restart costs ``d`` besides: the time a ring takes to form is not
in the rate (it is time without progress, which the slack pays as it passes), so one
restart early in a long job is not extrapolated over all of it (a 30 s formation in the
first hour of a 48 h job would count as 24 minutes; with a few hand-backs the safety
net tripped on the Can't Be Late traces with hours of slack). Progress is what the
rings commit (:class:`~spotring.driver.ring_progress.RingStatus`: a ring's steps since
it formed, summed over the rings). The rate is unknown until it has been measured for
``d``: the safety net waits for it (an early rate, over a few steps, is noise), and
uniform progress still counts the job behind once ``ep(t)`` passes what it did.

With ``--total-epochs`` instead of ``--total-steps``, the work is counted in epochs: the
job's epoch and its elastic sampler's position, as the workers commit them
(``RingStatus.epochs``: epoch + samples processed / the dataset's length). A bigger
ring then finishes an epoch in fewer steps, and the projection sees it.

The policy is spotring's own answer to the decision hooks when ``--deadline`` is
given (:class:`DeadlinePlugin`): it is asked after any other plugin, before spotring's
default answers, so a plugin's answer still wins. Each change of mode is an event
(``spotring_deadline_decided``) with its reason.
"""

from __future__ import annotations

import contextlib
import datetime
import enum
import logging
import math
import re
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import pluggy

from spotring.autoscaler.calls import emit
from spotring.autoscaler.capacity import GroupStatus, default_order
from spotring.autoscaler.plugins.policy import before_defaults
from spotring.core.hooks import hookimpl
from spotring.core.instance import Instance, Lifecycle
from spotring.core.job import JobShape
from spotring.driver.ring_events import RingStatus

__all__ = [
    "DEFAULT_RESTART_COST",
    "DeadlineOptions",
    "DeadlinePlugin",
    "DeadlinePolicy",
    "Mode",
    "Projection",
    "deadline_plugin",
    "parse_deadline",
]

log = logging.getLogger(__name__)

DEFAULT_RESTART_COST = 300.0
"""``--restart-cost``: seconds a change of hosts costs the job (``d`` in the paper): a
VM's boot and its worker joining the ring. Five minutes, as ``--fallback-after``."""

_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smh])")
_UNIT_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0}


def parse_deadline(when: str, now: float) -> float:
    """``--deadline WHEN`` as epoch seconds: a duration from ``now`` (``90s``, ``45m``,
    ``2h``) or an ISO 8601 time (``2026-11-28T18:00Z``; one without an offset is local
    time). Raises ValueError with a one-line message for anything else, or a time that
    is not in the future."""
    text = when.strip()
    match = _DURATION.fullmatch(text)
    if match is not None:
        seconds = float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
        if seconds <= 0:
            raise ValueError(f"--deadline {when!r}: a duration must be more than 0")
        return now + seconds
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"--deadline {when!r}: give a duration (90s, 45m, 2h) or an ISO 8601 time "
            "(2026-11-28T18:00Z)"
        ) from None
    deadline = moment.timestamp()  # a naive time is local time
    if deadline <= now:
        raise ValueError(f"--deadline {when!r} is not in the future")
    return deadline


@dataclass(frozen=True)
class DeadlineOptions:
    """What ``--deadline`` mode needs: when, how much work, what a restart costs."""

    deadline: float
    """Epoch seconds."""
    total_steps: int | None
    """Commits the job makes in all (``--total-steps``); None: ``total_epochs`` counts."""
    slots: int
    """The slots the job trains on at full size (``-np``): the projection's ring."""
    restart_cost: float = DEFAULT_RESTART_COST
    total_epochs: int | None = None
    """Epochs the job trains in all (``--total-epochs``), instead of ``total_steps``."""

    @property
    def total(self) -> int:
        """The job's work, in :attr:`unit`."""
        return self.total_epochs if self.total_epochs is not None else self.total_steps or 0

    @property
    def unit(self) -> str:
        return "epochs" if self.total_epochs is not None else "steps"


class Mode(enum.Enum):
    """Where the deadline policy wants the job's hosts."""

    SPOT = "spot"
    """Ahead of uniform progress: wait for spot, no new on-demand host for a short spot
    group (those held kept until spot can take their place)."""
    CATCH_UP = "catch-up"
    """Behind: the on-demand group is asked for the hosts that close the gap; its hosts
    are kept until the job is ``2d`` ahead."""
    SAFETY_NET = "safety-net"
    """Too little slack left for another restart: on-demand for the rest."""
    DONE = "done"
    """Every step is made: nothing to decide."""


@dataclass(frozen=True)
class Projection:
    """The job's progress against its deadline at one moment (epoch seconds)."""

    at: float
    done: float
    """Work done, in steps or epochs (the options' unit)."""
    total: float
    expected: float
    """``ep(t)``: the work uniform progress would have done by now."""
    rate_per_slot: float | None
    """Work per slot-second since the first commit; None until measured for ``d``."""
    ring_slots: int
    """The current ring's size (0: none stands)."""
    projected_finish: float | None
    """When the rest is done at the current ring's size; None when it makes no progress."""
    needed_s: float | None
    """``C(t)``: seconds the rest needs on a full ring (``-np`` slots); None: rate unknown."""
    slack_s: float | None
    """Seconds the job can still make no progress and finish on a full ring
    (``D - t - C(t)``); None: rate unknown."""


class DeadlinePolicy:
    """The deadline policy as pure logic over the rings' progress and a clock.

    Feed it each ring's progress (:meth:`ring_progress`); :meth:`decide` returns the
    mode and the projection it was decided on. Thread-safe: the progress comes on the
    progress tracker's thread, the decisions are asked on the controller's.
    """

    def __init__(self, options: DeadlineOptions, *, clock: Callable[[], float] = time.time) -> None:
        if (options.total_steps is None) == (options.total_epochs is None):
            raise ValueError("give one of --total-steps and --total-epochs")
        if options.total < 1:
            raise ValueError(f"--total-{options.unit} must be at least 1")
        self.options = options
        self._clock = clock
        self._start = clock()
        if options.deadline <= self._start:
            raise ValueError("the deadline is not in the future")
        self._lock = threading.Lock()
        self._mode = Mode.SPOT
        self._rings_done = 0  # steps of the rings before the current one
        self._ring = 0
        self._ring_steps = 0
        self._ring_slots = 0
        self._epochs = 0.0  # the job's, as the rings last reported them
        self._no_epochs_warned = False
        self._seen_at: float | None = None
        self._first_commit: float | None = None  # when
        self._trained = 0.0  # work of the rings before the current one, from their first commit
        self._ring_base: float | None = None  # work done when the current ring first committed
        self._slot_seconds = 0.0  # of the rings from their first commit

    @property
    def mode(self) -> Mode:
        return self._mode

    def ring_progress(self, ring: int, size: int, steps: int, epochs: float | None = None) -> None:
        """A ring's progress (``RingStatus``): its generation, size (slots), steps since
        it formed and the job's epochs (None: no sampler reported). The slot-seconds
        since the last report are counted at the size the ring had then, none across a
        change of ring or before a ring's first commit."""
        now = self._clock()
        with self._lock:
            if ring != self._ring:
                # The old ring's work is known to its last report; the time since holds
                # its end and the new one's formation: neither is training.
                self._trained += self._trained_on_ring()
                self._ring_base = None
                self._rings_done += self._ring_steps
                self._ring, self._ring_steps = ring, 0
            self._slot_seconds = self._slot_seconds_at(now)
            self._seen_at = now
            self._ring_steps = max(self._ring_steps, steps)
            self._ring_slots = size
            if epochs is not None:
                self._epochs = epochs  # the job's own count: a restore may lower it
            self._warn_without_epochs(steps, epochs)
            done = self._done()
            if self._ring_base is None and steps > 0:
                self._ring_base = done
            if self._first_commit is None and done > 0:
                self._first_commit = now

    def ring_lost(self) -> None:
        """No ring stands (every worker lost): no progress until the next forms."""
        self.ring_progress(self._ring + 1, 0, 0)

    def project(self) -> Projection:
        """Where the job stands now."""
        now = self._clock()
        with self._lock:
            return self._project(now)

    def decide(self) -> tuple[Mode, Projection]:
        """The mode now (the paper's rules: see the module's docstring), and the
        projection it was decided on."""
        now = self._clock()
        with self._lock:
            projection = self._project(now)
            self._mode = self._next_mode(projection)
            return self._mode, projection

    # ---------------------------------------------------------------- helpers

    def hosts_to_finish(self, total_hosts: int, headroom_s: float = 0.0) -> int | None:
        """Of the job's ``total_hosts`` (its ``-np`` slots), the hosts whose slots, at
        the measured rate, finish the rest by the deadline with the safety net's margin
        kept (``2d``) after the restart the added hosts cost (``d``) and ``headroom_s``
        more; None while the rate is unknown or that leaves no time (then: all of them)."""
        projection = self.project()
        rate = projection.rate_per_slot
        margin = 3 * self.options.restart_cost + headroom_s
        time_left = self.options.deadline - projection.at - margin
        if rate is None or time_left <= 0:
            return None
        remaining = max(0.0, projection.total - projection.done)
        slots = min(self.options.slots, math.ceil(remaining / (rate * time_left)))
        return math.ceil(total_hosts * slots / self.options.slots)

    def _done(self) -> float:
        if self.options.total_epochs is not None:
            return self._epochs
        return self._rings_done + self._ring_steps

    def _warn_without_epochs(self, steps: int, epochs: float | None) -> None:
        """Once: the job counts epochs but its workers commit steps without any."""
        if self.options.total_epochs is None or epochs is not None or steps == 0:
            return
        if not self._no_epochs_warned:
            self._no_epochs_warned = True
            log.warning(
                "--total-epochs: the workers commit no epoch (no hvd.elastic.ElasticSampler "
                "in their state): the job's progress is not known; give --total-steps instead"
            )

    def _project(self, now: float) -> Projection:
        options = self.options
        done = self._done()
        remaining = max(0.0, options.total - done)
        rate = None
        if self._first_commit is not None and now - self._first_commit >= options.restart_cost:
            slot_seconds = self._slot_seconds_at(now)
            trained = self._trained + self._trained_on_ring()
            if slot_seconds > 0 and trained > 0:
                rate = trained / slot_seconds
        finish = needed = slack = None
        if rate is not None:
            if self._ring_slots > 0:
                finish = now + remaining / (rate * self._ring_slots)
            needed = remaining / (rate * options.slots)
            slack = options.deadline - now - needed
        return Projection(
            at=now,
            done=done,
            total=options.total,
            expected=self._expected(now),
            rate_per_slot=rate,
            ring_slots=self._ring_slots,
            projected_finish=finish,
            needed_s=needed,
            slack_s=slack,
        )

    def _trained_on_ring(self) -> float:
        """The work the current ring made since its first commit."""
        return 0.0 if self._ring_base is None else max(0.0, self._done() - self._ring_base)

    def _slot_seconds_at(self, now: float) -> float:
        """Slot-seconds of the rings from their first commit, the time since the last
        report counted at the ring's size then (none while a ring forms)."""
        if self._ring_base is None or self._seen_at is None:
            return self._slot_seconds
        return self._slot_seconds + max(0.0, now - self._seen_at) * self._ring_slots

    def _expected(self, at: float) -> float:
        """``ep(at)``: the work uniform progress does by ``at``."""
        span = self.options.deadline - self._start
        share = min(1.0, max(0.0, (at - self._start) / span))
        return self.options.total * share

    def _next_mode(self, projection: Projection) -> Mode:
        restart = self.options.restart_cost
        if projection.done >= projection.total:
            return Mode.DONE
        if self._mode is Mode.SAFETY_NET:
            return Mode.SAFETY_NET  # for the rest of the job
        if projection.slack_s is not None and projection.slack_s < 2 * restart:
            return Mode.SAFETY_NET
        if self._mode is Mode.CATCH_UP:
            ahead = projection.done >= self._expected(projection.at + 2 * restart)
            return Mode.SPOT if ahead else Mode.CATCH_UP
        return Mode.CATCH_UP if projection.done < projection.expected else Mode.SPOT


def _reason(mode: Mode, projection: Projection, unit: str) -> str:
    """Why the policy is in ``mode``, in a few words (the event's and the log's reason)."""
    places = 2 if unit == "epochs" else 0
    made = f"{projection.done:.{places}f} of {projection.total:.0f} {unit}"
    steps = f"{made}, {projection.expected:.{places}f} due by now"
    if mode is Mode.DONE:
        return f"{made} made"
    if mode is Mode.SAFETY_NET:
        return (
            f"{steps}; {projection.slack_s:.0f}s of slack left, no more than two restarts: "
            "on-demand for the rest"
        )
    if mode is Mode.CATCH_UP:
        return f"{steps}: behind, a short spot group falls back to on-demand"
    return f"{steps}: ahead, waiting for spot rather than buying on-demand"


class DeadlinePlugin:
    """The deadline policy as spotring's answer to the decision hooks of a run with
    ``--deadline``; registered by :func:`deadline_plugin`, so a plugin's answer still
    comes first.

    :param hook: the plugin manager's hook relay, for the ``spotring_deadline_decided``
        event.
    """

    def __init__(self, policy: DeadlinePolicy, hook: pluggy.HookRelay) -> None:
        self.policy = policy
        self._hook = hook
        self._announced: Mode | None = None

    # ------------------------------------------------------------ what it hears

    @hookimpl
    def spotring_ring_progress(self, status: RingStatus) -> None:
        self.policy.ring_progress(status.ring, status.size, status.steps, status.epochs)

    @hookimpl
    def spotring_ring_lost(self) -> None:
        self.policy.ring_lost()

    # ------------------------------------------------------------ what it answers

    @hookimpl(trylast=True)
    def spotring_order_groups(
        self, groups: Sequence[GroupStatus], job: JobShape
    ) -> list[str] | None:
        """The safety net asks the on-demand groups first; otherwise spotring's order."""
        if self._mode() is not Mode.SAFETY_NET:
            return None
        order = default_order(groups)
        lifecycles = {g.name: g.lifecycle for g in groups}
        first = [name for name in order if lifecycles[name] is Lifecycle.ON_DEMAND]
        return first + [name for name in order if name not in first]

    @hookimpl(trylast=True)
    def spotring_fall_back_hosts(
        self, group: GroupStatus, short: GroupStatus, hosts: int, total: int, job: JobShape
    ) -> int | None:
        """The on-demand hosts a short spot group's shortfall may take. While ahead:
        none bought, those held kept. While catching up: what the deadline needs
        (:meth:`DeadlinePolicy.hosts_to_finish`, less the hosts the groups before it
        supply; all while the rate is unknown), bought with a restart's time of
        headroom, and never fewer than it holds. The safety net's: all.

        Why an on-demand host is not handed back while spot is short: the ring's work
        scales with its slots, so the work left costs the same on-demand host-hours on
        fewer on-demand hosts; handing one back saves only if spot returns before the
        job ends, and costs a restart now (and a boot and a restart if bought again).
        On flapping pools that lost more than it saved (docs/cost.md). The headroom:
        no progress while the hosts bought boot, so the need measured a minute later
        can be one host more; buying it in a second step costs a second restart."""
        if group.lifecycle is not Lifecycle.ON_DEMAND:
            return None
        mode = self._mode()
        if mode not in (Mode.SPOT, Mode.CATCH_UP):
            return None
        held = group.live
        if mode is Mode.SPOT:
            return held
        needed = self.policy.hosts_to_finish(total)
        if needed is None:
            return None
        if needed - (total - hosts) > held:  # buying: sized with a restart's headroom
            needed = self.policy.hosts_to_finish(total, self.policy.options.restart_cost)
            if needed is None:
                return None
        return max(needed - (total - hosts), held)

    @hookimpl(trylast=True)
    def spotring_return_to_spot(
        self, instance: Instance, group: GroupStatus, job: JobShape
    ) -> bool | None:
        """An on-demand host is kept while the job catches up (hysteresis) and for the
        rest once the safety net is down; a spot host goes once the safety net is down.

        Replacing an on-demand host by a spot one while catching up (the ring's size
        kept, a restart paid) whenever the slack afforded the restart with the safety
        net's margin cost more: on the Can't Be Late traces at 52 h, 10 of 30 runs dearer
        than today's policy against 5 (docs/cost.md)."""
        mode = self._mode()
        if mode is Mode.SAFETY_NET:
            return instance.lifecycle is not Lifecycle.ON_DEMAND
        if mode is Mode.CATCH_UP and instance.lifecycle is Lifecycle.ON_DEMAND:
            return False
        return None

    def _mode(self) -> Mode:
        mode, projection = self.policy.decide()
        if mode is not self._announced:
            self._announced = mode
            reason = _reason(mode, projection, self.policy.options.unit)
            log.info("deadline mode %s: %s", mode.value, reason)
            emit(
                self._hook,
                "spotring_deadline_decided",
                mode=mode.value,
                reason=reason,
                done=round(projection.done, 3),
                total=projection.total,
                projected_finish=_finite(projection.projected_finish),
                slack_s=_finite(projection.slack_s),
                deadline=self.policy.options.deadline,
            )
        return mode


def _finite(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else round(value, 3)


@contextlib.contextmanager
def deadline_plugin(pm: pluggy.PluginManager, policy: DeadlinePolicy | None) -> Iterator[None]:
    """Register ``policy`` (None: nothing) as a :class:`DeadlinePlugin` for the ``with``
    block, asked after every other plugin and before spotring's defaults
    (:func:`~spotring.autoscaler.plugins.policy.before_defaults`)."""
    if policy is None:
        yield
        return
    with before_defaults(pm, DeadlinePlugin(policy, pm.hook), DEADLINE_PLUGIN):
        yield


DEADLINE_PLUGIN = "spotring.deadline"
"""The name the deadline plugin is registered under."""
