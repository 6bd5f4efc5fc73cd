"""The plugin passes spotring's conformance kit, like every provider should."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from spotring_hostfile import HostFileProvider

from spotring.plugin import CoreOptions, ProviderContract


class TestHostFileContract(ProviderContract):
    @pytest.fixture
    def provider(self, tmp_path: Path) -> HostFileProvider:
        hosts = tmp_path / "hosts"
        hosts.write_text("# the pool\n10.0.0.1 2\n10.0.0.2\n")
        return HostFileProvider(str(hosts))

    @pytest.fixture
    def failing_provider(self, tmp_path: Path) -> HostFileProvider:
        return HostFileProvider(str(tmp_path / "missing"))


def test_a_malformed_line_is_named(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("10.0.0.1\n10.0.0.2 two\n")
    with pytest.raises(Exception, match="line 2"):
        HostFileProvider(str(hosts)).list_instances()


def test_made_from_its_own_options_and_the_typed_core_ones(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("10.0.0.1 4\n")
    own = argparse.Namespace(hosts_file=str(hosts))  # only what add_arguments added
    made = HostFileProvider.from_options(own, CoreOptions(slots_per_host=2, num_proc=2))
    assert [i.slots for i in made.list_instances()] == [2]  # --slots-per-host wins
    default = HostFileProvider.from_options(own, CoreOptions())
    assert [i.slots for i in default.list_instances()] == [4]
