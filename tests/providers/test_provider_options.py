"""Every option a provider reads takes effect, and it reads only its own.

Providers read their own options with ``getattr(options, NAME, default)``, so a NAME
that is not the option's ``dest`` is silently the default (the GCP provider once read
``options.resize`` where ``--no-resize`` is stored as ``no_resize``); spotring's own
options reach them typed (:class:`CoreOptions`), never as the parsed command line. The
options here come from the real parser (:func:`spotring.autoscaler.cli.parse`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from spotring.autoscaler.cli import core_options, make_provider, parse, provider_options
from spotring.autoscaler.plugins import get_plugin_manager, provider_registry
from spotring.providers.base import ConfigurationError, CoreOptions, Provider

PM = get_plugin_manager(load_entry_points=False)
AZURE_ENDPOINT = "http://127.0.0.1:9"
GCP_BASE = ["--group", "g", "--zone", "us-central1-a", "--project", "p"]
AZURE_BASE = ["--group", "g", "--resource-group", "rg", "--subscription", "s"]
BASE = {
    "aws": ["--group", "g", "--region", "us-east-1"],
    "gcp": GCP_BASE,
    "azure": [*AZURE_BASE, "--endpoint", AZURE_ENDPOINT],
}
SDK = {"aws": "boto3", "gcp": "google.cloud.compute_v1", "azure": "azure.mgmt.compute"}


@pytest.fixture(autouse=True)
def offline_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Credentials that make no call until used, and nothing of this machine's."""
    for key in [k for k in os.environ if k.startswith(("AWS_", "GOOGLE_", "AZURE_"))]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    adc = tmp_path / "adc.json"
    adc.write_text(
        json.dumps(
            {
                "type": "authorized_user",
                "client_id": "c",
                "client_secret": "s",
                "refresh_token": "r",
            }
        )
    )
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))


class _Strict(argparse.Namespace):
    """Options that record every name read that the parser never set."""

    def __init__(self, options: argparse.Namespace) -> None:
        super().__init__(**vars(options))
        object.__setattr__(self, "_unset", [])

    def __getattr__(self, name: str) -> Any:
        if not name.startswith("_"):
            self._unset.append(name)
        raise AttributeError(name)


def options_for(command: str, provider: str, *extra: str) -> tuple[argparse.Namespace, type]:
    argv = [command, "--provider", provider, *BASE[provider], *extra]
    if command == "run":
        argv += ["-np", "1", "--", "true"]
    options, cls = parse(argv, PM)
    assert cls is not None
    return options, cls


def make(command: str, provider: str, *extra: str) -> Provider:
    pytest.importorskip(SDK[provider])
    options, cls = options_for(command, provider, *extra)
    return make_provider(cls, options)


@pytest.mark.parametrize("command", ["run", "discover"])
@pytest.mark.parametrize("provider", ["aws", "gcp", "azure"])
def test_providers_read_only_options_the_parser_sets(command: str, provider: str) -> None:
    pytest.importorskip(SDK[provider])
    options, cls = options_for(command, provider)
    strict = _Strict(provider_options(options))

    made = cls.from_options(strict, core_options(options))
    made.close()

    assert not strict._unset, f"{provider} read options not its own: {strict._unset}"


def test_every_cloud_provider_is_covered() -> None:
    names = set(provider_registry(PM).names())
    assert {"aws", "gcp", "azure"} <= names


CHECKS: list[tuple[str, list[str], Callable[[Any], object], object]] = [
    ("spot_only", ["--spot-only"], lambda p: p.spot_only, True),
    ("slots_per_host", ["--slots-per-host", "3"], lambda p: p.slots_per_host, 3),
    ("scale_down_on_exit", ["--scale-down-on-exit"], lambda p: p.scale_down_on_exit, True),
    ("max_api_attempts", ["--max-api-attempts", "7"], lambda p: p.max_api_attempts, 7),
]


