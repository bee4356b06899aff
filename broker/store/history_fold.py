"""How a change becomes history: a raw row per changed attribute, and each level's slot folded.

Pure functions, no I/O, no storage: the context store (broker.store.history) calls them in
the commit of each write, and a batch job recomputing the levels from an archive of changes
(``silbo backfill``, on Spark) can call the same ones and get the same slots, given the
same samples in the same order (sums of doubles depend on their order: fold in time order,
ties by sequence, as the store does).

A write that changed attributes gives one :class:`Sample` per changed attribute it left
(:func:`samples_of`: ``Change.changed``, so values that did not change record nothing but
with ``forcedUpdate``; deleted attributes record nothing), all at one time, the entity's
new ``dateModified`` in microseconds (:func:`micros`), which never goes back for an entity.
A sample is a raw row (its type and value, :func:`raw_value`) and, when its value can be
aggregated (:func:`aggregated`), one more sample in a slot of each level:

- levels are STH-Comet's resolutions (:class:`Level`): ``second``, ``minute``, ``hour``,
  ``day``, ``month``; a level's *slot* is one of its units (the second, the minute...), which
  :func:`slot_start` gives in epoch seconds (UTC, months by the calendar);
- STH's documents are per *origin*, the start of the next coarser unit (the minute of a
  second, the hour of a minute, the day of an hour, the month of a day, the year of a month),
  and a slot is the point at its *offset* there (:func:`origin`, :func:`offset`): the second
  0-59, the minute 0-59, the hour 0-23, the day 1-31, the month 1-12;
- a slot holds ``samples`` (every sample), and for numbers their ``sum``, ``sum2`` (sum of
  squares), ``min`` and ``max``; for texts ``occur`` (the count of each text, at most
  :data:`MAX_OCCUR` distinct ones: more are counted in ``samples`` only). :func:`folded`
  works on its plain form, a list ``[samples, sum, sum2, min, max, occur]`` (what is stored:
  the write path folds many per write), :class:`Slot` names the fields for readers.

What is aggregated, as STH-Comet decides it (``getAggregationType``): a number (not a
boolean), or a text that reads as a decimal number, is a number; any other non-blank text
is a text, but for attributes typed ``DateTime`` / ``ISO8601`` (a timestamp per sample:
their counts say nothing); booleans, null, objects, arrays and blank texts are raw rows only.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

import msgpack

from broker.model.attribute import DATE_TYPES
from broker.store.semantics import Applied

__all__ = [
    "LEVELS",
    "MAX_OCCUR",
    "Level",
    "Sample",
    "Slot",
    "aggregated",
    "changed_samples",
    "folded",
    "merged",
    "micros",
    "offset",
    "origin",
    "raw_value",
    "samples_of",
    "slot_start",
    "slot_starts",
]

MAX_OCCUR: Final = 64  # distinct texts counted per slot
_DECIMAL: Final = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*")
_SPAN: Final = {"second": 1, "minute": 60, "hour": 3600, "day": 86400}


class Level(enum.Enum):
    """A level of aggregation: STH-Comet's ``aggrPeriod`` (its resolution)."""

    SECOND = "second"
    MINUTE = "minute"
    HOUR = "hour"
    DAY = "day"
    MONTH = "month"


LEVELS: Final = tuple(Level)


@dataclass(frozen=True, slots=True)
class Sample:
    """One changed attribute of a write: its name, type and new value."""

    attribute: str
    attr_type: str
    value: Any


@dataclass(frozen=True, slots=True)
class Slot:
    """What a level's slot holds (module doc): ``sum``... are None without a number,
    ``occur`` empty without a text."""

    samples: int = 0
    sum: float | None = None
    sum2: float | None = None
    min: float | None = None
    max: float | None = None
    occur: Mapping[str, int] = field(default_factory=dict)

    def to_wire(self) -> list[Any]:
        """The slot's plain form (module doc)."""
        return [self.samples, self.sum, self.sum2, self.min, self.max, dict(self.occur)]

    @classmethod
    def from_wire(cls, data: Any) -> Slot:
        """The slot of a plain form (ValueError / TypeError if it is not one)."""
        samples, total, squares, low, high, occur = data
        return cls(int(samples), total, squares, low, high, dict(occur))


def micros(seconds: float) -> int:
    """Epoch seconds as whole microseconds (the time of history rows)."""
    return int(seconds * 1_000_000)


def samples_of(applied: Applied) -> tuple[int, list[Sample]]:
    """The time (µs) and samples a write records (module doc); no samples if it changed no
    value."""
    change, document = applied.change, applied.document
    if change is None or document is None or not change.changed:
        return 0, []
    return micros(document.date_modified), changed_samples(change.changed, document.attributes)


