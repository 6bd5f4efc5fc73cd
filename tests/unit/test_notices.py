"""Interruption notices: the watchers against fake metadata services, and the signed
messages that carry a notice to the driver (forged, replayed, oversized, malformed and
foreign ones rejected)."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from spotring.autoscaler.controller import Controller
from spotring.driver.launcher import WorkerSpec, _NoticeReader
from spotring.driver.worker_events import WorkerEvents
from spotring.providers.base import InterruptionNotice
from spotring.providers.local import LocalProvider
from spotring.providers.local.metadata import FakeImds
from spotring.worker_image.notices import (
    MAX_MESSAGE_BYTES,
    MESSAGE_MARKER,
    PREEMPT,
    REBALANCE,
    TERMINATE,
    AwsImdsWatcher,
    AzureScheduledEventsWatcher,
    GcpMetadataWatcher,
    Notice,
    NoticeMessage,
    NoticeReporter,
    make_watcher,
)
from spotring.worker_image.peer_abort import JOB_KEY_ENV

KEY = bytes(range(32))

# ------------------------------------------------------------------------ AWS


@pytest.fixture
def imds() -> Iterator[FakeImds]:
    with FakeImds() as server:
        yield server


def test_aws_watcher_hears_a_spot_notice_with_its_deadline(imds: FakeImds) -> None:
    watcher = AwsImdsWatcher(imds.endpoint("i-1"))
    assert watcher.poll() is None
    deadline = int(time.time()) + 120
    imds.announce_interruption("i-1", deadline)
    assert watcher.poll() == Notice(PREEMPT, float(deadline), "terminate")
    # One token for every request: IMDSv2 sessions are reused.
    assert [r for r in imds.requests if r[0] == "PUT"] == [("PUT", "/i-1/latest/api/token", 200)]


def test_aws_watcher_refetches_an_expired_token(imds: FakeImds) -> None:
    imds.max_token_ttl = 0.2
    watcher = AwsImdsWatcher(imds.endpoint("i-1"))
    assert watcher.poll() is None
    time.sleep(0.3)
    imds.recommend_rebalance("i-1")
    assert watcher.poll() == Notice(REBALANCE, None, "rebalance recommendation")
    statuses = [status for _, _, status in imds.requests]
    assert 401 in statuses and len([r for r in imds.requests if r[0] == "PUT"]) == 2


def test_aws_token_of_another_host_is_refused(imds: FakeImds) -> None:
    """The fake keeps hosts apart, as separate machines' metadata services are."""
    AwsImdsWatcher(imds.endpoint("i-1")).poll()
    token = next(iter(imds._tokens))
    status, _ = imds.answer(
        "GET", "/i-2/latest/meta-data/spot/instance-action", {"X-aws-ec2-metadata-token": token}
    )
    assert status == 401


# ------------------------------------------------------------------------ GCP


