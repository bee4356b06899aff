"""``silbo bench derived``: Theodolite's UC2 and UC4 on Silbo's aggregation groups (issue 20).

    silbo bench derived [--uc 2|4|both] [--stores 1,2,4] [--sensors N] [--window S]
                        [--step S] [--start-rate R] [--max-rate R] [--precision P]
                        [--max-steps K] [--rates R[,R]] [--repeat K] [--publishers P]
                        [--batch B] [--in-flight F] [--tick S] [--drain S]
                        [--history on|off]
                        [--quick] [--dir DIR] [--profile DIR] [--json] [--plot FILE.png]
                        [--quiet]
    silbo bench derived --merge JSON [JSON ...] [--json] [--plot FILE.png]

Theodolite (Henning & Hasselbring) benchmarks the scalability of stream processing by use
case: UC2 *downsampling* (each sensor's measurements aggregated into time windows) and UC4
*hierarchical aggregation* (sensor groups nested, aggregated up the hierarchy). Its metric
is the *demand*: per number of instances, the highest load the system sustains, a load being
sustained when its lag does not grow (a linear regression of the lag over the run, its
slope below a threshold). Here the instances are context store processes, which run the
aggregation groups (docs/aggregation.md), and the load is updates a second from ``--sensors``
sensors (broker.bench.derived_load has the workloads, UC2 one derived entity per sensor and
window, UC4 sensors -> floors -> buildings -> campuses, and the load; derived_oracle what is
judged; derived_report the report).

For each count n of ``--stores`` (and each of ``--repeat`` runs) a local cluster starts in a
temporary directory (embedded ZooKeeper, n context stores, one connection point serving gRPC
and HTTP, one access point, one matcher, one exit point, as ``silbo up``), and ``--publishers``
publisher processes connect to it. For each use case:

1. its entities are made (``POST /v2/op/update``), its group defined (``POST
   /v2/x/aggregations``: tumbling windows of ``--window`` seconds) and its derived entities
   subscribed (gRPC, one subscription per level);
2. from the group's ``since`` on, steps of ``--step`` seconds each at one rate (open loop,
   gRPC publishes through the context store), each after the last window the step before
   may have written to: after each, the drain (until every window of the step is notified,
   ``--drain`` seconds at most: broker.bench.derived_oracle.complete), then the judgement
   (sustained or not, and the oracle of the windows);
3. the rates: doubled from ``--start-rate`` while sustained, then halved between the highest
   sustained and the lowest not until within ``--precision`` (``--max-steps`` at most), or
   the ``--rates`` given;
4. the group deleted.

Per use case and store count: the highest sustained rate; at it, the latency from a window's
end to its first notification per level (p50 / p95 / p99), the windows written, the oracle
(lost windows, duplicates, wrong counts, values lost or extra) and the cores used by each
process of the cluster, the publishers and the machine. ``--json`` prints one object;
``--plot`` the scaling curve (highest sustained rate by store count, both use cases; medians
of the repeats, each run a dot) and the latency at it; ``--merge`` reports and plots earlier
``--json`` outputs together (more runs for the medians) without running anything. Exit
status 1 if a drained step's oracle found a window lost, duplicated or miscounted, 2 for bad
options.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import psutil

from broker.bench.clusters import add_dir_option, store_cluster, wait_serving
from broker.bench.derived_load import TICK, Publishers, Subscriber, Workload
from broker.bench.derived_oracle import check, complete, judge, latencies, search, span
from broker.bench.derived_report import merged, plot, print_summary, summary
from broker.bench.match import positive
from broker.bench.storage import counts_argument, seconds_argument
from broker.cluster import LocalCluster
from broker.extras import require
from broker.runtime.options import Role

__all__ = ["configure", "run"]

TENANT: Final = "benchd"  # + the use case: benchd2, benchd4
LOWEST: Final = 10  # updates/s: the search stops below
# Sensors by use case. UC2 writes one derived entity per sensor and window whatever the rate
# (1,000 sensors: 1,000 derived writes a second, which alone took the shared machine); 100
# keep its output near UC4's (1,000 sensors: 100 floors, 20 buildings, 5 campuses).
SENSORS: Final = {2: 100, 4: 1_000}
_HTTP_TIMEOUT: Final = 60.0
_SETTLE: Final = 0.3  # seconds after the drain for repeated notifications to arrive
_ROLES: Final = ("context-store", "connection-point", "access-point", "matcher", "exit-point")


@dataclass(slots=True)
class _Running:
    """A started cluster, as the bench uses it."""

    cluster: LocalCluster
    endpoints: list[str]  # gRPC
    base: str  # HTTP
    processes: dict[int, str]  # pid: role
    zookeeper: int | None


# -- the command -------------------------------------------------------------------------------


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``bench derived`` options to ``parser`` and make it run :func:`run`."""
    add = parser.add_argument
    add("--uc", choices=["2", "4", "both"], default="both", help="use case (default both)")
    add(
        "--stores", type=counts_argument, metavar="N[,N]",
        help="context store counts, a cluster each (default 1,2,4; --quick: 1)",
    )  # fmt: skip
    add(
        "--sensors", type=positive,
        help="sensors publishing (default: UC2 100, UC4 1,000; --quick: 40)",
    )  # fmt: skip
    add("--window", type=positive, default=1, help="tumbling window, seconds (default 1)")
    add("--step", type=seconds_argument, help="seconds per rate tried (default 10; --quick: 2)")
    add("--start-rate", type=positive, help="the search's first rate (default 1,000; --quick: 100)")
    add("--max-rate", type=positive, default=200_000, help="the search stops above (updates/s)")
    add(
        "--store-cap", type=positive, metavar="N",
        help="emulate a store's capacity: each context store takes at most N writes a second "
        "(its --max-rate: docs/autoscaling.md), so that scaling with the stores shows on a "
        "machine with fewer cores than processes",
    )  # fmt: skip
    add(
        "--precision", type=float, default=0.1,
        help="the search stops when the highest sustained and the lowest not are within this "
        "share of each other (default 0.1)",
    )  # fmt: skip
    add("--max-steps", type=positive, help="rates tried per search at most (default 8; --quick: 1)")
    add(
        "--rates", type=counts_argument, metavar="R[,R]",
        help="these rates (updates/s) in turn instead of the search",
    )  # fmt: skip
    add("--repeat", type=positive, default=1, help="runs per store count, medians (default 1)")
    add("--publishers", type=positive, help="publisher processes (default 4; --quick: 1)")
    add(
        "--batch",
        type=positive,
        default=100,
        help="updates per publish batch at most (default 100)",
    )
    add(
        "--in-flight", type=positive, default=4,
        help="batches in flight per publisher (default 4: held back, batches grow)",
    )  # fmt: skip
    add(
        "--tick", type=seconds_argument, default=TICK,
        help=f"seconds between a publisher's sends (default {TICK:g})",
    )  # fmt: skip
    add(
        "--drain", type=seconds_argument, default=20.0,
        help="seconds after a step that its windows may take to arrive (default 20)",
    )  # fmt: skip
    add(
        "--history", choices=["on", "off"], default="off",
        help="the stores also record attribute history (docs/history.md; default off)",
    )  # fmt: skip
    add("--quick", action="store_true", help="a smoke run: 1 store, 40 sensors, one low rate")
    add("--profile", type=Path, metavar="DIR", help="cProfile the cluster's processes into DIR")
    add_dir_option(add)
    add(
        "--merge", type=Path, nargs="+", metavar="JSON",
        help="run nothing: report (and --plot) these earlier --json outputs together",
    )  # fmt: skip
    add("--json", action="store_true", help="print one JSON object")
    add("--plot", type=Path, metavar="FILE.png", help="write the scaling curve as a PNG")
    add("--quiet", "-q", action="store_true", help="no progress on stderr")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run ``silbo bench derived`` and print its report; the exit status (module doc)."""
    quick = args.quick
    args.stores = args.stores or ((1,) if quick else (1, 2, 4))
    args.sensor_counts = {uc: args.sensors or (40 if quick else SENSORS[uc]) for uc in (2, 4)}
    args.step = args.step or (2.0 if quick else 10.0)
    args.start_rate = args.start_rate or (100 if quick else 1_000)
    args.max_steps = args.max_steps or (1 if quick else 8)
    args.publishers = args.publishers or (1 if quick else 4)
    args.ucs = (2, 4) if args.uc == "both" else (int(args.uc),)
    if not 0 < args.precision < 1:
        print("silbo bench derived: error: --precision must be between 0 and 1", file=sys.stderr)
        return 2
    if args.plot is not None:
        require("bench", "the plot of silbo bench derived")
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
        os.environ["SILBO_PROFILE"] = str(args.profile.resolve())
    if args.merge:
        parameters, results = merged(args.merge)
    else:
        parameters, results = _parameters(args), _run(args)
    report = summary(args, parameters, results)
    if args.plot is not None:
        plot(report, args.plot)
        _say(args, f"wrote {args.plot}")
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print_summary(report)
    return 0 if report["ok"] else 1


def _run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every repeat of every store count: a result per use case each."""
    results = []
    publishers = Publishers(args.publishers, args.batch, args.in_flight, args.tick)
    try:
        for repeat in range(args.repeat):
            for stores in args.stores:
                results += _run_cluster(args, publishers, stores, repeat)
    finally:
        publishers.close()
    return results


