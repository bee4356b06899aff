"""``silbo bench storage``: the context store's embedded engines on W-IoT entities (issue 17).

    silbo bench storage [--entities N] [--engines lmdb,rocksdb] [--writers W[,W]]
                        [--duration S] [--reads R] [--runs K] [--quick] [--dir DIR]
                        [--json] [--plot FILE.png]

Each engine is measured in a process of its own (so that its memory is its own), on a fresh
store in a temporary directory under ``--dir``, durable (every commit fsync'd). In order:

1. **load** N W-IoT entities (stations ``urn:ngsi-ld:AirQualityObserved:<code>`` of tenant
   ``madrid`` in its 21 district service paths, each a msgpack'd document of the 8
   pollutants, ``dateObserved`` and ``stationName`` as {type, value, metadata}, with
   ``dateCreated`` / ``dateModified``), in commits of 1,000: ``load_s``;
2. **size**: the bytes the store's files take on disk (allocated blocks) and the process's
   resident set, with its anonymous part (``rss_anon``: the heap; the rest is mapped files,
   page cache the kernel can take back);
3. **GET**: R point reads of uniformly drawn entities, one at a time: p50 / p99;
4. **scan**: the first 100,000 entities of the tenant in key order (a list query's read),
   three times: the median;
5. **writes**: for each batch size B in (1, 16, 256) and each count W of ``--writers``
   (default 1, 8 and 64), W writer coroutines each writing batches of B updates of random
   entities through one :class:`GroupCommitter`, for S seconds: durable entities/s,
   acknowledgements/s, commits (fsyncs) and writes per commit, and the acknowledgement
   latency p50 / p99. One writer has no one to share a commit with: its rate is the
   engine's durable commit rate.

With ``--runs K`` each run measures every engine (their order alternating run by run) and
the report gives the median of each figure over the runs, with the ratios of the engines'
medians. ``--quick`` is a smoke run: 20,000 entities, 8 writers, short phases.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import itertools
import json
import math
import multiprocessing
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
import psutil

from broker.bench.clusters import add_dir_option
from broker.bench.match import machine_info, positive
from broker.bench.workloads.iot import DISTRICTS, IOT_TENANT, IOT_TYPE, POLLUTANTS, madrid_stations
from broker.extras import require
from broker.store.engine import (
    DEFAULT_ENGINE,
    ENGINES,
    Engine,
    GroupCommitter,
    entity_key,
    key_prefix,
    open_engine,
)

__all__ = [
    "EngineReport",
    "WriteFigures",
    "configure",
    "iot_attributes",
    "iot_entities",
    "iot_entity_id",
    "iot_entity_key",
    "iot_service_path",
    "run",
]

WRITE_BATCHES = (1, 16, 256)
LOAD_BATCH = 1000
SCAN_ENTITIES = 100_000
_SCAN_REPEATS = 3
_WRITE_POOL = 4096  # distinct documents cycled through by the writers
_BASE_TIME = datetime(2024, 3, 1, tzinfo=UTC).timestamp()
_ID_PREFIX = "urn:ngsi-ld:AirQualityObserved:"
_MB = 1 << 20


@dataclass(frozen=True, slots=True)
class _Config:
    """What one engine's measurement needs (sent to its process)."""

    kind: str
    entities: int
    reads: int
    writers: tuple[int, ...]
    duration_s: float
    directory: str
    seed: int
    quiet: bool


@dataclass(slots=True)
class WriteFigures:
    """Durable writes of ``batch`` entities each through the group committer."""

    batch: int
    writers: int
    seconds: float
    writes: int
    entities_per_s: float
    writes_per_s: float
    commits: int
    commits_per_s: float
    writes_per_commit: float
    ack_p50_ms: float
    ack_p99_ms: float


@dataclass(slots=True)
class EngineReport:
    """Every figure of one engine in one run (or the medians of several: see ``runs``)."""

    engine: str
    entities: int
    value_bytes: float = 0.0
    load_s: float = 0.0
    load_entities_per_s: float = 0.0
    disk_bytes: int = 0
    disk_bytes_per_entity: float = 0.0
    rss_base_bytes: int = 0
    rss_loaded_bytes: int = 0
    rss_anon_loaded_bytes: int = 0
    rss_end_bytes: int = 0
    rss_anon_end_bytes: int = 0
    reads: int = 0
    get_p50_us: float = 0.0
    get_p99_us: float = 0.0
    gets_per_s: float = 0.0
    scan_entities: int = 0
    scan_s: float = 0.0
    scan_entities_per_s: float = 0.0
    disk_bytes_after_writes: int = 0
    writes: list[WriteFigures] = field(default_factory=list)


