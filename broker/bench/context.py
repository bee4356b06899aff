"""``silbo bench context``: the context store layer, through its processes (issue 17).

    silbo bench context [--stores 1,2,4] [--clients C] [--batch B] [--in-flight F]
                        [--duration S] [--windows K] [--write-entities N]
                        [--http-batch B] [--http-clients C] [--reads R]
                        [--query-entities N] [--query-runs K] [--entities N]
                        [--history on|off] [--archive on|off]
                        [--quick] [--dir DIR] [--profile DIR] [--json] [--plot FILE.png]

Every figure is measured on real processes: for each count n of ``--stores`` a local cluster
(embedded ZooKeeper, n ``silbo run context-store`` processes on RocksDB, one matcher, one
access point, one exit point, one connection point serving HTTP) is started in a temporary
state directory under ``--dir``, measured, stopped and removed. Entities are W-IoT stations
(broker.bench.storage: 10 attributes each, in 21 district service paths).

1. **Durable writes per store** (every cluster): ``--write-entities`` entities are loaded
   (tenant ``benchw``), then ``--clients`` driver processes each keep ``--in-flight`` calls
   per store of ``ContextStore.Apply``, each an upsert of all 10 attributes of ``--batch``
   existing entities of that store (new values: a write that changes nothing commits
   nothing, so the share of ``modified`` writes is reported), routed by partition as a
   front routes them. After a warm-up, ``--windows`` windows of ``--duration`` seconds:
   writes/s (median of the windows), per store process, call latency p50 / p99, and the
   cores used meanwhile by the stores, the drivers and the rest of the machine.
2. **Through one front** (the first cluster, 1 store by default): ``POST /v2/op/update``
   (append) batches of ``--http-batch`` entities of one district, ``--http-clients`` at a
   time, as fast as answered: writes/s and request p50 / p99. Then GET one entity
   (``/v2/entities/{id}?type=``, random entities, one at a time) ``--reads`` times idle, and
   again while a driver writes through the front at half the measured rate: p50 / p99 / max.
3. **List query with q**: ``--query-entities`` entities loaded (tenant ``benchq``), then
   ``GET /v2/entities?type=AirQualityObserved&q=NO2>70&limit=100`` (about 12% match) and the
   same with ``options=count``, ``--query-runs`` times each after one untimed run: the median
   ms; and the store's own part of the count query, asked over gRPC (no front): the median.
4. **Memory**: the store loaded up to ``--entities`` entities (0: skipped) through ``Apply``
   in batches of 500; the store process's resident set (and its anonymous part: the heap;
   the rest is mapped files) after the load and after a scan of them all (the count query
   over gRPC, timed), and the bytes its directory takes on disk.

``--quick`` is a smoke run (1 and 2 stores, thousands of entities, seconds per phase).
``--profile DIR`` runs the cluster's processes under cProfile (``SILBO_PROFILE``: one
``<role>-<pid>.prof`` each in DIR, written when the cluster stops).
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Final
from urllib.parse import quote

import grpc
import numpy as np
import psutil

from broker.bench.clusters import add_dir_option, store_cluster, wait_serving
from broker.bench.context_load import (
    CALL_TIMEOUT,
    FrontJob,
    StoreJob,
    drive_front,
    drive_stores,
    holders,
    load_entities,
    store_addresses,
)
from broker.bench.match import machine_info, non_negative, positive
from broker.bench.storage import (
    counts_argument,
    iot_entity_id,
    iot_service_path,
    seconds_argument,
)
from broker.bench.workloads.iot import IOT_TYPE
from broker.cluster import LocalCluster
from broker.extras import require
from broker.runtime.link import CHANNEL_OPTIONS
from broker.runtime.options import Role
from broker.store.layout import StoreLayout
from broker.store.query import EntityQuery, Selector
from broker.store.reading import ENTITIES, query_body
from broker.store.wire import unpack
from broker.wire import internal_pb2 as wire
from broker.wire import internal_pb2_grpc as wire_grpc

__all__ = ["TARGETS", "configure", "run"]

WRITE_TENANT: Final = "benchw"
QUERY_TENANT: Final = "benchq"
Q: Final = "NO2>70"
QUERY_LIMIT: Final = 100
# The spec's figures to reach (spec/context-store.md).
TARGETS: Final = {
    "writes_per_store_per_s": 20_000.0,
    "get_p99_ms_at_half_load": 5.0,
    "query_ms": 100.0,
    "rss_mb_1m_entities": 300.0,
}
_MB: Final = 1 << 20
_PARAMETERS: Final = (
    "stores",
    "clients",
    "batch",
    "in_flight",
    "duration",
    "windows",
    "warmup",
    "write_entities",
    "http_batch",
    "http_clients",
    "reads",
    "query_entities",
    "query_runs",
    "entities",
    "history",
    "archive",
    "seed",
)


@dataclass(slots=True)
class StoreWrites:
    """Durable writes through ``ContextStore.Apply`` to ``stores`` store processes."""

    stores: int
    writes_per_s: float = 0.0  # the median of the windows
    writes_per_store_per_s: float = 0.0
    window_writes_per_s: list[float] = field(default_factory=list)
    by_store_per_s: dict[str, float] = field(default_factory=dict)  # over all windows
    modified_share: float = 0.0
    errors: int = 0
    call_p50_ms: float = 0.0
    call_p99_ms: float = 0.0
    cores_stores: float = 0.0  # CPU seconds per second while measured
    writes_per_store_cpu_s: float = 0.0  # writes per CPU second of the stores: what a core gives
    cores_drivers: float = 0.0
    cores_machine: float = 0.0  # every process of the machine (other sessions' too)
    load_entities_per_s: float = 0.0


@dataclass(slots=True)
class FrontFigures:
    """Writes and GETs through one HTTP front."""

    stores: int = 1
    writes_per_s: float = 0.0
    window_writes_per_s: list[float] = field(default_factory=list)
    request_p50_ms: float = 0.0
    request_p99_ms: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    cores_machine: float = 0.0
    get_idle: dict[str, float] = field(default_factory=dict)  # p50_ms, p99_ms, max_ms, reads
    background_writes_per_s: float = 0.0  # what the half-load writer achieved
    get_half_load: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class QueryFigures:
    """A list query with ``q`` over ``entities`` entities."""

    entities: int = 0
    matching: int = 0
    limit_ms: float = 0.0  # median, through the front
    count_ms: float = 0.0
    store_part_ms: float = 0.0  # the store's part of the count query, over gRPC
    runs_limit_ms: list[float] = field(default_factory=list)
    runs_count_ms: list[float] = field(default_factory=list)
    runs_store_part_ms: list[float] = field(default_factory=list)


@dataclass(slots=True)
class MemoryFigures:
    """One store process holding ``entities`` entities."""

    entities: int = 0
    load_s: float = 0.0
    load_entities_per_s: float = 0.0
    rss_start_mb: float = 0.0
    rss_loaded_mb: float = 0.0
    rss_anon_loaded_mb: float = 0.0
    scan_s: float = 0.0
    scan_matching: int = 0
    rss_after_scan_mb: float = 0.0
    rss_anon_after_scan_mb: float = 0.0
    disk_mb: float = 0.0


@dataclass(slots=True)
class _Running:
    """A started cluster, as the bench uses it."""

    cluster: LocalCluster
    layout: StoreLayout
    addresses: dict[str, str]  # store id: gRPC address
    pids: dict[str, int]  # store id: process id
    base: str  # the front's HTTP base URL
    state_dir: Path


# -- the clusters ------------------------------------------------------------------------------


@contextmanager
def _cluster(args: argparse.Namespace, stores: int) -> Iterator[_Running]:
    """A local cluster of ``stores`` context stores and one HTTP front, removed afterwards."""

    def archive(state: Path) -> dict[str, Any]:
        return {
            "archive": str(state / "archive") if args.archive == "on" else "",
            "archive_interval": 2.0,  # batches while the windows run: pulls and trims cost too
        }

    with store_cluster(args, "context", stores, _say, archive) as started:
        cluster, described = started
        layout, addresses = store_addresses(cluster.zk_address, cluster.spec.cluster)
        internal = {
            p["internal"]: int(p["pid"])
            for p in described["processes"]
            if p["role"] == Role.CONTEXT_STORE.value
        }
        pids = {store: internal[address] for store, address in addresses.items()}
        base = f"http://{described['http_endpoints'][0]}"
        wait_serving(base)
        yield _Running(cluster, layout, addresses, pids, base, cluster.state_dir)


# -- 1. durable writes per store -----------------------------------------------------------------


def _store_writes(args: argparse.Namespace, running: _Running) -> StoreWrites:
    figures = StoreWrites(stores=len(running.addresses))
    figures.load_entities_per_s = args.write_entities / _load(
        args, running, WRITE_TENANT, 0, args.write_entities
    )
    by_store = holders(running.layout, WRITE_TENANT, args.write_entities)
    jobs = [
        StoreJob(
            number=n,
            tenant=WRITE_TENANT,
            addresses=running.addresses,
            entities={s: entities[n :: args.clients] for s, entities in by_store.items()},
            batch=args.batch,
            in_flight=args.in_flight,
            seed=args.seed,
            start_at=0.0,  # set once the drivers are up
            warmup=args.warmup,
            duration=args.duration,
            windows=args.windows,
        )
        for n in range(args.clients)
    ]
    _say(
        args,
        f"{figures.stores} store(s): {args.clients} drivers x {args.in_flight} calls in flight "
        f"per store, batches of {args.batch}, {args.windows} windows of {args.duration:g} s",
    )
    results, cores, _ = _measured(args, drive_stores, jobs, list(running.pids.values()))
    figures.cores_stores, figures.cores_drivers, figures.cores_machine = cores
    seconds = args.duration
    totals = [0.0] * args.windows
    for store in running.addresses:
        per_window = [
            sum(r["counts"][f"writes:{store}"][w] for r in results) for w in range(args.windows)
        ]
        figures.by_store_per_s[store] = round(sum(per_window) / (seconds * args.windows), 1)
        totals = [t + c for t, c in zip(totals, per_window, strict=True)]
    figures.window_writes_per_s = [round(t / seconds, 1) for t in totals]
    figures.writes_per_s = round(statistics.median(figures.window_writes_per_s), 1)
    figures.writes_per_store_per_s = round(figures.writes_per_s / figures.stores, 1)
    if figures.cores_stores > 0:
        figures.writes_per_store_cpu_s = round(figures.writes_per_s / figures.cores_stores, 1)
    written = sum(totals)
    figures.modified_share = round(
        sum(sum(r["counts"]["modified"]) for r in results) / max(written, 1), 4
    )
    figures.errors = sum(sum(r["counts"]["errors"]) for r in results)
    latencies = [x for r in results for x in r["latencies"]]
    figures.call_p50_ms, figures.call_p99_ms = _percentiles(latencies, (50, 99))
    _say(
        args,
        f"{figures.stores} store(s): {figures.writes_per_s:,.0f} writes/s "
        f"({figures.writes_per_store_per_s:,.0f} per store, "
        f"{figures.writes_per_store_cpu_s:,.0f} per store CPU second), calls p50 "
        f"{figures.call_p50_ms:.1f} / p99 {figures.call_p99_ms:.1f} ms; cores: stores "
        f"{figures.cores_stores:.2f}, drivers {figures.cores_drivers:.2f}, machine "
        f"{figures.cores_machine:.2f}",
    )
    return figures


def _measured(
    args: argparse.Namespace,
    driver: Callable[[Any], dict[str, Any]],
    jobs: list[Any],
    watched: list[int],
    during: Callable[[float], Any] | None = None,
) -> tuple[list[dict[str, Any]], tuple[float, float, float], Any]:
    """Run ``driver`` on each job (a StoreJob or FrontJob) in a process of its own, all
    starting together once every process is up; their results, the cores used over the
    measured windows by ``watched``, by the drivers and by the machine, and what ``during``
    (run here from the first window on, given the end of the last) returned."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=len(jobs), mp_context=context) as pool:
        for ready in [pool.submit(_ready, len(jobs)) for _ in jobs]:
            ready.result()  # the interpreters have started and imported the drivers
        start_at = time.time() + 1.0
        jobs = [replace(job, start_at=start_at) for job in jobs]
        futures = [pool.submit(driver, job) for job in jobs]
        drivers = [psutil.Process(p) for p in _pool_pids(pool)]
        begin = start_at + args.warmup
        end = begin + args.windows * args.duration
        time.sleep(max(0.0, begin - time.time()))
        before = _cpu(watched, drivers)
        extra = during(end) if during is not None else None
        time.sleep(max(0.0, end - time.time()))
        after = _cpu(watched, drivers)
        results = [f.result() for f in futures]
    seconds = args.windows * args.duration
    cores = tuple(round((a - b) / seconds, 2) for a, b in zip(after, before, strict=True))
    return results, (cores[0], cores[1], cores[2]), extra


