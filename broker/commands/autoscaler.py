"""``silbo autoscaler``: run an automatic scaling controller (docs/autoscaling.md).

    silbo autoscaler (--state-dir DIR | --zk HOST:PORT [--cluster NAME]) [--interval 2]
                     [--record FILE] [--log-level INFO]

Every controller process of a cluster contends in a ZooKeeper election: one leads (it
observes the layers every ``--interval`` seconds and carries out the decisions,
broker.autoscale.controller), the others stand by and take over when its session ends.
``silbo up --autoscale`` starts two, as children (``--state-dir``: processes are started and
stopped for it); against another cluster (``--zk``) the controller scales with processes
that are registered already and pre-warms nothing. ``--record FILE`` appends, while it
leads, each round's observation, policy and decisions as a JSON line: a real series that
the model replays (tests/autoscale/test_recorded.py).

It runs until SIGTERM or SIGINT (exit 0); exit 2 for an error the user can fix (no cluster
described, an unreachable ZooKeeper, a bad interval), one line on stderr.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from types import FrameType

from broker.autoscale.controller import SESSION_TIMEOUT, Autoscaler, LiveCluster, contend
from broker.autoscale.state import AutoscaleState
from broker.commands.admin import cluster_address
from broker.commands.run import add_cluster_token, set_up_logging, use_cluster_token
from broker.coordination.client import connect
from broker.errors import InvalidInput, SilboError
from broker.runtime.options import DEFAULT_CLUSTER

__all__ = ["DEFAULT_INTERVAL", "configure", "run"]

DEFAULT_INTERVAL = 2.0  # seconds between two observations


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``silbo autoscaler``."""
    parser.add_argument("--state-dir", default=None, help="a cluster started by silbo up")
    parser.add_argument("--zk", default=None, help="ZooKeeper HOST:PORT[,...]")
    parser.add_argument("--cluster", default=None, help=f"cluster name (default {DEFAULT_CLUSTER})")
    parser.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_INTERVAL,
        help=f"seconds between two observations of the layers (default {DEFAULT_INTERVAL:g})",
    )
    parser.add_argument(
        "--record", default=None, help="append each round's observation and decisions to FILE"
    )
    parser.add_argument("--log-level", default="INFO", help="logging level")
    add_cluster_token(parser)
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Contend, and lead when elected, until stopped (module docstring)."""
    use_cluster_token(args)
    set_up_logging(args.log_level)
    try:
        if not args.interval > 0:
            raise InvalidInput(f"--interval must be seconds above 0, not {args.interval:g}")
        hosts, cluster = cluster_address(args)
        client = connect(hosts, cluster=cluster, timeout=10.0, session_timeout=SESSION_TIMEOUT)
    except SilboError as exc:
        print(f"silbo autoscaler: error: {exc}", file=sys.stderr)
        return 2
    # The processes it starts (pre-warming, scale-outs) are recorded in cluster.json and
    # outlive it; the kernel reaps those that exit meanwhile.
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    stop = threading.Event()

    def stopping(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, stopping)
    signal.signal(signal.SIGINT, stopping)
    local = None if args.zk else Path(args.state_dir or ".silbo").resolve()
    identity = f"{socket.gethostname()}:{os.getpid()}"
    try:
        record = open(args.record, "a") if args.record else None  # noqa: SIM115 (held to the end)
    except OSError as exc:
        print(f"silbo autoscaler: error: --record: {exc}", file=sys.stderr)
        client.stop()
        client.close()
        return 2
    autoscaler = Autoscaler(
        LiveCluster(client, local, ask_timeout=min(2.0, args.interval)),
        AutoscaleState(client),
        identity=identity,
        record=record,
    )
    # The election blocks until this one leads: in a thread, so that a stop is not held up.
    worker = threading.Thread(
        target=contend,
        args=(client, autoscaler),
        kwargs={"interval": args.interval, "stop": stop},
        name="autoscaler",
        daemon=True,
    )
    print(f"silbo autoscaler {identity}: contending for the lead of {cluster}", file=sys.stderr)
    worker.start()
    while not stop.wait(0.5):
        pass
    client.stop()  # our election znode goes now: a standby leads at once
    client.close()
    worker.join(5.0)
    if record is not None:
        record.close()
    return 0
