"""The numeric interval index agrees with a direct evaluation of every interval."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.matching import attribute_index
from broker.matching.attribute_index import NumericIndex
from broker.matching.bitset import positions
from broker.matching.constraint import Interval

_ENDS = st.one_of(
    st.integers(min_value=-5, max_value=5).map(float),
    st.floats(min_value=-10, max_value=10, allow_nan=False),
)


def _interval(low: float | None, low_open: bool, high: float | None, high_open: bool) -> Interval:
    return Interval(
        -math.inf if low is None else low,
        low_open and low is not None,
        math.inf if high is None else high,
        high_open and high is not None,
    )


_INTERVALS = st.builds(
    _interval, st.none() | _ENDS, st.booleans(), st.none() | _ENDS, st.booleans()
)


def _contains(interval: Interval, x: float) -> bool:
    above = x > interval.low or (x == interval.low and not interval.low_open)
    below = x < interval.high or (x == interval.high and not interval.high_open)
    return above and below


def _check(intervals: list[Interval], probes: list[float]) -> None:
    entries = list(enumerate(intervals))
    index = NumericIndex(entries, len(intervals))
    for x in probes:
        possible, sure = index.lookup(x)
        truth = {p for p, i in entries if _contains(i, x)}
        assert set(positions(sure)) <= truth, (x, intervals)
        assert truth <= set(positions(possible)), (x, intervals)


@settings(max_examples=300)
@given(st.lists(_INTERVALS, min_size=1, max_size=40), st.lists(_ENDS, max_size=30))
def test_exact_regions(intervals: list[Interval], probes: list[float]) -> None:
    ends = [e for i in intervals for e in (i.low, i.high) if math.isfinite(e)]
    _check(intervals, probes + ends + [-1e9, 1e9])
    # with few ends the index is exact: possible == sure
    index = NumericIndex(list(enumerate(intervals)), len(intervals))
    for x in probes + ends:
        possible, sure = index.lookup(x)
        assert possible == sure


@settings(max_examples=150)
@given(st.lists(_INTERVALS, min_size=1, max_size=60), st.lists(_ENDS, max_size=30))
def test_quantile_cells(intervals: list[Interval], probes: list[float]) -> None:
    saved = attribute_index.EXACT_ENDS, attribute_index.CELLS
    attribute_index.EXACT_ENDS, attribute_index.CELLS = 2, 4
    try:
        ends = [e for i in intervals for e in (i.low, i.high) if math.isfinite(e)]
        _check(intervals, probes + ends + [-1e9, 1e9])
    finally:
        attribute_index.EXACT_ENDS, attribute_index.CELLS = saved
