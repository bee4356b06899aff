"""Broker processes as an operator sees them: ``silbo run``'s errors, SIGTERM, metrics, status.

- ``silbo run`` with an unreachable ZooKeeper, or a taken port, exits with status 2 and one
  clear line on stderr (no traceback) within seconds;
- SIGTERM stops any role cleanly (exit status 0) and its membership znode goes away;
- every process serves Prometheus metrics with the ``silbo_`` families, and they move;
- ``silbo admin status --json`` describes the running cluster.
"""

from __future__ import annotations

import functools
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import StartCluster
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from broker.client import Client
from broker.cluster import LocalCluster
from broker.coordination.client import connect
from broker.coordination.embedded import EmbeddedZooKeeper
from broker.coordination.membership import Member, members
from broker.model.update import ContextUpdate
from integration.conftest import wait_until

# these tests start processes (ZooKeeper, silbo, a cluster)
pytestmark = pytest.mark.slow

ROLES = ("connection-point", "access-point", "matcher", "exit-point", "context-store")


def _silbo(*arguments: str) -> list[str]:
    return [sys.executable, "-m", "broker.cli", *arguments]


@pytest.fixture
def held_port() -> Iterator[int]:
    """A port bound (and listened on) by this process for the whole test."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


def _assert_clear_error(result: subprocess.CompletedProcess[str], *fragments: str) -> str:
    """The process failed with status 2 and one ``silbo ...: error: ...`` line naming them."""
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert "Traceback" not in result.stderr, result.stderr
    errors = [line for line in result.stderr.splitlines() if ": error: " in line]
    assert len(errors) == 1, result.stderr
    for fragment in fragments:
        assert fragment in errors[0], errors[0]
    return errors[0]


@functools.cache
def _startup_seconds() -> float:
    """How long ``silbo`` takes to start and exit here (imports), to allow for it."""
    started = time.monotonic()
    subprocess.run(_silbo("run", "--help"), capture_output=True, check=True, timeout=60)
    return time.monotonic() - started


def _run_matcher_against(port: int) -> None:
    """``silbo run matcher --zk-timeout 3`` against ``port``: a clear error within 3 s
    (and 2 s to spare) once started."""
    allowed = _startup_seconds() + 3 + 2
    started = time.monotonic()
    result = subprocess.run(
        _silbo("run", "matcher", "--zk", f"127.0.0.1:{port}", "--zk-timeout", "3"),
        capture_output=True,
        text=True,
        timeout=allowed,  # it is killed, and the test fails, if it hangs on
    )
    elapsed = time.monotonic() - started
    line = _assert_clear_error(result, "silbo run matcher: error:", f"127.0.0.1:{port}")
    assert "ZooKeeper" in line and "3 s" in line, line
    assert 3.0 < elapsed < allowed, f"gave up on ZooKeeper after {elapsed:.1f} s"


def test_a_stopped_zookeeper_is_a_clear_error_within_seconds() -> None:
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    _run_matcher_against(closed)


def test_a_zookeeper_that_never_answers_is_a_clear_error_within_seconds(held_port: int) -> None:
    # the port accepts connections (the kernel completes them) but never answers, as a hung
    # server would
    _run_matcher_against(held_port)


@pytest.mark.parametrize("option", ["--listen", "--metrics-listen"])
def test_a_port_in_use_is_a_clear_error(
    zookeeper: EmbeddedZooKeeper, held_port: int, option: str
) -> None:
    address = f"127.0.0.1:{held_port}"
    result = subprocess.run(
        _silbo(
            "run",
            "connection-point",
            "--zk",
            zookeeper.address,
            "--cluster",
            "taken",
            option,
            address,
        ),
        capture_output=True,
        text=True,
        timeout=30,
    )
    line = _assert_clear_error(result, "silbo run connection-point: error:", address)
    assert "in use" in line


def _members_of(cluster: LocalCluster) -> list[Member]:
    """Every process registered in the cluster's membership."""
    client = connect(cluster.zk_address, cluster=cluster.spec.cluster, timeout=10.0)
    try:
        return members(client)
    finally:
        client.stop()
        client.close()


def _registered(cluster: LocalCluster) -> dict[int, str]:
    """pid -> role of every registered process."""
    return {member.pid: member.role for member in _members_of(cluster)}


