"""An update's :class:`~broker.model.change.Change`, carried with the published entity.

The front that takes an update knows what it changed (it holds the last values); the front
that sends the notification may be another connection point. So the publishing front writes
the :class:`Change` into the published entity's bytes as a field the wire Entity does not
declare (number 15): protobuf keeps unknown fields through parsing and serializing, so it
travels untouched through access points, matchers and exit points, and gRPC clients ignore
it. An entity without one (a gRPC publisher's) counts as a change of every attribute it
carries. :class:`Alteration` and :class:`Change` are the model's, re-exported here.

The field holds a msgpack array: the alteration's code, the changed, metadata-changed and
requested attributes, the correlator, then (optional) the builtins of :func:`builtins_of`
(two items, or two nulls) and the update's X-Auth-Token (only when it had one, so an
update without a token costs nothing more).
"""

from __future__ import annotations

from typing import Any

import msgpack

from broker.model.change import Alteration, Change
from broker.store.semantics import Applied, iso8601
from broker.wire import client_pb2 as pb

__all__ = ["Alteration", "Change", "builtins_of", "read_change", "with_change"]

_FIELD = 15
_TAG = bytes([(_FIELD << 3) | 2])
_CODES = {a: i for i, a in enumerate(Alteration)}
_BY_CODE = dict(enumerate(Alteration))


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


def with_change(
    entity: pb.Entity,
    change: Change,
    builtins: tuple[Any, Any] | None = None,
    auth_token: str = "",
) -> pb.Entity:
    """``entity`` with ``change`` written into it (as unknown field 15); returns it.

    ``builtins`` (from :func:`builtins_of`): the dates, previous values and action types the
    store gave, compact; :func:`read_change` renders them into the Change's ``metadata``
    and ``attributes``. ``auth_token``: the X-Auth-Token of the request that made the
    update, forwarded on the notifications it causes (read back as ``auth_token``)."""
    fields = [
        _CODES[change.alteration],
        sorted(change.changed),
        sorted(change.meta_changed),
        sorted(change.requested),
        change.correlator,
    ]
    if builtins is not None:
        fields.extend(builtins)
    if auth_token:
        if builtins is None:
            fields.extend((None, None))
        fields.append(auth_token)
    body = msgpack.packb(fields)
    entity.MergeFromString(_TAG + _varint(len(body)) + body)
    return entity


def read_change(data: bytes, entity: pb.Entity | None = None) -> Change:
    """The Change written into an entity's bytes; a change of every attribute if none is
    (``entity``: the bytes parsed, if they already are)."""
    body = _field(data)
    if body is not None:
        try:
            code, changed, meta, requested, correlator, *rest = msgpack.unpackb(body)
            metadata: dict[str, Any] = {}
            attributes: dict[str, Any] = {}
            if len(rest) >= 2 and rest[0] is not None:
                metadata, attributes = _rendered(rest[0], rest[1])
            return Change(
                _BY_CODE[code],
                frozenset(changed),
                frozenset(meta),
                frozenset(requested),
                correlator,
                auth_token=rest[2] if len(rest) > 2 else "",
                metadata=metadata,
                attributes=attributes,
            )
        except (ValueError, KeyError, TypeError, msgpack.UnpackException):
            pass  # not ours: read it as a plain update
    if entity is None:
        entity = pb.Entity.FromString(data)
    names = frozenset(a.name for a in entity.attributes)
    return Change(Alteration.CHANGE, names, frozenset(), names)


def builtins_of(applied: Applied) -> tuple[Any, Any] | None:
    """The builtin metadata and attributes of an applied write, compact for the wire: per
    attribute [dateCreated, dateModified, actionType or None, previous [type, value] or
    None], and the entity's [dateCreated, dateModified] (epoch seconds)."""
    document = applied.document if applied.document is not None else applied.before
    if document is None:
        return None
    plain = not applied.operators  # Orion notifies neither after an update operator
    rows = {}
    for name in document.attributes:
        created, modified = document.dates(name)
        old = applied.previous.get(name) if plain else None
        rows[name] = [
            created,
            modified,
            applied.actions.get(name) if plain else None,
            None if old is None else [old["type"], old["value"]],
        ]
    return rows, [document.date_created, document.date_modified]


def _rendered(rows: Any, dates: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    metadata: dict[str, Any] = {}
    for name, (created, modified, action, previous) in rows.items():
        one = {
            "dateCreated": {"type": "DateTime", "value": iso8601(created)},
            "dateModified": {"type": "DateTime", "value": iso8601(modified)},
        }
        if action is not None:
            one["actionType"] = {"type": "Text", "value": action}
        if previous is not None:
            one["previousValue"] = {"type": previous[0], "value": previous[1]}
        metadata[name] = one
    created, modified = dates
    attributes = {
        "dateCreated": {"type": "DateTime", "value": iso8601(created), "metadata": {}},
        "dateModified": {"type": "DateTime", "value": iso8601(modified), "metadata": {}},
    }
    return metadata, attributes


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
