"""A group member as its provider last reported it: state, billing, interruption notice.

Frozen records, so a snapshot can cross threads without a lock. Each provider maps its
cloud's own states onto :class:`InstanceState` with a plain mapping.
"""

from __future__ import annotations

import enum
import ipaddress
import re
from collections.abc import Mapping
from dataclasses import dataclass, field


class InstanceState(enum.Enum):
    """Lifecycle of a group member, as spotring sees it.

    Each provider maps its cloud's own states onto these with a plain mapping
    (see ``STATE_MAP`` in the built-in providers).
    """

    PENDING = "pending"
    """Launching or booting: not yet able to run a worker."""
    READY = "ready"
    """Running and healthy: Horovod may place workers on it."""
    DRAINING = "draining"
    """Still running but about to go (spot notice, scale-in, unhealthy): take no new work."""
    TERMINATING = "terminating"
    """Being shut down by the cloud."""
    GONE = "gone"
    """Terminated, detached or otherwise no longer part of the group."""


class Lifecycle(enum.Enum):
    """How an instance is billed, which tells how likely it is to be taken away."""

    SPOT = "spot"
    ON_DEMAND = "on-demand"


@dataclass(frozen=True)
class InterruptionNotice:
    """The cloud's warning that an instance will be taken away."""

    kind: str
    """What the cloud announced, e.g. ``"terminate"``, ``"rebalance"``, ``"preempt"``."""
    deadline: float | None = None
    """Wall-clock time (epoch seconds) by which the instance will be gone, if known."""


@dataclass(frozen=True)
class Instance:
    """One member of an instance group, as last reported by its provider."""

    id: str
    """The cloud's id for the member; unique and stable for its life."""
    address: str
    """Host name or IP address Horovod uses to reach the member. May be empty while PENDING."""
    state: InstanceState
    slots: int = 1
    """Worker processes the member runs (typically its GPU count)."""
    lifecycle: Lifecycle = Lifecycle.ON_DEMAND
    zone: str = ""
    instance_type: str = ""
    launch_time: float | None = None
    """Epoch seconds at which the cloud launched the member, if known."""
    notice: InterruptionNotice | None = None
    cloud_state: str = ""
    """The cloud's own state string(s), kept for logs and debugging."""
    labels: Mapping[str, str] = field(default_factory=dict)
    group: str = ""
    """The name of the group the member belongs to, in a job that spans several
    (:meth:`spotring.providers.base.Provider.group_name`); empty from a provider that
    does not set it."""
    failure: str = ""
    """Why the cloud says this member failed for good, or empty: it will not run again
    by itself and the group does not replace it (a spot VM evicted and kept
    deallocated, a VM whose provisioning failed). A listing only reports it; the
    controller takes such a member for a failed host, and the ``spotring_replace_host``
    decision says whether :meth:`Provider.replace_instance` is called."""

    @property
    def is_ready(self) -> bool:
        """True when Horovod may place workers on this member.

        A member whose address is not a host name or IP address never is: the address
        goes to ssh and into Horovod's host list.
        """
        return (
            self.state is InstanceState.READY
            and self.notice is None
            and is_valid_address(self.address)
        )


_HOST_NAME = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?:\.(?!-)[A-Za-z0-9_-]{1,63})*\.?")


def is_valid_address(address: str) -> bool:
    """Whether ``address`` is an IP address or a DNS host name (nothing ssh could read
    as an option, no spaces, no shell or URL syntax)."""
    if not address or len(address) > 253:
        return False
    try:
        ipaddress.ip_address(address)
        return True
    except ValueError:
        return _HOST_NAME.fullmatch(address) is not None
