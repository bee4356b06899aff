"""``silbo admin scale context-stores N``: the store layer resized while writes and reads flow.

For a cluster of ``silbo up`` (``--state-dir``), the stores a scale-out needs are started
by the command (as ``silbo admin scale`` starts other layers' processes: detached, recorded
in cluster.json, store ids ``store-n`` by slot), stopped again if the scale is rolled back;
the stores a scale-in removes (the last ones of the layout) are stopped once it completed.
For an external cluster (``--zk``), start the new stores first (``silbo run context-store
--store-id ID``): registered stores outside the layout are taken in id order; stop the
removed ones afterwards (they hold nothing once the scale completes). The coordinator is
broker.roles.store_scaling.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from broker.cluster.operations import resize_store_layer
from broker.coordination.client import connect
from broker.errors import SilboError
from broker.roles.store_scaling import (
    StoreScaleOutcome,
)

__all__ = ["run_store_scale"]

_PREFIX = "silbo admin scale: error:"


def run_store_scale(
    args: argparse.Namespace, where: Callable[[argparse.Namespace], tuple[str, str]]
) -> int:
    """Scale the context store layer to ``args.count`` stores; prints the outcome. Exit 0
    if completed, 1 if rolled back, 2 if refused (the cluster serves on unchanged)."""
    try:
        hosts, cluster = where(args)
        client = connect(hosts, cluster=cluster, timeout=10.0)
    except SilboError as exc:
        print(f"{_PREFIX} {exc}", file=sys.stderr)
        return 2
    local = None if args.zk else Path(args.state_dir or ".silbo")
    try:
        outcome, before = resize_store_layer(client, local, args.count, args.timeout)
    except SilboError as exc:
        print(f"{_PREFIX} {exc}", file=sys.stderr)
        return 2
    finally:
        client.stop()
        client.close()
    _print_outcome(outcome, args, before)
    return 0 if outcome.outcome == "completed" else 1


def _print_outcome(outcome: StoreScaleOutcome, args: argparse.Namespace, before: int) -> None:
    if args.json:
        print(json.dumps(outcome.to_dict(), sort_keys=True))
        return
    print(
        f"{outcome.outcome}: context-stores {before} -> {args.count} in "
        f"{outcome.duration_s:.2f} s, {outcome.moved_partitions} partitions "
        f"({outcome.moved_keys} keys, {outcome.moved_bytes} bytes) moved, "
        f"store layout {outcome.layout}" + (f" ({outcome.message})" if outcome.message else "")
    )