# -- one cluster -------------------------------------------------------------------------------


def _run_cluster(
    args: argparse.Namespace, publishers: Publishers, stores: int, repeat: int
) -> list[dict[str, Any]]:
    """Every use case on one cluster of ``stores`` context stores; a result each."""
    out = []
    with _cluster(args, stores) as running:
        publishers.connect(running.endpoints)
        try:
            for uc in args.ucs:
                sensors = args.sensor_counts[uc]
                workload = Workload(uc, sensors, args.window, f"{TENANT}{uc}")
                out.append(_run_case(args, running, publishers, workload, stores, repeat))
        finally:
            publishers.disconnect()
    return out


@contextmanager
def _cluster(args: argparse.Namespace, stores: int) -> Iterator[_Running]:
    """A local cluster of ``stores`` context stores serving gRPC and HTTP, removed after."""

    def capped(_state: Path) -> dict[str, Any]:
        cap = args.store_cap
        return {"max_rates": ((Role.CONTEXT_STORE.value, float(cap)),) if cap else ()}

    with store_cluster(args, "derived", stores, _say, capped) as started:
        cluster, described = started
        running = _Running(
            cluster,
            list(described["endpoints"]),
            f"http://{described['http_endpoints'][0]}",
            {int(p["pid"]): str(p["role"]) for p in described["processes"]},
            described.get("zookeeper", {}).get("pid"),
        )
        wait_serving(running.base)
        yield running


