"""Deciding in bulk which subscriptions a matched batch fires (broker.ngsi.firing)."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.ngsi.allow import AllowList
from broker.ngsi.change import Alteration, Change, with_change
from broker.ngsi.entity import to_wire
from broker.ngsi.firing import Firing
from broker.ngsi.subscriptions import HttpSubscription, parse_document
from broker.store.geo import location_of
from broker.wire import internal_pb2 as wire


def _subscription(number: int, **document: Any) -> HttpSubscription:
    body = {
        "subject": {"entities": [{"idPattern": ".*"}], **document.pop("subject", {})},
        "notification": {"http": {"url": "http://127.0.0.1:1/n"}},
        **document,
    }
    subscription = HttpSubscription(
        f"{number:024d}", "", "/#", parse_document(body, AllowList.parse())
    )
    subscription.number = number
    subscription.handle = 1000 + number
    return subscription


def _batch(changes: list[Change], pairs: list[tuple[int, int]]) -> wire.NotificationBatchOut:
    entities = [
        with_change(to_wire(f"E{i}", "T", "", "/", {}), change).SerializeToString()
        for i, change in enumerate(changes)
    ]
    return wire.NotificationBatchOut(
        entities=entities,
        handles=np.array([1000 + n for n, _i in pairs], dtype="<u8").tobytes(),
        entity_index=np.array([i for _n, i in pairs], dtype="<u4").tobytes(),
    )


def test_plain_and_one_by_one_subscriptions_fire_in_the_batchs_order() -> None:
    plain = _subscription(1)
    on_x = _subscription(2, subject={"condition": {"attrs": ["x"]}})
    throttled = _subscription(3, throttling=60)
    oneshot = _subscription(4, status="oneshot")
    deletes_only = _subscription(5, subject={"condition": {"alterationTypes": ["entityDelete"]}})
    by_handle = {s.handle: s for s in (plain, on_x, throttled, oneshot, deletes_only)}
    firing = Firing(by_handle)
    changes = [
        Change(Alteration.CHANGE, frozenset({"x"})),
        Change(Alteration.CHANGE, frozenset({"y"})),
        Change(Alteration.DELETE),
    ]
    pairs = [(n, i) for i in range(3) for n in (1, 2, 3, 4, 5, 99)]  # 99: unknown handle
    fired = firing.decide(_batch(changes, pairs), now=1000.0)
    assert fired is not None
    got = [(n, fired.entities[i]) for n, i in zip(fired.numbers, fired.indexes, strict=True)]
    entity = {data: position for position, data in enumerate(_batch(changes, []).entities)}
    assert [(n, entity[data]) for n, data in got] == [
        (1, 0), (2, 0), (3, 0), (4, 0),  # throttled and oneshot fire once
        (1, 1),  # y changed: not on_x's condition
        (5, 2),  # a delete fires only who asked for deletes
    ]  # fmt: skip
    assert dict((s.number, c) for s, c in fired.counts) == {1: 2, 2: 1, 3: 1, 4: 1, 5: 1}
    assert (plain.times_sent, plain.last_notification) == (2, 1000.0)
    assert oneshot.status == "inactive" and throttled.times_sent == 1


def test_a_subscription_made_inactive_since_is_left_out_and_the_arrays_made_again() -> None:
    a, b = _subscription(1), _subscription(2)
    firing = Firing({a.handle: a, b.handle: b})
    batch = _batch([Change(Alteration.CHANGE, frozenset({"x"}))], [(1, 0), (2, 0)])
    assert firing.decide(batch, now=1.0) is not None
    a.status = "inactive"  # the delivery worker's report, after the arrays were made
    fired = firing.decide(batch, now=2.0)
    assert fired is not None and fired.numbers == [2]
    assert [s.number for s, _c in fired.counts] == [2] and a.times_sent == 1
    fired = firing.decide(batch, now=3.0)
    assert fired is not None and fired.numbers == [2]
    firing.invalidate()
    a.status = "active"
    fired = firing.decide(batch, now=4.0)
    assert fired is not None and fired.numbers == [1, 2]
    assert firing.decide(_batch([Change(Alteration.UPDATE)], [(1, 0)]), now=5.0) is None


def test_a_geographical_subscription_fires_only_for_a_location_in_its_relation() -> None:
    """The whole entity's first geo attribute (not one marked ignoreType) decides."""
    near = _subscription(
        1,
        subject={
            "condition": {
                "expression": {
                    "georel": "near;maxDistance:1000",
                    "geometry": "point",
                    "coords": "0,0",
                }
            }
        },
    )
    assert near.parsed.geo is not None
    firing = Firing({near.handle: near})

    def located(*points: tuple[str, dict[str, Any]]) -> bytes:
        attributes = {
            f"p{n}": {"type": "geo:point", "value": value, "metadata": metadata}
            for n, (value, metadata) in enumerate(points)
        }
        attributes["name"] = {"type": "Text", "value": "0, 0", "metadata": {}}
        entity = to_wire("E", "T", "", "/", attributes)
        return with_change(entity, Change(Alteration.CHANGE, frozenset({"p0"}))).SerializeToString()

    ignored = {"ignoreType": {"type": "Boolean", "value": True}}
    entities = [
        located(("0, 0.005", {})),  # 556 m east: inside
        located(("0, 0.02", {})),  # 2.2 km: outside
        located(("0, 0.02", ignored), ("0, 0.001", {})),  # the second one is the location
        located(),  # no location: never
    ]
    batch = wire.NotificationBatchOut(
        entities=entities,
        handles=np.array([1001] * 4, dtype="<u8").tobytes(),
        entity_index=np.array([0, 1, 2, 3], dtype="<u4").tobytes(),
    )
    fired = firing.decide(batch, now=1.0)
    assert fired is not None
    assert [entities.index(fired.entities[i]) for i in fired.indexes] == [0, 2]
    assert near.times_sent == 2


