"""Checkpoint URIs: what each form means, checked without touching the network.

/path/to/dir, relative/dir, file:///path      a local or mounted directory
s3://BUCKET/PREFIX                            Amazon S3
gs://BUCKET/PREFIX                            Google Cloud Storage
https://ACCOUNT.blob.core.windows.net/CONTAINER/PREFIX, az://ACCOUNT/CONTAINER/PREFIX
                                              Azure Blob Storage
http://127.0.0.1:PORT/devstoreaccount1/CONTAINER/PREFIX
                                              Azurite (loopback only)
"""

from __future__ import annotations

import importlib.util
import os
import re
from urllib.parse import SplitResult, urlsplit

from spotring.checkpoint.azure_blob import AZURITE_ACCOUNT
from spotring.checkpoint.errors import CheckpointError
from spotring.checkpoint.store import Location, ObjectStore, check_key

_S3_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_GCS_BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")
_AZURE_ACCOUNT = re.compile(r"[a-z0-9]{3,24}")
_AZURE_CONTAINER = re.compile(r"(?!.*--)[a-z0-9][a-z0-9-]{1,61}[a-z0-9]")
# The blob endpoints of Azure's clouds, and nothing else (a DefaultAzureCredential
# token goes to the host): the standard endpoint and the Azure DNS zone one
# (https://learn.microsoft.com/azure/storage/blobs/storage-blob-query-endpoint-srp),
# Azure China and Azure Government
# (https://learn.microsoft.com/azure/china/resources-developer-guide#check-endpoints-in-azure,
# https://learn.microsoft.com/azure/azure-government/compare-azure-government-global-azure).
_AZURE_HOST = re.compile(
    r"([a-z0-9]{3,24})\.(blob\.core\.windows\.net|z[0-9]{2}\.blob\.storage\.azure\.net"
    r"|blob\.core\.chinacloudapi\.cn|blob\.core\.usgovcloudapi\.net)"
)

FORMS = (
    "a directory, s3://BUCKET/PREFIX, gs://BUCKET/PREFIX,"
    " https://ACCOUNT.blob.core.windows.net/CONTAINER/PREFIX or az://ACCOUNT/CONTAINER/PREFIX"
)


def _fail(uri: str, problem: str) -> CheckpointError:
    return CheckpointError(f"bad checkpoint location {uri!r}: {problem}")


def _prefix(uri: str, path: str) -> str:
    prefix = path.strip("/")
    if prefix:
        try:
            check_key(prefix)
        except CheckpointError:
            raise _fail(uri, f"bad prefix {prefix!r} (empty, '.' or '..' parts)") from None
    return prefix


def _is_loopback(host: str) -> bool:
    # The two hosts azure-storage-blob addresses path-style (account in the path).
    return host in ("127.0.0.1", "localhost")


def _azure(uri: str, parts: SplitResult) -> Location:
    host = (parts.hostname or "").lower()
    segments = parts.path.lstrip("/")
    if parts.scheme == "az":
        account, account_url, emulator = host, f"https://{host}.blob.core.windows.net", False
    elif _is_loopback(host):
        account, _, segments = segments.partition("/")
        account_url, emulator = f"{parts.scheme}://{parts.netloc}/{account}", True
        if account != AZURITE_ACCOUNT:
            raise _fail(
                uri,
                f"a loopback blob endpoint is taken as Azurite: its account must be"
                f" {AZURITE_ACCOUNT}, e.g. http://127.0.0.1:10000/{AZURITE_ACCOUNT}/CONTAINER",
            )
    elif parts.scheme == "http":
        raise _fail(uri, "plain http is accepted only for a local emulator on 127.0.0.1; use https")
    else:
        found = _AZURE_HOST.fullmatch(host)
        if not found:
            raise _fail(
                uri,
                "not an Azure Blob endpoint (ACCOUNT.blob.core.windows.net, or the blob"
                " endpoint of Azure China, Azure Government or an Azure DNS zone)",
            )
        account, account_url, emulator = found.group(1), f"https://{parts.netloc.lower()}", False
    if not _AZURE_ACCOUNT.fullmatch(account):
        raise _fail(uri, f"bad storage account {account!r} (3-24 lowercase letters and digits)")
    container, _, path = segments.partition("/")
    if not _AZURE_CONTAINER.fullmatch(container):
        raise _fail(uri, f"bad or missing container {container!r} (3-63 of a-z, 0-9, -)")
    prefix = _prefix(uri, path)
    shown = f"az://{account}/{container}" if parts.scheme == "az" else f"{account_url}/{container}"
    return Location(
        "azure",
        shown + (f"/{prefix}" if prefix else ""),
        bucket=container,
        prefix=prefix,
        account_url=account_url,
        emulator=emulator,
    )


