"""FIWARE's Python client, filip (``filip.clients.ngsi_v2.ContextBrokerClient``), used
unchanged against a real cluster with a context store: what a filip user writes reads back
as Orion would answer it, and a subscription made through filip notifies.

filip's registrations are tested in tests/ngsi/test_registrations.py (with a context
provider) and its MQTT subscriptions in tests/ngsi/test_mqtt.py (with a real mosquitto),
on those modules' clusters.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import pytest
from filip.clients.exceptions import BaseHttpClientException
from filip.clients.ngsi_v2 import ContextBrokerClient
from filip.models.base import FiwareHeader
from filip.models.ngsi_v2.base import EntityPattern, Expression, NamedMetadata
from filip.models.ngsi_v2.context import (
    ContextAttribute,
    ContextEntity,
    NamedContextAttribute,
    Query,
)
from filip.models.ngsi_v2.subscriptions import Http, Notification, Subject, Subscription

from broker.coordination.embedded import EmbeddedZooKeeper
from ngsi.conftest import Front, Receiver, started_front, tenant


@pytest.fixture(scope="module")
def front(
    zookeeper: EmbeddedZooKeeper, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Front]:
    """One cluster (with its context store) for the module; tests keep apart by tenant."""
    with started_front(zookeeper, tmp_path_factory, "filip") as served:
        yield served


@pytest.fixture
def client(front: Front) -> Iterator[ContextBrokerClient]:
    """A filip client of the front, on a tenant of its own and service path ``/filip``."""
    header = FiwareHeader(service=tenant(), service_path="/filip")
    with ContextBrokerClient(url=f"http://{front.host}:{front.port}", fiware_header=header) as cb:
        yield cb


def room(entity_id: str, temperature: float, floor: int, **more: Any) -> ContextEntity:
    """A Room as filip users build one."""
    return ContextEntity(
        id=entity_id,
        type="Room",
        temperature={"type": "Number", "value": temperature},
        floor={"type": "Integer", "value": floor},
        **more,
    )


def values(entity: ContextEntity) -> dict[str, Any]:
    """An entity's attributes as name: (type, value)."""
    return {a.name: (a.type, a.value) for a in entity.get_attributes()}


def test_the_client_accepts_the_version(client: ContextBrokerClient) -> None:
    assert client.get_version()["orion"]["version"]


