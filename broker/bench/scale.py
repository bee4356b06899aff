"""``silbo bench scale``: matchers scaled out and in under a constant load, on a time line.

    silbo bench scale [--subscriptions 100000] [--steps 2,4,2] [--rate 1000] [--phase 20]
                      [--batch 50] [--out bench-out] [--state-dir DIR] [--zk HOST:PORT]
                      [--drain 120] [--timeout 60] [--json]

The scale scenario of workloads.md. One run:

1. starts a cluster on this machine (1 connection point, 1 access point, ``steps[0]``
   matchers, 1 exit point; an embedded ZooKeeper unless ``--zk`` names one), its logs under
   ``--state-dir`` (default: a new temporary directory, kept and named on stderr);
2. registers ``--subscriptions`` W-IoT subscriptions through one subscriber client, then
   computes with the in-process engine which of them each update of a pool of W-IoT updates
   matches (neither is timed; the engine is property-tested against the reference matcher).
   Meanwhile a heartbeat keeps data flowing between the processes (see :class:`_Heartbeat`);
3. publishes the pool, cycled, from one publisher thread at a constant ``--rate`` updates/s
   in batches of ``--batch``, for one phase of ``--phase`` seconds per step; at the end of
   each phase but the last the main thread moves the matchers to the next step, as
   ``silbo admin scale`` does: a scale-out starts the new matcher processes, then runs the
   scale protocol over the old matchers plus the new ones; a scale-in runs it over the first
   N and then stops the leaving processes. Publishing goes on until the last phase has
   lasted ``--phase`` seconds after the last scale. A status line per second (time,
   updates completed in the last second, their p99, matchers configured);
4. waits for every expected notification (at most ``--drain`` seconds), checks every
   delivery against the engine's (lost, duplicated, unexpected, out of publish order), and
   writes ``OUT/scale.json`` and ``OUT/scale.png``.

Definitions (times in seconds from the first publish; broker/bench/timeline.py computes
them):

- an update is *completed* when the subscriber has received every notification the engine
  says it has; its completion time is the arrival of the last of them. An update that
  matches no subscription is completed when it is published (``silent_updates`` counts
  them: none at 100k W-IoT subscriptions, a few percent at 2,000);
- the time line covers the whole seconds of publishing. *updates/s* of second ``t``:
  updates completed in ``[t, t + 1)``; *latency* of an update: its completion time minus
  the moment its batch was handed to the client; *p50/p99* of second ``t``: over the
  updates published in ``[t, t + 1)``;
- per scale: ``outcome``, ``duration_s``, ``moved_subscriptions``, ``moved_bytes``,
  ``no_matching_ms``, ``epoch`` as the coordinator reports them (``duration_s`` is the
  protocol's window); ``processes_s``: the time spent starting the new matchers before it,
  or stopping the leaving ones after it; ``before_per_s``: the median updates/s of the 5
  whole seconds before the scale began (processes included); ``during_per_s``: updates
  completed per second from the protocol's start to its end (at least 1 s: completions
  arrive in batches); ``operation_per_s``: the same over the whole operation, processes
  included; ``after_per_s``: over the 5 s after the protocol; ``ratio``: during / before;
  ``longest_gap_ms``: the longest time in the protocol's window in which no update
  completed (``gap_before_ms``: the same over the 5 s before the scale), a check from
  outside of the no-matching time.

Exit status 1 if anything was lost, duplicated, unexpected or out of order, if a scale did
not complete, or if the expected notifications did not all arrive.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import json
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
from kazoo.client import KazooClient

from broker.bench.e2e import (
    POOL,
    delivered_pairs,
    expected_pairs,
    expected_positions,
    handle_positions,
    sorted_unique,
)
from broker.bench.match import machine_info
from broker.bench.timeline import ScaleWindow, matchers_at, plot, throughput_around, timeline
from broker.bench.workloads.iot import iot_subscriptions, iot_updates
from broker.client import Client
from broker.cluster import ClusterSpec, LocalCluster
from broker.coordination.client import connect
from broker.coordination.configuration import DEFAULT_REPLICAS, ClusterConfiguration
from broker.coordination.coordinator import ScaleOutcome, scale_matchers
from broker.coordination.membership import members
from broker.model.subscription import EntitySelector, Subscription
from broker.model.update import ContextUpdate
from broker.runtime.options import Role
from broker.wire import client_pb2 as pb
from broker.wire.convert import entity_from_update

__all__ = ["ScaleRecord", "configure", "run", "scale_local", "source_commit"]

PUBLISHER = "bench-scale"
HEARTBEAT_TENANT = "bench_heartbeat"  # no workload subscription or update uses it
REGISTER_CHUNK = 10_000


@dataclass
class ScaleRecord:
    """One scale as run: the coordinator's outcome and when each part of it happened.

    Times are ``time.perf_counter()`` values.
    """

    before: int
    after: int
    outcome: ScaleOutcome
    began: float  # starting new matcher processes, or the protocol for a scale-in
    protocol_began: float
    protocol_ended: float
    ended: float  # the leaving matchers stopped

    @property
    def completed(self) -> bool:
        """Whether the protocol completed."""
        return self.outcome.outcome == "completed"

    @property
    def label(self) -> str:
        """``2->4``."""
        return f"{self.before}->{self.after}"

    def window(self, origin: float) -> ScaleWindow:
        """When it ran, in seconds from ``origin``."""
        return ScaleWindow(
            self.began - origin,
            self.protocol_began - origin,
            self.protocol_ended - origin,
            self.ended - origin,
        )

    def report(self, origin: float) -> dict[str, Any]:
        """The record as JSON: the outcome's keys, and its times in seconds from ``origin``."""
        return {
            "from": self.before,
            "to": self.after,
            **self.outcome.to_dict(),
            "began_s": round(self.began - origin, 3),
            "protocol_began_s": round(self.protocol_began - origin, 3),
            "protocol_ended_s": round(self.protocol_ended - origin, 3),
            "ended_s": round(self.ended - origin, 3),
            "processes_s": round(
                (self.protocol_began - self.began) + (self.ended - self.protocol_ended), 3
            ),
        }

    def summary_line(self) -> str:
        """One line for people: outcome, duration, what moved, no-matching time, epoch."""
        outcome = self.outcome
        line = (
            f"{self.label}: {outcome.outcome} in {outcome.duration_s:.2f} s, "
            f"{outcome.moved_subscriptions:,} subscriptions ({outcome.moved_bytes:,} bytes) "
            f"moved, no-matching time {outcome.no_matching_ms:g} ms, epoch {outcome.epoch}"
        )
        return line + (f" ({outcome.message})" if outcome.message else "")


