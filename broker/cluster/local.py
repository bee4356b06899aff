"""Start and stop a whole Silbo cluster on this machine (``silbo up`` / ``silbo down``).

:class:`LocalCluster` starts, in order: an embedded ZooKeeper (unless one is given; its data
is kept in the state directory across runs: broker.cluster.durable), then every broker
process (``silbo run ROLE`` as a child, its output in ``STATE_DIR/logs``), waits until each
has registered in ZooKeeper, forms the cluster (its first configuration, over exactly the
matchers it started), and writes
``STATE_DIR/cluster.json``::

    {"cluster": "silbo", "state_dir": "/abs/.silbo", "status": "running",
     "supervisor": 1234, "supervisor_start_time": 81234, "detached": false,
     "zookeeper": {"address": "127.0.0.1:40123", "embedded": true, "pid": 1200,
                   "start_time": 81240, "data_dir": "/abs/.silbo/zookeeper"},
     "endpoints": ["127.0.0.1:7777"],
     "processes": [{"role": "matcher", "name": "matcher-...-0000000000", "pid": 1201,
                    "start_time": 81301, "address": "127.0.0.1:39031",
                    "metrics": "127.0.0.1:41002", "log": "/abs/.silbo/logs/matcher-1.log"}, ...]}

cluster.json is first written with ``"status": "starting"`` as soon as the processes exist
(so that ``silbo down`` finds them even if the start never completes), then rewritten with
``"running"``. A ``start_time`` is the process's start in clock ticks since boot (field 22 of
``/proc/PID/stat``): a pid is only ever signalled while it is still that same process.

One cluster per state directory: :meth:`LocalCluster.start` takes ``STATE_DIR/lock`` (an
``flock`` held while starting, and for a foreground cluster until it stops), and refuses to
start while any process cluster.json names is still alive (:class:`ClusterBusy`). The
connection points' ports are checked before anything starts (``AddressInUse``): gRPC servers
bind with SO_REUSEPORT, so a child would otherwise share a port another cluster's
connection point holds rather than fail.

Children never outlive their supervisor by accident: in the foreground they are started with
a parent-death signal (SIGKILL when the supervisor dies, even by SIGKILL) and stopped on
:meth:`LocalCluster.stop`; detached ones run in their own sessions, hold none of the caller's
terminal or pipes, and are stopped by :func:`stop_cluster` from cluster.json. SIGINT, SIGTERM
and SIGHUP are held back while a child is being spawned and recorded, so a signal handler that
raises cannot leave an untracked child behind. (A *detached* start killed with SIGKILL before
it completes leaves its processes running; ``silbo down`` stops them from the "starting"
cluster.json.)
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError

from broker.archive.location import location
from broker.cluster.durable import STORES, clear_previous_run, layout_of, purge, write_layout
from broker.coordination.client import CLOSE_WITHIN, chroot_of, close, connect
from broker.coordination.configuration import (
    CONFIG,
    DEFAULT_REPLICAS,
    ClusterConfiguration,
    Configuration,
)
from broker.coordination.embedded import EmbeddedZooKeeper, die_with_parent, stop_detached
from broker.coordination.errors import ConfigurationConflict, translated
from broker.coordination.http_subscriptions import FRONTS
from broker.coordination.membership import Member, members
from broker.errors import AddressInUse, InvalidInput, SilboError
from broker.ngsi.cors_options import DEFAULT_MAX_AGE, cors_problems
from broker.ngsi.retry import DEFAULT_WINDOW, window_problem
from broker.processes import command_line, running
from broker.runtime.options import (
    DEFAULT_ARCHIVE_INTERVAL,
    DEFAULT_CLUSTER,
    PEER_HANG_AFTER,
    SESSION_GRACE,
    Role,
    max_rate_problem,
)
from broker.store.history import HistoryOptions
from broker.store.layout import create_store_layout

__all__ = [
    "ClusterBusy",
    "ClusterError",
    "ClusterSpec",
    "LocalCluster",
    "NoCluster",
    "live_processes",
    "read_cluster",
    "stop_cluster",
]

STATE_FILE = "cluster.json"
LOCK_FILE = "lock"
STOP_GRACE = 10.0
HOST = "127.0.0.1"
_DEFERRED_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


class ClusterError(SilboError):
    """The local cluster could not be started or stopped (the message says why)."""


class ClusterBusy(ClusterError):
    """A cluster is already starting or running from that state directory (or that name)."""


class NoCluster(ClusterError):
    """No cluster is described in that state directory."""


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """What to start: how many processes per layer, and where."""

    matchers: int = 2
    access_points: int = 1
    exit_points: int = 1
    connection_points: int = 1
    context_stores: int = 1  # the context store layer (resized by silbo admin scale)
    grpc_port: int = 7777  # the first connection point's port; the next ones count up; 0: any
    # NGSI v2 HTTP: the first connection point's port, the next ones count up; 0: any; None: off
    http_port: int | None = None
    notify_allow: tuple[str, ...] = ()  # --notify-allow of every connection point
    status_flush: float = 10.0  # --status-flush of every connection point
    http_read_timeout: float = 30.0  # --http-read-timeout of every connection point
    retry_window: float = DEFAULT_WINDOW  # --retry-window of every connection point
    session_grace: float = SESSION_GRACE  # --session-grace of matchers and exit points
    cors_origin: str = ""  # --cors-origin of every connection point ("": no CORS)
    cors_max_age: int = DEFAULT_MAX_AGE  # --cors-max-age of every connection point
    spark_offload: int = 0  # --spark-offload of every matcher (0: off)
    store_history: bool = False  # --history on of every context store (docs/history.md)
    history_retention: str = ""  # their --history-retention ('': the defaults)
    # the archive (docs/archive.md): where an archiver writes it, a path or a URI ('': no
    # archive, no archiver), the stores then record their changes; the archiver's
    # --archive-interval
    archive: str = ""
    archive_interval: float = DEFAULT_ARCHIVE_INTERVAL
    # --max-rate of every process of a layer: (role value, items a second), capacity emulation
    max_rates: tuple[tuple[str, float], ...] = ()
    replicas: int = DEFAULT_REPLICAS  # matchers that hold each subscription
    # ``silbo autoscaler`` processes started once the cluster is formed (one leads, the others
    # stand by; 0: none) and their --interval (broker.autoscale.controller)
    autoscalers: int = 0
    autoscale_interval: float = 2.0
    # each controller's --record in logs/autoscaler-N.observations.jsonl
    autoscale_record: bool = False
    peer_hang_after: float = PEER_HANG_AFTER  # --peer-hang-after of every process (0: off)
    zk: str | None = None  # None: start an embedded ZooKeeper
    cluster: str = DEFAULT_CLUSTER
    state_dir: Path = Path(".silbo")
    detach: bool = False
    log_level: str = "INFO"
    fresh: bool = False  # start from nothing: drop what the state directory kept

    def __post_init__(self) -> None:
        problems = [
            f"--{name.replace('_', '-')} must be at least 1, not {getattr(self, name)}"
            for name in (
                "matchers",
                "access_points",
                "exit_points",
                "connection_points",
                "context_stores",
                "replicas",
            )
            if getattr(self, name) < 1
        ]
        last = self.grpc_port + max(self.connection_points, 1) - 1
        if not 0 <= self.grpc_port <= 65535:
            problems.append(f"--grpc-port {self.grpc_port} is not a port (0 to 65535)")
        elif self.grpc_port and last > 65535:
            problems.append(
                f"--grpc-port {self.grpc_port} leaves no room for {self.connection_points} "
                "connection points (they use consecutive ports)"
            )
        if self.http_port is not None and not (
            self.http_port >= 0 and self.http_port + max(self.connection_points, 1) - 1 <= 65535
        ):
            problems.append(
                f"--http-port {self.http_port} is not a port with room for "
                f"{self.connection_points} connection points (0 to 65535)"
            )
        if self.autoscalers < 0:
            problems.append(f"autoscalers must not be negative, not {self.autoscalers}")
        if not self.autoscale_interval > 0:
            problems.append(
                f"--autoscale-interval must be seconds above 0, not {self.autoscale_interval:g}"
            )
        if self.spark_offload < 0:
            problems.append(f"--spark-offload must not be negative, not {self.spark_offload}")
        if self.peer_hang_after < 0:
            problems.append(f"--peer-hang-after must not be negative, not {self.peer_hang_after}")
        problems.extend(max_rates_problems(self.max_rates))
        if self.history_retention:
            try:
                HistoryOptions.parse(self.history_retention)
            except InvalidInput as exc:
                problems.append(f"--history-retention: {exc}")
        if not self.status_flush > 0:
            problems.append(f"--status-flush must be positive, not {self.status_flush}")
        if self.archive:
            try:
                location(self.archive)
            except InvalidInput as exc:
                problems.append(str(exc))
        if not self.archive_interval > 0:
            problems.append(
                f"--archive-interval must be positive seconds, not {self.archive_interval:g}"
            )
        if not self.http_read_timeout > 0:
            problems.append(f"--http-read-timeout must be positive, not {self.http_read_timeout}")
        if (problem := window_problem(self.retry_window, "--retry-window")) is not None:
            problems.append(problem)
        problems.extend(cors_problems(self.cors_origin, self.cors_max_age))
        if not isinstance(logging.getLevelName(self.log_level.upper()), int):
            problems.append(f"--log-level {self.log_level} is not a logging level")
        if self.zk is not None and not self.zk.strip():
            problems.append("--zk must name HOST:PORT")
        if problems:
            raise InvalidInput("; ".join(problems))
        chroot_of(self.cluster)  # InvalidIdentifier (an InvalidInput) for an unusable name

    def counts(self) -> dict[Role, int]:
        """Processes per role, in start order."""
        return {
            Role.CONTEXT_STORE: self.context_stores,
            Role.MATCHER: self.matchers,
            Role.EXIT_POINT: self.exit_points,
            Role.ACCESS_POINT: self.access_points,
            Role.CONNECTION_POINT: self.connection_points,
            Role.ARCHIVER: 1 if self.archive else 0,
        }


@dataclass(frozen=True, slots=True)
class ChildOptions:
    """What every process of a role is started with besides its address: one place that
    turns a cluster's options into ``silbo run`` arguments, for ``up``, the supervisor's
    restarts and ``admin scale`` alike (kept in cluster.json as ``child_options``)."""

    log_level: str = "INFO"
    spark_offload: int = 0  # matchers
    http_port: int | None = None  # connection points: the first one's; 0: any; None: no HTTP
    status_flush: float = 10.0
    http_read_timeout: float = 30.0
    retry_window: float = DEFAULT_WINDOW
    notify_allow: tuple[str, ...] = ()
    peer_hang_after: float = PEER_HANG_AFTER
    store_root: str = ""  # context stores: the directory of their directories
    session_grace: float = SESSION_GRACE
    cors_origin: str = ""
    cors_max_age: int = DEFAULT_MAX_AGE
    max_rates: tuple[tuple[str, float], ...] = ()  # (role value, --max-rate) per capped layer
    store_history: bool = False  # context stores: --history on
    history_retention: str = ""  # context stores: --history-retention ('': the defaults)
    # the archiver's --archive (a path made absolute, or a URI); the stores' --archive on if set
    archive: str = ""
    archive_interval: float = DEFAULT_ARCHIVE_INTERVAL  # the archiver's --archive-interval

    @classmethod
    def of(cls, spec: ClusterSpec) -> ChildOptions:
        """The options of ``spec``'s processes."""
        return cls(
            spec.log_level,
            spec.spark_offload,
            spec.http_port,
            spec.status_flush,
            spec.http_read_timeout,
            spec.retry_window,
            tuple(spec.notify_allow),
            spec.peer_hang_after,
            str(spec.state_dir.resolve() / STORES),
            spec.session_grace,
            spec.cors_origin,
            spec.cors_max_age,
            tuple(spec.max_rates),
            spec.store_history,
            spec.history_retention,
            location(spec.archive) if spec.archive else "",
            spec.archive_interval,
        )

    def to_dict(self) -> dict[str, Any]:
        """For cluster.json."""
        return {
            "log_level": self.log_level,
            "spark_offload": self.spark_offload,
            "http_port": self.http_port,
            "status_flush": self.status_flush,
            "http_read_timeout": self.http_read_timeout,
            "retry_window": self.retry_window,
            "notify_allow": list(self.notify_allow),
            "peer_hang_after": self.peer_hang_after,
            "store_root": self.store_root,
            "session_grace": self.session_grace,
            "cors_origin": self.cors_origin,
            "cors_max_age": self.cors_max_age,
            "max_rates": dict(self.max_rates),
            "store_history": self.store_history,
            "history_retention": self.history_retention,
            "archive": self.archive,
            "archive_interval": self.archive_interval,
        }

    @classmethod
    def from_dict(cls, data: object) -> ChildOptions:
        """What :meth:`to_dict` wrote (the defaults for a cluster.json without it)."""
        if not isinstance(data, dict):
            return cls()
        known = {k: v for k, v in data.items() if k in cls.__dataclass_fields__}
        known["notify_allow"] = tuple(known.get("notify_allow") or ())
        rates = known.get("max_rates")
        known["max_rates"] = tuple(rates.items()) if isinstance(rates, dict) else ()
        return cls(**known)

    def arguments(self, role: Role, number: int) -> list[str]:
        """The role-specific ``silbo run`` arguments of process ``number`` (from 1)."""
        extra = ["--log-level", self.log_level, "--peer-hang-after", f"{self.peer_hang_after:g}"]
        if role in (Role.MATCHER, Role.EXIT_POINT) and self.session_grace != SESSION_GRACE:
            extra += ["--session-grace", f"{self.session_grace:g}"]
        if role is Role.MATCHER and self.spark_offload:
            extra += ["--spark-offload", str(self.spark_offload)]
        for layer, rate in self.max_rates:
            if layer == role.value:
                extra += ["--max-rate", f"{rate:g}"]
        if role is Role.CONTEXT_STORE:  # slot n is store n: same id, same directory
            store = store_id_of(number)
            extra += ["--store-dir", str(Path(self.store_root) / store), "--store-id", store]
            if self.store_history:
                extra += ["--history", "on"]
            if self.history_retention:
                extra += ["--history-retention", self.history_retention]
            if self.archive:
                extra += ["--archive", "on"]
        if role is Role.ARCHIVER:
            extra += ["--archive", self.archive, "--archive-interval", f"{self.archive_interval:g}"]
        if role is Role.CONNECTION_POINT and self.http_port is not None:
            http = self.http_port and self.http_port + number - 1
            extra += [
                *("--http-listen", f"{HOST}:{http}"),
                *("--status-flush", str(self.status_flush)),
                *("--http-read-timeout", str(self.http_read_timeout)),
                *("--retry-window", str(self.retry_window)),
            ]
            if self.cors_origin:
                extra += ["--cors-origin", self.cors_origin]
                extra += ["--cors-max-age", str(self.cors_max_age)]
            for entry in self.notify_allow:
                extra += ["--notify-allow", entry]
        return extra


