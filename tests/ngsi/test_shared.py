"""HTTP subscriptions shared by every front and kept in ZooKeeper: any connection point lists,
reads, changes and deletes any of them; a connection point that is killed, stopped or scaled
in leaves its subscriptions to the others, status and all; a new one takes over when none is
left. Real processes, a real ZooKeeper, a real receiver.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from broker.cluster import ClusterSpec, LocalCluster
from broker.coordination.client import connect
from broker.coordination.coordinator import scale_layer
from broker.coordination.embedded import EmbeddedZooKeeper
from broker.coordination.http_subscriptions import FRONTS, OWNERS, STATUS, SUBSCRIPTIONS
from broker.ngsi.retry import ID_HEADER
from broker.runtime.options import Role
from ngsi.conftest import Front, Receiver, fronts_of, tenant
from ngsi.test_notifications import get, http_subscription, publish, subscribe, wait_until

# these tests start processes (ZooKeeper, silbo, a cluster)
pytestmark = pytest.mark.slow

ADOPTED = 40.0  # seconds for a dead front's session to end and its subscriptions be adopted


def _cluster(
    zookeeper: EmbeddedZooKeeper, root: Path, connection_points: int = 2
) -> tuple[LocalCluster, list[Front]]:
    name = f"shared-{uuid.uuid4().hex[:10]}"
    spec = ClusterSpec(
        zk=zookeeper.address,
        cluster=name,
        grpc_port=0,
        http_port=0,  # any free port: the fronts' addresses are read from ZooKeeper
        connection_points=connection_points,
        status_flush=0.2,
        state_dir=root / name,
    )
    cluster = LocalCluster(spec)
    cluster.start()
    return cluster, fronts_of(cluster)


@pytest.fixture(scope="module")
def pair(
    zookeeper: EmbeddedZooKeeper, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Front, Front]]:
    """One cluster with two fronts for the module's non-destructive tests."""
    cluster, (one, two) = _cluster(zookeeper, tmp_path_factory.mktemp("pair"))
    try:
        yield one, two
    finally:
        cluster.stop()


@pytest.fixture
def fresh(
    zookeeper: EmbeddedZooKeeper, tmp_path: Path
) -> Iterator[tuple[LocalCluster, list[Front]]]:
    """A cluster with two fronts of its own, for a test that kills or stops them."""
    cluster, fronts = _cluster(zookeeper, tmp_path)
    try:
        yield cluster, fronts
    finally:
        cluster.stop()


def _headers() -> dict[str, str]:
    return {"Fiware-Service": tenant(), "Fiware-ServicePath": "/"}


def _ids(answer_body: Any) -> list[str]:
    return [s["id"] for s in answer_body]


def _listed(front: Front, headers: dict[str, str], query: str = "") -> Any:
    answer = front.call("GET", f"/v2/subscriptions{query}", headers=headers)
    assert answer.status == 200, answer
    return answer


def _zk(cluster: LocalCluster) -> KazooClient:
    return connect(cluster.zk_address, cluster=cluster.spec.cluster, timeout=10.0)


def test_every_front_lists_every_subscription_oldest_first_with_paging(
    pair: tuple[Front, Front], receiver: Receiver
) -> None:
    one, two = pair
    headers = _headers()
    made = []
    for i in range(6):  # alternately at either front
        front = one if i % 2 == 0 else two
        made.append(subscribe(front, headers, http_subscription(receiver.url(f"/{i}"))))
    for front in (one, two):
        answer = _listed(front, headers, "?options=count&limit=1000")
        assert _ids(answer.body) == made
        assert answer.header("Fiware-Total-Count") == "6"
        assert _ids(_listed(front, headers, "?limit=2&offset=3").body) == made[3:5]
        assert _ids(_listed(front, headers, "?offset=5").body) == made[5:]
        assert _listed(front, headers, "?offset=6").body == []
    # another tenant sees none of them, at either front
    other = _headers()
    for front in (one, two):
        assert _listed(front, other, "?options=count").header("Fiware-Total-Count") == "0"


