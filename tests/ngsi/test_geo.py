"""Geographical queries and subscriptions end to end (issue 18): real processes, one cluster
for the module (the ``front`` fixture), each test in its own tenant.

The places: Madrid, a park 1.2 km east of its centre, Valencia (302 km from Madrid) as
GeoJSON, Barcelona (505 km), and an entity without a location, which no geographical query
takes. Sources of the answers: Orion's api, Geographical Queries (broker.store.geo).
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import urlencode

from ngsi.conftest import WAIT, Front, Receiver, tenant

PLACES = [
    {
        "id": "Madrid",
        "type": "City",
        "location": {"type": "geo:point", "value": "40.4168, -3.7038"},
    },
    {
        "id": "Park",
        "type": "Park",
        "location": {
            "type": "geo:polygon",
            "value": [
                "40.41, -3.69",
                "40.42, -3.69",
                "40.42, -3.68",
                "40.41, -3.68",
                "40.41, -3.69",
            ],
        },
    },
    {
        "id": "Valencia",
        "type": "City",
        "location": {
            "type": "geo:json",
            "value": {"type": "Point", "coordinates": [-0.3763, 39.4699]},
        },
    },
    {
        "id": "Barcelona",
        "type": "City",
        "location": {"type": "geo:point", "value": "41.3874, 2.1686"},
    },
    {"id": "Nowhere", "type": "City", "name": {"type": "Text", "value": "40.4168, -3.7038"}},
]
MADRID = "40.4168,-3.7038"


def _ids(front: Front, headers: dict[str, str], **params: str) -> list[str]:
    answer = front.call("GET", f"/v2/entities?{urlencode(params)}", headers=headers)
    assert answer.status == 200, answer
    return [e["id"] for e in answer.body]


def _error(front: Front, headers: dict[str, str], **params: str) -> str:
    answer = front.call("GET", f"/v2/entities?{urlencode(params)}", headers=headers)
    assert (answer.status, answer.body["error"]) == (400, "BadRequest"), answer
    description: str = answer.body["description"]
    return description


def test_geographical_queries(front: Front) -> None:
    h = {"Fiware-Service": tenant()}
    answer = front.call(
        "POST", "/v2/op/update", {"actionType": "append", "entities": PLACES}, headers=h
    )
    assert answer.status == 204, answer
    near = {"georel": "near;maxDistance:400000", "geometry": "point", "coords": MADRID}
    by_distance = _ids(front, h, **near, orderBy="geo:distance")
    assert by_distance == ["Madrid", "Park", "Valencia"]
    assert _ids(front, h, **near, orderBy="!geo:distance") == ["Valencia", "Park", "Madrid"]
    assert sorted(_ids(front, h, **near)) == ["Madrid", "Park", "Valencia"]
    assert _ids(front, h, **near, type="City", orderBy="geo:distance") == ["Madrid", "Valencia"]
    assert _ids(front, h, **{**near, "georel": "near;minDistance:400000"}) == ["Barcelona"]
    box = {"geometry": "box", "coords": "39,-1;42,3"}  # lat 39..42, lon -1..3: the east coast
    assert _ids(front, h, georel="coveredBy", **box, orderBy="id") == ["Barcelona", "Valencia"]
    assert _ids(
        front, h, georel="disjoint", geometry="box", coords="40,-4;41,-3.5", orderBy="id"
    ) == ["Barcelona", "Valencia"]  # not Nowhere: no location, no geographical match
    half = "40.415,-3.7;40.415,-3.685;40.43,-3.685;40.43,-3.7;40.415,-3.7"  # a park's corner
    assert _ids(front, h, georel="intersects", geometry="polygon", coords=half) == ["Park"]
    assert _ids(front, h, georel="coveredBy", geometry="polygon", coords=half) == []
    assert _ids(front, h, georel="equals", geometry="point", coords="41.3874,2.1686") == [
        "Barcelona"
    ]
    body = {
        "entities": [{"idPattern": "^[MV]"}],
        "expression": {"georel": "near;maxDistance:400000", "geometry": "point", "coords": MADRID},
    }
    answer = front.call("POST", "/v2/op/query?orderBy=!geo:distance&options=count", body, headers=h)
    assert answer.status == 200, answer
    assert [e["id"] for e in answer.body] == ["Valencia", "Madrid"]
    assert answer.header("Fiware-Total-Count") == "2"

    assert _error(front, h, georel="near", geometry="point", coords=MADRID) == (
        "Invalid query: georel /near/ without either minDistance nor maxDistance"
    )
    assert _error(front, h, georel="near;maxDistance:1", **box) == (
        "Invalid query: georel /near/ used with geometry different than point"
    )
    assert _error(front, h, georel="coveredBy", geometry="polygon", coords="0,0;0,1;1,1;1,0") == (
        "Invalid query: First and last point in polygon not the same"
    )
    assert _error(front, h, georel="coveredBy", geometry="box") == (
        "Invalid query: URI param /geometry/ used without /coords/"
    )
    assert _error(front, h, orderBy="geo:distance") == (
        "orderBy=geo:distance needs a georel=near query"
    )
    answer = front.call("POST", "/v2/op/query", {"expression": {"georel": "near"}}, headers=h)
    assert (answer.status, answer.body["error"]) == (400, "BadRequest"), answer


def _subscribe(front: Front, headers: dict[str, str], body: dict[str, Any]) -> str:
    answer = front.call("POST", "/v2/subscriptions", body, headers=headers)
    assert answer.status == 201, answer
    return (answer.header("Location") or "").rsplit("/", 1)[1]


def _move(front: Front, headers: dict[str, str], entity_id: str, where: str) -> None:
    entity = {"id": entity_id, "location": {"type": "geo:point", "value": where}}
    answer = front.call("POST", "/v2/entities?options=upsert", entity, headers=headers)
    assert answer.status == 204, answer


def test_a_near_subscription_notifies_a_moving_point_only_while_inside(
    front: Front, receiver: Receiver
) -> None:
    """A 1 km circle around (0, 0); the bus goes 2.2 km east, 556 m, 111 m, then 2.2 km
    again. A marker subscription, notified after, tells when every update was decided."""
    h = {"Fiware-Service": tenant()}
    expression = {"georel": "near;maxDistance:1000", "geometry": "point", "coords": "0,0"}
    circle = _subscribe(
        front,
        h,
        {
            "subject": {"entities": [{"id": "Bus"}], "condition": {"expression": expression}},
            "notification": {"http": {"url": receiver.url("/circle")}, "attrsFormat": "keyValues"},
        },
    )
    shown = front.call("GET", f"/v2/subscriptions/{circle}", headers=h).body
    assert shown["subject"]["condition"]["expression"] == expression
    marker = _subscribe(
        front,
        h,
        {
            "subject": {"entities": [{"id": "Marker"}]},
            "notification": {"http": {"url": receiver.url("/m")}},
        },
    )
    for where in ("0, 0.02", "0, 0.005", "0, 0.001", "0, 0.02"):
        _move(front, h, "Bus", where)
    _move(front, h, "Marker", "50, 50")
    deadline = time.monotonic() + WAIT
    while not any(n.path == "/m" for n in receiver.received()):
        assert time.monotonic() < deadline, "the marker's notification did not arrive"
        time.sleep(0.05)
    receiver.wait_for(3)
    got = [n.body for n in receiver.received() if n.path == "/circle"]
    assert [b["subscriptionId"] for b in got] == [circle, circle]
    assert sorted(b["data"][0]["location"] for b in got) == ["0, 0.001", "0, 0.005"]
    assert marker
