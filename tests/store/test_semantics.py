"""Orion's write semantics on one entity (broker/store/semantics.py): modes, operators,
metadata, change detection, builtin dates, dateExpires, notification metadata, storage; and a
property test against a small dict model of Orion's rules."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from strategies import examples

from broker.errors import AlreadyExists, InvalidUpdate, NotFound, SerializationError, mapping_for
from broker.ngsi.change import Alteration
from broker.ngsi.errors import PartialUpdate, Unprocessable
from broker.query.dates import parse_iso8601
from broker.store.semantics import (
    Applied,
    Document,
    Mode,
    OperatorError,
    Write,
    apply,
    builtin_attributes,
    iso8601,
    notification_metadata,
)

T0 = 1_000.0


def md(**items: Any) -> dict[str, dict[str, Any]]:
    """Metadata given as name=value (typed Number or Text)."""
    return {
        k: {"type": "Text" if isinstance(v, str) else "Number", "value": v}
        for k, v in items.items()
    }


def attr(value: Any, type_: str | None = "Number", **metadata: Any) -> dict[str, Any]:
    """A request attribute."""
    return {"type": type_, "value": value, "metadata": md(**metadata)}


def write(mode: Mode, attributes: dict[str, Any] | None = None, **options: Any) -> Write:
    return Write(mode, "E", "T", "/", "t", attributes or {}, **options)


def entity(**attributes: Any) -> Document:
    """A stored entity created at T0 with these attributes (name=value or name=attr(...))."""
    request = {
        n: a if isinstance(a, dict) and "metadata" in a else attr(a) for n, a in attributes.items()
    }
    applied = apply(None, write(Mode.CREATE, request), T0)
    assert applied.document is not None and applied.error is None
    return applied.document


def values(applied: Applied) -> dict[str, Any]:
    assert applied.document is not None
    return {n: a["value"] for n, a in applied.document.attributes.items()}


# -- modes x existing / missing entity and attribute --------------------------------------------

A2 = {"a": attr(2)}
MODES = [
    # mode, entity present (None: missing; "a": has a; "b": has only b), error, alteration, after
    (Mode.CREATE, None, None, Alteration.CREATE, {"a": 2}),
    (Mode.CREATE, "a", AlreadyExists, None, {"a": 1}),
    (Mode.CREATE, "b", AlreadyExists, None, {"b": 1}),
    (Mode.UPSERT, None, None, Alteration.CREATE, {"a": 2}),
    (Mode.UPSERT, "a", None, Alteration.CHANGE, {"a": 2}),
    (Mode.UPSERT, "b", None, Alteration.CHANGE, {"b": 1, "a": 2}),
    (Mode.APPEND, None, NotFound, None, None),
    (Mode.APPEND, "a", None, Alteration.CHANGE, {"a": 2}),
    (Mode.APPEND, "b", None, Alteration.CHANGE, {"b": 1, "a": 2}),
    (Mode.APPEND_STRICT, None, NotFound, None, None),
    (Mode.APPEND_STRICT, "a", Unprocessable, None, {"a": 1}),
    (Mode.APPEND_STRICT, "b", None, Alteration.CHANGE, {"b": 1, "a": 2}),
    (Mode.UPDATE, None, NotFound, None, None),
    (Mode.UPDATE, "a", None, Alteration.CHANGE, {"a": 2}),
    (Mode.UPDATE, "b", Unprocessable, None, {"b": 1}),
    (Mode.REPLACE, None, NotFound, None, None),
    (Mode.REPLACE, "a", None, Alteration.CHANGE, {"a": 2}),
    (Mode.REPLACE, "b", None, Alteration.CHANGE, {"a": 2}),
    (Mode.REPLACE_ATTRIBUTE, None, NotFound, None, None),
    (Mode.REPLACE_ATTRIBUTE, "a", None, Alteration.CHANGE, {"a": 2}),
    (Mode.REPLACE_ATTRIBUTE, "b", NotFound, None, {"b": 1}),
    (Mode.DELETE_ATTRIBUTES, None, NotFound, None, None),
    (Mode.DELETE_ATTRIBUTES, "a", None, Alteration.CHANGE, {}),
    (Mode.DELETE_ATTRIBUTES, "b", NotFound, None, {"b": 1}),
    (Mode.DELETE_ENTITY, None, NotFound, None, None),
    (Mode.DELETE_ENTITY, "a", None, Alteration.DELETE, None),
]


@pytest.mark.parametrize(("mode", "present", "error", "alteration", "after"), MODES)
def test_modes(
    mode: Mode,
    present: str | None,
    error: type[Exception] | None,
    alteration: Alteration | None,
    after: dict[str, Any] | None,
) -> None:
    current = None if present is None else entity(**{present: 1})
    request = {} if mode is Mode.DELETE_ENTITY else A2
    applied = apply(current, write(mode, request), T0 + 10)
    assert applied.before is current
    if error is None:
        assert applied.error is None
        assert applied.change is not None and applied.change.alteration is alteration
        assert applied.modified
    else:
        assert isinstance(applied.error, error)
        assert applied.change is None and not applied.modified
        assert applied.document is current  # nothing applied
    if after is None:
        assert applied.document is None
    else:
        assert values(applied) == after


@pytest.mark.parametrize(
    ("mode", "stored", "request_names", "after", "message"),
    [
        (Mode.APPEND_STRICT, ["a"], ["a", "c"], {"a": 1, "c": 2}, "already exist: ['a']"),
        (Mode.UPDATE, ["a"], ["a", "c"], {"a": 2}, "do not exist: ['c']"),
        (Mode.DELETE_ATTRIBUTES, ["a", "b"], ["a", "c"], {"b": 1}, "do not exist: ['c']"),
    ],
)
def test_a_partial_update_applies_the_valid_part(
    mode: Mode, stored: list[str], request_names: list[str], after: dict[str, Any], message: str
) -> None:
    current = entity(**dict.fromkeys(stored, 1))
    applied = apply(current, write(mode, {n: attr(2) for n in request_names}), T0 + 1)
    assert isinstance(applied.error, PartialUpdate) and message in str(applied.error)
    assert values(applied) == after
    assert applied.change is not None and applied.change.alteration is Alteration.CHANGE


@pytest.mark.parametrize(
    ("mode", "stored", "request_names", "error", "message"),
    [
        (Mode.APPEND_STRICT, ["a"], ["a"], Unprocessable, "Attributes already exist: ['a']"),
        (
            Mode.APPEND_STRICT,
            ["a"],
            ["a", "c"],
            PartialUpdate,
            "Some of the attributes already exist: ['a']",
        ),
        (
            Mode.UPDATE,
            ["a"],
            ["c"],
            Unprocessable,
            "The attributes in the request do not exist: ['c']",
        ),
        (
            Mode.UPDATE,
            ["a"],
            ["a", "c"],
            PartialUpdate,
            "Some of the attributes do not exist: ['c']",
        ),
        (
            Mode.REPLACE_ATTRIBUTE,
            ["a"],
            ["c"],
            NotFound,
            "The entity does not have such an attribute",
        ),
        (
            Mode.DELETE_ATTRIBUTES,
            ["a"],
            ["c"],
            NotFound,
            "The entity does not have such an attribute",
        ),
        (
            Mode.DELETE_ATTRIBUTES,
            ["a", "b"],
            ["a", "c"],
            PartialUpdate,
            "Some of the attributes do not exist: ['c']",
        ),
        (Mode.CREATE, ["a"], ["a"], AlreadyExists, "Already Exists"),
    ],
)
def test_errors_and_messages_are_the_fronts(
    mode: Mode, stored: list[str], request_names: list[str], error: type, message: str
) -> None:
    """The error classes and descriptions the HTTP front has always answered."""
    request = {n: attr(2) for n in request_names}
    applied = apply(entity(**dict.fromkeys(stored, 1)), write(mode, request), T0)
    assert type(applied.error) is error
    assert str(applied.error) == message


def test_a_missing_entity_is_the_fronts_404() -> None:
    applied = apply(None, write(Mode.UPDATE, A2), T0)
    assert isinstance(applied.error, NotFound)
    assert str(applied.error) == "The requested entity has not been found. Check type and id"


def test_replace_removes_what_it_does_not_name_and_counts_only_what_it_names() -> None:
    current = entity(a=1, b=2)
    applied = apply(current, write(Mode.REPLACE, {"a": attr(1), "c": attr(3)}), T0 + 1)
    assert values(applied) == {"a": 1, "c": 3}
    assert applied.change is not None
    assert applied.change.changed == {"a", "c"}  # a unchanged still counts; b removed does not
    assert applied.actions == {"a": "update", "c": "update"}
    assert set(applied.previous) == {"a", "b"}
    assert notification_metadata(applied, ["previousValue", "actionType"]) == {
        "a": {
            "previousValue": {"type": "Number", "value": 1},
            "actionType": {"type": "Text", "value": "update"},
        },
        "c": {"actionType": {"type": "Text", "value": "update"}},
    }


def test_replace_without_attributes_changes_nothing() -> None:
    current = entity(a=1)
    applied = apply(current, write(Mode.REPLACE, {}), T0 + 1)
    assert applied.document is current and not applied.modified
    assert applied.change is not None and applied.change.alteration is Alteration.UPDATE


def test_delete_entity_keeps_the_entity_to_notify() -> None:
    current = entity(a=1)
    assert current.key == ("t", "/", "E", "T")
    applied = apply(current, write(Mode.DELETE_ENTITY, correlator="c1"), T0 + 1)
    assert applied.document is None and applied.before is current
    assert applied.change is not None and applied.change.correlator == "c1"


# -- update operators -----------------------------------------------------------------------------

ERROR = OperatorError
OPERATORS_ON_VALUES = [
    (10, {"$inc": 2}, 12),
    (10.5, {"$inc": -1}, 9.5),
    ("x", {"$inc": 1}, ERROR),
    (None, {"$inc": 1}, ERROR),
    (True, {"$inc": 1}, ERROR),
    (10, {"$inc": "foo"}, ERROR),
    (10, {"$inc": True}, ERROR),
    (1e308, {"$inc": 1e308}, ERROR),
    (10, {"$mul": 2}, 20),
    ("x", {"$mul": 2}, ERROR),
    (10, {"$mul": "2"}, ERROR),
    (10, {"$min": 2}, 2),
    (10, {"$min": 20}, 10),
    (10, {"$min": "a"}, 10),  # BSON order: numbers < strings
    (10, {"$max": "a"}, "a"),
    ("b", {"$min": "a"}, "a"),
    (None, {"$max": 1}, 1),
    (True, {"$min": [1]}, [1]),  # arrays < booleans
    ({"x": 1}, {"$max": {"x": 2}}, {"x": 2}),
    ([1, 2], {"$min": [1, 1, 5]}, [1, 1, 5]),
    (10, {"$max": 12}, 12),
    (10, {"$max": 4}, 10),
    ([1, 2, 3], {"$push": 3}, [1, 2, 3, 3]),
    ([1, 2, 3], {"$push": {"$each": [4, 5]}}, [1, 2, 3, 4, 5]),
    ([1, 2, 3], {"$push": {"$each": [-1, 0], "$position": 0}}, [-1, 0, 1, 2, 3]),
    ([1, 2, 3], {"$push": {"$each": [9], "$position": -1}}, [1, 2, 9, 3]),
    ([1, 2, 3], {"$push": {"$each": [4], "$slice": -2}}, [3, 4]),
    ([1], {"$push": {"x": 1}}, [1, {"x": 1}]),
    ("x", {"$push": 1}, ERROR),
    ([1], {"$push": {"$each": 2}}, ERROR),
    ([1], {"$push": {"$each": [2], "$sort": 1}}, ERROR),
    ([1, 2, 3], {"$addToSet": 4}, [1, 2, 3, 4]),
    ([1, 2, 3], {"$addToSet": 3}, [1, 2, 3]),
    ([1], {"$addToSet": 1.0}, [1]),
    ([1], {"$addToSet": True}, [1, True]),
    ([1, 2, 3], {"$addToSet": {"$each": [3, 4, 4]}}, [1, 2, 3, 4]),
    (5, {"$addToSet": 1}, ERROR),
    ([1, 2, 3, 2], {"$pull": 2}, [1, 3]),
    ([{"a": 1}, {"a": 2}], {"$pull": {"a": 1}}, [{"a": 2}]),
    ("x", {"$pull": 1}, ERROR),
    ([1, 2, 3], {"$pullAll": [2, 3]}, [1]),
    ([1, 2, 3], {"$pullAll": 2}, ERROR),
    ("x", {"$pullAll": [1]}, ERROR),
    ({"X": 1, "Y": 2}, {"$set": {"Y": 20, "Z": 30}}, {"X": 1, "Y": 20, "Z": 30}),
    ({}, {"$set": {"a": 1}}, {"a": 1}),
    ({"X": 1}, {"$set": "foo"}, "foo"),
    ("foo", {"$set": {"a": 1}}, ERROR),
    (None, {"$set": {"a": 1}}, ERROR),
    ({"X": 1, "Y": 2}, {"$unset": {"X": 1}}, {"Y": 2}),
    ({"X": 1, "Y": 2}, {"$unset": {"X": None, "Q": 1}}, {"Y": 2}),
    ({"X": 1}, {"$unset": "X"}, {"X": 1}),
    ("foo", {"$unset": {"X": 1}}, "foo"),
    ({"X": 1, "Y": 2}, {"$set": {"Y": 20, "Z": 30}, "$unset": {"X": 1}}, {"Y": 20, "Z": 30}),
    ({"X": 1, "Y": 2}, {"$set": {"X": 20}, "$unset": {"X": 1}}, ERROR),
    ({"X": 1}, {"$unset": {"X": 1}, "$set": {"Y": 2}}, {"Y": 2}),
    (3, {"$inc": 1, "$mul": 10}, 4),  # Orion: "randomly, in principle"; here the first key
    (3, {"x": 1, "$inc": 1}, {"x": 1, "$inc": 1}),  # not an operator: a plain object
]


@pytest.mark.parametrize(("old", "value", "expected"), OPERATORS_ON_VALUES)
def test_operators_on_an_existing_attribute(old: Any, value: Any, expected: Any) -> None:
    current = entity(a=attr(old, "Thing"), b=1)
    applied = apply(current, write(Mode.UPDATE, {"a": attr(value, "Thing"), "b": attr(5)}), T0 + 1)
    if expected is ERROR:
        assert isinstance(applied.error, OperatorError)
        assert applied.document is current and applied.change is None  # b did not apply either
        # Orion answers 500; a client's mistake is a 400 here (docs/ngsi.md)
        assert mapping_for(applied.error).http_status == 400
        assert mapping_for(applied.error).ngsi_error == "BadRequest"
    else:
        assert applied.error is None
        assert values(applied) == {"a": expected, "b": 5}
        assert type(values(applied)["a"]) is type(expected)
        assert applied.change is not None and "a" in applied.change.changed
        assert applied.operators is next(iter(value)).startswith("$")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ({"$inc": 3}, 3),
        ({"$mul": 3}, 0),
        ({"$mul": 3.5}, 0.0),
        ({"$min": 5}, 5),
        ({"$max": -5}, -5),
        ({"$push": 1}, [1]),
        ({"$push": {"$each": [1, 2]}}, [1, 2]),
        ({"$addToSet": {"$each": [1, 1, 2]}}, [1, 2]),
        ({"$set": {"a": 1}}, {"a": 1}),
        ({"$set": 7}, 7),
        ({"$pull": 1}, None),
        ({"$pullAll": [1]}, None),
        ({"$unset": {"a": 1}}, None),
        ({"$inc": "x"}, ERROR),
    ],
)
def test_operators_on_a_missing_attribute_of_an_existing_entity(value: Any, expected: Any) -> None:
    """MongoDB on a missing field; None: the attribute is not created."""
    current = entity(b=1)
    applied = apply(current, write(Mode.APPEND, {"a": attr(value)}), T0 + 1)
    if expected is ERROR:
        assert isinstance(applied.error, OperatorError)
        return
    if expected is None:
        assert values(applied) == {"b": 1}
        assert not applied.modified and applied.change is not None
        assert applied.change.alteration is Alteration.UPDATE
    else:
        assert values(applied) == {"b": 1, "a": expected}
        assert type(values(applied)["a"]) is type(expected)
        assert applied.actions == {"a": "append"}


CREATION = [
    ("Number", {"$inc": 4}, 4),
    ("Number", {"$inc": "x"}, 0),
    ("Number", {"$mul": 1000}, 0),
    ("Number", {"$min": 5}, 0),
    ("Number", {"$min": -5}, -5),
    ("Number", {"$max": 5}, 5),
    ("Number", {"$max": -5}, 0),
    ("DateTime", {"$max": "2020-01-01T00:00:00Z"}, "2020-01-01T00:00:00Z"),
    ("DateTime", {"$min": "2020-01-01T00:00:00Z"}, "1970-01-01T00:00:00.000Z"),
    ("DateTime", {"$min": "1960-01-01T00:00:00Z"}, "1960-01-01T00:00:00Z"),
    ("Array", {"$push": 4}, [4]),
    ("Array", {"$push": {"$each": [4, 5], "$position": 0}}, [4, 5]),
    ("Array", {"$addToSet": 4}, [4]),
    ("Object", {"$set": {"X": 1}}, {"X": 1}),
    ("Object", {"$set": {"X": 1}, "$unset": {"Y": 1}}, {"X": 1}),
    ("Object", {"$unset": {"Y": 1}, "$set": {"X": 1}}, None),
    ("Object", {"$unset": 1}, None),
    ("Array", {"$pull": 1}, None),
    ("Array", {"$pullAll": [1]}, None),
]


@pytest.mark.parametrize("mode", [Mode.CREATE, Mode.UPSERT, Mode.REPLACE])
@pytest.mark.parametrize(("type_", "value", "expected"), CREATION)
def test_operators_in_a_create_or_a_replace(
    mode: Mode, type_: str, value: Any, expected: Any
) -> None:
    """Orion's references: 0, the epoch, [] and {}; a dropped attribute is not created."""
    current = entity(a=attr(10), b=1) if mode is Mode.REPLACE else None
    request = {"a": attr(value, type_), "b": attr(1)}
    applied = apply(current, write(mode, request), T0 + 1)
    assert applied.error is None
    assert values(applied) == ({"b": 1} if expected is None else {"a": expected, "b": 1})
    assert not applied.operators  # Orion keeps previousValue / actionType here