def scale_local(
    cluster: LocalCluster, client: KazooClient, count: int, timeout: float = 60.0
) -> ScaleRecord:
    """Scale the matchers of a local cluster to ``count``, as ``silbo admin scale`` does.

    A scale-out starts the missing matchers (registered idle ones are taken first) and runs
    the protocol over the old matchers plus the new; a scale-in runs it over the first
    ``count`` and, once completed, stops the others.
    """
    began = time.perf_counter()
    current = ClusterConfiguration(client).read()
    old = list(current.configuration.matchers) if current is not None else []
    leaving: list[str] = []
    if count > len(old):
        idle = [m.name for m in members(client, Role.MATCHER.value) if m.name not in old]
        missing = count - len(old) - len(idle)
        if missing > 0:
            idle += [m.name for m in cluster.add(Role.MATCHER, missing)]
        new = old + idle[: count - len(old)]
    else:
        new, leaving = old[:count], old[count:]
    protocol_began = time.perf_counter()
    outcome = scale_matchers(client, new, timeout=timeout)
    protocol_ended = time.perf_counter()
    if outcome.outcome == "completed" and leaving:
        cluster.retire(leaving)
    return ScaleRecord(
        len(old), count, outcome, began, protocol_began, protocol_ended, time.perf_counter()
    )


