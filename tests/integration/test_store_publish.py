"""gRPC publishes through the context store (``Client(store=True)``, ``silbo publish
--store``), against a real cluster with a context store: the stored entity is what readers
get and what is matched (a ``q`` on an attribute the update did not carry fires), update
operators apply, an update that changes nothing is stored once, a refused entity is named
while the rest of its batch is stored, and a plain publish leaves the store alone."""

from __future__ import annotations

import queue
from typing import Any

import pytest
from conftest import StartCluster

from broker.cli import main
from broker.client import Client, Notification, SubscriptionHandle
from broker.errors import InvalidInput, NotFound, SilboError
from broker.model.update import ContextUpdate
from broker.wire import client_pb2 as pb

pytestmark = pytest.mark.slow


def _room(entity_id: str, **values: object) -> ContextUpdate:
    return ContextUpdate.of(entity_id, values, entity_type="Room", tenant="acme")


def _nothing_more(handle: SubscriptionHandle) -> None:
    with pytest.raises(queue.Empty):
        handle.get(timeout=1.0)


def _stored(client: Client, entity_id: str, tenant: str = "acme") -> dict[str, Any]:
    """The stored entity's attribute values (keyValues)."""
    entity = client.get_entity(entity_id, tenant=tenant, options="keyValues")
    return {k: v for k, v in entity.items() if k not in ("id", "type")}


def _values(notification: Notification) -> dict[str, object]:
    return {name: a.value for name, a in notification.update.attributes.items()}


def test_publishes_through_the_store_are_stored_merged_and_matched(
    start_cluster: StartCluster,
) -> None:
    cluster = start_cluster(matchers=2)
    endpoint = cluster.endpoints[0]
    with (
        Client(endpoint) as subscriber,
        Client(endpoint, store=True) as stored,
        Client(endpoint) as plain,
    ):
        on_pressure = subscriber.subscribe(type="Room", q="pressure==1", tenant="acme")
        stored.publish(_room("Room1", temperature=20, pressure=1, visits=0))
        first = on_pressure.get(timeout=30)
        assert _values(first) == {"temperature": 20, "pressure": 1, "visits": 0}
        # a partial update: the whole stored entity is published, so q on pressure fires
        stored.publish(_room("Room1", temperature=21))
        second = on_pressure.get(timeout=30)
        assert _values(second) == {"temperature": 21, "pressure": 1, "visits": 0}
        assert second.update.sequence > first.update.sequence
        # update operators apply at the store
        stored.publish(_room("Room1", visits={"$inc": 5}))
        assert _values(on_pressure.get(timeout=30))["visits"] == 5
        assert _stored(stored, "Room1") == {"temperature": 21, "pressure": 1, "visits": 5}
        # the same values again: stored once, notified as an update that changed nothing
        # (gRPC subscriptions have no alteration types: it is matched like any other)
        stored.publish(_room("Room1", temperature=21))
        assert _values(on_pressure.get(timeout=30))["temperature"] == 21
        # a plain publish is matched as sent and never stored
        plain.publish(_room("Room2", temperature=30, pressure=1))
        assert _values(on_pressure.get(timeout=30)) == {"temperature": 30, "pressure": 1}
        with pytest.raises(NotFound):
            plain.get_entity("Room2", tenant="acme")
        _nothing_more(on_pressure)
        # the command line: silbo publish --store
        command = ["publish", "--entity", "Lamp1", "--type", "Lamp", "--connect", endpoint]
        assert main([*command, "--store", "on=true", "watts:Number=40"]) == 0
        assert main([*command, "--store", "watts:Number=60"]) == 0
        assert _stored(plain, "Lamp1", tenant="") == {"on": True, "watts": 60}


def test_a_refused_entity_is_named_and_the_rest_of_its_batch_is_stored(
    start_cluster: StartCluster,
) -> None:
    cluster = start_cluster(matchers=1)
    endpoint = cluster.endpoints[0]
    with Client(endpoint) as subscriber, Client(endpoint, store=True) as stored:
        rooms = subscriber.subscribe(type="Room", tenant="acme")
        stored.publish(_room("Room1", name="hall"))
        assert rooms.get(timeout=30).update.entity_id == "Room1"
        batch = [_room("Room1", name={"$inc": 1}), _room("Room2", name="kitchen")]
        with pytest.raises(SilboError, match=r"refused 1 of the batch's entities.*entity 0"):
            stored.publish_many(batch)
        assert rooms.get(timeout=30).update.entity_id == "Room2"
        assert _stored(stored, "Room2") == {"name": "kitchen"}
        assert _stored(stored, "Room1") == {"name": "hall"}
        # an invalid entity refuses the whole batch before anything is stored
        bad = pb.Entity(id="Room4", type="Room", tenant="acme")
        bad.attributes.add(name="bad name", type="Number").value.number = 1
        with pytest.raises(InvalidInput, match="entity 1"):
            stored.publish_many([_room("Room3", name="attic"), bad])
        with pytest.raises(NotFound):
            stored.get_entity("Room3", tenant="acme")
        _nothing_more(rooms)
