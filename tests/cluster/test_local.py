"""LocalCluster and stop_cluster against real processes and a real ZooKeeper."""

from __future__ import annotations

import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import StartCluster

from broker.cluster.local import (
    ClusterBusy,
    ClusterSpec,
    LocalCluster,
    NoCluster,
    live_processes,
    read_cluster,
    retire_all_but,
    stop_cluster,
)
from broker.coordination.client import connect
from broker.coordination.configuration import ClusterConfiguration
from broker.coordination.embedded import EmbeddedZooKeeper
from broker.coordination.membership import Member
from broker.errors import AddressInUse, InvalidInput
from broker.runtime.options import Role

# these tests start processes (ZooKeeper, silbo, a cluster)
pytestmark = pytest.mark.slow


@pytest.fixture
def clusters() -> Iterator[list[LocalCluster]]:
    """LocalClusters a test appends; stopped afterwards (also when the test fails)."""
    started: list[LocalCluster] = []
    yield started
    for cluster in started:
        cluster.stop()


def running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def configured_matchers(address: str, cluster: str) -> set[str]:
    """The matchers the cluster's configuration in ZooKeeper names."""
    client = connect(address, cluster=cluster, timeout=10.0)
    try:
        current = ClusterConfiguration(client).read()
        assert current is not None
        return set(current.configuration.matchers)
    finally:
        client.stop()
        client.close()


def matcher_names(description: dict[str, Any]) -> set[str]:
    """The matchers a cluster.json names."""
    return {p["name"] for p in description["processes"] if p["role"] == "matcher"}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"matchers": 0}, "--matchers must be at least 1"),
        ({"exit_points": -2}, "--exit-points must be at least 1"),
        ({"grpc_port": -1}, "--grpc-port -1 is not a port"),
        ({"grpc_port": 65535, "connection_points": 2}, "leaves no room for 2 connection points"),
        ({"log_level": "chatty"}, "--log-level chatty is not a logging level"),
        ({"zk": " "}, "--zk must name HOST:PORT"),
        ({"cluster": ".."}, "is not usable as a znode name"),
        ({"history_retention": "raw=soon"}, "--history-retention: "),
    ],
)
def test_a_spec_refuses_what_cannot_start(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidInput, match=message):
        ClusterSpec(**fields)


def test_a_restarted_embedded_cluster_is_formed_over_its_own_matchers(
    tmp_path: Path, clusters: list[LocalCluster]
) -> None:
    # The embedded ZooKeeper keeps its data in the state dir: a second start must not
    # inherit the first one's configuration (naming matchers that are gone).
    spec = ClusterSpec(matchers=2, grpc_port=0, state_dir=tmp_path / "state", log_level="WARNING")
    first = LocalCluster(spec)
    clusters.append(first)
    first.start()
    names = matcher_names(first.description)
    assert configured_matchers(first.zk_address, spec.cluster) == names
    first.stop()
    second = LocalCluster(spec)
    clusters.append(second)
    second.start()
    again = matcher_names(second.description)
    assert again.isdisjoint(names)
    assert configured_matchers(second.zk_address, spec.cluster) == again


def test_one_cluster_per_state_dir_and_name_on_a_shared_zookeeper(
    tmp_path: Path, zookeeper: EmbeddedZooKeeper, clusters: list[LocalCluster]
) -> None:
    name = f"t-{uuid.uuid4().hex[:10]}"

    def spec(state: str, matchers: int = 1) -> ClusterSpec:
        return ClusterSpec(
            matchers=matchers,
            grpc_port=0,
            zk=zookeeper.address,
            cluster=name,
            state_dir=tmp_path / state,
            log_level="WARNING",
        )

    first = LocalCluster(spec("a"))
    clusters.append(first)
    first.start()
    written = read_cluster(tmp_path / "a")
    assert written == first.description and written["status"] == "running"

    with pytest.raises(ClusterBusy, match="already starting or running from"):
        LocalCluster(spec("a")).start()  # the running one holds the state dir's lock
    assert read_cluster(tmp_path / "a") == written  # and its cluster.json is untouched

    with pytest.raises(ClusterBusy, match=f"cluster {name} in ZooKeeper .* is in use"):
        LocalCluster(spec("b")).start()  # same name, same ZooKeeper: its matchers are live
    assert read_cluster(tmp_path / "b") is None
    assert all(running(int(p["pid"])) for p in written["processes"])

    first.stop()
    assert read_cluster(tmp_path / "a") is None
    # Stopped: the name is free again, and its configuration is replaced, not inherited,
    # even with another number of matchers.
    second = LocalCluster(spec("b", matchers=2))
    clusters.append(second)
    second.start()
    assert configured_matchers(zookeeper.address, name) == matcher_names(second.description)