class _Tracker:
    """Counts the subscriber's notifications per update as they arrive (the reader thread).

    Per sequence (1 to capacity): ``expected`` notifications (from the engine), ``received``
    so far, and ``completed`` (the arrival that made them all, perf_counter; NaN until
    then). Every delivery is also kept (sequence, handle) for the verification.

    Order (one publisher): within a batch sequences must increase, and a batch must not
    start before the previous one ended (``out_of_order`` counts the batches that do, the
    first few are kept in ``disorder``: the previous batch's last sequence, then this
    one's first ones). A batch that starts with the previous one's last update (its
    notifications came in two batches) keeps the order: ``split`` counts those.
    """

    def __init__(self, capacity: int) -> None:
        self.expected = np.zeros(capacity + 1, dtype=np.int64)  # set before publishing
        self.received = np.zeros(capacity + 1, dtype=np.int64)
        self.completed = np.full(capacity + 1, np.nan)
        self.lock = threading.Lock()
        self.sequences: list[npt.NDArray[np.int64]] = []
        self.handles: list[npt.NDArray[np.uint64]] = []
        self.count = 0
        self.out_of_order = 0
        self.disorder: list[list[int]] = []
        self.split = 0
        self._previous = 0

    def __call__(self, batch: pb.NotificationBatch, _handles: dict[int, str]) -> None:
        now = time.perf_counter()
        sequences = np.asarray(batch.sequences, dtype=np.int64)
        index = np.frombuffer(batch.entity_index, dtype="<u4").astype(np.int64)
        with self.lock:
            if len(sequences):
                self._check_order(sequences)
            np.add.at(self.received, sequences[index], 1)
            self._complete(sequences, now)
            self.sequences.append(sequences[index])
            self.handles.append(np.frombuffer(batch.handles, dtype="<u8").astype(np.uint64))
            self.count += len(index)

    def _check_order(self, sequences: npt.NDArray[np.int64]) -> None:
        # caller holds the lock
        first = int(sequences[0])
        if first < self._previous or np.any(np.diff(sequences) <= 0):
            self.out_of_order += 1
            if len(self.disorder) < 5:
                self.disorder.append([self._previous, *sequences[:3].tolist()])
        elif first == self._previous:
            self.split += 1
        self._previous = max(self._previous, int(sequences[-1]))

    def published(self, sequences: npt.NDArray[np.int64], now: float) -> None:
        """Updates just published: those that match nothing are complete already."""
        with self.lock:
            self._complete(sequences, now)

    def _complete(self, sequences: npt.NDArray[np.int64], now: float) -> None:
        # caller holds the lock
        fresh = sequences[
            (self.received[sequences] >= self.expected[sequences])
            & np.isnan(self.completed[sequences])
        ]
        self.completed[fresh] = now


@dataclass
class _Run:
    """What the publisher thread, the status thread and the scaling (main) thread share."""

    rate: int
    batch: int
    capacity: int  # sequences 1..capacity
    published_at: npt.NDArray[np.float64]
    stop: threading.Event = field(default_factory=threading.Event)
    started: float = 0.0
    stopped: float = 0.0
    published: int = 0
    error: BaseException | None = None
    scales: list[ScaleRecord] = field(default_factory=list)
    matchers: list[tuple[float, int]] = field(default_factory=list)  # (since started, count)
    scaling: str = ""


