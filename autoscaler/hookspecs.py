"""Hook specifications: every way a plugin can extend spotring.

Plugins implement these with ``@spotring.autoscaler.hookimpl``, the same marker as
``spotring.core.hookimpl`` (which the built-in providers use: they stand below the
controller), and are found through the ``spotring.providers`` entry-point group. Only
functions whose names start with ``spotring_`` are taken as hook implementations.

Every hook is called through the plugin manager (``pm.hook.NAME``), so
``SPOTRING_TRACE_HOOKS=1`` shows each call and ``wrapper=True`` implementations run.

Threads: each hook's docstring says which thread calls it. In short:

* configuration (``spotring_register_providers``, ``spotring_add_provider_options``):
  the thread that builds the plugin manager or the parser (the CLI's);
* ``spotring_job_started`` and ``spotring_job_finished``: the thread that runs the job
  (the CLI's), before the controller starts and after everything has stopped;
* the controller's decisions and events (``spotring_target_size``,
  ``spotring_replace_host``, ``spotring_inventory_changed``, ``spotring_refreshed``,
  ``spotring_host_noticed``, ``spotring_host_failed``, and the capacity ones:
  ``spotring_order_groups``, ``spotring_fall_back``, ``spotring_fall_back_hosts``,
  ``spotring_return_to_spot``,
  ``spotring_capacity_shortage``, ``spotring_fell_back``, ``spotring_returned``,
  ``spotring_group_demoted``, ``spotring_deadline_decided``, and
  ``spotring_price_changed``): the controller's thread
  (``spotring-controller``), one call at a time, in the order things happened;
* ``spotring_drain_on_notice``: the launcher's thread that read the notice from the
  worker (``spotring-output``), at once and synchronously, so that a draining host
  leaves discovery before Horovod's next poll: keep it quick, call no cloud;
* ``spotring_ring_formed``: Horovod's thread that plans the ring, inside the
  rendezvous server, before the workers hear their ranks: keep it quick;
* ``spotring_ring_progress``, ``spotring_ring_idle``, ``spotring_ring_stalled`` and
  ``spotring_ring_hung``: the progress tracker's thread (``spotring-progress``).

An event plugin that keeps state across threads (the ring's and the controller's
events) guards it with a lock.

Errors: an event hook's implementation that raises (a ``wrapper=True`` one included)
is logged, once per plugin and hook, and the other plugins still hear the event (the
plugin manager isolates them). A decision hook that raises stops the job with its
message, through the controller's fatal error, since spotring cannot act on a policy
it could not learn. A configuration hook's error reaches the command that called it.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, TypeVar, overload

# The markers live in spotring.core so plugins mark hooks without importing the
# controller; they are re-exported here under their old names.
from spotring.core.hooks import PROJECT as PROJECT
from spotring.core.hooks import hookimpl as hookimpl
from spotring.core.hooks import hookspec

if TYPE_CHECKING:
    from spotring.autoscaler.capacity import GroupStatus
    from spotring.core import (
        CapacityShortage,
        Instance,
        InterruptionNotice,
        Inventory,
        JobShape,
        Lifecycle,
    )
    from spotring.core.prices import HourlyPrice
    from spotring.driver.ring_events import Hang, RingStatus, Stall
    from spotring.providers.base import Provider, ProviderRegistry

F = TypeVar("F", bound=Callable[..., object])


@overload
def event(function: F, *, historic: bool = False) -> F: ...
@overload
def event(function: None = None, *, historic: bool = False) -> Callable[[F], F]: ...
def event(function: F | None = None, *, historic: bool = False) -> F | Callable[[F], F]:
    """Mark a hookspec as an event: its results are ignored, and the plugin manager
    isolates its implementations from one another (one that raises is logged, the rest
    still run). ``historic``: a plugin registered after the call hears it then."""

    def mark(spec: F) -> F:
        spec.spotring_event = True  # type: ignore[attr-defined]  # a marker on the spec
        return hookspec(historic=historic)(spec)

    return mark if function is None else mark(function)


def is_event(spec: Callable[..., object]) -> bool:
    """Whether ``spec`` (a hookspec function) is marked with :func:`event`."""
    return bool(getattr(spec, "spotring_event", False))


# -------------------------------------------------------------------- registration


@hookspec
def spotring_register_providers(registry: ProviderRegistry) -> None:
    """Register provider classes.

    Called on every plugin each time spotring collects its providers (``spotring
    providers``, ``--provider``), and on one plugin at a time when a provider is
    disabled (``SPOTRING_DISABLE_PLUGINS``): register and do nothing else. Called on
    the thread that asks (the CLI's); an error reaches it.

    :param registry: call ``registry.add(ProviderClass)`` for each provider the plugin
        offers; the class's ``name`` attribute is the key users pass to ``--provider``.
        Adding a second provider under a name already taken raises ``ValueError``.
    """


# ---------------------------------------------------------------- command line


@hookspec
def spotring_add_provider_options(provider: type[Provider], group: argparse._ArgumentGroup) -> None:
    """Add command-line options for ``provider``.

    Called when ``spotring run`` or ``spotring discover`` builds its parser for the
    chosen provider, so ``spotring run --provider NAME --help`` shows the options.
    spotring's own implementation calls ``provider.add_arguments(group)``; other plugins
    may add options that they read back in their own hooks. Called on the thread that
    builds the parser (the CLI's); an error reaches it.

    :param provider: the provider class the user chose.
    :param group: the argument group to add options to.
    """


# ------------------------------------------------------------------- decisions


@hookspec(firstresult=True)
def spotring_target_size(
    inventory: Inventory, job: JobShape, current_target: int | None
) -> int | None:
    """How many hosts the group should hold.

    Called on the controller thread after every successful refresh while resizing is
    on. spotring's own answer (``spotring.autoscaler.policy``): at start,
    ``--target-hosts`` or enough hosts for ``-np`` at the slots the members report;
    later, only a change that keeps the group within what ``--min-np``/``--max-np``
    need. The controller clamps the answer to the group's own limits and calls the
    provider only when it differs from ``current_target``. Stops at the first non-None
    result.

    :param inventory: the group as just listed.
    :param job: the job's elastic limits and steering options.
    :param current_target: the size spotring last asked for; None before the first.
    :return: the number of hosts, or None to leave the group as it is.
    """


@hookspec(firstresult=True)
def spotring_replace_host(instance: Instance, reason: str, job: JobShape) -> bool | None:
    """Whether to have the group replace a host taken out of the job.

    Called on the controller thread after ``spotring_host_failed``. A host the job
    carried on without for the replacement grace period is then replaced through
    ``provider.replace_instance``. spotring's own answer: yes, unless ``--no-replace``.
    Stops at the first non-None result.

    :param instance: the instance as last listed.
    :param reason: why it was taken out, e.g. ``"worker rank 2 exited with -9"``.
    :param job: the job's elastic limits and steering options.
    :return: True to replace, False to keep it, None to leave the answer to others.
    """


@hookspec(firstresult=True)
def spotring_drain_on_notice(
    instance: Instance, notice: InterruptionNotice, job: JobShape
) -> bool | None:
    """Whether a host that announced its interruption leaves the job now.

    Called on the launcher's thread that read the notice from the worker
    (``spotring-output``), synchronously, the moment a verified notice arrives: the
    answer takes effect before the call returns, so a draining host leaves discovery
    before Horovod's next poll. That is the one decision not made on the controller's
    thread: keep it quick and call no cloud (the controller tells the provider, and
    ``spotring_host_noticed`` the plugins, on its thread right after). Not called when
    no other host could carry the ring on (the host stays). Draining takes the host
    out of discovery: the ring re-forms at its next commit without it, with nothing
    rolled back. spotring's own answer: yes, except for a rebalance recommendation
    (elevated risk, no deadline) without ``--drain-on-rebalance``. An implementation
    that raises stops the job with its message (the host does not drain). Stops at
    the first non-None result.

    :param instance: the instance as last listed.
    :param notice: what the host heard: ``kind`` (``preempt``, ``terminate``,
        ``rebalance``) and ``deadline`` (epoch seconds, or None).
    :param job: the job's elastic limits and steering options.
    :return: True to drain, False to keep training on it, None to leave it to others.
    """


# ------------------------------------------------------------ capacity decisions


@hookspec(firstresult=True)
def spotring_order_groups(groups: Sequence[GroupStatus], job: JobShape) -> Sequence[str] | None:
    """The order in which a job of several groups asks its groups for hosts.

    Called on the controller thread after every successful refresh of a job that spans
    several groups (``--group`` given more than once). The job's size goes to the
    groups in this order; a short group's shortfall is asked of the next. spotring's
    own answer: the user's order, with a demoted group (preempted 3 times within an
    hour) moved after the others but before the last one for an hour. Stops at the
    first non-None result.

    :param groups: each group's status (``name``, ``lifecycle``, ``position`` in the
        user's order, ``asked``, ``live``, ``ready``, ``short``, ``shortage``,
        ``backoff_left_s``, ``below_target_s``, ``preemptions_last_hour``,
        ``demoted_left_s``), in the user's order.
    :param job: the job's elastic limits and steering options.
    :return: group names, most preferred first (a group left out is appended in the
        user's order), or None to leave the answer to others.
    """


@hookspec(firstresult=True)
def spotring_fall_back(
    group: GroupStatus, short: GroupStatus, hosts: int, job: JobShape
) -> bool | None:
    """Whether ``group`` may be asked for the hosts a short group cannot supply.

    Called on the controller thread after every successful refresh, for each group met
    after a short one while hosts are still wanted. A group refused keeps what it holds
    and the shortfall goes on to the next group. spotring's own answer: yes. Stops at
    the first non-None result.

    :param group: the group that would be asked.
    :param short: the first short group before it (``shortage`` says why).
    :param hosts: the hosts still wanted when ``group``'s turn comes.
    :param job: the job's elastic limits and steering options.
    :return: True to ask it, False to skip it, None to leave the answer to others.
    """


@hookspec(firstresult=True)
def spotring_fall_back_hosts(
    group: GroupStatus, short: GroupStatus, hosts: int, total: int, job: JobShape
) -> int | None:
    """How many of the ``hosts`` a short group cannot supply ``group`` may hold.

    Called on the controller thread right after ``spotring_fall_back`` allowed ``group``
    (a refused group keeps what it holds), with the same arguments. ``group`` is asked
    for no more; the ready hosts it holds beyond are handed back as fallback hosts are
    (one at a time, after ``--return-after``, each asked ``spotring_return_to_spot``,
    leaving the ring at a commit), though the job is left short. spotring's own answer:
    all of them; with ``--deadline``, only the hosts whose slots let the job finish in
    time (while it is ahead, none bought: docs/cost.md). Stops at the first non-None
    result.

    :param hosts: the hosts still wanted when ``group``'s turn comes.
    :param total: the hosts the job wants in all (``hosts`` is what the groups before
        ``group`` do not supply).
    :return: a number of hosts (clamped to 0..``hosts``), or None to leave the answer
        to others.
    """


@hookspec(firstresult=True)
def spotring_return_to_spot(instance: Instance, group: GroupStatus, job: JobShape) -> bool | None:
    """Whether a fallback host is handed back now.

    Called on the controller thread when the job holds its size without ``instance``
    (a preferred group has capacity again), the host has been in its group for
    ``--return-after`` seconds and no other host is being handed back. A host handed
    back leaves discovery at once (the ring re-forms without it at its next commit,
    with nothing rolled back), then leaves its group (``remove_instance``). spotring's
    own answer: yes. Asked again at the next refresh after a no. Stops at the first
    non-None result.

    :param instance: the host, as last listed (``group``, ``lifecycle``).
    :param group: the status of the group it would leave.
    :param job: the job's elastic limits and steering options.
    :return: True to hand it back, False to keep it, None to leave the answer to others.
    """


# ---------------------------------------------------------------------- events


@event
def spotring_inventory_changed(
    added: Sequence[Instance], removed: Sequence[Instance], ready: Sequence[Instance]
) -> None:
    """The set of READY instances changed.

    Called on the controller thread (as every event of this section) after a refresh,
    a failure or a readmission that changed the hosts Horovod may use; keep it quick.
    Return values are ignored.

    :param added: instances that became READY.
    :param removed: instances that stopped being READY (gone, draining, failed).
    :param ready: every READY instance after the change.
    """


@event
def spotring_refreshed(
    inventory: Inventory | None,
    seconds: float,
    calls: int | None,
    error: str | None,
    target: int | None,
) -> None:
    """The controller listed the group once (successfully or not).

    Called on the controller thread after every refresh. Return values are ignored.

    :param inventory: the inventory now in use (the last good one after a failure;
        None before the first success).
    :param seconds: how long the listing took.
    :param calls: cloud API requests it made, where the provider counts them
        (``last_refresh_calls``), else None.
    :param error: the failure's message, or None when the listing succeeded.
    :param target: the group size spotring asks for (None before it asked).
    """


@event
def spotring_host_noticed(instance: Instance, notice: InterruptionNotice, draining: bool) -> None:
    """A host announced that the cloud will take it (spot reclaim, scale-in, rebalance).

    Called on the controller thread, after the host left discovery if ``draining``.
    Return values are ignored.

    :param instance: the instance as last listed.
    :param notice: the notice (kind, deadline).
    :param draining: whether the host is leaving the job now.
    """


@event
def spotring_host_failed(instance: Instance, reason: str) -> None:
    """A host was taken out of the job because a worker on it failed or it was preempted.

    Called on the controller thread right after the launcher reported the failure (the
    host already left discovery), before the provider is asked to replace the
    instance. Return values are ignored.

    :param instance: the instance as last listed.
    :param reason: a short human explanation, e.g. ``"worker exited with -9"``.
    """


@event
def spotring_capacity_shortage(group: str, shortage: CapacityShortage) -> None:
    """A group of the job is short: its cloud reported a launch failure while it was
    below the size asked of it, or it stayed below that size for ``--fallback-after``
    seconds (``shortage.code`` is then ``BelowTarget``).

    Called on the controller thread. The group is backed off (not asked for more until
    the backoff expires) and its shortfall is asked of the next group. Return values
    are ignored.

    :param group: the group's name.
    :param shortage: ``cause`` (capacity, quota, price, other), ``code``, ``message``.
    """


@event
def spotring_fell_back(from_group: str, to_group: str, hosts: int) -> None:
    """The hosts a short group cannot supply are asked of a later group (again, when
    that number changed).

    Called on the controller thread. Return values are ignored.

    :param from_group: the short group.
    :param to_group: the group asked instead.
    :param hosts: how many hosts of ``from_group``'s share it is asked for.
    """


@event
def spotring_returned(instance: Instance, group: str, seconds: float) -> None:
    """A fallback host left the ring and was handed back: its group was shrunk by one.

    Called on the controller thread after ``remove_instance`` (or, for a group that
    cannot remove one member, a lower target size). Return values are ignored.

    :param instance: the host, as last listed.
    :param group: the group it left.
    :param seconds: how long it had been in that group (at least ``--return-after``).
    """


@event
def spotring_deadline_decided(
    mode: str,
    reason: str,
    done: int,
    total: int,
    projected_finish: float | None,
    slack_s: float | None,
    deadline: float,
) -> None:
    """The deadline policy (``spotring run --deadline``) changed its mode.

    Called on the controller thread, as a decision hook asks the policy. Return values
    are ignored.

    :param mode: ``spot`` (ahead: wait for spot), ``catch-up`` (behind: a short spot
        group falls back to on-demand, whose hosts stay until the job is ahead),
        ``safety-net`` (on-demand for the rest) or ``done``.
    :param reason: why, in a few words.
    :param done: steps the rings committed so far; ``total``: ``--total-steps``
        (with ``--total-epochs``: the epochs committed so far, and that total).
    :param projected_finish: epoch seconds the rest is done at the current ring's
        size; None when no ring makes progress.
    :param slack_s: seconds the job can still make no progress and finish on a full
        ring; None before the first commit.
    :param deadline: epoch seconds.
    """


@event
def spotring_group_demoted(group: str, until: float) -> None:
    """A group was preempted 3 times within an hour: it is asked after the other
    groups (before the last) until ``until``.

    Called on the controller thread. Return values are ignored.

    :param group: the group's name.
    :param until: epoch seconds at which the demotion ends.
    """


@event
def spotring_price_changed(
    group: str, lifecycle: Lifecycle | None, price: HourlyPrice | None
) -> None:
    """A group's price for one member-hour was first read, or changed (its cloud's
    price API, or ``--price``): what the job's cost counts from now on.

    Called on the controller thread after a refresh, at most once per group and price
    refresh. Return values are ignored.

    :param group: the group's name.
    :param lifecycle: what the group launches (spot or on-demand), where it says.
    :param price: the price (``usd``, ``source``, ``read_at``), or None when it is
        unknown (the controller warned once).
    """


# ------------------------------------------------------------------------- the job


@event(historic=True)
def spotring_job_started(provider: Provider, job: JobShape, groups: Sequence[Provider]) -> None:
    """A job starts on ``groups``, ``provider``'s the preferred one.

    Called once per run (``spotring run``), on the thread that runs the job, after the
    run's own plugins (the events file, the metrics) are registered and before the
    controller first lists the groups. Historic: a plugin registered later in the run
    hears it at its registration, on the registering thread. Return values are ignored.

    :param provider: the preferred group's provider (``provider.name``,
        ``provider.describe()``): the job's provider.
    :param job: the job's elastic limits and steering options.
    :param groups: every group of the job, one provider each, most preferred first
        (``group_name()``, ``describe()``); one for a job of one group. An
        implementation that does not name it is called as before.
    """


@event
def spotring_job_finished(
    ok: bool, exit_code: int, seconds: float, world_sizes: Sequence[int]
) -> None:
    """The job ended, successfully or not (Ctrl-C and a failed start included).

    Called once per run, on the thread that ran the job, after the controller, the
    workers and the provider's clean-up have stopped; the last hook of a run. Return
    values are ignored.

    :param ok: whether the job succeeded.
    :param exit_code: the exit status ``spotring run`` ends with (0, 1, 2, 130).
    :param seconds: how long the run took.
    :param world_sizes: the size of every ring Horovod formed, in order (empty when
        none formed); ``len(world_sizes) - 1`` resets.
    """


# ------------------------------------------------------------------------ the ring


@event
def spotring_ring_formed(size: int, hosts: Sequence[str]) -> None:
    """Horovod planned a new ring: the first, and one after every reset.

    Called on Horovod's thread that plans the ring, inside the rendezvous server's
    ``init`` while Horovod holds its lock, before the workers hear their ranks: keep
    it quick. Return values are ignored.

    :param size: the ring's workers (its world size).
    :param hosts: the addresses of its hosts, sorted.
    """


@event
def spotring_ring_progress(status: RingStatus) -> None:
    """The current ring's progress: once as it forms, then every 10 s while it stands.

    Called on the progress tracker's thread (``spotring-progress``). Return values are
    ignored.

    :param status: ``ring`` (its generation: 1, then +1 per reset), ``size``,
        ``steps`` (the most commits a member made since it formed), ``idle_s`` (seconds
        since its last commit) and ``slowest`` (``host[local_rank]`` of the member whose
        last commit is oldest).
    """


@event
def spotring_ring_idle(seconds: float) -> None:
    """How long the ring has gone without a commit, told every tick (about twice a
    second).

    Called on the progress tracker's thread (``spotring-progress``); keep it quick.
    Return values are ignored.

    :param seconds: seconds since the ring's last commit (or its formation, if later);
        0 while no ring stands.
    """


@event
def spotring_ring_stalled(stall: Stall) -> None:
    """The ring's longest time without any commit around one reset, once the new ring
    has committed (a second after its first commit, for late reports).

    Called on the progress tracker's thread (``spotring-progress``), once per reset.
    Return values are ignored.

    :param stall: ``ring`` (the generation whose first commit ended it), ``start`` and
        ``end`` (epoch seconds) and ``seconds``.
    """


@event
def spotring_ring_lost(
    size: int, why: str, checkpoint: dict[str, Any] | None, lost: dict[str, Any]
) -> None:
    """Every worker of the ring was lost, and a new ring starts from durable storage.

    Only with ``--checkpoint``. Called on the Horovod thread that recorded the ring's
    last worker (a reclaim: killed or lost workers), or on the driver's thread that
    forms the next ring (every host of the ring left after its notice), before the
    new ring's workers start; its rank 0 loads the newest complete checkpoint. Return
    values are ignored.

    :param size: workers the lost ring had.
    :param why: what ended it, in a few words.
    :param checkpoint: the newest complete checkpoint the new ring resumes from:
        ``commits`` (the job's commit count it holds), ``age_seconds`` (since that
        commit) and ``name``; None when there is none (the script starts over) or the
        store could not be read.
    :param lost: what the resume loses: ``commits`` (the job's commits made after the
        checkpoint's, as the workers reported them; those of a killed worker's last
        half second may be missing) and ``seconds`` (from the checkpoint's commit to
        the last commit reported; None when no commit was).
    """


@event
def spotring_ring_hung(hang: Hang) -> None:
    """A ring made no progress for ``--hang-timeout``: the member that holds it up is
    failed.

    Called on the progress tracker's thread (``spotring-progress``), once per member
    failed, just before its worker is failed (its host then takes the path of a failed
    host: ``spotring_host_failed`` follows on the controller's thread). Return values
    are ignored.

    :param hang: ``ring``, ``host`` and ``local_rank`` of the member failed,
        ``idle_s`` (the ring's time without progress), ``member_idle_s`` (the member's),
        ``why`` (what set it apart from its peers) and ``reason``.
    """
