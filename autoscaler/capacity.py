"""The capacity policy: which group of a job is asked for how many hosts.

A job may span several groups in the user's order of preference (spot groups first,
an on-demand group last). This module is the policy as pure logic, on an injectable
clock, with no provider or hook in sight: the controller feeds it what each refresh
saw (:meth:`CapacityPolicy.observe`, :meth:`CapacityPolicy.report_shortage`), and
reads back the size to ask of each group (:meth:`CapacityPolicy.distribute`) and the
fallback host to hand back, if any (:meth:`CapacityPolicy.return_candidate`). Each
decision is returned as a :class:`Decision` for the controller to emit as an event.

The policy, in short:

* A group is *short* when its cloud reports a :class:`CapacityShortage` (any cause)
  while it is below the size asked of it, or when it has stayed below that size for
  ``fallback_after`` seconds without a signal. A short group is backed off (jittered,
  exponential, bounded: :class:`ShortageBackoff`) and asked for no more than it holds
  until the backoff expires; then it is probed: asked for its share again.
* The job's total goes to the groups in order; a short group's shortfall is asked of
  the next. ``on_demand_base`` hosts always go to the last group.
* A host is handed back (a fallback host, once a preferred group has capacity again)
  only when the job keeps its total without it, not before ``return_after`` seconds
  since it fell back, and one at a time.
* A group that was preempted :data:`DEMOTE_AFTER_PREEMPTIONS` times within
  :data:`PREEMPTION_WINDOW_SECONDS` is demoted for :data:`DEMOTION_SECONDS`: it is
  tried after the other groups, before the last.
"""

from __future__ import annotations

import random
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from spotring.core.capacity import CapacityShortage, ShortageCause
from spotring.core.instance import Lifecycle

__all__ = [
    "BELOW_TARGET_CODE",
    "DEFAULT_FALLBACK_AFTER",
    "DEFAULT_ON_DEMAND_BASE",
    "DEFAULT_PROBE_AFTER",
    "DEFAULT_RETURN_AFTER",
    "DEMOTE_AFTER_PREEMPTIONS",
    "DEMOTION_SECONDS",
    "PREEMPTION_WINDOW_SECONDS",
    "CapacityOptions",
    "CapacityPolicy",
    "Decision",
    "GroupStatus",
    "ShortageBackoff",
    "default_order",
]

DEFAULT_FALLBACK_AFTER = 300.0
"""``--fallback-after``: seconds below target without a signal before a group counts as
short. Five minutes: longer than a GPU VM's usual boot (a slow launch is no shortage),
as short as cluster-autoscaler's ``max-node-provision-time`` default is long (15 min)
is too long for a ring training small meanwhile."""
DEFAULT_PROBE_AFTER = 60.0
"""``--probe-after``: seconds a short group is left alone before it is asked again (the
first backoff; each shortage in a row multiplies it by 1.6, up to five times it)."""
DEFAULT_ON_DEMAND_BASE = 0
"""``--on-demand-base``: hosts always kept in the last group (ASG's OnDemandBaseCapacity)."""
DEFAULT_RETURN_AFTER = 600.0
"""``--return-after``: seconds a host stays in its fallback group before it may be handed
back. Two full backoffs of a group that keeps failing (a few minutes each): a spot pool
that comes back for a minute does not make the job swap hosts twice."""

DEMOTE_AFTER_PREEMPTIONS = 3
"""Preemptions within :data:`PREEMPTION_WINDOW_SECONDS` that demote a group."""
PREEMPTION_WINDOW_SECONDS = 3600.0
DEMOTION_SECONDS = 3600.0
"""How long a demoted group is tried after the others (SkyPilot's reasoning: a pool
that keeps preempting is likely to go on doing so for a while)."""

BELOW_TARGET_CODE = "BelowTarget"
"""The code of the shortage the policy infers when a group stays below its target for
``fallback_after`` seconds and its cloud reported nothing."""


