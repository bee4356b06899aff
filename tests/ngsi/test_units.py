"""The front's parts without a cluster: entities, the last values, change notes, the
allow-list and subscription documents."""

from __future__ import annotations

from typing import Any

import pytest

from broker.errors import InvalidInput, NotFound
from broker.model.subscription import AttrsFormat
from broker.ngsi.allow import AllowList
from broker.ngsi.change import Alteration, Change, read_change, with_change
from broker.ngsi.entity import parse_entity, parse_text_value, render, to_wire
from broker.ngsi.errors import NotServed
from broker.ngsi.subscriptions import iso, merged, parse_document
from broker.query.dates import parse_iso8601
from broker.wire import client_pb2 as pb


def attr(value: Any, type_: str = "Number", **metadata: Any) -> dict[str, Any]:
    return {"type": type_, "value": value, "metadata": metadata}


@pytest.mark.parametrize(
    ("text", "value"),
    [('"hi"', "hi"), ("true", True), ("false", False), ("null", None), ("42", 42), ("-1.5", -1.5)],
)
def test_text_plain_values(text: str, value: Any) -> None:
    assert parse_text_value(text) == value
    assert type(parse_text_value(text)) is type(value)


def test_text_plain_refuses_bare_words() -> None:
    with pytest.raises(InvalidInput):
        parse_text_value("hello")


@pytest.mark.parametrize("text", ["1e400", "nan", "-inf", "1" * 400, "1" * 5000, "0" * 5000 + "1"])
def test_text_plain_refuses_numbers_json_cannot_carry(text: str) -> None:
    """400 digits were an integer no float carries (a 500 when published), 5000 more than
    int() reads (a 500 at once)."""
    with pytest.raises(InvalidInput):
        parse_text_value(text)


def test_entities_get_orions_defaults() -> None:
    entity_id, entity_type, attributes = parse_entity(
        {
            "id": "E",
            "a": {"value": "x"},
            "b": {},
            "c": {"value": [1], "metadata": {"m": {"value": 1}}},
        },
        key_values=False,
    )
    assert (entity_id, entity_type) == ("E", "Thing")
    assert attributes == {
        "a": attr("x", "Text"),
        "b": attr(None, "None"),
        "c": {
            "type": "StructuredValue",
            "value": [1],
            "metadata": {"m": {"type": "Number", "value": 1}},
        },
    }
    _i, _t, key_values = parse_entity({"id": "E", "type": "T", "a": 1.5}, key_values=True)
    assert key_values == {"a": attr(1.5)}


@pytest.mark.parametrize(
    "body",
    [
        {"id": "E", "x": {"value": "<script>"}},
        {"id": "E", "x": {"value": {"k": "a=b"}}},
        {"id": "E", "x": {"value": 1, "metadata": {"m": {"value": "'q'"}}}},
        {"id": "E", "id2": 1, "type": "bad/type"},
        {"id": "E", "x": {"value": 1, "type": "a b"}},
    ],
)
def test_forbidden_characters(body: dict[str, Any]) -> None:
    with pytest.raises(InvalidInput):
        parse_entity(body, key_values=False)


@pytest.mark.parametrize(
    ("body", "key_values"),
    [
        ({"id": "E", "x": {"value": 10**400}}, False),
        ({"id": "E", "x": 10**400}, True),
        ({"id": "E", "x": {"value": 1, "metadata": {"m": {"value": -(10**309)}}}}, False),
    ],
)
def test_integers_past_any_float(body: dict[str, Any], key_values: bool) -> None:
    """An integer outside int64 is published as a float; one past the largest float made the
    publication raise OverflowError (a 500)."""
    with pytest.raises(InvalidInput, match="number past"):
        parse_entity(body, key_values=key_values)
    parse_entity({"id": "E", "x": {"value": 10**300}}, key_values=False)  # a float carries it


def test_render_formats_and_filters() -> None:
    attributes = {"a": attr(1), "b": attr("x", "Text"), "c": attr(True, "Boolean")}
    assert render("E", "T", attributes, AttrsFormat.KEY_VALUES, attrs=["c", "a"]) == {
        "id": "E",
        "type": "T",
        "c": True,
        "a": 1,
    }
    assert render("E", "T", attributes, AttrsFormat.VALUES, except_attrs=["b"]) == [1, True]
    normalized = render("E", "T", attributes, AttrsFormat.NORMALIZED, attrs=["missing"])
    assert normalized == {"id": "E", "type": "T"}


def test_the_change_note_travels_in_the_entity_bytes() -> None:
    entity = to_wire("E", "T", "t", "/a", {"x": attr(1)})
    change = Change(Alteration.CHANGE, frozenset({"x"}), frozenset({"y"}), frozenset({"x"}), "c1")
    data = with_change(entity, change).SerializeToString()
    copy = pb.Entity.FromString(data)
    copy.type = "T2"  # what a connection point does while normalising: the note survives
    again = copy.SerializeToString()
    assert read_change(again, pb.Entity.FromString(again)) == change


def test_an_entity_without_a_note_changed_everything_it_carries() -> None:
    entity = to_wire("E", "T", "", "/", {"x": attr(1), "y": attr(2)})
    change = read_change(entity.SerializeToString(), entity)
    assert change.alteration is Alteration.CHANGE
    assert change.changed == {"x", "y"}


