"""Failures in the middle of a matcher scale: the scale ends rolled back, the cluster keeps
serving exactly, and a new scale completes afterwards.

Each test stalls a scale from 2 to 3 matchers before its switch, deterministically: the new
matcher is stopped (SIGSTOP) before the plan is published, so it cannot take its parts, and
no matcher can report ready (the old ones wait until their parts are taken). Once both old
matchers have split, one failure strikes:

- the new matcher is killed (SIGKILL): the coordinator rolls back when its session ends;
- the coordinator (``silbo admin scale`` as a process) is killed: nobody ends the scale, so
  the participants roll back on their own when its session ends (the plan's owner znode
  goes), and release the subscriptions they held;
- the coordinator's ZooKeeper session expires: it reports the rollback at once and the
  participants roll back on their own.

Steady traffic flows from before the stall until after the scale that follows; subscriptions
made during the stall (and after it) are published to once acknowledged. Every recorder is
checked against the reference matcher (``assert_exact_delivery``), and the matchers must
hold each subscription exactly once after the rollback (the new matcher dropped the parts
it had received).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import TypeVar

from conftest import StartCluster
from kazoo.client import KazooClient

from broker.bench.workloads.iot import iot_subscriptions, iot_updates
from broker.client import Client
from broker.cluster import LocalCluster
from broker.coordination.client import connect
from broker.coordination.configuration import ClusterConfiguration
from broker.coordination.coordinator import LOST_BEFORE, ScaleOutcome, scale_matchers
from broker.coordination.scale import ScalePlan, read_state, reports
from broker.runtime.options import Role
from integration.conftest import (
    Recorder,
    SteadyPublisher,
    assert_exact_delivery,
    cluster_status,
    subscriptions_held,
    wait_until,
)

TIMEOUT = 30.0  # each scale's; a failure must end the stalled scale well before it
SESSION_END = 20.0  # a killed process's ZooKeeper session (10 s) ends within this
LATE_TENANT = "late"  # subscriptions made during the stall, and the updates meant for them
GONE_TENANT = "gone"  # subscriptions (matching nothing) removed during the stall

T = TypeVar("T")


class _Scene:
    """A recorder and steady traffic on a cluster; late recorders subscribed mid-scale."""

    def __init__(self, cluster: LocalCluster, seed: int) -> None:
        self.endpoints = cluster.endpoints
        self.subscriptions = iot_subscriptions(150, seed=seed, stations=40)
        self.pool = iot_updates(6000, seed=seed + 1, stations=40)
        self.recorder = Recorder(self.endpoints, "rec")
        self.recorder.subscribe(self.subscriptions)
        self.late: list[Recorder] = []
        self.doomed = Client(self.endpoints)
        self.doomed_ids = {f"gone-{s.id}" for s in self.subscriptions[:60]}
        self.doomed.subscribe_many(
            [
                dataclasses.replace(s, id=f"gone-{s.id}", tenant=GONE_TENANT)
                for s in self.subscriptions[:60]
            ]
        )
        self.traffic = [
            SteadyPublisher(self.endpoints, f"steady-{i}", self.pool[i:4000:2], batch=5, pace=0.1)
            for i in range(2)
        ]
        for traffic in self.traffic:
            traffic.start()

    @property
    def held(self) -> int:
        """The subscriptions the matchers hold (each recorder's end-marker one included)."""
        recorders = [self.recorder, *self.late]
        return sum(len(r.subscriptions) for r in recorders) + len(self.doomed_ids)

    def unsubscribe_moving(self, plan: ScalePlan) -> Future[None]:
        """Unsubscribe, on a thread, the subscriptions that move to a new matcher in ``plan``
        (during a scale the access point holds the first; the rest follow once it ends)."""
        moving = sorted(
            i for i in self.doomed_ids if plan.new.selector.owner_of(i) not in plan.old.matchers
        )
        assert moving, "no subscription moves to the new matcher"

        def unsubscribe() -> None:
            for subscription_id in moving:
                self.doomed.unsubscribe(subscription_id)
                self.doomed_ids.discard(subscription_id)

        return _in_thread(unsubscribe)

    def subscribe_late(self, name: str) -> Future[Recorder]:
        """Subscribe anew, on a thread (during a scale the access point holds it)."""
        subscriptions = [
            dataclasses.replace(s, id=f"{name}-{s.id}", tenant=LATE_TENANT)
            for s in self.subscriptions[:40]
        ]

        def subscribe() -> Recorder:
            recorder = Recorder(self.endpoints, name)
            recorder.subscribe(subscriptions)
            return recorder

        return _in_thread(subscribe)

    def publish_late(self, recorders: list[Recorder]) -> None:
        """The late recorders are acknowledged: publish to their tenant too."""
        self.late.extend(recorders)
        updates = [dataclasses.replace(u, tenant=LATE_TENANT) for u in self.pool[4000:]]
        late = SteadyPublisher(self.endpoints, "late-traffic", updates, batch=5, pace=0.1)
        self.traffic.append(late)
        late.start()

    def check(self) -> None:
        for traffic in self.traffic:
            assert traffic.is_alive(), f"{traffic.name} ran out of updates before the test ended"
            traffic.stop()
        published = [t.finish() for t in self.traffic]
        for recorder in [self.recorder, *self.late]:
            recorder.wait_for_markers(p.publisher for p in published)
            assert assert_exact_delivery(recorder, published) > 0
        assert all(r.received() for r in self.late), "a late recorder got nothing"

    def close(self) -> None:
        for traffic in self.traffic:
            traffic.stop()
        for recorder in [self.recorder, *self.late]:
            recorder.close()
        self.doomed.close()


def _in_thread(work: Callable[[], T]) -> Future[T]:
    result: Future[T] = Future()

    def run() -> None:
        try:
            result.set_result(work())
        except BaseException as exc:
            result.set_exception(exc)

    threading.Thread(target=run, daemon=True).start()
    return result


def _zk(cluster: LocalCluster, zk_of: list[KazooClient]) -> KazooClient:
    client = connect(cluster.zk_address, cluster=cluster.spec.cluster, timeout=10.0)
    zk_of.append(client)
    return client


def _matchers(cluster: LocalCluster) -> list[str]:
    return [m.name for m in cluster.members_of(Role.MATCHER)]


def _epoch(zk: KazooClient) -> int:
    current = ClusterConfiguration(zk).read()
    assert current is not None
    return current.epoch


@contextlib.contextmanager
def _stopped(pid: int) -> Iterator[None]:
    """The process is stopped (SIGSTOP) inside the block, continued (SIGCONT) after it."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)


def _stall(zk: KazooClient, cluster: LocalCluster, old: list[str]) -> ScalePlan:
    """Wait until the plan is published and every old matcher has split (its parts are on
    their way to the stopped matcher); no matcher can be ready then."""

    def split() -> bool:
        plan = read_state(zk).followed
        if plan is None:
            return False
        logs = [p.read_text() for p in Path(cluster.state_dir, "logs").glob("matcher-*.log")]
        line = re.compile(rf"scale {plan.id}: \d+ subscriptions move away")
        return sum(bool(line.search(log)) for log in logs) == len(old)

    wait_until(split, TIMEOUT, "the plan is published and the old matchers split")
    plan = read_state(zk).followed
    assert plan is not None and plan.old.matchers == tuple(old)
    assert reports(zk, "ready") == {}, "a matcher was ready although the new one is stopped"
    return plan


def _serving_exactly(cluster: LocalCluster, scene: _Scene) -> None:
    """The matchers hold each subscription once (and the access point holds none back)."""
    wait_until(
        lambda: subscriptions_held(cluster)["matcher"] == scene.held,
        10.0,
        f"the matchers hold the {scene.held} subscriptions once each",
    )


def _scale_completes(zk: KazooClient, names: list[str]) -> ScaleOutcome:
    outcome = scale_matchers(zk, names, timeout=TIMEOUT)
    assert outcome.outcome == "completed", outcome
    assert outcome.epoch == 2 and outcome.moved_subscriptions > 0
    return outcome


def test_a_new_matcher_killed_mid_scale_rolls_back_then_a_new_scale_completes(
    start_cluster: StartCluster, zk_of: list[KazooClient]
) -> None:
    cluster = start_cluster(matchers=2)
    zk = _zk(cluster, zk_of)
    scene = _Scene(cluster, seed=41)
    try:
        old = _matchers(cluster)
        new = cluster.add(Role.MATCHER, 1)[0]
        with _stopped(new.pid):
            scale = _in_thread(lambda: scale_matchers(zk, [*old, new.name], timeout=TIMEOUT))
            _stall(zk, cluster, old)
            late = scene.subscribe_late("late")  # held until the scale ends
            os.kill(new.pid, signal.SIGKILL)
            killed = time.monotonic()
        out = scale.result(timeout=TIMEOUT + 10)
        assert out.outcome == "rolled back", out
        assert out.message == f"matcher {new.name} went away before the switch"
        assert time.monotonic() - killed < SESSION_END  # its session's end, not the timeout
        assert out.epoch == 1 and _epoch(zk) == 1
        assert read_state(zk).plan is None  # the coordinator removed it
        scene.publish_late([late.result(timeout=10)])
        _serving_exactly(cluster, scene)

        cluster.retire([new.name])
        third = cluster.add(Role.MATCHER, 1)[0]
        _scale_completes(zk, [*old, third.name])
        _serving_exactly(cluster, scene)
        scene.check()
    finally:
        scene.close()


def test_a_coordinator_killed_mid_scale_is_rolled_back_by_the_participants(
    start_cluster: StartCluster, zk_of: list[KazooClient]
) -> None:
    cluster = start_cluster(matchers=2)
    zk = _zk(cluster, zk_of)
    scene = _Scene(cluster, seed=51)
    try:
        old = _matchers(cluster)
        new = cluster.add(Role.MATCHER, 1)[0]
        command = [sys.executable, "-m", "broker.cli", "admin", "scale", "matchers", "3"]
        where = ["--zk", cluster.zk_address, "--cluster", cluster.spec.cluster]
        with _stopped(new.pid):  # briefly: its own session must outlive the stop
            coordinator = subprocess.Popen(
                [*command, *where, "--timeout", str(TIMEOUT)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            try:
                plan = _stall(zk, cluster, old)
                held = scene.subscribe_late("held")
                gone = scene.unsubscribe_moving(plan)
            finally:
                coordinator.kill()
                coordinator.wait()
        # The new matcher takes its parts and reports ready, but nobody switches: the plan
        # is followed until the dead coordinator's session ends, then rolled back by all.
        after = scene.subscribe_late("after")
        wait_until(lambda: read_state(zk).stale, SESSION_END, "the coordinator's session ends")
        status = cluster_status(cluster)["scale"]
        assert status.startswith(f"stale plan {plan.id}") and "rolled back" in status, status
        scene.publish_late([held.result(timeout=10), after.result(timeout=10)])
        gone.result(timeout=10)
        assert _epoch(zk) == 1
        _serving_exactly(cluster, scene)

        _scale_completes(zk, [*old, new.name])  # it removes the stale plan
        assert cluster_status(cluster)["scale"] is None
        _serving_exactly(cluster, scene)
        scene.check()
    finally:
        scene.close()


def test_the_coordinators_session_expiring_mid_scale_rolls_back(
    start_cluster: StartCluster, zk_of: list[KazooClient]
) -> None:
    cluster = start_cluster(matchers=2)
    zk = _zk(cluster, zk_of)
    coordinator = _zk(cluster, zk_of)
    scene = _Scene(cluster, seed=61)
    try:
        old = _matchers(cluster)
        new = cluster.add(Role.MATCHER, 1)[0]
        with _stopped(new.pid):
            names = [*old, new.name]
            scale = _in_thread(lambda: scale_matchers(coordinator, names, timeout=TIMEOUT))
            plan = _stall(zk, cluster, old)
            late = scene.subscribe_late("late")
            gone = scene.unsubscribe_moving(plan)
            _expire(coordinator, cluster.zk_address)
            expired = time.monotonic()
            out = scale.result(timeout=TIMEOUT + 10)
        assert out.outcome == "rolled back", out
        assert out.message == LOST_BEFORE
        assert time.monotonic() - expired < 5.0
        assert out.epoch == 1 and _epoch(zk) == 1
        state = read_state(zk)
        assert state.plan == plan and state.stale and state.followed is None
        scene.publish_late([late.result(timeout=10)])
        gone.result(timeout=10)
        _serving_exactly(cluster, scene)

        # The coordinator's client has a new session: it can run the next scale. The parts
        # of the rolled-back plan never reach the new matcher (they would bring back what
        # was unsubscribed meanwhile).
        _scale_completes(coordinator, names)
        _serving_exactly(cluster, scene)
        scene.check()
    finally:
        scene.close()


def _expire(client: KazooClient, hosts: str) -> None:
    """End ``client``'s session the way kazoo's tests do: attach to it, then close it."""
    intruder = KazooClient(hosts=hosts, client_id=client.client_id)
    intruder.start(timeout=10)
    intruder.stop()
    intruder.close()