def test_an_operator_without_type_makes_a_structured_value() -> None:
    applied = apply(entity(b=1), write(Mode.APPEND, {"a": attr({"$inc": 1}, None)}), T0)
    assert applied.document is not None
    assert applied.document.attributes["a"] == {
        "type": "StructuredValue",
        "value": 1,
        "metadata": {},
    }


def test_an_operator_always_counts_as_a_change() -> None:
    current = entity(a=10)
    applied = apply(current, write(Mode.UPDATE, {"a": attr({"$max": 4})}), T0 + 5)
    assert values(applied) == {"a": 10}
    assert applied.change is not None and applied.change.alteration is Alteration.CHANGE
    assert applied.change.changed == {"a"}
    assert applied.document is not None and applied.document.date_modified == T0 + 5


def test_dates_compare_as_dates_in_min_max() -> None:
    current = entity(d=attr("2021-06-01T00:00:00Z", "DateTime"))
    later = {"d": attr({"$max": "2021-06-01T01:00:00+00:30"}, "DateTime")}
    applied = apply(current, write(Mode.UPDATE, later), T0)
    assert values(applied) == {"d": "2021-06-01T01:00:00+00:30"}
    earlier = {"d": attr({"$max": "2021-06-01T01:00:00+02:00"}, "DateTime")}
    assert values(apply(current, write(Mode.UPDATE, earlier), T0)) == {"d": "2021-06-01T00:00:00Z"}