def test_sigterm_stops_every_role_cleanly_and_its_membership_goes(
    start_cluster: StartCluster, tmp_path: Path
) -> None:
    cluster = start_cluster(matchers=1)
    extra: dict[str, subprocess.Popen[bytes]] = {}
    logs = {role: tmp_path / f"extra-{role}.log" for role in ROLES}
    try:
        for role in ROLES:
            with open(logs[role], "wb") as output:
                store = ["--store-dir", str(tmp_path / "extra-store")]
                extra[role] = subprocess.Popen(
                    _silbo(
                        "run",
                        role,
                        "--zk",
                        cluster.zk_address,
                        "--cluster",
                        cluster.spec.cluster,
                        *(store if role == "context-store" else []),
                    ),
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                )
        pids = {p.pid: role for role, p in extra.items()}
        wait_until(
            lambda: pids.items() <= _registered(cluster).items(), 20, "the extra processes register"
        )
        # the extra connection point serves: a session through it holds a subscription
        extra_cp = next(
            m.endpoint for m in _members_of(cluster) if m.pid == extra["connection-point"].pid
        )
        with Client(extra_cp, publisher="through-extra") as client:
            room = client.subscribe(type="Room")
            client.publish(ContextUpdate.of("Room1", {"temperature": 30}, entity_type="Room"))
            assert room.get(timeout=30).update.entity_id == "Room1"
            for process in extra.values():
                process.send_signal(signal.SIGTERM)
            for role, process in extra.items():
                assert process.wait(timeout=30) == 0, (role, logs[role].read_text())
        registered = _registered(cluster)
        assert not pids.keys() & registered.keys(), "a stopped process is still a member"
        assert sorted(registered.values()) == sorted(ROLES)  # the cluster's own are still there
        for role, log in logs.items():
            assert "Traceback" not in log.read_text(), (role, log.read_text())
        assert not cluster.poll(), "a broker process of the cluster died"
    finally:
        for process in extra.values():
            if process.poll() is None:
                process.kill()
                process.wait()


def _scrape(address: str) -> dict[str, Metric]:
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {family.name: family for family in text_string_to_metric_families(text)}


def _updates_matched(metrics: dict[str, Metric]) -> float:
    family = metrics["silbo_items_in"]
    return sum(
        s.value
        for s in family.samples
        if s.name == "silbo_items_in_total" and s.labels.get("kind") == "update"
    )


FAMILIES = {
    "silbo_messages_in": "counter",  # exposed as silbo_messages_in_total
    "silbo_messages_out": "counter",
    "silbo_items_in": "counter",
    "silbo_items_out": "counter",
    "silbo_queue_depth": "gauge",
    "silbo_batch_size": "histogram",
    "silbo_stage_seconds": "histogram",
    "silbo_subscriptions": "gauge",
}


def test_every_process_serves_prometheus_metrics_that_move(start_cluster: StartCluster) -> None:
    cluster = start_cluster(matchers=2)
    processes = cluster.description["processes"]
    assert sorted({p["role"] for p in processes}) == sorted(ROLES)
    for process in processes:
        metrics = _scrape(process["metrics"])
        kinds = {name: metrics[name].type for name in FAMILIES if name in metrics}
        assert kinds == FAMILIES, (process["role"], sorted(metrics))
        info = metrics["silbo_process_info"].samples
        assert [s.labels for s in info] == [{"role": process["role"]}]
    matchers = [p["metrics"] for p in processes if p["role"] == "matcher"]
    before = [_updates_matched(_scrape(address)) for address in matchers]
    with Client(cluster.endpoints) as client:
        client.subscribe(type="Room")
        count = client.publish_many(
            [ContextUpdate.of(f"Room{i}", {"t": i}, entity_type="Room") for i in range(25)]
        )
    assert count == 25
    # every matcher matches every update against its own part of the subscriptions
    wait_until(
        lambda: [_updates_matched(_scrape(a)) for a in matchers] == [b + 25 for b in before],
        10,
        "each matcher's silbo_items_in_total{kind=update} grows by 25",
    )
    # the client closed: its subscription goes (from both its replicas) soon after
    wait_until(
        lambda: (
            sum(s.value for a in matchers for s in _scrape(a)["silbo_subscriptions"].samples) == 0
        ),
        10,
        "the closed session's subscription removed from the matchers",
    )
    connection_point = next(p["metrics"] for p in processes if p["role"] == "connection-point")
    published = _scrape(connection_point)["silbo_messages_in"].samples
    assert any(s.labels == {"stream": "Publish"} and s.value >= 1 for s in published), published


def test_admin_status_describes_the_running_cluster(start_cluster: StartCluster) -> None:
    cluster = start_cluster(matchers=2)
    with Client(cluster.endpoints) as client:
        for i in range(6):
            client.subscribe(subscription_id=f"s{i}", type="Room")
        result = subprocess.run(
            _silbo(
                "admin", "status", "--json", "--interval", "0",
                "--zk", cluster.zk_address, "--cluster", cluster.spec.cluster,
            ),
            capture_output=True,
            text=True,
            timeout=60,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    status = json.loads(result.stdout)
    assert status["cluster"] == cluster.spec.cluster
    assert status["layers"] == {
        "connection-point": 1,
        "access-point": 1,
        "matcher": 2,
        "exit-point": 1,
        "context-store": 1,
    }
    assert len(status["matchers"]) == 2 and status["epoch"] >= 1
    by_role: dict[str, int] = {}
    for process in status["processes"]:
        assert process["reachable"], process
        by_role[process["role"]] = by_role.get(process["role"], 0) + process["subscriptions"]
    # each subscription is held by its replicas (2 of the 2 matchers)
    assert status["replicas"] == status["replicas_live"] == 2
    assert by_role["matcher"] == 2 * by_role["connection-point"] == 12
    described = {p["pid"] for p in cluster.description["processes"]}
    assert {p["pid"] for p in status["processes"]} == described