def _ready(workers: int) -> None:
    """A no-op task that holds its process a moment, so that every worker gets one."""
    time.sleep(0.2 * workers)


def _pool_pids(pool: ProcessPoolExecutor) -> list[int]:
    processes = getattr(pool, "_processes", None) or {}
    return list(processes)


def _cpu(watched: list[int], drivers: list[psutil.Process]) -> tuple[float, float, float]:
    """CPU seconds so far of the watched processes, of the drivers and of the machine."""

    def used(process: psutil.Process) -> float:
        try:
            times = process.cpu_times()
        except psutil.Error:
            return 0.0
        return float(times.user + times.system)

    machine = psutil.cpu_times()
    busy = sum(machine) - machine.idle - getattr(machine, "iowait", 0.0)
    return (
        sum(used(psutil.Process(p)) for p in watched),
        sum(used(d) for d in drivers),
        busy,
    )


# -- 2. through one front ----------------------------------------------------------------------


def _front(args: argparse.Namespace, running: _Running) -> FrontFigures:
    figures = FrontFigures(stores=len(running.addresses))
    _say(args, f"front: op/update batches of {args.http_batch}, {args.http_clients} clients")
    results, cores, _ = _measured(args, drive_front, [_front_job(args, running, 0.0)], [])
    figures.cores_machine = cores[2]
    counts = results[0]["counts"]
    figures.window_writes_per_s = [round(w / args.duration, 1) for w in counts["writes"]]
    figures.writes_per_s = round(statistics.median(figures.window_writes_per_s), 1)
    figures.request_p50_ms, figures.request_p99_ms = _percentiles(results[0]["latencies"], (50, 99))
    figures.errors = results[0]["statuses"]
    _say(
        args,
        f"front: {figures.writes_per_s:,.0f} writes/s, requests p50 {figures.request_p50_ms:.1f} "
        f"/ p99 {figures.request_p99_ms:.1f} ms, errors {figures.errors or 0}",
    )
    figures.get_idle = _gets(args, running, args.reads)
    _say(args, f"GET idle: {_latency_text(figures.get_idle)}")
    if figures.writes_per_s > 0:
        half = figures.writes_per_s / 2
        results, _, figures.get_half_load = _measured(
            args,
            drive_front,
            [_front_job(args, running, half)],
            [],
            lambda end: _gets(args, running, args.reads, end),
        )
        written = sum(results[0]["counts"]["writes"])
        figures.background_writes_per_s = round(written / (args.duration * args.windows), 1)
        _say(
            args,
            f"GET at half load ({figures.background_writes_per_s:,.0f} writes/s): "
            f"{_latency_text(figures.get_half_load)}",
        )
    return figures