@dataclass
class _Measured:
    """What a run leaves for the summary, once the cluster is stopped."""

    state: _Run
    tracker: _Tracker
    per_update: list[npt.NDArray[np.int64]]  # subscription positions each pool update matches
    positions: dict[int, int]  # subscription handle -> position
    drained: bool


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``silbo bench scale``."""
    parser.add_argument("--subscriptions", type=int, default=100_000)
    parser.add_argument("--steps", default="2,4,2", help="matchers per phase, e.g. 2,4,2 or 1,2")
    parser.add_argument("--rate", type=int, default=1000, help="updates/s offered, constant")
    parser.add_argument("--phase", type=float, default=20.0, help="seconds per step")
    parser.add_argument("--batch", type=int, default=50, help="updates per publish batch")
    parser.add_argument(
        "--replicas",
        type=int,
        default=DEFAULT_REPLICAS,
        help=f"matchers holding each subscription (default {DEFAULT_REPLICAS})",
    )
    parser.add_argument("--out", default="bench-out", help="where scale.json and scale.png go")
    parser.add_argument("--state-dir", default=None, help="the cluster's logs (default: a tmp dir)")
    parser.add_argument("--zk", default=None, help="use this ZooKeeper HOST:PORT (else embedded)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds before a roll-back")
    parser.add_argument("--drain", type=float, default=120.0, help="seconds to wait at the end")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run the scenario; write scale.json and scale.png; 0 if every check passed."""
    try:
        steps = _steps(args.steps)
    except ValueError as exc:
        print(f"silbo bench scale: error: {exc}", file=sys.stderr)
        return 2
    if args.rate <= 0 or args.batch <= 0 or args.phase <= 0 or args.subscriptions <= 0:
        print(
            "silbo bench scale: error: --rate, --batch, --phase and --subscriptions must be "
            "positive",
            file=sys.stderr,
        )
        return 2
    summary = _run_scenario(args, steps)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "scale.json").write_text(json.dumps(summary, indent=2) + "\n")
    plot(summary, out / "scale.png")
    _say(f"wrote {out / 'scale.json'} and {out / 'scale.png'}")
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print(summary)
    return 0 if summary["ok"] else 1


def _steps(text: str) -> list[int]:
    try:
        steps = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--steps {text!r} is not a comma-separated list of counts") from None
    if len(steps) < 2 or min(steps) < 1:
        raise ValueError("--steps needs at least two matcher counts, each at least 1")
    if any(a == b for a, b in itertools.pairwise(steps)):
        raise ValueError("--steps: consecutive counts must differ")
    return steps


def _run_scenario(args: argparse.Namespace, steps: list[int]) -> dict[str, Any]:
    state = Path(args.state_dir or tempfile.mkdtemp(prefix="silbo-bench-scale-"))
    name = f"bench-scale-{uuid.uuid4().hex[:8]}" if args.zk else "silbo"
    spec = ClusterSpec(
        matchers=steps[0],
        grpc_port=0,
        zk=args.zk,
        cluster=name,
        state_dir=state,
        replicas=args.replicas,
    )
    _say(f"starting a cluster ({steps[0]} matchers), logs in {state / 'logs'}")
    with LocalCluster(spec) as cluster:
        measured = _measure(args, steps, cluster)
    return _summarize(args, steps, measured)  # the cluster stopped: its CPU is free again


def _measure(args: argparse.Namespace, steps: list[int], cluster: LocalCluster) -> _Measured:
    subscriptions = iot_subscriptions(args.subscriptions, args.seed)
    pool = iot_updates(POOL, args.seed + 1)
    entities = [entity_from_update(u) for u in pool]
    target = cluster.endpoints[0]
    planned = len(steps) * args.phase
    capacity = int(args.rate * (planned + args.timeout * (len(steps) - 1) + 60)) + args.batch
    tracker = _Tracker(capacity)
    subscriber = Client(target, on_batch=tracker, timeout=120.0)
    publisher = Client(target, publisher=PUBLISHER, timeout=60.0)
    try:
        with _Heartbeat(target):
            ids = _register(subscriber, subscriptions)
            positions = handle_positions(subscriber)
            _say("computing each pool update's matches with the in-process engine")
            per_update = expected_positions(subscriptions, pool, ids)
        counts = np.array([len(p) for p in per_update], dtype=np.int64)
        tracker.expected[1:] = np.resize(counts, capacity)  # sequence s: pool update s - 1
        state = _Run(args.rate, args.batch, capacity, np.full(capacity + 1, np.nan))
        state.matchers.append((0.0, steps[0]))
        # connected only now: a session idle through a long registration may expire
        zk = connect(cluster.zk_address, cluster=cluster.spec.cluster, timeout=10.0)
        try:
            _drive(args, steps, state, tracker, publisher, entities, cluster, zk)
        finally:
            zk.stop()
            zk.close()
        drained = _drain(tracker, state.published, args.drain)
    finally:
        publisher.close()
        subscriber.close()
    return _Measured(state, tracker, per_update, positions, drained)


