"""The torch.distributed backend's in-place mode on real Gloo groups of local processes.

Each test runs examples/torch_inplace.py as 2-3 worker processes and plays the driver
with a :class:`StorePublisher` over a TCPStore in this process. Chaos is triggered by
the workers' progress (the commits rank 0 reports), never by the clock; the waits
below are upper bounds well under Gloo's own timeout (inplace.GROUP_TIMEOUT, 60 s), so
a survivor that waited a timeout out fails the test.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from spotring.torch.coordinator import StorePublisher  # noqa: E402
from spotring.torch.inplace import FORMATION_TIMEOUT  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "torch_inplace.py"
WAIT = timedelta(seconds=40)
"""Longest wait for one report after chaos: under Gloo's 60 s, so a survivor that waited
Gloo's timeout out fails the test."""
STARTED = timedelta(seconds=180)
"""Longest wait for the first reports: interpreters importing torch on a loaded machine."""


class Job:
    """Worker processes of the example, this process's store, and the driver's half."""

    def __init__(self, tmp_path: Path) -> None:
        self.store = dist.TCPStore("127.0.0.1", 0, None, True, timeout=WAIT, wait_for_workers=False)
        self.publisher = StorePublisher(self.store, "127.0.0.1", self.store.port)
        self.report = dist.PrefixStore("example/", self.store)
        self.workers: dict[str, subprocess.Popen[bytes]] = {}
        self._logs = tmp_path

    def start(self, worker: str, *extra: str) -> None:
        log = open(self._logs / f"{worker}.log", "wb")  # noqa: SIM115  # the child's
        self.workers[worker] = subprocess.Popen(
            [sys.executable, str(EXAMPLE), "--store", f"127.0.0.1:{self.store.port}",
             "--worker-id", worker, *extra],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "PYTHONPATH": str(REPO)},
        )  # fmt: skip

    def wait(self, key: str, within: timedelta = WAIT) -> str:
        try:
            self.report.wait([key], within)
        except dist.DistStoreError:
            pytest.fail(f"no {key} within {within}: {self.logs()}")
        return self.report.get(key).decode()

    def committed_batches(self, up_to: int) -> list[int]:
        return [b for b in range(1, up_to + 1) if self.report.check([f"committed/{b}"])]

    def finish(self, worker: str) -> tuple[int, int, str]:
        batch, rolled_back, digest = self.wait(f"done/{worker}").split()
        assert self.workers[worker].wait(timeout=WAIT.total_seconds()) == 0, self.logs()
        return int(batch), int(rolled_back), digest

    def logs(self) -> str:
        return "\n".join(
            f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
            for p in sorted(self._logs.glob("*.log"))
        )

    def stop(self) -> None:
        for process in self.workers.values():
            if process.poll() is None:
                process.send_signal(signal.SIGCONT)
                process.kill()
            process.wait()


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Job]:
    job = Job(tmp_path)
    yield job
    job.stop()


STEPS = "30"


def test_killed_peer_survivors_reform_without_losing_a_commit_and_ddp_goes_on(job: Job) -> None:
    # A commit every 3 steps: the survivors have steps to roll back. DDP, wrapped again
    # in the new group, must keep the survivors' models equal to the end.
    extra = ("--steps", STEPS, "--commit-every", "3", "--ddp")
    for worker in ("a", "b", "c"):
        job.start(worker, *extra)
    job.publisher.publish(["a", "b", "c"])
    job.wait("stepped/8", STARTED)  # two steps past the commit of 6: steps to roll back

    job.workers["c"].send_signal(signal.SIGKILL)
    job.workers["c"].wait()
    last_commit = max(job.committed_batches(int(STEPS)))
    job.publisher.publish(["a", "b"])

    starts = {w: job.wait(f"start/1/{w}").split() for w in ("a", "b")}
    # Each survivor starts the new group at a commit, the newest: none lost, and nothing
    # after it kept (the steps since were rolled back). The newest may be one that was
    # saved just before the kill and not yet reported.
    (start,) = {int(batch) for batch, _ in starts.values()}
    assert start % 3 == 0 and last_commit <= start <= last_commit + 3, (start, last_commit)
    assert starts["a"][1] == starts["b"][1]  # synced
    results = {w: job.finish(w) for w in ("a", "b")}
    assert {batch for batch, _, _ in results.values()} == {int(STEPS)}
    assert results["a"][2] == results["b"][2]  # the same model and optimizer at the end


def test_joiner_is_synced_bit_for_bit_and_nothing_is_rolled_back(job: Job) -> None:
    for worker in ("a", "b"):
        job.start(worker, "--steps", STEPS)
    job.publisher.publish(["a", "b"])
    job.wait("committed/5", STARTED)

    job.start("j", "--steps", STEPS)
    job.publisher.publish(["a", "b", "j"], abandon=False)

    starts = {w: job.wait(f"start/1/{w}", STARTED).split() for w in ("a", "b", "j")}
    assert len({digest for _, digest in starts.values()}) == 1, starts
    assert len({batch for batch, _ in starts.values()}) == 1, starts
    results = {w: job.finish(w) for w in ("a", "b", "j")}
    assert {rolled_back for _, rolled_back, _ in results.values()} == {0}
    assert len({digest for _, _, digest in results.values()}) == 1


