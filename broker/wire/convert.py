"""Conversions between wire messages (broker.wire.client_pb2) and model objects.

Two directions, two levels of trust:

- :func:`update_from_entity` and :func:`subscription_from_spec` read what a client sent:
  every field is validated by the model's constructors, and a problem raises an InvalidInput
  subclass naming the field.
- :func:`trusted_update` reads an entity that a connection point already validated (the
  bytes inside internal streams): it builds the model objects without validating again,
  which is what keeps a matcher's decoding cost to a few microseconds per update.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from broker.errors import InvalidInput, InvalidUpdate, InvalidValue
from broker.model.attribute import (
    DATE_TYPES,
    MAX_STRING_LENGTH,
    MAX_VALUE_DEPTH,
    Attribute,
    Metadata,
    check_value,
    default_type,
    parse_iso8601,
)
from broker.model.identifiers import (
    DEFAULT_SCOPE,
    DEFAULT_SERVICE_PATH,
    check_identifier,
    check_service_path,
    check_tenant,
)
from broker.model.subscription import EntitySelector, NotificationOptions, Subscription
from broker.model.update import DEFAULT_ENTITY_TYPE, RESERVED_ATTRIBUTE_NAMES, ContextUpdate
from broker.wire import client_pb2 as pb

__all__ = [
    "entity_from_update",
    "normalize_entity",
    "spec_from_subscription",
    "subscription_from_spec",
    "trusted_update",
    "trusted_update_from_obj",
    "update_from_entity",
    "value_from_wire",
    "value_to_wire",
]

_INT64 = (-(1 << 63), (1 << 63) - 1)
_EMPTY: Mapping[str, Metadata] = {}
_new = object.__new__
_set = object.__setattr__


def value_to_wire(value: Any, out: pb.Value) -> None:
    """Write a JSON value into a wire Value."""
    if value is None:
        out.null = True
    elif isinstance(value, bool):
        out.boolean = value
    elif isinstance(value, int) and _INT64[0] <= value <= _INT64[1]:
        out.integer = value
    elif isinstance(value, int | float):
        out.number = float(value)
    elif isinstance(value, str):
        out.text = value
    else:
        out.json = json.dumps(value, separators=(",", ":"), allow_nan=False)


def value_from_wire(value: pb.Value, what: str = "value") -> Any:
    """The JSON value a wire Value holds; InvalidValue for bad JSON text."""
    kind = value.WhichOneof("kind")
    if kind is None or kind == "null":
        return None
    if kind == "json":
        try:
            decoded = json.loads(value.json)
        except ValueError as exc:
            raise InvalidValue(f"{what} is not valid JSON: {exc}") from exc
        except RecursionError as exc:  # nested past what the decoder's stack allows
            raise InvalidValue(f"{what} is nested deeper than {MAX_VALUE_DEPTH} levels") from exc
        if not isinstance(decoded, list | dict):
            raise InvalidValue(f"{what}: the json kind holds objects and arrays only")
        return decoded
    if kind == "number" and not math.isfinite(value.number):
        raise InvalidValue(f"{what} is {value.number}, which JSON cannot carry")
    return getattr(value, kind)


def entity_from_update(update: ContextUpdate, out: pb.Entity | None = None) -> pb.Entity:
    """The wire Entity of a context update (publisher and sequence travel beside it)."""
    entity = pb.Entity() if out is None else out
    entity.id = update.entity_id
    entity.type = update.entity_type
    entity.tenant = update.tenant
    entity.service_path = update.service_path
    for name, attribute in update.attributes.items():
        wire = entity.attributes.add(name=name, type=attribute.type)
        value_to_wire(attribute.value, wire.value)
        for key, item in attribute.metadata.items():
            meta = wire.metadata.add(name=key, type=item.type)
            value_to_wire(item.value, meta.value)
    return entity


def update_from_entity(
    entity: pb.Entity, *, publisher: str = "", sequence: int = 0
) -> ContextUpdate:
    """The validated context update a client's Entity describes (InvalidInput otherwise)."""
    attributes: dict[str, Attribute] = {}
    for wire in entity.attributes:
        if wire.name in attributes:
            raise InvalidUpdate(f"attribute {wire.name!r} is given twice")
        what = f"attribute {wire.name!r}"
        value = value_from_wire(wire.value, what)
        metadata: dict[str, Metadata] = {}
        for meta in wire.metadata:
            if meta.name in metadata:
                raise InvalidUpdate(f"{what} has metadata {meta.name!r} twice")
            item = value_from_wire(meta.value, f"{what} metadata {meta.name!r}")
            metadata[meta.name] = Metadata(meta.type or default_type(item), item)
        attributes[wire.name] = Attribute(wire.type or default_type(value), value, metadata)
    return ContextUpdate(
        entity.id,
        attributes,
        entity_type=entity.type or DEFAULT_ENTITY_TYPE,
        tenant=entity.tenant,
        service_path=entity.service_path or DEFAULT_SERVICE_PATH,
        publisher=publisher,
        sequence=sequence,
    )


