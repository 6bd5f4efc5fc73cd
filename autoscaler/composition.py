"""What a job is made of, from typed options, before it runs: its groups, its durable
checkpoints, and the rules that span them.

The CLI parses argv into these options and reports what comes back;
:mod:`spotring.autoscaler.job` runs what is composed here (the controller, the
launcher and Horovod, wired once). Nothing here reads argv, so all of it is testable
without a command line. Each function raises :class:`ConfigurationError` for what the
user must fix, with a one-line message.
"""

from __future__ import annotations

import argparse
import hashlib
from collections.abc import Mapping, Sequence

from spotring.autoscaler.capacity import CapacityOptions
from spotring.autoscaler.deadline import DeadlineOptions, DeadlinePolicy
from spotring.autoscaler.groups import group_names, job_groups
from spotring.core import ConfigurationError, CoreOptions, Lifecycle
from spotring.core.job import JobShape
from spotring.driver.options import DurableOptions
from spotring.providers.base import Provider

__all__ = [
    "check_capacity",
    "check_prices",
    "compose_groups",
    "deadline_policy",
    "durable_options",
    "job_id",
]


def compose_groups(
    provider: type[Provider], options: argparse.Namespace, core: CoreOptions
) -> tuple[Provider, ...]:
    """The job's groups, one provider each (``provider.groups_from_options``: one per
    ``--group``, in the user's order), made from the provider's own ``options`` and
    the typed ``core`` ones, never the whole command line."""
    return job_groups(provider.groups_from_options(options, core))


def check_capacity(capacity: CapacityOptions, groups: Sequence[Provider]) -> None:
    """The capacity options ``groups`` can honour: ``--on-demand-base`` keeps hosts in
    the last of several groups."""
    if capacity.on_demand_base and len(groups) == 1:
        raise ConfigurationError(
            "--on-demand-base needs a job of several groups (the last one on-demand): "
            "give --group more than once"
        )


def check_prices(prices: Mapping[str, float], groups: Sequence[Provider]) -> None:
    """``--price NAME=USD`` names one of ``groups`` or a lifecycle (``spot``,
    ``on-demand``): a misspelt name would silently price nothing."""
    known = set(group_names(groups)) | {lifecycle.value for lifecycle in Lifecycle}
    for name in prices:
        if name not in known:
            raise ConfigurationError(
                f"--price {name}=...: no group or lifecycle of that name "
                f"(one of: {', '.join(sorted(known))})"
            )


def deadline_policy(
    deadline: float | None,
    totals: tuple[int | None, int | None],
    restart_cost: float,
    shape: JobShape,
    groups: Sequence[Provider],
) -> DeadlinePolicy | None:
    """The deadline policy of ``--deadline`` (epoch seconds; None: no deadline mode) and
    ``totals`` (``--total-steps``, ``--total-epochs``: one of them), starting now: it
    steers what falls back to the last group, so a job of one group cannot have it."""
    total_steps, total_epochs = totals
    if deadline is None or (total_steps is None and total_epochs is None):
        return None
    if len(groups) == 1:
        raise ConfigurationError(
            "--deadline needs a job of several groups (spot first, the last on-demand): "
            "give --group more than once"
        )
    options = DeadlineOptions(deadline, total_steps, shape.num_proc, restart_cost, total_epochs)
    try:
        return DeadlinePolicy(options)
    except ValueError as error:  # the deadline passed while the job was composed
        raise ConfigurationError(f"--deadline: {error}") from None


def durable_options(
    uri: str | None, every: float, keep: int, command: Sequence[str]
) -> DurableOptions | None:
    """``--checkpoint URI`` and its settings, None without one; a URI that cannot name
    a store (a bad form, a missing SDK) is refused now, before anything starts."""
    if uri is None:
        return None
    from spotring.autoscaler.durable_job import STORE_TIMEOUT_SECONDS
    from spotring.checkpoint import CheckpointError, open_store

    try:  # opened once: the driver's lock and summaries use this store
        store = open_store(uri, timeout_s=STORE_TIMEOUT_SECONDS)
    except CheckpointError as error:
        raise ConfigurationError(f"--checkpoint: {error}") from None
    return DurableOptions(
        uri=store.uri, every=every, keep=keep, job_id=job_id(command), store=store
    )


def job_id(command: Sequence[str]) -> str:
    """The job's name in its checkpoints: the same training command is the same job."""
    return hashlib.sha256("\0".join(command).encode()).hexdigest()[:16]
