"""The context store layer with real processes: two fronts, one entity state (issue 17).

- Writes spread over two HTTP fronts read back identically through both, with two store
  processes (the partitions divided between them), and again after the cluster stops and
  starts on the same state directory; so does the history the stores recorded of them
  (STH-Comet's ``lastN``, docs/history.md).
- A PATCH through the front that did not create the entity finds it; a subscription whose
  ``q`` names an attribute the update did not carry fires whichever front took the update.
- kill -9 of a store: writes of its partitions wait, then answer 503 (never a 2xx for a
  write that is not durable); once the store is back, every write answered 2xx is there
  (the oracle), and the store serves again.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ngsi.conftest import Answer, Front, Receiver, fronts_of

from broker.cluster import ClusterSpec, LocalCluster
from broker.coordination.embedded import EmbeddedZooKeeper
from broker.runtime.options import Role
from broker.store.entities import partition_of
from broker.store.layout import StoreLayout

pytestmark = pytest.mark.slow


def _spec(zookeeper: EmbeddedZooKeeper, state: Path, name: str, **fields: Any) -> ClusterSpec:
    return ClusterSpec(
        **{
            "zk": zookeeper.address,
            "cluster": name,
            "grpc_port": 0,
            "http_port": 0,
            "connection_points": 2,
            "context_stores": 2,
            "matchers": 1,
            "state_dir": state,
            **fields,
        }
    )


def _entities(front: Front, **headers: str) -> list[dict[str, Any]]:
    got: list[dict[str, Any]] = []
    offset = 0
    while True:
        answer = front.call("GET", f"/v2/entities?limit=1000&offset={offset}", headers=headers)
        assert answer.status == 200, answer
        got.extend(answer.body)
        if len(answer.body) < 1000:
            return sorted(got, key=lambda e: (e["id"], e["type"]))
        offset += 1000


def _ok(answer: Answer) -> Answer:
    assert answer.status in (200, 201, 204), answer
    return answer


def test_writes_through_two_fronts_read_the_same_through_both_and_after_a_restart(
    zookeeper: EmbeddedZooKeeper, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    name = f"cs-{uuid.uuid4().hex[:8]}"
    rng = random.Random(7)
    model: dict[str, dict[str, Any]] = {}  # the test's own model of what Orion would store
    history: dict[str, list[int]] = {}  # each entity's values of t, as they changed
    with LocalCluster(_spec(zookeeper, state, name, store_history=True)) as cluster:
        a, b = fronts_of(cluster)
        for i in range(120):
            front = rng.choice((a, b))
            entity_id = f"Room{rng.randrange(30)}"
            value = rng.randrange(100)
            if entity_id not in model or rng.random() < 0.2:
                body = {"id": entity_id, "type": "Room", "t": {"type": "Number", "value": value}}
                _ok(front.call("POST", "/v2/entities?options=upsert", body))
                model.setdefault(entity_id, {"id": entity_id, "type": "Room"})
                model[entity_id]["t"] = {"type": "Number", "value": value, "metadata": {}}
                _changed(history.setdefault(entity_id, []), value)
            elif rng.random() < 0.5:
                # PATCH without a type, through either front: the store finds the entity
                patch = {"t": {"type": "Number", "value": value}}
                _ok(front.call("PATCH", f"/v2/entities/{entity_id}/attrs", patch))
                model[entity_id]["t"] = {"type": "Number", "value": value, "metadata": {}}
                _changed(history[entity_id], value)
            else:
                inc = {"n": {"type": "Number", "value": {"$inc": 1}}}
                _ok(front.call("POST", f"/v2/entities/{entity_id}/attrs", inc))
                old = model[entity_id].get("n", {"value": 0})["value"]
                number = 1 if "n" not in model[entity_id] else old + 1
                model[entity_id]["n"] = {"type": "Number", "value": number, "metadata": {}}
            del i
        expected = sorted(model.values(), key=lambda e: e["id"])
        assert _entities(a) == expected
        assert _entities(b) == expected
        some = expected[0]
        one = b.call("GET", f"/v2/entities/{some['id']}?options=keyValues")
        assert one.status == 200 and one.body["t"] == some["t"]["value"]
        counted = a.call("GET", "/v2/entities?type=Room&options=count&limit=1")
        assert counted.headers.get("Fiware-Total-Count") == str(len(expected))
        types = a.call("GET", "/v2/types")
        assert types.status == 200 and [t["type"] for t in types.body] == ["Room"]
        assert _history(b, some["id"]) == history[some["id"]]
    with LocalCluster(
        _spec(zookeeper, state, name, connection_points=1, store_history=True)
    ) as cluster:
        (again,) = fronts_of(cluster)
        assert _entities(again) == expected
        assert {e: _history(again, e) for e in history} == history  # durable, as the entities


def _changed(values: list[int], value: int) -> None:
    """Record ``value`` as a change of t (a write of the same value changes nothing)."""
    if not values or values[-1] != value:
        values.append(value)


def _history(front: Front, entity_id: str) -> list[int]:
    """The values of t the stores recorded for ``entity_id``, oldest first."""
    path = f"/STH/v1/contextEntities/type/Room/id/{entity_id}/attributes/t?lastN=100"
    answer = front.call("GET", path)
    assert answer.status == 200, answer
    rows = answer.body["contextResponses"][0]["contextElement"]["attributes"][0]["values"]
    return [row["attrValue"] for row in rows]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """An HTTP receiver of notifications (tests/ngsi's)."""
    served = Receiver()
    try:
        yield served
    finally:
        served.close()


def test_a_q_subscription_fires_on_an_update_through_the_other_front(
    zookeeper: EmbeddedZooKeeper, tmp_path: Path, receiver: Receiver
) -> None:
    spec = _spec(zookeeper, tmp_path / "state", f"cs-{uuid.uuid4().hex[:8]}")
    with LocalCluster(spec) as cluster:
        a, b = fronts_of(cluster)
        subscription = {
            "subject": {
                "entities": [{"idPattern": ".*", "type": "Room"}],
                "condition": {"attrs": ["t"], "expression": {"q": "floor==3"}},
            },
            "notification": {"http": {"url": receiver.url()}, "attrs": ["t", "floor"]},
        }
        _ok(a.call("POST", "/v2/subscriptions", subscription))
        room = {
            "id": "R1",
            "type": "Room",
            "floor": {"type": "Number", "value": 3},
            "t": {"type": "Number", "value": 20},
        }
        _ok(a.call("POST", "/v2/entities", room))
        (created,) = receiver.wait_for(1)
        # through the other front, an update that does not carry `floor`: Orion evaluates q
        # on the whole entity, so it fires
        _ok(b.call("PATCH", "/v2/entities/R1/attrs", {"t": {"type": "Number", "value": 21}}))
        notes = receiver.wait_for(2)
        data = notes[-1].body["data"][0]
        assert data["t"]["value"] == 21 and data["floor"]["value"] == 3
        # an entity on another floor does not fire, whichever front
        other = {**room, "id": "R2", "floor": {"type": "Number", "value": 4}}
        _ok(b.call("POST", "/v2/entities", other))
        _ok(a.call("PATCH", "/v2/entities/R2/attrs", {"t": {"type": "Number", "value": 5}}))
        # a last update that fires: one subscription's notifications leave in order, so
        # once it is in, anything R2 had fired would be in before it
        _ok(b.call("PATCH", "/v2/entities/R1/attrs", {"t": {"type": "Number", "value": 22}}))
        notes = receiver.wait_for(3)
        assert len(notes) == 3 and notes[-1].body["data"][0]["t"]["value"] == 22
        del created


def _kill_store(cluster: LocalCluster, number: int) -> None:
    (store,) = [
        p
        for p in cluster.description["processes"]
        if p["role"] == Role.CONTEXT_STORE.value and p["log"].endswith(f"-{number}.log")
    ]
    os.kill(store["pid"], signal.SIGKILL)


def _write(front: Front, i: int, acknowledged: dict[str, int], *, upsert: bool = False) -> int:
    body = {"id": f"E{i}", "type": "T", "v": {"type": "Number", "value": i}}
    answer = front.call("POST", "/v2/entities" + ("?options=upsert" if upsert else ""), body)
    if answer.status in (201, 204):
        acknowledged[f"E{i}"] = i
    else:
        assert answer.status == 503, answer
        assert answer.body["error"] == "ServiceUnavailable"
    return answer.status


@contextlib.contextmanager
def _one_front(
    zookeeper: EmbeddedZooKeeper, tmp_path: Path, *, replicas: int
) -> Iterator[tuple[LocalCluster, Front]]:
    """A cluster of 2 stores (``replicas`` each partition) and one HTTP front."""
    name = f"cs-{uuid.uuid4().hex[:8]}"
    spec = _spec(zookeeper, tmp_path / "state", name, connection_points=1, replicas=replicas)
    with LocalCluster(spec) as cluster:
        (front,) = fronts_of(cluster)
        yield cluster, front


def _wait_reads(front: Front) -> None:
    deadline = time.monotonic() + 30
    while front.call("GET", "/v2/entities?limit=1").status != 200:
        assert time.monotonic() < deadline, "the stores do not serve"
        time.sleep(0.2)


def test_with_one_replica_a_killed_store_refuses_then_serves_all_it_acknowledged(
    zookeeper: EmbeddedZooKeeper, tmp_path: Path
) -> None:
    with _one_front(zookeeper, tmp_path, replicas=1) as (cluster, front):
        acknowledged: dict[str, int] = {}
        for i in range(60):
            assert _write(front, i, acknowledged) == 201
        _kill_store(cluster, 1)
        layout = StoreLayout(1, ("store-1", "store-2"), replicas=1)
        on_dead = [
            i for i in range(60, 200) if layout.holder(partition_of("", f"E{i}")) == "store-1"
        ]
        on_live = [i for i in range(60, 200) if i not in on_dead]
        for i in on_dead[:2]:  # refused after the front's 5 s wait for a primary
            assert _write(front, i, acknowledged) == 503
        for i in on_live[:5]:  # the other store's partitions serve on
            assert _write(front, i, acknowledged) == 201
        reads = front.call("GET", "/v2/entities?limit=1000")
        assert reads.status == 503  # a list needs every partition: refused, not partial
        cluster.replace(Role.CONTEXT_STORE, 1)
        _wait_reads(front)
        found = {e["id"]: e["v"]["value"] for e in _entities(front)}
        assert found == acknowledged  # nothing acknowledged lost, nothing refused applied
        assert _write(front, on_dead[0], acknowledged, upsert=True) == 204


def test_with_two_replicas_a_killed_store_loses_nothing_and_recovers_what_it_missed(
    zookeeper: EmbeddedZooKeeper, tmp_path: Path
) -> None:
    with _one_front(zookeeper, tmp_path, replicas=2) as (cluster, front):
        acknowledged: dict[str, int] = {}
        for i in range(40):
            assert _write(front, i, acknowledged) == 201
        _kill_store(cluster, 1)  # its partitions fail over to store-2, which has them all
        for i in range(40, 100):
            assert _write(front, i, acknowledged) == 201
        assert {e["id"]: e["v"]["value"] for e in _entities(front)} == acknowledged
        cluster.replace(Role.CONTEXT_STORE, 1)  # out of sync: it copies what it missed
        for i in range(100, 140):  # while it recovers
            assert _write(front, i, acknowledged) == 201
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError):
                data = cluster.description and _store_states(cluster)
                if data == {"store-1": "serving", "store-2": "serving"}:
                    break
            assert time.monotonic() < deadline, f"store-1 does not recover: {data}"
            time.sleep(0.2)
        _kill_store(cluster, 2)  # now store-1 alone must hold every acknowledged write
        for i in range(140, 160):
            assert _write(front, i, acknowledged) == 201
        assert {e["id"]: e["v"]["value"] for e in _entities(front)} == acknowledged
        assert len(acknowledged) == 160


def _store_states(cluster: LocalCluster) -> dict[str, str]:
    from broker.coordination.client import connect
    from broker.store.layout import LayoutWatch

    client = connect(cluster.zk_address, cluster=cluster.spec.cluster, timeout=10.0)
    try:
        view = LayoutWatch(client).view
        return {s: view.states[s] for s in view.states if s in view.in_sync}
    finally:
        client.stop()
        client.close()