def test_a_subscription_is_read_changed_and_deleted_through_any_front(
    pair: tuple[Front, Front], receiver: Receiver
) -> None:
    one, two = pair
    headers = _headers()
    made = subscribe(one, headers, http_subscription(receiver.url(), description="at one"))
    assert get(two, headers, made) == get(one, headers, made)
    # another tenant cannot see it through the other front either
    assert two.call("GET", f"/v2/subscriptions/{made}", headers=_headers()).status == 404
    patched = two.call(
        "PATCH", f"/v2/subscriptions/{made}", {"description": "through two"}, headers=headers
    )
    assert patched.status == 204, patched
    assert get(one, headers, made)["description"] == "through two"
    bad = two.call("PATCH", f"/v2/subscriptions/{made}", {"status": "sleepy"}, headers=headers)
    assert bad.status == 400 and bad.body["error"] == "BadRequest", bad
    # delivery stays with the front that holds it, whichever front the update came through
    publish(two, headers, {"id": "Room1", "type": "Room", "t": {"value": 1, "type": "Number"}})
    [got] = receiver.wait_for(1)
    assert got.body["subscriptionId"] == made
    wait_until(lambda: get(two, headers, made)["notification"].get("timesSent") == 1, "counted")
    deleted = two.call("DELETE", f"/v2/subscriptions/{made}", headers=headers)
    assert deleted.status == 204, deleted
    for front in (one, two):
        gone = front.call("GET", f"/v2/subscriptions/{made}", headers=headers)
        assert gone.status == 404 and gone.body["error"] == "NotFound", gone
    missing = two.call("DELETE", f"/v2/subscriptions/{made}", headers=headers)
    assert missing.status == 404, missing
    for unknown in ("0" * 24, "..", "zookeeper", "a%00b", "A" * 24, "x" * 300):
        for method in ("GET", "DELETE"):
            answer = two.call(method, f"/v2/subscriptions/{unknown}", headers=headers)
            assert answer.status == 404 and answer.body["error"] == "NotFound", (unknown, answer)
    # a client cannot make a front pass a request on forever
    other = subscribe(one, headers, http_subscription(receiver.url()))
    looped = two.call("GET", f"/v2/subscriptions/{other}", headers={**headers, "Silbo-Hops": "2"})
    assert looped.status == 503 and looped.body["error"] == "ServiceUnavailable", looped


def _member(cluster: LocalCluster, front: Front) -> Any:
    """The connection point serving ``front`` (its /ngsi/fronts entry names its address)."""
    zk = _zk(cluster)
    try:
        for member in cluster.members_of(Role.CONNECTION_POINT):
            data, _stat = zk.get(f"{FRONTS}/{member.name}")
            if json.loads(data)["http"] == f"{front.host}:{front.port}":
                return member
    finally:
        zk.stop()
        zk.close()
    raise AssertionError(f"no connection point serves {front.port}")


def test_a_killed_front_leaves_its_subscriptions_with_their_status_to_the_other(
    fresh: tuple[LocalCluster, list[Front]], receiver: Receiver
) -> None:
    cluster, (one, two) = fresh
    headers = _headers()
    made = subscribe(one, headers, http_subscription(receiver.url(), throttling=0))
    oneshot = subscribe(one, headers, http_subscription(receiver.url("/once"), status="oneshot"))
    publish(one, headers, {"id": "R", "type": "Room", "t": {"value": 1, "type": "Number"}})
    receiver.wait_for(2)
    wait_until(lambda: get(one, headers, oneshot)["status"] == "inactive", "oneshot spent")

    def saved(subscription_id: str) -> dict[str, Any]:
        zk = _zk(cluster)
        try:
            return dict(json.loads(zk.get(f"{STATUS}/{subscription_id}")[0]))
        finally:
            zk.stop()
            zk.close()

    # timesSent counts a notification when it goes, lastSuccess when its answer came: a save
    # may fall between the two
    wait_until(
        lambda: saved(made).get("timesSent") == 1 and saved(made).get("lastSuccess") is not None,
        "the counters saved",
    )
    wait_until(lambda: saved(oneshot).get("status") == "inactive", "the spent oneshot saved")
    os.kill(_member(cluster, one).pid, signal.SIGKILL)

    def adopted() -> bool:
        return two.call("GET", f"/v2/subscriptions/{made}", headers=headers).status == 200

    wait_until(adopted, "adopted by the other front", ADOPTED)
    shown = get(two, headers, made)
    assert shown["notification"]["timesSent"] == 1
    assert "lastSuccess" in shown["notification"]
    assert get(two, headers, oneshot)["status"] == "inactive"  # it must not fire again
    publish(two, headers, {"id": "R", "type": "Room", "t": {"value": 2, "type": "Number"}})
    got = receiver.wait_for(3)
    assert [n.path for n in got].count("/once") == 1
    assert got[-1].body["data"][0]["t"]["value"] == 2
    wait_until(lambda: get(two, headers, made)["notification"]["timesSent"] == 2, "counted on")


