"""The reference semantics of matching, pinned case by case.

``subscription_matches`` is the definition the indexed engine is tested against, so these
cases hold the definition itself to the NGSI v2 rules (ngsi-v2.md sections 2-4): tenant
isolation, service-path scopes, entity selectors, condition attributes, status and expiry,
and filters on DateTime attributes.
"""

from __future__ import annotations

from typing import Any

import pytest
from strategies import NOW

from broker.errors import NotFound
from broker.matching.reference import ReferenceMatcher, selector_matches, subscription_matches
from broker.model.attribute import Attribute, Metadata
from broker.model.subscription import EntitySelector, Status, Subscription
from broker.model.update import ContextUpdate

ANY_ENTITY = (EntitySelector(id_pattern=".*"),)


def sub(**fields: Any) -> Subscription:
    """A subscription to every entity of the default tenant, with some fields changed."""
    fields.setdefault("entities", ANY_ENTITY)
    return Subscription(id="s1", **fields)


def update(
    values: dict[str, Any] | None = None,
    *,
    attributes: dict[str, Attribute] | None = None,
    **fields: Any,
) -> ContextUpdate:
    """An update of Room1 (type Room) at '/', with bare values or full attributes."""
    fields.setdefault("entity_type", "Room")
    if attributes is not None:
        return ContextUpdate(fields.pop("entity_id", "Room1"), attributes, **fields)
    return ContextUpdate.of(fields.pop("entity_id", "Room1"), values or {"temp": 20}, **fields)


def matches(subscription: Subscription, an_update: ContextUpdate) -> bool:
    return subscription_matches(subscription, an_update, NOW)


# -- tenants -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sub_tenant", "update_tenant", "expected"),
    [
        ("", "", True),
        ("madrid", "madrid", True),
        ("", "madrid", False),
        ("madrid", "", False),
        ("madrid", "x_1", False),
    ],
)
def test_tenants_are_isolated(sub_tenant: str, update_tenant: str, expected: bool) -> None:
    assert matches(sub(tenant=sub_tenant), update(tenant=update_tenant)) is expected


# -- service paths -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("scope", "path", "expected"),
    [
        ("/a/#", "/a", True),
        ("/a/#", "/a/b", True),
        ("/a/#", "/a/b/c", True),
        ("/a/#", "/a2", False),
        ("/a/#", "/", False),
        ("/a/#", "/b/a", False),
        ("/a/b/#", "/a", False),
        ("/a/b/#", "/a/b", True),
        ("/#", "/", True),
        ("/#", "/a", True),
        ("/#", "/a2/b", True),
        ("/a", "/a", True),
        ("/a", "/a/b", False),
        ("/a", "/a2", False),
        ("/a/b", "/a", False),
        ("/", "/", True),
        ("/", "/a", False),
    ],
)
def test_scopes(scope: str, path: str, expected: bool) -> None:
    assert matches(sub(service_path=scope), update(service_path=path)) is expected


def test_default_scope_is_everything() -> None:
    assert matches(sub(), update(service_path="/x/y/z"))


# -- entity selectors ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "entity_id", "entity_type", "expected"),
    [
        (EntitySelector(id="Room1"), "Room1", "Room", True),
        (EntitySelector(id="Room1"), "Room10", "Room", False),
        (EntitySelector(id="Room1"), "room1", "Room", False),
        # patterns are searched anywhere, not anchored
        (EntitySelector(id_pattern="oom"), "Room1", "Room", True),
        (EntitySelector(id_pattern="1"), "urn:a:1", "Room", True),
        (EntitySelector(id_pattern="^oom"), "Room1", "Room", False),
        (EntitySelector(id_pattern="Room[12]$"), "Room1", "Room", True),
        (EntitySelector(id_pattern="Room[12]$"), "Room10", "Room", False),
        (EntitySelector(id_pattern=".*"), "anything", "Whatever", True),
        (EntitySelector(id_pattern="^$"), "Room1", "Room", False),
        # type is exact, typePattern is searched
        (EntitySelector(id="Room1", type="Room"), "Room1", "Room", True),
        (EntitySelector(id="Room1", type="Room"), "Room1", "Rooms", False),
        (EntitySelector(id_pattern=".*", type="Room"), "Room1", "Thing", False),
        (EntitySelector(id_pattern=".*", type_pattern="^T"), "Room1", "Thing", True),
        (EntitySelector(id_pattern=".*", type_pattern="ing"), "Room1", "Thing", True),
        (EntitySelector(id_pattern=".*", type_pattern="^T"), "Room1", "Room", False),
        (EntitySelector(id_pattern="Room", type_pattern="Room|Thing"), "Room2", "Thing", True),
        (EntitySelector(id_pattern="Room", type_pattern="Room|Thing"), "urn:a:1", "Thing", False),
        # no type means any type
        (EntitySelector(id="Room1"), "Room1", "T2", True),
    ],
)
def test_selectors(
    selector: EntitySelector, entity_id: str, entity_type: str, expected: bool
) -> None:
    assert selector_matches(selector, entity_id, entity_type) is expected
    found = update(entity_id=entity_id, entity_type=entity_type)
    assert matches(sub(entities=(selector,)), found) is expected


