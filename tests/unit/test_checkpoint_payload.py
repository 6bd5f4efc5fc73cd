"""spotring.checkpoint.payload and its use by the durable hooks: a checkpoint's data is a
JSON header and the raw tensor bytes (no pickle), copied once into a reused host buffer;
a damaged one is skipped with one warning; the torch.save checkpoints of earlier
versions still load."""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
hvd = pytest.importorskip("horovod.torch")

from horovod.torch.elastic import ElasticSampler  # noqa: E402
from horovod.torch.elastic import TorchState as HorovodTorchState  # noqa: E402

from spotring.checkpoint import Checkpoints, open_store  # noqa: E402
from spotring.checkpoint import payload as fmt  # noqa: E402
from spotring.torch import TorchState  # noqa: E402
from spotring.worker_image import durable  # noqa: E402
from spotring.worker_image.durable import (  # noqa: E402
    DurableCommits,
    DurableConfig,
    deserialize,
    serialize,
    snapshot_state,
)

STATE_CLASSES = {"spotring": TorchState, "horovod": HorovodTorchState}


@pytest.fixture(scope="module", autouse=True)
def horovod_size1():  # type: ignore[no-untyped-def]
    hvd.init()
    yield
    hvd.shutdown()


def _same(a: Any, b: Any) -> bool:
    """Equal values of the same types, tensors compared by dtype, shape and contents
    (NaN equal to NaN)."""
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and bool(torch.equal(a, b) or torch.isnan(a).equal(torch.isnan(b)))
        )
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return bool(a == b)


def _tree() -> dict[str, Any]:
    odict: OrderedDict[str, Any] = OrderedDict(weight=torch.randn(3, 2), bias=torch.zeros(0))
    odict._metadata = OrderedDict({"": {"version": 2}})  # type: ignore[attr-defined]
    dtypes = [torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16,
              torch.int32, torch.int64, torch.uint8, torch.bool, torch.complex64]  # fmt: skip
    return {
        "module": odict,
        "by dtype": [torch.ones(4, 3).to(d) for d in dtypes],
        "scalar": torch.tensor(2.5),
        "strided": torch.arange(12.0).view(3, 4).t(),
        "ints": {0: {"momentum": torch.full((2,), 7.0)}, -3: None, (1, "a"): "tuple key"},
        "$looks like a tag": {"$t": 0},
        "floats": [1.5, math.inf, -math.inf, math.nan, 2**70],
        "tuple": (1, (2, "3")),
        "set": {1, 2, 3},
        "bytes": b"\x00\xff",
        "text": "é",
    }


def test_a_tree_round_trips_without_pickle() -> None:
    tree = _tree()
    data = bytes(fmt.encode(tree))
    assert fmt.is_payload(data) and data.startswith(b"SPOTCKPT")
    back = fmt.decode(data)
    assert _same(back, tree)
    assert back["module"]._metadata == {"": {"version": 2}}
    # Each tensor is its own writable memory, not a view of the bytes read.
    back["scalar"].add_(1)
    assert back["scalar"].item() == 3.5 and fmt.decode(data)["scalar"].item() == 2.5


@pytest.mark.parametrize(
    "value",
    [object(), torch.zeros(3).to_sparse(), torch.zeros(2, dtype=torch.float8_e4m3fn)],
    ids=["object", "sparse", "float8"],
)
def test_what_the_format_cannot_hold_is_refused_when_writing(value: Any) -> None:
    with pytest.raises(TypeError):
        fmt.plan({"x": [value]})