def _front_job(args: argparse.Namespace, running: _Running, rate: float) -> FrontJob:
    return FrontJob(
        base=running.base,
        tenant=WRITE_TENANT,
        entities=args.write_entities,
        batch=args.http_batch,
        concurrency=args.http_clients if rate == 0 else 2,
        rate=rate,
        seed=args.seed,
        start_at=0.0,  # set once the driver is up
        warmup=args.warmup,
        duration=args.duration,
        windows=args.windows,
    )


def _gets(
    args: argparse.Namespace, running: _Running, reads: int, end: float = float("inf")
) -> dict[str, float]:
    """GETs of random entities, one at a time, until ``end`` (wall clock) at the latest:
    their latency percentiles."""
    rng = np.random.default_rng([args.seed, 5])
    picks = rng.integers(0, args.write_entities, size=reads).tolist()
    host, port = running.base.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    latencies = []
    try:
        for i in picks:
            if time.time() > end:
                break
            path = f"/v2/entities/{quote(iot_entity_id(i), safe='')}?type={IOT_TYPE}"
            headers = {"Fiware-Service": WRITE_TENANT, "Fiware-ServicePath": iot_service_path(i)}
            started = time.perf_counter()
            connection.request("GET", path, headers=headers)
            answer = connection.getresponse()
            answer.read()
            latencies.append(time.perf_counter() - started)
            if answer.status != 200:
                raise RuntimeError(f"GET {path}: {answer.status}")
    finally:
        connection.close()
    p50, p90, p99 = _percentiles(latencies, (50, 90, 99))
    return {
        "reads": len(latencies),
        "p50_ms": p50,
        "p90_ms": p90,
        "p99_ms": p99,
        "max_ms": round(max(latencies, default=0.0) * 1000, 3),
    }


