"""httpCustom and mqttCustom templates: Orion's ``${...}`` macros, and the ``payload`` /
``json`` / ``ngsi`` bodies of custom notifications (ngsi-v2.md section 3), without JEXL.

A macro names a value of the notified entity: ``${id}``, ``${type}``, ``${service}`` (the
tenant, empty for the default one), ``${servicePath}``, ``${authToken}`` (the
``X-Auth-Token`` of the update that caused the notification; empty without one), or an
attribute, whose value it is (these five names win over attributes of the same name, as in
Orion). Where a macro goes:

- in text (the URL, header and ``qs`` values, ``payload``, and strings of ``json`` / ``ngsi``
  that hold more than the macro): a string value as it is, any other value as JSON (``21.5``,
  ``true``, ``null``, ``{"a":1}``); an attribute the entity does not have: the empty string;
- as a whole string of ``json`` or of an ``ngsi`` attribute value (``"${temperature}"`` and
  nothing else): the value itself, typed (a number stays a number); an attribute the entity
  does not have: null.

Orion 3.x evaluates what is inside ``${...}`` as a JEXL expression when it is built with
JEXL (``${a|uppercase}``, ``${a*2}``, ``${a.b}`` as a path...). Silbo takes plain names only:
a macro whose content is not a plain name (letters, digits and ``_ - . : @``) is refused
when the subscription is created (400, saying that JEXL is not supported), never sent
literally. A ``${`` without its ``}`` is plain text, as in Orion.

Templates are compiled once (:func:`compile_text`, :func:`compile_json`,
:func:`compile_ngsi`): by the front to validate a subscription, and by the delivery worker
once per version of a subscription; filling one (:func:`fill_text`, :func:`fill_json`,
:func:`fill_ngsi`) only walks what was compiled.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from broker.errors import InvalidSubscription
from broker.model.attribute import default_type

__all__ = [
    "BUILTINS",
    "Context",
    "Json",
    "Macro",
    "NgsiPatch",
    "Text",
    "compile_json",
    "compile_ngsi",
    "compile_text",
    "fill_json",
    "fill_ngsi",
    "fill_text",
    "has_macro",
]

BUILTINS = frozenset({"id", "type", "service", "servicePath", "authToken"})
MAX_TEMPLATE_DEPTH = 32  # levels of nesting of a json or ngsi template (as an attribute value)
_MACRO = re.compile(r"\$\{([^}]*)\}")
_PLAIN = re.compile(r"[A-Za-z0-9_.:@-]{1,256}")
_NGSI_ATTRIBUTE = frozenset({"type", "value", "metadata"})


@dataclass(frozen=True, slots=True)
class Macro:
    """One ``${name}``."""

    name: str


Text = tuple[str | Macro, ...]  # a compiled text: literal pieces and macros, in order


class Context(NamedTuple):
    """What macros are filled from: the notified entity and its update."""

    id: str
    type: str
    service: str
    service_path: str
    auth_token: str
    attributes: Mapping[str, Mapping[str, Any]]  # name -> {"type", "value", "metadata"}


@dataclass(frozen=True, slots=True)
class Json:
    """A compiled ``json`` template: the value with every string that holds a macro
    compiled (a whole-string macro as a :class:`Macro`, others as :data:`Text`)."""

    value: Any


@dataclass(frozen=True, slots=True)
class NgsiPatch:
    """A compiled ``ngsi`` template: the entity id and type it sets (None: kept) and the
    attributes it adds or replaces (``{"type": Text | None, "value": compiled}``)."""

    id: Text | None
    type: Text | None
    attributes: tuple[tuple[str, Text | None, Any], ...]  # name, type, value


def has_macro(text: str) -> bool:
    """Tell whether ``text`` holds a ``${...}``."""
    return "${" in text and _MACRO.search(text) is not None


def compile_text(text: str, what: str) -> Text:
    """``text`` as literal pieces and macros (InvalidSubscription for a macro that is not a
    plain name: see the module doc)."""
    pieces: list[str | Macro] = []
    at = 0
    for found in _MACRO.finditer(text):
        if found.start() > at:
            pieces.append(text[at : found.start()])
        pieces.append(Macro(_macro_name(found.group(1), what)))
        at = found.end()
    if at < len(text):
        pieces.append(text[at:])
    return tuple(pieces)


def _macro_name(content: str, what: str) -> str:
    if _PLAIN.fullmatch(content):
        return content
    if "|" in content:
        raise InvalidSubscription(
            f"{what}: ${{{content}}} applies a JEXL transformation; JEXL is not supported by "
            "Silbo: a macro names an attribute, id, type, service, servicePath or authToken"
        )
    raise InvalidSubscription(
        f"{what}: ${{{content}}} is not a plain name (a JEXL expression?); JEXL is not "
        "supported by Silbo: a macro names an attribute, id, type, service, servicePath or "
        "authToken"
    )


def _value(name: str, context: Context) -> tuple[bool, Any]:
    """(whether it is known, the value) of a macro's name."""
    if name in BUILTINS:
        if name == "id":
            return True, context.id
        if name == "type":
            return True, context.type
        if name == "service":
            return True, context.service
        if name == "servicePath":
            return True, context.service_path
        return True, context.auth_token
    attribute = context.attributes.get(name)
    if attribute is None:
        return False, None
    return True, attribute.get("value")


