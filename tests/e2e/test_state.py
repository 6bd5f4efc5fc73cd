"""spotring.driver.state.TorchState: exact restores, allocation-free commits, data position."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
hvd = pytest.importorskip("horovod.torch")

from horovod.common.elastic import State  # noqa: E402
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: E402
from horovod.runner.elastic.worker import HostUpdateResult  # noqa: E402
from horovod.torch.elastic import ElasticSampler  # noqa: E402
from horovod.torch.elastic import TorchState as HorovodTorchState  # noqa: E402
from horovod.torch.elastic.state import SamplerStateHandler  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from spotring.driver.state import TorchState  # noqa: E402


@pytest.fixture(scope="module")
def horovod_size1():
    """Single-process Horovod (Gloo, size 1): no launcher needed for one worker."""
    hvd.init()
    assert hvd.size() == 1
    yield hvd
    hvd.shutdown()


def _net() -> torch.nn.Module:
    # BatchNorm brings float running stats and an int64 num_batches_tracked buffer.
    return torch.nn.Sequential(
        torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.ReLU(), torch.nn.Linear(8, 3)
    )


def _optimizers(model: torch.nn.Module) -> dict[str, torch.optim.Optimizer]:
    first, *rest = list(model.parameters())
    return {
        # Two groups with different settings; momentum buffers appear at the first step.
        "sgd": torch.optim.SGD(
            [{"params": [first], "lr": 0.05}, {"params": rest, "weight_decay": 1e-3}],
            lr=0.1,
            momentum=0.9,
        ),
        # Tensor step counters plus two moment tensors per parameter.
        "adam": torch.optim.Adam(model.parameters(), lr=1e-2, amsgrad=True),
    }


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int) -> None:
    for _ in range(steps):
        optimizer.zero_grad()
        model(torch.randn(16, 6)).square().mean().backward()
        optimizer.step()


def _bits(value: torch.Tensor) -> torch.Tensor:
    return value.detach().reshape(-1).view(torch.uint8)


def _assert_bitwise_equal(actual: object, expected: object, where: str = "") -> None:
    """Recursive equality; tensors compared byte for byte (NaN-safe, -0.0 != 0.0)."""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), where
        assert (actual.shape, actual.dtype) == (expected.shape, expected.dtype), where
        assert torch.equal(_bits(actual), _bits(expected)), where
    elif isinstance(expected, dict):
        assert isinstance(actual, dict) and list(actual) == list(expected), where
        for key in expected:
            _assert_bitwise_equal(actual[key], expected[key], f"{where}/{key}")
    elif isinstance(expected, list | tuple):
        assert len(actual) == len(expected), where
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            _assert_bitwise_equal(a, e, f"{where}[{i}]")
    else:
        assert actual == expected, where


def _snapshot(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    return copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict())


def _assert_matches(snapshot: tuple[dict, dict], model, optimizer) -> None:
    _assert_bitwise_equal(model.state_dict(), snapshot[0], "model")
    _assert_bitwise_equal(optimizer.state_dict(), snapshot[1], "optimizer")


def _allocated_bytes(fn: Callable[[], object]) -> int:
    """Bytes of tensor storage allocated while fn runs, as torch's CPU allocator reports them.

    Each allocation is attributed to the innermost profiled op (self memory), so nested
    ops are not counted twice; frees are ignored.
    """
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return sum(max(event.self_cpu_memory_usage, 0) for event in prof.events())


def _buffer_ptrs(state: TorchState) -> dict[str, list[int]]:
    # The flat commit buffers of each handler (internal, looked at for the test only).
    return {
        name: [flat.data_ptr() for flat in handler._arena.flats.values()]
        for name, handler in state._handlers.items()
        if hasattr(handler, "_arena")
    }


def _state_bytes(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    tensors = list(model.state_dict().values())
    tensors += [v for s in optimizer.state.values() for v in s.values() if torch.is_tensor(v)]
    return sum(t.numel() * t.element_size() for t in tensors)


@pytest.mark.parametrize("kind", ["sgd", "adam"])
def test_restore_is_bit_exact_and_in_place(kind: str) -> None:
    torch.manual_seed(0)
    model = _net()
    optimizer = _optimizers(model)[kind]
    state = TorchState(model, optimizer, epoch=1)
    _train(model, optimizer, 3)
    state.epoch = 2
    state.save()
    committed = _snapshot(model, optimizer)
    params = [(p, p.data_ptr()) for p in model.parameters()]
    opt_state = optimizer.state
    per_param = {id(p): s for p, s in optimizer.state.items()}

    _train(model, optimizer, 4)  # moves params, buffers, moments, step counts
    optimizer.param_groups[0]["lr"] = 7.0
    state.epoch = 3
    state.restore()

    _assert_matches(committed, model, optimizer)
    assert state.epoch == 2
    # Same objects, same storage: the user's references stay valid.
    assert all(
        q is p and q.data_ptr() == ptr
        for q, (p, ptr) in zip(model.parameters(), params, strict=True)
    )
    assert optimizer.state is opt_state
    assert all(per_param[id(p)] is s for p, s in optimizer.state.items())
    if kind == "adam":
        assert all(s["step"].item() == 3 for s in optimizer.state.values())

    # Training on from the restore matches training on from the committed state_dicts.
    reference_model, reference_opt = _net(), None
    reference_model.load_state_dict(committed[0])
    reference_opt = _optimizers(reference_model)[kind]
    reference_opt.load_state_dict(committed[1])
    torch.manual_seed(5)
    _train(model, optimizer, 2)
    torch.manual_seed(5)
    _train(reference_model, reference_opt, 2)
    _assert_matches(_snapshot(reference_model, reference_opt), model, optimizer)


def test_commit_reuses_buffers_and_allocates_nothing() -> None:
    torch.manual_seed(0)
    model = _net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _train(model, optimizer, 1)
    state = TorchState(model, optimizer)
    ptrs = _buffer_ptrs(state)
    assert all(ptrs.values())

    theirs = HorovodTorchState(model, optimizer)
    # Positive control: the profiler does see horovod's deep copies.
    assert _allocated_bytes(theirs.save) >= _state_bytes(model, optimizer)
    for _ in range(3):
        _train(model, optimizer, 1)
        assert _allocated_bytes(state.save) == 0
    assert _buffer_ptrs(state) == ptrs


def test_new_optimizer_state_gets_buffers_once() -> None:
    torch.manual_seed(0)
    model = _net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = TorchState(model, optimizer)  # no momentum yet
    model_ptrs = _buffer_ptrs(state)["model"]

    _train(model, optimizer, 1)  # momentum buffers appear
    momentum_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    first = _allocated_bytes(state.save)
    assert momentum_bytes <= first < momentum_bytes + 64 * 1024  # one aligned flat buffer
    ptrs = _buffer_ptrs(state)
    assert ptrs["model"] == model_ptrs

    for _ in range(2):
        _train(model, optimizer, 1)
        assert _allocated_bytes(state.save) == 0
    assert _buffer_ptrs(state) == ptrs


def test_state_created_after_commit_is_removed_on_restore() -> None:
    torch.manual_seed(0)
    model = _net()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    state = TorchState(model, optimizer)
    committed = _snapshot(model, optimizer)
    _train(model, optimizer, 2)
    optimizer.param_groups[0]["extra_setting"] = 1
    assert len(optimizer.state) > 0

    state.restore()
    assert len(optimizer.state) == 0
    assert "extra_setting" not in optimizer.param_groups[0]
    _assert_matches(committed, model, optimizer)

    # Entries deleted after a commit come back; an entry added to one parameter goes.
    _train(model, optimizer, 1)
    state.save()
    committed = _snapshot(model, optimizer)
    first, second = list(optimizer.state.values())[:2]
    del first["exp_avg"]
    second["extra"] = torch.zeros(3)
    state.restore()
    _assert_matches(committed, model, optimizer)


def test_commit_every_saves_every_nth_call(horovod_size1, monkeypatch) -> None:
    torch.manual_seed(0)
    model = _net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = TorchState(model, optimizer, commit_every=3)
    saves, checks = [], []
    save, check = state.save, state.check_host_updates
    monkeypatch.setattr(state, "save", lambda: (saves.append(1), save())[1])
    monkeypatch.setattr(state, "check_host_updates", lambda: (checks.append(1), check())[1])

    seen = []
    for call in range(1, 8):
        _train(model, optimizer, 1)
        if call == 6:
            committed = _snapshot(model, optimizer)
        state.commit()
        seen.append(state.steps_since_commit)
    assert seen == [1, 2, 0, 1, 2, 0, 1]
    assert len(saves) == len(checks) == 2

    _train(model, optimizer, 1)
    state.restore()  # back to call 6: the seventh call was not saved
    _assert_matches(committed, model, optimizer)
    assert state.steps_rolled_back == 1
    assert state.steps_since_commit == 0

    # A host update is noticed by the next saving commit(), not by the free ones.
    state.on_hosts_updated(time.time(), HostUpdateResult.added)
    state.commit()
    state.commit()
    with pytest.raises(HostsUpdatedInterrupt):
        state.commit()
    assert state.steps_since_commit == 0


def test_sync_commits_what_it_synchronised(horovod_size1) -> None:
    torch.manual_seed(0)
    model = _net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = TorchState(model, optimizer, commit_every=5)
    state.commit()
    assert state.steps_since_commit == 1
    # horovod's broadcast_optimizer_state initialises empty optimizer state with a
    # zero-gradient step, so even a single worker's state changes in sync().
    state.sync()
    assert state.steps_since_commit == 0
    synced = _snapshot(model, optimizer)
    assert len(optimizer.state) > 0
    _train(model, optimizer, 1)
    state.restore()
    _assert_matches(synced, model, optimizer)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="commit_every"):
        TorchState(_net(), commit_every=0)
    with pytest.raises(ValueError, match="offload"):
        TorchState(_net(), offload="disk")


def test_plugs_into_horovod_like_torchstate() -> None:
    model = _net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    state = TorchState(model, optimizer, batch=0, note=None)
    assert isinstance(state, State)
    assert state.model is model and state.optimizer is optimizer and state.batch == 0
    # Plain attributes behave as in horovod's ObjectState: saved by save, reset by restore.
    state.batch = 5
    state.save()
    state.batch = 9
    state.restore()
    assert state.batch == 5
    # Assigning a tracked attribute re-targets its handler and commits the new object.
    other = _net()
    state.model = other
    committed = copy.deepcopy(other.state_dict())
    with torch.no_grad():
        next(other.parameters()).add_(1.0)
    state.restore()
    assert state.model is other
    _assert_bitwise_equal(other.state_dict(), committed)


def test_sampler_handler_is_horovods(horovod_size1) -> None:
    sampler = ElasticSampler(list(range(10)))
    state = TorchState(_net(), sampler=sampler)
    assert isinstance(state._handlers["sampler"], SamplerStateHandler)


def _batches(sampler: ElasticSampler, size: int) -> Iterator[list[int]]:
    indices = list(iter(sampler))
    for start in range(0, len(indices), size):
        yield indices[start : start + size]


class _Counter(torch.nn.Module):
    """A model whose state records which samples it has trained on."""

    def __init__(self, samples: int) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(1, 1)
        self.register_buffer("seen", torch.zeros(samples, dtype=torch.int64))

    def forward(self, batch: list[int]) -> torch.Tensor:
        self.seen[batch] += 1
        return self.linear(torch.tensor(batch, dtype=torch.float32)[:, None])


def test_sampler_position_matches_commits_across_failures(horovod_size1) -> None:
    """hvd.elastic.run with failures between commits: every sample trained on exactly once."""
    samples, batch_size, epochs = 50, 4, 2
    torch.manual_seed(0)
    model = _Counter(samples)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    sampler = ElasticSampler(list(range(samples)), shuffle=True, seed=3)
    state = TorchState(model, optimizer, sampler=sampler, epoch=0, commit_every=3)
    resets = []
    state.register_reset_callbacks([lambda: resets.append(1)])
    fail_at = {4, 9, 10, 15, 20, 21}  # global batch numbers; some right after a save
    log = {"batches": 0, "pending": [], "committed": [], "processed": 0, "lost": 0, "redone": 0}

    @hvd.elastic.run
    def train(state: TorchState) -> None:
        while state.epoch < epochs:
            for batch in _batches(state.sampler, batch_size):
                log["batches"] += 1
                if log["batches"] in fail_at:
                    log["lost"] += len(log["pending"])
                    log["redone"] += sum(len(b) for b in log["pending"])
                    log["pending"].clear()
                    raise HorovodInternalError("simulated peer failure")
                state.optimizer.zero_grad()
                state.model(batch).square().mean().backward()
                state.optimizer.step()
                log["processed"] += len(batch)
                log["pending"].append(batch)
                state.sampler.record_batch(0, len(batch))
                state.commit()
                if state.steps_since_commit == 0:
                    log["committed"] += log["pending"]
                    log["pending"] = []
            # The live model (committed + pending batches) has seen each sample once.
            assert state.model.seen.tolist() == [1] * samples
            state.model.seen.zero_()
            state.epoch += 1
            state.sampler.set_epoch(state.epoch)
            state.save()  # end of epoch: commit whatever the last commit() left over
            log["committed"] += log["pending"]
            log["pending"] = []

    train(state)
    flat = [i for batch in log["committed"] for i in batch]
    assert len(flat) == epochs * samples
    for epoch in range(epochs):
        assert sorted(flat[epoch * samples : (epoch + 1) * samples]) == list(range(samples))
    assert len(resets) == len(fail_at)
    assert log["lost"] > 0 and state.steps_rolled_back == log["lost"]
    assert log["processed"] == epochs * samples + log["redone"]


def test_model_and_sampler_roll_back_together(horovod_size1) -> None:
    """restore() + sync() mid-epoch: the committed model has seen each sample once."""
    samples, batch_size = 37, 5
    model = _Counter(samples)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    sampler = ElasticSampler(list(range(samples)), shuffle=True, seed=1)
    state = TorchState(model, optimizer, sampler=sampler, commit_every=4)
    batches, done = 0, False
    while not done:
        done = True
        for batch in _batches(sampler, batch_size):
            batches += 1
            model(batch)
            sampler.record_batch(0, len(batch))
            state.commit()
            if batches in (3, 6, 7, 13) and state.steps_since_commit:
                state.restore()
                state.sync()
                done = False
                break
    state.save()
    assert state.steps_rolled_back > 0
    state.restore()
    assert model.seen.tolist() == [1] * samples


_TWO_WORKERS = textwrap.dedent(
    """
    import torch
    import horovod.torch as hvd
    from horovod.torch.elastic import ElasticSampler
    from spotring.driver.state import TorchState

    hvd.init()
    samples, batch_size = 42, 3
    torch.manual_seed(hvd.rank())  # different start: sync() must align the workers
    model = torch.nn.Linear(1, 1)
    model.register_buffer("seen", torch.zeros(samples, dtype=torch.int64))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    sampler = ElasticSampler(list(range(samples)), shuffle=True, seed=2)
    state = TorchState(model, optimizer, sampler=sampler, commit_every=2)
    state.sync()
    state.restore()  # the commit must hold the synchronised state, not this rank's own
    weights = hvd.allgather(model.weight.detach().reshape(1, -1))
    assert torch.equal(weights[0], weights[1])
    batches, done = 0, False
    while not done:
        done = True
        indices = list(iter(sampler))
        for start in range(0, len(indices), batch_size):
            batch = indices[start : start + batch_size]
            batches += 1
            # Replicated state, as in data-parallel training: every worker counts the
            # samples of all workers (sync() broadcasts rank 0's model to the others).
            everyone = hvd.allgather(torch.tensor(batch))
            model.seen.index_add_(0, everyone, torch.ones_like(everyone))
            optimizer.zero_grad()
            model(torch.tensor(batch, dtype=torch.float32)[:, None]).sum().backward()
            for p in model.parameters():
                p.grad = hvd.allreduce(p.grad, op=hvd.Average)
            optimizer.step()
            sampler.record_batch(0, batch_size)
            state.commit()
            if batches in (3, 8) and state.steps_since_commit:
                state.restore()
                state.sync()
                done = False
                break
    state.save()
    assert model.seen.tolist() == [1] * samples, model.seen.tolist()
    weights = hvd.allgather(model.weight.detach().reshape(1, -1))
    assert torch.equal(weights[0], weights[1])
    assert state.steps_rolled_back == 2
    print("rank", hvd.rank(), "ok")
    """
)


_JOINING_WORKER = textwrap.dedent(
    """
    import torch
    import horovod.torch as hvd
    from spotring.driver.state import TorchState

    hvd.init()
    torch.manual_seed(hvd.rank())
    model = torch.nn.Sequential(
        torch.nn.Linear(4, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2)
    )
    optimizer = hvd.DistributedOptimizer(
        torch.optim.Adam(model.parameters(), lr=1e-3), named_parameters=model.named_parameters()
    )
    state = TorchState(model, optimizer, epoch=0, note="")
    if hvd.rank() == 0:  # a worker that trained; rank 1 just joined: no optimizer state
        for _ in range(3):  # no backward(): its hooks would allreduce
            model(torch.randn(16, 4))  # moves BatchNorm's running statistics
            for p in model.parameters():
                p.grad = torch.randn_like(p)
            super(optimizer.__class__, optimizer).step()  # this worker alone
        optimizer.param_groups[0]["lr"] = 0.05
        state.epoch, state.note = 3, "from rank 0"
        state.save()  # plain attributes are synchronised as last committed (horovod's way)
    state.sync()

    def gathered(tensor):
        return hvd.allgather(tensor.detach().reshape(1, -1).to(torch.float64))

    for key, tensor in model.state_dict().items():
        both = gathered(tensor)
        assert torch.equal(both[0], both[1]), key
    assert len(optimizer.state) == 6
    for param_state in optimizer.state.values():
        for key, tensor in param_state.items():
            both = gathered(tensor)
            assert torch.equal(both[0], both[1]), key
    assert float(optimizer.state[next(model.parameters())]["step"]) == 3
    assert optimizer.param_groups[0]["lr"] == 0.05
    assert (state.epoch, state.note) == (3, "from rank 0")
    state.restore()  # the commit holds rank 0's state too
    assert state.epoch == 3 and optimizer.param_groups[0]["lr"] == 0.05
    print("rank", hvd.rank(), "ok")
    """
)


def _run_two_workers(tmp_path: Path, source: str) -> None:
    horovodrun = Path(sys.executable).parent / "horovodrun"
    if not horovodrun.exists():
        pytest.skip("horovodrun not installed next to the interpreter")
    script = tmp_path / "two_workers.py"
    script.write_text(source)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    result = subprocess.run(
        [str(horovodrun), "-np", "2", "-H", "localhost:2", "--gloo", sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count(" ok") == 2


@pytest.mark.e2e
def test_two_workers_roll_back_consistently(tmp_path: Path) -> None:
    _run_two_workers(tmp_path, _TWO_WORKERS)


@pytest.mark.e2e
def test_sync_gives_a_joining_worker_rank_0s_state(tmp_path: Path) -> None:
    """Model tensors and buffers, optimizer state created by the joining worker's
    zero-gradient step, optimizer settings and plain attributes: all rank 0's."""
    _run_two_workers(tmp_path, _JOINING_WORKER)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("offload", ["auto", "device"])
def test_cuda_commit(offload: str) -> None:
    torch.manual_seed(0)
    model = _net().cuda()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)

    def train(steps: int) -> None:
        for _ in range(steps):
            optimizer.zero_grad()
            model(torch.randn(16, 6, device="cuda")).square().mean().backward()
            optimizer.step()

    train(2)
    state = TorchState(model, optimizer, offload=offload)
    flats = [f for h in state._handlers.values() for f in h._arena.flats.values()]
    if offload == "auto":
        cuda_flats = [f for f in flats if f.is_cuda]
        assert not cuda_flats
        assert any(f.is_pinned() for f in flats)
    else:
        assert any(f.is_cuda for f in flats)
    train(1)
    before = torch.cuda.memory_allocated()
    state.save()
    assert torch.cuda.memory_allocated() == before
    committed = _snapshot(model, optimizer)
    train(3)
    state.restore()
    _assert_matches(committed, model, optimizer)
