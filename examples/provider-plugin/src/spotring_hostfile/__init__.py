"""A spotring provider plugin: the group is the hosts listed in a file.

Each line of the file is ``HOST [SLOTS]``; ``#`` starts a comment. Edit the file while
a job runs and spotring follows: a host added joins the ring, a host removed leaves it.
The file is the whole "cloud API", so this plugin cannot resize the group or replace a
member: it says so with ``can_resize`` and ``can_replace``, and spotring only lists it.
Optional features are class attributes spotring reads (``can_resize``, ``can_replace``,
``needs_credentials``...), and optional methods have defaults in ``Provider``.

Copy this package, rename it, and replace ``_read`` with your own API calls.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from spotring.plugin import (
    ConfigurationError,
    CoreOptions,
    Instance,
    InstanceState,
    Provider,
    ProviderError,
    ProviderRegistry,
    hookimpl,
    is_valid_address,
)


class HostFileProvider(Provider):
    """The hosts listed in a file, all READY."""

    name = "hostfile"
    description = "the hosts listed in a file (--hosts-file PATH), followed while it changes"
    can_resize = False  # the file is edited by people, not by spotring
    can_replace = False

    def __init__(self, path: str, slots_per_host: int | None = None) -> None:
        if not path:
            raise ConfigurationError("--hosts-file is required for --provider hostfile")
        self.path = Path(path)
        self.slots_per_host = slots_per_host

    @classmethod
    def add_arguments(cls, group: argparse._ArgumentGroup) -> None:
        group.add_argument("--hosts-file", metavar="PATH", help="lines of 'HOST [SLOTS]'")

    @classmethod
    def from_options(cls, options: argparse.Namespace, core: CoreOptions) -> HostFileProvider:
        # `options` holds only what add_arguments added; spotring's own options that a
        # provider may use (--slots-per-host, -np, --no-resize) come typed in `core`.
        return cls(options.hosts_file or "", core.slots_per_host)

    def list_instances(self) -> list[Instance]:
        # Any failure raises ProviderError: spotring keeps the last good list then.
        try:
            text = self.path.read_text()
        except OSError as error:
            raise ProviderError(f"cannot read {self.path}: {error.strerror}") from None
        return [self._member(number, line) for number, line in self._lines(text)]

    def set_target_size(self, size: int) -> None:
        raise ConfigurationError("a host file cannot be resized by spotring")

    def replace_instance(self, instance_id: str) -> None:
        raise ConfigurationError("a host file cannot replace its hosts")

    def describe(self) -> str:
        return f"host file {self.path}"

    @staticmethod
    def _lines(text: str) -> list[tuple[int, str]]:
        lines = enumerate((line.split("#")[0].strip() for line in text.splitlines()), 1)
        return [(number, line) for number, line in lines if line]

    def _member(self, number: int, line: str) -> Instance:
        host, *rest = line.split()
        if not is_valid_address(host) or len(rest) > 1 or (rest and not rest[0].isdigit()):
            raise ProviderError(f"{self.path}, line {number}: expected 'HOST [SLOTS]': {line!r}")
        slots = self.slots_per_host or (int(rest[0]) if rest else 1)
        return Instance(id=host, address=host, state=InstanceState.READY, slots=max(1, slots))


@hookimpl
def spotring_register_providers(registry: ProviderRegistry) -> None:
    registry.add(HostFileProvider)
