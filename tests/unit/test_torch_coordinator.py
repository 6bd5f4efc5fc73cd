"""The in-place mode's parts without a process group: the coordinator over a TCPStore in
this process, the state's commit and restore, and an import that needs no Horovod."""

from __future__ import annotations

import subprocess
import sys
import threading
from datetime import timedelta
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from spotring.torch import inplace  # noqa: E402
from spotring.torch.coordinator import Membership, StoreCoordinator, StorePublisher  # noqa: E402

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def store() -> dist.TCPStore:
    return dist.TCPStore(
        "127.0.0.1", 0, None, True, timeout=timedelta(seconds=10), wait_for_workers=False
    )


def test_a_worker_gets_each_generation_it_is_in_and_passes_over_the_others(store) -> None:
    publisher = StorePublisher(store, "127.0.0.1", store.port)
    a = StoreCoordinator("127.0.0.1", store.port, "a")
    b = StoreCoordinator("127.0.0.1", store.port, "b")
    assert a.latest() == -1
    publisher.publish(["a", "b"])
    publisher.publish(["b"])  # a left
    publisher.publish(["b", "a"])  # a back, as rank 1

    assert b.next_membership(-1) == Membership(0, 1, 2, "127.0.0.1", store.port)
    assert b.next_membership(0) == Membership(1, 0, 1, "127.0.0.1", store.port)
    assert a.next_membership(-1).generation == 0
    assert a.next_membership(0) == Membership(2, 1, 2, "127.0.0.1", store.port)
    assert a.latest() == 2


def test_a_watch_ends_on_abandonment_or_when_closed(store) -> None:
    publisher = StorePublisher(store, "127.0.0.1", store.port)
    worker = StoreCoordinator("127.0.0.1", store.port, "a")
    publisher.publish(["a"])
    abandoned, closed = worker.watch(0), worker.watch(0)
    results: dict[str, bool] = {}
    threads = [
        threading.Thread(target=lambda: results.__setitem__("closed", closed.wait()), daemon=True),
        threading.Thread(
            target=lambda: results.__setitem__("abandoned", abandoned.wait()), daemon=True
        ),
    ]
    for thread in threads:
        thread.start()
    closed.close()
    threads[0].join(timeout=10)
    assert results == {"closed": False}

    publisher.publish(["a"])  # abandons 0
    threads[1].join(timeout=10)
    assert results == {"closed": False, "abandoned": True}


def test_a_join_is_published_without_abandoning_the_current_generation(store) -> None:
    publisher = StorePublisher(store, "127.0.0.1", store.port)
    publisher.publish(["a"])
    publisher.publish(["a", "j"], abandon=False)
    assert not store.check(["spotring/abandoned/0"])
    publisher.publish(["a"])
    assert store.check(["spotring/abandoned/1"])


def test_commit_every_n_and_restore_roll_back_to_the_last_save() -> None:
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = inplace.TorchState(model, optimizer, commit_every=2, batch=0)
    saved = None
    for _ in range(3):  # saves at the 2nd call only
        model.weight.data += 1
        state.batch += 1
        state.commit()
        if state.batch == 2:
            saved = model.weight.detach().clone()  # not weight - 1 later: float rounding
    assert saved is not None and not torch.equal(model.weight, saved)
    state.restore()
    assert state.batch == 2
    assert torch.equal(model.weight, saved)
    assert state.steps_rolled_back == 1


def test_the_in_place_mode_imports_no_horovod() -> None:
    code = "import sys, spotring.torch.inplace; print('horovod' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True
    )
    assert out.stdout.strip() == "False"
