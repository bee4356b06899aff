"""``silbo bench ngsi``: updates/s taken over NGSI v2 HTTP and notifications/s sent by HTTP.

    silbo bench ngsi [--subscriptions 10000] [--workload iot|geo] [--max-distance 500]
                     [--duration 20] [--clients 16] [--batch 1]
                     [--rate 0] [--receiver-faults 0] [--runs 1] [--drain 20]
                     [--state-dir DIR] [--zk HOST:PORT] [--json]

One run:

1. starts a cluster with the HTTP front (1 connection point serving HTTP, 1 access point,
   2 matchers, 1 exit point), unless ``--state-dir`` names a running one
   (``silbo up --http-port``), and a notification receiver in a process of its own
   (a bare HTTP/1.1 server on asyncio, one URL per subscription: ``/n/<position>``), which
   counts requests and their data entities and keeps, per notification, (subscription,
   request, station); with ``--receiver-faults F`` it does not take a share F of the
   notification requests (chosen at random), answering them 503 or resetting the
   connection, alternately (a flaky receiver: what the front's retries are for);
2. creates the W-IoT stations as entities (``POST /v2/op/update``, no subscription yet),
   then ``--subscriptions`` W-IoT subscriptions over HTTP (``POST /v2/subscriptions``:
   ``idPattern`` or ``id``, ``type``, ``q``, ``Fiware-ServicePath`` as the scope, no
   throttling), all on a fresh tenant (``Fiware-Service``);
3. for ``--duration`` seconds, ``--clients`` concurrent publishers (one keep-alive
   connection each, one request in flight each, on the delivery worker's lean HTTP client
   :class:`broker.ngsi.http_client.HttpClient`, so that they take little of the machine)
   send W-IoT readings as fast as they are answered (or ``--rate`` readings/s in all): with
   ``--batch 1`` one ``POST /v2/entities/{id}/attrs`` per reading (what IoT agents mostly
   send), otherwise ``POST /v2/op/update`` (``append``) of ``--batch`` readings of one
   district (one service path per request, as Orion wants; a district has about 48 stations,
   so a batch of 100 carries most of its stations twice); each client owns whole districts
   (at most 21 clients), so each station's readings go out in order and its state at the
   front is known;
4. waits at most ``--drain`` seconds for the notifications still queued, then checks them.

The check: the bench replays what each client had accepted through the store's own code
(:class:`broker.store.entities.Entities` in memory, Orion's write semantics: the whole
entity after each reading, and whether it changed), matches the whole entities that changed
with the in-process engine (property-tested against the reference matcher) on the same
subscriptions, and compares the (subscription, request, station) triples with those
received: ``unexpected`` (received, not expected, or more often than expected) should be 0;
``missing`` counts expected ones not received, dropped by the front's queue bounds
(``dropped``: what the subscriptions count in ``droppedNotifications``) or still queued at
the end (its notification worker sends at most 128 at a time, and keeps at most 1,000 queued
per subscription and 100,000 in all). Contents of the notifications (attribute values,
headers) are not checked here: tests/ngsi does that.

Reported: ``updates_per_s`` (readings in 2xx answers / publishing time), ``requests_per_s``,
``errors`` by status, ``p50_ms`` / ``p99_ms`` request latency, ``notifications_per_s``
(requests the receiver got while publishing, per second) and ``notified_entities_per_s``,
and the totals after the drain; ``cpu_us_per_update`` includes the processes' children
(``connection-point-N/<pid>``: the notification worker).

``--workload geo`` (W-fleet, :mod:`broker.bench.workloads.fleet`): the entities are 1,000
vehicles moving about a Madrid-sized box (a ``geo:json`` Point ``location`` that moves
20-80 m at each reading, and the same coordinates as ``latitude`` / ``longitude``
numbers), and each subscription (``idPattern .*``, type ``Vehicle``) watches the circle of
``--max-distance`` meters around a random place of the city: ``georel
near;maxDistance:M``, ``geometry point``, ``coords``. In the same cluster, on a fresh tenant,
the run then measures the same without geo: the same readings and places, each circle
asked as ``q`` ranges on ``latitude`` and ``longitude`` (the box that holds it, which the
matchers index), reported as ``without_geo``. The check of the geographical run does not
use the engine (every subscription selects every vehicle) nor :mod:`broker.store.geo`: a
changed vehicle is expected to notify the subscriptions whose place is within the distance
of its location by the bench's own haversine (:func:`broker.bench.workloads.fleet.within`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import random
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import aiohttp
import numpy as np
import numpy.typing as npt

from broker.bench.match import run_and_report
from broker.bench.workloads.fleet import (
    FLEET_ID_PREFIX,
    box_subscriptions,
    fleet_places,
    fleet_updates,
    near_expression,
    vehicle_number,
    within,
)
from broker.bench.workloads.iot import DISTRICTS, iot_subscriptions, iot_updates
from broker.cluster import ClusterSpec, LocalCluster
from broker.matching import Engine
from broker.model.subscription import Subscription
from broker.model.update import ContextUpdate
from broker.ngsi.change import Alteration
from broker.ngsi.entity import Attributes, parse_attributes, to_wire
from broker.ngsi.http_client import HttpClient, Target, TransportError
from broker.store.entities import Entities, MemoryEngine
from broker.store.semantics import Mode
from broker.store.wire import Intent
from broker.wire.convert import trusted_update

__all__ = ["NgsiReport", "configure", "run", "run_once"]

POOL = 20_000  # distinct readings; each client cycles through its share
STATIONS = 1_000  # W-IoT stations, or fleet vehicles
MAX_CLIENTS = len(DISTRICTS)
_STATION_BITS = 10  # a notification's key: (request * 2**10 + station) * 2**20 + position
_POSITION_BITS = 20
_FIRES = (Alteration.CREATE, Alteration.CHANGE)  # a subscription's default alterationTypes
_REQUEST_TIMEOUT = 60.0  # seconds a publisher waits for an answer


@dataclass
class NgsiReport:
    """One run's figures (see the module doc)."""

    subscriptions: int
    duration_s: float
    clients: int
    batch: int
    workload: str = "iot"  # iot, geo (near circles), no-geo (the same circles as q boxes)
    requests: int = 0
    updates: int = 0
    updates_per_s: float = 0.0
    requests_per_s: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    p50_ms: float = 0.0
    p99_ms: float = 0.0
    notifications_per_s: float = 0.0
    notified_entities_per_s: float = 0.0
    notifications: int = 0
    notified_entities: int = 0
    drain_s: float = 0.0
    dropped: int = 0  # the subscriptions' droppedNotifications after the drain
    subscribe_per_s: float = 0.0
    cpu_us_per_update: dict[str, float] = field(default_factory=dict)  # by process, publishing
    expected: int = 0
    received: int = 0
    missing: int = 0
    unexpected: int = 0
    without_geo: NgsiReport | None = None  # --workload geo: the no-geo run, same cluster