# -- metadata -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [Mode.UPDATE, Mode.APPEND, Mode.UPSERT, Mode.REPLACE_ATTRIBUTE])
@pytest.mark.parametrize(
    ("override", "request_md", "after"),
    [
        (
            False,
            {"avg": 25.6, "accuracy": 98.7},
            {"unit": "celsius", "avg": 25.6, "accuracy": 98.7},
        ),
        (False, {}, {"unit": "celsius", "avg": 25.4}),
        (True, {"avg": 25.6, "accuracy": 98.7}, {"avg": 25.6, "accuracy": 98.7}),
        (True, {}, {}),
    ],
)
def test_metadata_merge_override_and_clear(
    mode: Mode, override: bool, request_md: dict[str, Any], after: dict[str, Any]
) -> None:
    """The api's example (Metadata update semantics, overrideMetadata option)."""
    current = entity(temperature=attr(25, unit="celsius", avg=25.4))
    request = {"temperature": attr(26, **request_md)}
    applied = apply(current, write(mode, request, override_metadata=override), T0 + 1)
    assert applied.document is not None
    assert applied.document.attributes["temperature"]["metadata"] == md(**after)


@pytest.mark.parametrize("override", [False, True])
def test_put_value_keeps_type_and_metadata(override: bool) -> None:
    current = entity(a=attr(1, "Float", unit="m"))
    request: dict[str, Any] = {"a": {"type": None, "value": 2, "metadata": {}}}
    applied = apply(
        current,
        write(Mode.REPLACE_ATTRIBUTE, request, value_only=True, override_metadata=override),
        T0,
    )
    assert applied.document is not None
    assert applied.document.attributes["a"] == {
        "type": "Float",
        "value": 2,
        "metadata": md(unit="m"),
    }