class _FakeGcpMetadata(ThreadingHTTPServer):
    """instance/preempted (hanging GET with wait_for_change) and maintenance-event."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _GcpHandler)
        self.daemon_threads = True
        self.preempted = "FALSE"
        self.maintenance = "NONE"
        self.changed = threading.Condition()
        self.etag = 1
        self.requests: list[str] = []

    def preempt(self) -> None:
        with self.changed:
            self.preempted, self.etag = "TRUE", self.etag + 1
            self.changed.notify_all()


class _GcpHandler(BaseHTTPRequestHandler):
    server: _FakeGcpMetadata

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        fake, url = self.server, urlsplit(self.path)
        fake.requests.append(self.path)
        query = parse_qs(url.query)
        if self.headers.get("Metadata-Flavor") != "Google":
            return self._send(403, "Missing Metadata-Flavor:Google header.")
        if url.path.endswith("/instance/preempted"):
            if query.get("wait_for_change") == ["true"]:
                with fake.changed:
                    if query.get("last_etag") == [str(fake.etag)]:
                        fake.changed.wait(float(query.get("timeout_sec", ["60"])[0]))
            return self._send(200, fake.preempted, etag=str(fake.etag))
        if url.path.endswith("/instance/maintenance-event"):
            return self._send(200, fake.maintenance)
        self._send(404, "")

    def _send(self, status: int, body: str, etag: str | None = None) -> None:
        self.send_response(status)
        if etag:
            self.send_header("ETag", etag)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body.encode())


@pytest.fixture
def gcp() -> Iterator[_FakeGcpMetadata]:
    server = _FakeGcpMetadata()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def test_gcp_watcher_hangs_until_the_preemption(gcp: _FakeGcpMetadata) -> None:
    watcher = GcpMetadataWatcher(f"http://127.0.0.1:{gcp.server_address[1]}", interval=10)
    assert watcher.poll() is None  # the first read learns the ETag
    threading.Timer(0.5, gcp.preempt).start()
    started = time.monotonic()
    notice = watcher.poll()  # a hanging GET: answered the moment the value changes
    waited = time.monotonic() - started
    assert notice is not None and notice.kind == PREEMPT
    assert notice.deadline is not None and 25 < notice.deadline - time.time() <= 30
    assert 0.4 < waited < 5, waited
    assert any("wait_for_change=true" in r and "last_etag=1" in r for r in gcp.requests)


def test_gcp_watcher_hears_a_terminating_maintenance_event(gcp: _FakeGcpMetadata) -> None:
    gcp.maintenance = "TERMINATE_ON_HOST_MAINTENANCE"
    watcher = GcpMetadataWatcher(f"http://127.0.0.1:{gcp.server_address[1]}", interval=1)
    assert watcher.poll() == Notice(TERMINATE, None, "TERMINATE_ON_HOST_MAINTENANCE")


# ---------------------------------------------------------------------- Azure


class _FakeScheduledEvents(ThreadingHTTPServer):
    def __init__(self, vm_name: str) -> None:
        super().__init__(("127.0.0.1", 0), _AzureHandler)
        self.daemon_threads = True
        self.vm_name = vm_name
        self.events: list[dict[str, Any]] = []
        self.acknowledged: list[dict[str, Any]] = []
        # Seconds each next events request is held before its answer: "you should expect
        # a delayed response in your first call of up to two minutes".
        self.delays: list[float] = []


class _AzureHandler(BaseHTTPRequestHandler):
    server: _FakeScheduledEvents

    def log_message(self, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.headers.get("Metadata") != "true":
            return self._send(400, {"error": "Bad request. Required metadata header not specified"})
        if self.path.startswith("/metadata/instance/compute/name"):
            return self._send(200, self.server.vm_name)
        if self.path.startswith("/metadata/scheduledevents"):
            if self.server.delays:
                time.sleep(self.server.delays.pop(0))
            return self._send(200, {"DocumentIncarnation": 1, "Events": self.server.events})
        self._send(404, {})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length", "0"))
        self.server.acknowledged.append(json.loads(self.rfile.read(length)))
        self._send(200, "")

    def _send(self, status: int, body: Any) -> None:
        data = (body if isinstance(body, str) else json.dumps(body)).encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        with contextlib.suppress(OSError):  # the client may have given up waiting
            self.wfile.write(data)


@pytest.fixture
def scheduled_events() -> Iterator[_FakeScheduledEvents]:
    server = _FakeScheduledEvents("workers_1")
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _url(server: _FakeScheduledEvents) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}"


def _event(event_id: str, kind: str, *vms: str) -> dict[str, Any]:
    return {
        "EventId": event_id,
        "EventType": kind,
        "ResourceType": "VirtualMachine",
        "Resources": list(vms),
        "EventStatus": "Scheduled",
        "NotBefore": "Mon, 23 Nov 2026 18:29:47 GMT",
        "Description": "",
        "EventSource": "Platform",
        "DurationInSeconds": -1,
    }


def test_azure_watcher_hears_its_own_eviction_and_acknowledges_it(
    scheduled_events: _FakeScheduledEvents,
) -> None:
    server = scheduled_events
    watcher = AzureScheduledEventsWatcher(_url(server))
    server.events = [_event("E-other", "Preempt", "workers_2"), _event("E-f", "Freeze")]
    assert watcher.poll() is None  # another VM's eviction, and a freeze
    server.events.append(_event("E-1", "Preempt", "workers_1"))
    notice = watcher.poll()
    assert notice is not None and (notice.kind, notice.detail) == (PREEMPT, "E-1")
    assert notice.deadline == 1795458587.0  # NotBefore, Mon, 23 Nov 2026 18:29:47 GMT

    reporter = NoticeReporter(watcher, KEY, "launch", lambda line: None)
    reporter.acknowledge()  # nothing reported yet: nothing to acknowledge
    assert server.acknowledged == []
    reporter._report(notice)
    reporter.acknowledge()
    assert server.acknowledged == [{"StartRequests": [{"EventId": "E-1"}]}]


def test_azure_watcher_waits_long_for_the_first_answer_only(
    scheduled_events: _FakeScheduledEvents,
) -> None:
    watcher = AzureScheduledEventsWatcher(_url(scheduled_events), timeout=0.3, first_timeout=30)
    scheduled_events.events = [_event("E-1", "Preempt", "workers_1")]
    scheduled_events.delays = [1.0]  # the first call enables the service: it takes a while

    notice = watcher.poll()

    assert notice is not None and notice.detail == "E-1"
    scheduled_events.delays = [1.0]  # later calls are quick or failed
    with pytest.raises(OSError):
        watcher.poll()


def test_azure_watcher_never_takes_another_vms_event_without_its_own_name(
    scheduled_events: _FakeScheduledEvents,
) -> None:
    watcher = AzureScheduledEventsWatcher(_url(scheduled_events))
    scheduled_events.events = [_event("E-2", "Preempt", "workers_2")]
    scheduled_events.vm_name = ""  # the instance metadata has no answer yet

    with pytest.raises(OSError):
        watcher.poll()
    scheduled_events.vm_name = "workers_1"
    assert watcher.poll() is None


def test_azure_watcher_acknowledges_only_events_naming_this_vm_alone(
    scheduled_events: _FakeScheduledEvents,
) -> None:
    watcher = AzureScheduledEventsWatcher(_url(scheduled_events))
    reporter = NoticeReporter(watcher, KEY, "launch", lambda line: None)
    scheduled_events.events = [_event("E-both", "Preempt", "workers_1", "workers_2")]
    shared = watcher.poll()
    assert shared is not None and shared.detail == "E-both"  # this VM's eviction too

    reporter._report(shared)
    reporter.acknowledge()  # it would release workers_2 before it has drained
    assert scheduled_events.acknowledged == []

    scheduled_events.events = [_event("E-own", "Preempt", "workers_1")]
    own = watcher.poll()
    assert own is not None
    reporter._report(own)
    reporter.acknowledge()
    assert scheduled_events.acknowledged == [{"StartRequests": [{"EventId": "E-own"}]}]


# ------------------------------------------------------------------- reporting


class _Script:
    """A watcher that hears what the test tells it."""

    interval = 0.01

    def __init__(self) -> None:
        self.notice: Notice | None = None

    def poll(self) -> Notice | None:
        return self.notice


def test_reporter_reports_each_notice_once_signed_and_numbered() -> None:
    lines: list[str] = []
    watcher = _Script()
    reporter = NoticeReporter(watcher, KEY, "L1", lines.append)
    reporter.start()
    try:
        watcher.notice = Notice(REBALANCE, None, "rebalance recommendation")
        _wait_for(lambda: len(lines) == 1)
        watcher.notice = Notice(PREEMPT, 123.0, "terminate")
        _wait_for(lambda: len(lines) == 2)
        time.sleep(0.1)
    finally:
        reporter.stop()
    assert len(lines) == 2, "the same notice is reported once"
    messages = [NoticeMessage.parse(line.rstrip("\n")) for line in lines]
    assert [m.sequence for m in messages] == [1, 2]
    assert all(m.verify(KEY) and m.launch == "L1" for m in messages)
    assert messages[1].notice == Notice(PREEMPT, 123.0, "terminate")


def test_a_failing_watcher_is_logged_and_keeps_polling(caplog: pytest.LogCaptureFixture) -> None:
    class Broken:
        interval = 0.01
        calls = 0

        def poll(self) -> Notice | None:
            Broken.calls += 1
            raise OSError("no route to 169.254.169.254")

    reporter = NoticeReporter(Broken(), KEY, "L", lambda line: None)
    reporter.start()
    _wait_for(lambda: Broken.calls > 20)
    reporter.stop()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings and "no route" in warnings[0] and len(warnings) <= 3


def test_make_watcher_takes_built_in_names_and_import_paths() -> None:
    assert isinstance(make_watcher({"watcher": "aws", "interval": 3}), AwsImdsWatcher)
    own = make_watcher({"watcher": "spotring.worker_image.notices:GcpMetadataWatcher"})
    assert isinstance(own, GcpMetadataWatcher)
    with pytest.raises(ValueError, match="unknown notice watcher"):
        make_watcher({"watcher": "nope"})


# -------------------------------------------------------- the driver's checks


class _Listener(WorkerEvents):
    def __init__(self) -> None:
        self.heard: list[tuple[str, Notice]] = []

    def worker_noticed(self, host: str, notice: Notice) -> None:
        self.heard.append((host, notice))


def _reader(launch: str = "L1") -> tuple[_NoticeReader, _Listener]:
    spec = WorkerSpec("10.0.0.5", 0, 1, ("python",), env={JOB_KEY_ENV: KEY.hex()}, notices={})
    listener = _Listener()
    return _NoticeReader(spec, launch, lambda event: event(listener)), listener


def _line(sequence: int, key: bytes = KEY, launch: str = "L1") -> str:
    return NoticeMessage(launch, sequence, Notice(PREEMPT, 1.0, "terminate")).signed(key).line()


def test_a_good_notice_is_passed_on_once(caplog: pytest.LogCaptureFixture) -> None:
    reader, listener = _reader()
    reader.read(_line(1))
    reader.read(_line(1))  # replayed
    reader.read(_line(2))
    assert listener.heard == [("10.0.0.5", Notice(PREEMPT, 1.0, "terminate"))] * 2
    assert "replayed" in caplog.text


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (_line(1, key=b"x" * 32), "bad signature"),
        (_line(1, launch="L0"), "another launch"),
        (MESSAGE_MARKER + "{" * 10, "not JSON"),
        (MESSAGE_MARKER + json.dumps({"launch": "L1", "seq": 1, "kind": "reboot", "mac": ""}),
         "unknown kind"),
        (MESSAGE_MARKER + json.dumps({"launch": "L1", "seq": "1", "kind": "preempt", "mac": ""}),
         "bad sequence"),
        (MESSAGE_MARKER + json.dumps({"launch": "L1"}) + " " * MAX_MESSAGE_BYTES, "oversized"),
        (MESSAGE_MARKER + "[]", "not a JSON object"),
    ],
)  # fmt: skip
def test_bad_notices_are_rejected_and_logged(
    line: str, why: str, caplog: pytest.LogCaptureFixture
) -> None:
    reader, listener = _reader()
    reader.read(line)
    assert listener.heard == []
    assert why in caplog.text and "rejected" in caplog.text


def test_a_message_is_tampered_with_in_any_field() -> None:
    message = NoticeMessage("L1", 1, Notice(PREEMPT, 100.0, "terminate")).signed(KEY)
    for changed in (
        NoticeMessage("L1", 2, message.notice, message.mac),
        NoticeMessage("L1", 1, Notice(TERMINATE, 100.0, "terminate"), message.mac),
        NoticeMessage("L1", 1, Notice(PREEMPT, 101.0, "terminate"), message.mac),
    ):
        assert not changed.verify(KEY)
    assert message.verify(KEY)


def test_a_notice_for_a_host_outside_the_group_is_ignored(
    caplog: pytest.LogCaptureFixture,
) -> None:
    provider = LocalProvider(2)
    controller = Controller(provider, refresh_interval=60)
    try:
        assert controller.refresh()
        assert not controller.host_noticed("10.9.9.9", InterruptionNotice(PREEMPT, None))
        assert "not a member of the group" in caplog.text
        assert len(controller.inventory.ready) == 2  # type: ignore[union-attr]

        assert controller.host_noticed("host-1", InterruptionNotice(PREEMPT, None))
        inventory = controller.inventory
        assert inventory is not None and [i.id for i in inventory.ready] == ["host-0"]
        noticed = inventory.by_id("host-1")
        assert noticed is not None and noticed.state.value == "draining" and noticed.notice
        # The last host cannot leave: no other would carry the state.
        assert not controller.host_noticed("host-0", InterruptionNotice(PREEMPT, None))
        assert [i.id for i in controller.inventory.ready] == ["host-0"]  # type: ignore[union-attr]
    finally:
        provider.close()


def _wait_for(condition: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)
