"""The fault-injecting proxy (tests/fakes/fault_proxy.py) in front of a tiny upstream."""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from xml.etree import ElementTree

import pytest

from tests.fakes.fault_proxy import GARBAGE_VARIANTS, KINDS, Fault, FaultProxy

DOCUMENT = {
    "kind": "list",
    "items": [
        {"id": "vm-1", "address": "10.0.0.1", "state": "RUNNING"},
        {"id": "vm-2", "address": "10.0.0.2", "state": "RUNNING"},
    ],
}
XML = (
    b'<ListResponse xmlns="urn:test"><ListResult><Items>'
    b"<member><Id>vm-1</Id><State>running</State></member>"
    b"<member><Id>vm-2</Id><State>running</State></member>"
    b"</Items></ListResult><RequestId>r-1</RequestId></ListResponse>"
)
AWS_AUTH = "AWS4-HMAC-SHA256 Credential=AKID/20260101/us-east-1/{}/aws4_request, Signature=x"


class _Upstream(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Any

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def _serve(self) -> None:
        self.server.requests += 1
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        status, kind = 200, "application/json"
        if self.path.startswith("/xml"):
            data, kind = XML, "text/xml"
        elif self.path.startswith("/echo"):
            headers = {k.lower(): v for k, v in self.headers.items()}
            echo = {"method": self.command, "path": self.path, "headers": headers}
            data = json.dumps({**echo, "body": body.decode()}).encode()
        elif self.path.startswith("/missing"):
            status, data = 404, b'{"error": "no such thing"}'
        else:
            data = json.dumps(DOCUMENT).encode()
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("X-Upstream", "yes")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


@pytest.fixture(scope="module")
def upstream() -> Iterator[ThreadingHTTPServer]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Upstream)
    server.daemon_threads = True
    server.requests = 0  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def proxy(upstream: ThreadingHTTPServer) -> Iterator[FaultProxy]:
    url = f"http://127.0.0.1:{upstream.server_address[1]}"
    with FaultProxy(url, flavour="gcp", hang_seconds=5, huge_bytes=300_000, retry_after=2) as p:
        yield p


def request(
    proxy: FaultProxy,
    path: str = "/list",
    method: str = "GET",
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 5,
) -> tuple[http.client.HTTPResponse, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=timeout)
    connection.request(method, path, body=body, headers=headers or {})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    return response, data


# ----------------------------------------------------------------------- pass-through


def test_passes_requests_and_answers_through_unchanged(proxy: FaultProxy) -> None:
    response, data = request(
        proxy,
        "/echo/a%20b?x=1&y=two",
        "POST",
        b'{"hello": 1}',
        {"X-Test": "kept", "Content-Type": "application/json", "Host": "compute.example"},
    )

    echo = json.loads(data)
    assert response.status == 200 and response.getheader("X-Upstream") == "yes"
    assert (echo["method"], echo["path"], echo["body"]) == (
        "POST",
        "/echo/a%20b?x=1&y=two",
        '{"hello": 1}',
    )
    assert echo["headers"]["x-test"] == "kept" and echo["headers"]["host"] == "compute.example"
    response, data = request(proxy, "/missing")
    assert (response.status, data) == (404, b'{"error": "no such thing"}')
    assert [(e.method, e.path, e.fault) for e in proxy.log] == [
        ("POST", "/echo/a%20b?x=1&y=two", None),
        ("GET", "/missing", None),
    ]


def test_dropped_request_headers_never_reach_the_upstream(upstream: ThreadingHTTPServer) -> None:
    url = f"http://127.0.0.1:{upstream.server_address[1]}"
    with FaultProxy(url, drop_request_headers=("If-None-Match",)) as proxy:
        _, data = request(proxy, "/echo", "POST", b"x", {"if-none-match": "*", "X-Test": "kept"})
    headers = json.loads(data)["headers"]
    assert "if-none-match" not in headers and headers["x-test"] == "kept"


def test_keeps_connections_alive_both_ways(proxy: FaultProxy) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=5)
    for _ in range(3):
        connection.request("GET", "/list")
        assert json.loads(connection.getresponse().read()) == DOCUMENT
    connection.close()


# ------------------------------------------------------------------ the cloud's errors