def test_a_truncated_or_damaged_payload_is_refused() -> None:
    data = bytes(fmt.encode(_tree()))
    for cut in (0, 10, 64, len(data) // 2, len(data) - 1):
        with pytest.raises(ValueError):
            fmt.decode(data[:cut])
    with pytest.raises(ValueError):
        fmt.decode(data + b"\x00")
    header_at = int.from_bytes(data[16:24], "little")
    broken = bytearray(data)
    broken[header_at + 5] = ord("}")
    with pytest.raises(ValueError):
        fmt.decode(bytes(broken))
    # A tensor entry pointing into the header is refused, not read.
    lying = data.replace(b'"offset":64,', b'"offset":' + str(header_at).encode() + b",", 1)
    assert lying != data
    with pytest.raises(ValueError):
        fmt.decode(lying)


def _forged(
    entries: list[dict[str, Any]], state: Any, data: bytes = b"\0" * 4096, raw_state: bytes = b""
) -> bytes:
    """A payload of ``data`` (the tensor bytes, from offset 64) with this header (its
    state ``raw_state``, JSON text, if given)."""
    header = json.dumps({"tensors": entries, "state": state}).encode()
    if raw_state:
        header = header.replace(b'"state": null', b'"state": ' + raw_state)
    end = 64 + len(data)
    prefix = fmt._PREFIX.pack(fmt.MAGIC, fmt.VERSION, 0, end, len(header)).ljust(64, b"\0")
    return prefix + data + header


def _entry(offset: int, count: int = 256) -> dict[str, Any]:
    return {"dtype": "float32", "shape": [count], "offset": offset, "nbytes": 4 * count}


def test_a_forged_header_is_refused_not_amplified() -> None:
    """Regions that overlap (each entry a copy of the same bytes: 400 entries make a
    1 MiB payload 400 MiB), regions out of order, too many entries or values, a tree
    nested too deep, unhashable keys: all ValueError, before any large allocation."""
    good = _forged([_entry(64), _entry(64 + 1024)], [{"$t": 0}, {"$t": 1}])
    assert [t.numel() for t in fmt.decode(good)] == [256, 256]
    forged = {
        "overlapping": _forged([_entry(64)] * 400, [{"$t": i} for i in range(400)]),
        "descending": _forged([_entry(64 + 1024), _entry(64)], []),
        "deep": _forged([], _nested(fmt.MAX_DEPTH + 1)),
        "deeper than json parses": _forged([], None, raw_state=b"[" * 10**5 + b"]" * 10**5),
        "unhashable set member": _forged([], {"$set": [[1]]}),
        "unhashable key": _forged([], {"$dict": [[[1], 2]]}),
        "bytes not text": _forged([], {"$bytes": 5}),
    }
    for name, data in forged.items():
        with pytest.raises(ValueError):
            fmt.decode(data)
            pytest.fail(name)


def _nested(depth: int) -> Any:
    tree: Any = 0
    for _ in range(depth):
        tree = [tree]
    return tree


def test_tables_and_trees_beyond_the_caps_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fmt, "MAX_TENSORS", 3)
    monkeypatch.setattr(fmt, "MAX_NODES", 100)
    fmt.decode(_forged([_entry(64, 0)] * 3, list(range(90))))
    with pytest.raises(ValueError, match="tensor entries"):
        fmt.decode(_forged([_entry(64, 0)] * 4, []))
    with pytest.raises(ValueError, match="larger than 100"):
        fmt.decode(_forged([], list(range(100))))


def test_buffers_are_reused_once_given_back_and_never_while_in_use() -> None:
    buffers = fmt.PayloadBuffers()
    tree = {"w": torch.randn(1000)}
    first, release_first = buffers.encode(tree)
    second, release_second = buffers.encode(tree)  # the first is still being written
    address = torch.frombuffer(first, dtype=torch.uint8).data_ptr()
    assert torch.frombuffer(second, dtype=torch.uint8).data_ptr() != address
    release_first()
    release_second()
    tree["w"].add_(1)
    third, _ = buffers.encode(tree)
    assert torch.frombuffer(third, dtype=torch.uint8).data_ptr() in (
        address,
        torch.frombuffer(second, dtype=torch.uint8).data_ptr(),
    )
    assert torch.equal(fmt.decode(bytes(third))["w"], tree["w"])


def _make_state(cls: type, seed: int) -> Any:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    sampler = ElasticSampler(list(range(20)), shuffle=False)
    state = cls(model, optimizer, sampler=sampler, epoch=0, step=0, best=math.inf)
    return state


