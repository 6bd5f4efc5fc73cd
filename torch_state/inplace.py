"""In-place elastic training on ``torch.distributed``: the surviving processes keep running.

The programming model of Horovod's elastic mode, without Horovod::

    from spotring.torch import inplace

    state = inplace.TorchState(model, optimizer, batch=0)

    @inplace.run(coordinator)
    def train(state):
        ddp = DistributedDataParallel(state.model, init_sync=False)  # again per formation
        for state.batch in range(state.batch, steps):
            ...  # forward, backward, optimizer.step()
            state.commit()

    train(state)

:func:`run` forms the process group of the coordinator's membership (the default group,
so ``dist.all_reduce`` and DDP use it), syncs the state from the member that holds the
newest commit, and calls the function. When the group fails (a member died: Gloo sees
its sockets close; a member hangs: the coordinator abandons the generation and a watcher
thread shuts this process's sockets of the group, so nothing waits out a timeout), the
state is restored to the last commit, the group is formed again on the next membership,
and the function is called again. A join is taken at a commit, with nothing rolled back.

``torch.distributed``'s own ``ProcessGroupGloo.abort()`` does not end a collective that
waits on a stopped peer in torch 2.13 (it waits out the group's timeout: see
docs/torch.md), hence the socket shutdown.
"""

from __future__ import annotations

import copy
import functools
import logging
import os
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed import distributed_c10d

from spotring.torch import formation
from spotring.torch.coordinator import Coordinator, Membership
from spotring.worker_image.commit_buffers import (
    ModelBuffers,
    Offload,
    OptimizerBuffers,
    checked_commit_options,
)
from spotring.worker_image.peer_abort import (
    listening_sockets,
    own_tcp_sockets,
    shutdown_sockets,
)

__all__ = ["MembershipChanged", "ProcessGroup", "TorchState", "run"]

log = logging.getLogger(__name__)

T = TypeVar("T")

GROUP_TIMEOUT = timedelta(seconds=60)
"""Gloo's own timeout for collectives, the last resort: failures end them long before it."""

FORMATION_TIMEOUT = timedelta(seconds=2)
"""Gloo's timeout while a group connects, raised to :data:`GROUP_TIMEOUT` once it has.
A peer that died after publishing its address holds each peer that waits for its
connection five times this (Gloo's ``Pair::waitUntil`` for an initial connect; at
:data:`GROUP_TIMEOUT` it was five minutes) unless the coordinator abandons the generation,
which ends those waits at once (:mod:`.formation`): this is the bound when it cannot. It
does not bound the members' arrival: the store's waits (a member still finishing a long
step) are the store's own."""

CONNECT_SHUT_EVERY_SECONDS = 0.02
"""How often connects a forming group starts after its generation was abandoned are
shut down (Gloo tries each connect four times)."""

ABANDON_GRACE_SECONDS = 10.0
"""How long a worker whose collective failed waits for the coordinator to abandon the
generation before it takes the failure for its own (a bug: re-raised)."""


class MembershipChanged(Exception):
    """Raised by :meth:`TorchState.commit` once a newer generation is published: the
    workers leave the group at this commit (just saved) and form the next one."""


