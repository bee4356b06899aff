"""Exit points, access points and connection points scaled out and back in under load.

Each test runs steady publishers through a scale-out and a scale-in of one layer and checks
every recording subscriber against the reference matcher (``assert_exact_delivery``): each
expected notification exactly once, in per-publisher order. Subscriptions made during a
scale (on their own tenant, published to only after they are acknowledged) are honoured.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
from conftest import StartCluster
from kazoo.client import KazooClient

from broker.bench.workloads.iot import iot_subscriptions, iot_updates
from broker.cluster import LocalCluster
from broker.coordination.client import connect
from broker.coordination.configuration import ClusterConfiguration
from broker.coordination.coordinator import ScaleOutcome, scale_layer
from broker.model.subscription import Subscription
from broker.model.update import ContextUpdate
from broker.runtime.options import Role
from broker.wire import internal_pb2 as wire
from broker.wire import internal_pb2_grpc as wire_grpc
from integration.conftest import (
    Published,
    Recorder,
    SteadyPublisher,
    assert_exact_delivery,
    cluster_status,
    wait_until,
)

LATE_TENANT = "late"  # the subscriptions made during a scale, and the updates meant for them


def _zk(cluster: LocalCluster, zk_of: list[KazooClient]) -> KazooClient:
    client = connect(cluster.zk_address, cluster=cluster.spec.cluster, timeout=10.0)
    zk_of.append(client)
    return client


def _names(cluster: LocalCluster, role: Role) -> list[str]:
    return [m.name for m in cluster.members_of(role)]


def _addresses(cluster: LocalCluster, role: Role) -> list[str]:
    return [m.endpoint for m in cluster.members_of(role)]


def _late(subscriptions: list[Subscription]) -> list[Subscription]:
    return [dataclasses.replace(s, id=f"late-{s.id}", tenant=LATE_TENANT) for s in subscriptions]


def _late_updates(updates: list[ContextUpdate]) -> list[ContextUpdate]:
    return [dataclasses.replace(u, tenant=LATE_TENANT) for u in updates]


class _Scene:
    """Recorders and steady publishers spread over the connection points given."""

    def __init__(self, endpoints: list[list[str]], seed: int, extra: tuple[str, ...] = ()) -> None:
        """``extra``: more publishers (names) on the first endpoints, each with its own
        share of the updates."""
        self.subscriptions = iot_subscriptions(300, seed=seed, stations=50)
        names = [f"steady-{i}" for i in range(len(endpoints))] + list(extra)
        # more than needed: the publishers are stopped once the scales are over
        self.updates = iot_updates(6000 * len(names), seed=seed + 1, stations=50)
        self.recorders = [Recorder(e, f"rec-{i}") for i, e in enumerate(endpoints)]
        for recorder in self.recorders:
            recorder.subscribe(
                [dataclasses.replace(s, id=f"{recorder.name}-{s.id}") for s in self.subscriptions]
            )
        n = len(names)
        self.publishers = [
            SteadyPublisher(endpoints[i % len(endpoints)], name, self.updates[i::n])
            for i, name in enumerate(names)
        ]
        self.late: Recorder | None = None
        self.late_publisher: SteadyPublisher | None = None

    def start(self) -> None:
        for publisher in self.publishers:
            publisher.start()

    def subscribe_late(self, endpoints: list[str]) -> None:
        """Subscribe anew (meant to overlap a scale); publish to them once acknowledged."""
        self.late = Recorder(endpoints, "late")
        self.late.subscribe(_late(self.subscriptions[:100]))
        self.late_publisher = SteadyPublisher(
            endpoints, "late-publisher", _late_updates(self.updates[:600])
        )
        self.late_publisher.start()

    def check(self) -> None:
        for publisher in self.publishers:
            publisher.stop()
        published: list[Published] = [p.finish() for p in self.publishers]
        if self.late_publisher is not None:
            published.append(self.late_publisher.finish())
        recorders = [*self.recorders, *([self.late] if self.late else [])]
        for recorder in recorders:
            recorder.wait_for_markers(p.publisher for p in published)
            assert assert_exact_delivery(recorder, published) > 0
        assert self.late is None or len(self.late.received()) > 100

    def close(self) -> None:
        for recorder in [*self.recorders, *([self.late] if self.late else [])]:
            recorder.close()


def _scale_with_late_subscriptions(
    scene: _Scene, zk: KazooClient, layer: str, names: list[str], endpoints: list[str]
) -> ScaleOutcome:
    late = threading.Thread(target=scene.subscribe_late, args=(endpoints,), daemon=True)
    late.start()
    outcome = scale_layer(zk, layer, names, timeout=30.0)
    late.join(30.0)
    return outcome


def _epoch(zk: KazooClient) -> int:
    current = ClusterConfiguration(zk).read()
    assert current is not None
    return current.epoch


def test_exit_points_scale_out_and_in(
    start_cluster: StartCluster, zk_of: list[KazooClient]
) -> None:
    cluster = start_cluster(matchers=2)
    zk = _zk(cluster, zk_of)
    # the access points hash publishers over the serving exit points (crc32 % 2): every
    # "steady-N" goes to the first, "second-exit" to the second, all the time it serves
    scene = _Scene([cluster.endpoints], seed=21, extra=("second-exit",))
    try:
        scene.start()
        cluster.add(Role.EXIT_POINT, 1)
        out = _scale_with_late_subscriptions(
            scene, zk, "exit-points", _names(cluster, Role.EXIT_POINT), cluster.endpoints
        )
        assert out.outcome == "completed", out
        assert out.epoch == 2 and out.moved_subscriptions == 0 and out.no_matching_ms == 0
        second = _names(cluster, Role.EXIT_POINT)[1]

        def delivered() -> int:
            counters = {p["name"]: p["counters"] for p in cluster_status(cluster)["processes"]}
            return int(counters[second].get("items_out:notification", 0))

        wait_until(lambda: delivered() > 0, 30, "the second exit point delivering")
        back = scale_layer(zk, "exit-points", _names(cluster, Role.EXIT_POINT)[:1], timeout=30.0)
        assert back.outcome == "completed", back
        assert back.epoch == 3
        assert any(p.is_alive() for p in scene.publishers), "the publishers finished too soon"
        cluster.retire([second])
        scene.check()
        # each drained exit point waited until the connection point took its deliveries
        logs = [Path(p["log"]).read_text() for p in cluster.description["processes"]
                if p["role"] == Role.EXIT_POINT.value]  # fmt: skip
        confirmed = sum(log.count("(1 of 1 connection points confirmed") for log in logs)
        assert confirmed == 2, "a drained report without the connection point's confirmation"
    finally:
        scene.close()


def test_access_points_scale_out_and_in(
    start_cluster: StartCluster, zk_of: list[KazooClient]
) -> None:
    cluster = start_cluster(matchers=2, connection_points=3, grpc_port=0)
    zk = _zk(cluster, zk_of)
    scene = _Scene([[a] for a in cluster.endpoints], seed=31)
    try:
        scene.start()
        cluster.add(Role.ACCESS_POINT, 1)
        out = _scale_with_late_subscriptions(
            scene, zk, "access-points", _names(cluster, Role.ACCESS_POINT), cluster.endpoints[:1]
        )
        assert out.outcome == "completed", out
        assert out.epoch == 2 and out.moved_subscriptions == 0
        second = _names(cluster, Role.ACCESS_POINT)[1]
        back = scale_layer(zk, "access-points", _names(cluster, Role.ACCESS_POINT)[:1], timeout=30)
        assert back.outcome == "completed", back
        assert any(p.is_alive() for p in scene.publishers), "the publishers finished too soon"
        routed = {
            p["name"]: p["counters"].get("items_in:update", 0)
            for p in cluster_status(cluster)["processes"]
        }
        cluster.retire([second])
        scene.check()
        assert routed[second] > 0, "no connection point moved to the second access point"
        assert _epoch(zk) == 3
    finally:
        scene.close()


def test_connection_points_scale_out_and_in(
    start_cluster: StartCluster, zk_of: list[KazooClient]
) -> None:
    cluster = start_cluster(matchers=2, grpc_port=0)
    zk = _zk(cluster, zk_of)
    cluster.add(Role.CONNECTION_POINT, 1)
    names = _names(cluster, Role.CONNECTION_POINT)
    out = scale_layer(zk, "connection-points", names, timeout=30.0)
    assert out.outcome == "completed", out
    first, second = _addresses(cluster, Role.CONNECTION_POINT)
    # clients on both; those on the second are handed over when it leaves
    scene = _Scene([[first], [second]], seed=41)
    try:
        scene.start()
        back = _scale_with_late_subscriptions(scene, zk, "connection-points", names[:1], [second])
        assert back.outcome == "completed", back
        assert back.epoch == out.epoch == 1  # the configuration did not change
        assert any(p.is_alive() for p in scene.publishers), "the publishers finished too soon"
        cluster.retire(names[1:])
        scene.check()
        assert all(r.client.target == first for r in scene.recorders)
    finally:
        scene.close()


def test_a_connection_point_confirms_a_flush_once_the_stream_brought_it(
    start_cluster: StartCluster,
) -> None:
    # the exit points' hand-over (broker.roles.exit_point._flush_then_report): Flushed
    # answers only once the sender's Deliver stream brought its marker, so what the stream
    # carried before it is in the sessions' queues; a token never sent runs out its deadline
    cluster = start_cluster(matchers=1)
    (entry,) = [p for p in cluster.description["processes"] if p["role"] == "connection-point"]
    release = threading.Event()

    def stream() -> Iterator[wire.Handoff]:
        yield wire.Handoff(hello=wire.Hello(sender="old-exit-point", role="exit-point"))
        release.wait(30)
        yield wire.Handoff(marker=wire.Marker(flush=wire.Flush(token=1)))

    with grpc.insecure_channel(entry["internal"]) as channel:
        stub = wire_grpc.DeliveryStub(channel)  # type: ignore[no-untyped-call]
        delivering = stub.Deliver.future(stream(), timeout=60)
        asked = stub.Flushed.future(wire.FlushRequest(sender="old-exit-point", token=1), timeout=30)
        time.sleep(0.5)
        assert not asked.done(), "confirmed before the marker came"
        release.set()
        asked.result(timeout=10)  # raises if it failed
        delivering.result(timeout=10)
        for sender, token in (("old-exit-point", 2), ("never-seen", 1)):
            try:
                stub.Flushed(wire.FlushRequest(sender=sender, token=token), timeout=0.5)
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED, exc
            else:
                raise AssertionError(f"{sender} {token} confirmed without its marker")
