"""Per-attribute indexes of one clause group: which clauses an attribute's value lets through.

An :class:`AttributeIndex` answers, for the value an update carries for one attribute (or
its absence), two bitsets over the group's clauses: *possible* (every clause whose constraint
on this attribute might hold) and *sure* (clauses whose constraint certainly holds). Clauses
with no constraint on the attribute are in both. ``sure`` is a subset of ``possible``; the
engine verifies exactly the clauses that are possible but not sure.

- numbers go to a :class:`NumericIndex` of intervals: the real line is cut into regions at the
  interval ends (exactly, when there are few ends, otherwise into quantile cells), and each
  region keeps the bitsets of the intervals that meet it and that cover it;
- strings go to a :class:`StringIndex`: a hash of equality values, prefixes and suffixes by
  length, substrings by needle length, and the regexes, with the answers for recent values
  remembered;
- arrays and objects may satisfy "contains" semantics, so every valued constraint is possible
  and none sure; booleans and null satisfy no numeric or string test.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from broker.matching.bitset import from_positions
from broker.matching.constraint import AttributeConstraint, Interval, Presence, StringTest
from broker.query.ast import Op
from broker.query.regex import compile_pattern, search_remembered

__all__ = ["AttributeIndex", "NumericIndex", "StringIndex"]

EXACT_ENDS = 256  # up to this many distinct interval ends, regions are exact
CELLS = 96  # otherwise, this many quantile cells
_MEMO_LIMIT = 8192


class IntervalColumns(NamedTuple):
    """Intervals as numpy columns: interval j belongs to the clause at ``positions[j]``."""

    positions: npt.NDArray[np.int64]
    low: npt.NDArray[np.float64]
    low_open: npt.NDArray[np.bool_]
    high: npt.NDArray[np.float64]
    high_open: npt.NDArray[np.bool_]

    @classmethod
    def of(cls, entries: Sequence[tuple[int, Interval]]) -> IntervalColumns:
        """The columns of (position, interval) pairs."""
        positions = np.array([p for p, _ in entries], dtype=np.int64)
        # flattened first: numpy reads a flat list of floats far faster than tuples
        flat = [x for _, interval in entries for x in interval]
        table = np.array(flat, dtype=np.float64).reshape(-1, 4)
        return cls(positions, table[:, 0], table[:, 1] != 0, table[:, 2], table[:, 3] != 0)


class NumericIndex:
    """Intervals over the real line, queried with one number."""

    __slots__ = ("_bounds", "_regions", "exact")

    def __init__(
        self,
        entries: Sequence[tuple[int, Interval]] | IntervalColumns,
        size: int,
        base: int = 0,
    ) -> None:
        """Index the intervals (position, interval); every answer also holds ``base``."""
        columns = entries if isinstance(entries, IntervalColumns) else IntervalColumns.of(entries)
        positions, low, low_open, high, high_open = columns
        ends = np.unique(np.concatenate([low, high]))
        ends = ends[np.isfinite(ends)]
        self.exact = len(ends) <= EXACT_ENDS
        if not self.exact:
            quantiles = np.quantile(ends, np.linspace(0.0, 1.0, CELLS + 1)[1:-1])
            ends = np.unique(quantiles)
        self._bounds: list[float] = ends.tolist()
        m = len(ends)
        if self.exact:
            # regions: (-inf, e0), [e0], (e0, e1), [e1], ..., [e_last], (e_last, inf), numbered
            # 0..2m; every interval end is some e_j, so an interval covers a contiguous run of
            # regions exactly: from its low end's point (or the gap after it, if open) to its
            # high end's point (or the gap before it)
            j_low = np.searchsorted(ends, low)
            j_high = np.searchsorted(ends, high)
            first = np.where(low == -math.inf, 0, 2 * j_low + 1 + low_open)
            last = np.where(high == math.inf, 2 * m, 2 * j_high + 1 - high_open)
            bits = _region_bitsets(first, last, 2 * m + 1, positions, size, base)
            self._regions = [(b, b) for b in bits]
        else:
            # cells [lows[k], highs[k]) for k in 0..m, with lows = (-inf, e...) and
            # highs = (e..., inf): an interval meets the cells first..last and covers the
            # cells first_covered..last_covered
            first = np.searchsorted(ends, low, side="right")
            last = np.where(
                high_open,
                np.searchsorted(ends, high, side="left"),
                np.searchsorted(ends, high, side="right"),
            )
            first_covered = np.where(
                low == -math.inf,
                0,
                np.where(
                    low_open,
                    np.searchsorted(ends, low, side="right"),
                    np.searchsorted(ends, low, side="left"),
                )
                + 1,
            )
            last_covered = np.where(
                high == math.inf, m, np.searchsorted(ends, high, side="right") - 1
            )
            meets = _region_bitsets(first, last, m + 1, positions, size, base)
            covers = _region_bitsets(first_covered, last_covered, m + 1, positions, size, base)
            self._regions = list(zip(meets, covers, strict=True))

    def lookup(self, x: float) -> tuple[int, int]:
        """The (possible, sure) bitsets for the value ``x``."""
        bounds = self._bounds
        if self.exact:
            k = bisect.bisect_left(bounds, x)
            region = 2 * k + 1 if k < len(bounds) and bounds[k] == x else 2 * k
            return self._regions[region]
        return self._regions[bisect.bisect_right(bounds, x)]


def _region_bitsets(
    first: np.ndarray,
    last: np.ndarray,
    regions: int,
    positions: np.ndarray,
    size: int,
    base: int,
) -> list[int]:
    """One bitset per region r: the clauses whose interval spans regions first..last with
    first <= r <= last (each with ``base``), built by sweeping r and adding the intervals
    that start at r and dropping those that ended before it."""
    spans = first <= last
    starts = _grouped(first[spans], positions[spans], regions, size)
    stops = _grouped(last[spans], positions[spans], regions, size)
    result: list[int] = []
    current = 0
    for region in range(regions):
        current |= starts[region]
        result.append(base | current)
        current &= ~stops[region]
    return result


def _grouped(keys: np.ndarray, positions: np.ndarray, regions: int, size: int) -> list[int]:
    """For each region r, the bitset of the positions whose key is r (one flag matrix per
    block of regions, packed at once)."""
    result: list[int] = []
    block = max(1, (1 << 24) // max(size, 1))  # regions per pass: at most ~16 MB of flags
    for start in range(0, regions, block):
        stop = min(start + block, regions)
        chosen = (keys >= start) & (keys < stop)
        flags = np.zeros((stop - start, size), dtype=np.bool_)
        flags[keys[chosen] - start, positions[chosen]] = True
        packed = np.packbits(flags, axis=1, bitorder="little")
        result.extend(int.from_bytes(row.tobytes(), "little") for row in packed)
    return result


class StringIndex:
    """String tests (equality, prefix, suffix, contains, regex), queried with one string."""

    __slots__ = ("_base", "_contains", "_equal", "_memo", "_prefix", "_regex", "_suffix")

    def __init__(self, entries: Sequence[tuple[int, StringTest]], size: int, base: int = 0) -> None:
        """Index the string tests (position, test); every answer also holds ``base``."""
        self._base = base
        equal: dict[str, list[int]] = {}
        prefix: dict[str, list[int]] = {}
        suffix: dict[str, list[int]] = {}
        contains: dict[str, list[int]] = {}
        regex: dict[str, list[int]] = {}
        tables = {Op.EQ: equal, Op.PREFIX: prefix, Op.SUFFIX: suffix, Op.CONTAINS: contains}
        for position, test in entries:
            table = tables.get(test.op, regex)
            for value in set(test.values):
                table.setdefault(value, []).append(position)

        def bits(table: dict[str, list[int]]) -> dict[str, int]:
            return {value: from_positions(where, size) for value, where in table.items()}

        self._equal = bits(equal)
        self._prefix: dict[int, dict[str, int]] = {}
        for value, value_bits in bits(prefix).items():
            self._prefix.setdefault(len(value), {})[value] = value_bits
        self._suffix: dict[int, dict[str, int]] = {}
        for value, value_bits in bits(suffix).items():
            self._suffix.setdefault(len(value), {})[value] = value_bits
        self._contains = bits(contains)
        for pattern in regex:
            compile_pattern(pattern)  # a bad pattern fails here, not at the first update
        self._regex: list[tuple[str, int]] = list(bits(regex).items())
        self._memo: dict[str, int] = {}

    def lookup(self, value: str) -> int:
        """The bitset of clauses whose string test ``value`` passes."""
        bits = self._memo.get(value)
        if bits is not None:
            return bits
        bits = self._base | self._equal.get(value, 0)
        size = len(value)
        for length, table in self._prefix.items():
            if length <= size:
                bits |= table.get(value[:length], 0)
        for length, table in self._suffix.items():
            if length <= size:
                bits |= table.get(value[size - length :], 0)
        for needle, needle_bits in self._contains.items():
            if needle in value:
                bits |= needle_bits
        for pattern, regex_bits in self._regex:
            if search_remembered(pattern, value):
                bits |= regex_bits
        if len(self._memo) >= _MEMO_LIMIT:
            self._memo.clear()
        self._memo[value] = bits
        return bits


class AttributeIndex:
    """Everything one group's clauses ask of one attribute (see the module docstring)."""

    __slots__ = (
        "_absent",
        "_compound",
        "_numeric",
        "_present",
        "_strings",
        "exact",
        "intervals",
        "name",
    )

    def __init__(
        self,
        name: str,
        entries: Sequence[tuple[int, AttributeConstraint]],
        free: int,
        size: int,
    ) -> None:
        self.name = name
        absent: list[int] = []
        present: list[int] = []
        intervals: list[tuple[int, Interval]] = []
        strings: list[tuple[int, StringTest]] = []
        for position, constraint in entries:
            if constraint.presence is Presence.ABSENT:
                absent.append(position)
            elif constraint.interval is not None:
                intervals.append((position, constraint.interval))
            elif constraint.string is not None:
                strings.append((position, constraint.string))
            else:
                present.append(position)
        # answers are (possible, sure) pairs made once, with the free clauses folded in
        absent_bits = free | from_positions(absent, size)
        present_bits = free | from_positions(present, size)
        valued = [p for p, _ in intervals] + [p for p, _ in strings]
        self._absent = (absent_bits, absent_bits)
        self._present = (present_bits, present_bits)
        self._compound = (present_bits | from_positions(valued, size), present_bits)
        # the interval columns, kept for the group to build its cell matrix, then dropped
        self.intervals = IntervalColumns.of(intervals) if intervals else None
        self._numeric = NumericIndex(self.intervals, size, present_bits) if self.intervals else None
        self._strings = StringIndex(strings, size, present_bits) if strings else None
        self.exact = self._numeric is None or self._numeric.exact  # possible == sure for scalars

    def lookup(self, attribute: Any) -> tuple[int, int]:
        """(possible, sure) for the update's attribute (None when the update lacks it)."""
        if attribute is None:
            return self._absent
        value = attribute.match_value
        kind = type(value)
        if kind is float or kind is int:
            numeric = self._numeric
            return self._present if numeric is None else numeric.lookup(value)
        if kind is str:
            strings = self._strings
            if strings is None:
                return self._present
            bits = strings.lookup(value)
            return bits, bits
        if kind is list or kind is dict:
            return self._compound
        return self._present
