"""``silbo admin scale context-stores N`` with real processes, while a writer and a reader run.

- 1 -> 2 -> 1 stores (one replica each partition: every partition moves on its own copy)
  while a writer upserts and ``$inc``s with an oracle of every acknowledged write and a
  reader reads one entity: after each scale every entity reads back as acknowledged (the
  counters exact), the reader never failed, and after a restart of the cluster too.
- 2 -> 3 -> 2 stores with two replicas of each partition (`silbo up`'s default), under the
  same writer and reader, then a store killed: nothing acknowledged lost. An aggregation
  group (sensors -> buildings, 1 s tumbling windows) runs through both scales: the windows
  written (the last notification of each) count every acknowledged sensor value once
  (docs/aggregation.md "Scaling with the stores").
- A new store that hangs during its copy: the scale is rolled back, nothing acknowledged
  is lost, the cluster serves on with its old stores.
- Bad arguments are refused with a message, and leave the cluster serving.
"""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from ngsi.conftest import Front, Receiver, fronts_of, tenant

from broker.cli import main
from broker.cluster import LocalCluster
from broker.coordination.client import connect
from broker.coordination.embedded import EmbeddedZooKeeper
from broker.roles.store_scaling import registrations
from broker.runtime.options import Role
from broker.store.layout import SCALE, read_store_layout
from integration.test_context_store import _entities, _kill_store, _spec

pytestmark = pytest.mark.slow

ENTITIES = 30


class _Writer(threading.Thread):
    """Upserts and ``$inc``s round the entities; keeps what each acknowledged answer means."""

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True)
        self.front = Front(address)
        self.values: dict[str, int] = {}
        self.counters: dict[str, int] = {}
        self.refused = 0
        self._done = threading.Event()

    def run(self) -> None:
        i = 0
        while not self._done.is_set():
            entity = f"E{i % ENTITIES}"
            body = {"id": entity, "type": "T", "v": {"type": "Number", "value": i}}
            if self._ok(self.front.call("POST", "/v2/entities?options=upsert", body)):
                self.values[entity] = i
                inc = {"n": {"type": "Number", "value": {"$inc": 1}}}
                if self._ok(self.front.call("POST", f"/v2/entities/{entity}/attrs", inc)):
                    self.counters[entity] = self.counters.get(entity, 0) + 1
            i += 1

    def _ok(self, answer: Any) -> bool:
        if answer.status in (201, 204):
            return True
        assert answer.status == 503, answer  # refused: not applied
        self.refused += 1
        return False

    def stop(self) -> None:
        self._done.set()
        self.join(30)

    def check(self, front: Front) -> None:
        found = {e["id"]: e for e in _entities(front)}
        assert {k: e["v"]["value"] for k, e in found.items()} == self.values
        assert {k: e["n"]["value"] for k, e in found.items() if "n" in e} == self.counters


class _Reader(threading.Thread):
    """Reads one entity and a list over and over; counts what did not answer 200."""

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True)
        self.front = Front(address)
        self.failed: list[int] = []
        self.reads = 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.is_set():
            for path in ("/v2/entities/E0", "/v2/entities?limit=5"):
                status = self.front.call("GET", path).status
                self.reads += 1
                if status != 200:
                    self.failed.append(status)
            time.sleep(0.01)

    def stop(self) -> None:
        self._done.set()
        self.join(30)


