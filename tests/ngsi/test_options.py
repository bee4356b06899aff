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


def _refused(*options: str) -> str:
    """What ``silbo run connection-point`` with ``options`` says as it exits 2 at once."""
    command = [sys.executable, "-m", "broker.cli", "run", "connection-point", "--zk", "h:1"]
    command += ["--http-listen", "127.0.0.1:0", *options]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done
    return done.stderr


def test_a_bad_allow_entry_stops_silbo_run_at_once() -> None:
    assert "not a CIDR, address or host name" in _refused("--notify-allow", "http://x/")


@pytest.mark.parametrize("flush", [0, -1])
def test_status_flush_must_be_positive(flush: float) -> None:
    with pytest.raises(InvalidInput, match="--status-flush"):
        ProcessOptions(Role.CONNECTION_POINT, zk="h:1", status_flush=flush)
    with pytest.raises(InvalidInput, match="--status-flush"):
        ClusterSpec(status_flush=flush)


@pytest.mark.parametrize("window", [-1, 86_401])
def test_retry_window_is_seconds_from_0_to_a_day(window: float) -> None:
    ProcessOptions(Role.CONNECTION_POINT, zk="h:1", retry_window=0)
    with pytest.raises(InvalidInput, match="--retry-window must be a number of seconds"):
        ProcessOptions(Role.CONNECTION_POINT, zk="h:1", retry_window=window)
    with pytest.raises(InvalidInput, match="--retry-window must be a number of seconds"):
        ClusterSpec(retry_window=window)


def test_silbo_run_takes_retry_window_and_refuses_a_bad_one() -> None:
    message = "--retry-window must be a number of seconds from 0 to 86400, not -5.0"
    assert message in _refused("--retry-window", "-5")


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
