"""``silbo bench e2e``: sustained throughput and latency of a whole cluster, end to end.

    silbo bench e2e --subscriptions 10000 --rate max|R --duration 30 [--batch 200]
                    [--matchers 2] [--replicas 2|1,2] [--state-dir DIR] [--runs N] [--json]

``--replicas 1,2`` measures each count in turn (runs alternating, so both see the same
machine) and reports each one's medians and the throughput ratio of the last to the first.

One run:

1. starts a cluster (1 connection point, 1 access point, ``--matchers`` matchers, 1 exit
   point, embedded ZooKeeper), unless ``--state-dir`` names a running one;
2. registers ``--subscriptions`` W-IoT subscriptions through one subscriber client, and
   prepares a pool of W-IoT updates as publish batches of ``--batch`` (not timed);
3. publishes for ``--duration`` seconds at ``--rate`` updates/s (``max``: as fast as the
   cluster acknowledges, at most ``--window`` batches in flight), then waits for every
   expected notification (at most ``--drain`` seconds);
4. checks the deliveries against the expected ones, computed by the in-process engine on
   the same subscriptions and updates (the engine is checked against the reference matcher
   by the property tests): lost, duplicated, unexpected, and per-publisher order.

Reported: ``updates_per_s`` (updates published / time from the first publish to the last
delivery, so backlog drained at the end counts against it), ``offered_per_s`` (the publish
rate achieved), ``deliveries_per_s``, ``p50_ms``/``p99_ms``/``max_ms`` of publish-to-delivery
latency (per update and subscriber, from the moment its batch was handed to the client to
the moment its notification batch arrived; the first ``--warmup`` seconds, while caches and
indexes fill, are left out), and the verification counts (over every update).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from broker.bench.match import machine_info, run_and_report
from broker.bench.workloads.iot import iot_subscriptions, iot_updates
from broker.client import Client
from broker.cluster import ClusterSpec, LocalCluster
from broker.coordination.configuration import DEFAULT_REPLICAS
from broker.matching import Engine
from broker.model.update import ContextUpdate
from broker.wire import client_pb2 as pb
from broker.wire.convert import entity_from_update

__all__ = [
    "E2eReport",
    "configure",
    "delivered_pairs",
    "expected_pairs",
    "expected_positions",
    "handle_positions",
    "run",
    "run_once",
    "sorted_unique",
    "stored_pool",
]

POOL = 20_000  # distinct updates; the run cycles through them


@dataclass
class E2eReport:
    """One run's figures (see the module doc)."""

    subscriptions: int
    rate: str
    duration_s: float
    batch: int
    matchers: int
    replicas: int = DEFAULT_REPLICAS
    updates: int = 0
    updates_per_s: float = 0.0
    offered_per_s: float = 0.0
    deliveries: int = 0
    deliveries_per_s: float = 0.0
    expected: int = 0
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    max_ms: float = 0.0
    lost: int = 0
    duplicated: int = 0
    unexpected: int = 0
    out_of_order: int = 0
    drained: bool = True
    store: bool = False  # published through the context store (--store)


