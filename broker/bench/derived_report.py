"""The report of ``silbo bench derived``: the summary (``--json``), merged runs, the table and
the scaling curve (``--plot``)."""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from broker.bench.match import machine_info
from broker.bench.scale import source_commit
from broker.extras import require

__all__ = ["merged", "plot", "print_summary", "summary"]


def summary(
    args: argparse.Namespace, parameters: dict[str, Any], results: list[dict[str, Any]]
) -> dict[str, Any]:
    """The JSON object of ``--json``: the parameters, every run, and per use case and store
    count the median of the runs."""
    cases = []
    for uc in parameters["ucs"]:
        for stores in parameters["stores"]:
            runs = [r for r in results if r["uc"] == uc and r["stores"] == stores]
            rates = [r["max_sustained_rate"] for r in runs if r["max_sustained_rate"] is not None]
            cases.append(
                {
                    "uc": uc,
                    "stores": stores,
                    "max_sustained_rate": statistics.median(rates) if rates else None,
                    "runs": [r["max_sustained_rate"] for r in runs],
                    "latency": _median_latency([r["at_max"] for r in runs if r["at_max"]]),
                }
            )
    judged = [s for r in results for s in r["steps"] if s["drained"]]
    return {
        "benchmark": "derived",
        "command": getattr(args, "command_line", ""),
        "commit": source_commit(),
        "machine": machine_info(),
        "parameters": parameters,
        "cases": cases,
        "results": results,
        "ok": all(s["oracle"]["exact"] for s in judged),
    }


def merged(paths: list[Path]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The parameters of the first of these earlier ``--json`` outputs, and every run of
    them all (their repeats numbered on)."""
    results: list[dict[str, Any]] = []
    parameters: dict[str, Any] = {}
    for path in paths:
        earlier = json.loads(path.read_text())
        parameters = parameters or dict(earlier["parameters"])
        offset = 1 + max((r["repeat"] for r in results), default=-1)
        results += [{**r, "repeat": r["repeat"] + offset} for r in earlier["results"]]
    parameters["repeat"] = 1 + max((r["repeat"] for r in results), default=-1)
    return parameters, results


def _median_latency(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per level, the median over the runs of each latency figure at the highest rate."""
    if not steps:
        return []
    out = []
    for level, first in enumerate(steps[0]["latency"]):
        row: dict[str, Any] = {"type": first["type"]}
        for name in ("p50_ms", "p95_ms", "p99_ms", "max_ms"):
            row[name] = round(statistics.median(s["latency"][level][name] for s in steps), 1)
        out.append(row)
    return out


def print_summary(summary: dict[str, Any]) -> None:
    parameters = summary["parameters"]
    sensors = ", ".join(f"UC{uc} {n:,}" for uc, n in parameters["sensors"].items())
    print(
        f"sensors: {sensors}; tumbling windows of {parameters['window_s']} s, steps of "
        f"{parameters['step_s']:g} s, {parameters['repeat']} run(s) each"
    )
    print("uc  stores  max sustained/s (runs)        latency at it, per level: p50/p95/p99 ms")
    for case in summary["cases"]:
        rate = case["max_sustained_rate"]
        runs = ", ".join("-" if r is None else f"{r:,}" for r in case["runs"])
        latency = "; ".join(
            f"{row['type']} {row['p50_ms']:.0f}/{row['p95_ms']:.0f}/{row['p99_ms']:.0f}"
            for row in case["latency"]
        )
        shown = "none" if rate is None else f"{rate:,.0f}"
        print(f"{case['uc']:>2}  {case['stores']:>6}  {shown:>15} ({runs})  {latency}")
    for result in summary["results"]:
        for step in result["steps"]:
            oracle = step["oracle"]
            if not oracle["exact"] and step["drained"]:
                print(
                    f"UC{result['uc']}, {result['stores']} stores, {step['rate']:,}/s: windows "
                    f"lost {oracle['lost_windows']}, duplicated {oracle['duplicated']}, wrong "
                    f"counts {oracle['wrong_counts']}, values lost {oracle['lost_values']} / "
                    f"extra {oracle['extra_values']}"
                )
    print("result: " + ("ok" if summary["ok"] else "FAILED (the oracle found windows wrong)"))


def plot(summary: dict[str, Any], path: Path) -> None:
    """The scaling curve: the highest sustained rate by store count per use case (median,
    each run a dot, and the linear scaling of the one-store median dotted), and the latency
    at it (the top level's p50 and p99, medians)."""
    require("bench", "the plot of silbo bench derived")
    from matplotlib.figure import Figure

    figure = Figure(figsize=(11, 4.5), layout="constrained")
    rates, delays = figure.subplots(1, 2)
    ucs = summary["parameters"]["ucs"]
    for n, uc in enumerate(ucs):
        cases = [c for c in summary["cases"] if c["uc"] == uc]
        stores = [c["stores"] for c in cases]
        shift = (n - (len(ucs) - 1) / 2) * 0.06  # the two use cases' dots side by side
        color = f"C{n}"
        label = "UC2 downsampling" if uc == 2 else "UC4 hierarchical (3 levels)"
        median = [c["max_sustained_rate"] or 0 for c in cases]
        rates.plot(stores, median, marker="o", color=color, label=f"{label}, median")
        for case in cases:
            runs = [r or 0 for r in case["runs"]]
            rates.scatter([case["stores"] + shift] * len(runs), runs, s=14, color=color, alpha=0.5)
        if stores and median[0]:
            ideal = [median[0] * k / stores[0] for k in stores]
            rates.plot(stores, ideal, ls=":", color=color, alpha=0.6, label=f"UC{uc} linear")
        top = [c["latency"][-1] if c["latency"] else {"p50_ms": 0, "p99_ms": 0} for c in cases]
        delays.plot(
            stores, [t["p50_ms"] for t in top], marker="o", color=color, label=f"UC{uc} p50"
        )
        delays.plot(
            stores, [t["p99_ms"] for t in top], marker="s", ls="--", color=color,
            label=f"UC{uc} p99",
        )  # fmt: skip
    stores = summary["parameters"]["stores"]
    highest = max((r or 0 for c in summary["cases"] for r in c["runs"]), default=0)
    for axes in (rates, delays):
        axes.set_xticks(stores)
        axes.set_xlabel("context store processes")
        axes.set_ylim(bottom=0)
        axes.legend(fontsize=8)
    rates.set_ylim(top=max(highest * 1.15, 1))
    rates.set_ylabel("highest sustained input (updates/s)")
    delays.set_ylabel("window end to its top level's notification (ms)")
    machine = summary["machine"]
    sensors = ", ".join(f"UC{uc} {n:,}" for uc, n in summary["parameters"]["sensors"].items())
    cap = summary["parameters"].get("store_cap")
    capped = f",\neach store capped at {cap:,} writes/s (emulated capacity)" if cap else ""
    figure.suptitle(
        f"silbo bench derived: sensors {sensors}, {summary['parameters']['window_s']} s windows, "
        f"{summary['parameters']['repeat']} runs{capped}, {machine['cores']} cores shared by "
        "cluster, load and other work"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
