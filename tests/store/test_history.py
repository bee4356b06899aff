"""The history a store's writes record (broker.store.history), read back (history_query).

A Hypothesis model drives writes of a few entities through :class:`Entities` (in memory,
history on) at moments that go forward, stand still (writes of one batch, one microsecond)
and now and then go back; what the store answers for every attribute, raw and at every
level, must be what the test computes from its own record of the changes: the raw rows in
order, and each slot's count, sums, extremes and text counts. Then retention (on the way
and by the sweep), partitions (history moves with its entity) and the query's ranges.
"""

from __future__ import annotations

import asyncio
import re
from collections import Counter, defaultdict
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

from broker.errors import InvalidInput
from broker.store.entities import Entities, MemoryEngine, key_partition, partition_of
from broker.store.history import KINDS, HistoryOptions
from broker.store.history_fold import LEVELS, Level, Slot
from broker.store.history_query import HistoryQuery
from broker.store.semantics import Mode
from broker.store.wire import Intent

T0 = 1_700_000_000.0
TYPES = {"n": "Number", "s": "Text", "d": "DateTime"}
POOLS: dict[str, list[Any]] = {
    "n": [2.5, -3.0, 7.25, 1e6, 3, 17, "12.5", None, True, {"a": 1}],
    "s": ["on", "off", "a.b$", " ", "21"],
    "d": ["2024-01-01T00:00:00Z", "2024-01-02T00:00:00Z"],
}
# forward, still (one microsecond), back: the moments between two batches
STEPS = st.sampled_from([0.0, 0.0004, 0.3, 1.0, 59.0, 61.0, 3599.0, 86400.0, 40 * 86400.0, -5.0])
WRITE = st.tuples(
    st.sampled_from(["E1", "E2"]),
    st.one_of(  # None: the entity deleted (history stays; a new one may be created again)
        st.dictionaries(st.sampled_from(list(POOLS)), st.integers(0, 9), min_size=1),
        st.none(),
    ),
)


def _intent(entity_id: str, values: dict[str, Any]) -> Intent:
    attributes = {n: {"type": TYPES[n], "value": v, "metadata": {}} for n, v in values.items()}
    return Intent(Mode.UPSERT, entity_id, "T", "/", "", attributes)


def _kind(name: str, value: Any) -> float | str | None:
    if type(value) in (int, float):
        return float(value)
    if not isinstance(value, str) or not value.strip():
        return None
    if re.fullmatch(r"\s*[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?\s*", value):
        return float(value)
    return None if TYPES[name] == "DateTime" else value


