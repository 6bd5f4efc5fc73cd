"""spotring.worker_image.durable: commits copied durably in the background, loaded by
the first sync of a ring without state; with both state classes, on one Horovod rank.

The hooks are applied to the state's own methods here (not installed on Horovod's
classes), so no other test's state objects are touched.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
hvd = pytest.importorskip("horovod.torch")

from horovod.common.exceptions import HostsUpdatedInterrupt  # noqa: E402
from horovod.torch.elastic import TorchState as HorovodTorchState  # noqa: E402

from spotring.checkpoint import Checkpoints, Fence, JobLock, open_store  # noqa: E402
from spotring.checkpoint.lock import LOCK_KEY, LockState  # noqa: E402
from spotring.torch import TorchState  # noqa: E402
from spotring.worker_image.durable import (  # noqa: E402
    DurableCommits,
    DurableConfig,
    deserialize,
)

STATE_CLASSES = {"spotring": TorchState, "horovod": HorovodTorchState}


@pytest.fixture(scope="module", autouse=True)
def horovod_size1():  # type: ignore[no-untyped-def]
    hvd.init()
    yield
    hvd.shutdown()


def _make_state(cls: type, seed: int) -> Any:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = cls(model, optimizer, epoch=0, step=0, seen=torch.zeros(5, dtype=torch.int32))
    return state


def _train(state: Any, steps: int) -> None:
    for _ in range(steps):
        state.optimizer.zero_grad()
        state.model(torch.randn(8, 4)).sum().backward()
        state.optimizer.step()
        state.step += 1
        state.seen = state.seen + 1


class _Hooks:
    """The durable hooks around one state object, with a clock the test moves."""

    def __init__(
        self,
        directory: Path,
        every: float = 10.0,
        flush: Callable[[], bool] = lambda: False,
        fence: Fence | None = None,
    ) -> None:
        self.now = 1000.0
        self.checkpoints = Checkpoints(
            open_store(str(directory)), job_id="job", keep=3, fence=fence
        )
        self.durable = DurableCommits(
            DurableConfig(uri=str(directory), every=every, job_id="job"),
            self.checkpoints,
            rank=lambda: int(hvd.rank()),
            broadcast_object=hvd.broadcast_object,
            flush_requested=flush,
            clock=lambda: self.now,
            flush_poll=0.01,
        )

    def commit(self, state: Any) -> None:
        self.durable.wrap_commit(type(state).commit)(state)

    def sync(self, state: Any) -> None:
        self.durable.wrap_sync(type(state).sync)(state)

    def wait_for(self, count: int) -> list[Any]:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            found = self.checkpoints.list()
            if len(found) >= count:
                return found
            time.sleep(0.05)
        raise AssertionError(f"{count} checkpoints not written: {self.checkpoints.list()}")


@pytest.mark.parametrize("name", STATE_CLASSES)
def test_a_fresh_ring_resumes_from_the_newest_commit_written(name: str, tmp_path: Path) -> None:
    hooks = _Hooks(tmp_path)
    state = _make_state(STATE_CLASSES[name], seed=1)
    hooks.sync(state)  # the job's first ring: nothing to load
    _train(state, 3)
    hooks.commit(state)  # the first commit is copied
    hooks.wait_for(1)
    _train(state, 2)
    hooks.now += 1
    hooks.commit(state)  # not due: 1 s of 10
    _train(state, 2)
    hooks.now += 10
    hooks.commit(state)  # due
    (newest, *_) = hooks.wait_for(2)
    committed = {k: v.clone() for k, v in state.model.state_dict().items()}
    momentum = [s["momentum_buffer"].clone() for s in state.optimizer.state.values()]
    assert newest.meta["commits"] == 3 and hooks.durable.commits == 3
    _train(state, 4)  # lost with the ring

    # Every worker died: a new process's rank 0, with the script's initial state.
    fresh = _Hooks(tmp_path)
    again = _make_state(STATE_CLASSES[name], seed=2)
    fresh.sync(again)
    assert again.step == 7 and torch.equal(again.seen, torch.full((5,), 7, dtype=torch.int32))
    for key, value in again.model.state_dict().items():
        assert torch.equal(value, committed[key]), key
    got = [s["momentum_buffer"] for s in again.optimizer.state.values()]
    assert all(torch.equal(a, b) for a, b in zip(got, momentum, strict=True))
    assert fresh.durable.commits == 3, "the job's commit count goes on from the checkpoint"
    _train(again, 1)
    again.restore()  # the loaded state is the committed one
    assert again.step == 7
    fresh.sync(again)  # a later sync loads nothing
    assert again.step == 7


def test_a_payload_is_data_not_code(tmp_path: Path) -> None:
    """Loading never unpickles arbitrary objects (torch's weights_only)."""
    import io
    import pickle

    class Boom:
        def __reduce__(self) -> tuple[Any, ...]:
            return (print, ("ran code",))

    buffer = io.BytesIO()
    torch.save({"handlers": {}, "attributes": {"x": Boom()}}, buffer, pickle_module=pickle)
    with pytest.raises(pickle.UnpicklingError):
        deserialize(buffer.getvalue())


@pytest.mark.parametrize("name", STATE_CLASSES)
def test_a_ring_whose_every_host_leaves_writes_its_last_commit_before_stopping(
    name: str, tmp_path: Path
) -> None:
    asked = threading.Event()
    hooks = _Hooks(tmp_path, every=3600, flush=lambda: asked.is_set())
    state = _make_state(STATE_CLASSES[name], seed=1)
    hooks.sync(state)
    _train(state, 2)
    hooks.commit(state)
    hooks.wait_for(1)
    _train(state, 3)
    hooks.commit(state)  # not due for an hour: no copy
    assert len(hooks.checkpoints.list()) == 1

    # The driver asks for the flush; Horovod's host check raises at the next commit.
    asked.set()
    _train(state, 1)
    hvd_state_commit = type(state).commit

    def commit_then_hosts_changed(self: Any) -> None:
        hvd_state_commit(self)
        raise HostsUpdatedInterrupt(True)

    with pytest.raises(HostsUpdatedInterrupt):
        hooks.durable.wrap_commit(commit_then_hosts_changed)(state)
    # Written before commit returned: nothing after it is lost.
    newest = hooks.checkpoints.list()[0]
    assert newest.meta["commits"] == 3
    _, payload = hooks.checkpoints.load_latest() or (None, b"")
    assert deserialize(payload)["attributes"]["step"] == 6


def test_a_failed_write_is_said_and_the_training_goes_on(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("a file where the checkpoints should go")
    hooks = _Hooks(blocker / "inside")
    state = _make_state(TorchState, seed=1)
    hooks.sync(state)
    _train(state, 1)
    hooks.commit(state)
    said, deadline = "", time.monotonic() + 10
    while "NOT written" not in said and time.monotonic() < deadline:
        time.sleep(0.05)
        said += capfd.readouterr().err
    assert "spotring durable: checkpoint of commit 1 NOT written" in said, said
    _train(state, 1)
    hooks.now += 100
    hooks.commit(state)
    assert state.step == 2
    deadline = time.monotonic() + 10  # the next one is tried, and said, too
    while "commit 2 NOT written" not in said and time.monotonic() < deadline:
        time.sleep(0.05)
        said += capfd.readouterr().err
    assert "commit 2 NOT written" in said


def test_while_the_driver_asks_every_commit_is_durable_before_training_goes_on(
    tmp_path: Path,
) -> None:
    """The last host stays in its ring to the end (nobody to hand the state to): no ring
    change at its commits, so rank 0 hears the request from its watcher."""
    asked = threading.Event()
    hooks = _Hooks(tmp_path, every=3600, flush=lambda: asked.is_set())
    state = _make_state(TorchState, seed=1)
    hooks.sync(state)
    _train(state, 1)
    hooks.commit(state)
    hooks.wait_for(1)
    asked.set()
    time.sleep(0.2)  # the watcher asks every 10 ms here
    for expected in (2, 3):
        _train(state, 1)
        hooks.commit(state)
        assert hooks.checkpoints.list()[0].meta["commits"] == expected  # written already
    asked.clear()
    time.sleep(0.2)
    _train(state, 1)
    hooks.commit(state)  # not due for an hour, and no longer asked
    time.sleep(0.2)
    assert hooks.checkpoints.list()[0].meta["commits"] == 3


def test_a_ring_whose_lock_another_driver_took_stops_writing_with_one_warning(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Rank 0 writes under the generation its driver was started with; once the lock is
    another driver's, it says so once and copies no state any more."""
    store = open_store(str(tmp_path))
    lock = JobLock(store, job_id="job")
    lock.acquire()
    hooks = _Hooks(tmp_path, fence=lock.fence)
    state = _make_state(TorchState, seed=1)
    hooks.sync(state)
    _train(state, 1)
    hooks.commit(state)
    (written,) = hooks.wait_for(1)
    assert written.lock_generation == lock.fence.generation
    # Another driver of the job takes the lock (this one was taken for dead).
    store.put(
        LOCK_KEY, LockState("job", "another-driver", lock.fence.generation + 1, True).encode()
    )
    for _ in range(3):
        _train(state, 1)
        hooks.now += 100
        hooks.commit(state)
    said, deadline = "", time.monotonic() + 10
    while "another driver" not in said and time.monotonic() < deadline:
        time.sleep(0.05)
        said += capfd.readouterr().err
    _train(state, 1)
    hooks.now += 100
    hooks.commit(state)  # after the warning: not even copied
    said += capfd.readouterr().err
    assert said.count("NOT written") == 1, said
    assert "nor any after it: another driver of the job holds its checkpoints now" in said
    assert hooks.checkpoints.list() == [written]
    assert hooks.durable._writer is not None and hooks.durable._writer.superseded
