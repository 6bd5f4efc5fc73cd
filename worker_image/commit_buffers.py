"""Commit buffers: a module's or an optimizer's state copied into preallocated memory.

The first save allocates one flat buffer per (dtype, destination) and every later save
copies each tensor into its slice of that buffer; restore copies back in place, so the
user's model, parameters and optimizer stay the same objects. Horovod's
``hvd.elastic.TorchState`` deep-copies the ``state_dict`` on every commit instead, which
allocates (and page-faults) a full copy of the training state each time and, on a GPU,
doubles device memory.

CUDA tensors are committed to pinned host memory by default (``offload="auto"``): a
commit costs no device memory, and the device-to-host copies run as async DMA that the
save waits for before it returns.

Nothing here imports Horovod: :mod:`spotring.worker_image.state` (Horovod's elastic
state) and :mod:`spotring.torch.inplace` (torch.distributed's) both build on it.
"""

from __future__ import annotations

import copy
from collections.abc import Hashable, Sequence
from typing import Any, Literal, TypeGuard

import torch

__all__ = ["OFFLOADS", "ModelBuffers", "Offload", "OptimizerBuffers", "checked_commit_options"]

Offload = Literal["auto", "device", "host"]
OFFLOADS = ("auto", "device", "host")


def checked_commit_options(offload: str, commit_every: int) -> int:
    """``commit_every`` as an int, once both options are known good (a state object's
    constructor calls this first); ValueError naming the bad one otherwise."""
    if offload not in OFFLOADS:
        raise ValueError(f"offload must be one of {OFFLOADS}, not {offload!r}")
    if int(commit_every) < 1:
        raise ValueError(f"commit_every must be >= 1, not {commit_every!r}")
    return int(commit_every)


# Slices start on 256-byte boundaries: vectorised copies and CUDA DMA like aligned
# addresses, and every element size divides 256.
_ALIGN_BYTES = 256

# Values that are safe to share between the live object and the snapshot.
_ATOMIC = (int, float, bool, complex, str, bytes, type(None))

_CPU = torch.device("cpu")


def _is_plain(value: object) -> TypeGuard[torch.Tensor]:
    """True for ordinary dense tensors, the only kind the flat buffers can hold."""
    return (
        isinstance(value, torch.Tensor)
        and type(value) in (torch.Tensor, torch.nn.Parameter)
        and value.layout == torch.strided
        and not value.is_quantized
        and not value.is_meta
    )


def _signature(t: torch.Tensor) -> tuple[torch.Size, torch.dtype, torch.device]:
    return t.shape, t.dtype, t.device


def _copy_value(value: Any) -> Any:
    """Snapshot a non-buffered value: share immutables, deep-copy anything else."""
    if isinstance(value, _ATOMIC):
        return value
    if isinstance(value, tuple) and all(isinstance(v, _ATOMIC) for v in value):
        return value
    return copy.deepcopy(value)


def _copy_all(dsts: list[torch.Tensor], srcs: list[torch.Tensor], non_blocking: bool) -> None:
    """dst.copy_(src) for every pair, in one dispatcher call where torch has one."""
    if not dsts:
        return
    with torch.no_grad():
        foreach_copy = getattr(torch, "_foreach_copy_", None)
        if foreach_copy is not None:
            foreach_copy(dsts, srcs, non_blocking=non_blocking)
        else:  # pragma: no cover - torch < 2.1
            for dst, src in zip(dsts, srcs, strict=True):
                dst.copy_(src, non_blocking=non_blocking)


