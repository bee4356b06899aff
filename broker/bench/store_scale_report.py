"""The figures of ``silbo bench store-scale`` from its records: per scale, per series, per
second, and the PNG.

Inputs are the drivers' records (broker.bench.store_scale_load), wall-clock times:

- the writer's calls, one row each: (sent, latency s, first write, writes, outcome);
- the reader's GETs, one row each: (sent, latency s, HTTP status; 0: no answer).

A scale's *window* is its whole operation, from the first new store started to the last
leaving one stopped (``began_s`` .. ``ended_s``, seconds from the drivers' start). Writes
*during* a scale are the calls sent in its window; writes *outside* are those sent in no
window, after the first second (the channels' set-up). Latencies are per write (a call's
latency counts once for each write it carried).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from broker.bench.store_scale_load import OK, REFUSED
from broker.extras import require

__all__ = ["plot", "reads_in", "scale_figures", "series_figures", "timeline", "writes_in"]

WARMUP_S: Final = 1.0
Windows = Sequence[tuple[float, float]]  # (began, ended), seconds from the drivers' start


def writes_in(calls: npt.NDArray[np.float64], mask: npt.NDArray[np.bool_]) -> dict[str, float]:
    """The writes of the calls ``mask`` selects: acknowledged, refused, failed, and the
    latency p50 / p99 (ms) of the acknowledged ones."""
    chosen = calls[mask]
    counts, outcomes = chosen[:, 3].astype(np.int64), chosen[:, 4]
    ok = outcomes == OK
    latency = np.repeat(chosen[ok, 1], counts[ok]) * 1000.0
    p50, p99 = _percentiles(latency, (50, 99))
    return {
        "acknowledged": int(counts[ok].sum()),
        "refused": int(counts[outcomes == REFUSED].sum()),
        "failed": int(counts[(outcomes != OK) & (outcomes != REFUSED)].sum()),
        "p50_ms": p50,
        "p99_ms": p99,
    }


def reads_in(reads: npt.NDArray[np.float64], mask: npt.NDArray[np.bool_]) -> dict[str, float]:
    """The GETs ``mask`` selects: how many, the errors (not 200), latency p50 / p99 / max."""
    chosen = reads[mask]
    p50, p99 = _percentiles(chosen[:, 1] * 1000.0, (50, 99))
    return {
        "reads": len(chosen),
        "errors": int(np.count_nonzero(chosen[:, 2] != 200)),
        "p50_ms": p50,
        "p99_ms": p99,
        "max_ms": round(float(chosen[:, 1].max()) * 1000.0, 2) if len(chosen) else 0.0,
    }


def scale_figures(
    record: dict[str, Any],
    calls: npt.NDArray[np.float64],
    reads: npt.NDArray[np.float64],
    origin: float,
) -> dict[str, Any]:
    """A scale's record with the writes and GETs during it."""
    window = [(record["began_s"], record["ended_s"])]
    writes = writes_in(calls, _inside(calls[:, 0] - origin, window))
    gets = reads_in(reads, _inside(reads[:, 0] - origin, window))
    return {
        **record,
        "writes_acknowledged": writes["acknowledged"],
        "writes_refused": writes["refused"],
        "writes_failed": writes["failed"],
        "write_p50_ms": writes["p50_ms"],
        "write_p99_ms": writes["p99_ms"],
        "get_reads": gets["reads"],
        "get_p99_ms": gets["p99_ms"],
        "get_max_ms": gets["max_ms"],
        "get_errors": gets["errors"],
    }


def series_figures(
    calls: npt.NDArray[np.float64],
    reads: npt.NDArray[np.float64],
    origin: float,
    windows: Windows,
) -> dict[str, Any]:
    """Writes and GETs of a whole series, and those outside its scales."""
    sent = calls[:, 0] - origin
    outside = ~_inside(sent, windows) & (sent >= WARMUP_S)
    read_sent = reads[:, 0] - origin
    return {
        "writes": writes_in(calls, np.ones(len(calls), dtype=bool)),
        "writes_outside": writes_in(calls, outside),
        "reads": reads_in(reads, np.ones(len(reads), dtype=bool)),
        "reads_outside": reads_in(reads, ~_inside(read_sent, windows) & (read_sent >= WARMUP_S)),
    }


def timeline(
    calls: npt.NDArray[np.float64],
    reads: npt.NDArray[np.float64],
    origin: float,
    seconds: int,
    stores: Sequence[tuple[float, int]],
) -> dict[str, list[float | None]]:
    """Per second t: writes offered (sent) and acknowledged (answered), write p99 (by send
    second), GET p50 / p99 and errors (by send second), the stores of the layout."""
    sent = calls[:, 0] - origin
    counts = calls[:, 3]
    ok = calls[:, 4] == OK
    answered = sent + calls[:, 1]
    second = np.floor(sent).astype(np.int64)
    read_second = np.floor(reads[:, 0] - origin).astype(np.int64)
    columns: dict[str, list[float | None]] = {
        "t": [float(t) for t in range(seconds)],
        "offered_per_s": _per_second(sent, counts, seconds),
        "acknowledged_per_s": _per_second(answered[ok], counts[ok], seconds),
        "write_p99_ms": [],
        "get_p50_ms": [],
        "get_p99_ms": [],
        "get_errors": [],
        "stores": [float(_stores_at(stores, t + 1.0)) for t in range(seconds)],
    }
    for t in range(seconds):
        here = (second == t) & ok
        latency = np.repeat(calls[here, 1], calls[here, 3].astype(np.int64)) * 1000.0
        columns["write_p99_ms"].append(_percentiles(latency, (99,))[0] if len(latency) else None)
        chosen = reads[read_second == t]
        good = chosen[chosen[:, 2] == 200, 1] * 1000.0
        p50, p99 = _percentiles(good, (50, 99))
        columns["get_p50_ms"].append(p50 if len(good) else None)
        columns["get_p99_ms"].append(p99 if len(good) else None)
        columns["get_errors"].append(float(np.count_nonzero(chosen[:, 2] != 200)))
    return columns


