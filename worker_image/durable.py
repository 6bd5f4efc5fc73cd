"""Worker side of durable checkpoints: a copy of a commit, written in the background.

With ``spotring run --checkpoint URI`` every worker gets :data:`URI_ENV` (and the
cadence, the number kept, the job's id), and spotring's ``sitecustomize`` installs
:class:`DurableCommits` on Horovod's ``State`` (``hvd.elastic.TorchState`` and
spotring's ``TorchState`` alike) when the script imports Horovod:

* **Write, off the training path.** After a commit that saved the state, rank 0 (every
  rank holds the same committed state) copies the live state, which the commit has just
  saved, when :data:`EVERY_ENV` seconds have passed since its last copy: one more copy
  of the state per interval, on the training thread, straight into a reused host
  buffer laid out as the checkpoint's payload (:mod:`spotring.checkpoint.payload`: raw
  tensor bytes and a JSON header, nothing to serialise). A background thread writes
  it while another hashes it (data first,
  manifest last: :class:`spotring.checkpoint.Checkpoints`); a newer copy replaces one
  still waiting.
* **Read, on the first sync of a ring with no member of the previous one.** Horovod
  ranks the surviving hosts first, so a rank 0 that has never synchronised belongs to
  a ring in which nobody has state: the job's first ring, a ring formed after every
  worker died, or the first ring of a restarted driver. That rank 0 loads the newest
  complete checkpoint into the live objects before the sync broadcasts them.
* **The job's commit count** travels with the state: it is broadcast at every sync
  and stored in each checkpoint, so a resumed ring counts on from the checkpoint and
  each checkpoint says which commit it holds.
* **One driver's ring writes.** Rank 0 writes under the job lock's generation its
  driver started it with (:data:`FENCE_ENV`): each put and prune first reads
  ``lock.json``, and once another driver holds it, the ring says so once and writes no
  more (:class:`spotring.checkpoint.Checkpoints` with a fence).
* **A noticed total reclaim**: while the driver publishes :data:`FLUSH_KEY` on its
  rendezvous server (after a notice, nobody would carry the ring's state on), rank 0
  writes every commit synchronously, the one at which the ring stops to train
  included, before training on: what its hosts take with them was durable.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from spotring.checkpoint.errors import CheckpointLockLost
from spotring.checkpoint.payload import PayloadBuffers, is_payload
from spotring.checkpoint.payload import decode as decode_payload
from spotring.worker_image.wire import (
    CHECKPOINT_EVERY_ENV,
    CHECKPOINT_FENCE_ENV,
    CHECKPOINT_KEEP_ENV,
    CHECKPOINT_URI_ENV,
    FLUSH_KEY,
    JOB_ID_ENV,
    TORCH_COORDINATOR_ENV,
)

log = logging.getLogger(__name__)

# The names of the settings each worker is told, and of the flush request: the wire
# protocol's (:mod:`spotring.worker_image.wire`).
URI_ENV = CHECKPOINT_URI_ENV
EVERY_ENV = CHECKPOINT_EVERY_ENV
KEEP_ENV = CHECKPOINT_KEEP_ENV
FENCE_ENV = CHECKPOINT_FENCE_ENV

MARKER = "spotring durable:"
"""Starts the lines this module prints for the driver's log (informational only)."""

DEFAULT_EVERY_SECONDS = 60.0
FLUSH_TIMEOUT_SECONDS = 120.0
FLUSH_POLL_SECONDS = 0.5
"""How often rank 0 asks the driver (a GET on its rendezvous server) for a flush."""
"""How long a flush may hold the last commit before the ring leaves anyway."""


@dataclass(frozen=True)
class DurableConfig:
    """The job's checkpoint settings, as the driver handed them to the worker."""

    uri: str
    every: float = DEFAULT_EVERY_SECONDS
    keep: int = 3
    job_id: str = ""
    fence: str = ""
    """:data:`FENCE_ENV` ('' for a driver that holds no lock: unfenced)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> DurableConfig | None:
        """The settings in ``env``; None when the job writes no checkpoints."""
        uri = env.get(URI_ENV, "")
        if not uri:
            return None
        return cls(
            uri=uri,
            every=float(env.get(EVERY_ENV, DEFAULT_EVERY_SECONDS)),
            keep=int(env.get(KEEP_ENV, 3)),
            job_id=env.get(JOB_ID_ENV, ""),
            fence=env.get(FENCE_ENV, ""),
        )


# ----------------------------------------------------------------- state <-> payload


def _host_copy(value: Any) -> Any:
    """A deep copy of a ``state_dict`` with every tensor copied into host memory."""
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, dict):
        return type(value)((k, _host_copy(v)) for k, v in value.items())
    if isinstance(value, list | tuple) and not hasattr(value, "_fields"):
        return type(value)(_host_copy(v) for v in value)
    return copy.deepcopy(value)


@dataclass
class Snapshot:
    """A commit copied out of the live objects: a payload ready to write (spotring's
    format, in a reused host buffer) or, for a state that format cannot hold, host
    copies for ``torch.save``."""

    payload: memoryview | None = None
    tree: dict[str, Any] | None = None
    release: Callable[[], None] = lambda: None
    """Frees the payload's buffer for a later snapshot: called once nothing reads it."""

    def serialized(self) -> memoryview:
        """The bytes to write."""
        if self.payload is not None:
            return self.payload
        assert self.tree is not None
        return serialize(self.tree)