@dataclass(frozen=True)
class ShortageBackoff:
    """How long a short group is left alone before it is probed again.

    SkyPilot's numbers for capacity (60 s, x1.6, at most 300 s, +-40% jitter): a
    training job runs small meanwhile, so a pool that comes back is tried within about
    five minutes, and the jitter keeps many jobs from probing a zone at the same time.
    Cluster-autoscaler's 5 -> 30 min are for quota (``quota_*``): a quota is raised by
    a person, not by the cloud within minutes, and asking again costs an API error.
    """

    base: float = 60.0
    factor: float = 1.6
    cap: float = 300.0
    quota_base: float = 300.0
    quota_cap: float = 1800.0
    jitter: float = 0.4
    """The delay is drawn from ``[1 - jitter, 1 + jitter]`` times its nominal value."""

    def delay(
        self, failures: int, cause: ShortageCause, rng: Callable[[], float] = random.random
    ) -> float:
        """Seconds to back a group off after its ``failures``-th shortage in a row (>= 1)."""
        quota = cause is ShortageCause.QUOTA
        base, cap = (self.quota_base, self.quota_cap) if quota else (self.base, self.cap)
        nominal = min(cap, base * self.factor ** max(0, failures - 1))
        return nominal * (1 - self.jitter + 2 * self.jitter * rng())


@dataclass(frozen=True)
class CapacityOptions:
    """The capacity policy's options (``spotring run``)."""

    fallback_after: float = DEFAULT_FALLBACK_AFTER
    on_demand_base: int = DEFAULT_ON_DEMAND_BASE
    return_after: float = DEFAULT_RETURN_AFTER
    backoff: ShortageBackoff = field(default_factory=ShortageBackoff)

    @classmethod
    def probing_after(cls, probe_after: float, **options: Any) -> CapacityOptions:
        """Options whose capacity backoff starts at ``probe_after`` seconds (SkyPilot's
        growth and jitter, at most five times it); quota backoff unchanged."""
        backoff = ShortageBackoff(base=probe_after, cap=5 * probe_after)
        return cls(backoff=backoff, **options)


@dataclass(frozen=True)
class GroupStatus:
    """One group as the policy sees it: what the decision hooks are shown."""

    name: str
    lifecycle: Lifecycle | None
    position: int
    """Its place in the user's order of preference (0 first)."""
    asked: int
    """Hosts last asked of it."""
    live: int
    """Members launching or ready."""
    ready: int
    """Members ready (in the job)."""
    short: bool
    """Backed off: not asked for more than it holds until ``backoff_left_s`` is 0."""
    shortage: CapacityShortage | None
    """The last shortage it had, or None."""
    backoff_left_s: float
    below_target_s: float
    """Seconds it has been below ``asked``; 0 when it is not."""
    preemptions_last_hour: int
    demoted_left_s: float
    """Seconds its demotion has left; 0 when it is not demoted."""
    usd_per_slot: float | None = None
    """What one of its slots costs an hour (the job's price book); None when unknown."""

    @property
    def demoted(self) -> bool:
        return self.demoted_left_s > 0


def default_order(groups: Sequence[GroupStatus], by_price: bool = False) -> list[str]:
    """spotring's order of ``groups``: the user's, with demoted groups moved after the
    others but before the last group (the on-demand one, which stays last).

    ``by_price`` (``--order price``): the groups before the last are tried cheapest per
    slot first, within each of those two tiers (a demoted group still comes after the
    others, however cheap); a group whose price is unknown after those whose price is
    known; equal prices in the user's order. The last group stays last.
    """
    ordered = sorted(groups, key=lambda g: g.position)
    if len(ordered) < 2:
        return [g.name for g in ordered]
    head, last = ordered[:-1], ordered[-1]
    if by_price:  # sorted() is stable: the user's order among equals
        head = sorted(head, key=_price_key)
    kept = [g.name for g in head if not g.demoted]
    demoted = [g.name for g in head if g.demoted]
    return [*kept, *demoted, last.name]


def _price_key(group: GroupStatus) -> tuple[bool, float]:
    return (group.usd_per_slot is None, group.usd_per_slot or 0.0)


@dataclass(frozen=True)
class Decision:
    """Something the policy decided that is worth an event: ``kind`` is
    ``capacity_shortage``, ``group_demoted`` or ``fell_back``."""

    kind: str
    group: str
    shortage: CapacityShortage | None = None
    until: float | None = None
    """Epoch seconds (``group_demoted``)."""
    to_group: str = ""
    hosts: int = 0


