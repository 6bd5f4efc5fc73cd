"""The worker side's reach into Horovod's internals, in one place.

In a worker, spotring wraps Horovod's ``init`` and its notification service, reads
the elastic state's and the optimizer's private attributes, and patches the state
class's ``reset``. Every such use on the worker side is a small function here (the
driver side's are in :mod:`spotring.driver.horovod_internals`), and :data:`INTERNALS`
lists what they rely on: :mod:`spotring.driver.compat` checks each entry against the
installed Horovod before a run, and ``tests/unit/test_horovod_internals.py`` fails when
spotring touches a private Horovod attribute anywhere else, or here without an entry.

Importing this module imports neither Horovod nor torch (the driver's compat check
imports its table): each function imports what it patches, or takes it as an argument.
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

_SERVICE = "horovod.runner.elastic.worker:WorkerNotificationService"

INTERNALS: tuple[tuple[str, str], ...] = (
    # Horovod's torch init, under each name it is reached by (worker_image/peer_abort.py),
    # and the init every framework's goes through (worker_image/warm_start.py).
    ("horovod.torch.mpi_ops", "init"),
    ("horovod.torch", "init"),
    ("horovod.torch.elastic", "init"),
    ("horovod.common.basics:HorovodBasics", "init"),
    # The loaded library, for spotring's own entry point (worker_image/peer_abort.py).
    ("horovod.torch.mpi_ops", "_basics"),
    # The worker's notification service (worker_image/peer_abort.py), and the
    # registration it sends the driver (sent signed: worker_image/store_client.py).
    ("horovod.runner.elastic.worker:WorkerNotificationManager", "_service"),
    ("horovod.runner.elastic.worker", "put_data_into_kvstore"),
    (_SERVICE, "_handle"),
    (_SERVICE, "_make_handler"),
    ("horovod.runner.common.util.network", "AckResponse"),
    # The elastic state and the optimizer (worker_image/state.py,
    # worker_image/sampler_reset.py; worker_image/progress.py patches State.commit).
    ("horovod.common.elastic:ObjectState", "_saved_state"),
    ("horovod.common.elastic:ObjectState", "_set_attrs"),
    ("horovod.common.elastic:State", "commit"),
    ("horovod.torch.elastic.state:TorchState", "reset"),
    ("horovod.torch.elastic.state:TorchState", "_handlers"),
    ("horovod.torch.optimizer:_DistributedOptimizer", "_handles"),
    ("horovod.torch.optimizer:_DistributedOptimizer", "_synchronized"),
    ("horovod.torch.optimizer:_DistributedOptimizer", "_should_synchronize"),
    ("horovod.torch.optimizer:_DistributedOptimizer", "_allreduce_delay"),
)
"""(``module`` or ``module:Class``, attribute) pairs the worker side relies on."""

# ------------------------------------------------------------- init


def replace_torch_init(init: Callable[..., Any]) -> None:
    """Make ``init`` Horovod's torch ``init`` under every name a script or Horovod's
    elastic reset reaches it by: ``hvd.init``, ``hvd.elastic``'s and ``mpi_ops.init``."""
    import horovod.torch as hvd_torch
    import horovod.torch.elastic as hvd_elastic
    import horovod.torch.mpi_ops as mpi_ops

    for module in (mpi_ops, hvd_torch, hvd_elastic):
        module.init = init


def wrap_basics_init(
    basics: ModuleType, wrap: Callable[[Callable[..., Any]], Callable[..., Any]]
) -> None:
    """Replace ``HorovodBasics.init`` of ``horovod.common.basics`` (``basics``), which
    every framework's ``hvd.init`` calls, with ``wrap(init)``."""
    cls = basics.HorovodBasics
    cls.init = wrap(cls.init)


def abort_collectives() -> bool:
    """Fail every Gloo send and receive in progress, or started later, on this process's
    current contexts (spotring's patched Horovod, ``horovod-failure-paths.patch``):
    Horovod's background loop then reports the error and the elastic reset begins.
    Contexts formed afterwards are not affected. False when the installed Horovod lacks
    the entry point, or has no Gloo."""
    import ctypes

    import horovod.torch.mpi_ops as mpi_ops

    try:
        entry = mpi_ops._basics.MPI_LIB_CTYPES.horovod_spotring_abort_collectives
    except AttributeError:  # a Horovod without spotring's patch
        return False
    entry.restype = ctypes.c_bool
    return bool(entry())


