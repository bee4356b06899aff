"""Updates as JSON lines: one NGSI v2 entity in normalized form per line, plus the optional
``tenant`` and ``servicePath`` beside ``id``, ``type`` and the attributes.

This is the form Spark reads (``silbo replay --updates``, and the batches a matcher hands to
Spark). :func:`update_from_json` is the reference reading of one line, with a clear error
naming the field; :func:`update_to_json` writes an update so that reading it back gives it
again.

``strict`` reading applies the NGSI v2 rules of the HTTP front (no ``< > " ' = ; ( )`` in
text unless typed ``TextUnrestricted``, attributes as objects of ``type`` / ``value`` /
``metadata`` only); the lax reading accepts every update the broker's gRPC API accepts.

``timed`` reading (``silbo replay --updates``) takes one more field beside ``id``: ``time``,
when the update was made, epoch seconds or an ISO 8601 date (:func:`time_of`); an attribute
named ``time`` cannot be given then. Otherwise ``time`` is an attribute like any other.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from broker.errors import InvalidInput
from broker.model.attribute import Attribute, Metadata, default_type, parse_iso8601
from broker.model.identifiers import DEFAULT_SERVICE_PATH
from broker.model.update import DEFAULT_ENTITY_TYPE, ContextUpdate
from broker.ngsi.entity import parse_attribute

__all__ = [
    "ENTITY_FIELDS",
    "TIMED_FIELDS",
    "TIME_FIELD",
    "InputError",
    "line_error",
    "time_of",
    "update_from_json",
    "update_to_json",
    "write_updates",
]

ENTITY_FIELDS = frozenset({"id", "type", "tenant", "servicePath"})
TIME_FIELD = "time"
TIMED_FIELDS = ENTITY_FIELDS | {TIME_FIELD}


class InputError(InvalidInput):
    """A line (or row) of an input file is not a valid update or subscription."""

    def __init__(self, source: str, line: int, field: str, reason: str) -> None:
        where = f"{source}: line {line}" if line else source
        super().__init__(f"{where}: {field}: {reason}" if field else f"{where}: {reason}")
        self.source = source
        self.line = line
        self.field = field
        self.reason = reason


def update_to_json(update: ContextUpdate) -> dict[str, Any]:
    """The update as one JSON object (normalized attributes, with tenant and service path)."""
    body: dict[str, Any] = {
        "id": update.entity_id,
        "type": update.entity_type,
        "tenant": update.tenant,
        "servicePath": update.service_path,
    }
    for name, attribute in update.attributes.items():
        item: dict[str, Any] = {"type": attribute.type, "value": attribute.value}
        if attribute.metadata:
            item["metadata"] = {
                key: {"type": m.type, "value": m.value} for key, m in attribute.metadata.items()
            }
        body[name] = item
    return body


def write_updates(updates: Iterable[ContextUpdate], path: Path) -> int:
    """Write updates as JSON lines; the number written."""
    count = 0
    with path.open("w", encoding="utf-8") as out:
        for update in updates:
            out.write(json.dumps(update_to_json(update), ensure_ascii=False, allow_nan=False))
            out.write("\n")
            count += 1
    return count


def line_error(
    text: str,
    *,
    strict: bool = True,
    source: str = "<input>",
    line: int = 0,
    timed: bool = False,
) -> InputError | None:
    """Why one JSON line is not a valid update (its InputError), None if it is one."""
    try:
        body = json.loads(text)
    except ValueError as exc:
        return InputError(source, line, "", f"not JSON: {exc}")
    try:
        update_from_json(body, strict=strict, source=source, line=line, timed=timed)
    except InputError as exc:
        return exc
    return None


def _field(body: Mapping[str, Any], name: str, default: Any) -> Any:
    return body.get(name, default)


def time_of(body: Mapping[str, Any], source: str = "<input>", line: int = 0) -> float | None:
    """The ``time`` field of a timed update in epoch seconds (None without one): a number
    of seconds or an ISO 8601 date; InputError otherwise."""
    value = body.get(TIME_FIELD)
    if value is None:
        return None
    if isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
        if seconds - seconds == 0:
            return seconds
    elif isinstance(value, str):
        parsed = parse_iso8601(value)
        if parsed is not None:
            return parsed
    reason = f"{value!r} is neither epoch seconds nor an ISO 8601 date"
    raise InputError(source, line, TIME_FIELD, reason)


def update_from_json(
    body: Any,
    *,
    strict: bool = True,
    source: str = "<input>",
    line: int = 0,
    timed: bool = False,
) -> ContextUpdate:
    """The update one JSON object describes; InputError naming the field if it is invalid
    (``timed``: ``time`` is the update's time, checked, not an attribute)."""
    if not isinstance(body, dict):
        raise InputError(source, line, "", "an update must be a JSON object")
    if "id" not in body:
        raise InputError(source, line, "id", "entity id is missing")
    if timed:
        time_of(body, source, line)
    fields = TIMED_FIELDS if timed else ENTITY_FIELDS
    attributes: dict[str, Attribute] = {}
    for name, item in body.items():
        if name in fields:
            continue
        try:
            attributes[name] = _attribute(name, item, strict)
        except InvalidInput as exc:
            raise InputError(source, line, name, str(exc)) from None
    try:
        entity_type = _field(body, "type", DEFAULT_ENTITY_TYPE)
        return ContextUpdate(
            body["id"],
            attributes,
            entity_type=entity_type,
            tenant=_field(body, "tenant", ""),
            service_path=_field(body, "servicePath", DEFAULT_SERVICE_PATH),
        )
    except InvalidInput as exc:
        text = str(exc)
        field = next(
            (
                name
                for name, word in (
                    ("servicePath", "service path"),
                    ("tenant", "tenant"),
                    ("type", "entity type"),
                    ("id", "entity id"),
                )
                if word in text
            ),
            "",
        )
        raise InputError(source, line, field, text) from None


def _attribute(name: str, item: Any, strict: bool) -> Attribute:
    if strict:
        parsed = parse_attribute(name, item, key_values=False)
    else:
        if not isinstance(item, dict):
            raise InputError("", 0, name, "an attribute must be a JSON object")
        value = item.get("value")
        metadata = item.get("metadata") or {}
        if not isinstance(metadata, dict) or not all(
            isinstance(m, dict) for m in metadata.values()
        ):
            raise InputError("", 0, name, "metadata must be an object of objects")
        parsed = {"type": item.get("type") or default_type(value), "value": value}
        parsed["metadata"] = {
            key: {"type": m.get("type") or default_type(m.get("value")), "value": m.get("value")}
            for key, m in metadata.items()
        }
    metadata = {key: Metadata(m["type"], m["value"]) for key, m in parsed["metadata"].items()}
    return Attribute(parsed["type"], parsed["value"], metadata)
