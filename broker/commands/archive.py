"""``silbo archive status``: what the archive holds, what waits for it, whether it moves.

    silbo archive status [--state-dir DIR | --zk HOST:PORT [--cluster NAME]]
                         [--archive PATH|URI] [--json]

For the cluster (``--state-dir``, default ``.silbo``, or ``--zk``/``--cluster``) whose
archiver runs (``silbo up --archive PATH``): per tenant and day the files and rows the
archive holds (their Parquet footers), the changes the stores hold that are not archived
yet (each partition's primary counts those after the archiver's cursor: per store, in all,
and the age of the oldest), and the archiver's liveness (its registration, its last batch).
``--archive`` reads the files there rather than where the archiver writes: a path, or a URI
as the archiver takes (``s3://bucket/prefix``..., broker.archive.location).

Exit status: 0; 2 for what the user can fix (no cluster described, a cluster without an
archive, an archive directory that is not there), one line on stderr; 1 if the cluster,
or the archive's file system, did not answer.
"""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import grpc
from kazoo.client import KazooClient

from broker.archive import files
from broker.archive.location import open_root
from broker.archive.state import ArchiveState, read_state
from broker.commands import told
from broker.commands.admin import cluster_address
from broker.coordination.client import connect
from broker.coordination.membership import members
from broker.errors import InvalidInput, SilboError
from broker.extras import require
from broker.runtime.link import CHANNEL_OPTIONS
from broker.runtime.options import Role
from broker.runtime.token import call_metadata
from broker.store.layout import LayoutWatch, StoreView
from broker.store.wire import pack, unpack
from broker.wire import internal_pb2 as wire
from broker.wire import internal_pb2_grpc as wire_grpc

__all__ = ["archive_status", "configure", "run_status"]

_PROG = "silbo archive"


class NoArchive(InvalidInput):
    """The cluster has no archive (its archiver never ran)."""


def configure(parser: argparse.ArgumentParser) -> None:
    """Add ``silbo archive`` and its subcommands."""
    commands = parser.add_subparsers(dest="archive_command", metavar="COMMAND", required=True)
    status = commands.add_parser(
        "status", help="files and rows per tenant and day, changes waiting, the archiver"
    )
    status.add_argument("--state-dir", default=None, help="a cluster started by silbo up")
    status.add_argument("--zk", default=None, help="ZooKeeper HOST:PORT[,...]")
    status.add_argument("--cluster", default=None, help="cluster name (with --zk)")
    status.add_argument(
        "--archive",
        default=None,
        metavar="PATH|URI",
        help="read the files here (default: the archiver's)",
    )
    status.add_argument("--json", action="store_true", help="one JSON object")
    status.set_defaults(handler=run_status)


def run_status(args: argparse.Namespace) -> int:
    """Print the archive's status (module doc)."""

    def work() -> int:
        require("archive", "silbo archive status")
        hosts, cluster = cluster_address(args)
        status = archive_status(hosts, cluster, args.archive)
        print(json.dumps(status, sort_keys=True) if args.json else _shown(status))
        return 0

    return told(_PROG, work)


def archive_status(hosts: str, cluster: str, where: str | None = None) -> dict[str, Any]:
    """The archive's status as one JSON-able object (``silbo archive status --json``)."""
    client = connect(hosts, cluster=cluster, timeout=10.0)
    try:
        state = read_state(client)
        if state is None:
            raise NoArchive(
                f"cluster {cluster} has no archive: start it with silbo up --archive PATH "
                "(or run silbo run archiver --archive PATH)"
            )
        archivers = members(client, Role.ARCHIVER.value)
        waiting = _counted(client, state)
    finally:
        client.stop()
        client.close()
    root = open_root(where if where is not None else state.root)
    try:
        if not root.exists():
            raise InvalidInput(f"the archive directory {root.uri} does not exist")
        days = files.summary(root)
    except OSError as exc:
        raise SilboError(f"the archive {root.uri} could not be read: {exc}") from None
    now = time.time()
    return {
        "cluster": cluster,
        "id": state.id,
        "root": root.uri,
        "archiver": {
            "running": bool(archivers),
            "processes": [{"name": m.name, "pid": m.pid, "address": m.address} for m in archivers],
            "batch": state.batch,
            "last_batch_age": round(now - state.batched, 3) if state.batched else None,
            "pending": state.pending.batch if state.pending is not None else None,
            "rows": state.rows,
        },
        "waiting": waiting,
        "days": [
            {"tenant": d.tenant, "day": d.day, "files": d.files, "rows": d.rows} for d in days
        ],
        "files": sum(d.files for d in days),
        "rows": sum(d.rows for d in days),
    }