@pytest.mark.parametrize("provider", ["aws", "gcp", "azure"])
@pytest.mark.parametrize(("name", "flags", "read", "wanted"), CHECKS, ids=[c[0] for c in CHECKS])
def test_a_common_option_takes_effect(
    provider: str, name: str, flags: list[str], read: Callable[[Any], object], wanted: object
) -> None:
    made = make("run", provider, *flags)
    assert read(made) == wanted
    assert read(make("run", provider)) != wanted, "the default differs"


@pytest.mark.parametrize("provider", ["aws", "gcp", "azure"])
def test_the_slots_label_option_takes_effect(provider: str) -> None:
    flag = "--slots-label" if provider == "gcp" else "--slots-tag"
    assert make("discover", provider, flag, "gpus").slots.label == "gpus"  # type: ignore[attr-defined]


def test_aws_options_take_effect() -> None:
    made: Any = make("discover", "aws", "--endpoint-url", "http://127.0.0.1:9")
    assert (made.group, made.region) == ("g", "us-east-1")
    assert made.autoscaling.meta.endpoint_url == "http://127.0.0.1:9"
    with pytest.raises(ConfigurationError, match="profile 'nope' not found"):
        make("discover", "aws", "--profile", "nope")


def test_gcp_options_take_effect() -> None:
    made: Any = make("discover", "gcp", "--endpoint", "http://127.0.0.1:9")
    assert (made.group, made.zone, made.region, made.project) == ("g", "us-central1-a", None, "p")
    assert made.endpoint == "http://127.0.0.1:9"
    assert made._resize_disabled_by_user is False
    assert make("run", "gcp", "--no-resize")._resize_disabled_by_user is True  # type: ignore[attr-defined]
    options, cls = parse(
        ["discover", "--provider", "gcp", "--group", "g", "--region", "us-central1",
         "--project", "p"], PM,
    )  # fmt: skip
    assert make_provider(cls, options).region == "us-central1"  # type: ignore[arg-type,attr-defined]


def test_azure_options_take_effect() -> None:
    made: Any = make("discover", "azure", "--keep-evicted")
    assert (made.group, made.resource_group, made.subscription) == ("g", "rg", "s")
    assert made.endpoint == AZURE_ENDPOINT and made.keep_evicted is True
    assert make("discover", "azure").keep_evicted is False  # type: ignore[attr-defined]


# ------------------------------------------------------- --no-resize against the fake


@pytest.fixture
def compute() -> Iterator[Any]:
    pytest.importorskip("google.cloud.compute_v1", reason="the gcp extra is not installed")
    from tests.fakes.gcp import FakeCompute

    with FakeCompute() as fake:
        yield fake


@pytest.mark.parametrize("no_resize", [False, True])
def test_gcp_no_resize_quiets_the_autoscaler_warning(
    compute: Any,
    caplog: pytest.LogCaptureFixture,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    no_resize: bool,
) -> None:
    zone = "us-central1-a"
    autoscaler = f"projects/{compute.project}/zones/{zone}/autoscalers/as"
    compute.add_group("workers", zone=zone, size=1, autoscaler=autoscaler)
    adc = compute.write_credentials(tmp_path / "fake-adc.json")
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
    argv = ["run", "--provider", "gcp", "--group", "workers", "--zone", zone,
            "--project", compute.project, "--endpoint", compute.url, "-np", "1"]  # fmt: skip
    options, cls = parse([*argv, *(["--no-resize"] if no_resize else []), "--", "true"], PM)
    provider = make_provider(cls, options)  # type: ignore[arg-type]

    with caplog.at_level(logging.INFO, logger="spotring.providers.gcp"):
        provider.list_instances()

    (record,) = [r for r in caplog.records if "is sized by autoscaler as" in r.getMessage()]
    assert record.levelno == (logging.INFO if no_resize else logging.WARNING)


# ------------------------------------------------ the typed contract, not the namespace


