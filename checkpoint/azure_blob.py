"""A checkpoint store in Azure Blob Storage (azure-storage-blob).

Real accounts authenticate with azure-identity's DefaultAzureCredential (managed
identity, environment, Azure CLI login), never with keys in the URI. A loopback
``http://127.0.0.1:PORT/devstoreaccount1/...`` endpoint is Azurite, the emulator, with
its published development account key.
"""

from __future__ import annotations

import threading
from typing import Any

from spotring.checkpoint.errors import CheckpointError, ObjectNotFoundError, one_line
from spotring.checkpoint.store import (
    BytesReader,
    Location,
    ObjectStore,
    Versioned,
    check_key,
    check_prefix,
    check_size,
    seconds_between,
)

AZURITE_ACCOUNT = "devstoreaccount1"
# Azurite's well-known development key, published in its documentation: not a secret,
# and accepted only for a loopback endpoint (see spotring.checkpoint.uri).
AZURITE_KEY = (
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)
BLOCK = 8 * 2**20
"""Block size of staged uploads and of ranged downloads."""
CONCURRENCY = 8
ATTEMPTS = 5


class AzureBlobStore(ObjectStore):
    """Blobs under a container prefix. Puts above :data:`BLOCK` stage blocks in
    parallel and commit the list last (the blob appears only then)."""

    unused_version = '"0x0"'

    def __init__(self, location: Location, *, timeout_s: float = 60.0) -> None:
        self.uri = location.uri
        self.account_url = location.account_url
        self.container_name = location.bucket
        self.prefix = location.prefix
        self.emulator = location.emulator
        self.timeout_s = timeout_s
        self._container: Any = None
        self._lock = threading.Lock()

    def _blobs(self) -> Any:
        """The container client, made on first use."""
        with self._lock:
            if self._container is None:
                from azure.storage.blob import BlobServiceClient, ExponentialRetry

                credential: Any
                if self.emulator:
                    from azure.core.credentials import AzureNamedKeyCredential

                    credential = AzureNamedKeyCredential(AZURITE_ACCOUNT, AZURITE_KEY)
                else:
                    from azure.identity import DefaultAzureCredential

                    credential = DefaultAzureCredential(exclude_interactive_browser_credential=True)
                service = BlobServiceClient(
                    self.account_url,
                    credential=credential,
                    connection_timeout=min(10.0, self.timeout_s),
                    read_timeout=self.timeout_s,
                    # The SDK's default waits 15 s before its first retry.
                    retry_policy=ExponentialRetry(
                        initial_backoff=1, increment_base=2, retry_total=ATTEMPTS - 1
                    ),
                    max_single_put_size=BLOCK,
                    max_block_size=BLOCK,
                    max_single_get_size=4 * BLOCK,
                    max_chunk_get_size=BLOCK,
                )
                self._container = service.get_container_client(self.container_name)
            return self._container

    def _key(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _fail(self, action: str, key: str, error: Exception) -> CheckpointError:
        from azure.core.exceptions import ClientAuthenticationError, HttpResponseError

        where = f"{self.uri}/{key}" if key else self.uri
        if isinstance(error, ClientAuthenticationError) and not isinstance(
            getattr(error, "status_code", None), int
        ):
            return CheckpointError(
                f"cannot {action} {where}: no Azure credentials found (managed identity,"
                " AZURE_CLIENT_ID/AZURE_TENANT_ID/AZURE_CLIENT_SECRET, or az login)"
            )
        code = getattr(error, "error_code", None) or ""
        if isinstance(error, HttpResponseError) and error.status_code == 403:
            return CheckpointError(
                f"cannot {action} {where}: access denied ({code or 403}; the identity needs"
                " the Storage Blob Data Contributor role on the container)"
            )
        if code == "ContainerNotFound":
            return CheckpointError(
                f"cannot {action} {where}: container {self.container_name} does not exist"
            )
        message = getattr(error, "message", None) or str(error)
        return CheckpointError(f"cannot {action} {where}: {one_line(message)}")

    def put(self, key: str, data: bytes | memoryview) -> None:
        from azure.core.exceptions import AzureError

        name, reader = self._key(key), BytesReader(data)
        try:
            self._blobs().upload_blob(
                name,
                reader,
                length=len(reader),
                overwrite=True,
                max_concurrency=CONCURRENCY,
            )
        except AzureError as error:
            raise self._fail("write", key, error) from error

    def get(self, key: str, *, max_size: int | None = None) -> bytes:
        from azure.core import MatchConditions

        blob = self._blobs().get_blob_client(self._key(key))
        pinned: dict[str, Any] = {}
        if max_size is not None:
            properties = self._call("read", key, blob.get_blob_properties)
            check_size(self.uri, key, properties.size, max_size)
            # Download the version that was sized.
            pinned = {"etag": properties.etag, "match_condition": MatchConditions.IfNotModified}
        download = self._call(
            "read", key, blob.download_blob, max_concurrency=CONCURRENCY, **pinned
        )
        data: bytes = self._call("read", key, download.readall)
        return data

    def get_versioned(self, key: str, *, max_size: int) -> Versioned:
        blob = self._blobs().get_blob_client(self._key(key))
        answered: list[Any] = []
        download = self._call(
            "read", key, blob.download_blob,
            raw_response_hook=lambda answer: answered.append(answer.http_response.headers),
        )  # fmt: skip
        check_size(self.uri, key, download.size, max_size)
        data: bytes = self._call("read", key, download.readall)
        # The blob's Last-Modified and the answer's Date, both the service's clock
        # (https://learn.microsoft.com/rest/api/storageservices/get-blob#response-headers).
        date = answered[0].get("Date") if answered else None
        properties = download.properties
        return Versioned(data, properties.etag, seconds_between(properties.last_modified, date))

    def _call(self, action: str, key: str, call: Any, *args: Any, **kwargs: Any) -> Any:
        """``call`` with the SDK's errors made :class:`CheckpointError` (a missing blob
        :class:`ObjectNotFoundError`)."""
        from azure.core.exceptions import AzureError, ResourceNotFoundError

        try:
            return call(*args, **kwargs)
        except ResourceNotFoundError as error:
            if getattr(error, "error_code", None) == "ContainerNotFound":
                raise self._fail(action, key, error) from error
            raise ObjectNotFoundError(f"{self.uri}/{key} does not exist") from error
        except AzureError as error:
            raise self._fail(action, key, error) from error

    def list(self, prefix: str = "") -> list[str]:
        from azure.core.exceptions import AzureError

        check_prefix(prefix)
        blobs = self._blobs()
        root = f"{self.prefix}/" if self.prefix else ""
        try:
            return sorted(
                name[len(root) :] for name in blobs.list_blob_names(name_starts_with=root + prefix)
            )
        except AzureError as error:
            raise self._fail("list", prefix, error) from error

    def delete(self, key: str) -> None:
        from azure.core.exceptions import AzureError, ResourceNotFoundError

        name = self._key(key)
        try:
            self._blobs().delete_blob(name)
        except ResourceNotFoundError as error:
            if getattr(error, "error_code", None) == "ContainerNotFound":
                raise self._fail("delete", key, error) from error
        except AzureError as error:
            raise self._fail("delete", key, error) from error

    def put_if(self, key: str, data: bytes, version: str | None) -> str | None:
        """Blob conditional headers (https://learn.microsoft.com/rest/api/storageservices/
        specifying-conditional-headers-for-blob-service-operations): ``If-None-Match: *``
        (``overwrite=False``) fails with 409 BlobAlreadyExists for an existing blob,
        ``If-Match: ETAG`` with 412 ConditionNotMet for another version or none."""
        from azure.core import MatchConditions
        from azure.core.exceptions import (
            AzureError,
            ResourceExistsError,
            ResourceModifiedError,
            ResourceNotFoundError,
        )

        blob = self._blobs().get_blob_client(self._key(key))
        condition: dict[str, Any] = (
            {"overwrite": False}
            if version is None
            else {"etag": version, "match_condition": MatchConditions.IfNotModified}
        )
        try:
            written = blob.upload_blob(data, **condition)
        except (ResourceExistsError, ResourceModifiedError):
            return None
        except ResourceNotFoundError as error:  # the container
            raise self._fail("write", key, error) from error
        except AzureError as error:
            raise self._fail("write", key, error) from error
        return str(written["etag"])
