"""``silbo run ROLE``: run one broker process in the foreground (what compose/ uses).

    silbo run connection-point|access-point|matcher|exit-point|context-store|archiver
        --zk HOST:PORT[,...]
        [--cluster NAME] [--listen HOST:PORT] [--advertise HOST:PORT]
        [--internal-listen HOST:PORT]
        [--metrics-listen HOST:PORT] [--zk-timeout S] [--peer-hang-after S]
        [--log-level LEVEL]
        [--http-listen HOST:PORT [--notify-allow CIDR_OR_HOST ...] [--status-flush S]
         [--http-read-timeout S]]
                                                                      (connection points)
        [--store-dir DIR [--store-id ID] [--store-engine rocksdb|lmdb]
         [--history on|off] [--history-retention raw=7d,minute=14d,...]
         [--archive on|off]]                                          (context stores)
        [--archive PATH|URI [--archive-interval S] [--archive-rows N]]  (the archiver)
        [--max-rate N]                 (serve at most N items/s: capacity emulation)

It stops cleanly on SIGTERM or Ctrl-C. Errors a user can fix (an unreachable ZooKeeper, a
port in use, bad options) are one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable

from broker.errors import InvalidInput, SilboError
from broker.ngsi.allow import AllowList
from broker.ngsi.cors_options import ALL_ORIGINS, DEFAULT_MAX_AGE
from broker.ngsi.retry import DEFAULT_WINDOW
from broker.runtime.options import (
    DEFAULT_ARCHIVE_INTERVAL,
    DEFAULT_ARCHIVE_ROWS,
    DEFAULT_CLUSTER,
    PEER_HANG_AFTER,
    SESSION_GRACE,
    ProcessOptions,
    Role,
)
from broker.runtime.process import RoleService, run_process
from broker.runtime.token import TOKEN_ENV
from broker.store.engine import DEFAULT_ENGINE, ENGINES

__all__ = ["ROLES", "configure", "run"]

# each role's module and class, imported only by the process that runs it (a matcher need
# not import the HTTP front and aiohttp: a third of its start-up)
ROLES: dict[Role, tuple[str, str]] = {
    Role.CONNECTION_POINT: ("broker.roles.connection_point", "ConnectionPoint"),
    Role.ACCESS_POINT: ("broker.roles.access_point", "AccessPoint"),
    Role.MATCHER: ("broker.roles.matcher", "Matcher"),
    Role.EXIT_POINT: ("broker.roles.exit_point", "ExitPoint"),
    Role.CONTEXT_STORE: ("broker.roles.context_store", "ContextStore"),
    Role.ARCHIVER: ("broker.roles.archiver", "Archiver"),
}


def role_class(role: Role) -> Callable[[], RoleService]:
    """The class of ``role``'s service, its module imported now."""
    module, name = ROLES[role]
    found: Callable[[], RoleService] = getattr(importlib.import_module(module), name)
    return found


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``silbo run``."""
    parser.add_argument("role", choices=[r.value for r in Role], help="the layer to run")
    parser.add_argument("--zk", required=True, help="ZooKeeper: HOST:PORT[,HOST:PORT...]")
    add_cluster_token(parser)
    parser.add_argument("--cluster", default=DEFAULT_CLUSTER, help="the cluster's name")
    parser.add_argument("--listen", default="127.0.0.1:0", help="gRPC address (port 0: any)")
    parser.add_argument("--advertise", default="", help="address peers use (default: --listen)")
    parser.add_argument(
        "--internal-listen",
        default="",
        help="connection points: the gRPC address of the internal services (exit points' "
        "deliveries, admin), --listen serving clients only (default: --listen's host, any port)",
    )
    parser.add_argument(
        "--metrics-listen", default="127.0.0.1:0", help="Prometheus endpoint ('' for none)"
    )
    parser.add_argument("--zk-timeout", type=float, default=10.0, help="seconds to reach ZooKeeper")
    parser.add_argument(
        "--peer-hang-after",
        type=float,
        default=PEER_HANG_AFTER,
        help="while this process is the cluster's repairer: seconds a member may leave its "
        f"liveness probe unanswered before it is declared dead (default {PEER_HANG_AFTER:g}; "
        "0: never, a hung member is then seen when its ZooKeeper session expires)",
    )
    parser.add_argument("--log-level", default="INFO", help="logging level (default INFO)")
    parser.add_argument(
        "--http-listen", default="", help="connection points: serve NGSI v2 HTTP here (port 0: any)"
    )
    parser.add_argument(
        "--notify-allow",
        action="append",
        default=[],
        metavar="CIDR_OR_HOST",
        help="a network or host HTTP notifications may go to, besides loopback (repeatable)",
    )
    parser.add_argument(
        "--store-dir",
        default="",
        help="context stores: the directory the store keeps its entities in (required)",
    )
    parser.add_argument(
        "--store-id",
        default="",
        help="context stores: the store's stable id (default: the one its directory records, "
        "else store-DIRNAME)",
    )
    parser.add_argument(
        "--store-engine",
        default="",
        choices=["", *ENGINES],
        help=f"context stores: the embedded storage of a new directory (default {DEFAULT_ENGINE})",
    )
    parser.add_argument(
        "--history",
        default="off",
        choices=["on", "off"],
        help="context stores: record the history of attributes, served as STH-Comet's API "
        "(default off: it costs a write about twice its CPU; docs/history.md)",
    )
    parser.add_argument(
        "--history-retention",
        default="",
        metavar="KIND=DURATION,...",
        help="context stores: how long raw rows and the stored levels (minute, hour, day) are "
        "kept: a duration (30s, 15m, 12h, 7d, 2w, 5y), off or forever "
        "(default raw=7d,minute=14d,hour=180d,day=5y; docs/history.md)",
    )
    parser.add_argument(
        "--archive",
        default="",
        metavar="on|off|PATH|URI",
        help="context stores: on records every change for the archiver (default off; "
        "docs/archive.md); the archiver: where the archive's Parquet files go, a directory "
        "or a URI such as s3://bucket/prefix",
    )
    add_archive_batches(parser)
    add_status_flush(parser)
    add_http_read_timeout(parser)
    add_retry_window(parser)
    add_session_grace(parser)
    add_cors(parser)
    add_spark_offload(parser)
    parser.add_argument(
        "--spark-master", default="", help="matchers: the Spark master URL (default local[*])"
    )
    parser.add_argument(
        "--max-rate",
        type=float,
        default=0.0,
        metavar="N",
        help="take in at most N data-path items a second, to emulate a process of that "
        "capacity (docs/autoscaling.md; default 0: no cap)",
    )
    parser.set_defaults(handler=run)


def add_archive_batches(parser: argparse.ArgumentParser) -> None:
    """Add ``--archive-interval S`` and ``--archive-rows N`` (``silbo run archiver`` and
    ``silbo up``: docs/archive.md)."""
    parser.add_argument(
        "--archive-interval",
        type=float,
        default=DEFAULT_ARCHIVE_INTERVAL,
        metavar="S",
        help="the archiver: seconds between two batches, each a Parquet file per tenant, day "
        f"and type (default {DEFAULT_ARCHIVE_INTERVAL:g})",
    )
    parser.add_argument(
        "--archive-rows",
        type=int,
        default=DEFAULT_ARCHIVE_ROWS,
        metavar="N",
        help="the archiver: the most changes one batch takes; a full batch is followed by the "
        f"next at once (default {DEFAULT_ARCHIVE_ROWS})",
    )


def archive_options(role: str, value: str) -> tuple[bool, str]:
    """``--archive``'s (record changes, archive root) for ``role``: on|off for a context
    store, a path for the archiver (InvalidInput otherwise)."""
    if role == Role.CONTEXT_STORE.value:
        if value not in ("", "on", "off"):
            raise InvalidInput(f"--archive of a context store is on or off, not {value!r}")
        return value == "on", ""
    return False, value


def add_status_flush(parser: argparse.ArgumentParser) -> None:
    """Add ``--status-flush S`` (``silbo run`` and ``silbo up``: docs/ngsi.md)."""
    parser.add_argument(
        "--status-flush",
        type=float,
        default=10.0,
        metavar="S",
        help="connection points: seconds between saves of the HTTP subscriptions' counters "
        "to ZooKeeper (default 10)",
    )


def add_http_read_timeout(parser: argparse.ArgumentParser) -> None:
    """Add ``--http-read-timeout S`` (``silbo run`` and ``silbo up``: docs/ngsi.md)."""
    parser.add_argument(
        "--http-read-timeout",
        type=float,
        default=30.0,
        metavar="S",
        help="connection points: seconds an HTTP client may take to send a request's head or "
        "body, or stay idle between requests (default 30)",
    )


def add_retry_window(parser: argparse.ArgumentParser) -> None:
    """Add ``--retry-window S`` (``silbo run`` and ``silbo up``: docs/ngsi.md)."""
    parser.add_argument(
        "--retry-window",
        type=float,
        default=DEFAULT_WINDOW,
        metavar="S",
        help="connection points: seconds an HTTP notification is retried for, unless its "
        f"subscription sets notification.retryWindow (default {DEFAULT_WINDOW:.0f}; 0: no retries)",
    )


def add_session_grace(parser: argparse.ArgumentParser) -> None:
    """Add ``--session-grace S`` (``silbo run`` and ``silbo up``: docs/failures.md)."""
    parser.add_argument(
        "--session-grace",
        type=float,
        default=SESSION_GRACE,
        metavar="S",
        help="matchers and exit points: seconds a dead connection point's client sessions "
        f"can be resumed at another one, nothing lost (default {SESSION_GRACE:.0f})",
    )


def add_cors(parser: argparse.ArgumentParser) -> None:
    """Add ``--cors-origin ORIGIN`` and ``--cors-max-age S`` (``silbo run`` and ``silbo up``:
    docs/ngsi.md, as Orion's -corsOrigin and -corsMaxAge)."""
    parser.add_argument(
        "--cors-origin",
        default="",
        metavar="ORIGIN",
        help="connection points: answer cross-origin (CORS) requests from this origin "
        f"({ALL_ORIGINS}: any; default: no CORS)",
    )
    parser.add_argument(
        "--cors-max-age",
        type=int,
        default=DEFAULT_MAX_AGE,
        metavar="S",
        help="connection points: seconds a browser may keep the answer to a CORS preflight "
        f"(default {DEFAULT_MAX_AGE})",
    )


def add_spark_offload(parser: argparse.ArgumentParser) -> None:
    """Add ``--spark-offload N`` (``silbo run`` and ``silbo up``: docs/spark.md)."""
    parser.add_argument(
        "--spark-offload",
        type=int,
        default=0,
        metavar="N",
        help="matchers match batches of N updates or more on Spark (default 0: off)",
    )


def add_cluster_token(parser: argparse.ArgumentParser) -> None:
    """``--cluster-token``: what guards the internal services (broker.runtime.token)."""
    parser.add_argument(
        "--cluster-token",
        default=None,
        metavar="TOKEN",
        help=f"internal calls must carry this token (default: ${TOKEN_ENV}; none: not checked); "
        f"prefer ${TOKEN_ENV}, which ps does not show",
    )


def use_cluster_token(args: argparse.Namespace) -> None:
    """Make ``--cluster-token`` this process's (and its children's) token."""
    if getattr(args, "cluster_token", None):
        os.environ[TOKEN_ENV] = args.cluster_token


def set_up_logging(level: str) -> None:
    """A process's log: ``level`` and up on stderr, one line each, kazoo's warnings only."""
    logging.basicConfig(
        level=level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("kazoo").setLevel(logging.WARNING)


def run(args: argparse.Namespace) -> int:
    """Run the process until it is stopped; 0 after a clean stop, 2 on a user error."""
    use_cluster_token(args)
    set_up_logging(args.log_level)
    try:
        archive, archive_root = archive_options(args.role, args.archive)
        options = ProcessOptions(
            role=Role(args.role),
            zk=args.zk,
            cluster=args.cluster,
            listen=args.listen,
            advertise=args.advertise,
            internal_listen=args.internal_listen,
            metrics_listen=args.metrics_listen,
            zk_timeout=args.zk_timeout,
            http_listen=args.http_listen,
            notify_allow=tuple(args.notify_allow),
            status_flush=args.status_flush,
            http_read_timeout=args.http_read_timeout,
            retry_window=args.retry_window,
            cors_origin=args.cors_origin,
            cors_max_age=args.cors_max_age,
            spark_offload=args.spark_offload,
            spark_master=args.spark_master,
            peer_hang_after=args.peer_hang_after,
            session_grace=args.session_grace,
            store_dir=args.store_dir,
            store_id=args.store_id,
            store_engine=args.store_engine,
            history=args.history == "on",
            history_retention=args.history_retention,
            archive=archive,
            archive_root=archive_root,
            archive_interval=args.archive_interval,
            archive_rows=args.archive_rows,
            max_rate=args.max_rate,
        )
        AllowList.parse(options.notify_allow)  # a bad entry is an error before anything starts
        return run_process(options, role_class(options.role))
    except SilboError as exc:
        print(f"silbo run {args.role}: error: {exc}", file=sys.stderr)
        return 2