def set_store_key(job_key: bytes) -> bool:
    """Hand ``job_key`` to spotring's Horovod build (``horovod-rendezvous.patch``),
    which signs the worker's writes to the driver's rendezvous server with it. Through
    a call, never the environment. False when the installed Horovod lacks the entry
    point."""
    import ctypes

    import horovod.torch.mpi_ops as mpi_ops

    try:
        entry = mpi_ops._basics.MPI_LIB_CTYPES.horovod_spotring_set_store_key
    except AttributeError:  # a Horovod without spotring's patch
        return False
    entry.restype = ctypes.c_bool
    entry.argtypes = [ctypes.c_char_p, ctypes.c_int]
    return bool(entry(job_key, len(job_key)))


def replace_registration_put(put: Callable[[str, int, str, str, Any], None]) -> None:
    """Make the worker's notification manager register its service with ``put``
    (Horovod's ``put_data_into_kvstore(addr, port, scope, key, value)``, imported into
    ``horovod.runner.elastic.worker`` by name)."""
    import horovod.runner.elastic.worker as worker

    worker.put_data_into_kvstore = put


# ------------------------------------------------------------- the notification service


def has_notification_service() -> bool:
    """Whether this worker's notification service runs (Horovod starts it, and
    registers it with the driver, in ``hvd.elastic.run``)."""
    from horovod.common.elastic import notification_manager

    return getattr(notification_manager, "_service", None) is not None


def notification_handle() -> Callable[[Any, Any, Any], Any]:
    """``WorkerNotificationService._handle(service, request, client_address)``: what
    answers each request the service reads."""
    from horovod.runner.elastic.worker import WorkerNotificationService

    handle: Callable[[Any, Any, Any], Any] = WorkerNotificationService._handle
    return handle


def replace_notification_handle(handle: Callable[[Any, Any, Any], Any]) -> None:
    """Make every worker notification service answer requests with ``handle``."""
    from horovod.runner.elastic.worker import WorkerNotificationService

    WorkerNotificationService._handle = handle


def notification_handler_factory() -> Callable[[Any], Any]:
    """``WorkerNotificationService._make_handler(service)``: the request handler class
    each service is made with."""
    from horovod.runner.elastic.worker import WorkerNotificationService

    make_handler: Callable[[Any], Any] = WorkerNotificationService._make_handler
    return make_handler


def replace_notification_handler_factory(make_handler: Callable[[Any], Any]) -> None:
    """Make every worker notification service made from now on take its request
    handler class from ``make_handler(service)``."""
    from horovod.runner.elastic.worker import WorkerNotificationService

    WorkerNotificationService._make_handler = make_handler


def ack_response() -> Any:
    """Horovod's plain answer to a request (``AckResponse``)."""
    from horovod.runner.common.util import network

    return network.AckResponse()


# ------------------------------------------------------------- the elastic state


def saved_attributes(state: Any) -> dict[str, Any]:
    """An ``ObjectState``'s committed plain attributes (name -> value)."""
    saved: dict[str, Any] = state._saved_state
    return saved


def restore_attributes(state: Any, saved: dict[str, Any]) -> None:
    """Make ``saved`` an ``ObjectState``'s committed plain attributes, and set them on it
    (as its ``restore`` and ``sync`` do)."""
    state._saved_state = saved
    state._set_attrs()


def state_handlers(state: Any) -> dict[str, Any]:
    """Horovod's ``TorchState``'s handlers (its model, optimizer, samplers...), by name."""
    handlers: dict[str, Any] = state._handlers
    return handlers


def torch_state_reset() -> Callable[[Any], None]:
    """``hvd.elastic.TorchState.reset``, called after every reset."""
    from horovod.torch.elastic.state import TorchState

    reset: Callable[[Any], None] = TorchState.reset
    return reset


def replace_torch_state_reset(reset: Callable[[Any], None]) -> None:
    """Make ``hvd.elastic.TorchState`` (and its subclasses) reset with ``reset``."""
    from horovod.torch.elastic.state import TorchState

    TorchState.reset = reset


def forget_pending_allreduces(optimizer: Any) -> None:
    """Clear a ``hvd.DistributedOptimizer``'s in-flight gradient allreduces (nothing
    for another optimizer).

    A failure between ``backward()`` and ``step()`` leaves handles of a collective that
    will never finish; horovod's TorchState drops them through ``load_state_dict``,
    which our in-place restore does not call. Without this, the next ``zero_grad()``
    raises "called after loss.backward() but before optimizer.step()".
    """
    if not hasattr(optimizer, "_handles"):
        return
    optimizer._handles = {}
    optimizer._synchronized = False
    optimizer._should_synchronize = True
    for param in optimizer._allreduce_delay:
        optimizer._allreduce_delay[param] = optimizer.backward_passes_per_step