class _Receiver:
    """Counts notification batches as they arrive (on the client's reader thread)."""

    def __init__(self, sent_at: npt.NDArray[np.float64], batch: int) -> None:
        self._sent_at = sent_at
        self._batch = batch
        self.lock = threading.Lock()
        self.sequences: list[npt.NDArray[np.int64]] = []
        self.handles: list[npt.NDArray[np.uint64]] = []
        self.latencies: list[npt.NDArray[np.float64]] = []
        self.latency_sequences: list[npt.NDArray[np.int64]] = []
        self.count = 0
        self.last = 0.0
        self.out_of_order = 0
        self._previous = 0

    def __call__(self, batch: pb.NotificationBatch, _handles: dict[int, str]) -> None:
        now = time.perf_counter()
        sequences = np.asarray(batch.sequences, dtype=np.int64)
        index = np.frombuffer(batch.entity_index, dtype="<u4").astype(np.int64)
        with self.lock:
            if len(sequences):
                if sequences[0] <= self._previous or np.any(np.diff(sequences) <= 0):
                    self.out_of_order += 1
                self._previous = int(sequences[-1])
            self.sequences.append(sequences[index])
            self.handles.append(np.frombuffer(batch.handles, dtype="<u8").astype(np.uint64))
            self.latencies.append(now - self._sent_at[(sequences - 1) // self._batch])
            self.latency_sequences.append(sequences)
            self.count += len(index)
            self.last = now


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``silbo bench e2e``."""
    parser.add_argument("--subscriptions", type=int, default=10_000)
    parser.add_argument("--rate", default="max", help="updates/s offered, or max")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of publishing")
    parser.add_argument(
        "--warmup",
        type=float,
        default=2.0,
        help="first seconds of publishing left out of the latency figures (still verified)",
    )
    parser.add_argument("--batch", type=int, default=200, help="updates per publish batch")
    parser.add_argument("--window", type=int, default=8, help="publish batches in flight")
    parser.add_argument(
        "--store",
        action="store_true",
        help="publish through the context store (PublishRequest.store: each update upserted, "
        "the stored entity published)",
    )
    parser.add_argument("--matchers", type=int, default=2)
    parser.add_argument(
        "--replicas",
        default=str(DEFAULT_REPLICAS),
        help=f"matchers holding each subscription (default {DEFAULT_REPLICAS}); a list "
        "(1,2) compares them",
    )
    parser.add_argument("--state-dir", default=None, help="use this running cluster instead")
    parser.add_argument("--drain", type=float, default=60.0, help="seconds to wait at the end")
    parser.add_argument("--runs", type=int, default=1, help="runs (medians reported)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; prints the report (exit 1 if anything was lost or duplicated)."""
    if args.rate != "max" and (not args.rate.isdigit() or int(args.rate) <= 0):
        print("silbo bench e2e: error: --rate must be a positive integer or max", file=sys.stderr)
        return 2
    if args.store and args.state_dir:
        print(
            "silbo bench e2e: error: --store needs a cluster of its own (its oracle starts "
            "from an empty store): leave out --state-dir",
            file=sys.stderr,
        )
        return 2
    try:
        counts = [int(part) for part in str(args.replicas).split(",")]
        if not counts or min(counts) < 1:
            raise ValueError
    except ValueError:
        print(
            "silbo bench e2e: error: --replicas must be a positive integer or a comma-separated "
            "list of them",
            file=sys.stderr,
        )
        return 2
    if len(counts) == 1:
        args.replicas = counts[0]
        report = run_and_report(args, run_once, _median, _print, _say)
        reports = [report]
    else:
        reports = _compare(args, counts)
    bad = any(r.lost or r.duplicated or r.unexpected or r.out_of_order for r in reports)
    return 1 if bad else 0


def _compare(args: argparse.Namespace, counts: list[int]) -> list[E2eReport]:
    """Runs alternating over the replica counts; each count's median and the ratio."""
    runs: dict[int, list[E2eReport]] = {count: [] for count in counts}
    for i in range(args.runs):
        for count in counts:
            _say(f"run {i + 1}/{args.runs}, {count} replicas")
            args.replicas = count
            runs[count].append(run_once(args))
    medians = {count: _median(reports) for count, reports in runs.items()}
    first, last = medians[counts[0]], medians[counts[-1]]
    ratio = round(last.updates_per_s / first.updates_per_s, 3) if first.updates_per_s else 0.0
    if args.json:
        print(
            json.dumps(
                {
                    "by_replicas": {str(c): asdict(m) for c, m in medians.items()},
                    "runs": {str(c): [asdict(r) for r in rs] for c, rs in runs.items()},
                    "throughput_ratio": ratio,
                    "machine": machine_info(),
                    "command": getattr(args, "command_line", ""),
                },
                indent=2,
            )
        )
    else:
        for report in medians.values():
            _print(report)
        print(f"throughput with {counts[-1]} replicas / with {counts[0]}: {ratio:.2f}")
    return list(medians.values())


def run_once(args: argparse.Namespace) -> E2eReport:
    """One run (see the module doc)."""
    report = E2eReport(
        args.subscriptions, str(args.rate), args.duration, args.batch, args.matchers, args.replicas
    )
    report.store = args.store
    cluster = None
    if args.state_dir:
        client_targets = Client.from_state_dir(args.state_dir).target
    else:
        state = Path(tempfile.mkdtemp(prefix="silbo-e2e-"))
        spec = ClusterSpec(
            matchers=args.matchers,
            grpc_port=0,
            state_dir=state,
            log_level="WARNING",
            replicas=args.replicas,
        )
        _say(f"starting a cluster ({args.matchers} matchers) in {state}")
        cluster = LocalCluster(spec)
        cluster.start()
        client_targets = cluster.endpoints[0]
    try:
        _measure(args, report, client_targets)
    finally:
        if cluster is not None:
            cluster.stop()
    return report


def _measure(args: argparse.Namespace, report: E2eReport, target: str) -> None:
    subscriptions = iot_subscriptions(args.subscriptions, args.seed)
    pool = iot_updates(POOL, args.seed + 1)
    entities = [entity_from_update(u) for u in pool]
    rate = None if args.rate == "max" else int(args.rate)
    total = int((rate or 40_000) * args.duration * 1.5) + args.batch
    batches = total // args.batch
    sent_at = np.full(batches + 1, np.nan)
    receiver = _Receiver(sent_at, args.batch)
    subscriber = Client(target, on_batch=receiver, timeout=60.0)
    publisher = Client(target, publisher="bench-e2e", window=args.window, timeout=60.0)
    try:
        _say(f"subscribing {len(subscriptions)} W-IoT subscriptions")
        handles = subscriber.subscribe_many(subscriptions)
        ids = [h.id for h in handles]
        handle_numbers = handle_positions(subscriber)
        _say(f"publishing for {args.duration:.0f} s at {args.rate} updates/s")
        published, started, stopped = _publish(publisher, entities, args, rate, sent_at, batches)
        expected = _expected(subscriptions, pool, published, ids, args.store)
        report.expected = len(expected)
        deadline = time.perf_counter() + args.drain
        while receiver.count < report.expected and time.perf_counter() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)  # late duplicates, if any, arrive now
        report.drained = receiver.count >= report.expected
    finally:
        publisher.close()
        subscriber.close()
    with receiver.lock:
        sequences = np.concatenate(receiver.sequences) if receiver.sequences else np.zeros(0)
        got_handles = (
            np.concatenate(receiver.handles) if receiver.handles else np.zeros(0, dtype=np.uint64)
        )
        latencies = np.concatenate(receiver.latencies) if receiver.latencies else np.zeros(0)
        latency_sequences = (
            np.concatenate(receiver.latency_sequences)
            if receiver.latency_sequences
            else np.zeros(0, dtype=np.int64)
        )
        last = receiver.last or stopped
        report.out_of_order = receiver.out_of_order
    delivered = delivered_pairs(sequences, got_handles, handle_numbers)
    unique = np.unique(delivered)
    report.updates = published
    report.deliveries = len(delivered)
    report.duplicated = len(delivered) - len(unique)
    report.lost = len(np.setdiff1d(expected, unique))
    report.unexpected = len(np.setdiff1d(unique, expected))
    elapsed = max(last, stopped) - started
    report.updates_per_s = round(published / elapsed, 1)
    report.offered_per_s = round(published / (stopped - started), 1)
    report.deliveries_per_s = round(len(delivered) / elapsed, 1)
    warm = int(min(args.warmup, args.duration / 2) * report.offered_per_s)
    latencies = latencies[latency_sequences > warm]
    if len(latencies):
        ms = latencies * 1000.0
        report.p50_ms = round(float(np.percentile(ms, 50)), 2)
        report.p99_ms = round(float(np.percentile(ms, 99)), 2)
        report.max_ms = round(float(ms.max()), 2)


def _publish(
    publisher: Client,
    entities: list[pb.Entity],
    args: argparse.Namespace,
    rate: int | None,
    sent_at: npt.NDArray[np.float64],
    batches: int,
) -> tuple[int, float, float]:
    size = args.batch
    requests = []
    for b in range(batches):
        chosen = [entities[(b * size + i) % len(entities)] for i in range(size)]
        requests.append(
            pb.PublishRequest(
                publisher="bench-e2e",
                first_sequence=b * size + 1,
                entities=chosen,
                store=args.store,
            )
        )
    # The prepared batches are many long-lived objects: keep the collector off them, and
    # off this process while it measures (a full collection would show up as latency).
    gc.freeze()
    gc.disable()
    started = time.perf_counter()
    end = started + args.duration
    sent = 0
    futures = []
    for b, request in enumerate(requests):
        now = time.perf_counter()
        if now >= end:
            break
        if rate is not None:
            due = started + b * size / rate
            if due > now:
                time.sleep(due - now)
        sent_at[b] = time.perf_counter()
        futures.append(publisher._send_request(request))
        sent += size
        if b % 50 == 0:
            _progress(sent, time.perf_counter() - started)
    for future in futures:
        future.result(timeout=120)
    stopped = time.perf_counter()
    gc.enable()
    print(file=sys.stderr)
    return sent, started, stopped


def handle_positions(client: Client) -> dict[int, int]:
    """Subscription handle -> its position among the subscriptions (by id order of acks)."""
    return {h: i for i, h in enumerate(client._handles)}


def _local(handles: npt.NDArray[np.uint64], numbers: dict[int, int]) -> npt.NDArray[np.int64]:
    keys = np.fromiter(numbers.keys(), dtype=np.uint64, count=len(numbers))
    values = np.fromiter(numbers.values(), dtype=np.int64, count=len(numbers))
    order = np.argsort(keys)
    keys, values = keys[order], values[order]
    at = np.clip(np.searchsorted(keys, handles), 0, len(keys) - 1)
    found = keys[at] == handles
    return np.where(found, values[at], -1)


def expected_positions(
    subscriptions: list[Any], pool: list[Any], ids: list[str]
) -> list[npt.NDArray[np.int64]]:
    """Per update of ``pool``, the positions in ``ids`` of the subscriptions it matches.

    Computed by the in-process engine (property-tested against the reference matcher).
    """
    engine = Engine(subscriptions)
    position_of_id = {subscription_id: i for i, subscription_id in enumerate(ids)}
    slot_position = np.full(len(ids) * 2 + 1, -1, dtype=np.int64)
    for subscription in subscriptions:
        slot = engine.slot_of(subscription.id)
        if slot is not None:
            if slot >= len(slot_position):
                slot_position = np.resize(slot_position, slot + 1)
            slot_position[slot] = position_of_id[subscription.id]
    return [slot_position[s] for s in engine.match_batch_slots(pool, now=time.time())]


def expected_pairs(
    per_update: list[npt.NDArray[np.int64]], published: int, period: int | None = None
) -> npt.NDArray[np.int64]:
    """Every (sequence, subscription position) pair that should be delivered, encoded.

    Sequence ``s`` (from 1) carries pool update ``(s - 1) % len(per_update)``; a pair is
    ``s * 2**24 + position``, as :func:`delivered_pairs` encodes deliveries. With ``period``,
    ``per_update`` is a first pass then one that repeats every ``period`` (stored updates:
    :func:`stored_pool`).
    """
    pairs = []
    for sequence in range(1, published + 1):
        positions = per_update[_pool_index(sequence, len(per_update), period)]
        if len(positions):
            pairs.append(sequence * (1 << 24) + positions)
    return sorted_unique(np.concatenate(pairs)) if pairs else np.zeros(0, dtype=np.int64)


def _pool_index(sequence: int, length: int, period: int | None) -> int:
    if period is None:
        return (sequence - 1) % length
    first = length - period
    return sequence - 1 if sequence <= length else first + (sequence - 1 - first) % period


def stored_pool(pool: list[ContextUpdate]) -> list[ContextUpdate]:
    """What the context store publishes for the pool cycled twice (``--store``): each
    update merged into its entity's earlier attributes. From the second pass on, every
    entity has all the attributes it ever gets, so the second pass repeats for ever."""
    merged: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    out = []
    for update in [*pool, *pool]:
        key = (update.tenant, update.service_path, update.entity_id, update.entity_type)
        attributes = merged.setdefault(key, {})
        attributes.update(update.attributes)
        out.append(replace(update, attributes=dict(attributes)))
    return out


def sorted_unique(values: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """``np.unique(values)``, by sorting: numpy 2's hashing unique is far slower on pair codes."""
    ordered = np.sort(values)
    if len(ordered) == 0:
        return ordered
    keep = np.empty(len(ordered), dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


def delivered_pairs(
    sequences: npt.NDArray[Any],
    handles: npt.NDArray[np.uint64],
    positions: dict[int, int],
) -> npt.NDArray[np.int64]:
    """Deliveries (sequence, subscription handle) encoded as :func:`expected_pairs` does."""
    return sequences.astype(np.int64) * (1 << 24) + _local(handles, positions)


def _expected(
    subscriptions: list[Any],
    pool: list[Any],
    published: int,
    ids: list[str],
    store: bool = False,
) -> npt.NDArray[np.int64]:
    """Every (sequence, subscription position) pair that should be delivered, encoded."""
    _say("computing the expected deliveries with the in-process engine")
    if store:
        stored = stored_pool(pool)
        per_update = expected_positions(subscriptions, stored, ids)
        return expected_pairs(per_update, published, period=len(pool))
    return expected_pairs(expected_positions(subscriptions, pool, ids), published)


def _median(reports: list[E2eReport]) -> E2eReport:
    if len(reports) == 1:
        return reports[0]
    median = E2eReport(**asdict(reports[0]))
    for key in ("updates_per_s", "offered_per_s", "deliveries_per_s", "p50_ms", "p99_ms", "max_ms"):
        setattr(median, key, round(statistics.median(getattr(r, key) for r in reports), 2))
    for key in ("lost", "duplicated", "unexpected", "out_of_order"):
        setattr(median, key, max(getattr(r, key) for r in reports))
    return median


def _print(report: E2eReport) -> None:
    print(
        f"W-IoT e2e, {report.subscriptions} subscriptions, {report.matchers} matchers "
        f"({report.replicas} replicas), "
        f"rate {report.rate}, batch {report.batch}"
        f"{', through the context store' if report.store else ''}\n"
        f"  updates: {report.updates} at {report.updates_per_s:,.0f}/s sustained "
        f"(offered {report.offered_per_s:,.0f}/s)\n"
        f"  deliveries: {report.deliveries:,} at {report.deliveries_per_s:,.0f}/s "
        f"(expected {report.expected:,})\n"
        f"  latency: p50 {report.p50_ms} ms, p99 {report.p99_ms} ms, max {report.max_ms} ms\n"
        f"  lost {report.lost}, duplicated {report.duplicated}, unexpected {report.unexpected}, "
        f"out of order {report.out_of_order}"
    )


def _say(message: str) -> None:
    print(f"[bench e2e] {message}", file=sys.stderr, flush=True)


def _progress(sent: int, elapsed: float) -> None:
    rate = sent / elapsed if elapsed > 0 else 0.0
    print(f"\r[bench e2e] published {sent:,} ({rate:,.0f}/s)", end="", file=sys.stderr, flush=True)