def _run_case(
    args: argparse.Namespace,
    running: _Running,
    publishers: Publishers,
    workload: Workload,
    stores: int,
    repeat: int,
) -> dict[str, Any]:
    """One use case on a running cluster: made, searched, removed; its result."""
    name = f"UC{workload.uc}, {stores} store{'s' if stores > 1 else ''}"
    for batch in workload.entities():
        body = {"actionType": "append", "entities": batch}
        _call(running.base, "POST", "/v2/op/update", workload.tenant, body, 204)
    group = workload.group()
    _call(running.base, "POST", "/v2/x/aggregations", workload.tenant, group, 201)
    shown = _call(running.base, "GET", f"/v2/x/aggregations/{group['id']}", workload.tenant)
    since = datetime.fromisoformat(shown["since"]).timestamp()
    subscriber = Subscriber(running.endpoints, workload)
    _say(
        args,
        f"{name}: {workload.sensors:,} sensors, groups per level "
        f"{[workload.groups(level) for level in range(len(workload.levels))]}, windows from "
        f"{shown['since']}",
    )
    steps: list[dict[str, Any]] = []
    try:
        time.sleep(max(0.0, since - time.time()))

        def step(rate: int) -> bool:
            after = steps[-1]["span"][1] if steps else 0.0  # the last step's last window
            if after is None:
                after = time.time() + workload.window
            steps.append(_step(args, running, publishers, subscriber, workload, rate, name, after))
            return bool(steps[-1]["sustained"])

        if args.rates:
            for rate in args.rates:
                step(rate)
            best = max((s["rate"] for s in steps if s["sustained"]), default=None)
        else:
            best, _tried = search(
                step, args.start_rate, highest=args.max_rate, lowest=LOWEST,
                precision=args.precision, steps=args.max_steps,
            )  # fmt: skip
    finally:
        subscriber.close()
        _call(
            running.base, "DELETE", f"/v2/x/aggregations/{group['id']}", workload.tenant, None, 204
        )
    at_best = next((s for s in reversed(steps) if s["rate"] == best and s["sustained"]), None)
    _say(args, f"{name}: highest sustained rate {best if best is not None else 'none'} updates/s")
    return {
        "uc": workload.uc,
        "stores": stores,
        "repeat": repeat,
        "sensors": workload.sensors,
        "groups": [workload.groups(level) for level in range(len(workload.levels))],
        "types": list(workload.types),
        "max_sustained_rate": best,
        "at_max": at_best,
        "steps": steps,
    }