class _Heartbeat:
    """One update a second through every layer, to a subscription of its own, while in use.

    Registering a million subscriptions takes many minutes, and the links between the
    processes that carry no data meanwhile (matcher to exit point, exit point to connection
    point) are closed by gRPC after a few minutes of keepalive pings without data
    ("too_many_pings"); they do not deliver afterwards. The heartbeat keeps data on them.
    Its notifications go to a session of its own, so the measured one never sees them.
    """

    def __init__(self, target: str) -> None:
        self._subscriber = Client(target, on_batch=lambda _batch, _handles: None)
        self._publisher = Client(target, publisher=f"{PUBLISHER}-heartbeat")
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True)

    def __enter__(self) -> _Heartbeat:
        beat = EntitySelector(id_pattern=".*", type="Heartbeat")
        self._subscriber.subscribe_many(
            [Subscription(id="heartbeat", entities=(beat,), tenant=HEARTBEAT_TENANT)]
        )
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self._publisher.close()
        self._subscriber.close()

    def _beat(self) -> None:
        beats = itertools.count(1)
        while not self._stop.wait(1.0):
            update = ContextUpdate.of(
                "heartbeat", {"beat": next(beats)}, entity_type="Heartbeat", tenant=HEARTBEAT_TENANT
            )
            self._publisher.publish(update)


def _register(client: Client, subscriptions: list[Any]) -> list[str]:
    ids: list[str] = []
    began = said = time.perf_counter()
    for start in range(0, len(subscriptions), REGISTER_CHUNK):
        handles = client.subscribe_many(subscriptions[start : start + REGISTER_CHUNK])
        ids += [h.id for h in handles]
        now = time.perf_counter()
        if now - said >= 5.0 or len(ids) == len(subscriptions):
            said = now
            rate = len(ids) / (now - began)
            _say(f"registered {len(ids):,}/{len(subscriptions):,} subscriptions ({rate:,.0f}/s)")
    return ids


def _drive(
    args: argparse.Namespace,
    steps: list[int],
    state: _Run,
    tracker: _Tracker,
    publisher: Client,
    entities: list[pb.Entity],
    cluster: LocalCluster,
    zk: KazooClient,
) -> None:
    """Publish and print a status line per second (two threads); scale on this thread.

    The scales run here because a matcher started by a thread gets its parent-death
    signal when that thread ends (``PR_SET_PDEATHSIG`` is per thread): it must be one that
    lives as long as the cluster.
    """
    gc.collect()
    gc.freeze()  # the subscriptions and the tracker's arrays are long-lived
    sender = threading.Thread(
        target=_publish, args=(state, tracker, publisher, entities), daemon=True
    )
    status = threading.Thread(target=_report_status, args=(state, tracker), daemon=True)
    _say(
        f"publishing {args.rate:,} updates/s; matchers {'->'.join(map(str, steps))}, "
        f"one step every {args.phase:g} s"
    )
    state.started = time.perf_counter()
    sender.start()
    status.start()
    try:
        _scale_all(state, steps, args, cluster, zk)
        last = state.scales[-1].ended if state.scales else state.started
        while sender.is_alive() and time.perf_counter() < last + args.phase:
            time.sleep(0.05)
    finally:
        state.stop.set()
        state.stopped = time.perf_counter()
        sender.join()
        status.join()
        gc.unfreeze()
    if state.error is not None:
        raise state.error


