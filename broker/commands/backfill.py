"""``silbo backfill``: the history levels and the aggregation groups' windows recomputed
from the archive of changes, on Spark (docs/spark.md, "Backfill").

    silbo backfill --archive PATH --output PATH [--from T] [--to T] [--tenant T]
                   [--history] [--aggregations FILE | --state-dir DIR | --zk HOST:PORT
                   [--cluster NAME]] [--master URL]

``--archive`` is the archiver's Parquet root (spark_matcher.archive), ``--output`` a
directory (or URL) that gets ``history/`` (with ``--history``: every slot of every level,
spark_matcher.backfill.HISTORY_SCHEMA) and ``aggregations/`` (the windows of the groups:
WINDOW_SCHEMA), each replaced if there. The groups are a JSON file (``--aggregations``: one
``POST /v2/x/aggregations`` body or an array of them, each with the optional ``tenant`` and
``servicePath`` it is defined under), or what a cluster keeps in ZooKeeper (``--state-dir``
of ``silbo up``, or ``--zk``), read as the context stores read them (each version from its
``since``). ``--from`` / ``--to`` (epoch seconds or ISO 8601) bound the changes taken; only
the slots and windows wholly within are written.

Progress goes to stderr, the summary to stdout. Bad input (no archive, no change in the
range, a definition that is not valid, nothing asked) is one line on stderr and exit status
2; a failure of Spark or of ZooKeeper one line with its cause, exit status 1.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from broker.commands import standalone
from broker.commands.admin import cluster_address
from broker.commands.spark_job import Progress, read_json_file, run_job
from broker.coordination.aggregations import kept_aggregations
from broker.coordination.client import connect
from broker.errors import InvalidInput, SilboError
from broker.extras import require
from broker.model.identifiers import check_scope, check_tenant
from broker.query.dates import parse_iso8601
from broker.roles.store_aggregation import versions_of
from broker.store.aggregation_runtime import Version
from broker.store.history_fold import micros

__all__ = [
    "HELP",
    "BackfillFailed",
    "NoChanges",
    "cluster_versions",
    "configure",
    "main",
    "read_versions",
    "run",
]

HELP = "history levels and aggregation windows recomputed from the archive, on Spark"
_PROG = "silbo backfill"
_SCOPE_FIELDS = ("tenant", "servicePath")


class BackfillFailed(SilboError):
    """Spark or the cluster failed (not the input)."""


class NoChanges(InvalidInput):
    """The archive holds no change in the range asked (or is no archive)."""


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``silbo backfill``."""
    parser.epilog = (
        "Writes OUTPUT/history (--history: every attribute's slots, each level) and "
        "OUTPUT/aggregations (every window of the groups), equal to what the live stores "
        "computed from the same changes. docs/spark.md, Backfill."
    )
    parser.add_argument(
        "--archive", required=True, metavar="PATH", help="the archive's root (a path or URL)"
    )
    parser.add_argument(
        "--output", required=True, metavar="PATH", help="where history/ and aggregations/ go"
    )
    parser.add_argument(
        "--from", dest="since", metavar="T", help="changes from T (epoch s or ISO 8601)"
    )
    parser.add_argument(
        "--to", dest="until", metavar="T", help="changes before T (epoch s or ISO 8601)"
    )
    parser.add_argument("--tenant", metavar="T", help="only this tenant ('' the default one)")
    parser.add_argument(
        "--history", action="store_true", help="recompute the history levels of every attribute"
    )
    groups = parser.add_mutually_exclusive_group()
    groups.add_argument(
        "--aggregations",
        type=Path,
        metavar="FILE",
        help="recompute these groups: a JSON definition or an array of them",
    )
    groups.add_argument(
        "--state-dir", metavar="DIR", help="recompute the groups of the cluster silbo up runs"
    )
    groups.add_argument(
        "--zk", metavar="HOST:PORT", help="recompute the groups of the cluster of this ZooKeeper"
    )
    parser.add_argument("--cluster", metavar="NAME", help="with --zk: the cluster's name")
    parser.add_argument("--master", metavar="URL", help="Spark master URL (default local[*])")
    parser.set_defaults(handler=run)


# -- the groups -----------------------------------------------------------------------------