@dataclass(frozen=True, slots=True)
class _Workload:
    """What one measurement publishes and subscribes: its readings, its subscriptions (what
    the engine of the check matches), the attributes an entity is created with, and for the
    geographical one each subscription's place and circle (the check's own oracle, not the
    engine, decides those)."""

    name: str
    pool: list[ContextUpdate]
    subscriptions: list[Subscription]
    created_with: tuple[str, ...]
    places: list[tuple[float, float]] | None = None
    meters: float = 0.0


@dataclass(frozen=True, slots=True)
class _Request:
    """One prepared update request: where, its body, and the readings it carries."""

    path: str
    service_path: str
    body: bytes
    readings: tuple[int, ...]  # positions in the pool


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the options of ``silbo bench ngsi``."""
    parser.add_argument("--subscriptions", type=int, default=10_000)
    parser.add_argument(
        "--workload",
        choices=("iot", "geo"),
        default="iot",
        help="iot: W-IoT stations; geo: moving vehicles and near circles, then the same "
        "circles as q boxes (no geo) in the same cluster",
    )
    parser.add_argument(
        "--max-distance",
        type=float,
        default=500.0,
        metavar="M",
        help="--workload geo: the circles' radius in meters (default 500)",
    )
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of publishing")
    parser.add_argument(
        "--clients",
        type=int,
        default=16,
        help=f"concurrent HTTP publishers, one request in flight each (1 to {MAX_CLIENTS})",
    )
    parser.add_argument(
        "--batch",
        type=int,
        default=1,
        help="readings per request: 1 = POST /v2/entities/{id}/attrs, more = POST /v2/op/update",
    )
    parser.add_argument(
        "--rate", type=float, default=0.0, help="readings/s in all (default 0: as fast as answered)"
    )
    parser.add_argument(
        "--receiver-faults",
        type=float,
        default=0.0,
        metavar="F",
        help="share of notification requests the receiver does not take: answered 503 or the "
        "connection reset, alternately (0 to 1; default 0)",
    )
    parser.add_argument("--runs", type=int, default=1, help="runs (medians reported)")
    parser.add_argument(
        "--drain", type=float, default=20.0, help="seconds to wait for queued notifications"
    )
    parser.add_argument(
        "--state-dir", default=None, help="use this running cluster (silbo up --http-port)"
    )
    parser.add_argument("--zk", default=None, help="use this ZooKeeper HOST:PORT (else embedded)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark; prints the report (exit 1 if a notification was unexpected)."""
    if (
        not 1 <= args.clients <= MAX_CLIENTS
        or args.batch < 1
        or args.subscriptions < 1
        or args.rate < 0
        or not 0 <= args.receiver_faults < 1
        or not args.max_distance > 0
    ):
        print(
            f"silbo bench ngsi: error: --clients must be 1 to {MAX_CLIENTS} (one W-IoT district "
            "or more each), --batch and --subscriptions at least 1, --rate at least 0, "
            "--receiver-faults from 0 to below 1, --max-distance above 0",
            file=sys.stderr,
        )
        return 2
    report = run_and_report(args, run_once, _median, _print, _say)
    return 1 if report.unexpected else 0


