"""Steering: the size each of a job's groups is asked to hold.

After each refresh, on the controller's thread, :class:`Steering` asks the
``spotring_target_size`` hook for the job's size, within its groups' limits. A job of
one group is asked that size. A job of several is steered by the capacity policy
(:class:`spotring.autoscaler.capacity.CapacityPolicy`), which decides as pure logic
over what each refresh saw; the steering feeds it and applies its decisions: it asks a
group below its size for its cloud's shortage signal, splits the job's size across
the groups (through the ``spotring_order_groups`` and ``spotring_fall_back`` hooks),
resizes them, and hands fallback hosts back one at a time, at a commit
(``spotring_return_to_spot``). It counts the spot members the clouds take, which
demote a group.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass

import pluggy

from spotring.autoscaler.calls import ControllerError, call, emit
from spotring.autoscaler.capacity import CapacityOptions, CapacityPolicy, GroupStatus
from spotring.autoscaler.groups import describe_groups, group_names, job_size_limits
from spotring.core import Instance, InstanceState, InterruptionNotice, Lifecycle, ProviderError
from spotring.core.inventory import Inventory
from spotring.core.job import JobShape
from spotring.providers.base import Provider

log = logging.getLogger(__name__)

__all__ = ["Steering"]

_BILLED = (InstanceState.PENDING, InstanceState.READY, InstanceState.DRAINING)
_TAKEN = (InstanceState.TERMINATING, InstanceState.GONE)


class Steering:
    """The steering of one job's ``groups`` (in the user's order of preference).

    :param hook: the plugin manager's hook relay: the decision hooks and the events.
    :param job: the job's limits and steering options.
    :param options: the capacity policy's options (a job of several groups).
    :param clock: the policy's clock (seconds, monotonic): tests pass a fake one.
    :param drain: takes a host out of discovery with a notice, as a noticed host
        leaves (the controller's); a host being handed back leaves that way.
    :param prices: a group's USD per slot-hour, None when unknown (the controller's
        price book): shown to the hooks in each group's status.
    """

    RETURN_LEAVE_SECONDS = 300.0
    """The longest a host being handed back waits for a ring formed without it before
    its group is shrunk anyway (no ring may be forming at all). Generous: the ring
    leaves it at its next commit, and a job may commit minutes apart; shrinking the
    group before then would kill its workers mid-step (a roll back)."""
    RETURN_GONE_SECONDS = 600.0
    """The longest a host handed back may stay listed before another may go."""
    RETURN_NOTICE = "return"
    """The notice kind a host handed back drains with (as a noticed preemption)."""

    def __init__(
        self,
        groups: Sequence[Provider],
        hook: pluggy.HookRelay,
        job: JobShape,
        options: CapacityOptions,
        clock: Callable[[], float],
        drain: Callable[[str, InterruptionNotice], None],
        prices: Callable[[str], float | None] | None = None,
    ) -> None:
        self._groups = tuple(groups)
        self._by_name = dict(zip(group_names(groups), groups, strict=True))
        self._hook = hook
        self._job = job
        self._options = options
        self._clock = clock
        self._drain = drain
        self._prices = prices
        self.target: int | None = None
        """The job's size last asked for; None before."""
        self._policy: CapacityPolicy | None = None  # made at the first steering
        self._asked: dict[str, int] = {}  # group -> size it last accepted
        self._limits: dict[str, int] | None = None
        self._members: dict[str, tuple[str, Lifecycle]] = {}  # live id -> (group, lifecycle)
        self._not_preempted: set[str] = set()  # ids that left at spotring's request
        self._return: _Return | None = None
        # The last ring's hosts and when it formed (monotonic), from Horovod's thread.
        self._ring: tuple[float, frozenset[str]] = (0.0, frozenset())
        self._offered: frozenset[str] | None = None
        """What discovery last offered Horovod; None before it says (no driver: every
        ready host counts)."""
        self.status: tuple[GroupStatus, ...] = ()
        """Each group's status after the last capacity steering (a job of several
        groups; empty otherwise): replaced whole, readable from any thread."""

    # ------------------------------------------------ what the controller tells it

    def ring_formed(self, hosts: Sequence[str]) -> list[str]:
        """Horovod formed a ring of ``hosts`` (on Horovod's thread): the address of the
        host being handed back once it has left the ring, for its workers to stop."""
        self._ring = (time.monotonic(), frozenset(hosts))
        handing = self._return
        if handing is None or handing.instance.address in hosts:
            return []
        return [handing.instance.address]

    def hosts_offered(self, hosts: Collection[str]) -> None:
        """The hosts discovery last offered Horovod (on Horovod's thread): a fallback
        host is handed back only while the job keeps its size in offered hosts
        without it."""
        self._offered = frozenset(hosts)

    def handing_back(self, instance_id: str) -> bool:
        """Whether ``instance_id`` is the host being handed back (any thread)."""
        handing = self._return
        return handing is not None and handing.instance.id == instance_id

    def asked_to_go(self, instance_id: str) -> None:
        """spotring asked for ``instance_id`` to go (a replacement): its leaving is no
        preemption."""
        self._not_preempted.add(instance_id)

    def preempted(self, instance_id: str) -> None:
        """The cloud is taking ``instance_id`` (a notice, or it went): a spot member
        counts against its group, once; 3 in an hour demote the group."""
        member = self._members.pop(instance_id, None)
        if member is None or instance_id in self._not_preempted or self._policy is None:
            return
        self._not_preempted.add(instance_id)  # counted once
        group, lifecycle = member
        if lifecycle is not Lifecycle.SPOT:
            return
        decision = self._policy.preempted(group)
        if decision is not None and decision.until is not None:
            log.warning("group %s was preempted often: asked after the others for an hour",
                        group)  # fmt: skip
            emit(self._hook, "spotring_group_demoted", group=group, until=decision.until)

    # ------------------------------------------------------------------- steering

    def steer(self, inventory: Inventory, lifecycles: Mapping[str, Lifecycle | None]) -> None:
        """Steer the groups as the last refresh found them (``inventory``;
        ``lifecycles``: what each group launches, where it says), then have each hold
        its size (``keep_size``). Nothing for groups that cannot be resized."""
        if not any(group.can_resize for group in self._groups):
            return
        self._steer_size(inventory)
        if len(self._groups) > 1 and self.target is not None:
            self._steer_capacity(self.target, inventory, lifecycles)
        for group in self._groups:
            if group.can_resize:
                call("keeping the group's size", group.keep_size)

    def _steer_size(self, inventory: Inventory) -> None:
        """Ask for the job's size (``spotring_target_size``) within the groups' limits:
        of its group, or, for several, of the capacity steering."""
        wanted = call(
            "the spotring_target_size hook",
            self._hook.spotring_target_size,
            inventory=inventory,
            job=self._job,
            current_target=self.target,
        )
        if wanted is None or wanted == self.target:
            return
        limits = call("reading the group's limits", job_size_limits, self._groups)
        size = int(wanted)
        if limits is not None:
            low, high = limits
            size = min(max(size, low), high)
            if size != wanted and size != self.target:
                log.warning("target of %d hosts is outside the group's limits [%d, %d]; "
                            "using %d", wanted, low, high, size)  # fmt: skip
        if size == self.target:
            return
        try:
            if len(self._groups) == 1:
                call("resizing the group", self._groups[0].set_target_size, size)
        except ProviderError as error:
            if not error.retryable:
                raise
            log.warning("could not resize %s, will retry: %s", self._describe(), error)
            return
        self.target = size
        log.info("asked %s for %d hosts", self._describe(), size)

    def _describe(self) -> str:
        return describe_groups(self._groups)

    def _steer_capacity(
        self, total: int, inventory: Inventory, lifecycles: Mapping[str, Lifecycle | None]
    ) -> None:
        """Split the job's ``total`` hosts across its groups, fall back from short
        groups, and hand a fallback host back, at a commit."""
        policy = self._capacity_policy(lifecycles)
        ready: dict[str, list[str]] = {name: [] for name in policy.groups}
        for instance in inventory.ready:
            if instance.group in ready:
                ready[instance.group].append(instance.id)
        self._count_preemptions(inventory)
        for name in policy.groups:
            policy.observe(name, _live_members(inventory, name), len(ready[name]))
            self._read_shortage(policy, name)
        order = self._order(policy)
        self._resize(policy, total, order)
        offered = self._offered
        if offered is not None:
            # Only hosts Horovod is offered count toward the job's size: a spot host
            # still starting its warm worker is not yet one the ring can re-form onto,
            # and handing a fallback host back before it is would train the ring small.
            addresses = {i.id: i.address for i in inventory.ready}
            ready = {
                name: [key for key in ids if addresses[key] in offered]
                for name, ids in ready.items()
            }
        self._hand_back(policy, inventory, total, ready, order)
        self.status = tuple(policy.statuses())

    def _capacity_policy(self, lifecycles: Mapping[str, Lifecycle | None]) -> CapacityPolicy:
        if self._policy is None:
            self._policy = CapacityPolicy(
                list(self._by_name),
                self._options,
                lifecycles=lifecycles,
                clock=self._clock,
                prices=self._prices,
            )
        return self._policy

    def _read_shortage(self, policy: CapacityPolicy, name: str) -> None:
        """Ask ``name``'s cloud for its shortage while the policy wants the signal, and
        tell the plugins when the group is found short."""
        shortage = None
        since = policy.below_since_wall(name) if policy.wants_signal(name) else None
        if since is not None:
            try:
                shortage = call(f"asking {name} for a capacity shortage",
                                self._by_name[name].capacity_shortage, since)  # fmt: skip
            except ProviderError as error:
                if not error.retryable:
                    raise
                log.warning("could not ask %s for a capacity shortage: %s", name, error)
        decision = policy.report_shortage(name, shortage)
        if decision is not None and decision.shortage is not None:
            log.warning("group %s is short: %s", name, decision.shortage.describe())
            emit(self._hook, "spotring_capacity_shortage", group=name, shortage=decision.shortage)

    def _order(self, policy: CapacityPolicy) -> list[str] | None:
        """The order the plugins ask the groups in (None: spotring's own)."""
        order = call(
            "the spotring_order_groups hook",
            self._hook.spotring_order_groups,
            groups=policy.statuses(),
            job=self._job,
        )
        return list(order) if order is not None else None

    def _resize(self, policy: CapacityPolicy, total: int, order: list[str] | None) -> None:
        """Ask each group for its share of ``total``, a short group's shortfall of the
        groups after it, as the ``spotring_fall_back`` hook allows, as many hosts as
        ``spotring_fall_back_hosts`` says (default: all still wanted)."""

        def allow(group: str, short: str, hosts: int) -> int:
            asked = {
                "group": policy.status(group),
                "short": policy.status(short),
                "hosts": hosts,
                "job": self._job,
            }
            answer = call("the spotring_fall_back hook", self._hook.spotring_fall_back, **asked)
            if answer is not None and not answer:
                return policy.status(group).ready  # refused: it keeps what it holds
            count = call(
                "the spotring_fall_back_hosts hook",
                self._hook.spotring_fall_back_hosts,
                total=total,
                **asked,
            )
            if count is None:
                return hosts
            if not isinstance(count, int) or isinstance(count, bool):
                raise ControllerError(
                    f"the spotring_fall_back_hosts hook answered {count!r}, not a number of hosts"
                )
            return count

        if self._limits is None:
            self._limits = call("reading the groups' limits", self._group_limits)
        asked, decisions = policy.distribute(total, order, allow, self._limits)
        for decision in decisions:
            log.warning("asking %s for %d hosts %s cannot supply", decision.to_group,
                        decision.hosts, decision.group)  # fmt: skip
            emit(self._hook, "spotring_fell_back", from_group=decision.group,
                 to_group=decision.to_group, hosts=decision.hosts)  # fmt: skip
        for name, size in asked.items():
            group = self._by_name[name]
            if self._asked.get(name) == size or not group.can_resize:
                continue
            try:
                call(f"resizing {name}", group.set_target_size, size)
            except ProviderError as error:
                if not error.retryable:
                    raise
                log.warning("could not resize %s, will retry: %s", name, error)
                continue
            self._asked[name] = size
            log.info("asked %s for %d hosts", name, size)

    def _group_limits(self) -> dict[str, int]:
        """The most members each group can hold, where it says."""
        limits = {}
        for name, group in self._by_name.items():
            limit = group.size_limits()
            if limit is not None:
                limits[name] = limit[1]
        return limits

    def _count_preemptions(self, inventory: Inventory) -> None:
        """A spot member the cloud took (it left the listing, or is going, failed)
        without spotring asking counts against its group: 3 in an hour demote it.
        Only a member that ran counts: one that failed or went while it was being
        created is a launch that failed (the group's capacity shortage says so), not
        a preemption."""
        current: dict[str, tuple[str, Lifecycle]] = {}
        gone: list[str] = []
        for instance in inventory.instances:
            if instance.failure or instance.state in _TAKEN:
                gone.append(instance.id)
            elif instance.group and (
                instance.state is InstanceState.READY or instance.id in self._members
            ):
                current[instance.id] = (instance.group, instance.lifecycle)
        gone += [key for key in self._members if key not in current and key not in gone]
        for key in gone:
            if key in self._members:
                self.preempted(key)
        self._members = current
        listed = {i.id for i in inventory.instances}
        self._not_preempted &= listed  # forgotten once the cloud stops listing them

    # ---------------------------------------------------------------- hand-backs

    def _hand_back(
        self,
        policy: CapacityPolicy,
        inventory: Inventory,
        total: int,
        ready: dict[str, list[str]],
        order: list[str] | None,
    ) -> None:
        """Hand fallback hosts back, one at a time: take the host out of discovery
        (the ring re-forms without it at its next commit), then, once a ring formed
        without it (or :data:`RETURN_LEAVE_SECONDS` passed), shrink its group."""
        handing = self._return
        if handing is not None:
            listed = inventory.by_id(handing.instance.id)
            gone = listed is None or listed.state in _TAKEN
            waited = time.monotonic() - handing.started
            if not handing.removed:
                ring_at, ring = self._ring
                left = ring_at > handing.started and handing.instance.address not in ring
                if gone or left or waited > self.RETURN_LEAVE_SECONDS:
                    self._shrink(policy, inventory, handing)
                return
            if not gone and waited <= self.RETURN_GONE_SECONDS:
                return
            self._return = None  # gone: the next may go
            policy.finish_return(removed=False)
        candidate = policy.return_candidate(total, ready, order)
        if candidate is None:
            return
        instance_id, name = candidate
        instance = inventory.by_id(instance_id)
        if instance is None:
            return
        keep = not call(
            "the spotring_return_to_spot hook",
            self._hook.spotring_return_to_spot,
            instance=instance,
            group=policy.status(name),
            job=self._job,
        )
        if keep:
            return
        log.info("handing %s (%s) back to %s's preferred groups: it leaves the ring at its "
                 "next commit", instance.address, instance.id, name)  # fmt: skip
        self._return = _Return(
            instance, name, time.monotonic(), policy.in_group_for(instance.id, name)
        )
        self._not_preempted.add(instance.id)
        policy.start_return(instance.id, name)
        self._drain(instance.id, InterruptionNotice(self.RETURN_NOTICE))

    def _shrink(self, policy: CapacityPolicy, inventory: Inventory, handing: _Return) -> None:
        name = handing.group
        group = self._by_name[name]
        try:
            if group.can_remove:
                if inventory.by_id(handing.instance.id) is not None:  # not gone already
                    call(f"removing a member of {name}", group.remove_instance,
                         handing.instance.id)  # fmt: skip
            else:
                # One less than the group was asked for, or than it holds when no
                # resize of it went through yet: never 0 for a group of several.
                asked = self._asked.get(name)
                if asked is None:
                    asked = len(_live_members(inventory, name))
                call(f"resizing {name}", group.set_target_size, max(0, asked - 1))
        except ProviderError as error:
            if not error.retryable:
                raise
            log.warning("could not hand %s back, will retry: %s", handing.instance.id, error)
            return
        handing.removed = True
        if name in self._asked:
            self._asked[name] = max(0, self._asked[name] - 1)
        policy.finish_return(removed=True)
        policy.start_return(handing.instance.id, name)  # still one at a time
        log.info("handed %s back: %s shrunk by one", handing.instance.id, name)
        emit(self._hook, "spotring_returned", instance=handing.instance, group=name,
             seconds=handing.in_group_s)  # fmt: skip


def _live_members(inventory: Inventory, group: str) -> list[str]:
    """Ids of ``group``'s members the cloud bills and keeps: starting, up or
    draining, and not failed."""
    return [
        i.id
        for i in inventory.instances
        if i.group == group and i.state in _BILLED and not i.failure
    ]


@dataclass
class _Return:
    """A host being handed back: it drains, then its group is shrunk."""

    instance: Instance
    group: str
    started: float
    in_group_s: float
    """How long it had been in its group when its hand-back began."""
    removed: bool = False
