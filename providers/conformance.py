"""Provider conformance kit: the contract tests every provider must pass.

Shipped with spotring as a pytest plugin (entry point ``pytest11``), so a plugin author
writes::

    from spotring.providers.conformance import ProviderContract

    class TestMyProvider(ProviderContract):
        @pytest.fixture
        def provider(self):
            ...  # a provider whose group has at least two READY members and room to grow

        @pytest.fixture
        def failing_provider(self):
            ...  # the same provider pointed at an API that fails every call

and inherits the tests below. A cloud whose group changes asynchronously can override
:meth:`ProviderContract.settle` (called between listings while a test waits for the
group to reach a size). A capability the provider does not declare makes its test
skip with the reason, never pass silently.
"""

from __future__ import annotations

import json
import re
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence

import pytest

from spotring.providers.base import (
    Instance,
    InstanceState,
    Provider,
    ProviderError,
)

_LIVE = (InstanceState.PENDING, InstanceState.READY, InstanceState.DRAINING)


def live(instances: Sequence[Instance]) -> list[Instance]:
    """Members that count towards the group's size: not terminating, not gone."""
    return [i for i in instances if i.state in _LIVE]


class ProviderContract:
    """Base class of contract tests; override the ``provider`` fixtures."""

    settle_attempts = 30
    """Listings a test makes while it waits for the group to reach a size."""

    @pytest.fixture
    def provider(self) -> Provider:
        """A provider whose group has at least two READY members and room for one more."""
        raise NotImplementedError("override the 'provider' fixture")

    @pytest.fixture
    def failing_provider(self) -> Provider:
        """A provider whose every API call fails."""
        raise NotImplementedError("override the 'failing_provider' fixture")

    def settle(self, provider: Provider) -> None:
        """Between two listings while waiting for a change; override for slow fakes."""
        time.sleep(0.05)

    def wait_for(
        self, provider: Provider, done: Callable[[list[Instance]], bool], what: str
    ) -> list[Instance]:
        """List until ``done(instances)``; fail naming ``what`` if it never is."""
        instances = list(provider.list_instances())
        for _ in range(self.settle_attempts):
            if done(instances):
                return instances
            self.settle(provider)
            instances = list(provider.list_instances())
        assert done(instances), f"{what}; the group lists {_summary(instances)}"
        return instances

    # ----------------------------------------------------------------- listing

    def test_lists_members_with_unique_stable_ids(self, provider: Provider) -> None:
        first = provider.list_instances()
        second = provider.list_instances()
        ids = [instance.id for instance in first]
        assert all(isinstance(instance, Instance) for instance in first)
        assert len(ids) == len(set(ids)), f"duplicate ids: {Counter(ids)}"
        assert {i.id for i in first} == {i.id for i in second}

    def test_states_are_mapped(self, provider: Provider) -> None:
        instances = provider.list_instances()
        assert all(isinstance(i.state, InstanceState) for i in instances)
        ready = [i for i in instances if i.state is InstanceState.READY]
        assert len(ready) >= 2, "the 'provider' fixture must have two READY members"
        assert all(i.is_ready and i.slots >= 1 for i in ready), "READY needs an address"

    # ---------------------------------------------------------------- steering

    def test_set_target_size_resizes_the_group_and_is_idempotent(self, provider: Provider) -> None:
        if not provider.can_resize:
            pytest.skip(f"{type(provider).__name__} cannot resize its group (can_resize)")
        size = len(live(provider.list_instances()))
        provider.set_target_size(size + 1)
        provider.set_target_size(size + 1)  # idempotent: still one more, not two
        grown = f"set_target_size({size + 1}) did not grow the group from {size} members"
        self.wait_for(provider, lambda i: len(live(i)) == size + 1, grown)
        provider.set_target_size(size)
        provider.set_target_size(size)
        shrunk = f"set_target_size({size}) did not shrink the group back to {size} members"
        self.wait_for(provider, lambda i: len(live(i)) == size, shrunk)

    def test_replace_instance_is_idempotent(self, provider: Provider) -> None:
        if not provider.can_replace:
            pytest.skip(f"{type(provider).__name__} cannot replace members (can_replace)")
        before = provider.list_instances()
        size = len(live(before))
        victim = next(i for i in before if i.state is InstanceState.READY)
        provider.replace_instance(victim.id)
        provider.replace_instance(victim.id)  # idempotent: one replacement, not two

        def victim_out(instances: list[Instance]) -> bool:
            listed = {i.id: i for i in instances}
            return victim.id not in listed or listed[victim.id].state is not InstanceState.READY

        after = self.wait_for(provider, victim_out, f"replace_instance({victim.id}) left it READY")
        for _ in range(3):  # a second launch may take a listing or two to show
            self.settle(provider)
            after = list(provider.list_instances())
            newcomers = [i for i in live(after) if i.id not in {b.id for b in before}]
            assert len(newcomers) <= 1, f"two replacements for one member: {_summary(newcomers)}"
            assert len(live(after)) <= size, f"the group grew past {size}: {_summary(after)}"

    # ---------------------------------------------------------------- failures

    def test_failure_raises_provider_error_never_empty(self, failing_provider: Provider) -> None:
        with pytest.raises(ProviderError):
            failing_provider.list_instances()

    def test_failed_steering_raises_provider_error(self, failing_provider: Provider) -> None:
        if not (failing_provider.can_resize or failing_provider.can_replace):
            pytest.skip(f"{type(failing_provider).__name__} does not steer its group")
        if failing_provider.can_resize:
            with pytest.raises(ProviderError):
                failing_provider.set_target_size(3)
        if failing_provider.can_replace:
            with pytest.raises(ProviderError):
                failing_provider.replace_instance("i-0123456789abcdef0")

    # ------------------------------------------------------------ capabilities

    def test_size_limits_bound_the_group(self, provider: Provider) -> None:
        limits = provider.size_limits()
        if limits is None:
            pytest.skip(f"{type(provider).__name__} declares no size limits")
        low, high = limits
        assert isinstance(low, int) and isinstance(high, int) and 0 <= low <= high
        assert low <= len(live(provider.list_instances())) <= high

    def test_notice_watchers_are_well_formed(self, provider: Provider) -> None:
        ready = [i for i in provider.list_instances() if i.state is InstanceState.READY]
        specs = {i.id: provider.notice_watcher(i) for i in ready}
        if all(spec is None for spec in specs.values()):
            pytest.skip(f"{type(provider).__name__} gives its hosts no notice watcher")
        for instance_id, spec in specs.items():
            if spec is None:
                continue
            where = f"notice_watcher({instance_id}) = {spec!r}"
            assert isinstance(spec, Mapping), f"{where}: not a mapping"
            watcher = spec.get("watcher")
            assert isinstance(watcher, str) and (
                watcher in BUILT_IN_WATCHERS or _PLUGIN_WATCHER.fullmatch(watcher)
            ), (
                f"{where}: 'watcher' must be a built-in name (aws, gcp, azure) or "
                "'package.module:Class'"
            )
            assert all(isinstance(key, str) for key in spec), f"{where}: option names not str"
            try:
                json.dumps(dict(spec))
            except (TypeError, ValueError) as error:
                raise AssertionError(f"{where}: not JSON ({error}): it goes to the host") from None


BUILT_IN_WATCHERS = ("aws", "gcp", "azure")
"""The watchers of ``spotring.worker_image.notices`` a provider may name."""
_PLUGIN_WATCHER = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")
"""A plugin's own watcher: ``package.module:Class``."""


def _summary(instances: Sequence[Instance]) -> str:
    return ", ".join(f"{i.id}={i.state.value}" for i in instances) or "no members"