def run_once(args: argparse.Namespace) -> NgsiReport:
    """One run (see the module doc)."""
    report = NgsiReport(args.subscriptions, args.duration, args.clients, args.batch, args.workload)
    cluster = None
    if args.state_dir and (Path(args.state_dir) / "cluster.json").exists():
        described = json.loads((Path(args.state_dir) / "cluster.json").read_text())
        endpoints = described.get("http_endpoints") or []
        if not endpoints:
            raise SystemExit(f"{args.state_dir}: the cluster serves no HTTP (silbo up --http-port)")
        address = endpoints[0]
        processes = described.get("processes", [])
    else:
        state = Path(args.state_dir or tempfile.mkdtemp(prefix="silbo-ngsi-"))
        name = f"bench-ngsi-{uuid.uuid4().hex[:8]}" if args.zk else "silbo"
        spec = ClusterSpec(
            matchers=2,
            grpc_port=0,
            http_port=0,  # any free port: cluster.json names the fronts
            zk=args.zk,
            cluster=name,
            state_dir=state,
            log_level="WARNING",
        )
        _say(f"starting a cluster (HTTP front, 2 matchers) in {state}")
        cluster = LocalCluster(spec)
        described = cluster.start()
        address, processes = described["http_endpoints"][0], described["processes"]
    receiver = _ReceiverProcess(args.receiver_faults, args.seed)
    pids = {f"{p['role']}-{i}": int(p["pid"]) for i, p in enumerate(processes) if p.get("pid")}
    pids.update(_children(pids))
    pids["receiver"] = receiver.pid
    try:
        if args.workload == "iot":
            workload = _Workload(
                "iot",
                iot_updates(POOL, args.seed + 1, STATIONS),
                iot_subscriptions(args.subscriptions, args.seed, STATIONS),
                ("stationName",),
            )
            asyncio.run(_measure(args, report, workload, f"http://{address}", receiver, pids))
        else:
            report.without_geo = NgsiReport(**{**asdict(report), "workload": "no-geo"})
            for measured, workload in zip((report, report.without_geo), _fleet(args), strict=True):
                asyncio.run(_measure(args, measured, workload, f"http://{address}", receiver, pids))
    finally:
        receiver.stop()
        if cluster is not None:
            cluster.stop()
    return report


def _fleet(args: argparse.Namespace) -> tuple[_Workload, _Workload]:
    """The geographical workload and the same without geo (module doc)."""
    pool = fleet_updates(POOL, args.seed + 1, STATIONS)
    places = fleet_places(args.subscriptions, args.seed)
    boxes = box_subscriptions(places, args.max_distance)
    everywhere = [
        Subscription(id=s.id, entities=s.entities, description="near") for s in boxes
    ]  # the geo subscriptions' selectors: their circles go in the expression
    return (
        _Workload("geo", pool, everywhere, ("speed",), places, args.max_distance),
        _Workload("no-geo", pool, boxes, ("speed",)),
    )


# -- the measurement ------------------------------------------------------------------------


async def _measure(
    args: argparse.Namespace,
    report: NgsiReport,
    workload: _Workload,
    base: str,
    receiver: _ReceiverProcess,
    pids: dict[str, int],
) -> None:
    subscriptions, pool = workload.subscriptions, workload.pool
    tenant = f"bench_{uuid.uuid4().hex[:10]}"
    streams = _streams(pool, args.clients, args.batch)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        await _wait_serving(http, base)
        await receiver.wait_ready(http)
        await receiver.reset(http)
        _say(f"{workload.name}: creating {STATIONS} entities (tenant {tenant})")
        await _provision(http, base, tenant, pool, workload.created_with)
        await asyncio.sleep(1.0)  # their publications matched before any subscription exists
        _say(f"{workload.name}: creating {len(subscriptions):,} subscriptions over HTTP")
        started = time.perf_counter()
        await _subscribe(http, base, tenant, workload, receiver.url)
        report.subscribe_per_s = round(len(subscriptions) / (time.perf_counter() - started), 1)
        await asyncio.sleep(1.0)
        _say(
            f"{workload.name}: publishing for {args.duration:.0f} s, {args.clients} clients, "
            f"batch {args.batch}"
        )
        cpu_before = _cpu_seconds(pids)
        done = await _publish(http, base, tenant, streams, args, report, receiver)
        cpu = _cpu_seconds(pids)
        report.cpu_us_per_update = {
            name: round((cpu[name] - cpu_before[name]) * 1e6 / max(report.updates, 1), 1)
            for name in cpu
            if name in cpu_before
        }
        deadline = time.perf_counter() + args.drain
        drain_started = time.perf_counter()
        last, still = -1, 0.0
        while time.perf_counter() < deadline:
            posts, _entities = await receiver.counts(http)
            if posts == last and time.perf_counter() - still > 2.0:
                break  # nothing more for 2 s: the front's queues are empty
            if posts != last:
                last, still = posts, time.perf_counter()
            _say(f"draining: {posts:,} notifications received")
            await asyncio.sleep(0.5)
        report.drain_s = round(time.perf_counter() - drain_started, 1)
        report.notifications, report.notified_entities = await receiver.counts(http)
        received = await receiver.keys(http)
        report.dropped = await _dropped(http, base, tenant)
    _say("computing the expected notifications (front cache replayed, in-process engine)")
    expected = _expected(workload, streams, done, args.batch)
    report.expected = len(expected)
    report.received = len(received)
    report.missing, report.unexpected = _compare(expected, received)


