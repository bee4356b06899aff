"""What ``silbo bench derived`` judges: the oracle of the derived windows, whether a load was
sustained (Theodolite's lag trend), and the search for the highest sustained rate.

Pure functions over what the publishers and the subscriber recorded (broker.bench.
derived_load), no I/O, so that tests check them without a cluster.

**The oracle** (:func:`check`). A store counts a value in the window of the moment it
applied the write, which lies between the moment its batch was sent and the moment it was
acknowledged (the store answers after counting it). So each acknowledged update is
*certainly* in one window when both moments fall in it, and *possibly* in each window
between them otherwise. At every level of the group, per derived entity:

- every window holding a certain update must be written (else ``lost_windows``), and any
  window written must hold at least its certain updates and at most its possible ones
  (else ``wrong_counts``; a window no update could be in is ``unexpected``);
- each window is notified once (``duplicated``: the notifications after the first; a
  ``correction`` is one with other values);
- over the step, the counts of an entity's windows add up to its acknowledged updates and
  their sums to their values (``lost_values``, ``extra_values``, ``wrong_sums``): every
  update counted once at every level, in some window.

A refused batch (not acknowledged) may or may not have been applied: its updates widen the
bounds and the totals (``refused``) rather than count as lost or extra.

**Sustained** (:func:`judge`), as Theodolite's *lag trend*: a linear regression over the
step, after a warm-up, of the input's backlog (updates offered by the rate and not yet
acknowledged: the publisher held back) and of the output's lag (how long after a window's
end its last derived notification arrived), each slope below a threshold; and the drain
ended with every window of the step (:func:`complete`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from broker.bench.derived_load import Arrival, Published, Workload

__all__ = [
    "INPUT_TREND",
    "OUTPUT_TREND",
    "WARMUP",
    "Judgement",
    "Oracle",
    "check",
    "complete",
    "judge",
    "latencies",
    "search",
    "span",
    "windows_due",
]

WARMUP: Final = 1.0  # seconds of a step left out of the trends
INPUT_TREND: Final = 0.05  # the backlog may grow at most this share of the rate
OUTPUT_TREND: Final = 0.1  # the output lag may grow at most this many seconds per second
_SAMPLE: Final = 0.25  # seconds between the backlog's samples
_EXAMPLES: Final = 5  # windows found wrong shown per step


@dataclass(slots=True)
class Oracle:
    """The derived windows of one step against its inputs (module doc)."""

    updates: int = 0  # acknowledged
    refused: int = 0  # in refused batches (applied or not)
    windows_expected: int = 0  # windows holding a certain update, every level
    windows_written: int = 0  # distinct windows notified, every level
    notifications: int = 0
    duplicated: int = 0
    corrections: int = 0
    lost_windows: int = 0
    wrong_counts: int = 0
    unexpected: int = 0
    lost_values: int = 0
    extra_values: int = 0
    wrong_sums: int = 0
    by_level: list[dict[str, int]] = field(default_factory=list)
    # a few of the windows found wrong: level, group, end, what was notified and the bounds
    examples: list[dict[str, Any]] = field(default_factory=list)

    @property
    def exact(self) -> bool:
        """Every window once, with the right values, nothing lost or added."""
        return not any(
            (self.duplicated, self.lost_windows, self.wrong_counts, self.unexpected,
             self.lost_values, self.extra_values, self.wrong_sums)
        )  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "exact": self.exact}


@dataclass(slots=True)
class Judgement:
    """Whether one step's load was sustained, and why (module doc)."""

    offered: int = 0  # updates the rate asked for over the step
    published: int = 0
    acknowledged: int = 0
    achieved_per_s: float = 0.0  # acknowledged a second, to the last acknowledgement
    input_trend: float = 0.0  # the backlog's slope over the rate (0: kept up)
    output_trend_s_per_s: float = 0.0  # the output lag's slope
    output_lag_s: float = 0.0  # the last window's lag
    drained: bool = False
    sustained: bool = False
    why: str = ""