def read_versions(path: Path, tenant: str | None = None) -> list[Version]:
    """The groups a JSON file defines (one definition, or an array of them), each applying
    from the start; those of ``tenant`` only if given (a definition without ``tenant`` is
    of ``tenant``, else of the default one). InputError naming the file and the definition
    (its 0-based index) for anything not valid."""
    from spark_matcher.entities import InputError

    source = str(path)
    body = read_json_file(path)
    items = body if isinstance(body, list) else [body]
    if not items:
        raise InputError(source, 0, "", "no aggregation is defined")
    found: dict[tuple[str, str], Version] = {}
    for index, item in enumerate(items):
        where = f"aggregation {index}"
        if not isinstance(item, dict):
            raise InputError(source, 0, where, "a definition is a JSON object")
        try:
            owner = check_tenant(item.get("tenant", tenant or ""))
            scope = item.get("servicePath")
            scope = check_scope(scope) if scope is not None else None
            document = {k: v for k, v in item.items() if k not in _SCOPE_FIELDS}
            version = Version.parse(document, owner, scope, 1, -math.inf)
        except InvalidInput as exc:
            raise InputError(source, 0, where, str(exc)) from None
        key = (owner, version.definition.id)
        if key in found:
            raise InputError(source, 0, where, f"the id {key[1]!r} is repeated (tenant {owner!r})")
        found[key] = version
    return [v for (owner, _id), v in found.items() if tenant is None or owner == tenant]


def cluster_versions(args: argparse.Namespace, progress: Progress | None = None) -> list[Version]:
    """The groups a cluster keeps (``--state-dir`` or ``--zk``/``--cluster``), every version
    the stores apply; one not valid is told to ``progress`` and left out, as the stores do."""
    hosts, cluster = cluster_address(args)
    client = connect(hosts, cluster=cluster, timeout=10.0)
    try:
        kept, unreadable = kept_aggregations(client)
    finally:
        client.stop()
        client.close()
    problems = dict(unreadable)
    found: list[Version] = []
    for name, stored in kept.items():
        if args.tenant is not None and stored.current.tenant != args.tenant:
            continue
        try:
            found += versions_of(stored)
        except SilboError as exc:
            problems[name] = str(exc)
    for name, problem in sorted(problems.items()):
        if progress is not None:
            progress.step(f"aggregation {name} is not used: {problem}")
    return found


# -- the command ----------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    """Backfill; print a summary line. Exit 0, 2 for bad input, 1 for failures."""

    def missing(cause: str) -> str | None:
        gone = "PATH_NOT_FOUND" in cause or "Path does not exist" in cause
        return f"--archive {args.archive}" if gone else None

    return run_job(_PROG, lambda progress: _backfill(args, progress), missing)


def _moment(text: str | None, option: str) -> float | None:
    """Epoch seconds from ``--from`` / ``--to``: seconds or an ISO 8601 date."""
    if text is None:
        return None
    try:
        seconds = float(text)
    except ValueError:
        parsed = parse_iso8601(text)
        if parsed is not None:
            return parsed
    else:
        if math.isfinite(seconds):
            return seconds
    raise InvalidInput(f"{option} {text!r}: neither epoch seconds nor an ISO 8601 date")


def _local(where: str) -> Path | None:
    """The local path of an --archive or --output (None for a URL Spark reads)."""
    return None if "://" in where else Path(where)


def _check(args: argparse.Namespace, since: float | None, until: float | None) -> None:
    if not args.history and args.aggregations is None and args.state_dir is None and not args.zk:
        raise InvalidInput(
            "nothing to backfill: give --history, and/or the groups (--aggregations FILE, "
            "--state-dir DIR or --zk HOST:PORT)"
        )
    if since is not None and until is not None and since >= until:
        raise InvalidInput("--from must be before --to")
    if args.tenant is not None:
        check_tenant(args.tenant)
    archive = _local(args.archive)
    if archive is not None and not archive.is_dir():
        raise NoChanges(f"--archive {args.archive}: no such directory")
    output = _local(args.output)
    if output is not None and not output.absolute().parent.is_dir():
        raise InvalidInput(f"--output {args.output}: no directory {output.absolute().parent}")


def _url(where: str) -> str:
    local = _local(where)
    return str(local.absolute()) if local is not None else where.rstrip("/")