async def _wait_serving(http: aiohttp.ClientSession, base: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            async with http.get(f"{base}/version") as answer:
                if answer.status == 200:
                    return
        except aiohttp.ClientError:
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.1)


async def _provision(
    http: aiohttp.ClientSession,
    base: str,
    tenant: str,
    pool: list[ContextUpdate],
    created_with: tuple[str, ...],
) -> None:
    """Create every entity (with the attributes ``created_with`` of its last reading: a
    station's name) so that ``.../attrs`` finds it."""
    by_path: dict[str, dict[str, dict[str, Any]]] = {}
    for update in pool:
        entity: dict[str, Any] = {"id": update.entity_id, "type": update.entity_type}
        for name in created_with:
            entity[name] = _attribute_json(update, name)
        by_path.setdefault(update.service_path, {})[update.entity_id] = entity
    for path, entities in by_path.items():
        body = {"actionType": "append", "entities": list(entities.values())}
        headers = {"Fiware-Service": tenant, "Fiware-ServicePath": path}
        async with http.post(f"{base}/v2/op/update", json=body, headers=headers) as answer:
            if answer.status != 204:
                raise RuntimeError(f"creating the stations: {answer.status} {await answer.text()}")


async def _subscribe(
    http: aiohttp.ClientSession, base: str, tenant: str, workload: _Workload, url: str
) -> None:
    queue = list(enumerate(workload.subscriptions))
    queue.reverse()
    places, meters = workload.places, workload.meters

    async def worker() -> None:
        while queue:
            position, subscription = queue.pop()
            headers = {"Fiware-Service": tenant}
            if subscription.service_path != "/#":
                headers["Fiware-ServicePath"] = subscription.service_path
            body = _subscription_json(subscription, f"{url}/n/{position}")
            if places is not None:
                expression = near_expression(places[position], meters)
                body["subject"]["condition"] = {"expression": expression}
            async with http.post(f"{base}/v2/subscriptions", json=body, headers=headers) as answer:
                if answer.status != 201:
                    raise RuntimeError(f"subscribing: {answer.status} {await answer.text()}")

    await asyncio.gather(*(worker() for _ in range(32)))


async def _dropped(http: aiohttp.ClientSession, base: str, tenant: str) -> int:
    """The sum of the tenant's subscriptions' ``droppedNotifications``."""
    total, offset = 0, 0
    while True:
        params = {"limit": "1000", "offset": str(offset)}
        headers = {"Fiware-Service": tenant}
        async with http.get(f"{base}/v2/subscriptions", params=params, headers=headers) as answer:
            page = await answer.json()
        total += sum(int(s["notification"].get("droppedNotifications", 0)) for s in page)
        if len(page) < 1000:
            return total
        offset += 1000


def _subscription_json(subscription: Subscription, url: str) -> dict[str, Any]:
    """A W-IoT subscription as an NGSI v2 subscription notifying ``url``."""
    entities = []
    for selector in subscription.entities:
        entity: dict[str, str] = {}
        if selector.id is not None:
            entity["id"] = selector.id
        else:
            entity["idPattern"] = selector.id_pattern or ".*"
        if selector.type is not None:
            entity["type"] = selector.type
        entities.append(entity)
    subject: dict[str, Any] = {"entities": entities}
    if subscription.q:
        subject["condition"] = {"expression": {"q": subscription.q}}
    return {
        "description": subscription.description,
        "subject": subject,
        "notification": {"http": {"url": url}, "attrsFormat": "normalized"},
    }


@dataclass
class _Client:
    """One publisher's tally."""

    done: int = 0  # requests answered 2xx, in stream order (it stops at its first error)
    updates: int = 0
    latencies: list[float] = field(default_factory=list)
    errors: Counter[str] = field(default_factory=Counter)


