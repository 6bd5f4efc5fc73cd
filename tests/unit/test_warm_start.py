"""Workers started ahead of their join: the supervisor's hold, the launcher's hand-over,
the pool that decides which hosts Horovod may have."""

from __future__ import annotations

import io
import json
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psutil
import pytest

from spotring.driver.elastic import warm_worker_env
from spotring.driver.launcher import ProcessLauncher, WarmWorker, WorkerExit, WorkerSpec
from spotring.driver.warm_pool import SLOW_START_SECONDS, WarmPool
from spotring.driver.worker_events import WorkerEvents
from spotring.worker_image import warm_start
from spotring.worker_image.peer_abort import JOB_KEY_ENV, JOB_KEY_FD_ENV
from spotring.worker_image.warm_start import READY_MARKER

ENV = {"PATH": os.environ["PATH"]}

HELD = """\
import os, sys
from spotring.worker_image.warm_start import hold_until_assigned
print("started", flush=True)
hold_until_assigned(lambda: None)()
print("joined as", os.environ.get("HOROVOD_RANK"), "on", os.environ.get("HOROVOD_HOSTNAME"))
"""
"""Stands for a training script: holds where ``hvd.init`` would, prints its slot."""


class Listener(WorkerEvents):
    """Records every launcher event, in order."""

    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def process_started(self, host: str, process_group: int) -> None:
        self.events.append(("process_started", host))

    def process_exited(self, host: str, process_group: int) -> None:
        self.events.append(("process_exited", host))

    def worker_started(self, host: str, process_group: int) -> None:
        self.events.append(("worker_started", host))

    def worker_exited(self, exit: WorkerExit, process_group: int) -> None:
        self.events.append(("worker_exited", exit.host))


def warm_spec(script: str, marker: str = "", host: str = "host-1") -> WorkerSpec:
    argv = (sys.executable, "-c", script, marker)
    env = {**ENV, "HOROVOD_HOSTNAME": host, "HOROVOD_LOCAL_RANK": "0"}
    return WorkerSpec(host=host, local_rank=0, rank=-1, argv=argv, env=env)


def slot_spec(warm: WorkerSpec, rank: int = 2) -> WorkerSpec:
    env = {**warm.env, "HOROVOD_RANK": str(rank), "HOROVOD_SIZE": "3"}
    return WorkerSpec(warm.host, warm.local_rank, rank, warm.argv, env)


