"""``silbo bench spark``: the Spark matcher against the in-process engine, on the same input.

    silbo bench spark --workload iot|dense --subscriptions N --updates M
                      [--partitions P[,P2,...]] [--methods engine,join] [--runs R]
                      [--batch B] [--seed S] [--master URL] [--json] [--quiet]

One invocation:

1. generates the workload's subscriptions and updates (seeded; ``generation_s``) and writes
   the updates once to a temporary JSON-lines file (``write_s``); neither is timed below;
2. builds the in-process Engine (``add`` every subscription, ``compact()``; ``build_s``),
   matches a small untimed warm-up slice, then, per run, matches all M updates in batches
   of ``--batch`` through ``match_batch_slots`` and counts the matches (``match_s``);
3. starts the SparkSession (``session_s``), runs one small untimed warm-up job (when M is
   above 1,000), then, per run, per method (``engine``: the engine in every Spark task;
   ``join``: relational joins; see :mod:`spark_matcher`) and per partition count P: builds
   the matcher (``planning_s``) and times reading the file and counting the rows of the
   match frame, one per (update, subscription) (``job_s``: ``read_lines`` +
   ``match_frame(...).count()``; for the engine method this includes building the engines
   in Spark's Python workers). ``total_s`` is planning plus job.

Wall times on a shared machine move with its load: ``cpu_s`` (CPU seconds of this process,
plus, for Spark, of the local JVM and its Python workers) is reported beside them.

Every run must find the same number of matches on both sides: if not, the command fails.
Figures are medians over runs (each run's numbers are in the JSON). ``ratio`` is Spark's
``total_s`` over the engine's ``build_s + match_s``; ``job_ratio`` is ``job_s`` over
``match_s``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from broker.bench.match import machine_info, non_negative, positive
from broker.bench.workloads import WORKLOADS
from broker.model.subscription import Subscription
from broker.model.update import ContextUpdate

__all__ = ["MatchMismatch", "benchmark", "configure", "parse_methods", "parse_partitions", "run"]

SPARK_WORKLOADS = ("dense", "iot")
WARMUP = 1000  # updates (and subscriptions) of the untimed warm-up passes


class MatchMismatch(RuntimeError):
    """The Spark matcher and the engine found different numbers of matches."""


def parse_partitions(text: str) -> list[int]:
    """``"1,2"`` as ``[1, 2]``; ValueError unless every count is a whole number >= 1."""
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"partitions: expected P[,P2,...] (whole numbers), got {text!r}") from None
    if not counts or any(p < 1 for p in counts):
        raise ValueError(f"partitions: every count must be at least 1, got {text!r}")
    return counts


def parse_methods(text: str) -> list[str]:
    """``"engine,join"`` as ``["engine", "join"]``; ValueError for an unknown method."""
    from spark_matcher import METHODS

    methods = list(dict.fromkeys(part.strip() for part in text.split(",")))
    unknown = [m for m in methods if m not in METHODS]
    if not methods or unknown:
        raise ValueError(f"methods: expected some of {', '.join(METHODS)}, got {text!r}")
    return methods


def _methods_arg(text: str) -> list[str]:
    try:
        return parse_methods(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _partitions_arg(text: str) -> list[int]:
    try:
        return parse_partitions(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _per_s(count: int, seconds: float) -> float:
    return count / seconds if seconds > 0 else 0.0


def _engine_pass(
    engine: Any, updates: Sequence[ContextUpdate], batch: int, now: float
) -> tuple[float, int]:
    """Match every update once, ``batch`` at a time: (seconds, total matches)."""
    match = engine.match_batch_slots
    matches = 0
    started = time.perf_counter()
    for start in range(0, len(updates), batch):
        for slots in match(updates[start : start + batch], now):
            matches += len(slots)
    return time.perf_counter() - started, matches


def _process_cpu_s(root: int) -> float | None:
    """CPU seconds used so far by process ``root`` and its live descendants (Linux /proc;
    None where unavailable)."""
    tick = os.sysconf("SC_CLK_TCK")
    usage: dict[int, tuple[int, float]] = {}
    try:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii") as stat:
                    fields = stat.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            usage[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / tick)
    except OSError:
        return None
    if root not in usage:
        return None
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += usage[pid][1]
        todo += [child for child, (parent, _) in usage.items() if parent == pid]
    return total


def _spark_cpu_s(spark: Any) -> float | None:
    """CPU seconds used so far by this process and the local Spark JVM (with its Python
    workers); None when the JVM is not a local child."""
    proc = getattr(getattr(spark.sparkContext, "_gateway", None), "proc", None)
    jvm = _process_cpu_s(proc.pid) if proc is not None else None
    return None if jvm is None else jvm + time.process_time()


def _spark_pass(
    spark: Any,
    subscriptions: Sequence[Subscription],
    path: Path,
    partitions: int,
    now: float,
    method: str,
) -> dict[str, Any]:
    """Plan, read and match once: planning_s, job_s, total_s, cpu_s and matches."""
    from spark_matcher import open_matcher
    from spark_matcher.source import read_lines

    cpu = _spark_cpu_s(spark)
    matcher = open_matcher(spark, subscriptions, method=method, now=now, partitions=partitions)
    try:
        started = time.perf_counter()
        lines = read_lines(spark, path)
        matches = int(matcher.match_frame(lines, validate=False).count())
        job_s = time.perf_counter() - started
    finally:
        matcher.close()
    after = _spark_cpu_s(spark)
    return {
        "planning_s": matcher.planning_s,
        "job_s": job_s,
        "total_s": matcher.planning_s + job_s,
        "cpu_s": None if cpu is None or after is None else after - cpu,
        "matches": matches,
    }


def _check(engine_matches: int, spark_matches: int, label: str, run: int) -> None:
    if engine_matches != spark_matches:
        raise MatchMismatch(
            f"run {run}, {label}: Spark found {spark_matches:,} matches, "
            f"the engine {engine_matches:,}"
        )


def benchmark(
    args: argparse.Namespace,
    spark: Any = None,
    say: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    """Run the benchmark the parsed arguments describe and return its report (a JSON-able
    dict). ``spark``: the session to use (default ``spark_session(args.master)``).

    ValueError for an unknown workload or a partition count below 1; MatchMismatch when the
    two sides disagree."""
    if args.workload not in SPARK_WORKLOADS:
        raise ValueError(
            f"unknown workload {args.workload!r}; expected one of {', '.join(SPARK_WORKLOADS)}"
        )
    partitions = list(args.partitions)
    if not partitions or any(p < 1 for p in partitions):
        raise ValueError(f"partitions: every count must be at least 1, got {partitions}")
    methods = list(getattr(args, "methods", None) or ["engine", "join"])
    parse_methods(",".join(methods))
    if args.runs < 1 or args.subscriptions < 1 or args.updates < 1 or args.batch < 1:
        raise ValueError("runs, subscriptions, updates and batch must be at least 1")
    progress = say or (lambda message: None)
    workload = WORKLOADS[args.workload]
    m = args.updates

    progress(f"generating {args.subscriptions:,} {workload.title} subscriptions (seed {args.seed})")
    started = time.perf_counter()
    subscriptions = workload.subscriptions(args.subscriptions, args.seed)
    subscriptions_s = time.perf_counter() - started
    progress(f"  {subscriptions_s:.1f} s; generating {m:,} updates (seed {args.seed + 1})")
    started = time.perf_counter()
    updates = workload.updates(m, args.seed + 1)
    updates_s = time.perf_counter() - started
    progress(f"  {updates_s:.1f} s")
    now = time.time()

    with tempfile.TemporaryDirectory(prefix="silbo-bench-spark-") as directory:
        from spark_matcher.entities import write_updates

        path = Path(directory) / "updates.jsonl"
        started = time.perf_counter()
        write_updates(updates, path)
        write_s = time.perf_counter() - started
        warm_path = Path(directory) / "warmup.jsonl"
        write_updates(updates[:WARMUP], warm_path)
        size = path.stat().st_size
        progress(f"wrote {m:,} updates ({size / 1e6:,.1f} MB) in {write_s:.1f} s")

        # the engine
        from broker.matching.engine import Engine

        gc.collect()
        gc.freeze()
        started = time.perf_counter()
        engine = Engine()
        for subscription in subscriptions:
            engine.add(subscription)
        engine.compact()
        build_s = time.perf_counter() - started
        _engine_pass(engine, updates[:WARMUP], args.batch, now)
        progress(f"engine built in {build_s:.1f} s")
        engine_runs: list[dict[str, Any]] = []
        for run in range(1, args.runs + 1):
            cpu = time.process_time()
            seconds, matches = _engine_pass(engine, updates, args.batch, now)
            cpu = time.process_time() - cpu
            engine_runs.append({"match_s": seconds, "cpu_s": cpu, "matches": matches})
            progress(
                f"engine run {run}/{args.runs}: {seconds:.1f} s (CPU {cpu:.1f} s), "
                f"{_per_s(m, seconds):,.0f} updates/s, {matches:,} matches"
            )
        engine_matches = engine_runs[0]["matches"]
        del engine
        gc.collect()

        # Spark
        started = time.perf_counter()
        if spark is None:
            from spark_matcher.session import spark_session

            spark = spark_session(args.master)
        session_s = time.perf_counter() - started
        master = spark.sparkContext.master
        progress(f"Spark session ({master}) in {session_s:.1f} s")
        warmup_s = 0.0
        if m > WARMUP:  # small jobs first, so that the first timed one is not the JVM's first
            started = time.perf_counter()
            for method in methods:
                _spark_pass(spark, subscriptions[:WARMUP], warm_path, partitions[0], now, method)
            warmup_s = time.perf_counter() - started
            progress(f"warm-up jobs ({WARMUP:,} subscriptions and updates) in {warmup_s:.1f} s")
        cases = [(method, p) for method in methods for p in partitions]
        spark_runs: dict[tuple[str, int], list[dict[str, Any]]] = {case: [] for case in cases}
        for run in range(1, args.runs + 1):
            for method, p in cases:
                figures = _spark_pass(spark, subscriptions, path, p, now, method)
                spark_runs[method, p].append(figures)
                progress(
                    f"Spark run {run}/{args.runs}, {method} P={p}: "
                    f"planning {figures['planning_s']:.1f} s "
                    f"+ job {figures['job_s']:.1f} s = {figures['total_s']:.1f} s "
                    f"(CPU {figures['cpu_s'] or 0:.1f} s), "
                    f"{_per_s(m, figures['total_s']):,.0f} updates/s, "
                    f"{figures['matches']:,} matches"
                )
                _check(engine_matches, figures["matches"], f"{method} P={p}", run)
        for number, record in enumerate(engine_runs, 1):
            if record["matches"] != engine_matches:
                raise MatchMismatch(f"engine run {number} found {record['matches']:,} matches")

    match_s = statistics.median(r["match_s"] for r in engine_runs)
    spark_report = []
    for method, p in cases:
        records = spark_runs[method, p]
        planning = statistics.median(r["planning_s"] for r in records)
        job = statistics.median(r["job_s"] for r in records)
        total = statistics.median(r["total_s"] for r in records)
        cpus = [r["cpu_s"] for r in records if r["cpu_s"] is not None]
        spark_report.append(
            {
                "method": method,
                "partitions": p,
                "planning_s": planning,
                "job_s": job,
                "total_s": total,
                "cpu_s": statistics.median(cpus) if len(cpus) == len(records) else None,
                "updates_per_s": _per_s(m, total),
                "job_updates_per_s": _per_s(m, job),
                "matches": records[0]["matches"],
                "ratio": total / (build_s + match_s) if build_s + match_s > 0 else 0.0,
                "job_ratio": job / match_s if match_s > 0 else 0.0,
                "runs": records,
            }
        )
    return {
        "benchmark": "spark",
        "workload": workload.name,
        "subscriptions": args.subscriptions,
        "updates": m,
        "runs": args.runs,
        "batch": args.batch,
        "seed": args.seed,
        "master": master,
        "partitions": partitions,
        "methods": methods,
        "matches": engine_matches,
        "matches_agree": True,
        "generation_s": subscriptions_s + updates_s,
        "generation": {"subscriptions_s": subscriptions_s, "updates_s": updates_s},
        "write_s": write_s,
        "input_bytes": size,
        "engine": {
            "build_s": build_s,
            "match_s": match_s,
            "cpu_s": statistics.median(r["cpu_s"] for r in engine_runs),
            "total_s": build_s + match_s,
            "updates_per_s": _per_s(m, match_s),
            "matches": engine_matches,
            "runs": engine_runs,
        },
        "spark": spark_report,
        "session_s": session_s,
        "warmup_s": warmup_s,
        "machine": machine_info(),
        "command": getattr(args, "command_line", ""),
    }


def _table(report: dict[str, Any]) -> str:
    engine = report["engine"]
    m = report["updates"]
    rows = [
        ("workload", f"{report['workload']} (seed {report['seed']})"),
        ("subscriptions", f"{report['subscriptions']:,}"),
        ("updates x runs", f"{m:,} x {report['runs']}"),
        ("generation", f"{report['generation_s']:.1f} s (not timed below)"),
        ("matches", f"{report['matches']:,} (Spark and engine agree)"),
        (
            "engine",
            f"build {engine['build_s']:.2f} s + match {engine['match_s']:.2f} s "
            f"(CPU {engine['cpu_s']:.1f} s) "
            f"({engine['updates_per_s']:,.0f} updates/s, batches of {report['batch']})",
        ),
    ]
    for s in report["spark"]:
        rows.append(
            (
                f"Spark {s['method']} P={s['partitions']}",
                f"planning {s['planning_s']:.2f} s + job {s['job_s']:.2f} s = "
                f"{s['total_s']:.2f} s, CPU {s['cpu_s'] or 0:.1f} s "
                f"({s['updates_per_s']:,.0f} updates/s; "
                f"{s['ratio']:.2f}x the engine's time, job alone {s['job_ratio']:.2f}x)",
            )
        )
    machine = report["machine"]
    rows.append(("master", report["master"]))
    rows.append(("machine", f"{machine['cores']} cores, {machine['cpu_model']}"))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``bench spark`` options to ``parser`` and make it run :func:`run`."""
    parser.add_argument("--workload", required=True, choices=SPARK_WORKLOADS)
    parser.add_argument(
        "--subscriptions", "-n", type=positive, required=True, metavar="N",
        help="subscriptions to match against",
    )  # fmt: skip
    parser.add_argument(
        "--updates", "-m", type=positive, required=True, metavar="M", help="updates matched"
    )
    parser.add_argument(
        "--partitions", "-p", type=_partitions_arg, default=[1], metavar="P[,P2,...]",
        help="Spark matcher partition counts, each timed (default 1)",
    )  # fmt: skip
    parser.add_argument(
        "--methods", type=_methods_arg, default=["engine", "join"], metavar="M[,M2]",
        help="Spark methods timed: engine, join (default both)",
    )  # fmt: skip
    parser.add_argument("--runs", "-r", type=positive, default=3, help="timed runs (default 3)")
    parser.add_argument(
        "--batch", "-b", type=positive, default=1000, help="updates per engine batch"
    )
    parser.add_argument("--seed", "-s", type=non_negative, default=1, help="generator seed")
    parser.add_argument(
        "--master", default=None, help="Spark master URL (default: SILBO_SPARK_MASTER or local[*])"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run ``silbo bench spark`` and print its report; the exit status (1 on a mismatch)."""

    def say(message: str) -> None:
        if not args.quiet:
            print(f"[bench spark] {message}", file=sys.stderr, flush=True)

    try:
        report = benchmark(args, say=say)
    except MatchMismatch as exc:
        print(f"silbo bench spark: MISMATCH: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(_table(report))
    return 0
