"""ProcessLauncher and the worker supervisor: output, exits, stops, secrets, ssh."""

from __future__ import annotations

import io
import os
import stat
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import psutil
import pytest

from bench.driver_resources import install_fake_ssh
from spotring.driver.launcher import (
    LAUNCH_FAILED_EXIT,
    ProcessLauncher,
    SshOptions,
    WorkerExit,
    WorkerSpec,
)
from spotring.driver.worker_env import parse_forwarded, worker_base_environment
from spotring.driver.worker_events import WorkerEvents
from spotring.worker_image.supervisor import SITEHOOK_DIR, interface_towards

ENV = {"PATH": os.environ["PATH"]}


class Listener(WorkerEvents):
    def __init__(self) -> None:
        self.started: list[tuple[str, int]] = []
        self.exits: list[WorkerExit] = []

    def worker_started(self, host: str, process_group: int) -> None:
        self.started.append((host, process_group))

    def worker_exited(self, exit: WorkerExit, process_group: int) -> None:
        self.exits.append(exit)


def spec(*argv: str, host: str = "host-1", env: dict[str, str] | None = None) -> WorkerSpec:
    return WorkerSpec(host=host, local_rank=0, rank=2, argv=argv, env=env or ENV)


def processes_with(marker: str) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if any(marker in part for part in process.info["cmdline"] or ()):
            found.append(process)
    return found


def test_output_is_prefixed_and_exit_reported() -> None:
    out, listener = io.StringIO(), Listener()
    launcher = ProcessLauncher(remote=False, listeners=[listener], output=out)
    code, _ = launcher(spec("sh", "-c", "echo hello; exit 3"), [threading.Event()])
    assert code == 3
    assert out.getvalue() == "[2]<host-1:0>: hello\n"
    assert listener.started and listener.started[0][0] == "host-1"
    (exit,) = listener.exits
    assert (exit.host, exit.rank, exit.exit_code, exit.stopped, exit.failed) == (
        "host-1",
        2,
        3,
        False,
        True,
    )


def test_a_worker_killed_by_a_signal_is_reported_with_it() -> None:
    code, _ = ProcessLauncher(remote=False, output=io.StringIO())(
        spec("sh", "-c", "kill -9 $$"), []
    )
    assert code == -9


def test_event_stops_the_whole_process_group_and_is_not_a_failure() -> None:
    listener, event = Listener(), threading.Event()
    marker = f"spotring-test-{uuid.uuid4().hex}"
    launcher = ProcessLauncher(remote=False, listeners=[listener], output=io.StringIO())
    threading.Timer(0.5, event.set).start()
    began = time.monotonic()
    code, _ = launcher(spec("sh", "-c", f"sleep 60 {marker} & sleep 60; wait", marker), [event])
    assert time.monotonic() - began < 10
    assert code != 0
    (exit,) = listener.exits
    assert exit.stopped and not exit.failed
    assert not processes_with(marker), "a child of the worker survived the stop"


def test_success_is_not_a_failure() -> None:
    listener = Listener()
    ProcessLauncher(remote=False, listeners=[listener], output=io.StringIO())(spec("true"), [])
    assert listener.exits[0].exit_code == 0 and not listener.exits[0].failed


def test_worker_environment_comes_through_stdin_never_argv() -> None:
    secret = f"s3cret-{uuid.uuid4().hex}"
    out = io.StringIO()
    seen_in_argv: list[bool] = []

    def look() -> None:
        time.sleep(0.5)
        seen_in_argv.append(bool(processes_with(secret)))

    watcher = threading.Thread(target=look)
    watcher.start()
    ProcessLauncher(remote=False, output=out)(
        spec("sh", "-c", 'echo "$MY_TOKEN|$PYTHONPATH"; sleep 1', env={**ENV, "MY_TOKEN": secret}),
        [],
    )
    watcher.join()
    assert out.getvalue().split(": ", 1)[1].strip() == f"{secret}|{SITEHOOK_DIR}"
    assert seen_in_argv == [False]