def processes_with(marker: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        with_marker = any(marker in part for part in process.info["cmdline"] or ())
        if with_marker and process.status() != psutil.STATUS_ZOMBIE:
            found.append(process)
    return found


def wait_until(condition, timeout: float = 30.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def test_a_warm_worker_holds_until_handed_its_slot_then_runs_on_as_that_rank() -> None:
    out, listener = io.StringIO(), Listener()
    launcher = ProcessLauncher(remote=False, listeners=[listener], output=out)
    spec = warm_spec(HELD)
    warm = launcher.prestart(spec)
    assert warm.wait_held(30), out.getvalue()
    # The hold is signalled on its own channel; the line printed before it may still
    # be on its way through the output thread on a loaded machine.
    deadline = time.monotonic() + 10
    while not out.getvalue() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert out.getvalue() == "[warm]<host-1:0>: started\n"  # held: nothing after the hold
    assert listener.events == [("process_started", "host-1")]  # not a Horovod worker yet
    code, _ = launcher(slot_spec(spec), [threading.Event()], warm)
    assert code == 0
    assert out.getvalue().splitlines()[1:] == ["[2]<host-1:0>: joined as 2 on host-1"]
    assert listener.events == [
        ("process_started", "host-1"),
        ("worker_started", "host-1"),
        ("worker_exited", "host-1"),
        ("process_exited", "host-1"),
    ]


SHOW_KEY = """\
import os
from spotring.worker_image.warm_start import hold_until_assigned
hold_until_assigned(lambda: None)()
print("os.environ:", os.environ.get("SPOTRING_JOB_KEY"), flush=True)
print("block:", open("/proc/self/environ", "rb").read().replace(b"\\0", b" ").decode())
"""


def test_the_job_key_never_reaches_a_warm_workers_environment() -> None:
    """Not at its start, and not with its slot, even one whose key differs (so the
    launcher's hand-over sends it) and reaches the supervisor."""
    out = io.StringIO()
    launcher = ProcessLauncher(remote=False, output=out)
    keys = os.urandom(32).hex(), os.urandom(32).hex()
    spec = warm_spec(SHOW_KEY)
    spec = WorkerSpec(spec.host, 0, -1, spec.argv, {**spec.env, JOB_KEY_ENV: keys[0]})
    warm = launcher.prestart(spec)
    assert warm.wait_held(30), out.getvalue()
    slot = slot_spec(spec)
    slot = WorkerSpec(slot.host, 0, slot.rank, slot.argv, {**slot.env, JOB_KEY_ENV: keys[1]})
    code, _ = launcher(slot, [threading.Event()], warm)
    assert code == 0, out.getvalue()
    assert "os.environ: None" in out.getvalue() and "HOROVOD_RANK=2" not in out.getvalue()
    assert not any(key in out.getvalue() for key in keys)


def test_a_slots_environment_never_carries_the_key_into_os_environ(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(warm_start, "_warm_up_torch", lambda: None)
    ours, supervisor = socket.socketpair()
    with ours, supervisor:
        slot = {"HOROVOD_RANK": "1", JOB_KEY_ENV: "ab" * 32, JOB_KEY_FD_ENV: "0"}
        supervisor.sendall(json.dumps(slot).encode() + b"\n")
        assert warm_start.wait_for_slot(ours) == {"HOROVOD_RANK": "1"}


def test_a_warm_worker_stopped_before_it_joins_leaves_no_process() -> None:
    marker, listener = f"warm-{uuid.uuid4()}", Listener()
    launcher = ProcessLauncher(remote=False, listeners=[listener], output=io.StringIO())
    warm = launcher.prestart(warm_spec(HELD, marker))
    assert warm.wait_held(30)
    assert processes_with(marker)
    warm.stop()
    assert wait_until(lambda: not processes_with(marker), timeout=15)
    assert wait_until(lambda: ("process_exited", "host-1") in listener.events)
    assert warm.hand_over(slot_spec(warm_spec(HELD, marker))) is None  # too late


def test_a_warm_worker_that_ended_is_replaced_by_a_cold_start() -> None:
    script = "import os, sys\nif 'HOROVOD_RANK' not in os.environ: sys.exit(5)\nprint('cold')"
    out, listener = io.StringIO(), Listener()
    launcher = ProcessLauncher(remote=False, listeners=[listener], output=out)
    spec = warm_spec(script)
    warm = launcher.prestart(spec)
    assert wait_until(lambda: warm.exited)
    assert not warm.held
    code, _ = launcher(slot_spec(spec), [], warm)
    assert code == 0
    assert "[2]<host-1:0>: cold\n" in out.getvalue()
    assert listener.events.count(("process_started", "host-1")) == 2


def test_a_worker_cannot_claim_to_be_held_by_printing_the_ready_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The ready line carries the launch id, which only the supervisor knows."""
    script = f"import time\nprint({READY_MARKER!r} + 'guessed', flush=True)\ntime.sleep(60)"
    launcher = ProcessLauncher(remote=False, output=io.StringIO())
    warm = launcher.prestart(warm_spec(script))
    try:
        with caplog.at_level(logging.WARNING):
            assert wait_until(lambda: "forged ready line" in caplog.text)
        assert not warm.held
    finally:
        warm.stop()


HOROVOD_SCRIPT = """\
import sys
import horovod.torch as hvd
print("imported", flush=True)
hvd.init()
print("initialised", hvd.rank(), hvd.size(), "torch._dynamo" in sys.modules, flush=True)
"""


def test_hvd_init_holds_in_a_warm_worker_whatever_the_script_imports() -> None:
    """The sitecustomize holds Horovod's init as soon as Horovod is imported: a script
    that calls hvd.init() first thing waits there, and torch's lazily imported parts
    are paid while it waits."""
    out = io.StringIO()
    launcher = ProcessLauncher(remote=False, output=out)
    spec = warm_spec(HOROVOD_SCRIPT)
    warm = launcher.prestart(spec)
    assert warm.wait_held(120), out.getvalue()
    assert "initialised" not in out.getvalue()
    slot = {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "1", "HOROVOD_LOCAL_SIZE": "1"}
    code, _ = launcher(WorkerSpec(spec.host, 0, 0, spec.argv, {**spec.env, **slot}), [], warm)
    assert code == 0, out.getvalue()
    assert "[0]<host-1:0>: initialised 0 1 True" in out.getvalue()


class PermissiveStore(BaseHTTPRequestHandler):
    """A rendezvous store that takes anything: where a stray init would succeed."""

    data: dict[str, bytes] = {}

    def do_PUT(self) -> None:
        self.data[self.path] = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.end_headers()

    def do_GET(self) -> None:
        value = self.data.get(self.path)
        self.send_response(404 if value is None else 200)
        self.send_header("Content-Length", str(len(value or b"")))
        self.end_headers()
        self.wfile.write(value or b"")

    def do_DELETE(self) -> None:
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("warm", [False, True], ids=["slot's env", "warm env"])
def test_an_init_that_escapes_the_hold_fails_instead_of_training_alone(warm: bool) -> None:
    """A script run with ``python -I`` gets no sitecustomize, so no hold: in a warm
    worker's environment its hvd.init must fail, not form a ring of one and train as
    rank 0 (with the rendezvous server's port it would: the first case)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), PermissiveStore)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {
        **ENV,
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(server.server_address[1]),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        **(warm_worker_env("host-1", 0) if warm else {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "1"}),
    }
    try:
        result = subprocess.run(
            [sys.executable, "-I", "-c", HOROVOD_SCRIPT],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        server.shutdown()
    assert "imported" in result.stdout
    if warm:
        assert result.returncode != 0 and "initialised" not in result.stdout
    else:
        assert "initialised 0 1" in result.stdout, result.stderr[-2000:]


# ---------------------------------------------------------------------- the pool


def make_pool(script: str, marker: str, clock=time.monotonic) -> WarmPool:  # type: ignore[no-untyped-def]
    pool = WarmPool(ProcessLauncher(remote=False, output=io.StringIO()), clock=clock)
    pool.start(lambda host, local_rank: warm_spec(script, marker, host))
    return pool


def test_a_host_is_offered_once_its_workers_hold_and_each_is_taken_once() -> None:
    marker = f"pool-{uuid.uuid4()}"
    pool = WarmPool(ProcessLauncher(remote=False, output=io.StringIO()))
    try:
        assert pool.offer({"host-1": 1}) == {}  # not started: no spec to start yet
        pool.start(lambda host, local_rank: warm_spec(HELD, marker, host))
        assert pool.offer({"host-1": 1}) == {}  # starting
        assert wait_until(lambda: pool.offer({"host-1": 1}) == {"host-1": 1})
        worker = pool.take("host-1", 0)
        assert isinstance(worker, WarmWorker) and worker.held
        assert pool.take("host-1", 0) is None
        assert pool.offer({"host-1": 1}) == {"host-1": 1}  # offered until it leaves
    finally:
        pool.close()
    worker.stop()
    assert wait_until(lambda: not processes_with(marker), timeout=15)


def test_workers_of_a_host_that_leaves_before_joining_are_stopped() -> None:
    marker = f"pool-{uuid.uuid4()}"
    pool = make_pool(HELD, marker)
    try:
        pool.offer({"host-1": 1, "host-2": 1})
        assert wait_until(lambda: len(pool.offer({"host-1": 1, "host-2": 1})) == 2)
        assert len(processes_with(marker)) == 2
        assert pool.offer({"host-1": 1}) == {"host-1": 1}
        assert wait_until(lambda: len(processes_with(marker)) == 1, timeout=15)
        assert pool.take("host-2", 0) is None
    finally:
        pool.close()
    assert wait_until(lambda: not processes_with(marker), timeout=15)
    assert pool.offer({"host-1": 1}) == {}


def test_a_host_whose_warm_worker_ended_early_is_offered_to_start_cold(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A script that fails before hvd.init must fail the way it would without warm
    starts (Horovod's cold start meets the same error and reports it), not leave the
    job waiting for a host that is never offered."""
    pool = make_pool("raise SystemExit(1)", f"pool-{uuid.uuid4()}")
    try:
        with caplog.at_level(logging.WARNING):
            assert wait_until(lambda: pool.offer({"host-1": 1}) == {"host-1": 1})
        assert "ended before it reached hvd.init" in caplog.text
        assert pool.take("host-1", 0) is None
    finally:
        pool.close()


def test_a_worker_slow_to_reach_init_is_reported_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    now = [0.0]
    marker = f"pool-{uuid.uuid4()}"
    pool = make_pool("import time\ntime.sleep(60)", marker, clock=lambda: now[0])
    try:
        with caplog.at_level(logging.WARNING):
            assert pool.offer({"host-1": 1}) == {}
            now[0] = SLOW_START_SECONDS + 1
            assert pool.offer({"host-1": 1}) == {}
            assert pool.offer({"host-1": 1}) == {}
        assert caplog.text.count("have not reached hvd.init after") == 1
    finally:
        pool.close()
    assert wait_until(lambda: not processes_with(marker), timeout=15)