def _state_tree(state: Any) -> dict[str, Any]:
    """Each handler's live ``state_dict`` (right after a commit saved it: the committed
    state) and the committed plain attributes, without copying anything. A state that
    says so itself (the torch backend's in-place ``TorchState``: ``durable_tree``) is
    asked; Horovod's are read."""
    if hasattr(state, "durable_tree"):
        tree: dict[str, Any] = state.durable_tree()
        return tree
    from spotring.worker_image.horovod_internals import saved_attributes, state_handlers

    handlers = {}
    for name, handler in state_handlers(state).items():
        state_dict = getattr(handler.value, "state_dict", None)
        if state_dict is None:
            raise TypeError(
                f"cannot checkpoint {name!r}: {type(handler.value).__name__} has no state_dict()"
            )
        handlers[name] = state_dict()
    return {"handlers": handlers, "attributes": dict(saved_attributes(state))}


def snapshot_state(state: Any, buffers: PayloadBuffers | None = None) -> Snapshot:
    """Rank 0's committed state, copied out of the live objects right after a commit
    saved them: each handler's ``state_dict`` and the plain attributes.

    With ``buffers``, every tensor is copied once, straight into its place in a reused
    host buffer that then is the payload (nothing to serialise); a state holding
    something that format cannot write (say a numpy value) is deep-copied for
    ``torch.save`` instead.
    """
    tree = _state_tree(state)
    if buffers is not None:
        try:
            payload, release = buffers.encode(tree)
            return Snapshot(payload=payload, release=release)
        except TypeError as error:
            _say_once(f"writing checkpoints with torch.save: {error}")
    return Snapshot(tree=_host_copy(tree))


def apply_snapshot(state: Any, snapshot: Mapping[str, Any]) -> None:
    """Load ``snapshot`` into the live objects of ``state`` and commit it there."""
    if hasattr(state, "load_durable_tree"):
        state.load_durable_tree(snapshot)
        return
    from spotring.worker_image.horovod_internals import state_handlers

    handlers = state_handlers(state)
    missing = sorted(set(snapshot["handlers"]) ^ set(handlers))
    if missing:
        raise ValueError(
            f"the checkpoint does not match the state's objects ({', '.join(missing)})"
        )
    for name, state_dict in snapshot["handlers"].items():
        handlers[name].value.load_state_dict(state_dict)
    for name, value in snapshot["attributes"].items():
        setattr(state, name, value)
    state.save()


def serialize(snapshot: Mapping[str, Any]) -> memoryview:
    """``snapshot`` in the format of the first checkpoints (``torch.save``)."""
    import torch

    buffer = io.BytesIO()
    torch.save(dict(snapshot), buffer)
    return buffer.getbuffer()


def deserialize(payload: bytes) -> dict[str, Any]:
    """The snapshot a checkpoint's data holds, in either format; ValueError if it is not
    a whole checkpoint of spotring's format."""
    import torch

    if is_payload(payload):
        loaded = decode_payload(payload)
    else:
        # weights_only: a checkpoint is data; nothing in it may run code when loaded.
        loaded = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    if not (
        isinstance(loaded, dict)
        and isinstance(loaded.get("handlers"), dict)
        and all(isinstance(v, Mapping) for v in loaded["handlers"].values())
        and isinstance(loaded.get("attributes"), dict)
        and all(isinstance(k, str) for k in loaded["attributes"])
    ):
        raise ValueError("not a spotring checkpoint")
    return loaded


# ----------------------------------------------------------------- the writer


@dataclass
class _Pending:
    commits: int
    committed_at: float
    snapshot: Snapshot
    done: threading.Event


WRITER_NICE = 0
"""How much lower the writer's threads run than the training (Linux nice is per thread,
and relative within the process's autogroup). 0: at 10, rank 0's writer also yields to
the other ranks of its host (one autogroup), and on a loaded 2-core machine the
end-to-end job finished before its next checkpoint was written."""


