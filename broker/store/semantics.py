"""Orion's write semantics on one stored entity: what a write leaves and what it changed.

Pure functions, no I/O: the context store process reads the stored :class:`Document`, calls
:func:`apply` with the :class:`Write` a front sent and the time, persists what comes back and
routes its :class:`~broker.ngsi.change.Change`. Sources: Orion's ``doc/manuals/orion-api.md``
(4.x, "api" below) and its code (``src/lib/mongoBackend/MongoCommonUpdate.cpp``, "code").

Writes (api: Entities Operations, Batch Operations; code: ``processContextElement``):

- create on an existing entity: AlreadyExists; every other mode but upsert on a missing entity:
  NotFound. Upsert (and batch append) creates, or updates-or-appends (``append``).
- ``update`` (PATCH) applies the existing attributes; missing ones are Unprocessable (all) or
  PartialUpdate (some; the rest applies). ``appendStrict`` appends the missing ones; existing
  ones are Unprocessable / PartialUpdate. ``replaceAttribute`` (PUT ``.../attrs/{a}``): 404 if
  absent. ``deleteAttributes``: 404 if none exists, PartialUpdate if some do not.
- ``replace`` (PUT ``.../attrs``) writes the request's attributes as new ones (fresh
  ``dateCreated``) and removes the others; every requested attribute counts as changed, even
  with an identical value; a removed one does not (code: ``updateAttribute`` with isReplace
  puts only request attributes in the trigger list). A replace without attributes changes
  nothing (code: no attribute processed, entity not modified; not confirmed by a test).

Metadata (api: Metadata update semantics, overrideMetadata option; code: ``mergeAttrInfo``):
an update merges the request's metadata into the existing ones (a key in the request wins,
the others stay); ``overrideMetadata`` replaces them, so ``{}`` (or none) clears them. PUT of
one attribute (replaceAttribute) is an update of that attribute: it merges too, and
``overrideMetadata`` works there (the api's own example is a PUT). PUT ``.../value``
(``Write.value_only``) keeps the type and every metadata, ``overrideMetadata`` ignored.
Appended or replaced attributes take the request's metadata as given.

Change detection (code: ``mergeAttrInfo``, ``processContextAttributeVector``): an attribute's
value changed if ``forcedUpdate``, if the value differs (numbers as doubles: 1 == 1.0, true is
no number; objects deeply) or if the type differs; its metadata changed if the merged metadata
differ. Value changed -> ``Change.changed``; metadata alone -> ``meta_changed``. Added and
deleted attributes are changed. Any of these makes the write an entityChange and sets the
entity's and the attribute's ``dateModified``; none is an entityUpdate and nothing is stored.

Update operators (api: Update operators for attribute values): a value that is an object
whose first key is ``$inc $mul $min $max $push $addToSet $pull $pullAll $set $unset``.

- On an existing attribute MongoDB's semantics apply; what MongoDB refuses is Orion's 500
  InternalServerError (:class:`OperatorError`, a 400 here; nothing of the write applies):
  ``$inc``/``$mul`` of a non-number or by one;
  ``$push``/``$addToSet``/``$pull``/``$pullAll`` on a non-array (``$pullAll`` by a
  non-array); ``$set`` of an object into a non-object; ``$set`` and ``$unset`` of one key.
  ``$min``/``$max`` compare in BSON order (null < numbers < strings < objects < arrays <
  booleans; DateTime attributes as dates). ``$set`` of a non-object is a plain update;
  ``$unset`` of a non-object, or on a non-object, changes nothing. ``$push`` takes
  ``$each``, ``$position``, ``$slice``; ``$addToSet`` takes ``$each``. An operator always
  counts as a value change (code compares the operator object with the stored value).
- On an attribute missing from an existing entity (MongoDB on a missing field): ``$inc``,
  ``$min``, ``$max`` give the operand, ``$mul`` 0, ``$push``/``$addToSet`` an array, ``$set``
  the object; ``$pull``, ``$pullAll``, ``$unset`` create nothing.
- In a create or a replace (api: Usage in create or replace entity operations; code:
  ``ContextAttribute::calculateOperator``) numbers start from 0 (``$inc`` n -> n, ``$mul`` ->
  0, ``$min`` n -> min(0, n), ``$max`` -> max(0, n)), dates from the epoch, ``$push`` and
  ``$addToSet`` from ``[]``, ``$set`` from ``{}``; ``$pull``, ``$pullAll``, ``$unset`` create
  nothing.
- A missing type is inferred from the request value as usual, so ``{"$inc": 1}`` without a type
  becomes ``StructuredValue`` (code: ``parseContextAttribute`` infers before the operator runs).

Builtins (api: Builtin Attributes, Builtin Metadata, Transient Entities; code: ``addBuiltins``,
``dateExpiration.cpp``): the entity's ``dateCreated``/``dateModified`` and each attribute's
(kept in :attr:`Document.attribute_dates`); ``dateExpires`` is the attribute of that name,
which must be typed DateTime (else 400, nothing applied); null or removed: no expiry. An
expired entity stays writable until the store removes it (Orion: MongoDB's TTL monitor,
within 60 s).
``previousValue`` is given for every existing attribute a write updated with a value,
changed or not (code: ``updateAttrInNotifyCer``; the api: equal values mean no change);
``actionType`` is ``append`` for a created entity's and an appended attribute, ``update`` for
an updated or replaced one; deleted attributes are not notified (code skips them) and Orion
never sends ``delete`` (api annex: actionType metadata). An update with an operator notifies
the entity re-read from MongoDB, without either (code: ``updateEntity``, findAndModify).

Where Orion's documentation and code disagree, or this could not be confirmed:

- creation-time operators: the old user manual (``user/update_operators.md``) stores them
  literally; the api and the code compute them (followed). Where the code builds odd values
  (``$push``/``$addToSet`` with ``$each``: an array of the operator's parts; ``$set`` of a
  non-object: no value) MongoDB's result on a missing field is used; a non-number ``$inc``,
  ``$min`` or ``$max`` gives 0, as in the code.
- the api's example of ``$set`` with ``$unset`` shows ``{"Y": 20}`` where MongoDB (followed)
  gives ``{"Y": 20, "Z": 30}``; the user manual's ``$unset`` example shows ``{"Y": 20}`` for
  ``{"Y": 2}``.
- ``$pull``/``$pullAll``/``$unset`` appended to an existing entity: the code leaves an
  attribute with no value; here it is not created, as in a create.
- whether Orion's compound equality is key-order sensitive; whether ``$pull`` by an object
  (a MongoDB query) matches as MongoDB does (here: by equality); ``$push`` ``$sort``.
- after a replace, Orion's notification still carries the removed attributes (the code
  builds it from the stored entity and skips only deleted ones); here the stored document is
  what is notified.
- Orion fires entityUpdate subscriptions after a write that failed whole (Unprocessable);
  here a failed write has no change. Error descriptions are the HTTP front's (cache.py), not
  Orion's ("do not exist: E/T - [ A ]").
- Silbo's choices: ``dateModified`` never goes back (the write's time is at least the stored
  one); metadata keep their order with new keys last (Orion: request's first, others sorted).
"""