class ProcessGroup:
    """One generation's process group: the default group while it lives.

    Formed over the coordinator's store for the generation, so generations never read
    each other's keys. :meth:`abort` shuts down the connections Gloo opened for it
    (not its listening socket: Gloo's listener thread takes an error there for a fatal
    one), which fails every collective pending on them at once, in every thread.
    """

    def __init__(self, membership: Membership, coordinator: Coordinator) -> None:
        self.membership = membership
        self.abandoned = threading.Event()
        """Set once the coordinator has abandoned this generation."""
        self._coordinator = coordinator
        self._watch = coordinator.watch(membership.generation)
        self._connections: set[int] = set()
        self._formed = threading.Event()
        self._forming_ended = threading.Event()
        # Gloo's formation as this module needs it: one store request per rank for its
        # peers' addresses, a multi-get (O(N) requests, not O(N^2)) that waits by the
        # store's own timeout, not by FORMATION_TIMEOUT (Gloo passes that to wait());
        # and each pair named by its ranks, which formation.release relies on.
        os.environ["GLOO_ENABLE_RANK_AS_SEQUENCE_NUMBER"] = "1"
        os.environ["GLOO_ENABLE_STORE_V2_API"] = "1"
        # Watching from the start: a generation abandoned while its group forms ends
        # the formation's waits (formation.release), not only the collectives'.
        watcher = threading.Thread(target=self._watch_abandoned, name="spotring-watch")
        try:
            store = coordinator.group_store(membership)
            self._before = own_tcp_sockets()  # the store's connection is not the group's
            watcher.start()
            dist.init_process_group(
                "gloo", store=store, rank=membership.rank, world_size=membership.world_size,
                timeout=FORMATION_TIMEOUT,
            )  # fmt: skip
            distributed_c10d._set_pg_timeout(GROUP_TIMEOUT)  # the collectives: read per operation
        except BaseException:
            self._forming_ended.set()
            self._watch.close()
            if watcher.ident is not None:  # started
                watcher.join()
            # What destroy_process_group resets: the default group's name is the count of
            # groups made, and a failed init counted one. Left so, this worker's next
            # group's keys would be named apart from those of a member that never failed
            # (a joiner), and both would wait for each other until the store gave up.
            distributed_c10d._world.group_count = 0
            raise
        self._watcher = watcher
        self._connections = _connections(own_tcp_sockets() - self._before)
        self._formed.set()
        self._forming_ended.set()
        if self.abandoned.is_set():  # while it formed: the watcher could not abort it
            self.abort()

    def _watch_abandoned(self) -> None:
        try:
            if self._watch.wait():
                log.info("generation %d abandoned: aborting", self.membership.generation)
                self.abandoned.set()
                if self._formed.is_set():
                    self.abort()
                else:
                    self._end_formation()
        except Exception:  # never silently: the worker would wait out Gloo's timeout
            log.exception("watching generation %d failed", self.membership.generation)
            self.abort()

    def _end_formation(self) -> None:
        """Make the formation in progress fail now (see :mod:`.formation`)."""
        made = formation.release(self._before, self.membership.rank, self.membership.world_size)
        log.info("generation %d abandoned while forming: %d waits ended",
                 self.membership.generation, made)  # fmt: skip
        # Gloo connects its pairs one after another and retries a failed connect: the
        # ones it starts from now on are shut down too, until the formation ends.
        deadline = time.monotonic() + 5 * FORMATION_TIMEOUT.total_seconds()
        while not self._forming_ended.wait(CONNECT_SHUT_EVERY_SECONDS):
            formation.shut_connects(self._before)
            if time.monotonic() > deadline:  # Gloo's own bound has ended it
                return

    def latest(self) -> int:
        """The newest generation the coordinator has published."""
        return self._coordinator.latest()

    def abort(self) -> None:
        """Fail every collective of this group, now and later."""
        shutdown_sockets(self._connections)

    def close(self) -> None:
        """Leave the group: stop the watcher and destroy the default group."""
        self._watch.close()
        self._watcher.join()
        dist.destroy_process_group()


def _connections(inodes: set[int]) -> set[int]:
    """Those of ``inodes`` that are TCP sockets but not listening ones."""
    return inodes - listening_sockets(inodes).keys()


# ------------------------------------------------------------------------------ state


