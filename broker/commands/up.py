"""``silbo up``: start a whole cluster on this machine.

    silbo up [--matchers 2] [--access-points 1] [--exit-points 1] [--connection-points 1]
             [--context-stores 2]
        [--grpc-port 7777] [--http-port PORT [--notify-allow CIDR_OR_HOST ...]
        [--status-flush S] [--http-read-timeout S]]
        [--zk HOST:PORT] [--cluster NAME] [--state-dir .silbo]
        [--detach] [--hang-after 1.25] [--log-level INFO] [--timeout 60]
        [--max-rate LAYER=N ...]     (capacity emulation: docs/autoscaling.md)
        [--autoscale [--autoscale-interval 2]]   (automatic scaling: docs/autoscaling.md)
        [--archive PATH|URI [--archive-interval S]]  (the archive of every change: docs/archive.md)

Without ``--zk`` an embedded ZooKeeper is started too, its data kept under
STATE_DIR/zookeeper: a cluster started again from the same state directory has its HTTP
subscriptions and their statuses, and each layer the size it last had (after scales) unless
a count is given (``silbo down --purge`` starts from nothing; broker.cluster.durable). Every
process logs to STATE_DIR/logs; STATE_DIR/cluster.json describes the cluster (what ``silbo
down`` and ``silbo admin status --state-dir`` read).

- In the foreground (the default) it serves until Ctrl-C, SIGTERM or SIGHUP (or ``silbo
  down``), then stops every process and ZooKeeper and exits 0. It supervises meanwhile
  (broker.cluster.supervisor): a process that dies is reported, restarted with backoff and
  taken back into its layer; the embedded ZooKeeper is restarted on its port and data.
  A process stopped for ``--hang-after`` seconds (1.25 by default), or whose event loop
  leaves the liveness probe unanswered 8 times as long, is killed as hung, and so restarted
  (broker.cluster.liveness); the processes' own probe (the elected repairer's,
  broker.runtime.liveness) declares a silent one dead after 8 times as long too.
  ``--hang-after 0`` turns both off.
  With ``--archive PATH`` the context stores record every change they apply and an
  archiver process (``silbo run archiver``, log ``archiver-1.log``) moves them to Parquet
  files under PATH, or a URI such as ``s3://bucket/prefix`` (broker.archive.location),
  supervised as the others (``silbo archive status``).
  With ``--autoscale`` it also starts two autoscaling controllers (``silbo autoscaler``,
  logs ``autoscaler-N.log``): one leads and scales the layers with their load, the other
  stands by. A controller that dies is not restarted (the other leads on).
  If the supervisor itself is killed (even by SIGKILL), its children die with it (a
  parent-death signal).
- With ``--detach`` it starts the same command without ``--detach`` as a daemon (its own
  session, output in STATE_DIR/logs/supervisor.log): the supervisor, which starts and
  supervises the cluster as in the foreground. It returns once the daemon reports the
  cluster running (its summary printed), or with the daemon's error and exit status; the
  processes hold none of the caller's terminal or pipes (``silbo up --detach | cat`` returns).
  A stop signal while starting stops the daemon, and so everything it started.
  Stop them with ``silbo down``.

Exit status: 0 once up (detached) or after a requested stop (foreground); 2 for an error the
user can fix (a bad count, a port in use, a cluster already running from the state dir, no
Java, an unreachable ``--zk``), one line on stderr, with nothing left running; 1 if the
cluster failed to start; 128+N when signal N interrupted the start.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

from broker.cluster.durable import read_layout
from broker.cluster.liveness import HANG_AFTER
from broker.cluster.local import (
    ClusterBusy,
    ClusterSpec,
    LocalCluster,
    read_cluster,
)
from broker.cluster.supervisor import CHECK_INTERVAL, Supervisor
from broker.commands.run import (
    add_cluster_token,
    add_cors,
    add_http_read_timeout,
    add_retry_window,
    add_session_grace,
    add_spark_offload,
    add_status_flush,
    use_cluster_token,
)
from broker.coordination.configuration import DEFAULT_REPLICAS
from broker.coordination.errors import (
    JavaNotFound,
    ZooKeeperJarsNotFound,
    ZooKeeperUnavailable,
)
from broker.errors import AddressInUse, InvalidInput, SilboError
from broker.runtime.options import DEFAULT_ARCHIVE_INTERVAL, DEFAULT_CLUSTER, PEER_HANG_AFTER

__all__ = ["HELP", "configure", "main", "run"]

HELP = "start a whole cluster on this machine (and ZooKeeper, unless --zk is given)"
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
_USER_ERRORS: tuple[type[SilboError], ...] = (
    InvalidInput,
    ClusterBusy,
    AddressInUse,
    JavaNotFound,
    ZooKeeperJarsNotFound,
    ZooKeeperUnavailable,
)


class Stopped(BaseException):
    """Raised (by our signal handler) in the main thread when a stop signal arrives."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


