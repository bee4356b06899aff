"""``silbo bench chaos``: faults injected into a cluster under steady load, checked by an oracle.

    silbo bench chaos [--duration 120 | --count N] [--interval 12] [--rate 200] [--batch 10]
                      [--subscriptions 100] [--store-rate 50]
                      [--faults matcher,access-point,exit-point,matcher-hang,zookeeper,
                                context-store,scale-kill,access-point-hang,exit-point-hang,
                                context-store-hang,scale-kill-exit-point,
                                scale-kill-access-point,connection-point,
                                scale-kill-connection-point]
                      [--json] [--plot FILE.png]

It starts ``silbo up`` (its supervisor: broker.cluster.supervisor) with 3 matchers, 2 access
points, 2 exit points, 2 context stores (each partition on both: ``--replicas`` 2) and the
NGSI v2 HTTP front in a temporary state directory, subscribes
W-IoT subscriptions from a gRPC subscriber and ``HTTP_SUBSCRIPTIONS`` NGSI subscriptions
notifying a local HTTP receiver, and publishes W-IoT updates at ``--rate`` from one
publisher (explicit sequences, each update carrying its sequence as ``chaosSeq``; a batch
the cluster refuses is sent again as it was, and counted as a refusal). Meanwhile it writes
entities through the HTTP front at ``--store-rate`` writes/s (broker.bench.chaos_store: each
write sets a per-entity counter ``n`` and adds 1 to ``inc``; 0: no writes). Every
``--interval`` seconds (or once the last fault's layer is whole, if later) it injects the
next fault of ``--faults`` (round robin), for ``--duration`` seconds or ``--count`` faults:

- ``matcher``, ``access-point``, ``exit-point``: SIGKILL of one live process of the role;
- ``matcher-hang``, ``access-point-hang``, ``exit-point-hang``: SIGSTOP of one process of
  the role until its repair, then SIGCONT: the supervisor's liveness probe kills it as hung
  within 2 s and restarts it (broker.cluster.liveness);
- ``zookeeper``: SIGKILL of the embedded ZooKeeper (the supervisor restarts it);
- ``connection-point``: SIGKILL of the connection point (the only one: every client and the
  store writer are on it): the supervisor restarts it on its ports, the publisher sends what
  was not acknowledged again (with its incarnation: copies are dropped), the gRPC subscriber
  resumes its session there (the exit points kept what the dead one missed), and the HTTP
  subscriptions are adopted by the new one once the dead one's ZooKeeper session ended
  (the exit points' deliveries that never reached the dead one are replayed to it); its
  delivery worker sends what it held before it exits. Detection: the new connection point
  registered; recovery: every HTTP subscription owned by a live front again (the dead
  one's ZooKeeper session had to end first);
- ``context-store``, ``context-store-hang``: SIGKILL, or SIGSTOP until detected then
  SIGCONT, of one context store: its backup fences it and serves its partitions (a stopped
  one may be killed as hung by the supervisor first), the supervisor restarts it, and it
  recovers by copying;
- ``scale-kill``: ``silbo admin scale matchers 4`` and, in the middle of it, SIGKILL of one
  of the matchers; then ``silbo admin scale matchers 3`` right after (retried while another
  scale runs); the outcomes are reported. ``scale-kill-exit-point`` and
  ``scale-kill-access-point`` do the same to the exit points (2 → 3 → 2) and the access
  points, ``scale-kill-connection-point`` to the connection points (1 → 2 → 1: whole again
  once one is registered and owns every HTTP subscription).

Per fault it measures *detection* (until the configuration names the victim in ``failed``;
for ZooKeeper, until it answers again; for a store, until its registration ``/stores/<id>``
is gone or another member's) and *recovery* (until the layer serves its configured size
again without the victim, from the detection; for a store, until ``/stores/<id>`` is a new
member's, serving, and the store is in ``/store-sync``, from the fault). After the last
fault and a quiet period, an end marker is published and waited for; then the oracle (the
reference matcher, broker.matching.reference, not the broker's engine) says which
notifications every update should have caused, and the summary counts published,
acknowledged, refused, expected, delivered, lost, duplicated and unexpected, for the gRPC
subscriber and for the HTTP receiver (keyed by subscription and ``chaosSeq``; the oracle for
those is the subscriptions' id patterns). The store writer reads every entity back and
counts (``store``) entities lost (``n`` below the last acknowledged one, or missing),
increments applied twice (``store_double``) or missing (``store_short``), refused and
unknown writes, and the write latency. The PNG is the time line of delivered notifications
per second with each fault (red) and its recovery (green) marked.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import http.server
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException

from broker.bench.chaos_store import (
    StoreWriter,
    member_of,
    registered_again,
    replaced,
    serving_again,
)
from broker.bench.workloads.iot import IOT_TENANT, IOT_TYPE, iot_subscriptions, iot_updates
from broker.client import Client
from broker.cluster.local import read_cluster, store_id_of
from broker.coordination.client import connect
from broker.coordination.configuration import ClusterConfiguration, Configuration
from broker.coordination.http_subscriptions import OWNERS
from broker.coordination.membership import MEMBERS
from broker.coordination.scale import read_plan
from broker.errors import SilboError
from broker.extras import require
from broker.matching.reference import subscription_matches
from broker.model.attribute import Attribute
from broker.model.subscription import EntitySelector, Subscription
from broker.model.update import ContextUpdate
from broker.wire import client_pb2 as pb
from broker.wire.convert import entity_from_update

__all__ = ["configure", "run", "tally"]

FAULTS = (
    "matcher",
    "access-point",
    "exit-point",
    "matcher-hang",
    "zookeeper",
    "context-store",
    "scale-kill",
    "access-point-hang",
    "exit-point-hang",
    "context-store-hang",
    "scale-kill-exit-point",
    "scale-kill-access-point",
    "connection-point",
    "scale-kill-connection-point",
)
# HTTP subscriptions: one per last digit of the station id, and one for every station
HTTP_SUBSCRIPTIONS = [f"{digit}$" for digit in range(10)] + ["."]
SIZES = {
    "matchers": 3,
    "access-points": 2,
    "exit-points": 2,
    "context-stores": 2,
    "connection-points": 1,
}
_LAYER = {
    "matcher": "matchers",
    "access-point": "access_points",
    "exit-point": "exit_points",
    "connection-point": "connection_points",
}
_CONNECTION_POINT = "connection-point"
# the cluster's log level (SILBO_CHAOS_LOG=INFO: the processes' logs say what each did)
_LOG_LEVEL = os.environ.get("SILBO_CHAOS_LOG", "WARNING")
_END_TYPE = "ChaosEnd"
_STORE_ROLE = "context-store"


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``silbo bench chaos``."""
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of faults")
    parser.add_argument(
        "--count",
        type=int,
        default=0,
        help="inject exactly this many faults (round robin, --interval apart at least), "
        "however long they take, instead of faults for --duration",
    )
    parser.add_argument("--interval", type=float, default=12.0, help="seconds between faults")
    parser.add_argument("--rate", type=int, default=200, help="updates/s published")
    parser.add_argument("--batch", type=int, default=10, help="updates per publish batch")
    parser.add_argument("--subscriptions", type=int, default=100)
    parser.add_argument(
        "--store-rate", type=float, default=50.0, help="entity writes/s through the HTTP front"
    )
    parser.add_argument(
        "--faults", default=",".join(FAULTS), help=f"a comma list of {', '.join(FAULTS)}"
    )
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--plot", type=Path, default=None, help="write the time line PNG")
    parser.add_argument(
        "--keep",
        type=Path,
        default=None,
        metavar="DIR",
        help="run the cluster in DIR/state and keep it (its logs) afterwards",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; exit status 1 if a notification was lost, duplicated or unexpected,
    or an entity write lost or applied twice."""
    faults = [f.strip() for f in args.faults.split(",") if f.strip()]
    unknown = sorted(set(faults) - set(FAULTS))
    if (
        unknown
        or not faults
        or args.rate <= 0
        or args.interval <= 0
        or args.batch <= 0
        or args.store_rate < 0
        or args.count < 0
    ):
        print(f"silbo bench chaos: error: bad options (unknown faults {unknown})", file=sys.stderr)
        return 2
    if args.keep is not None:
        args.keep.mkdir(parents=True, exist_ok=True)
        summary = _Run(args, faults, args.keep).run()
    else:
        with tempfile.TemporaryDirectory(prefix="silbo-chaos-") as state:
            summary = _Run(args, faults, Path(state)).run()
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print(summary)
    if args.plot is not None:
        _plot(summary, args.plot)
    http = summary["http"]
    bad = [summary[k] or http[k] for k in ("lost", "duplicated", "unexpected")]
    store = summary.get("store") or {}
    bad += [store.get(k) for k in ("store_lost", "store_double", "store_short")]
    return 1 if any(bad) else 0


class _Run:
    def __init__(self, args: argparse.Namespace, faults: list[str], state: Path) -> None:
        self.args = args
        self.faults = faults
        self.state = state / "state"
        self.random = random.Random(args.seed)
        self.subscriptions = [
            *iot_subscriptions(args.subscriptions, args.seed),
            Subscription(id="chaos-end", entities=(EntitySelector(id="end", type=_END_TYPE),)),
        ]
        self.pool = iot_updates(5_000, args.seed + 1)
        self.sent: list[ContextUpdate] = []  # sequence i + 1
        self.sent_at: list[float] = []  # when each was first sent, from the start
        self.acked = 0
        self.refusals = 0
        self.arrivals: list[tuple[str, int, float]] = []  # (subscription, sequence, time)
        self.lock = threading.Lock()
        self.stop_publishing = threading.Event()
        self.started = 0.0
        self.events: list[dict[str, Any]] = []
        self.client: KazooClient | None = None
        self.http_port = _free_port()
        self.receiver = _Receiver()
        self.http_patterns: dict[str, re.Pattern[str]] = {}  # subscription id -> id pattern
        self.writer = StoreWriter(self.http_port, args.store_rate) if args.store_rate else None
        self.store: dict[str, Any] | None = None  # what the writer's check found

    def run(self) -> dict[str, Any]:
        up = self._up()
        self.receiver.start()
        try:
            endpoints = self._description()["endpoints"]
            subscriber = Client(endpoints, on_batch=self._on_batch, timeout=60.0)
            subscriber.subscribe_many(self.subscriptions)
            self._subscribe_http()
            self.started = time.monotonic()
            publisher = threading.Thread(target=self._publish, args=(endpoints,), daemon=True)
            publisher.start()
            if self.writer is not None:
                self.writer.start()
            time.sleep(min(5.0, self.args.interval))
            end = self.started + self.args.duration
            k = 0
            while k < self.args.count if self.args.count else time.monotonic() < end:
                began = time.monotonic()
                self._inject(self.faults[k % len(self.faults)])
                k += 1
                time.sleep(max(0.0, began + self.args.interval - time.monotonic()))
            time.sleep(5.0)  # quiet: the last recovery's traffic
            self.stop_publishing.set()
            if self.writer is not None:
                self.writer.stop()
                self.store = self.writer.check()
            publisher.join(120)
            self._wait_end()
            self._wait_http_settled()
            subscriber.close()
        finally:
            self.receiver.stop()
            if self.client is not None:
                self.client.stop()
                self.client.close()
            up.send_signal(signal.SIGTERM)
            try:
                up.wait(timeout=90)
            except subprocess.TimeoutExpired:
                up.kill()
        return self._summary()

    # -- the cluster --------------------------------------------------------------------

    def _up(self) -> subprocess.Popen[bytes]:
        command = ["--state-dir", str(self.state)]
        # fixed ports: a connection point restarted (fenced after its session expired) is
        # found again where the clients and the writer left it
        command += ["--grpc-port", str(_free_port()), "--log-level", _LOG_LEVEL]
        command += ["--http-port", str(self.http_port)]
        for layer, size in SIZES.items():
            command += [f"--{layer}", str(size)]
        return foreground_up(self.state, command)

    def _description(self) -> dict[str, Any]:
        found: dict[str, Any] = json.loads((self.state / "cluster.json").read_text())
        return found

    def _zk(self) -> KazooClient:
        """One client kept for the run (it reconnects after a ZooKeeper restart: same port)."""
        if self.client is None:
            address = self._description()["zookeeper"]["address"]
            self.client = connect(address, cluster="silbo", timeout=2)
        return self.client

    def _configuration(self) -> Configuration | None:
        """The configuration; None while ZooKeeper does not answer."""
        try:
            current = ClusterConfiguration(self._zk()).read()
        except (SilboError, OSError, ValueError):
            return None
        return current.configuration if current else None

    def _subscribe_http(self) -> None:
        """The NGSI subscriptions, through the HTTP front, notifying the receiver."""
        for pattern in HTTP_SUBSCRIPTIONS:
            document = {
                "subject": {"entities": [{"idPattern": pattern, "type": IOT_TYPE}]},
                "notification": {
                    "http": {"url": f"http://127.0.0.1:{self.receiver.port}/notify"},
                    "attrs": ["chaosSeq"],
                },
            }
            request = urllib.request.Request(
                f"http://127.0.0.1:{self.http_port}/v2/subscriptions",
                data=json.dumps(document).encode(),
                headers={
                    "Content-Type": "application/json",
                    "Fiware-Service": IOT_TENANT,
                    "Fiware-ServicePath": "/#",
                },
                method="POST",
            )
            with urllib.request.urlopen(request, timeout=30) as answer:
                location = answer.headers["Location"]
            self.http_patterns[location.rsplit("/", 1)[-1]] = re.compile(pattern)

    # -- load -----------------------------------------------------------------------------

    def _publish(self, endpoints: list[str]) -> None:
        with Client(endpoints, publisher="chaos", timeout=60.0) as client:
            pace = self.args.batch / self.args.rate
            next_at = time.monotonic()
            while not self.stop_publishing.is_set():
                batch = [self._numbered(len(self.sent) + i) for i in range(self.args.batch)]
                self._send(client, batch)
                next_at += pace
                time.sleep(max(0.0, next_at - time.monotonic()))
            self._send(
                client, [ContextUpdate.of("end", {"n": len(self.sent)}, entity_type=_END_TYPE)]
            )

    def _numbered(self, position: int) -> ContextUpdate:
        """The pool's update for ``position``, carrying its sequence (position + 1)."""
        update = self.pool[position % len(self.pool)]
        attributes = {**update.attributes, "chaosSeq": Attribute("Number", position + 1)}
        return dataclasses.replace(update, attributes=attributes)

    def _send(self, client: Client, batch: list[ContextUpdate]) -> None:
        first_sent = time.monotonic() - self.started
        request = pb.PublishRequest(
            publisher="chaos",
            first_sequence=len(self.sent) + 1,
            entities=[entity_from_update(u) for u in batch],
            incarnation=client.incarnation,  # a copy sent again after a failure is dropped
        )
        while True:
            try:
                self.acked += client.publish_requests([request])
                break
            except SilboError:
                self.refusals += 1
                time.sleep(0.1)
        self.sent.extend(batch)
        self.sent_at.extend([first_sent] * len(batch))

    def _on_batch(self, batch: pb.NotificationBatch, handles: dict[int, str]) -> None:
        now = time.monotonic() - self.started
        index = np.frombuffer(batch.entity_index, dtype="<u4").tolist()
        column = np.frombuffer(batch.handles, dtype="<u8").tolist()
        with self.lock:
            for i, handle in zip(index, column, strict=True):
                self.arrivals.append((handles.get(handle, "?"), batch.sequences[i], now))

    def _by_second(self, lost: Counter[tuple[str, int]]) -> dict[int, int]:
        """How many of ``lost`` were published in each second of the run."""
        found: Counter[int] = Counter()
        for (_subscription, sequence), count in lost.items():
            if 0 < sequence <= len(self.sent_at):
                found[int(self.sent_at[sequence - 1])] += count
        return dict(sorted(found.items()))

    def _wait_end(self) -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with self.lock:
                if any(s == "chaos-end" for s, _q, _t in self.arrivals[-200:]):
                    return
            time.sleep(0.1)

    def _wait_http_settled(self, quiet: float = 2.0) -> None:
        """Wait until the HTTP receiver got nothing new for ``quiet`` seconds (at most 120 s):
        notifications a front's worker still had queued are late, not lost."""
        deadline = time.monotonic() + 120
        last, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            total = self.receiver.received().total()
            if total != last:
                last, since = total, time.monotonic()
            elif time.monotonic() - since >= quiet:
                return
            time.sleep(0.2)

    # -- faults ---------------------------------------------------------------------------

    def _inject(self, fault: str) -> None:
        at = time.monotonic()
        event: dict[str, Any] = {"fault": fault, "t": round(at - self.started, 2)}
        try:
            self._inject_one(fault, event)
        except (ProcessLookupError, LookupError, OSError, ValueError, SilboError) as exc:
            # the victim went away first (a fenced process restarted...): the run goes on
            event.update(error=f"{type(exc).__name__}: {exc}", detection_s=None, recovery_s=None)
            _say(f"{fault}: not injected ({event['error']})")
            self.events.append(event)
            return
        self.events.append(event)
        _say(f"{fault}: detected in {event['detection_s']} s, whole in {event['recovery_s']} s")

    def _inject_one(self, fault: str, event: dict[str, Any]) -> None:
        if fault == "zookeeper":
            pid = int(self._description()["zookeeper"]["pid"])
            os.kill(pid, signal.SIGKILL)
            detected = self._until(lambda: self._zookeeper_back(pid), 60)
            event.update(detection_s=detected, recovery_s=detected)
        elif fault == "connection-point":
            event.update(self._kill_connection_point())
        elif fault.startswith("context-store"):
            event.update(self._fault_store(hang=fault.endswith("hang")))
        elif fault.startswith("scale-kill"):
            event.update(
                self._kill_mid_scale(fault.removeprefix("scale-kill").lstrip("-") or "matcher")
            )
        else:
            role = fault.removesuffix("-hang")
            victims = [p for p in self._description()["processes"] if p["role"] == role]
            victim = self.random.choice([v for v in victims if v.get("name")])
            os.kill(victim["pid"], signal.SIGSTOP if fault.endswith("hang") else signal.SIGKILL)
            detected = self._until(lambda: self._failed(victim["name"]), 60)
            if fault.endswith("hang"):
                with contextlib.suppress(ProcessLookupError):  # killed as hung already
                    os.kill(victim["pid"], signal.SIGCONT)
            recovered = self._until(lambda: self._whole(role, victim["name"]), 90)
            event.update(victim=victim["name"], detection_s=detected, recovery_s=recovered)

    def _kill_connection_point(self) -> dict[str, Any]:
        """Kill a connection point: detected once the supervisor's new one registered, whole
        once every HTTP subscription has a live owner again (adopted from the dead one)."""
        role = "connection-point"
        victims = [p for p in self._description()["processes"] if p["role"] == role]
        victim = self.random.choice([v for v in victims if v.get("name")])
        os.kill(victim["pid"], signal.SIGKILL)

        def restarted() -> bool:
            processes = self._description()["processes"]
            return any(
                p["role"] == role and p.get("name") and p["pid"] != victim["pid"] for p in processes
            )

        detected = self._until(restarted, 60)
        began = time.monotonic() - (detected or 0.0)
        gone = self._until(lambda: self._adopted_from(victim["name"]), 60)
        return {
            "victim": victim["name"],
            "detection_s": detected,
            "recovery_s": None if gone is None else round(time.monotonic() - began, 2),
        }

    def _adopted_from(self, dead: str) -> bool:
        """Whether every HTTP subscription has an owner, and none is the front ``dead``."""
        try:
            zk = self._zk()
            owners = [zk.get(f"{OWNERS}/{i}")[0] for i in zk.get_children(OWNERS)]
        except (KazooException, OSError):
            return False
        fronts = [json.loads(data).get("front") for data in owners]
        return len(fronts) >= len(self.http_patterns) and dead not in fronts

    def _fault_store(self, *, hang: bool) -> dict[str, Any]:
        """Kill (or stop until detected) one context store; detected once its registration
        is gone or another member's, whole once it serves again in sync."""
        victims = [p for p in self._description()["processes"] if p["role"] == _STORE_ROLE]
        victim = self.random.choice(victims)
        slot = re.search(r"-(\d+)\.log$", victim["log"])
        if slot is None:
            raise LookupError(f"no slot in the log name {victim['log']}")
        store_id = store_id_of(int(slot.group(1)))
        member = member_of(self._zk(), store_id)
        if member is None:
            raise LookupError(f"store {store_id} is not registered")
        os.kill(victim["pid"], signal.SIGSTOP if hang else signal.SIGKILL)
        began = time.monotonic()
        detected = self._until(lambda: replaced(self._zk(), store_id, member), 60)
        if hang:
            with contextlib.suppress(ProcessLookupError):  # killed as hung already
                os.kill(victim["pid"], signal.SIGCONT)
        back = self._until(lambda: registered_again(self._zk(), store_id, member), 90)
        registered = None if back is None else round(time.monotonic() - began, 2)
        whole = self._until(lambda: serving_again(self._zk(), store_id, member), 90)
        return {
            "victim": f"{store_id} ({member})",
            "detection_s": detected,
            "registered_s": registered,  # its replacement registered (recovering), from the fault
            "recovery_s": None if whole is None else round(time.monotonic() - began, 2),
        }

    def _kill_mid_scale(self, role: str) -> dict[str, Any]:
        """Scale ``role``'s layer out by one, kill one of its processes in the middle, then
        scale it back."""
        layer = _LAYER[role].replace("_", "-")
        victims = [p for p in self._description()["processes"] if p["role"] == role]
        victim = self.random.choice([v for v in victims if v.get("name")])
        began = time.monotonic()
        first: dict[str, Any] | None = None
        while True:  # a scale of the supervisor's (back to size) may run: start once it ended
            scale = self._admin_scale(layer, SIZES[layer] + 1)
            started = self._until(
                lambda scale=scale: self._planned() or scale.poll() is not None, 30
            )
            if started is None:
                break
            if scale.poll() is None or time.monotonic() - began > 60:
                break  # the plan is up: the scale runs
            first = _outcome(scale)
            if first.get("outcome") == "completed":
                break  # a connection-point scale out needs no plan: the kill comes right after
            first = None
            self._until(lambda: not self._planned(), 60)  # rejected: the other scale ends
        time.sleep(self.random.random() * 0.5)  # the cut, the transfer, the switch...
        victims = [p for p in self._description()["processes"] if p["role"] == role]
        if victim not in victims:  # it died meanwhile (fenced, killed as hung): another one
            victim = self.random.choice([v for v in victims if v.get("name")])
        os.kill(victim["pid"], signal.SIGKILL)
        killed = time.monotonic()
        # repaired out, or left out by the scale it was part of (completed without it)
        detected = self._until(lambda: self._left_out(role, victim["name"]), 60)
        first = first or _outcome(scale)
        began = time.monotonic()
        while True:  # right after the failure; the supervisor's own scale may run: again
            back = _outcome(self._admin_scale(layer, SIZES[layer]))
            if back.get("outcome") == "completed" or time.monotonic() - began > 90:
                break
            self._until(lambda: not self._planned(), 60)  # the scale that ran ends
        whole = self._until(lambda: self._whole(role, victim["name"]), 90)
        return {
            "victim": victim["name"],
            "detection_s": detected,
            "recovery_s": None if whole is None else round(time.monotonic() - killed, 2),
            "scale_out": first.get("outcome"),
            "scale_out_message": first.get("message", ""),
            "scale_back": back.get("outcome"),
        }

    def _planned(self) -> bool:
        """Is a scale plan up in ZooKeeper (a scale running)?"""
        try:
            return read_plan(self._zk()) is not None
        except (SilboError, OSError, ValueError):
            return False

    def _admin_scale(self, layer: str, size: int) -> subprocess.Popen[str]:
        command = [sys.executable, "-m", "broker.cli", "admin", "scale", layer, str(size)]
        command += ["--state-dir", str(self.state), "--json"]
        return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def _until(self, condition: Any, timeout: float) -> float | None:
        began = time.monotonic()
        while time.monotonic() - began < timeout:
            if condition():
                return round(time.monotonic() - began, 2)
            time.sleep(0.05)
        return None

    def _failed(self, name: str) -> bool:
        configuration = self._configuration()
        return configuration is not None and name in configuration.failed

    def _left_out(self, role: str, name: str) -> bool:
        """The configuration no longer has ``name`` serve: repaired out (``failed``), or a
        scale completed without it (and no plan is up)."""
        configuration = self._configuration()
        if configuration is None:
            return False
        if role == _CONNECTION_POINT:  # not in the configuration: its registration
            return name not in self._connection_points() and not self._planned()
        if name in configuration.failed:
            return True
        return name not in getattr(configuration, _LAYER[role]) and not self._planned()

    def _connection_points(self) -> list[str]:
        """The connection points registered now."""
        try:
            return list(self._zk().get_children(f"{MEMBERS}/{_CONNECTION_POINT}"))
        except (KazooException, OSError):
            return []

    def _whole(self, role: str, victim: str) -> bool:
        if role == _CONNECTION_POINT:  # its size, and every HTTP subscription owned
            live = self._connection_points()
            size = SIZES[_LAYER[role].replace("_", "-")]
            return len(live) == size and victim not in live and self._adopted_from(victim)
        configuration = self._configuration()
        if configuration is None:
            return False
        serving = getattr(configuration, _LAYER[role])
        return len(serving) == SIZES[_LAYER[role].replace("_", "-")] and victim not in serving

    def _zookeeper_back(self, old_pid: int) -> bool:
        try:
            pid = int(self._description()["zookeeper"]["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            return False
        return pid != old_pid and self._configuration() is not None

    # -- the oracle -------------------------------------------------------------------------

    def _unplanned(self) -> dict[str, int]:
        """What the supervisor did that no fault asked for: processes fenced (their session
        expired, or their peers declared them dead), and hang kills beyond the injected
        hangs."""
        try:
            log = (self.state.parent / "up.err").read_text(errors="replace")
        except OSError:
            return {}
        hangs = sum(1 for e in self.events if e["fault"].endswith("-hang") and "error" not in e)
        return {
            "fenced_exits": log.count("exited with 75"),
            "hang_kills_not_injected": max(0, log.count("killed as hung") - hangs),
        }

    def _summary(self) -> dict[str, Any]:
        _say(f"the oracle: {len(self.sent):,} updates, {len(self.subscriptions)} subscriptions")
        expected: Counter[tuple[str, int]] = Counter()
        # An update matches as its pool entry does (chaosSeq is in no subscription's filter):
        # each entry is matched once.
        by_entry: dict[int, list[str]] = {}
        for sequence, update in enumerate(self.sent, start=1):
            entry = (sequence - 1) % len(self.pool) if update.entity_type == IOT_TYPE else -sequence
            matched = by_entry.get(entry)
            if matched is None:
                matched = by_entry[entry] = [
                    s.id for s in self.subscriptions if subscription_matches(s, update)
                ]
            for subscription_id in matched:
                expected[subscription_id, sequence] += 1
        got = Counter((s, q) for s, q, _t in self.arrivals)
        lost, repeated, extra = tally(expected, got)
        duplicated = repeated.total()
        http_expected: Counter[tuple[str, int]] = Counter()
        for sequence, update in enumerate(self.sent, start=1):
            if update.entity_type != IOT_TYPE:
                continue
            for subscription_id, pattern in self.http_patterns.items():
                if pattern.search(update.entity_id):
                    http_expected[subscription_id, sequence] += 1
        http_got = self.receiver.received()
        http_extra = http_got - http_expected
        http_lost = http_expected - http_got
        http_duplicated = sum(n - 1 for k, n in http_got.items() if n > 1 and k in http_expected)
        seconds = int(max((t for _s, _q, t in self.arrivals), default=0.0)) + 1
        per_second = np.bincount(
            np.asarray([int(t) for _s, _q, t in self.arrivals], dtype=np.int64), minlength=seconds
        )
        return {
            "published": len(self.sent),
            "acknowledged": self.acked,
            "refused": self.refusals,
            "expected": expected.total(),
            "delivered": got.total(),
            "lost": lost.total(),
            "duplicated": duplicated,
            "unexpected": extra.total(),
            # when the updates whose notifications were lost had been published (second: count)
            "lost_by_second": self._by_second(lost),
            # when the updates notified twice had been published; the first few of them
            "duplicated_by_second": self._by_second(repeated),
            "duplicated_examples": [
                {"subscription": s, "sequence": q, "arrived": [round(t, 2) for t in at]}
                for (s, q) in sorted(repeated)[:5]
                for at in [[t for s2, q2, t in self.arrivals if (s2, q2) == (s, q)]]
            ],
            "http": {
                "subscriptions": len(self.http_patterns),
                "expected": http_expected.total(),
                "delivered": http_got.total(),
                "lost": http_lost.total(),
                "lost_by_second": self._by_second(http_lost),
                "lost_by_subscription": dict(
                    Counter(s for s, _q in http_lost.elements()).most_common()
                ),
                "duplicated": http_duplicated,
                "unexpected": http_extra.total() - http_duplicated,
            },
            "faults": self.events,
            "unplanned": self._unplanned(),
            "store": self.store,
            "delivered_per_second": per_second.tolist(),
            "command": "silbo bench chaos " + " ".join(sys.argv[3:]),
        }


def foreground_up(state: Path, options: list[str]) -> subprocess.Popen[bytes]:
    """``silbo up OPTIONS`` in the foreground (its stderr in ``state``'s parent, up.err), once
    its cluster.json says running (SilboError if it exits first or takes over 120 s)."""
    state.mkdir(parents=True)
    command = [sys.executable, "-m", "broker.cli", "up", *options]
    err = open(state.parent / "up.err", "wb")  # noqa: SIM115 (lives with the process)
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=err)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SilboError((state.parent / "up.err").read_text())
        description = read_cluster(state)
        if description is not None and description.get("status") == "running":
            return process
        time.sleep(0.1)
    process.kill()
    raise SilboError("silbo up did not start within 120 s")


def tally(
    expected: Counter[Any], got: Counter[Any]
) -> tuple[Counter[Any], Counter[Any], Counter[Any]]:
    """The oracle's verdict on deliveries keyed alike (e.g. subscription and sequence): what
    was lost (expected, not delivered), what was delivered more than once (the copies beyond
    the first, of expected keys) and what was unexpected (delivered, not expected, copies of
    such keys included)."""
    repeated = Counter({k: n - 1 for k, n in got.items() if n > 1 and k in expected})
    unexpected = got - expected - repeated
    return expected - got, repeated, unexpected


def _print(summary: dict[str, Any]) -> None:
    for what, by_second in (
        ("gRPC", summary["lost_by_second"]),
        ("HTTP", summary["http"]["lost_by_second"]),
    ):
        if by_second:
            worst = sorted(by_second.items(), key=lambda kv: -kv[1])[:5]
            print(f"{what} losses by publish second (worst): {worst}")
    for key in ("published", "acknowledged", "refused", "expected", "delivered", "lost"):
        print(f"{key:>13}: {summary[key]:,}")
    print(f"{'duplicated':>13}: {summary['duplicated']:,}")
    print(f"{'unexpected':>13}: {summary['unexpected']:,}")
    http = summary["http"]
    print(
        f"{'HTTP':>13}: {http['delivered']:,} of {http['expected']:,} delivered to "
        f"{http['subscriptions']} subscriptions, {http['lost']:,} lost, "
        f"{http['duplicated']:,} duplicated, {http['unexpected']:,} unexpected"
    )
    store = summary.get("store")
    if store:
        latency = store["latency_ms"]
        print(
            f"{'store':>13}: {store['writes']:,} entity writes ({store['acknowledged']:,} "
            f"acknowledged, {store['refused']:,} refused, {store['not_sent']:,} not sent, "
            f"{store['unknown']:,} unknown), "
            f"{store['read']} of {store['entities']} entities read back: "
            f"{store['store_lost']} lost, {store['store_double']} double, "
            f"{store['store_short']} short; latency p50 {latency['p50']} ms, "
            f"p99 {latency['p99']} ms"
        )
        if store["read_error"]:
            print(f"{'':>13}  read back failed: {store['read_error']}")
    for event in summary["faults"]:
        scales = (
            f", scale out {event['scale_out']}, back {event['scale_back']}"
            if "scale_out" in event
            else ""
        )
        if "registered_s" in event:
            scales = f" (registered again {event['registered_s']} s)"
        print(
            f"  t={event['t']:>7} s  {event['fault']:<18} detected {event['detection_s']} s, "
            f"whole {event['recovery_s']} s{scales}"
        )


def _plot(summary: dict[str, Any], path: Path) -> None:
    require("bench", "the plot of silbo bench chaos")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(11, 4))
    rates = summary["delivered_per_second"]
    axes.plot(range(len(rates)), rates, color="tab:blue", label="notifications delivered/s")
    for event in summary["faults"]:
        axes.axvline(event["t"], color="tab:red", alpha=0.6)
        axes.annotate(
            event["fault"], (event["t"] + 0.3, 0.6 * max(rates or [1])), rotation=90, fontsize=7
        )
        if event.get("recovery_s") is not None:
            axes.axvline(event["t"] + event["recovery_s"], color="tab:green", alpha=0.5)
    axes.set_xlabel("seconds")
    axes.set_ylabel("notifications/s")
    axes.set_title(
        f"silbo bench chaos: {summary['lost']:,} of {summary['expected']:,} lost, "
        f"{summary['duplicated']} duplicated (red: fault, green: layer whole again)"
    )
    axes.legend(loc="lower left")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def _say(message: str) -> None:
    print(f"[chaos] {message}", file=sys.stderr, flush=True)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _outcome(scale: subprocess.Popen[str]) -> dict[str, Any]:
    """What ``silbo admin scale --json`` answered (its error, if it printed no JSON)."""
    try:
        out, err = scale.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        scale.kill()
        return {"outcome": "timed out"}
    try:
        found: dict[str, Any] = json.loads(out)
        return found
    except ValueError:
        return {"outcome": "failed", "message": (err or out).strip()[-300:]}


class _Receiver:
    """An HTTP server that takes NGSI notifications and counts (subscription, chaosSeq)."""

    def __init__(self) -> None:
        self._counts: Counter[tuple[str, int]] = Counter()
        self._lock = threading.Lock()
        counts, lock = self._counts, self._lock

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                try:
                    notification = json.loads(body)
                    subscription = notification["subscriptionId"]
                    keys = [
                        (subscription, int(e["chaosSeq"]["value"])) for e in notification["data"]
                    ]
                except (ValueError, KeyError, TypeError):
                    keys = []
                with lock:
                    counts.update(keys)
                self.send_response(204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def received(self) -> Counter[tuple[str, int]]:
        with self._lock:
            return Counter(self._counts)
