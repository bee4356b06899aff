"""``silbo bench store-scale``: the context store layer scaled while writes and reads flow.

    silbo bench store-scale [--entities 20000,100000] [--steps 1,2,1] [--replicas 1]
                            [--rate 500] [--read-rate 50] [--phase 10] [--timeout 60]
                            [--seed 1] [--dir DIR] [--json] [--plot FILE.png] [--quiet]

The spec's line (spec/context-store.md): "Scale of the store layer under write load: no
write lost, reads keep answering, time grows with the moved data only". For each size N of
``--entities``, one *series*:

1. a local cluster (embedded ZooKeeper, ``steps[0]`` context stores keeping ``--replicas``
   copies of each partition, one connection point serving HTTP, one access point, one exit
   point, matchers) starts in a temporary directory under ``--dir``;
2. N W-IoT entities are loaded through ``ContextStore.Apply`` (untimed, as ``bench
   context`` loads them);
3. a writer process writes ``--rate`` writes/s through a StoreClient (the fronts' way to the
   stores), each an ``$inc`` of a counter and a sequence number (broker.bench.store_scale_load),
   and a reader process GETs random entities through the HTTP front at ``--read-rate``;
4. after ``--phase`` seconds, the store layer is scaled to each next count of ``--steps``,
   ``--phase`` seconds apart, by the code of ``silbo admin scale context-stores``
   (broker.cluster.operations.resize_store_layer: new stores started, the coordinator,
   leaving stores stopped); ``--phase`` seconds after the last scale both stop;
5. the oracle: every written entity read back through the cluster; its counter must equal
   its acknowledged increments (``lost``: acknowledged ones missing, ``doubled``: applied
   more than once; a refused write may or may not have been applied and is allowed either
   way), its ``v`` its last acknowledged write (``stale`` otherwise), and the tenant must
   still hold N entities (``missing``).

Per scale: outcome, seconds (the coordinator's), partitions / keys / bytes moved, the
whole operation's seconds (processes started and stopped included), the writes sent
during the operation (acknowledged, refused) and their latency p50 / p99 against the writes
sent outside every scale, the GETs during it (p99, errors). ``--json`` prints one object
(``scales``, ``lost``, ``doubled``, ``stale``, ``missing``, ``read_errors``, ``refused``,
``series`` with a per-second time line each, ``machine``, ``command``, ``commit``);
``--plot`` draws writes/s, latencies and the stores over time, each scale marked.

Exit status 1 if a scale did not complete or the oracle or a GET failed, 2 for bad options.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import multiprocessing
import queue
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from broker.bench.clusters import add_dir_option, bench_cluster
from broker.bench.context_load import load_entities, store_addresses
from broker.bench.match import machine_info, positive
from broker.bench.scale import source_commit
from broker.bench.storage import counts_argument, seconds_argument
from broker.bench.store_scale_load import (
    OK,
    ReaderJob,
    Signals,
    WriterJob,
    drive_reader,
    drive_writer,
    read_back,
)
from broker.bench.store_scale_report import plot, scale_figures, series_figures, timeline
from broker.cluster import ClusterSpec, LocalCluster
from broker.cluster.operations import resize_store_layer
from broker.coordination.client import connect
from broker.errors import SilboError
from broker.extras import require

__all__ = ["Series", "check", "configure", "run", "steps_argument", "summarize"]

TENANT: Final = "benchs"
_PREFIX: Final = "silbo bench store-scale: error:"
_COLLECT_TIMEOUT: Final = 120.0  # seconds for a driver to hand back its records


@dataclass(slots=True)
class Series:
    """What one size's run recorded (wall-clock times, ``time.time()``)."""

    size: int
    started: float = 0.0  # the drivers' start: the time line's origin
    stopped: float = 0.0
    scales: list[dict[str, Any]] = field(default_factory=list)
    stores: list[tuple[float, int]] = field(default_factory=list)  # (from when, count)
    calls: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros((0, 5)))
    write_errors: list[int] = field(default_factory=list)
    sent: int = 0
    reads: npt.NDArray[np.float64] = field(default_factory=lambda: np.zeros((0, 3)))
    oracle: dict[str, int] = field(default_factory=dict)


