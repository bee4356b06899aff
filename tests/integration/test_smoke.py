"""The shortest path through real processes: subscribe, publish, receive."""

from __future__ import annotations

import threading

from conftest import StartCluster

from broker.client import Client
from broker.model.update import ContextUpdate


def test_a_published_update_reaches_its_subscriber(start_cluster: StartCluster) -> None:
    cluster = start_cluster(matchers=2)
    with Client(cluster.endpoints) as client:
        room = client.subscribe(type="Room", q="temperature>25")
        client.publish(ContextUpdate.of("Room1", {"temperature": 30}, entity_type="Room"))
        client.publish(ContextUpdate.of("Room2", {"temperature": 20}, entity_type="Room"))
        client.publish(ContextUpdate.of("Room3", {"temperature": 26}, entity_type="Room"))
        got = [room.get(timeout=10).update for _ in range(2)]
    assert [(u.entity_id, u.sequence) for u in got] == [("Room1", 1), ("Room3", 3)]
    assert got[0].publisher == client.publisher
    # closed, a client's streams have ended: a call still open at the interpreter's exit is
    # cancelled by its garbage collection, which aborted a CI run's `silbo subscribe`
    for _ in range(5):
        other = Client(cluster.endpoints)
        other.subscribe(type="Room")
        other.publish(ContextUpdate.of("Room4", {"temperature": 30}, entity_type="Room"))
        other.close()
        readers = [t.name for t in threading.enumerate() if t.name.startswith("silbo-")]
        assert readers == [], readers