@pytest.mark.parametrize(
    ("flavour", "headers", "status", "expected"),
    [
        (
            "aws",
            {"Authorization": AWS_AUTH.format("autoscaling")},
            400,
            b"<Type>Sender</Type><Code>Throttling</Code><Message>Rate exceeded</Message>",
        ),
        (
            "aws",
            {"Authorization": AWS_AUTH.format("ec2")},
            503,
            b"<Response><Errors><Error><Code>RequestLimitExceeded</Code>",
        ),
        ("gcp", {}, 429, b'"reason": "rateLimitExceeded"'),
        ("azure", {}, 429, b'{"error": {"code": "TooManyRequests"'),
    ],
)
def test_throttle_answers_as_each_cloud_does(
    upstream: ThreadingHTTPServer, flavour: str, headers: dict, status: int, expected: bytes
) -> None:
    url = f"http://127.0.0.1:{upstream.server_address[1]}"
    with FaultProxy(url, flavour=flavour, retry_after=3) as proxy:
        before = upstream.requests  # type: ignore[attr-defined]
        proxy.next_faults(["throttle"])
        response, data = request(proxy, "/", "POST", b"Action=DescribeThings", headers)
        assert upstream.requests == before  # type: ignore[attr-defined]
    assert response.status == status and expected in data
    assert (response.getheader("Retry-After") == "3") == (flavour == "azure")
    (entry,) = proxy.log
    assert (entry.fault, entry.action) == ("throttle", "DescribeThings")


@pytest.mark.parametrize("flavour", ["aws", "gcp", "azure"])
def test_server_error_is_a_5xx_in_the_clouds_shape(
    upstream: ThreadingHTTPServer, flavour: str
) -> None:
    url = f"http://127.0.0.1:{upstream.server_address[1]}"
    with FaultProxy(url, flavour=flavour) as proxy:
        proxy.next_faults([Fault("server_error", status=502), Fault("server_error", seed=1)])
        first, body = request(proxy)
        second, _ = request(proxy)
    assert first.status == 502 and second.status in (500, 502, 503)
    shape = {"aws": b"<ErrorResponse><Error>", "gcp": b'"backendError"', "azure": b"BadGateway"}
    assert shape[flavour] in body


# ------------------------------------------------------------------ broken connections


def test_hang_outlasts_the_client_and_ends_at_stop(upstream: ThreadingHTTPServer) -> None:
    url = f"http://127.0.0.1:{upstream.server_address[1]}"
    proxy = FaultProxy(url, hang_seconds=30).start()
    proxy.next_faults(["hang", "hang"])
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        request(proxy, timeout=0.3)
    assert 0.25 < time.monotonic() - started < 2

    patient: list[BaseException] = []
    waiting = threading.Thread(target=lambda: _record_error(patient, proxy, timeout=20))
    waiting.start()
    time.sleep(0.2)  # the second hang holds its request
    stopping = time.monotonic()
    proxy.stop()
    waiting.join(timeout=5)
    assert time.monotonic() - stopping < 1.5, "stop() left a hung request holding on"
    assert patient and isinstance(patient[0], (http.client.RemoteDisconnected, ConnectionError))
    assert [e.fault for e in proxy.log] == ["hang", "hang"]


def _record_error(errors: list[BaseException], proxy: FaultProxy, timeout: float) -> None:
    try:
        request(proxy, timeout=timeout)
    except BaseException as error:
        errors.append(error)


@pytest.mark.parametrize("variant", ["close", "reset"])
def test_drop_closes_without_an_answer(proxy: FaultProxy, variant: str) -> None:
    proxy.next_faults([Fault("drop", variant=variant)])
    with pytest.raises((http.client.RemoteDisconnected, ConnectionResetError)):
        request(proxy)
    assert request(proxy)[0].status == 200  # the next request goes through


def test_truncate_promises_more_than_it_sends(proxy: FaultProxy) -> None:
    for seed in range(5):
        proxy.next_faults([Fault("truncate", seed=seed)])
        with pytest.raises(http.client.IncompleteRead) as cut:
            request(proxy)
        assert len(cut.value.partial) < len(json.dumps(DOCUMENT))
    assert len(proxy.hits("truncate")) == 5


@pytest.mark.parametrize("variant", GARBAGE_VARIANTS)
def test_garbage_is_a_200_that_is_not_the_document(proxy: FaultProxy, variant: str) -> None:
    for seed in range(3):
        proxy.next_faults([Fault("garbage", variant=variant, seed=seed)])
        response, data = request(proxy)
        assert response.status == 200 and int(response.getheader("Content-Length")) == len(data)
        try:
            parsed = json.loads(data)
        except ValueError:
            continue
        assert not isinstance(parsed, dict), data