# -- 3. a list query with q --------------------------------------------------------------------


def _query(args: argparse.Namespace, running: _Running) -> QueryFigures:
    figures = QueryFigures(entities=args.query_entities)
    _load(args, running, QUERY_TENANT, 0, args.query_entities)
    path = f"/v2/entities?type={IOT_TYPE}&q={quote(Q)}&limit={QUERY_LIMIT}"
    headers = {"Fiware-Service": QUERY_TENANT, "Fiware-ServicePath": "/#"}
    for n in range(args.query_runs + 1):  # the first is untimed
        took, got, _ = _timed_get(running.base, path, headers)
        counted, _, total = _timed_get(running.base, path + "&options=count", headers)
        part, matching = _store_count(running, QUERY_TENANT)
        if got != min(QUERY_LIMIT, matching) or total != matching:
            raise RuntimeError(
                f"the q query gave {got} entities and a count of {total}; the stores count "
                f"{matching}"
            )
        figures.matching = matching
        if n:
            figures.runs_limit_ms.append(round(took * 1000, 2))
            figures.runs_count_ms.append(round(counted * 1000, 2))
            figures.runs_store_part_ms.append(round(part * 1000, 2))
    figures.limit_ms = round(statistics.median(figures.runs_limit_ms), 2)
    figures.count_ms = round(statistics.median(figures.runs_count_ms), 2)
    figures.store_part_ms = round(statistics.median(figures.runs_store_part_ms), 2)
    _say(
        args,
        f"q over {args.query_entities:,} entities ({figures.matching:,} match): limit "
        f"{figures.limit_ms:,.0f} ms, count {figures.count_ms:,.0f} ms, the stores' parts "
        f"{figures.store_part_ms:,.0f} ms",
    )
    return figures


