"""The provider contract: what spotring asks of a cloud instance group.

A provider plugin is a subclass of :class:`Provider` registered through the
``spotring_register_providers`` hook. spotring makes one provider object for the group
the user names and calls it from a single controller thread, never from Horovod's
driver thread.

Invariants every provider keeps (the conformance kit in
``spotring.providers.conformance`` checks them):

* ``list_instances`` returns every member of the group, each exactly once, with an id
  that is unique and stable for the member's life. A member the cloud still lists but
  that can no longer run work is reported with a non-READY state, never dropped
  silently while it still holds a Horovod slot.
* Any failure to learn the group's membership raises :class:`ProviderError`. A provider
  never returns an empty list because a call failed: an empty list means the group
  really is empty.
* ``list_instances`` only reads: it never changes the group, whatever it finds
  (``spotring discover`` calls nothing else). A member the group will not replace by
  itself is reported with :attr:`Instance.failure`; acting on it is the controller's
  decision.
* ``set_target_size`` and ``replace_instance`` are idempotent: calling them twice with
  the same argument has the effect of calling them once.
* Providers never import Horovod.
"""

from __future__ import annotations

import abc
import argparse
import enum
import ipaddress
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar


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


def hosts_for_slots(num_proc: int, slots_per_host: int) -> int:
    """Hosts needed to run ``num_proc`` workers at ``slots_per_host`` each (at least 1)."""
    return max(1, math.ceil(num_proc / max(1, slots_per_host)))


class ProviderError(Exception):
    """A provider could not do what was asked. Raised for every cloud API failure."""

    retryable: bool = True
    """Whether trying again later may succeed (throttling, 5xx, network)."""


class ConfigurationError(ProviderError):
    """The request can never succeed as configured: missing group, bad credentials,
    missing permissions. The message names what the user must fix."""

    retryable = False


class Provider(abc.ABC):
    """A group of instances spotring can list and steer.

    Subclasses set :attr:`name`, implement the abstract methods, and declare optional
    capabilities as class attributes. They are constructed by :meth:`from_options` with
    the parsed command line, so ``spotring run --provider NAME --help`` can list the
    options a provider added in :meth:`add_arguments`.
    """

    name: ClassVar[str]
    """Short name users pass to ``--provider``; the registry's key."""
    description: ClassVar[str] = ""
    """One line shown by ``spotring providers``."""
    supports_interruption_notices: ClassVar[bool] = False
    """True when :attr:`Instance.notice` is filled in by :meth:`list_instances`."""
    can_resize: bool = True
    """False when :meth:`set_target_size` cannot work (e.g. the ``script`` provider
    without a resize command): spotring then never steers the group's size."""
    can_replace: bool = True
    """False when :meth:`replace_instance` cannot work: failed hosts are only left out."""
    runs_workers_locally: ClassVar[bool] = False
    """True when the group's hosts are simulated on this machine and workers run as
    local processes (the embedded ``local`` provider, and test doubles of clouds)."""

    @classmethod
    def add_arguments(cls, group: argparse._ArgumentGroup) -> None:
        """Add this provider's command-line options to ``group``. Optional."""

    @classmethod
    @abc.abstractmethod
    def from_options(cls, options: argparse.Namespace) -> Provider:
        """Make the provider from parsed command-line options.

        Raises :class:`ConfigurationError` for options that cannot work.
        """

    @abc.abstractmethod
    def list_instances(self) -> Sequence[Instance]:
        """Every member of the group with its state.

        Raises :class:`ProviderError` on any failure; never returns an empty list
        because a call failed.
        """

    @abc.abstractmethod
    def set_target_size(self, size: int) -> None:
        """Ask the group to hold ``size`` members. Idempotent.

        The provider clamps nothing silently: a size outside what the group allows
        raises :class:`ConfigurationError` naming the limit.
        """

    @abc.abstractmethod
    def replace_instance(self, instance_id: str) -> None:
        """Take ``instance_id`` out of service and have the group launch a replacement.

        Idempotent: replacing a member already being replaced, or already gone, is not
        an error.
        """

    def size_limits(self) -> tuple[int, int] | None:
        """The group's own (min, max) size, if it has one. Optional."""
        return None

    def describe(self) -> str:
        """A short human description of the group, for progress lines."""
        return self.name

    def close(self) -> None:
        """Release resources (clients, simulated hosts). Called once at the end."""

    def notice_watcher(self, instance: Instance) -> Mapping[str, Any] | None:
        """The interruption-notice watcher the supervisor on ``instance`` runs, or None.

        ``{"watcher": NAME, **options}``: a built-in watcher of
        ``spotring.worker_image.notices`` (``aws``, ``gcp``, ``azure``) or
        ``"package.module:Class"`` of the plugin's own, importable on the hosts, made
        with the options as keyword arguments. Its notices take the host out of the
        ring at a commit boundary, with nothing rolled back.
        """
        return None

    def keep_size(self) -> None:
        """Hold the group at the size spotring asked for, where the cloud lowers it by
        itself when a member is deleted or evicted (an Azure scale set does; Auto Scaling
        and managed instance groups keep their size).

        Called by the controller on its thread after each successful refresh while it
        steers a job, never by a listing or ``spotring discover``. The size is the one
        :meth:`set_target_size` asked for, or the one a :meth:`replace_instance` or
        :meth:`host_noticed` kept. The default does nothing.
        """

    def host_noticed(self, instance: Instance, notice: InterruptionNotice) -> None:
        """``instance`` announced it will be taken and is leaving the job.

        Called on the controller thread. Providers start its replacement here where the
        cloud allows it without taking the host first; the default does nothing.
        """

    def job_finished(self, options: argparse.Namespace) -> None:
        """Called once when the training job ends, before :meth:`close`.

        Providers use it for clean-up a user asked for, e.g. scaling the group down.
        """
