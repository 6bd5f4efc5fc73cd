"""The ``script`` provider: the group is whatever your commands say it is.

For instances spotring has no plugin for (an on-premises pool, a Slurm allocation,
another cloud), and for every horovodrun discovery script already written::

    spotring run --provider script --list-command ./discover.sh -np 4 -- python train.py

``--list-command`` prints one member per line. Two formats, mixed freely:

* horovodrun's: ``HOST`` or ``HOST:SLOTS``: a READY member whose id is its address;
* spotring's, version 1: ``ID ADDRESS STATE [SLOTS]``, STATE one of ``pending``,
  ``ready``, ``draining``, ``terminating``, ``gone``; ID must not start with ``-``
  (``--replace-command`` gets it as its argument, not as an option).

Blank lines and lines starting with ``#`` are ignored (``# spotring-group v1`` is a good
first line). ``--resize-command CMD`` runs as ``CMD SIZE`` and ``--replace-command CMD``
as ``CMD ID``; without them spotring never resizes the group or replaces a member.
Every command runs through ``/bin/sh -c`` with a timeout; a failure, a timeout or a
malformed line (named by its number) raises ProviderError, so the last good inventory
stays in use.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import signal
import subprocess
from collections.abc import Sequence

from spotring.core.hooks import hookimpl
from spotring.providers.base import (
    ConfigurationError,
    CoreOptions,
    Instance,
    InstanceState,
    Provider,
    ProviderError,
    is_valid_address,
)
from spotring.providers.options import positive_seconds

FORMAT_VERSION = 1
DEFAULT_TIMEOUT_SECONDS = 30.0
_STATES = {state.value: state for state in InstanceState}


def parse_members(text: str, default_slots: int | None = None) -> list[Instance]:
    """The members a list command printed; ``ProviderError`` naming a bad line."""
    members: list[Instance] = []
    seen: set[str] = set()
    for number, line in enumerate(text.splitlines(), start=1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        try:
            member = _parse_line(words, default_slots)
        except ValueError as error:
            raise ProviderError(f"list command output, line {number}: {error}: {line!r}") from None
        if member.id in seen:
            raise ProviderError(f"list command output, line {number}: id {member.id!r} repeated")
        seen.add(member.id)
        members.append(member)
    return members


def _parse_line(words: list[str], default_slots: int | None) -> Instance:
    if len(words) == 1:  # horovodrun: HOST or HOST:SLOTS
        host, colon, slots_text = words[0].rpartition(":")
        if not colon:
            host, slots_text = words[0], ""
        slots = _slots(slots_text) if colon else (default_slots or 1)
        _check_address(host)
        return Instance(id=host, address=host, state=InstanceState.READY, slots=slots)
    if len(words) in (3, 4):  # spotring v1: ID ADDRESS STATE [SLOTS]
        instance_id, address, state_text = words[:3]
        if instance_id.startswith("-"):  # --replace-command would take it for an option
            raise ValueError(f"id {instance_id!r} starts with '-'")
        state = _STATES.get(state_text.lower())
        if state is None:
            raise ValueError(f"state {state_text!r} is not one of {', '.join(_STATES)}")
        if address != "-":
            _check_address(address)
        slots = _slots(words[3]) if len(words) == 4 else (default_slots or 1)
        return Instance(
            id=instance_id,
            address="" if address == "-" else address,
            state=state,
            slots=slots,
            cloud_state=state_text,
        )
    raise ValueError("expected 'HOST[:SLOTS]' or 'ID ADDRESS STATE [SLOTS]'")


def _slots(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"slots {text!r} is not a positive whole number")
    return int(text)


def _check_address(address: str) -> None:
    if not is_valid_address(address):
        raise ValueError(f"{address!r} is not a host name or IP address")


class ScriptProvider(Provider):
    """A group listed, and optionally steered, by the user's own commands."""

    name = "script"
    description = "a group your commands list and steer (--list-command CMD; horovodrun scripts)"

    def __init__(
        self,
        list_command: str,
        *,
        resize_command: str | None = None,
        replace_command: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        slots_per_host: int | None = None,
    ) -> None:
        if not list_command or not list_command.strip():
            raise ConfigurationError("--list-command is required for --provider script")
        if not timeout > 0:  # NaN too
            raise ConfigurationError("--command-timeout must be positive")
        self.list_command = list_command
        self.resize_command = resize_command
        self.replace_command = replace_command
        self.timeout = timeout
        self.slots_per_host = slots_per_host
        self.can_resize = resize_command is not None
        self.can_replace = replace_command is not None

    @classmethod
    def add_arguments(cls, group: argparse._ArgumentGroup) -> None:
        group.add_argument(
            "--list-command",
            metavar="CMD",
            help="prints the group, a member per line: HOST[:SLOTS] (horovodrun's format) "
            "or ID ADDRESS STATE [SLOTS] (required)",
        )
        group.add_argument(
            "--resize-command", metavar="CMD", help="run as 'CMD SIZE' to resize the group"
        )
        group.add_argument(
            "--replace-command",
            metavar="CMD",
            help="run as 'CMD ID' to have a failed member replaced",
        )
        group.add_argument(
            "--command-timeout",
            type=positive_seconds,
            default=DEFAULT_TIMEOUT_SECONDS,
            metavar="SECONDS",
            help="how long a command may run (default: %(default)s)",
        )

    @classmethod
    def from_options(cls, options: argparse.Namespace, core: CoreOptions) -> ScriptProvider:
        return cls(
            options.list_command or "",
            resize_command=options.resize_command,
            replace_command=options.replace_command,
            timeout=options.command_timeout,
            slots_per_host=core.slots_per_host,
        )

    def list_instances(self) -> list[Instance]:
        members = parse_members(self._run(self.list_command, ()), self.slots_per_host)
        if self.slots_per_host is not None:  # the flag wins over what the script says
            members = [
                Instance(i.id, i.address, i.state, self.slots_per_host, cloud_state=i.cloud_state)
                for i in members
            ]
        return members

    def set_target_size(self, size: int) -> None:
        if self.resize_command is None:
            raise ConfigurationError("no --resize-command: the script group cannot be resized")
        self._run(self.resize_command, (str(size),))

    def replace_instance(self, instance_id: str) -> None:
        if self.replace_command is None:
            raise ConfigurationError("no --replace-command: members cannot be replaced")
        self._run(self.replace_command, (instance_id,))

    def describe(self) -> str:
        return f"script group ({self.list_command})"

    def _run(self, command: str, args: Sequence[str]) -> str:
        """Run ``command ARGS...`` through the shell; its stdout, or ProviderError."""
        line = " ".join([command, *(shlex.quote(a) for a in args)])
        try:
            process = subprocess.Popen(
                ["/bin/sh", "-c", line],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                stdin=subprocess.DEVNULL,
                text=True,
                errors="replace",
                start_new_session=True,  # a timeout kills the command's children too
            )
        except OSError as error:
            raise ProviderError(f"cannot run {line!r}: {error}") from None
        try:
            stdout, stderr = process.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.communicate()
            raise ProviderError(f"{line!r} did not finish within {self.timeout:g}s") from None
        if process.returncode != 0:
            last = (stderr.strip().splitlines() or ["no message"])[-1]
            raise ProviderError(f"{line!r} exited with {process.returncode}: {last[:200]}")
        return stdout


@hookimpl
def spotring_register_providers(registry) -> None:
    """Register :class:`ScriptProvider` as ``script``."""
    registry.add(ScriptProvider)