def trusted_update(entity: pb.Entity, publisher: str = "", sequence: int = 0) -> ContextUpdate:
    """The context update of an Entity that a connection point validated (no checks)."""
    attributes: dict[str, Attribute] = {}
    for wire in entity.attributes:
        type_ = wire.type
        value = _trusted_value(wire.value)
        attribute = _new(Attribute)
        _set(attribute, "type", type_)
        _set(attribute, "value", value)
        if wire.metadata:
            _set(attribute, "metadata", _trusted_metadata(wire))
        else:
            _set(attribute, "metadata", _EMPTY)
        if type_ in DATE_TYPES and isinstance(value, str):
            _set(attribute, "match_value", parse_iso8601(value))
        else:
            _set(attribute, "match_value", value)
        attributes[wire.name] = attribute
    update = _new(ContextUpdate)
    _set(update, "entity_id", entity.id)
    _set(update, "attributes", attributes)
    _set(update, "entity_type", entity.type)
    _set(update, "tenant", entity.tenant)
    _set(update, "service_path", entity.service_path)
    _set(update, "publisher", publisher)
    _set(update, "sequence", sequence)
    return update


def _trusted_value(value: pb.Value) -> Any:
    kind = value.WhichOneof("kind")
    if kind == "number":
        return value.number
    if kind == "text":
        return value.text
    if kind == "integer":
        return value.integer
    if kind == "boolean":
        return value.boolean
    if kind == "json":
        return json.loads(value.json)
    return None


def _trusted_metadata(wire: pb.Attribute) -> dict[str, Metadata]:
    return {meta.name: Metadata(meta.type, _trusted_value(meta.value)) for meta in wire.metadata}


def subscription_from_spec(spec: pb.SubscriptionSpec, *, id: str, subscriber: str) -> Subscription:
    """The validated subscription a client's SubscriptionSpec describes (InvalidInput otherwise)."""
    if spec.expires and not math.isfinite(spec.expires):
        raise InvalidInput(f"expires must be a finite epoch time, got {spec.expires}")
    selectors = tuple(
        EntitySelector(
            id=s.id or None,
            id_pattern=s.id_pattern or None,
            type=s.type or None,
            type_pattern=s.type_pattern or None,
        )
        for s in spec.entities
    )
    return Subscription(
        id=id,
        entities=selectors,
        tenant=spec.tenant,
        service_path=spec.service_path or DEFAULT_SCOPE,
        condition_attrs=tuple(spec.condition_attrs),
        q=spec.q,
        mq=spec.mq,
        notification=NotificationOptions(attrs=tuple(spec.attrs)),
        subscriber=subscriber,
        expires=spec.expires or None,
        description=spec.description,
    )


def spec_from_subscription(subscription: Subscription) -> pb.SubscriptionSpec:
    """The wire SubscriptionSpec of a subscription (its notification attrs included)."""
    spec = pb.SubscriptionSpec(
        id=subscription.id,
        tenant=subscription.tenant,
        service_path=subscription.service_path,
        condition_attrs=list(subscription.condition_attrs),
        q=subscription.q,
        mq=subscription.mq,
        description=subscription.description,
        expires=subscription.expires or 0.0,
        attrs=list(subscription.notification.attrs),
    )
    add_selectors(spec, subscription.entities)
    return spec


def add_selectors(spec: pb.SubscriptionSpec, selectors: Iterable[EntitySelector]) -> None:
    """Add the model's entity selectors to a SubscriptionSpec."""
    for s in selectors:
        spec.entities.add(
            id=s.id or "",
            id_pattern=s.id_pattern or "",
            type=s.type or "",
            type_pattern=s.type_pattern or "",
        )


# -- the connection point's check: validate a client's Entity, get the matchable form ------

_CACHE_LIMIT = 1 << 16
# Tenants and paths already found valid (they repeat a lot; check_identifier remembers the
# identifiers itself).
_tenants: dict[str, str] = {}
_paths: dict[str, str] = {}


def _remember(cache: dict[str, str], key: str, value: str) -> str:
    if len(cache) >= _CACHE_LIMIT:
        cache.clear()
    cache[key] = value
    return value