from __future__ import annotations

import enum
import math
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import msgpack

from broker.errors import (
    AlreadyExists,
    InvalidUpdate,
    NotFound,
    SerializationError,
    SilboError,
)
from broker.model.attribute import DATE_TYPES, default_type, parse_iso8601
from broker.ngsi.change import Alteration, Change
from broker.ngsi.errors import PartialUpdate, Unprocessable

__all__ = [
    "BUILTIN_METADATA",
    "DOCUMENT_VERSION",
    "Applied",
    "Attribute",
    "Attributes",
    "Document",
    "Key",
    "Mode",
    "OperatorError",
    "Write",
    "apply",
    "builtin_attributes",
    "iso8601",
    "notification_metadata",
]

DOCUMENT_VERSION = 1
BUILTIN_METADATA = ("dateCreated", "dateModified", "previousValue", "actionType")

Attribute = dict[str, Any]  # {"type", "value", "metadata": {name: {"type", "value"}}}
Attributes = dict[str, Attribute]
Key = tuple[str, str, str, str]  # tenant, service path, entity id, entity type

_NO_ENTITY = "The requested entity has not been found. Check type and id"
_NO_ATTRIBUTE = "The entity does not have such an attribute"
_EPOCH = "1970-01-01T00:00:00.000Z"
_LARGEST = sys.float_info.max
_OPERATORS = frozenset(
    {"$inc", "$mul", "$min", "$max", "$push", "$addToSet", "$pull", "$pullAll", "$set", "$unset"}
)