def test_failures_to_start_or_watch_become_failed_exits() -> None:
    class Raising(Listener):
        def worker_started(self, host: str, process_group: int) -> None:
            raise RuntimeError("a listener's bug")

    listener = Raising()
    launcher = ProcessLauncher(remote=False, listeners=[listener], output=io.StringIO())
    # A listener raising does not lose the worker: it is still watched to its end.
    assert launcher(spec("sh", "-c", "exit 4"), [])[0] == 4
    assert listener.exits[-1].exit_code == 4
    # An address ssh could take for an option is never started.
    code, _ = launcher(spec("true", host="-oProxyCommand=touch /tmp/x"), [])
    assert code == LAUNCH_FAILED_EXIT and listener.exits[-1].failed
    # No interpreter to run the supervisor (or no ssh binary): a failed exit, not a hang.
    broken = ProcessLauncher(remote=False, python="/nonexistent/python", listeners=[listener])
    assert broken(spec("true"), [])[0] == LAUNCH_FAILED_EXIT
    assert listener.exits[-1].failed


@pytest.mark.parametrize(
    "line", ["not json", '{"argv": ["true"], "warm": true}'], ids=["not json", "warm, no launch"]
)
def test_supervisor_rejects_a_bad_spec_in_one_line(line: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "spotring.worker_image.supervisor"],
        input=line + "\n",
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "bad worker spec" in result.stderr


def test_workers_pick_the_interface_that_routes_to_the_driver() -> None:
    assert interface_towards("127.0.0.1") == "lo"


# ---------------------------------------------------------------------- environment


def test_only_allow_listed_and_named_variables_are_forwarded() -> None:
    driver = {
        "PATH": "/bin",
        "HOROVOD_GLOO_TIMEOUT_SECONDS": "60",
        "NCCL_DEBUG": "INFO",
        "LC_ALL": "C.UTF-8",
        "PYTHONPATH": "/src",
        "AWS_SECRET_ACCESS_KEY": "aws-secret",
        "AWS_ACCESS_KEY_ID": "AKIA",
        "GOOGLE_APPLICATION_CREDENTIALS": "/key.json",
        "AZURE_CLIENT_SECRET": "azure-secret",
        "MY_SECRET_TOKEN": "token",
        "WANDB_API_KEY": "wandb",
    }
    forwarded = parse_forwarded(["WANDB_API_KEY", "EXTRA=1"], driver)
    env = worker_base_environment(driver, forwarded)
    assert env == {
        "PATH": "/bin",
        "HOROVOD_GLOO_TIMEOUT_SECONDS": "60",
        "NCCL_DEBUG": "INFO",
        "LC_ALL": "C.UTF-8",
        "PYTHONPATH": "/src",
        "WANDB_API_KEY": "wandb",
        "EXTRA": "1",
    }


@pytest.mark.parametrize("item", ["1BAD", "A-B=1", "", "NOT_SET_ANYWHERE"])
def test_bad_forwarded_names_are_rejected(item: str) -> None:
    with pytest.raises(ValueError):
        parse_forwarded([item], {})


# ------------------------------------------------------------------------------ ssh


def test_ssh_argv_ends_options_before_the_host_and_pins_host_keys() -> None:
    launcher = ProcessLauncher(
        remote=True,
        ssh=SshOptions(port=2222, identity_file="/k"),
        python="/opt/spotring/venv/bin/python",
        host_alias=lambda address: "i-0abc",
    )
    try:
        argv = launcher.argv("10.0.0.5")
        assert argv[0] == "ssh" and argv[-3:-1] == ["--", "10.0.0.5"]
        assert argv[-1] == "exec /opt/spotring/venv/bin/python -m spotring.worker_image.supervisor"
        options = argv[1 : argv.index("--")]
        assert "StrictHostKeyChecking=accept-new" in options
        assert "HostKeyAlias=i-0abc" in options
        assert "BatchMode=yes" in options and "ServerAliveInterval=5" in options
        known = next(o for o in options if o.startswith("UserKnownHostsFile="))
        job_dir = Path(known.split("=", 1)[1]).parent
        assert job_dir.name.startswith("spotring-ssh-")
        assert stat.S_IMODE(job_dir.stat().st_mode) == 0o700  # its sockets are the user's
        # One master connection per host: its control socket in the job's directory.
        assert "ControlMaster=auto" in options and "ControlPersist=60" in options
        path = Path(next(o for o in options if o.startswith("ControlPath=")).split("=", 1)[1])
        assert path.parent == job_dir
        assert launcher.argv("10.0.0.5") == argv  # the same host, the same master
        other = launcher.argv("10.0.0.6")
        assert f"ControlPath={path}" not in other and other[-3:-1] == ["--", "10.0.0.6"]
        assert options[options.index("-p") + 1] == "2222"
    finally:
        launcher.close()
    no_check = ProcessLauncher(remote=True, ssh=SshOptions(host_key_checking="no"))
    assert "StrictHostKeyChecking=no" in no_check.argv("h")
    no_check.close()
    plain = ProcessLauncher(remote=True, ssh=SshOptions(multiplex=False))
    assert not any(o.startswith("Control") for o in plain.argv("h"))
    plain.close()


