"""An EC2-style instance metadata service (IMDSv2) on loopback, one per simulated group.

The local provider's hosts announce their preemption here exactly as EC2 does, so the
demo and the end-to-end tests run the real notice watcher
(``spotring.worker_image.notices.AwsImdsWatcher``), not a shortcut. Each host has its
own prefix: ``http://127.0.0.1:PORT/<host>/latest/...``. The tests use it as the AWS
fake too.

Like IMDSv2: a session token from ``PUT latest/api/token`` (with a TTL header) is
required on every GET and expires; a GET without a valid one answers 401.
``spot/instance-action`` and ``events/recommendations/rebalance`` answer 404 until set.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

from spotring.providers.loopback_http import LoopbackHandler, LoopbackHTTPServer

TOKEN_HEADER = "X-aws-ec2-metadata-token"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"


def iso_time(epoch: float) -> str:
    """``2026-11-22T12:34:56Z``, the way EC2 writes a notice's time."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


class _Handler(LoopbackHandler):
    def _serve(self, method: str) -> None:
        imds: FakeImds = self.server.owner
        status, body = imds.answer(method, self.path, self.headers)
        imds.requests.append((method, self.path, status))
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._serve("GET")

    def do_PUT(self) -> None:
        self._serve("PUT")


class FakeImds(LoopbackHTTPServer):
    """The metadata service of a group of simulated hosts (``start()`` serves it on
    127.0.0.1, a free port, on a daemon thread; a context manager too).

    :param max_token_ttl: tokens live at most this long (seconds), whatever was asked.
    """

    handler_class = _Handler
    thread_name = "spotring-imds"
    request_timeout = 10.0
    """A client that stops reading or writing mid-request holds a thread no longer."""

    def __init__(self, *, max_token_ttl: float = 21600.0, clock: Callable[[], float] = time.time):
        self.max_token_ttl = max_token_ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._tokens: dict[str, tuple[str, float]] = {}  # token -> (host, expires)
        self._documents: dict[tuple[str, str], str] = {}  # (host, path) -> body
        self.requests: list[tuple[str, str, int]] = []
        """(method, path, status) of every request, for tests."""

    def endpoint(self, host: str) -> str:
        """The metadata base URL of ``host`` (what the watcher's ``endpoint`` is)."""
        return f"{self.url}/{host}"

    # ---------------------------------------------------------------- events

    def announce_interruption(self, host: str, deadline: float, action: str = "terminate") -> None:
        """EC2's two-minute warning for ``host``: the instance will be taken at ``deadline``."""
        body = json.dumps({"action": action, "time": iso_time(deadline)})
        self._set(host, "spot/instance-action", body)

    def recommend_rebalance(self, host: str) -> None:
        """An EC2 rebalance recommendation for ``host`` (elevated risk, no deadline)."""
        self._set(
            host,
            "events/recommendations/rebalance",
            json.dumps({"noticeTime": iso_time(self._clock())}),
        )

    def forget(self, host: str) -> None:
        """Drop ``host``'s documents (it is gone)."""
        with self._lock:
            self._documents = {k: v for k, v in self._documents.items() if k[0] != host}

    def _set(self, host: str, path: str, body: str) -> None:
        with self._lock:
            self._documents[(host, path)] = body

    # ---------------------------------------------------------------- requests

    def answer(self, method: str, path: str, headers: Any) -> tuple[int, str]:
        """(status, body) for one request."""
        host, _, rest = path.lstrip("/").partition("/")
        now = self._clock()
        with self._lock:
            if method == "PUT" and rest == "latest/api/token":
                try:
                    ttl = float(headers.get(TTL_HEADER, ""))
                except ValueError:
                    return 400, ""
                if not 1 <= ttl <= 21600:
                    return 400, ""
                token = secrets.token_urlsafe(24)
                self._tokens[token] = (host, now + min(ttl, self.max_token_ttl))
                return 200, token
            if method != "GET" or not rest.startswith("latest/meta-data/"):
                return 404, ""
            owner, expires = self._tokens.get(headers.get(TOKEN_HEADER, ""), ("", 0.0))
            if owner != host or expires <= now:
                return 401, ""
            document = rest.removeprefix("latest/meta-data/")
            if document == "autoscaling/target-lifecycle-state":
                return 200, "InService"
            body = self._documents.get((host, document))
            return (200, body) if body is not None else (404, "")
