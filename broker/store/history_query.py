"""Reading an attribute's history: its raw rows or one level's slots, in a range of dates.

A front asks the primary of the entity's partition (``ContextStore.History``) with a
:class:`HistoryQuery` (its wire form); the store answers it over its engine with
:func:`answer_history`, from the keys of broker.store.history, and the front renders the
answer as STH-Comet does (broker.ngsi.history). Semantics are STH-Comet's
(``sthDatabase.getRawData`` / ``getAggregatedData``):

- raw rows: ``last_n`` (the last N, answered oldest first; 0: all), else ``offset`` and
  ``limit`` (0: all) in time order; ``date_from`` / ``date_to`` (ms, both inclusive) bound
  them; ``count`` adds how many rows the dates hold;
- a level's slots (``level``): those from the slot holding ``date_from`` to the one holding
  ``date_to``, in time order; the ``second`` level's are the raw rows folded by second, the
  ``month`` level's the day slots merged by month (broker.store.history).

An answer holds at most :data:`MAX_ROWS` rows or slots (the first ones in its order): STH
answers every row for ``lastN=0``; the cap keeps a store's answer within a gRPC message.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Final

import msgpack

from broker.errors import InvalidInput
from broker.store.history import (
    RAW,
    attribute_prefix,
    entity_prefix,
    key_time,
    slot_key,
)
from broker.store.history_fold import Level, Sample, aggregated, folded, merged, slot_start

if TYPE_CHECKING:
    from broker.store.engine import Engine

__all__ = ["MAX_ROWS", "HistoryQuery", "answer_history"]

MAX_ROWS: Final = 100_000
_NEVER: Final = (1 << 64) - 1  # past every time a key holds
_LAST_DATE: Final = 253_402_300_799  # 9999-12-31T23:59:59Z: the calendar's end


@dataclass(frozen=True, slots=True)
class HistoryQuery:
    """What a history request asks (module doc)."""

    tenant: str
    service_path: str
    entity_id: str
    entity_type: str
    attribute: str
    level: Level | None = None  # None: raw rows
    last_n: int | None = None
    limit: int = 0
    offset: int = 0
    date_from: int | None = None  # ms
    date_to: int | None = None  # ms
    count: bool = False

    def to_wire(self) -> list[Any]:
        """The query as msgpack-able data."""
        return [
            self.tenant,
            self.service_path,
            self.entity_id,
            self.entity_type,
            self.attribute,
            None if self.level is None else self.level.value,
            self.last_n,
            self.limit,
            self.offset,
            self.date_from,
            self.date_to,
            self.count,
        ]

    @classmethod
    def from_wire(cls, data: Any) -> HistoryQuery:
        """What :meth:`to_wire` gave (InvalidInput if it is not one)."""
        try:
            tenant, path, entity_id, entity_type, attribute, level, last_n, *rest = data
            limit, offset, date_from, date_to, count = rest
            return cls(
                str(tenant),
                str(path),
                str(entity_id),
                str(entity_type),
                str(attribute),
                None if level is None else Level(level),
                None if last_n is None else int(last_n),
                int(limit),
                int(offset),
                None if date_from is None else int(date_from),
                None if date_to is None else int(date_to),
                bool(count),
            )
        except (TypeError, ValueError) as exc:
            raise InvalidInput(f"not a history query: {exc}") from exc


def answer_history(engine: Engine, document_key: bytes, query: HistoryQuery) -> list[Any]:
    """The answer to ``query`` over the history of the entity at ``document_key``: raw
    ``[[[µs, type, value], ...], count or None]``, or a level's ``[[start s, slot], ...]``
    (slots in their plain form, broker.store.history_fold)."""
    if query.level is Level.SECOND:
        return _seconds(engine, document_key, query)
    if query.level is Level.MONTH:
        return _months(engine, document_key, query)
    if query.level is not None:
        return _slots(engine, document_key, query, query.level)
    prefix = attribute_prefix(document_key, query.attribute)
    low = max(0, query.date_from * 1000) if query.date_from is not None else 0
    high = (query.date_to + 1) * 1000 if query.date_to is not None else _NEVER
    if high <= low:
        return [[], 0 if query.count else None]
    rows = prefix + RAW
    found: list[list[Any]] = []
    if query.last_n is not None:
        wanted = query.last_n or MAX_ROWS
        for key, value in engine.scan_back(rows, rows + min(high, _NEVER).to_bytes(8, "big")):
            if key_time(key, len(prefix)) < low or len(found) >= min(wanted, MAX_ROWS):
                break
            found.append(_row(key, len(prefix), value))
        found.reverse()
    else:
        skipped = 0
        wanted = query.limit or MAX_ROWS
        for key, value in engine.scan(rows, rows + low.to_bytes(8, "big")):
            if key_time(key, len(prefix)) >= high or len(found) >= min(wanted, MAX_ROWS):
                break
            if skipped < query.offset:
                skipped += 1
                continue
            found.append(_row(key, len(prefix), value))
    total = None
    if query.count:
        total = 0
        for key, _value in engine.scan(rows, rows + low.to_bytes(8, "big")):
            if key_time(key, len(prefix)) >= high:
                break
            total += 1
    return [found, total]


def _row(key: bytes, length: int, value: bytes) -> list[Any]:
    attr_type, attr_value = msgpack.unpackb(value, raw=False, strict_map_key=False)
    return [key_time(key, length), attr_type, attr_value]


def _bounds(query: HistoryQuery, level: Level) -> tuple[int, int] | None:
    """The first and last slot starts (epoch s) of a level query (None: no slot)."""
    if query.date_to is not None and query.date_to < 0:
        return None
    low = 0
    if query.date_from is not None:
        low = slot_start(level, min(max(0, query.date_from // 1000), _LAST_DATE))
    high = _NEVER
    if query.date_to is not None and query.date_to // 1000 < _LAST_DATE:
        high = slot_start(level, query.date_to // 1000)
    return low, high


def _slots(engine: Engine, document_key: bytes, query: HistoryQuery, level: Level) -> list[Any]:
    """A stored level's slots of the attribute."""
    bounds = _bounds(query, level)
    if bounds is None:
        return []
    low, high = bounds
    prefix = slot_key(entity_prefix(document_key), level, 0)[:-8]
    after = prefix + (low - 1).to_bytes(8, "big") if low > 0 else None
    found: list[list[Any]] = []
    for key, value in engine.scan(prefix, after):
        start = key_time(key, len(prefix) - 1)
        if start > high or len(found) >= MAX_ROWS:
            break
        slot = msgpack.unpackb(value, raw=False, strict_map_key=False).get(query.attribute)
        if slot is not None:
            found.append([start, slot])
    return found