def _as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def fill_text(text: Text, context: Context) -> str:
    """The text with its macros filled (see the module doc)."""
    out = []
    for piece in text:
        if isinstance(piece, str):
            out.append(piece)
        else:
            known, value = _value(piece.name, context)
            if known:
                out.append(_as_text(value))
    return "".join(out)


def _compile_value(value: Any, what: str, depth: int) -> Any:
    """A JSON value with its strings compiled: a string that is one macro and nothing else
    becomes the Macro, one holding macros a Text (a tuple), one without stays a str."""
    if depth > MAX_TEMPLATE_DEPTH:
        raise InvalidSubscription(f"{what} is nested deeper than {MAX_TEMPLATE_DEPTH} levels")
    if isinstance(value, str):
        if not has_macro(value):
            return value
        text = compile_text(value, what)
        if len(text) == 1 and isinstance(text[0], Macro):
            return text[0]
        return text
    if isinstance(value, list):
        return [_compile_value(v, what, depth + 1) for v in value]
    if isinstance(value, dict):
        return {k: _compile_value(v, what, depth + 1) for k, v in value.items()}
    return value


def _fill_value(value: Any, context: Context) -> Any:
    if isinstance(value, str):
        return value
    if isinstance(value, Macro):
        return _value(value.name, context)[1]
    if isinstance(value, tuple):
        return fill_text(value, context)
    if isinstance(value, list):
        return [_fill_value(v, context) for v in value]
    if isinstance(value, dict):
        return {k: _fill_value(v, context) for k, v in value.items()}
    return value


def compile_json(value: Any, what: str) -> Json:
    """A ``json`` template: an object or an array (InvalidSubscription otherwise)."""
    if not isinstance(value, dict | list):
        raise InvalidSubscription(f"{what} must be a JSON object or array")
    return Json(_compile_value(value, what, 1))


def fill_json(template: Json, context: Context) -> Any:
    """The ``json`` body: the template with its macros filled (see the module doc)."""
    return _fill_value(template.value, context)


def compile_ngsi(fragment: Any, what: str) -> NgsiPatch:
    """An ``ngsi`` template: an entity fragment (``id``, ``type``, attributes as in a
    normalized entity: ``{"type", "value"}``; no metadata), InvalidSubscription otherwise."""
    if not isinstance(fragment, dict):
        raise InvalidSubscription(f"{what} must be a JSON object (an entity fragment)")
    entity_id = entity_type = None
    attributes = []
    for name, body in fragment.items():
        if name in ("id", "type"):
            if not isinstance(body, str) or not body:
                raise InvalidSubscription(f"{what}.{name} must be a non-empty string")
            if name == "id":
                entity_id = compile_text(body, f"{what}.id")
            else:
                entity_type = compile_text(body, f"{what}.type")
            continue
        if not _PLAIN.fullmatch(name):
            raise InvalidSubscription(f"{what}: {name!r} is not an attribute name")
        if not isinstance(body, dict):
            raise InvalidSubscription(
                f'{what}.{name} must be an attribute object ({{"type", "value"}})'
            )
        unknown = set(body) - _NGSI_ATTRIBUTE
        if unknown:
            raise InvalidSubscription(f"{what}.{name}: unrecognized field {sorted(unknown)[0]!r}")
        if body.get("metadata"):
            raise InvalidSubscription(
                f"{what}.{name}: metadata is not allowed in the attributes of an ngsi template"
            )
        kind = body.get("type")
        if kind is not None and (not isinstance(kind, str) or not kind):
            raise InvalidSubscription(f"{what}.{name}.type must be a non-empty string")
        attributes.append(
            (
                name,
                None if kind is None else compile_text(kind, f"{what}.{name}.type"),
                _compile_value(body.get("value"), f"{what}.{name}.value", 1),
            )
        )
    return NgsiPatch(entity_id, entity_type, tuple(attributes))


def fill_ngsi(
    patch: NgsiPatch, context: Context
) -> tuple[str | None, str | None, dict[str, dict[str, Any]]]:
    """The entity id and type an ``ngsi`` template sets (None: kept) and the attributes it
    adds or replaces, normalized (a missing type inferred from the filled value, as an
    update's is)."""
    entity_id = None if patch.id is None else fill_text(patch.id, context)
    entity_type = None if patch.type is None else fill_text(patch.type, context)
    attributes = {}
    for name, kind, template in patch.attributes:
        value = _fill_value(template, context)
        attributes[name] = {
            "type": default_type(value) if kind is None else fill_text(kind, context),
            "value": value,
            "metadata": {},
        }
    return entity_id, entity_type, attributes
