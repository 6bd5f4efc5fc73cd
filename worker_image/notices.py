"""Host side of interruption notices: hear that this host will be taken, tell the driver.

Spot capacity is announced before it is reclaimed: AWS about 2 minutes ahead (and an
earlier rebalance recommendation), GCP about 30 s, Azure at least 30 s. A watcher polls
its cloud's metadata service from the worker's supervisor, on the host itself, so the
user's training script needs no change. What it hears goes to the driver as a
:class:`NoticeMessage` line on the supervisor's stdout: the pipe (or ssh channel) the
driver already reads the worker's output from. No port is opened for it. The line is
signed with the job key and bound to the one worker launch it comes from, so the
training script sharing that output cannot forge one the driver accepts, and a copy
cannot be replayed into another launch.

Built-in watchers: ``aws`` (IMDSv2: ``spot/instance-action``,
``events/recommendations/rebalance``, ``autoscaling/target-lifecycle-state``), ``gcp``
(metadata server: ``instance/preempted`` as a hanging GET, ``instance/maintenance-event``)
and ``azure`` (Scheduled Events ``Preempt`` / ``Terminate``, acknowledged once the host
has left the ring). A provider plugin names its watcher in
``Provider.notice_watcher()``: a built-in name or ``"package.module:Class"`` of its own
(a class taking the options as keyword arguments, with :meth:`Watcher.poll`).
"""

from __future__ import annotations

import calendar
import contextlib
import email.utils
import importlib
import json
import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from spotring.worker_image.signed_lines import SignedLine, is_int
from spotring.worker_image.wire import NOTICE_MARKER

log = logging.getLogger(__name__)

PREEMPT = "preempt"
"""The host will be taken at ``deadline``: spot reclaim, eviction."""
TERMINATE = "terminate"
"""The group will terminate the host (scale-in, maintenance): leave now."""
REBALANCE = "rebalance"
"""Elevated risk of a reclaim, no deadline: start a replacement, keep training."""
KINDS = frozenset({PREEMPT, TERMINATE, REBALANCE})

MESSAGE_MARKER = NOTICE_MARKER
MAX_MESSAGE_BYTES = 2048
"""Longer lines with the marker are rejected unread."""

REQUEST_TIMEOUT = 2.0


@dataclass(frozen=True)
class Notice:
    """What a watcher heard."""

    kind: str
    deadline: float | None = None
    """When the host will be taken (epoch seconds); None when the cloud gave none."""
    detail: str = ""
    """The cloud's own words: the action, event id or event type."""

    def lead(self, now: float | None = None) -> float | None:
        """Seconds left before the deadline (None without one)."""
        if self.deadline is None:
            return None
        return self.deadline - (time.time() if now is None else now)


# ------------------------------------------------------------------ the message


@dataclass(frozen=True)
class NoticeMessage(SignedLine):
    """A notice on its way from a worker's supervisor to the driver: a signed line
    (:mod:`spotring.worker_image.signed_lines`).

    ``launch`` is the random id the driver gave that one worker launch; ``sequence``
    increases with every message of the launch. The MAC (HMAC-SHA256 under the job
    key) covers everything else.
    """

    MARKER = MESSAGE_MARKER
    MAX_BYTES = MAX_MESSAGE_BYTES

    launch: str
    sequence: int
    notice: Notice
    mac: str = ""

    def fields(self) -> dict[str, Any]:
        notice = self.notice
        return {"kind": notice.kind, "deadline": notice.deadline, "detail": notice.detail}

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> NoticeMessage:
        launch, sequence, kind = body.get("launch"), body.get("seq"), body.get("kind")
        deadline, detail, mac = body.get("deadline"), body.get("detail", ""), body.get("mac")
        if not (isinstance(launch, str) and isinstance(mac, str) and isinstance(detail, str)):
            raise ValueError("missing launch, detail or mac")
        if not is_int(sequence) or sequence < 1:
            raise ValueError("bad sequence number")
        if not isinstance(kind, str) or kind not in KINDS:
            raise ValueError(f"unknown kind {kind!r}"[:80])
        if deadline is not None and not isinstance(deadline, (int, float)):
            raise ValueError("bad deadline")
        return cls(launch, sequence, Notice(kind, deadline, detail[:200]), mac)


