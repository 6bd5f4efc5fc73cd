"""A checkpoint store in Amazon S3 (boto3).

Credentials are boto3's own chain (environment, profile, instance role, ...); the
endpoint is AWS's unless ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` names another
(an emulator, an S3-compatible service): boto3 reads both itself.
"""

from __future__ import annotations

import contextlib
import io
import threading
import time
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

PART = 16 * 2**20
"""Multipart part size: large enough for few requests, small enough to retry cheaply."""
MAX_PARTS = 10_000  # S3's limit per upload
CONCURRENCY = 8
ATTEMPTS = 5
_NOT_FOUND = ("404", "NoSuchKey", "NotFound")


_loader: list[Any] = []
_loader_lock = threading.Lock()


def _shared_loader(session: Any) -> Any:
    with _loader_lock:
        if not _loader:
            from botocore.loaders import create_loader

            _loader.append(create_loader(session.get_config_variable("data_path")))
        return _loader[0]


class S3Store(ObjectStore):
    """Objects under ``s3://BUCKET/PREFIX``. Large puts are boto3 managed multipart
    uploads (an upload that fails leaves no object); large gets are ranged, in parallel."""

    unused_version = '"' + "0" * 32 + '"'  # an MD5-like ETag of nothing

    def __init__(self, location: Location, *, timeout_s: float = 60.0) -> None:
        self.uri = location.uri
        self.bucket = location.bucket
        self.prefix = location.prefix
        self.timeout_s = timeout_s
        self._client: Any = None
        self._lock = threading.Lock()

    def _s3(self) -> Any:
        with self._lock:
            if self._client is None:
                import boto3
                import botocore.session
                from botocore.config import Config

                session = botocore.session.get_session()
                # One model loader per process: loading S3's service model costs ~0.3 s.
                session.register_component("data_loader", _shared_loader(session))
                config = Config(
                    connect_timeout=min(10.0, self.timeout_s),
                    read_timeout=self.timeout_s,
                    retries={"mode": "standard", "total_max_attempts": ATTEMPTS},
                    max_pool_connections=2 * CONCURRENCY,
                    tcp_keepalive=True,
                )
                self._client = boto3.session.Session(botocore_session=session).client(
                    "s3", config=config
                )
            return self._client

    def _transfer(self, size: int) -> Any:
        from boto3.s3.transfer import TransferConfig

        part = max(PART, -(-size // MAX_PARTS))
        return TransferConfig(
            multipart_threshold=PART,
            multipart_chunksize=part,
            max_concurrency=CONCURRENCY,
            num_download_attempts=ATTEMPTS,
            use_threads=True,
        )

    def _key(self, key: str) -> str:
        check_key(key)
        return f"{self.prefix}/{key}" if self.prefix else key

    def _fail(self, action: str, key: str, error: Exception) -> CheckpointError:
        from botocore.exceptions import ClientError, NoCredentialsError

        where = f"{self.uri}/{key}" if key else self.uri
        cause = getattr(error, "last_exception", None) or error.__cause__ or error
        if isinstance(cause, NoCredentialsError):
            return CheckpointError(
                f"cannot {action} {where}: no AWS credentials found (instance role,"
                " AWS_PROFILE or AWS_ACCESS_KEY_ID)"
            )
        if isinstance(cause, ClientError):
            code = cause.response.get("Error", {}).get("Code", "")
            if code == "NoSuchBucket":
                return CheckpointError(
                    f"cannot {action} {where}: bucket {self.bucket} does not exist"
                )
            if code in ("AccessDenied", "403", "Forbidden"):
                return CheckpointError(
                    f"cannot {action} {where}: access denied (the role needs s3:GetObject,"
                    " s3:PutObject, s3:DeleteObject, s3:AbortMultipartUpload and s3:ListBucket"
                    " there)"
                )
        return CheckpointError(f"cannot {action} {where}: {one_line(error)}")

    def put(self, key: str, data: bytes | memoryview) -> None:
        from boto3.exceptions import Boto3Error
        from botocore.exceptions import BotoCoreError, ClientError

        name, reader = self._key(key), BytesReader(data)
        try:
            self._s3().upload_fileobj(reader, self.bucket, name, Config=self._transfer(len(reader)))
        except (Boto3Error, BotoCoreError, ClientError) as error:
            raise self._fail("write", key, error) from error

    def get(self, key: str, *, max_size: int | None = None) -> bytes:
        from boto3.exceptions import Boto3Error
        from botocore.exceptions import BotoCoreError, ClientError, FlexibleChecksumError

        name = self._key(key)
        if max_size is not None:
            check_size(self.uri, key, self._head(key)["ContentLength"], max_size)
        for attempt in range(1, ATTEMPTS + 1):
            out = io.BytesIO()
            try:
                self._s3().download_fileobj(self.bucket, name, out, Config=self._transfer(PART))
                return out.getvalue()
            except ClientError as error:
                raise self._read_failed(key, error) from error
            except FlexibleChecksumError as error:
                # s3transfer does not retry these: damaged on the way, or at rest.
                if attempt == ATTEMPTS:
                    raise ObjectCorruptError(
                        f"{self.uri}/{key} does not match its S3 checksum: {one_line(error)}"
                    ) from error
            except (Boto3Error, BotoCoreError) as error:
                raise self._fail("read", key, error) from error
        raise AssertionError("unreachable")

    def _read_failed(self, key: str, error: Any) -> CheckpointError:
        """A read's ClientError as ObjectNotFoundError for a missing key, else as
        :meth:`_fail` says it."""
        if error.response.get("Error", {}).get("Code") in _NOT_FOUND:
            return ObjectNotFoundError(f"{self.uri}/{key} does not exist")
        return self._fail("read", key, error)

    def _head(self, key: str) -> Any:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            return self._s3().head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as error:
            raise self._read_failed(key, error) from error
        except BotoCoreError as error:
            raise self._fail("read", key, error) from error

    def get_versioned(self, key: str, *, max_size: int) -> Versioned:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            answer = self._s3().get_object(Bucket=self.bucket, Key=self._key(key))
            body = answer["Body"]
            with contextlib.closing(body):
                # The length is known from the headers, before the body is read.
                check_size(self.uri, key, answer["ContentLength"], max_size)
                data: bytes = body.read()
        except ClientError as error:
            raise self._read_failed(key, error) from error
        except BotoCoreError as error:
            raise self._fail("read", key, error) from error
        # GetObject answers with the object's ETag and Last-Modified, and the Date of
        # the answer (https://docs.aws.amazon.com/AmazonS3/latest/API/API_GetObject.html,
        # RESTCommonResponseHeaders.html): S3's clock on both sides.
        date = answer["ResponseMetadata"].get("HTTPHeaders", {}).get("date")
        return Versioned(data, answer["ETag"], seconds_between(answer["LastModified"], date))

    def list(self, prefix: str = "") -> list[str]:
        from botocore.exceptions import BotoCoreError, ClientError

        check_prefix(prefix)
        root = f"{self.prefix}/" if self.prefix else ""
        keys: list[str] = []
        try:
            pages = self._s3().get_paginator("list_objects_v2")
            for page in pages.paginate(Bucket=self.bucket, Prefix=root + prefix):
                keys.extend(item["Key"][len(root) :] for item in page.get("Contents", ()))
        except (BotoCoreError, ClientError) as error:
            raise self._fail("list", prefix, error) from error
        return sorted(keys)

    def delete(self, key: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        name = self._key(key)
        try:
            self._s3().delete_object(Bucket=self.bucket, Key=name)
        except ClientError as error:
            if error.response.get("Error", {}).get("Code") not in _NOT_FOUND:
                raise self._fail("delete", key, error) from error
        except BotoCoreError as error:
            raise self._fail("delete", key, error) from error

    def put_if(self, key: str, data: bytes, version: str | None) -> str | None:
        """S3's conditional writes (https://docs.aws.amazon.com/AmazonS3/latest/userguide/
        conditional-writes.html): ``If-None-Match: *`` creates only a missing key,
        ``If-Match: ETAG`` replaces only that version; 412 PreconditionFailed when the
        condition fails (and 404 NoSuchKey for If-Match on a missing key), 409
        ConditionalRequestConflict while another conditional write of the key is in
        flight (S3 asks for a retry). An S3-compatible store may ignore the headers:
        :class:`~spotring.checkpoint.lock.JobLock` checks at start that it does not."""
        from botocore.exceptions import BotoCoreError, ClientError

        condition = {"IfNoneMatch": "*"} if version is None else {"IfMatch": version}
        for attempt in range(3):
            try:
                answer = self._s3().put_object(
                    Bucket=self.bucket, Key=self._key(key), Body=data, **condition
                )
                return str(answer["ETag"])
            except ClientError as error:
                code = error.response.get("Error", {}).get("Code")
                if code in ("PreconditionFailed", *_NOT_FOUND):
                    return None
                if code == "ConditionalRequestConflict" and attempt < 2:
                    time.sleep(0.2 * (attempt + 1))
                    continue
                raise self._fail("write", key, error) from error
            except BotoCoreError as error:
                raise self._fail("write", key, error) from error
        return None