def test_appended_and_replaced_attributes_take_the_metadata_as_given() -> None:
    current = entity(a=attr(1, unit="m"))
    replaced = apply(current, write(Mode.REPLACE, {"a": attr(1, avg=2)}), T0)
    assert replaced.document is not None
    assert replaced.document.attributes["a"]["metadata"] == md(avg=2)
    appended = apply(current, write(Mode.APPEND, {"b": attr(1, avg=2)}), T0)
    assert appended.document is not None
    assert appended.document.attributes["b"]["metadata"] == md(avg=2)


# -- change detection ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "options", "alteration", "changed", "meta_changed"),
    [
        (attr(1), attr(1), {}, Alteration.UPDATE, set(), set()),
        (attr(1), attr(1.0), {}, Alteration.UPDATE, set(), set()),
        (attr(1), attr(True, "Number"), {}, Alteration.CHANGE, {"a"}, set()),
        (attr(1), attr(2), {}, Alteration.CHANGE, {"a"}, set()),
        (attr(1), attr(1, "Text"), {}, Alteration.CHANGE, {"a"}, set()),
        (
            attr({"x": 1, "y": [1, 2]}),
            attr({"y": [1, 2.0], "x": 1}),
            {},
            Alteration.UPDATE,
            set(),
            set(),
        ),
        (attr([1, 2]), attr([2, 1]), {}, Alteration.CHANGE, {"a"}, set()),
        (attr(1), attr(1, u="m"), {}, Alteration.CHANGE, set(), {"a"}),
        (attr(1, u="m"), attr(1, u="m"), {}, Alteration.UPDATE, set(), set()),
        (attr(1, u="m"), attr(1), {}, Alteration.UPDATE, set(), set()),
        (attr(1, u="m"), attr(1), {"override_metadata": True}, Alteration.CHANGE, set(), {"a"}),
        (attr(1, u="m"), attr(2, u="k"), {}, Alteration.CHANGE, {"a"}, set()),
        (attr(1), attr(1), {"forced_update": True}, Alteration.CHANGE, {"a"}, set()),
    ],
)
def test_change_or_update(
    old: dict[str, Any],
    new: dict[str, Any],
    options: dict[str, Any],
    alteration: Alteration,
    changed: set[str],
    meta_changed: set[str],
) -> None:
    current = entity(a=old, b=5)
    applied = apply(current, write(Mode.UPDATE, {"a": new}, **options), T0 + 1)
    change = applied.change
    assert change is not None and change.alteration is alteration
    assert change.changed == changed and change.meta_changed == meta_changed
    assert change.requested == {"a"}
    assert applied.modified is (alteration is Alteration.CHANGE)
    if alteration is Alteration.UPDATE:
        assert applied.document is current  # Orion stores nothing