def test_a_taken_port_is_found_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        cluster = LocalCluster(ClusterSpec(grpc_port=port, state_dir=tmp_path / "state"))
        with pytest.raises(
            AddressInUse, match=f"port {port} \\(127.0.0.1:{port}\\) is already in use"
        ):
            cluster.start()
    assert not (tmp_path / "state" / "zookeeper").exists()
    assert read_cluster(tmp_path / "state") is None
    with open(tmp_path / "state" / "lock", "rb") as lock:  # released: usable at once
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_a_detached_cluster_outlives_its_object_until_stop_cluster(
    tmp_path: Path, zookeeper: EmbeddedZooKeeper, clusters: list[LocalCluster]
) -> None:
    spec = ClusterSpec(
        matchers=1,
        grpc_port=0,
        zk=zookeeper.address,
        cluster=f"t-{uuid.uuid4().hex[:10]}",
        state_dir=tmp_path / "state",
        detach=True,
        log_level="WARNING",
    )
    cluster = LocalCluster(spec)
    clusters.append(cluster)
    description = cluster.start()
    cluster.detach()
    cluster.stop()  # a no-op now: it must neither stop the processes nor forget them
    pids = [int(p["pid"]) for p in description["processes"]]
    assert read_cluster(spec.state_dir) == description
    assert sorted(live_processes(description)) == sorted(pids)  # the supervisor (us) excluded
    with pytest.raises(ClusterBusy, match="already running"):
        LocalCluster(spec).start()

    assert stop_cluster(spec.state_dir, grace=5.0) == 5  # a context store too
    assert not any(running(pid) for pid in pids)
    assert read_cluster(spec.state_dir) is None
    assert running(zookeeper.pid or 0)  # an external ZooKeeper is not ours to stop
    with pytest.raises(NoCluster, match="no cluster is running from"):
        stop_cluster(spec.state_dir)


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """A process that is not part of any cluster."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield process
    process.kill()
    process.wait()


@pytest.mark.parametrize("start_time", [12345, None])
def test_stop_cluster_leaves_a_recycled_pid_alone(
    tmp_path: Path, bystander: subprocess.Popen[bytes], start_time: int | None
) -> None:
    # cluster.json names a pid that now belongs to another process: another start time,
    # or (a file without start times) a command line that is not `silbo run`.
    entry = {"role": "matcher", "pid": bystander.pid, "start_time": start_time}
    description = {
        "cluster": "old",
        "supervisor": bystander.pid,
        "supervisor_start_time": start_time,
        "detached": False,
        "status": "running",
        "zookeeper": {"embedded": True, "pid": bystander.pid, "start_time": start_time},
        "processes": [entry],
    }
    (tmp_path / "cluster.json").write_text(json.dumps(description))
    assert live_processes(description) == []
    assert stop_cluster(tmp_path, grace=1.0) == 0
    assert bystander.poll() is None
    assert read_cluster(tmp_path) is None  # the stale file is gone


@pytest.mark.parametrize("content", ["[1, 2]", "{not json", ""])
def test_an_unreadable_cluster_json_is_no_cluster(tmp_path: Path, content: str) -> None:
    (tmp_path / "cluster.json").write_text(content)
    assert read_cluster(tmp_path) is None
    with pytest.raises(NoCluster):
        stop_cluster(tmp_path)


def test_poll_names_a_dead_child_and_its_log(start_cluster: StartCluster) -> None:
    cluster = start_cluster(matchers=1)
    assert cluster.poll() == []
    exit_point = next(p for p in cluster.description["processes"] if p["role"] == "exit-point")
    os.kill(exit_point["pid"], signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not (exited := cluster.poll()) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert exited == [
        f"exit-point (pid {exit_point['pid']}) exited with -9 (log: {exit_point['log']})"
    ]


class _InterruptedCluster(LocalCluster):
    """Interrupted (as by a signal handler that raises) once its processes are spawned."""

    def _await_members_and_form(self, timeout: float) -> None:
        raise KeyboardInterrupt


def test_an_interrupted_start_leaves_nothing_running(tmp_path: Path) -> None:
    state = tmp_path / "state"
    cluster = _InterruptedCluster(ClusterSpec(grpc_port=0, state_dir=state, log_level="WARNING"))
    spawned: list[dict[str, Any]] = []
    write = cluster._write

    def record(description: dict[str, Any]) -> None:
        spawned.append(description)
        write(description)

    cluster._write = record  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        cluster.start()
    last = spawned[-1]
    assert last["status"] == "starting" and len(last["processes"]) == 6
    pids = [int(p["pid"]) for p in last["processes"]] + [int(last["zookeeper"]["pid"])]
    assert not any(running(pid) for pid in pids)
    assert read_cluster(state) is None
    with open(state / "lock", "rb") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_a_scale_in_keeps_a_member_its_entry_does_not_name_yet(tmp_path: Path) -> None:
    """retire_all_but knows a kept member by its pid too: the supervisor names a restarted
    process's entry only after it registered, and a scale in that completes in between kept
    it (before: it was retired with the ones leaving). Nothing here runs: the file only."""
    entries = [
        {"role": "connection-point", "name": None, "pid": 4_000_001, "log": "cp-1.log"},
        {"role": "connection-point", "name": "cp-b", "pid": 4_000_002, "log": "cp-2.log"},
        {"role": "connection-point", "name": "cp-c", "pid": 4_000_003, "log": "cp-3.log"},
        {"role": "matcher", "name": "m-a", "pid": 4_000_004, "log": "matcher-1.log"},
    ]
    (tmp_path / "cluster.json").write_text(json.dumps({"processes": entries}))
    kept = Member("connection-point", "127.0.0.1:1", 4_000_001, 0.0, name="cp-a")
    other = Member("connection-point", "127.0.0.1:3", 4_000_003, 0.0, name="cp-c")
    assert retire_all_but(tmp_path, Role.CONNECTION_POINT, [kept, other]) == 0  # none ran
    left = read_cluster(tmp_path)
    assert left is not None
    assert [p["log"] for p in left["processes"]] == ["cp-1.log", "cp-3.log", "matcher-1.log"]