def _start(level: Level, micros: int) -> int:
    moment = datetime.fromtimestamp(micros // 1_000_000, UTC)
    cut = {
        Level.SECOND: {},
        Level.MINUTE: {"second": 0},
        Level.HOUR: {"minute": 0, "second": 0},
        Level.DAY: {"hour": 0, "minute": 0, "second": 0},
        Level.MONTH: {"day": 1, "hour": 0, "minute": 0, "second": 0},
    }[level]
    return int(moment.replace(**cut).timestamp())  # type: ignore[arg-type]


class _Model:
    """The test's own record: each entity's values and dateModified, each attribute's rows."""

    def __init__(self) -> None:
        self.values: dict[str, dict[str, Any]] = {}
        self.modified: dict[str, float] = {}
        self.rows: dict[tuple[str, str], list[list[Any]]] = defaultdict(list)

    def write(self, entity_id: str, values: dict[str, Any] | None, now: float) -> None:
        if values is None:
            self.values.pop(entity_id, None)
            self.modified.pop(entity_id, None)
            return
        current = self.values.setdefault(entity_id, {})
        changed = [n for n, v in values.items() if n not in current or current[n] != v]
        current.update(values)
        if not changed:
            return
        stamp = max(now, self.modified.get(entity_id, now))
        self.modified[entity_id] = stamp
        for name in sorted(changed):
            self.rows[entity_id, name].append([int(stamp * 1_000_000), TYPES[name], values[name]])

    def slots(self, entity_id: str, name: str, level: Level) -> list[list[Any]]:
        """Each slot of the level: its samples' count, sums, extremes and text counts; a
        month's sums are its days' sums added (the store keeps days, and adds them)."""
        if level is Level.MONTH:
            months: dict[int, list[list[Any]]] = defaultdict(list)
            for start, day in self.slots(entity_id, name, Level.DAY):
                months[_start(Level.MONTH, start * 1_000_000)].append(day)
            return [[start, _added(days)] for start, days in sorted(months.items())]
        grouped: dict[int, list[float | str]] = defaultdict(list)
        # stored levels fold the samples as they are written; seconds are the raw rows read
        rows = self.rows[entity_id, name]
        for moment, _type, value in self.in_time_order(rows) if level is Level.SECOND else rows:
            kind = _kind(name, value)
            if kind is not None:
                grouped[_start(level, moment)].append(kind)
        answer = []
        for start, kinds in sorted(grouped.items()):
            numbers = [k for k in kinds if isinstance(k, float)]
            texts = Counter(k for k in kinds if isinstance(k, str))
            stats: list[Any] = [None] * 4
            if numbers:
                stats = [sum(numbers), sum(n * n for n in numbers), min(numbers), max(numbers)]
            answer.append([start, [len(kinds), *stats, dict(texts)]])
        return answer

    @staticmethod
    def in_time_order(rows: list[list[Any]]) -> list[list[Any]]:
        """Rows in time order (ties as written): the order they are read in; times go back
        only for an entity deleted and created again while the clock went back."""
        return sorted(rows, key=lambda row: int(row[0]))


def _added(days: list[list[Any]]) -> list[Any]:
    numbers = [day for day in days if day[1] is not None]
    texts: Counter[str] = Counter()
    for day in days:
        texts.update(day[5])
    stats: list[Any] = [None] * 4
    if numbers:
        stats = [
            sum(day[1] for day in numbers),
            sum(day[2] for day in numbers),
            min(day[3] for day in numbers),
            max(day[4] for day in numbers),
        ]
    return [sum(day[0] for day in days), *stats, dict(texts)]


def _query(entity_id: str, name: str, **fields: Any) -> HistoryQuery:
    return HistoryQuery("", "/", entity_id, "T", name, **fields)


@settings(max_examples=examples(100), deadline=None)
@given(st.lists(st.tuples(STEPS, st.lists(WRITE, min_size=1, max_size=3)), max_size=25))
def test_the_store_answers_what_the_changes_give(
    batches: list[tuple[float, list[tuple[str, dict[str, int] | None]]]],
) -> None:
    forever = ",".join(f"{kind}=forever" for kind in KINDS)
    entities = Entities(MemoryEngine(), history=HistoryOptions.parse(forever))
    model = _Model()
    now = T0
    for step, writes in batches:
        now += step
        intents = []
        for entity_id, picks in writes:
            if picks is None:
                model.write(entity_id, None, now)
                intents.append(Intent(Mode.DELETE_ENTITY, entity_id, "T", "/", ""))
                continue
            values = {name: POOLS[name][pick % len(POOLS[name])] for name, pick in picks.items()}
            model.write(entity_id, values, now)
            intents.append(_intent(entity_id, values))
        entities.apply_now(intents, now)
    for entity_id, name in [(e, n) for e in ("E1", "E2") for n in POOLS]:
        rows, total = entities.read_history(_query(entity_id, name, last_n=0, count=True))
        assert rows == model.in_time_order(model.rows[entity_id, name])
        assert total == len(rows)
        for level in LEVELS:
            slots = entities.read_history(_query(entity_id, name, level=level))
            assert slots == model.slots(entity_id, name, level), level


def _numbers(entities: Entities, moments: list[float], name: str = "n") -> None:
    for index, moment in enumerate(moments):
        entities.apply_now([_intent("E1", {name: float(index)})], moment)


def test_raw_rows_are_paged_last_n_and_bounded_by_dates() -> None:
    entities = Entities(MemoryEngine(), history=HistoryOptions())
    _numbers(entities, [T0 + i for i in range(10)])

    def values(**fields: Any) -> list[Any]:
        rows, _total = entities.read_history(_query("E1", "n", **fields))
        return [value for _t, _type, value in rows]

    assert values(last_n=3) == [7.0, 8.0, 9.0]
    assert values(limit=3, offset=2) == [2.0, 3.0, 4.0]
    ms = int(T0 * 1000)
    assert values(last_n=2, date_to=ms + 4000) == [3.0, 4.0]  # dateTo is inclusive
    assert values(limit=0, date_from=ms + 8000) == [8.0, 9.0]
    assert values(last_n=0, date_from=ms + 2000, date_to=ms + 3000) == [2.0, 3.0]
    assert values(last_n=5, date_from=ms + 9001) == []
    _rows, total = entities.read_history(_query("E1", "n", limit=1, count=True, date_from=ms))
    assert total == 10
    assert entities.read_history(_query("E9", "n", last_n=3)) == [[], None]
    minute = entities.read_history(_query("E1", "n", level=Level.MINUTE, date_to=ms - 60_000))
    assert minute == []


def test_raw_rows_and_slots_past_their_retention_go_on_the_way_and_by_the_sweep() -> None:
    options = HistoryOptions.parse("raw=90m,minute=2h,hour=1d")
    entities = Entities(MemoryEngine(), history=options)
    moments = [T0 + i * 1200 for i in range(10)]  # a write each 20 minutes; T0 is :13:20
    _numbers(entities, moments)
    # the first write of each hour prunes: raw rows 90 minutes older, minute slots 2 hours
    rows, _ = entities.read_history(_query("E1", "n", last_n=0))
    assert [t / 1_000_000 for t, _ty, _v in rows] == moments[5:]
    seconds = entities.read_history(_query("E1", "n", level=Level.SECOND))
    assert [start for start, _slot in seconds] == [int(m) for m in moments[5:]]
    minutes = entities.read_history(_query("E1", "n", level=Level.MINUTE))
    assert [start for start, _slot in minutes] == [int(m) // 60 * 60 for m in moments[4:]]
    assert len(entities.read_history(_query("E1", "n", level=Level.HOUR))) == 4
    # the entity is left alone: the sweep of its partition ages it out all the same
    partition = partition_of("", "E1")
    later = T0 + 2 * 86400
    assert asyncio.run(entities.forget_history(partition + 1, later)) == 0
    assert asyncio.run(entities.forget_history(partition, later)) > 0
    assert entities.read_history(_query("E1", "n", last_n=0)) == [[], None]
    assert entities.read_history(_query("E1", "n", level=Level.MINUTE)) == []
    assert entities.read_history(_query("E1", "n", level=Level.HOUR)) == []
    assert entities.read_history(_query("E1", "n", level=Level.DAY)) != []  # kept 5 years


def test_history_keys_are_keys_of_the_entitys_partition_and_move_with_it() -> None:
    entities = Entities(MemoryEngine(), history=HistoryOptions())
    _numbers(entities, [T0, T0 + 1])
    partition = partition_of("", "E1")
    copied = dict(entities.partition_items([partition]))
    history = [key for key in copied if key[:1] == b"h"]
    assert len(history) == 2 + 3  # raw rows, one value of each stored level
    assert {key_partition(key) for key in copied} == {partition}
    assert not any(k[:1] == b"h" for k, _v in entities.partition_items([partition + 1]))
    # a backup stores the copy (states, not writes) and answers the same
    backup = Entities(MemoryEngine(), history=HistoryOptions())
    asyncio.run(backup.store(list(copied.items()), []))
    query = _query("E1", "n", level=Level.SECOND)
    assert backup.read_history(query) == entities.read_history(query)


def test_without_history_a_store_records_none() -> None:
    entities = Entities(MemoryEngine())
    _numbers(entities, [T0, T0 + 1])
    assert entities.read_history(_query("E1", "n", last_n=0)) == [[], None]
    assert not any(k[:1] == b"h" for k, _v in entities.partition_items(range(256)))


def test_a_slot_is_read_back_after_the_cache_and_the_writes_moved_on() -> None:
    first = Entities(MemoryEngine(), history=HistoryOptions())
    _numbers(first, [T0, T0 + 1, T0 + 2])
    engine = MemoryEngine()
    engine.commit(list(first.partition_items(range(256))), [])
    again = Entities(engine, history=HistoryOptions())  # a restart: nothing cached
    again.apply_now([_intent("E1", {"n": 10.0})], T0 + 3)
    ((_start, hour),) = again.read_history(_query("E1", "n", level=Level.HOUR))
    assert Slot.from_wire(hour) == Slot(4, 13.0, 105.0, 0.0, 10.0, {})


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("raw=7x", "raw='7x' is not a duration"),
        ("week=1d", "'week' is not one of raw, minute, hour, day"),
        ("second=1h", "'second' is not one of"),
        ("minute=30s", "minute is kept at least 60 s"),
        ("raw=1d,day=2h", "day is kept at least"),
    ],
)
def test_a_bad_retention_is_refused_naming_it(text: str, problem: str) -> None:
    with pytest.raises(InvalidInput, match=re.escape(problem)):
        HistoryOptions.parse(text)


def test_retention_defaults_and_overrides() -> None:
    options = HistoryOptions.parse(" raw = 2w , hour=off,day=forever")
    assert options.of("raw") == 14 * 86400
    assert options.of("hour") == 0
    assert options.of("minute") == 14 * 86400  # its default
    assert options.of("day") == float("inf")
    assert HistoryOptions.parse("").retention == HistoryOptions().retention