# -- the workload ---------------------------------------------------------------------------


def iot_entity_key(i: int) -> bytes:
    """The storage key of W-IoT entity ``i`` (tenant madrid, its district's service path)."""
    return entity_key(IOT_TENANT, iot_service_path(i), IOT_TYPE, iot_entity_id(i))


def iot_attributes(start: int, count: int, seed: int) -> list[dict[str, Any]]:
    """The attributes of W-IoT entities ``start`` to ``start + count - 1``: the 8 pollutants,
    ``dateObserved`` and ``stationName``, each as {type, value, metadata}, with readings drawn
    as W-IoT draws them (deterministic in ``seed`` and ``start``)."""
    rng = np.random.default_rng([seed, start])
    readings = [
        np.round(
            np.clip(rng.lognormal(math.log(p.median), p.sigma, size=count), 0.0, p.high),
            p.decimals,
        ).tolist()
        for p in POLLUTANTS
    ]
    hours = rng.integers(0, 24 * 365, size=count).tolist()
    names = [s.name for s in madrid_stations(1000)]
    out = []
    for j in range(count):
        stamp = _BASE_TIME + 3600.0 * hours[j]
        attrs: dict[str, Any] = {
            p.name: {"type": "Number", "value": readings[k][j], "metadata": {}}
            for k, p in enumerate(POLLUTANTS)
        }
        attrs["dateObserved"] = {
            "type": "DateTime",
            "value": datetime.fromtimestamp(stamp, UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "metadata": {},
        }
        attrs["stationName"] = {
            "type": "Text",
            "value": names[(start + j) % len(names)],
            "metadata": {},
        }
        out.append(attrs)
    return out


def iot_entity_id(i: int) -> str:
    """The id of W-IoT entity ``i``."""
    return f"{_ID_PREFIX}28079{i:07d}"


def iot_service_path(i: int) -> str:
    """The service path of W-IoT entity ``i``: its district's."""
    return "/" + DISTRICTS[i % len(DISTRICTS)]


def iot_entities(start: int, count: int, seed: int) -> list[tuple[bytes, bytes]]:
    """(key, msgpack'd document) of W-IoT entities ``start`` to ``start + count - 1``.

    The documents are the shape the store keeps (every attribute as {type, value,
    metadata}, plus the entity's dates), with readings drawn as W-IoT draws them."""
    packb = msgpack.Packer(use_bin_type=True).pack
    pairs = []
    for j, attrs in enumerate(iot_attributes(start, count, seed)):
        i = start + j
        stamp = datetime.strptime(attrs["dateObserved"]["value"], "%Y-%m-%dT%H:%M:%SZ")
        document = {
            "id": iot_entity_id(i),
            "type": IOT_TYPE,
            "attrs": attrs,
            "dateCreated": _BASE_TIME,
            "dateModified": stamp.replace(tzinfo=UTC).timestamp(),
        }
        pairs.append((iot_entity_key(i), packb(document)))
    return pairs


# -- one engine, in its own process -------------------------------------------------------------


def measure_engine(config: _Config) -> EngineReport:
    """Every phase of the module doc on one engine; run in a process of its own."""
    gc.collect()
    report = EngineReport(engine=config.kind, entities=config.entities)
    report.rss_base_bytes = _rss()[0]
    directory = Path(tempfile.mkdtemp(prefix=f"silbo-bench-{config.kind}-", dir=config.directory))
    engine = open_engine(config.kind, directory / "store")
    try:
        _load(engine, config, report)
        report.disk_bytes = _disk_bytes(directory)
        report.disk_bytes_per_entity = report.disk_bytes / max(config.entities, 1)
        gc.collect()
        report.rss_loaded_bytes, report.rss_anon_loaded_bytes = _rss()
        _reads(engine, config, report)
        _scan(engine, config, report)
        gc.collect()
        report.rss_end_bytes, report.rss_anon_end_bytes = _rss()
        report.writes = [
            asyncio.run(_writes(engine, config, batch, writers))
            for batch in WRITE_BATCHES
            for writers in config.writers
        ]
        report.disk_bytes_after_writes = _disk_bytes(directory)
        if engine.count() != config.entities:
            raise RuntimeError(f"{config.kind}: {engine.count()} keys, not {config.entities}")
    finally:
        engine.close()
        shutil.rmtree(directory, ignore_errors=True)
    return report


def _load(engine: Engine, config: _Config, report: EngineReport) -> None:
    say = _sayer(config, f"{config.kind}: load")
    total_bytes, seconds, done, shown = 0, 0.0, 0, time.monotonic()
    while done < config.entities:
        pairs = iot_entities(done, min(LOAD_BATCH, config.entities - done), config.seed)
        total_bytes += sum(len(v) for _, v in pairs)
        started = time.perf_counter()
        engine.commit(pairs, ())
        seconds += time.perf_counter() - started
        done += len(pairs)
        if time.monotonic() - shown > 5 or done == config.entities:
            shown = time.monotonic()
            say(f"{done:,}/{config.entities:,} entities ({done / seconds:,.0f}/s committing)")
    report.value_bytes = total_bytes / max(config.entities, 1)
    report.load_s = seconds
    report.load_entities_per_s = config.entities / seconds if seconds > 0 else 0.0


def _reads(engine: Engine, config: _Config, report: EngineReport) -> None:
    rng = np.random.default_rng([config.seed, 7])
    keys = [iot_entity_key(i) for i in rng.integers(0, config.entities, size=config.reads)]
    timings = np.empty(len(keys), dtype=np.int64)
    get, clock = engine.get, time.perf_counter_ns
    started = time.perf_counter()
    for n, key in enumerate(keys):
        before = clock()
        if get(key) is None:
            raise RuntimeError(f"{config.kind}: entity {key!r} missing")
        timings[n] = clock() - before
    seconds = time.perf_counter() - started
    report.reads = len(keys)
    report.get_p50_us = float(np.percentile(timings, 50)) / 1000
    report.get_p99_us = float(np.percentile(timings, 99)) / 1000
    report.gets_per_s = len(keys) / seconds if seconds > 0 else 0.0
    _sayer(config, f"{config.kind}: GET")(
        f"p50 {report.get_p50_us:.1f} us, p99 {report.get_p99_us:.1f} us"
    )


def _scan(engine: Engine, config: _Config, report: EngineReport) -> None:
    want = min(SCAN_ENTITIES, config.entities)
    prefix = key_prefix(IOT_TENANT)
    times = []
    for _ in range(_SCAN_REPEATS):
        started = time.perf_counter()
        got = sum(1 for _ in itertools.islice(engine.scan(prefix), want))
        times.append(time.perf_counter() - started)
        if got != want:
            raise RuntimeError(f"{config.kind}: the scan gave {got} entities, not {want}")
    report.scan_entities = want
    report.scan_s = statistics.median(times)
    report.scan_entities_per_s = want / report.scan_s if report.scan_s > 0 else 0.0
    _sayer(config, f"{config.kind}: scan")(f"{want:,} entities in {report.scan_s * 1000:.0f} ms")


async def _writes(engine: Engine, config: _Config, batch: int, writers: int) -> WriteFigures:
    rng = np.random.default_rng([config.seed, 11, batch])
    keys = [iot_entity_key(i) for i in rng.integers(0, config.entities, size=65536)]
    pool = [v for _, v in iot_entities(0, _WRITE_POOL, config.seed + 1)]
    committer = GroupCommitter(engine)
    latencies: list[float] = []
    written = [0]
    deadline = time.perf_counter() + config.duration_s

    async def writer(number: int) -> None:
        cursor = number * 7919
        while time.perf_counter() < deadline:
            puts = []
            for _ in range(batch):
                cursor += 1
                puts.append((keys[cursor % len(keys)], pool[cursor % len(pool)]))
            started = time.perf_counter()
            await committer.write(puts)
            latencies.append(time.perf_counter() - started)
            written[0] += batch

    started = time.perf_counter()
    await asyncio.gather(*(writer(n) for n in range(writers)))
    seconds = time.perf_counter() - started
    await committer.close()
    acks = len(latencies)
    figures = WriteFigures(
        batch=batch,
        writers=writers,
        seconds=seconds,
        writes=acks,
        entities_per_s=written[0] / seconds,
        writes_per_s=acks / seconds,
        commits=committer.commits,
        commits_per_s=committer.commits / seconds,
        writes_per_commit=acks / max(committer.commits, 1),
        ack_p50_ms=float(np.percentile(latencies, 50)) * 1000 if latencies else 0.0,
        ack_p99_ms=float(np.percentile(latencies, 99)) * 1000 if latencies else 0.0,
    )
    _sayer(config, f"{config.kind}: writes of {batch} x {writers} writers")(
        f"{figures.entities_per_s:,.0f} entities/s, {figures.commits_per_s:,.0f} commits/s, "
        f"{figures.writes_per_commit:.1f} writes per commit"
    )
    return figures


def _rss() -> tuple[int, int]:
    """(resident set, its anonymous part) of this process, in bytes."""
    info = psutil.Process().memory_info()
    shared = int(getattr(info, "shared", 0))  # Linux: resident pages of mapped files
    return int(info.rss), max(int(info.rss) - shared, 0)


def _disk_bytes(directory: Path) -> int:
    """Bytes allocated on disk to the files under ``directory`` (sparse files count less)."""
    return sum(p.stat().st_blocks * 512 for p in directory.rglob("*") if p.is_file())


def _sayer(config: _Config, phase: str) -> Callable[[str], None]:
    def say(message: str) -> None:
        if not config.quiet:
            print(f"[bench storage] {phase}: {message}", file=sys.stderr, flush=True)

    return say


# -- runs, medians, output ------------------------------------------------------------------


def _configs(args: argparse.Namespace, run_number: int) -> Iterator[_Config]:
    engines = args.engines if run_number % 2 == 0 else list(reversed(args.engines))
    for kind in engines:
        yield _Config(
            kind=kind,
            entities=args.entities,
            reads=args.reads,
            writers=args.writers,
            duration_s=args.duration,
            directory=str(args.dir),
            seed=args.seed,
            quiet=args.quiet,
        )


def _measure_apart(config: _Config) -> EngineReport:
    """:func:`measure_engine` in a fresh process: its resident set is this engine's alone."""
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(measure_engine, config).result()


def _median(reports: list[EngineReport]) -> EngineReport:
    """The median of every figure over runs of one engine (write figures per batch size)."""
    first = reports[0]
    values: dict[str, Any] = {}
    for name, value in asdict(first).items():
        if isinstance(value, int | float) and not isinstance(value, bool):
            middle = statistics.median(getattr(r, name) for r in reports)
            values[name] = type(value)(middle)
        else:
            values[name] = value
    values["writes"] = [
        WriteFigures(
            **{
                name: type(value)(statistics.median(asdict(r.writes[i])[name] for r in reports))
                for name, value in asdict(figures).items()
            }
        )
        for i, figures in enumerate(first.writes)
    ]
    return EngineReport(**values)


def _ratios(medians: dict[str, EngineReport]) -> dict[str, float]:
    """Each figure of the first engine over the second's (when two were measured)."""
    if len(medians) != 2:
        return {}
    a, b = medians.values()
    ratios = {
        "get_p99": a.get_p99_us / b.get_p99_us,
        "scan_s": a.scan_s / b.scan_s,
        "disk_bytes": a.disk_bytes / b.disk_bytes,
        "rss_end_bytes": a.rss_end_bytes / b.rss_end_bytes,
        "load_entities_per_s": a.load_entities_per_s / b.load_entities_per_s,
    }
    for wa, wb in zip(a.writes, b.writes, strict=True):
        name = f"entities_per_s_batch_{wa.batch}_writers_{wa.writers}"
        ratios[name] = wa.entities_per_s / wb.entities_per_s
    return {k: round(v, 3) for k, v in ratios.items()}


def _table(medians: dict[str, EngineReport], runs: int) -> str:
    kinds = list(medians)
    rows: list[tuple[str, ...]] = [("", *kinds)]

    def row(name: str, show: Callable[[EngineReport], str]) -> None:
        rows.append((name, *(show(medians[k]) for k in kinds)))

    row("entities (value bytes)", lambda r: f"{r.entities:,} ({r.value_bytes:.0f} B)")
    row("load (commits of 1,000)", lambda r: f"{r.load_s:.1f} s, {r.load_entities_per_s:,.0f}/s")
    row("disk", lambda r: f"{r.disk_bytes / _MB:,.0f} MB ({r.disk_bytes_per_entity:.0f} B/entity)")
    row("RSS base", lambda r: f"{r.rss_base_bytes / _MB:,.0f} MB")
    row("RSS loaded (anon)", lambda r: _mb_pair(r.rss_loaded_bytes, r.rss_anon_loaded_bytes))
    row("RSS after reads (anon)", lambda r: _mb_pair(r.rss_end_bytes, r.rss_anon_end_bytes))
    row("GET p50 / p99", lambda r: f"{r.get_p50_us:.1f} / {r.get_p99_us:.1f} us")
    row("GET/s (one at a time)", lambda r: f"{r.gets_per_s:,.0f}")
    row("scan", lambda r: f"{r.scan_entities:,} in {r.scan_s * 1000:,.0f} ms")
    for i, figures in enumerate(medians[kinds[0]].writes):
        cells = [_write_cells(medians[k].writes[i]) for k in kinds]
        name = f"writes of {figures.batch} x {figures.writers}"
        rows.append((f"{name}: entities/s", *(c[0] for c in cells)))
        rows.append(("  commits/s, writes/commit", *(c[1] for c in cells)))
        rows.append(("  ack p50 / p99", *(c[2] for c in cells)))
    width = [max(len(r[c]) for r in rows) for c in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(width[c]) for c, cell in enumerate(r)).rstrip() for r in rows]
    lines.append(f"(medians of {runs} run{'s' if runs > 1 else ''}; durable: fsync per commit)")
    return "\n".join(lines)


