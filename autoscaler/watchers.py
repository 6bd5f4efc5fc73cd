"""Notice watchers: what each host runs to hear that the cloud will take it.

Each member's watcher (:meth:`Provider.notice_watcher`) is asked of its group once, on
the controller's thread, as the member is first listed starting or up: before
discovery can offer the host, since a worker is started only on a host of a
published inventory. Whoever starts a worker (Horovod's thread) reads it from here
without calling a provider.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from spotring.autoscaler.calls import call
from spotring.core import Instance, InstanceState, ProviderError
from spotring.providers.base import Provider

log = logging.getLogger(__name__)

__all__ = ["NoticeWatchers"]


class NoticeWatchers:
    """The notice watchers of a job's members, by instance id."""

    def __init__(self) -> None:
        self._by_id: dict[str, dict[str, Any] | None] = {}  # replaced whole

    def update(
        self, instances: Sequence[Instance], group_of: Callable[[Instance], Provider | None]
    ) -> None:
        """Keep the watchers of the members ``instances`` lists, and ask each new
        starting or up member's group (``group_of``) for its own. A group that cannot
        say yet is asked again at the next listing."""
        watchers: dict[str, dict[str, Any] | None] = {}
        for instance in instances:
            if instance.id in self._by_id:
                watchers[instance.id] = self._by_id[instance.id]
            elif instance.state in (InstanceState.PENDING, InstanceState.READY):
                group = group_of(instance)
                if group is None:
                    continue
                try:
                    watcher = call("the provider's notice watcher", group.notice_watcher, instance)
                except ProviderError as error:
                    if not error.retryable:
                        raise
                    log.warning("no notice watcher for %s yet: %s", instance.id, error)
                    continue
                watchers[instance.id] = dict(watcher) if watcher else None
        self._by_id = watchers

    def get(self, instance_id: str) -> dict[str, Any] | None:
        """A copy of ``instance_id``'s watcher, or None; from any thread."""
        watcher = self._by_id.get(instance_id)
        return dict(watcher) if watcher else None