def _timed_get(base: str, path: str, headers: dict[str, str]) -> tuple[float, int, int]:
    """(seconds, entities answered, Fiware-Total-Count or -1) of one GET."""
    started = time.perf_counter()
    status, answered, body = _http(base, path, headers)
    took = time.perf_counter() - started
    if status != 200:
        raise RuntimeError(f"GET {path}: {status} {body[:300]!r}")
    return took, len(json.loads(body)), int(answered.get("Fiware-Total-Count", -1))


def _store_count(running: _Running, tenant: str) -> tuple[float, int]:
    """(seconds, count) of the q count query asked of every store over gRPC, in parallel."""
    query = EntityQuery(
        tenant=tenant,
        scopes=("/#",),
        selectors=(Selector(type=IOT_TYPE),),
        q=Q,
        limit=QUERY_LIMIT,
        count=True,
    )
    body = query_body(ENTITIES, query.to_wire(), None)  # each store: its primary partitions

    async def ask() -> int:
        channels = [
            grpc.aio.insecure_channel(a, options=CHANNEL_OPTIONS)
            for a in running.addresses.values()
        ]
        try:
            stubs = [wire_grpc.ContextStoreStub(c) for c in channels]  # type: ignore[no-untyped-call]
            answers = await asyncio.gather(
                *(s.Query(wire.StoreRequest(body=body), timeout=CALL_TIMEOUT) for s in stubs)
            )
            return sum(int(unpack(a.body)["count"]) for a in answers)
        finally:
            for channel in channels:
                await channel.close()

    started = time.perf_counter()
    count = asyncio.run(ask())
    return time.perf_counter() - started, count


# -- 4. memory ---------------------------------------------------------------------------------