def _write_cells(w: WriteFigures) -> tuple[str, str, str]:
    return (
        f"{w.entities_per_s:,.0f}",
        f"{w.commits_per_s:,.0f}, {w.writes_per_commit:.1f}",
        f"{w.ack_p50_ms:.2f} / {w.ack_p99_ms:.2f} ms",
    )


def _mb_pair(total: int, anon: int) -> str:
    return f"{total / _MB:,.0f} MB ({anon / _MB:,.0f} MB)"


def plot(medians: dict[str, EngineReport], path: Path, title: str) -> None:
    """Write the engines' medians as a PNG: writes by batch, GET, scan, disk and memory."""
    require("bench", "the plot of silbo bench storage")
    from matplotlib.figure import Figure

    kinds = list(medians)
    figure = Figure(figsize=(11, 7), layout="constrained")
    (writes, gets), (scan, memory) = figure.subplots(2, 2)
    width = 0.8 / len(kinds)
    for n, kind in enumerate(kinds):
        report, offset = medians[kind], (n - (len(kinds) - 1) / 2) * width
        x = np.arange(len(report.writes)) + offset
        rates = [w.entities_per_s for w in report.writes]
        writes.bar(x, rates, width, label=kind, color=f"C{n}")
        gets.bar(
            np.arange(2) + offset, [report.get_p50_us, report.get_p99_us], width, color=f"C{n}"
        )
        scan.bar(n, report.scan_s * 1000, 0.6, color=f"C{n}")
        sizes = [report.disk_bytes, report.rss_end_bytes, report.rss_anon_end_bytes]
        memory.bar(np.arange(3) + offset, [s / _MB for s in sizes], width, color=f"C{n}")
    cells = next(iter(medians.values())).writes
    writes.set_xticks(
        range(len(cells)), [f"{w.batch}x{w.writers}" for w in cells], fontsize=7, rotation=45
    )
    writes.set_xlabel("batch size x writers")
    writes.set_yscale("log")
    writes.set_ylabel("durable entities/s (group commit)")
    gets.set_xticks(range(2), ["p50", "p99"])
    gets.set_ylabel("GET latency (us)")
    scan.set_xticks(range(len(kinds)), kinds)
    scan.set_ylabel(f"scan of {next(iter(medians.values())).scan_entities:,} entities (ms)")
    memory.set_xticks(range(3), ["disk", "RSS", "RSS anon"])
    memory.set_ylabel("MB")
    figure.legend(loc="outside lower center", ncols=len(kinds), frameon=False)
    figure.suptitle(title)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)


def benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """Measure every engine ``args.runs`` times; the summary the command prints."""
    by_engine: dict[str, list[EngineReport]] = {kind: [] for kind in args.engines}
    for run_number in range(args.runs):
        for config in _configs(args, run_number):
            if not args.quiet:
                print(
                    f"[bench storage] run {run_number + 1}/{args.runs}: {config.kind}, "
                    f"{config.entities:,} entities",
                    file=sys.stderr,
                    flush=True,
                )
            by_engine[config.kind].append(_measure_apart(config))
    medians = {kind: _median(reports) for kind, reports in by_engine.items()}
    return {
        "entities": args.entities,
        "writers": list(args.writers),
        "duration_s": args.duration,
        "reads": args.reads,
        "runs": args.runs,
        "default_engine": DEFAULT_ENGINE,
        "medians": {kind: asdict(report) for kind, report in medians.items()},
        "ratios": _ratios(medians),
        "all_runs": {kind: [asdict(r) for r in reports] for kind, reports in by_engine.items()},
        "machine": machine_info(),
        "command": getattr(args, "command_line", ""),
        "_medians": medians,
    }


def _engines(text: str) -> list[str]:
    kinds = [k.strip() for k in text.split(",") if k.strip()]
    unknown = [k for k in kinds if k not in ENGINES]
    if not kinds or unknown or len(set(kinds)) != len(kinds):
        raise argparse.ArgumentTypeError(
            f"expected distinct engines among {', '.join(ENGINES)}, got {text!r}"
        )
    return kinds