# ------------------------------------------------------------------ watchers


class Watcher(Protocol):
    """Polls one cloud's metadata service for a notice about this host."""

    interval: float
    """Seconds between polls (a hanging GET may use them to wait)."""

    def poll(self) -> Notice | None:
        """One check: the notice in force now, or None. Raises OSError when the
        metadata service cannot be reached."""
        ...


def _request(
    url: str,
    *,
    method: str = "GET",
    headers: Mapping[str, str] = {},
    data: bytes | None = None,
    timeout: float = REQUEST_TIMEOUT,
) -> tuple[int, str]:
    """(status, body) of one HTTP request; 4xx/5xx are answers, not errors."""
    request = urllib.request.Request(url, data=data, method=method, headers=dict(headers))
    # No proxy: a metadata service is link-local, and a proxy would see the tokens.
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout) as response:
            return response.status, response.read(65536).decode(errors="replace")
    except urllib.error.HTTPError as error:
        return error.code, error.read(65536).decode(errors="replace")


class AwsImdsWatcher:
    """EC2 instance metadata (IMDSv2), every ``interval`` seconds.

    ``spot/instance-action`` (a spot reclaim, 2 minutes ahead), then
    ``autoscaling/target-lifecycle-state`` (``Terminated``: the group scales this host
    in), then ``events/recommendations/rebalance`` (elevated risk). The session token
    is fetched once and again when the service answers 401.
    """

    TOKEN_TTL_SECONDS = 21600

    def __init__(self, endpoint: str = "http://169.254.169.254", interval: float = 1.0) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.interval = interval
        self._token: str | None = None

    def poll(self) -> Notice | None:
        status, body = self._get("spot/instance-action")
        if status == 200:
            action = _json_object(body)
            deadline = _iso_time(str(action.get("time", "")))
            return Notice(PREEMPT, deadline, str(action.get("action", "terminate")))
        status, body = self._get("autoscaling/target-lifecycle-state")
        if status == 200 and body.strip() == "Terminated":
            return Notice(TERMINATE, None, "target-lifecycle-state Terminated")
        status, body = self._get("events/recommendations/rebalance")
        if status == 200:
            return Notice(REBALANCE, None, "rebalance recommendation")
        return None

    def _get(self, path: str) -> tuple[int, str]:
        for _ in range(2):
            if self._token is None:
                self._token = self._new_token()
            status, body = _request(
                f"{self.endpoint}/latest/meta-data/{path}",
                headers={"X-aws-ec2-metadata-token": self._token},
            )
            if status != 401:
                return status, body
            self._token = None  # expired: once more with a new one
        return status, body

    def _new_token(self) -> str:
        status, body = _request(
            f"{self.endpoint}/latest/api/token",
            method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": str(self.TOKEN_TTL_SECONDS)},
        )
        if status != 200 or not body.strip():
            raise OSError(f"IMDSv2 token request answered {status}")
        return body.strip()


