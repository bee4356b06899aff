"""Start and stop a whole Silbo cluster on this machine (``silbo up`` / ``silbo down``).

:class:`LocalCluster` starts, in order: an embedded ZooKeeper (unless one is given), then
every broker process (``silbo run ROLE`` as a child, its output in ``STATE_DIR/logs``), waits
until each has registered in ZooKeeper, forms the cluster (its first configuration), and
writes ``STATE_DIR/cluster.json``::

    {"cluster": "silbo", "state_dir": "/abs/.silbo", "supervisor": 1234, "detached": false,
     "zookeeper": {"address": "127.0.0.1:40123", "embedded": true, "pid": 1200,
                   "data_dir": "/abs/.silbo/zookeeper"},
     "endpoints": ["127.0.0.1:7777"],
     "processes": [{"role": "matcher", "name": "matcher-...-0000000000", "pid": 1201,
                    "address": "127.0.0.1:39031", "metrics": "127.0.0.1:41002",
                    "log": "/abs/.silbo/logs/matcher-1.log"}, ...]}

Children never outlive their supervisor by accident: in the foreground they are started with
a parent-death signal (SIGKILL when the supervisor dies, even by SIGKILL) and stopped in
order on stop; detached ones run in their own sessions, hold none of the caller's terminal or
pipes, and are stopped by :func:`stop_cluster` from cluster.json (which checks every pid is
still the process it started before signalling it).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from broker.coordination.client import connect
from broker.coordination.embedded import EmbeddedZooKeeper, die_with_parent, stop_detached
from broker.coordination.errors import CoordinationError
from broker.coordination.formation import form
from broker.coordination.membership import Member, members
from broker.errors import InvalidInput, SilboError
from broker.runtime.options import DEFAULT_CLUSTER, Role

__all__ = ["ClusterError", "ClusterSpec", "LocalCluster", "read_cluster", "stop_cluster"]

STATE_FILE = "cluster.json"
STOP_GRACE = 10.0


class ClusterError(SilboError):
    """The local cluster could not be started or stopped (the message says why)."""


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """What to start: how many processes per layer, and where."""

    matchers: int = 2
    access_points: int = 1
    exit_points: int = 1
    connection_points: int = 1
    grpc_port: int = 7777  # the first connection point's port; the next ones count up; 0: any
    zk: str | None = None  # None: start an embedded ZooKeeper
    cluster: str = DEFAULT_CLUSTER
    state_dir: Path = Path(".silbo")
    detach: bool = False
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        problems = [
            f"--{name.replace('_', '-')} must be at least 1"
            for name in ("matchers", "access_points", "exit_points", "connection_points")
            if getattr(self, name) < 1
        ]
        if not 0 <= self.grpc_port <= 65535:
            problems.append(f"--grpc-port {self.grpc_port} is not a port")
        if problems:
            raise InvalidInput("; ".join(problems))

    def counts(self) -> dict[Role, int]:
        """Processes per role, in start order."""
        return {
            Role.MATCHER: self.matchers,
            Role.EXIT_POINT: self.exit_points,
            Role.ACCESS_POINT: self.access_points,
            Role.CONNECTION_POINT: self.connection_points,
        }


@dataclass(slots=True)
class _Child:
    role: Role
    process: subprocess.Popen[bytes]
    log: Path
    member: Member | None = None


class LocalCluster:
    """A cluster of child processes on this machine (see the module doc)."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.state_dir = spec.state_dir.resolve()
        self._zookeeper: EmbeddedZooKeeper | None = None
        self._zk_address = spec.zk or ""
        self._children: list[_Child] = []
        self.description: dict[str, Any] = {}

    @property
    def zk_address(self) -> str:
        """ZooKeeper's HOST:PORT."""
        return self._zk_address

    @property
    def endpoints(self) -> list[str]:
        """The connection points' addresses (what clients connect to)."""
        return list(self.description.get("endpoints", []))

    def start(self, timeout: float = 60.0) -> dict[str, Any]:
        """Start everything, wait until it serves, write cluster.json; its content."""
        existing = read_cluster(self.state_dir)
        if existing is not None and _alive(existing):
            raise ClusterError(
                f"a cluster is already running from {self.state_dir} "
                f"(supervisor pid {existing.get('supervisor')}); stop it with silbo down"
            )
        (self.state_dir / "logs").mkdir(parents=True, exist_ok=True)
        try:
            if self.spec.zk is None:
                self._zookeeper = EmbeddedZooKeeper(
                    data_dir=self.state_dir / "zookeeper", die_with_parent=not self.spec.detach
                ).start()
                self._zk_address = self._zookeeper.address
            self._spawn_all()
            self._await_members(timeout)
            self.description = self._describe()
            self._write(self.description)
        except BaseException:
            self.stop()
            raise
        return self.description

    def stop(self) -> None:
        """Stop every child (SIGTERM, SIGKILL after a grace period) and the embedded ZooKeeper."""
        for child in reversed(self._children):
            with contextlib.suppress(ProcessLookupError):
                child.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE
        for child in reversed(self._children):
            try:
                child.process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()
        self._children.clear()
        if self._zookeeper is not None:
            self._zookeeper.stop()
            self._zookeeper = None
        (self.state_dir / STATE_FILE).unlink(missing_ok=True)

    def detach(self) -> None:
        """Leave everything running after this object (and this interpreter) are gone."""
        if self._zookeeper is not None:
            self._zookeeper.detach()
            self._zookeeper = None
        self._children.clear()

    def poll(self) -> list[str]:
        """Children that have exited, as 'role (pid) exited with N' lines."""
        return [
            f"{c.role.value} (pid {c.process.pid}) exited with {c.process.returncode}"
            for c in self._children
            if c.process.poll() is not None
        ]

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- private helpers --------------------------------------------------------------------

    def _spawn_all(self) -> None:
        port = self.spec.grpc_port
        for role, count in self.spec.counts().items():
            for i in range(count):
                listen = "127.0.0.1:0"
                if role is Role.CONNECTION_POINT and port:
                    listen = f"127.0.0.1:{port + i}"
                self._spawn(role, i + 1, listen)

    def _spawn(self, role: Role, number: int, listen: str) -> None:
        log = self.state_dir / "logs" / f"{role.value}-{number}.log"
        command = [
            sys.executable,
            "-m",
            "broker.cli",
            "run",
            role.value,
            "--zk",
            self._zk_address,
            "--cluster",
            self.spec.cluster,
            "--listen",
            listen,
            "--log-level",
            self.spec.log_level,
        ]
        with open(log, "ab") as out:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # Ctrl-C reaches the supervisor, which stops us in order
                preexec_fn=None if self.spec.detach else die_with_parent,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self._children.append(_Child(role, process, log))

    def _await_members(self, timeout: float) -> None:
        client = connect(self._zk_address, cluster=self.spec.cluster, timeout=10.0)
        try:
            deadline = time.monotonic() + timeout
            while True:
                exited = [c for c in self._children if c.process.poll() is not None]
                if exited:
                    child = exited[0]
                    raise ClusterError(
                        f"{child.role.value} exited with {child.process.returncode} while "
                        f"starting:\n{_tail(child.log)}"
                    )
                by_pid = {m.pid: m for m in members(client)}
                for child in self._children:
                    child.member = by_pid.get(child.process.pid)
                if all(c.member is not None for c in self._children):
                    break
                if time.monotonic() > deadline:
                    missing = [c.role.value for c in self._children if c.member is None]
                    raise ClusterError(f"not registered within {timeout:.0f} s: {missing}")
                time.sleep(0.1)
            try:
                form(client, self.spec.matchers, timeout=timeout)
            except CoordinationError as exc:
                raise ClusterError(f"cannot form the cluster: {exc}") from exc
        finally:
            client.stop()
            client.close()

    def _describe(self) -> dict[str, Any]:
        processes = []
        for child in self._children:
            assert child.member is not None
            processes.append(
                {
                    "role": child.role.value,
                    "name": child.member.name,
                    "pid": child.process.pid,
                    "address": child.member.address,
                    "metrics": child.member.metrics,
                    "log": str(child.log),
                }
            )
        zookeeper: dict[str, Any] = {"address": self._zk_address, "embedded": self.spec.zk is None}
        if self._zookeeper is not None:
            zookeeper["pid"] = self._zookeeper.pid
            zookeeper["data_dir"] = str(self._zookeeper.data_dir)
        return {
            "cluster": self.spec.cluster,
            "state_dir": str(self.state_dir),
            "supervisor": os.getpid(),
            "detached": self.spec.detach,
            "started": time.time(),
            "zookeeper": zookeeper,
            "endpoints": [
                p["address"] for p in processes if p["role"] == Role.CONNECTION_POINT.value
            ],
            "processes": processes,
        }

    def _write(self, description: dict[str, Any]) -> None:
        path = self.state_dir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(description, indent=2) + "\n")
        tmp.replace(path)


