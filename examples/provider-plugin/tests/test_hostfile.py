"""The plugin passes spotring's conformance kit, like every provider should."""

from __future__ import annotations

from pathlib import Path

import pytest
from spotring_hostfile import HostFileProvider

from spotring.providers.conformance import ProviderContract


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