class _Arena:
    """Preallocated copies of a fixed list of tensors.

    One flat buffer per (dtype, destination device, pinned); each tensor owns a view of
    an aligned slice. ``save`` and ``restore`` are pure copies: no allocation.
    """

    def __init__(self, tensors: Sequence[torch.Tensor], offload: Offload) -> None:
        self.signature = [_signature(t) for t in tensors]
        sizes: dict[tuple[torch.dtype, torch.device, bool], int] = {}
        placement = []
        for t in tensors:
            key = self._destination(t, offload)
            step = max(1, _ALIGN_BYTES // t.element_size())
            start = -(-sizes.get(key, 0) // step) * step
            sizes[key] = start + t.numel()
            placement.append((key, start))
        self.flats = {
            key: torch.empty(n, dtype=key[0], device=key[1], pin_memory=key[2])
            for key, n in sizes.items()
        }
        self.views = [
            self.flats[key][start : start + t.numel()].view(t.shape)
            for (key, start), t in zip(placement, tensors, strict=True)
        ]
        self._placement = placement
        # Set by adopt(): live tensors moved into flat buffers laid out like `flats`.
        self._live: dict[tuple[torch.dtype, torch.device, bool], torch.Tensor] = {}
        self._live_ptrs: list[int] = []
        self._loose: list[int] = list(range(len(tensors)))  # indices outside `_live`
        # Copies touching a GPU are asynchronous; these are the devices to wait for.
        self.cuda_devices = sorted({t.device for t in tensors if t.is_cuda}, key=str)

    @staticmethod
    def _destination(t: torch.Tensor, offload: Offload) -> tuple[torch.dtype, torch.device, bool]:
        if t.is_cuda and offload != "device":
            # Pinned so the device-to-host copy is a real async DMA at full bandwidth.
            return t.dtype, _CPU, True
        if offload == "host":
            return t.dtype, _CPU, False
        return t.dtype, t.device, False

    def matches(self, tensors: Sequence[torch.Tensor | None]) -> bool:
        """Whether ``tensors`` have the shapes, dtypes and devices this arena was built for."""
        sig = self.signature
        return len(tensors) == len(sig) and all(
            t is not None and _signature(t) == s for t, s in zip(tensors, sig, strict=True)
        )

    def adopt(self, tensors: Sequence[torch.Tensor]) -> None:
        """Move the live CPU tensors into flat buffers laid out like the copies.

        Each tensor keeps its identity (``tensor.data`` is re-pointed at a view), and a
        commit becomes one copy per buffer, at memcpy speed, instead of one per tensor.
        Only buffers whose tensors all live in ordinary CPU memory are adopted: a CUDA
        tensor's copy sits in pinned host memory and is saved tensor by tensor.
        """
        with torch.no_grad():
            for key, flat in self.flats.items():
                members = [i for i, (k, _) in enumerate(self._placement) if k == key]
                if key[1] != _CPU or key[2] or any(tensors[i].device != _CPU for i in members):
                    continue
                live = torch.empty_like(flat)
                for i in members:
                    start, tensor = self._placement[i][1], tensors[i]
                    view = live[start : start + tensor.numel()].view(tensor.shape)
                    view.copy_(tensor)
                    tensor.data = view
                self._live[key] = live
        adopted = {i for i, (k, _) in enumerate(self._placement) if k in self._live}
        self._loose = [i for i in range(len(tensors)) if i not in adopted]
        self._live_ptrs = [t.data_ptr() for t in tensors]

    def _adopted(self, tensors: Sequence[torch.Tensor]) -> bool:
        """Whether every tensor still lives where adopt() put it (none was replaced)."""
        return bool(self._live) and [t.data_ptr() for t in tensors] == self._live_ptrs

    def save(self, tensors: list[torch.Tensor]) -> None:
        if self._adopted(tensors):
            with torch.no_grad():
                for key, live in self._live.items():
                    self.flats[key].copy_(live)
            loose = self._loose
            _copy_all([self.views[i] for i in loose], [tensors[i] for i in loose],
                      non_blocking=bool(self.cuda_devices))  # fmt: skip
        else:
            _copy_all(self.views, tensors, non_blocking=bool(self.cuda_devices))
        self._wait()

    def restore(self, tensors: list[torch.Tensor], views: list[torch.Tensor] | None = None) -> None:
        if views is None and self._adopted(tensors):
            with torch.no_grad():
                for key, live in self._live.items():
                    live.copy_(self.flats[key])
            loose = self._loose
            _copy_all([tensors[i] for i in loose], [self.views[i] for i in loose],
                      bool(self.cuda_devices))  # fmt: skip
        else:
            _copy_all(tensors, self.views if views is None else views, bool(self.cuda_devices))
        self._wait()

    def _wait(self) -> None:
        # A commit must be complete when it returns: the next step writes the sources.
        for device in self.cuda_devices:
            torch.cuda.current_stream(device).synchronize()


class _Buffers:
    """The commit buffers of one tracked object (``value``), as Horovod's handlers hold it."""

    def __init__(self, value: Any) -> None:
        self.value = value

    def save(self) -> None:
        """Copy the object's current state into the buffers."""
        raise NotImplementedError

    def restore(self) -> None:
        """Copy the last save back into the object, in place."""
        raise NotImplementedError

    def set_value(self, value: Any) -> None:
        """Track ``value`` instead, and save it at once."""
        self.value = value
        self.save()


class ModelBuffers(_Buffers):
    """Snapshot of a module's ``state_dict`` (parameters and persistent buffers)."""

    def __init__(self, model: torch.nn.Module, offload: Offload) -> None:
        super().__init__(model)
        self._offload = offload
        self._arena: _Arena | None = None
        self._keys: list[str] = []
        # Entries the arena cannot hold (extra state, sparse tensors): deep copies.
        self._other: dict[str, Any] = {}
        self.save()

    def save(self) -> None:
        keys, tensors, other = [], [], {}
        # Re-read every time: cheap, and catches replaced parameters or new modules.
        for key, value in self.value.state_dict(keep_vars=True).items():
            if _is_plain(value):
                keys.append(key)
                tensors.append(value)
            else:
                other[key] = _copy_value(value)
        if self._arena is None or keys != self._keys or not self._arena.matches(tensors):
            self._arena = None  # free the old layout before allocating the new one
            self._arena = _Arena(tensors, self._offload)
            self._arena.adopt(tensors)
            self._keys = keys
        self._arena.save(tensors)
        self._other = other

    def restore(self) -> None:
        assert self._arena is not None
        live = self.value.state_dict(keep_vars=True)
        tensors = [live.get(key) for key in self._keys]
        same_layout = (
            len(live) == len(self._keys) + len(self._other)
            and all(key in live for key in self._other)
            and self._arena.matches(tensors)
        )
        if same_layout:
            self._arena.restore(tensors)
            if self._other:
                self.value.load_state_dict(copy.deepcopy(self._other), strict=False)
        else:
            # The module changed shape since the commit: let torch copy and complain
            # exactly as horovod's handler (load_state_dict, strict) would.
            saved = dict(zip(self._keys, self._arena.views, strict=True))
            saved.update(copy.deepcopy(self._other))
            self.value.load_state_dict(saved)


_SlotKey = tuple[str, int]  # ("p", position in param_groups) or ("k", id of another key)


class OptimizerBuffers(_Buffers):
    """Snapshot of an optimizer: per-parameter state tensors and param_group settings.

    Parameters are identified by their position in ``param_groups``, as
    ``Optimizer.state_dict`` does, so restore maps the state back onto the same slots.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, offload: Offload) -> None:
        super().__init__(optimizer)
        self._offload = offload
        self._arena: _Arena | None = None
        self._slots: list[tuple[_SlotKey, Hashable]] = []  # arena order
        self._slot_views: dict[tuple[_SlotKey, Hashable], int] = {}
        self._layout: list[tuple[_SlotKey, list[Hashable]]] = []  # state order
        self._values: dict[tuple[_SlotKey, Hashable], Any] = {}  # non-tensor state
        self._groups: list[tuple[int, dict[str, Any]]] = []  # (n params, settings)
        self._other_keys: dict[int, Any] = {}  # state keys that are not params
        self.save()

    def save(self) -> None:
        optimizer = self.value
        position: dict[int, int] = {}
        groups = []
        for group in optimizer.param_groups:
            params = group["params"]
            for p in params:
                position.setdefault(id(p), len(position))
            settings = {k: _copy_value(v) for k, v in group.items() if k != "params"}
            groups.append((len(params), settings))

        layout, slots, tensors, values, other_keys = [], [], [], {}, {}
        for param, param_state in optimizer.state.items():
            index = position.get(id(param))
            if index is None:
                other_keys[id(param)] = param
                key: _SlotKey = ("k", id(param))
            else:
                key = ("p", index)
            layout.append((key, list(param_state)))
            for name, value in param_state.items():
                if _is_plain(value):
                    slots.append((key, name))
                    tensors.append(value)
                else:
                    values[(key, name)] = _copy_value(value)

        # New state (momentum after the first step) changes the layout: buffers are
        # allocated once for it, then reused by every later commit.
        if self._arena is None or slots != self._slots or not self._arena.matches(tensors):
            self._arena = None
            self._arena = _Arena(tensors, self._offload)
            self._arena.adopt(tensors)
            self._slots = slots
            self._slot_views = {slot: i for i, slot in enumerate(slots)}
        self._arena.save(tensors)
        self._layout, self._values = layout, values
        self._groups, self._other_keys = groups, other_keys

    def restore(self) -> None:
        assert self._arena is not None
        optimizer = self.value
        groups = optimizer.param_groups
        if len(groups) != len(self._groups) or any(
            len(g["params"]) != n for g, (n, _) in zip(groups, self._groups, strict=True)
        ):
            raise ValueError("optimizer param groups changed since the last commit")
        for group, (_, settings) in zip(groups, self._groups, strict=True):
            for k in [k for k in group if k != "params" and k not in settings]:
                del group[k]
            for k, v in settings.items():
                group[k] = _copy_value(v)

        params = [p for g in groups for p in g["params"]]
        live = dict(optimizer.state)
        # Rebuild in committed order, dropping state created after the commit, but keep
        # the optimizer's state mapping and its per-parameter dicts as the same objects.
        optimizer.state.clear()
        dsts, srcs = [], []
        views, signature = self._arena.views, self._arena.signature
        for key, names in self._layout:
            param = params[key[1]] if key[0] == "p" else self._other_keys[key[1]]
            param_state = live.get(param)
            old = dict(param_state) if param_state is not None else {}
            if param_state is None:
                param_state = {}
            param_state.clear()
            for name in names:
                slot = (key, name)
                i = self._slot_views.get(slot)
                if i is None:
                    param_state[name] = _copy_value(self._values[slot])
                    continue
                current = old.get(name)
                if not (_is_plain(current) and _signature(current) == signature[i]):
                    # Replaced or deleted since the commit: a fresh tensor (rare path).
                    shape, dtype, device = signature[i]
                    current = torch.empty(shape, dtype=dtype, device=device)
                param_state[name] = current
                dsts.append(current)
                srcs.append(views[i])
            optimizer.state[param] = param_state
        self._arena.restore(dsts, srcs)