def _backfill(args: argparse.Namespace, progress: Progress) -> int:
    require("spark", _PROG)
    from spark_matcher.archive import any_change, open_archive, read_changes
    from spark_matcher.backfill import history_frame
    from spark_matcher.session import spark_session

    started = time.monotonic()
    since, until = _moment(args.since, "--from"), _moment(args.until, "--to")
    _check(args, since, until)
    versions: list[Version] = []
    if args.aggregations is not None:
        progress.step(f"reading the aggregation groups of {args.aggregations}")
        versions = read_versions(args.aggregations, args.tenant)
    elif args.state_dir is not None or args.zk:
        progress.step("reading the aggregation groups of the cluster")
        versions = cluster_versions(args, progress)
    if (args.aggregations is not None or args.state_dir or args.zk) and not versions:
        whose = "" if args.tenant is None else f" of tenant {args.tenant!r}"
        raise InvalidInput(f"no aggregation group{whose} is defined there")
    archive, output = _url(args.archive), _url(args.output)
    tenants = None if args.tenant is None else [args.tenant]
    low = None if since is None else micros(since)
    high = None if until is None else micros(until)
    progress.step("starting Spark")
    spark = spark_session(args.master)
    with progress.spark(spark, f"looking for changes in {archive}"):
        files = open_archive(spark, archive)
        if not any_change(files, tenants=tenants, since=low, until=high):
            raise NoChanges(f"--archive {args.archive}: {_no_changes(args, since, until)}")
    summary = []
    if args.history:
        with progress.spark(spark, f"folding the history of every attribute into {output}/history"):
            changes = read_changes(files, tenants=tenants, since=low, until=high)
            slots = _write(history_frame(spark, changes, since, until), f"{output}/history")
        summary.append(f"{slots} history slots")
    if versions:
        kept: list[Any] = []
        try:
            groups = len({(v.definition.tenant, v.definition.id) for v in versions})
            with progress.spark(
                spark, f"folding the windows of {groups} groups into {output}/aggregations"
            ):
                windows = _windows(spark, files, versions, low, high, kept)
                count = _write(_within(windows, since, until), f"{output}/aggregations")
        finally:
            for frame in kept:
                frame.unpersist()
        summary.append(f"{count} windows")
    took = time.monotonic() - started
    print(f"{' and '.join(summary)} written to {output} in {took:.1f} s")
    return 0


def _no_changes(args: argparse.Namespace, since: float | None, until: float | None) -> str:
    text = "no change archived"
    if args.tenant is not None:
        text += f" of tenant {args.tenant!r}"
    if since is not None:
        text += f" from {args.since}"
    if until is not None:
        text += f" until {args.until}"
    return text


def _windows(
    spark: Any,
    files: Any,
    versions: Sequence[Version],
    low: int | None,
    high: int | None,
    kept: list[Any],
) -> Any:
    """Every level's windows of the groups, as one frame."""
    from spark_matcher.archive import read_changes
    from spark_matcher.backfill import window_frames

    tenants = sorted({v.definition.tenant for v in versions})
    changes = read_changes(files, tenants=tenants, since=low, until=high)

    def states(tenants: Sequence[str], types: Sequence[str]) -> Any:
        return read_changes(files, tenants=tenants, types=types, until=high)

    frames = window_frames(spark, changes, states, versions, kept)
    union = frames[0]
    for frame in frames[1:]:
        union = union.unionByName(frame)
    return union


def _within(windows: Any, since: float | None, until: float | None) -> Any:
    """The windows wholly in the range (those at its edges miss values outside it)."""
    from pyspark.sql import functions as F

    if since is not None:
        windows = windows.where(F.col("start") >= since)
    if until is not None:
        windows = windows.where(F.col("end") <= until)
    return windows


def _write(frame: Any, where: str) -> int:
    """Write ``frame`` as Parquet at ``where`` (replaced); how many rows it has."""
    frame.write.mode("overwrite").parquet(where)
    count: int = frame.sparkSession.read.parquet(where).count()
    return count


def main(argv: Sequence[str] | None = None) -> int:
    """``silbo backfill`` on its own: parse ``argv`` (default ``sys.argv[1:]``) and run it."""
    return standalone(_PROG, HELP, configure, run, argv)


if __name__ == "__main__":
    sys.exit(main())
