"""Provider conformance kit: the contract tests every provider must pass.

Shipped with spotring as a pytest plugin (entry point ``pytest11``), so a plugin author
writes::

    from spotring.providers.conformance import ProviderContract

    class TestMyProvider(ProviderContract):
        @pytest.fixture
        def provider(self):
            ...  # a provider whose group has at least two READY members

        @pytest.fixture
        def failing_provider(self):
            ...  # the same provider pointed at an API that fails every call

and inherits the tests below. A capability the provider does not declare makes its
test skip, never pass silently.
"""

from __future__ import annotations

from collections import Counter

import pytest

from spotring.providers.base import Instance, InstanceState, Provider, ProviderError


class ProviderContract:
    """Base class of contract tests; override the ``provider`` fixtures."""

    @pytest.fixture
    def provider(self) -> Provider:
        """A provider whose group has at least two READY members."""
        raise NotImplementedError("override the 'provider' fixture")

    @pytest.fixture
    def failing_provider(self) -> Provider:
        """A provider whose every API call fails."""
        raise NotImplementedError("override the 'failing_provider' fixture")

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
        assert all(i.address and i.slots >= 1 for i in ready)

    def test_set_target_size_is_idempotent(self, provider: Provider) -> None:
        size = len(provider.list_instances())
        provider.set_target_size(size + 1)
        provider.set_target_size(size + 1)
        after = provider.list_instances()
        assert size + 1 >= len([i for i in after if i.state is not InstanceState.GONE]) >= size

    def test_replace_instance_is_idempotent(self, provider: Provider) -> None:
        victim = next(i for i in provider.list_instances() if i.state is InstanceState.READY)
        provider.replace_instance(victim.id)
        provider.replace_instance(victim.id)
        listed = {i.id: i for i in provider.list_instances()}
        assert victim.id not in listed or listed[victim.id].state is not InstanceState.READY

    def test_failure_raises_provider_error_never_empty(self, failing_provider: Provider) -> None:
        with pytest.raises(ProviderError):
            failing_provider.list_instances()