def _months(engine: Engine, document_key: bytes, query: HistoryQuery) -> list[Any]:
    """The month level: the attribute's day slots merged by month."""
    bounds = _bounds(query, Level.MONTH)
    if bounds is None:
        return []
    low, high = bounds
    days = replace(query, level=Level.DAY, date_from=low * 1000, date_to=None)
    found: list[list[Any]] = []
    for start, slot in _slots(engine, document_key, days, Level.DAY):
        month = slot_start(Level.MONTH, start)
        if month > high:
            break
        if found and found[-1][0] == month:
            found[-1][1] = merged(found[-1][1], slot)
        else:
            found.append([month, slot])
    return found


def _seconds(engine: Engine, document_key: bytes, query: HistoryQuery) -> list[Any]:
    """The second level: the attribute's raw rows folded by second."""
    bounds = _bounds(query, Level.SECOND)
    if bounds is None:
        return []
    low, high = bounds
    prefix = attribute_prefix(document_key, query.attribute) + RAW
    found: list[list[Any]] = []
    for key, data in engine.scan(prefix, prefix + (low * 1_000_000).to_bytes(8, "big")):
        start = key_time(key, len(prefix) - 1) // 1_000_000
        if start > high:
            break
        attr_type, attr_value = msgpack.unpackb(data, raw=False, strict_map_key=False)
        value = aggregated(Sample(query.attribute, attr_type, attr_value))
        if value is None:
            continue
        if found and found[-1][0] == start:
            found[-1][1] = folded(found[-1][1], value)
        elif len(found) >= MAX_ROWS:
            break
        else:
            found.append([start, folded(None, value)])
    return found
