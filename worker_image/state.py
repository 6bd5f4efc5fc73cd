"""Worker-side elastic state whose commits are copies into preallocated buffers.

``TorchState`` is a drop-in for ``hvd.elastic.TorchState``: same constructor, same
``commit`` / ``save`` / ``restore`` / ``sync`` / reset-callback behaviour, usable with
``hvd.elastic.run``. Modules and optimizers are committed into preallocated buffers
(:mod:`spotring.worker_image.commit_buffers`) instead of deep copies; CUDA tensors into
pinned host memory by default.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from horovod.common.elastic import ObjectState
from horovod.torch.elastic.state import (
    ModelStateHandler,
    OptimizerStateHandler,
    StateHandler,
    get_handler_registry,
)
from horovod.torch.functions import broadcast_object
from horovod.torch.mpi_ops import broadcast_async_, rank, synchronize

from spotring.worker_image import horovod_internals
from spotring.worker_image.commit_buffers import (
    ModelBuffers,
    Offload,
    OptimizerBuffers,
    checked_commit_options,
)
from spotring.worker_image.sampler_reset import reset_samplers

__all__ = ["Offload", "TorchState"]


class _BroadcastHandler(StateHandler):
    """A handler whose ``sync`` can join the others' in one :class:`StateBroadcast`."""

    def add_to(self, batch: StateBroadcast, name: str) -> None:
        """Put what this handler tracks into ``batch``, its names under ``name``."""
        raise NotImplementedError

    def sync(self) -> None:
        batch = StateBroadcast()
        self.add_to(batch, type(self.value).__name__)
        batch.run(root_rank=0)


class _ModelHandler(ModelBuffers, _BroadcastHandler):
    """Snapshot of a module's ``state_dict`` in commit buffers, synced from rank 0."""

    def add_to(self, batch: StateBroadcast, name: str) -> None:
        """Put the module's ``state_dict`` into ``batch`` (to take rank 0's)."""
        module = self.value
        for key, value in module.state_dict().items():
            if isinstance(value, torch.Tensor):
                batch.tensor(f"{name}.{key}", value)
            else:  # extra state: whatever the module made it
                batch.value(
                    f"{name}.{key}",
                    value,
                    lambda v, key=key: module.load_state_dict({key: v}, strict=False),  # type: ignore[misc]  # lambda with defaults
                )


class _OptimizerHandler(OptimizerBuffers, _BroadcastHandler):
    """Snapshot of an optimizer in commit buffers, synced from rank 0."""

    def restore(self) -> None:
        super().restore()
        horovod_internals.forget_pending_allreduces(self.value)

    def add_to(self, batch: StateBroadcast, name: str) -> None:
        """Put the optimizer's state and settings into ``batch`` (to take rank 0's).

        As ``hvd.broadcast_optimizer_state``: an optimizer that has not stepped yet (a
        worker that just joined) first takes a step with zero gradients, which creates
        its state (momentum buffers, ...) for rank 0's to be broadcast into.
        """
        optimizer = self.value
        if isinstance(optimizer, torch.optim.LBFGS):
            raise ValueError("cannot broadcast torch.optim.LBFGS state")  # as horovod
        if not optimizer.state:
            _create_optimizer_state(optimizer)
        params = [p for group in optimizer.param_groups for p in group["params"]]
        for index, group in enumerate(optimizer.param_groups):
            for key, value in group.items():
                if key != "params":
                    batch.value(
                        f"{name}.group{index}.{key}",
                        value,
                        lambda v, group=group, key=key: group.__setitem__(key, v),  # type: ignore[misc]  # lambda with defaults
                    )
        for index, param in enumerate(params):
            param_state = optimizer.state.get(param)
            for key, value in (param_state or {}).items():
                if isinstance(value, torch.Tensor):
                    batch.tensor(f"{name}.{index}.{key}", value)
                else:
                    batch.value(
                        f"{name}.{index}.{key}",
                        value,
                        lambda v, state=param_state, key=key: state.__setitem__(key, v),  # type: ignore[misc]  # lambda with defaults
                    )


def _create_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Step ``optimizer`` with zero gradients, as ``hvd.broadcast_optimizer_state`` does
    for an optimizer without state: the step creates it."""
    from horovod.torch.optimizer import DistributedOptimizer

    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and p not in optimizer.state:
                p.grad = p.data.new(p.size()).zero_()
                if isinstance(optimizer, torch.optim.SparseAdam):
                    p.grad = p.grad.to_sparse()
    if optimizer.__module__ == DistributedOptimizer.__module__:
        # The wrapper's step would allreduce, and only this worker is stepping.
        super(optimizer.__class__, optimizer).step()  # type: ignore[misc]  # the class is Horovod's, made at run time
    else:
        optimizer.step()


class StateBroadcast:
    """Rank 0's values of many tensors and objects, broadcast in two collective rounds.

    Every tensor is broadcast in place at once (asynchronous broadcasts that Horovod
    negotiates together), every other value in one pickled object whose size goes
    along with the tensors. Horovod's ``TorchState.sync`` takes a round per module, a
    round per optimizer plus two for its settings, and two for the plain attributes;
    after a reset each round waits on every worker, the one that just joined included,
    so it is the ring that waits.
    """

    def __init__(self) -> None:
        self._tensors: list[tuple[str, torch.Tensor]] = []
        self._values: dict[str, Any] = {}
        self._setters: dict[str, Callable[[Any], None]] = {}

    def tensor(self, name: str, tensor: torch.Tensor) -> None:
        """Overwrite ``tensor`` with rank 0's tensor of the same ``name``."""
        self._tensors.append((name, tensor))

    def value(self, name: str, value: Any, setter: Callable[[Any], None]) -> None:
        """Call ``setter`` with rank 0's value of ``name`` (this rank's is ``value``)."""
        self._values[name] = value
        self._setters[name] = setter

    def run(self, root_rank: int = 0) -> None:
        """Broadcast everything from ``root_rank``. Every worker must call it with the
        same names, as with any collective."""
        handles = [
            broadcast_async_(tensor, root_rank, name=f"spotring.sync.{name}")
            for name, tensor in self._tensors
        ]
        values = self._values
        if values:
            values = broadcast_object(values, root_rank, name="spotring.sync.values")
        for handle in handles:
            synchronize(handle)
        for name, value in values.items():
            setter = self._setters.get(name)
            if setter is None:
                raise RuntimeError(
                    f"rank {root_rank} synchronised {name!r}, which this worker lacks"
                )
            setter(value)