# -- the command -------------------------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``bench store-scale`` options to ``parser`` and make it run :func:`run`."""
    add = parser.add_argument
    add(
        "--entities", type=counts_argument, default=(20_000, 100_000), metavar="N[,N]",
        help="entities loaded, one scale series per size (default 20000,100000)",
    )  # fmt: skip
    add("--steps", default="1,2,1", help="context stores per phase (default 1,2,1)")
    add("--replicas", type=positive, default=1, help="copies of each partition (default 1)")
    add("--rate", type=positive, default=500, help="writes/s offered (default 500)")
    add("--read-rate", type=positive, default=50, help="GETs/s offered (default 50)")
    add(
        "--phase", type=seconds_argument, default=10.0,
        help="seconds before, between and after the scales (default 10)",
    )  # fmt: skip
    add("--timeout", type=seconds_argument, default=60.0, help="seconds before a roll-back")
    add("--seed", type=positive, default=1, help="generator seed (default 1)")
    add_dir_option(add)
    add("--json", action="store_true", help="print one JSON object")
    add("--plot", type=Path, metavar="FILE.png", help="write the time lines as a PNG")
    add("--quiet", "-q", action="store_true", help="no progress on stderr")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run every series, print the report; the exit status (module doc)."""
    try:
        args.steps = steps_argument(args.steps, args.replicas)
    except ValueError as exc:
        print(f"{_PREFIX} {exc}", file=sys.stderr)
        return 2
    if args.plot is not None:
        require("bench", "the plot of silbo bench store-scale")
    series = [_run_series(args, size) for size in args.entities]
    summary = summarize(args, series)
    if args.plot is not None:
        plot(summary, args.plot)
        _say(args, f"wrote {args.plot}")
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        _print(summary)
    return 0 if summary["ok"] else 1


def steps_argument(text: str, replicas: int) -> list[int]:
    """The store counts of ``--steps`` (ValueError with the reason if they are not usable)."""
    try:
        steps = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--steps {text!r} is not a comma-separated list of counts") from None
    if len(steps) < 2 or min(steps) < 1:
        raise ValueError("--steps needs at least two store counts, each at least 1")
    if any(a == b for a, b in itertools.pairwise(steps)):
        raise ValueError("--steps: consecutive counts must differ")
    if min(steps) < replicas:
        raise ValueError(
            f"--steps: every count must be at least --replicas ({replicas}): a store layer "
            f"keeping {replicas} copies of each partition needs {replicas} stores"
        )
    return steps


# -- one series --------------------------------------------------------------------------------


def _run_series(args: argparse.Namespace, size: int) -> Series:
    series = Series(size)
    with _cluster(args, size) as cluster:
        _load(args, cluster, size)
        written = min(size, max(1_000, args.rate * 10))  # each entity written several times
        _drive(args, cluster, series, written)
        _say(args, f"{size:,} entities: reading back {written:,} written entities")
        found = read_back(cluster.zk_address, cluster.spec.cluster, TENANT, written)
    series.oracle = check(series, found, written)
    _say(args, f"{size:,} entities: oracle {series.oracle}")
    return series


@contextmanager
def _cluster(args: argparse.Namespace, size: int) -> Iterator[LocalCluster]:
    """A local cluster of ``steps[0]`` stores and one HTTP front, removed afterwards."""

    def spec_of(state: Path) -> ClusterSpec:
        return ClusterSpec(
            matchers=args.replicas,
            context_stores=args.steps[0],
            replicas=args.replicas,
            grpc_port=0,
            http_port=0,  # any free port: cluster.json names the fronts
            state_dir=state,
            log_level="INFO",  # the stores' copy lines, the coordinator's steps
        )

    _say(args, f"{size:,} entities: starting a cluster of {args.steps[0]} context store(s)")
    with bench_cluster(args, f"silbo-bench-store-scale-{size}-", spec_of, _say) as started:
        yield started[0]


def _load(args: argparse.Namespace, cluster: LocalCluster, size: int) -> None:
    layout, addresses = store_addresses(cluster.zk_address, cluster.spec.cluster)
    _say(args, f"{size:,} entities: loading them")
    took = asyncio.run(
        load_entities(addresses, layout, TENANT, 0, size, args.seed, lambda m: _say(args, m))
    )
    _say(args, f"{size:,} entities loaded in {took:.1f} s ({size / took:,.0f}/s)")


def _drive(args: argparse.Namespace, cluster: LocalCluster, series: Series, written: int) -> None:
    """The writer and the reader running, the scales made in turn on this thread (the new
    stores are detached processes: no parent-death signal tied to a thread)."""
    context = multiprocessing.get_context("spawn")
    signals = Signals(context.Queue(), context.Event(), context.Event(), context.Queue())
    writer_job = WriterJob(cluster.zk_address, cluster.spec.cluster, TENANT, written, args.rate)
    base = f"http://{cluster.description['http_endpoints'][0]}"
    reader_job = ReaderJob(base, TENANT, series.size, args.read_rate, args.seed)
    drivers = [
        context.Process(target=drive_writer, args=(writer_job, signals), daemon=True),
        context.Process(target=drive_reader, args=(reader_job, signals), daemon=True),
    ]
    for driver in drivers:
        driver.start()
    for _ in drivers:
        signals.ready.get(timeout=_COLLECT_TIMEOUT)  # imported and connected
    series.started = time.time()
    signals.go.set()
    series.stores.append((0.0, args.steps[0]))
    zk = connect(cluster.zk_address, cluster=cluster.spec.cluster, timeout=10.0)
    try:
        for before, after in itertools.pairwise(args.steps):
            _wait(args, series, args.phase)
            series.scales.append(_scale(args, cluster, zk, series, before, after))
        _wait(args, series, args.phase)
    finally:
        zk.stop()
        zk.close()
        signals.stop.set()
        series.stopped = time.time()
        _collect(series, signals.out, drivers)


def _wait(args: argparse.Namespace, series: Series, seconds: float) -> None:
    """Let ``seconds`` pass, a progress line every 5 s."""
    end = time.time() + seconds
    while (left := end - time.time()) > 0:
        time.sleep(min(left, 5.0))
        stores = series.stores[-1][1]
        _say(
            args,
            f"{series.size:,} entities: t={time.time() - series.started:5.1f} s, {stores} store(s)",
        )


def _scale(
    args: argparse.Namespace,
    cluster: LocalCluster,
    zk: Any,
    series: Series,
    before: int,
    after: int,
) -> dict[str, Any]:
    """One scale, as ``silbo admin scale context-stores`` makes it; its record."""
    _say(args, f"{series.size:,} entities: scaling the context stores {before} -> {after}")
    began = time.time()
    try:
        outcome, _old = resize_store_layer(zk, cluster.state_dir, after, args.timeout)
        result = outcome.to_dict()
    except SilboError as exc:
        result = {"outcome": f"refused: {exc}", "duration_s": 0.0, "moved_partitions": 0,
                  "moved_keys": 0, "moved_bytes": 0, "layout": 0, "message": str(exc)}  # fmt: skip
    ended = time.time()
    if result["outcome"] == "completed":
        series.stores.append((ended - series.started, after))
    record = {
        "size": series.size,
        "from": before,
        "to": after,
        "outcome": result["outcome"],
        "seconds": result["duration_s"],
        "operation_s": round(ended - began, 3),
        "moved_partitions": result["moved_partitions"],
        "moved_keys": result["moved_keys"],
        "moved_bytes": result["moved_bytes"],
        "layout": result["layout"],
        "message": result["message"],
        "began_s": round(began - series.started, 3),
        "ended_s": round(ended - series.started, 3),
    }
    _say(
        args,
        f"{series.size:,} entities: {before} -> {after} {record['outcome']} in "
        f"{record['seconds']:.2f} s ({record['operation_s']:.2f} s with the processes), "
        f"{record['moved_partitions']} partitions, {record['moved_keys']:,} keys, "
        f"{record['moved_bytes']:,} bytes moved"
        + (f" ({record['message']})" if record["message"] else ""),
    )
    return record


def _collect(series: Series, results: queue.Queue[Any], processes: Sequence[Any]) -> None:
    """The drivers' records (the writer's dict, the reader's array), then the processes."""
    for _ in processes:
        got = results.get(timeout=_COLLECT_TIMEOUT)
        if isinstance(got, dict):
            series.calls, series.write_errors, series.sent = (
                got["calls"],
                got["errors"],
                got["sent"],
            )
        else:
            series.reads = got
    for process in processes:
        process.join(timeout=30)