def _publish(state: _Run, tracker: _Tracker, publisher: Client, entities: list[pb.Entity]) -> None:
    size = state.batch
    futures: list[Future[int]] = []
    try:
        for b in itertools.count():
            first = b * size + 1
            if first + size - 1 > state.capacity:
                break
            due = state.started + b * size / state.rate
            if state.stop.wait(max(0.0, due - time.perf_counter())):
                break
            chosen = [entities[(first - 1 + i) % len(entities)] for i in range(size)]
            request = pb.PublishRequest(publisher=PUBLISHER, first_sequence=first, entities=chosen)
            now = time.perf_counter()
            state.published_at[first : first + size] = now
            futures.append(publisher._send_request(request))
            state.published = first + size - 1
            tracker.published(np.arange(first, first + size, dtype=np.int64), now)
            futures = _pending(futures)
        for future in futures:
            future.result(timeout=120)
    except BaseException as exc:
        state.error = exc


def _pending(futures: list[Future[int]]) -> list[Future[int]]:
    """The futures not done yet; the first refused batch raises."""
    for future in futures:
        if future.done():
            future.result()
    return [f for f in futures if not f.done()]


def _scale_all(
    state: _Run,
    steps: list[int],
    args: argparse.Namespace,
    cluster: LocalCluster,
    zk: KazooClient,
) -> None:
    for i, count in enumerate(steps[1:], start=1):
        due = state.started + i * args.phase
        while time.perf_counter() < due and state.error is None:
            time.sleep(0.05)
        if state.error is not None:
            return  # the publisher failed
        state.scaling = f"{steps[i - 1]}->{count}"
        try:
            record = scale_local(cluster, zk, count, args.timeout)
        finally:
            state.scaling = ""
        state.scales.append(record)
        if record.completed:
            state.matchers.append((record.protocol_ended - state.started, count))
        _say(record.summary_line())


def _report_status(state: _Run, tracker: _Tracker) -> None:
    for second in itertools.count(1):
        if state.stop.wait(max(0.0, state.started + second - time.perf_counter())):
            return
        _status(state, tracker, second)


def _status(state: _Run, tracker: _Tracker, second: int) -> None:
    now = time.perf_counter()
    with tracker.lock:
        completed = tracker.completed.copy()
    recent = (completed >= now - 1.0) & (completed < now)
    latency = (completed[recent] - state.published_at[recent]) * 1000.0
    p99 = f"{np.percentile(latency, 99):7.1f}" if len(latency) else "      -"
    matchers = matchers_at(state.matchers, now - state.started)
    scaling = f"  scaling {state.scaling}" if state.scaling else ""
    _say(
        f"t={second:4d} s  published {state.published:9,}  completed/s "
        f"{np.count_nonzero(recent):6,}  p99 {p99} ms  matchers {matchers}{scaling}"
    )


def _drain(tracker: _Tracker, published: int, timeout: float) -> bool:
    deadline = time.perf_counter() + timeout
    want = int(tracker.expected[1 : published + 1].sum())
    while tracker.count < want and time.perf_counter() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # late duplicates, if any, arrive now
    return tracker.count >= want


def _summarize(args: argparse.Namespace, steps: list[int], measured: _Measured) -> dict[str, Any]:
    state, tracker = measured.state, measured.tracker
    published = state.published
    published_at = state.published_at[1 : published + 1] - state.started
    completed_at = tracker.completed[1 : published + 1] - state.started
    seconds = int(state.stopped - state.started)  # the whole seconds of publishing
    series = timeline(published_at, completed_at, seconds, state.matchers)
    scales = []
    for record in state.scales:
        window = record.window(state.started)
        around = throughput_around(window, completed_at, series["updates_per_s"])
        scales.append({**record.report(state.started), **around})
    verification = _verify(measured, published)
    ok = (
        verification["ok"]
        and len(state.scales) == len(steps) - 1
        and all(r.completed for r in state.scales)
    )
    return {
        "benchmark": "scale",
        "command": getattr(args, "command_line", ""),
        "commit": source_commit(),
        "machine": machine_info(),
        "workload": {
            "name": "W-IoT",
            "subscriptions": args.subscriptions,
            "seed": args.seed,
            "pool": POOL,
            "matches_per_update": round(float(np.mean([len(p) for p in measured.per_update])), 1),
            "silent_updates": int(np.count_nonzero(tracker.expected[1 : published + 1] == 0)),
            "steps": steps,
            "rate": args.rate,
            "batch": args.batch,
            "phase_s": args.phase,
        },
        "series": series,
        "scales": scales,
        "verification": verification,
        "ok": bool(ok),
    }