class _Recorder(Provider):
    """Records what :meth:`from_options` was given."""

    name = "recorder"
    made_with: tuple[object, object] | None = None

    @classmethod
    def add_arguments(cls, group: argparse._ArgumentGroup) -> None:
        group.add_argument("--knob", type=int, default=1)
        where = group.add_mutually_exclusive_group()
        where.add_argument("--left", action="store_true")
        where.add_argument("--right", action="store_true")

    @classmethod
    def from_options(cls, options: argparse.Namespace, core: CoreOptions) -> _Recorder:
        cls.made_with = (options, core)
        return cls()

    def list_instances(self) -> list:  # type: ignore[type-arg]
        return []

    def set_target_size(self, size: int) -> None: ...

    def replace_instance(self, instance_id: str) -> None: ...


def _registering(*providers: type[Provider]) -> Any:
    from spotring.core import hookimpl

    class Plugin:
        @hookimpl
        def spotring_register_providers(self, registry: Any) -> None:
            for provider in providers:
                registry.add(provider)

    pm = get_plugin_manager(load_entry_points=False)
    pm.register(Plugin())
    return pm


def test_a_provider_gets_its_own_options_and_typed_core_ones_never_the_namespace() -> None:
    pm = _registering(_Recorder)
    argv = ["run", "--provider", "recorder", "--knob", "5", "--right", "-np", "4",
            "--slots-per-host", "2", "--no-resize", "--refresh-interval", "3",
            "--", "true"]  # fmt: skip
    options, cls = parse(argv, pm)
    assert cls is _Recorder

    make_provider(cls, options)

    assert _Recorder.made_with is not None
    own, core = _Recorder.made_with
    assert vars(own) == {"knob": 5, "left": False, "right": True}  # nothing of spotring's
    assert core == CoreOptions(slots_per_host=2, num_proc=4, resize=False)

    options, cls = parse(["discover", "--provider", "recorder"], pm)
    make_provider(cls, options)  # type: ignore[arg-type]
    own, core = _Recorder.made_with
    assert vars(own) == {"knob": 1, "left": False, "right": False}
    assert core == CoreOptions(slots_per_host=None, num_proc=None, resize=True)


def test_core_options_are_frozen() -> None:
    with pytest.raises(AttributeError):
        CoreOptions().slots_per_host = 3  # type: ignore[misc]


def test_an_old_style_plugin_keeps_working_with_a_deprecation_warning() -> None:
    with pytest.warns(DeprecationWarning, match="old provider contract") as warned:

        class OldStyle(_Recorder):
            """A plugin written for the old contract: the parsed command line."""

            name = "old-style"
            finished_with: object = None

            @classmethod
            def from_options(cls, options: argparse.Namespace) -> OldStyle:  # type: ignore[override]
                cls.made_with = (options, None)
                return cls()

            def job_finished(self, options: argparse.Namespace) -> None:  # type: ignore[override]
                type(self).finished_with = options

    assert [Path(w.filename).name for w in warned] == [Path(__file__).name] * 2
    pm = _registering(OldStyle)
    argv = ["run", "--provider", "old-style", "--knob", "5", "-np", "4",
            "--slots-per-host", "2", "--", "true"]  # fmt: skip
    options, cls = parse(argv, pm)
    made = make_provider(cls, options)  # type: ignore[arg-type]

    assert OldStyle.made_with is not None
    legacy, _ = OldStyle.made_with
    assert isinstance(legacy, argparse.Namespace)
    # its own options, and the core ones under their option names, as it read them
    assert (legacy.knob, legacy.slots_per_host, legacy.num_proc, legacy.no_resize) == (
        5, 2, 4, False,
    )  # fmt: skip
    made.job_finished()  # spotring calls it without options now
    assert isinstance(OldStyle.finished_with, argparse.Namespace)
    OldStyle.from_options(argparse.Namespace(x=1))  # an old caller's one argument still works
    assert OldStyle.made_with[0].x == 1  # type: ignore[attr-defined]