@pytest.mark.parametrize(
    ("entity_id", "entity_type", "expected"),
    [
        ("Room1", "Room", True),  # the first selector
        ("urn:a:1", "Thing", True),  # the second
        ("Room2", "Room", False),  # neither: wrong id for the first, wrong type for the second
        ("urn:a:1", "Room", False),
    ],
)
def test_any_of_several_selectors(entity_id: str, entity_type: str, expected: bool) -> None:
    subscription = sub(
        entities=(
            EntitySelector(id="Room1"),
            EntitySelector(id_pattern="^urn:", type="Thing"),
        )
    )
    assert matches(subscription, update(entity_id=entity_id, entity_type=entity_type)) is expected


# -- condition attributes ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("condition", "values", "expected"),
    [
        ((), {"temp": 20}, True),  # empty: any attribute
        ((), {"other": 1}, True),
        (("temp",), {"temp": 20}, True),
        (("temp",), {"pressure": 1}, False),
        (("temp", "pressure"), {"pressure": 1}, True),  # any of them
        (("temp", "pressure"), {"name": "x", "temp": None}, True),  # null counts as carried
        (("temp", "pressure"), {"name": "x"}, False),
    ],
)
def test_condition_attributes(
    condition: tuple[str, ...], values: dict[str, Any], expected: bool
) -> None:
    assert matches(sub(condition_attrs=condition), update(values)) is expected


def test_empty_condition_matches_an_update_without_attributes() -> None:
    assert matches(sub(), update(attributes={}))
    assert not matches(sub(condition_attrs=("temp",)), update(attributes={}))


# -- status and expiry -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "expected"),
    [(Status.ACTIVE, True), (Status.ONESHOT, True), (Status.INACTIVE, False)],
)
def test_status(status: Status, expected: bool) -> None:
    assert matches(sub(status=status), update()) is expected


def test_inactive_never_matches_even_when_everything_else_does() -> None:
    subscription = sub(status=Status.INACTIVE, q="temp==20", expires=NOW + 3600)
    assert not matches(subscription, update({"temp": 20}))


@pytest.mark.parametrize(
    ("expires", "expected"),
    [
        (None, True),
        (NOW + 3600, True),
        (NOW + 0.001, True),
        (NOW, False),  # expired at exactly now
        (NOW - 1, False),
    ],
)
def test_expiry_against_now(expires: float | None, expected: bool) -> None:
    assert matches(sub(expires=expires), update()) is expected


def test_expiry_uses_the_given_clock() -> None:
    subscription = sub(expires=NOW)
    assert subscription_matches(subscription, update(), NOW - 10)
    assert not subscription_matches(subscription, update(), NOW + 10)


# -- filters on DateTime attributes ---------------------------------------------------------------


