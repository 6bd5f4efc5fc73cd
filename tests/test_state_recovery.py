"""TorchState after a failure mid-step: what the elastic restore must undo."""

from __future__ import annotations

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
    # The step fails here (a peer died); Horovod restores the last commit.
    state.restore()
    optimizer.zero_grad()  # raised AssertionError before the fix
    model(torch.ones(3, 4)).sum().backward()
    optimizer.step()
    state.commit()
