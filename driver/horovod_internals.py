"""The driver side's reach into Horovod's internals, in one place.

spotring drives Horovod 0.28.1's elastic driver, rendezvous server and the driver's
client of each worker partly through their private attributes, and replaces some of
their methods. Every such use on the driver side is a small function here (the worker
side's are in :mod:`spotring.worker_image.horovod_internals`), and :data:`INTERNALS`
lists what they rely on: :mod:`spotring.driver.compat` checks each entry against the
installed Horovod before a run, and ``tests/test_horovod_internals.py`` fails when
spotring touches a private Horovod attribute anywhere else, or here without an entry.

Nothing here imports Horovod (``spotring --help`` imports :mod:`~spotring.driver.compat`,
which imports this table): the functions take Horovod's objects as arguments.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

_DRIVER = "horovod.runner.elastic.driver:ElasticDriver"
_CLIENT = "horovod.runner.common.util.network:BasicClient"
_SERVER = "horovod.runner.http.http_server:RendezvousServer"
_HTTP_SERVER = "horovod.runner.http.http_server:RendezvousHTTPServer"

INTERNALS: tuple[tuple[str, str], ...] = (
    # The elastic driver (driver/elastic.py, driver/rendezvous.py, driver/peer_failure.py).
    (_DRIVER, "_wait_hosts_cond"),
    (_DRIVER, "_host_manager"),
    (_DRIVER, "_notify_workers_host_changes"),
    (_DRIVER, "_worker_registry"),
    ("horovod.runner.elastic.registration:WorkerStateRegistry", "_barrier"),
    (_DRIVER, "_handle_worker_exit"),
    (_DRIVER, "register_worker_server"),
    (_DRIVER, "get_slot_info"),
    (_DRIVER, "_verbose"),
    (_DRIVER, "_worker_clients"),
    # ... and its public calls spotring makes.
    (_DRIVER, "get_coordinator_info"),
    (_DRIVER, "host_assignments"),
    (_DRIVER, "has_rank_assignment"),
    (_DRIVER, "get_worker_client"),
    (_DRIVER, "get_results"),
    ("horovod.runner.elastic.worker", "HostUpdateResult"),
    ("horovod.runner.gloo_run", "create_slot_env_vars"),
    ("horovod.runner.util.network", "get_driver_ip"),
    # The driver's client of a worker's notification service (driver/rendezvous.py,
    # driver/peer_failure.py).
    (_CLIENT, "_send"),
    (_CLIENT, "_wire"),
    (_CLIENT, "_probe"),
    (_CLIENT, "_probe_one"),
    (_CLIENT, "_send_one"),
    (_CLIENT, "_attempts"),
    ("horovod.runner.common.util.network:Wire", "_key"),
    # The rendezvous server, its HTTP server and request handler (driver/rendezvous.py).
    (_SERVER, "_verbose"),
    (_SERVER, "_httpd"),
    (_SERVER, "_listen_thread"),
    (_SERVER, "init"),
    ("horovod.runner.http.http_server", "RendezvousHandler"),
    ("horovod.runner.http.http_server:RendezvousHandler", "_get_value"),
    (_HTTP_SERVER, "init"),
    (_HTTP_SERVER, "cache"),
    (_HTTP_SERVER, "cache_lock"),
    (_HTTP_SERVER, "scope_size"),
    (_HTTP_SERVER, "finished_list"),
    (_HTTP_SERVER, "finished_list_lock"),
)
"""(``module`` or ``module:Class``, attribute) pairs the driver side relies on."""

# ------------------------------------------------------------- the elastic driver


def wait_hosts_cond(driver: Any) -> threading.Condition:
    """The ``ElasticDriver``'s lock (and condition) over its hosts and their changes."""
    cond: threading.Condition = driver._wait_hosts_cond
    return cond


def current_hosts(driver: Any) -> Any:
    """The driver's host manager's current hosts (Horovod's ``DiscoveredHosts``)."""
    return driver._host_manager.current_hosts


def notify_workers_host_changes(driver: Any, hosts: Any, update_result: Any) -> None:
    """Tell the coordinator of a host change, as the driver's discovery thread does
    (call it holding :func:`wait_hosts_cond`)."""
    driver._notify_workers_host_changes(hosts, update_result)