class _Sensors(threading.Thread):
    """Sends sensor values (batches of one, four sensors in two buildings) on a tenant of
    its own; keeps the count and sum of the acknowledged ones per building, and each
    sensor's acknowledged values in order (an alert rule watches them)."""

    GROUP: Any = {
        "id": "building-temperature",
        "entities": {"type": "Sensor"},
        "groupBy": [{"attribute": "refBuilding", "type": "Building"}],
        "attributes": ["temperature"],
        "functions": ["count", "sum"],
        "window": {"type": "tumbling", "size": "1s"},
    }
    RULE: Any = {
        "id": "hot",
        "entities": {"type": "Sensor"},
        "attribute": "temperature",
        "condition": {"above": 5, "clearBelow": 3},
    }

    def __init__(self, address: str) -> None:
        super().__init__(daemon=True)
        self.front = Front(address)
        self.headers = {"Fiware-Service": tenant()}
        self.acknowledged: dict[str, list[int]] = {}  # building: [count, sum]
        self.values: dict[str, list[int]] = {}  # sensor: its acknowledged values, in order
        self.receiver = Receiver()
        self._done = threading.Event()

    def define(self) -> None:
        """The group, the rule, and a subscription on the buildings and one on the alerts;
        returns once the group counts."""
        for kind in ("Building", "Alert"):
            subscription = {
                "subject": {"entities": [{"idPattern": ".*", "type": kind}]},
                "notification": {"http": {"url": self.receiver.url()}},
            }
            made = self.front.call("POST", "/v2/subscriptions", subscription, headers=self.headers)
            assert made.status == 201, made
        made = self.front.call("POST", "/v2/x/alerts", self.RULE, headers=self.headers)
        assert made.status == 201, made
        made = self.front.call("POST", "/v2/x/aggregations", self.GROUP, headers=self.headers)
        assert made.status == 201, made
        path = "/v2/x/aggregations/building-temperature"
        since = self.front.call("GET", path, headers=self.headers).body["since"]
        while time.time() < datetime.fromisoformat(since).timestamp():
            time.sleep(0.05)

    def run(self) -> None:
        i = 0
        while not self._done.is_set():
            sensor, value = f"S{i % 4}", i % 7 + 1
            building = f"B{i % 2}"
            entity = {
                "id": sensor,
                "type": "Sensor",
                "temperature": {"type": "Number", "value": value},
                "refBuilding": {"type": "Relationship", "value": building},
            }
            batch = {"actionType": "append", "entities": [entity]}
            answer = self.front.call("POST", "/v2/op/update", batch, headers=self.headers)
            if answer.status == 204:
                total = self.acknowledged.setdefault(building, [0, 0])
                total[0] += 1
                total[1] += value
                self.values.setdefault(sensor, []).append(value)
            else:
                assert answer.status == 503, answer  # refused: not applied
            i += 1
            time.sleep(0.01)

    def stop(self) -> None:
        self._done.set()
        self.join(30)

    def windows(self) -> dict[str, list[int]]:
        """Per building, the count and sum over its windows, each as last notified."""
        last: dict[tuple[str, float], tuple[int, int]] = {}
        for notification in self.receiver.received():
            for entity in notification.body["data"]:
                if entity["type"] != "Building":
                    continue
                count = entity["temperature_count_1s"]
                end = count["metadata"]["aggregate"]["value"]["end"]
                total = entity["temperature_sum_1s"]["value"]
                last[(entity["id"], end)] = (count["value"], total)
        totals: dict[str, list[int]] = {}
        for (building, _end), (count, total) in last.items():
            into = totals.setdefault(building, [0, 0])
            into[0] += count
            into[1] += total
        return totals

    def check(self, timeout: float = 20.0) -> None:
        """Wait until the windows count every acknowledged value (at most ``timeout``)."""
        deadline = time.monotonic() + timeout
        while self.windows() != self.acknowledged and time.monotonic() < deadline:
            time.sleep(0.2)
        assert self.windows() == self.acknowledged, self._told()
        expected = self._transitions()
        while self._alerts() != expected and time.monotonic() < deadline:
            time.sleep(0.2)
        assert self._alerts() == expected, "alert transitions != the rule over the values"

    def _told(self) -> str:
        """What a failed check says: the totals, and each window notified more than once
        with the counts in arrival order (a count going down: a write overtaken; all
        equal: values that never reached the window)."""
        counts: dict[tuple[str, float], list[int]] = {}
        for notification in self.receiver.received():
            for entity in notification.body["data"]:
                if entity["type"] == "Building":
                    count = entity["temperature_count_1s"]
                    end = count["metadata"]["aggregate"]["value"]["end"]
                    counts.setdefault((entity["id"], end), []).append(count["value"])
        repeated = {f"{b} {e}": seen for (b, e), seen in sorted(counts.items()) if len(seen) > 1}
        return (
            f"windows (count, sum) {self.windows()} != acknowledged {self.acknowledged}; "
            f"{len(counts)} windows; notified more than once: {repeated}"
        )

    def _transitions(self) -> list[tuple[str, int, str]]:
        """The rule's transitions over each sensor's values (above 5 raises, below 3
        clears): (alert id, number, status)."""
        found = []
        for sensor, values in sorted(self.values.items()):
            raised, number = False, 0
            for value in values:
                if (not raised and value > 5) or (raised and value < 3):
                    raised, number = not raised, number + 1
                    found.append((f"Alert:hot:{sensor}", number, "raised" if raised else "cleared"))
        return found

    def _alerts(self) -> list[tuple[str, int, str]]:
        """The alert entities notified, as (id, transition, status), sorted (repeats kept)."""
        return sorted(
            (entity["id"], entity["transition"]["value"], entity["status"]["value"])
            for notification in self.receiver.received()
            for entity in notification.body["data"]
            if entity["type"] == "Alert"
        )


