"""spotring's Gloo abort (horovod-failure-paths.patch), on a real two-rank Horovod ring.

The peer-failure abort shuts down a survivor's Gloo sockets, which fails every pair and
what is queued on them. About one hard kill in fifty left a survivor waiting anyway, in
a receive no failing pair knew of, until ``HOROVOD_GLOO_TIMEOUT_SECONDS``. The patch's
entry point fails every wait of the contexts that exist. Here a live peer that never
answers (stopped) keeps rank 0's background loop in such a wait, with no socket failing:
only the entry point can free it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("horovod.torch")

from horovod.runner.common.util.hosts import SlotInfo

from spotring.driver.rendezvous import RingTracker
from tests.fakes.store_signing import JOB_KEY, key_pipe_env

RANK_SCRIPT = Path(__file__).parents[1] / "data" / "gloo_abort_rank.py"
GLOO_TIMEOUT_SECONDS = 30


def rank_environment(rank: int, port: int) -> dict[str, str]:
    """What Horovod's Gloo init reads: rank 0 and 1 of a ring on hosts h0 and h1."""
    return {
        **os.environ,
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1",
        "HOROVOD_GLOO_RENDEZVOUS_PORT": str(port),
        "HOROVOD_CONTROLLER": "gloo",
        "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_IFACE": "lo",
        "HOROVOD_GLOO_TIMEOUT_SECONDS": str(GLOO_TIMEOUT_SECONDS),
        "HOROVOD_HOSTNAME": f"h{rank}",
        "HOROVOD_RANK": str(rank),
        "HOROVOD_SIZE": "2",
        "HOROVOD_LOCAL_RANK": "0",
        "HOROVOD_LOCAL_SIZE": "1",
        "HOROVOD_CROSS_RANK": str(rank),
        "HOROVOD_CROSS_SIZE": "2",
    }


@pytest.fixture
def ring_server() -> Iterator[int]:
    tracker = RingTracker()
    port = tracker.start(address="127.0.0.1", job_key=JOB_KEY)
    tracker.init([SlotInfo(f"h{r}", r, 0, r, 2, 1, 2) for r in range(2)])
    try:
        yield port
    finally:
        tracker.stop()


def stopped(process: subprocess.Popen[str]) -> bool:
    with open(f"/proc/{process.pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[0] == "T"


def run_ring(port: int, *rank0_args: str) -> str:
    """Form the ring, stop rank 1, let rank 0 allreduce: how rank 0's allreduce ended."""
    ranks = []
    for rank in range(2):
        key_env, key_fd = key_pipe_env()  # the job key, as spotring's supervisor hands it
        ranks.append(
            subprocess.Popen(
                [sys.executable, str(RANK_SCRIPT), *(rank0_args if rank == 0 else ())],
                env={**rank_environment(rank, port), **key_env},
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                pass_fds=(key_fd,),
            )
        )
        os.close(key_fd)
    try:
        for rank in ranks:
            assert rank.stdout is not None and rank.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 10
        while not stopped(ranks[1]):
            assert time.monotonic() < deadline, "rank 1 did not stop"
            time.sleep(0.02)
        assert ranks[0].stdin is not None and ranks[0].stdout is not None
        ranks[0].stdin.write("go\n")
        ranks[0].stdin.flush()
        return ranks[0].stdout.readline().strip()
    finally:
        for rank in ranks:
            rank.kill()
            rank.wait()


def test_the_abort_frees_a_wait_no_failing_socket_would_end(ring_server: int) -> None:
    ended = run_ring(ring_server)
    assert ended.startswith("failed after "), ended
    seconds = float(ended.split()[2])
    # Called 0.5 s in; waits look every 20 ms. Without the abort: 30 s.
    assert seconds < 3, ended


def test_a_worker_waiting_for_a_collective_leaves_the_cpu_to_others(ring_server: int) -> None:
    """horovod-waits.patch: ``synchronize`` sleeps until the collective is done.
    Stock Horovod polls in a ``yield`` loop, a busy core per waiting worker (measured:
    2.2 s of CPU in a 2 s wait), which on a shared machine slows the very peer the
    ring waits for (a joining worker)."""
    ended = run_ring(ring_server, "--abort-after", "1.5")
    assert ended.startswith("failed after "), ended
    waited, cpu = float(ended.split()[2]), float(ended.split()[4])
    assert waited >= 1.4, ended
    assert cpu < 0.1 * waited, ended
