"""The folding of changes into history (broker.store.history_fold), against direct computations.

Hypothesis draws samples at random moments; each slot folded one sample at a time must be
what a direct computation over the same samples gives (counts, ``sum`` and ``sum2`` as
``sum()`` in the same order, ``min``, ``max``, the count of each text), and each slot's
start, origin and offset what the calendar says (``datetime`` fields, no arithmetic shared
with the module). No process runs.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import msgpack
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

from broker.model.change import Alteration, Change
from broker.store.history_fold import (
    LEVELS,
    MAX_OCCUR,
    Level,
    Sample,
    Slot,
    aggregated,
    folded,
    merged,
    offset,
    origin,
    raw_value,
    samples_of,
    slot_start,
)
from broker.store.semantics import Applied, Document

# 1970 to 2100: every month length and leap year on the way
MOMENTS = st.integers(min_value=0, max_value=4_102_444_800)
VALUES = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.integers(-(10**6), 10**6),
    st.sampled_from(["on", "off", "a.b$c", "12.5", " 7 ", "-3e2", "", "  ", "x" * 3]),
    st.sampled_from([None, True, False, {"a": 1}, [1, 2]]),
)
TYPES = st.sampled_from(["Number", "Text", "DateTime", "StructuredValue"])


def _expected_kind(attr_type: str, value: Any) -> float | str | None:
    """What the module doc says is aggregated, written out again."""
    if type(value) in (int, float):
        return float(value)
    if not isinstance(value, str) or value.strip() == "":
        return None
    if re.fullmatch(r"\s*[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?\s*", value):
        return float(value)
    return None if attr_type in ("DateTime", "ISO8601") else value


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.tuples(TYPES, VALUES), max_size=40))
def test_a_slot_folded_sample_by_sample_is_the_direct_computation(
    drawn: list[tuple[str, Any]],
) -> None:
    plain: list[Any] | None = None
    numbers: list[float] = []
    texts: list[str] = []
    for attr_type, value in drawn:
        kind = aggregated(Sample("a", attr_type, value))
        assert kind == _expected_kind(attr_type, value)
        if kind is None:
            continue
        before = None if plain is None else [*plain[:5], dict(plain[5])]
        folded_now = folded(plain, kind)
        assert plain == before  # the slot folded into is left as it was
        plain = folded_now
        (texts if isinstance(kind, str) else numbers).append(kind)  # type: ignore[arg-type]
    if plain is None:
        assert not numbers and not texts
        return
    slot = Slot.from_wire(msgpack.unpackb(msgpack.packb(plain), raw=False))
    assert slot.samples == len(numbers) + len(texts)
    if numbers:
        assert slot.sum == sum(numbers)
        assert slot.sum2 == sum(n * n for n in numbers)
        assert (slot.min, slot.max) == (min(numbers), max(numbers))
    else:
        assert (slot.sum, slot.sum2, slot.min, slot.max) == (None, None, None, None)
    assert dict(slot.occur) == dict(Counter(texts))


@settings(max_examples=examples(100), deadline=None)
@given(st.lists(st.lists(st.one_of(VALUES), min_size=1, max_size=8), min_size=1, max_size=6))
def test_merged_slots_are_the_slot_of_all_their_samples_with_sums_of_sums(
    days: list[list[Any]],
) -> None:
    """A month is its days merged: counts, extremes and texts as if folded, sums added."""
    kinds = [
        [k for v in day if (k := aggregated(Sample("a", "Number", v))) is not None] for day in days
    ]
    slots = []
    for day in kinds:
        plain: list[Any] | None = None
        for kind in day:
            plain = folded(plain, kind)
        if plain is not None:
            slots.append(plain)
    if not slots:
        return
    month = slots[0]
    for slot in slots[1:]:
        month = merged(month, slot)
    every = [k for day in kinds for k in day]
    numbers = [k for k in every if isinstance(k, float)]
    assert month[0] == len(every)
    assert dict(month[5]) == dict(Counter(k for k in every if isinstance(k, str)))
    if numbers:
        day_sums = [slot[1] for slot in slots if slot[1] is not None]
        assert month[1] == sum(day_sums)
        assert (month[3], month[4]) == (min(numbers), max(numbers))
    else:
        assert month[1:5] == [None] * 4


def test_a_slot_counts_at_most_max_occur_texts_but_every_sample() -> None:
    plain: list[Any] | None = None
    for index in range(MAX_OCCUR + 10):
        plain = folded(plain, f"t{index}")
    slot = Slot.from_wire(folded(plain, "t0"))
    assert len(slot.occur) == MAX_OCCUR and slot.occur["t0"] == 2
    assert slot.samples == MAX_OCCUR + 11


def _floor(level: Level, moment: datetime) -> datetime:
    fields = {
        Level.SECOND: moment.replace(microsecond=0),
        Level.MINUTE: moment.replace(second=0, microsecond=0),
        Level.HOUR: moment.replace(minute=0, second=0, microsecond=0),
        Level.DAY: moment.replace(hour=0, minute=0, second=0, microsecond=0),
        Level.MONTH: moment.replace(day=1, hour=0, minute=0, second=0, microsecond=0),
    }
    return fields[level]


@settings(max_examples=examples(300), deadline=None)
@given(MOMENTS)
def test_slots_origins_and_offsets_are_the_calendars(seconds: int) -> None:
    moment = datetime.fromtimestamp(seconds, UTC)
    coarser = dict(zip(LEVELS, [*LEVELS[1:], None], strict=True))
    for level in LEVELS:
        start = slot_start(level, seconds)
        assert start == int(_floor(level, moment).timestamp())
        above = coarser[level]
        expected_origin = (
            moment.replace(month=1, day=1, hour=0, minute=0, second=0)
            if above is None
            else _floor(above, moment)
        )
        assert origin(level, start) == int(expected_origin.timestamp())
        fields = {
            Level.SECOND: moment.second,
            Level.MINUTE: moment.minute,
            Level.HOUR: moment.hour,
            Level.DAY: moment.day,
            Level.MONTH: moment.month,
        }
        assert offset(level, start) == fields[level]


def _document(modified: float, **values: Any) -> Document:
    attributes = {n: {"type": "Number", "value": v, "metadata": {}} for n, v in values.items()}
    return Document("E", "T", "/", "", attributes, 1.0, modified)


def test_a_write_records_its_changed_attributes_at_its_date_modified() -> None:
    document = _document(1_700_000_000.25, a=1, b=2, c=3)
    change = Change(Alteration.CHANGE, frozenset({"b", "a", "gone"}), frozenset({"c"}))
    moment, samples = samples_of(Applied(None, document, change, modified=True))
    assert moment == 1_700_000_000_250_000
    assert samples == [Sample("a", "Number", 1), Sample("b", "Number", 2)]  # not c, not gone
    unchanged = Change(Alteration.UPDATE, requested=frozenset({"a"}))
    assert samples_of(Applied(document, document, unchanged)) == (0, [])
    assert samples_of(Applied(document, None, Change(Alteration.DELETE), modified=True)) == (0, [])


def test_a_raw_row_keeps_a_number_past_64_bits_as_a_double() -> None:
    assert raw_value(Sample("a", "Number", 2**70)) == raw_value(Sample("a", "Number", 2.0**70))
