"""``silbo demo``: a whole cluster at work, and a check that it delivered exactly right.

    silbo demo [--duration 30] [--subscriptions 1000] [--rate 250] [--publishers 3]
               [--subscribers 3] [--matchers 2] [--scale-to 4] [--state-dir DIR]

1. starts a cluster on this machine (embedded ZooKeeper, 1 connection point, 1 access
   point, ``--matchers`` matchers, 1 exit point: real processes, their logs under the state
   directory);
2. registers the W-IoT subscriptions (docs/workloads.md), spread over ``--subscribers``
   subscriber clients;
3. runs ``--publishers`` publishers (each a client of its own, in its own thread) sending
   W-IoT updates at ``--rate`` updates/s in all, for ``--duration`` seconds, printing
   progress each second;
4. meanwhile scales the matchers out to ``--scale-to`` a third of the way through (new
   matcher processes, then the scale protocol) and back in to ``--matchers`` two thirds of
   the way (the protocol, then the leaving processes stop), as ``silbo admin scale`` does;
   the publishers keep going until both scales are over (``--scale-to`` equal to
   ``--matchers``: no scale);
5. computes the deliveries expected with the reference matcher (which evaluates every
   subscription plainly) and prints each scale's report (outcome, duration, subscriptions
   and bytes moved, no-matching time, epoch) and the verification summary: updates
   published, deliveries expected, delivered, lost, duplicated, out of order.

It exits 1 if any delivery was lost, duplicated or out of publish order, or if a scale did
not complete; else 0.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from kazoo.client import KazooClient

from broker.bench.scale import ScaleRecord, scale_local
from broker.bench.workloads.iot import iot_subscriptions, iot_updates
from broker.client import Client
from broker.cluster import ClusterSpec, LocalCluster
from broker.coordination.client import connect
from broker.errors import SilboError
from broker.matching.reference import ReferenceMatcher
from broker.model.update import ContextUpdate
from broker.wire import client_pb2 as pb

__all__ = ["Scales", "Tally", "configure", "run"]


@dataclass
class Tally:
    """What the subscribers received: (publisher, sequence, subscription id) per notification."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    received: list[tuple[str, int, str]] = field(default_factory=list)
    out_of_order: int = 0
    last: dict[tuple[str, str], int] = field(default_factory=dict)  # (subscriber, publisher)

    def receiver(self, name: str) -> object:
        """A Client ``on_batch`` callback recording a subscriber's notifications."""

        def on_batch(batch: pb.NotificationBatch, handles: dict[int, str]) -> None:
            index = np.frombuffer(batch.entity_index, dtype="<u4").tolist()
            numbers = np.frombuffer(batch.handles, dtype="<u8").tolist()
            with self.lock:
                for i, handle in zip(index, numbers, strict=True):
                    publisher, sequence = batch.publishers[i], batch.sequences[i]
                    self.received.append((publisher, sequence, handles.get(handle, "?")))
                for publisher, sequence in zip(batch.publishers, batch.sequences, strict=True):
                    key = (name, publisher)
                    if sequence <= self.last.get(key, 0):
                        self.out_of_order += 1
                    self.last[key] = sequence

        return on_batch