def _memory(args: argparse.Namespace, running: _Running, start_rss: float) -> MemoryFigures:
    figures = MemoryFigures(entities=args.entities, rss_start_mb=start_rss)
    have = args.query_entities
    if args.entities > have:
        took = _load(args, running, QUERY_TENANT, have, args.entities - have)
        figures.load_s = round(took, 1)
        figures.load_entities_per_s = round((args.entities - have) / took, 1)
    pid = next(iter(running.pids.values()))
    figures.rss_loaded_mb, figures.rss_anon_loaded_mb = _rss_mb(pid)
    _say(args, f"store RSS with {args.entities:,} entities: {figures.rss_loaded_mb:,.0f} MB")
    figures.scan_s, figures.scan_matching = _store_count(running, QUERY_TENANT)
    figures.scan_s = round(figures.scan_s, 2)
    figures.rss_after_scan_mb, figures.rss_anon_after_scan_mb = _rss_mb(pid)
    store_dir = running.state_dir / "stores"
    figures.disk_mb = round(
        sum(p.stat().st_blocks * 512 for p in store_dir.rglob("*") if p.is_file()) / _MB, 1
    )
    _say(
        args,
        f"scan of {args.entities:,} entities (q count) in {figures.scan_s:.1f} s; RSS after "
        f"{figures.rss_after_scan_mb:,.0f} MB (anon {figures.rss_anon_after_scan_mb:,.0f})",
    )
    return figures


def _rss_mb(pid: int) -> tuple[float, float]:
    """(resident set, its anonymous part) of process ``pid``, in MB."""
    info = psutil.Process(pid).memory_info()
    shared = int(getattr(info, "shared", 0))
    return round(info.rss / _MB, 1), round(max(info.rss - shared, 0) / _MB, 1)


# -- helpers -----------------------------------------------------------------------------------


def _load(
    args: argparse.Namespace, running: _Running, tenant: str, start: int, count: int
) -> float:
    """Load entities through Apply (untimed phase); the seconds it took."""
    _say(args, f"loading {count:,} entities into tenant {tenant}")
    return asyncio.run(
        load_entities(
            running.addresses,
            running.layout,
            tenant,
            start,
            count,
            args.seed,
            lambda message: _say(args, message),
        )
    )


def _http(base: str, path: str, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
    host, port = base.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=CALL_TIMEOUT)
    try:
        connection.request("GET", path, headers=headers)
        answer = connection.getresponse()
        return answer.status, dict(answer.getheaders()), answer.read()
    finally:
        connection.close()


def _percentiles(seconds: list[float], which: tuple[int, ...]) -> tuple[float, ...]:
    if not seconds:
        return tuple(0.0 for _ in which)
    return tuple(round(float(np.percentile(seconds, p)) * 1000, 3) for p in which)


def _latency_text(figures: dict[str, float]) -> str:
    return (
        f"p50 {figures['p50_ms']:.2f} / p99 {figures['p99_ms']:.2f} / max "
        f"{figures['max_ms']:.1f} ms over {figures['reads']:,.0f} reads"
    )


def _say(args: argparse.Namespace, message: str) -> None:
    if not args.quiet:
        print(f"[bench context] {message}", file=sys.stderr, flush=True)


# -- the report --------------------------------------------------------------------------------


def benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """Every phase of the module doc; the summary the command prints."""
    writes: list[StoreWrites] = []
    front = query = memory = None
    for number, stores in enumerate(args.stores):
        with _cluster(args, stores) as running:
            start_rss = _rss_mb(next(iter(running.pids.values())))[0]
            writes.append(_store_writes(args, running))
            if number == 0:
                front = _front(args, running)
                query = _query(args, running)
                if args.entities and stores == 1:
                    memory = _memory(args, running, start_rss)
    summary: dict[str, Any] = {
        "parameters": {name: getattr(args, name) for name in _PARAMETERS},
        "writes": [asdict(w) for w in writes],
        "front": asdict(front) if front is not None else None,
        "query": asdict(query) if query is not None else None,
        "memory": asdict(memory) if memory is not None else None,
        "machine": machine_info(),
        "command": getattr(args, "command_line", ""),
    }
    summary["targets"] = _targets(summary)
    return summary