def test_huge_padded_is_still_the_document(proxy: FaultProxy) -> None:
    proxy.next_faults([Fault("huge", variant="padded"), Fault("huge", variant="padded")])
    response, data = request(proxy)
    assert response.status == 200 and len(data) > 300_000
    assert json.loads(data)["items"] == DOCUMENT["items"]
    _, data = request(proxy, "/xml")
    assert len(data) > 300_000
    assert [
        i.findtext("{urn:test}Id") for i in ElementTree.fromstring(data).iter("{urn:test}member")
    ] == ["vm-1", "vm-2"]


def test_huge_stream_never_ends_but_is_cut_off(proxy: FaultProxy) -> None:
    proxy.next_faults([Fault("huge", variant="stream", size=200_000)])
    with pytest.raises(http.client.IncompleteRead) as cut:
        request(proxy)
    assert len(cut.value.partial) >= 200_000
    assert proxy.hits()[0].detail == "stream cut after 200000 bytes"


# --------------------------------------------------------------------- missing fields


def test_missing_fields_by_name_keeps_list_items(proxy: FaultProxy) -> None:
    proxy.next_faults(
        [Fault("missing_fields", fields=("address",)), Fault("missing_fields", fields=("Id",))]
    )
    response, data = request(proxy)
    assert response.status == 200
    assert json.loads(data)["items"] == [
        {"id": "vm-1", "state": "RUNNING"},
        {"id": "vm-2", "state": "RUNNING"},
    ]
    _, data = request(proxy, "/xml")
    root = ElementTree.fromstring(data)
    assert root.tag == "{urn:test}ListResponse"  # the namespace survives
    members = list(root.iter("{urn:test}member"))
    assert len(members) == 2 and all(m.find("{urn:test}Id") is None for m in members)
    assert [e.detail for e in proxy.hits("missing_fields")] == ["address,address", "Id,Id"]


def test_missing_fields_at_random_deletes_some_and_no_list_items(proxy: FaultProxy) -> None:
    deleted = set()
    for seed in range(20):
        proxy.next_faults([Fault("missing_fields", seed=seed, rate=0.3)])
        document = json.loads(request(proxy)[1])
        assert document != DOCUMENT
        assert len(document.get("items", [{}, {}])) == 2
        deleted.update(proxy.hits()[-1].detail.split(","))
        proxy.next_faults([Fault("missing_fields", seed=seed, rate=0.3)])
        root = ElementTree.fromstring(request(proxy, "/xml")[1])
        assert len(list(root.iter("{urn:test}member"))) in (0, 2)  # all, or with their list
    assert {"kind", "items", "id", "address", "state"} <= deleted


# ------------------------------------------------------------------------- choosing


def test_queued_faults_wait_for_the_request_they_match(proxy: FaultProxy) -> None:
    proxy.next_faults([Fault("throttle", match=r"^GET /xml"), "server_error"])
    assert request(proxy)[0].status in (500, 502, 503)  # the first fault waits
    assert request(proxy, "/xml")[0].status == 429
    assert request(proxy)[0].status == 200 and proxy.pending == 0
    assert [e.fault for e in proxy.log] == ["server_error", "throttle", None]


def test_rate_is_seeded_and_limited_to_its_kinds(upstream: ThreadingHTTPServer) -> None:
    url = f"http://127.0.0.1:{upstream.server_address[1]}"
    runs = []
    for _ in range(2):
        with FaultProxy(url, flavour="gcp", seed=7) as proxy:
            proxy.set_rate(0.3, ["throttle", "server_error", "garbage"])
            for _ in range(60):
                request(proxy)
            runs.append([e.fault for e in proxy.log])
    assert runs[0] == runs[1]
    assert 8 <= sum(f is not None for f in runs[0]) <= 30
    assert {f for f in runs[0] if f} == {"throttle", "server_error", "garbage"}


def test_every_kind_is_known_and_unknown_ones_are_refused() -> None:
    assert len(KINDS) == 8
    with pytest.raises(ValueError, match="unknown fault kind"):
        Fault("explode")
    with pytest.raises(ValueError, match="flavour"):
        FaultProxy("http://127.0.0.1:1", flavour="ibm")


def test_runs_standalone(upstream: ThreadingHTTPServer, repo: Any) -> None:
    url = f"http://127.0.0.1:{upstream.server_address[1]}"
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    argv = ["--upstream", url, "--flavour", "azure", "--rate", "1", "--kinds", "throttle"]
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.fakes.fault_proxy", *argv, "--port", str(port)],
        cwd=repo,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        assert process.stdout.readline().strip() == f"http://127.0.0.1:{port}"
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        connection.request("GET", "/list")
        response = connection.getresponse()
        assert response.status == 429 and b"TooManyRequests" in response.read()
    finally:
        process.terminate()
        assert process.wait(timeout=10) == 0
