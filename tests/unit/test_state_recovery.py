"""TorchState after a failure mid-step: what the elastic restore must undo."""

from __future__ import annotations

import time

import horovod.torch as hvd
import pytest
import torch

from spotring.driver.state import TorchState


@pytest.fixture(scope="module", autouse=True)
def horovod() -> None:
    hvd.init()


def test_restore_forgets_allreduces_of_a_failed_step(monkeypatch: pytest.MonkeyPatch) -> None:
    # Elastic mode registers the gradient hooks even in a world of one.
    monkeypatch.setenv("HOROVOD_ELASTIC", "1")
    model = torch.nn.Linear(4, 2)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
        named_parameters=model.named_parameters(),
    )
    state = TorchState(model, optimizer, step=0)
    state.commit()
    model(torch.ones(3, 4)).sum().backward()  # hooks start allreduces
    assert optimizer._handles, "the test needs in-flight allreduce handles"
    # Let Horovod's background thread finish them, as a reset's shutdown would: a new
    # allreduce of a name still in flight is refused, whatever restore does.
    handles = [handle for handle, _ in optimizer._handles.values() if handle is not None]
    while not all(hvd.poll(handle) for handle in handles):
        time.sleep(0.001)
    # The step fails here (a peer died); Horovod restores the last commit.
    state.restore()
    optimizer.zero_grad()  # raised AssertionError before the fix
    model(torch.ones(3, 4)).sum().backward()
    optimizer.step()
    state.commit()


def test_commit_adopts_cpu_state_into_one_buffer_and_survives_replaced_tensors() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(2, 8)).sum().backward()
    optimizer.step()
    params = list(model.parameters())
    state = TorchState(model, optimizer)
    state.commit()
    storages = {p.untyped_storage().data_ptr() for p in params}
    assert len(storages) == 1, "parameters were not moved into one flat buffer"
    assert params == list(model.parameters()), "parameters must stay the same objects"

    committed = [p.detach().clone() for p in params]
    # Someone replaces a parameter's storage: commits must fall back, not go stale.
    params[0].data = params[0].data.clone()
    with torch.no_grad():
        params[0].add_(1.0)
    committed[0] = params[0].detach().clone()
    state.commit()
    with torch.no_grad():
        for p in params:
            p.mul_(3.0)
    state.restore()
    for p, saved in zip(params, committed, strict=True):
        assert torch.equal(p, saved)
