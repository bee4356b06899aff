"""``silbo up`` and ``silbo down`` as a user runs them: real processes, real ZooKeeper.

Each test runs ``up``/``down`` as their own processes (``python -m broker.commands.up``), with
a cluster name and state directory of its own, and checks through /proc that nothing is
left: not the pids cluster.json named, not the ZooKeeper, and no process whose command line
mentions the state directory or the cluster's name.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from broker.commands import down, up
from broker.coordination.embedded import EmbeddedZooKeeper

# these tests start processes (ZooKeeper, silbo, a cluster)
pytestmark = pytest.mark.slow

UP = [sys.executable, "-m", "broker.commands.up"]
DOWN = [sys.executable, "-m", "broker.commands.down"]
START_TIMEOUT = 60.0


@dataclass
class Place:
    """Where one test's cluster lives."""

    state_dir: Path
    name: str

    def up_args(self, *extra: str) -> list[str]:
        return [
            *UP,
            "--state-dir",
            str(self.state_dir),
            "--cluster",
            self.name,
            "--grpc-port",
            "0",
            "--log-level",
            "WARNING",
            *extra,
        ]

    def description(self) -> dict[str, Any] | None:
        try:
            found: dict[str, Any] = json.loads((self.state_dir / "cluster.json").read_text())
        except (OSError, ValueError):
            return None
        return found


@pytest.fixture
def place(tmp_path: Path) -> Iterator[Place]:
    """A fresh state dir and cluster name; whatever is still running afterwards is stopped."""
    where = Place(tmp_path / "state", f"t-{uuid.uuid4().hex[:10]}")
    yield where
    if where.description() is not None:
        subprocess.run([*DOWN, "--state-dir", str(where.state_dir)], timeout=60, check=False)
    for pid in mentioning(where):
        os.kill(pid, signal.SIGKILL)


def running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def mentioning(where: Place) -> list[int]:
    """Running processes whose command line names the state dir or the cluster."""
    needles = (str(where.state_dir).encode(), where.name.encode())
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            command = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if any(n in command for n in needles) and running(int(entry.name)):
            found.append(int(entry.name))
    return found


def cluster_pids(description: dict[str, Any]) -> list[int]:
    """The broker processes' pids and the embedded ZooKeeper's."""
    pids = [int(p["pid"]) for p in description["processes"]]
    if description["zookeeper"].get("pid"):
        pids.append(int(description["zookeeper"]["pid"]))
    return pids


def assert_nothing_left(where: Place, pids: list[int], within: float = 5.0) -> None:
    """Every pid gone and no process mentions the cluster, within ``within`` seconds."""
    deadline = time.monotonic() + within
    while True:
        left = [p for p in pids if running(p)] + mentioning(where)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert not left, f"still running: {left}"


def wait_running(where: Place, process: subprocess.Popen[bytes]) -> dict[str, Any]:
    """cluster.json once it says running (fails if ``up`` exits first)."""
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        description = where.description()
        if description is not None and description.get("status") == "running":
            return description
        if process.poll() is not None:
            pytest.fail(f"silbo up exited with {process.returncode} before the cluster ran")
        time.sleep(0.05)
    pytest.fail("the cluster did not come up in time")


def start_foreground(where: Place, tmp_path: Path, *extra: str) -> subprocess.Popen[bytes]:
    """``silbo up`` in the foreground, its output in tmp_path/up.out and up.err."""
    with open(tmp_path / "up.out", "wb") as out, open(tmp_path / "up.err", "wb") as err:
        return subprocess.Popen(where.up_args(*extra), stdout=out, stderr=err)


