"""Fixtures for coordination tests: one real ZooKeeper per test session, a fresh cluster per test.

Every test gets its own cluster name, hence its own chroot (``/silbo/<name>``), so tests
share the server but never see each other's znodes. ``expire`` ends a client's session the
way kazoo's own tests do: a second client attaches to the same session id and password and
closes it, and the first client then finds its session expired (LOST) and reconnects with a
new one (CONNECTED).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
from kazoo.client import KazooClient

from broker.coordination.client import ConnectionState, ConnectionStateWatcher, connect
from broker.coordination.embedded import EmbeddedZooKeeper

Expire = Callable[[KazooClient], None]


@pytest.fixture
def cluster() -> str:
    """A cluster name no other test uses."""
    return f"test-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def connected(zookeeper: EmbeddedZooKeeper, cluster: str) -> Iterator[Callable[[], KazooClient]]:
    """A factory of clients of this test's cluster; each is stopped after the test."""
    clients: list[KazooClient] = []

    def factory() -> KazooClient:
        client = connect(zookeeper.address, cluster=cluster, timeout=10.0)
        clients.append(client)
        return client

    yield factory
    for client in clients:
        client.stop()
        client.close()


@pytest.fixture
def client(connected: Callable[[], KazooClient]) -> KazooClient:
    """A client of this test's cluster."""
    return connected()


@pytest.fixture
def expire(zookeeper: EmbeddedZooKeeper) -> Expire:
    """End a client's session; returns once the client has reconnected with a new session."""

    def expire_session(client: KazooClient) -> None:
        watcher = ConnectionStateWatcher(client)
        try:
            intruder = KazooClient(hosts=zookeeper.address, client_id=client.client_id)
            intruder.start(timeout=10)
            intruder.stop()
            intruder.close()
            assert watcher.wait_for(ConnectionState.LOST, timeout=15), watcher.states()
            lost_at = watcher.states().index(ConnectionState.LOST)
            assert watcher.wait_for(ConnectionState.CONNECTED, after=lost_at, timeout=15)
        finally:
            watcher.close()

    return expire_session
