"""The rings' events: one typed interface, declared once, for whoever listens.

A ring backend (Horovod's elastic driver today, :mod:`spotring.driver.horovod_driver`)
and the ring-side objects around it (:mod:`spotring.driver.ring_side`) tell one
:class:`RingEvents` what happens to the job's rings; the controller's side implements it
once, feeding the plugins' ``spotring_ring_*`` hooks (``spotring.autoscaler.job``).
Each method says the thread it is called on: the hookspecs promise the same threads.
A listener keeps each call quick; one that raises is logged by the caller and the ring
goes on.

The events' values are declared here too, so that a plugin, the observers and a second
backend depend on this module only.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


@dataclass(frozen=True)
class RingStatus:
    """The current ring's progress."""

    ring: int
    """Its generation: 1 for the first ring, +1 per reset."""
    size: int
    steps: int
    """The most commits any member made since the ring formed."""
    idle_s: float
    """Seconds since the ring's last commit (or its formation, if later)."""
    slowest: str
    """The member (``host[local_rank]``) whose last commit is oldest; "" if none."""
    epochs: float | None = None
    """The job's epochs (epoch + its share of samples processed) at the members' latest
    commit, from their states' elastic samplers; None: no member reported one."""
    samples: int | None = None
    """The job's samples at that commit (epoch x the dataset's length + the samples
    processed in it), from the same sampler; None: no member reported one."""


@dataclass(frozen=True)
class Stall:
    """The ring's longest time without a commit around one reset (epoch seconds)."""

    ring: int
    """The generation of the ring whose first commit ended it."""
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Hang:
    """A ring that made no progress for ``hang_timeout``: the member to fail."""

    ring: int
    host: str
    local_rank: int
    idle_s: float
    """Seconds since the ring's last commit or its planning."""
    member_idle_s: float
    """Seconds since the chosen member's last commit (or the ring's formation)."""
    why: str = "its last commit is the oldest"
    """What sets this member apart from the peers that wait for it."""

    @property
    def reason(self) -> str:
        return f"hung: the ring made no progress for {self.idle_s:.1f} s; {self.why}"


@dataclass(frozen=True)
class RingLoss:
    """A ring lost every member and is started again from durable storage."""

    size: int
    """Members the lost ring had."""
    why: str
    """What ended it, in a few words."""
    checkpoint: dict[str, Any] | None = None
    """The durable checkpoint the next ring starts from (its commit, age, time and
    name); None when there is none (or it could not be read)."""
    lost: dict[str, Any] = field(default_factory=lambda: {"commits": None, "seconds": None})
    """``commits``: the job's commits made since that checkpoint, lost with the ring;
    ``seconds``: from the checkpoint's commit to the ring's last reported one (None:
    unknown)."""


class RingFormation(Protocol):
    """Who hears of each ring a backend plans (the ring side, which tells the rest)."""

    def ring_formed(self, size: int, hosts: Sequence[str]) -> None:
        """The backend planned a ring of ``size`` workers on ``hosts`` (sorted). On the
        backend's thread that plans it (Horovod's, inside the rendezvous server), before
        the workers hear their ranks."""


class RingEvents(RingFormation, Protocol):
    """What happens to the job's rings, as a backend tells it (``ring_formed`` as
    :class:`RingFormation` says)."""

    def ring_progress(self, status: RingStatus) -> None:
        """The current ring's progress: as it forms, then every 10 s while it stands. On
        the progress tracker's thread (``spotring-progress``)."""

    def ring_idle(self, seconds: float) -> None:
        """Seconds since the ring's last commit (0 while no ring stands), about twice a
        second. On the progress tracker's thread."""

    def ring_stalled(self, stall: Stall) -> None:
        """Once per reset, when the new ring has committed: its longest time without a
        commit around the reset. On the progress tracker's thread."""

    def ring_hung(self, hang: Hang) -> None:
        """With a hang timeout: the member failed for holding up a ring that made no
        progress. On the progress tracker's thread, before the member is failed."""

    def ring_lost(self, loss: RingLoss) -> None:
        """A ring lost every member (with durable checkpoints): a new one starts from
        ``loss.checkpoint``. On the backend's thread that recorded the ring's last
        worker, or that saw every host of the ring leave, before the new ring's workers
        start."""


class NoRingEvents:
    """A :class:`RingEvents` that ignores every event (subclass it to hear some)."""

    def ring_formed(self, size: int, hosts: Sequence[str]) -> None:
        pass

    def ring_progress(self, status: RingStatus) -> None:
        pass

    def ring_idle(self, seconds: float) -> None:
        pass

    def ring_stalled(self, stall: Stall) -> None:
        pass

    def ring_hung(self, hang: Hang) -> None:
        pass

    def ring_lost(self, loss: RingLoss) -> None:
        pass