def _ends(times: npt.NDArray[np.float64], window: float) -> npt.NDArray[np.float64]:
    """The end of the window holding each moment."""
    return (np.floor(times / window) + 1) * window


def windows_due(workload: Workload, published: Published) -> set[tuple[int, int, float]]:
    """(level, group number, window end) of every window holding a certain update: those
    the drain waits for."""
    sent, acked = published.per_update()
    window = float(workload.window)
    ok = np.isfinite(acked)
    low = _ends(sent, window)
    sure = ok & (low == _ends(np.where(ok, acked, 0.0), window))
    due: set[tuple[int, int, float]] = set()
    for level in range(len(workload.levels)):
        keys = workload.keys(level)[published.sensor[sure]]
        due |= {(level, k, e) for k, e in zip(keys.tolist(), low[sure].tolist(), strict=True)}
    return due


def span(workload: Workload, published: Published) -> tuple[float, float]:
    """The ends of the first and the last window the step's updates may be in (the last:
    infinite if a batch was refused, its updates' windows are not known)."""
    if not len(published.sensor):
        return math.inf, -math.inf
    window = float(workload.window)
    sent, acked = published.per_update()
    ok = np.isfinite(acked)
    first = float(_ends(sent, window).min())
    if not ok.all():
        return first, math.inf
    return first, float(_ends(acked, window).max())


def complete(workload: Workload, published: Published, arrivals: Sequence[Arrival]) -> bool:
    """Whether every window of the step has arrived: each holding a certain update, and at
    every level windows counting at least the updates acknowledged (the drain waits for
    this: a window holding only updates sent in one window and acknowledged in the next is
    known to exist only by the count)."""
    have = {(a.level, a.number, a.end) for a in arrivals}
    if windows_due(workload, published) - have:
        return False
    first, last = span(workload, published)
    acknowledged = int(np.isfinite(published.per_update()[1]).sum())
    for level in range(len(workload.levels)):
        latest: dict[tuple[int, float], Arrival] = {}
        for a in arrivals:
            if a.level == level and first <= a.end <= last:
                known = latest.get((a.number, a.end))
                if known is None or a.at >= known.at:
                    latest[(a.number, a.end)] = a
        if sum(a.count for a in latest.values()) < acknowledged:
            return False
    return True


def check(workload: Workload, published: Published, arrivals: Sequence[Arrival]) -> Oracle:
    """The oracle of one step (module doc); ``arrivals`` may hold other steps' windows,
    which are left out (those outside the step's span)."""
    oracle = Oracle()
    if not len(published.sensor):
        return oracle
    window = float(workload.window)
    sent, acked = published.per_update()
    ok = np.isfinite(acked)
    oracle.updates, oracle.refused = int(ok.sum()), int((~ok).sum())
    low = _ends(sent, window)
    high = np.where(ok, _ends(np.where(ok, acked, 0.0), window), math.inf)
    first_end, last_end = span(workload, published)
    ours = [a for a in arrivals if first_end <= a.end <= last_end]
    for level in range(len(workload.levels)):
        counts = _level(workload, level, published, ok, low, high, ours, oracle.examples)
        oracle.by_level.append(counts)
        for name, value in counts.items():
            if hasattr(oracle, name) and name not in ("updates", "refused"):
                setattr(oracle, name, getattr(oracle, name) + value)
    return oracle