def _make_handler(value: Any, offload: Offload) -> StateHandler | None:
    # Walk horovod's registry so user registrations (set_handler_registry) still apply;
    # only horovod's deep-copying model and optimizer handlers are swapped for ours.
    for value_type, handler_cls in get_handler_registry():
        if isinstance(value, value_type):
            if handler_cls is ModelStateHandler:
                return _ModelHandler(value, offload)
            if handler_cls is OptimizerStateHandler:
                return _OptimizerHandler(value, offload)
            return handler_cls(value)
    return None


class TorchState(ObjectState):
    """Elastic training state of a PyTorch worker, committed into preallocated buffers.

    A drop-in for ``hvd.elastic.TorchState``: every keyword argument becomes an
    attribute; modules and optimizers are tracked by buffer-copying handlers, other
    registered types (``ElasticSampler``, user handlers) by horovod's handlers, and
    anything else as a plain Python object. Pass it to a function wrapped by
    ``hvd.elastic.run``.

    Args:
        model: Optional module (parameters and persistent buffers are committed).
        optimizer: Optional optimizer (state tensors and param_group settings).
        offload: Where committed copies of CUDA tensors live. ``"auto"`` (default):
            pinned host memory for CUDA tensors, the tensor's own device otherwise;
            ``"host"``: always host memory; ``"device"``: always the tensor's device.
        commit_every: ``commit()`` saves and checks for host updates on every N-th
            call only; the other calls return at once. All workers must use the same N
            and call ``commit()`` equally often (the host-update check is collective).
        **kwargs: Further objects to track, exposed as attributes (horovod semantics).
    """

    def __init__(
        self,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        *,
        offload: Offload = "auto",
        commit_every: int = 1,
        **kwargs: Any,
    ) -> None:
        every = checked_commit_options(offload, commit_every)
        self._commit_every = every
        self._calls_since_save = 0
        self._rolled_back = 0
        kwargs.update(model=model, optimizer=optimizer)  # same order as horovod
        handlers: dict[str, StateHandler] = {}
        plain: dict[str, Any] = {}
        for name, value in kwargs.items():
            handler = _make_handler(value, offload)
            if handler is None:
                plain[name] = value
            else:
                handlers[name] = handler
        self._handlers = handlers
        for name, handler in handlers.items():
            setattr(self, name, handler.value)
        super().__init__(bcast_object=broadcast_object, get_rank=rank, **plain)

    @property
    def steps_since_commit(self) -> int:
        """``commit()`` calls since the last save: the steps a restore would roll back."""
        return self._calls_since_save

    @property
    def steps_rolled_back(self) -> int:
        """Total ``commit()`` calls discarded by ``restore()`` over this object's life."""
        return self._rolled_back

    def commit(self) -> None:
        """Save the state and check for host updates, on every ``commit_every``-th call.

        Raises ``HostsUpdatedInterrupt`` (from the check) when hosts were added or
        removed; the other calls do nothing, so they cost nothing.
        """
        self._calls_since_save += 1
        if self._calls_since_save < self._commit_every:
            return
        self.save()
        self.check_host_updates()

    def save(self) -> None:
        """Copy the current state into the commit buffers (unconditionally)."""
        for handler in self._handlers.values():
            handler.save()
        super().save()
        self._calls_since_save = 0

    def restore(self) -> None:
        """Copy the last commit back in place; state created since then is dropped."""
        for handler in self._handlers.values():
            handler.restore()
        super().restore()
        self._rolled_back += self._calls_since_save
        self._calls_since_save = 0

    def sync(self) -> None:
        """Broadcast the state from rank 0, then commit it so every rank's commit agrees.

        Modules, optimizers and plain attributes go in one :class:`StateBroadcast`;
        other handlers (``ElasticSampler``'s, user-registered ones) sync themselves.
        """
        batch = StateBroadcast()
        for name, handler in self._handlers.items():
            if isinstance(handler, _BroadcastHandler):
                handler.add_to(batch, name)
            else:
                handler.sync()
        saved = horovod_internals.saved_attributes(self)
        if saved:
            batch.value("attributes", saved, self._take_attributes)
        batch.run(root_rank=0)
        self.save()

    def _take_attributes(self, saved: dict[str, Any]) -> None:
        horovod_internals.restore_attributes(self, saved)

    def reset(self) -> None:
        """After every reset (before any sync): re-partition each ``ElasticSampler``
        for the new ring, which a reset without a sync would not (see
        :mod:`spotring.worker_image.sampler_reset`)."""
        reset_samplers(self._handlers.values())

    def __setattr__(self, name: str, value: Any) -> None:
        # As horovod's TorchState: assigning a tracked attribute re-targets its handler.
        if hasattr(self, name) and name in self._handlers:
            self._handlers[name].set_value(value)
        super().__setattr__(name, value)
