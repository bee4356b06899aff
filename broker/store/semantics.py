"""Orion's write semantics on one stored entity: what a write leaves and what it changed.

Pure functions, no I/O: the context store process reads the stored :class:`Document`, calls
:func:`apply` with the :class:`Write` a front sent and the time, persists what comes back and
routes its :class:`~broker.model.change.Change`. Sources: Orion's ``doc/manuals/orion-api.md``
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
whose first key is ``$inc $mul $min $max $push $addToSet $pull $pullAll $set $unset`` is
computed by :mod:`broker.store.operators` (MongoDB's semantics; what MongoDB refuses is an
:class:`OperatorError` and nothing of the write applies). An operator always counts as a value
change (code compares the operator object with the stored value). A missing type is inferred
from the request value as usual, so ``{"$inc": 1}`` without a type becomes
``StructuredValue`` (code: ``parseContextAttribute`` infers before the operator runs).

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

Where Orion's documentation and code disagree, or this could not be confirmed (for operators,
see :mod:`broker.store.operators`):

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
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import msgpack

from broker.errors import (
    AlreadyExists,
    InvalidUpdate,
    NotFound,
    PartialUpdate,
    SerializationError,
    SilboError,
    Unprocessable,
)
from broker.model.attribute import DATE_TYPES, default_type, parse_iso8601
from broker.model.change import Alteration, Change
from broker.store.operators import (
    DROP,
    MISSING,
    OperatorError,
    operated,
    operator_of,
    same,
    started,
)

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
    "expiry_of",
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


class Mode(enum.Enum):
    """What a write does (Orion's routes and batch action types; the HTTP front's too)."""

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
        expiry_of(attributes),
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
        operators = operators or operator_of(request.get("value")) is not None
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
        date_expires=expiry_of(attributes),
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
    op = operator_of(value)
    if op is not None:  # Orion compares the operator object with the value: a change
        value = operated(op, value, old["value"], type_)
    value_changed = (
        op is not None
        or write.forced_update
        or type_ != old["type"]
        or not same(old["value"], value)
    )
    asked = request.get("metadata") or {}
    if write.override_metadata and not write.value_only:
        metadata = dict(asked)
    else:
        metadata = {**old["metadata"], **asked}
    merged = {"type": type_, "value": value, "metadata": metadata}
    return merged, value_changed, not same(old["metadata"], metadata)


def _appended(request: Attribute) -> Attribute | None:
    """A new attribute of an existing entity (operators as MongoDB on a missing field)."""
    value: Any = request.get("value")
    type_ = request.get("type") or default_type(value)
    op = operator_of(value)
    if op is not None:
        value = operated(op, value, MISSING, type_)
        if value is DROP:
            return None
    return {"type": type_, "value": value, "metadata": dict(request.get("metadata") or {})}


def _initial(request: Attribute) -> Attribute | None:
    """An attribute of a created or replaced entity (operators from Orion's references)."""
    value: Any = request.get("value")
    type_ = request.get("type") or default_type(value)
    op = operator_of(value)
    if op is not None:
        value = started(op, value[op], type_)
        if value is DROP:
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


def expiry_of(attributes: Attributes) -> float | None:
    """The entity's expiry (epoch s) its ``dateExpires`` attribute gives (None: none)."""
    attribute = attributes.get("dateExpires")
    if attribute is None or attribute["type"] not in DATE_TYPES:
        return None
    value = attribute["value"]
    return parse_iso8601(value) if isinstance(value, str) else None


# -- storage ----------------------------------------------------------------------------------


def _doubled(value: Any) -> Any:
    """``value`` with integers past 64 bits as doubles (what msgpack cannot hold)."""
    if type(value) is int and not -(2**63) <= value < 2**64:
        return float(value)
    if type(value) is list:
        return [_doubled(v) for v in value]
    if type(value) is dict:
        return {k: _doubled(v) for k, v in value.items()}
    return value
