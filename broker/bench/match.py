"""``silbo bench match``: how fast one matcher indexes subscriptions and matches updates.

One run of the command:

1. generates the workload's subscriptions and updates (not timed);
2. builds the matcher — ``add`` every subscription, then ``compact()`` — and times it
   (``build_s``, ``subscriptions_per_s``) and measures its memory (``bytes_per_subscription``,
   see :func:`measure_build`);
3. matches the updates ``runs`` times, in batches through ``match_batch``, and reports the
   median over runs of events per second and milliseconds per event, and the mean number of
   matches per event.

Before matching, everything built so far is moved out of the garbage collector's sight
(``gc.freeze()``), as a long-running matcher process would do, so that collections do not
rescan millions of subscriptions in the middle of a timed run.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, TypeVar

import psutil

from broker.bench.workloads import WORKLOADS
from broker.model.subscription import Subscription
from broker.model.update import ContextUpdate

__all__ = [
    "BuildResult",
    "MatchReport",
    "Matcher",
    "configure",
    "machine_info",
    "make_matcher",
    "measure_build",
    "measure_matching",
    "non_negative",
    "positive",
    "run",
]

ENGINES = ("indexed", "reference")
MEMORY_METHODS = ("tracemalloc", "rss", "none")


class Matcher(Protocol):
    """What the benchmark needs of a matcher (Engine and ReferenceMatcher both qualify)."""

    def add(self, subscription: Subscription) -> None: ...

    def remove(self, subscription_id: str) -> Subscription: ...

    def match_batch(
        self, updates: Sequence[ContextUpdate], now: float | None = None
    ) -> list[set[str]]: ...

    def __len__(self) -> int: ...


@dataclass(frozen=True, slots=True)
class BuildResult:
    """A built matcher, how long it took and how much memory it holds."""

    matcher: Matcher
    seconds: float
    memory_bytes: int | None  # None when not measured


@dataclass(slots=True)
class MatchReport:
    """Every figure of one ``bench match`` invocation (the ``--json`` object)."""

    workload: str
    engine: str
    subscriptions: int
    updates: int
    runs: int
    batch: int
    seed: int
    events_per_s: float
    ms_per_event: float
    events_per_s_ids: float
    matches_per_event: float
    build_s: float
    subscriptions_per_s: float
    bytes_per_subscription: float | None
    subscription_object_bytes: float | None
    memory_method: str
    generation_s: float
    run_events_per_s: list[float] = field(default_factory=list)
    baseline_updates: int = 0
    baseline_events_per_s: float | None = None
    speedup: float | None = None
    baseline_mismatches: int | None = None
    churn: int = 0
    churn_events_per_s: float | None = None
    churn_changes_per_s: float | None = None
    machine: dict[str, Any] = field(default_factory=dict)
    command: str = ""


def make_matcher(engine: str) -> Matcher:
    """An empty matcher of the named kind: ``indexed`` (Engine) or ``reference``."""
    if engine == "reference":
        from broker.matching.reference import ReferenceMatcher

        return ReferenceMatcher()
    if engine == "indexed":
        from broker.matching.engine import Engine

        return Engine()
    raise ValueError(f"unknown engine {engine!r}; expected one of {', '.join(ENGINES)}")


def _rss_bytes() -> int:
    """This process's resident set size now (0 where unavailable)."""
    try:
        return int(psutil.Process().memory_info().rss)
    except psutil.Error:
        return 0


def _build(engine: str, subscriptions: Sequence[Subscription]) -> Matcher:
    matcher = make_matcher(engine)
    add = matcher.add
    for subscription in subscriptions:
        add(subscription)
    compact = getattr(matcher, "compact", None)
    if compact is not None:
        compact()
    return matcher


def measure_build(
    engine: str, subscriptions: Sequence[Subscription], memory: str = "tracemalloc"
) -> BuildResult:
    """Build a matcher holding ``subscriptions``; time it and measure what it holds.

    ``memory`` says how: ``tracemalloc`` builds a second, untimed copy under tracemalloc and
    reports the Python heap it still holds afterwards (exact for Python objects; tracing
    makes that build 2-3x slower); ``rss`` is the growth of the process's resident set
    across the timed build (free, but it counts allocator slack and misses memory reused
    from objects freed earlier, such as the generator's temporaries); ``none`` skips it.
    Either way the subscriptions themselves, made before, are not counted: the figure is
    the index's own cost.
    """
    if memory not in MEMORY_METHODS:
        raise ValueError(f"unknown memory method {memory!r}")
    traced: int | None = None
    if memory == "tracemalloc":
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        copy = _build(engine, subscriptions)
        traced = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        del copy
    gc.collect()
    rss_before = _rss_bytes()
    started = time.perf_counter()
    matcher = _build(engine, subscriptions)
    seconds = time.perf_counter() - started
    rss = max(_rss_bytes() - rss_before, 0) if memory == "rss" else None
    return BuildResult(matcher, seconds, traced if memory == "tracemalloc" else rss)