# -- the oracle --------------------------------------------------------------------------------


def check(series: Series, found: dict[str, Any], written: int) -> dict[str, int]:
    """What the read-back says of the acknowledged writes (module doc, step 5)."""
    acked = np.zeros(written, dtype=np.int64)
    maybe = np.zeros(written, dtype=np.int64)
    last = np.full(written, -1, dtype=np.int64)  # the last acknowledged v
    unsure: dict[int, set[int]] = {}  # entity: the v of its refused writes
    failed = set(series.write_errors)
    for _sent, _latency, first, count, outcome in series.calls:
        seqs = np.arange(int(first), int(first + count), dtype=np.int64)
        if outcome == OK:
            good = np.array([s for s in seqs if s not in failed], dtype=np.int64)
            np.add.at(acked, good % written, 1)
            np.maximum.at(last, good % written, good)
        else:
            np.add.at(maybe, seqs % written, 1)
            for s in seqs.tolist():
                unsure.setdefault(s % written, set()).add(s)
    lost = doubled = stale = 0
    for i, value in enumerate(found["values"]):
        if value is None:  # counted in missing too
            lost += int(acked[i])
            continue
        n = int(value[0] or 0)
        v = value[1]
        lost += max(0, int(acked[i]) - n)
        doubled += max(0, n - int(acked[i]) - int(maybe[i]))
        allowed = {int(last[i])} | {s for s in unsure.get(i, ()) if s > last[i]}
        if last[i] >= 0 and (not isinstance(v, int) or v not in allowed):
            stale += 1
    return {
        "written": written,
        "acknowledged": int(acked.sum()),
        "refused": int(maybe.sum()),
        "write_errors": len(failed),
        "lost": lost,
        "doubled": doubled,
        "stale": stale,
        "missing": max(0, series.size - int(found["count"])),
    }


