"""Delivery through real processes: exactly once, in order, exactly what the reference matches.

Every test starts its own cluster (real processes on the session's ZooKeeper, a fresh chroot
each), subscribes and publishes through :class:`broker.client.Client`, waits for every
publisher's end marker, and compares what each subscriber got with the reference matcher
(:func:`broker.matching.reference.subscription_matches`): no notification missing, none
duplicated, none extra, per-publisher order kept, the published entity carried.
"""

from __future__ import annotations

import dataclasses
import random

import pytest
from conftest import StartCluster
from strategies import RandomSource, draw_subscription, draw_update

from broker.bench.workloads.iot import iot_subscriptions, iot_updates
from broker.model.subscription import EntitySelector, Status, Subscription
from broker.model.update import ContextUpdate
from integration.conftest import (
    Recorder,
    assert_exact_delivery,
    publish_concurrently,
    subscriptions_held,
)


def _deal(items: list[Subscription], hands: int) -> list[list[Subscription]]:
    return [items[i::hands] for i in range(hands)]


@pytest.mark.parametrize("matchers", [1, 2, 3], ids=lambda n: f"{n}-matchers")
def test_w_iot_deliveries_are_exactly_the_reference_matches(
    start_cluster: StartCluster, matchers: int
) -> None:
    """W-IoT over 3 subscribers and 3 concurrent publishers: the same deliveries, whatever
    the number of matchers (each run is compared with the same oracle)."""
    cluster = start_cluster(matchers=matchers)
    # A small city, so that one update matches several subscriptions.
    subscriptions = iot_subscriptions(300, seed=7, stations=60)
    # A tenant of their own for every tenth subscription and update: tenants never mix.
    subscriptions = [
        s.replace(tenant="valencia") if i % 10 == 3 else s for i, s in enumerate(subscriptions)
    ]
    updates = [
        dataclasses.replace(u, tenant="valencia") if i % 10 == 7 else u
        for i, u in enumerate(iot_updates(1800, seed=11, stations=60))
    ]
    recorders = [
        Recorder(cluster.endpoints, "raw-0", raw=True),
        Recorder(cluster.endpoints, "queues-1", raw=False),
        Recorder(cluster.endpoints, "raw-2", raw=True),
    ]
    try:
        for recorder, hand in zip(recorders, _deal(subscriptions, 3), strict=True):
            recorder.subscribe(hand)
        held = subscriptions_held(cluster)
        assert held["matcher"] == held["connection-point"] == len(subscriptions) + 3
        published = publish_concurrently(
            cluster.endpoints, [updates[i::3] for i in range(3)], prefix=f"iot{matchers}"
        )
        counts = []
        for recorder in recorders:
            recorder.wait_for_markers(p.publisher for p in published)
            counts.append(assert_exact_delivery(recorder, published))
    finally:
        for recorder in recorders:
            recorder.close()
    assert min(counts) > 500, f"too few matches to prove anything: {counts}"


def test_random_subscriptions_and_odd_updates_match_as_the_reference(
    start_cluster: StartCluster,
) -> None:
    """Tenants, service paths and scopes, id and type patterns, q and mq on odd values
    (dates two ways, numbers as text, -0.0, nulls, objects, dotted names) from the shared
    property-test vocabularies, drawn with a fixed seed."""
    cluster = start_cluster(matchers=2)
    source = RandomSource(random.Random(20240301))
    subscriptions = [
        # The wire carries no status, and the vocabulary's expiry times are in the past.
        draw_subscription(source, f"r{i}").replace(status=Status.ACTIVE, expires=None)
        for i in range(160)
    ]
    updates = [draw_update(source) for _ in range(800)]
    assert {u.tenant for u in updates} == {s.tenant for s in subscriptions} == {"", "madrid", "x_1"}
    assert len({u.service_path for u in updates}) >= 4
    raw = Recorder(cluster.endpoints, "raw", raw=True)
    queues = Recorder(cluster.endpoints, "queues", raw=False)
    try:
        raw.subscribe(subscriptions[::2])
        queues.subscribe(subscriptions[1::2])
        published = publish_concurrently(
            cluster.endpoints, [updates[::2], updates[1::2]], prefix="odd", batch_size=37
        )
        counts = []
        for recorder in (raw, queues):
            recorder.wait_for_markers(p.publisher for p in published)
            counts.append(assert_exact_delivery(recorder, published))
    finally:
        raw.close()
        queues.close()
    assert min(counts) > 1000, f"too few matches to prove anything: {counts}"