def test_hung_peer_is_aborted_from_outside_not_waited_out(job: Job) -> None:
    for worker in ("a", "b", "c"):
        job.start(worker, "--steps", STEPS)
    job.publisher.publish(["a", "b", "c"])
    job.wait("committed/5", STARTED)

    job.workers["c"].send_signal(signal.SIGSTOP)  # its peers block on it in a collective
    job.publisher.publish(["a", "b"])  # the driver's verdict: abandon, go on without it

    # WAIT (40 s) is under Gloo's 60 s: only an abort gets the survivors here in time.
    starts = {w: job.wait(f"start/1/{w}").split() for w in ("a", "b")}
    assert starts["a"] == starts["b"]
    results = {w: job.finish(w) for w in ("a", "b")}
    assert {batch for batch, _, _ in results.values()} == {int(STEPS)}


DIES_AFTER_PUBLISHING = """
import os, signal, socket, struct, sys
import torch.distributed as dist
os.environ["GLOO_ENABLE_RANK_AS_SEQUENCE_NUMBER"] = "1"  # Gloo's formation as members run it
os.environ["GLOO_ENABLE_STORE_V2_API"] = "1"
from spotring.torch.coordinator import StoreCoordinator
from spotring.worker_image.peer_abort import tcp_sockets

coordinator = StoreCoordinator("127.0.0.1", int(sys.argv[1]), "x")
membership = coordinator.next_membership(after=-1)
inner = coordinator.group_store(membership)


def listening_address():
    for _, sock in tcp_sockets():
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
            return sock.getsockname()


class DiesAfterPublishing(dist.Store):
    \"\"\"The generation's store, until this member has written its address, with the
    port the test gave, then dies once its peers have written theirs (they are past the
    store, in Gloo's connects).\"\"\"

    def set(self, key, value):
        host, port = listening_address()
        assert host == sys.argv[2], f"Gloo listens on {host}, not {sys.argv[2]}"
        ours = struct.pack("<H", socket.AF_INET) + struct.pack("!H", port)
        value = bytes(value)
        assert ours in value, "the address is not Gloo's sockaddr_in as expected"
        inner.set(key, value.replace(ours, ours[:2] + struct.pack("!H", int(sys.argv[3])), 1))
        prefix = key.rstrip("0123456789")
        inner.wait([prefix + str(r) for r in range(membership.world_size)])
        os.kill(os.getpid(), signal.SIGKILL)  # a preemption between publishing and connecting

    def get(self, key):
        return inner.get(key)

    def wait(self, keys, timeout=None):
        inner.wait(keys)

    def check(self, keys):
        return inner.check(keys)

    def add(self, key, value):
        return inner.add(key, value)

    def has_extended_api(self):
        return True

    def multi_get(self, keys):
        return inner.multi_get(keys)

    def multi_set(self, keys, values):
        inner.multi_set(keys, values)


dist.init_process_group("gloo", store=DiesAfterPublishing(), rank=membership.rank,
                        world_size=membership.world_size)
"""


@pytest.fixture
def unanswered(tmp_path: Path) -> Iterator[int]:
    """A port on Gloo's address where connects go unanswered (a host gone): a listener
    whose one-place queue is full drops every SYN, and Linux retries them for minutes.
    Its port sorts below every ephemeral port as Gloo compares them (network order read
    as a number), so a survivor connects to it rather than waiting for it."""
    host = socket.gethostbyname(socket.gethostname())
    with socket.socket() as hole:
        for high in range(4, 128):  # port high * 256 reads as `high` < 128 <= any ephemeral
            with contextlib.suppress(OSError):
                hole.bind((host, high * 256))
                break
        hole.listen(0)
        with socket.create_connection(hole.getsockname()):  # the queue's one place
            yield hole.getsockname()[1]


@pytest.mark.parametrize("side", ["waits for its connection", "connects to it"])
def test_a_peer_lost_after_publishing_its_address_holds_the_forming_group_no_longer(
    job: Job, tmp_path: Path, side: str, request: pytest.FixtureRequest
) -> None:
    # Gloo's order (the greater address connects): at the greatest port, it connects to
    # the survivors and they wait for it; at the unanswered one they connect to it.
    port = 0xFFFF if side == "waits for its connection" else request.getfixturevalue("unanswered")
    for worker in ("a", "b"):
        job.start(worker, "--steps", "100000")
    job.publisher.publish(["a", "b"])
    job.wait("committed/5", STARTED)

    # Rank 1 of the next generation publishes its address and dies before it connects.
    host = socket.gethostbyname(socket.gethostname())
    joiner = subprocess.Popen(
        [sys.executable, "-c", DIES_AFTER_PUBLISHING, str(job.store.port), host, str(port)],
        stdout=open(tmp_path / "x.log", "wb"), stderr=subprocess.STDOUT,  # noqa: SIM115
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    job.publisher.publish(["a", "x", "b"], abandon=False)
    assert joiner.wait(STARTED.total_seconds()) == -signal.SIGKILL, job.logs()
    job.publisher.publish(["a", "b"])  # the driver's verdict: abandon, go on without it
    abandoned = time.monotonic()

    starts = {w: job.wait(f"start/2/{w}").split() for w in ("a", "b")}
    assert starts["a"] == starts["b"]
    # Gloo alone holds them five times the formation timeout (10 s) from when they
    # began to wait: the abandonment ends the wait (formation.release).
    bound = 5 * FORMATION_TIMEOUT.total_seconds()
    assert time.monotonic() - abandoned < bound / 2, job.logs()