def max_rates_problems(rates: Iterable[tuple[str, float]]) -> list[str]:
    """What is wrong with per-layer ``--max-rate LAYER=N`` values (each problem once)."""
    layers = [role.value for role in Role]
    problems = []
    seen = set()
    for layer, rate in rates:
        if layer not in layers:
            problems.append(
                f"--max-rate {layer}=N: no layer {layer!r} (one of {', '.join(layers)})"
            )
        elif layer in seen:
            problems.append(f"--max-rate {layer}=N is given twice")
        seen.add(layer)
        if (problem := max_rate_problem(rate, f"--max-rate {layer}=N")) is not None:
            problems.append(problem)
    return problems


def spawn_process(
    role: Role,
    number: int,
    *,
    zk: str,
    cluster: str,
    listen: str,
    options: ChildOptions,
    log: Path,
    preexec: Callable[[], None] | None = None,
) -> subprocess.Popen[bytes]:
    """Start one ``silbo run ROLE`` process in its own session, its output appended to
    ``log``: the one way every process of a local cluster is started."""
    command = [sys.executable, "-m", "broker.cli", "run", role.value, "--zk", zk]
    command += ["--cluster", cluster, "--listen", listen, *options.arguments(role, number)]
    with open(log, "ab") as out:
        return subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches the supervisor, which stops us
            preexec_fn=preexec,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


