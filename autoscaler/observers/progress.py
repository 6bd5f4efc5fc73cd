"""Progress lines and the closing summary of ``spotring run``, on stderr.

The reporter is itself a plugin: it hears membership changes, notices, failures and
rings through the same hooks a third-party plugin would implement, on the threads they
come on (the controller's, Horovod's, the progress tracker's): its state is guarded by
a lock.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterable, Sequence
from typing import IO, Any

from spotring.autoscaler.groups import describe_groups
from spotring.core import CapacityShortage, Instance, InterruptionNotice
from spotring.core.hooks import hookimpl
from spotring.core.inventory import Inventory
from spotring.driver.ring_events import Hang
from spotring.providers.base import Provider


class ProgressReporter:
    """Prints one line per membership change and a summary at the end."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self._stream = stream or sys.stderr
        self._started = time.monotonic()
        self.membership_changes = 0
        self.host_failures: list[str] = []
        self.notices: dict[str, str] = {}  # address -> what its notice came to
        self._draining: dict[str, bool] = {}  # address -> no failure since its notice
        self.resumes: list[tuple[dict[str, Any] | None, dict[str, Any]]] = []
        """Each lost ring's checkpoint, and what its resume lost."""
        self.capacity: list[str] = []  # fallbacks and hand-backs, for the summary
        self._groups = "the job's groups"  # as the job_started hook describes them
        self.restarts_workers = False
        """Every worker restarts on a membership change (``--backend torch``'s restart
        mode): a noticed host's leaving then costs the steps since the script's own
        checkpoint, not nothing."""
        self._lock = threading.Lock()  # one write per line
        self._state = threading.Lock()  # the fields above, written from several threads

    def say(self, text: str) -> None:
        """Print one progress line, with the time since the run started."""
        elapsed = time.monotonic() - self._started
        with self._lock:  # one write per line: the controller thread prints too
            self._stream.write(f"spotring [{elapsed:6.1f}s] {text}\n")
            self._stream.flush()

    @hookimpl
    def spotring_job_started(self, groups: Sequence[Provider]) -> None:
        self._groups = describe_groups(groups)

    def started(self, inventory: Inventory) -> None:
        """The job's first inventory, of the groups the job started on."""
        ready = inventory.hosts_and_slots()
        self.say(
            f"{self._groups}: {len(inventory.instances)} members, {len(ready)} ready "
            f"({_hosts(ready)})"
        )

    @hookimpl
    def spotring_inventory_changed(
        self, added: Sequence[Instance], removed: Sequence[Instance], ready: Sequence[Instance]
    ) -> None:
        with self._state:
            self.membership_changes += 1
        changes = [f"+{_named(i)}" for i in added] + [f"-{_named(i)}" for i in removed]
        self.say(
            f"hosts {' '.join(changes)} -> ready: {_hosts({i.address: i.slots for i in ready})}"
        )

    @hookimpl
    def spotring_host_noticed(
        self, instance: Instance, notice: InterruptionNotice, draining: bool
    ) -> None:
        lead = "" if notice.deadline is None else f", {notice.deadline - time.time():.0f} s ahead"
        then = "keeps training"
        if draining:
            then = (
                "every worker restarts without it"
                if self.restarts_workers
                else "leaves the ring at the next commit"
            )
        with self._state:
            self.notices[instance.address] = f"{notice.kind}{lead}" + ("" if draining else ", kept")
            if draining:
                self._draining[instance.address] = True
        self.say(f"host {instance.address} announced {notice.kind}{lead}; {then}")

    @hookimpl
    def spotring_host_failed(self, instance: Instance, reason: str) -> None:
        with self._state:
            self.host_failures.append(instance.address)
            if self._draining.pop(instance.address, None) is not None:
                self.notices[instance.address] += ": died before it could leave (rolled back)"
            # A ring re-formed after a failure restores its last commit: no longer clean.
            self._draining = dict.fromkeys(self._draining, False)
        self.say(f"host {instance.address} failed ({reason}); taken out of the job")

    @hookimpl
    def spotring_ring_formed(self, size: int, hosts: Sequence[str]) -> None:
        """Horovod's driver assigned ranks for a new ring."""
        self.say(f"ring of {size} workers on {', '.join(hosts)}")
        left = []
        with self._state:
            for address in sorted(set(self._draining) - set(hosts)):
                # Left at a commit: the survivors saved it and restore nothing, unless a
                # failure since made the ring roll back anyway.
                clean = self._draining.pop(address) and not self.restarts_workers
                what = "left at a commit, 0 steps rolled back" if clean else "left"
                self.notices[address] += f": {what}"
                left.append((address, what))
        for address, what in left:
            self.say(f"host {address} {what.replace('left', 'left the ring', 1)}")

    @hookimpl
    def spotring_ring_lost(
        self, size: int, why: str, checkpoint: dict[str, Any] | None, lost: dict[str, Any]
    ) -> None:
        """Every worker of the ring was lost; a new ring resumes from ``checkpoint``."""
        with self._state:
            self.resumes.append((checkpoint, lost))
        if checkpoint is None:
            self.say(f"ring lost ({why}); a new ring starts with no checkpoint to resume from")
        else:
            self.say(
                f"ring lost ({why}); a new ring resumes from the checkpoint of commit "
                f"{checkpoint['commits']}, taken {checkpoint['age_seconds']:.1f} s ago"
                f"{_lost(lost)}"
            )

    @hookimpl
    def spotring_ring_hung(self, hang: Hang) -> None:
        """A ring made no progress for ``--hang-timeout``."""
        self.say(
            f"ring made no progress for {hang.idle_s:.1f} s: failing the worker on "
            f"{hang.host}[{hang.local_rank}] ({hang.why})"
        )

    @hookimpl
    def spotring_capacity_shortage(self, group: str, shortage: CapacityShortage) -> None:
        self.say(f"group {group} is short: {shortage.describe()}")

    @hookimpl
    def spotring_fell_back(self, from_group: str, to_group: str, hosts: int) -> None:
        with self._state:
            self.capacity.append(f"{from_group} -> {to_group} ({hosts})")
        self.say(f"asking {to_group} for {hosts} host(s) {from_group} cannot supply")

    @hookimpl
    def spotring_returned(self, instance: Instance, group: str, seconds: float) -> None:
        with self._state:
            self.capacity.append(f"{instance.address} back from {group}")
        self.say(
            f"host {instance.address} handed back after {seconds:.0f} s in {group}: "
            f"{group} shrunk by one"
        )

    @hookimpl
    def spotring_group_demoted(self, group: str, until: float) -> None:
        self.say(
            f"group {group} was preempted often: asked after the others for "
            f"{max(0.0, until - time.time()) / 60:.0f} min"
        )

    def summary(
        self,
        world_sizes: Sequence[int],
        ok: bool,
        seconds: float,
        events: Iterable[tuple[float, str]] = (),
    ) -> None:
        """Print the closing summary of a job."""
        sizes = " -> ".join(str(size) for size in world_sizes) or "none"
        lines = [
            f"job {'finished' if ok else 'FAILED'} in {seconds:.1f}s",
            f"world sizes: {sizes}",
            f"resets: {max(0, len(world_sizes) - 1)}",
            f"membership changes: {self.membership_changes}",
            f"failed hosts: {', '.join(self.host_failures) or 'none'}",
            "interruption notices: "
            + (", ".join(f"{a} ({what})" for a, what in self.notices.items()) or "none"),
        ]
        if self.resumes:
            lines.append("rings lost and resumed from durable checkpoints: " + ", ".join(
                "no checkpoint" if c is None
                else f"commit {c['commits']} ({c['age_seconds']:.1f} s old){_lost(lost)}"
                for c, lost in self.resumes
            ))  # fmt: skip
        if self.capacity:
            lines.append("fallbacks and hand-backs: " + ", ".join(self.capacity))
        lines += [f"at {at:5.1f}s {what}" for at, what in events]
        width = max(len(line) for line in lines)
        print("spotring summary " + "-" * max(0, width - 17), file=self._stream)
        for line in lines:
            print(line, file=self._stream)
        self._stream.flush()


def _named(instance: Instance) -> str:
    """The host's address, and its group when the job spans several (only then is the
    group set)."""
    return f"{instance.address}[{instance.group}]" if instance.group else instance.address


def _hosts(hosts: dict[str, int]) -> str:
    return ", ".join(f"{host}:{slots}" for host, slots in hosts.items()) or "none"


def _lost(lost: dict[str, Any]) -> str:
    """``; N commits (S s) lost``, from what the hook was told; "" when not counted."""
    if lost.get("commits") is None:
        return ""
    seconds = lost.get("seconds")
    return f"; {lost['commits']} commits{'' if seconds is None else f' ({seconds:.1f} s)'} lost"