def _lower_priority(nice: int | None = None) -> None:
    """Lower the calling thread's scheduling priority (and that of the threads it
    starts) by ``nice`` (:data:`WRITER_NICE`), where threads have their own (Linux)."""
    nice = WRITER_NICE if nice is None else nice
    if nice <= 0:
        return
    with contextlib.suppress(AttributeError, OSError):
        thread = threading.get_native_id()
        current = os.getpriority(os.PRIO_PROCESS, thread)
        os.setpriority(os.PRIO_PROCESS, thread, min(19, current + nice))


class BackgroundWriter:
    """Writes snapshots on one thread; a newer snapshot replaces one still waiting.

    Never dies silently: a failed write is printed (with the error) and the next
    snapshot is tried as usual; the previous complete checkpoint stays the newest. A
    write refused because another driver holds the job's lock now is said once, and
    nothing more is written (:attr:`superseded`).
    """

    def __init__(self, write: Callable[[int, memoryview, dict[str, Any]], Any]) -> None:
        self._write = write
        self._pending: _Pending | None = None
        self._cond = threading.Condition()
        self._closed = False
        self.superseded = False
        """Another driver holds the lock: snapshots are dropped unwritten."""
        self._thread = threading.Thread(target=self._run, name="spotring-durable", daemon=True)
        self._thread.start()

    def submit(self, commits: int, snapshot: Snapshot) -> threading.Event:
        """Queue ``snapshot`` (the state at commit ``commits``); an event set once it
        was written or failed."""
        pending = _Pending(commits, time.time(), snapshot, threading.Event())
        with self._cond:
            if self.superseded:
                snapshot.release()
                pending.done.set()
                return pending.done
            if self._pending is not None:
                self._pending.snapshot.release()
                self._pending.done.set()  # superseded: never written
            self._pending = pending
            self._cond.notify()
        return pending.done

    def _run(self) -> None:
        _lower_priority()
        while True:
            with self._cond:
                while self._pending is None and not self._closed:
                    self._cond.wait()
                if self._pending is None:
                    return
                pending, self._pending = self._pending, None
            try:
                started = time.monotonic()
                payload = pending.snapshot.serialized()
                meta = {"commits": pending.commits, "committed_at": pending.committed_at}
                self._write(pending.commits, payload, meta)
                took = time.monotonic() - started
                _say(
                    f"checkpoint of commit {pending.commits} written "
                    f"({len(payload) / 2**20:.1f} MiB in {took:.2f} s)"
                )
            except CheckpointLockLost as error:  # said once; nothing more is written
                with self._cond:
                    self.superseded = True
                    waiting, self._pending = self._pending, None
                if waiting is not None:
                    waiting.snapshot.release()
                    waiting.done.set()
                _say(
                    f"checkpoint of commit {pending.commits} NOT written, nor any after it:"
                    f" another driver of the job holds its checkpoints now ({error})"
                )
            except Exception as error:  # said, and the next one is tried
                _say(f"checkpoint of commit {pending.commits} NOT written: {error}")
            finally:
                pending.snapshot.release()
                pending.snapshot = Snapshot()
                pending.done.set()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()


def _say(message: str) -> None:
    with contextlib.suppress(OSError, ValueError):
        print(f"{MARKER} {message}", file=sys.stderr, flush=True)


_said: set[str] = set()


def _say_once(message: str) -> None:
    if message not in _said:
        _said.add(message)
        _say(message)


# ----------------------------------------------------------------- the hooks


