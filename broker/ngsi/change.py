"""What an update changed, worked out against the last values, and carried with the entity.

Orion fires a subscription only on some *alteration types* (ngsi-v2.md section 3): an entity
created, changed (a value or metadata differs, or ``forcedUpdate``), updated (nothing
differs) or deleted; and, for a change, only when a ``condition.attrs`` attribute changed.
The front that takes the update knows this (it holds the last values); the front that sends
the notification may be another connection point. So the publishing front writes a
:class:`Change` into the published entity's bytes as a field the wire Entity does not
declare (number 15): protobuf keeps unknown fields through parsing and serializing, so it
travels untouched through access points, matchers and exit points, and gRPC clients ignore
it. An entity without one (a gRPC publisher's) counts as a change of every attribute it
carries.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

import msgpack

from broker.wire import client_pb2 as pb

__all__ = ["Alteration", "Change", "read_change", "with_change"]

_FIELD = 15
_TAG = bytes([(_FIELD << 3) | 2])


class Alteration(enum.Enum):
    """Orion's alteration types; the value is the name subscriptions use."""

    CREATE = "entityCreate"
    CHANGE = "entityChange"
    UPDATE = "entityUpdate"
    DELETE = "entityDelete"


_CODES = {a: i for i, a in enumerate(Alteration)}
_BY_CODE = dict(enumerate(Alteration))


@dataclass(frozen=True, slots=True)
class Change:
    """How one update altered its entity.

    ``changed``: attributes whose value or type changed (or were added or deleted);
    ``meta_changed``: attributes whose metadata alone changed; ``requested``: attributes the
    request named; ``correlator``: the request's Fiware-Correlator.
    """

    alteration: Alteration
    changed: frozenset[str] = frozenset()
    meta_changed: frozenset[str] = frozenset()
    requested: frozenset[str] = frozenset()
    correlator: str = ""

    def fires(self, condition: Iterable[str], notify_on_metadata: bool) -> bool:
        """Tell whether a subscription with these condition attributes fires on it."""
        condition = tuple(condition)
        if self.alteration is Alteration.DELETE:
            return True
        if self.alteration is Alteration.UPDATE:
            return not condition or any(a in self.requested for a in condition)
        touched = self.changed | self.meta_changed if notify_on_metadata else self.changed
        if not touched:
            return False
        return not condition or any(a in touched for a in condition)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low = n & 0x7F
        n >>= 7
        if n:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def with_change(entity: pb.Entity, change: Change) -> pb.Entity:
    """``entity`` with ``change`` written into it (as unknown field 15); returns it."""
    body = msgpack.packb(
        [
            _CODES[change.alteration],
            sorted(change.changed),
            sorted(change.meta_changed),
            sorted(change.requested),
            change.correlator,
        ]
    )
    entity.MergeFromString(_TAG + _varint(len(body)) + body)
    return entity


def read_change(data: bytes, entity: pb.Entity | None = None) -> Change:
    """The Change written into an entity's bytes; a change of every attribute if none is
    (``entity``: the bytes parsed, if they already are)."""
    body = _field(data)
    if body is not None:
        try:
            code, changed, meta, requested, correlator = msgpack.unpackb(body)
            return Change(
                _BY_CODE[code],
                frozenset(changed),
                frozenset(meta),
                frozenset(requested),
                correlator,
            )
        except (ValueError, KeyError, TypeError, msgpack.UnpackException):
            pass  # not ours: read it as a plain update
    if entity is None:
        entity = pb.Entity.FromString(data)
    names = frozenset(a.name for a in entity.attributes)
    return Change(Alteration.CHANGE, names, frozenset(), names)


def _field(data: bytes) -> bytes | None:
    """The payload of the last top-level length-delimited field 15 of a message, if any."""
    i, end, found = 0, len(data), None
    while i < end:
        key = data[i]
        if key < 0x80:  # one-byte varints, the usual keys and sizes, read inline
            i += 1
        else:
            key, i = _read_varint(data, i)
        kind = key & 7
        if kind == 0:
            _value, i = _read_varint(data, i)
        elif kind == 2:
            size = data[i] if i < end else 0
            if size < 0x80:
                i += 1
            else:
                size, i = _read_varint(data, i)
            if key >> 3 == _FIELD:
                found = data[i : i + size]
            i += size
        elif kind == 1:
            i += 8
        elif kind == 5:
            i += 4
        else:
            return found
    return found


def _read_varint(data: bytes, i: int) -> tuple[int, int]:
    shift = result = 0
    while i < len(data):
        byte = data[i]
        i += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, i
        shift += 7
    return result, i
