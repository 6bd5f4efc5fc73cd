"""Plugin manager: built-ins, entry points, disabling, the hook contract."""

from __future__ import annotations

import inspect
import re
import sys
import textwrap
from pathlib import Path

import pytest

from spotring.autoscaler import hookspecs
from spotring.autoscaler.plugins import (
    BUILTIN_PLUGINS,
    ProviderRegistry,
    get_plugin_manager,
    provider_registry,
)
from spotring.providers.local import LocalProvider
from tests.fakes.scripted import ScriptedProvider


@pytest.fixture
def fake_distribution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An installed-looking distribution whose entry point registers a provider."""
    (tmp_path / "spotring_fakecloud.py").write_text(
        textwrap.dedent(
            """
            from spotring.autoscaler import hookimpl
            from tests.fakes.scripted import ScriptedProvider

            class FakeCloud(ScriptedProvider):
                name = "fakecloud"
                description = "a provider from an entry point"

            @hookimpl
            def spotring_register_providers(registry):
                registry.add(FakeCloud)

            @hookimpl
            def spotring_add_provider_options(provider, group):
                if provider.name == "fakecloud":
                    group.add_argument("--fake-pool")

            def spotring_helper_not_a_hook():
                pass
            """
        )
    )
    info = tmp_path / "spotring_fakecloud-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: spotring-fakecloud\nVersion: 1.0\n"
    )
    (info / "entry_points.txt").write_text("[spotring.providers]\nfakecloud = spotring_fakecloud\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop("spotring_fakecloud", None)


def test_builtins_register_like_plugins() -> None:
    pm = get_plugin_manager(load_entry_points=False)
    registry = provider_registry(pm)
    assert registry.get("local") is LocalProvider
    assert {pm.get_name(p) for p in pm.get_plugins()} >= set(BUILTIN_PLUGINS)


def test_entry_point_plugin_is_loaded(fake_distribution: Path) -> None:
    pm = get_plugin_manager()
    registry = provider_registry(pm)
    assert "fakecloud" in registry
    assert registry.get("fakecloud").description == "a provider from an entry point"


def test_entry_point_plugin_can_be_disabled(
    fake_distribution: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SPOTRING_DISABLE_PLUGINS", "fakecloud")
    assert "fakecloud" not in provider_registry(get_plugin_manager())


def test_disable_takes_the_names_spotring_providers_shows(
    fake_distribution: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from spotring.autoscaler.cli import main

    # The entry point is named "fakecloud-plugin": the user knows only the provider name.
    (fake_distribution / "spotring_fakecloud-1.0.dist-info" / "entry_points.txt").write_text(
        "[spotring.providers]\nfakecloud-plugin = spotring_fakecloud\n"
    )
    monkeypatch.setenv("SPOTRING_DISABLE_PLUGINS", "aws, fakecloud")
    pm = get_plugin_manager()
    names = provider_registry(pm).names()
    assert "aws" not in names and "fakecloud" not in names
    assert {"azure", "gcp", "local", "script"} <= set(names)
    # A plugin left with no provider is not registered: none of its hooks run.
    assert pm.get_plugin("spotring.providers.aws") is None
    assert pm.get_plugin("fakecloud-plugin") is None
    assert main(["providers"]) == 0
    shown = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert shown == names
    assert main(["discover", "--provider", "aws"]) != 0
    assert "unknown provider 'aws'" in capsys.readouterr().err


def test_disabling_one_provider_keeps_the_plugins_others() -> None:
    from spotring.autoscaler import hookimpl

    class Second(ScriptedProvider):
        name = "second"

    class TwoProviders:
        @hookimpl
        def spotring_register_providers(self, registry: ProviderRegistry) -> None:
            registry.add(ScriptedProvider)
            registry.add(Second)

    pm = get_plugin_manager(["scripted"], load_entry_points=False)
    pm.register(TwoProviders())
    registry = provider_registry(pm)
    assert "second" in registry and "scripted" not in registry


@pytest.mark.parametrize("name", ["spotring.providers.aws", "aws"])
def test_a_builtin_is_disabled_by_module_or_provider_name(name: str) -> None:
    pm = get_plugin_manager([name], load_entry_points=False)
    assert "aws" not in provider_registry(pm)
    assert pm.get_plugin("spotring.providers.aws") is None


def test_spotrings_own_hooks_cannot_be_disabled() -> None:
    pm = get_plugin_manager(["spotring.autoscaler.policy"], load_entry_points=False)
    assert pm.get_plugin("spotring.autoscaler.policy") is not None


def test_unprefixed_functions_are_not_hooks(fake_distribution: Path) -> None:
    # check_pending() would raise for an unknown spotring_ hook; the helper is
    # rejected by name: it must not be taken as a hook at all.
    pm = get_plugin_manager()
    module = sys.modules["spotring_fakecloud"]
    names = {
        impl.function.__name__
        for caller in pm.get_hookcallers(module) or []
        for impl in caller.get_hookimpls()
    }
    assert "spotring_helper_not_a_hook" not in names
    assert "spotring_register_providers" in names


def test_provider_options_come_from_the_hook(fake_distribution: Path) -> None:
    from spotring.autoscaler.cli import parse

    pm = get_plugin_manager()
    options, provider = parse(["discover", "--provider", "fakecloud", "--fake-pool", "p1"], pm)
    assert provider is not None and provider.name == "fakecloud"
    assert options.fake_pool == "p1"


def test_registry_rejects_duplicates_and_non_providers() -> None:
    registry = ProviderRegistry()
    registry.add(ScriptedProvider)
    registry.add(ScriptedProvider)  # the same class again is harmless

    class Other(ScriptedProvider):
        name = "scripted"

    with pytest.raises(ValueError, match="taken"):
        registry.add(Other)
    with pytest.raises(TypeError):
        registry.add(object)  # type: ignore[arg-type]
    with pytest.raises(KeyError, match="choose from: scripted"):
        registry.get("nope")


def test_every_hookspec_documents_its_parameters() -> None:
    """The docs' hooks page is generated from these docstrings (tests/unit/test_docs.py
    checks that every hook is on it, with its parameters)."""
    for name, spec in inspect.getmembers(hookspecs, inspect.isfunction):
        if not name.startswith("spotring_"):
            continue
        assert spec.__doc__ and ":param" in spec.__doc__, name


def test_every_hookspec_uses_the_prefix() -> None:
    pm = get_plugin_manager(load_entry_points=False)
    assert all(
        re.match(r"spotring_\w+$", name) for name in vars(pm.hook) if not name.startswith("_")
    )