_DEFAULT_SIZES = {
    "matchers": 2,
    "access_points": 1,
    "exit_points": 1,
    "connection_points": 1,
    "context_stores": 2,  # with --replicas 2 (the default), every write on both
}


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``silbo up``."""
    counts = (
        ("matchers", "matcher processes"),
        ("access_points", "access point processes"),
        ("exit_points", "exit point processes"),
        ("connection_points", "connection point processes (what clients connect to)"),
        (
            "context_stores",
            "context store processes (the entities; fixed once the cluster has data)",
        ),
    )
    for layer, what in counts:
        parser.add_argument(
            f"--{layer.replace('_', '-')}",
            type=int,
            default=None,
            help=f"{what} (default: as the state directory's last run left it, else "
            f"{_DEFAULT_SIZES[layer]})",
        )
    parser.add_argument(
        "--grpc-port",
        type=int,
        default=7777,
        help="the first connection point's port; the next ones count up (0: any free port)",
    )
    parser.add_argument(
        "--http-port",
        type=int,
        default=None,
        help="serve NGSI v2 over HTTP: the first connection point's port, the next ones count "
        "up (0: any free port; default: no HTTP)",
    )
    parser.add_argument(
        "--notify-allow",
        action="append",
        default=[],
        metavar="CIDR_OR_HOST",
        help="a network or host HTTP notifications may go to, besides loopback (repeatable)",
    )
    parser.add_argument(
        "--replicas",
        type=int,
        default=DEFAULT_REPLICAS,
        help="matchers that hold each subscription, so that one dies or hangs without a "
        f"notification lost (default {DEFAULT_REPLICAS}; 1: no copies). A cluster formed "
        "before keeps the count it was formed with",
    )
    add_cluster_token(parser)
    add_status_flush(parser)
    add_http_read_timeout(parser)
    add_retry_window(parser)
    add_session_grace(parser)
    add_cors(parser)
    add_spark_offload(parser)
    parser.add_argument(
        "--history",
        default="off",
        choices=["on", "off"],
        help="the context stores record the history of attributes, served as STH-Comet's "
        "API (default off: it costs a write about twice its CPU; docs/history.md)",
    )
    parser.add_argument(
        "--history-retention",
        default="",
        metavar="KIND=DURATION,...",
        help="how long the context stores keep raw rows and the stored levels (minute, hour, "
        "day): a duration (30s, 15m, 12h, 7d, 2w, 5y), off or forever "
        "(default raw=7d,minute=14d,hour=180d,day=5y; docs/history.md)",
    )
    parser.add_argument(
        "--archive",
        default="",
        metavar="PATH|URI",
        help="archive every change the context stores apply as Parquet files under PATH, or "
        "a URI such as s3://bucket/prefix, by an archiver process (default: no archive; "
        "docs/archive.md, silbo archive status)",
    )
    parser.add_argument(
        "--archive-interval",
        type=float,
        default=DEFAULT_ARCHIVE_INTERVAL,
        metavar="S",
        help="seconds between two batches of the archiver, each a Parquet file per tenant, day "
        f"and type (default {DEFAULT_ARCHIVE_INTERVAL:g})",
    )
    parser.add_argument(
        "--zk", default=None, help="use this ZooKeeper (HOST:PORT[,...]) instead of an embedded one"
    )
    parser.add_argument("--cluster", default=DEFAULT_CLUSTER, help="the cluster's name")
    parser.add_argument(
        "--state-dir", default=".silbo", help="cluster.json, logs and ZooKeeper's data"
    )
    parser.add_argument(
        "--detach", action="store_true", help="return once the cluster serves; stop it with down"
    )
    parser.add_argument(
        "--hang-after",
        type=float,
        default=HANG_AFTER,
        help="seconds a process may stay stopped (SIGSTOP) before the supervisor kills it as "
        f"hung and restarts it (default {HANG_AFTER:g}); its event loop may leave the liveness "
        "probe unanswered 8 times as long. 0: no such watch; a hung process is then seen when "
        "its ZooKeeper session expires",
    )
    parser.add_argument("--log-level", default="INFO", help="the processes' logging level")
    parser.add_argument(
        "--max-rate",
        action="append",
        default=[],
        metavar="LAYER=N",
        help="every process of LAYER (e.g. matcher) takes in at most N data-path items a "
        "second, to emulate processes of that capacity (repeatable; docs/autoscaling.md)",
    )
    parser.add_argument(
        "--autoscale",
        action="store_true",
        help="start two autoscaling controllers (one leads, one stands by): every layer is "
        "scaled with its load (docs/autoscaling.md; silbo admin autoscale on|off|status|set)",
    )
    parser.add_argument(
        "--autoscale-record",
        action="store_true",
        help="the controllers record each round's observation and decisions, a JSON line, in "
        "STATE_DIR/logs/autoscaler-N.observations.jsonl (silbo autoscaler --record)",
    )
    parser.add_argument(
        "--autoscale-interval",
        type=float,
        default=2.0,
        help="seconds between two observations of the layers by the autoscaler (default 2)",
    )
    parser.add_argument(
        "--timeout", type=float, default=60.0, help="seconds to wait for every process to register"
    )
    parser.set_defaults(handler=run)


def layer_sizes(args: argparse.Namespace) -> dict[str, int]:
    """Each layer's size: as given, else as the state directory's last run left it (after
    its scales; broker.cluster.durable), else the default."""
    kept = read_layout(Path(args.state_dir)) if args.zk is None else {}
    return {
        layer: given if (given := getattr(args, layer)) is not None else kept.get(layer, default)
        for layer, default in _DEFAULT_SIZES.items()
    }


def parse_max_rates(values: Sequence[str]) -> tuple[tuple[str, float], ...]:
    """``--max-rate LAYER=N`` values as (layer, N) pairs (checked by ClusterSpec)."""
    rates = []
    for value in values:
        layer, equals, number = value.partition("=")
        try:
            rates.append((layer.strip(), float(number)))
        except ValueError:
            raise InvalidInput(
                f"--max-rate {value!r} must be LAYER=N (e.g. matcher=200)"
                + ("" if equals else ": the '=' is missing")
            ) from None
    return tuple(rates)


def run(args: argparse.Namespace) -> int:
    """Start the cluster; in the foreground, serve until stopped (see the module doc)."""
    use_cluster_token(args)
    if args.hang_after < 0:
        return _error(InvalidInput(f"--hang-after must be 0 or more, not {args.hang_after:g}"), 2)
    if args.detach:
        return _start_daemon(args)
    sizes = layer_sizes(args)
    try:
        spec = ClusterSpec(
            max_rates=parse_max_rates(args.max_rate),
            matchers=sizes["matchers"],
            access_points=sizes["access_points"],
            exit_points=sizes["exit_points"],
            connection_points=sizes["connection_points"],
            context_stores=sizes["context_stores"],
            grpc_port=args.grpc_port,
            http_port=args.http_port,
            notify_allow=tuple(args.notify_allow),
            status_flush=args.status_flush,
            http_read_timeout=args.http_read_timeout,
            retry_window=args.retry_window,
            session_grace=args.session_grace,
            cors_origin=args.cors_origin,
            cors_max_age=args.cors_max_age,
            spark_offload=args.spark_offload,
            store_history=args.history == "on",
            history_retention=args.history_retention,
            archive=args.archive,
            archive_interval=args.archive_interval,
            replicas=args.replicas,
            autoscalers=2 if args.autoscale else 0,
            autoscale_interval=args.autoscale_interval,
            autoscale_record=args.autoscale_record,
            peer_hang_after=max(PEER_HANG_AFTER, 8 * args.hang_after) if args.hang_after else 0,
            zk=args.zk,
            cluster=args.cluster,
            state_dir=Path(args.state_dir),
            detach=args.detach,
            log_level=args.log_level,
        )
    except InvalidInput as exc:
        return _error(exc, 2)
    # The supervisor's own ZooKeeper client: its connection chatter is not the user's business
    # (an interrupted start drops the connection on purpose).
    logging.getLogger("kazoo").setLevel(logging.ERROR)
    cluster = LocalCluster(spec)
    serving = False
    with _stop_signals():
        try:
            description = cluster.start(timeout=args.timeout)
            if spec.detach:
                cluster.detach()
                serving = True
                _ignore_stop_signals()  # it is up: nothing left to interrupt
                _summary(description, detached=True)
                return 0
            serving = True
            _summary(description, detached=False)
            return _serve(cluster, hang_after=args.hang_after)
        except Stopped as stop:
            # Once cluster.json says running, whoever watches it may already stop us: that
            # is a stop of a cluster that is up, even if start() had not quite returned.
            if serving or cluster.reached_running:
                print(f"silbo up: {stop}: stopping the cluster", file=sys.stderr)
                return 0
            print(f"silbo up: {stop} while starting: stopping everything", file=sys.stderr)
            return 128 + stop.signum
        except _USER_ERRORS as exc:
            return _error(exc, 2)
        except SilboError as exc:
            return _error(exc, 1)
        finally:
            _ignore_stop_signals()  # a second Ctrl-C must not cut the clean stop short
            cluster.stop()  # a no-op once detached


def main(argv: Sequence[str] | None = None) -> int:
    """``silbo up`` on its own (``python -m broker.commands.up ...``): the exit status."""
    parser = argparse.ArgumentParser(prog="silbo up", description=HELP)
    configure(parser)
    arguments = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(arguments)
    args.arguments = ["up", *arguments]
    status: int = args.handler(args)
    return status


SUPERVISOR_LOG = "supervisor.log"


def _start_daemon(args: argparse.Namespace) -> int:
    """``--detach``: run this very command in the foreground as a daemon (see the module doc)."""
    state_dir = Path(args.state_dir).resolve()
    (state_dir / "logs").mkdir(parents=True, exist_ok=True)
    log = state_dir / "logs" / SUPERVISOR_LOG
    command = [sys.executable, "-m", "broker.cli"]
    command += [a for a in getattr(args, "arguments", []) if a != "--detach"]
    if len(command) == 3 or command[3] != "up":
        raise SilboError("silbo up --detach needs its command line (run it as `silbo up`)")
    with _stop_signals():
        with open(log, "ab") as out:
            offset = out.tell()
            daemon = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        try:
            while True:
                status = daemon.poll()
                if status is not None:
                    said = log.read_bytes()[offset:].decode(errors="replace")
                    sys.stderr.write(said)
                    return status if status else 1
                description = read_cluster(state_dir)
                if (
                    description is not None
                    and description.get("status") == "running"
                    and description.get("supervisor") == daemon.pid
                ):
                    _summary(description, detached=True)
                    return 0
                time.sleep(0.05)
        except Stopped as stop:
            _ignore_stop_signals()
            daemon.send_signal(signal.SIGTERM)
            daemon.wait()
            print(f"silbo up: {stop} while starting: stopping everything", file=sys.stderr)
            return 128 + stop.signum


def _serve(cluster: LocalCluster, *, hang_after: float) -> int:
    """Supervise until a stop signal (raised as Stopped)."""
    supervisor = Supervisor(cluster, out=sys.stderr, hang_after=hang_after)
    try:
        while True:
            supervisor.check()
            time.sleep(CHECK_INTERVAL)
    finally:
        supervisor.close()


def _summary(description: dict[str, Any], *, detached: bool) -> None:
    zookeeper = description["zookeeper"]
    state_dir = description["state_dir"]
    processes = description["processes"]
    roles = ", ".join(
        f"{sum(1 for p in processes if p['role'] == role)} {role}"
        for role in ("connection-point", "access-point", "matcher", "exit-point", "context-store")
    )
    where = "embedded" if zookeeper.get("embedded") else "external"
    down = f"silbo down --state-dir {state_dir}"
    lines = [
        f"cluster {description['cluster']} is up: {roles}",
        f"  ZooKeeper:  {zookeeper['address']} ({where})",
        f"  clients:    {', '.join(description['endpoints'])}",
        *(
            [f"  NGSI v2:    http://{', http://'.join(description['http_endpoints'])}"]
            if description.get("http_endpoints")
            else []
        ),
        *(
            [
                f"  archive:    {description['child_options']['archive']} (silbo archive status "
                f"--state-dir {state_dir})"
            ]
            if (description.get("child_options") or {}).get("archive")
            else []
        ),
        *(
            [
                f"  autoscale:  {len(description['autoscalers'])} controllers (silbo admin "
                f"autoscale status --state-dir {state_dir})"
            ]
            if description.get("autoscalers")
            else []
        ),
        f"  state dir:  {state_dir} (logs in {state_dir}/logs)",
        f"  stop with:  {down}" if detached else f"  stop with:  Ctrl-C (or {down})",
    ]
    print("\n".join(lines), flush=True)


def _error(exc: BaseException, status: int) -> int:
    print(f"silbo up: error: {exc}", file=sys.stderr)
    return status


def _raise_stopped(signum: int, frame: FrameType | None) -> None:
    _ignore_stop_signals()
    raise Stopped(signum)


def _ignore_stop_signals() -> None:
    for signum in _STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


@contextmanager
def _stop_signals() -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP raise Stopped in the main thread; restored afterwards."""
    previous = {signum: signal.getsignal(signum) for signum in _STOP_SIGNALS}
    for signum in _STOP_SIGNALS:
        signal.signal(signum, _raise_stopped)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


if __name__ == "__main__":
    sys.exit(main())