class DurableCommits:
    """Wraps ``commit`` and ``sync`` of Horovod's state classes (see the module)."""

    def __init__(
        self,
        config: DurableConfig,
        checkpoints: Any,  # spotring.checkpoint.Checkpoints
        rank: Callable[[], int],
        broadcast_object: Callable[..., Any],
        flush_requested: Callable[[], bool],
        clock: Callable[[], float] = time.monotonic,
        flush_poll: float = FLUSH_POLL_SECONDS,
    ) -> None:
        self.config = config
        self.commits = 0
        """The job's commit count: ``commit`` calls since the job's first ring."""
        self._checkpoints = checkpoints
        self._rank = rank
        self._broadcast_object = broadcast_object
        self._flush_requested = flush_requested
        self._clock = clock
        self._synced = False
        self._last_copy: float | None = None
        self._writer: BackgroundWriter | None = None
        self._buffers = PayloadBuffers()
        self._depth = threading.local()
        self._flush_poll = flush_poll
        self._flush_watch = threading.Event()  # set while the driver asks for it
        self._flush_watcher: threading.Thread | None = None

    # -- commit

    def wrap_commit(
        self, commit: Callable[..., Any], ring_change: type[BaseException] | None = None
    ) -> Callable[..., Any]:
        """``commit`` copying each commit that saved, every interval; ``ring_change``:
        what the commit raises, after saving, when the ring is about to change
        (default: Horovod's ``HostsUpdatedInterrupt``)."""
        if ring_change is None:
            from horovod.common.exceptions import HostsUpdatedInterrupt

            ring_change = HostsUpdatedInterrupt
        changing: type[BaseException] = ring_change
        hooks = self

        def durable_commit(state: Any, *args: Any, **kwargs: Any) -> Any:
            depth = getattr(hooks._depth, "commit", 0)
            hooks._depth.commit = depth + 1
            try:
                if depth:
                    return commit(state, *args, **kwargs)
                hooks.commits += 1
                try:
                    result = commit(state, *args, **kwargs)
                except changing:
                    hooks._after_commit(state, ring_changing=True)
                    raise
                hooks._after_commit(state, ring_changing=False)
                return result
            finally:
                hooks._depth.commit = depth

        return _marked(durable_commit, commit)

    def _after_commit(self, state: Any, ring_changing: bool) -> None:
        if getattr(state, "steps_since_commit", 0) != 0:
            return  # spotring's TorchState with commit_every: this call saved nothing
        try:
            if self._rank() != 0:
                return
        except ValueError:  # Horovod not initialised: not in a ring
            return
        if self._writer is not None and self._writer.superseded:
            return  # another driver's ring writes the job's checkpoints now
        self._watch_started()
        flush = self._flush_watch.is_set() or (ring_changing and self._flush_requested_safely())
        now = self._clock()
        if not flush and self._last_copy is not None and now - self._last_copy < self.config.every:
            return
        self._last_copy = now
        try:
            snapshot = snapshot_state(state, self._buffers)
        except Exception as error:  # never stop the training over a checkpoint
            _say(f"cannot copy the state of commit {self.commits}: {error}")
            return
        done = self._writer_started().submit(self.commits, snapshot)
        if flush:
            # Every commit from now until the ring stops, or its hosts go, is durable
            # before the training goes on: nothing committed is lost with them.
            _say(f"nobody stays to carry the ring on: writing commit {self.commits} now")
            if not done.wait(FLUSH_TIMEOUT_SECONDS):
                _say(
                    f"the checkpoint of commit {self.commits} took over {FLUSH_TIMEOUT_SECONDS:g} s"
                )

    def _flush_requested_safely(self) -> bool:
        try:
            return self._flush_requested()
        except Exception as error:  # the driver unreachable: the periodic copies remain
            _say(f"cannot ask the driver whether to write now: {error}")
            return False

    def _watch_started(self) -> None:
        """Rank 0 asks the driver twice a second, off the training path, whether every
        host of the ring is leaving (a host that stays to the end, with nobody to hand
        the state to, sees no ring change at its commits)."""
        if self._flush_watcher is None:
            self._flush_watcher = threading.Thread(
                target=self._watch, name="spotring-durable-flush", daemon=True
            )
            self._flush_watcher.start()

    def _watch(self) -> None:
        failures = 0
        while True:
            try:
                if self._flush_requested():
                    self._flush_watch.set()
                else:
                    self._flush_watch.clear()
                failures = 0
            except Exception as error:  # said now and then; the ring-change check remains
                failures += 1
                if failures in (1, 10) or failures % 120 == 0:
                    _say(f"cannot ask the driver whether every host is leaving: {error}")
            time.sleep(self._flush_poll)

    def _writer_started(self) -> BackgroundWriter:
        if self._writer is None:
            self._writer = BackgroundWriter(self._checkpoints.write)
        return self._writer

    # -- sync

    def wrap_sync(self, sync: Callable[..., Any]) -> Callable[..., Any]:
        hooks = self

        def durable_sync(state: Any, *args: Any, **kwargs: Any) -> Any:
            depth = getattr(hooks._depth, "sync", 0)
            hooks._depth.sync = depth + 1
            try:
                if depth:
                    return sync(state, *args, **kwargs)
                if not hooks._synced and hooks._rank() == 0:
                    hooks._resume(state)
                result = sync(state, *args, **kwargs)
                # Every rank calls sync, so every rank takes part in this broadcast.
                hooks.commits = int(
                    hooks._broadcast_object(hooks.commits, 0, name="spotring.commits")
                )
                hooks._synced = True
                return result
            finally:
                hooks._depth.sync = depth

        return _marked(durable_sync, sync)

    def _resume(self, state: Any) -> None:
        """Load the newest complete checkpoint into ``state`` (rank 0 of a ring in
        which nobody has state); a job without one starts from its initial state."""
        try:
            loaded = self._checkpoints.load_latest_decoded(deserialize)
            if loaded is None:
                _say(
                    f"no checkpoint in {self.config.uri}: starting from the script's initial state"
                )
                return
            info, snapshot = loaded
            apply_snapshot(state, snapshot)
        except Exception as error:
            # Never train on from the initial state when a checkpoint could not be
            # read: this worker fails, and the ring tries again without it.
            _say(f"cannot resume from {self.config.uri}: {error}")
            raise
        self.commits = info.commits
        committed_at = info.committed_at
        self._last_copy = self._clock()  # what was just loaded needs no copy
        _say(
            f"resumed from the checkpoint of commit {self.commits} "
            f"(committed {max(0.0, time.time() - committed_at):.1f} s ago)"
        )

    # -- installing

    def install(self, elastic: ModuleType) -> None:
        """Wrap ``elastic.State``'s ``commit`` and ``sync`` and every subclass's own."""
        from spotring.worker_image.state_hooks import wrap_in_state_classes

        wrap_in_state_classes(elastic, "commit", self.wrap_commit)
        wrap_in_state_classes(elastic, "sync", self.wrap_sync)

    def install_inplace(self, inplace: ModuleType) -> None:
        """Wrap ``commit`` and ``sync`` of the torch backend's in-place ``TorchState``
        (``spotring.torch.inplace``), asking its ``flush_requested`` whether to write
        each commit at once."""
        self._flush_requested = inplace.flush_requested
        state = inplace.TorchState
        state.commit = self.wrap_commit(state.commit, inplace.MembershipChanged)
        state.sync = self.wrap_sync(state.sync)