class TorchState:
    """Elastic training state committed into preallocated buffers, synced over
    ``torch.distributed``: the in-place mode's counterpart of the Horovod path's
    :class:`spotring.torch.TorchState`.

    Args:
        model: Optional module (parameters and persistent buffers are committed).
        optimizer: Optional optimizer (state tensors and param_group settings).
        offload: Where committed copies of CUDA tensors live (as the Horovod path's).
        commit_every: ``commit()`` saves, and looks for a newer generation, on every
            N-th call only; the other calls return at once. Every worker must use the
            same N (the look is collective).
        **kwargs: Plain values (the sampler's position, the epoch, ...), exposed as
            attributes, committed as copies.
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
        self.model = model
        self.optimizer = optimizer
        self._model = ModelBuffers(model, offload) if model is not None else None
        self._optimizer = OptimizerBuffers(optimizer, offload) if optimizer is not None else None
        self._names = list(kwargs)
        for name, value in kwargs.items():
            setattr(self, name, value)
        self._commit_every = every
        self._calls_since_save = 0
        self._rolled_back = 0
        self.commits = 0
        """Saves so far, carried across syncs: the newest commit is the highest."""
        self.group: ProcessGroup | None = None
        """The current generation's group (set by :func:`run`)."""
        self._saved: dict[str, Any] = {}
        self.save()
        self.commits = 0

    @property
    def rank(self) -> int:
        """This worker's rank in the current group."""
        assert self.group is not None, "outside inplace.run"
        return self.group.membership.rank

    @property
    def world_size(self) -> int:
        """The current group's size."""
        assert self.group is not None, "outside inplace.run"
        return self.group.membership.world_size

    @property
    def steps_since_commit(self) -> int:
        """``commit()`` calls since the last save: the steps a restore would roll back."""
        return self._calls_since_save

    @property
    def steps_rolled_back(self) -> int:
        """Total ``commit()`` calls discarded by ``restore()`` over this object's life."""
        return self._rolled_back

    def commit(self) -> None:
        """Save the state and look for a newer generation, on every ``commit_every``-th
        call; raises :class:`MembershipChanged` (after saving) when there is one."""
        self._calls_since_save += 1
        if self._calls_since_save < self._commit_every:
            return
        self.save()
        if self.group is not None and _newer_generation_published(self.group):
            raise MembershipChanged

    def save(self) -> None:
        """Copy the current state into the commit buffers (unconditionally)."""
        for buffers in (self._model, self._optimizer):
            if buffers is not None:
                buffers.save()
        self._saved = {name: copy.deepcopy(getattr(self, name)) for name in self._names}
        self._calls_since_save = 0
        self.commits += 1

    def restore(self) -> None:
        """Copy the last commit back in place; state created since then is dropped."""
        for buffers in (self._model, self._optimizer):
            if buffers is not None:
                buffers.restore()
        for name, value in self._saved.items():
            setattr(self, name, copy.deepcopy(value))
        self._rolled_back += self._calls_since_save
        self._calls_since_save = 0

    def durable_tree(self) -> dict[str, Any]:
        """The committed state as a durable checkpoint holds it, read right after a
        commit saved it (so the live objects are the commit): the model's and the
        optimizer's ``state_dict`` (not copied) and the committed plain values."""
        handlers = {}
        if self.model is not None:
            handlers["model"] = self.model.state_dict()
        if self.optimizer is not None:
            handlers["optimizer"] = self.optimizer.state_dict()
        return {"handlers": handlers, "attributes": dict(self._saved)}

    def load_durable_tree(self, tree: dict[str, Any]) -> None:
        """Load a durable checkpoint's state into the live objects, then commit it."""
        objects = {"model": self.model, "optimizer": self.optimizer}
        present = {name for name, value in objects.items() if value is not None}
        if set(tree["handlers"]) != present or set(tree["attributes"]) != set(self._names):
            raise ValueError("the checkpoint does not match the state's objects")
        for name, state_dict in tree["handlers"].items():
            objects[name].load_state_dict(state_dict)  # type: ignore[union-attr]
        for name, value in tree["attributes"].items():
            setattr(self, name, value)
        self.save()

    def sync(self) -> None:
        """Take the state of the member with the newest commit, then commit it, so every
        member's commit agrees. Collective over the current group."""
        commits = torch.tensor([self.commits], dtype=torch.int64)
        everyone = [torch.zeros_like(commits) for _ in range(dist.get_world_size())]
        dist.all_gather(everyone, commits)
        root = max(range(len(everyone)), key=lambda r: (int(everyone[r]), -r))
        if self.optimizer is not None and not self.optimizer.state:
            _create_optimizer_state(self.optimizer)  # a joiner: same layout as the root's
        tensors, values = self._sync_parts()
        _broadcast_in_place(tensors, root)
        taken: list[Any] = [values]
        dist.broadcast_object_list(taken, src=root)
        if dist.get_rank() != root:
            self._take_values(taken[0])
        self.save()
        self.commits = int(everyone[root]) + 1

    def _sync_parts(self) -> tuple[list[torch.Tensor], dict[str, Any]]:
        """The live tensors to broadcast in place, and the values to send pickled."""
        tensors: list[torch.Tensor] = []
        values: dict[str, Any] = {name: getattr(self, name) for name in self._names}
        if self.model is not None:
            tensors += [t for t in self.model.state_dict().values() if torch.is_tensor(t)]
        if self.optimizer is not None:
            opt = self.optimizer.state_dict()
            for param_state in opt["state"].values():
                tensors += [t for t in param_state.values() if torch.is_tensor(t)]
            values["optimizer.param_groups"] = [
                {k: v for k, v in group.items() if k != "params"} for group in opt["param_groups"]
            ]
            values["optimizer.state"] = {  # per-parameter values that are not tensors
                index: {k: v for k, v in param_state.items() if not torch.is_tensor(v)}
                for index, param_state in opt["state"].items()
            }
        return tensors, values

    def _take_values(self, values: dict[str, Any]) -> None:
        groups = values.pop("optimizer.param_groups", None)
        per_param = values.pop("optimizer.state", None)
        if groups is not None and self.optimizer is not None:
            for group, settings in zip(self.optimizer.param_groups, groups, strict=True):
                group.update(settings)
            params = [p for group in self.optimizer.param_groups for p in group["params"]]
            for index, settings in (per_param or {}).items():
                self.optimizer.state[params[index]].update(settings)
        for name, value in values.items():
            setattr(self, name, value)


