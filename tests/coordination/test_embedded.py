"""The embedded ZooKeeper server: starts, serves, stops without leftovers, fails clearly."""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from broker.coordination.embedded import (
    EmbeddedZooKeeper,
    ServerState,
    find_classpath,
    find_java,
)
from broker.coordination.errors import (
    EmbeddedServerError,
    JavaNotFound,
    ServerStartTimeout,
    ZooKeeperJarsNotFound,
)
from broker.errors import AddressInUse

# these tests start processes (ZooKeeper, silbo, a cluster)
pytestmark = pytest.mark.slow


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _executable(path: Path, script: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{script}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_serves_then_stops_leaving_no_process_and_no_temp_dir() -> None:
    server = EmbeddedZooKeeper()
    with server:
        pid, data_dir, state = server.pid, server.data_dir, server.state
        assert state is ServerState.RUNNING and pid is not None
        client = KazooClient(hosts=server.address)
        client.start(timeout=10)
        client.create("/hello", b"world")
        assert client.get("/hello")[0] == b"world"
        client.stop()
        client.close()
        assert os.getpgid(pid) == pid  # its own process group: Ctrl-C reaches the parent only
    assert server.state is ServerState.STOPPED and server.pid is None
    assert _gone(pid)
    assert not data_dir.exists()
    server.stop()  # idempotent


def test_a_given_data_dir_is_kept_and_holds_the_log(tmp_path: Path) -> None:
    with EmbeddedZooKeeper(data_dir=tmp_path / "zk") as server:
        pid = server.pid
    assert pid is not None and _gone(pid)
    log = (tmp_path / "zk" / "zookeeper.log").read_text()
    assert "ZooKeeperServerMain" in log or "ZooKeeperServer" in log


def test_a_port_in_use_is_a_typed_error(zookeeper: EmbeddedZooKeeper) -> None:
    with pytest.raises(AddressInUse) as caught:
        EmbeddedZooKeeper(port=zookeeper.port).start()
    assert caught.value.port == zookeeper.port
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        with pytest.raises(AddressInUse, match=str(port)):
            EmbeddedZooKeeper(port=port).start()


def test_missing_java_is_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(JavaNotFound, match="JAVA_HOME"):
        EmbeddedZooKeeper(java=tmp_path / "no-java").start()
    with pytest.raises(JavaNotFound, match="install Java"):
        find_java(environ={"PATH": str(tmp_path)})


def test_java_is_found_in_java_home_first(tmp_path: Path) -> None:
    java = _executable(tmp_path / "jdk" / "bin" / "java", "exit 0")
    assert find_java(environ={"JAVA_HOME": str(tmp_path / "jdk"), "PATH": "/usr/bin"}) == java


def test_missing_jars_are_a_typed_error(tmp_path: Path) -> None:
    with pytest.raises(ZooKeeperJarsNotFound, match=r"silbo\[spark\]"):
        EmbeddedZooKeeper(jar_dirs=[tmp_path]).start()
    with pytest.raises(ZooKeeperJarsNotFound):
        find_classpath([])


@pytest.mark.parametrize(
    ("layout", "expected"),
    [("zookeeper-3.9.5.jar", "{d}/*"), ("lib/zookeeper.jar", "{d}/lib/*")],
)
def test_the_first_directory_with_a_server_jar_wins(
    tmp_path: Path, layout: str, expected: str
) -> None:
    empty, jars = tmp_path / "empty", tmp_path / "jars"
    empty.mkdir()
    (jars / layout).parent.mkdir(parents=True)
    (jars / layout).write_bytes(b"")
    assert find_classpath([empty, jars]) == expected.format(d=jars)


def test_a_server_that_exits_while_starting_reports_its_log(tmp_path: Path) -> None:
    java = _executable(tmp_path / "fake-java", "echo 'Error: no such main class' >&2; exit 3")
    server = EmbeddedZooKeeper(java=java, data_dir=tmp_path / "zk")
    with pytest.raises(ServerStartTimeout, match="exited with status 3") as caught:
        server.start()
    assert "no such main class" in caught.value.log_tail
    assert server.state is ServerState.STOPPED


def test_a_server_that_does_not_answer_in_time_is_killed(tmp_path: Path) -> None:
    java = _executable(tmp_path / "slow-java", "exec sleep 60")
    server = EmbeddedZooKeeper(java=java, data_dir=tmp_path / "zk", startup_timeout=0.3)
    with pytest.raises(ServerStartTimeout, match="did not answer"):
        server.start()
    pid = int((tmp_path / "zk" / "zookeeper.pid").read_text())
    assert _gone(pid)
    with pytest.raises(EmbeddedServerError, match="stopped"):
        server.start()