@dataclass(slots=True)
class _Child:
    role: Role
    process: subprocess.Popen[bytes]
    log: Path
    start_time: int | None
    member: Member | None = None
    number: int = 0  # the slot within its role (its log is <role>-<number>.log)
    listen: str = ""
    http: str = ""  # a connection point's HTTP front, as it registered it (--http-port 0)


class LocalCluster:
    """A cluster of child processes on this machine (see the module doc)."""

    def __init__(self, spec: ClusterSpec) -> None:
        self.spec = spec
        self.state_dir = spec.state_dir.resolve()
        self._zookeeper: EmbeddedZooKeeper | None = None
        self._zk_address = spec.zk or ""
        self._children: list[_Child] = []
        self._autoscalers: list[tuple[subprocess.Popen[bytes], Path]] = []
        self._autoscaler_started: dict[int, float] = {}  # pid -> monotonic start (restarts)
        self._lock_fd: int | None = None
        self._status = "new"
        self._wrote_state = False
        self._detached = False
        self.description: dict[str, Any] = {}

    @property
    def zk_address(self) -> str:
        """ZooKeeper's HOST:PORT."""
        return self._zk_address

    @property
    def running(self) -> bool:
        """Whether cluster.json says "running" (start has done its work, or nearly)."""
        return self._status == "running"

    # Whether start() got as far as "running", even if a signal then cut it short (and it
    # stopped everything): whoever watched cluster.json may have stopped a cluster that was up.
    reached_running = False

    @property
    def endpoints(self) -> list[str]:
        """The connection points' addresses (what clients connect to)."""
        return list(self.description.get("endpoints", []))

    def start(self, timeout: float = 60.0) -> dict[str, Any]:
        """Start everything, wait until it serves, write cluster.json; its content.

        ClusterBusy if a cluster is starting or running from the state directory, AddressInUse
        if a connection point's port is taken (nothing is started then); on any failure
        (or an exception raised by a signal handler) everything started is stopped again.
        """
        if self._status != "new":
            raise ClusterError(f"this cluster was already started (it is {self._status})")
        self._status = "starting"
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._lock()
        try:
            self._check_not_running()
            self._check_ports()
        except BaseException:
            self._unlock()
            self._status = "stopped"
            raise
        try:
            (self.state_dir / "logs").mkdir(parents=True, exist_ok=True)
            if self.spec.zk is None:
                self._start_zookeeper()
            self._write(self._describe())
            self._prepare_chroot()
            self._spawn_all()
            self._write(self._describe())
            self._await_members_and_form(timeout)
            self._await_fronts(self._children, timeout)
            self._spawn_autoscalers()
            self._status = "running"
            self.reached_running = True
            self.description = self._describe()
            self._write(self.description)
            write_layout(self.state_dir, layout_of(self.description["processes"]))
        except BaseException:
            self.stop()
            raise
        return self.description

    def stop(self) -> None:
        """Stop every child (SIGTERM, SIGKILL after a grace period) and the embedded ZooKeeper.

        Idempotent; a no-op once :meth:`detach` was called (use :func:`stop_cluster` then).
        Removes cluster.json only if this object wrote it.
        """
        if self._detached:
            return
        _terminate([p.pid for p, _log in self._autoscalers if p.poll() is None], grace=5.0)
        self._autoscalers.clear()
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
        if self._wrote_state:  # processes `admin scale` added are not our children
            description = read_cluster(self.state_dir) or {}
            _terminate([pid for pid, kind in _live(description) if kind == "process"], grace=5.0)
        if self._zookeeper is not None:
            self._zookeeper.stop()
            self._zookeeper = None
        if self._wrote_state:
            (self.state_dir / STATE_FILE).unlink(missing_ok=True)
            self._wrote_state = False
        self._unlock()
        self._status = "stopped"

    def detach(self) -> None:
        """Leave everything running after this object (and this interpreter) are gone.

        Only a started cluster whose spec says ``detach`` can be detached: the others'
        children die with this process (their parent-death signal).
        """
        if self._status != "running" or not self.spec.detach:
            raise ClusterError(
                f"only a running cluster started with detach=True can be detached "
                f"(this one is {self._status}, detach={self.spec.detach})"
            )
        if self._zookeeper is not None:
            self._zookeeper.detach()
            self._zookeeper = None
        self._children.clear()
        self._detached = True
        self._status = "detached"
        self._unlock()

    def add(self, role: Role, count: int, timeout: float = 60.0) -> list[Member]:
        """Start ``count`` more processes of ``role`` and wait until they are registered.

        They are not part of the configuration until a scale brings them in.
        """
        first = sum(1 for c in self._children if c.role is role) + 1
        new = []
        for i in range(count):
            self._spawn(role, first + i, f"{HOST}:0")
            new.append(self._children[-1])
        client = self._connect()
        try:
            deadline = time.monotonic() + timeout
            while not all(c.member for c in new):
                exited = [c for c in new if c.process.poll() is not None]
                if exited:
                    raise ClusterError(
                        f"{role.value} exited while starting:\n{_tail(exited[0].log)}"
                    )
                if time.monotonic() > deadline:
                    raise ClusterError(f"new {role.value}s not registered within {timeout:g} s")
                by_pid = {m.pid: m for m in members(client, role.value)}
                for child in new:
                    child.member = by_pid.get(child.process.pid)
                time.sleep(0.05)
        finally:
            close(client, CLOSE_WITHIN)
        self._await_fronts(new, timeout)
        if self._wrote_state:
            self.description = self._describe()
            self._write(self.description)
        return [c.member for c in new if c.member is not None]

    def retire(self, names: Iterable[str], grace: float = STOP_GRACE) -> None:
        """Stop the processes with these member names (SIGTERM, SIGKILL after ``grace``)."""
        wanted = set(names)
        leaving = [c for c in self._children if c.member and c.member.name in wanted]
        for child in leaving:
            child.process.send_signal(signal.SIGTERM)
        for child in leaving:
            try:
                child.process.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                child.process.kill()
                child.process.wait()
            self._children.remove(child)
        if self._wrote_state:
            self.description = self._describe()
            self._write(self.description)

    def replace(self, role: Role, number: int) -> subprocess.Popen[bytes]:
        """Start a process in the slot ``number`` of ``role`` again (its port, its log); the
        supervisor's way to restart a dead one. The dead one's entry is forgotten."""
        port = self.spec.grpc_port
        listen = f"{HOST}:0"
        if role is Role.CONNECTION_POINT and port:
            listen = f"{HOST}:{port + number - 1}"
        self._children = [c for c in self._children if not (c.role is role and c.number == number)]
        self._spawn(role, number, listen)
        return self._children[-1].process

    def child(self, pid: int) -> subprocess.Popen[bytes] | None:
        """The process this object started with ``pid`` (None: not one of ours)."""
        return next((c.process for c in self._children if c.process.pid == pid), None)

    def zookeeper_exited(self) -> int | None:
        """The embedded ZooKeeper's exit status if it died (None while it runs, or if the
        ZooKeeper is not ours)."""
        zookeeper = self._zookeeper
        if zookeeper is None or zookeeper.pid is None:
            return None
        return zookeeper.exit_status()

    def restart_zookeeper(self) -> None:
        """Start the embedded ZooKeeper again on its port and data (its clients reconnect;
        sessions still within their timeout go on)."""
        old = self._zookeeper
        if old is None:
            raise ClusterError("this cluster's ZooKeeper is not embedded")
        port = old.port
        old.stop()
        self._zookeeper = EmbeddedZooKeeper(
            port=port, data_dir=self.state_dir / "zookeeper", die_with_parent=not self.spec.detach
        ).start()
        update_description(
            self.state_dir, lambda d: d["zookeeper"].update(self._describe()["zookeeper"])
        )

    def members_of(self, role: Role) -> list[Member]:
        """The registered members of ``role`` this cluster started, by registration order."""
        found = [c.member for c in self._children if c.role is role and c.member is not None]
        return sorted(found, key=lambda m: m.sequence)

    def poll(self) -> list[str]:
        """Children that have exited, as 'role (pid N) exited with S (log: PATH)' lines."""
        return [
            f"{c.role.value} (pid {c.process.pid}) exited with {c.process.returncode} "
            f"(log: {c.log})"
            for c in self._children
            if c.process.poll() is not None
        ]

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- private helpers --------------------------------------------------------------------

    def _lock(self) -> None:
        path = self.state_dir / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by children
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise ClusterBusy(
                f"a cluster is already starting or running from {self.state_dir} "
                f"(supervisor pid {holder}); stop it with: silbo down --state-dir {self.state_dir}"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._lock_fd = fd

    def _unlock(self) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            os.close(fd)  # releases the flock

    def _check_not_running(self) -> None:
        existing = read_cluster(self.state_dir)
        if existing is None:
            return
        alive = live_processes(existing)
        if alive:
            raise ClusterBusy(
                f"a cluster ({existing.get('cluster')}) is already running from "
                f"{self.state_dir} (pids {', '.join(map(str, alive))}); "
                f"stop it with: silbo down --state-dir {self.state_dir}"
            )

    def _check_ports(self) -> None:
        if not self.spec.grpc_port:
            return
        for port in range(self.spec.grpc_port, self.spec.grpc_port + self.spec.connection_points):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                # As gRPC binds (SO_REUSEADDR on): only a live socket makes the port taken.
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    sock.bind((HOST, port))
                except OSError as exc:
                    if exc.errno == errno.EADDRINUSE:
                        raise _port_taken(port, "already in use") from exc
                    raise _port_taken(port, f"not usable ({exc.strerror})") from exc

    def _start_zookeeper(self) -> None:
        data_dir = self.state_dir / "zookeeper"
        # Nothing in cluster.json is alive and we hold the lock: whatever runs on this data
        # directory is left over from an interrupted start. Its data is kept (broker.cluster.
        # durable): _prepare_chroot clears what belonged to the previous run's processes.
        stop_detached(data_dir)
        if self.spec.fresh:
            purge(self.state_dir)
        self._zookeeper = EmbeddedZooKeeper(
            data_dir=data_dir, die_with_parent=not self.spec.detach
        ).start()
        self._zk_address = self._zookeeper.address

    def _connect(self) -> KazooClient:
        return connect(self._zk_address, cluster=self.spec.cluster, timeout=10.0)

    def _prepare_chroot(self) -> None:
        """Check ZooKeeper answers, and clear the configuration a stopped cluster left."""
        client = self._connect()
        try:
            if self.spec.zk is None:  # our own ZooKeeper: every process of its last run is gone
                clear_previous_run(client)
            self._check_store_layout(client)
            existing = ClusterConfiguration(client).read()
            if existing is None:
                return
            configured = set(existing.configuration.matchers)
            alive = [m.name for m in members(client, Role.MATCHER.value) if _may_be_alive(m)]
            in_use = sorted(configured.intersection(alive))
            if in_use:
                raise ClusterBusy(
                    f"cluster {self.spec.cluster} in ZooKeeper {self._zk_address} is in use "
                    f"(its matchers {', '.join(in_use)} are registered); choose another "
                    "--cluster name"
                )
            with (
                translated("remove the configuration a stopped cluster left"),
                contextlib.suppress(NoNodeError),
            ):
                client.delete(CONFIG)
        finally:
            close(client, CLOSE_WITHIN)

    def _check_store_layout(self, client: KazooClient) -> None:
        """Write the store layout of ``context_stores`` stores, or check the kept one has
        that many (it is resized while it runs, by ``silbo admin scale context-stores``)."""
        wanted = [store_id_of(n + 1) for n in range(self.spec.context_stores)]
        layout = create_store_layout(client, wanted, replicas=self.spec.replicas)
        if list(layout.stores) != wanted:
            raise ClusterError(
                f"cluster {self.spec.cluster} keeps its entities in {len(layout.stores)} context "
                f"stores ({', '.join(layout.stores)}), not {len(wanted)}: start it with "
                f"--context-stores {len(layout.stores)} and resize it with silbo admin scale "
                "context-stores N, or start from nothing with --fresh"
            )

    def _spawn_all(self) -> None:
        port = self.spec.grpc_port
        for role, count in self.spec.counts().items():
            for i in range(count):
                listen = f"{HOST}:0"
                if role is Role.CONNECTION_POINT and port:
                    listen = f"{HOST}:{port + i}"
                self._spawn(role, i + 1, listen)

    def _spawn(self, role: Role, number: int, listen: str) -> None:
        log = self.state_dir / "logs" / f"{role.value}-{number}.log"
        with _signals_held() as mask:
            process = spawn_process(
                role,
                number,
                zk=self._zk_address,
                cluster=self.spec.cluster,
                listen=listen,
                options=ChildOptions.of(self.spec),
                log=log,
                preexec=_ChildSetup(os.getpid(), mask, die=not self.spec.detach),
            )
            self._children.append(
                _Child(role, process, log, _start_time(process.pid), number=number, listen=listen)
            )

    def _spawn_autoscalers(self) -> None:
        """Start ``spec.autoscalers`` controller processes (``silbo autoscaler``): they read
        cluster.json, so they follow a cluster that runs, and outlive no stop of it."""
        for number in range(1, self.spec.autoscalers + 1):
            log = self.state_dir / "logs" / f"autoscaler-{number}.log"
            self._autoscalers.append((self._spawn_autoscaler(log), log))

    def _spawn_autoscaler(self, log: Path) -> subprocess.Popen[bytes]:
        command = [sys.executable, "-m", "broker.cli", "autoscaler"]
        command += ["--state-dir", str(self.state_dir), "--log-level", self.spec.log_level]
        command += ["--interval", f"{self.spec.autoscale_interval:g}"]
        if self.spec.autoscale_record:
            command += ["--record", str(log.with_suffix(".observations.jsonl"))]
        with _signals_held() as mask, open(log, "ab") as out:
            process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_ChildSetup(os.getpid(), mask, die=not self.spec.detach),
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        self._autoscaler_started[process.pid] = time.monotonic()
        return process

    def restart_autoscalers(self, *, ran_at_least: float = 0.0) -> list[str]:
        """Start again each autoscaling controller that exited (killed, crashed) and ran at
        least ``ran_at_least`` seconds (a crash loop waits); cluster.json names the new ones.
        One ``autoscaler (pid N) exited with S, restarted as pid M (log: PATH)`` line each."""
        said = []
        for index, (process, log) in enumerate(self._autoscalers):
            if process.poll() is None or self._status != "running":
                continue
            ran = time.monotonic() - self._autoscaler_started.get(process.pid, 0.0)
            if ran < ran_at_least:
                continue
            fresh = self._spawn_autoscaler(log)
            del self._autoscaler_started[process.pid]
            self._autoscalers[index] = (fresh, log)
            said.append(
                f"autoscaler (pid {process.pid}) exited with {process.returncode}, "
                f"restarted as pid {fresh.pid} (log: {log})"
            )
        if said:
            entries = self._autoscaler_entries()
            update_description(self.state_dir, lambda d: d.__setitem__("autoscalers", entries))
        return said

    def _await_members_and_form(self, timeout: float) -> None:
        client = self._connect()
        try:
            deadline = time.monotonic() + timeout
            while True:
                exited = [c for c in self._children if c.process.poll() is not None]
                if exited:
                    child = exited[0]
                    raise _exited_while_starting(child)
                by_pid = {m.pid: m for m in members(client)}
                for child in self._children:
                    child.member = by_pid.get(child.process.pid)
                if all(c.member is not None for c in self._children):
                    break
                if time.monotonic() > deadline:
                    missing = [c.role.value for c in self._children if c.member is None]
                    raise ClusterError(f"not registered within {timeout:g} s: {missing}")
                time.sleep(0.1)

            # Exactly the matchers started here, in registration order (never someone
            # else's, nor a registration a killed process left behind).
            def ours(role: Role) -> list[str]:
                found = [c.member for c in self._children if c.role is role and c.member]
                return [m.name for m in sorted(found, key=lambda m: m.sequence)]

            first = Configuration.of(
                1,
                ours(Role.MATCHER),
                exit_points=ours(Role.EXIT_POINT),
                access_points=ours(Role.ACCESS_POINT),
                replicas=self.spec.replicas,
            )
            try:
                ClusterConfiguration(client).create(first)
            except ConfigurationConflict as exc:
                raise ClusterBusy(
                    f"cluster {self.spec.cluster} in ZooKeeper {self._zk_address} was formed "
                    "by someone else while starting; choose another --cluster name"
                ) from exc
        finally:
            close(client, CLOSE_WITHIN)

    def _describe(self) -> dict[str, Any]:
        processes = [
            {
                "role": child.role.value,
                "name": child.member.name if child.member else None,
                "pid": child.process.pid,
                "start_time": child.start_time,
                "address": child.member.endpoint if child.member else None,
                "internal": child.member.address if child.member else None,
                "metrics": child.member.metrics if child.member else None,
                "log": str(child.log),
            }
            for child in self._children
        ]
        zookeeper: dict[str, Any] = {"address": self._zk_address, "embedded": self.spec.zk is None}
        if self._zookeeper is not None and self._zookeeper.pid is not None:
            zookeeper["pid"] = self._zookeeper.pid
            zookeeper["start_time"] = _start_time(self._zookeeper.pid)
            zookeeper["data_dir"] = str(self._zookeeper.data_dir)
        return {
            "cluster": self.spec.cluster,
            "state_dir": str(self.state_dir),
            "status": self._status,
            "supervisor": os.getpid(),
            "supervisor_start_time": _start_time(os.getpid()),
            "detached": self.spec.detach,
            "started": time.time(),
            "zookeeper": zookeeper,
            "child_options": ChildOptions.of(self.spec).to_dict(),
            "endpoints": [
                p["address"]
                for p in processes
                if p["role"] == Role.CONNECTION_POINT.value and p["address"]
            ],
            "http_endpoints": self._http_endpoints(),
            "processes": processes,
            # the autoscaling controllers (silbo autoscaler), not members of any layer
            "autoscalers": self._autoscaler_entries(),
        }

    def http_endpoint(self, member: str) -> str:
        """The HTTP front of the connection point ``member`` started here ("" if none)."""
        for child in self._children:
            if child.member is not None and child.member.name == member:
                if child.role is not Role.CONNECTION_POINT or self.spec.http_port is None:
                    return ""
                if self.spec.http_port:  # the slot's port, as it was started
                    return f"{HOST}:{self.spec.http_port + child.number - 1}"
                return child.http
        return ""

    def _http_endpoints(self) -> list[str]:
        if self.spec.http_port:
            return [f"{HOST}:{self.spec.http_port + i}" for i in range(self.spec.connection_points)]
        return [c.http for c in self._children if c.http]  # any port: as they registered

    def _await_fronts(self, children: list[_Child], timeout: float) -> None:
        """With HTTP on any port (``--http-port 0``), wait until each connection point of
        ``children`` registered its front, and keep its address (cluster.json's
        ``http_endpoints``)."""
        waiting = [
            c
            for c in children
            if self.spec.http_port == 0 and c.role is Role.CONNECTION_POINT and c.member
        ]
        if not waiting:
            return
        client = self._connect()
        try:
            deadline = time.monotonic() + timeout
            for child in waiting:
                assert child.member is not None
                while True:
                    try:
                        data, _stat = client.get(f"{FRONTS}/{child.member.name}")
                        child.http = str(json.loads(data)["http"])
                        break
                    except NoNodeError:
                        pass
                    if child.process.poll() is not None:
                        raise _exited_while_starting(child)
                    if time.monotonic() > deadline:
                        raise ClusterError(
                            f"{child.member.name} served no HTTP front within {timeout:g} s"
                        )
                    time.sleep(0.05)
        finally:
            close(client, CLOSE_WITHIN)

    def _autoscaler_entries(self) -> list[dict[str, Any]]:
        return [
            {"pid": p.pid, "start_time": _start_time(p.pid), "log": str(log)}
            for p, log in self._autoscalers
        ]

    def _write(self, description: dict[str, Any]) -> None:
        path = self.state_dir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(description, indent=2) + "\n")
        tmp.replace(path)
        self._wrote_state = True