def parse(uri: str) -> Location:
    """What ``uri`` names; :class:`CheckpointError` (one line, saying the fix) if it is
    not a checkpoint location."""
    if not isinstance(uri, str) or not uri.strip():
        raise CheckpointError(f"empty checkpoint location: expected {FORMS}")
    if "://" not in uri and not uri.startswith("file:"):
        path = os.path.abspath(os.path.expanduser(uri))
        return Location("local", path, path=path)
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if parts.username is not None or parts.password is not None:
        # The message must not repeat the URI: it holds a secret.
        raise CheckpointError(
            f"credentials do not belong in a {scheme}:// checkpoint location; the cloud's SDK"
            " finds them (instance role, environment, CLI login)"
        )
    shown = f"{scheme}://{parts.netloc}{parts.path}"
    if parts.query or parts.fragment:
        raise CheckpointError(
            f"bad checkpoint location {shown!r}: no query or fragment (SAS tokens and other"
            " credentials do not belong in it)"
        )
    if scheme == "file":
        if parts.netloc not in ("", "localhost"):
            raise _fail(uri, "file:// URIs name a local path (file:///path)")
        path = os.path.abspath(os.path.expanduser(parts.path))
        return Location("local", path, path=path)
    if scheme in ("s3", "gs"):
        bucket = parts.netloc
        pattern = _S3_BUCKET if scheme == "s3" else _GCS_BUCKET
        if not pattern.fullmatch(bucket):
            raise _fail(uri, f"bad or missing bucket name {bucket!r}")
        prefix = _prefix(uri, parts.path)
        kind = "s3" if scheme == "s3" else "gcs"
        shown = f"{scheme}://{bucket}" + (f"/{prefix}" if prefix else "")
        return Location(kind, shown, bucket=bucket, prefix=prefix)
    if scheme in ("az", "https", "http"):
        return _azure(uri, parts._replace(scheme=scheme))
    raise _fail(uri, f"unknown scheme {scheme!r}; expected {FORMS}")


_SDKS = {
    "s3": (("boto3",), "aws"),
    "gcs": (("google.cloud.storage",), "gcp"),
    "azure": (("azure.storage.blob", "azure.identity"), "azure"),
}


def _check_sdk(location: Location) -> None:
    modules, extra = _SDKS[location.kind]
    if location.emulator:
        modules = modules[:1]  # Azurite's key needs no azure-identity
    for module in modules:
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:  # its parent package is missing
            found = False
        if not found:
            raise CheckpointError(
                f"{location.uri} needs the {module} package: pip install 'spotring[{extra}]'"
            )


def open_store(uri: str, *, timeout_s: float = 60.0) -> ObjectStore:
    """The store ``uri`` names (see this module's docstring for the forms).

    Contacts no network and creates nothing: clients are made on first use, so this can
    check a command line. ``timeout_s`` bounds each request's connect and read (the SDKs
    retry failed requests with backoff). Raises :class:`CheckpointError` with a one-line
    message for a bad URI or a missing SDK (naming the extra to install).
    """
    if not timeout_s > 0:
        raise CheckpointError(f"checkpoint timeout must be positive, got {timeout_s}")
    location = parse(uri)
    if location.kind == "local":
        from spotring.checkpoint.local import LocalStore

        if os.path.exists(location.uri) and not os.path.isdir(location.uri):
            raise _fail(uri, "it is a file, not a directory")
        return LocalStore(location.uri)
    _check_sdk(location)
    if location.kind == "s3":
        from spotring.checkpoint.s3 import S3Store

        return S3Store(location, timeout_s=timeout_s)
    if location.kind == "gcs":
        from spotring.checkpoint.gcs import GcsStore

        return GcsStore(location, timeout_s=timeout_s)
    from spotring.checkpoint.azure_blob import AzureBlobStore

    return AzureBlobStore(location, timeout_s=timeout_s)