@dataclass
class Scales:
    """The matcher scales of a run: the plan, what ran, and how many matchers serve now."""

    plan: list[tuple[float, int]]  # (seconds after the start, matchers)
    matchers: int
    records: list[ScaleRecord] = field(default_factory=list)
    error: SilboError | None = None

    @property
    def ok(self) -> bool:
        """Whether every planned scale ran and completed."""
        done = len(self.records) == len(self.plan)
        return done and self.error is None and all(r.completed for r in self.records)

    def run(self, cluster: LocalCluster, started: float) -> None:
        """Scale at each planned moment (``started``: a ``time.monotonic()``), on this thread.

        On this thread because a matcher started by a thread gets its parent-death signal
        when that thread ends (``PR_SET_PDEATHSIG`` is per thread). Stops at the first
        scale that does not complete.
        """
        if not self.plan:
            return
        try:
            client = connect(cluster.zk_address, cluster=cluster.spec.cluster, timeout=10.0)
            try:
                self._run_plan(cluster, client, started)
            finally:
                client.stop()
                client.close()
        except SilboError as exc:
            self.error = exc

    def _run_plan(self, cluster: LocalCluster, client: KazooClient, started: float) -> None:
        for at, count in self.plan:
            time.sleep(max(0.0, started + at - time.monotonic()))
            record = scale_local(cluster, client, count)
            self.records.append(record)
            _say(f"scale {record.summary_line()}")
            if not record.completed:
                return
            self.matchers = count


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``silbo demo``."""
    parser.add_argument("--duration", type=float, default=30.0, help="seconds of publishing")
    parser.add_argument("--subscriptions", type=int, default=1000)
    parser.add_argument("--rate", type=int, default=250, help="updates/s, all publishers")
    parser.add_argument("--publishers", type=int, default=3)
    parser.add_argument("--subscribers", type=int, default=3)
    parser.add_argument("--matchers", type=int, default=2)
    parser.add_argument(
        "--scale-to", type=int, default=4, help="matchers while scaled out (mid-run)"
    )
    parser.add_argument("--state-dir", default=None, help="where the cluster keeps its logs")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--log-level",
        default="WARNING",
        choices=("DEBUG", "INFO", "WARNING", "ERROR"),
        help="the cluster processes' log level (default WARNING)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run the demonstration; 0 if every delivery was exactly right, else 1."""
    if args.scale_to < 1:
        print("silbo demo: error: --scale-to must be at least 1", file=sys.stderr)
        return 2
    state = Path(args.state_dir) if args.state_dir else Path(tempfile.mkdtemp(prefix="silbo-demo-"))
    spec = ClusterSpec(
        matchers=args.matchers, grpc_port=0, state_dir=state, log_level=args.log_level
    )
    _say(f"starting a cluster: {args.matchers} matchers, logs in {state / 'logs'}")
    began = time.monotonic()
    with LocalCluster(spec) as cluster:
        took = time.monotonic() - began
        _say(f"cluster up in {took:.1f} s; clients connect to {', '.join(cluster.endpoints)}")
        published, tally, subscriptions, scales = _scenario(args, cluster)
    delivered = _verify(published, tally, subscriptions)
    scaled = _report_scales(scales)
    return 0 if delivered and scaled else 1


def _scenario(
    args: argparse.Namespace, cluster: LocalCluster
) -> tuple[dict[str, list[ContextUpdate]], Tally, list[object], Scales]:
    endpoints = cluster.endpoints
    subscriptions = iot_subscriptions(args.subscriptions, args.seed)
    tally = Tally()
    subscribers = [
        Client(endpoints, on_batch=tally.receiver(f"subscriber-{i}"))  # type: ignore[arg-type]
        for i in range(args.subscribers)
    ]
    for i, client in enumerate(subscribers):
        client.subscribe_many(subscriptions[i :: args.subscribers])
    _say(f"{len(subscriptions)} W-IoT subscriptions over {args.subscribers} subscribers")
    published: dict[str, list[ContextUpdate]] = {}
    stop = threading.Event()
    per_publisher = args.rate / args.publishers
    threads = []
    for p in range(args.publishers):
        name = f"station-feed-{p + 1}"
        published[name] = []
        thread = threading.Thread(
            target=_publish,
            args=(endpoints, name, per_publisher, args.seed + 100 + p, published[name], stop),
            daemon=True,
        )
        threads.append(thread)
        thread.start()
    scales = Scales(_scale_plan(args), args.matchers)
    started = time.monotonic()
    done = threading.Event()
    progress = threading.Thread(
        target=_progress, args=(published, tally, scales, started, done), daemon=True
    )
    progress.start()
    scales.run(cluster, started)  # the publishers keep going meanwhile
    time.sleep(max(0.0, started + args.duration - time.monotonic()))
    stop.set()
    done.set()
    for thread in [*threads, progress]:
        thread.join()
    time.sleep(2.0)  # let the last notifications arrive
    for client in subscribers:
        client.close()
    return published, tally, list(subscriptions), scales