def test_forced_update_counts_every_applied_attribute() -> None:
    current = entity(a=1, b=2)
    request = {"a": attr(1), "b": attr(2), "c": attr(3)}
    applied = apply(current, write(Mode.UPDATE, request, forced_update=True), T0 + 1)
    assert isinstance(applied.error, PartialUpdate)
    assert applied.change is not None and applied.change.changed == {"a", "b"}
    assert applied.change.requested == {"a", "b", "c"}


def test_deleting_attributes_changes_them() -> None:
    applied = apply(entity(a=1, b=2), write(Mode.DELETE_ATTRIBUTES, {"a": {}}), T0 + 1)
    assert applied.change is not None and applied.change.changed == {"a"}
    assert applied.actions == {}  # deleted attributes are not notified


# -- builtin dates --------------------------------------------------------------------------------


def test_create_dates() -> None:
    document = entity(a=1, b=2)
    assert (document.date_created, document.date_modified) == (T0, T0)
    assert document.attribute_dates == {"a": (T0, T0), "b": (T0, T0)}


def test_update_dates_touch_only_what_changed() -> None:
    current = entity(a=1, b=2)
    applied = apply(current, write(Mode.APPEND, {"a": attr(1), "b": attr(3), "c": attr(4)}), T0 + 5)
    document = applied.document
    assert document is not None
    assert (document.date_created, document.date_modified) == (T0, T0 + 5)
    assert document.attribute_dates == {"a": (T0, T0), "b": (T0, T0 + 5), "c": (T0 + 5, T0 + 5)}
    metadata_only = apply(document, write(Mode.UPDATE, {"a": attr(1, u="m")}), T0 + 9)
    assert metadata_only.document is not None
    assert metadata_only.document.attribute_dates["a"] == (T0, T0 + 9)