class Mode(enum.Enum):
    """What a write does; the values of :class:`broker.ngsi.cache.Mode` (``Mode(m.value)``)."""

    CREATE = "create"  # POST /v2/entities
    UPSERT = "upsert"  # POST /v2/entities?options=upsert; batch append
    APPEND = "append"  # POST .../attrs: update or append
    APPEND_STRICT = "appendStrict"  # POST .../attrs?options=append
    UPDATE = "update"  # PATCH .../attrs: existing attributes only
    REPLACE = "replace"  # PUT .../attrs: all attributes replaced
    REPLACE_ATTRIBUTE = "replaceAttribute"  # PUT .../attrs/{a}[/value]
    DELETE_ATTRIBUTES = "deleteAttributes"  # DELETE .../attrs/{a}; batch delete with attrs
    DELETE_ENTITY = "deleteEntity"  # DELETE /v2/entities/{id}; batch delete without attrs


_MUST_EXIST = frozenset(Mode) - {Mode.CREATE, Mode.UPSERT}


class OperatorError(InvalidUpdate):
    """An update operator cannot apply to the stored value (MongoDB refuses it; nothing of
    the write applies). Orion answers 500 InternalServerError; Silbo answers 400 BadRequest,
    as for any request the client can fix: a 5xx says the broker failed."""


class _Missing:
    """The value of an attribute that does not exist (MongoDB's missing field)."""


_MISSING = _Missing()
_DROP = _Missing()  # an operator result meaning "no attribute"


