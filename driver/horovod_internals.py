"""The driver side's reach into Horovod's internals, in one place.

spotring drives Horovod 0.28.1's elastic driver, rendezvous server and the driver's
client of each worker partly through their private attributes, and replaces some of
their methods. Every such use on the driver side is a small function here (the worker
side's are in :mod:`spotring.worker_image.horovod_internals`), and :data:`INTERNALS`
lists what they rely on: :mod:`spotring.driver.compat` checks each entry against the
installed Horovod before a run, and ``tests/unit/test_horovod_internals.py`` fails when
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
_REGISTRY = "horovod.runner.elastic.registration:WorkerStateRegistry"

C = TypeVar("C", bound=type)

INTERNALS: tuple[tuple[str, str], ...] = (
    # The elastic driver (driver/horovod_driver.py: spotring's subclass, its overrides
    # and what they use; driver/elastic.py, driver/rendezvous/, driver/peer_failure.py).
    (_DRIVER, "_wait_hosts_cond"),
    (_DRIVER, "_host_manager"),
    (_DRIVER, "_notify_workers_host_changes"),
    (_DRIVER, "_worker_registry"),
    (_REGISTRY, "_barrier"),
    (_DRIVER, "_handle_worker_exit"),
    (_DRIVER, "register_worker_server"),
    (_DRIVER, "get_slot_info"),
    (_DRIVER, "record_ready"),
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
    # A ring that lost every member starts again (driver/durable.py; the registry's
    # subclass in driver/horovod_driver.py).
    (_DRIVER, "_host_assignments"),
    (_DRIVER, "_get_host_assignments"),
    (_DRIVER, "_update_host_assignments"),
    (_DRIVER, "resume"),
    ("horovod.runner.elastic.discovery:HostManager", "blacklist"),
    (_REGISTRY, "_on_workers_recorded"),
    (_REGISTRY, "_action_event"),
    (_REGISTRY, "record_failure"),
    (_REGISTRY, "last_rendezvous"),
    (_REGISTRY, "_reset_count"),
    (_REGISTRY, "_reset_limit"),
    (_REGISTRY, "get"),
    (_REGISTRY, "size"),
    ("horovod.runner.elastic.registration", "FAILURE"),
    # The driver's client of a worker's notification service (driver/rendezvous/,
    # driver/peer_failure.py).
    (_CLIENT, "_send"),
    (_CLIENT, "_wire"),
    (_CLIENT, "_probe"),
    (_CLIENT, "_probe_one"),
    (_CLIENT, "_send_one"),
    (_CLIENT, "_attempts"),
    ("horovod.runner.common.util.network:Wire", "_key"),
    # The rendezvous server, its HTTP server and request handler (driver/rendezvous/).
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


# ------------------------------------------------- a ring that lost every member


def failed_slots(registry: Any) -> list[tuple[str, int]]:
    """The (host, local_rank) slots the registry recorded as failed in this round."""
    from horovod.runner.elastic.registration import FAILURE

    return sorted(registry.get(FAILURE))


def registry_size(registry: Any) -> int:
    """How many workers the registry's current round waits for."""
    size: int = registry.size()
    return size


def reset_limit_reached(registry: Any) -> bool:
    """Whether another reset would exceed ``--reset-limit``."""
    limit = registry._reset_limit
    return limit is not None and registry._reset_count >= limit


def blacklist(driver: Any, host: str) -> None:
    """Blacklist ``host`` as Horovod blacklists a failed host (until its cooldown)."""
    driver._host_manager.blacklist(host)


def count_reset(registry: Any) -> None:
    """Count a reset against ``--reset-limit``, as Horovod counts its own."""
    registry._reset_count += 1


def wait_for_round_decision(registry: Any) -> None:
    """Wait while the registry decides the end of a round (a new ring may be forming):
    what was true of a slot before may not be after."""
    registry._action_event.wait()


def assigned_hosts(driver: Any) -> set[str]:
    """The hosts of the ring the driver formed last."""
    return set(driver._host_assignments)


def hosts_to_assign(driver: Any, current_hosts: Any) -> set[str]:
    """The hosts the driver would give ranks to from ``current_hosts``."""
    assignments, _ = driver._get_host_assignments(current_hosts)
    return set(assignments)


def forget_host_assignments(driver: Any) -> None:
    """Make the driver's next ring start every slot anew: none of the last ring's
    workers remains to sync the others (Horovod refuses such a ring otherwise)."""
    driver._host_assignments = {}


def driver_verbose(driver: Any) -> int:
    """The driver's verbosity, as it passes it on to its worker clients."""
    verbose: int = driver._verbose
    return verbose


def set_worker_client(driver: Any, host: str, slot: int, client: Any) -> None:
    """Make ``client`` the driver's client of the worker in ``host``'s ``slot``."""
    driver._worker_clients[(host, slot)] = client


def replace_worker_registry(driver: Any, make: Callable[[Any, Any], Any]) -> None:
    """Give ``driver`` the registry ``make(driver, host_manager)`` in place of the one
    its ``__init__`` made (before it starts: the registry records each reset)."""
    driver._worker_registry = make(driver, driver._host_manager)


def route_driver_hooks(cls: C) -> C:
    """Make an ``ElasticDriver`` subclass do Horovod's private steps with its own
    methods, Horovod's own staying callable under a ``horovod_`` name:

    * ``_handle_worker_exit(slot_info, exit_code, timestamp)`` (a worker's exit
      recorded) calls ``cls.handle_worker_exit``; Horovod's: ``horovod_handle_worker_exit``;
    * ``_notify_workers_host_changes(current_hosts, update_result)`` (the coordinator
      told of a host change) calls ``cls.notify_workers_host_changes``; Horovod's:
      ``horovod_notify_workers_host_changes``;
    * ``_update_host_assignments(current_hosts)`` (the ranks of the next ring) calls
      ``cls.update_host_assignments``; Horovod's: ``horovod_update_host_assignments``.
    """
    target: Any = cls
    target.horovod_handle_worker_exit = target._handle_worker_exit
    target._handle_worker_exit = lambda driver, slot_info, exit_code, timestamp: (
        driver.handle_worker_exit(slot_info, exit_code, timestamp)
    )
    target.horovod_notify_workers_host_changes = target._notify_workers_host_changes
    target._notify_workers_host_changes = lambda driver, current_hosts, update_result: (
        driver.notify_workers_host_changes(current_hosts, update_result)
    )
    target.horovod_update_host_assignments = target._update_host_assignments
    target._update_host_assignments = lambda driver, current_hosts: driver.update_host_assignments(
        current_hosts
    )
    return cls


def route_registry_hooks(cls: C) -> C:
    """Make a ``WorkerStateRegistry`` subclass end a round (every worker recorded: the
    reset barrier's action) with ``cls.workers_recorded``; Horovod's decision stays
    callable as ``horovod_workers_recorded``."""
    target: Any = cls
    target.horovod_workers_recorded = target._on_workers_recorded
    target._on_workers_recorded = lambda registry: registry.workers_recorded()
    return cls


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