def test_dates_never_go_back() -> None:
    current = entity(a=1)
    applied = apply(current, write(Mode.UPDATE, {"a": attr(2)}), T0 - 100)
    assert applied.document is not None
    assert applied.document.date_modified == T0 and applied.document.attribute_dates["a"] == (
        T0,
        T0,
    )


def test_replace_gives_fresh_attribute_dates() -> None:
    current = entity(a=1)
    applied = apply(current, write(Mode.REPLACE, {"a": attr(1)}), T0 + 3)
    assert applied.document is not None
    assert applied.document.date_created == T0
    assert applied.document.attribute_dates == {"a": (T0 + 3, T0 + 3)}


def test_builtin_attributes_and_iso_dates() -> None:
    document = entity(a=1)
    assert builtin_attributes(document) == {
        "dateCreated": {"type": "DateTime", "value": "1970-01-01T00:16:40.000Z", "metadata": {}},
        "dateModified": {"type": "DateTime", "value": "1970-01-01T00:16:40.000Z", "metadata": {}},
    }
    assert iso8601(1_700_000_000.1234) == "2023-11-14T22:13:20.123Z"


# -- dateExpires ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["2028-07-07T21:35:00Z", "2028-07-07T21:35:00.250Z", "2028-07-07", "2028-07-07T23:35:00+02:00"],
)
def test_date_expires_from_the_attribute(text: str) -> None:
    document = entity(dateExpires=attr(text, "DateTime"))
    assert document.date_expires == parse_iso8601(text)
    assert document.expired(parse_iso8601(text) or 0.0)
    assert not document.expired((parse_iso8601(text) or 0.0) - 1)


def test_date_expires_changes_with_its_attribute() -> None:
    document = entity(a=1, dateExpires=attr("2028-07-07T21:35:00Z", "DateTime"))
    moved = apply(document, write(Mode.UPDATE, {"dateExpires": attr("2029-01-01", "DateTime")}), T0)
    assert moved.document is not None and moved.document.date_expires == parse_iso8601("2029-01-01")
    for change in (
        write(Mode.DELETE_ATTRIBUTES, {"dateExpires": {}}),
        write(Mode.REPLACE, {"a": attr(1)}),
        write(Mode.UPDATE, {"dateExpires": attr(None, "DateTime")}),
    ):
        applied = apply(document, change, T0)
        assert applied.document is not None and applied.document.date_expires is None


@pytest.mark.parametrize("mode", [Mode.CREATE, Mode.APPEND, Mode.REPLACE])
def test_date_expires_must_be_a_datetime(mode: Mode) -> None:
    current = None if mode is Mode.CREATE else entity(a=1)
    request = {"a": attr(2), "dateExpires": attr("2028-07-07", "Text")}
    applied = apply(current, write(mode, request), T0)
    assert isinstance(applied.error, InvalidUpdate)
    assert mapping_for(applied.error).http_status == 400
    assert applied.document is current and applied.change is None


def test_a_legacy_date_expires_of_another_type_is_a_plain_attribute() -> None:
    stored = Document("E", "T", "/", "t", {"dateExpires": attr("soon", "Text")}, T0, T0)
    applied = apply(stored, write(Mode.APPEND, {"a": attr(1)}), T0)
    assert applied.error is None
    assert applied.document is not None and applied.document.date_expires is None


# -- notification metadata ------------------------------------------------------------------------

EVERY = ["previousValue", "actionType", "dateCreated", "dateModified"]


def test_notification_metadata_of_a_create() -> None:
    applied = apply(None, write(Mode.CREATE, {"a": attr(1)}), T0)
    assert notification_metadata(applied, EVERY) == {
        "a": {
            "actionType": {"type": "Text", "value": "append"},
            "dateCreated": {"type": "DateTime", "value": iso8601(T0)},
            "dateModified": {"type": "DateTime", "value": iso8601(T0)},
        }
    }