async def _publish(
    http: aiohttp.ClientSession,
    base: str,
    tenant: str,
    streams: list[list[_Request]],
    args: argparse.Namespace,
    report: NgsiReport,
    receiver: _ReceiverProcess,
) -> list[int]:
    """Publish for ``--duration`` s; the requests each client had accepted, in order."""
    clients = [_Client() for _ in streams]
    posts_before, entities_before = await receiver.counts(http)
    started = time.perf_counter()
    end = started + args.duration

    async def publisher(number: int, stream: list[_Request]) -> None:
        tally = clients[number]
        own = HttpClient(1, 1)  # one keep-alive connection per client
        targets: dict[tuple[str, str], Target] = {}
        try:
            i = 0
            while time.perf_counter() < end:
                if args.rate:  # this client's share of --rate readings/s
                    due = started + tally.updates * len(streams) / args.rate
                    await asyncio.sleep(max(0.0, due - time.perf_counter()))
                request = stream[i % len(stream)]
                target = targets.get((request.path, request.service_path))
                if target is None:
                    headers = (
                        ("Fiware-Service", tenant),
                        ("Fiware-ServicePath", request.service_path),
                        ("Content-Type", "application/json"),
                    )
                    target = Target.parse(base + request.path, "POST", headers)
                    targets[(request.path, request.service_path)] = target
                correlator = b"Fiware-Correlator: %d\r\n" % (i * len(streams) + number)
                data = target.head(correlator, len(request.body)) + request.body
                sent = time.perf_counter()
                try:
                    status = await own.request(target, data, _REQUEST_TIMEOUT)
                except TransportError as exc:
                    tally.errors[type(exc).__name__] += 1
                    return
                tally.latencies.append(time.perf_counter() - sent)
                if status // 100 != 2:
                    tally.errors[str(status)] += 1
                    return  # the replay of the check needs each client's accepted prefix
                tally.done += 1
                tally.updates += len(request.readings)
                i += 1
        finally:
            await own.close()

    async def progress() -> None:
        previous, previous_posts = 0, posts_before
        while True:
            await asyncio.sleep(1.0)
            updates = sum(c.updates for c in clients)
            posts, _entities = await receiver.counts(http)
            _say(
                f"{time.perf_counter() - started:5.1f} s: {updates:,} updates "
                f"({updates - previous:,}/s), notifications {posts - previous_posts:,}/s"
            )
            previous, previous_posts = updates, posts

    ticker = asyncio.get_running_loop().create_task(progress())
    try:
        await asyncio.gather(*(publisher(n, s) for n, s in enumerate(streams)))
    finally:
        ticker.cancel()
    elapsed = time.perf_counter() - started
    posts, entities = await receiver.counts(http)
    report.requests = sum(c.done for c in clients)
    report.updates = sum(c.updates for c in clients)
    report.updates_per_s = round(report.updates / elapsed, 1)
    report.requests_per_s = round(report.requests / elapsed, 1)
    report.notifications_per_s = round((posts - posts_before) / elapsed, 1)
    report.notified_entities_per_s = round((entities - entities_before) / elapsed, 1)
    errors: Counter[str] = Counter()
    for client in clients:
        errors.update(client.errors)
    report.errors = dict(errors)
    latencies = np.array([x for c in clients for x in c.latencies]) * 1000.0
    if len(latencies):
        report.p50_ms = round(float(np.percentile(latencies, 50)), 2)
        report.p99_ms = round(float(np.percentile(latencies, 99)), 2)
    return [c.done for c in clients]


# -- requests and the expected notifications -----------------------------------------------


def _streams(pool: list[ContextUpdate], clients: int, batch: int) -> list[list[_Request]]:
    """Each client's requests: its districts' readings in pool order (see the module doc)."""
    district = {"/" + d: i for i, d in enumerate(DISTRICTS)}
    per_district: dict[str, list[int]] = {}
    for k, update in enumerate(pool):
        per_district.setdefault(update.service_path, []).append(k)
    streams: list[list[_Request]] = [[] for _ in range(clients)]
    if batch == 1:
        for k, update in enumerate(pool):
            body = {name: _attribute_json(update, name) for name in update.attributes}
            path = f"/v2/entities/{update.entity_id}/attrs?type={update.entity_type}"
            streams[district[update.service_path] % clients].append(
                _Request(path, update.service_path, json.dumps(body).encode(), (k,))
            )
        return streams
    chunks: list[list[_Request]] = [[] for _ in range(clients)]
    for service_path, readings in per_district.items():
        owner = district[service_path] % clients
        for start in range(0, len(readings), batch):
            chosen = tuple(readings[start : start + batch])
            entities = [_entity_json(pool[k]) for k in chosen]
            batched = {"actionType": "append", "entities": entities}
            chunks[owner].append(
                _Request("/v2/op/update", service_path, json.dumps(batched).encode(), chosen)
            )
    for owner, requests in enumerate(chunks):
        # Interleave the districts a client owns, each district's requests kept in order.
        by_path: dict[str, list[_Request]] = {}
        for request in requests:
            by_path.setdefault(request.service_path, []).append(request)
        lanes = list(by_path.values())
        for i in range(max(len(lane) for lane in lanes)):
            streams[owner] += [lane[i] for lane in lanes if i < len(lane)]
    return streams


