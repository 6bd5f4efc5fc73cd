"""A fault-injecting HTTP/1.1 reverse proxy, for testing cloud clients against hostile answers.

:class:`FaultProxy` listens on 127.0.0.1 (a free port) in front of any HTTP server (moto's
``ThreadedMotoServer``, tests/fakes/gcp.py, tests/fakes/azure.py) and forwards each request's
method, path, query, headers and body unchanged; by default it returns the upstream's
answer unchanged too. Faults are chosen per request, either from a queue
(:meth:`FaultProxy.next_faults`, consumed in order) or at a rate (:meth:`FaultProxy.set_rate`,
from a seeded RNG)::

    with FaultProxy(moto_url, flavour="aws") as proxy:
        provider = AwsProvider("workers", endpoint_url=proxy.url, ...)
        proxy.next_faults(["throttle", Fault("missing_fields", fields=("privateIpAddress",))])
        ...
        assert [entry.fault for entry in proxy.hits()] == ["throttle", "missing_fields"]

Fault kinds (:data:`KINDS`). The first four answer in the upstream's place, so the request
never reaches it; the other four mangle the upstream's real answer:

``throttle``
    The cloud's own throttling answer (``flavour``): AWS ``Throttling`` (400, query XML;
    EC2's ``RequestLimitExceeded`` 503 for EC2 calls), GCP 429 ``rateLimitExceeded``,
    Azure 429 ``TooManyRequests`` with ``Retry-After``.
``server_error``
    500, 502 or 503 in the cloud's own error body shape.
``hang``
    Holds the request ``seconds`` (default ``hang_seconds``) without answering, then
    closes the connection; :meth:`FaultProxy.stop` ends every hang at once.
``drop``
    Closes the connection without an answer (variant ``reset``: with a TCP reset).
``truncate``
    The upstream's headers with the original Content-Length, part of the body, then close.
``garbage``
    Status 200, correct Content-Length, the body replaced by random bytes, random text,
    an HTML page, nothing, or JSON of the wrong type (``null``, ``[]``, a string, a number).
``huge``
    Status 200 and a very large answer (``size`` bytes, default ``huge_bytes``): the real
    document with that much padding inside it, still valid (variant ``padded``), or an
    endless chunked stream cut off after ``size`` bytes (variant ``stream``).
``missing_fields``
    Status 200 and the upstream's JSON or XML with fields deleted: every field named in
    ``fields`` wherever it occurs, or else a random subset (each field with probability
    ``rate``, at least one). Only fields (object keys, XML elements) are deleted, never an
    item of a list: a list one item shorter is a different, valid answer, not a broken one.
    An answer that is neither JSON nor XML passes through unchanged.

Request faults (:data:`REQUEST_KINDS`, only when asked for by name: not in :data:`KINDS`,
so a rate over the default kinds never draws them) break what the client sends instead:

``cut_request``
    Sends the upstream the request's headers (with the full Content-Length) and only part
    of its body, then closes both connections without an answer: a client that died or
    lost its network mid-upload, as the upstream sees it.
``corrupt_request``
    Flips one bit of the request body (at a random offset) and forwards it: the upstream
    gets data damaged in transit, and its answer comes back unchanged.

Every request is logged (:attr:`FaultProxy.log`: method, path, fault, AWS action, detail),
so tests can assert that the faults they asked for hit the calls they meant.

``drop_request_headers`` makes the upstream an endpoint that ignores those headers: they
never reach it (an S3-compatible store without conditional writes: ``If-None-Match``;
moto does not check request signatures, so the signed header may go).

Limitations: answers that carry absolute links to the upstream (Azure's ``nextLink``,
long-running operation URLs) lead the client past the proxy; a fault that answers in the
upstream's place never reaches it, so a mutating call it hits is not carried out.

Standalone (prints its URL on the first line of stdout, serves until killed)::

    python -m tests.fakes.fault_proxy --upstream http://127.0.0.1:5000 --flavour aws --rate 0.3 \\
        --kinds throttle,server_error,hang,drop --hang-seconds 25 --port 0
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import http.client
import json
import random
import re
import signal
import socket
import string
import struct
import sys
import threading
import uuid
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple
from urllib.parse import parse_qs, urlsplit
from xml.etree import ElementTree

from spotring.providers.loopback_http import LoopbackHTTPServer
from tests.fakes.server import KeepAliveHandler

KINDS: tuple[str, ...] = (
    "throttle",
    "server_error",
    "hang",
    "drop",
    "truncate",
    "garbage",
    "huge",
    "missing_fields",
)
"""Every fault kind that answers or mangles an answer, in the order of the module docstring."""

REQUEST_KINDS: tuple[str, ...] = ("cut_request", "corrupt_request")
"""Faults of what the client sends; never drawn unless named (see the module docstring)."""

FLAVOURS = ("aws", "gcp", "azure")

GARBAGE_VARIANTS = ("bytes", "text", "html", "empty", "json")
HUGE_VARIANTS = ("padded", "stream")
DROP_VARIANTS = ("close", "reset")

# Not forwarded in either direction (RFC 9110 section 7.6.1), plus the length and
# framing the proxy sets itself.
_HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
    }
)
_AWS_SERVICE = re.compile(r"Credential=[^/]+/[^/]+/[^/]+/([^/]+)/")
_CHUNK = 64 * 1024


@dataclass(frozen=True)
class Fault:
    """One fault for one request. Fields a kind does not use are ignored; None: drawn
    from the proxy's RNG (or its defaults) when the fault is applied."""

    kind: str
    status: int | None = None
    """``server_error``: 500, 502 or 503."""
    seconds: float | None = None
    """``hang``: how long to hold the request (default: the proxy's ``hang_seconds``)."""
    variant: str | None = None
    """``garbage``: one of :data:`GARBAGE_VARIANTS`; ``huge``: :data:`HUGE_VARIANTS`;
    ``drop``: :data:`DROP_VARIANTS`."""
    size: int | None = None
    """``huge``: bytes of padding (default: the proxy's ``huge_bytes``)."""
    fields: tuple[str, ...] = ()
    """``missing_fields``: names (JSON keys, XML element names) to delete everywhere."""
    rate: float = 0.2
    """``missing_fields`` without ``fields``: the chance each field is deleted."""
    seed: int | None = None
    """Seeds this fault's own randomness (garbage bytes, the cut, the fields deleted)."""
    match: str | None = None
    """Only for a request whose ``METHOD path?query`` this regular expression finds, or
    whose AWS action it is (e.g. ``"DescribeInstances"``, ``"listManagedInstances"``)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS + REQUEST_KINDS:
            raise ValueError(
                f"unknown fault kind {self.kind!r}; expected one of {KINDS + REQUEST_KINDS}"
            )

    def matches(self, request: str, action: str) -> bool:
        return _matches(self.match, request, action)


def _matches(match: str | None, request: str, action: str) -> bool:
    """Whether ``match`` (None: anything) is found in ``METHOD path?query`` or is the action."""
    return match is None or match == action or re.search(match, request) is not None


class Entry(NamedTuple):
    """One request the proxy saw."""

    method: str
    path: str
    """Path and query, as the client sent them."""
    fault: str | None
    """The fault kind applied, or None when it was passed through."""
    action: str = ""
    """The AWS API action (``Action=`` of a query or EC2 call), "" for other clouds."""
    detail: str = ""
    """What the fault did, e.g. the fields deleted or the bytes sent."""


class FaultProxy(LoopbackHTTPServer):
    """A threaded reverse proxy on 127.0.0.1 that injects faults; see the module docstring.

    :param upstream: the server's base URL, ``http://host:port``.
    :param flavour: whose error answers to imitate: ``aws``, ``gcp`` or ``azure``.
    :param seed: seeds the RNG that draws faults at a rate and their details (None: random).
    :param hang_seconds: how long ``hang`` holds a request by default: longer than the
        client's read timeout (the providers use 20 s).
    :param huge_bytes: how large a ``huge`` answer is by default.
    :param retry_after: the Retry-After (seconds) of Azure's throttling answer.
    :param upstream_timeout: seconds to wait for the upstream.
    :param port: where to listen (0: a free port).
    :param drop_request_headers: request headers never forwarded (any case).
    """

    thread_name = "fault-proxy"

    def __init__(
        self,
        upstream: str,
        *,
        flavour: str = "aws",
        seed: int | None = 0,
        hang_seconds: float = 30.0,
        huge_bytes: int = 20 * 2**20,
        retry_after: float = 1,
        upstream_timeout: float = 60.0,
        port: int = 0,
        drop_request_headers: Sequence[str] = (),
    ) -> None:
        parts = urlsplit(upstream)
        if parts.scheme != "http" or not parts.hostname:
            raise ValueError(f"upstream must be an http://host:port URL, got {upstream!r}")
        if flavour not in FLAVOURS:
            raise ValueError(f"flavour must be one of {FLAVOURS}, got {flavour!r}")
        self.upstream = upstream.rstrip("/")
        self.flavour = flavour
        self.hang_seconds = hang_seconds
        self.huge_bytes = huge_bytes
        self.retry_after = retry_after
        self.upstream_timeout = upstream_timeout
        self.dropped_headers = _HOP_BY_HOP | {name.lower() for name in drop_request_headers}
        """Request headers the upstream never gets."""
        self._upstream_address = (parts.hostname, parts.port or 80)
        self._port = port
        self._lock = threading.Lock()
        self._rng = random.Random(seed)
        self._queue: list[Fault] = []
        self._rate = 0.0
        self._rate_kinds: tuple[str, ...] = KINDS
        self._rate_match: str | None = None
        self._log: list[Entry] = []
        self._stopping = threading.Event()

    # ------------------------------------------------------------------ lifecycle

    def start(self, port: int | None = None) -> FaultProxy:
        """Serve on 127.0.0.1:``port`` (default: the one given to the constructor) on a
        daemon thread; returns self. ``url`` is what the client gets instead of the
        upstream's."""
        self._stopping.clear()
        return super().start(self._port if port is None else port)

    def stop(self) -> None:
        """Stop serving; requests held by ``hang`` end at once."""
        self._stopping.set()
        super().stop()

    # ------------------------------------------------------------------ faults

    def next_faults(self, faults: Iterable[str | Fault]) -> None:
        """Apply ``faults`` (kinds or :class:`Fault`) to the next requests, one each, in
        order; a fault with ``match`` waits for a request it matches. Replaces whatever
        was still queued; ``next_faults([])`` empties the queue."""
        queue = [f if isinstance(f, Fault) else Fault(f) for f in faults]
        with self._lock:
            self._queue = queue

    def set_rate(
        self, rate: float, kinds: Sequence[str] | None = None, *, match: str | None = None
    ) -> None:
        """Fault each request (that ``match`` matches) with probability ``rate``, the kind
        drawn evenly from ``kinds`` (default: all). Queued faults go first."""
        if not 0 <= rate <= 1:
            raise ValueError(f"rate must be within 0..1, got {rate}")
        kinds = tuple(kinds) if kinds is not None else KINDS
        for kind in kinds:
            Fault(kind)  # validates
        with self._lock:
            self._rate, self._rate_kinds, self._rate_match = rate, kinds, match

    def clear(self) -> None:
        """No more faults: empty the queue and set the rate to 0 (the log stays)."""
        with self._lock:
            self._queue = []
            self._rate = 0.0

    @property
    def pending(self) -> int:
        """Queued faults not applied yet."""
        with self._lock:
            return len(self._queue)

    @property
    def log(self) -> list[Entry]:
        """Every request so far, oldest first (a copy)."""
        with self._lock:
            return list(self._log)

    def hits(self, kind: str | None = None) -> list[Entry]:
        """Logged requests that got a fault (of ``kind``, if given)."""
        return [e for e in self.log if e.fault is not None and (kind is None or e.fault == kind)]

    def clear_log(self) -> None:
        with self._lock:
            self._log = []

    def _take_fault(self, request: str, action: str) -> tuple[Fault | None, random.Random]:
        """The fault for a request and an RNG for its details (under the lock)."""
        with self._lock:
            for index, fault in enumerate(self._queue):
                if fault.matches(request, action):
                    del self._queue[index]
                    break
            else:
                fault = None
                matched = _matches(self._rate_match, request, action)
                if self._rate and matched and self._rng.random() < self._rate:
                    fault = Fault(self._rng.choice(self._rate_kinds))
            seed = fault.seed if fault is not None and fault.seed is not None else None
            rng = random.Random(seed if seed is not None else self._rng.getrandbits(64))
            return fault, rng

    def _record(self, entry: Entry) -> None:
        with self._lock:
            self._log.append(entry)

    # --------------------------------------------------------- the cloud's errors

    def error_answer(
        self, kind: str, status: int | None, headers: Any, rng: random.Random
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        """Status, headers and body of a ``throttle`` or ``server_error`` answer."""
        request_id = str(uuid.UUID(int=rng.getrandbits(128)))
        if kind == "server_error":
            status = status or rng.choice((500, 502, 503))
        if self.flavour == "aws":
            return _aws_error(kind, status, _aws_service(headers), request_id)
        if self.flavour == "gcp":
            if kind == "throttle":
                status, reason, state = 429, "rateLimitExceeded", "RESOURCE_EXHAUSTED"
                message = (
                    "Quota exceeded for quota metric 'Read requests' and limit 'Read requests"
                    " per minute' of service 'compute.googleapis.com'."
                )
            else:
                assert status is not None
                reason = "backendError"
                state = "INTERNAL" if status == 500 else "UNAVAILABLE"
                message = "Internal error. Please try again or contact Google Support."
            error = {
                "code": status,
                "message": message,
                "errors": [{"message": message, "domain": "global", "reason": reason}],
                "status": state,
            }
            body = json.dumps({"error": error}).encode()
            return status, [("Content-Type", "application/json; charset=UTF-8")], body
        extra: list[tuple[str, str]] = [("x-ms-request-id", request_id)]
        if kind == "throttle":
            status, code = 429, "TooManyRequests"
            message = (
                "The request is being throttled as the limit has been reached for operation"
                " type - Read_ObservationWindow_00:05:00."
            )
            extra += [
                ("Retry-After", f"{self.retry_after:g}"),
                ("x-ms-ratelimit-remaining-subscription-reads", "0"),
            ]
        else:
            assert status is not None
            code = {500: "InternalServerError", 502: "BadGateway"}.get(status, "ServiceUnavailable")
            message = "The server encountered an internal error. Please retry the request."
        body = json.dumps({"error": {"code": code, "message": message}}).encode()
        return status, [("Content-Type", "application/json; charset=utf-8"), *extra], body


def _aws_service(headers: Any) -> str:
    """The signing service of an AWS request (``ec2``, ``autoscaling``), "" if unsigned."""
    found = _AWS_SERVICE.search(headers.get("Authorization") or "")
    return found.group(1) if found else ""


def _aws_error(
    kind: str, status: int | None, service: str, request_id: str
) -> tuple[int, list[tuple[str, str]], bytes]:
    if service == "s3":  # S3's REST-XML errors: <Error> at the root
        if kind == "throttle":
            status, code, message = 503, "SlowDown", "Please reduce your request rate."
        else:
            code = "InternalError" if status == 500 else "ServiceUnavailable"
            message = "We encountered an internal error. Please try again."
        body = (
            f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code>"
            f"<Message>{message}</Message><RequestId>{request_id}</RequestId></Error>"
        )
    elif service == "ec2":  # EC2's own protocol: <Response><Errors>
        if kind == "throttle":
            status, code, message = 503, "RequestLimitExceeded", "Request limit exceeded."
        else:
            code = "InternalError" if status == 500 else "Unavailable"
            message = "An internal error has occurred" if status == 500 else "Unavailable"
        body = (
            f"<?xml version='1.0' encoding='UTF-8'?><Response><Errors><Error><Code>{code}</Code>"
            f"<Message>{message}</Message></Error></Errors><RequestID>{request_id}</RequestID>"
            "</Response>"
        )
    else:  # the query protocol (Auto Scaling, and most others)
        if kind == "throttle":
            status, kind_of, code, message = 400, "Sender", "Throttling", "Rate exceeded"
        else:
            kind_of = "Receiver"
            code = "InternalFailure" if status == 500 else "ServiceUnavailable"
            message = "Service is unavailable, please try again later"
        body = (
            f"<ErrorResponse><Error><Type>{kind_of}</Type><Code>{code}</Code>"
            f"<Message>{message}</Message></Error><RequestId>{request_id}</RequestId>"
            "</ErrorResponse>"
        )
    assert status is not None
    return status, [("Content-Type", "text/xml")], body.encode()


# ------------------------------------------------------------------ mangled answers


def _decoded(headers: list[tuple[str, str]], body: bytes) -> tuple[list[tuple[str, str]], bytes]:
    """The body without its Content-Encoding (gzip, deflate), to read and rewrite it."""
    encoding = next((v for k, v in headers if k.lower() == "content-encoding"), "").lower()
    if encoding not in ("gzip", "deflate"):
        return headers, body
    try:
        body = gzip.decompress(body) if encoding == "gzip" else zlib.decompress(body)
    except (OSError, zlib.error):
        return headers, body
    return [(k, v) for k, v in headers if k.lower() != "content-encoding"], body


def _garbage(variant: str, rng: random.Random) -> bytes:
    if variant == "bytes":
        return rng.randbytes(rng.randint(1, 4096))
    if variant == "text":
        return "".join(rng.choices(string.printable, k=rng.randint(1, 2048))).encode()
    if variant == "html":
        return b"<html><head><title>502 Bad Gateway</title></head><body>nginx</body></html>\n"
    if variant == "empty":
        return b""
    return rng.choice([b"null", b"[]", b'"ok"', b"42", b"true", b"[{}]"])


def _padded(body: bytes, size: int) -> bytes:
    """``body`` with ``size`` bytes of padding inside the document, still well formed."""
    stripped = body.rstrip()
    if stripped.endswith(b"}"):  # a JSON object: one more (unknown) member
        inner = stripped[:-1].rstrip()
        comma = b"" if inner.endswith(b"{") else b","
        return inner + comma + b'"padding":"' + b"x" * size + b'"}'
    if stripped.endswith(b">"):  # XML: an unknown element as the root's last child
        close = stripped.rfind(b"</")
        if close > 0:
            return stripped[:close] + b"<Padding>" + b"x" * size + b"</Padding>" + stripped[close:]
    return body + b" " * size  # JSON arrays and scalars allow trailing whitespace


def _delete_fields(body: bytes, fault: Fault, rng: random.Random) -> tuple[bytes, list[str]] | None:
    """``body`` (JSON or XML) with fields deleted, and their names; None if unreadable."""
    text = body.lstrip()
    if text[:1] in (b"{", b"["):
        try:
            document = json.loads(body)
        except ValueError:
            return None
        deleted = _delete_json(document, fault, rng)
        return json.dumps(document).encode(), deleted
    if text[:1] == b"<":
        try:
            root = ElementTree.fromstring(body)
        except ElementTree.ParseError:
            return None
        deleted = _delete_xml(root, fault, rng)
        return ElementTree.tostring(root, encoding="utf-8", xml_declaration=True), deleted
    return None


def _delete_json(document: Any, fault: Fault, rng: random.Random) -> list[str]:
    fields: list[tuple[dict[str, Any], str]] = []  # (object, key), outermost first

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                fields.append((node, key))
                walk(value)
        elif isinstance(node, list):
            for item in node:
                walk(item)

    walk(document)
    if fault.fields:
        chosen = [(obj, key) for obj, key in fields if key in fault.fields]
    else:
        chosen = [f for f in fields if rng.random() < fault.rate] or (
            [rng.choice(fields)] if fields else []
        )
    for obj, key in chosen:
        obj.pop(key, None)  # an outer field may have taken this one with it
    return [key for _, key in chosen]


def _delete_xml(root: ElementTree.Element, fault: Fault, rng: random.Random) -> list[str]:
    namespace = ""
    for element in root.iter():  # local names, one default namespace on the root
        if element.tag.startswith("{"):
            uri, element.tag = element.tag[1:].split("}", 1)
            namespace = namespace or uri
    if namespace:
        root.set("xmlns", namespace)
    fields: list[tuple[ElementTree.Element, ElementTree.Element]] = []  # (parent, child)
    for parent in root.iter():
        for child in parent:
            # AWS lists are <member> (query) or <item> (EC2) elements: list items, kept.
            if child.tag not in ("member", "item"):
                fields.append((parent, child))
    if fault.fields:
        chosen = [(p, c) for p, c in fields if c.tag in fault.fields]
    else:
        chosen = [f for f in fields if rng.random() < fault.rate] or (
            [rng.choice(fields)] if fields else []
        )
    for parent, child in chosen:
        with contextlib.suppress(ValueError):  # already gone with an outer field
            parent.remove(child)
    return [child.tag for _, child in chosen]


# ---------------------------------------------------------------------- handler


class _Handler(KeepAliveHandler):
    _upstream: http.client.HTTPConnection | None = None

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        if self._upstream is not None:
            self._upstream.close()

    def handle_one_request(self) -> None:
        with contextlib.suppress(ConnectionError, TimeoutError):  # the client gave up
            super().handle_one_request()

    def do_GET(self) -> None:
        self._serve()

    def do_HEAD(self) -> None:
        self._serve()

    def do_POST(self) -> None:
        self._serve()

    def do_PUT(self) -> None:
        self._serve()

    def do_PATCH(self) -> None:
        self._serve()

    def do_DELETE(self) -> None:
        self._serve()

    # ------------------------------------------------------------------ serving

    def _serve(self) -> None:
        proxy: FaultProxy = self.server.owner
        body = self._read_body()
        action = self._aws_action(body)
        fault, rng = proxy._take_fault(f"{self.command} {self.path}", action)
        self._entry: Entry | None = Entry(self.command, self.path, fault and fault.kind, action)
        try:
            if fault is None:
                self._answer(*self._forward(body))
            elif fault.kind in ("throttle", "server_error"):
                status, headers, data = proxy.error_answer(
                    fault.kind, fault.status, self.headers, rng
                )
                self._note(str(status))
                self._answer(status, http.client.responses.get(status, ""), headers, data)
            elif fault.kind == "hang":
                seconds = fault.seconds if fault.seconds is not None else proxy.hang_seconds
                self._note(f"{seconds:g}s")
                proxy._stopping.wait(seconds)
                self._close()
            elif fault.kind == "drop":
                variant = fault.variant or rng.choice(DROP_VARIANTS)
                self._note(variant)
                self._close(reset=variant == "reset")
            elif fault.kind == "cut_request":
                data = body or b""
                cut = rng.randrange(len(data)) if data else 0
                self._note(f"{cut} of {len(data)} bytes sent upstream")
                self._forward_cut(data, cut)
                self._close()
            elif fault.kind == "corrupt_request":
                data = bytearray(body or b"")
                if data:
                    at = rng.randrange(len(data))
                    data[at] ^= 1 << rng.randrange(8)
                    self._note(f"flipped a bit of byte {at} of {len(data)}")
                self._answer(*self._forward(bytes(data) if body is not None else None))
            else:
                self._mangle(fault, rng, body)
        finally:
            self._note()

    def _note(self, detail: str = "") -> None:
        """Log this request, once, before its answer's first byte: a test reads the log as
        soon as it has the answer."""
        if self._entry is not None:
            self.server.owner._record(self._entry._replace(detail=detail))
            self._entry = None

    def _mangle(self, fault: Fault, rng: random.Random, body: bytes | None) -> None:
        """Forward, then answer with the upstream's answer broken as ``fault`` says."""
        proxy: FaultProxy = self.server.owner
        status, reason, headers, data = self._forward(body)
        if fault.kind == "truncate":
            cut = rng.randrange(len(data)) if data else 0
            self._note(f"{cut} of {len(data)} bytes")
            self._send_head(status, reason, headers, max(1, len(data)))
            self.wfile.write(data[:cut])
            self._close()
            return
        if fault.kind == "garbage":
            variant = fault.variant or rng.choice(GARBAGE_VARIANTS)
            self._note(variant)
            self._answer(200, "OK", headers, _garbage(variant, rng))
            return
        headers, data = _decoded(headers, data)
        if fault.kind == "missing_fields":
            mangled = _delete_fields(data, fault, rng)
            if mangled is None:
                self._note("unreadable: passed through")
                self._answer(status, reason, headers, data)
                return
            data, deleted = mangled
            self._note(",".join(deleted))
            self._answer(200, "OK", headers, data)
            return
        size = fault.size if fault.size is not None else proxy.huge_bytes
        variant = fault.variant or rng.choice(HUGE_VARIANTS)
        if variant == "padded":
            self._note(f"padded {size} bytes")
            self._answer(200, "OK", headers, _padded(data, size))
            return
        # stream: chunked, the document's start, then padding that never ends
        self._note(f"stream cut after {size} bytes")
        self.send_response_only(200, "OK")
        for name, value in headers:
            self.send_header(name, value)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        start = data[: len(data) // 2]
        sent = 0
        with contextlib.suppress(OSError):  # the client may stop reading
            self.wfile.write(b"%x\r\n%s\r\n" % (len(start), start) if start else b"")
            while sent < size:
                chunk = b"x" * min(_CHUNK, size - sent)
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
        self._close()

    # ------------------------------------------------------------------ plumbing

    def _read_body(self) -> bytes | None:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline().strip():  # trailers
                        pass
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else None

    def _aws_action(self, body: bytes | None) -> str:
        query = parse_qs(urlsplit(self.path).query)
        if "Action" not in query and body and b"Action=" in body:
            query = parse_qs(body.decode("latin-1"))
        return query.get("Action", [""])[0]

    def _forward(self, body: bytes | None) -> tuple[int, str, list[tuple[str, str]], bytes]:
        """The upstream's answer to this request: status, reason, headers, body."""
        proxy: FaultProxy = self.server.owner
        headers = {}
        for name, value in self.headers.items():
            if name.lower() not in proxy.dropped_headers:
                headers[name] = value  # http.client keeps the client's Host as given
        if body is not None:
            headers["Content-Length"] = str(len(body))
        for attempt in (1, 2):
            reused = self._upstream is not None
            if self._upstream is None:
                self._upstream = http.client.HTTPConnection(
                    *proxy._upstream_address, timeout=proxy.upstream_timeout
                )
            try:
                self._upstream.request(self.command, self.path, body=body, headers=headers)
                response = self._upstream.getresponse()
                data = response.read()
            except (OSError, http.client.HTTPException) as error:
                self._upstream.close()
                self._upstream = None
                stale = isinstance(error, (http.client.RemoteDisconnected, ConnectionResetError))
                if reused and stale and attempt == 1:
                    continue  # a kept-alive connection the upstream had closed
                message = f"fault proxy: upstream {proxy.upstream} failed: {error!r}\n"
                return 502, "Bad Gateway", [("Content-Type", "text/plain")], message.encode()
            if response.will_close:
                self._upstream.close()
                self._upstream = None
            kept = [
                (k, v)
                for k, v in response.getheaders()
                if k.lower() not in _HOP_BY_HOP
                # A HEAD's answer has no body: its length is the object's.
                or (self.command == "HEAD" and k.lower() == "content-length")
            ]
            return response.status, response.reason, kept, data
        raise AssertionError("unreachable")

    def _forward_cut(self, body: bytes, cut: int) -> None:
        """Send the upstream this request with only ``body[:cut]``, then hang up."""
        proxy: FaultProxy = self.server.owner
        connection = http.client.HTTPConnection(
            *proxy._upstream_address, timeout=proxy.upstream_timeout
        )
        try:
            connection.putrequest(
                self.command, self.path, skip_host=True, skip_accept_encoding=True
            )
            for name, value in self.headers.items():
                if name.lower() not in proxy.dropped_headers:
                    connection.putheader(name, value)
            connection.putheader("Content-Length", str(len(body)))
            connection.endheaders()
            connection.send(body[:cut])
        except (OSError, http.client.HTTPException):
            pass  # the upstream gave up first: it got no more than the cut either
        finally:
            connection.close()

    def _send_head(
        self, status: int, reason: str, headers: Sequence[tuple[str, str]], length: int
    ) -> None:
        self._note()
        self.send_response_only(status, reason)
        for name, value in headers:
            if name.lower() not in _HOP_BY_HOP:
                self.send_header(name, value)
        self.send_header("Content-Length", str(length))
        self.end_headers()

    def _answer(
        self, status: int, reason: str, headers: Sequence[tuple[str, str]], data: bytes
    ) -> None:
        if self.command == "HEAD":
            length = next((v for k, v in headers if k.lower() == "content-length"), "0")
            self._send_head(status, reason, headers, int(length))
            return
        self._send_head(status, reason, headers, len(data))
        self.wfile.write(data)

    def _close(self, reset: bool = False) -> None:
        """End the connection now, with a FIN (or a RST), whatever was sent."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.wfile.flush()
            if reset:
                self.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
                self.connection.close()
            else:
                self.connection.shutdown(socket.SHUT_RDWR)


FaultProxy.handler_class = _Handler


# ------------------------------------------------------------------------ main


def main(argv: Sequence[str] | None = None) -> int:
    """Run a proxy until SIGTERM or SIGINT; print its URL on the first line of stdout."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.fakes.fault_proxy", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--upstream", required=True, metavar="URL", help="http://host:port")
    parser.add_argument("--flavour", choices=FLAVOURS, default="aws")
    parser.add_argument("--rate", type=float, default=0.0, help="chance a request is faulted")
    parser.add_argument(
        "--kinds",
        default=",".join(KINDS),
        help="comma-separated fault kinds drawn at --rate (default: all)",
    )
    parser.add_argument(
        "--match", metavar="REGEX", help="fault only requests whose path or AWS action has this"
    )
    parser.add_argument("--port", type=int, default=0, help="where to listen (default: free)")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--hang-seconds", type=float, default=30.0)
    parser.add_argument("--huge-bytes", type=int, default=20 * 2**20)
    parser.add_argument("--retry-after", type=float, default=1.0)
    parser.add_argument("--log", metavar="FILE", help="append one JSON line per request here")
    options = parser.parse_args(argv)
    kinds = [k.strip() for k in options.kinds.split(",") if k.strip()]
    try:
        proxy = FaultProxy(
            options.upstream,
            flavour=options.flavour,
            seed=options.seed,
            hang_seconds=options.hang_seconds,
            huge_bytes=options.huge_bytes,
            retry_after=options.retry_after,
            port=options.port,
        )
        proxy.set_rate(options.rate, kinds, match=options.match)
    except ValueError as error:
        parser.error(str(error))
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    with proxy:
        print(proxy.url, flush=True)
        written = 0
        while not stop.wait(0.2):
            if options.log:
                written = _append_log(options.log, proxy, written)
        if options.log:
            _append_log(options.log, proxy, written)
    return 0


def _append_log(path: str, proxy: FaultProxy, written: int) -> int:
    entries = proxy.log
    if len(entries) > written:
        with open(path, "a", encoding="utf-8") as out:
            for entry in entries[written:]:
                out.write(json.dumps(entry._asdict()) + "\n")
    return len(entries)


__all__ = ["FLAVOURS", "KINDS", "REQUEST_KINDS", "Entry", "Fault", "FaultProxy", "main"]

if __name__ == "__main__":
    sys.exit(main())