def _delivery_workers(pid: int) -> list[int]:
    """The delivery workers process ``pid`` started (its children running delivery's main)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            command = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[1]) == pid and b"broker.ngsi.delivery" in command:
            found.append(int(stat.parent.name))
    return found


def _ended(pid: int) -> bool:
    """Whether ``pid`` has exited (a zombie not reaped yet counts: it sends nothing)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_a_killed_fronts_notifications_are_all_sent_once_by_its_worker_or_its_heir(
    fresh: tuple[LocalCluster, list[Front]], receiver: Receiver
) -> None:
    """A front is killed while its delivery worker holds a queue (a slow receiver), and
    updates go on through the other front until it adopts the subscription (once the dead
    one's ZooKeeper session ended). The orphaned worker sends what it held, in order, then
    exits; what the matchers matched for the dead front meanwhile was kept by the exit points
    and is replayed to the adopter (docs/failures.md): every update is notified once."""
    cluster, (one, two) = fresh
    headers = _headers()
    made = subscribe(one, headers, http_subscription(receiver.url()))

    def update(front: Front, value: int) -> None:
        entity = {"id": "R", "type": "Room", "t": {"value": value, "type": "Number"}}
        publish(front, headers, entity)

    count = 40
    receiver.script = [(204, {}, 0.075)] * count  # 3 s to take them all: a queue waits
    for value in range(count):
        update(one, value)
    # timesSent counts a notification once it went down the pipe to the worker: a kill loses
    # nothing in the connection point's memory from here
    wait_until(
        lambda: get(one, headers, made)["notification"].get("timesSent") == count,
        "every notification handed to the worker",
    )
    member = _member(cluster, one)
    [worker] = _delivery_workers(member.pid)
    os.kill(member.pid, signal.SIGKILL)  # the connection point alone: its worker lives on
    held = count - len(receiver.received())
    assert held > 0, "the worker held nothing when its connection point was killed"
    sent = count
    deadline = time.monotonic() + ADOPTED
    while two.call("GET", f"/v2/subscriptions/{made}", headers=headers).status != 200:
        assert time.monotonic() < deadline, "not adopted by the other front"
        update(two, sent)  # matched for the dead front: kept by the exit point
        sent += 1
        time.sleep(0.2)
    for _ in range(3):  # and after the adoption
        update(two, sent)
        sent += 1
    got = receiver.wait_for(sent)
    wait_until(lambda: _ended(worker), "the orphaned worker ends once it has sent it all", 5)
    values = [n.body["data"][0]["t"]["value"] for n in receiver.received()]
    assert sorted(values) == list(range(sent)), f"lost or repeated: {values}"
    assert [v for v in values if v < count] == list(range(count))  # the worker's, in order
    assert len({n.headers[ID_HEADER] for n in got}) == sent
    assert sent > count + 5, "the adoption came too soon to publish while it was pending"
    [log] = [p["log"] for p in cluster.description["processes"] if p["pid"] == member.pid]
    drained = re.search(r"(\d+) sent, 0 given up", Path(log).read_text())
    assert drained is not None and int(drained.group(1)) >= held  # (+ the one in flight)


