"""``spotring check``: what this installation can run, before a run (like
``horovodrun --check-build``).

One line per item: torch, the Horovod build (frameworks, controllers, collectives),
what spotring needs of Horovod's internals, and for each installed provider whether
its SDK imports and whether credentials are found. Credentials are looked for, never
printed, and nothing here calls a cloud API.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from spotring.driver.compat import HorovodSetupError, require_horovod
from spotring.providers.base import ProviderRegistry


@dataclass(frozen=True)
class Finding:
    """One line of the report."""

    item: str
    ok: bool
    detail: str
    required: bool = True
    """A failed required finding makes ``spotring check`` exit 1."""

    def line(self) -> str:
        status = "ok" if self.ok else ("FAILED" if self.required else "missing")
        return f"{self.item:<24} {status:<7} {self.detail}"


def check_training() -> Iterator[Finding]:
    """torch and Horovod, as ``spotring run`` needs them."""
    yield Finding("python", True, f"{sys.version.split()[0]} at {sys.executable}")
    try:
        import torch

        cuda = "CUDA available" if torch.cuda.is_available() else "no CUDA"
        yield Finding("torch", True, f"{torch.__version__} ({cuda})")
    except ImportError:
        yield Finding("torch", False, "not installed: pip install torch (CPU: torch==2.13.0)")
        return
    try:
        version = require_horovod()
    except HorovodSetupError as error:
        yield Finding("horovod", False, str(error))
        return
    import horovod.torch as hvd

    built = [name for name, test in (("Gloo", hvd.gloo_built), ("MPI", hvd.mpi_built)) if test()]
    collectives = [
        name
        for name, test in (("NCCL", hvd.nccl_built), ("DDL", hvd.ddl_built), ("CCL", hvd.ccl_built))
        if test()
    ]
    yield Finding(
        "horovod",
        "Gloo" in built,
        f"{version}, PyTorch, controllers: {', '.join(built) or 'none'}"
        f"; GPU collectives: {', '.join(collectives) or 'none'}"
        + ("" if "Gloo" in built else " (spotring needs Gloo: build with HOROVOD_WITH_GLOO=1)"),
    )
    yield Finding("horovod internals", True, "every attribute spotring relies on is there")


def _imports(*modules: str) -> str | None:
    """The first module of ``modules`` that does not import, or None."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            return module
    return None


def _aws_credentials() -> str | None:
    import boto3

    credentials = boto3.session.Session().get_credentials()
    return None if credentials is None else f"found ({credentials.method})"


def _gcp_credentials() -> str | None:
    path = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    if path:
        return "found (GOOGLE_APPLICATION_CREDENTIALS)" if Path(path).is_file() else None
    if (Path.home() / ".config" / "gcloud" / "application_default_credentials.json").is_file():
        return "found (gcloud auth application-default login)"
    product = Path("/sys/class/dmi/id/product_name")
    if product.is_file() and "Google" in product.read_text(errors="replace"):
        return "found (this VM's service account)"
    return None


def _azure_credentials() -> str | None:
    if os.environ.get("AZURE_CLIENT_ID") and os.environ.get("AZURE_TENANT_ID"):
        return "found (AZURE_CLIENT_ID / AZURE_TENANT_ID environment)"
    if (Path.home() / ".azure" / "msal_token_cache.json").is_file():
        return "found (Azure CLI login)"
    if os.environ.get("IDENTITY_ENDPOINT") or os.environ.get("MSI_ENDPOINT"):
        return "found (managed identity)"
    return None


PROVIDER_PROBES: dict[str, tuple[tuple[str, ...], str, Callable[[], str | None]]] = {
    "aws": (("boto3",), "spotring[aws]", _aws_credentials),
    "gcp": (("google.cloud.compute_v1", "google.auth"), "spotring[gcp]", _gcp_credentials),
    "azure": (
        ("azure.mgmt.compute", "azure.mgmt.network", "azure.identity"),
        "spotring[azure]",
        _azure_credentials,
    ),
}
"""Per built-in cloud provider: the SDK modules, the extra to install, a credential probe
that says where credentials were found (None: not found) without printing them."""


def check_provider(name: str, required: bool) -> Iterator[Finding]:
    """The SDK and credentials of provider ``name``."""
    probe = PROVIDER_PROBES.get(name)
    if probe is None:
        yield Finding(f"provider {name}", True, "installed (no SDK or credential check known)")
        return
    modules, extra, credentials = probe
    missing = _imports(*modules)
    if missing is not None:
        yield Finding(
            f"provider {name}", False, f"{missing} not installed: pip install '{extra}'", required
        )
        return
    yield Finding(f"provider {name}", True, f"SDK installed ({', '.join(modules)})")
    try:
        where = credentials()
    except Exception as error:  # a broken config file: say so, without its contents
        where, detail = None, f"could not be read ({type(error).__name__})"
    else:
        detail = where or "not found"
    yield Finding(f"{name} credentials", where is not None, detail, required)


def run_check(
    registry: ProviderRegistry, only: str | None = None, out: IO[str] = sys.stdout
) -> int:
    """Print the report; 0 when everything required works, 1 otherwise.

    Required: torch and Horovod, and with ``only`` that provider's SDK and credentials
    (without it, a cloud SDK or credentials missing is reported, not a failure).
    """
    findings = list(check_training())
    for provider in registry:
        if only is None or provider.name == only:
            findings += check_provider(provider.name, required=only is not None)
    for finding in findings:
        print(finding.line(), file=out)
    return 0 if all(f.ok or not f.required for f in findings) else 1