def _progress(
    published: dict[str, list[ContextUpdate]],
    tally: Tally,
    scales: Scales,
    started: float,
    done: threading.Event,
) -> None:
    """A line each second: updates published, notifications received, matchers serving."""
    while not done.wait(1.0):
        sent = sum(len(v) for v in published.values())
        with tally.lock:
            got = len(tally.received)
        _say(
            f"t={time.monotonic() - started:4.0f} s  published {sent:6d}  "
            f"notifications {got:7d}  matchers {scales.matchers}"
        )


def _scale_plan(args: argparse.Namespace) -> list[tuple[float, int]]:
    """Out to --scale-to a third of the way through, back to --matchers at two thirds."""
    if args.scale_to == args.matchers:
        return []
    return [(args.duration / 3, args.scale_to), (2 * args.duration / 3, args.matchers)]


def _publish(
    endpoints: list[str],
    name: str,
    rate: float,
    seed: int,
    out: list[ContextUpdate],
    stop: threading.Event,
) -> None:
    updates = iot_updates(int(rate * 120) + 100, seed)
    random.Random(seed).shuffle(updates)
    batch = max(1, int(rate / 20))  # about 20 batches per second
    with Client(endpoints, publisher=name) as client:
        started = time.monotonic()
        for start in range(0, len(updates), batch):
            if stop.is_set():
                break
            due = started + start / rate
            delay = due - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            chunk = updates[start : start + batch]
            client.publish_many(chunk, batch_size=batch)
            out.extend(chunk)


def _report_scales(scales: Scales) -> bool:
    """Print each scale's report; whether every planned scale completed."""
    if not scales.plan:
        return True
    print("\nscales (matchers, while the publishers kept publishing)")
    for record in scales.records:
        print(f"  {record.summary_line()}")
    if scales.error is not None:
        print(f"  scaling failed: {scales.error}")
    print("  result: " + ("every scale completed" if scales.ok else "FAILED"))
    return scales.ok


def _verify(
    published: dict[str, list[ContextUpdate]], tally: Tally, subscriptions: list[object]
) -> bool:
    total = sum(len(v) for v in published.values())
    _say(f"computing the expected deliveries of {total} updates with the reference matcher")
    reference = ReferenceMatcher(subscriptions)  # type: ignore[arg-type]
    expected: dict[tuple[str, int, str], int] = defaultdict(int)
    for publisher, updates in published.items():
        for sequence, update in enumerate(updates, start=1):
            for subscription_id in reference.match(update):
                expected[(publisher, sequence, subscription_id)] += 1
    delivered: dict[tuple[str, int, str], int] = defaultdict(int)
    for key in tally.received:
        delivered[key] += 1
    lost = sum(1 for key in expected if key not in delivered)
    duplicated = sum(n - 1 for n in delivered.values() if n > 1)
    unexpected = sum(1 for key in delivered if key not in expected)
    rows = [
        ("updates published", total),
        ("deliveries expected (reference matcher)", len(expected)),
        ("delivered", len(tally.received)),
        ("lost", lost),
        ("duplicated", duplicated),
        ("unexpected", unexpected),
        ("out of order (per publisher)", tally.out_of_order),
    ]
    print("\nverification summary")
    for label, value in rows:
        print(f"  {label:<42} {value:>9,}")
    ok = not (lost or duplicated or unexpected or tally.out_of_order)
    print(
        "  result: " + ("every notification delivered exactly once, in order" if ok else "FAILED")
    )
    return ok


def _say(message: str) -> None:
    print(f"[demo] {message}", flush=True)
    sys.stdout.flush()