def _train(state: Any, steps: int) -> None:
    for _ in range(steps):
        state.optimizer.zero_grad()
        state.model(torch.randn(8, 4)).sum().backward()
        state.optimizer.step()
        state.step += 1
    state.sampler.record_batch(0, 4)


def _hooks(directory: Path) -> DurableCommits:
    return DurableCommits(
        DurableConfig(uri=str(directory), every=3600, job_id="job"),
        Checkpoints(open_store(str(directory)), job_id="job", keep=3),
        rank=lambda: int(hvd.rank()),
        broadcast_object=hvd.broadcast_object,
        flush_requested=lambda: False,
    )


def _committed(state: Any) -> tuple[Any, ...]:
    return (
        {k: v.clone() for k, v in state.model.state_dict().items()},
        [{k: v.clone() for k, v in s.items()} for s in state.optimizer.state.values()],
        state.sampler.state_dict(),
        state.step,
        state.best,
    )


def _resumed(directory: Path, cls: type) -> Any:
    """A fresh process's rank 0 with the script's initial state, after its first sync."""
    again = _make_state(cls, seed=2)
    hooks = _hooks(directory)
    hooks.wrap_sync(type(again).sync)(again)
    return again


@pytest.mark.parametrize("name", STATE_CLASSES)
def test_a_state_is_written_in_the_format_and_resumes_the_same(name: str, tmp_path: Path) -> None:
    cls = STATE_CLASSES[name]
    state = _make_state(cls, seed=1)
    hooks = _hooks(tmp_path)
    hooks.wrap_sync(cls.sync)(state)
    _train(state, 3)
    hooks.wrap_commit(cls.commit)(state)
    deadline = time.monotonic() + 30
    while not hooks._checkpoints.list() and time.monotonic() < deadline:
        time.sleep(0.05)
    expected = _committed(state)
    _, data = hooks._checkpoints.load_latest() or (None, b"")
    assert fmt.is_payload(data), "written as a JSON header and raw tensor bytes"
    # The same snapshot torch.save held, value for value.
    reference = deserialize(bytes(serialize(durable._state_tree(state))))
    assert _same(deserialize(data), reference)
    _train(state, 2)  # lost with the ring

    again = _resumed(tmp_path, cls)
    assert _same(_committed(again), expected)


@pytest.mark.parametrize("name", STATE_CLASSES)
def test_a_torch_save_checkpoint_of_an_earlier_version_still_resumes(
    name: str, tmp_path: Path
) -> None:
    cls = STATE_CLASSES[name]
    state = _make_state(cls, seed=1)
    _train(state, 2)
    state.commit()
    old = serialize(durable._host_copy(durable._state_tree(state)))
    assert not fmt.is_payload(old)
    Checkpoints(open_store(str(tmp_path)), job_id="job").write(1, old, {"commits": 1})
    again = _resumed(tmp_path, cls)
    assert _same(_committed(again), _committed(state))