def changed_samples(changed: Iterable[str], attributes: Mapping[str, Any]) -> list[Sample]:
    """The samples of a write that changed the attributes ``changed`` and left the entity's
    ``attributes`` (name: {type, value...}): one per changed attribute it left, by name (what
    :func:`samples_of` gives, and a backfill from an archived change's columns)."""
    return [
        Sample(name, attributes[name]["type"], attributes[name]["value"])
        for name in sorted(changed)
        if name in attributes
    ]


def raw_value(sample: Sample) -> bytes:
    """A raw row as stored: [type, value] (integers past 64 bits as doubles, as documents)."""
    try:
        return bytes(msgpack.packb([sample.attr_type, sample.value], use_bin_type=True))
    except OverflowError:
        return bytes(msgpack.packb([sample.attr_type, _doubled(sample.value)], use_bin_type=True))


def aggregated(sample: Sample) -> float | str | None:
    """What a sample adds to the slots: a number, a text, or None (module doc)."""
    value = sample.value
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return _finite(value)
    if not isinstance(value, str) or not value.strip():
        return None
    if _DECIMAL.fullmatch(value):
        return _finite(value)
    return None if sample.attr_type in DATE_TYPES else value


def folded(slot: list[Any] | None, value: float | str) -> list[Any]:
    """A slot's plain form (None: an empty slot) with one more sample of ``value`` (from
    :func:`aggregated`): a new list, ``slot`` is left as it was."""
    if slot is None:
        if isinstance(value, str):
            return [1, None, None, None, None, {value: 1}]
        return [1, value, value * value, value, value, {}]
    samples, total, squares, low, high, occur = slot
    if isinstance(value, str):
        if value in occur or len(occur) < MAX_OCCUR:
            occur = {**occur, value: occur.get(value, 0) + 1}
        return [samples + 1, total, squares, low, high, occur]
    if total is None:
        return [samples + 1, value, value * value, value, value, occur]
    return [
        samples + 1,
        total + value,
        squares + value * value,
        low if low <= value else value,
        high if high >= value else value,
        occur,
    ]


def merged(first: list[Any], then: list[Any]) -> list[Any]:
    """Two slots' plain forms as one: ``first``'s samples, then ``then``'s (a month from its
    days). Not quite the fold of their samples: ``sum`` adds partial sums."""
    samples, total, squares, low, high, occur = first
    more, more_total, more_squares, more_low, more_high, more_occur = then
    if more_occur:
        occur = dict(occur)
        for text, count in more_occur.items():
            if text in occur or len(occur) < MAX_OCCUR:
                occur[text] = occur.get(text, 0) + count
    if more_total is None:
        return [samples + more, total, squares, low, high, occur]
    if total is None:
        return [samples + more, more_total, more_squares, more_low, more_high, occur]
    return [
        samples + more,
        total + more_total,
        squares + more_squares,
        low if low <= more_low else more_low,
        high if high >= more_high else more_high,
        occur,
    ]


def slot_start(level: Level, seconds: int) -> int:
    """The start (epoch s) of the slot of ``level`` holding the moment ``seconds``."""
    span = _SPAN.get(level.value)
    if span is not None:
        return seconds - seconds % span
    moment = datetime.fromtimestamp(seconds, UTC)
    return int(datetime(moment.year, moment.month, 1, tzinfo=UTC).timestamp())


def slot_starts(moment: int) -> dict[Level, int]:
    """The slot of every level holding ``moment`` (µs), by level."""
    seconds = moment // 1_000_000
    return {level: slot_start(level, seconds) for level in LEVELS}


def origin(level: Level, start: int) -> int:
    """STH's origin of a slot (epoch s): the start of the next coarser unit (module doc)."""
    if level is Level.SECOND:
        return start - start % 60
    if level is Level.MINUTE:
        return start - start % 3600
    if level is Level.HOUR:
        return start - start % 86400
    moment = datetime.fromtimestamp(start, UTC)
    month = moment.month if level is Level.DAY else 1
    return int(datetime(moment.year, month, 1, tzinfo=UTC).timestamp())


def offset(level: Level, start: int) -> int:
    """STH's offset of a slot within its origin (module doc)."""
    if level is Level.SECOND:
        return start % 60
    if level is Level.MINUTE:
        return start // 60 % 60
    if level is Level.HOUR:
        return start // 3600 % 24
    moment = datetime.fromtimestamp(start, UTC)
    return moment.day if level is Level.DAY else moment.month


def _finite(value: float | str) -> float | None:
    try:
        number = float(value)
    except (OverflowError, ValueError):
        return None
    return number if math.isfinite(number) else None


def _doubled(value: Any) -> Any:
    """``value`` with integers past 64 bits as doubles (what msgpack cannot hold)."""
    if type(value) is int and not -(2**63) <= value < 2**64:
        return float(value)
    if type(value) is list:
        return [_doubled(v) for v in value]
    if type(value) is dict:
        return {k: _doubled(v) for k, v in value.items()}
    return value