def test_detached_up_through_a_pipe_returns_and_down_leaves_nothing(place: Place) -> None:
    command = " ".join(place.up_args("--detach")) + " | cat"
    began = time.monotonic()
    # If a process kept the pipe (or the captured stderr) open, this would time out.
    piped = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=60)
    assert piped.returncode == 0, piped.stderr
    assert time.monotonic() - began < 45
    description = place.description()
    assert description is not None and description["status"] == "running"
    pids = cluster_pids(description)
    assert len(pids) == 8 and all(running(p) for p in pids)  # 7 broker processes + ZooKeeper
    supervisor = description["supervisor"]
    assert running(supervisor) and not description["detached"]  # the daemon supervises
    assert f"cluster {place.name} is up" in piped.stdout
    assert description["zookeeper"]["address"] in piped.stdout
    assert description["endpoints"][0] in piped.stdout
    assert f"silbo down --state-dir {place.state_dir}" in piped.stdout

    again = subprocess.run(place.up_args("--detach"), capture_output=True, text=True, timeout=60)
    assert again.returncode == 2
    # the supervisor daemon holds the state dir's lock
    assert "already starting or running" in again.stderr and "silbo down" in again.stderr
    assert place.description() == description  # the running cluster is untouched

    stopped = subprocess.run(
        [*DOWN, "--state-dir", str(place.state_dir)], capture_output=True, text=True, timeout=60
    )
    assert stopped.returncode == 0, stopped.stderr
    # 5 broker processes, ZooKeeper and the supervisor (the daemon `up --detach` started)
    assert f"stopped cluster {place.name} (9 processes)" in stopped.stdout
    assert_nothing_left(place, pids, within=0.0)  # down returns only once all are gone
    assert place.description() is None

    twice = subprocess.run(
        [*DOWN, "--state-dir", str(place.state_dir)], capture_output=True, text=True, timeout=60
    )
    assert twice.returncode == 1
    assert "no cluster is running from" in twice.stderr


