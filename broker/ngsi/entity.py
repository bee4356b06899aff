"""NGSI v2 entities as the HTTP front reads and writes them.

Reading: :func:`parse_attributes` and :func:`parse_entity` check a request body (normalized
or ``keyValues``) the way Orion does (ngsi-v2.md section 1): identifiers by the model's rules,
string values free of ``< > " ' = ; ( )`` unless typed ``TextUnrestricted``, a missing type
inferred, a missing value null, ``DateTime`` values ISO 8601. Every problem raises an
InvalidInput subclass (400 BadRequest).

Writing: :func:`render` gives an entity in a notification format (normalized, keyValues,
values, simplified*) with ``attrs`` / ``exceptAttrs`` applied; :func:`to_wire` gives the wire
Entity the connection point publishes.

An entity's attributes are held as ``{name: {"type", "value", "metadata"}}`` (insertion
order kept), the normalized JSON itself.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from broker.errors import InvalidUpdate, InvalidValue
from broker.model.attribute import (
    DATE_TYPES,
    MAX_STRING_LENGTH,
    check_value,
    default_type,
    parse_iso8601,
)
from broker.model.identifiers import check_identifier
from broker.model.subscription import AttrsFormat
from broker.model.update import DEFAULT_ENTITY_TYPE, RESERVED_ATTRIBUTE_NAMES
from broker.wire import client_pb2 as pb
from broker.wire.convert import value_from_wire, value_to_wire

__all__ = [
    "Attributes",
    "check_text",
    "from_wire",
    "parse_attribute",
    "parse_attributes",
    "parse_entity",
    "parse_text_value",
    "render",
    "to_wire",
]

Attributes = dict[str, dict[str, Any]]

_FORBIDDEN_IN_VALUES = frozenset("<>\"'=;()")
_UNRESTRICTED = "TextUnrestricted"
_ATTRIBUTE_KEYS = frozenset({"type", "value", "metadata"})
_METADATA_KEYS = frozenset({"type", "value"})
# An integer outside int64 is published as a float: none holds one past this.
_LARGEST = int(sys.float_info.max)


def check_text(value: Any, what: str) -> None:
    """Raise InvalidValue if a string anywhere in ``value`` holds a forbidden character."""
    if isinstance(value, str):
        if not _FORBIDDEN_IN_VALUES.isdisjoint(value):
            raise InvalidValue(f"Invalid characters in {what}")
    elif isinstance(value, list):
        for item in value:
            check_text(item, what)
    elif isinstance(value, dict):
        for key, item in value.items():
            check_text(key, what)
            check_text(item, what)


def _typed_value(type_: Any, value: Any, what: str) -> tuple[str, Any]:
    type_ = default_type(value) if type_ is None else check_identifier(type_, f"{what} type")
    kind = type(value)
    if kind is str:
        plain = len(value) <= MAX_STRING_LENGTH and (
            type_ == _UNRESTRICTED or _FORBIDDEN_IN_VALUES.isdisjoint(value)
        )
    elif kind is int and not -_LARGEST <= value <= _LARGEST:
        raise InvalidValue(f"{what} value is a number past {_LARGEST:.6g}")
    else:
        finite = kind is float and value - value == 0
        plain = value is None or kind is int or kind is bool or finite
    if not plain:  # the full checks, and their messages
        check_value(value, f"{what} value")
        if type_ != _UNRESTRICTED:
            check_text(value, f"{what} value")
    if (
        type_ in DATE_TYPES
        and value is not None
        and (not isinstance(value, str) or parse_iso8601(value) is None)
    ):
        raise InvalidValue(f"{what} is typed {type_} but {value!r} is not an ISO 8601 date")
    return type_, value


def parse_attribute(name: str, body: Any, *, key_values: bool) -> dict[str, Any]:
    """One attribute of a request body, normalized: ``{"type", "value", "metadata"}``."""
    check_identifier(name, "attribute name")
    if name in RESERVED_ATTRIBUTE_NAMES:
        raise InvalidUpdate(f"attribute name {name!r} is reserved")
    what = f"attribute {name!r}"
    if key_values:
        type_, value = _typed_value(None, body, what)
        return {"type": type_, "value": value, "metadata": {}}
    if not isinstance(body, dict):
        raise InvalidUpdate(f"{what} must be a JSON object, unless keyValues option is used")
    if not _ATTRIBUTE_KEYS.issuperset(body):
        unknown = set(body) - _ATTRIBUTE_KEYS
        raise InvalidUpdate(f"{what}: unrecognized property {sorted(unknown)[0]!r}")
    type_, value = _typed_value(body.get("type"), body.get("value"), what)
    metadata = body.get("metadata")
    return {
        "type": type_,
        "value": value,
        "metadata": {} if metadata is None else _parse_metadata(metadata, what),
    }


def _parse_metadata(body: Any, what: str) -> dict[str, Any]:
    if body is None:
        return {}
    if not isinstance(body, dict):
        raise InvalidUpdate(f"{what}: metadata must be a JSON object")
    metadata: dict[str, Any] = {}
    for key, item in body.items():
        check_identifier(key, "metadata name")
        where = f"{what} metadata {key!r}"
        if not isinstance(item, dict):
            raise InvalidUpdate(f"{where} must be a JSON object")
        unknown = set(item) - _METADATA_KEYS
        if unknown:
            raise InvalidUpdate(f"{where}: unrecognized property {sorted(unknown)[0]!r}")
        type_, value = _typed_value(item.get("type"), item.get("value"), where)
        metadata[key] = {"type": type_, "value": value}
    return metadata


def parse_attributes(body: Any, *, key_values: bool) -> Attributes:
    """The attributes of a request body (an object of attributes; ``id``/``type`` refused)."""
    if not isinstance(body, dict):
        raise InvalidUpdate("the payload must be a JSON object")
    return {name: parse_attribute(name, item, key_values=key_values) for name, item in body.items()}


def parse_entity(body: Any, *, key_values: bool) -> tuple[str, str, Attributes]:
    """``(id, type, attributes)`` of an entity body (``id`` required, ``type`` defaulted)."""
    if not isinstance(body, dict):
        raise InvalidUpdate("an entity must be a JSON object")
    if "id" not in body:
        raise InvalidUpdate("entity id is missing")
    entity_id = check_identifier(body["id"], "entity id")
    entity_type = check_identifier(body.get("type", DEFAULT_ENTITY_TYPE), "entity type")
    attributes = {
        name: parse_attribute(name, item, key_values=key_values)
        for name, item in body.items()
        if name != "id" and name != "type"
    }
    return entity_id, entity_type, attributes


def parse_text_value(text: str) -> Any:
    """An attribute value sent as ``text/plain``: a quoted string, true, false, null or a
    number (ngsi-v2.md section 2)."""
    text = text.strip()
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1]
    if text in ("true", "false"):
        return text == "true"
    if text == "null":
        return None
    try:
        number = float(text)
    except ValueError:
        number = math.nan
    if not math.isfinite(number):
        raise InvalidValue(
            f"{text[:100]!r} is not a quoted string, true, false, null or a finite number"
        )
    if not text.lstrip("-").isdigit():
        return number
    try:
        return int(text)
    except ValueError:  # past the 4300 digits int() reads (leading zeros count)
        raise InvalidValue(f"a number of {len(text)} digits is too long") from None


def _selected(
    attributes: Attributes, attrs: Sequence[str] | None, except_attrs: Sequence[str]
) -> Iterable[str]:
    if attrs is not None and "*" not in attrs:
        return [a for a in attrs if a in attributes]
    excluded = set(except_attrs)
    return [a for a in attributes if a not in excluded]


def render(
    entity_id: str,
    entity_type: str,
    attributes: Attributes,
    attrs_format: AttrsFormat,
    *,
    attrs: Sequence[str] | None = None,
    except_attrs: Sequence[str] = (),
) -> Any:
    """The entity in ``attrs_format`` with only the chosen attributes: those of ``attrs``
    in its order, or (None) every one not in ``except_attrs`` in the entity's order."""
    names = _selected(attributes, attrs, except_attrs)
    if attrs_format is AttrsFormat.VALUES:
        return [attributes[n]["value"] for n in names]
    if attrs_format is AttrsFormat.LEGACY:
        return _context_element(entity_id, entity_type, {n: attributes[n] for n in names})
    out: dict[str, Any] = {"id": entity_id, "type": entity_type}
    if attrs_format in (AttrsFormat.KEY_VALUES, AttrsFormat.SIMPLIFIED_KEY_VALUES):
        for name in names:
            out[name] = attributes[name]["value"]
    else:
        for name in names:
            out[name] = attributes[name]
    return out


