"""Hook specifications: every way a plugin can extend spotring.

Plugins implement these with ``@spotring.autoscaler.hookimpl``, the same marker as
``spotring.core.hookimpl`` (which the built-in providers use: they stand below the
controller), and are found through the ``spotring.providers`` entry-point group. Only
functions whose names start with ``spotring_`` are taken as hook implementations.

Threading: the decision and event hooks are called on the controller's thread only,
one call at a time, in the order things happened; never on Horovod's threads or the
launcher's. An event hook that raises is logged (once per plugin and hook) and the
other plugins still hear the event; a decision hook that raises stops the job with
its message, since spotring cannot act on a policy it could not learn.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

# The markers live in spotring.core so plugins mark hooks without importing the
# controller; they are re-exported here under their old names.
from spotring.core.hooks import PROJECT as PROJECT
from spotring.core.hooks import hookimpl as hookimpl
from spotring.core.hooks import hookspec

if TYPE_CHECKING:
    from spotring.core import Instance, InterruptionNotice, Inventory, JobShape
    from spotring.providers.base import Provider, ProviderRegistry


# -------------------------------------------------------------------- registration


@hookspec
def spotring_register_providers(registry: ProviderRegistry) -> None:
    """Register provider classes.

    Called on every plugin each time spotring collects its providers (``spotring
    providers``, ``--provider``), and on one plugin at a time when a provider is
    disabled (``SPOTRING_DISABLE_PLUGINS``): register and do nothing else.

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
    may add options that they read back in their own hooks.

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

    Called on the worker launcher's thread the moment the notice arrives (keep it
    quick). Draining takes the host out of discovery: the ring re-forms at its next
    commit without it, with nothing rolled back. spotring's own answer: yes, except for
    a rebalance recommendation (elevated risk, no deadline) without
    ``--drain-on-rebalance``. Stops at the first non-None result.

    :param instance: the instance as last listed.
    :param notice: what the host heard: ``kind`` (``preempt``, ``terminate``,
        ``rebalance``) and ``deadline`` (epoch seconds, or None).
    :param job: the job's elastic limits and steering options.
    :return: True to drain, False to keep training on it, None to leave it to others.
    """


# ---------------------------------------------------------------------- events


@hookspec
def spotring_inventory_changed(
    added: Sequence[Instance], removed: Sequence[Instance], ready: Sequence[Instance]
) -> None:
    """The set of READY instances changed.

    Called on the controller thread after a refresh, a failure or a readmission that
    changed the hosts Horovod may use; keep it quick. Return values are ignored.

    :param added: instances that became READY.
    :param removed: instances that stopped being READY (gone, draining, failed).
    :param ready: every READY instance after the change.
    """


@hookspec
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


@hookspec
def spotring_host_noticed(instance: Instance, notice: InterruptionNotice, draining: bool) -> None:
    """A host announced that the cloud will take it (spot reclaim, scale-in, rebalance).

    Called on the controller thread, after the host left discovery if ``draining``.
    Return values are ignored.

    :param instance: the instance as last listed.
    :param notice: the notice (kind, deadline).
    :param draining: whether the host is leaving the job now.
    """


@hookspec
def spotring_host_failed(instance: Instance, reason: str) -> None:
    """A host was taken out of the job because a worker on it failed or it was preempted.

    Called on the controller thread right after the launcher reported the failure (the
    host already left discovery), before the provider is asked to replace the
    instance. Return values are ignored.

    :param instance: the instance as last listed.
    :param reason: a short human explanation, e.g. ``"worker exited with -9"``.
    """