def _step(
    args: argparse.Namespace,
    running: _Running,
    publishers: Publishers,
    subscriber: Subscriber,
    workload: Workload,
    rate: int,
    name: str,
    not_before: float,
) -> dict[str, Any]:
    """One rate for ``--step`` seconds from ``not_before`` on at the earliest (so that no
    window holds two steps' updates), drained and judged."""
    watched = _watched(running, publishers)
    mark = subscriber.count()  # the earlier steps' windows arrived before (or are left out)
    start = max(time.time() + 0.3, not_before)
    before = _cpu(watched)
    published = publishers.run(workload.tenant, workload.sensors, rate, start, args.step)
    after = _cpu(watched)
    seconds = max(time.time() - start, args.step)
    deadline = time.monotonic() + args.drain
    while not (drained := complete(workload, published, subscriber.arrivals(mark))):
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
    time.sleep(_SETTLE)
    arrivals = subscriber.arrivals(mark)
    judgement = judge(workload, published, arrivals, rate, start, args.step, drained)
    oracle = check(workload, published, arrivals)
    first_end, last_end = span(workload, published)
    latency = latencies(workload, arrivals, first_end, last_end)
    cores = _cores(running, publishers, before, after, seconds)
    top = latency[-1]
    _say(
        args,
        f"{name}: {rate:,}/s -> {judgement.achieved_per_s:,.0f}/s acknowledged, backlog trend "
        f"{judgement.input_trend:+.0%}, output lag {judgement.output_lag_s:.2f} s (trend "
        f"{judgement.output_trend_s_per_s:+.3f} s/s), {workload.types[-1]} p50/p99 "
        f"{top['p50_ms']:.0f}/{top['p99_ms']:.0f} ms, windows {oracle.windows_written:,} "
        f"(lost {oracle.lost_windows}, duplicated {oracle.duplicated}, wrong "
        f"{oracle.wrong_counts}): {'sustained' if judgement.sustained else 'NOT sustained'}"
        + (f" ({judgement.why})" if judgement.why else "")
        + f"; cores: stores {sum(cores['context-store']):.2f}, connection point "
        f"{cores['connection-point']:.2f}, machine {cores['machine']:.2f}",
    )
    return {
        "rate": rate,
        "seconds": args.step,
        "batches": len(published.first),  # publish batches (each split by store primary)
        **asdict(judgement),
        "latency": [
            {"type": t, **figures} for t, figures in zip(workload.types, latency, strict=True)
        ],
        "oracle": oracle.to_json(),
        "cores": cores,
        # the ends of the step's first and last windows (None: not known, a batch refused)
        "span": [first_end, last_end if math.isfinite(last_end) else None],
    }