def read_cluster(state_dir: Path) -> dict[str, Any] | None:
    """The cluster.json of ``state_dir``, or None if there is none (or it is unreadable)."""
    try:
        found: dict[str, Any] = json.loads((Path(state_dir) / STATE_FILE).read_text())
        return found
    except (OSError, ValueError):
        return None


def stop_cluster(state_dir: Path, *, grace: float = STOP_GRACE, out: IO[str] | None = None) -> int:
    """Stop the cluster described in ``STATE_DIR/cluster.json``; how many processes it stopped.

    Each pid is signalled only while it is still the ``silbo run`` process it was (a recycled
    pid is left alone). SIGTERM first, SIGKILL after ``grace`` seconds; the embedded ZooKeeper
    last.
    """
    description = read_cluster(state_dir)
    if description is None:
        raise ClusterError(f"no cluster described in {Path(state_dir) / STATE_FILE}")
    pids = [
        int(p["pid"])
        for p in description.get("processes", [])
        if _is_ours(int(p["pid"]), p.get("role", ""))
    ]
    supervisor = int(description.get("supervisor", 0))
    if supervisor and not description.get("detached") and _is_supervisor(supervisor):
        pids.append(supervisor)  # a foreground `silbo up`: it stops its own children too
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    for pid in pids:
        if _running(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    while any(_running(pid) for pid in pids) and time.monotonic() < deadline + 5:
        time.sleep(0.05)
    zookeeper = description.get("zookeeper", {})
    if zookeeper.get("embedded") and zookeeper.get("data_dir"):
        stop_detached(zookeeper["data_dir"], timeout=grace)
    (Path(state_dir) / STATE_FILE).unlink(missing_ok=True)
    if out is not None:
        print(f"stopped {len(pids)} processes of cluster {description.get('cluster')}", file=out)
    return len(pids)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def _is_ours(pid: int, role: str) -> bool:
    command = _cmdline(pid)
    return "broker.cli run" in command and role in command


def _is_supervisor(pid: int) -> bool:
    command = _cmdline(pid)
    return " up" in command and ("silbo" in command or "broker.cli" in command)


def _running(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    try:
        return stat.read_text().split(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _alive(description: dict[str, Any]) -> bool:
    return any(
        _is_ours(int(p.get("pid", 0)), p.get("role", "")) for p in description.get("processes", [])
    )


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""