def _attribute_json(update: ContextUpdate, name: str) -> dict[str, Any]:
    attribute = update.attributes[name]
    return {"type": attribute.type, "value": attribute.value}


def _entity_json(update: ContextUpdate) -> dict[str, Any]:
    entity: dict[str, Any] = {"id": update.entity_id, "type": update.entity_type}
    for name in update.attributes:
        entity[name] = _attribute_json(update, name)
    return entity


def _station(entity_id: str) -> int:
    """An entity's number in a notification's key: a station's (``urn:...:28079<n>``, n
    from 1) or a vehicle's."""
    if entity_id.startswith(FLEET_ID_PREFIX):
        return vehicle_number(entity_id)
    return int(entity_id.rsplit(":", 1)[1][5:]) - 1


def _expected(
    workload: _Workload, streams: list[list[_Request]], done: list[int], batch: int
) -> npt.NDArray[np.int64]:
    """Every notification key the accepted requests should have caused (sorted)."""
    pool = workload.pool
    cache = Entities(MemoryEngine())
    key_of: dict[str, tuple[str, str, str, str]] = {}
    for update in pool:  # the provisioned entities: as _provision made them
        key = ("", update.service_path, update.entity_id, update.entity_type)
        key_of[update.entity_id] = key
        created = {name: _attribute_json(update, name) for name in workload.created_with}
        made = parse_attributes(created, key_values=False)
        cache.apply_now([Intent(Mode.UPSERT, key[2], key[3], key[1], key[0], made)])
    parsed: dict[int, Attributes] = {}
    mode = Mode.APPEND if batch == 1 else Mode.UPSERT
    changed: list[ContextUpdate] = []
    bases: list[int] = []
    for number, (stream, count) in enumerate(zip(streams, done, strict=True)):
        for i in range(count):
            request = stream[i % len(stream)]
            rid = i * len(streams) + number
            for k in request.readings:
                update = pool[k]
                attributes = parsed.get(k)
                if attributes is None:
                    body = {name: _attribute_json(update, name) for name in update.attributes}
                    attributes = parsed[k] = parse_attributes(body, key_values=False)
                key = key_of[update.entity_id]
                (outcome,) = cache.apply_now(
                    [Intent(mode, key[2], key[3], key[1], key[0], attributes)]
                )
                if outcome.change is None or outcome.change.alteration not in _FIRES:
                    continue
                assert outcome.document is not None
                whole = outcome.document.attributes
                entity = to_wire(key[2], key[3], update.tenant, key[1], whole)
                changed.append(trusted_update(entity))
                bases.append(((rid << _STATION_BITS) + _station(key[2])) << _POSITION_BITS)
    if workload.places is not None:
        return _expected_near(workload.places, workload.meters, changed, bases)
    return _expected_matched(workload.subscriptions, changed, bases)


def _expected_near(
    places: list[tuple[float, float]],
    meters: float,
    changed: list[ContextUpdate],
    bases: list[int],
) -> npt.NDArray[np.int64]:
    """The keys of the geographical workload: every subscription selects every vehicle, so
    a changed vehicle notifies those whose circle holds its reading's point (the check's
    own haversine: :func:`broker.bench.workloads.fleet.within`)."""
    points = []
    for entity in changed:  # the whole entity's location: a geo:json Point, [lon, lat]
        lon, lat = entity.attributes["location"].value["coordinates"]
        points.append((float(lat), float(lon)))
    keys = [
        base + positions
        for base, positions in zip(bases, within(places, meters, points), strict=True)
        if len(positions)
    ]
    return np.sort(np.concatenate(keys)) if keys else np.zeros(0, dtype=np.int64)


def _expected_matched(
    subscriptions: list[Subscription], changed: list[ContextUpdate], bases: list[int]
) -> npt.NDArray[np.int64]:
    """The keys the in-process engine matches for the changed entities."""
    engine = Engine(subscriptions)
    position = np.full(2 * len(subscriptions) + 1, -1, dtype=np.int64)
    for i, subscription in enumerate(subscriptions):
        slot = engine.slot_of(subscription.id)
        if slot is not None:
            if slot >= len(position):
                position = np.resize(position, slot + 1)
            position[slot] = i
    keys = []
    step = 20_000
    now = time.time()
    for start in range(0, len(changed), step):
        matched = engine.match_batch_slots(changed[start : start + step], now=now)
        for base, slots in zip(bases[start : start + step], matched, strict=True):
            if len(slots):
                keys.append(base + position[slots])
    return np.sort(np.concatenate(keys)) if keys else np.zeros(0, dtype=np.int64)


