"""Pickles the driver takes from the network: plain data only, or Horovod's three
answer classes, each opcode checked before anything is loaded (a worker's registration,
and the answers of its notification service)."""

from __future__ import annotations

import base64
import binascii
import io
import ipaddress
import logging
import pickle
import pickletools
from typing import Any

from horovod.runner.common.util import secret

from spotring.driver.rendezvous.limits import MAX_ADDRESSES, MAX_WORKER_ADDRESSES_BYTES
from spotring.driver.rendezvous.refusal import HostileInput, printable

log = logging.getLogger(__name__)


# Every opcode the pickle of plain tuples, lists, dicts, str, bytes and ints may use.
# Nothing that looks up a global (GLOBAL, STACK_GLOBAL, EXT*, INST), calls (REDUCE,
# NEWOBJ*, OBJ, BUILD) or reaches outside the data (PERSID, NEXT_BUFFER); and no memo
# index chosen by the sender (PUT, LONG_BINPUT): the unpickler would size its memo to it.
PLAIN_DATA_OPCODES = frozenset(
    {
        *("PROTO", "FRAME", "STOP", "MARK", "POP", "POP_MARK", "DUP", "MEMOIZE"),
        *("BINPUT", "BINGET", "LONG_BINGET"),
        *("EMPTY_TUPLE", "TUPLE", "TUPLE1", "TUPLE2", "TUPLE3"),
        *("EMPTY_LIST", "LIST", "APPEND", "APPENDS", "EMPTY_DICT", "DICT"),
        *("SETITEM", "SETITEMS", "BININT", "BININT1", "BININT2", "LONG1"),
        *("SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8"),
        *("SHORT_BINBYTES", "BINBYTES", "BINBYTES8"),
    }
)


# Horovod's answers to the driver's messages, and what their pickles use beyond plain data.
ANSWER_CLASSES = frozenset(
    ("horovod.runner.common.util.network", name)
    for name in ("PingResponse", "AckResponse", "AckStreamResponse")
)
ANSWER_OPCODES = PLAIN_DATA_OPCODES | {"STACK_GLOBAL", "NEWOBJ", "BUILD"}


class _RestrictedUnpickler(pickle.Unpickler):
    """Looks up only the ``classes`` given (none: plain data only)."""

    def __init__(self, data: bytes, classes: frozenset[tuple[str, str]]) -> None:
        self.stream = io.BytesIO(data)
        super().__init__(self.stream)
        self._classes = classes

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in self._classes:
            raise HostileInput(f"the pickle names {printable(module)}.{printable(name)}")
        return super().find_class(module, name)

    def persistent_load(self, pid: Any) -> Any:
        raise HostileInput("the pickle has a persistent id")


def load_restricted(
    data: bytes, opcodes: frozenset[str], classes: frozenset[tuple[str, str]] = frozenset()
) -> Any:
    """Unpickle ``data`` if it uses only ``opcodes`` and ``classes``, and nothing follows
    it; raises :class:`HostileInput` otherwise. The opcodes are checked before anything
    is loaded."""
    try:
        for opcode, _arg, _pos in pickletools.genops(data):
            if opcode.name not in opcodes:
                raise HostileInput(f"pickle opcode {opcode.name}")
        unpickler = _RestrictedUnpickler(data, classes)
        value = unpickler.load()
    except HostileInput:
        raise
    except Exception as error:  # any malformed pickle
        raise HostileInput(f"not a pickle of the expected kind: {type(error).__name__}") from None
    if unpickler.stream.read(1):
        raise HostileInput("bytes after the pickle")
    return value


def decode_worker_addresses(body: bytes) -> tuple[dict[str, list[tuple[str, int]]], bytes]:
    """``(addresses, secret_key)`` from the body of Horovod's ``PUT worker_addresses``.

    Horovod's worker sends ``base64(cloudpickle((addresses, key)))``: ``addresses`` maps
    an interface name to a list of ``(ip, port)``, ``key`` is its notification
    service's secret. The pickle is checked opcode by opcode before it is loaded (plain
    data only), loaded without any global lookups, and must have exactly that shape.
    Raises :class:`HostileInput` for anything else.
    """
    if len(body) > MAX_WORKER_ADDRESSES_BYTES:
        raise HostileInput(f"registration of {len(body)} bytes")
    try:
        raw = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError) as error:
        raise HostileInput(f"not base64: {error}") from None
    return _worker_addresses(load_restricted(raw, PLAIN_DATA_OPCODES))


def _worker_addresses(value: object) -> tuple[dict[str, list[tuple[str, int]]], bytes]:
    if type(value) is not tuple or len(value) != 2:
        raise HostileInput("not a pair (addresses, key)")
    addresses, key = value
    if type(key) is not bytes or len(key) != secret.SECRET_LENGTH:
        raise HostileInput(f"the key is not {secret.SECRET_LENGTH} bytes")
    if type(addresses) is not dict or not addresses:
        raise HostileInput("the addresses are not a dict of interfaces")
    result: dict[str, list[tuple[str, int]]] = {}
    count = 0
    for interface, endpoints in addresses.items():
        if type(interface) is not str or not 0 < len(interface) <= 64:
            raise HostileInput("an interface name is not a short string")
        if not interface.isprintable():
            raise HostileInput("an interface name has control characters")
        if type(endpoints) is not list or not endpoints:
            raise HostileInput("an interface has no address list")
        count += len(endpoints)
        if count > MAX_ADDRESSES:
            raise HostileInput(f"more than {MAX_ADDRESSES} addresses")
        checked = []
        for endpoint in endpoints:
            if type(endpoint) is not tuple or len(endpoint) != 2:
                raise HostileInput("an address is not a pair (ip, port)")
            ip, port = endpoint
            if type(ip) is not str or len(ip) > 64 or type(port) is not int:
                raise HostileInput("an address is not (str, int)")
            try:
                ipaddress.ip_address(ip)
            except ValueError:
                raise HostileInput("an address is not an IP address") from None
            if not 0 < port < 65536:
                raise HostileInput(f"port {port} out of range")
            checked.append((ip, port))
        result[interface] = checked
    return result, key
