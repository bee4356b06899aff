"""Matchers scaled out and back in while updates flow: nothing lost, duplicated or reordered.

A steady publisher runs through both scales; the subscriber's notifications are compared
with the reference matcher (``assert_exact_delivery``). The scale moves only the
subscriptions whose owner changes, and matching never pauses.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest
from conftest import StartCluster
from kazoo.client import KazooClient

from broker.bench.workloads.iot import iot_subscriptions, iot_updates
from broker.cluster import LocalCluster
from broker.coordination.client import connect
from broker.coordination.coordinator import scale_matchers
from broker.runtime.options import Role
from integration.conftest import (
    Recorder,
    SteadyPublisher,
    assert_exact_delivery,
    subscriptions_held,
)


def _matchers(cluster: LocalCluster) -> list[str]:
    return [m.name for m in cluster.members_of(Role.MATCHER)]


CHUNK = 2000  # subscriptions per Transfer call in test_a_large_part_moves_in_chunks


@pytest.mark.parametrize(("first", "peak"), [(2, 4), (1, 3)])
def test_matchers_scale_out_and_in_while_updates_flow(
    start_cluster: StartCluster, zk_of: list[KazooClient], first: int, peak: int
) -> None:
    cluster = start_cluster(matchers=first)
    zk = connect(cluster.zk_address, cluster=cluster.spec.cluster, timeout=10.0)
    zk_of.append(zk)
    subscriptions = iot_subscriptions(400, seed=5, stations=60)
    recorder = Recorder(cluster.endpoints, "raw", raw=True)
    try:
        recorder.subscribe(subscriptions)
        updates = iot_updates(12000, seed=9, stations=60)  # more than needed: stopped
        publishers = [
            SteadyPublisher(cluster.endpoints, f"steady-{i}", updates[i::2]) for i in range(2)
        ]
        for publisher in publishers:
            publisher.start()
        time.sleep(0.5)

        cluster.add(Role.MATCHER, peak - first)
        # Subscriptions made while the scale runs (their own tenant, published to once they
        # are acknowledged) are honoured after it.
        late = Recorder(cluster.endpoints, "late", raw=True)
        late_publisher: list[SteadyPublisher] = []

        def subscribe_late() -> None:
            late.subscribe(
                [
                    dataclasses.replace(s, id=f"late-{s.id}", tenant="late")
                    for s in subscriptions[:100]
                ]
            )
            late_updates = [dataclasses.replace(u, tenant="late") for u in updates[:400]]
            late_publisher.append(SteadyPublisher(cluster.endpoints, "late-pub", late_updates))
            late_publisher[0].start()

        during = threading.Thread(target=subscribe_late, daemon=True)
        during.start()
        out = scale_matchers(zk, _matchers(cluster), timeout=30.0)
        overlapped = any(p.is_alive() for p in publishers)
        during.join(30.0)
        assert out.outcome == "completed", out
        assert out.epoch == 2
        held = len(subscriptions) + 1 + 101  # end markers; the late ones and their marker
        # Only copies a new holder lacks move: each subscription has 2 holders (replicas),
        # so fewer than 2 per subscription, most of them to the new matchers.
        assert 0 < out.moved_subscriptions < 2 * held
        assert out.moved_bytes > 0
        assert subscriptions_held(cluster)["matcher"] == held

        back = scale_matchers(zk, _matchers(cluster)[:first], timeout=30.0)
        assert back.outcome == "completed", back
        assert back.epoch == 3
        assert overlapped, "the publishers finished before the scale"
        cluster.retire(_matchers(cluster)[first:])
        assert subscriptions_held(cluster)["matcher"] == held

        for publisher in publishers:
            publisher.stop()
        published = [p.finish() for p in publishers]
        published.append(late_publisher[0].finish())
        for which in (recorder, late):
            which.wait_for_markers(p.publisher for p in published)
        assert assert_exact_delivery(recorder, published) > 300
        assert assert_exact_delivery(late, published) > 50
    finally:
        recorder.close()
        late.close()


def test_a_second_scale_while_one_runs_is_rejected(
    start_cluster: StartCluster, zk_of: list[KazooClient]
) -> None:
    cluster = start_cluster(matchers=1)
    zk = connect(cluster.zk_address, cluster=cluster.spec.cluster, timeout=10.0)
    zk_of.append(zk)
    from broker.coordination.configuration import ClusterConfiguration
    from broker.coordination.scale import ScalePlan, begin, finish

    current = ClusterConfiguration(zk).read()
    assert current is not None
    begin(zk, ScalePlan.of(current.configuration, current.configuration.next(["x"])))
    try:
        other = connect(cluster.zk_address, cluster=cluster.spec.cluster, timeout=10.0)
        zk_of.append(other)
        outcome = scale_matchers(other, ["y"], timeout=5.0)
        assert outcome.outcome == "rejected"
        assert "another scale is running" in outcome.message
    finally:
        finish(zk)


def test_a_large_part_moves_in_chunks(
    start_cluster: StartCluster, zk_of: list[KazooClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    """1 -> 2 with more subscriptions than one Transfer chunk carries: the new matcher takes
    its part in over several chunks, and delivery stays exact throughout. The matchers send
    chunks of CHUNK subscriptions (SILBO_TRANSFER_CHUNK), so a few thousand take several."""
    monkeypatch.setenv("SILBO_TRANSFER_CHUNK", str(CHUNK))
    cluster = start_cluster(matchers=1)
    zk = connect(cluster.zk_address, cluster=cluster.spec.cluster, timeout=10.0)
    zk_of.append(zk)
    subscriptions = iot_subscriptions(400, seed=5, stations=60)
    bulk = [  # their own tenant, never published to: they only fill the parts
        dataclasses.replace(s, id=f"bulk-{s.id}", tenant="bulk")
        for s in iot_subscriptions(3 * CHUNK, seed=6, stations=60)
    ]
    recorder = Recorder(cluster.endpoints, "raw", raw=True)
    filler = Recorder(cluster.endpoints, "bulk", raw=True)
    try:
        recorder.subscribe(subscriptions)
        for start in range(0, len(bulk), 10_000):
            filler.subscribe(bulk[start : start + 10_000])
        updates = iot_updates(12000, seed=9, stations=60)
        publisher = SteadyPublisher(cluster.endpoints, "steady", updates)
        publisher.start()
        deadline = time.monotonic() + 30.0  # the scale starts under traffic
        while not recorder.received() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert recorder.received(), "nothing delivered before the scale"
        cluster.add(Role.MATCHER, 1)
        out = scale_matchers(zk, _matchers(cluster), timeout=60.0)
        assert out.outcome == "completed", out
        assert out.moved_subscriptions > 1.2 * CHUNK  # two chunks at least
        assert publisher.is_alive(), "the publisher finished before the scale"
        publisher.stop()
        published = publisher.finish()
        recorder.wait_for_markers([published.publisher])
        assert assert_exact_delivery(recorder, [published]) > 300
        held = len(subscriptions) + len(bulk) + 2  # and the two recorders' end markers
        deadline = time.monotonic() + 30.0  # the old matcher drops what moved in the background
        while subscriptions_held(cluster)["matcher"] != held and time.monotonic() < deadline:
            time.sleep(0.5)
        assert subscriptions_held(cluster)["matcher"] == held
    finally:
        recorder.close()
        filler.close()