def _cluster(
    zookeeper: EmbeddedZooKeeper, tmp_path: Path, stores: int
) -> Iterator[tuple[LocalCluster, Any]]:
    """A cluster of ``stores`` stores, each partition on all of them, and one HTTP front,
    with E0 written."""
    spec = _spec(
        zookeeper,
        tmp_path / "state",
        f"ss-{uuid.uuid4().hex[:8]}",
        connection_points=1,
        context_stores=stores,
        replicas=stores,
    )
    with LocalCluster(spec) as cluster:
        (front,) = fronts_of(cluster)
        body = {"id": "E0", "type": "T", "v": {"type": "Number", "value": 0}}
        assert front.call("POST", "/v2/entities", body).status == 201
        yield cluster, front


@pytest.fixture
def one_store(zookeeper: EmbeddedZooKeeper, tmp_path: Path) -> Iterator[tuple[LocalCluster, Any]]:
    """One store (one replica)."""
    yield from _cluster(zookeeper, tmp_path, 1)


@pytest.fixture
def two_stores(zookeeper: EmbeddedZooKeeper, tmp_path: Path) -> Iterator[tuple[LocalCluster, Any]]:
    """Two stores holding every partition twice (replicas 2, `silbo up`'s default)."""
    yield from _cluster(zookeeper, tmp_path, 2)


def _scale(cluster: LocalCluster, count: int, *extra: str) -> int:
    state = str(cluster.state_dir)
    return main(["admin", "scale", "context-stores", str(count), "--state-dir", state, *extra])


def _stores(cluster: LocalCluster) -> list[str]:
    client = connect(cluster.zk_address, cluster=cluster.spec.cluster, timeout=10.0)
    try:
        layout = read_store_layout(client)
        assert layout is not None and not layout.previous
        return list(layout.stores)
    finally:
        client.stop()
        client.close()


def test_scale_out_and_in_under_writes_and_reads_loses_nothing(
    one_store: tuple[LocalCluster, Front], capsys: pytest.CaptureFixture[str]
) -> None:
    cluster, front = one_store
    writer, reader = _Writer(front.host + f":{front.port}"), _Reader(f"{front.host}:{front.port}")
    writer.values["E0"] = 0
    writer.start()
    reader.start()
    time.sleep(0.5)
    try:
        assert _scale(cluster, 2) == 0, capsys.readouterr()
        out = capsys.readouterr().out
        assert out.startswith("completed: context-stores 1 -> 2"), out
        assert _stores(cluster) == ["store-1", "store-2"]
        time.sleep(0.3)
        assert _scale(cluster, 1, "--json") == 0, capsys.readouterr()
        assert '"outcome": "completed"' in capsys.readouterr().out
        assert _stores(cluster) == ["store-1"]
        time.sleep(0.3)
    finally:
        writer.stop()
        reader.stop()
    assert reader.reads > 20 and reader.failed == []
    assert len(writer.values) == ENTITIES and writer.refused == 0
    writer.check(front)
    stores = [p for p in cluster.description["processes"] if p["role"] == "context-store"]
    assert len(stores) == 1
    cluster.stop()
    with LocalCluster(cluster.spec) as again:
        (front,) = fronts_of(again)
        writer.check(front)