@pytest.fixture
def fake_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An ``ssh`` that runs the remote command in a session of its own, as a remote host
    would, fed by a pipe that closes when this "client" dies or its stdin closes; it
    logs each connection, multiplexed session and master closed (bench's FAKE_SSH)."""
    script = install_fake_ssh(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{script.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SSH_LOG", str(tmp_path / "ssh.log"))
    monkeypatch.delenv("FAKE_SSH_EXEC", raising=False)
    return tmp_path / "ssh.log"


def test_a_stop_reaches_the_remote_process_group(fake_ssh: Path) -> None:
    marker = f"spotring-remote-{uuid.uuid4().hex}"
    event, listener = threading.Event(), Listener()
    launcher = ProcessLauncher(
        remote=True,
        listeners=[listener],
        ssh=SshOptions(host_key_checking="no"),
        output=io.StringIO(),
    )
    threading.Timer(1.0, event.set).start()
    try:
        code, _ = launcher(
            spec("sh", "-c", f"sleep 60 {marker} & wait", marker, host="10.1.2.3"), [event]
        )
    finally:
        launcher.close()
    # Never 0 for a stopped worker, whatever ssh says: Horovod would take it as success.
    assert listener.exits[-1].stopped and code != 0
    # The host's master connection carried the worker's session, and was closed.
    assert fake_ssh.read_text().splitlines() == [
        "connect 10.1.2.3",
        "mux 10.1.2.3",
        "exit 10.1.2.3",
    ]
    deadline = time.monotonic() + 10
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not processes_with(marker), "the remote worker outlived its stop"


def test_a_notice_comes_through_the_supervisor_signed_and_out_of_the_output() -> None:
    """The real watcher on a (fake) metadata service, the supervisor's signed line, the
    launcher's check: the listener hears the notice, the output never shows it, and a
    worker stopped because its host left counts as stopped."""
    from spotring.providers.local.metadata import FakeImds
    from spotring.worker_image.notices import MESSAGE_MARKER, PREEMPT
    from spotring.worker_image.peer_abort import JOB_KEY_ENV

    class Heard(Listener):
        def __init__(self) -> None:
            super().__init__()
            self.notices: list[tuple[str, object]] = []

        def worker_noticed(self, host: str, notice: object) -> None:
            self.notices.append((host, notice))

    out, listener = io.StringIO(), Heard()
    launcher = ProcessLauncher(remote=False, listeners=[listener], output=out)
    with FakeImds() as imds:
        worker = WorkerSpec(
            host="host-1",
            local_rank=0,
            rank=2,
            argv=("sh", "-c", "printf 'no newline yet'; sleep 60"),
            env={**ENV, JOB_KEY_ENV: os.urandom(32).hex()},
            notices={"watcher": "aws", "endpoint": imds.endpoint("host-1"), "interval": 0.1},
        )
        result: list[tuple[int, float]] = []
        thread = threading.Thread(target=lambda: result.append(launcher(worker, [])))
        thread.start()
        deadline = time.monotonic() + 20
        while not imds.requests and time.monotonic() < deadline:
            time.sleep(0.05)
        imds.announce_interruption("host-1", time.time() + 120)
        while not listener.notices and time.monotonic() < deadline:
            time.sleep(0.05)
        launcher.stop_workers_on("host-1")
        thread.join(timeout=20)
    assert [(h, n.kind) for h, n in listener.notices] == [("host-1", PREEMPT)]  # type: ignore[attr-defined]
    assert MESSAGE_MARKER not in out.getvalue() and "launch" not in out.getvalue()
    assert "[2]<host-1:0>: no newline yet\n" in out.getvalue()
    (exit,) = listener.exits
    assert exit.stopped and not exit.failed and result[0][0] != 0


def test_a_line_without_end_is_cut_in_bounded_memory_and_what_follows_still_arrives(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker prints 100 MiB without a newline: the driver keeps the first
    MAX_LINE_CHARS of it, says so once, and the notice and lines after it come through;
    the driver's Python memory never holds the line (the whole run traced)."""
    import tracemalloc

    from spotring.driver.launcher import MAX_LINE_CHARS
    from spotring.providers.local.metadata import FakeImds
    from spotring.worker_image.peer_abort import JOB_KEY_ENV

    class Heard(Listener):
        def __init__(self) -> None:
            super().__init__()
            self.notices: list[str] = []

        def worker_noticed(self, host: str, notice: object) -> None:
            self.notices.append(host)

    printed, go = tmp_path / "printed", tmp_path / "go"
    script = (
        "head -c 104857600 /dev/zero | tr '\\0' x; "  # 100 MiB, no newline
        f"touch {printed}; while [ ! -e {go} ]; do sleep 0.05; done; "
        "printf 'after\\n'; head -c 200000 /dev/zero | tr '\\0' y; printf '\\nend\\n'"
    )
    out, listener = io.StringIO(), Heard()
    launcher = ProcessLauncher(remote=False, listeners=[listener], output=out)
    tracemalloc.start()
    try:
        with FakeImds() as imds, caplog.at_level("WARNING", logger="spotring.driver.launcher"):
            worker = WorkerSpec(
                host="host-1",
                local_rank=0,
                rank=2,
                argv=("sh", "-c", script),
                env={**ENV, JOB_KEY_ENV: os.urandom(32).hex()},
                notices={"watcher": "aws", "endpoint": imds.endpoint("host-1"), "interval": 0.1},
            )
            result: list[tuple[int, float]] = []
            thread = threading.Thread(target=lambda: result.append(launcher(worker, [])))
            thread.start()
            deadline = time.monotonic() + 60
            while not printed.exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            time.sleep(0.5)  # the driver reads the rest of it
            imds.announce_interruption("host-1", time.time() + 120)
            while not listener.notices and time.monotonic() < deadline:
                time.sleep(0.05)
            go.touch()
            thread.join(timeout=60)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 * MAX_LINE_CHARS + (2 << 20), peak  # not the 100 MiB line
    assert result and result[0][0] == 0
    assert listener.notices == ["host-1"]
    lines = out.getvalue().splitlines()
    prefix = "[2]<host-1:0>: "
    assert lines[0] == prefix + "x" * MAX_LINE_CHARS + " [cut]"
    # (If the notice came before the driver read all the x's, the supervisor's newline
    # before it ended the line there, and the rest is a line of its own, cut too.)
    assert all(set(line[len(prefix) :].removesuffix(" [cut]")) == {"x"} for line in lines[:-3])
    assert all(len(line) <= len(lines[0]) for line in lines)
    assert lines[-3:] == [
        prefix + "after",
        prefix + "y" * MAX_LINE_CHARS + " [cut]",
        prefix + "end",
    ]
    cut = [r.getMessage() for r in caplog.records if "longer than" in r.getMessage()]
    assert cut == [
        f"worker {prefix[:-2]} printed a line longer than {MAX_LINE_CHARS} characters; cut"
    ]


def test_a_script_printing_a_crafted_notice_line_cannot_stop_the_drivers_reading(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A notice whose kind is a JSON list (unhashable) is refused like any malformed one,
    and the worker's output keeps arriving (it once ended the reader thread: the worker
    would then block on a full pipe)."""
    from spotring.providers.local.metadata import FakeImds
    from spotring.worker_image.notices import MESSAGE_MARKER
    from spotring.worker_image.peer_abort import JOB_KEY_ENV

    crafted = MESSAGE_MARKER + '{"launch":"x","seq":1,"kind":[],"mac":""}'
    out = io.StringIO()
    launcher = ProcessLauncher(remote=False, output=out)
    with FakeImds() as imds, caplog.at_level("WARNING", logger="spotring.driver.launcher"):
        worker = WorkerSpec(
            host="host-1",
            local_rank=0,
            rank=1,
            argv=("sh", "-c", f"printf '%s\\nafter\\n' '{crafted}'"),
            env={**ENV, JOB_KEY_ENV: os.urandom(32).hex()},
            notices={"watcher": "aws", "endpoint": imds.endpoint("host-1"), "interval": 0.1},
        )
        assert launcher(worker, [])[0] == 0
    assert "after" in out.getvalue()


# ----------------------------------------------------------------- many workers


def _run_all(
    launcher: ProcessLauncher, specs: list[WorkerSpec], events: list[threading.Event]
) -> tuple[list[threading.Thread], dict[int, int]]:
    """Run each spec on a thread of its own, as Horovod's elastic driver does."""
    codes: dict[int, int] = {}

    def run(worker: WorkerSpec) -> None:
        codes[worker.rank] = launcher(worker, events)[0]

    threads = [threading.Thread(target=run, args=(worker,)) for worker in specs]
    for thread in threads:
        thread.start()
    return threads, codes


def _wait_for(predicate: object, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate() and time.monotonic() < deadline:  # type: ignore[operator]
        time.sleep(0.05)
    assert predicate(), "timed out"  # type: ignore[operator]


def test_many_workers_share_one_thread_and_each_exit_keeps_its_code(tmp_path: Path) -> None:
    """However many workers run, the launcher adds one thread of its own to those that
    wait for them (Horovod's); each exit is told with its own code."""
    out, listener = io.StringIO(), Listener()
    launcher = ProcessLauncher(remote=False, listeners=[listener], output=out)
    counted = {}
    for count in (2, 12):
        go = tmp_path / f"go-{count}"
        script = f"echo up; while [ ! -e {go} ]; do sleep 0.05; done; exit $1"
        _wait_for(lambda: launcher.threads == 0, 10)  # the last round's has ended
        # Threads by identity: one an earlier test left may end meanwhile.
        before = set(threading.enumerate())
        specs = [
            WorkerSpec(f"host-{n}", 0, n, ("sh", "-c", script, "w", str(n % 7 + 1)), ENV)
            for n in range(count)
        ]
        threads, codes = _run_all(launcher, specs, [])
        _wait_for(lambda c=count: out.getvalue().count("up\n") == c)  # type: ignore[misc]
        counted[count] = len(set(threading.enumerate()) - before - set(threads))
        assert launcher.threads == 1
        go.touch()
        for thread in threads:
            thread.join(timeout=30)
        assert codes == {n: n % 7 + 1 for n in range(count)}
        out.seek(0)
        out.truncate()
    assert counted == {2: 1, 12: 1}
    exits = {e.rank: e.exit_code for e in listener.exits}
    assert exits == {n: n % 7 + 1 for n in range(12)}
    _wait_for(lambda: launcher.threads == 0, 10)  # nothing left to watch: it ends


def test_each_workers_lines_arrive_in_order_while_many_print_at_once() -> None:
    out = io.StringIO()
    launcher = ProcessLauncher(remote=False, output=out)
    script = "i=0; while [ $i -lt 2000 ]; do echo $i; i=$((i+1)); done"
    threads, codes = _run_all(
        launcher, [WorkerSpec(f"h{n}", 0, n, ("sh", "-c", script), ENV) for n in range(6)], []
    )
    for thread in threads:
        thread.join(timeout=60)
    assert codes == dict.fromkeys(range(6), 0)
    by_worker: dict[str, list[str]] = {}
    for line in out.getvalue().splitlines():
        prefix, text = line.split(": ", 1)
        by_worker.setdefault(prefix, []).append(text)
    assert by_worker == {f"[{n}]<h{n}:0>": [str(i) for i in range(2000)] for n in range(6)}


@pytest.mark.parametrize("chunk", [1, 7, 4096, 1 << 20])
def test_lines_are_cut_once_whatever_the_pipe_hands_over_at_a_time(chunk: int) -> None:
    """The same output read in any chunking gives the same lines: a line of
    MAX_LINE_CHARS or more is cut there once (its rest dropped), shorter ones are
    whole, "\\r\\n" and "\\r" end lines as in text mode, a last line without newline
    comes at the end, and a character split across reads is decoded whole."""
    from spotring.driver.launcher import MAX_LINE_CHARS
    from spotring.driver.output_pump import Watch

    max_ = MAX_LINE_CHARS
    stream = (
        b"a" * (max_ - 1) + b"\n"
        + b"b" * max_ + b"\n"
        + b"c" * (3 * max_ + 5) + b"\n"
        + "d\u00e9\u20ac\r\n".encode() + b"e\rf\n" + b"g" * (max_ + 1)
    )  # fmt: skip
    watch = Watch(subprocess.Popen(["true"]), lambda lines: None, lambda: "w")
    watch.process.wait()
    lines: list[str] = []
    for start in range(0, len(stream), chunk):
        lines += watch._split(stream[start : start + chunk])
    lines += watch._split(b"", final=True)
    assert lines == [
        "a" * (max_ - 1) + "\n",
        "b" * max_ + " [cut]\n",
        "c" * max_ + " [cut]\n",
        "d\u00e9\u20ac\n",
        "e\n",
        "f\n",
        "g" * max_ + " [cut]\n",
    ]


def test_a_failure_of_the_watcher_thread_fails_its_workers_and_hangs_none(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from spotring.driver.output_pump import Pump

    def broken(self: Pump, selector: object, watch: object) -> None:
        raise RuntimeError("a bug in the pump")

    monkeypatch.setattr(Pump, "_read", broken)
    listener = Listener()
    launcher = ProcessLauncher(remote=False, listeners=[listener], output=io.StringIO())
    began = time.monotonic()
    with caplog.at_level("CRITICAL", logger="spotring.driver.output_pump"):
        code, _ = launcher(spec("sh", "-c", "echo hi; sleep 60"), [])
    assert code == LAUNCH_FAILED_EXIT and time.monotonic() - began < 30
    (exit,) = listener.exits
    assert exit.failed and "watcher thread failed" in exit.reason
    assert any("a bug in the pump" in r.getMessage() or r.exc_info for r in caplog.records)


def test_the_workers_of_a_host_share_its_one_ssh_connection(fake_ssh: Path) -> None:
    """Three workers on one host and one on another: two connections (the hosts'
    masters, opened before their first worker), every session carried over them, and
    both closed by close()."""
    out = io.StringIO()
    launcher = ProcessLauncher(remote=True, ssh=SshOptions(host_key_checking="no"), output=out)
    stop = threading.Event()
    specs = [
        WorkerSpec(host, slot, rank, ("sh", "-c", "echo up; read x"), ENV)
        for rank, (host, slot) in enumerate(
            [("10.0.0.1", 0), ("10.0.0.1", 1), ("10.0.0.1", 2), ("10.0.0.2", 0)]
        )
    ]
    try:
        threads, codes = _run_all(launcher, specs, [stop])
        _wait_for(lambda: out.getvalue().count("up\n") == 4)
        masters = [
            line.split("=", 1)[1] for line in launcher.argv("10.0.0.1") if "ControlPath" in line
        ]
        stop.set()
        for thread in threads:
            thread.join(timeout=30)
    finally:
        launcher.close()
    assert sorted(codes) == [0, 1, 2, 3] and 0 not in codes.values()  # stopped, never 0
    log = fake_ssh.read_text().splitlines()
    # Each host's own order (the two hosts' workers start concurrently).
    for host, sessions in (("10.0.0.1", 3), ("10.0.0.2", 1)):
        mine = [line.split()[0] for line in log if line.split()[1:] == [host]]
        assert mine == ["connect"] + ["mux"] * sessions + ["exit"], log
    assert len(log) == 8, log
    (master,) = masters
    assert not os.path.exists(master) and not os.path.exists(os.path.dirname(master))
