"""Durable checkpoints of the in-place torch state: what rank 0 writes loads back whole."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from spotring.checkpoint.payload import PayloadBuffers  # noqa: E402
from spotring.torch.inplace import TorchState  # noqa: E402
from spotring.worker_image.durable import apply_snapshot, deserialize, snapshot_state  # noqa: E402


def trained_state(seed: int) -> TorchState:
    torch.manual_seed(seed)
    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    return TorchState(model, optimizer, batch=0, epoch=0)


def test_a_snapshot_of_a_commit_loads_into_a_fresh_state_bit_for_bit() -> None:
    state = trained_state(1)
    state.batch, state.epoch = 17, 2
    state.commit()
    payload = bytes(snapshot_state(state, PayloadBuffers()).serialized())

    fresh = trained_state(2)
    apply_snapshot(fresh, deserialize(payload))
    assert (fresh.batch, fresh.epoch) == (17, 2)
    assert fresh.model is not None and state.model is not None
    pairs = zip(fresh.model.state_dict().values(), state.model.state_dict().values(), strict=True)
    assert all(torch.equal(mine, theirs) for mine, theirs in pairs)
    assert fresh.optimizer is not None and state.optimizer is not None
    momentum = [s["momentum_buffer"] for s in fresh.optimizer.state_dict()["state"].values()]
    expected = [s["momentum_buffer"] for s in state.optimizer.state_dict()["state"].values()]
    assert all(torch.equal(a, b) for a, b in zip(momentum, expected, strict=True))
    fresh.batch = 99
    fresh.restore()  # what was loaded is the commit
    assert fresh.batch == 17


def test_a_checkpoint_of_other_objects_is_refused() -> None:
    state = trained_state(1)
    state.commit()
    payload = bytes(snapshot_state(state, PayloadBuffers()).serialized())
    other = TorchState(torch.nn.Linear(4, 2), batch=0, epoch=0)  # no optimizer
    with pytest.raises(ValueError, match="does not match"):
        apply_snapshot(other, deserialize(payload))
