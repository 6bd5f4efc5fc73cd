"""A checkpoint's payload without pickle: a small JSON header and the raw tensor bytes.

    0       b"SPOTCKPT", then little-endian u32 version, u32 0, u64 header offset,
            u64 header length (zeros up to byte 64)
    64      each tensor's bytes, C order, at offsets that are multiples of 64
    header  UTF-8 JSON: {"tensors": [{"dtype", "shape", "offset", "nbytes"}...],
            "state": the tree, a tensor written as {"$t": its index}}; it ends the payload

The header comes last so that a tensor's offset depends on the tensors alone: the
writer copies a state of the same layout into the same host buffer at every checkpoint
(:class:`PayloadBuffers`) and only rewrites the header. Nothing in a payload is code:
the tree holds JSON values, tuples, dicts with non-string keys, ``OrderedDict`` (with
its ``_metadata``, as ``Module.state_dict`` has), sets, bytes and non-finite floats,
each tagged; anything else is refused with :class:`TypeError` when writing, and a
reader refuses what does not follow this format with :class:`ValueError`.

Imports torch only when called (the driver imports :mod:`spotring.checkpoint`).
"""

from __future__ import annotations

import base64
import json
import math
import reprlib
import struct
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MAGIC = b"SPOTCKPT"
VERSION = 1
_PREFIX = struct.Struct("<8sIIQQ")
_START = 64
_ALIGN = 64

MAX_DEPTH = 64
"""How deep a state tree may nest (a model's ``state_dict`` takes a handful of levels)."""
MAX_NODES = 2**22
"""Values a state tree may hold, tensors' bytes aside."""
MAX_TENSORS = 2**20
"""Entries a tensor table may have."""

_DTYPES = (
    "float32", "float64", "float16", "bfloat16", "complex64", "complex128",
    "uint8", "int8", "int16", "int32", "int64", "bool",
)  # fmt: skip


def is_payload(data: bytes | memoryview) -> bool:
    """Whether ``data`` starts as a payload of this format does (else: ``torch.save``)."""
    return bytes(memoryview(data)[: len(MAGIC)]) == MAGIC


def _dtype_name(tensor: Any) -> str:
    name = str(tensor.dtype).removeprefix("torch.")
    if name not in _DTYPES:
        raise TypeError(f"cannot write a {tensor.dtype} tensor")
    return name


def _plain_tensor(value: Any) -> bool:
    import torch

    if not isinstance(value, torch.Tensor):
        return False
    if type(value) not in (torch.Tensor, torch.nn.Parameter) or value.layout != torch.strided:
        raise TypeError(f"cannot write a {type(value).__name__} of layout {value.layout}")
    if value.is_quantized or value.is_meta:
        raise TypeError("cannot write a quantized or meta tensor")
    return True


