"""``silbo replay``: the notifications a file of updates would have made, on Spark.

    silbo replay (--updates FILE [--initial-state FILE]
                  | --archive PATH [--tenant T] [--from TIME] [--to TIME])
                 (--subscriptions FILE | --state-dir DIR) --out FILE
                 [--master URL] [--partitions P] [--method M]

``--updates`` is JSON lines (one NGSI v2 entity in normalized form per line, with the
optional ``tenant``, ``servicePath`` and ``time``) or a ``.parquet`` with those columns.
Each update is an upsert of its entity, applied in order as the context store applies it,
from no entities (or those of ``--initial-state``, in the same form); the entity it leaves
is matched, and the front's decision taken on each match at the update's time
(spark_matcher.replay: the state, matching and decision passes).
``--archive`` takes instead the changes a cluster's stores applied, from its archive
(docs/archive.md; spark_matcher.archive_replay): each row holds the entity as published and its
change, so the state pass is not run; ``update`` is then a change's position in the
archive's order (time, partition, sequence) among those selected (``--tenant``, and
``--from`` included to ``--to`` excluded: epoch seconds or ISO 8601 dates).
``--subscriptions`` is a JSON array of NGSI v2 subscriptions as Orion lists them (each with
its ``id``; ``tenant`` and ``servicePath`` give the scope it was created under), read with
the HTTP front's validation; ``--state-dir`` takes instead the subscriptions a running
cluster (``silbo up``) holds now, with its matchers' partitioning and its fronts' documents.
``--out`` gets one row per notification, ``(update, subscription)``: ``.parquet`` (written
by Spark) or ``.jsonl`` (sorted by update, then subscription). ``update`` is the 0-based
position of the update in its file.

Progress goes to stderr, the summary to stdout. Bad input (a file that cannot be read, a
line or a subscription that is not valid) is one line naming the file, the line or the
subscription, and the field, exit status 2; a failure of Spark or of the cluster is one
line with its cause, exit status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc

from broker.archive.files import MARKER
from broker.commands import standalone
from broker.commands.admin import cluster_address
from broker.commands.publish import positive_int
from broker.commands.spark_job import Progress, read_json_file, run_job
from broker.coordination.client import connect
from broker.coordination.configuration import ClusterConfiguration, Configuration
from broker.coordination.http_subscriptions import kept_definitions
from broker.coordination.membership import members
from broker.errors import InvalidInput, QuerySyntaxError, SilboError
from broker.extras import require
from broker.model.attribute import parse_iso8601
from broker.model.identifiers import DEFAULT_SCOPE, check_scope, check_tenant
from broker.model.subscription import Subscription
from broker.partition.parts import unpack_part
from broker.partition.selector import RendezvousSelector
from broker.runtime.link import CHANNEL_OPTIONS
from broker.runtime.token import call_metadata
from broker.wire import internal_pb2 as wire
from broker.wire import internal_pb2_grpc as wire_grpc
from spark_matcher.decisions import FrontSubscription
from spark_matcher.entities import InputError

__all__ = [
    "HELP",
    "ReplayFailed",
    "cluster_subscriptions",
    "configure",
    "main",
    "read_subscriptions",
    "run",
]

HELP = "the notifications a file of updates would have made, on Spark (docs/spark.md)"
_PROG = "silbo replay"
_FORMATS = (".parquet", ".jsonl")
_SCOPE_FIELDS = ("tenant", "servicePath")
_FIELD = re.compile(
    r"^((?:subject|notification|description|expires|status|throttling)(?:\.\w+|\[\d+\])*)"
    r":?\s+(.*)$",
    re.DOTALL,
)


class ReplayFailed(SilboError):
    """Spark or the cluster failed (not the input)."""


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``silbo replay``."""
    given = parser.add_mutually_exclusive_group(required=True)
    given.add_argument("--updates", type=Path, help="JSON lines or .parquet")
    given.add_argument(
        "--archive",
        default=None,
        metavar="PATH",
        help="the changes of a cluster's archive instead (silbo up --archive; docs/archive.md)",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--subscriptions", type=Path, help="a JSON array of NGSI v2 subscriptions")
    source.add_argument(
        "--state-dir", type=Path, help="the subscriptions of a cluster started by silbo up"
    )
    parser.add_argument(
        "--out", required=True, type=Path, help="the notifications: .parquet or .jsonl"
    )
    parser.add_argument(
        "--initial-state",
        type=Path,
        default=None,
        help="entities there before the first update (JSON lines or .parquet, as --updates)",
    )
    parser.add_argument(
        "--tenant", default=None, help="with --archive: only this tenant's changes ('': default)"
    )
    parser.add_argument(
        "--from",
        dest="since",
        default=None,
        metavar="TIME",
        help="with --archive: changes from this time (epoch seconds or ISO 8601), included",
    )
    parser.add_argument(
        "--to",
        dest="until",
        default=None,
        metavar="TIME",
        help="with --archive: changes before this time (epoch seconds or ISO 8601)",
    )
    parser.add_argument("--master", default=None, help="Spark master URL (default local[*])")
    parser.add_argument(
        "--partitions",
        type=positive_int,
        default=None,
        help="key partitions with --subscriptions (default 1); a cluster's: its matchers",
    )
    parser.add_argument(
        "--method",
        choices=("engine", "join"),
        default="engine",
        help="engine: the matchers' engine in every Spark task (default); join: relational "
        "joins (docs/spark.md)",
    )
    parser.set_defaults(handler=run)


# -- subscriptions --------------------------------------------------------------------------


def read_subscriptions(path: Path) -> list[FrontSubscription]:
    """The subscriptions of a JSON array of NGSI v2 subscriptions (InputError otherwise)."""
    source = str(path)
    body = read_json_file(path)
    if not isinstance(body, list):
        raise InputError(source, 0, "", "subscriptions must be a JSON array")
    found: list[FrontSubscription] = []
    seen: set[str] = set()
    for index, document in enumerate(body):
        where = f"{source}: subscription {index}"
        subscription = _subscription(document, where)
        if subscription.id in seen:
            raise InputError(where, 0, "id", f"subscription id {subscription.id!r} is repeated")
        seen.add(subscription.id)
        found.append(subscription)
    return found


def _subscription(document: Any, where: str) -> FrontSubscription:
    """A subscription as the NGSI front would hold it (checked: it can be placed)."""
    if not isinstance(document, dict):
        raise InputError(where, 0, "", "a subscription must be a JSON object")
    subscription_id = document.get("id")
    if not isinstance(subscription_id, str) or not subscription_id:
        raise InputError(where, 0, "id", "a subscription needs its id (a non-empty string)")
    try:
        tenant = check_tenant(document.get("tenant", ""))
    except InvalidInput as exc:
        raise InputError(where, 0, "tenant", str(exc)) from None
    try:
        scope = check_scope(document.get("servicePath", DEFAULT_SCOPE))
    except InvalidInput as exc:
        raise InputError(where, 0, "servicePath", str(exc)) from None
    body = {k: v for k, v in document.items() if k not in _SCOPE_FIELDS}
    front = FrontSubscription(subscription_id, tenant, scope, body)
    try:
        front.matched()
        return front
    except SilboError as exc:
        field, reason = _field_of(exc)
        raise InputError(where, 0, field, reason) from None


def _field_of(exc: SilboError) -> tuple[str, str]:
    """The document field an error of the front's validation is about, and the rest of it."""
    text = str(exc)
    if isinstance(exc, QuerySyntaxError):
        name = "mq" if text.startswith("in mq") else "q"
        return f"subject.condition.expression.{name}", text
    for word, field in (
        ("pattern ", "subject.entities"),
        ("unknown alterationType", "subject.condition.alterationTypes"),
        ("condition attribute", "subject.condition.attrs"),
        ("subscription id", "id"),
    ):
        if text.startswith(word):
            return field, text
    match = _FIELD.match(text)
    return (match.group(1), match.group(2)) if match else ("", text)


def cluster_subscriptions(
    state_dir: Path,
) -> tuple[list[Subscription], list[FrontSubscription], Configuration]:
    """What the matchers of the cluster ``silbo up --state-dir`` runs hold now, the HTTP
    fronts' documents of those made over NGSI (as defined: the fronts keep them in
    ZooKeeper), and the configuration the matchers hold them under."""
    where = argparse.Namespace(zk=None, cluster=None, state_dir=str(state_dir))
    hosts, cluster = cluster_address(where)
    client = connect(hosts, cluster=cluster, timeout=10.0)
    try:
        current = ClusterConfiguration(client).read()
        addresses = {m.name: m.address for m in members(client, "matcher")}
        fronts = [
            FrontSubscription(s.id, s.tenant, s.scope, s.document) for s in kept_definitions(client)
        ]
    finally:
        client.stop()
        client.close()
    if current is None:
        raise ReplayFailed(f"cluster {cluster} is not formed (no configuration)")
    configuration = current.configuration
    found: list[Subscription] = []
    for name in configuration.matchers:
        if name not in addresses:
            raise ReplayFailed(f"matcher {name} of cluster {cluster} is not running")
        found += _matcher_subscriptions(name, addresses[name], configuration.epoch)
    for front in fronts:
        try:
            front.held()
        except SilboError as exc:  # the front took it: a document of another version?
            raise ReplayFailed(f"the HTTP subscription {front.id} is not readable: {exc}") from None
    return found, fronts, configuration


def _matcher_subscriptions(name: str, address: str, epoch: int) -> list[Subscription]:
    found: list[Subscription] = []
    try:
        with grpc.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
            stub = wire_grpc.MatcherStub(channel)  # type: ignore[no-untyped-call]
            parts: Iterator[wire.Part] = stub.Subscriptions(
                wire.Empty(), timeout=120.0, metadata=call_metadata()
            )
            for part in parts:
                if part.epoch != epoch:
                    raise ReplayFailed(
                        f"the cluster was scaled while its subscriptions were read (epoch "
                        f"{epoch}, matcher {name} at {part.epoch}); run the replay again"
                    )
                found += unpack_part(part.data, name).subscriptions
    except grpc.RpcError as exc:
        detail = exc.details() if isinstance(exc, grpc.Call) else str(exc)
        raise ReplayFailed(
            f"matcher {name} at {address} did not list its subscriptions: {detail}"
        ) from None
    return found


# -- the command ----------------------------------------------------------------------------


def run(args: argparse.Namespace) -> int:
    """Replay the updates; print a summary line. Exit 0, 2 for bad input, 1 for failures."""
    return run_job(_PROG, lambda progress: _replay(args, progress))


def _check_paths(args: argparse.Namespace) -> None:
    if args.out.suffix not in _FORMATS:
        raise InvalidInput(f"--out {args.out}: the name must end in .parquet or .jsonl")
    if not args.out.parent.is_dir():
        raise InvalidInput(f"--out {args.out}: no directory {args.out.parent}")
    if args.state_dir is not None and args.partitions is not None:
        raise InvalidInput("--partitions goes with --subscriptions (a cluster has its matchers)")
    if args.archive is None:
        for option in ("tenant", "since", "until"):
            if getattr(args, option) is not None:
                name = {"since": "from", "until": "to"}.get(option, option)
                raise InvalidInput(f"--{name} goes with --archive")
    else:
        if args.initial_state is not None:
            raise InvalidInput("--initial-state goes with --updates (an archive holds entities)")
        _check_archive(args.archive)
        if args.tenant is not None:
            check_tenant(args.tenant)
    for given in (args.updates, args.initial_state):
        if given is not None:
            _check_input(given)


def _check_archive(root: str) -> None:
    """InputError unless a local ``root`` is an archive's directory (a URL is Spark's)."""
    if "://" in root:
        return
    path = Path(root)
    if not path.is_dir():
        raise InputError(root, 0, "", "no such directory (the archive's: silbo up --archive)")
    if not (path / MARKER).is_file():
        raise InputError(root, 0, "", f"not an archive (no {MARKER})")


def _moment(option: str, text: str | None) -> float | None:
    """``--from`` / ``--to`` in epoch seconds (InvalidInput for another text)."""
    if text is None:
        return None
    with contextlib.suppress(ValueError):
        seconds = float(text)
        if seconds - seconds == 0:
            return seconds
    parsed = parse_iso8601(text)
    if parsed is None:
        raise InvalidInput(f"--{option} {text!r} is neither epoch seconds nor an ISO 8601 date")
    return parsed


def _check_input(path: Path) -> None:
    """InputError unless ``path`` is a readable file (or a Parquet directory)."""
    if not path.exists():
        raise InputError(str(path), 0, "", "no such file")
    if path.is_file():
        try:
            with path.open("rb") as readable:
                readable.read(1)
        except OSError as exc:
            raise InputError(str(path), 0, "", exc.strerror or str(exc)) from None
    elif path.suffix != ".parquet":
        raise InputError(str(path), 0, "", "not a file")


def _replay(args: argparse.Namespace, progress: Progress) -> int:
    require("spark", "silbo replay")
    from spark_matcher import open_matcher
    from spark_matcher.archive_replay import archived_steps
    from spark_matcher.history import Clock
    from spark_matcher.replay import MATCHED_FROM, apply_updates, notified
    from spark_matcher.session import spark_session

    started = time.monotonic()
    clock = Clock(time.time())  # updates without a time: 1 ms apart from now
    _check_paths(args)
    since, until = _moment("from", args.since), _moment("to", args.until)
    selector: RendezvousSelector | None = None
    if args.state_dir is not None:
        progress.step(f"reading the subscriptions of the cluster of {args.state_dir}")
        subscriptions, fronts, configuration = cluster_subscriptions(args.state_dir)
        selector, partitions = configuration.selector, len(configuration.matchers)
    else:
        progress.step(f"reading subscriptions from {args.subscriptions}")
        fronts = read_subscriptions(args.subscriptions)
        subscriptions, partitions = [f.matched() for f in fronts], args.partitions or 1
    progress.step("starting Spark")
    spark = spark_session(args.master)
    if args.archive is not None:
        with progress.spark(spark, f"reading the changes of the archive {args.archive}"):
            stepped = archived_steps(
                spark, args.archive, tenant=args.tenant, since=since, until=until
            )
    else:
        with progress.spark(spark, f"reading and checking {args.updates}"):
            lines = _read_checked(spark, args.updates)
            initial = None
            if args.initial_state is not None:
                initial = _read_checked(spark, args.initial_state)
        with progress.spark(spark, "applying the updates to their entities"):
            stepped = apply_updates(
                spark,
                lines,
                clock,
                initial=initial,
                source=str(args.updates),
                initial_source=str(args.initial_state),
            )
    kept: list[Any] = [stepped]
    try:
        progress.step(
            f"planning {len(subscriptions)} subscriptions in {partitions} partitions "
            f"(Spark master {spark.sparkContext.master}, method {args.method})"
        )
        with (
            open_matcher(
                spark,
                subscriptions,
                method=args.method,
                now=MATCHED_FROM,
                partitions=partitions,
                selector=selector,
            ) as matcher,
            progress.spark(spark, f"matching, deciding and writing {args.out}"),
        ):
            frame = notified(spark, matcher, stepped, {f.id: f for f in fronts}, kept)
            count = _write(frame, args.out)
        updates = stepped.count()
    finally:
        for frame_or_broadcast in kept:
            frame_or_broadcast.unpersist()
    took = time.monotonic() - started
    what = "changes" if args.archive is not None else "updates"
    print(
        f"{updates} {what}, {len(subscriptions)} subscriptions: {count} notifications "
        f"written to {args.out} in {took:.1f} s"
    )
    return 0


def _read_checked(spark: Any, path: Path) -> Any:
    """The ``(update, text)`` lines of a file of updates, checked (InputError otherwise)."""
    from spark_matcher.source import check_dates, check_lines, read_lines

    lines = read_lines(spark, path)
    check_lines(lines, source=str(path), timed=True)
    check_dates(lines, source=str(path))
    return lines


def _write(frame: Any, out: Path) -> int:
    """Write the notifications, sorted; how many there were."""
    ordered = frame.orderBy("update", "subscription")
    if out.suffix == ".parquet":
        ordered.write.mode("overwrite").parquet(str(out))
        count: int = ordered.sparkSession.read.parquet(str(out)).count()
        return count
    count = 0
    with out.open("w", encoding="utf-8") as written:
        for update, subscription in ordered.toLocalIterator():
            written.write(json.dumps({"update": update, "subscription": subscription}))
            written.write("\n")
            count += 1
    return count


def main(argv: Sequence[str] | None = None) -> int:
    """``silbo replay`` on its own: parse ``argv`` (default ``sys.argv[1:]``) and run it."""
    return standalone(_PROG, HELP, configure, run, argv)


if __name__ == "__main__":
    sys.exit(main())