class _Moved(SilboError):
    """A store asked to count a partition's changes is not its primary any more."""


def _counted(client: KazooClient, state: ArchiveState, tries: int = 3) -> dict[str, Any]:
    """:func:`_waiting` by the stores' layout as it is; again (a fresh view, up to
    ``tries`` times) while partitions move between stores (a scale, a store back)."""
    for attempt in range(tries):
        watch = LayoutWatch(client)
        view = watch.view
        watch.stop()
        try:
            return _waiting(view, state, time.time())
        except _Moved:
            if attempt == tries - 1:
                raise
            time.sleep(0.5)
    raise AssertionError("unreachable")


def _waiting(view: StoreView, state: ArchiveState, now: float) -> dict[str, Any]:
    """The changes not archived yet, as each partition's primary counts them."""
    layout = view.layout
    partitions = range(layout.partitions) if layout is not None else range(0)
    by_primary: dict[str, dict[int, int]] = {}
    unserved = []
    for partition in partitions:
        primary = view.primary(partition)
        if primary is None or primary not in view.addresses:
            unserved.append(partition)
        else:
            by_primary.setdefault(primary, {})[partition] = state.cursors.get(partition, 0)
    by_store: dict[str, int] = {}
    by_partition: dict[str, int] = {}
    recording: dict[str, bool] = {}
    oldest = 0
    for store, cursors in sorted(by_primary.items()):
        try:
            with grpc.insecure_channel(view.addresses[store], options=CHANNEL_OPTIONS) as channel:
                stub = wire_grpc.ContextStoreStub(channel)  # type: ignore[no-untyped-call]
                answer = stub.Changes(
                    wire.StoreRequest(body=pack([cursors, 0, True])),
                    timeout=30.0,
                    metadata=call_metadata(),
                )
        except grpc.RpcError as exc:
            detail = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            moved = isinstance(exc, grpc.Call) and exc.code() == grpc.StatusCode.FAILED_PRECONDITION
            error = _Moved if moved else SilboError
            raise error(f"store {store} did not count its changes: {detail}") from None
        archiving, counted, _more = unpack(answer.body)
        recording[store] = bool(archiving)
        by_store[store] = sum(int(count) for count, _first in counted.values())
        by_partition.update({str(p): int(c) for p, (c, _first) in sorted(counted.items()) if c})
        firsts = [int(first) for count, first in counted.values() if count]
        if firsts:
            oldest = min(oldest or min(firsts), min(firsts))
    return {
        "changes": sum(by_store.values()),
        "by_store": by_store,
        "by_partition": by_partition,
        "oldest_age": round(now - oldest / 1_000_000, 3) if oldest else None,
        "stores_recording": recording,
        "partitions_without_primary": unserved,
    }


def _shown(status: dict[str, Any]) -> str:
    archiver, waiting = status["archiver"], status["waiting"]
    if archiver["running"]:
        running = ", ".join(f"pid {p['pid']}, {p['name']}" for p in archiver["processes"])
        alive = f"running ({running})"
    else:
        alive = "NOT RUNNING"
    age = archiver["last_batch_age"]
    last = f"last batch {archiver['batch']}, {age:.1f} s ago" if age is not None else "no batch yet"
    by_store = ", ".join(f"{s}: {n}" for s, n in waiting["by_store"].items())
    oldest = waiting["oldest_age"]
    lines = [
        f"archive {status['id']} of cluster {status['cluster']} in {status['root']}",
        f"  archiver:  {alive}; {last}; {archiver['rows']} changes archived",
        f"  waiting:   {waiting['changes']} changes not archived yet ({by_store or 'no store'})"
        + (f", the oldest {oldest:.1f} s ago" if oldest is not None else ""),
    ]
    if archiver["pending"] is not None:
        lines.append(
            f"  pending:   batch {archiver['pending']} (being written, or left by a crash)"
        )
    off = sorted(s for s, on in waiting["stores_recording"].items() if not on)
    if off:
        lines.append(f"  warning:   {', '.join(off)} do not record changes (--archive on)")
    if waiting["partitions_without_primary"]:
        lines.append(
            f"  warning:   {len(waiting['partitions_without_primary'])} partitions have no "
            "serving store: not counted"
        )
    lines.append(f"  {'tenant':<16} {'day':<10} {'files':>7} {'rows':>12}")
    for day in status["days"]:
        lines.append(f"  {day['tenant']:<16} {day['day']:<10} {day['files']:>7} {day['rows']:>12}")
    lines.append(f"  {'all':<16} {'':<10} {status['files']:>7} {status['rows']:>12}")
    return "\n".join(lines)