def _encode(value: Any, tensors: list[Any]) -> Any:
    """``value`` as JSON, its tensors appended to ``tensors``; TypeError for a value
    this format does not hold."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value) if math.isfinite(value) else {"$f": repr(float(value))}
    if _plain_tensor(value):
        _dtype_name(value)
        tensors.append(value)
        return {"$t": len(tensors) - 1}
    if isinstance(value, list) and type(value) is list:
        return [_encode(v, tensors) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return {"$tuple": [_encode(v, tensors) for v in value]}
    if isinstance(value, (set, frozenset)):
        return {"$set": [_encode(v, tensors) for v in value]}
    if isinstance(value, bytes):
        return {"$bytes": base64.b64encode(value).decode()}
    if type(value) is OrderedDict:
        encoded: dict[str, Any] = {"$odict": _items(value, tensors)}
        metadata = getattr(value, "_metadata", None)
        if metadata is not None:
            encoded["$meta"] = _encode(metadata, tensors)
        return encoded
    if type(value) is dict:
        if all(isinstance(k, str) and not k.startswith("$") for k in value):
            return {k: _encode(v, tensors) for k, v in value.items()}
        return {"$dict": _items(value, tensors)}
    raise TypeError(f"cannot write a {type(value).__name__}")


def _items(value: dict[Any, Any], tensors: list[Any]) -> list[Any]:
    return [[_encode(k, tensors), _encode(v, tensors)] for k, v in value.items()]


class _Tree:
    """Decodes a header's state tree, refusing one nested deeper than :data:`MAX_DEPTH`
    or of more than :data:`MAX_NODES` values (ValueError): the tree costs memory in
    proportion to the header, never more."""

    def __init__(self, tensors: list[Any]) -> None:
        self._tensors = tensors
        self._nodes = 0

    def decode(self, value: Any, depth: int = 0) -> Any:
        self._nodes += 1
        if depth > MAX_DEPTH or self._nodes > MAX_NODES:
            raise ValueError(f"state tree deeper than {MAX_DEPTH} or larger than {MAX_NODES}")
        inner = depth + 1
        if isinstance(value, list):
            return [self.decode(v, inner) for v in value]
        if not isinstance(value, dict):
            return value
        if len(value) == 1 or (len(value) == 2 and "$meta" in value):
            tag, tagged = next(iter(value.items()))
            if tag == "$t":
                if not isinstance(tagged, int) or not 0 <= tagged < len(self._tensors):
                    raise ValueError(f"no tensor {tagged!r}")
                return self._tensors[tagged]
            if tag == "$f":
                if tagged not in ("inf", "-inf", "nan"):
                    raise ValueError(f"bad float {tagged!r}")
                return float(tagged)
            if tag == "$tuple":
                return tuple(self.decode(v, inner) for v in _list(tagged))
            if tag == "$set":
                return {_hashable(self.decode(v, inner)) for v in _list(tagged)}
            if tag == "$bytes":
                if not isinstance(tagged, str):
                    raise ValueError("bytes that are not base64 text")
                return base64.b64decode(tagged, validate=True)
            if tag == "$dict":
                return {
                    _hashable(self.decode(k, inner)): self.decode(v, inner)
                    for k, v in _pairs(tagged)
                }
            if tag == "$odict":
                result = OrderedDict(
                    (_hashable(self.decode(k, inner)), self.decode(v, inner))
                    for k, v in _pairs(tagged)
                )
                if "$meta" in value:
                    result._metadata = self.decode(value["$meta"], inner)  # type: ignore[attr-defined]  # as Module.state_dict sets it
                return result
        if any(isinstance(k, str) and k.startswith("$") for k in value):
            raise ValueError(f"unknown tag in {sorted(value)[:3]}")
        return {k: self.decode(v, inner) for k, v in value.items()}


def _hashable(key: Any) -> Any:
    try:
        hash(key)
    except TypeError:
        raise ValueError(f"a {type(key).__name__} as a set member or dict key") from None
    return key


def _list(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError("a tagged value is not a list")
    return value


def _pairs(value: Any) -> list[tuple[Any, Any]]:
    pairs = _list(value)
    if not all(isinstance(p, list) and len(p) == 2 for p in pairs):
        raise ValueError("a dict's items are not pairs")
    return [(k, v) for k, v in pairs]


@dataclass
class Plan:
    """Where a state's tensors go in a payload, and its header without them."""

    tree: Any
    tensors: list[Any]
    entries: list[dict[str, Any]]
    end: int
    """Where the tensor bytes end (the header starts)."""

    @property
    def layout(self) -> tuple[tuple[str, tuple[int, ...]], ...]:
        return tuple((e["dtype"], tuple(e["shape"])) for e in self.entries)

    def header(self) -> bytes:
        document = {"tensors": self.entries, "state": self.tree}
        return json.dumps(document, separators=(",", ":"), allow_nan=False).encode()