def _verify(measured: _Measured, published: int) -> dict[str, Any]:
    _say("verifying every delivery")
    tracker = measured.tracker
    with tracker.lock:
        sequences = np.concatenate(tracker.sequences) if tracker.sequences else np.zeros(0)
        handles = (
            np.concatenate(tracker.handles) if tracker.handles else np.zeros(0, dtype=np.uint64)
        )
        out_of_order = tracker.out_of_order
        order = {"out_of_order_examples": list(tracker.disorder), "split_updates": tracker.split}
    expected = expected_pairs(measured.per_update, published)
    delivered = delivered_pairs(sequences, handles, measured.positions)
    unique = sorted_unique(delivered)
    counts = {
        "published": published,
        "expected": len(expected),
        "delivered": len(delivered),
        "lost": _absent(expected, unique),
        "duplicated": len(delivered) - len(unique),
        "unexpected": _absent(unique, expected),
        "out_of_order": out_of_order,
    }
    bad = counts["lost"] or counts["duplicated"] or counts["unexpected"] or out_of_order
    drained = measured.drained
    return {**counts, **order, "drained": drained, "ok": bool(drained and not bad)}


def _absent(values: npt.NDArray[np.int64], among: npt.NDArray[np.int64]) -> int:
    """How many of ``values`` are not in ``among`` (both sorted, without repeats)."""
    if len(among) == 0:
        return len(values)
    at = np.minimum(np.searchsorted(among, values), len(among) - 1)
    return int(np.count_nonzero(among[at] != values))


def source_commit() -> str | None:
    """The short commit of the running code (None outside a git checkout): a figure names it."""
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=Path(__file__).parent,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None


def _print(summary: dict[str, Any]) -> None:
    workload, check = summary["workload"], summary["verification"]
    print(
        f"W-IoT scale, {workload['subscriptions']:,} subscriptions "
        f"({workload['matches_per_update']} matches per update), matchers "
        f"{'->'.join(map(str, workload['steps']))}, {workload['rate']:,} updates/s offered"
    )
    for scale in summary["scales"]:
        print(
            f"  {scale['from']}->{scale['to']}: {scale['outcome']} in {scale['duration_s']:.2f} s "
            f"(+{scale['processes_s']:.1f} s processes), {scale['moved_subscriptions']:,} "
            f"subscriptions / {scale['moved_bytes']:,} bytes moved, no-matching "
            f"{scale['no_matching_ms']:g} ms, epoch {scale['epoch']}; updates/s before "
            f"{scale['before_per_s']:,.0f}, during {scale['during_per_s']:,.0f} "
            f"({scale['ratio']:.0%}), after {scale['after_per_s']:,.0f}; longest gap "
            f"{scale['longest_gap_ms']:g} ms (before {scale['gap_before_ms']:g})"
        )
    print(
        f"  published {check['published']:,}, expected {check['expected']:,}, delivered "
        f"{check['delivered']:,}: lost {check['lost']}, duplicated {check['duplicated']}, "
        f"unexpected {check['unexpected']}, out of order {check['out_of_order']}"
        + ("" if check["drained"] else " (NOT drained)")
    )
    print("  result: " + ("ok" if summary["ok"] else "FAILED"))


def _say(message: str) -> None:
    print(f"[bench scale] {message}", file=sys.stderr, flush=True)
