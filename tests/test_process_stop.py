"""A stopping process closes its ZooKeeper client within a bound, whatever ZooKeeper does:
a client whose connection thread waits in a read for a ZooKeeper that does not answer (one
restarted on a loaded machine) held kazoo's stop up to 10 s (a CI run's access point took
9.9 s to stop, near its supervisor's 10-s grace)."""

from __future__ import annotations

import socket
import threading
import time

from kazoo.client import KazooClient

from broker.coordination.client import close


def _stuck_client(listener: socket.socket) -> tuple[KazooClient, socket.socket]:
    """A client connected to ``listener``, which accepts and never answers its handshake."""
    port = listener.getsockname()[1]
    zk = KazooClient(hosts=f"127.0.0.1:{port}", timeout=10.0)
    zk.start_async()
    accepted, _ = listener.accept()
    accepted.recv(1024)  # its connect request: the client now waits in a read for an answer
    return zk, accepted


def test_a_client_waiting_for_a_silent_zookeeper_is_closed_within_the_bound() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.settimeout(10)
        zk, accepted = _stuck_client(listener)
        with accepted:
            began = time.monotonic()
            close(zk, within=1.0)
            took = time.monotonic() - began
            # kazoo's own stop still waits for the read (so the bound is what ended it)
            assert any(t.name == "zookeeper-close" for t in threading.enumerate())
        assert took < 2.5, f"closing took {took:.1f} s"
