"""The time line of a benchmark run, per second, and its PNG (``silbo bench scale``).

Inputs are per-update times in seconds from the run's first publish: when each update was
published, and when it was *completed* (its last expected notification arrived; NaN if it
never was). From them:

- :func:`timeline`: per second, updates offered and completed, p50/p99 latency of the
  updates published in that second, and the matchers configured;
- :func:`window_rate`, :func:`longest_gap` and :func:`throughput_around`: throughput in a
  window, and around one scale;
- :func:`plot`: two stacked panels sharing the time axis (updates/s; p50 and p99 latency),
  each scale marked (the whole operation in grey, the protocol's window in orange).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from broker.extras import require

__all__ = [
    "WINDOW_S",
    "ScaleWindow",
    "longest_gap",
    "matchers_at",
    "plot",
    "throughput_around",
    "timeline",
    "window_rate",
]

WINDOW_S = 5.0  # seconds before and after a scale that its throughput is compared with
MIN_DURING_S = 1.0  # the shortest window "during" a scale is measured over


@dataclass(frozen=True, slots=True)
class ScaleWindow:
    """When a scale ran, in seconds from the first publish."""

    began: float  # the operation (new processes started first, for a scale-out)
    protocol_began: float
    protocol_ended: float
    ended: float  # the operation (leaving processes stopped, for a scale-in)


def timeline(
    published_at: npt.NDArray[np.float64],
    completed_at: npt.NDArray[np.float64],
    seconds: int,
    matchers: Sequence[tuple[float, int]],
) -> dict[str, list[float | None]]:
    """Per second ``t`` of ``seconds``: offered and completed updates/s, p50/p99 latency (ms).

    ``published_at[i]``/``completed_at[i]``: update i's publish and completion times
    (seconds from the first publish; NaN if never completed); ``matchers``: ``(time, count)``
    from which each configuration held, the first at 0. A second whose published updates
    did not all complete has the latency of those that did (none: None).
    """
    done = ~np.isnan(completed_at)
    offered = _per_second(published_at, seconds)
    completed = _per_second(completed_at[done], seconds)
    latency_ms = (completed_at - published_at) * 1000.0
    second = np.floor(published_at).astype(np.int64)
    p50: list[float | None] = []
    p99: list[float | None] = []
    for t in range(seconds):
        chosen = latency_ms[(second == t) & done]
        p50.append(round(float(np.percentile(chosen, 50)), 2) if len(chosen) else None)
        p99.append(round(float(np.percentile(chosen, 99)), 2) if len(chosen) else None)
    return {
        "t": [float(t) for t in range(seconds)],
        "offered_per_s": [float(n) for n in offered],
        "updates_per_s": [float(n) for n in completed],
        "p50_ms": p50,
        "p99_ms": p99,
        "matchers": [float(matchers_at(matchers, t + 1.0)) for t in range(seconds)],
    }


def _per_second(moments: npt.NDArray[np.float64], seconds: int) -> npt.NDArray[np.int64]:
    """How many of ``moments`` fall in each ``[t, t + 1)`` for t in 0 to ``seconds - 1``."""
    inside = moments[(moments >= 0) & (moments < seconds)]
    return np.bincount(np.floor(inside).astype(np.int64), minlength=seconds)


def matchers_at(changes: Sequence[tuple[float, int]], moment: float) -> int:
    """The matchers configured at ``moment``: ``changes`` are ``(from when, count)``."""
    held = changes[0][1]
    for at, count in changes:
        if at <= moment:
            held = count
    return held


def window_rate(completed_at: npt.NDArray[np.float64], start: float, end: float) -> float:
    """Updates completed in ``[start, end)``, per second."""
    if end <= start:
        return 0.0
    inside = (completed_at >= start) & (completed_at < end)
    return float(np.count_nonzero(inside)) / (end - start)


def longest_gap(completed_at: npt.NDArray[np.float64], start: float, end: float) -> float:
    """The longest time (ms) within ``[start, end]`` in which no update completed."""
    inside = completed_at[(completed_at >= start) & (completed_at <= end)]
    moments = np.concatenate(([start], np.sort(inside), [end]))
    return round(float(np.max(np.diff(moments))) * 1000.0, 1)


def throughput_around(
    window: ScaleWindow,
    completed_at: npt.NDArray[np.float64],
    updates_per_s: Sequence[float | None],
) -> dict[str, float | None]:
    """A scale's throughput before, during and after it, and the longest completion gaps.

    ``before_per_s``: the median of ``updates_per_s`` (the time line's series) over the
    whole seconds of the ``WINDOW_S`` before the scale began; ``during_per_s``: updates
    completed per second from the protocol's start to its end, or to ``MIN_DURING_S`` after
    its start if it was shorter (completions arrive in batches: a shorter window would
    measure their spacing); ``operation_per_s``: the same from the start of the whole
    operation (new processes started) to its end (old ones stopped); ``after_per_s``: over
    the ``WINDOW_S`` after the protocol; ``ratio``: during / before; ``longest_gap_ms``: the
    longest time in the protocol's window in which no update completed (``gap_before_ms``:
    the same over the ``WINDOW_S`` before the scale).
    """
    first = max(0, int(np.floor(window.began - WINDOW_S)))
    last = max(first, int(np.floor(window.began)))
    whole_seconds = [n for n in updates_per_s[first:last] if n is not None]
    before = float(statistics.median(whole_seconds)) if whole_seconds else 0.0
    during_end = max(window.protocol_ended, window.protocol_began + MIN_DURING_S)
    during = window_rate(completed_at, window.protocol_began, during_end)
    operation = window_rate(completed_at, window.began, window.ended)
    after = window_rate(completed_at, window.protocol_ended, window.protocol_ended + WINDOW_S)
    return {
        "before_per_s": round(before, 1),
        "during_per_s": round(during, 1),
        "operation_per_s": round(operation, 1),
        "after_per_s": round(after, 1),
        "ratio": round(during / before, 3) if before > 0 else None,
        "longest_gap_ms": longest_gap(completed_at, window.protocol_began, window.protocol_ended),
        "gap_before_ms": longest_gap(completed_at, max(0.0, window.began - WINDOW_S), window.began),
    }


def plot(summary: dict[str, Any], path: Path) -> None:
    """Write the time line as a PNG: updates/s above, p50/p99 latency below, scales marked."""
    # imported here: every silbo command loads this module, few of them plot
    require("bench", "the plot of silbo bench")
    from matplotlib.figure import Figure

    column = {key: np.array(values, dtype=np.float64) for key, values in summary["series"].items()}
    t = column["t"] + 0.5  # each second's figure at its middle
    figure = Figure(figsize=(11, 6.5), layout="constrained")
    rate_axes, latency_axes = figure.subplots(2, 1, sharex=True)
    rate_axes.plot(t, column["offered_per_s"], color="0.6", ls="--", lw=1, label="offered")
    rate_axes.plot(t, column["updates_per_s"], color="C0", lw=1.5, label="completed")
    rate_axes.set_ylabel("updates/s")
    rate_axes.set_ylim(bottom=0)
    latency_axes.plot(t, column["p50_ms"], color="C2", lw=1.2, label="p50")
    latency_axes.plot(t, column["p99_ms"], color="C3", lw=1.2, label="p99")
    latency_axes.set_ylabel("latency (ms, by publish second)")
    latency_axes.set_yscale("log")
    latency_axes.set_xlabel("seconds since the first publish")
    for i, scale in enumerate(summary["scales"]):
        _mark(rate_axes, latency_axes, scale, legend=i == 0)
    figure.legend(loc="outside lower center", ncols=6, fontsize=8, frameon=False)
    workload = summary["workload"]
    figure.suptitle(
        f"silbo bench scale: W-IoT, {workload['subscriptions']:,} subscriptions, matchers "
        f"{'->'.join(map(str, workload['steps']))}, {workload['rate']:,} updates/s offered"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)


def _mark(rate_axes: Any, latency_axes: Any, scale: dict[str, Any], *, legend: bool) -> None:
    for axes in (rate_axes, latency_axes):
        labelled = legend and axes is rate_axes  # one legend entry for the figure
        axes.axvspan(
            scale["began_s"],
            scale["ended_s"],
            color="0.85",
            lw=0,
            label="matchers started / stopped" if labelled else None,
        )
        axes.axvspan(
            scale["protocol_began_s"],
            scale["protocol_ended_s"],
            color="C1",
            alpha=0.4,
            label="scale protocol" if labelled else None,
        )
    label = (
        f"{scale['from']}->{scale['to']}: {scale['duration_s']:.2f} s, "
        f"{scale['moved_subscriptions']:,} moved"
        + ("" if scale["outcome"] == "completed" else f" ({scale['outcome']})")
    )
    rate_axes.annotate(
        label,
        (scale["protocol_began_s"], 1.0),
        xycoords=("data", "axes fraction"),
        xytext=(3, -12),
        textcoords="offset points",
        fontsize=8,
        rotation=0,
    )