def normalize_entity(entity: pb.Entity) -> list[Any]:
    """Validate a client's Entity, fill in its defaults in place, and return it as an update
    array (the layout of broker.serialization.update_to_obj, publisher '' and sequence 0).

    Raises InvalidInput subclasses naming the field, as the model's constructors do; the
    checks are the model's, with texts already found valid remembered (they repeat a lot).
    This runs once per published update on the connection point, so it is written for speed.
    """
    if not entity.type:
        entity.type = DEFAULT_ENTITY_TYPE
    if not entity.service_path:
        entity.service_path = DEFAULT_SERVICE_PATH
    entity_id = check_identifier(entity.id, "entity id")
    entity_type = check_identifier(entity.type, "entity type")
    tenant = entity.tenant
    if tenant not in _tenants:
        _remember(_tenants, tenant, check_tenant(tenant))
    path = entity.service_path
    if path not in _paths:
        _remember(_paths, path, check_service_path(path))
    attributes: list[Any] = []
    seen: set[str] = set()
    for wire in entity.attributes:
        name = wire.name
        check_identifier(name, "attribute name")
        if name in seen:
            raise InvalidUpdate(f"attribute {name!r} is given twice")
        if name in RESERVED_ATTRIBUTE_NAMES:
            raise InvalidUpdate(f"attribute name {name!r} is reserved")
        seen.add(name)
        wire_value = wire.value
        kind = wire_value.WhichOneof("kind")
        if kind == "number":
            value: Any = wire_value.number
            if value - value != 0:  # inf or nan
                raise InvalidValue(f"attribute {name!r} is {value}, which JSON cannot carry")
        elif kind == "text":
            value = wire_value.text
            if len(value) > MAX_STRING_LENGTH:
                raise InvalidValue(f"attribute {name!r} is a string of {len(value)} characters")
        elif kind == "integer":
            value = wire_value.integer
        else:
            value = _checked_value(wire_value, f"attribute {name!r}")
        type_ = wire.type
        if not type_:
            type_ = wire.type = default_type(value)
        check_identifier(type_, "attribute type")
        if type_ in DATE_TYPES and value is not None:
            _check_date(value, f"attribute {name!r}", type_)
        attributes.append([name, type_, value, _metadata(wire, name) if wire.metadata else []])
    return [entity_id, entity_type, tenant, path, "", 0, attributes]


def _metadata(wire: pb.Attribute, name: str) -> list[Any]:
    metadata: list[Any] = []
    for meta in wire.metadata:
        what = f"attribute {name!r} metadata {meta.name!r}"
        key = check_identifier(meta.name, "metadata name")
        item = _checked_value(meta.value, what)
        if not meta.type:
            meta.type = default_type(item)
        meta_type = check_identifier(meta.type, "metadata type")
        if meta_type in DATE_TYPES and item is not None:
            _check_date(item, what, meta_type)
        metadata.append([key, meta_type, item])
    if len({m[0] for m in metadata}) != len(metadata):
        raise InvalidUpdate(f"attribute {name!r} names a metadata item twice")
    return metadata


def _checked_value(value: pb.Value, what: str) -> Any:
    decoded = value_from_wire(value, what)
    if isinstance(decoded, str):
        if len(decoded) > MAX_STRING_LENGTH:
            raise InvalidValue(f"{what} is a string of {len(decoded)} characters; too long")
    elif isinstance(decoded, list | dict):
        check_value(decoded, what)
    return decoded


def _check_date(value: Any, what: str, type_: str) -> None:
    if not isinstance(value, str) or parse_iso8601(value) is None:
        raise InvalidValue(f"{what} is typed {type_} but {value!r} is not an ISO 8601 date")


def _setter(cls: type, name: str) -> Callable[[Any, Any], None]:
    setter: Callable[[Any, Any], None] = cls.__dict__[name].__set__
    return setter


# Slot setters of the frozen model classes: building trusted objects through them skips
# validation and costs a third of object.__setattr__ (this runs for every update a matcher
# decodes).
_A_TYPE = _setter(Attribute, "type")
_A_VALUE = _setter(Attribute, "value")
_A_METADATA = _setter(Attribute, "metadata")
_A_MATCH = _setter(Attribute, "match_value")
_U_ID = _setter(ContextUpdate, "entity_id")
_U_ATTRIBUTES = _setter(ContextUpdate, "attributes")
_U_TYPE = _setter(ContextUpdate, "entity_type")
_U_TENANT = _setter(ContextUpdate, "tenant")
_U_PATH = _setter(ContextUpdate, "service_path")
_U_PUBLISHER = _setter(ContextUpdate, "publisher")
_U_SEQUENCE = _setter(ContextUpdate, "sequence")


def trusted_update_from_obj(obj: list[Any]) -> ContextUpdate:
    """The context update of an array that :func:`normalize_entity` made (no checks)."""
    entity_id, entity_type, tenant, path, publisher, sequence, wire_attributes = obj
    attributes: dict[str, Attribute] = {}
    for name, type_, value, metadata in wire_attributes:
        attribute = _new(Attribute)
        _A_TYPE(attribute, type_)
        _A_VALUE(attribute, value)
        _A_METADATA(attribute, {k: Metadata(t, v) for k, t, v in metadata} if metadata else _EMPTY)
        if type_ in DATE_TYPES and isinstance(value, str):
            _A_MATCH(attribute, parse_iso8601(value))
        else:
            _A_MATCH(attribute, value)
        attributes[name] = attribute
    update = _new(ContextUpdate)
    _U_ID(update, entity_id)
    _U_ATTRIBUTES(update, attributes)
    _U_TYPE(update, entity_type)
    _U_TENANT(update, tenant)
    _U_PATH(update, path)
    _U_PUBLISHER(update, publisher)
    _U_SEQUENCE(update, sequence)
    return update