def counts_argument(text: str) -> tuple[int, ...]:
    """An argparse type: whole numbers of at least 1, comma-separated."""
    try:
        counts = tuple(int(part) for part in text.split(","))
    except ValueError:
        counts = ()
    if not counts or min(counts) < 1:
        raise argparse.ArgumentTypeError(f"expected whole numbers of at least 1, got {text!r}")
    return counts


def seconds_argument(text: str) -> float:
    """An argparse type: seconds, more than 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0, got {text}")
    return value


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``bench storage`` options to ``parser`` and make it run :func:`run`."""
    parser.add_argument(
        "--entities", "-n", type=positive, metavar="N",
        help="entities loaded into each engine (default 1,000,000; --quick: 20,000)",
    )  # fmt: skip
    parser.add_argument(
        "--engines", type=_engines, default=["lmdb", "rocksdb"], metavar="E[,E]",
        help=f"engines to measure, in order (default lmdb,rocksdb; of {', '.join(ENGINES)})",
    )  # fmt: skip
    parser.add_argument(
        "--writers", type=counts_argument, metavar="W[,W]",
        help="concurrent writers through the group committer, each count in turn "
        "(default 1,8,64; --quick: 8)",
    )  # fmt: skip
    parser.add_argument(
        "--duration", type=seconds_argument, metavar="S",
        help="seconds of writes per batch size (default 5; --quick: 0.5)",
    )  # fmt: skip
    parser.add_argument(
        "--reads", type=positive, metavar="R",
        help="point reads timed (default 100,000; --quick: 2,000)",
    )  # fmt: skip
    parser.add_argument("--runs", type=positive, default=1, help="runs (default 1): medians")
    parser.add_argument("--seed", type=positive, default=1, help="generator seed (default 1)")
    parser.add_argument(
        "--quick", action="store_true", help="a smoke run: small defaults, seconds in all"
    )
    add_dir_option(parser.add_argument, "the stores")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--plot", type=Path, metavar="FILE.png", help="write the medians as a PNG")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run ``silbo bench storage`` and print its report; the exit status."""
    quick = args.quick
    args.entities = args.entities or (20_000 if quick else 1_000_000)
    args.writers = args.writers or ((8,) if quick else (1, 8, 64))
    args.duration = args.duration or (0.5 if quick else 5.0)
    args.reads = args.reads or (2_000 if quick else 100_000)
    if args.plot is not None:
        require("bench", "the plot of silbo bench storage")
    summary = benchmark(args)
    medians: dict[str, EngineReport] = summary.pop("_medians")
    if args.plot is not None:
        title = (
            f"silbo bench storage: {args.entities:,} W-IoT entities, durable, "
            f"medians of {args.runs} run{'s' if args.runs > 1 else ''}"
        )
        plot(medians, args.plot, title)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(_table(medians, args.runs))
    return 0
