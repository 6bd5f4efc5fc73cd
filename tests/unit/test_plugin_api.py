"""``spotring.plugin``: one import for plugin authors, the same objects as at home, and
light enough for a module the hosts import."""

from __future__ import annotations

import importlib
import subprocess
import sys

import spotring.plugin as plugin

HOMES = {
    "hookimpl": "spotring.core.hooks",
    "Provider": "spotring.providers.base",
    "ProviderRegistry": "spotring.providers.base",
    "CoreOptions": "spotring.core.options",
    "Instance": "spotring.core.instance",
    "InstanceState": "spotring.core.instance",
    "Lifecycle": "spotring.core.instance",
    "InterruptionNotice": "spotring.core.instance",
    "is_valid_address": "spotring.core.instance",
    "CapacityShortage": "spotring.core.capacity",
    "ShortageCause": "spotring.core.capacity",
    "ProviderError": "spotring.core.errors",
    "ConfigurationError": "spotring.core.errors",
    "JobShape": "spotring.core.job",
    "Inventory": "spotring.core.inventory",
    "GroupStatus": "spotring.autoscaler.capacity",
    "CloudGroupProvider": "spotring.providers.cloud",
    "ProviderContract": "spotring.providers.conformance",
    "RingStatus": "spotring.driver.ring_progress",
    "Stall": "spotring.driver.ring_progress",
    "Hang": "spotring.driver.ring_progress",
}


def test_every_name_is_the_object_at_its_home() -> None:
    assert sorted(plugin.__all__) == sorted(HOMES) == dir(plugin)
    for name, home in HOMES.items():
        assert getattr(plugin, name) is getattr(importlib.import_module(home), name), name


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        plugin.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as error:
        assert "NoSuchThing" in str(error)
    else:
        raise AssertionError("no AttributeError")


def test_importing_it_loads_neither_the_controller_nor_the_ring_nor_pytest() -> None:
    """A notice watcher's module, imported on the hosts, may import it."""
    code = (
        "import sys, spotring.plugin\n"
        "heavy = ('spotring.autoscaler', 'spotring.driver', 'pytest')\n"
        "print(sorted(m for m in sys.modules if m.startswith(heavy)))\n"
        "spotring.plugin.GroupStatus\n"
        "print('spotring.autoscaler.capacity' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout.splitlines()
    assert out == ["[]", "True"]