def _near(number: int, lat: float, lon: float, meters: float, **document: Any) -> HttpSubscription:
    expression = {
        "georel": f"near;maxDistance:{meters!r}",
        "geometry": "point",
        "coords": f"{lat!r},{lon!r}",
    }
    return _subscription(number, subject={"condition": {"expression": expression}}, **document)


GRID = st.integers(-6, 6).map(lambda n: n / 100)  # about 1.1 km apart, around (0, 0)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(GRID, GRID, st.sampled_from([500.0, 1113.2, 2226.4, 5000.0])), max_size=30),
    st.lists(st.tuples(GRID, GRID), min_size=1, max_size=6),
    st.booleans(),
)
def test_the_geo_index_fires_exactly_what_checking_each_subscription_fires(
    circles: list[tuple[float, float, float]], points: list[tuple[float, float]], throttle: bool
) -> None:
    """Plain near subscriptions go through the index; the same with throttling (decided one
    by one) and a direct check of each filter must agree."""
    document = {"throttling": 1} if throttle else {}
    subscriptions = [
        _near(n, lat, lon, meters, **document) for n, (lat, lon, meters) in enumerate(circles)
    ]
    firing = Firing({s.handle: s for s in subscriptions})
    entities = [
        with_change(
            to_wire(
                f"E{i}",
                "T",
                "",
                "/",
                {"location": {"type": "geo:point", "value": f"{lat}, {lon}", "metadata": {}}},
            ),
            Change(Alteration.CHANGE, frozenset({"location"})),
        ).SerializeToString()
        for i, (lat, lon) in enumerate(points)
    ]
    pairs = [(s.number, i) for i in range(len(points)) for s in subscriptions]
    batch = wire.NotificationBatchOut(
        entities=entities,
        handles=np.array([1000 + n for n, _i in pairs], dtype="<u8").tobytes(),
        entity_index=np.array([i for _n, i in pairs], dtype="<u4").tobytes(),
    )
    fired = firing.decide(batch, now=1000.0)
    got = (
        []
        if fired is None
        else [
            (n, entities.index(fired.entities[i]))
            for n, i in zip(fired.numbers, fired.indexes, strict=True)
        ]
    )
    expected = []
    for n, i in pairs:
        geo = subscriptions[n].parsed.geo
        assert geo is not None
        lat, lon = points[i]
        if geo.matches(location_of("geo:point", f"{lat}, {lon}")):
            expected.append((n, i))
    if throttle:  # each fires at most once in a batch
        expected = [
            (n, i) for k, (n, i) in enumerate(expected) if n not in {m for m, _ in expected[:k]}
        ]
    assert got == expected