def test_post_and_get_an_entity(
    client: ContextBrokerClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    label = NamedContextAttribute(
        name="label",
        type="Text",
        value="hall",
        metadata=[NamedMetadata(name="lang", type="Text", value="en")],
    )
    entity = room("Room1", 21.5, 3)
    entity.add_attributes([label])
    location = client.post_entity(entity)
    assert location == "/v2/entities/Room1?type=Room"
    got = client.get_entity("Room1", entity_type="Room")
    assert (got.id, got.type) == ("Room1", "Room")
    assert values(got) == {
        "temperature": ("Number", 21.5),
        "floor": ("Integer", 3),
        "label": ("Text", "hall"),
    }
    assert got.get_attribute("label").metadata["lang"].value == "en"
    # without the type: the one entity of that id
    assert client.get_entity("Room1") == got
    # keyValues through filip's models
    simple = client.get_entity("Room1", response_format="keyValues")
    assert simple.model_dump() == {
        "id": "Room1",
        "type": "Room",
        "temperature": 21.5,
        "floor": 3,
        "label": "hall",
    }
    attributes = client.get_entity_attributes("Room1", entity_type="Room")
    assert {n: (a.type, a.value) for n, a in attributes.items()} == values(got)
    assert client.get_attribute("Room1", "temperature").value == 21.5
    assert client.get_attribute_value("Room1", "temperature") == 21.5
    assert client.get_attribute_value("Room1", "label") == "hall"
    assert client.does_entity_exist("Room1", "Room")
    assert not client.does_entity_exist("Room2", "Room")
    assert not [r for r in caplog.records if r.name.startswith("filip")]


def test_entity_lists_by_type_q_and_id_pattern(client: ContextBrokerClient) -> None:
    for i in range(5):
        client.post_entity(room(f"Room{i}", 20.0 + i, i % 2))
    client.post_entity(ContextEntity(id="Car1", type="Car", speed={"type": "Number", "value": 80}))
    everything = client.get_entity_list()
    assert [e.id for e in everything] == ["Room0", "Room1", "Room2", "Room3", "Room4", "Car1"]
    rooms = client.get_entity_list(entity_types=["Room"])
    assert [e.id for e in rooms] == [f"Room{i}" for i in range(5)]
    warm = client.get_entity_list(entity_types=["Room"], q="temperature>21.5;floor==1")
    assert [e.id for e in warm] == ["Room3"]
    assert [e.id for e in client.get_entity_list(id_pattern="^Room[13]$")] == ["Room1", "Room3"]
    assert [e.id for e in client.get_entity_list(type_pattern="^C")] == ["Car1"]
    assert [e.id for e in client.get_entity_list(entity_ids=["Car1", "Room4"])] == [
        "Room4",
        "Car1",
    ]
    ordered = client.get_entity_list(entity_types=["Room"], order_by="!temperature", limit=2)
    assert [e.id for e in ordered] == ["Room4", "Room3"]
    plain = client.get_entity_list(entity_types=["Car"], response_format="keyValues")
    assert [e.model_dump() for e in plain] == [{"id": "Car1", "type": "Car", "speed": 80}]
    shown = client.get_entity_list(entity_ids=["Room2"], attrs=["floor"])
    assert values(shown[0]) == {"floor": ("Integer", 0)}
    assert client.get_entity_list(
        entity_types=["Room"], q="floor==1", response_format="values"
    ) == [
        [21.0, 1],
        [23.0, 1],
    ]
    # POST /v2/op/query
    found = client.query(
        query=Query(
            entities=[EntityPattern(idPattern="^Room", type="Room")],
            attrs=["temperature"],
            expression=Expression(q="floor==0"),
        )
    )
    assert [(e.id, values(e)) for e in found] == [
        ("Room0", {"temperature": ("Number", 20.0)}),
        ("Room2", {"temperature": ("Number", 22.0)}),
        ("Room4", {"temperature": ("Number", 24.0)}),
    ]


def test_the_list_pages_past_a_thousand(client: ContextBrokerClient) -> None:
    entities = [
        ContextEntity(id=f"S{i:04d}", type="Sensor", v={"type": "Number", "value": i})
        for i in range(1005)
    ]
    client.update(entities=entities, action_type="append")
    got = client.get_entity_list(entity_types=["Sensor"])
    assert [e.id for e in got] == [e.id for e in entities]
    assert len(client.get_entity_list(entity_types=["Sensor"], limit=7)) == 7


def test_updates(client: ContextBrokerClient) -> None:
    client.post_entity(room("Room1", 21.0, 1))
    # POST .../attrs: update temperature, append humidity
    client.update_or_append_entity_attributes(
        "Room1",
        [
            NamedContextAttribute(name="temperature", type="Number", value=22.0),
            NamedContextAttribute(name="humidity", type="Number", value=40),
        ],
        entity_type="Room",
    )
    # PATCH .../attrs: existing attributes only
    client.update_existing_entity_attributes(
        "Room1", {"floor": ContextAttribute(type="Integer", value=2)}, entity_type="Room"
    )
    # PUT .../attrs/{a}/value with a text/plain number
    client.update_attribute_value(entity_id="Room1", attr_name="humidity", value=45)
    client.update_attribute_value(entity_id="Room1", attr_name="floor", value=3, entity_type="Room")
    got = client.get_entity("Room1", entity_type="Room")
    assert values(got) == {
        "temperature": ("Number", 22.0),
        "floor": ("Integer", 3),
        "humidity": ("Number", 45),
    }
    # update_entity: POST .../attrs with every attribute of the model
    got.temperature.value = 23.5
    client.update_entity(got)
    assert client.get_attribute_value("Room1", "temperature", entity_type="Room") == 23.5
    # PUT .../attrs/{a}: one attribute replaced, metadata overridden (filip's default)
    client.update_entity_attribute(
        "Room1",
        NamedContextAttribute(
            name="humidity",
            type="Number",
            value=50,
            metadata=[NamedMetadata(name="source", type="Text", value="probe")],
        ),
        entity_type="Room",
    )
    humidity = client.get_attribute("Room1", "humidity", entity_type="Room")
    assert humidity.value == 50 and humidity.metadata["source"].value == "probe"
    # PUT .../attrs: every attribute replaced
    client.replace_entity_attributes(
        "Room1", [NamedContextAttribute(name="co2", type="Number", value=400)], entity_type="Room"
    )
    assert values(client.get_entity("Room1")) == {"co2": ("Number", 400)}
    # PATCH of an attribute the entity lacks: Orion's 422, through filip's exception
    with pytest.raises(BaseHttpClientException) as refused:
        client.update_existing_entity_attributes(
            "Room1", {"floor": ContextAttribute(type="Integer", value=2)}, entity_type="Room"
        )
    assert refused.value.response.status_code == 422
    # post_entity(update=True): the 422 of a second create, then PUT .../attrs
    client.post_entity(room("Room1", 19.0, 0), update=True)
    assert values(client.get_entity("Room1")) == {
        "temperature": ("Number", 19.0),
        "floor": ("Integer", 0),
    }
    # patch_entity: reads the entity, then sends what differs
    client.patch_entity(room("Room1", 18.0, 0))
    assert client.get_attribute_value("Room1", "temperature") == 18.0


def test_batch_update_and_delete(client: ContextBrokerClient) -> None:
    client.update(entities=[room("Room1", 20.0, 1), room("Room2", 21.0, 2)], action_type="append")
    client.update(
        entities=[
            ContextEntity(id="Room1", type="Room", temperature={"type": "Number", "value": 25.0})
        ],
        action_type="update",
    )
    client.update(
        entities=[ContextEntity(id="Room2", type="Room", co2={"type": "Number", "value": 1})],
        action_type="appendStrict",
    )
    got = {e.id: values(e) for e in client.get_entity_list(entity_types=["Room"])}
    assert got == {
        "Room1": {"temperature": ("Number", 25.0), "floor": ("Integer", 1)},
        "Room2": {"temperature": ("Number", 21.0), "floor": ("Integer", 2), "co2": ("Number", 1)},
    }
    # batch delete of one attribute, then of a whole entity
    client.update(
        entities=[ContextEntity(id="Room2", type="Room", co2={"type": "Number", "value": 1})],
        action_type="delete",
    )
    assert "co2" not in values(client.get_entity("Room2"))
    client.update(entities=[ContextEntity(id="Room2", type="Room")], action_type="delete")
    assert [e.id for e in client.get_entity_list()] == ["Room1"]
    client.delete_entity_attribute("Room1", "floor")
    assert values(client.get_entity("Room1")) == {"temperature": ("Number", 25.0)}
    client.delete_entity("Room1", entity_type="Room")
    assert client.get_entity_list() == []
    with pytest.raises(BaseHttpClientException) as missing:
        client.get_entity("Room1")
    assert missing.value.response.status_code == 404
    # delete_entities: batch delete of entities, whatever attributes they carry
    client.update(entities=[room("Room3", 1.0, 1), room("Room4", 2.0, 2)], action_type="append")
    client.delete_entities(client.get_entity_list())
    assert client.get_entity_list() == []


def test_entity_types(client: ContextBrokerClient) -> None:
    client.post_entity(room("Room1", 21.0, 1))
    client.post_entity(room("Room2", 22.0, 2))
    client.post_entity(ContextEntity(id="Car1", type="Car", speed={"type": "Number", "value": 80}))
    types = client.get_entity_types()
    assert types == [
        {"type": "Car", "attrs": {"speed": {"types": ["Number"]}}, "count": 1},
        {
            "type": "Room",
            "attrs": {"floor": {"types": ["Integer"]}, "temperature": {"types": ["Number"]}},
            "count": 2,
        },
    ]
    assert client.get_entity_types(options="values") == ["Car", "Room"]
    assert client.get_entity_type("Room")["count"] == 2


def test_a_subscription_through_filip_notifies(
    client: ContextBrokerClient, receiver: Receiver
) -> None:
    subscription = Subscription(
        description="warm rooms",
        subject=Subject(
            entities=[{"idPattern": "Room.*", "type": "Room"}],
            condition={"attrs": ["temperature"], "expression": {"q": "temperature>25"}},
        ),
        notification=Notification(
            http=Http(url=receiver.url()), attrs=["temperature", "floor"], attrsFormat="keyValues"
        ),
        throttling=0,
    )
    sid = client.post_subscription(subscription)
    assert len(sid) == 24
    # filip lists the subscriptions before creating one: the same one again is not created
    with pytest.warns(UserWarning, match="existed already"):
        assert client.post_subscription(subscription) == sid
    stored = client.get_subscription(sid)
    assert str(stored.subject.condition.expression.q) == "temperature>25"
    assert [s.id for s in client.get_subscription_list()] == [sid]
    client.post_entity(room("Room1", 20.0, 1))  # not warm: no notification
    client.update_attribute_value(entity_id="Room1", attr_name="temperature", value=26)
    (note,) = receiver.wait_for(1)
    assert note.body["subscriptionId"] == sid
    assert note.body["data"] == [{"id": "Room1", "type": "Room", "temperature": 26, "floor": 1}]
    headers = {k.lower(): v for k, v in note.headers.items()}
    assert headers["fiware-servicepath"] == "/filip"
    assert headers["fiware-service"] == client.fiware_headers.service
    client.delete_subscription(sid)
    assert client.get_subscription_list() == []