def plan(state: Any) -> Plan:
    """The payload of ``state`` (a tree of tensors and plain values), without copying a
    tensor; TypeError if something in it cannot be written in this format."""
    tensors: list[Any] = []
    tree = _encode(state, tensors)
    entries, offset = [], _START
    for tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        entries.append(
            {"dtype": _dtype_name(tensor), "shape": list(tensor.shape), "offset": offset,
             "nbytes": nbytes}
        )  # fmt: skip
        offset += -(-nbytes // _ALIGN) * _ALIGN
    return Plan(tree, tensors, entries, offset)


def write_into(buffer: Any, plan: Plan, header: bytes) -> memoryview:
    """Copy the plan's tensors and ``header`` into ``buffer`` (a uint8 CPU tensor of at
    least ``plan.end + len(header)`` bytes); the payload, a view of the buffer."""
    import torch

    dsts, srcs = [], []
    for entry, tensor in zip(plan.entries, plan.tensors, strict=True):
        if entry["nbytes"]:
            start = entry["offset"]
            target = buffer[start : start + entry["nbytes"]]
            dsts.append(target.view(tensor.dtype).view(tensor.shape))
            srcs.append(tensor.detach())
    with torch.no_grad():
        if dsts:
            torch._foreach_copy_(dsts, srcs)
    total = plan.end + len(header)
    view = memoryview(buffer.numpy()).cast("B")
    view[: _PREFIX.size] = _PREFIX.pack(MAGIC, VERSION, 0, plan.end, len(header))
    view[_PREFIX.size : _START] = bytes(_START - _PREFIX.size)
    view[plan.end : total] = header
    return view[:total]


def encode(state: Any) -> memoryview:
    """``state`` as a payload in a buffer of its own; TypeError if it cannot be."""
    import torch

    p = plan(state)
    header = p.header()
    return write_into(torch.empty(p.end + len(header), dtype=torch.uint8), p, header)


def decode(data: bytes | memoryview) -> Any:
    """The tree a payload holds, every tensor a CPU tensor of its own (copied out of
    ``data``); ValueError if ``data`` is not a whole, consistent payload: its tensors'
    regions ascending and apart, so the tensors returned hold no more bytes than
    ``data``, and its tree within :data:`MAX_DEPTH` and :data:`MAX_NODES`."""
    view = memoryview(data).cast("B")
    if len(view) < _START:
        raise ValueError(f"a payload of {len(view)} bytes is truncated")
    magic, version, _, header_at, header_size = _PREFIX.unpack_from(view)
    if magic != MAGIC:
        raise ValueError("not a spotring payload")
    if version != VERSION:
        raise ValueError(f"unsupported payload version {version}")
    if header_at < _START or header_at + header_size != len(view):
        raise ValueError(f"{len(view)} bytes of payload, its header says {header_at + header_size}")
    try:
        document = json.loads(bytes(view[header_at:]))
        if not isinstance(document, dict) or not isinstance(document.get("tensors"), list):
            raise ValueError("payload header has no tensor table")
        tensors = _tensors(view, document["tensors"], header_at)
        return _Tree(tensors).decode(document.get("state"))
    except (TypeError, RuntimeError, OverflowError) as error:  # RecursionError among them
        raise ValueError(f"bad payload header: {type(error).__name__}: {error}") from error


def _tensors(view: memoryview, table: list[Any], header_at: int) -> list[Any]:
    """The tensors of a payload's table, copied out of ``view``; ValueError unless every
    entry is well formed and its region lies after the previous one's, before the
    header."""
    import torch

    if len(table) > MAX_TENSORS:
        raise ValueError(f"{len(table)} tensor entries, more than {MAX_TENSORS}")
    buffer = None
    tensors = []
    free_from = _START  # where the previous entry's region ends
    for entry in table:
        dtype, shape, offset, nbytes = (
            entry.get(k) if isinstance(entry, dict) else None
            for k in ("dtype", "shape", "offset", "nbytes")
        )
        if dtype not in _DTYPES or not isinstance(shape, list):
            raise ValueError(f"bad tensor entry {reprlib.repr(entry)}")
        if not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape):
            raise ValueError(f"bad tensor shape {reprlib.repr(shape)}")
        torch_dtype = getattr(torch, dtype)
        size = math.prod(shape) * torch.empty((), dtype=torch_dtype).element_size()
        if not (
            isinstance(offset, int) and isinstance(nbytes, int) and nbytes == size
            and offset >= free_from and offset % _ALIGN == 0 and offset + nbytes <= header_at
        ):  # fmt: skip
            raise ValueError(f"tensor entry out of order or bounds: {reprlib.repr(entry)}")
        free_from = offset + nbytes
        if nbytes == 0:
            tensors.append(torch.empty(shape, dtype=torch_dtype))
            continue
        if buffer is None:
            with warnings.catch_warnings():
                # Read-only bytes: every tensor is cloned out of it before it is returned.
                warnings.simplefilter("ignore", UserWarning)
                buffer = torch.frombuffer(view, dtype=torch.uint8)
        raw = buffer[offset : offset + nbytes]
        tensors.append(raw.view(torch_dtype).view(shape).clone())
    return tensors


class PayloadBuffers:
    """Host buffers reused from one checkpoint to the next: a checkpoint's tensors are
    copied into one that no write is reading, so a copy costs a memcpy, not fresh
    (page-faulting) memory. At most ``idle`` free buffers are kept."""

    def __init__(self, idle: int = 1) -> None:
        self._idle = idle
        self._free: list[Any] = []
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> Any:
        """A uint8 CPU tensor of at least ``nbytes``, not in use; give it back with
        :meth:`give_back` once nothing reads the payload in it."""
        import torch

        with self._lock:
            for i, buffer in enumerate(self._free):
                if nbytes <= buffer.numel() <= nbytes + max(2**20, nbytes // 16):
                    return self._free.pop(i)
        # Room for a header that grows (counters get longer) without a new buffer.
        return torch.empty(nbytes + 4096 + nbytes // 1024, dtype=torch.uint8)

    def give_back(self, buffer: Any) -> None:
        with self._lock:
            self._free.insert(0, buffer)
            del self._free[self._idle :]

    def encode(self, state: Any) -> tuple[memoryview, Callable[[], None]]:
        """``state`` as a payload in a reused buffer, and the call that frees the buffer
        for the next one; TypeError if it cannot be written in this format."""
        p = plan(state)
        header = p.header()
        buffer = self.take(p.end + len(header))
        try:
            view = write_into(buffer, p, header)
        except BaseException:
            self.give_back(buffer)
            raise
        return view, lambda: self.give_back(buffer)