def _compare(expected: npt.NDArray[np.int64], received: npt.NDArray[np.int64]) -> tuple[int, int]:
    """(missing, unexpected) between two multisets of keys."""
    want, want_count = np.unique(expected, return_counts=True)
    got, got_count = np.unique(received, return_counts=True)
    at = np.clip(np.searchsorted(want, got), 0, max(len(want) - 1, 0))
    found = (want[at] == got) if len(want) else np.zeros(len(got), dtype=bool)
    matched_count = np.where(found, np.minimum(got_count, want_count[at] if len(want) else 0), 0)
    matched = int(matched_count.sum())
    return len(expected) - matched, len(received) - matched


# -- the notification receiver --------------------------------------------------------------


_UNAVAILABLE = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"
_RESET = b""  # the receiver's answer to reset the connection instead


class _ReceiverProcess:
    """The notification receiver, in a process of its own (so it takes no publisher's CPU)."""

    def __init__(self, faults: float = 0.0, seed: int = 1) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._dir = tempfile.mkdtemp(prefix="silbo-ngsi-receiver-")
        context = multiprocessing.get_context("spawn")
        self._process = context.Process(
            target=_receive, args=(self.port, faults, seed), daemon=True
        )
        self._process.start()
        self.pid = self._process.pid or 0

    async def wait_ready(self, http: aiohttp.ClientSession, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                await self.counts(http)
                return
            except aiohttp.ClientError:
                if time.monotonic() > deadline or not self._process.is_alive():
                    raise
            await asyncio.sleep(0.1)

    async def counts(self, http: aiohttp.ClientSession) -> tuple[int, int]:
        """Notification requests received so far, and their data entities."""
        async with http.get(f"{self.url}/_counts") as answer:
            got = await answer.json()
        return int(got["posts"]), int(got["entities"])

    async def reset(self, http: aiohttp.ClientSession) -> None:
        """Forget the notifications received so far (a measurement's start)."""
        async with http.post(f"{self.url}/_reset") as answer:
            answer.raise_for_status()

    async def keys(self, http: aiohttp.ClientSession) -> npt.NDArray[np.int64]:
        """Every notification's key (see ``_STATION_BITS``), in arrival order."""
        path = str(Path(self._dir) / "keys.npy")
        async with http.get(f"{self.url}/_keys", params={"path": path}) as answer:
            answer.raise_for_status()
        keys: npt.NDArray[np.int64] = np.load(path)
        return keys

    def stop(self) -> None:
        if self._process.is_alive():
            self._process.terminate()
        self._process.join(10)


def _receive(port: int, faults: float = 0.0, seed: int = 1) -> None:
    """The receiver process: serve until terminated (a bare HTTP/1.1 server on asyncio, so
    that taking a notification costs it little of the machine the front runs on); a share
    ``faults`` of the notification requests is not taken (503, or the connection reset)."""
    keys: list[int] = []
    counts = {"posts": 0, "entities": 0, "other": 0, "faults": 0}
    chance = random.Random(seed)

    def notification(path: bytes, correlator: bytes, body: bytes) -> None:
        data = json.loads(body).get("data", [])
        counts["posts"] += 1
        counts["entities"] += len(data)
        request = correlator.split(b";", 1)[0].strip()
        if request.isdigit() and data:
            station = _station(data[0]["id"])
            position = int(path.rsplit(b"/", 1)[1])
            keys.append(((int(request) << _STATION_BITS) + station) << _POSITION_BITS | position)
        else:
            counts["other"] += 1

    def answer(method: bytes, target: bytes, correlator: bytes, body: bytes) -> bytes:
        path, _, query = target.partition(b"?")
        if method == b"POST" and path.startswith(b"/n/"):
            if faults and chance.random() < faults:
                counts["faults"] += 1
                return _RESET if counts["faults"] % 2 else _UNAVAILABLE
            notification(path, correlator, body)
            return b"HTTP/1.1 204 No Content\r\n\r\n"
        if path == b"/_counts":
            text = json.dumps(counts).encode()
            head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d"
            return head % len(text) + b"\r\n\r\n" + text
        if path == b"/_reset":
            keys.clear()
            counts.update(dict.fromkeys(counts, 0))
            return b"HTTP/1.1 204 No Content\r\n\r\n"
        if path == b"/_keys":
            where = parse_qs(query.decode())["path"][0]
            np.save(where, np.array(keys, dtype=np.int64))
            return b"HTTP/1.1 204 No Content\r\n\r\n"
        return b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"

    class Connection(asyncio.Protocol):
        def __init__(self) -> None:
            self.buffer = bytearray()
            self.transport: asyncio.Transport | None = None

        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            buffer = self.buffer
            buffer += data
            out = []
            while (end := buffer.find(b"\r\n\r\n")) >= 0:
                lines = bytes(buffer[:end]).split(b"\r\n")
                length, correlator = 0, b""
                for line in lines[1:]:
                    name, _, value = line.partition(b":")
                    name = name.lower()
                    if name == b"content-length":
                        length = int(value)
                    elif name == b"fiware-correlator":
                        correlator = value
                if len(buffer) < end + 4 + length:
                    break
                body = bytes(buffer[end + 4 : end + 4 + length])
                del buffer[: end + 4 + length]
                method, target, _version = lines[0].split(b" ", 2)
                answered = answer(method, target, correlator, body)
                if not answered:  # _RESET
                    buffer.clear()
                    if self.transport is not None:
                        self.transport.abort()
                    return
                out.append(answered)
            if out and self.transport is not None:
                self.transport.write(b"".join(out))

    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(Connection, "127.0.0.1", port)
        await server.serve_forever()

    asyncio.run(serve())


# -- reporting ------------------------------------------------------------------------------


def _median(reports: list[NgsiReport]) -> NgsiReport:
    if len(reports) == 1:
        return reports[0]
    median = NgsiReport(**{**asdict(reports[0]), "without_geo": None})
    for key in (
        "updates_per_s",
        "requests_per_s",
        "p50_ms",
        "p99_ms",
        "notifications_per_s",
        "notified_entities_per_s",
        "subscribe_per_s",
    ):
        setattr(median, key, round(statistics.median(getattr(r, key) for r in reports), 2))
    errors: Counter[str] = Counter()
    for report in reports:
        errors.update(report.errors)
    median.errors = dict(errors)
    for key in ("requests", "updates", "notifications", "notified_entities", "expected", "dropped"):
        setattr(median, key, sum(getattr(r, key) for r in reports))
    for key in ("received", "missing", "unexpected"):
        setattr(median, key, sum(getattr(r, key) for r in reports))
    median.drain_s = max(r.drain_s for r in reports)
    baselines = [r.without_geo for r in reports if r.without_geo is not None]
    if baselines:
        median.without_geo = _median(baselines)
    return median


_TITLES = {
    "iot": "W-IoT",
    "geo": "W-fleet, near circles (geo)",
    "no-geo": "W-fleet, the same circles as q boxes (no geo)",
}


def _print(report: NgsiReport) -> None:
    mode = "POST /v2/entities/{id}/attrs" if report.batch == 1 else "POST /v2/op/update"
    print(
        f"{_TITLES[report.workload]} over NGSI v2 HTTP, {report.subscriptions:,} subscriptions, "
        f"{report.clients} clients, {mode} of {report.batch}\n"
        f"  updates: {report.updates:,} at {report.updates_per_s:,.0f}/s "
        f"({report.requests_per_s:,.0f} requests/s), errors {report.errors or 'none'}\n"
        f"  request latency: p50 {report.p50_ms} ms, p99 {report.p99_ms} ms\n"
        f"  notifications: {report.notifications_per_s:,.0f} POSTs/s while publishing "
        f"({report.notified_entities_per_s:,.0f} entities/s); {report.notifications:,} in all "
        f"after {report.drain_s} s of drain\n"
        f"  check: expected {report.expected:,}, received {report.received:,}, "
        f"missing {report.missing:,} (dropped or still queued; {report.dropped:,} dropped), "
        f"unexpected {report.unexpected}\n"
        f"  CPU us per update while publishing: {report.cpu_us_per_update}"
    )
    baseline = report.without_geo
    if baseline is not None:
        _print(baseline)
        print(
            f"geo against no geo: updates/s x{_ratio(report.updates_per_s, baseline.updates_per_s)}"
            f", notifications/s x{_ratio(report.notifications_per_s, baseline.notifications_per_s)}"
            f", p99 x{_ratio(report.p99_ms, baseline.p99_ms)}"
        )


def _ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "-"


def _cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds (user + system) each process has used, this one's as ``bench``."""
    tick = os.sysconf("SC_CLK_TCK")
    used = {"bench": sum(os.times()[:2])}
    for name, pid in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone, or not Linux
        used[name] = (int(fields[11]) + int(fields[12])) / tick
    return used


def _children(pids: dict[str, int]) -> dict[str, int]:
    """The child processes of those named (a connection point's notification worker), as
    ``<name>/<pid>`` (Linux; none elsewhere)."""
    found = {}
    for name, pid in pids.items():
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            continue
        found.update({f"{name}/{child}": int(child) for child in children})
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _say(message: str) -> None:
    print(f"[bench ngsi] {message}", file=sys.stderr, flush=True)