@dataclass
class _Group:
    name: str
    lifecycle: Lifecycle | None
    position: int
    asked: int = 0
    asked_once: bool = False
    live: int = 0
    ready: int = 0
    below_since: float | None = None
    shortage: CapacityShortage | None = None
    short_at: float | None = None
    backoff_until: float = 0.0
    failures: int = 0
    preemptions: deque[float] = field(default_factory=deque)
    demoted_until: float = 0.0
    joined: dict[str, float] = field(default_factory=dict)
    """Live member id -> when it was first seen in this group."""
    fell_back_to: int = 0
    """Hosts the last distribution asked of the groups after this one because it was short."""


class CapacityPolicy:
    """The capacity policy of one job over ``groups`` (names in preference order).

    :param lifecycles: each group's lifecycle where known (for the status shown to
        hooks and the metrics).
    :param clock: seconds, monotonic (tests pass a fake one).
    :param wall_clock: epoch seconds, for ``since`` and ``until`` values shown outside.
    :param rng: uniform in [0, 1), for the backoff's jitter.
    :param prices: a group's USD per slot-hour, None when unknown (the job's price
        book): shown in each group's status.
    """

    def __init__(
        self,
        groups: Sequence[str],
        options: CapacityOptions = CapacityOptions(),
        *,
        lifecycles: Mapping[str, Lifecycle | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        rng: Callable[[], float] = random.random,
        prices: Callable[[str], float | None] | None = None,
    ) -> None:
        if not groups:
            raise ValueError("a capacity policy needs at least one group")
        if len(set(groups)) != len(groups):
            raise ValueError(f"group names must be unique: {', '.join(groups)}")
        self.options = options
        self._clock = clock
        self._wall_clock = wall_clock
        self._rng = rng
        self._prices = prices
        lifecycles = lifecycles or {}
        self._groups = {
            name: _Group(name, lifecycles.get(name), position)
            for position, name in enumerate(groups)
        }
        self._order = list(groups)
        self._shares: dict[str, int] = {}  # the last distribution, before live floors
        self._limited: set[str] = set()  # groups allowed less than was wanted of them
        self.returning: tuple[str, str] | None = None
        """(instance id, group) of the host being handed back, or None."""
        self._returning_since = 0.0

    # ----------------------------------------------------------------- reading

    @property
    def groups(self) -> list[str]:
        """Group names in the user's order."""
        return list(self._order)

    @property
    def last(self) -> str:
        """The user's last group: the one that keeps ``on_demand_base``."""
        return self._order[-1]

    def asked(self, group: str) -> int:
        return self._groups[group].asked

    def below_since(self, group: str) -> float | None:
        """Clock time since which ``group`` is below its asked size, or None."""
        return self._groups[group].below_since

    def below_since_wall(self, group: str) -> float | None:
        """:meth:`below_since` as epoch seconds: the ``since`` of
        :meth:`Provider.capacity_shortage`."""
        since = self._groups[group].below_since
        return None if since is None else self._wall_clock() - (self._clock() - since)

    def wants_signal(self, group: str) -> bool:
        """Whether the controller should ask ``group``'s cloud for a shortage now: it
        is below its asked size and not backed off already."""
        state = self._groups[group]
        return state.below_since is not None and not self._short(state)

    def status(self, group: str) -> GroupStatus:
        state = self._groups[group]
        now = self._clock()
        self._forget_preemptions(state, now)
        return GroupStatus(
            name=state.name,
            lifecycle=state.lifecycle,
            position=state.position,
            asked=state.asked,
            live=state.live,
            ready=state.ready,
            short=self._short(state),
            shortage=state.shortage,
            backoff_left_s=max(0.0, state.backoff_until - now),
            below_target_s=0.0 if state.below_since is None else now - state.below_since,
            preemptions_last_hour=len(state.preemptions),
            demoted_left_s=max(0.0, state.demoted_until - now),
            usd_per_slot=self._prices(group) if self._prices is not None else None,
        )

    def statuses(self) -> list[GroupStatus]:
        """Every group's status, in the user's order."""
        return [self.status(name) for name in self._order]

    def default_order(self) -> list[str]:
        """spotring's order (:func:`default_order` of the groups' statuses)."""
        return default_order(self.statuses())

    # ---------------------------------------------------------------- observing

    def observe(self, group: str, live_ids: Iterable[str], ready: int) -> None:
        """What a refresh listed of ``group``: its live (launching or ready) members
        and how many are ready. Marks the group below target or back at it."""
        state = self._groups[group]
        now = self._clock()
        ids = list(live_ids)
        state.joined = {key: state.joined.get(key, now) for key in ids}
        state.live = len(ids)
        state.ready = ready
        # What it should hold: its share, not members it was left with beyond it (a
        # host being handed back drains while its group is asked to keep it).
        wanted = min(state.asked, self._shares.get(group, state.asked))
        if ready >= wanted or self._short(state):
            # Backed off: it is not waited for; it is asked anew, and timed anew, at expiry.
            state.below_since = None
            if ready >= wanted > 0 and not self._short(state):
                state.failures = 0  # it reached what it was asked: the pool is back
        elif state.below_since is None:
            state.below_since = now

    def report_shortage(self, group: str, shortage: CapacityShortage | None) -> Decision | None:
        """The cloud's answer for ``group`` (None: it reported nothing) after
        :meth:`observe`. Returns a ``capacity_shortage`` decision when the group is
        now short: backed off, not asked for more until the backoff expires."""
        state = self._groups[group]
        now = self._clock()
        if state.below_since is None or self._short(state):
            return None
        if shortage is None:
            if now - state.below_since < self.options.fallback_after:
                return None
            shortage = CapacityShortage(
                ShortageCause.OTHER,
                BELOW_TARGET_CODE,
                f"{state.ready} of {state.asked} hosts ready for "
                f"{now - state.below_since:.0f}s with no error from the cloud",
            )
        state.failures += 1
        state.shortage = shortage
        state.short_at = now
        state.backoff_until = now + self.options.backoff.delay(
            state.failures, shortage.cause, self._rng
        )
        # Probing again restarts the wait: the group is asked anew at expiry.
        state.below_since = None
        return Decision("capacity_shortage", group, shortage=shortage)

    def preempted(self, group: str) -> Decision | None:
        """A member of ``group`` was taken by the cloud (a notice, or it vanished).
        Returns a ``group_demoted`` decision when that demotes the group."""
        state = self._groups[group]
        now = self._clock()
        self._forget_preemptions(state, now)
        state.preemptions.append(now)
        if len(state.preemptions) < DEMOTE_AFTER_PREEMPTIONS or state.demoted_until > now:
            return None
        state.demoted_until = now + DEMOTION_SECONDS
        state.preemptions.clear()
        return Decision("group_demoted", group, until=self._wall_clock() + DEMOTION_SECONDS)

    # --------------------------------------------------------------- deciding

    def distribute(
        self,
        total: int,
        order: Sequence[str] | None = None,
        allow: Callable[[str, str, int], int] | None = None,
        limits: Mapping[str, int] | None = None,
    ) -> tuple[dict[str, int], list[Decision]]:
        """The size to ask of each group for a job of ``total`` hosts, and the
        ``fell_back`` decisions it took.

        Groups are served in ``order`` (default :meth:`default_order`): a group that is
        not short is asked for all that is still wanted; a short one only for what it
        has ready, the rest going to the next. The last group always gets
        ``on_demand_base`` hosts on top. A group is never asked for fewer than its live
        members (hosts leave only by :meth:`return_candidate`, at a commit).

        :param allow: ``allow(group, short_group, hosts)``: how many of the ``hosts``
            still wanted ``group`` may hold because ``short_group`` is short (the
            ``spotring_fall_back`` and ``spotring_fall_back_hosts`` hooks): ``hosts``
            allows all. A group allowed fewer than it holds is not shrunk here: the
            hosts beyond are handed back by :meth:`return_candidate`, even though the
            job is left short.
        :param limits: the most members each group can hold, where it says.
        """
        order = list(order) if order is not None else self.default_order()
        order += [g for g in self._order if g not in order]  # a hook's order may omit some
        limits = limits or {}
        base = min(self.options.on_demand_base, total)
        remaining = total - base
        shares: dict[str, int] = {}
        self._limited = set()
        decisions: list[Decision] = []
        passed: list[tuple[str, int]] = []  # short groups whose shortfall goes on
        for name in order:
            state = self._groups[name]
            own_base = base if name == self.last else 0
            short = self._short(state)
            share = min(state.ready, remaining) if short else remaining
            if not short and remaining > 0 and passed and allow is not None:
                share = max(0, min(remaining, allow(name, passed[0][0], remaining)))
                if share < remaining:
                    self._limited.add(name)
            cap = limits.get(name)
            if cap is not None:
                share = max(0, min(share, cap - own_base))
            if short and remaining > share:
                passed.append((name, remaining - share))
            elif passed and not short and share > 0:
                # This group takes the shortfall of the short ones before it.
                for short_name, hosts in passed:
                    taken = min(hosts, share)
                    if self._groups[short_name].fell_back_to != taken:
                        decisions.append(
                            Decision("fell_back", short_name, to_group=name, hosts=taken)
                        )
                    self._groups[short_name].fell_back_to = taken
                passed = []
            shares[name] = share + own_base
            remaining -= share
        for name in self._order:
            if not self._short(self._groups[name]):
                self._groups[name].fell_back_to = 0
        self._shares = dict(shares)
        # A group is never shrunk below its live members: hosts leave only by being
        # handed back (return_candidate), at a commit. Nor is it grown to them: members
        # beyond what it was asked (a noticed host's replacement, launched by the
        # provider while the host drains) would otherwise raise its size each refresh,
        # and the provider launch another on top, without end.
        asked = {name: max(shares[name], self._floor(self._groups[name])) for name in self._order}
        now = self._clock()
        for name, size in asked.items():
            state = self._groups[name]
            state.asked, state.asked_once = size, True
            # Below target from the moment it is asked for more than it has: the
            # cloud's failure to launch comes right after the ask.
            if state.ready < shares[name] and state.below_since is None and not self._short(state):
                state.below_since = now
        return asked, decisions

    def return_candidate(
        self, total: int, ready: Mapping[str, Sequence[str]], order: Sequence[str] | None = None
    ) -> tuple[str, str] | None:
        """The host to hand back now, as (instance id, group), or None.

        Only when no host is being handed back already: a member of the least preferred
        group that holds more than its share (its last :meth:`distribute`), in that
        group for at least ``return_after`` seconds, when the job keeps ``total`` ready
        hosts without it, or its group was allowed fewer hosts than were wanted of it
        (``allow``). ``ready``: each group's ready member ids.
        """
        if self.returning is not None:
            return None
        order = list(order) if order is not None else self.default_order()
        keeps_size = sum(len(ids) for ids in ready.values()) - 1 >= total
        now = self._clock()
        for name in reversed(order):
            state = self._groups[name]
            if not keeps_size and name not in self._limited:
                continue
            if len(ready.get(name, ())) <= self._shares.get(name, 0):
                continue
            eligible = [
                key
                for key in ready.get(name, ())
                if now - state.joined.get(key, now) >= self.options.return_after
            ]
            if eligible:  # the newest first: the oldest has proven itself
                return max(eligible, key=lambda key: state.joined.get(key, now)), name
        return None

    def in_group_for(self, instance_id: str, group: str) -> float:
        """Seconds ``instance_id`` has been listed in ``group`` (0 when it is not)."""
        joined = self._groups[group].joined.get(instance_id)
        return 0.0 if joined is None else self._clock() - joined

    def start_return(self, instance_id: str, group: str) -> None:
        """``instance_id`` of ``group`` is being handed back: no other until it is gone."""
        self.returning = (instance_id, group)
        self._returning_since = self._clock()

    def returning_for(self) -> float:
        """Seconds since the current hand-back started (0 when none)."""
        return 0.0 if self.returning is None else self._clock() - self._returning_since

    def finish_return(self, removed: bool) -> None:
        """The host being handed back is gone (``removed``: the group was shrunk by one),
        or the hand-back was given up."""
        if self.returning is not None and removed:
            _, group = self.returning
            state = self._groups[group]
            state.asked = max(0, state.asked - 1)
        self.returning = None

    # ---------------------------------------------------------------- helpers

    @staticmethod
    def _floor(state: _Group) -> int:
        """The least a group is asked for: its live members, but no more than it was
        asked before (a group never asked yet: all it holds)."""
        return min(state.live, state.asked) if state.asked_once else state.live

    def _short(self, state: _Group) -> bool:
        return state.backoff_until > self._clock()

    def _forget_preemptions(self, state: _Group, now: float) -> None:
        while state.preemptions and state.preemptions[0] <= now - PREEMPTION_WINDOW_SECONDS:
            state.preemptions.popleft()