def test_notification_metadata_of_an_update() -> None:
    current = entity(a=1, b=attr("x", "Text"), c=3)
    request = {"a": attr(2), "b": attr("x", "Text"), "d": attr(4)}
    applied = apply(current, write(Mode.APPEND, request), T0 + 1)
    metadata = notification_metadata(applied, ["previousValue", "actionType", "*"])
    assert metadata == {
        "a": {
            "previousValue": {"type": "Number", "value": 1},
            "actionType": {"type": "Text", "value": "update"},
        },
        "b": {  # unchanged, yet Orion gives its previousValue (equal: no change)
            "previousValue": {"type": "Text", "value": "x"},
            "actionType": {"type": "Text", "value": "update"},
        },
        "d": {"actionType": {"type": "Text", "value": "append"}},
    }
    assert notification_metadata(applied, ["*", "accuracy"]) == {}


def test_user_metadata_wins_over_a_builtin_of_the_same_name() -> None:
    current = entity(a=attr(1, previousValue="mine"))
    applied = apply(current, write(Mode.UPDATE, {"a": attr(2)}), T0)
    assert notification_metadata(applied, ["previousValue"]) == {}


def test_no_previous_value_or_action_type_after_an_operator() -> None:
    current = entity(a=1, b=2)
    applied = apply(current, write(Mode.UPDATE, {"a": attr({"$inc": 1}), "b": attr(3)}), T0 + 1)
    assert applied.operators
    assert set(applied.previous) == {"a", "b"}  # kept for the store's change, not notified
    assert notification_metadata(applied, ["previousValue", "actionType"]) == {}
    assert notification_metadata(applied, ["dateModified"])["a"]["dateModified"]["value"] == (
        iso8601(T0 + 1)
    )


def test_notification_metadata_of_a_delete() -> None:
    applied = apply(entity(a=1), write(Mode.DELETE_ENTITY), T0 + 1)
    assert notification_metadata(applied, EVERY) == {
        "a": {
            "dateCreated": {"type": "DateTime", "value": iso8601(T0)},
            "dateModified": {"type": "DateTime", "value": iso8601(T0)},
        }
    }


# -- storage --------------------------------------------------------------------------------------


def test_to_bytes_round_trips() -> None:
    request = {
        "z": attr({"deep": [1, 2.5, None, True, "s", {"k": []}]}, "StructuredValue", u="m"),
        "a": attr(1),
        "dateExpires": attr("2028-07-07T21:35:00Z", "DateTime"),
    }
    document = apply(None, write(Mode.CREATE, request), T0).document
    assert document is not None
    again = Document.from_bytes(document.to_bytes())
    assert again == document
    assert list(again.attributes) == ["z", "a", "dateExpires"]
    assert again.to_bytes() == document.to_bytes()


def test_integers_past_64_bits_are_stored_as_doubles() -> None:
    document = entity(a=2**70, b=-(2**64))
    again = Document.from_bytes(document.to_bytes())
    assert again.attributes["a"]["value"] == float(2**70)
    assert again.attributes["b"]["value"] == float(-(2**64))


@pytest.mark.parametrize(
    "data", [b"", b"\x01", b"\xc1", b"\x93\x01\x02\x03", b"\x99" + b"\x02" * 9]
)
def test_from_bytes_refuses_what_is_not_a_document(data: bytes) -> None:
    with pytest.raises(SerializationError):
        Document.from_bytes(data)


# -- a model of Orion's rules for the plain modes -------------------------------------------------

Model = dict[str, dict[str, Any]] | None
NAMES = ("a", "b", "c")
VALUES = (0, 1, 1.0, True, False, "x", None, [1], {"k": 1}, {"k": 1.0})
METADATA: tuple[dict[str, Any], ...] = ({}, md(u="m"), md(u="k"), md(v=1), md(u="m", v=1.0))