def measure_matching(
    matcher: Matcher,
    updates: Sequence[ContextUpdate],
    batch: int,
    now: float,
    ids: bool = True,
) -> tuple[float, int]:
    """Match every update once, ``batch`` at a time; return (seconds, total matches).

    With ``ids`` the results are sets of subscription ids (``match_batch``); without, the
    engine's compact results, arrays of subscription slots (``match_batch_slots``), where
    the matcher has them.
    """
    match_batch = matcher.match_batch
    if not ids:
        match_batch = getattr(matcher, "match_batch_slots", match_batch)
    matches = 0
    started = time.perf_counter()
    for start in range(0, len(updates), batch):
        for result in match_batch(updates[start : start + batch], now):
            matches += len(result)
    return time.perf_counter() - started, matches


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_total() -> int | None:
    try:
        return int(psutil.virtual_memory().total)
    except (psutil.Error, OSError):
        return None


def machine_info() -> dict[str, Any]:
    """The machine a figure was measured on: cores, memory, CPU model, Python, OS."""
    affinity = getattr(os, "sched_getaffinity", None)
    return {
        "cores": os.cpu_count(),
        "usable_cores": len(affinity(0)) if affinity is not None else os.cpu_count(),
        "memory_bytes": _memory_total(),
        "cpu_model": _cpu_model(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
    }


def _progress(quiet: bool, message: str) -> None:
    if not quiet:
        print(f"[bench match] {message}", file=sys.stderr, flush=True)


def benchmark(args: argparse.Namespace) -> MatchReport:
    """Run the benchmark the parsed arguments describe and return its report."""
    workload = WORKLOADS[args.workload]
    updates_count = args.updates if args.updates is not None else workload.default_updates

    def say(message: str) -> None:
        _progress(args.quiet, message)

    say(f"generating {args.subscriptions:,} {workload.title} subscriptions (seed {args.seed})")
    started = time.perf_counter()
    subscriptions = workload.subscriptions(args.subscriptions, args.seed)
    updates = workload.updates(updates_count, args.seed + 1)
    generation_s = time.perf_counter() - started
    say(f"generated in {generation_s:.1f} s; building the {args.engine} matcher")
    gc.collect()
    gc.freeze()

    built = measure_build(args.engine, subscriptions, args.memory)
    say(f"built in {built.seconds:.2f} s; matching {updates_count:,} updates x {args.runs} runs")
    gc.collect()
    gc.freeze()

    now = time.time()
    # one untimed pass first: the runs measure a matcher in its steady state (its per-value
    # memos warm), as a long-running matcher is; the first pass would count their filling
    started = time.perf_counter()
    measure_matching(built.matcher, updates, args.batch, now, ids=False)
    say(f"warm-up pass: {updates_count / (time.perf_counter() - started):,.0f} events/s")
    timings: list[float] = []
    id_timings: list[float] = []
    matches = 0
    for run_number in range(args.runs):
        seconds, matches = measure_matching(built.matcher, updates, args.batch, now, ids=False)
        timings.append(seconds)
        id_seconds, id_matches = measure_matching(built.matcher, updates, args.batch, now)
        id_timings.append(id_seconds)
        if id_matches != matches:
            raise RuntimeError(f"slot results ({matches}) and id results ({id_matches}) differ")
        say(
            f"run {run_number + 1}/{args.runs}: {updates_count / seconds:,.0f} events/s "
            f"({updates_count / id_seconds:,.0f} with id sets)"
        )
    median = statistics.median(timings)
    id_median = statistics.median(id_timings)
    baseline = _baseline(built.matcher, subscriptions, updates[: args.baseline], now, say)
    churn = _churn(built.matcher, workload, subscriptions, updates, args, now, say)
    object_bytes = None
    if args.memory == "tracemalloc":
        object_bytes = _subscription_object_bytes(
            workload, min(args.subscriptions, 20_000), args.seed
        )
    count = max(updates_count, 1)
    return MatchReport(
        workload=workload.name,
        engine=args.engine,
        subscriptions=args.subscriptions,
        updates=updates_count,
        runs=args.runs,
        batch=args.batch,
        seed=args.seed,
        events_per_s=updates_count / median if median > 0 else 0.0,
        ms_per_event=1000.0 * median / count,
        events_per_s_ids=updates_count / id_median if id_median > 0 else 0.0,
        matches_per_event=matches / count,
        build_s=built.seconds,
        subscriptions_per_s=args.subscriptions / built.seconds if built.seconds > 0 else 0.0,
        bytes_per_subscription=(
            built.memory_bytes / args.subscriptions
            if built.memory_bytes is not None and args.subscriptions
            else None
        ),
        subscription_object_bytes=object_bytes,
        memory_method=args.memory,
        generation_s=generation_s,
        run_events_per_s=[updates_count / t if t > 0 else 0.0 for t in timings],
        **baseline,
        **churn,
        machine=machine_info(),
        command=getattr(args, "command_line", ""),
    )


def _baseline(
    matcher: Matcher,
    subscriptions: Sequence[Subscription],
    updates: Sequence[ContextUpdate],
    now: float,
    say: Any,
) -> dict[str, Any]:
    """Match ``updates`` with the reference matcher too, in this run: its rate, the engine's
    speed-up over it on the same updates (id sets both), and how many results differ."""
    if not updates:
        return {}
    from broker.matching.reference import ReferenceMatcher

    reference = ReferenceMatcher(subscriptions)
    say(f"baseline: matching {len(updates):,} updates with the reference matcher")
    started = time.perf_counter()
    expected = reference.match_batch(updates, now)
    reference_s = time.perf_counter() - started
    started = time.perf_counter()
    found = matcher.match_batch(updates, now)
    engine_s = time.perf_counter() - started
    mismatches = sum(1 for a, b in zip(expected, found, strict=True) if a != b)
    return {
        "baseline_updates": len(updates),
        "baseline_events_per_s": len(updates) / reference_s if reference_s > 0 else 0.0,
        "speedup": reference_s / engine_s if engine_s > 0 else 0.0,
        "baseline_mismatches": mismatches,
    }


def _churn(
    matcher: Matcher,
    workload: Any,
    subscriptions: Sequence[Subscription],
    updates: Sequence[ContextUpdate],
    args: argparse.Namespace,
    now: float,
    say: Any,
) -> dict[str, Any]:
    """One more timed pass in which, after every batch of updates, ``args.churn`` new
    subscriptions are added and as many of the original ones removed (the total stays N):
    matching while subscribers come and go, as a live matcher does."""
    per_batch = args.churn
    if not per_batch:
        return {}
    batches = (len(updates) + args.batch - 1) // args.batch
    count = min(per_batch * batches, len(subscriptions))
    fresh = [
        s.replace(id=f"churn-{i}")
        for i, s in enumerate(workload.subscriptions(count, args.seed + 13))
    ]
    leaving = [s.id for s in subscriptions[:count]]
    say(f"churn: {per_batch} subscriptions in and {per_batch} out after each batch")
    match_batch = getattr(matcher, "match_batch_slots", matcher.match_batch)
    changed = 0
    started = time.perf_counter()
    for start in range(0, len(updates), args.batch):
        match_batch(updates[start : start + args.batch], now)
        for _ in range(per_batch):
            if changed >= count:
                break
            matcher.add(fresh[changed])
            matcher.remove(leaving[changed])
            changed += 1
    seconds = time.perf_counter() - started
    return {
        "churn": per_batch,
        "churn_events_per_s": len(updates) / seconds if seconds > 0 else 0.0,
        "churn_changes_per_s": 2 * changed / seconds if seconds > 0 else 0.0,
    }


def _subscription_object_bytes(workload: Any, sample: int, seed: int) -> float:
    """Python heap held per subscription object itself (with its parsed filter), measured
    with tracemalloc on a freshly generated sample, the parser's cache emptied first so that
    shared filters are counted as a matcher process receiving them would hold them."""
    from broker.query.parser import parse_filter

    cache_clear = getattr(parse_filter, "cache_clear", None)
    if cache_clear is not None:
        cache_clear()
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    held = workload.subscriptions(sample, seed + 7)
    size = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del held
    return size / max(sample, 1)


def _table(report: MatchReport) -> str:
    per_sub = (
        "n/a"
        if report.bytes_per_subscription is None
        else f"{report.bytes_per_subscription:,.0f} index ({report.memory_method})"
    )
    if report.subscription_object_bytes is not None and report.bytes_per_subscription is not None:
        total = report.bytes_per_subscription + report.subscription_object_bytes
        per_sub += f" + {report.subscription_object_bytes:,.0f} object = {total:,.0f}"
    machine = report.machine
    rows = [
        ("workload", f"{report.workload} ({report.engine} engine, seed {report.seed})"),
        ("subscriptions", f"{report.subscriptions:,}"),
        ("updates x runs", f"{report.updates:,} x {report.runs} (batches of {report.batch})"),
        ("build", f"{report.build_s:.3f} s ({report.subscriptions_per_s:,.0f} subscriptions/s)"),
        ("bytes/subscription", per_sub),
        ("events/s (median)", f"{report.events_per_s:,.0f} (slot arrays)"),
        ("ms/event (median)", f"{report.ms_per_event:.4f}"),
        ("events/s, id sets", f"{report.events_per_s_ids:,.0f}"),
        ("matches/event", f"{report.matches_per_event:.2f}"),
        *(
            [
                (
                    "with churn",
                    f"{report.churn_events_per_s:,.0f} events/s while making "
                    f"{report.churn_changes_per_s:,.0f} subscription changes/s "
                    f"({report.churn} in and out per batch of {report.batch})",
                )
            ]
            if report.churn_events_per_s is not None and report.churn_changes_per_s is not None
            else []
        ),
        *(
            [
                (
                    "vs reference",
                    f"{report.speedup:,.0f}x faster on {report.baseline_updates:,} updates "
                    f"(reference {report.baseline_events_per_s:,.1f} events/s, "
                    f"{report.baseline_mismatches} mismatches)",
                )
            ]
            if report.speedup is not None
            else []
        ),
        ("machine", f"{machine['cores']} cores, {machine['cpu_model']}, "
                    f"Python {machine['python']}"),
    ]  # fmt: skip
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def _integer(text: str, least: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}, got {value}")
    return value


def positive(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    return _integer(text, 1)


def non_negative(text: str) -> int:
    """An argparse type: a whole number of at least 0."""
    return _integer(text, 0)


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``bench match`` options to ``parser`` and make it run :func:`run`."""
    parser.add_argument("--workload", required=True, choices=sorted(WORKLOADS))
    parser.add_argument(
        "--subscriptions", "-n", type=positive, required=True, metavar="N",
        help="subscriptions to index",
    )  # fmt: skip
    parser.add_argument(
        "--updates", "-m", type=positive, metavar="M",
        help="updates matched per run (default: 20000 iot/text, 2000 dense)",
    )  # fmt: skip
    parser.add_argument("--runs", "-r", type=positive, default=5, help="timed runs (default 5)")
    parser.add_argument(
        "--batch", "-b", type=positive, default=1000, help="updates per match_batch call"
    )
    parser.add_argument("--seed", "-s", type=non_negative, default=1, help="generator seed")
    parser.add_argument("--engine", choices=ENGINES, default="indexed")
    parser.add_argument(
        "--memory", choices=MEMORY_METHODS, default="tracemalloc",
        help="how to measure bytes per subscription (default tracemalloc, an extra untimed "
        "build; see docs/benchmarks.md)",
    )  # fmt: skip
    parser.add_argument(
        "--baseline", type=non_negative, default=0, metavar="K",
        help="also match the first K updates with the reference matcher, in this run: "
        "speed-up and mismatches (default 0, off)",
    )  # fmt: skip
    parser.add_argument(
        "--churn", type=non_negative, default=0, metavar="P",
        help="one more timed pass adding P new subscriptions and removing P old ones after "
        "every batch (default 0, off)",
    )  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quiet", "-q", action="store_true", help="no progress on stderr")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run ``silbo bench match`` and print its report; the exit status."""
    report = benchmark(args)
    if args.json:
        print(json.dumps(asdict(report), indent=None, sort_keys=True))
    else:
        print(_table(report))
    return 0


_R = TypeVar("_R")


def run_and_report(
    args: argparse.Namespace,
    run_once: Callable[[argparse.Namespace], _R],
    median: Callable[[list[_R]], _R],
    show: Callable[[_R], None],
    say: Callable[[str], None],
) -> _R:
    """``--runs`` runs of a benchmark; prints their median (``--json``: with every run, the
    machine and the command line) and returns it."""
    reports = []
    for i in range(args.runs):
        say(f"run {i + 1}/{args.runs}")
        reports.append(run_once(args))
    report = median(reports)
    if args.json:
        summary: dict[str, Any] = {
            **asdict(report),  # type: ignore[call-overload]
            "runs": [asdict(r) for r in reports],  # type: ignore[call-overload]
            "machine": machine_info(),
            "command": getattr(args, "command_line", ""),
        }
        print(json.dumps(summary, indent=2))
    else:
        show(report)
    return report
