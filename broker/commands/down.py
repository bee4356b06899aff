"""``silbo down``: stop the cluster ``silbo up`` started from a state directory.

    silbo down [--state-dir .silbo] [--grace 10] [--purge]

Reads STATE_DIR/cluster.json and stops every process it names that is still running: a
foreground ``silbo up`` is asked to stop (SIGTERM) and stops its own processes in order; the
processes of a detached cluster get SIGTERM, SIGKILL after ``--grace`` seconds; the embedded
ZooKeeper goes last. Only processes that are still the ones started are signalled.
``--purge`` then removes what the state directory keeps for the next ``silbo up``
(ZooKeeper's data: the HTTP subscriptions; the layer sizes), so that it starts from nothing.

Exit status: 0 once everything is stopped; 1 when no cluster is running from the state
directory (no cluster.json, or one whose processes are all gone: it is removed), or when a
process could not be stopped.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from broker.cluster.durable import purge
from broker.cluster.local import STOP_GRACE, ClusterError, NoCluster, read_cluster, stop_cluster

__all__ = ["HELP", "configure", "main", "run"]

HELP = "stop the cluster silbo up started (every process, and its embedded ZooKeeper)"


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``silbo down``."""
    parser.add_argument("--state-dir", default=".silbo", help="where silbo up wrote cluster.json")
    parser.add_argument(
        "--grace",
        type=float,
        default=STOP_GRACE,
        help=f"seconds a process gets to stop before SIGKILL (default {STOP_GRACE:g})",
    )
    parser.add_argument(
        "--purge",
        action="store_true",
        help="also remove the kept state (subscriptions, layer sizes): the next up starts empty",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Stop the cluster; 0 if one was stopped, 1 if there was none (or it would not stop)."""
    state_dir = Path(args.state_dir)
    description = read_cluster(state_dir) or {}
    name = description.get("cluster", "?")
    try:
        stopped = stop_cluster(state_dir, grace=args.grace)
    except NoCluster as exc:
        if args.purge:  # nothing runs: purging is all there is to do
            _purge(state_dir)
            return 0
        print(f"silbo down: {exc}", file=sys.stderr)
        return 1
    except ClusterError as exc:
        print(f"silbo down: error: {exc}", file=sys.stderr)
        return 1
    if args.purge:
        _purge(state_dir)
    if stopped == 0:
        print(
            f"silbo down: no cluster is running from {state_dir.resolve()} "
            f"(cluster {name} had stopped already; removed its stale cluster.json)",
            file=sys.stderr,
        )
        return 1
    what = f"cluster {name}" if description else "a ZooKeeper left by an interrupted start"
    print(f"stopped {what} ({stopped} processes) from {state_dir.resolve()}")
    return 0


def _purge(state_dir: Path) -> None:
    removed = purge(state_dir)
    what = ", ".join(str(p) for p in removed) or "nothing was kept"
    print(f"purged the kept state of {state_dir.resolve()}: {what}")


def main(argv: Sequence[str] | None = None) -> int:
    """``silbo down`` on its own (``python -m broker.commands.down ...``): the exit status."""
    parser = argparse.ArgumentParser(prog="silbo down", description=HELP)
    configure(parser)
    args = parser.parse_args(argv)
    status: int = args.handler(args)
    return status


if __name__ == "__main__":
    sys.exit(main())
