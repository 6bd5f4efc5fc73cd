"""Durable checkpoints (``--checkpoint``): what they cost the training loop, and how long
a commit takes to become durable next to a plain write of the same bytes.

Everything runs in this process on one Horovod rank (``hvd.init()``, size 1), with the
worker's own hooks (:class:`spotring.worker_image.durable.DurableCommits`) applied to the
state's ``commit`` here rather than installed on Horovod's classes, as
``tests/unit/test_durable_worker.py`` does.

**Cost on the training loop.** The model of ``bench/commit.py`` (about 28 M float32
parameters, 26 Linear + LayerNorm blocks, a BatchNorm, SGD momentum: 224 MB of state)
trains on CPU, batch 64: zero_grad, forward, MSE loss, backward, optimizer step, and a
commit after every step (spotring's loss bound: a worker lost costs one step), every
commit through the worker's durable hooks writing to a local directory (a temporary
one). A checkpoint costs the loop where it happens: the copy of the state on the
training thread (into the reused host buffer that is the payload), then the background
threads' hashing and write (at a lower priority) competing with the training for the
interpreter lock and for this machine's cores (torch's intra-op threads use them all),
the real cost on a CPU-bound worker. So each checkpoint is measured in place: about
3 s of steps, then the hooks' clock moves on by one interval (that commit is copied
and written, as in a run with ``--checkpoint``), steps until its write ended and one
more, then 3 s of steps again; the training time it lost is the window's steps against
as many at the median rate of the steps either side (which drift with this machine's
load over minutes, far more than one checkpoint costs: blocks a whole interval long
with and without the hooks spread by -6 % to +13 % at 60 s here). Nine checkpoints,
the median; the row is the step time at the default ``--checkpoint-every`` (60 s, one
checkpoint per interval) against the plain step, and extra gives the loss per
checkpoint, from which another interval follows (lost / interval), and the hooks' own
cost between checkpoints (the commit alone with and without them, in turn; added to the
row). The same with
``hvd.elastic.TorchState`` (whose commit deep-copies the state) is a second row.

**Commit to durable.** The same state, not training: the hooks with an interval of 0
(every commit copied), timed from the moment the copy is handed to the background
writer (the ``committed_at`` in the checkpoint's meta) until its manifest was stored
(the data, hashed while it is put, then the manifest: from then on it is complete and
durable; pruning the oldest beyond ``keep`` follows, and extra gives the time until
``Checkpoints.write`` returned too, and the process's CPU time while this thread only
waited for the write: the background's CPU per checkpoint, which a CPU-bound training
loses at most). The anchor is ``store.put`` of the same bytes
(one checkpoint's payload) through the same store
object: the write bandwidth of that client. Rounds interleave both, each first in every
other round; medians. Once for a local directory (written with fsync, as the store
does; 9 rounds, 4 with ``--quick``: a disk shared with other work takes the same put in
0.1 s or several times that, at random) and once for S3 through moto's server in a
process of its own (boto3's managed multipart upload, 16 MiB parts, 8 in parallel; 3
rounds, 1 with ``--quick``), on loopback and this machine's cores.

    python -m bench.durable [--quick]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

from bench.common import FAKE_CREDENTIALS, REGION, Row, format_extras, format_table, row

LOOP = "durable checkpoint cost on the training loop"
LATENCY = "time from commit to durable"
BATCH = 64
BUCKET = "spotring-bench-durable"


# ----------------------------------------------------------------- instruments


class _Recorder:
    """A :class:`~spotring.checkpoint.Checkpoints` whose writes are timed and counted
    (the hooks call ``write`` from their background thread, ``load_latest`` on resume)."""

    def __init__(self, checkpoints: Any) -> None:
        self.checkpoints = checkpoints
        self.finished = 0
        self.failed = 0
        self.writes: list[dict[str, float]] = []
        self._cond = threading.Condition()

    def write(self, step: int, payload: Any, meta: dict[str, Any]) -> Any:
        called = time.time()
        ok = False
        try:
            info = self.checkpoints.write(step, payload, meta)
            ok = True
            return info
        finally:
            ended = time.time()
            with self._cond:
                self.finished += 1
                if ok:
                    self.writes.append(
                        {
                            "committed_at": float(meta["committed_at"]),
                            "called": called,
                            "ended": ended,
                            "bytes": memoryview(payload).nbytes,
                        }
                    )
                else:
                    self.failed += 1
                self._cond.notify_all()

    def load_latest(self) -> Any:
        return self.checkpoints.load_latest()

    def load_latest_decoded(self, decode: Callable[[bytes], Any]) -> Any:
        return self.checkpoints.load_latest_decoded(decode)

    def wait(self, count: int, timeout: float = 300.0) -> None:
        """Until ``count`` writes have ended (written or failed)."""
        with self._cond:
            if not self._cond.wait_for(lambda: self.finished >= count, timeout):
                raise RuntimeError(f"checkpoint write {count} not done in {timeout:g} s")


@contextlib.contextmanager
def _timed_snapshots() -> Iterator[list[float]]:
    """Seconds each copy of the state took on the training thread (the hooks call the
    module's ``snapshot_state`` right before handing the copy to the writer)."""
    from spotring.worker_image import durable

    took: list[float] = []
    original = durable.snapshot_state

    def timed(state: Any, *args: Any) -> Any:
        begin = time.perf_counter()
        try:
            return original(state, *args)
        finally:
            took.append(time.perf_counter() - begin)

    durable.snapshot_state = timed
    try:
        yield took
    finally:
        durable.snapshot_state = original


class _TimedStore:
    """A store whose calls inside ``Checkpoints.write`` are timed: the data's put, and
    the rest (the manifest's put, pruning's list and deletes)."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.uri = store.uri
        self.data_s: list[float] = []
        self.other_s = 0.0
        self.manifests_stored: list[float] = []
        """When each manifest's put returned: its checkpoint is complete and durable."""

    def _timed(self, data: bool, call: Callable[..., Any], *args: Any) -> Any:
        begin = time.perf_counter()
        try:
            return call(*args)
        finally:
            took = time.perf_counter() - begin
            if data:
                self.data_s.append(took)
            else:
                self.other_s += took

    def put(self, key: str, data: Any) -> None:
        self._timed(key.endswith("/data"), self.store.put, key, data)
        if key.endswith("/manifest.json"):
            self.manifests_stored.append(time.time())

    def get(self, key: str) -> bytes:
        return self.store.get(key)

    def list(self, prefix: str = "") -> list[str]:
        return self._timed(False, self.store.list, prefix)  # type: ignore[no-any-return]

    def delete(self, key: str) -> None:
        self._timed(False, self.store.delete, key)


def _hooks(recorder: _Recorder, uri: str, every: float, clock: Callable[[], float]) -> Any:
    import horovod.torch as hvd

    from spotring.worker_image.durable import DurableCommits, DurableConfig

    return DurableCommits(
        DurableConfig(uri=uri, every=every, keep=recorder.checkpoints.keep, job_id="bench"),
        recorder,
        rank=lambda: int(hvd.rank()),
        broadcast_object=hvd.broadcast_object,
        flush_requested=lambda: False,
        clock=clock,
    )


def _close(hooks: Any) -> None:
    """Let the hooks' background writer thread end (it would otherwise stay parked)."""
    writer = getattr(hooks, "_writer", None)
    if writer is not None:
        writer.close()


# ----------------------------------------------------------------- the workload


def _workload(state_class: type, seed: int = 0) -> tuple[Any, Callable[[], None], int]:
    """(state, one training step without its commit, parameters)."""
    import torch

    from bench.commit import _model

    torch.manual_seed(seed)
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    batches = [(torch.randn(BATCH, 1024), torch.randn(BATCH, 640)) for _ in range(4)]
    state = state_class(model, optimizer, epoch=0, step=0)
    position = [0]

    def step() -> None:
        x, y = batches[position[0] % len(batches)]
        position[0] += 1
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()
        state.step += 1

    step()  # momentum buffers exist before the first commit
    state.commit()
    return state, step, sum(p.numel() for p in model.parameters())


def _loop_overhead(state_class: type, label: str, every: float, checkpoints: int) -> Row:
    """What one checkpoint costs the training loop, measured where it happens: steps
    with the durable hooks, a checkpoint taken now and then; the steps from its copy
    until its write ended (and one more) against the same number at the rate of the
    steps just before and after it. Per interval, that cost over the interval."""
    import torch

    from spotring.checkpoint import Checkpoints, open_store

    state, train_step, params = _workload(state_class)
    plain_commit = type(state).commit
    folder = tempfile.mkdtemp(prefix="spotring-bench-durable-")
    recorder = _Recorder(Checkpoints(open_store(folder), job_id="bench", keep=3))
    # The hooks' clock moves on by one interval when a checkpoint is wanted: that
    # commit is copied, and no other.
    now = [0.0]
    hooks = _hooks(recorder, folder, every, lambda: now[0])
    durable_commit = hooks.wrap_commit(plain_commit)

    def steps(count: int, commit: Callable[[Any], Any], into: list[float]) -> None:
        for _ in range(count):
            begin = time.perf_counter()
            train_step()
            commit(state)
            into.append(time.perf_counter() - begin)

    commit_s: list[float] = []
    warm: list[float] = []
    plain: list[float] = []
    lost: list[float] = []
    window_steps: list[int] = []
    try:
        with _timed_snapshots() as snapshots:
            steps(3, plain_commit, [])  # warm-up: first touches, allocator caches
            for _ in range(5):
                begin = time.perf_counter()
                train_step()
                middle = time.perf_counter()
                plain_commit(state)
                warm.append(time.perf_counter() - begin)
                commit_s.append(time.perf_counter() - middle)
            # About 3 s of steps either side: enough for a rate, too short for drift.
            around = max(8, round(3.0 / statistics.median(warm)))
            steps(around, durable_commit, [])  # the first copy: buffers allocated
            now[0] += every
            steps(1, durable_commit, [])
            recorder.wait(1)
            for _ in range(checkpoints):
                before: list[float] = []
                window: list[float] = []
                after: list[float] = []
                steps(around, durable_commit, before)
                now[0] += every
                # Until its checkpoint is written, and one step more (the write may
                # end mid-step); bounded, in case a write hangs.
                limit = time.monotonic() + 60
                wanted = recorder.finished + 1
                steps(1, durable_commit, window)
                while recorder.finished < wanted and time.monotonic() < limit:
                    steps(1, durable_commit, window)
                steps(1, durable_commit, window)
                steps(around, durable_commit, after)
                rate = statistics.median(before + after)
                lost.append(sum(window) - rate * len(window))
                window_steps.append(len(window))
                plain += before + after
            recorder.wait(len(snapshots))
            # The hooks between checkpoints: the commit alone, with and without them in
            # turn (a step's own time varies by more than they cost).
            hooked: list[float] = []
            unhooked: list[float] = []
            for turn in range(40):
                pair = [(durable_commit, hooked), (plain_commit, unhooked)]
                for commit, into in pair if turn % 2 else pair[::-1]:
                    begin = time.perf_counter()
                    commit(state)
                    into.append(time.perf_counter() - begin)
    finally:
        _close(hooks)
        shutil.rmtree(folder, ignore_errors=True)

    step_ms = statistics.median(plain) * 1e3
    lost_s = statistics.median(lost)
    # One checkpoint per interval, and the hooks on every commit.
    hooks_ms = (statistics.median(hooked) - statistics.median(unhooked)) * 1e3
    with_ms = step_ms * (1 + lost_s / every) + max(0.0, hooks_ms)
    written = recorder.writes
    extra = {
        "state class": label,
        "params": params,
        "batch": BATCH,
        "commit every steps": 1,
        "checkpoints measured": len(lost),
        "steps either side": around,
        "steps from a copy until its write ended, +1": window_steps,
        "training s lost per checkpoint (median)": round(lost_s, 3),
        "training s lost per checkpoint (each)": [round(x, 3) for x in lost],
        "overhead at --checkpoint-every 10 (%)": round(lost_s / 10 * 100, 2),
        "hooks between checkpoints, median commit ms with / without": (
            f"{statistics.median(hooked) * 1e3:.2f} / {statistics.median(unhooked) * 1e3:.2f}"
        ),
        "checkpoints written": len(written),
        "checkpoints failed": recorder.failed,
        "checkpoint MiB": round(written[0]["bytes"] / 2**20, 1) if written else None,
        "commit ms (plain, median)": round(statistics.median(commit_s) * 1e3, 1),
        "snapshot ms on the training thread (median, max)": (
            f"{statistics.median(snapshots) * 1e3:.0f}, {max(snapshots) * 1e3:.0f}"
            if snapshots
            else None
        ),
        "commit to durable s while training (median)": (
            round(statistics.median(w["ended"] - w["committed_at"] for w in written), 2)
            if written
            else None
        ),
        "torch threads": torch.get_num_threads(),
    }
    return row(
        f"{LOOP} ({label})",
        f"ms per step at --checkpoint-every {every:g}",
        with_ms,
        "same loop, no --checkpoint",
        step_ms,
        target="<= 1.02x",
        extra=extra,
    )


# ----------------------------------------------------------------- commit -> durable


def _latency(state: Any, uri: str, kind: str, rounds: int) -> Row:
    """Median commit -> durable against a plain put of the same bytes, same store."""
    import hashlib

    from spotring.checkpoint import Checkpoints, open_store
    from spotring.checkpoint.payload import PayloadBuffers
    from spotring.worker_image.durable import snapshot_state

    store = open_store(uri)
    timed = _TimedStore(store)
    recorder = _Recorder(Checkpoints(timed, job_id="bench", keep=2))
    hooks = _hooks(recorder, uri, 0.0, time.monotonic)
    commit = hooks.wrap_commit(type(state).commit)
    # The bytes a checkpoint holds, as the hooks write them.
    payload = bytes(snapshot_state(state, PayloadBuffers()).serialized())
    begin = time.perf_counter()
    hashlib.sha256(payload).hexdigest()
    sha_s = time.perf_counter() - begin
    raw_key = "bench-raw/data"
    raw: list[float] = []
    background_cpu: list[float] = []
    try:
        store.put(raw_key, payload)  # warm-up: the client, its connections, the files
        store.delete(raw_key)
        for n in range(rounds):
            # Each first in every other round: neither always follows the other's
            # deletes (a pruned checkpoint, the raw object) into the file system.
            for hooked in (True, False) if n % 2 == 0 else (False, True):
                if hooked:
                    ended = recorder.finished
                    commit(state)
                    # This thread only waits now: the process's CPU time until the write
                    # ends is the background's, which a CPU-bound training would lose.
                    cpu = time.process_time()
                    recorder.wait(ended + 1)
                    background_cpu.append(time.process_time() - cpu)
                    continue
                begin = time.perf_counter()
                store.put(raw_key, payload)
                raw.append(time.perf_counter() - begin)
                store.delete(raw_key)
    finally:
        _close(hooks)
    if recorder.failed:
        raise RuntimeError(f"{recorder.failed} checkpoint write(s) to {kind} failed")
    # Durable once its manifest is stored; pruning the oldest comes after.
    stored = timed.manifests_stored
    to_durable = [m - w["committed_at"] for w, m in zip(recorder.writes, stored, strict=True)]
    to_returned = [w["ended"] - w["committed_at"] for w in recorder.writes]
    handoff = [w["called"] - w["committed_at"] for w in recorder.writes]
    write = [w["ended"] - w["called"] for w in recorder.writes]
    size = len(payload)
    value, anchor = statistics.median(to_durable), statistics.median(raw)
    extra = {
        "bytes": size,
        "commit to durable MiB/s": round(size / value / 2**20, 1),
        "raw put MiB/s": round(size / anchor / 2**20, 1),
        "hand-off s (submit to write; nothing to serialise)": round(statistics.median(handoff), 3),
        "Checkpoints.write s (data with sha256 alongside, manifest, prune)": round(
            statistics.median(write), 3
        ),
        "of which data put s": round(statistics.median(timed.data_s), 3),
        "of which manifest + prune s (mean)": round(timed.other_s / rounds, 3),
        "commit to write returned (pruned) s": round(statistics.median(to_returned), 3),
        "background CPU s per checkpoint (median)": round(statistics.median(background_cpu), 3),
        "sha256 of the payload s (alone, this thread)": round(sha_s, 3),
        "fastest s commit to durable / raw put": f"{min(to_durable):.3f} / {min(raw):.3f}",
        "rounds": rounds,
    }
    return row(
        f"{LATENCY} ({kind})",
        "s, 224 MB state",
        value,
        "store.put of the same bytes",
        anchor,
        target="<= 1.2x",
        extra=extra,
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def _moto_s3() -> Iterator[str]:
    """moto's server in a process of its own (its CPU is not this process's GIL), a
    bucket in it, and the environment boto3 needs to find it; yields the URI."""
    server = shutil.which("moto_server", path=os.path.dirname(sys.executable))
    if server is None:
        raise RuntimeError("moto_server is not installed (scripts/setup.sh dev)")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {
        **FAKE_CREDENTIALS,
        "AWS_DEFAULT_REGION": REGION,
        "AWS_ENDPOINT_URL_S3": url,
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    }
    process = subprocess.Popen(
        [server, "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    saved = {name: os.environ.get(name) for name in env}
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"{url}/moto-api/", timeout=2):
                    break
            except (urllib.error.URLError, OSError):
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("moto_server did not start") from None
                time.sleep(0.2)
        os.environ.update(env)
        import boto3

        boto3.client("s3", endpoint_url=url, region_name=REGION).create_bucket(Bucket=BUCKET)
        yield f"s3://{BUCKET}/jobs/bench"
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# ----------------------------------------------------------------- entry point


def measure(quick: bool = False) -> list[Row]:
    """The rows: the loop's overhead with each state class, then commit -> durable for a
    local directory and for S3 (moto)."""
    import horovod.torch as hvd
    from horovod.torch.elastic import TorchState as HorovodTorchState

    from spotring.torch import TorchState
    from spotring.worker_image.durable import DEFAULT_EVERY_SECONDS

    # The product's default interval: the cost a user of --checkpoint pays (the
    # training time lost per checkpoint, in the extras, gives it at other intervals).
    every = DEFAULT_EVERY_SECONDS
    hvd.init()
    try:
        rows = [
            _loop_overhead(TorchState, "spotring TorchState", every, 2 if quick else 9),
            _loop_overhead(HorovodTorchState, "hvd.elastic.TorchState", every, 2 if quick else 9),
        ]
        state, _, _ = _workload(TorchState, seed=1)
        folder = tempfile.mkdtemp(prefix="spotring-bench-durable-")
        try:
            rows.append(_latency(state, folder, "local directory", 4 if quick else 9))
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        with _moto_s3() as uri:
            rows.append(_latency(state, uri, "S3 via moto", 1 if quick else 3))
    finally:
        hvd.shutdown()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter blocks, fewer rounds")
    rows = measure(quick=parser.parse_args().quick)
    print(format_table(rows))
    print(format_extras(rows))


if __name__ == "__main__":
    main()