def _context_element(entity_id: str, entity_type: str, attributes: Attributes) -> Any:
    """The entity as NGSIv1's ``contextElement`` (Orion's ``legacy`` notifications): its
    attributes as a list, each with ``metadatas`` when it has metadata."""
    listed = []
    for name, attribute in attributes.items():
        one = {"name": name, "type": attribute["type"], "value": attribute["value"]}
        metadata = attribute.get("metadata") or {}
        if metadata:
            one["metadatas"] = [
                {"name": key, "type": item["type"], "value": item["value"]}
                for key, item in metadata.items()
            ]
        listed.append(one)
    return {"type": entity_type, "isPattern": "false", "id": entity_id, "attributes": listed}


def to_wire(
    entity_id: str, entity_type: str, tenant: str, path: str, attributes: Mapping[str, Any]
) -> pb.Entity:
    """The wire Entity the connection point publishes (values already checked)."""
    entity = pb.Entity(id=entity_id, type=entity_type, tenant=tenant, service_path=path)
    for name, attribute in attributes.items():
        wire = entity.attributes.add(name=name, type=attribute["type"])
        value_to_wire(attribute["value"], wire.value)
        for key, item in attribute["metadata"].items():
            meta = wire.metadata.add(name=key, type=item["type"])
            value_to_wire(item["value"], meta.value)
    return entity


def from_wire(entity: pb.Entity) -> Attributes:
    """The attributes of a wire Entity (one that a connection point validated)."""
    attributes: Attributes = {}
    for wire in entity.attributes:
        value = wire.value
        kind = value.WhichOneof("kind")
        if kind == "number" or kind == "text" or kind == "integer" or kind == "boolean":
            plain = getattr(value, kind)  # checked when published; the common kinds first
        else:
            plain = value_from_wire(value)
        metadata = (
            {m.name: {"type": m.type, "value": value_from_wire(m.value)} for m in wire.metadata}
            if len(wire.metadata)
            else {}
        )
        attributes[wire.name] = {"type": wire.type, "value": plain, "metadata": metadata}
    return attributes
