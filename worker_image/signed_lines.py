"""Signed lines: how a worker's supervisor tells the driver something it can trust.

The supervisor's stdout is the pipe (or ssh channel) the driver reads the worker's
output from, and the training script prints on it too. A line the driver acts on
(an interruption notice, :mod:`spotring.worker_image.notices`; ring progress,
:mod:`spotring.worker_image.progress`) is therefore one of these:

    MARKER {"launch": ID, "seq": N, ...the message's own fields..., "mac": HEX}

* ``MARKER`` starts with the ASCII record separator (no script prints it by accident)
  and names the message type;
* ``launch`` is the random id the driver gave that one worker launch: a line copied
  into another launch is rejected;
* ``seq`` counts the launch's messages of that type from 1: a line replayed within its
  launch is rejected;
* ``mac`` is HMAC-SHA256 under the job key over the JSON array of everything else
  (the type's tag, if it has one, ``launch``, ``seq``, the message's fields in order):
  the script does not hold the key, so a line it prints is rejected;
* a line longer than the type's bound is rejected unread.

:class:`SignedLine` is that envelope (a message type adds its fields and their
checks); :class:`LineAcceptor` is the driver's side of one launch.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
from collections.abc import Mapping
from typing import Any, ClassVar, Generic, TypeGuard, TypeVar

M = TypeVar("M", bound="SignedLine")


class SignedLine:
    """The envelope of a signed line; a subclass is a frozen dataclass whose fields are
    ``launch: str``, ``sequence: int``, its own fields, then ``mac: str = ""``.

    A subclass sets :attr:`MARKER` and :attr:`MAX_BYTES`, and implements
    :meth:`fields` (its own fields as they go on the line) and :meth:`from_body`
    (the message of a parsed line's JSON object, checked).
    """

    MARKER: ClassVar[str]
    """Starts the line."""
    MAX_BYTES: ClassVar[int]
    """Longer lines with the marker are rejected unread."""
    TAG: ClassVar[tuple[str, ...]] = ()
    """Goes first into the signed payload (none: the notices' payload has none)."""

    launch: str
    sequence: int
    mac: str

    def fields(self) -> dict[str, Any]:
        """The message's own fields, by their names on the line, in order."""
        raise NotImplementedError

    @classmethod
    def from_body(cls: type[M], body: Mapping[str, Any]) -> M:
        """The message of a line's JSON object; ``ValueError`` for a malformed one."""
        raise NotImplementedError

    def _payload(self) -> bytes:
        body = [*self.TAG, self.launch, self.sequence, *self.fields().values()]
        return json.dumps(body, separators=(",", ":")).encode()

    def signed(self: M, key: bytes) -> M:
        """This message with its MAC under ``key``."""
        mac = hmac.new(key, self._payload(), hashlib.sha256).hexdigest()
        return dataclasses.replace(self, mac=mac)  # type: ignore[type-var]  # subclasses are dataclasses

    def verify(self, key: bytes) -> bool:
        """Whether the MAC is valid under ``key``."""
        expected = hmac.new(key, self._payload(), hashlib.sha256).hexdigest()
        return hmac.compare_digest(expected, self.mac)

    def line(self) -> str:
        """The message as one stdout line (marker, JSON, newline)."""
        body = {"launch": self.launch, "seq": self.sequence, **self.fields(), "mac": self.mac}
        return self.MARKER + json.dumps(body, separators=(",", ":")) + "\n"

    @classmethod
    def parse(cls: type[M], line: str) -> M:
        """The message of a line that starts with :attr:`MARKER`.

        Raises ``ValueError`` for an oversized or malformed one.
        """
        if len(line.encode(errors="replace")) > cls.MAX_BYTES:
            raise ValueError("oversized")
        try:
            body = json.loads(line.removeprefix(cls.MARKER))
        except json.JSONDecodeError:
            raise ValueError("not JSON") from None
        if not isinstance(body, dict):
            raise ValueError("not a JSON object")
        return cls.from_body(body)


def is_int(value: Any) -> TypeGuard[int]:
    """Whether a JSON value is an integer (``true`` is not)."""
    return isinstance(value, int) and not isinstance(value, bool)


class Rejected(ValueError):
    """Why a line was not accepted. ``malformed``: it could not be read (oversized, not
    JSON, a field missing or out of range); otherwise it was read and failed a check
    (signature, launch, sequence)."""

    def __init__(self, reason: str, malformed: bool) -> None:
        super().__init__(reason)
        self.malformed = malformed


class LineAcceptor(Generic[M]):
    """The driver's side of one worker launch, for one message type: accepts a line
    that parses, is signed with the job key, belongs to this launch and is newer than
    the last one accepted.

    :param key: the job key (empty: every line is rejected).
    :param launch: the launch's id.
    """

    def __init__(self, message_type: type[M], key: bytes, launch: str) -> None:
        self._type = message_type
        self._key = key
        self._launch = launch
        self._last_sequence = 0
        self.rejected = 0
        """How many lines were rejected so far (to bound the logging of them)."""

    def accept(self, line: str) -> M:
        """The message of ``line`` (a trailing newline is dropped); raises
        :class:`Rejected`, counted in :attr:`rejected`, for a line not to act on."""
        try:
            message = self._type.parse(line.rstrip("\n"))
        except ValueError as error:
            self.rejected += 1
            raise Rejected(str(error), malformed=True) from None
        if not self._key or not message.verify(self._key):
            reason = "bad signature"
        elif message.launch != self._launch:
            reason = "it belongs to another launch"
        elif message.sequence <= self._last_sequence:
            reason = "replayed"
        else:
            self._last_sequence = message.sequence
            return message
        self.rejected += 1
        raise Rejected(reason, malformed=False)