# -- CPU ---------------------------------------------------------------------------------------


def _watched(running: _Running, publishers: Publishers) -> dict[int, str]:
    watched = dict(running.processes)
    if running.zookeeper is not None:
        watched[int(running.zookeeper)] = "zookeeper"
    for pid in publishers.pids:
        watched[pid] = "publishers"
    watched[psutil.Process().pid] = "bench"
    return watched


def _cpu(watched: dict[int, str]) -> dict[str, Any]:
    """CPU seconds so far of each watched process and of the machine."""
    out: dict[str, Any] = {"machine": _machine_busy()}
    for pid in watched:
        try:
            times = psutil.Process(pid).cpu_times()
            out[str(pid)] = times.user + times.system
        except psutil.Error:
            out[str(pid)] = 0.0
    return out


def _machine_busy() -> float:
    times = psutil.cpu_times()
    return float(sum(times) - times.idle - getattr(times, "iowait", 0.0))


def _cores(
    running: _Running,
    publishers: Publishers,
    before: dict[str, Any],
    after: dict[str, Any],
    seconds: float,
) -> dict[str, Any]:
    """Cores used over the step: each store, every other role, the publishers, the bench (its
    subscriber), the whole machine, and the rest of it (other work)."""
    watched = _watched(running, publishers)
    used = {pid: max(0.0, after[str(pid)] - before[str(pid)]) / seconds for pid in watched}
    cores: dict[str, Any] = {"context-store": []}
    for pid, role in sorted(watched.items()):
        if role == "context-store":
            cores["context-store"].append(round(used[pid], 2))
        else:
            cores[role] = round(cores.get(role, 0.0) + used[pid], 2)
    cores["machine"] = round((after["machine"] - before["machine"]) / seconds, 2)
    cores["other"] = round(max(0.0, cores["machine"] - sum(used.values())), 2)
    return cores


# -- HTTP --------------------------------------------------------------------------------------


def _call(
    base: str, method: str, path: str, tenant: str, body: Any = None, expect: int = 200
) -> Any:
    """One request to the front; its JSON answer (None if empty). RuntimeError if the
    status is not ``expect``."""
    host, port = base.removeprefix("http://").split(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=_HTTP_TIMEOUT)
    headers = {"Fiware-Service": tenant}
    data = None
    if body is not None:
        data = json.dumps(body)
        headers["Content-Type"] = "application/json"
    try:
        connection.request(method, path, body=data, headers=headers)
        answer = connection.getresponse()
        text = answer.read()
    finally:
        connection.close()
    if answer.status != expect:
        raise RuntimeError(f"{method} {path}: {answer.status} {text[:300]!r}")
    return json.loads(text) if text else None


# -- the report --------------------------------------------------------------------------------


def _parameters(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "ucs": list(args.ucs),
        "stores": list(args.stores),
        "sensors": {str(uc): args.sensor_counts[uc] for uc in args.ucs},
        "window_s": args.window,
        "step_s": args.step,
        "start_rate": args.start_rate,
        "max_rate": args.max_rate,
        "store_cap": args.store_cap,
        "precision": args.precision,
        "max_steps": args.max_steps,
        "rates": list(args.rates) if args.rates else None,
        "repeat": args.repeat,
        "publishers": args.publishers,
        "batch": args.batch,
        "in_flight": args.in_flight,
        "tick_s": args.tick,
        "drain_s": args.drain,
        "history": args.history,
    }


def _say(args: argparse.Namespace, message: str) -> None:
    if not args.quiet:
        print(f"[bench derived] {message}", file=sys.stderr, flush=True)
