"""What travels between the fronts and the context store processes (``ContextStore`` bodies).

The gRPC messages (``StoreRequest``, ``StoreAnswer``) carry msgpack documents, versioned
here (:data:`WIRE_VERSION`): a front and a store of different wire versions refuse each
other's bodies with SerializationError instead of misreading them.

- ``Apply``: ``[version, [write, ...]]``, a write being :class:`Intent`'s fields; the answer
  ``[version, [result, ...]]``, one per write in order: the stored documents before and
  after (bytes of :meth:`Document.to_bytes`, or nil), the change, the previous values, the
  action types, whether an operator ran, and the error (its kind and message).
- ``Query``: ``[version, "entities" | "types", query]``; the answer is the query module's part.

Errors cross by kind: :data:`ERRORS` names every error a write can answer; anything else
arrives as SilboError with its message.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgpack

from broker.errors import (
    AlreadyExists,
    AmbiguousEntity,
    InvalidInput,
    InvalidUpdate,
    NotFound,
    PartialUpdate,
    SerializationError,
    SilboError,
    Unavailable,
    Unprocessable,
)
from broker.model.change import Alteration, Change
from broker.store.operators import OperatorError
from broker.store.semantics import Applied, Attribute, Document, Mode, Write

__all__ = [
    "ERRORS",
    "WIRE_VERSION",
    "Intent",
    "applied_of",
    "decode_results",
    "decode_writes",
    "encode_results",
    "encode_writes",
    "error_of",
    "pack",
    "result_row",
    "unpack",
]

WIRE_VERSION = 1

ERRORS: dict[str, type[SilboError]] = {
    cls.__name__: cls
    for cls in (
        AlreadyExists,
        InvalidInput,
        InvalidUpdate,
        NotFound,
        OperatorError,
        PartialUpdate,
        SerializationError,
        AmbiguousEntity,
        Unavailable,
        Unprocessable,
    )
}


@dataclass(frozen=True, slots=True)
class Intent:
    """A write as a front sends it: a :class:`Write` whose entity type may be unknown
    (``None``: the store finds the one entity of that id in that service path, or answers
    409 if there are several; a missing entity takes Orion's default type on creation)."""

    mode: Mode
    entity_id: str
    entity_type: str | None
    service_path: str = "/"
    tenant: str = ""
    attributes: dict[str, Attribute] = field(default_factory=dict)
    override_metadata: bool = False
    forced_update: bool = False
    value_only: bool = False
    correlator: str = ""
    upsert: bool = False  # a missing entity is created (batch appendStrict, as Orion)
    write_id: bytes = b""  # the sender's id of this write: sent again, it applies once

    def resolved(self, entity_type: str) -> Write:
        """The write, once its entity's type is known."""
        return Write(
            self.mode,
            self.entity_id,
            entity_type,
            self.service_path,
            self.tenant,
            self.attributes,
            self.override_metadata,
            self.forced_update,
            self.value_only,
            self.correlator,
        )


def pack(body: Any) -> bytes:
    """A versioned msgpack body."""
    return bytes(msgpack.packb([WIRE_VERSION, body], use_bin_type=True))


def unpack(data: bytes) -> Any:
    """The body of :func:`pack` (SerializationError for another version or bad bytes)."""
    try:
        version, body = msgpack.unpackb(data, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise SerializationError(f"not a context store message: {exc}") from exc
    if version != WIRE_VERSION:
        raise SerializationError(
            f"a context store message of wire version {version!r}; this process speaks "
            f"{WIRE_VERSION} (run one release across the cluster)"
        )
    return body


def encode_writes(writes: Sequence[Intent]) -> bytes:
    """The body of an ``Apply`` request."""
    return pack(
        [
            [
                w.mode.value,
                w.entity_id,
                w.entity_type,
                w.service_path,
                w.tenant,
                w.attributes,
                w.override_metadata,
                w.forced_update,
                w.value_only,
                w.correlator,
                w.upsert,
                w.write_id,
            ]
            for w in writes
        ]
    )


def decode_writes(data: bytes) -> list[Intent]:
    """The writes of an ``Apply`` request (SerializationError if it holds none readable)."""
    try:
        return [
            Intent(
                Mode(row[0]),
                row[1],
                row[2],
                row[3],
                row[4],
                dict(row[5]),
                bool(row[6]),
                bool(row[7]),
                bool(row[8]),
                row[9],
                bool(row[10]),
                bytes(row[11]),
            )
            for row in unpack(data)
        ]
    except (ValueError, TypeError, IndexError) as exc:
        raise SerializationError(f"not a context store write: {exc}") from exc


def encode_results(results: Sequence[Applied], rows: Sequence[list[Any]] | None = None) -> bytes:
    """The body of an ``Apply`` answer (``rows``: the results' rows, already made)."""
    return pack(list(rows) if rows is not None else [result_row(a) for a in results])


def result_row(
    applied: Applied, document: bytes | None = None, before: bytes | None = None
) -> list[Any]:
    """One result as plain data (msgpack-able; :func:`applied_of` reads it). What a front
    needs only: the document after a write that did something (before it, for a delete),
    none after a write that failed. ``document`` / ``before``: their bytes, if known."""
    change = applied.change
    after = before_row = None
    if change is not None and applied.document is not None:
        after = document if document is not None else applied.document.to_bytes()
    if change is not None and applied.document is None and applied.before is not None:
        before_row = before if before is not None else applied.before.to_bytes()
    return [
        before_row,
        after,
        None
        if change is None
        else [
            change.alteration.value,
            sorted(change.changed),
            sorted(change.meta_changed),
            sorted(change.requested),
            change.correlator,
        ],
        dict(applied.previous),
        dict(applied.actions),
        applied.modified,
        applied.operators,
        None if applied.error is None else [type(applied.error).__name__, str(applied.error)],
    ]


def decode_results(data: bytes) -> list[Applied]:
    """The results of an ``Apply`` answer, in the order of its writes."""
    try:
        return [applied_of(row) for row in unpack(data)]
    except (ValueError, TypeError, IndexError) as exc:
        raise SerializationError(f"not a context store result: {exc}") from exc


def applied_of(row: list[Any]) -> Applied:
    """The result :func:`result_row` gave."""
    before, document, change, previous, actions, modified, operators, error = row
    return Applied(
        Document.from_bytes(before) if before is not None else None,
        Document.from_bytes(document) if document is not None else None,
        None
        if change is None
        else Change(
            Alteration(change[0]),
            frozenset(change[1]),
            frozenset(change[2]),
            frozenset(change[3]),
            change[4],
        ),
        previous,
        actions,
        None if error is None else error_of(error[0], error[1]),
        bool(modified),
        bool(operators),
    )


def error_of(kind: str, message: str) -> SilboError:
    """The error a store answered, as its own class when it is one a write can answer."""
    return ERRORS.get(kind, SilboError)(message)
