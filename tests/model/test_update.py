"""Context updates and attributes: construction validates everything."""

from __future__ import annotations

from typing import Any

import pytest

from broker.errors import InvalidIdentifier, InvalidUpdate, InvalidValue
from broker.model.attribute import (
    MAX_VALUE_DEPTH,
    Attribute,
    Metadata,
    default_type,
    parse_iso8601,
)
from broker.model.update import ContextUpdate


def test_defaults() -> None:
    update = ContextUpdate("Room1")
    assert update.entity_type == "Thing"
    assert update.tenant == ""
    assert update.service_path == "/"
    assert update.attributes == {}


def test_of_infers_types_as_orion() -> None:
    update = ContextUpdate.of("r", {"t": 21.5, "n": "x", "b": True, "z": None, "o": {"a": 1}})
    types = {name: a.type for name, a in update.attributes.items()}
    assert types == {
        "t": "Number",
        "n": "Text",
        "b": "Boolean",
        "z": "None",
        "o": "StructuredValue",
    }


@pytest.mark.parametrize(
    ("value", "expected"),
    [(1, "Number"), (1.5, "Number"), (False, "Boolean"), ([1], "StructuredValue")],
)
def test_default_type(value: Any, expected: str) -> None:
    assert default_type(value) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1970-01-01T00:00:00Z", 0.0),
        ("1970-01-01T00:00:10.5Z", 10.5),
        ("1970-01-01T01:00:00+01:00", 0.0),
        ("1970-01-02", 86400.0),
        ("1970-01-01T00:01:00", 60.0),
    ],
)
def test_parse_iso8601(text: str, expected: float) -> None:
    assert parse_iso8601(text) == expected


@pytest.mark.parametrize(
    "text", ["2020", "yesterday", "2020-13-01", "20-01-01", "", "2020-01-01Tnope"]
)
def test_parse_iso8601_rejects(text: str) -> None:
    assert parse_iso8601(text) is None


def test_datetime_attributes_compare_as_epoch_numbers() -> None:
    attribute = Attribute("DateTime", "1970-01-01T00:00:05Z")
    assert attribute.match_value == 5.0
    assert Attribute("Text", "1970-01-01T00:00:05Z").match_value == "1970-01-01T00:00:05Z"
    assert Metadata("ISO8601", "1970-01-01T00:00:07Z").match_value == 7.0


def test_bad_datetime_is_a_typed_error() -> None:
    with pytest.raises(InvalidValue, match="not an ISO 8601 date"):
        Attribute("DateTime", "tomorrow")
    with pytest.raises(InvalidValue, match="not an ISO 8601 date"):
        Attribute("DateTime", 5)


def _nested(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = {"x": value}
    return value


def test_value_depth_limit() -> None:
    Attribute("StructuredValue", _nested(MAX_VALUE_DEPTH))
    with pytest.raises(InvalidValue, match="deeper than"):
        Attribute("StructuredValue", _nested(MAX_VALUE_DEPTH + 1))
    nested_list: Any = 1
    for _ in range(MAX_VALUE_DEPTH + 1):
        nested_list = [nested_list]
    with pytest.raises(InvalidValue, match="deeper than"):
        Attribute("StructuredValue", nested_list)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (float("nan"), "JSON cannot carry"),
        (float("inf"), "JSON cannot carry"),
        ({1: "x"}, "non-string key"),
        ({"a": object()}, "not a JSON value"),
        ("x" * ((1 << 20) + 1), "too long"),
    ],
)
def test_bad_values(value: Any, message: str) -> None:
    with pytest.raises(InvalidValue, match=message):
        Attribute("X", value)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"entity_id": ""}, InvalidIdentifier, "entity id"),
        ({"entity_id": "a b"}, InvalidIdentifier, "entity id"),
        ({"entity_type": "T/1"}, InvalidIdentifier, "entity type"),
        ({"tenant": "UPPER"}, InvalidIdentifier, "tenant"),
        ({"service_path": "/a/#"}, InvalidIdentifier, "service path"),
        ({"service_path": "relative"}, InvalidIdentifier, "absolute"),
        ({"attributes": {"id": Attribute("Text", "x")}}, InvalidUpdate, "reserved"),
        ({"attributes": {"a b": Attribute("Text", "x")}}, InvalidIdentifier, "attribute name"),
        ({"attributes": {"a": 5}}, InvalidUpdate, "must be an Attribute"),
        ({"attributes": [1]}, InvalidUpdate, "mapping"),
        ({"sequence": -1}, InvalidUpdate, "negative"),
        ({"sequence": True}, InvalidUpdate, "integer"),
        ({"publisher": 5}, InvalidUpdate, "publisher"),
    ],
)
def test_invalid_updates(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    fields: dict[str, Any] = {"entity_id": "Room1"} | kwargs
    with pytest.raises(error, match=message):
        ContextUpdate(**fields)


def test_attribute_type_and_metadata_are_checked() -> None:
    with pytest.raises(InvalidIdentifier, match="attribute type"):
        Attribute("", 1)
    with pytest.raises(InvalidIdentifier, match="metadata name"):
        Attribute("Number", 1, {"bad name": Metadata("Text", "x")})
    with pytest.raises(InvalidValue, match="must be a Metadata"):
        Attribute("Number", 1, {"unit": "C"})  # type: ignore[dict-item]
