"""The options that turn the HTTP front on: validated before anything starts."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from broker.cluster import ClusterSpec
from broker.coordination.embedded import EmbeddedZooKeeper
from broker.errors import InvalidInput
from broker.runtime.options import ProcessOptions, Role

# these tests start processes (ZooKeeper, silbo, a cluster)
pytestmark = pytest.mark.slow


def test_http_listen_is_an_address_of_a_connection_point() -> None:
    ProcessOptions(Role.CONNECTION_POINT, zk="h:1", http_listen="127.0.0.1:0")
    with pytest.raises(InvalidInput, match="--http-listen"):
        ProcessOptions(Role.CONNECTION_POINT, zk="h:1", http_listen="nonsense")
    with pytest.raises(InvalidInput, match="connection points only"):
        ProcessOptions(Role.MATCHER, zk="h:1", http_listen="127.0.0.1:0")


@pytest.mark.parametrize("port", [-1, 65536])
def test_http_port_of_a_cluster(port: int) -> None:
    with pytest.raises(InvalidInput, match="--http-port"):
        ClusterSpec(http_port=port)


def test_a_bad_allow_entry_stops_silbo_run_at_once() -> None:
    command = [sys.executable, "-m", "broker.cli", "run", "connection-point", "--zk", "h:1"]
    command += ["--http-listen", "127.0.0.1:0", "--notify-allow", "http://x/"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "not a CIDR, address or host name" in done.stderr


@pytest.mark.parametrize("flush", [0, -1])
def test_status_flush_must_be_positive(flush: float) -> None:
    with pytest.raises(InvalidInput, match="--status-flush"):
        ProcessOptions(Role.CONNECTION_POINT, zk="h:1", status_flush=flush)
    with pytest.raises(InvalidInput, match="--status-flush"):
        ClusterSpec(status_flush=flush)


def test_a_taken_http_port_stops_the_connection_point_with_a_clear_error(
    zookeeper: EmbeddedZooKeeper,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        command = [sys.executable, "-m", "broker.cli", "run", "connection-point"]
        command += ["--zk", zookeeper.address, "--cluster", f"taken-{port}"]
        command += ["--http-listen", f"127.0.0.1:{port}"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert f"cannot serve HTTP on 127.0.0.1:{port}" in done.stderr
    assert "--http-listen" in done.stderr