def _create_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """Step ``optimizer`` with zero gradients: the step creates its state (momentum
    buffers, ...) for the root's to be broadcast into, as Horovod does for a joiner."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            if p.requires_grad and p.grad is None:
                p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _broadcast_in_place(tensors: list[torch.Tensor], root: int) -> None:
    """Overwrite ``tensors`` with the root's, one broadcast per dtype. Every member
    must pass tensors of the same shapes and dtypes in the same order."""
    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    shapes = [(str(dtype), [tuple(t.shape) for t in ts]) for dtype, ts in by_dtype.items()]
    theirs: list[Any] = [shapes]
    dist.broadcast_object_list(theirs, src=root)
    if theirs[0] != shapes:
        raise ValueError("the state's tensors differ between members: cannot sync")
    with torch.no_grad():
        for ts in by_dtype.values():
            flat = _flatten_dense_tensors(ts)
            dist.broadcast(flat, src=root)
            if dist.get_rank() != root:
                for t, value in zip(ts, _unflatten_dense_tensors(flat, ts), strict=True):
                    t.copy_(value)


def _newer_generation_published(group: ProcessGroup) -> bool:
    """Whether any member sees a generation newer than the group's (collective, so
    all leave at the same commit)."""
    flag = torch.tensor([int(group.latest() > group.membership.generation)])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


# -------------------------------------------------------------------------------- run


def flush_requested() -> bool:
    """Whether the driver of ``spotring run --in-place`` asks rank 0 to make every commit
    durable at once (every member's host is leaving): durable checkpoints ask it."""
    from spotring.torch.driver_coordinator import coordinator_from_env

    return coordinator_from_env().flush_requested()


def _abandoned(coordinator: Coordinator, generation: int) -> bool:
    """Whether ``generation`` is given up, waiting up to :data:`ABANDON_GRACE_SECONDS`
    for the coordinator to say so."""
    watch = coordinator.watch(generation)
    timer = threading.Timer(ABANDON_GRACE_SECONDS, watch.close)
    timer.start()
    try:
        return watch.wait()
    finally:
        timer.cancel()
        watch.close()


def run(coordinator: Coordinator | None = None) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Decorate ``func(state, *args, **kwargs)`` to run elastically (see the module).

    ``coordinator``: where generations come from; by default the one ``spotring run
    --backend torch --in-place`` serves this worker
    (:func:`spotring.torch.driver_coordinator.coordinator_from_env`).

    On a failure of the group the state is restored and ``func`` called again on the
    next generation; on :class:`MembershipChanged` it is called again at once (the
    state was just committed). An exception the coordinator does not confirm by
    abandoning the generation within :data:`ABANDON_GRACE_SECONDS` is re-raised.
    """

    def decorate(func: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(func)
        def wrapper(state: TorchState, *args: Any, **kwargs: Any) -> T:
            nonlocal coordinator
            if coordinator is None:
                from spotring.torch.driver_coordinator import coordinator_from_env

                coordinator = coordinator_from_env()
            generation = -1
            while True:
                membership = coordinator.next_membership(after=generation)
                generation = membership.generation
                try:
                    group = state.group = ProcessGroup(membership, coordinator)
                except Exception:
                    # A member lost while the group formed: the coordinator gives the
                    # generation up, and the store's waits end with that.
                    if coordinator.latest() > generation or _abandoned(coordinator, generation):
                        log.info("generation %d given up while forming", generation)
                        continue
                    raise
                try:
                    state.sync()
                    return func(state, *args, **kwargs)
                except MembershipChanged:
                    continue
                except Exception:
                    group.abort()  # peers waiting on this member fail now, not at a timeout
                    if not group.abandoned.wait(ABANDON_GRACE_SECONDS):
                        raise
                    log.info("generation %d failed: back to the last commit", generation)
                    state.restore()
                finally:
                    group.close()
                    state.group = None

        return wrapper

    return decorate