def _level(
    workload: Workload,
    level: int,
    published: Published,
    ok: npt.NDArray[np.bool_],
    low: npt.NDArray[np.float64],
    high: npt.NDArray[np.float64],
    arrivals: Sequence[Arrival],
    examples: list[dict[str, Any]],
) -> dict[str, int]:
    keys = workload.keys(level)[published.sensor]
    groups = workload.groups(level)
    window = float(workload.window)
    certain: dict[tuple[int, float], int] = defaultdict(int)
    possible: dict[tuple[int, float], int] = defaultdict(int)
    sure = ok & (low == high)
    for key, end in zip(keys[sure].tolist(), low[sure].tolist(), strict=True):
        certain[(key, end)] += 1
        possible[(key, end)] += 1
    for i in np.flatnonzero(~sure).tolist():
        last = float(high[i]) if ok[i] else float(low[i]) + 3600.0  # refused: any later
        end = float(low[i])
        while end <= last:
            possible[(int(keys[i]), end)] += 1
            end += window
    maybe = np.bincount(keys[~ok], minlength=groups)
    expected = np.bincount(keys[ok], minlength=groups)
    expected_sum = np.bincount(keys[ok], weights=published.value[ok], minlength=groups)
    written: dict[tuple[int, float], list[Arrival]] = defaultdict(list)
    for arrival in arrivals:
        if arrival.level == level:
            written[(arrival.number, arrival.end)].append(arrival)
    out = dict.fromkeys(
        ("windows_expected", "windows_written", "notifications", "duplicated", "corrections",
         "lost_windows", "wrong_counts", "unexpected", "lost_values", "extra_values",
         "wrong_sums"),
        0,
    )  # fmt: skip
    out["windows_expected"] = len(certain)
    out["windows_written"] = len(written)
    counted = np.zeros(groups, dtype=np.int64)
    counted_sum = np.zeros(groups, dtype=np.float64)
    for (key, end), notified in written.items():
        notified.sort(key=lambda a: a.at)
        final = notified[-1]
        out["notifications"] += len(notified)
        out["duplicated"] += len(notified) - 1
        out["corrections"] += sum(
            1 for a in notified[1:] if (a.count, a.total) != (notified[0].count, notified[0].total)
        )
        bounds = (certain.get((key, end), 0), possible.get((key, end), 0))
        if not 0 <= key < groups or (key, end) not in possible:
            out["unexpected"] += 1
            _example(examples, "unexpected", level, key, end, notified, bounds)
            continue
        if not bounds[0] <= final.count <= bounds[1]:
            out["wrong_counts"] += 1
            _example(examples, "wrong count", level, key, end, notified, bounds)
        counted[key] += final.count
        counted_sum[key] += final.total
    lost = [k for k in certain if k not in written]
    out["lost_windows"] = len(lost)
    for key, end in lost:
        _example(examples, "lost", level, key, end, [], (certain[(key, end)], possible[(key, end)]))
    out["lost_values"] = int(np.maximum(expected - counted, 0).sum())
    out["extra_values"] = int(np.maximum(counted - expected - maybe, 0).sum())
    exact = (counted == expected) & (maybe == 0)
    out["wrong_sums"] = int((exact & (counted_sum != expected_sum)).sum())
    return out


def _example(
    examples: list[dict[str, Any]],
    kind: str,
    level: int,
    key: int,
    end: float,
    notified: Sequence[Arrival],
    bounds: tuple[int, int],
) -> None:
    if len(examples) < _EXAMPLES:
        examples.append(
            {
                "kind": kind,
                "level": level,
                "group": key,
                "end": end,
                "counts": [a.count for a in notified],
                "arrived_after_end_s": [round(a.at - end, 3) for a in notified],
                "certain": bounds[0],
                "possible": bounds[1],
            }
        )