def dated(value: Any, type_: str = "DateTime") -> ContextUpdate:
    """An update whose ``date`` attribute holds ``value`` typed ``type_``."""
    return update(attributes={"date": Attribute(type_, value)})


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        ("date>2020-01-01T00:00:00Z", True),
        ("date<2020-01-01T00:00:00Z", False),
        ("date>=2020-06-01T12:00:00Z", True),
        ("date<=2020-06-01T12:00:00Z", True),
        ("date>2020-06-01T12:00:00Z", False),
        ("date==2020-06-01T12:00:00Z", True),
        ("date:2020-06-01T12:00:00Z", True),
        ("date==2020-06-01T13:00:00+01:00", True),  # the same instant, another offset
        ("date!=2020-06-01T12:00:00Z", False),
        ("date!=2021-01-01T00:00:00Z", True),
        ("date==2020-01-01T00:00:00Z..2021-01-01T00:00:00Z", True),
        ("date==2021-01-01T00:00:00Z..2022-01-01T00:00:00Z", False),
        ("date==2020-01-01,2020-06-01T12:00:00Z", True),
        ("date>2020-01-01", True),  # a date without a time is midnight UTC
        ("date>1577836800", True),  # a number compares with the epoch seconds
        ("date==1591012800", True),
        ("date=='2020-06-01T12:00:00Z'", False),  # a quoted string is not a date
        ("date~=2020", False),  # the value is a number, not a string
        ("date", True),
        ("!date", False),
    ],
)
def test_q_on_datetime_attribute(q: str, expected: bool) -> None:
    assert matches(sub(q=q), dated("2020-06-01T12:00:00Z")) is expected


@pytest.mark.parametrize("type_", ["DateTime", "ISO8601"])
def test_both_date_types_compare_as_dates(type_: str) -> None:
    assert matches(sub(q="date>2020-01-01T00:00:00Z"), dated("2020-06-01T12:00:00Z", type_))


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        ("date>2020-01-01T00:00:00Z", False),  # Text: a string, no date comparison
        ("date=='2020-06-01T12:00:00Z'", True),
        ("date==2020-06-01T12:00:00Z", False),
        ("date=^2020-06", True),
        ("date~=^2020", True),
    ],
)
def test_q_on_date_text_is_a_string(q: str, expected: bool) -> None:
    assert matches(sub(q=q), dated("2020-06-01T12:00:00Z", "Text")) is expected


def test_date_literal_compares_with_number_attribute() -> None:
    # 1577836800 is 2020-01-01T00:00:00Z: NUMBER and DATE literals both compare numerically
    assert matches(sub(q="temp==2020-01-01T00:00:00Z"), update({"temp": 1577836800}))
    assert matches(sub(q="temp<2020-01-02"), update({"temp": 1577836800}))


def test_null_datetime_attribute() -> None:
    empty = dated(None)
    assert matches(sub(q="date==null"), empty)
    assert not matches(sub(q="date>2020-01-01T00:00:00Z"), empty)
    assert matches(sub(q="date"), empty)


def test_mq_on_datetime_metadata() -> None:
    attribute = Attribute("Number", 20, {"ts": Metadata("DateTime", "2020-06-01T12:00:00Z")})
    carried = update(attributes={"temp": attribute})
    assert matches(sub(mq="temp.ts>2020-01-01T00:00:00Z"), carried)
    assert not matches(sub(mq="temp.ts<2020-01-01T00:00:00Z"), carried)
    assert matches(sub(mq="temp.ts==2020-01-01..2021-01-01"), carried)


# -- the matcher around the definition ------------------------------------------------------------


def test_reference_matcher_returns_every_matching_id() -> None:
    subscriptions = [
        Subscription(id="all", entities=ANY_ENTITY),
        Subscription(id="warm", entities=ANY_ENTITY, q="temp>25"),
        Subscription(id="cold", entities=ANY_ENTITY, q="temp<25"),
        Subscription(id="madrid", entities=ANY_ENTITY, tenant="madrid"),
        Subscription(id="off", entities=ANY_ENTITY, status=Status.INACTIVE),
    ]
    matcher = ReferenceMatcher(subscriptions)
    warm, cold = update({"temp": 30}), update({"temp": 10})

    assert matcher.match(warm, NOW) == {"all", "warm"}
    assert matcher.match(cold, NOW) == {"all", "cold"}
    assert matcher.match_batch([warm, cold], NOW) == [{"all", "warm"}, {"all", "cold"}]


def test_reference_matcher_add_replaces_and_remove_forgets() -> None:
    matcher = ReferenceMatcher([sub(q="temp>25")])
    assert matcher.match(update({"temp": 20}), NOW) == set()

    matcher.add(sub(q="temp<25"))
    assert len(matcher) == 1
    assert matcher.match(update({"temp": 20}), NOW) == {"s1"}

    assert matcher.remove("s1").q == "temp<25"
    assert "s1" not in matcher
    assert matcher.match(update({"temp": 20}), NOW) == set()
    with pytest.raises(NotFound):
        matcher.remove("s1")
