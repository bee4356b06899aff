"""Attributes and metadata of an entity, and the value a filter compares against.

An attribute is ``(type, value, metadata)``. ``value`` is any JSON value (None, bool, int,
float, str, list, dict). A filter does not always compare the raw value: attributes (and
metadata) typed ``DateTime`` or ``ISO8601`` carry an ISO 8601 string that Orion stores as an
epoch number, so that ranges and comparisons work on them; :attr:`Attribute.match_value` is
that number (seconds since the epoch, as a float). For every other type it is the value itself.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.errors import InvalidValue
from broker.model.identifiers import check_identifier
from broker.query.dates import parse_iso8601

__all__ = [
    "DATE_TYPES",
    "MAX_STRING_LENGTH",
    "MAX_VALUE_DEPTH",
    "Attribute",
    "Metadata",
    "check_value",
    "default_type",
    "parse_iso8601",
]

DATE_TYPES = frozenset({"DateTime", "ISO8601"})
MAX_VALUE_DEPTH = 32
MAX_STRING_LENGTH = 1 << 20  # Orion caps a whole request at 1 MB


def default_type(value: Any) -> str:
    """The NGSI type Orion infers for a value given without one."""
    if isinstance(value, bool):
        return "Boolean"
    if isinstance(value, int | float):
        return "Number"
    if isinstance(value, str):
        return "Text"
    if value is None:
        return "None"
    return "StructuredValue"


def check_value(value: Any, what: str, depth: int = 0) -> None:
    """Raise InvalidValue unless ``value`` is JSON within the depth and length limits."""
    if depth > MAX_VALUE_DEPTH:
        raise InvalidValue(f"{what} is nested deeper than {MAX_VALUE_DEPTH} levels")
    if value is None or isinstance(value, bool | int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidValue(f"{what} is {value}, which JSON cannot carry")
        return
    if isinstance(value, str):
        if len(value) > MAX_STRING_LENGTH:
            raise InvalidValue(f"{what} is a string of {len(value)} characters; too long")
        return
    if isinstance(value, list | tuple):
        for item in value:
            check_value(item, what, depth + 1)
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidValue(f"{what} has a non-string key {key!r}")
            check_value(item, what, depth + 1)
        return
    raise InvalidValue(f"{what} is a {type(value).__name__}, which is not a JSON value")


def _match_value(type_: str, value: Any, what: str) -> Any:
    if type_ in DATE_TYPES and value is not None:
        if not isinstance(value, str) or (epoch := parse_iso8601(value)) is None:
            raise InvalidValue(f"{what} is typed {type_} but {value!r} is not an ISO 8601 date")
        return epoch
    return value


@dataclass(frozen=True, slots=True)
class Metadata:
    """One metadata item of an attribute: a typed JSON value."""

    type: str
    value: Any = None
    match_value: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "type", check_identifier(self.type, "metadata type"))
        check_value(self.value, "metadata value")
        object.__setattr__(self, "match_value", _match_value(self.type, self.value, "metadata"))


@dataclass(frozen=True, slots=True)
class Attribute:
    """One attribute of an entity: a type, a JSON value and its metadata."""

    type: str
    value: Any = None
    metadata: Mapping[str, Metadata] = field(default_factory=dict)
    match_value: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "type", check_identifier(self.type, "attribute type"))
        check_value(self.value, "attribute value")
        for name, item in self.metadata.items():
            check_identifier(name, "metadata name")
            if not isinstance(item, Metadata):
                raise InvalidValue(f"metadata {name!r} must be a Metadata, not {item!r}")
        object.__setattr__(self, "match_value", _match_value(self.type, self.value, "attribute"))

    @classmethod
    def unchecked(cls, type_: str, value: Any) -> Attribute:
        """An attribute without metadata, from input already checked elsewhere (the type
        and value are not checked again; a DateTime value must still be a date:
        InvalidValue)."""
        attribute = object.__new__(cls)
        object.__setattr__(attribute, "type", sys.intern(type_))
        object.__setattr__(attribute, "value", value)
        object.__setattr__(attribute, "metadata", {})
        object.__setattr__(attribute, "match_value", _match_value(type_, value, "attribute"))
        return attribute

    @classmethod
    def of(cls, value: Any, type_: str | None = None) -> Attribute:
        """An attribute holding ``value``, typed as Orion would infer when no type is given."""
        return cls(sys.intern(type_ or default_type(value)), value)
