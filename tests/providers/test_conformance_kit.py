"""The conformance kit itself: it must fail providers that break the contract.

The kit runs (in a pytest of its own) against an in-memory group that keeps the
contract, and against copies of it with one defect each.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

GROUPS = '''
import pytest

from spotring.providers.base import Instance, InstanceState, Provider, ProviderError
from spotring.providers.conformance import ProviderContract


class Group(Provider):
    """A group that keeps the contract: a desired size, replacements, typed errors."""

    name = "memory"

    def __init__(self, size=3, failing=False):
        self.failing = failing
        self.members = {}
        self.next = 0
        self.desired = size
        self._maintain()

    @classmethod
    def from_options(cls, options, core):
        return cls()

    def _launch(self):
        self.members[f"m-{self.next}"] = InstanceState.READY
        self.next += 1

    def _maintain(self):
        live = [i for i, s in self.members.items() if s is InstanceState.READY]
        for _ in range(self.desired - len(live)):
            self._launch()
        for extra in live[self.desired:]:
            del self.members[extra]

    def list_instances(self):
        if self.failing:
            raise ProviderError("down")
        self._maintain()
        return [Instance(i, f"10.0.0.{n}", s) for n, (i, s) in enumerate(self.members.items())]

    def set_target_size(self, size):
        if self.failing:
            raise ProviderError("down")
        self.desired = size

    def replace_instance(self, instance_id):
        if self.failing:
            raise ProviderError("down")
        self.members.pop(instance_id, None)


class NoopResize(Group):
    def set_target_size(self, size):
        pass


class DoubleReplace(Group):
    def replace_instance(self, instance_id):
        super().replace_instance(instance_id)
        self.desired += 1  # "launch a replacement" on every call, even a repeated one


class SwallowsErrors(Group):
    def set_target_size(self, size):
        if not self.failing:
            super().set_target_size(size)


class Watched(Group):
    def notice_watcher(self, instance):
        return {"watcher": "aws", "endpoint": f"http://{instance.address}:9", "interval": 1.0}


class BadWatcher(Group):
    def notice_watcher(self, instance):
        return {"watcher": "no such watcher", "deadline": object()}


def contract(group):
    class Contract(ProviderContract):
        settle_attempts = 3

        def settle(self, provider):
            pass

        @pytest.fixture
        def provider(self):
            return group()

        @pytest.fixture
        def failing_provider(self):
            return group(failing=True)

    return Contract


TestGroup = contract(Group)
TestNoopResize = contract(NoopResize)
TestDoubleReplace = contract(DoubleReplace)
TestSwallowsErrors = contract(SwallowsErrors)
TestWatched = contract(Watched)
TestBadWatcher = contract(BadWatcher)
'''


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], str]:
    folder = tmp_path_factory.mktemp("kit")
    (folder / "test_groups.py").write_text(GROUPS)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", str(folder)],
        capture_output=True,
        text=True,
        cwd=folder,
        timeout=120,
    )
    found = re.findall(r"::(\w+)::(\w+) (PASSED|FAILED|SKIPPED)", result.stdout)
    assert found, result.stdout[-3000:]
    return {(cls, test): status for cls, test, status in found}


def test_a_provider_that_keeps_the_contract_passes(outcomes: dict) -> None:
    mine = {test: status for (cls, test), status in outcomes.items() if cls == "TestGroup"}
    assert mine and all(status in ("PASSED", "SKIPPED") for status in mine.values()), mine


@pytest.mark.parametrize(
    ("defect", "caught_by"),
    [
        ("TestNoopResize", "test_set_target_size_resizes_the_group_and_is_idempotent"),
        ("TestDoubleReplace", "test_replace_instance_is_idempotent"),
        ("TestSwallowsErrors", "test_failed_steering_raises_provider_error"),
        ("TestBadWatcher", "test_notice_watchers_are_well_formed"),
    ],
)
def test_each_defect_fails_the_kit(outcomes: dict, defect: str, caught_by: str) -> None:
    assert outcomes[(defect, caught_by)] == "FAILED"


def test_an_undeclared_capability_skips_rather_than_passes(outcomes: dict) -> None:
    assert outcomes[("TestGroup", "test_notice_watchers_are_well_formed")] == "SKIPPED"
    assert outcomes[("TestGroup", "test_size_limits_bound_the_group")] == "SKIPPED"


def test_the_kit_is_installed_as_a_pytest_plugin(repo: Path) -> None:
    assert (
        'spotring_conformance = "spotring.providers.conformance"'
        in (repo / "pyproject.toml").read_text()
    )


def test_a_notice_watcher_is_checked_when_the_provider_gives_one(outcomes: dict) -> None:
    assert outcomes[("TestWatched", "test_notice_watchers_are_well_formed")] == "PASSED"