@dataclass(frozen=True, slots=True)
class Document:
    """One stored entity: its attributes (insertion order kept) and builtin dates (epoch s).

    ``attribute_dates`` maps each attribute to its (dateCreated, dateModified);
    ``date_expires`` comes from the ``dateExpires`` attribute (None: the entity does not expire).
    """

    id: str
    type: str
    service_path: str
    tenant: str
    attributes: Attributes
    date_created: float
    date_modified: float
    date_expires: float | None = None
    attribute_dates: Mapping[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def key(self) -> Key:
        """The partitioning key: (tenant, service path, id, type)."""
        return (self.tenant, self.service_path, self.id, self.type)

    def expired(self, now: float) -> bool:
        """Tell whether the entity's ``dateExpires`` has passed at ``now``."""
        return self.date_expires is not None and self.date_expires <= now

    def to_bytes(self) -> bytes:
        """The document as msgpack (integers past 64 bits stored as doubles, as Orion does)."""
        body = [
            DOCUMENT_VERSION,
            self.tenant,
            self.service_path,
            self.id,
            self.type,
            self.date_created,
            self.date_modified,
            self.date_expires,
            [
                [name, a["type"], a["value"], a["metadata"], *self.dates(name)]
                for name, a in self.attributes.items()
            ],
        ]
        try:
            return bytes(msgpack.packb(body, use_bin_type=True))
        except OverflowError:
            return bytes(msgpack.packb(_doubled(body), use_bin_type=True))

    @classmethod
    def from_bytes(cls, data: bytes) -> Document:
        """The document written by :meth:`to_bytes` (SerializationError if it is not one)."""
        try:
            version, tenant, path, id_, type_, created, modified, expires, rows = msgpack.unpackb(
                data, raw=False
            )
            if version != DOCUMENT_VERSION:
                raise SerializationError(f"context store document of version {version!r}")
            attributes: Attributes = {}
            dates: dict[str, tuple[float, float]] = {}
            for name, a_type, value, metadata, a_created, a_modified in rows:
                attributes[name] = {"type": a_type, "value": value, "metadata": metadata}
                dates[name] = (a_created, a_modified)
            return cls(id_, type_, path, tenant, attributes, created, modified, expires, dates)
        except (ValueError, TypeError, msgpack.UnpackException) as exc:
            raise SerializationError(f"not a context store document: {exc}") from exc

    def dates(self, name: str) -> tuple[float, float]:
        """An attribute's (dateCreated, dateModified); the entity's if it has none recorded."""
        return self.attribute_dates.get(name, (self.date_created, self.date_modified))


@dataclass(frozen=True, slots=True)
class Write:
    """One write to one entity, as the front parsed it (keyValues already resolved).

    ``attributes`` are normalized (``{"type", "value", "metadata"}``); a type of None keeps the
    existing attribute's (a new one's is inferred); for ``deleteAttributes`` only the names
    count. ``value_only``: PUT ``.../attrs/{a}/value`` (type and metadata kept).
    """

    mode: Mode
    entity_id: str
    entity_type: str
    service_path: str = "/"
    tenant: str = ""
    attributes: Mapping[str, Attribute] = field(default_factory=dict)
    override_metadata: bool = False
    forced_update: bool = False
    value_only: bool = False
    correlator: str = ""


@dataclass(frozen=True, slots=True)
class Applied:
    """What a write did.

    ``document``: the entity now (None: deleted or never there; ``before`` if the write
    failed); ``change``: None if nothing applied; ``previous``: each existing attribute the
    write updated, replaced or deleted, as it was; ``actions``: Orion's actionType per
    notified attribute; ``error``: why it failed (``change`` None) or applied in part;
    ``modified``: the store must write ``document`` (or delete); ``operators``: an update
    operator ran on an existing entity (Orion then notifies no previousValue / actionType).
    """

    before: Document | None
    document: Document | None
    change: Change | None
    previous: Mapping[str, Attribute] = field(default_factory=dict)
    actions: Mapping[str, str] = field(default_factory=dict)
    error: SilboError | None = None
    modified: bool = False
    operators: bool = False


def apply(current: Document | None, write: Write, now: float) -> Applied:
    """Apply ``write`` to the stored entity (None: there is none) at ``now``, as Orion does.

    Never raises for what a request can cause: the error is in the answer (see Applied).
    """
    try:
        return _apply(current, write, now)
    except SilboError as exc:
        return Applied(current, current, None, error=exc)


def notification_metadata(
    applied: Applied, requested: Iterable[str]
) -> dict[str, dict[str, dict[str, Any]]]:
    """The builtin metadata to add per attribute of the notified entity, for a subscription
    whose ``notification.metadata`` is ``requested`` (``*`` names no builtin; a user metadata
    of the same name wins, as in Orion)."""
    asked = set(requested)
    wanted = [m for m in BUILTIN_METADATA if m in asked]
    entity = applied.document if applied.document is not None else applied.before
    if not wanted or entity is None:
        return {}
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for name, attribute in entity.attributes.items():
        extra: dict[str, dict[str, Any]] = {}
        created, modified = entity.dates(name)
        for meta in wanted:
            if meta in attribute["metadata"]:
                continue
            if meta == "dateCreated":
                extra[meta] = {"type": "DateTime", "value": iso8601(created)}
            elif meta == "dateModified":
                extra[meta] = {"type": "DateTime", "value": iso8601(modified)}
            elif applied.operators:
                continue
            elif meta == "actionType" and name in applied.actions:
                extra[meta] = {"type": "Text", "value": applied.actions[name]}
            elif meta == "previousValue" and name in applied.previous:
                old = applied.previous[name]
                extra[meta] = {"type": old["type"], "value": old["value"]}
        if extra:
            out[name] = extra
    return out


def builtin_attributes(document: Document) -> Attributes:
    """The entity's ``dateCreated`` and ``dateModified`` builtin attributes (``dateExpires`` is
    the stored attribute itself)."""
    dates = {"dateCreated": document.date_created, "dateModified": document.date_modified}
    return {n: {"type": "DateTime", "value": iso8601(t), "metadata": {}} for n, t in dates.items()}


def iso8601(epoch: float) -> str:
    """An epoch as Orion renders dates: ``YYYY-MM-DDThh:mm:ss.sssZ``."""
    moment = datetime.fromtimestamp(epoch, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.") + f"{moment.microsecond // 1000:03d}Z"


# -- the modes --------------------------------------------------------------------------------


def _apply(current: Document | None, write: Write, now: float) -> Applied:
    mode = write.mode
    if current is None:
        if mode in _MUST_EXIST:
            raise NotFound(_NO_ENTITY)
        return _create(write, now)
    if mode is Mode.CREATE:
        raise AlreadyExists("Already Exists")
    if mode is Mode.DELETE_ENTITY:
        change = Change(Alteration.DELETE, correlator=write.correlator)
        return Applied(current, None, change, modified=True)
    stamp = max(now, current.date_modified)  # dates never go back, whatever the clock does
    if mode is Mode.REPLACE:
        return _replace(current, write, stamp)
    if mode is Mode.DELETE_ATTRIBUTES:
        return _delete_attributes(current, write, stamp)
    return _update(current, write, stamp)


def _create(write: Write, now: float) -> Applied:
    attributes = _initials(write)
    document = Document(
        write.entity_id,
        write.entity_type,
        write.service_path,
        write.tenant,
        attributes,
        now,
        now,
        _expiry(attributes),
        dict.fromkeys(attributes, (now, now)),
    )
    names = frozenset(write.attributes)
    change = Change(Alteration.CREATE, names, frozenset(), names, write.correlator)
    actions = dict.fromkeys(attributes, "append")
    return Applied(None, document, change, actions=actions, modified=True)


def _replace(current: Document, write: Write, stamp: float) -> Applied:
    if not write.attributes:
        return Applied(current, current, Change(Alteration.UPDATE, correlator=write.correlator))
    attributes = _initials(write)
    previous = dict(current.attributes)  # overwritten or removed
    document = _stored(current, attributes, dict.fromkeys(attributes, (stamp, stamp)), stamp)
    names = frozenset(write.attributes)
    change = Change(Alteration.CHANGE, names, frozenset(), names, write.correlator)
    actions = dict.fromkeys(attributes, "update")
    return Applied(current, document, change, previous, actions, modified=True)


def _delete_attributes(current: Document, write: Write, stamp: float) -> Applied:
    present = [a for a in write.attributes if a in current.attributes]
    absent = [a for a in write.attributes if a not in current.attributes]
    if not present:
        raise NotFound(_NO_ATTRIBUTE)
    partial = PartialUpdate(f"Some of the attributes do not exist: {absent}") if absent else None
    gone = set(present)
    attributes = {n: a for n, a in current.attributes.items() if n not in gone}
    dates = {n: d for n, d in current.attribute_dates.items() if n not in gone}
    document = _stored(current, attributes, dates, stamp)
    requested = frozenset(write.attributes)
    change = Change(Alteration.CHANGE, frozenset(present), frozenset(), requested, write.correlator)
    previous = {n: current.attributes[n] for n in present}
    return Applied(current, document, change, previous, error=partial, modified=True)


def _update(current: Document, write: Write, stamp: float) -> Applied:
    """update, append, upsert, appendStrict, replaceAttribute on an existing entity."""
    old = current.attributes
    targets, partial = _targets(old, write)
    attributes = dict(old)
    dates = dict(current.attribute_dates)
    changed: set[str] = set()
    meta_changed: set[str] = set()
    previous: dict[str, Attribute] = {}
    actions: dict[str, str] = {}
    operators = False
    for name in targets:
        request = write.attributes[name]
        operators = operators or _operator(request.get("value")) is not None
        if name in old:
            merged, value_changed, metadata_changed = _merged(old[name], request, write)
            previous[name] = old[name]
            actions[name] = "update"
            if value_changed or metadata_changed:
                (changed if value_changed else meta_changed).add(name)
                attributes[name] = merged
                dates[name] = (current.dates(name)[0], stamp)
        elif (made := _appended(request)) is not None:
            changed.add(name)
            actions[name] = "append"
            attributes[name] = made
            dates[name] = (stamp, stamp)
    _check_expiry(attributes, targets)
    modified = bool(changed or meta_changed)
    document = _stored(current, attributes, dates, stamp) if modified else current
    alteration = Alteration.CHANGE if modified else Alteration.UPDATE
    change = Change(
        alteration,
        frozenset(changed),
        frozenset(meta_changed),
        frozenset(write.attributes),
        write.correlator,
    )
    return Applied(current, document, change, previous, actions, partial, modified, operators)


def _initials(write: Write) -> Attributes:
    """The attributes of a created or replaced entity."""
    made = {name: _initial(request) for name, request in write.attributes.items()}
    attributes = {name: a for name, a in made.items() if a is not None}
    _check_expiry(attributes, attributes)
    return attributes


def _stored(
    current: Document, attributes: Attributes, dates: dict[str, tuple[float, float]], stamp: float
) -> Document:
    """``current`` with new attributes, modified at ``stamp``."""
    return replace(
        current,
        attributes=attributes,
        attribute_dates=dates,
        date_modified=stamp,
        date_expires=_expiry(attributes),
    )


def _targets(old: Attributes, write: Write) -> tuple[list[str], SilboError | None]:
    """The attributes the write applies to, and the error for those it cannot."""
    present = [a for a in write.attributes if a in old]
    absent = [a for a in write.attributes if a not in old]
    mode = write.mode
    if mode is Mode.APPEND_STRICT and present:
        if not absent:
            raise Unprocessable(f"Attributes already exist: {present}")
        return absent, PartialUpdate(f"Some of the attributes already exist: {present}")
    if mode in (Mode.UPDATE, Mode.REPLACE_ATTRIBUTE) and absent:
        if mode is Mode.REPLACE_ATTRIBUTE:
            raise NotFound(_NO_ATTRIBUTE)
        if not present:
            raise Unprocessable(f"The attributes in the request do not exist: {absent}")
        return present, PartialUpdate(f"Some of the attributes do not exist: {absent}")
    return list(write.attributes), None


# -- one attribute ----------------------------------------------------------------------------


def _merged(old: Attribute, request: Attribute, write: Write) -> tuple[Attribute, bool, bool]:
    """An existing attribute updated (Orion's mergeAttrInfo): it, whether its value (or type)
    changed, whether its metadata changed."""
    value: Any = request.get("value")
    type_ = request.get("type") or old["type"]
    op = _operator(value)
    if op is not None:  # Orion compares the operator object with the value: a change
        value = _operated(op, value, old["value"], type_)
    value_changed = (
        op is not None
        or write.forced_update
        or type_ != old["type"]
        or not _same(old["value"], value)
    )
    asked = request.get("metadata") or {}
    if write.override_metadata and not write.value_only:
        metadata = dict(asked)
    else:
        metadata = {**old["metadata"], **asked}
    merged = {"type": type_, "value": value, "metadata": metadata}
    return merged, value_changed, not _same(old["metadata"], metadata)


def _appended(request: Attribute) -> Attribute | None:
    """A new attribute of an existing entity (operators as MongoDB on a missing field)."""
    value: Any = request.get("value")
    type_ = request.get("type") or default_type(value)
    op = _operator(value)
    if op is not None:
        value = _operated(op, value, _MISSING, type_)
        if value is _DROP:
            return None
    return {"type": type_, "value": value, "metadata": dict(request.get("metadata") or {})}


def _initial(request: Attribute) -> Attribute | None:
    """An attribute of a created or replaced entity (operators from Orion's references)."""
    value: Any = request.get("value")
    type_ = request.get("type") or default_type(value)
    op = _operator(value)
    if op is not None:
        value = _started(op, value[op], type_)
        if value is _DROP:
            return None
    return {"type": type_, "value": value, "metadata": dict(request.get("metadata") or {})}


def _check_expiry(attributes: Attributes, written: Iterable[str]) -> None:
    """Refuse a written ``dateExpires`` that is not a DateTime (Orion: 400, nothing applied)."""
    attribute = attributes.get("dateExpires")
    if attribute is None or "dateExpires" not in written:
        return
    value = attribute["value"]
    if attribute["type"] not in DATE_TYPES or (
        value is not None and (not isinstance(value, str) or parse_iso8601(value) is None)
    ):
        raise InvalidUpdate("dateExpires must be a DateTime: it is the entity's expiration date")


def _expiry(attributes: Attributes) -> float | None:
    attribute = attributes.get("dateExpires")
    if attribute is None or attribute["type"] not in DATE_TYPES:
        return None
    value = attribute["value"]
    return parse_iso8601(value) if isinstance(value, str) else None


# -- update operators -------------------------------------------------------------------------


def _operator(value: Any) -> str | None:
    """The update operator a value holds (its first key, as Orion reads it), if any."""
    if type(value) is dict and value:
        first = next(iter(value))
        if first in _OPERATORS:
            return str(first)
    return None


def _started(op: str, operand: Any, type_: str) -> Any:
    """An operator's result in a create or replace (Orion's calculateOperator)."""
    if op in ("$unset", "$pull", "$pullAll"):
        return _DROP
    if op == "$set":
        return dict(operand) if type(operand) is dict else operand
    if op in ("$push", "$addToSet"):
        return _MONGO[op](operand, _MISSING, type_)  # from [] as MongoDB does
    if op == "$mul":
        return 0
    if op == "$inc":
        return operand if _is_number(operand) else 0
    epoch = parse_iso8601(operand) if isinstance(operand, str) else None
    if type_ in DATE_TYPES and epoch is not None:
        chosen = min(0.0, epoch) if op == "$min" else max(0.0, epoch)
        return operand if chosen == epoch else _EPOCH
    number = operand if _is_number(operand) else 0
    return min(0, number) if op == "$min" else max(0, number)


def _operated(op: str, value: dict[str, Any], old: Any, type_: str) -> Any:
    """An operator applied by MongoDB to the stored value (``_MISSING``: none)."""
    if op in ("$set", "$unset"):
        return _set_unset(value, old)
    return _MONGO[op](value[op], old, type_)


def _inc(operand: Any, old: Any, type_: str) -> Any:
    if not _is_number(operand):
        raise OperatorError(f"Cannot increment with non-numeric argument: {operand!r}")
    if old is _MISSING:
        return operand
    if not _is_number(old):
        raise OperatorError(f"Cannot apply $inc to a value of non-numeric type {_kind(old)}")
    return _finite(old + operand)


def _mul(operand: Any, old: Any, type_: str) -> Any:
    if not _is_number(operand):
        raise OperatorError(f"Cannot multiply with non-numeric argument: {operand!r}")
    if old is _MISSING:
        return 0.0 if isinstance(operand, float) else 0
    if not _is_number(old):
        raise OperatorError(f"Cannot apply $mul to a value of non-numeric type {_kind(old)}")
    return _finite(old * operand)


def _min(operand: Any, old: Any, type_: str) -> Any:
    return operand if old is _MISSING or _compare(operand, old, type_) < 0 else old


def _max(operand: Any, old: Any, type_: str) -> Any:
    return operand if old is _MISSING or _compare(operand, old, type_) > 0 else old


def _push(operand: Any, old: Any, type_: str) -> Any:
    items = _each(operand, ("$position", "$slice"))
    base = _array(old, "$push")
    modifiers = operand if type(operand) is dict and "$each" in operand else {}
    position, size = modifiers.get("$position"), modifiers.get("$slice")
    if (position is not None and type(position) is not int) or (
        size is not None and type(size) is not int
    ):
        raise OperatorError("$position and $slice must be integers")
    at = len(base) if position is None else position if position >= 0 else len(base) + position
    result = [*base[: max(0, at)], *items, *base[max(0, at) :]]
    if size is not None:
        result = result[:size] if size >= 0 else result[size:]
    return result


def _add_to_set(operand: Any, old: Any, type_: str) -> Any:
    result = _array(old, "$addToSet")
    for item in _each(operand):
        if not any(_same(item, present) for present in result):
            result.append(item)
    return result


def _pull(operand: Any, old: Any, type_: str) -> Any:
    if old is _MISSING:
        return _DROP
    return [item for item in _array(old, "$pull") if not _same(item, operand)]


def _pull_all(operand: Any, old: Any, type_: str) -> Any:
    if type(operand) is not list:
        raise OperatorError(f"$pullAll requires an array argument, not {_kind(operand)}")
    if old is _MISSING:
        return _DROP
    return [item for item in _array(old, "$pullAll") if not any(_same(item, x) for x in operand)]


_MONGO: dict[str, Callable[[Any, Any, str], Any]] = {
    "$inc": _inc,
    "$mul": _mul,
    "$min": _min,
    "$max": _max,
    "$push": _push,
    "$addToSet": _add_to_set,
    "$pull": _pull,
    "$pullAll": _pull_all,
}


def _set_unset(value: dict[str, Any], old: Any) -> Any:
    """``$set`` and ``$unset`` (alone or together) on the stored value."""
    result = old
    if "$set" in value:
        keys = value["$set"]
        if type(keys) is not dict:
            result = keys  # a plain update (api: "the same effect than a regular update")
        elif old is _MISSING:
            result = dict(keys)
        elif type(old) is dict:
            result = {**old, **keys}
        else:
            raise OperatorError(f"Cannot create a field in a value of type {_kind(old)}")
        unset = value.get("$unset")
        if type(keys) is dict and type(unset) is dict and keys.keys() & unset.keys():
            raise OperatorError("Updating a key with $set and $unset at once is a conflict")
    unset = value.get("$unset")
    if type(unset) is dict and type(result) is dict:
        result = {k: v for k, v in result.items() if k not in unset}
    return _DROP if result is _MISSING else result


def _each(operand: Any, modifiers: tuple[str, ...] = ()) -> list[Any]:
    """The items an ``$push`` / ``$addToSet`` operand adds (``{"$each": [...]}`` or one)."""
    if type(operand) is not dict or "$each" not in operand:
        return [operand]
    items = operand["$each"]
    if type(items) is not list:
        raise OperatorError(f"The argument to $each must be an array, not {_kind(items)}")
    unknown = set(operand) - {"$each", *modifiers}
    if unknown:
        raise OperatorError(f"Unsupported modifier {sorted(unknown)[0]} after $each")
    return list(items)


def _array(old: Any, op: str) -> list[Any]:
    if old is _MISSING:
        return []
    if type(old) is not list:
        raise OperatorError(f"Cannot apply {op} to a value of non-array type {_kind(old)}")
    return list(old)


def _finite(number: Any) -> Any:
    if (isinstance(number, float) and not math.isfinite(number)) or abs(number) > _LARGEST:
        raise OperatorError("The result of the operator is not a finite number")
    return number


# -- JSON values as MongoDB compares them -----------------------------------------------------


def _is_number(value: Any) -> bool:
    return type(value) is int or type(value) is float


def _kind(value: Any) -> str:
    names = {bool: "bool", int: "number", float: "number", str: "string", list: "array"}
    return "null" if value is None else names.get(type(value), "object")


def _same(a: Any, b: Any) -> bool:
    """JSON equality as Orion compares values: numbers as doubles, booleans apart."""
    if _is_number(a) and _is_number(b):
        return bool(a == b)
    if type(a) is not type(b):
        return False
    if type(a) is list:
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if type(a) is dict:
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


def _rank(value: Any) -> int:
    """BSON's comparison order of types: null, numbers, strings, objects, arrays, booleans."""
    if value is None:
        return 1
    if _is_number(value):
        return 2
    return {str: 3, dict: 4, list: 5, bool: 8}[type(value)]


def _compare(a: Any, b: Any, type_: str) -> int:
    """-1, 0, 1 as MongoDB orders two values (DateTime attributes as dates)."""
    if type_ in DATE_TYPES and isinstance(a, str) and isinstance(b, str):
        da, db = parse_iso8601(a), parse_iso8601(b)
        if da is not None and db is not None:
            return _order(da, db)
    ra, rb = _rank(a), _rank(b)
    if ra != rb or ra == 1:
        return _order(ra, rb)
    if ra in (2, 8):
        return _order(a, b)
    if ra == 3:
        return _order(a.encode(), b.encode())
    # objects and arrays: element by element (type, then name, then value), shorter first
    pairs_a = list(a.items()) if ra == 4 else [(str(i), x) for i, x in enumerate(a)]
    pairs_b = list(b.items()) if ra == 4 else [(str(i), x) for i, x in enumerate(b)]
    for (ka, va), (kb, vb) in zip(pairs_a, pairs_b, strict=False):
        order = (
            _order(_rank(va), _rank(vb)) or _order(ka.encode(), kb.encode()) or _compare(va, vb, "")
        )
        if order:
            return order
    return _order(len(pairs_a), len(pairs_b))


def _order(x: Any, y: Any) -> int:
    return int(x > y) - int(x < y)


def _doubled(value: Any) -> Any:
    """``value`` with integers past 64 bits as doubles (what msgpack cannot hold)."""
    if type(value) is int and not -(2**63) <= value < 2**64:
        return float(value)
    if type(value) is list:
        return [_doubled(v) for v in value]
    if type(value) is dict:
        return {k: _doubled(v) for k, v in value.items()}
    return value
