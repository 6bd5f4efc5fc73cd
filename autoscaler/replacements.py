"""Replacements: which failed hosts the groups replace, and when.

A failed host (a worker that exited with an error, a member the cloud reports failed)
is replaced when the ``spotring_replace_host`` hook says so, once its grace period is
over: when the whole job fails within it, the training script rather than the hosts
was at fault, and none is replaced. Each replacement goes to the group that lists the
member; one the cloud refuses for now is asked again a refresh interval later. All on
the controller's thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import pluggy

from spotring.autoscaler.calls import call
from spotring.core import Instance, ProviderError
from spotring.core.job import JobShape
from spotring.providers.base import Provider

log = logging.getLogger(__name__)

__all__ = ["Replacements"]


class Replacements:
    """The replacements of one job's failed hosts.

    :param hook: the plugin manager's hook relay (``spotring_replace_host``).
    :param job: the job's limits and steering options.
    :param retry_after: seconds before a replacement the cloud refused is asked again.
    """

    def __init__(self, hook: pluggy.HookRelay, job: JobShape, retry_after: float) -> None:
        self._hook = hook
        self._job = job
        self._retry_after = retry_after
        self._due: dict[str, float] = {}  # instance id -> when due (monotonic)

    def decide(self, instance: Instance, reason: str, grace: float) -> None:
        """``instance`` failed for ``reason``: replace it in ``grace`` seconds if
        ``spotring_replace_host`` says so (the earlier, if it was due already)."""
        replace = call(
            "the spotring_replace_host hook",
            self._hook.spotring_replace_host,
            instance=instance,
            reason=reason,
            job=self._job,
        )
        if not replace:
            log.info("not replacing %s (%s): spotring_replace_host said no", instance.id,
                     reason)  # fmt: skip
            return
        due = time.monotonic() + grace
        self._due[instance.id] = min(due, self._due.get(instance.id, due))

    def replace_due(self, group_of: Callable[[str], Provider | None]) -> list[str]:
        """Replace the hosts that are due, each through ``group_of(id)`` (None: no
        longer listed, so nothing is left to replace). Returns the ids asked for."""
        now = time.monotonic()
        asked = []
        for instance_id, at in list(self._due.items()):
            if at > now:
                continue
            group = group_of(instance_id)
            try:
                if group is not None:
                    call("replacing a host", group.replace_instance, instance_id)
            except ProviderError as error:
                if not error.retryable:
                    raise
                log.warning("could not replace %s, will retry: %s", instance_id, error)
                self._due[instance_id] = now + self._retry_after
                continue
            del self._due[instance_id]
            asked.append(instance_id)
        return asked

    def next_due(self) -> float | None:
        """Seconds until the next replacement is due; None when none is waiting."""
        return max(0.0, min(self._due.values()) - time.monotonic()) if self._due else None

    def cancel(self) -> None:
        """The job ended: replace nothing more."""
        if self._due:
            log.info("not replacing %s: the job ended before their grace period did",
                     ", ".join(self._due))  # fmt: skip
        self._due.clear()
