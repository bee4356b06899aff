"""``silbo bench autoscale``: the controller of issue 19 on a real cluster, under a load profile.

    silbo bench autoscale [--profile 1:20,4:60,1:50,3:8,1:20] [--scale-time 1] [--base 100]
                          [--cap 150] [--max 6] [--batch 10]
                          [--set KEY=VALUE ...] [--json] [--plot FILE.png] [--keep DIR]

It starts ``silbo up --autoscale`` (two controllers observing every second) with one
connection point, access point, matcher, exit point and context store, every exit point
capped at ``--cap`` items a second (``--max-rate exit-point=CAP``, docs/autoscaling.md), and
sets short policy windows through ``silbo admin autoscale set`` (metrics window 4 s,
stabilisation 30 s, cooldown 6 s, each times ``--scale-time``; the exit points at most
``--max``, the connection points, access points and matchers at most ``OTHERS_MAX`` (4:
free to be scaled wrongly, which the report counts), the context stores pinned at 1;
``--set`` adds or overrides knobs).

**Why the exit points.** Adding processes adds capacity to a layer only if its upstream
spreads the work over them (docs/autoscaling.md, Known limits): every matcher receives every
update (more matchers mean fewer subscriptions each, not more updates), and a connection
point sends through one access point, so with the one connection point the clients know
more access points carry nothing (and more connection points would only serve clients that
connect to them). The access points send each publisher's batches to one exit point, by a
hash of the publisher over the serving exit points, recomputed at every scale
(broker.roles.access_point); so with many publishers every exit point added takes its share
at once. The bench publishes as ``PUBLISHERS`` (12) publishers whose names hash to the 12
residues modulo 12: over 1, 2, 3, 4 or 6 exit points they spread exactly evenly (5: 3, 3, 2,
2, 2), so ``k`` exit points serve ``k x cap`` items a second, as a real layer of ``k``
processes would.

**The load.** ``--profile`` is a comma list of ``FACTOR:SECONDS`` segments: ``--base`` x
FACTOR updates a second for SECONDS x ``--scale-time`` seconds; ``sine:SECONDS`` is a wave
between 1x and 4x base (two periods). The default: base 20 s, a x4 step held 60 s, back
to base for 50 s (the stabilisation window and the scale-in), a x3 spike of 8 s, base 20 s.
The publisher is open-loop: it keeps to the profile's cumulative count, so when the cluster
holds it back (the exit points saturated, backpressure up to the connection point) it falls
behind and catches up as soon as capacity allows. The updates are W-IoT's (broker.bench.
workloads.iot); a gRPC subscriber holds ``SUBSCRIPTIONS``, one per last digit of the station
id, so every update notifies exactly one of them.

**What is recorded.** Every second: the load offered (the profile's rate), the updates
acknowledged and the notifications delivered in that second, the exit points serving (the
configuration in ZooKeeper) and registered (pre-warmed ones included), and the capacity
(serving x cap). At the end: the decisions from ZooKeeper (``/autoscale/decisions``),
times from the first publish; and the oracle (the reference matcher, as ``silbo bench
chaos`` counts: broker.bench.chaos.tally) over (subscription, publisher, sequence).

The report (``--json``: one object):

- ``lost``, ``duplicated``, ``unexpected``, ``published``, ``expected``, ``delivered``;
  ``out_of_order``: notifications that arrived after a later one of the same publisher for
  the same subscription (reported, not failed on: a batch the cluster refused and the
  publisher sent again would count); ``out_of_order_at``: when they arrived,
  ``{t, count, publishers}`` per second from the first publish (to set beside the
  decisions);
- ``decisions``: ``{t, layer, from, to, kind, reason, outcome}``, every layer;
  ``wrong_layer_decisions``: how many were on another layer than the exit points;
- ``steps``: per rise of the profile, ``time_to_capacity_s``: from the step to the end of
  the first second the capacity (serving x cap) was at least the load offered, and
  ``time_to_throughput_s``: to the end of the first of 3 seconds in a row in which the
  notifications delivered (one per update) were at least the load offered, what the
  publishers saw (None: never during the segment);
- ``oscillations``: broker.autoscale.model.oscillations over the decisions, within the
  stabilisation window;
- ``over_provisioned_process_s`` / ``under_provisioned_process_s``: summed over the seconds,
  serving exit points above / below the ideal ``ceil(offered / (cap x target-utilisation))``
  (at least 1); ``short_s``: seconds the capacity was below the load offered;
- ``series``: the per-second figures; ``policy``, ``publishers``, ``command``.

With ``--keep DIR`` the controllers' rounds (observation, policy, decisions) stay in
``DIR/state/logs/autoscaler-N.observations.jsonl`` (``silbo up --autoscale-record``): a
real series the model can replay (tests/autoscale/test_recorded.py).

``--plot``: the load offered, the capacity and the updates acknowledged over time, the exit
points serving and registered below, each decision marked. Exit status 1 if a notification
was lost, duplicated or unexpected (or the publisher failed), 2 for bad options.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import signal
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from kazoo.client import KazooClient

from broker.autoscale.model import Decision, Kind, oscillations
from broker.autoscale.policy import LAYERS, Policy
from broker.autoscale.state import AutoscaleState
from broker.bench.chaos import foreground_up, tally
from broker.bench.workloads.iot import IOT_TENANT, IOT_TYPE, iot_updates
from broker.client import Client
from broker.coordination.client import connect
from broker.coordination.configuration import ClusterConfiguration
from broker.coordination.membership import members
from broker.errors import InvalidInput, SilboError
from broker.extras import require
from broker.matching.reference import subscription_matches
from broker.model.subscription import EntitySelector, Subscription
from broker.wire import client_pb2 as pb
from broker.wire.convert import entity_from_update

__all__ = ["SUBSCRIPTIONS", "Segment", "configure", "parse_profile", "publisher_names", "run"]

LAYER = "exit-points"
ROLE = "exit-point"
OTHERS_MAX = 4  # the other layers' most processes: room for a wrong decision
PUBLISHERS = 12
DEFAULT_PROFILE = "1:20,4:60,1:50,3:8,1:20"
# the policy knobs set (seconds multiplied by --scale-time, at least the floor given)
_WINDOWS = {
    "metrics-window-s": (4.0, 2.0),
    "stabilisation-s": (30.0, 4.0),
    "cooldown-s": (6.0, 2.0),
}
_SINE_LOW, _SINE_HIGH = 1.0, 4.0
NOISE = 0.2  # a noisy segment: +-20% of its level, drawn anew every second
# one subscription per last digit of the station id: every update notifies exactly one
SUBSCRIPTIONS = [
    Subscription(
        id=f"digit-{digit}",
        entities=(EntitySelector(id_pattern=f"{digit}$", type=IOT_TYPE),),
        tenant=IOT_TENANT,
    )
    for digit in range(10)
]
_POOL = 2_000


@dataclass(frozen=True, slots=True)
class Segment:
    """One part of the load profile: ``factor`` x base for ``seconds`` (a wave if sine; if
    noisy, +-``NOISE`` of it drawn anew every second, the same draws in every run)."""

    factor: float
    seconds: float
    sine: bool = False
    noisy: bool = False

    def rate(self, base: float, into: float) -> float:
        """Updates a second offered ``into`` seconds after the segment began."""
        if self.noisy:
            draw = zlib.crc32(f"noise-{int(into)}".encode()) / 0xFFFFFFFF  # 0 to 1
            return base * self.factor * (1.0 + NOISE * (2.0 * draw - 1.0))
        if not self.sine:
            return base * self.factor
        wave = 0.5 * (1.0 - math.cos(2.0 * math.pi * into / (self.seconds / 2.0)))
        return base * (_SINE_LOW + (_SINE_HIGH - _SINE_LOW) * wave)


def parse_profile(text: str, scale_time: float) -> list[Segment]:
    """``FACTOR:SECONDS,...`` (``sine:SECONDS`` for a wave, ``FACTOR~:SECONDS`` for a noisy
    level) with the seconds scaled; raises ValueError naming the bad part."""
    segments = []
    for part in text.split(","):
        kind, sep, seconds_text = part.strip().partition(":")
        noisy = kind.endswith("~")
        try:
            seconds = float(seconds_text) * scale_time
            factor = 1.0 if kind == "sine" else float(kind.removesuffix("~"))
        except ValueError:
            seconds = factor = math.nan
        if not sep or not (math.isfinite(seconds) and seconds > 0) or not factor > 0:
            raise ValueError(
                f"--profile: {part.strip()!r} is not FACTOR:SECONDS, FACTOR~:SECONDS or "
                "sine:SECONDS (both positive)"
            )
        segments.append(Segment(factor, seconds, sine=kind == "sine", noisy=noisy))
    if not segments:
        raise ValueError("--profile: no segment")
    return segments


def publisher_names(count: int = PUBLISHERS) -> list[str]:
    """``count`` publisher names whose CRC-32 (the access points' hash) covers every residue
    modulo ``count`` once: over any number of exit points dividing ``count`` they spread
    evenly."""
    found: dict[int, str] = {}
    i = 0
    while len(found) < count:
        name = f"autoscale-{i}"
        found.setdefault(zlib.crc32(name.encode()) % count, name)
        i += 1
    return [found[r] for r in range(count)]


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``silbo bench autoscale``."""
    parser.add_argument(
        "--profile",
        default=DEFAULT_PROFILE,
        help=f"FACTOR:SECONDS load segments, sine:SECONDS a wave (default {DEFAULT_PROFILE})",
    )
    parser.add_argument(
        "--scale-time", type=float, default=1.0, help="multiply the profile's seconds and windows"
    )
    parser.add_argument("--base", type=float, default=100.0, help="updates/s at factor 1")
    parser.add_argument("--cap", type=float, default=150.0, help="items/s of one exit point")
    parser.add_argument("--max", type=int, default=6, help="most exit points (exit-points.max)")
    parser.add_argument("--batch", type=int, default=10, help="updates per publish batch")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an autoscaling knob besides the bench's (silbo admin autoscale set; repeatable)",
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--plot", type=Path, default=None, help="write the time line PNG")
    parser.add_argument(
        "--keep", type=Path, default=None, metavar="DIR", help="run the cluster in DIR/state, kept"
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; exit status 1 if a notification was lost, duplicated or unexpected."""
    try:
        profile = parse_profile(args.profile, args.scale_time)
        if not (args.scale_time > 0 and args.base > 0 and args.cap > 0 and args.batch > 0):
            raise ValueError("--scale-time, --base, --cap and --batch must be positive")
        if args.max < 1:
            raise ValueError("--max must be at least 1")
        Policy().updated(args.set)  # refused here, before a cluster is started
    except (ValueError, InvalidInput) as exc:
        print(f"silbo bench autoscale: error: {exc}", file=sys.stderr)
        return 2
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        summary = _Run(args, profile, args.keep).run()
    else:
        with tempfile.TemporaryDirectory(prefix="silbo-autoscale-") as state:
            summary = _Run(args, profile, Path(state)).run()
    if "error" in summary:
        print(f"silbo bench autoscale: {summary['error']}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print(summary)
    if args.plot is not None:
        plot(summary, args.plot)
    return 1 if summary["lost"] or summary["duplicated"] or summary["unexpected"] else 0


@dataclass
class _Second:
    t: int
    offered: float
    acknowledged: int = 0
    delivered: int = 0
    serving: int = 0
    registered: int = 0


@dataclass
class _Load:
    """What the publisher, the sampler and the subscriber's reader share."""

    sent: dict[str, list[int]] = field(default_factory=dict)  # publisher -> pool entries
    acked: int = 0
    refused: int = 0
    arrivals: Counter[tuple[str, str, int]] = field(default_factory=Counter)
    arrived: int = 0
    # (subscription, publisher): the highest sequence arrived; a lower one after it is out of
    # order (a copy too: duplicates are counted apart)
    highest: dict[tuple[str, str], int] = field(default_factory=dict)
    out_of_order: int = 0
    # second from the first publish -> [notifications out of order then, publishers]
    out_of_order_at: dict[int, list[Any]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    stop: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None


class _Run:
    def __init__(self, args: argparse.Namespace, profile: list[Segment], root: Path) -> None:
        self.args = args
        self.profile = profile
        self.state = root / "state"
        self.publishers = publisher_names()
        self.subscriptions = SUBSCRIPTIONS
        self.updates = iot_updates(_POOL, args.seed + 1)
        self.pool = [entity_from_update(u) for u in self.updates]
        self.load = _Load(sent={p: [] for p in self.publishers})
        self.seconds: list[_Second] = []
        self.started = 0.0  # monotonic, the first publish
        self.wall = 0.0  # time.time() then (decisions are in wall-clock time)
        self.settings: dict[str, str] = {}

    def run(self) -> dict[str, Any]:
        up = self._up()
        zk: KazooClient | None = None
        try:
            endpoints = self._description()["endpoints"]
            self._set_policy()
            zk = connect(self._description()["zookeeper"]["address"], cluster="silbo", timeout=5)
            subscriber = Client(endpoints, on_batch=self._on_batch, timeout=60.0)
            subscriber.subscribe_many(self.subscriptions)
            with Client(endpoints, timeout=60.0, window=64) as publisher:
                self.started, self.wall = time.monotonic(), time.time()
                sender = threading.Thread(target=self._publish, args=(publisher,), daemon=True)
                sender.start()
                self._sample(zk, until=self.started + sum(s.seconds for s in self.profile))
                self.load.stop.set()
                sender.join(120)
            self._drain()
            subscriber.close()
            decisions = AutoscaleState(zk).decisions()
        finally:
            if zk is not None:
                zk.stop()
                zk.close()
            up.send_signal(signal.SIGTERM)
            try:
                up.wait(timeout=90)
            except subprocess.TimeoutExpired:
                up.kill()
        if self.load.error is not None:
            return {"error": f"the publisher failed: {self.load.error}"}
        return self._summary(decisions)

    # -- the cluster ------------------------------------------------------------------------

    def _up(self) -> subprocess.Popen[bytes]:
        command = ["--state-dir", str(self.state)]
        command += ["--grpc-port", "0", "--log-level", "WARNING", "--replicas", "1"]
        for layer in LAYERS:
            command += [f"--{layer}", "1"]
        command += ["--max-rate", f"{ROLE}={self.args.cap:g}"]
        command += ["--autoscale", "--autoscale-interval", "1", "--autoscale-record"]
        return foreground_up(self.state, command)

    def _description(self) -> dict[str, Any]:
        found: dict[str, Any] = json.loads((self.state / "cluster.json").read_text())
        return found

    def _set_policy(self) -> None:
        """The bench's knobs, through ``silbo admin autoscale set`` as an operator sets them."""
        scale = self.args.scale_time
        knobs = {key: f"{max(floor, value * scale):g}" for key, (value, floor) in _WINDOWS.items()}
        knobs |= {f"{layer}.max": str(OTHERS_MAX) for layer in LAYERS if layer != LAYER}
        knobs["context-stores.max"] = "1"  # not autoscaled (docs/autoscaling.md)
        knobs[f"{LAYER}.max"] = str(self.args.max)
        settings = [f"{k}={v}" for k, v in knobs.items()] + list(self.args.set)
        command = [sys.executable, "-m", "broker.cli", "admin", "autoscale", "set", *settings]
        command += ["--state-dir", str(self.state), "--json"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
        if done.returncode != 0:
            raise SilboError(f"silbo admin autoscale set: {done.stderr.strip()}")
        self.settings = dict(json.loads(done.stdout)["policy"])

    # -- load -------------------------------------------------------------------------------

    def rate_at(self, t: float) -> float:
        """Updates a second the profile offers ``t`` seconds after the first publish."""
        for segment in self.profile:
            if t < segment.seconds:
                return segment.rate(self.args.base, t)
            t -= segment.seconds
        return 0.0

    def _publish(self, client: Client) -> None:
        """Open loop: keep to the profile's cumulative count, one batch per publisher in turn."""
        load, size = self.load, self.args.batch
        due, last = 0.0, 0.0
        sent, turn = 0, 0
        futures: list[tuple[Future[int], pb.PublishRequest]] = []
        try:
            while not load.stop.is_set():
                now = time.monotonic() - self.started
                due += self.rate_at(now) * (now - last)
                last = now
                while sent + size <= due and not load.stop.is_set():
                    name = self.publishers[turn % len(self.publishers)]
                    futures.append(self._send(client, name, sent, size))
                    sent, turn = sent + size, turn + 1
                    futures = self._settle(client, futures, wait=False)
                time.sleep(0.005)
            self._settle(client, futures, wait=True)
        except BaseException as exc:  # reported by the main thread
            load.error = exc

    def _send(
        self, client: Client, name: str, sent: int, size: int
    ) -> tuple[Future[int], pb.PublishRequest]:
        entries = self.load.sent[name]
        request = pb.PublishRequest(
            publisher=name,
            first_sequence=len(entries) + 1,
            entities=[self.pool[(sent + i) % _POOL] for i in range(size)],
            incarnation=client.incarnation,
        )
        entries.extend((sent + i) % _POOL for i in range(size))
        return client._send_request(request), request

    def _settle(
        self,
        client: Client,
        futures: list[tuple[Future[int], pb.PublishRequest]],
        *,
        wait: bool,
    ) -> list[tuple[Future[int], pb.PublishRequest]]:
        """Count the acknowledged batches; a refused one is sent again (same sequences)."""
        pending = []
        for future, request in futures:
            if not wait and not future.done():
                pending.append((future, request))
                continue
            try:
                accepted = future.result(timeout=120)
            except SilboError:
                self.load.refused += 1
                pending.append((client._send_request(request), request))
                continue
            with self.load.lock:
                self.load.acked += accepted
        if wait and pending:
            return self._settle(client, pending, wait=True)
        return pending

    def _on_batch(self, batch: pb.NotificationBatch, handles: dict[int, str]) -> None:
        index = np.frombuffer(batch.entity_index, dtype="<u4").tolist()
        column = np.frombuffer(batch.handles, dtype="<u8").tolist()
        keys = [
            (handles.get(h, "?"), batch.publishers[i], batch.sequences[i])
            for i, h in zip(index, column, strict=True)
        ]
        with self.load.lock:
            self.load.arrivals.update(keys)
            self.load.arrived += len(keys)
            highest = self.load.highest
            for subscription, publisher, sequence in keys:
                if sequence < highest.get((subscription, publisher), 0):
                    self.load.out_of_order += 1
                    second = int(time.monotonic() - self.started)
                    seen = self.load.out_of_order_at.setdefault(second, [0, set()])
                    seen[0] += 1
                    seen[1].add(publisher)
                else:
                    highest[(subscription, publisher)] = sequence

    def _sample(self, zk: KazooClient, until: float) -> None:
        """Once a second until ``until``: the load and the exit points."""
        configuration = ClusterConfiguration(zk)
        for second in range(math.ceil(until - self.started)):
            time.sleep(max(0.0, self.started + second + 1 - time.monotonic()))
            if self.load.error is not None:
                return
            with self.load.lock:
                acked, arrived = self.load.acked, self.load.arrived
            current = configuration.read()
            serving = len(current.configuration.exit_points) if current is not None else 0
            registered = len(members(zk, ROLE))
            self.seconds.append(
                _Second(second, self.rate_at(second + 0.5), acked, arrived, serving, registered)
            )
            row = self.seconds[-1]
            _say(
                f"t={second:4d} s  offered {row.offered:6.0f}/s  acknowledged {acked:8,}  "
                f"exit points {serving} ({registered} registered)"
            )

    def _drain(self) -> None:
        """Wait until every expected notification arrived, or none for 10 s (120 s at most)."""
        want = self._expected().total()
        deadline = time.monotonic() + 120
        last, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            with self.load.lock:
                arrived = self.load.arrived
            if arrived >= want or time.monotonic() - since > 10:
                break
            if arrived != last:
                last, since = arrived, time.monotonic()
            time.sleep(0.1)
        time.sleep(1.0)  # late duplicates, if any, arrive now

    # -- the report -------------------------------------------------------------------------

    def _expected(self) -> Counter[tuple[str, str, int]]:
        """The reference matcher's notifications, per (subscription, publisher, sequence)."""
        matched: dict[int, list[str]] = {}
        expected: Counter[tuple[str, str, int]] = Counter()
        for name, entries in self.load.sent.items():
            for sequence, entry in enumerate(entries, start=1):
                ids = matched.get(entry)
                if ids is None:
                    update = self.updates[entry]
                    ids = matched[entry] = [
                        s.id for s in self.subscriptions if subscription_matches(s, update)
                    ]
                expected.update((s, name, sequence) for s in ids)
        return expected

    def _summary(self, recorded: list[dict[str, Any]]) -> dict[str, Any]:
        expected = self._expected()
        with self.load.lock:
            got = Counter(self.load.arrivals)
        lost, repeated, unexpected = tally(expected, got)
        cap = self.args.cap
        target = float(self.settings.get("target-utilisation", 0.7))
        stabilisation = float(self.settings.get("stabilisation-s", 30))
        series = self._series()
        decisions = [
            {
                "t": round(float(d["t"]) - self.wall, 2),
                "layer": d["layer"],
                "from": d["from"],
                "to": d["to"],
                "kind": d["kind"],
                "reason": d["reason"],
                "outcome": d.get("outcome"),
            }
            for d in recorded  # the cluster is new: every decision is this run's
        ]
        model = [
            Decision(d["t"], d["layer"], d["from"], d["to"], Kind(d["kind"]), d["reason"])
            for d in decisions
        ]
        offered = np.asarray(series["offered_per_s"], dtype=np.float64)
        serving = np.asarray(series["serving"], dtype=np.int64)
        ideal = np.maximum(1, np.ceil(offered / (cap * target) - 1e-9)).astype(np.int64)
        return {
            "benchmark": "autoscale",
            "layer": LAYER,
            "cap_per_process": cap,
            "base": self.args.base,
            "profile": [dataclasses.asdict(s) for s in self.profile],
            "publishers": len(self.publishers),
            "subscriptions": len(self.subscriptions),
            "policy": self.settings,
            "published": sum(len(e) for e in self.load.sent.values()),
            "acknowledged": self.load.acked,
            "refused": self.load.refused,
            "expected": expected.total(),
            "delivered": got.total(),
            "lost": lost.total(),
            "duplicated": repeated.total(),
            "unexpected": unexpected.total(),
            "out_of_order": self.load.out_of_order,
            "out_of_order_at": [
                {"t": t, "count": count, "publishers": len(publishers)}
                for t, (count, publishers) in sorted(self.load.out_of_order_at.items())
            ],
            "decisions": decisions,
            "wrong_layer_decisions": sum(d["layer"] != LAYER for d in decisions),
            "steps": self._steps(series),
            "oscillations": oscillations(model, stabilisation),
            "over_provisioned_process_s": int(np.maximum(0, serving - ideal).sum()),
            "under_provisioned_process_s": int(np.maximum(0, ideal - serving).sum()),
            "short_s": int(np.count_nonzero(serving * cap < offered)),
            "series": series,
            "command": "silbo bench autoscale " + " ".join(sys.argv[3:]),
        }

    def _series(self) -> dict[str, list[Any]]:
        rows = self.seconds
        acked = np.diff([0] + [r.acknowledged for r in rows]).tolist()
        delivered = np.diff([0] + [r.delivered for r in rows]).tolist()
        return {
            "t": [r.t for r in rows],
            "offered_per_s": [round(r.offered, 1) for r in rows],
            "acknowledged_per_s": acked,
            "delivered_per_s": delivered,
            "serving": [r.serving for r in rows],
            "registered": [r.registered for r in rows],
            "capacity_per_s": [r.serving * self.args.cap for r in rows],
        }

    def _steps(self, series: dict[str, list[Any]]) -> list[dict[str, Any]]:
        """Per rise of the profile: how long until the capacity reached the load offered."""
        steps = []
        began = 0.0
        previous: Segment | None = None
        for segment in self.profile:
            if previous is not None and segment.factor > previous.factor and not segment.sine:
                inside = [
                    i for i, t in enumerate(series["t"]) if began <= t < began + segment.seconds
                ]
                offered = series["offered_per_s"]
                capacity, delivered = series["capacity_per_s"], series["delivered_per_s"]
                reached = next((i for i in inside if capacity[i] >= offered[i]), None)
                served = next(
                    (
                        i
                        for i in inside[:-2]
                        if all(delivered[j] >= offered[j] for j in (i, i + 1, i + 2))
                    ),
                    None,
                )
                steps.append(
                    {
                        "t": round(began, 1),
                        "from_per_s": previous.rate(self.args.base, 0.0),
                        "to_per_s": segment.rate(self.args.base, 0.0),
                        # sampled at the end of each second: second t counts as t + 1
                        "time_to_capacity_s": _since(series["t"], reached, began),
                        "time_to_throughput_s": _since(series["t"], served, began),
                    }
                )
            began += segment.seconds
            previous = segment
        return steps


def _since(seconds: list[int], index: int | None, began: float) -> float | None:
    return None if index is None else round(seconds[index] + 1 - began, 1)


def _print(summary: dict[str, Any]) -> None:
    print(
        f"{summary['layer']} capped at {summary['cap_per_process']:g} items/s each, "
        f"{summary['publishers']} publishers, base {summary['base']:g} updates/s"
    )
    for d in summary["decisions"]:
        print(
            f"  t={d['t']:7.1f} s  {d['layer']} {d['kind']} {d['from']} -> {d['to']}: "
            f"{d['outcome']}"
        )
        print(f"      why: {d['reason']}")
    for step in summary["steps"]:
        print(
            f"  step at t={step['t']:g} s, {step['from_per_s']:g} -> {step['to_per_s']:g}/s: "
            f"capacity after {step['time_to_capacity_s']} s, throughput after "
            f"{step['time_to_throughput_s']} s"
        )
    print(
        f"  decisions on the other layers {summary['wrong_layer_decisions']}, oscillations "
        f"{summary['oscillations']}, over-provisioned "
        f"{summary['over_provisioned_process_s']} process-s, under-provisioned "
        f"{summary['under_provisioned_process_s']} process-s, short {summary['short_s']} s"
    )
    print(
        f"  published {summary['published']:,}, expected {summary['expected']:,}, delivered "
        f"{summary['delivered']:,}: lost {summary['lost']}, duplicated {summary['duplicated']}, "
        f"unexpected {summary['unexpected']}, out of order {summary['out_of_order']}"
    )


def plot(summary: dict[str, Any], path: Path) -> None:
    """Load offered, capacity and updates acknowledged above, exit points below, decisions
    marked."""
    require("bench", "the plot of silbo bench autoscale")
    from matplotlib.figure import Figure

    series = {k: np.asarray(v, dtype=np.float64) for k, v in summary["series"].items()}
    t = series["t"] + 1.0  # sampled at the end of each second
    figure = Figure(figsize=(11, 6.5), layout="constrained")
    load_axes, process_axes = figure.subplots(
        2, 1, sharex=True, gridspec_kw={"height_ratios": [2, 1]}
    )
    load_axes.plot(t, series["offered_per_s"], color="0.3", ls="--", lw=1.2, label="offered")
    load_axes.step(t, series["capacity_per_s"], where="post", color="C1", lw=1.5, label="capacity")
    load_axes.plot(
        t, series["acknowledged_per_s"], color="C0", lw=1, alpha=0.8, label="acknowledged"
    )
    load_axes.set_ylabel("updates/s")
    load_axes.set_ylim(bottom=0)
    process_axes.step(t, series["serving"], where="post", color="C2", lw=1.5, label="serving")
    process_axes.step(
        t, series["registered"], where="post", color="C2", ls=":", lw=1, label="registered"
    )
    process_axes.set_ylabel(f"{summary['layer']}")
    process_axes.set_xlabel("seconds since the first publish")
    colours = {"scale-out": "C3", "scale-in": "C4", "prewarm": "C5", "cancel-prewarm": "C6"}
    for d in summary["decisions"]:
        for axes in (load_axes, process_axes):
            axes.axvline(d["t"], color=colours.get(d["kind"], "k"), alpha=0.6, lw=1)
        load_axes.annotate(
            f"{d['kind']} {d['from']}->{d['to']}",
            (d["t"], 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(2, -10),
            textcoords="offset points",
            fontsize=7,
            rotation=90,
            va="top",
        )
    load_axes.legend(loc="upper right", fontsize=8)
    process_axes.legend(loc="upper right", fontsize=8)
    figure.suptitle(
        f"silbo bench autoscale: {summary['layer']} at {summary['cap_per_process']:g} items/s "
        f"each; lost {summary['lost']}, duplicated {summary['duplicated']}, oscillations "
        f"{summary['oscillations']}"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def _say(message: str) -> None:
    print(f"[bench autoscale] {message}", file=sys.stderr, flush=True)
