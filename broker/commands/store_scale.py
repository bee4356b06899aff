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
import time
from collections.abc import Callable
from pathlib import Path

from kazoo.client import KazooClient

from broker.cluster.local import ClusterError, add_processes, retire_processes
from broker.coordination.client import connect
from broker.coordination.scale import ScaleInProgress
from broker.errors import SilboError
from broker.roles.store_scaling import (
    StoreScaleOutcome,
    check_store_count,
    registrations,
    scale_stores,
)
from broker.runtime.options import Role
from broker.store.layout import SCALE, read_store_layout

__all__ = ["resize_store_layer", "run_store_scale"]

_PREFIX = "silbo admin scale: error:"
REGISTER_TIMEOUT = 30.0  # seconds for started stores to announce their store ids


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


def resize_store_layer(
    client: KazooClient, local: Path | None, count: int, timeout: float
) -> tuple[StoreScaleOutcome, int]:
    """Scale the store layer to ``count`` stores, the processes of a ``silbo up`` cluster
    (``local``: its state directory; None: an external one) started and stopped as the
    module doc says; the outcome and the store count before. A SilboError if refused
    (nothing changed, the stores it started stopped again). ``silbo bench store-scale``
    scales through this too."""
    started: list[str] = []  # member names of the stores this call started
    try:
        layout = check_store_count(read_store_layout(client), count)
        if client.exists(SCALE):
            raise ScaleInProgress("a scale of the context store layer is running")
        old = list(layout.previous or layout.stores)
        new, leaving = old[:count], old[count:]
        if count > len(old):
            new += _added(client, local, old, count - len(old), started)
        outcome = scale_stores(client, new, timeout=timeout)
        if local is not None:
            members = {s: r.member for s, r in registrations(client).items()}
            if outcome.outcome == "completed":
                retire_processes(local, [members[s] for s in leaving if s in members])
            elif started:
                retire_processes(local, started)
    except SilboError:
        if local is not None and started:
            retire_processes(local, started)
        raise
    return outcome, len(old)


def _added(
    client: KazooClient, local: Path | None, old: list[str], count: int, started: list[str]
) -> list[str]:
    """``count`` store ids to add: idle registered stores first, then stores started here
    (their member names go to ``started``)."""
    idle = sorted(s for s in registrations(client) if s not in old)
    missing = count - len(idle)
    if missing <= 0:
        return idle[:count]
    if local is None:
        raise ClusterError(
            f"{missing} more context stores must be running first (start them with "
            "silbo run context-store --store-id ID)"
        )
    members = [m.name for m in add_processes(local, Role.CONTEXT_STORE, missing)]
    started.extend(members)
    deadline = time.monotonic() + REGISTER_TIMEOUT
    while True:
        ids = {r.member: s for s, r in registrations(client).items()}
        if all(m in ids for m in members):
            return idle + sorted(ids[m] for m in members)
        if time.monotonic() > deadline:
            raise ClusterError("the started context stores did not announce their store ids")
        time.sleep(0.05)


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
