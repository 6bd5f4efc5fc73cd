"""A scriptable in-memory provider for controller and discovery tests."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from spotring.providers.base import (
    CoreOptions,
    Instance,
    InstanceState,
    InterruptionNotice,
    Provider,
    ProviderError,
)


def instance(name: str, state: InstanceState = InstanceState.READY, slots: int = 1) -> Instance:
    return Instance(id=f"i-{name}", address=name, state=state, slots=slots)


class ScriptedProvider(Provider):
    """Answers list_instances from ``members``; raises ``error`` while it is set."""

    name = "scripted"

    def __init__(self, members: Sequence[Instance] = ()) -> None:
        self.members = list(members)
        self.error: ProviderError | None = None
        self.list_calls = 0
        self.targets: list[int] = []
        self.replaced: list[str] = []
        self.noticed: list[tuple[str, str]] = []

    @classmethod
    def from_options(cls, options: argparse.Namespace, core: CoreOptions) -> ScriptedProvider:
        return cls()

    def list_instances(self) -> list[Instance]:
        self.list_calls += 1
        if self.error is not None:
            raise self.error
        return list(self.members)

    def set_target_size(self, size: int) -> None:
        self.targets.append(size)

    def replace_instance(self, instance_id: str) -> None:
        self.replaced.append(instance_id)

    def host_noticed(self, instance: Instance, notice: InterruptionNotice) -> None:
        self.noticed.append((instance.id, notice.kind))