# -- the report --------------------------------------------------------------------------------


def summarize(args: argparse.Namespace, runs: Sequence[Series]) -> dict[str, Any]:
    """The JSON object of ``--json`` (module doc)."""
    scales: list[dict[str, Any]] = []
    series: list[dict[str, Any]] = []
    for one in runs:
        windows = [(s["began_s"], s["ended_s"]) for s in one.scales]
        scales += [scale_figures(s, one.calls, one.reads, one.started) for s in one.scales]
        seconds = int(one.stopped - one.started)
        series.append(
            {
                "size": one.size,
                "seconds": round(one.stopped - one.started, 1),
                **one.oracle,
                **series_figures(one.calls, one.reads, one.started, windows),
                "stores": [[round(at, 3), count] for at, count in one.stores],
                "timeline": timeline(one.calls, one.reads, one.started, seconds, one.stores),
            }
        )
    totals = {
        name: sum(int(s[name]) for s in series)
        for name in ("lost", "doubled", "stale", "missing", "refused", "write_errors")
    }
    read_errors = sum(int(s["reads"]["errors"]) for s in series)
    ok = (
        all(s["outcome"] == "completed" for s in scales)
        and len(scales) == len(runs) * (len(args.steps) - 1)
        and not any(totals[k] for k in ("lost", "doubled", "stale", "missing", "write_errors"))
        and read_errors == 0
    )
    return {
        "benchmark": "store-scale",
        "command": getattr(args, "command_line", ""),
        "commit": source_commit(),
        "machine": machine_info(),
        "parameters": {
            "entities": list(args.entities),
            "steps": args.steps,
            "replicas": args.replicas,
            "rate": args.rate,
            "read_rate": args.read_rate,
            "phase_s": args.phase,
            "timeout_s": args.timeout,
            "seed": args.seed,
        },
        "scales": scales,
        "series": series,
        **totals,
        "read_errors": read_errors,
        "ok": ok,
    }


def _print(summary: dict[str, Any]) -> None:
    parameters = summary["parameters"]
    print(
        f"context stores {'->'.join(map(str, parameters['steps']))}, replicas "
        f"{parameters['replicas']}, {parameters['rate']:,} writes/s and "
        f"{parameters['read_rate']} GETs/s offered"
    )
    print(
        "entities  scale  outcome    seconds  (whole)  partitions  keys moved  MB moved  "
        "writes ok/refused  write p50/p99 ms  GET p99 ms  GET errors"
    )
    for s in summary["scales"]:
        print(
            f"{s['size']:>8,}  {s['from']}->{s['to']:<3} {s['outcome']:<10} {s['seconds']:>7.2f}  "
            f"{s['operation_s']:>7.2f}  {s['moved_partitions']:>10}  {s['moved_keys']:>10,}  "
            f"{s['moved_bytes'] / 1e6:>8.1f}  "
            f"{s['writes_acknowledged']:>8,}/{s['writes_refused']:<8}  "
            f"{s['write_p50_ms']:>7.1f}/{s['write_p99_ms']:<8.1f}  "
            f"{s['get_p99_ms']:>10.1f}  {s['get_errors']:>10}"
        )
    for one in summary["series"]:
        outside, reads = one["writes_outside"], one["reads_outside"]
        print(
            f"{one['size']:,} entities, outside the scales: writes p50 {outside['p50_ms']:.1f} / "
            f"p99 {outside['p99_ms']:.1f} ms, GET p99 {reads['p99_ms']:.1f} ms; oracle over "
            f"{one['written']:,} entities, {one['acknowledged']:,} acknowledged writes: lost "
            f"{one['lost']}, doubled {one['doubled']}, stale {one['stale']}, missing "
            f"{one['missing']}; GET errors {one['reads']['errors']}"
        )
    print("result: " + ("ok" if summary["ok"] else "FAILED"))


def _say(args: argparse.Namespace, message: str) -> None:
    if not args.quiet:
        print(f"[bench store-scale] {message}", file=sys.stderr, flush=True)