def latencies(
    workload: Workload, arrivals: Sequence[Arrival], first: float, last: float
) -> list[dict[str, float]]:
    """Per level, how long after its window's end each window was first notified (windows
    ending in ``[first, last]``): p50 / p95 / p99 / max in ms, and how many."""
    out = []
    for level in range(len(workload.levels)):
        firsts: dict[tuple[int, float], float] = {}
        for a in arrivals:
            if a.level == level and first <= a.end <= last:
                key = (a.number, a.end)
                firsts[key] = min(firsts.get(key, math.inf), a.at - a.end)
        values = np.array(list(firsts.values()), dtype=np.float64) * 1000
        if not len(values):
            out.append({"windows": 0, "p50_ms": 0.0, "p95_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0})
            continue
        p50, p95, p99 = np.percentile(values, (50, 95, 99))
        out.append(
            {
                "windows": len(values),
                "p50_ms": round(float(p50), 1),
                "p95_ms": round(float(p95), 1),
                "p99_ms": round(float(p99), 1),
                "max_ms": round(float(values.max()), 1),
            }
        )
    return out


def judge(
    workload: Workload,
    published: Published,
    arrivals: Sequence[Arrival],
    rate: float,
    start: float,
    seconds: float,
    drained: bool,
) -> Judgement:
    """Whether the step (``rate`` updates a second from ``start`` for ``seconds``) was
    sustained (module doc)."""
    out = Judgement(drained=drained)
    out.offered = int(rate * seconds)
    out.published = len(published.sensor)
    _sent, acked = published.per_update()
    done = np.sort(acked[np.isfinite(acked)])
    out.acknowledged = len(done)
    # over the step, or until its last acknowledgement if that came later (the publisher was
    # held back: what was due by the end went late)
    took = max(seconds, float(done[-1]) - start) if len(done) else seconds
    out.achieved_per_s = round(out.acknowledged / took, 1)
    moments = np.arange(start + min(WARMUP, seconds / 2), start + seconds, _SAMPLE)
    if len(moments) >= 2:
        backlog = rate * (moments - start) - np.searchsorted(done, moments, side="right")
        out.input_trend = round(float(np.polyfit(moments - start, backlog, 1)[0]) / rate, 4)
    window = float(workload.window)
    completed: dict[float, float] = {}
    for a in arrivals:
        if start + min(WARMUP, seconds / 2) <= a.end - window and a.end <= start + seconds + window:
            completed[a.end] = max(completed.get(a.end, -math.inf), a.at - a.end)
    if completed:
        ends = np.array(sorted(completed))
        lags = np.array([completed[e] for e in ends])
        out.output_lag_s = round(float(lags[-1]), 3)
        if len(ends) >= 2:
            out.output_trend_s_per_s = round(float(np.polyfit(ends, lags, 1)[0]), 4)
    reasons = []
    if published.errors:
        reasons.append(f"publisher errors ({published.errors[0]})")
    if out.input_trend > INPUT_TREND:
        reasons.append(f"input backlog grew ({out.input_trend:.0%} of the rate)")
    if out.achieved_per_s < (1 - INPUT_TREND) * rate:
        reasons.append(f"{out.achieved_per_s:,.0f} updates/s acknowledged")
    if out.output_trend_s_per_s > OUTPUT_TREND:
        reasons.append(f"output lag grew {out.output_trend_s_per_s:.2f} s/s")
    if not drained:
        reasons.append("windows still missing after the drain")
    if not completed and out.acknowledged:
        reasons.append("no derived window arrived")
    out.sustained = not reasons
    out.why = "; ".join(reasons)
    return out


def search(
    sustained: Callable[[int], bool],
    start: int,
    *,
    highest: int,
    lowest: int,
    precision: float,
    steps: int,
) -> tuple[int | None, list[tuple[int, bool]]]:
    """The highest rate ``sustained`` holds: doubled from ``start`` while held (halved while
    not), then halved between the highest held and the lowest not, until they are within
    ``precision`` (a share) of each other or ``steps`` rates were tried; the rates tried."""
    tried: list[tuple[int, bool]] = []
    held: int | None = None
    failed: int | None = None
    rate = start
    while len(tried) < steps:
        ok = sustained(rate)
        tried.append((rate, ok))
        if ok:
            held = max(held or 0, rate)
        else:
            failed = rate if failed is None else min(failed, rate)
        if failed is None:
            rate *= 2
            if rate > highest:
                break
        elif held is None:
            rate //= 2
            if rate < lowest:
                break
        else:
            if failed <= held * (1 + precision):
                break
            rate = _rounded((held + failed) / 2)
            if rate in (held, failed):
                break
    return held, tried


def _rounded(rate: float) -> int:
    """A rate rounded to two significant figures (a search's steps read plainly)."""
    digits = max(0, int(math.log10(max(rate, 1))) - 1)
    return int(round(rate / 10**digits) * 10**digits)