def reset_barrier(driver: Any) -> threading.Barrier | None:
    """The barrier of the driver's worker registry where a reset gathers its workers;
    None when the driver has none (yet)."""
    registry = getattr(driver, "_worker_registry", None)
    barrier: threading.Barrier | None = getattr(registry, "_barrier", None)
    return barrier


def handle_worker_exit(driver: Any) -> Callable[[Any, int, float], None]:
    """The driver's ``_handle_worker_exit(slot_info, exit_code, timestamp)``."""
    handle: Callable[[Any, int, float], None] = driver._handle_worker_exit
    return handle


def replace_handle_worker_exit(driver: Any, handle: Callable[[Any, int, float], None]) -> None:
    """Make ``driver`` record each worker's exit with ``handle`` instead."""
    driver._handle_worker_exit = handle


def replace_register_worker_server(driver: Any, register: Callable[..., None]) -> None:
    """Make ``driver`` take each worker's registration (``host, slot, addresses,
    secret_key``) with ``register`` instead (its rendezvous handler calls it)."""
    driver.register_worker_server = register


def replace_get_slot_info(driver: Any, get_slot_info: Callable[[str, int], Any]) -> None:
    """Make ``driver`` answer each rank request (``host, slot``) with ``get_slot_info``."""
    driver.get_slot_info = get_slot_info


def driver_verbose(driver: Any) -> int:
    """The driver's verbosity, as it passes it on to its worker clients."""
    verbose: int = driver._verbose
    return verbose


def set_worker_client(driver: Any, host: str, slot: int, client: Any) -> None:
    """Make ``client`` the driver's client of the worker in ``host``'s ``slot``."""
    driver._worker_clients[(host, slot)] = client


# ------------------------------------------------------------- the driver's worker clients


def send_request(client: Any, request: Any) -> Any:
    """Send ``request`` to the worker behind ``client`` (a ``BasicClient``) the way its
    own messages go (every address it probed, its attempts); Horovod's answer."""
    return client._send(request)


def wire_key(wire: Any) -> bytes:
    """The key a ``Wire`` signs and checks its messages with."""
    key: bytes = wire._key
    return key


def probe_one(client: Any, interface: str, endpoint: Any, found: Any) -> None:
    """Horovod's probe of one address (puts ``(interface, endpoint)`` on ``found`` when
    it answers; catches every error)."""
    client._probe_one(interface, endpoint, found)


def send_attempts(client: Any) -> int:
    """How many times ``client`` tries each exchange."""
    attempts: int = client._attempts
    return attempts


C = TypeVar("C", bound=type)


def route_client_hooks(cls: C) -> C:
    """Make a ``BasicClient`` subclass do Horovod's private steps with its own methods:

    * ``_wire`` (set by ``BasicClient.__init__`` to Horovod's ``Wire``, used by each
      exchange) reads ``cls.answer_wire``, and setting it calls ``cls.use_wire(wire)``;
    * ``_probe(addresses)`` (the addresses that answer, at construction) calls
      ``cls.probe``;
    * ``_send_one(addr, req, stream)`` (one exchange with one address) calls
      ``cls.send_one``.
    """
    target: Any = cls
    target._wire = property(
        lambda client: client.answer_wire, lambda client, wire: client.use_wire(wire)
    )
    target._probe = lambda client, addresses: client.probe(addresses)
    target._send_one = lambda client, addr, req, stream=None: client.send_one(addr, req, stream)
    return cls


# ------------------------------------------------------------- the rendezvous server


def server_verbose(server: Any) -> int:
    """A ``RendezvousServer``'s verbosity, as it passes it on to its HTTP server."""
    verbose: int = server._verbose
    return verbose


def http_server(server: Any) -> Any:
    """The ``RendezvousServer``'s HTTP server (None before it starts)."""
    return server._httpd


def set_http_server(server: Any, httpd: Any, listen_thread: threading.Thread) -> None:
    """Give a ``RendezvousServer`` the HTTP server ``listen_thread`` serves, as its own
    ``start`` does (its ``init`` and ``stop`` use both)."""
    server._httpd = httpd
    server._listen_thread = listen_thread


def stored_value(handler: Any, scope: str, key: str) -> bytes | None:
    """What a ``RendezvousHandler``'s server stores under ``/scope/key`` (None: nothing)."""
    value: bytes | None = handler._get_value(scope, key)
    return value