@pytest.mark.parametrize("damage", ["truncated", "flipped"])
@pytest.mark.parametrize("name", STATE_CLASSES)
def test_a_damaged_newest_payload_falls_back_with_one_warning(
    name: str, damage: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Truncated by its writer (its manifest matches it: only reading the payload can
    tell), or a byte changed at rest (the manifest's SHA-256 tells)."""
    cls = STATE_CLASSES[name]
    state = _make_state(cls, seed=1)
    _train(state, 2)
    state.commit()
    expected = _committed(state)
    checkpoints = Checkpoints(open_store(str(tmp_path)), job_id="job")
    snapshot = snapshot_state(state, fmt.PayloadBuffers())
    checkpoints.write(1, snapshot.serialized(), {"commits": 1})
    _train(state, 1)
    state.commit()
    newest = snapshot_state(state, fmt.PayloadBuffers()).serialized()
    if damage == "truncated":
        checkpoints.write(2, newest[: len(newest) // 2], {"commits": 2})
    else:
        info = checkpoints.write(2, newest, {"commits": 2})
        data = tmp_path / info.data_key
        raw = bytearray(data.read_bytes())
        raw[100] ^= 0xFF
        data.write_bytes(raw)
    assert checkpoints.list()[0].step == 2

    caplog.set_level(logging.WARNING)
    again = _resumed(tmp_path, cls)
    assert _same(_committed(again), expected)
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    reason = "is not a checkpoint" if damage == "truncated" else "SHA-256"
    assert len(warned) == 1 and reason in warned[0], warned


@pytest.mark.parametrize(
    "data",
    [
        b"PK\x03\x04" + bytes(300),
        b"\x80\x02garbage",
        b"",
        _forged([], {"$set": [[1]]}),
        bytes(fmt.encode({"handlers": ["model"], "attributes": {}})),
    ],
    ids=["broken zip", "pickle", "empty", "unhashable", "not a state"],
)
def test_a_newest_checkpoint_its_decoding_fails_on_is_skipped(
    data: bytes, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Whatever the bytes make the decoder raise (RuntimeError, UnpicklingError,
    EOFError, ...), the checkpoint is damaged: the one before it is loaded."""
    checkpoints = Checkpoints(open_store(str(tmp_path)), job_id="job")
    good = checkpoints.write(1, fmt.encode({"handlers": {}, "attributes": {"step": 1}}))
    bad = checkpoints.write(2, data)
    caplog.set_level(logging.WARNING)
    found = checkpoints.load_latest_decoded(deserialize)
    assert found is not None and found[0] == good
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and bad.name in warned[0], warned


def test_a_state_the_format_cannot_hold_is_written_with_torch_save(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    model = torch.nn.Linear(2, 2)
    state = TorchState(
        model, torch.optim.SGD(model.parameters(), lr=0.1), extra=torch.zeros(2).to_sparse()
    )
    snapshot = snapshot_state(state, fmt.PayloadBuffers())
    assert snapshot.payload is None and not fmt.is_payload(snapshot.serialized())
    assert "writing checkpoints with torch.save" in capfd.readouterr().err
    loaded = deserialize(bytes(snapshot.serialized()))
    assert torch.equal(loaded["attributes"]["extra"].to_dense(), torch.zeros(2))


def test_the_writer_runs_at_the_priority_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Linux nice is per thread: a writer asked to run lower yields the CPU."""
    monkeypatch.setattr(durable, "WRITER_NICE", 5)
    seen: list[int] = []

    def write(step: int, data: Any, meta: dict[str, Any]) -> None:
        seen.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))

    writer = durable.BackgroundWriter(write)
    try:
        writer.submit(1, durable.Snapshot(payload=memoryview(b"x"))).wait(10)
    finally:
        writer.close()
    main = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert seen and seen[0] == min(19, main + 5) and seen[0] > main


def test_each_checkpoint_reuses_the_host_buffer_of_the_one_before(tmp_path: Path) -> None:
    """The writer gives the buffer back once written: the next checkpoint's copy goes
    into the same memory (no new allocation, no page faults on the training thread)."""
    now = [0.0]
    hooks = DurableCommits(
        DurableConfig(uri=str(tmp_path), every=10, job_id="job"),
        Checkpoints(open_store(str(tmp_path)), job_id="job", keep=3),
        rank=lambda: int(hvd.rank()),
        broadcast_object=hvd.broadcast_object,
        flush_requested=lambda: False,
        clock=lambda: now[0],
    )
    state = _make_state(TorchState, seed=1)
    commit = hooks.wrap_commit(TorchState.commit)
    held = []
    for written in (1, 2):
        _train(state, 1)
        now[0] += 10
        commit(state)
        deadline = time.monotonic() + 30
        while len(hooks._checkpoints.list()) < written and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.1)  # the buffer is given back right after the write returns
        held.append(list(hooks._buffers._free))
    assert len(held[0]) == 1 and len(held[1]) == 1 and held[0][0] is held[1][0]
    _, data = hooks._checkpoints.load_latest() or (None, b"")
    assert deserialize(data)["attributes"]["step"] == 2