def _targets(summary: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each figure of the spec against its target: the measured value and whether it is met."""
    out: dict[str, dict[str, Any]] = {}

    def judge(name: str, value: float | None, within: Callable[[float, float], bool]) -> None:
        target = TARGETS[name]
        out[name] = {
            "target": target,
            "measured": value,
            "met": None if value is None else within(value, target),
        }

    one = next((w for w in summary["writes"] if w["stores"] == 1), None)
    judge("writes_per_store_per_s", one and one["writes_per_store_per_s"], lambda v, t: v >= t)
    front = summary["front"]
    p99 = front["get_half_load"].get("p99_ms") if front else None
    judge("get_p99_ms_at_half_load", p99, lambda v, t: v <= t)
    query = summary["query"]
    worst = max(query["limit_ms"], query["count_ms"]) if query else None
    judge("query_ms", worst, lambda v, t: v <= t)
    memory = summary["memory"]
    rss = max(memory["rss_loaded_mb"], memory["rss_after_scan_mb"]) if memory else None
    judge("rss_mb_1m_entities", rss, lambda v, t: v <= t)
    return out


def _print(summary: dict[str, Any]) -> None:
    print("stores  writes/s  per store  call p50/p99 ms  modified  cores stores/drivers/machine")
    for w in summary["writes"]:
        print(
            f"{w['stores']:>6}  {w['writes_per_s']:>8,.0f}  {w['writes_per_store_per_s']:>9,.0f}  "
            f"{w['call_p50_ms']:>6.1f} / {w['call_p99_ms']:<6.1f}  {w['modified_share']:>8.1%}  "
            f"{w['cores_stores']:.2f} / {w['cores_drivers']:.2f} / {w['cores_machine']:.2f}"
        )
    front = summary["front"]
    if front:
        print(
            f"front: {front['writes_per_s']:,.0f} writes/s (op/update), requests p50 "
            f"{front['request_p50_ms']:.1f} / p99 {front['request_p99_ms']:.1f} ms"
        )
        print(f"GET idle: {_latency_text(front['get_idle'])}")
        if front["get_half_load"]:
            print(
                f"GET at half load ({front['background_writes_per_s']:,.0f} writes/s): "
                f"{_latency_text(front['get_half_load'])}"
            )
    query = summary["query"]
    if query:
        print(
            f"q {Q} over {query['entities']:,} entities ({query['matching']:,} match): limit "
            f"{QUERY_LIMIT} {query['limit_ms']:,.1f} ms, options=count {query['count_ms']:,.1f} "
            f"ms, the stores' parts {query['store_part_ms']:,.1f} ms (medians)"
        )
    memory = summary["memory"]
    if memory:
        print(
            f"store with {memory['entities']:,} entities: RSS {memory['rss_loaded_mb']:,.0f} MB "
            f"(anon {memory['rss_anon_loaded_mb']:,.0f}), after a scan "
            f"{memory['rss_after_scan_mb']:,.0f} MB (anon {memory['rss_anon_after_scan_mb']:,.0f}"
            f"), scan {memory['scan_s']:.1f} s, disk {memory['disk_mb']:,.0f} MB"
        )
    for name, judged in summary["targets"].items():
        verdict = {True: "met", False: "NOT met", None: "not measured"}[judged["met"]]
        print(f"target {name}: {judged['target']:,g}, measured {judged['measured']}: {verdict}")


def plot(summary: dict[str, Any], path: Path, title: str) -> None:
    """Write the summary as a PNG: writes/s by stores, GET latency, query times."""
    require("bench", "the plot of silbo bench context")
    from matplotlib.figure import Figure

    figure = Figure(figsize=(13, 4.5), layout="constrained")
    writes, gets, queries = figure.subplots(1, 3)
    rows = summary["writes"]
    x = np.arange(len(rows))
    writes.bar(x - 0.2, [w["writes_per_s"] for w in rows], 0.4, label="all stores", color="C0")
    writes.bar(
        x + 0.2, [w["writes_per_store_per_s"] for w in rows], 0.4, label="per store", color="C1"
    )
    writes.axhline(TARGETS["writes_per_store_per_s"], color="C3", ls="--", label="target per store")
    writes.set_xticks(x, [str(w["stores"]) for w in rows])
    writes.set_xlabel("context store processes")
    writes.set_ylabel("durable writes/s (Apply, 10 attributes)")
    writes.legend(fontsize=8)
    front = summary["front"]
    if front:
        names = ["p50_ms", "p90_ms", "p99_ms"]
        for n, (label, figures) in enumerate(
            (("idle", front["get_idle"]), ("half load", front["get_half_load"]))
        ):
            if figures:
                gets.bar(
                    np.arange(3) + (n - 0.5) * 0.4, [figures[k] for k in names], 0.4,
                    label=label, color=f"C{n + 2}",
                )  # fmt: skip
        gets.axhline(TARGETS["get_p99_ms_at_half_load"], color="C3", ls="--", label="target p99")
        gets.set_xticks(range(3), ["p50", "p90", "p99"])
        gets.set_ylabel("GET one entity through one front (ms)")
        gets.legend(fontsize=8)
    query = summary["query"]
    if query:
        labels = ["limit 100", "count", "stores' part"]
        values = [query["limit_ms"], query["count_ms"], query["store_part_ms"]]
        queries.bar(range(3), values, 0.6, color="C4")
        queries.axhline(TARGETS["query_ms"], color="C3", ls="--", label="target")
        queries.set_xticks(range(3), labels)
        queries.set_ylabel(f"q {Q} over {query['entities']:,} entities (ms, median)")
        queries.legend(fontsize=8)
    figure.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)


# -- the command -------------------------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``bench context`` options to ``parser`` and make it run :func:`run`."""
    add = parser.add_argument
    add(
        "--stores",
        type=counts_argument,
        metavar="N[,N]",
        help="store counts, in turn (default 1,2,4)",
    )
    add("--clients", type=positive, default=2, help="Apply driver processes (default 2)")
    add("--batch", type=positive, default=32, help="writes per Apply call (default 32)")
    add(
        "--in-flight", type=positive, default=4, metavar="F",
        help="Apply calls in flight per store per driver (default 4)",
    )  # fmt: skip
    add(
        "--duration",
        type=seconds_argument,
        help="seconds per measured window (default 5; --quick: 1)",
    )
    add("--windows", type=positive, help="measured windows: medians (default 3; --quick: 2)")
    add(
        "--write-entities", type=positive, metavar="N",
        help="entities the writes update (default 20,000; --quick: 2,000)",
    )  # fmt: skip
    add("--http-batch", type=positive, default=50, help="entities per op/update (default 50)")
    add("--http-clients", type=positive, default=8, help="op/update clients (default 8)")
    add("--reads", type=positive, help="GETs timed, idle and at half load (default 2,000)")
    add(
        "--query-entities", type=positive, metavar="N",
        help="entities the q query runs over (default 100,000; --quick: 3,000)",
    )  # fmt: skip
    add("--query-runs", type=positive, help="timed runs of each query (default 5; --quick: 2)")
    add(
        "--entities", type=non_negative, metavar="N",
        help="entities one store holds for the memory figures (default 1,000,000; "
        "--quick: 6,000; 0: skip)",
    )  # fmt: skip
    add(
        "--history", choices=["on", "off"], default="off",
        help="the stores record attribute history (default off; docs/history.md)",
    )  # fmt: skip
    add(
        "--archive", choices=["on", "off"], default="off",
        help="the stores record every change and an archiver moves them to Parquet files in "
        "the state directory (default off; docs/archive.md)",
    )  # fmt: skip
    add("--seed", type=positive, default=1, help="generator seed (default 1)")
    add("--quick", action="store_true", help="a smoke run: small sizes, short phases")
    add_dir_option(add)
    add("--profile", type=Path, metavar="DIR", help="cProfile the cluster's processes into DIR")
    add("--json", action="store_true", help="print one JSON object")
    add("--plot", type=Path, metavar="FILE.png", help="write the figures as a PNG")
    add("--quiet", "-q", action="store_true", help="no progress on stderr")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run ``silbo bench context`` and print its report; the exit status."""
    quick = args.quick
    args.stores = args.stores or ((1, 2) if quick else (1, 2, 4))
    args.duration = args.duration or (1.0 if quick else 5.0)
    args.windows = args.windows or (2 if quick else 3)
    args.warmup = 0.5 if quick else 1.0
    args.write_entities = args.write_entities or (2_000 if quick else 20_000)
    args.reads = args.reads or (300 if quick else 2_000)
    args.query_entities = args.query_entities or (3_000 if quick else 100_000)
    args.query_runs = args.query_runs or (2 if quick else 5)
    if args.entities is None:
        args.entities = 6_000 if quick else 1_000_000
    if args.plot is not None:
        require("bench", "the plot of silbo bench context")
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
        os.environ["SILBO_PROFILE"] = str(args.profile.resolve())
    summary = benchmark(args)
    if args.plot is not None:
        title = (
            f"silbo bench context: W-IoT entities, {os.cpu_count()} cores shared by stores, "
            "front and load"
        )
        plot(summary, args.plot, title)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print(summary)
    return 0