@pytest.mark.parametrize(
    ("change", "condition", "metadata", "fires"),
    [
        (Change(Alteration.CREATE, frozenset({"a"})), (), True, True),
        (Change(Alteration.CHANGE, frozenset({"a"})), ("b",), True, False),
        (Change(Alteration.CHANGE, frozenset(), frozenset({"b"})), ("b",), True, True),
        (Change(Alteration.CHANGE, frozenset(), frozenset({"b"})), ("b",), False, False),
        (Change(Alteration.UPDATE, requested=frozenset({"b"})), ("b",), True, True),
        (Change(Alteration.UPDATE, requested=frozenset({"a"})), ("b",), True, False),
        (Change(Alteration.DELETE), ("b",), True, True),
    ],
)
def test_when_a_change_fires(
    change: Change, condition: tuple[str, ...], metadata: bool, fires: bool
) -> None:
    assert change.fires(condition, metadata) is fires


@pytest.mark.parametrize(
    ("entries", "host", "allowed"),
    [
        ((), "127.0.0.1", True),
        ((), "127.9.9.9", True),
        ((), "::1", True),
        ((), "localhost", True),
        ((), "10.0.0.1", False),
        ((), "example.com", False),
        (("10.0.0.0/8",), "10.2.3.4", True),
        (("receiver.example.com",), "receiver.example.com", True),
        (("*.example.com",), "a.b.example.com", True),
        (("*.example.com",), "example.com.evil.org", False),
        (("*",), "anything.org", True),
    ],
)
def test_allow_list(entries: tuple[str, ...], host: str, allowed: bool) -> None:
    assert AllowList.parse(entries).allows(host) is allowed


def test_allow_list_refuses_nonsense() -> None:
    with pytest.raises(InvalidInput, match="not a CIDR"):
        AllowList.parse(["http://x/"])


ALLOW = AllowList.parse()
BASE: dict[str, Any] = {
    "subject": {"entities": [{"idPattern": ".*", "type": "Room"}]},
    "notification": {"http": {"url": "http://localhost:1234/n"}},
}


def test_subscription_defaults() -> None:
    parsed = parse_document(BASE, ALLOW)
    assert parsed.alterations == (Alteration.CREATE, Alteration.CHANGE)
    assert parsed.attrs_format is AttrsFormat.NORMALIZED
    assert (parsed.status, parsed.throttling, parsed.expires) == ("active", 0.0, None)
    assert parsed.channel.timeout == 5.0


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"subject": {"entities": [{"id": "a"}], "condition": {"jexlExpression": "x"}}}, NotServed),
        (
            {
                "subject": {
                    "entities": [{"id": "a"}],
                    "condition": {"expression": {"georel": "near"}},
                }
            },
            InvalidInput,
        ),
        (
            {
                "notification": {
                    "httpCustom": {"url": "http://localhost/", "payload": "x", "json": {}}
                }
            },
            InvalidInput,
        ),
        (
            {"notification": {"http": {"url": "http://localhost/", "timeout": 1_800_001}}},
            InvalidInput,
        ),
        ({"notification": {"http": {"url": "http://localhost/"}, "covered": True}}, InvalidInput),
        (
            {"notification": {"httpCustom": {"url": "http://localhost/", "method": "BREW"}}},
            InvalidInput,
        ),
        ({"description": "x" * 1025}, InvalidInput),
        ({"throttling": float("nan")}, InvalidInput),
        ({"throttling": float("inf")}, InvalidInput),
        ({"throttling": 10**400}, InvalidInput),  # float() of it raised OverflowError
        (
            {"subject": {"entities": [{"id": "a"}], "condition": {"alterationTypes": ["x"]}}},
            InvalidInput,
        ),
    ],
)
def test_subscription_refusals(change: dict[str, Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        parse_document({**BASE, **change}, ALLOW)


@pytest.mark.parametrize(
    ("epoch", "shown"),
    [
        (0.0, "1970-01-01T00:00:00.000Z"),
        (1.5, "1970-01-01T00:00:01.500Z"),
        (-62135596800.0, "0001-01-01T00:00:00.000Z"),  # %Y wrote "1-01-01"
        (parse_iso8601("0001-01-01T00:00:00+01:00"), "0001-01-01T00:00:00.000Z"),  # year 0
        (parse_iso8601("9999-12-31T23:59:59-01:00"), "9999-12-31T23:59:59.000Z"),  # year 10000
    ],
)
def test_timestamps_are_shown_within_the_calendar(epoch: float | None, shown: str) -> None:
    """An ``expires`` whose offset takes it past year 1 or 9999 is kept; showing it made
    every GET /v2/subscriptions of its tenant a 500."""
    assert epoch is not None
    assert iso(epoch) == shown


def test_a_patch_replaces_top_level_fields() -> None:
    document = merged(BASE, {"throttling": 5})
    assert parse_document(document, ALLOW).throttling == 5.0
    with pytest.raises(InvalidInput):
        merged(BASE, {})
    with pytest.raises(InvalidInput):
        merged(BASE, {"id": "other"})


def test_a_refusal_asks_to_retry_after_a_second_and_other_errors_do_not() -> None:
    from broker.errors import Unavailable
    from broker.ngsi.request import error_response

    refused = error_response(Unavailable("no access point reachable within 5 s"))
    assert refused.status == 503 and refused.headers["Retry-After"] == "1"
    assert b'"error":"ServiceUnavailable"' in refused.body  # type: ignore[operator]
    assert "Retry-After" not in error_response(NotFound("no entity")).headers
