"""Subscriptions: construction validates selectors, options and the filter."""

from __future__ import annotations

from typing import Any

import pytest

from broker.errors import (
    InvalidIdentifier,
    InvalidInput,
    InvalidRegex,
    InvalidSubscription,
    QuerySyntaxError,
    mapping_for,
)
from broker.model.subscription import (
    MAX_SELECTORS,
    EntitySelector,
    NotificationOptions,
    Status,
    Subscription,
)

ANY = (EntitySelector(id_pattern=".*"),)


def test_defaults_and_parsed_filter() -> None:
    subscription = Subscription("s1", ANY, q="temp>20;name=^Pla")
    assert subscription.service_path == "/#"
    assert subscription.status is Status.ACTIVE
    assert len(subscription.filter.q) == 2
    assert subscription.filter.mq == ()


def test_replace_validates_again() -> None:
    subscription = Subscription("s1", ANY, q="temp>20")
    changed = subscription.replace(q="temp<5", status=Status.INACTIVE)
    assert changed.q == "temp<5" and changed.status is Status.INACTIVE
    assert changed.filter != subscription.filter
    with pytest.raises(QuerySyntaxError):
        subscription.replace(q="temp=>5")


def test_match_all_selectors() -> None:
    assert EntitySelector(id_pattern=".*").any_id
    assert not EntitySelector(id="x").any_id
    assert EntitySelector(id="x").any_type
    assert EntitySelector(id="x", type_pattern="^.*$").any_type
    assert not EntitySelector(id="x", type="T").any_type


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({}, "exactly one of id and idPattern"),
        ({"id": "a", "id_pattern": "a"}, "exactly one of id and idPattern"),
        ({"id": "a", "type": "T", "type_pattern": "T"}, "not both"),
    ],
)
def test_contradictory_selectors(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidSubscription, match=message):
        EntitySelector(**kwargs)


@pytest.mark.parametrize(
    "pattern", ["(", "[a-", "(a)\\1", "(?=x)y", "x{1001}", "a" * 1025, "(((a{100}){100}){100})"]
)
def test_patterns_that_do_not_compile_or_are_too_large(pattern: str) -> None:
    with pytest.raises(InvalidRegex):
        EntitySelector(id_pattern=pattern)
    with pytest.raises(InvalidRegex):
        Subscription("s", ANY, q=f"name~={pattern}")


def test_pathological_patterns_run_in_linear_time() -> None:
    # with a backtracking engine this search takes ages; RE2 answers at once
    from broker.query.regex import compile_pattern

    assert compile_pattern("^(a+)+$")("a" * 50_000 + "b") is None
    assert compile_pattern("(a|aa)+c")("a" * 50_000 + "b") is None
    assert compile_pattern("(a+)+b")("a" * 50_000 + "b") is not None


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"entities": ()}, InvalidSubscription, "at least one entity selector"),
        ({"entities": [EntitySelector(id="a")]}, InvalidSubscription, "at least one"),
        ({"entities": ANY * (MAX_SELECTORS + 1)}, InvalidSubscription, "at most"),
        ({"entities": ("x",)}, InvalidSubscription, "not an EntitySelector"),
        ({"id": ""}, InvalidIdentifier, "subscription id"),
        ({"tenant": "Bad"}, InvalidIdentifier, "tenant"),
        ({"service_path": "/a/#/b"}, InvalidIdentifier, "service path"),
        ({"condition_attrs": ("ok", "not ok")}, InvalidIdentifier, "condition attribute"),
        ({"description": "x" * 1025}, InvalidSubscription, "description"),
        ({"expires": "tomorrow"}, InvalidSubscription, "expires"),
        ({"q": "temp=5"}, QuerySyntaxError, "unknown operator"),
        ({"q": "temp>"}, QuerySyntaxError, "column"),
        ({"q": "t>1;;u<2"}, QuerySyntaxError, "column"),
        ({"q": "'unterminated"}, QuerySyntaxError, "column"),
        ({"q": "a" * 5000}, QuerySyntaxError, "4096"),
        ({"mq": "temp"}, QuerySyntaxError, "mq"),
    ],
)
def test_invalid_subscriptions(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    fields: dict[str, Any] = {"id": "s1", "entities": ANY} | kwargs
    with pytest.raises(error, match=message) as caught:
        Subscription(**fields)
    assert isinstance(caught.value, InvalidInput)
    assert mapping_for(caught.value).grpc_status == "INVALID_ARGUMENT"
    assert mapping_for(caught.value).http_status == 400


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"attrs": ("a",), "except_attrs": ("b",)}, "not both"),
        ({"covered": True}, "explicit attrs"),
        ({"throttling": -1.0}, "negative"),
        ({"max_fails_limit": 0}, "at least 1"),
        ({"attrs": ("bad name",)}, "notification attribute"),
    ],
)
def test_invalid_notification_options(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        NotificationOptions(**kwargs)


def test_syntax_errors_carry_the_column() -> None:
    with pytest.raises(QuerySyntaxError) as caught:
        Subscription("s1", ANY, q="temp>20;pressure=>3")
    assert caught.value.column >= 9
    assert caught.value.expression
