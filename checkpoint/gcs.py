"""A checkpoint store in Google Cloud Storage (google-cloud-storage).

Credentials are Application Default Credentials (the VM's service account, or
``gcloud auth application-default login``); with ``STORAGE_EMULATOR_HOST`` set, the
client talks to that emulator anonymously (the library's own convention).
"""

from __future__ import annotations

import threading
from typing import Any

from spotring.checkpoint.errors import (
    CheckpointError,
    ObjectCorruptError,
    ObjectNotFoundError,
    one_line,
)
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

CHUNK = 32 * 2**20
"""Resumable upload chunk (a multiple of 256 KiB): each is one request, retried alone."""


class GcsStore(ObjectStore):
    """Objects under ``gs://BUCKET/PREFIX``. Puts above 8 MiB are resumable uploads in
    :data:`CHUNK` pieces (the object appears only when the last one lands)."""

    unused_version = "1"  # generations are microsecond timestamps

    def __init__(self, location: Location, *, timeout_s: float = 60.0) -> None:
        self.uri = location.uri
        self.bucket_name = location.bucket
        self.prefix = location.prefix
        self.timeout_s = timeout_s
        self._timeout = (min(10.0, timeout_s), timeout_s)  # (connect, read)
        self._client: Any = None
        self._bucket: Any = None
        self._retry: Any = None
        self._lock = threading.Lock()
        self._answers = threading.local()  # .date: the Date of this thread's last answer

    def _gcs(self) -> Any:
        """The bucket handle, its client made on first use."""
        with self._lock:
            if self._bucket is None:
                from google.cloud.storage import Client
                from google.cloud.storage.retry import DEFAULT_RETRY

                try:
                    # project=None: bucket calls need none, and ADC may not name one.
                    self._client = Client(project=None)
                except Exception as error:
                    raise self._fail("open", "", error) from error
                self._bucket = self._client.bucket(self.bucket_name)
                # The storage library hands back no answer's headers; the Date, the
                # store's clock for a lock's age, is taken where requests delivers them.
                self._client._http.hooks["response"].append(self._note_answer)
                # Each attempt is bounded by the timeout; all attempts by this deadline.
                bound = getattr(DEFAULT_RETRY, "with_timeout", None) or DEFAULT_RETRY.with_deadline
                self._retry = bound(3 * self.timeout_s)  # with_timeout: api-core >= 2.16
            return self._bucket

    def _key(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _errors(self) -> tuple[type[BaseException], ...]:
        import requests
        from google.api_core.exceptions import GoogleAPIError
        from google.auth.exceptions import GoogleAuthError
        from google.cloud.storage.exceptions import DataCorruption, InvalidResponse

        return (
            GoogleAPIError,
            GoogleAuthError,
            InvalidResponse,
            DataCorruption,
            requests.RequestException,
            OSError,
            ValueError,
        )

    def _fail(self, action: str, key: str, error: BaseException) -> CheckpointError:
        from google.api_core.exceptions import Forbidden, NotFound, Unauthorized
        from google.auth.exceptions import DefaultCredentialsError

        where = f"{self.uri}/{key}" if key else self.uri
        if isinstance(error, DefaultCredentialsError):
            return CheckpointError(
                f"cannot {action} {where}: no Google credentials found (the VM's service"
                " account, or gcloud auth application-default login)"
            )
        if isinstance(error, (Forbidden, Unauthorized)):
            return CheckpointError(
                f"cannot {action} {where}: access denied (the account needs"
                " roles/storage.objectUser on the bucket)"
            )
        if isinstance(error, NotFound) and "bucket" in str(error).lower():
            return CheckpointError(
                f"cannot {action} {where}: bucket {self.bucket_name} does not exist"
            )
        message = getattr(error, "message", None) or str(error)
        return CheckpointError(f"cannot {action} {where}: {one_line(message)}")

    def put(self, key: str, data: bytes | memoryview) -> None:
        name, reader = self._key(key), BytesReader(data)
        blob = self._gcs().blob(name, chunk_size=CHUNK)
        try:
            blob.upload_from_file(
                reader,
                size=len(reader),
                content_type="application/octet-stream",
                timeout=self._timeout,
                retry=self._retry,  # a whole-object overwrite: safe to repeat
            )
        except self._errors() as error:
            raise self._fail("write", key, error) from error

    def _note_answer(self, answer: Any, *_: Any, **__: Any) -> None:
        self._answers.date = answer.headers.get("Date")

    def _metadata(self, key: str) -> Any:
        """The object's metadata (size, generation, updated); ObjectNotFoundError."""
        try:
            blob = self._gcs().get_blob(self._key(key), timeout=self._timeout, retry=self._retry)
        except self._errors() as error:
            raise self._fail("read", key, error) from error
        if blob is None:
            raise ObjectNotFoundError(f"{self.uri}/{key} does not exist")
        return blob

    def get(self, key: str, *, max_size: int | None = None) -> bytes:
        name = self._key(key)
        if max_size is None:
            return self._download(key, self._gcs().blob(name))
        blob = self._metadata(key)
        check_size(self.uri, key, blob.size, max_size)
        return self._download(key, blob)  # of the generation sized (the blob names it)

    def get_versioned(self, key: str, *, max_size: int) -> Versioned:
        self._answers.date = None
        blob = self._metadata(key)
        # The object resource's `updated` and the answer's Date: both GCS's clock
        # (https://cloud.google.com/storage/docs/json_api/v1/objects#resource).
        date = self._answers.date
        check_size(self.uri, key, blob.size, max_size)
        data = self._download(key, blob)
        return Versioned(data, str(blob.generation), seconds_between(blob.updated, date))

    def _download(self, key: str, blob: Any) -> bytes:
        from google.api_core.exceptions import NotFound
        from google.cloud.storage.exceptions import DataCorruption

        try:
            data: bytes = blob.download_as_bytes(timeout=self._timeout, retry=self._retry)
        except NotFound as error:
            raise ObjectNotFoundError(f"{self.uri}/{key} does not exist") from error
        except DataCorruption as error:
            raise ObjectCorruptError(
                f"{self.uri}/{key} does not match its GCS checksum: {one_line(error)}"
            ) from error
        except self._errors() as error:
            raise self._fail("read", key, error) from error
        return data

    def list(self, prefix: str = "") -> list[str]:
        check_prefix(prefix)
        bucket = self._gcs()
        root = f"{self.prefix}/" if self.prefix else ""
        try:
            blobs = self._client.list_blobs(
                bucket, prefix=root + prefix, timeout=self._timeout, retry=self._retry
            )
            return sorted(blob.name[len(root) :] for blob in blobs)
        except self._errors() as error:
            raise self._fail("list", prefix, error) from error

    def delete(self, key: str) -> None:
        from google.api_core.exceptions import NotFound

        name = self._key(key)
        try:
            self._gcs().blob(name).delete(timeout=self._timeout, retry=self._retry)
        except NotFound:
            pass
        except self._errors() as error:
            raise self._fail("delete", key, error) from error

    def put_if(self, key: str, data: bytes, version: str | None) -> str | None:
        """GCS request preconditions (https://cloud.google.com/storage/docs/
        request-preconditions): ``ifGenerationMatch=0`` writes only if no live object
        has the name, ``ifGenerationMatch=G`` only over generation G; 412 otherwise."""
        from google.api_core.exceptions import PreconditionFailed

        blob = self._gcs().blob(self._key(key))
        try:
            blob.upload_from_string(
                data,
                content_type="application/json",
                if_generation_match=0 if version is None else int(version),
                timeout=self._timeout,
                retry=self._retry,
            )
        except PreconditionFailed:
            return None
        except self._errors() as error:
            raise self._fail("write", key, error) from error
        return str(blob.generation)