def _marked(wrapper: Callable[..., Any], wrapped: Callable[..., Any]) -> Callable[..., Any]:
    wrapper.__wrapped__ = wrapped  # type: ignore[attr-defined]  # as functools.wraps
    wrapper.__doc__ = wrapped.__doc__
    wrapper.__name__ = getattr(wrapped, "__name__", wrapper.__name__)
    return wrapper


def install_when_imported(env: Mapping[str, str] = os.environ) -> DurableCommits | None:
    """In a worker: durable checkpoints as the environment says, installed once
    ``horovod.common.elastic`` is imported. None when the job writes none."""
    from spotring.checkpoint import Checkpoints, Fence, open_store
    from spotring.worker_image.after_import import call_after_import
    from spotring.worker_image.peer_abort import read_generation_key

    config = DurableConfig.from_env(env)
    if config is None:
        return None
    checkpoints = Checkpoints(
        open_store(config.uri),
        job_id=config.job_id,
        keep=config.keep,
        fence=Fence.decode(config.fence) if config.fence else None,
    )

    def rank() -> int:
        from horovod.torch.mpi_ops import rank as horovod_rank

        return int(horovod_rank())

    def broadcast_object(value: Any, root_rank: int, name: str) -> Any:
        from horovod.torch.functions import broadcast_object as horovod_broadcast_object

        return horovod_broadcast_object(value, root_rank, name=name)

    def flush_requested() -> bool:
        return read_generation_key(FLUSH_KEY) is not None

    hooks = DurableCommits(config, checkpoints, rank, broadcast_object, flush_requested)
    call_after_import("horovod.common.elastic", _installer(hooks.install))
    if env.get(TORCH_COORDINATOR_ENV):  # the torch backend's in-place mode: its own ring
        # Its flush request comes from the in-place module (the coordinator), at install.
        inplace = DurableCommits(
            config, checkpoints, _torch_rank, _torch_broadcast_object, lambda: False
        )
        call_after_import("spotring.torch.inplace", _installer(inplace.install_inplace))
        return inplace
    return hooks


def _installer(install: Callable[[ModuleType], None]) -> Callable[[ModuleType], None]:
    def installing(module: ModuleType) -> None:
        try:
            install(module)
        except Exception as error:  # say so: the job runs, without durable copies
            _say(f"not installed, no durable checkpoints: {error}")

    return installing


def _torch_rank() -> int:
    import torch.distributed as dist

    if not dist.is_initialized():
        raise ValueError("no process group")  # as Horovod's rank before init
    return int(dist.get_rank())


def _torch_broadcast_object(value: Any, root_rank: int, name: str) -> Any:
    import torch.distributed as dist

    box = [value]
    dist.broadcast_object_list(box, src=root_rank)
    return box[0]