@pytest.mark.parametrize("stop", ["SIGTERM", "SIGINT", "silbo down"])
def test_a_foreground_up_stops_everything_and_exits_0(
    place: Place, tmp_path: Path, stop: str
) -> None:
    process = start_foreground(place, tmp_path)
    try:
        description = wait_running(place, process)
        pids = [*cluster_pids(description), process.pid]
        # cluster.json says running a moment before the summary is printed: a signal in
        # between stops a cluster that is up (status 0) without its summary (seen on CI)
        deadline = time.monotonic() + 30
        while "Ctrl-C" not in (tmp_path / "up.out").read_text():
            assert time.monotonic() < deadline, "no summary printed"
            time.sleep(0.05)
        if stop == "silbo down":
            result = subprocess.run(
                [*DOWN, "--state-dir", str(place.state_dir)],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert result.returncode == 0, result.stderr
            assert "(9 processes)" in result.stdout  # the supervisor too
        else:
            process.send_signal(signal.Signals[stop])
        status = process.wait(timeout=60)
        # (a rare 130 on CI once, "interrupted": its output says from where)
        assert status == 0, (tmp_path / "up.err").read_text()[-3000:]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert_nothing_left(place, pids, within=0.0)
    assert place.description() is None
    out = (tmp_path / "up.out").read_text()
    assert f"cluster {place.name} is up" in out and "Ctrl-C" in out
    expected = "SIGTERM" if stop == "silbo down" else stop
    assert f"silbo up: {expected}: stopping the cluster" in (tmp_path / "up.err").read_text()


def test_a_foreground_up_whose_zookeeper_was_restarted_stops_at_once(
    place: Place, tmp_path: Path
) -> None:
    """The supervisor's watchdog starts the embedded ZooKeeper again after a kill -9; on
    SIGTERM that ZooKeeper serves until every process stopped. (Before: it died with the
    watchdog thread that forked it, at the supervisor's close, and the processes waited for
    it out their 10 s grace.)"""
    process = start_foreground(place, tmp_path)
    try:
        description = wait_running(place, process)
        zookeeper = int(description["zookeeper"]["pid"])
        os.kill(zookeeper, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while "serves again" not in (tmp_path / "up.err").read_text():
            assert time.monotonic() < deadline, (tmp_path / "up.err").read_text()[-2000:]
            time.sleep(0.1)
        restarted = place.description()
        assert restarted is not None
        pids = [*cluster_pids(restarted), process.pid]
        assert zookeeper not in pids
        process.send_signal(signal.SIGTERM)
        stopping = time.monotonic()
        status = process.wait(timeout=60)
        took = time.monotonic() - stopping
        assert status == 0, (tmp_path / "up.err").read_text()[-3000:]
        assert took < 6.0, f"the stop took {took:.1f} s"
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert_nothing_left(place, pids, within=0.0)


def test_a_signal_while_starting_stops_what_was_started(place: Place, tmp_path: Path) -> None:
    process = start_foreground(place, tmp_path, "--detach")
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:  # until every process is spawned, and before they all registered
            description = place.description()
            if description and len(description["processes"]) == 7:
                break
            assert process.poll() is None and time.monotonic() < deadline
            time.sleep(0.005)
        assert description["status"] == "starting"
        pids = [*cluster_pids(description), process.pid]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 128 + signal.SIGTERM
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert_nothing_left(place, pids, within=0.0)
    assert place.description() is None
    err = (tmp_path / "up.err").read_text()
    assert err == "silbo up: SIGTERM while starting: stopping everything\n"


def test_a_killed_foreground_up_takes_its_processes_with_it(place: Place, tmp_path: Path) -> None:
    process = start_foreground(place, tmp_path)
    try:
        description = wait_running(place, process)
        pids = cluster_pids(description)
        assert all(running(p) for p in pids)
        process.kill()  # SIGKILL: no chance to clean up
        process.wait(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert_nothing_left(place, pids, within=5.0)  # the parent-death signal
    stale = subprocess.run(
        [*DOWN, "--state-dir", str(place.state_dir)], capture_output=True, text=True, timeout=60
    )
    assert stale.returncode == 1
    assert "had stopped already; removed its stale cluster.json" in stale.stderr
    assert place.description() is None


def test_a_foreground_up_restarts_a_dead_process_and_stops_everything_after(
    place: Place, tmp_path: Path, zookeeper: EmbeddedZooKeeper
) -> None:
    process = start_foreground(place, tmp_path, "--zk", zookeeper.address)
    try:
        description = wait_running(place, process)
        matcher = next(p for p in description["processes"] if p["role"] == "matcher")
        os.kill(matcher["pid"], signal.SIGKILL)

        def replaced() -> dict[str, Any] | None:
            now = place.description() or {}
            return next(
                (
                    p
                    for p in now.get("processes", [])
                    if p["log"] == matcher["log"] and p["pid"] != matcher["pid"] and p["name"]
                ),
                None,
            )

        deadline = time.monotonic() + 60
        while (new := replaced()) is None and time.monotonic() < deadline:
            assert process.poll() is None, (tmp_path / "up.err").read_text()
            time.sleep(0.1)
        assert new is not None, "the dead matcher was not restarted"
        assert new["restarts"] == 1 and running(new["pid"])
        pids = cluster_pids(place.description() or {})
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    err = (tmp_path / "up.err").read_text()
    assert f"matcher (pid {matcher['pid']}) exited with -9 (log: {matcher['log']})" in err
    assert f"matcher restarted (pid {new['pid']}, restart 1)" in err
    assert_nothing_left(place, pids)
    assert place.description() is None
    assert zookeeper.state.value == "running" and running(zookeeper.pid or 0)  # not ours


def _two_free_ports() -> int:
    """The first of two consecutive ports free now (tried until a pair is found)."""
    for _attempt in range(100):
        with socket.socket() as first, socket.socket() as second:
            first.bind(("127.0.0.1", 0))
            base = int(first.getsockname()[1])
            try:
                second.bind(("127.0.0.1", base + 1))
            except OSError:
                continue
            return base
    raise AssertionError("no two consecutive free ports in 100 tries")


@pytest.mark.parametrize("taken", [0, 1])
def test_a_port_in_use_is_one_clear_line_and_starts_nothing(
    place: Place, tmp_path: Path, taken: int
) -> None:
    with socket.socket() as holder:
        base = _two_free_ports()  # hold the one to take
        holder.bind(("127.0.0.1", base + taken))
        holder.listen()
        args = place.up_args("--connection-points", "2")
        args[args.index("--grpc-port") + 1] = str(base)
        result = subprocess.run(args, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("silbo up: error: port ")
    assert f"port {base + taken} " in lines[0] and "already in use" in lines[0]
    assert not (place.state_dir / "zookeeper").exists()  # nothing was started
    assert place.description() is None
    assert mentioning(place) == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--matchers", "0"], "--matchers must be at least 1, not 0"),
        (["--access-points", "-1"], "--access-points must be at least 1, not -1"),
        (["--exit-points", "0", "--connection-points", "0"], "--connection-points must be at"),
        (["--grpc-port", "70000"], "--grpc-port 70000 is not a port"),
        (["--log-level", "LOUD"], "--log-level LOUD is not a logging level"),
        (["--cluster", "a/b"], "cluster name 'a/b' is not usable"),
    ],
)
def test_bad_options_are_exit_2_with_the_message(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert up.main(["--state-dir", str(tmp_path / "state"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("silbo up: error: ") and message in err
    assert not (tmp_path / "state").exists()


def test_down_without_a_cluster_says_so_and_exits_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert down.main(["--state-dir", str(tmp_path / "nothing")]) == 1
    err = capsys.readouterr().err
    assert (
        err == f"silbo down: no cluster is running from {tmp_path / 'nothing'} (no cluster.json)\n"
    )
