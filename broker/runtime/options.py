"""The options of one broker process, validated all at once (every problem reported)."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass

from broker.addresses import parse_address
from broker.archive.location import location
from broker.errors import InvalidInput
from broker.ngsi.cors_options import DEFAULT_MAX_AGE, cors_problems
from broker.ngsi.retry import DEFAULT_WINDOW, window_problem
from broker.store.history import HistoryOptions

# seconds a dead connection point's sessions can be resumed: its deliveries are kept that
# long once it became unreachable, and the matchers match its subscriptions that long after
# it left (--session-grace; broker/runtime/retained.py)
SESSION_GRACE = 30.0
MAX_SESSION_GRACE = 3600.0  # seconds: what is kept for a dead connection point is bounded
PEER_HANG_AFTER = 5.0  # seconds without an answer before the repairer declares a member dead
DEFAULT_ARCHIVE_INTERVAL = 30.0  # seconds between two batches of the archiver
DEFAULT_ARCHIVE_ROWS = 100_000  # changes one batch of the archiver takes at most

__all__ = ["PEER_HANG_AFTER", "ProcessOptions", "Role", "max_rate_problem", "parse_address"]

DEFAULT_CLUSTER = "silbo"


class Role(enum.Enum):
    """The layers; the value is the name used on the command line and in ZooKeeper."""

    CONNECTION_POINT = "connection-point"
    ACCESS_POINT = "access-point"
    MATCHER = "matcher"
    EXIT_POINT = "exit-point"
    CONTEXT_STORE = "context-store"
    ARCHIVER = "archiver"


@dataclass(frozen=True, slots=True)
class ProcessOptions:
    """How to run one process: its role, ZooKeeper, cluster and addresses.

    ``listen`` is where its gRPC server binds; ``advertise`` is the address others use to
    reach it (default: ``listen``, with the port the server got when ``listen`` said 0).
    ``internal_listen`` (connection points) is where its internal services bind (the
    ``Delivery`` stream of the exit points, ``Admin``); ``listen`` then serves the client API
    only. Default: ``listen``'s host, any port; the address others use has ``advertise``'s
    host when that is set.
    ``metrics_listen`` is where its Prometheus endpoint binds ('' for none).
    ``http_listen`` is where a connection point serves NGSI v2 over HTTP ('' for not at all);
    ``notify_allow`` adds hosts or networks its HTTP notifications may go to (docs/ngsi.md);
    ``status_flush`` is how often (seconds) its HTTP subscriptions' counters are saved;
    ``http_read_timeout`` how long (seconds) an HTTP client may take to send a request's
    head or body (and stay idle between requests).
    ``retry_window`` how long (seconds) an HTTP notification is retried for, by default.
    ``cors_origin`` the origin the HTTP front allows cross-origin requests from (``__ALL``:
    any; '' for no CORS), ``cors_max_age`` how long (seconds) a browser may keep the
    answer to a preflight (broker.ngsi.cors).
    ``spark_offload`` makes a matcher match batches of at least that many updates on Spark
    (0: never), on ``spark_master`` ('' for local; docs/spark.md).
    ``session_grace``: how long (seconds) a dead connection point's client sessions can be
    resumed at another one (matchers and exit points; broker/runtime/retained.py).
    ``peer_hang_after``: while this process is the elected repairer, a member that leaves
    ``Admin.Status`` unanswered that long (seconds) is declared dead (0: never;
    broker.runtime.liveness).
    ``store_dir`` (context stores, required) is the directory a store keeps its entities in,
    ``store_id`` its stable id (default: the one the directory records, else ``store-`` and
    the directory's name), ``store_engine`` the embedded storage of a new directory
    (broker.store.engine; an existing one keeps its own); ``history`` whether it records the
    history of its entities' attributes, ``history_retention`` how long it keeps raw rows
    and each level (broker.store.history: ``raw=7d,minute=14d,...``; '' for the defaults),
    recording or not; ``archive`` whether it records its changelog for the archiver
    (broker.store.changelog).
    ``archive_root`` (the archiver, required) is where its Parquet files go: a directory or
    a URI of pyarrow's file systems (``s3://bucket/prefix``..., broker.archive.location),
    ``archive_interval`` the seconds between two of its batches, ``archive_rows`` the most
    changes one batch takes (broker.roles.archiver).
    ``max_rate``: the process takes in at most that many data-path items a second (0: no
    cap), to emulate a process of that capacity (broker.runtime.load; docs/autoscaling.md).
    """

    role: Role
    zk: str
    cluster: str = DEFAULT_CLUSTER
    listen: str = "127.0.0.1:0"
    advertise: str = ""
    internal_listen: str = ""
    metrics_listen: str = "127.0.0.1:0"
    zk_timeout: float = 10.0
    http_listen: str = ""
    notify_allow: tuple[str, ...] = ()
    status_flush: float = 10.0
    http_read_timeout: float = 30.0
    retry_window: float = DEFAULT_WINDOW
    cors_origin: str = ""
    cors_max_age: int = DEFAULT_MAX_AGE
    spark_offload: int = 0
    spark_master: str = ""
    peer_hang_after: float = PEER_HANG_AFTER
    session_grace: float = SESSION_GRACE
    store_dir: str = ""
    store_id: str = ""
    store_engine: str = ""
    history: bool = False
    history_retention: str = ""
    archive: bool = False
    archive_root: str = ""
    archive_interval: float = DEFAULT_ARCHIVE_INTERVAL
    archive_rows: int = DEFAULT_ARCHIVE_ROWS
    max_rate: float = 0.0

    def __post_init__(self) -> None:
        problems = []
        if not self.zk or "/" in self.zk:
            problems.append(f"--zk {self.zk!r} must be HOST:PORT[,HOST:PORT...] (no chroot)")
        for what, value in (
            ("--listen", self.listen),
            ("--advertise", self.advertise),
            ("--internal-listen", self.internal_listen),
            ("--metrics-listen", self.metrics_listen),
            ("--http-listen", self.http_listen),
        ):
            if value:
                try:
                    parse_address(value, what)
                except InvalidInput as exc:
                    problems.append(str(exc))
        if not self.cluster or "/" in self.cluster:
            problems.append(f"--cluster {self.cluster!r} must be a non-empty name without '/'")
        if self.http_listen and self.role is not Role.CONNECTION_POINT:
            problems.append("--http-listen is for connection points only")
        if self.internal_listen and self.role is not Role.CONNECTION_POINT:
            problems.append(
                "--internal-listen is for connection points only (the other roles serve "
                "internal services only, on --listen)"
            )
        if not self.status_flush > 0:
            problems.append(f"--status-flush must be positive seconds, not {self.status_flush}")
        if not self.http_read_timeout > 0:
            problems.append(
                f"--http-read-timeout must be positive seconds, not {self.http_read_timeout}"
            )
        if (problem := window_problem(self.retry_window, "--retry-window")) is not None:
            problems.append(problem)
        problems.extend(cors_problems(self.cors_origin, self.cors_max_age))
        if self.spark_offload < 0:
            problems.append("--spark-offload must not be negative")
        if (self.spark_offload or self.spark_master) and self.role is not Role.MATCHER:
            problems.append("--spark-offload and --spark-master are for matchers only")
        if self.role is Role.CONTEXT_STORE and not self.store_dir:
            problems.append("a context store needs --store-dir (where it keeps its entities)")
        if (self.store_dir or self.store_id or self.store_engine) and (
            self.role is not Role.CONTEXT_STORE
        ):
            problems.append("--store-dir, --store-id and --store-engine are for context stores")
        if (self.history_retention or self.history) and self.role is not Role.CONTEXT_STORE:
            problems.append("--history and --history-retention are for context stores")
        problems.extend(self._archive_problems())
        try:
            HistoryOptions.parse(self.history_retention)
        except InvalidInput as exc:
            problems.append(str(exc))
        if not 0 <= self.session_grace <= MAX_SESSION_GRACE:
            problems.append(
                f"--session-grace must be 0 to {MAX_SESSION_GRACE:g} seconds, "
                f"not {self.session_grace:g}"
            )
        if self.peer_hang_after < 0:
            problems.append(f"--peer-hang-after must not be negative, not {self.peer_hang_after}")
        if (problem := max_rate_problem(self.max_rate)) is not None:
            problems.append(problem)
        if self.zk_timeout <= 0:
            problems.append("the ZooKeeper timeout must be positive")
        if problems:
            raise InvalidInput("; ".join(problems))

    def _archive_problems(self) -> list[str]:
        problems = []
        if self.archive and self.role is not Role.CONTEXT_STORE:
            problems.append("--archive on|off is for context stores")
        if self.role is Role.ARCHIVER and not self.archive_root:
            problems.append("the archiver needs --archive PATH|URI (where its Parquet files go)")
        if self.archive_root:
            try:
                location(self.archive_root)
            except InvalidInput as exc:
                problems.append(str(exc))
        if self.archive_root and self.role is not Role.ARCHIVER:
            problems.append(
                "--archive is for context stores (on|off) and the archiver (PATH|URI), not a "
                f"{self.role.value}"
            )
        if not (math.isfinite(self.archive_interval) and self.archive_interval > 0):
            problems.append(
                f"--archive-interval must be positive seconds, not {self.archive_interval:g}"
            )
        if self.archive_rows < 1:
            problems.append(f"--archive-rows must be at least 1, not {self.archive_rows}")
        return problems


def max_rate_problem(rate: float, flag: str = "--max-rate") -> str | None:
    """What is wrong with a ``--max-rate`` (None: nothing)."""
    if math.isfinite(rate) and rate >= 0:
        return None
    return f"{flag} must be a number of items a second, 0 or more (0: no cap), not {rate:g}"
