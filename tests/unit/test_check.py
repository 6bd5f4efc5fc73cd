"""``spotring check``: one line per item, credentials found but never printed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from spotring.autoscaler.cli.check import Finding, check_provider
from spotring.providers.azure import AzureProvider
from spotring.providers.base import Provider
from spotring.providers.gcp import GcpProvider
from spotring.providers.local import LocalProvider

SPOTRING = str(Path(sys.executable).with_name("spotring"))


def run_check(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return subprocess.run(
        [SPOTRING, "check", *args],
        env={**base, "AWS_EC2_METADATA_DISABLED": "true", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def lines(result: subprocess.CompletedProcess[str]) -> dict[str, str]:
    return {line[:24].strip(): line[25:] for line in result.stdout.splitlines()}


def test_reports_the_build_and_finds_credentials_without_printing_them(tmp_path: Path) -> None:
    result = run_check(
        AWS_ACCESS_KEY_ID="AKIAEXAMPLEKEY",
        AWS_SECRET_ACCESS_KEY="sekrit-never-shown",
        AWS_CONFIG_FILE=str(tmp_path / "none"),
        AWS_SHARED_CREDENTIALS_FILE=str(tmp_path / "none"),
    )
    assert result.returncode == 0, result.stdout + result.stderr
    found = lines(result)
    assert found["torch"].startswith("ok")
    assert found["horovod"].startswith("ok") and "Gloo" in found["horovod"]
    assert found["horovod internals"].startswith("ok")
    assert found["provider aws"].startswith("ok")
    assert found["aws credentials"].split() == ["ok", "found", "(env)"]
    assert "sekrit-never-shown" not in result.stdout + result.stderr
    assert "AKIAEXAMPLEKEY" not in result.stdout + result.stderr


def test_a_provider_without_credentials_fails_only_when_asked_for(tmp_path: Path) -> None:
    isolated = {
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
    }
    general = run_check(**isolated)
    assert general.returncode == 0
    assert lines(general)["aws credentials"].startswith("missing not found")
    strict = run_check("--provider", "aws", **isolated)
    assert strict.returncode == 1
    assert lines(strict)["aws credentials"].startswith("FAILED  not found")
    assert "provider local" not in strict.stdout


# ------------------------------------------ each provider declares its SDK and credentials


class _Vault(Provider):
    """A third-party provider with an SDK and credentials of its own."""

    name = "vault"
    sdk_modules = ("json",)
    sdk_extra = "spotring-vault"
    needs_credentials = True
    source: str | None = "found (vault token file)"

    @classmethod
    def credential_source(cls) -> str | None:
        if cls.source == "broken":
            raise KeyError("the token file's contents")
        return cls.source

    @classmethod
    def from_options(cls, options: object, core: object) -> _Vault:  # type: ignore[override]
        return cls()

    def list_instances(self) -> list:  # type: ignore[type-arg]
        return []

    def set_target_size(self, size: int) -> None: ...

    def replace_instance(self, instance_id: str) -> None: ...


def shown(findings: list[Finding]) -> list[str]:
    return [" ".join(finding.line().split()) for finding in findings]


def test_a_plugin_probes_its_own_sdk_and_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    assert shown(list(check_provider(_Vault, required=True))) == [
        "provider vault ok SDK installed (json)",
        "vault credentials ok found (vault token file)",
    ]
    monkeypatch.setattr(_Vault, "source", None)
    assert shown(list(check_provider(_Vault, required=True)))[1] == (
        "vault credentials FAILED not found"
    )
    assert shown(list(check_provider(_Vault, required=False)))[1] == (
        "vault credentials missing not found"
    )
    monkeypatch.setattr(_Vault, "source", "broken")
    (_, broken) = shown(list(check_provider(_Vault, required=True)))
    assert broken == "vault credentials FAILED could not be read (KeyError)"
    assert "contents" not in broken
    monkeypatch.setattr(_Vault, "sdk_modules", ("json", "spotring_no_such_sdk"))
    assert shown(list(check_provider(_Vault, required=True))) == [
        "provider vault FAILED spotring_no_such_sdk not installed: pip install 'spotring-vault'"
    ]


def test_a_provider_without_sdk_or_credentials_is_installed() -> None:
    assert shown(list(check_provider(LocalProvider, required=True))) == [
        "provider local ok installed (no SDK or credential check known)"
    ]


def test_the_cloud_providers_find_their_credentials(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    for key in [k for k in os.environ if k.startswith(("GOOGLE_", "AZURE_", "IDENTITY_", "MSI_"))]:
        monkeypatch.delenv(key)
    adc = tmp_path / "adc.json"
    monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(adc))
    assert GcpProvider.credential_source() is None  # named, but no such file
    adc.write_text("{}")
    assert GcpProvider.credential_source() == "found (GOOGLE_APPLICATION_CREDENTIALS)"
    assert AzureProvider.credential_source() is None
    monkeypatch.setenv("AZURE_CLIENT_ID", "c")
    monkeypatch.setenv("AZURE_TENANT_ID", "t")
    assert AzureProvider.credential_source() == (
        "found (AZURE_CLIENT_ID / AZURE_TENANT_ID environment)"
    )