def test_a_subscriber_gets_one_notification_per_matching_subscription(
    start_cluster: StartCluster,
) -> None:
    cluster = start_cluster(matchers=2)
    overlapping = [
        Subscription(id="by-type", entities=(EntitySelector(id_pattern=".*", type="Room"),)),
        Subscription(id="by-id", entities=(EntitySelector(id="Room1"),), q="temperature>20"),
        Subscription(
            id="by-pattern",
            entities=(EntitySelector(id_pattern="^Room", type_pattern="Ro"),),
            condition_attrs=("temperature",),
        ),
        Subscription(id="never", entities=(EntitySelector(id="Room1"),), q="temperature<0"),
    ]
    recorder = Recorder(cluster.endpoints, "one", raw=False)
    try:
        handles = recorder.subscribe(overlapping)
        published = publish_concurrently(
            cluster.endpoints,
            [[ContextUpdate.of("Room1", {"temperature": 30}, entity_type="Room")]],
            prefix="overlap",
        )
        recorder.wait_for_markers(p.publisher for p in published)
        assert_exact_delivery(recorder, published)
        got = {
            h.id: [
                (r.publisher, r.sequence) for r in recorder.received() if r.subscription_id == h.id
            ]
            for h in handles
        }
        assert got == {
            "by-type": [("overlap-0", 1)],
            "by-id": [("overlap-0", 1)],
            "by-pattern": [("overlap-0", 1)],
            "never": [],
        }
    finally:
        recorder.close()


def test_unsubscribe_stops_delivery_and_the_others_keep_theirs(
    start_cluster: StartCluster,
) -> None:
    cluster = start_cluster(matchers=2)
    rooms = EntitySelector(id_pattern=".*", type="Room")

    def room(i: int) -> ContextUpdate:
        return ContextUpdate.of(f"Room{i}", {"temperature": 20 + i}, entity_type="Room")

    leaving = Recorder(cluster.endpoints, "leaving", raw=True)  # raw: sees any stray handle
    staying = Recorder(cluster.endpoints, "staying", raw=False)
    try:
        handles = leaving.subscribe(
            [
                Subscription(id="dropped", entities=(rooms,)),
                Subscription(id="kept", entities=(rooms,)),
            ]
        )
        staying.subscribe([Subscription(id="other", entities=(rooms,))])
        before = publish_concurrently(cluster.endpoints, [[room(i) for i in range(5)]], prefix="a")
        for recorder in (leaving, staying):
            recorder.wait_for_markers(["a-0"])
            assert_exact_delivery(recorder, before)
        assert subscriptions_held(cluster)["matcher"] == 5  # 3 + two end-marker subscriptions

        leaving.unsubscribe("dropped")
        dropped = handles[0]
        assert dropped.closed
        with pytest.raises(StopIteration):
            dropped.get(timeout=5)  # its iterator has ended
        held = subscriptions_held(cluster)
        assert held["matcher"] == held["connection-point"] == 4

        after = publish_concurrently(
            cluster.endpoints, [[room(i) for i in range(5, 9)]], prefix="b"
        )
        for recorder in (leaving, staying):
            recorder.wait_for_markers(["b-0"])
        # compared with the subscriptions each holds now: "dropped" must get none of "b"
        assert_exact_delivery(staying, [*before, *after])
        late = [r for r in leaving.received() if r.publisher == "b-0"]
        assert sorted({r.subscription_id for r in late}) == ["kept", "leaving-end"]
        assert len([r for r in late if r.subscription_id == "kept"]) == 4
    finally:
        leaving.close()
        staying.close()
