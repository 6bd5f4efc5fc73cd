"""The driver's rendezvous server: Horovod's, hardened against hostile requests.

Rooms: :mod:`.limits` (every bound), :mod:`.refusal` (what a refusal is), :mod:`.pickles`
(the only pickles taken off the network), :mod:`.mesh` (the one-request full mesh),
:mod:`.worker_client` (the driver's client of a worker's notification service),
:mod:`.handler` (the requests), :mod:`.threads` and :mod:`.server` (the HTTP server and
the current ring's state), :mod:`.tracker` (``RingTracker``, what the driver starts).

Horovod's elastic driver runs an HTTP key-value store (``RendezvousServer``) that every
worker reaches: Gloo's rendezvous keeps each ring's addresses there, a worker asks it
for its rank (``GET /rank_and_size/<host>:<slot>``) and registers its notification
service (``PUT /worker_addresses/<host>:<slot>``). As shipped, that server unpickles
the registration's body in the driver, keeps it (with the worker's secret key) where
any ``GET`` hands it out, stores any ``PUT`` to any scope, and reads whatever length a
request announces. spotring runs the same server (same store, same answers to Horovod's
clients) with a request handler that:

* decodes a registration with :func:`decode_worker_addresses`: no class or function is
  ever looked up, and only the shape Horovod's worker sends is accepted; it is handed
  to the driver and never stored;
* takes a write (every ``PUT`` and ``DELETE``, and the rank request, which tells the
  driver a worker is ready) only when it is signed by a worker of the job for the
  current ring (:mod:`spotring.worker_image.wire`: HMAC-SHA256 under the job key
  over the method, path, ring, a nonce and the body): an unsigned one is refused before
  its body is read, a forged, replayed or stale one before anything is stored or
  parked, and the first signed value of a key (a rank's mesh row) is final;
* answers ``rank_and_size`` only for slots of a ring this driver planned (Horovod
  answers a slot that left with ``-1``, and its worker leaves), and takes
  registrations only for slots of the current ring, one at a time per slot, each
  listing at most :data:`MAX_ADDRESSES` addresses;
* stores ``PUT`` s only under the keys Gloo's rendezvous writes for the current ring
  (``rank_<r>`` and ``<r>`` for each rank ``r`` below a scope's size), each up to the
  size Gloo's value has there, and the whole store up to a budget made from the plan
  (see :func:`store_budget`); keeps the ``spotring`` scope (the ring generation, plain
  ASCII digits) read-only from outside; and refuses a body over its key's bound before
  reading it;
* keeps one waiting mesh request per scope and rank (a newer one replaces it), counts
  a rank's ``DELETE`` only once the rank was answered, and answers a scope's waiters
  before the scope goes;
* gives a client :data:`REQUEST_DEADLINE_SECONDS` to send its whole request, and
  answers anything malformed with a 4xx and one warning line naming the client, never
  a traceback and never a change to the store.

A registration names an address and a key, and the driver then talks to that address:
:func:`use_safe_worker_clients` makes the driver's client for it unpickle nothing but
Horovod's three answer classes, whatever key the service signs with, gives a
connection and a whole answer :data:`ANSWER_TIMEOUT_SECONDS` each, and probes at most
:data:`MAX_CONCURRENT_PROBES` addresses at once.

What it cannot do: keep a client that reads the network between a worker and the
driver from reading what goes over it (the Gloo addresses, a registration's key), or
hold off one that opens connections until :data:`MAX_CONNECTIONS` (each cut off after
:data:`REQUEST_DEADLINE_SECONDS`). Reads change nothing and are not signed.
"""

from spotring.driver.rendezvous.handler import HardenedRendezvousHandler, rendezvous_handler
from spotring.driver.rendezvous.limits import (
    ENTRY_OVERHEAD_BYTES,
    MAX_ADDRESSES,
    MAX_BODY_BYTES,
    PAIR_ADDRESS_MAX_BYTES,
    gloo_value_limit,
    store_budget,
)
from spotring.driver.rendezvous.mesh import MeshScope
from spotring.driver.rendezvous.pickles import decode_worker_addresses
from spotring.driver.rendezvous.refusal import HostileInput
from spotring.driver.rendezvous.tracker import RingTracker
from spotring.driver.rendezvous.worker_client import (
    SafeWorkerNotificationClient,
    register_safe_worker_client,
    use_safe_worker_clients,
)
from spotring.worker_image.wire import MESH_ABANDONED, MESH_MAGIC, MESH_OK

__all__ = [
    "ENTRY_OVERHEAD_BYTES",
    "MAX_ADDRESSES",
    "MAX_BODY_BYTES",
    "MESH_ABANDONED",
    "MESH_MAGIC",
    "MESH_OK",
    "PAIR_ADDRESS_MAX_BYTES",
    "HardenedRendezvousHandler",
    "HostileInput",
    "MeshScope",
    "RingTracker",
    "SafeWorkerNotificationClient",
    "decode_worker_addresses",
    "gloo_value_limit",
    "register_safe_worker_client",
    "rendezvous_handler",
    "store_budget",
    "use_safe_worker_clients",
]
