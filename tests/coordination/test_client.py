"""Connecting to one cluster's chroot, failing fast when ZooKeeper is away, watching states."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from kazoo.client import KazooClient

from broker.coordination.client import (
    ConnectionState,
    ConnectionStateWatcher,
    chroot_of,
    connect,
)
from broker.coordination.embedded import EmbeddedZooKeeper, free_port
from broker.coordination.errors import ZooKeeperUnavailable
from broker.errors import InvalidIdentifier, InvalidInput

# these tests start processes (ZooKeeper, silbo, a cluster)
pytestmark = pytest.mark.slow


def test_an_unreachable_zookeeper_is_a_typed_error_within_the_timeout() -> None:
    began = time.monotonic()
    with pytest.raises(ZooKeeperUnavailable, match="did not answer within 1 s"):
        connect(f"127.0.0.1:{free_port()}", cluster="nowhere", timeout=1.0)
    assert time.monotonic() - began < 2.5


def test_clusters_are_isolated_by_their_chroots(zookeeper: EmbeddedZooKeeper, cluster: str) -> None:
    first = connect(zookeeper.address, cluster=cluster, timeout=10)
    second = connect(zookeeper.address, cluster=cluster + "-other", timeout=10)
    root = KazooClient(hosts=zookeeper.address)
    root.start(timeout=10)
    try:
        first.create("/config", b"first")
        assert second.exists("/config") is None
        second.create("/config", b"second")
        assert first.get("/config")[0] == b"first"
        assert root.get(f"/silbo/{cluster}/config")[0] == b"first"
        assert root.get(f"/silbo/{cluster}-other/config")[0] == b"second"
    finally:
        for client in (first, second, root):
            client.stop()
            client.close()


@pytest.mark.parametrize("name", ["", "a/b", ".", "..", "zookeeper", "tab\there"])
def test_a_cluster_name_must_be_a_znode_name(name: str) -> None:
    with pytest.raises(InvalidIdentifier):
        chroot_of(name)


def test_hosts_must_not_carry_a_chroot(zookeeper: EmbeddedZooKeeper) -> None:
    with pytest.raises(InvalidInput, match="chroot"):
        connect(zookeeper.address + "/elsewhere", cluster="c", timeout=1.0)


def test_the_watcher_records_transitions_and_calls_back(
    client: KazooClient, expire: Callable[[KazooClient], None]
) -> None:
    watcher = ConnectionStateWatcher(client)
    assert watcher.state is ConnectionState.CONNECTED
    seen: list[ConnectionState] = []
    lost: list[ConnectionState] = []
    watcher.on(None, seen.append)
    watcher.on(ConnectionState.LOST, lost.append)
    watcher.on(ConnectionState.LOST, _explode)  # a failing callback does not stop the others

    expire(client)

    assert watcher.wait_for(ConnectionState.CONNECTED, after=1, timeout=10)
    assert watcher.states()[-2:] == [ConnectionState.LOST, ConnectionState.CONNECTED]
    assert seen == watcher.states()
    assert lost == [ConnectionState.LOST]
    stamps = [t.at for t in watcher.transitions]
    assert stamps == sorted(stamps)
    watcher.close()
    client.stop()
    assert watcher.states()[-1] is ConnectionState.CONNECTED  # closed: LOST not recorded


def _explode(state: ConnectionState) -> None:
    raise RuntimeError(f"callback failure on {state}")


def test_connected_factory_gives_clients_of_one_cluster(
    connected: Callable[[], KazooClient],
) -> None:
    a, b = connected(), connected()
    a.create("/shared", b"x")
    assert b.get("/shared")[0] == b"x"


def test_coordination_errors_have_rows_in_the_error_table() -> None:
    from broker.coordination.errors import (
        ConfigurationConflict,
        CorruptCoordinationData,
        InvalidConfiguration,
        ZooKeeperUnavailable,
    )
    from broker.errors import mapping_for

    assert mapping_for(ZooKeeperUnavailable("x")).grpc_status == "UNAVAILABLE"
    assert mapping_for(ConfigurationConflict("x")).http_status == 409
    assert mapping_for(CorruptCoordinationData("x")).grpc_status == "DATA_LOSS"
    assert mapping_for(InvalidConfiguration("x")).http_status == 400
