"""``spotring check``: what this installation can run, before a run (like
``horovodrun --check-build``).

One line per item: torch, the Horovod build (frameworks, controllers, collectives),
what spotring needs of Horovod's internals, and for each installed provider whether
its SDK imports and whether credentials are found, as the provider class declares
(``sdk_modules``, ``needs_credentials``, ``credential_source``). Credentials are looked
for, never printed, and nothing here calls a cloud API.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

import pluggy

from spotring.autoscaler.cli.usage import AddCommand
from spotring.autoscaler.plugins import provider_registry
from spotring.driver.compat import HorovodSetupError, require_horovod
from spotring.providers.base import Provider, ProviderRegistry


def add_parser(add_command: AddCommand) -> None:
    """The ``check`` command's parser."""
    check = add_command(
        "check",
        help="report what this installation can run (torch, Horovod, provider SDKs)",
        description="Report torch, the Horovod build, and each provider's SDK and whether "
        "credentials are found (never printed; no cloud API is called). Exits 1 when "
        "something required is missing: torch and Horovod, and with --provider that "
        "provider's SDK and credentials.",
    )
    check.add_argument("--provider", metavar="NAME", help="check only this provider, strictly")


def check(pm: pluggy.PluginManager, only: str | None) -> int:
    """The report of every installed provider, or of ``only``, strictly."""
    return run_check(provider_registry(pm), only)


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


def check_provider(provider: type[Provider], required: bool) -> Iterator[Finding]:
    """The SDK and credentials of ``provider``, as it declares them
    (:attr:`Provider.sdk_modules`, :attr:`Provider.needs_credentials`,
    :meth:`Provider.credential_source`)."""
    name = provider.name
    modules = tuple(provider.sdk_modules)
    if not modules and not provider.needs_credentials:
        yield Finding(f"provider {name}", True, "installed (no SDK or credential check known)")
        return
    missing = _imports(*modules)
    if missing is not None:
        install = f"pip install '{provider.sdk_extra}'" if provider.sdk_extra else "not found"
        yield Finding(f"provider {name}", False, f"{missing} not installed: {install}", required)
        return
    sdk = f"SDK installed ({', '.join(modules)})" if modules else "installed"
    yield Finding(f"provider {name}", True, sdk)
    if not provider.needs_credentials:
        return
    try:
        where = provider.credential_source()
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
            findings += check_provider(provider, required=only is not None)
    for finding in findings:
        print(finding.line(), file=out)
    return 0 if all(f.ok or not f.required for f in findings) else 1