@dataclass(frozen=True, slots=True)
class _ChildSetup:
    """Runs in a child between fork and exec (keep it to async-signal-tolerant calls)."""

    parent: int
    mask: frozenset[int]
    die: bool

    def __call__(self) -> None:
        signal.pthread_sigmask(signal.SIG_SETMASK, self.mask)  # undo _signals_held
        if self.die:
            die_with_parent()
            if os.getppid() != self.parent:  # the parent died before prctl took effect
                os._exit(1)


@contextlib.contextmanager
def _signals_held() -> Iterator[frozenset[int]]:
    """Hold SIGINT/SIGTERM/SIGHUP back in this thread; yields the mask to restore in a child."""
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, _DEFERRED_SIGNALS)
    try:
        yield frozenset(int(s) for s in previous)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def read_cluster(state_dir: Path) -> dict[str, Any] | None:
    """The cluster.json of ``state_dir``, or None if there is none (or it is unreadable)."""
    try:
        found = json.loads((Path(state_dir) / STATE_FILE).read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def live_processes(description: dict[str, Any]) -> list[int]:
    """The pids of a cluster.json's processes still running: supervisor, children, ZooKeeper.

    The supervisor counts while the cluster is in the foreground or still starting (a
    detached one exits once started), unless it is this very process.
    """
    return [pid for pid, _kind in _live(description)]


def stop_cluster(state_dir: Path, *, grace: float = STOP_GRACE, out: IO[str] | None = None) -> int:
    """Stop the cluster described in ``STATE_DIR/cluster.json``; how many processes were running.

    A foreground (or still starting) supervisor is asked first (SIGTERM): it stops its own
    children in order. Then every child still running gets SIGTERM, SIGKILL after ``grace``
    seconds; the embedded ZooKeeper last. A pid is signalled only while it is still the
    process that was started (a recycled pid is left alone). cluster.json is removed once
    nothing is left; 0 means nothing was running (the stale file is removed). NoCluster when
    there is no cluster.json, ClusterError if a process could not be stopped.
    """
    state_dir = Path(state_dir)
    description = read_cluster(state_dir)
    if description is None:
        # A detached start killed before it wrote cluster.json may have left its ZooKeeper.
        if stop_detached(state_dir / "zookeeper", timeout=grace):
            return 1
        raise NoCluster(f"no cluster is running from {state_dir.resolve()} (no {STATE_FILE})")
    alive = _live(description)
    supervisors = [pid for pid, kind in alive if kind == "supervisor"]
    children = [pid for pid, kind in alive if kind == "process"]
    _terminate(supervisors, grace=2 * grace + 5)  # it takes up to grace per stage to stop
    _terminate([pid for pid in children if running(pid)], grace=grace)
    zookeeper = description.get("zookeeper") or {}
    if zookeeper.get("embedded") and zookeeper.get("data_dir"):
        stop_detached(zookeeper["data_dir"], timeout=grace)
    left = [pid for pid, _kind in _live(description)]
    if left:
        raise ClusterError(f"could not stop processes {left} of cluster {description['cluster']}")
    (state_dir / STATE_FILE).unlink(missing_ok=True)
    if out is not None:
        print(f"stopped {len(alive)} processes of cluster {description.get('cluster')}", file=out)
    return len(alive)


def _live(description: dict[str, Any]) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    supervisor = int(description.get("supervisor") or 0)
    supervising = not description.get("detached") or description.get("status") == "starting"
    if (
        supervisor
        and supervisor != os.getpid()
        and supervising
        and _same_process(supervisor, description.get("supervisor_start_time"), " up")
    ):
        found.append((supervisor, "supervisor"))
    for entry in description.get("processes") or []:
        pid = int(entry.get("pid") or 0)
        if pid and _same_process(pid, entry.get("start_time"), "broker.cli run"):
            found.append((pid, "process"))
    for entry in description.get("autoscalers") or []:
        pid = int(entry.get("pid") or 0)
        if pid and _same_process(pid, entry.get("start_time"), "broker.cli autoscaler"):
            found.append((pid, "process"))
    zookeeper = description.get("zookeeper") or {}
    pid = int(zookeeper.get("pid") or 0)
    embedded = bool(zookeeper.get("embedded"))
    if embedded and pid and _same_process(pid, zookeeper.get("start_time"), "ZooKeeperServerMain"):
        found.append((pid, "zookeeper"))
    return found


def _terminate(pids: list[int], *, grace: float) -> None:
    """SIGTERM ``pids``, wait up to ``grace`` seconds, SIGKILL what is left and wait for it."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        pids = [pid for pid in pids if running(pid)]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        _wait_gone(pids, wait)


def _wait_gone(pids: Iterable[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    pids = list(pids)
    while any(running(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def _may_be_alive(member: Member) -> bool:
    """False for a registration on this host whose process is gone (its session lingers)."""
    return not (member.address.startswith("127.") and not running(member.pid))


def _exited_while_starting(child: _Child) -> ClusterError:
    return ClusterError(
        f"{child.role.value} exited with {child.process.returncode} while starting "
        f"(log: {child.log}):\n{_tail(child.log)}"
    )


def _stat_fields(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def _start_time(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks since boot (None if it is gone)."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields and len(fields) > 19 else None


def _same_process(pid: int, start_time: object, marker: str) -> bool:
    """Whether ``pid`` runs and is the process recorded (its start time, else its command)."""
    if not running(pid):
        return False
    if isinstance(start_time, int):
        return _start_time(pid) == start_time
    return marker in command_line(pid)  # written by an older version: no start time recorded


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# -- changing a running cluster from another process (silbo admin scale) -----------------


def add_processes(
    state_dir: Path, role: Role, count: int, *, timeout: float = 60.0
) -> list[Member]:
    """Start ``count`` more ``role`` processes for the cluster of ``STATE_DIR/cluster.json``.

    They run detached (their own session; logs under the state directory), are recorded in
    cluster.json (so ``silbo down`` stops them) and are returned once registered. They join
    the configuration only through a scale.
    """
    state_dir = Path(state_dir)
    description = read_cluster(state_dir)
    if description is None:
        raise NoCluster(f"no cluster is running from {state_dir.resolve()} (no {STATE_FILE})")
    zk, cluster = description["zookeeper"]["address"], description["cluster"]
    options = ChildOptions.from_dict(description.get("child_options"))
    logs = Path(description.get("state_dir") or state_dir) / "logs"
    taken = {p.get("log") for p in description.get("processes") or []}
    started: list[tuple[subprocess.Popen[bytes], Path]] = []
    number = 1
    for _ in range(count):
        while str(logs / f"{role.value}-{number}.log") in taken:
            number += 1
        log = logs / f"{role.value}-{number}.log"
        taken.add(str(log))
        process = spawn_process(
            role, number, zk=zk, cluster=cluster, listen=f"{HOST}:0", options=options, log=log
        )
        started.append((process, log))
    client = connect(zk, cluster=cluster, timeout=10.0)
    try:
        deadline = time.monotonic() + timeout
        while True:
            by_pid = {m.pid: m for m in members(client, role.value)}
            if all(p.pid in by_pid for p, _log in started):
                break
            exited = [(p, log) for p, log in started if p.poll() is not None]
            if exited or time.monotonic() > deadline:
                for process, _log in started:
                    process.kill()
                why = f"exited:\n{_tail(exited[0][1])}" if exited else "did not register in time"
                raise ClusterError(f"a new {role.value} {why}")
            time.sleep(0.05)
    finally:
        close(client, CLOSE_WITHIN)
    new = [by_pid[p.pid] for p, _log in started]
    entries = [
        {
            "role": role.value,
            "name": member.name,
            "pid": member.pid,
            "start_time": _start_time(member.pid),
            "address": member.endpoint,
            "internal": member.address,
            "metrics": member.metrics,
            "log": str(log),
        }
        for member, (_p, log) in zip(new, started, strict=True)
    ]
    update_description(state_dir, lambda d: d.setdefault("processes", []).extend(entries))
    return new


def registered_slots(
    state_dir: Path, client: KazooClient, role: Role, *, timeout: float = 30.0
) -> dict[str, int]:
    """The slot number of each registered ``role`` process of cluster.json, by member name,
    once every one of them is registered: a process the supervisor is restarting (dead, or
    started and not registered yet) is waited for, at most ``timeout`` seconds, so that a
    scale decides on the whole layer (and one it did not see cannot come back over the size
    it asked for). Past the timeout, or with no ``silbo up`` supervising, the registered
    ones."""
    deadline = time.monotonic() + timeout
    while True:
        description = read_cluster(Path(state_dir)) or {}
        entries = [p for p in description.get("processes") or [] if p.get("role") == role.value]
        by_pid = {m.pid: m for m in members(client, role.value)}
        slots = {
            by_pid[int(p["pid"])].name: _slot_number(p)
            for p in entries
            if int(p.get("pid") or 0) in by_pid
        }
        supervisor = int(description.get("supervisor") or 0)
        supervised = _same_process(supervisor, description.get("supervisor_start_time"), " up")
        if len(slots) == len(entries) or not supervised or time.monotonic() > deadline:
            return slots
        time.sleep(0.1)


def _slot_number(entry: dict[str, Any]) -> int:
    found = re.search(r"-(\d+)\.log$", str(entry.get("log") or ""))
    return int(found.group(1)) if found else 1 << 30


def retire_processes(state_dir: Path, names: Iterable[str], *, grace: float = STOP_GRACE) -> int:
    """Stop the processes of cluster.json with these member names; how many were running.

    They leave cluster.json first, so that a supervisor does not take their exit for a death.
    """
    wanted = set(names)
    return _retire(Path(state_dir), lambda p: p.get("name") in wanted, grace)


def retire_all_but(state_dir: Path, role: Role, keep: Iterable[Member]) -> int:
    """Stop every process of ``role`` in cluster.json but the members ``keep``: the ones a
    scale leaves out, and a dead one the supervisor is restarting (not registered again yet,
    so no scale saw it), which would otherwise come back over the size asked for. A kept
    member is known by its pid too: the supervisor names a restarted one's entry only after
    it registered. How many were running."""
    names = {m.name for m in keep}
    pids = {m.pid for m in keep}

    def leaves(entry: dict[str, Any]) -> bool:
        if entry.get("role") != role.value:
            return False
        return entry.get("name") not in names and int(entry.get("pid") or 0) not in pids

    return _retire(Path(state_dir), leaves, STOP_GRACE)


def _retire(state_dir: Path, leaves: Callable[[dict[str, Any]], bool], grace: float) -> int:
    """Take the processes ``leaves`` picks out of cluster.json, then stop them."""
    leaving: list[dict[str, Any]] = []

    def remove(description: dict[str, Any]) -> None:
        processes = description.get("processes") or []
        leaving.extend(p for p in processes if leaves(p))
        description["processes"] = [p for p in processes if not leaves(p)]

    if update_description(state_dir, remove) is None:
        raise NoCluster(f"no cluster is running from {state_dir.resolve()} (no {STATE_FILE})")
    pids = [
        int(p["pid"])
        for p in leaving
        if _same_process(int(p.get("pid") or 0), p.get("start_time"), "broker.cli run")
    ]
    _terminate(pids, grace=grace)
    return len(pids)


@contextlib.contextmanager
def _description_lock(state_dir: Path) -> Iterator[None]:
    """Serialise read-modify-writes of cluster.json (supervisor, admin scale)."""
    fd = os.open(Path(state_dir) / f"{STATE_FILE}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def update_description(
    state_dir: Path, change: Callable[[dict[str, Any]], None]
) -> dict[str, Any] | None:
    """Apply ``change`` to cluster.json under its lock and write it back; the new content
    (None, and nothing written, when there is no cluster.json)."""
    with _description_lock(state_dir):
        description = read_cluster(state_dir)
        if description is None:
            return None
        change(description)
        _rewrite(Path(state_dir), description)
        return description


def _rewrite(state_dir: Path, description: dict[str, Any]) -> None:
    description["endpoints"] = [
        p["address"]
        for p in description.get("processes") or []
        if p.get("role") == Role.CONNECTION_POINT.value and p.get("address")
    ]
    path = state_dir / STATE_FILE
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(description, indent=2) + "\n")
    tmp.replace(path)
    write_layout(state_dir, layout_of(description.get("processes") or []))


def _port_taken(port: int, detail: str) -> AddressInUse:
    return AddressInUse(
        f"port {port} ({HOST}:{port}) is {detail}; choose another with --grpc-port "
        "(0: any free port)",
        port=port,
    )


def store_id_of(number: int) -> str:
    """The store id of context store slot ``number`` (from 1) of a local cluster."""
    return f"store-{number}"