def canon(value: Any) -> Any:
    """A value as Orion compares it: numbers as doubles, booleans apart, objects unordered."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return (type(value).__name__, value)
    if isinstance(value, int | float):
        return ("number", float(value))
    if isinstance(value, list):
        return ("list", tuple(canon(v) for v in value))
    return ("dict", frozenset((k, canon(v)) for k, v in value.items()))


def model(state: Model, w: Write) -> tuple[Model, type[Exception] | None, Any]:
    """(state after, error class, (alteration, changed, meta_changed) or None)."""
    mode, names = w.mode, list(w.attributes)
    if state is None:
        if mode not in (Mode.CREATE, Mode.UPSERT):
            return state, NotFound, None
        created = {n: dict(w.attributes[n]) for n in names}
        return created, None, (Alteration.CREATE, set(names), set())
    if mode is Mode.CREATE:
        return state, AlreadyExists, None
    if mode is Mode.DELETE_ENTITY:
        return None, None, (Alteration.DELETE, set(), set())
    there = [n for n in names if n in state]
    missing = [n for n in names if n not in state]
    if mode is Mode.DELETE_ATTRIBUTES:
        if not there:
            return state, NotFound, None
        kept = {n: a for n, a in state.items() if n not in there}
        return kept, PartialUpdate if missing else None, (Alteration.CHANGE, set(there), set())
    if mode is Mode.REPLACE:
        if not names:
            return state, None, (Alteration.UPDATE, set(), set())
        return (
            {n: dict(w.attributes[n]) for n in names},
            None,
            (Alteration.CHANGE, set(names), set()),
        )
    error: type[Exception] | None = None
    applying = names
    if mode is Mode.APPEND_STRICT and there:
        if not missing:
            return state, Unprocessable, None
        error, applying = PartialUpdate, missing
    if mode in (Mode.UPDATE, Mode.REPLACE_ATTRIBUTE) and missing:
        if mode is Mode.REPLACE_ATTRIBUTE:
            return state, NotFound, None
        if not there:
            return state, Unprocessable, None
        error, applying = PartialUpdate, there
    after, changed, meta_changed = dict(state), set(), set()
    for n in applying:
        asked = w.attributes[n]
        if n not in state:
            after[n] = dict(asked)
            changed.add(n)
            continue
        old = state[n]
        metadata = (
            dict(asked["metadata"])
            if w.override_metadata
            else {**old["metadata"], **asked["metadata"]}
        )
        if (
            w.forced_update
            or old["type"] != asked["type"]
            or canon(old["value"]) != canon(asked["value"])
        ):
            changed.add(n)
        elif canon(old["metadata"]) != canon(metadata):
            meta_changed.add(n)
        after[n] = {"type": asked["type"], "value": asked["value"], "metadata": metadata}
    if not changed and not meta_changed:
        return state, error, (Alteration.UPDATE, set(), set())
    return after, error, (Alteration.CHANGE, changed, meta_changed)


@st.composite
def writes(draw: st.DrawFn) -> Write:
    rare = draw(st.integers(0, 15)) == 0  # deleting the entity leaves little to test after it
    mode = Mode.DELETE_ENTITY if rare else draw(st.sampled_from(list(Mode)[:-1]))
    if mode is Mode.DELETE_ENTITY:
        names: list[str] = []
    elif mode is Mode.REPLACE_ATTRIBUTE:
        names = [draw(st.sampled_from(NAMES))]
    else:
        low = 1 if mode is Mode.DELETE_ATTRIBUTES else 0
        names = draw(st.lists(st.sampled_from(NAMES), min_size=low, max_size=3, unique=True))
    attributes = {
        n: {
            "type": draw(st.sampled_from(("Number", "Text"))),
            "value": draw(st.sampled_from(VALUES)),
            "metadata": draw(st.sampled_from(METADATA)),
        }
        for n in names
    }
    return Write(
        mode,
        "E",
        "T",
        attributes=attributes,
        override_metadata=draw(st.booleans()),
        forced_update=draw(st.booleans()),
    )


@settings(max_examples=examples(300))
@given(
    st.lists(
        st.tuples(writes(), st.floats(min_value=-5, max_value=50, allow_nan=False)),
        min_size=1,
        max_size=25,
    )
)
def test_apply_agrees_with_the_model(steps: list[tuple[Write, float]]) -> None:
    stored: Document | None = None
    state: Model = None
    now = T0
    for w, step in steps:
        now += step
        expected_state, expected_error, expected_change = model(state, w)
        applied = apply(stored, w, now)
        outcome = expected_error.__name__ if expected_error else expected_change[0].value
        event(f"{w.mode.value} -> {outcome}")
        assert type(applied.error) is (expected_error or type(None))
        if expected_change is None:
            assert applied.change is None and applied.document is stored
        else:
            assert applied.change is not None
            alteration, changed, meta_changed = expected_change
            assert applied.change.alteration is alteration
            assert applied.change.changed == changed
            assert applied.change.meta_changed == meta_changed
            assert applied.modified is (alteration is not Alteration.UPDATE)
        document = applied.document
        if expected_state is None:
            assert document is None
        else:
            assert document is not None
            assert list(document.attributes) == list(expected_state)
            for name, attribute in expected_state.items():
                got = document.attributes[name]
                assert got["type"] == attribute["type"]
                assert canon(got["value"]) == canon(attribute["value"])
                assert canon(got["metadata"]) == canon(attribute["metadata"])
            assert set(document.attribute_dates) == set(document.attributes)
            assert document.date_created <= document.date_modified
            for created, modified in document.attribute_dates.values():
                assert document.date_created <= created <= modified <= document.date_modified
            if stored is not None and document is not stored:
                assert document.date_modified >= stored.date_modified
            assert Document.from_bytes(document.to_bytes()) == document
        stored, state = document, expected_state


@given(
    st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-(2**63), 2**64 - 1)
        | st.floats(allow_nan=False, allow_infinity=False)
        | st.text(max_size=5),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
        ),
        max_leaves=10,
    ),
    st.dictionaries(st.text(min_size=1, max_size=4), st.sampled_from(METADATA), max_size=4),
)
def test_to_bytes_round_trips_any_json(value: Any, names: dict[str, Any]) -> None:
    attributes = {n: {"type": "T", "value": value, "metadata": m} for n, m in names.items()}
    dates = {n: (T0, T0 + i) for i, n in enumerate(names)}
    document = Document("E", "T", "/a/b", "tenant", attributes, T0, T0 + 9, None, dates)
    again = Document.from_bytes(document.to_bytes())
    assert again == document and list(again.attributes) == list(attributes)
    assert again.to_bytes() == document.to_bytes()