class GcpMetadataWatcher:
    """The Compute Engine metadata server.

    ``instance/preempted`` as a hanging GET (``wait_for_change``, up to ``interval``
    seconds per request, so a preemption is heard the moment it is announced), then
    ``instance/maintenance-event``. A preemption leaves about 30 s.
    """

    PREEMPTION_LEAD_SECONDS = 30.0
    HEADERS = {"Metadata-Flavor": "Google"}

    def __init__(
        self, endpoint: str = "http://metadata.google.internal", interval: float = 5.0
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.interval = interval
        self._etag: str | None = None

    def poll(self) -> Notice | None:
        base = f"{self.endpoint}/computeMetadata/v1/instance"
        if self._etag is None:
            status, body = self._get(f"{base}/preempted", self.interval)
        else:
            wait = max(1, int(self.interval))
            url = f"{base}/preempted?wait_for_change=true&timeout_sec={wait}&last_etag={self._etag}"
            status, body = self._get(url, wait + REQUEST_TIMEOUT)
        if status == 200 and body.strip().upper() == "TRUE":
            return Notice(PREEMPT, time.time() + self.PREEMPTION_LEAD_SECONDS, "preempted")
        status, body = self._get(f"{base}/maintenance-event", REQUEST_TIMEOUT)
        if status == 200 and body.strip().startswith("TERMINATE"):
            return Notice(TERMINATE, None, body.strip())
        return None

    def _get(self, url: str, timeout: float) -> tuple[int, str]:
        request = urllib.request.Request(url, headers=self.HEADERS)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        try:
            with opener.open(request, timeout=timeout) as response:
                if "preempted" in url:
                    self._etag = response.headers.get("ETag") or self._etag
                return response.status, response.read(4096).decode(errors="replace")
        except urllib.error.HTTPError as error:
            return error.code, ""


class AzureScheduledEventsWatcher:
    """Azure Scheduled Events: ``Preempt`` (spot eviction) and ``Terminate`` for this VM.

    Events of other VMs of the set (every VM of a placement group sees them all: "check
    the Resources field in the event to identify which VMs are affected") are skipped by
    the VM's name, read from the instance metadata until it answers. The event is
    acknowledged (``StartRequests``) once the host has left the ring, so Azure need not
    wait out the rest of the notice period for nothing; but only an event that names
    this VM alone, since "acknowledging an event allows the event to proceed for all
    Resources in the event, not just the VM that acknowledges the event" (Azure
    Metadata Service: Scheduled Events, learn.microsoft.com/azure/virtual-machines/
    linux/scheduled-events).
    """

    API = "api-version=2020-07-01"
    HEADERS = {"Metadata": "true"}
    FIRST_CALL_TIMEOUT = 130.0
    """Seconds the first Scheduled Events call may take: "Scheduled Events is enabled
    for your service the first time you make a request for events. You should expect a
    delayed response in your first call of up to two minutes." Later calls get
    ``timeout``."""

    def __init__(
        self,
        endpoint: str = "http://169.254.169.254",
        interval: float = 1.0,
        timeout: float = REQUEST_TIMEOUT,
        first_timeout: float = FIRST_CALL_TIMEOUT,
    ) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.interval = interval
        self.timeout = timeout
        self.first_timeout = first_timeout
        self._vm_name: str | None = None
        self._answered = False  # Scheduled Events answered once: it is enabled
        self._reported: tuple[str, list[str]] = ("", [])  # the last event's id, resources

    def poll(self) -> Notice | None:
        if self._vm_name is None:
            self._vm_name = self._own_name()
        status, body = _request(
            f"{self.endpoint}/metadata/scheduledevents?{self.API}",
            headers=self.HEADERS,
            timeout=self.timeout if self._answered else self.first_timeout,
        )
        self._answered = True
        if status != 200:
            raise OSError(f"Scheduled Events answered {status}")
        for event in _json_object(body).get("Events") or ():
            if not isinstance(event, dict):
                continue
            if event.get("EventType") not in ("Preempt", "Terminate"):
                continue
            resources = event.get("Resources") or []
            if resources and self._vm_name not in resources:
                continue
            deadline = _http_date(str(event.get("NotBefore") or ""))
            kind = PREEMPT if event["EventType"] == "Preempt" else TERMINATE
            event_id = str(event.get("EventId", ""))
            self._reported = (event_id, [str(r) for r in resources])
            return Notice(kind, deadline, event_id)
        return None

    def _own_name(self) -> str:
        status, body = _request(
            f"{self.endpoint}/metadata/instance/compute/name?api-version=2021-02-01&format=text",
            headers=self.HEADERS,
            timeout=self.timeout,
        )
        if status != 200 or not body.strip():
            # Without it, another VM's eviction would pass for this one's.
            raise OSError(f"instance metadata (the VM's name) answered {status}")
        return body.strip()

    def acknowledge(self, notice: Notice) -> None:
        """Tell Azure the VM is ready for the event ``notice`` came from, if that event
        names this VM alone (acknowledging it releases every VM it names)."""
        event_id, resources = self._reported
        if notice.detail != event_id or resources != [self._vm_name]:
            log.info("not acknowledging scheduled event %s: it names %s, not this VM alone",
                     notice.detail, ", ".join(resources) or "no VM")  # fmt: skip
            return
        body = json.dumps({"StartRequests": [{"EventId": notice.detail}]}).encode()
        status, _ = _request(
            f"{self.endpoint}/metadata/scheduledevents?{self.API}",
            method="POST",
            headers={**self.HEADERS, "Content-Type": "application/json"},
            data=body,
            timeout=self.timeout,
        )
        log.info("acknowledged scheduled event %s: %d", notice.detail, status)


WATCHERS: dict[str, Callable[..., Watcher]] = {
    "aws": AwsImdsWatcher,
    "gcp": GcpMetadataWatcher,
    "azure": AzureScheduledEventsWatcher,
}


def make_watcher(config: Mapping[str, Any]) -> Watcher:
    """The watcher a provider asked for: ``{"watcher": NAME or "module:Class", ...options}``."""
    options = dict(config)
    name = str(options.pop("watcher", ""))
    factory = WATCHERS.get(name)
    if factory is None:
        module, _, attribute = name.partition(":")
        if not module or not attribute:
            raise ValueError(f"unknown notice watcher {name!r}")
        factory = getattr(importlib.import_module(module), attribute)
    return factory(**options)


class NoticeReporter:
    """Runs a watcher on a thread and writes each new notice as a signed line.

    :param write: writes one line to the driver (the supervisor's stdout).
    """

    def __init__(
        self, watcher: Watcher, key: bytes, launch: str, write: Callable[[str], None]
    ) -> None:
        self.watcher = watcher
        self._key = key
        self._launch = launch
        self._write = write
        self._sequence = 0
        self._stop = threading.Event()
        self.last: Notice | None = None
        """The last notice reported (what an acknowledgement is for)."""

    def start(self) -> None:
        threading.Thread(target=self._run, name="spotring-notices", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def acknowledge(self) -> None:
        """Acknowledge the last notice, where the cloud has such a thing (Azure)."""
        acknowledge = getattr(self.watcher, "acknowledge", None)
        if self.last is not None and acknowledge is not None:
            with contextlib.suppress(OSError):
                acknowledge(self.last)

    def _run(self) -> None:
        failures = 0
        while not self._stop.is_set():
            started = time.monotonic()
            try:
                notice = self.watcher.poll()
                failures = 0
            except Exception as error:  # never die silently; a missing service is quiet
                failures += 1
                if failures in (1, 10) or failures % 100 == 0:
                    log.warning("notice watcher: %s: %s", type(error).__name__, error)
                notice = None
            if notice is not None and self._is_new(notice):
                self._report(notice)
            self._stop.wait(max(0.0, self.watcher.interval - (time.monotonic() - started)))

    def _is_new(self, notice: Notice) -> bool:
        last = self.last
        # A real notice after a rebalance recommendation is news; the same one again is not.
        return last is None or (last.kind, last.detail) != (notice.kind, notice.detail)

    def _report(self, notice: Notice) -> None:
        self.last = notice
        self._sequence += 1
        message = NoticeMessage(self._launch, self._sequence, notice).signed(self._key)
        self._write(message.line())


def _json_object(body: str) -> dict[str, Any]:
    try:
        value = json.loads(body)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def _iso_time(text: str) -> float | None:
    """Epoch seconds of ``2026-11-22T12:34:56Z`` (None if unreadable)."""
    try:
        return float(calendar.timegm(time.strptime(text, "%Y-%m-%dT%H:%M:%SZ")))
    except ValueError:
        return None


def _http_date(text: str) -> float | None:
    """Epoch seconds of ``Mon, 19 Sep 2016 18:29:47 GMT`` (None if unreadable or empty)."""
    if not text:
        return None
    try:
        return email.utils.parsedate_to_datetime(text).timestamp()
    except (TypeError, ValueError):
        return None