def test_with_two_replicas_scale_out_and_in_then_a_kill_loses_nothing(
    two_stores: tuple[LocalCluster, Front], capsys: pytest.CaptureFixture[str]
) -> None:
    cluster, front = two_stores
    writer, reader = _Writer(f"{front.host}:{front.port}"), _Reader(f"{front.host}:{front.port}")
    sensors = _Sensors(f"{front.host}:{front.port}")
    sensors.define()
    writer.values["E0"] = 0
    writer.start()
    reader.start()
    sensors.start()
    time.sleep(0.5)
    try:
        assert _scale(cluster, 3) == 0, capsys.readouterr()
        assert capsys.readouterr().out.startswith("completed: context-stores 2 -> 3")
        assert _stores(cluster) == ["store-1", "store-2", "store-3"]
        time.sleep(0.3)
        assert _scale(cluster, 2) == 0, capsys.readouterr()
        assert capsys.readouterr().out.startswith("completed: context-stores 3 -> 2")
        assert _stores(cluster) == ["store-1", "store-2"]
        time.sleep(0.3)
        sensors.stop()
        assert sum(c for c, _s in sensors.acknowledged.values()) > 20
        sensors.check()  # before the kill: a killed store loses its open panes (documented)
        failed_before_kill = list(reader.failed)
        # every partition is on both stores again: one killed, the other serves them all
        _kill_store(cluster, 1)
        time.sleep(1.5)
    finally:
        writer.stop()
        reader.stop()
        sensors.stop()
        sensors.receiver.close()
    assert reader.reads > 20 and failed_before_kill == []
    assert len(writer.values) == ENTITIES
    writer.check(front)  # nothing acknowledged lost, the $inc counters exact


def test_a_new_store_that_hangs_during_its_copy_rolls_the_scale_back(
    one_store: tuple[LocalCluster, Front], capsys: pytest.CaptureFixture[str]
) -> None:
    cluster, front = one_store
    (added,) = cluster.add(Role.CONTEXT_STORE, 1)  # idle: the scale takes it
    client = connect(cluster.zk_address, cluster=cluster.spec.cluster, timeout=10.0)
    try:
        deadline = time.monotonic() + 20
        while registrations(client).get("store-2", None) is None:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        os.kill(added.pid, signal.SIGSTOP)  # hangs: it copies nothing, takes no shipment
        writer = _Writer(f"{front.host}:{front.port}")
        writer.values["E0"] = 0
        writer.start()
        try:
            assert _scale(cluster, 2, "--timeout", "6") == 1
            out = capsys.readouterr().out
            assert out.startswith("rolled back: context-stores 1 -> 2"), out
        finally:
            os.kill(added.pid, signal.SIGKILL)
            writer.stop()
        assert _stores(cluster) == ["store-1"]
        writer.check(front)
        assert front.call("GET", "/v2/entities/E0").status == 200
    finally:
        client.stop()
        client.close()


def test_bad_arguments_are_refused_and_the_cluster_serves_on(
    one_store: tuple[LocalCluster, Front], capsys: pytest.CaptureFixture[str]
) -> None:
    cluster, front = one_store
    assert _scale(cluster, 0) == 2
    assert "at least one context store" in capsys.readouterr().err
    client = connect(cluster.zk_address, cluster=cluster.spec.cluster, timeout=10.0)
    try:
        client.create(SCALE, b"", ephemeral=True)
        assert _scale(cluster, 2) == 2
        assert "is running" in capsys.readouterr().err
        client.delete(SCALE)
    finally:
        client.stop()
        client.close()
    other = f"none-{uuid.uuid4().hex[:8]}"  # a cluster with no store layer
    where = ["--zk", cluster.zk_address, "--cluster", other]
    assert main(["admin", "scale", "context-stores", "2", *where]) == 2
    assert "no context store layer" in capsys.readouterr().err
    assert _stores(cluster) == ["store-1"]
    assert front.call("GET", "/v2/entities/E0").status == 200