def test_a_new_front_takes_over_when_every_front_died(
    fresh: tuple[LocalCluster, list[Front]], receiver: Receiver
) -> None:
    cluster, (one, two) = fresh
    headers = _headers()
    made = [subscribe(f, headers, http_subscription(receiver.url())) for f in (one, two)]
    for pid in [_member(cluster, front).pid for front in (one, two)]:
        os.kill(pid, signal.SIGKILL)
    zk = _zk(cluster)
    try:
        assert sorted(zk.get_children(SUBSCRIPTIONS)) == sorted(made)  # kept while none serve
        [third] = cluster.add(Role.CONNECTION_POINT, 1)
        [front] = fronts_of(cluster, [third])

        def owner(subscription_id: str) -> bytes:
            try:
                return bytes(zk.get(f"{OWNERS}/{subscription_id}")[0])
            except NoNodeError:  # a dead front's claim, gone with its session meanwhile
                return b""

        def owned() -> bool:
            return all(third.name.encode() in owner(i) for i in made)

        wait_until(owned, "every subscription claimed by the new front", ADOPTED)
    finally:
        zk.stop()
        zk.close()
    wait_until(lambda: _ids(_listed(front, headers).body) == made, "listed by the new front")
    publish(front, headers, {"id": "R", "type": "Room", "t": {"value": 7, "type": "Number"}})
    got = receiver.wait_for(2)
    assert sorted(n.body["subscriptionId"] for n in got) == sorted(made)


def test_a_stopped_front_gives_its_subscriptions_up(
    fresh: tuple[LocalCluster, list[Front]], receiver: Receiver
) -> None:
    cluster, (one, two) = fresh
    headers = _headers()
    made = subscribe(two, headers, http_subscription(receiver.url()))
    cluster.retire([_member(cluster, two).name])  # SIGTERM
    wait_until(
        lambda: one.call("GET", f"/v2/subscriptions/{made}", headers=headers).status == 200,
        "adopted",
    )
    publish(one, headers, {"id": "R", "type": "Room", "t": {"value": 3, "type": "Number"}})
    [got] = receiver.wait_for(1)
    assert got.body["subscriptionId"] == made


def test_scaling_connection_points_in_hands_subscriptions_over_without_gaps_or_duplicates(
    fresh: tuple[LocalCluster, list[Front]], receiver: Receiver
) -> None:
    cluster, (one, two) = fresh
    headers = _headers()
    made = [subscribe(two, headers, http_subscription(receiver.url(f"/{i}"))) for i in range(5)]
    stop = threading.Event()
    sent: list[int] = []

    def steady() -> None:
        value = 0
        while not stop.is_set():
            value += 1
            entity = {"id": "R", "type": "Room", "n": {"value": value, "type": "Number"}}
            publish(one, headers, entity)
            sent.append(value)
            time.sleep(0.01)

    staying, leaving = _member(cluster, one), _member(cluster, two)
    publisher = threading.Thread(target=steady, daemon=True)
    publisher.start()
    try:
        wait_until(lambda: len(receiver.received()) >= 50, "publishing before the scale")
        zk = _zk(cluster)
        try:
            outcome = scale_layer(zk, "connection-points", [staying.name], timeout=60)
        finally:
            zk.stop()
            zk.close()
        assert outcome.outcome == "completed", outcome
        after = len(sent)
        wait_until(lambda: len(sent) >= after + 50, "publishing after the scale")
    finally:
        stop.set()
        publisher.join(10)
    cluster.retire([leaving.name])
    # a marker last: once each subscription has it from the staying front, which sends a
    # subscription's notifications in order, nothing more can come (the leaving one stopped)
    marker = {"id": "R", "type": "Room", "n": {"value": -1, "type": "Number"}}
    publish(one, headers, marker)

    def marked() -> bool:
        paths = {n.path for n in receiver.received() if n.body["data"][0]["n"]["value"] == -1}
        return paths == {f"/{i}" for i in range(len(made))}

    wait_until(marked, "the marker notified to every subscription", 30)
    got = [n for n in receiver.received() if n.body["data"][0]["n"]["value"] != -1]
    for i, subscription_id in enumerate(made):
        values = sorted(n.body["data"][0]["n"]["value"] for n in got if n.path == f"/{i}")
        assert values == sent, f"subscription {subscription_id}: gaps or duplicates"
        assert {n.body["subscriptionId"] for n in got if n.path == f"/{i}"} == {subscription_id}
    for subscription_id in made:
        assert get(one, headers, subscription_id)["notification"]["timesSent"] >= 1