def _per_second(
    moments: npt.NDArray[np.float64], weights: npt.NDArray[np.float64], seconds: int
) -> list[float | None]:
    inside = (moments >= 0) & (moments < seconds)
    slots = np.floor(moments[inside]).astype(np.int64)
    return [float(x) for x in np.bincount(slots, weights[inside], minlength=seconds)[:seconds]]


def _stores_at(changes: Sequence[tuple[float, int]], moment: float) -> int:
    held = changes[0][1]
    for at, count in changes:
        if at <= moment:
            held = count
    return held


def _inside(moments: npt.NDArray[np.float64], windows: Windows) -> npt.NDArray[np.bool_]:
    mask = np.zeros(len(moments), dtype=bool)
    for began, ended in windows:
        mask |= (moments >= began) & (moments <= ended)
    return mask


def _percentiles(values: npt.NDArray[np.float64], which: tuple[int, ...]) -> tuple[float, ...]:
    if not len(values):
        return tuple(0.0 for _ in which)
    return tuple(round(float(np.percentile(values, p)), 2) for p in which)


# -- the PNG -----------------------------------------------------------------------------------


def plot(summary: dict[str, Any], path: Path) -> None:
    """Write the time lines as a PNG: one column per size; writes/s, latencies (write p99,
    GET p50 / p99) and the stores over time, each scale's operation marked."""
    require("bench", "the plot of silbo bench store-scale")
    from matplotlib.figure import Figure

    series = summary["series"]
    figure = Figure(figsize=(max(10.0, 6.5 * len(series)), 8.5), layout="constrained")
    axes = figure.subplots(3, len(series), sharex="col", squeeze=False)
    for column, one in enumerate(series):
        rates, latencies, stores = axes[:, column]
        _draw(one, rates, latencies, stores, legend=column == 0)
        for n, scale in enumerate(s for s in summary["scales"] if s["size"] == one["size"]):
            _mark(scale, (rates, latencies, stores), legend=column == 0 and n == 0)
        rates.set_title(f"{one['size']:,} entities", fontsize=10)
    figure.legend(loc="outside lower center", ncols=4, fontsize=8, frameon=False)
    parameters = summary["parameters"]
    figure.suptitle(
        f"silbo bench store-scale: context stores {'->'.join(map(str, parameters['steps']))}, "
        f"replicas {parameters['replicas']}\n{parameters['rate']:,} writes/s (\\$inc) offered "
        f"through a store client, {parameters['read_rate']} GETs/s through the HTTP front"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)


def _draw(one: dict[str, Any], rates: Any, latencies: Any, stores: Any, *, legend: bool) -> None:
    line = {k: np.array(v, dtype=np.float64) for k, v in one["timeline"].items()}
    t = line["t"] + 0.5  # each second's figure at its middle

    def label(text: str) -> str | None:
        return text if legend else None  # one legend entry for the figure

    rates.plot(t, line["offered_per_s"], color="0.6", ls="--", lw=1, label=label("offered"))
    rates.plot(t, line["acknowledged_per_s"], color="C0", lw=1.5, label=label("acknowledged"))
    rates.set_ylabel("writes/s")
    rates.set_ylim(bottom=0)
    latencies.plot(t, line["write_p99_ms"], color="C3", lw=1.2, label=label("write p99"))
    latencies.plot(t, line["get_p99_ms"], color="C4", lw=1.2, label=label("GET p99"))
    latencies.plot(t, line["get_p50_ms"], color="C2", lw=1.0, label=label("GET p50"))
    latencies.set_yscale("log")
    latencies.set_ylabel("latency, ms (by send second)")
    changes = one["stores"]  # [from when, count], the first at 0
    moments = [at for at, _count in changes] + [float(len(t))]
    counts = [count for _at, count in changes]
    stores.step(moments, [*counts, counts[-1]], where="post", color="C5", label=label("stores"))
    stores.set_ylabel("context stores in the layout")
    stores.set_ylim(0, max(counts) + 1)
    stores.yaxis.get_major_locator().set_params(integer=True)
    stores.set_xlabel("seconds since the writer started")


def _mark(scale: dict[str, Any], axes: Sequence[Any], *, legend: bool) -> None:
    for n, ax in enumerate(axes):
        ax.axvspan(
            scale["began_s"], scale["ended_s"], color="C1", alpha=0.25, lw=0,
            label="scale (whole operation)" if legend and n == 0 else None,
        )  # fmt: skip
    text = (
        f"{scale['from']}->{scale['to']}: {scale['seconds']:.1f} s, "
        f"{scale['moved_keys']:,} keys" + ("" if scale["outcome"] == "completed" else " (!)")
    )
    axes[0].annotate(
        text, (scale["began_s"], 1.0), xycoords=("data", "axes fraction"), xytext=(3, -12),
        textcoords="offset points", fontsize=8,
    )  # fmt: skip
