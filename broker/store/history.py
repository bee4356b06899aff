"""The history of a store's entities: raw rows and downsampled levels, in the writes' commits.

What a write records is :mod:`broker.store.history_fold`'s (a raw row per changed attribute,
a sample in a slot of each level for numbers and texts); this module keeps it in the store's
engine, in the same commit as the write (:meth:`HistoryLog.stage`), so history is exactly as
durable as the entity, replicated with it (the primary ships its commit's states) and moves
with its partition (its keys are keys of the partition, broker.store.entities).

Keys: ``h``, then the entity's document key without its ``d`` (the partition, tenant NUL id
NUL service path NUL type), NUL, then

- the attribute, NUL, ``r``, the time in µs (8 bytes), a sequence (4 bytes): a raw row,
  msgpack [type, value];
- NUL, a level's code (``m h d``), the slot's start in epoch seconds (8 bytes): the
  entity's slots of that level, msgpack {attribute: slot's plain form}.

The levels stored are ``minute``, ``hour`` and ``day`` (STH-Comet's default
``aggregationBy``), per entity, one value for all its attributes: a write changing many
attributes reads and writes one value per level, not one per attribute. The other two are
folded when read (broker.store.history_query): ``second`` from the raw rows, ``month`` from
the day slots, so each is there as long as those are. Each costs a write nothing.

Times are the entity's ``dateModified``, which never goes back for an entity, so an
attribute's rows sort by time; rows of one attribute at one microsecond (two writes in a
batch, a clock gone back, an entity deleted and created again) take the next sequences,
counted from the pending writes, or from what is durable (a scan of that microsecond, only
when the clock did not move on or the entity is created).

Slot values are read-modified-written, in the order of the writes: one a pending write left
is taken from it, one that starts after the entity's last write is known empty (not read;
an entity created may find what an earlier life wrote), others come from a cache of those
this store committed, or are read.

Retention (:class:`HistoryOptions`, ``silbo run context-store --history-retention``): for raw
rows and each stored level, a duration, ``off`` (not kept) or ``forever``. A raw row older
than its retention, or a slot that starts before it, is deleted: on the way, by the first
write of the entity in a new hour (raw rows of the attributes it changes, minute slots), day
(hour slots) or month (day slots), at most :data:`PRUNE_MOST` keys each; and by
the store's sweep of its partitions (:meth:`HistoryLog.expired`), for entities no longer
written.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

import msgpack

from broker.errors import InvalidInput
from broker.store.history_fold import (
    Level,
    Sample,
    aggregated,
    folded,
    micros,
    raw_value,
    samples_of,
    slot_start,
)
from broker.store.semantics import Applied

if TYPE_CHECKING:  # the engine's module loads the storage libraries: only its interface here
    from broker.store.engine import Engine

__all__ = [
    "DEFAULT_RETENTION",
    "HISTORY_SPACE",
    "KINDS",
    "LEVEL_CODES",
    "PRUNE_MOST",
    "RAW",
    "STORED_LEVELS",
    "HistoryLog",
    "HistoryOptions",
    "attribute_prefix",
    "entity_prefix",
    "key_time",
    "recordable",
]

HISTORY_SPACE: Final = b"h"
RAW: Final = b"r"
STORED_LEVELS: Final = (Level.MINUTE, Level.HOUR, Level.DAY)
LEVEL_CODES: Final = {Level.MINUTE: b"m", Level.HOUR: b"h", Level.DAY: b"d"}
KINDS: Final = ("raw", *(level.value for level in STORED_LEVELS))  # what has a retention
FOREVER: Final = float("inf")
# seconds each is kept (docs/history.md argues them)
DEFAULT_RETENTION: Final = {
    "raw": 7 * 86400.0,
    "minute": 14 * 86400.0,
    "hour": 180 * 86400.0,
    "day": 5 * 365 * 86400.0,
}
PRUNE_MOST: Final = 10_000  # keys of one attribute (raw) or level deleted on the way at once
RECENT_SLOTS: Final = 16384  # committed slot values kept decoded
_SEP: Final = b"\x00"
_UNITS: Final = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400, "y": 365 * 86400}
_DURATION: Final = re.compile(r"(\d+(?:\.\d+)?)([smhdwy])")
_SPANS: Final = {"raw": 60, "minute": 60, "hour": 3600, "day": 86400}
# the unit (its index in the stored levels) whose first write prunes each kind (module doc)
_PRUNED_BY: Final = {"raw": 1, "minute": 1, "hour": 2, "day": 3}
_CODE_KINDS: Final = {code: level.value for level, code in LEVEL_CODES.items()}


@dataclass(frozen=True, slots=True)
class HistoryOptions:
    """What a store records: ``retention`` seconds per kind (``raw`` and each stored
    level): 0 for not kept, ``inf`` for forever."""

    retention: tuple[tuple[str, float], ...] = tuple(DEFAULT_RETENTION.items())

    @classmethod
    def parse(cls, text: str) -> HistoryOptions:
        """Options from ``raw=7d,minute=14d,hour=180d,day=forever`` (kinds not named keep their
        default; ``off``: not kept); InvalidInput naming every problem."""
        kept = dict(DEFAULT_RETENTION)
        problems = []
        for item in (part.strip() for part in text.split(",")):
            if not item:
                continue
            kind, _, value = (part.strip() for part in item.partition("="))
            if kind not in kept:
                problems.append(f"{kind!r} is not one of {', '.join(KINDS)}")
                continue
            seconds = _seconds(value)
            if seconds is None:
                problems.append(
                    f"{kind}={value!r} is not a duration (30s, 15m, 12h, 7d, 2w, 5y), off or "
                    "forever"
                )
            elif 0 < seconds < _SPANS[kind]:
                problems.append(f"{kind} is kept at least {_SPANS[kind]} s, if at all")
            else:
                kept[kind] = seconds
        if problems:
            raise InvalidInput("--history-retention: " + "; ".join(problems))
        return cls(tuple(kept.items()))

    def of(self, kind: str) -> float:
        """The retention (seconds) of ``raw`` or a stored level (0: not kept)."""
        return dict(self.retention)[kind]


def recordable(samples: list[Sample]) -> list[Sample]:
    """The samples a store records: those whose attribute name can be in a key (no NUL)."""
    return [s for s in samples if "\x00" not in s.attribute]


def entity_prefix(document_key: bytes) -> bytes:
    """The prefix of an entity's history keys, from its document key."""
    return HISTORY_SPACE + document_key[1:] + _SEP


def attribute_prefix(document_key: bytes, attribute: str) -> bytes:
    """The prefix of an attribute's raw rows (``r`` follows), from its entity's document key."""
    return entity_prefix(document_key) + attribute.encode() + _SEP


def slot_key(entity: bytes, level: Level, start: int) -> bytes:
    """The key of an entity's slots of ``level`` starting at ``start`` (epoch s)."""
    return entity + _SEP + LEVEL_CODES[level] + start.to_bytes(8, "big")


def key_time(key: bytes, prefix_length: int) -> int:
    """The time after a prefix and a kind byte: µs for a raw row, epoch seconds for a slot."""
    return int.from_bytes(key[prefix_length + 1 : prefix_length + 9], "big")


class HistoryLog:
    """The history one store's writes record (see the module doc). One event loop uses it;
    :meth:`expired` may run in another thread."""

    def __init__(self, engine: Engine, options: HistoryOptions | None = None) -> None:
        self._engine = engine
        self.options = options or HistoryOptions()
        self._raw = self.options.of("raw")
        # per stored level kept: its index in _starts, code, retention, unit pruning it
        self._plan = [
            (index, LEVEL_CODES[level], self.options.of(level.value), _PRUNED_BY[level.value])
            for index, level in enumerate(STORED_LEVELS)
            if self.options.of(level.value)
        ]
        # slot key: (ticket, {attribute: slot}) staged, not committed yet
        self._pending: dict[bytes, tuple[int, dict[str, list[Any]]]] = {}
        self._recent: dict[bytes, dict[str, list[Any]]] = {}  # committed, oldest first
        self._months: dict[int, int] = {}  # day (epoch s // 86400): its month's start
        # attribute prefix: (ticket, µs, next sequence) of its last raw row staged
        self._times: dict[bytes, tuple[int, int, int]] = {}
        self._held: dict[int, list[bytes]] = {}  # ticket: the slot keys and prefixes it holds

    def stage(
        self,
        key: bytes,
        applied: Applied,
        ticket: int,
        puts: list[tuple[bytes, bytes]],
        deletes: list[bytes],
    ) -> None:
        """Add to a commit's ``puts`` and ``deletes`` what the write ``applied`` to the
        document at ``key`` records (pending under ``ticket`` until :meth:`release`)."""
        moment, samples = samples_of(applied)
        samples = recordable(samples)
        if not samples:
            return
        before = applied.before
        last = micros(before.date_modified) if before is not None else -1
        seconds = moment // 1_000_000
        starts = self._starts(seconds)
        fresh = [last < start * 1_000_000 for start in starts]  # its first write in that unit
        # a slot after the entity's last write is empty, but one of an entity created again
        # may hold what its earlier life wrote
        empty = fresh if before is not None else [False] * len(starts)
        entity = entity_prefix(key)
        held = self._held.setdefault(ticket, [])
        values: list[tuple[str, float | str]] = []
        for sample in samples:
            prefix = entity + sample.attribute.encode() + _SEP
            if self._raw and self._fits(_raw_key(prefix, 0, 0)):
                sequence = self._sequence(prefix, moment, last if before is not None else None)
                puts.append((_raw_key(prefix, moment, sequence), raw_value(sample)))
                self._times[prefix] = (ticket, moment, sequence + 1)
                held.append(prefix)
                if fresh[_PRUNED_BY["raw"]]:
                    deletes.extend(self._old(prefix + RAW, moment - _micros(self._raw)))
            value = aggregated(sample)
            if value is not None:
                values.append((sample.attribute, value))
        if not self._fits(entity + _SEP + b"?" + bytes(8)):  # every level's slot key
            values = []
        for index, code, keep, pruned_by in self._plan if values else ():
            at = entity + _SEP + code + starts[index].to_bytes(8, "big")
            slots = dict(self._slots(at)) if not empty[index] else {}
            for attribute, value in values:
                slots[attribute] = folded(slots.get(attribute), value)
            puts.append((at, msgpack.packb(slots, use_bin_type=True)))
            self._pending[at] = (ticket, slots)
            held.append(at)
            if fresh[pruned_by]:
                deletes.extend(self._old(entity + _SEP + code, seconds - keep))

    def _fits(self, key: bytes) -> bool:
        """Whether the engine takes a key this long (LMDB: 511 bytes; a long id, type,
        service path and attribute name keep no history there: docs/history.md)."""
        limit = self._engine.max_key_size
        return limit is None or len(key) <= limit

    def release(self, ticket: int) -> None:
        """The commit holding ``ticket``'s write ended (durable, or the store failed)."""
        for key in self._held.pop(ticket, ()):
            pending = self._pending.get(key)
            if pending is not None and pending[0] == ticket:
                del self._pending[key]
                self._remember(key, pending[1])
            times = self._times.get(key)
            if times is not None and times[0] == ticket:
                del self._times[key]

    def forget(self, keys: Iterable[bytes]) -> None:
        """Keys changed by another way than :meth:`stage` (a primary's shipment, a copy, a
        drop, a sweep): their cached slots are dropped."""
        for key in keys:
            if key[:1] == HISTORY_SPACE:
                self._recent.pop(key, None)

    def expired(self, prefix: bytes, now: float, most: int = 50_000) -> list[bytes]:
        """The history keys under ``prefix`` (``h`` and a partition) past their retention at
        ``now`` (epoch s), at most ``most``: the store's sweep."""
        retention = dict(self.options.retention)
        found = []
        for key, _value in self._engine.scan(prefix):
            parts = key[3:].split(_SEP, 5)
            if len(parts) != 6 or not parts[5]:
                continue
            kind = parts[5][:1]
            moment = int.from_bytes(parts[5][1:9], "big")
            if parts[4] and kind == RAW:
                keep, moment_s = retention["raw"], moment / 1_000_000
            elif not parts[4] and kind in _CODE_KINDS:
                keep, moment_s = retention[_CODE_KINDS[kind]], float(moment)
            else:
                continue
            if keep == 0 or moment_s < now - keep:
                found.append(key)
                if len(found) >= most:
                    break
        return found

    def _sequence(self, prefix: bytes, moment: int, last: int | None) -> int:
        """The sequence of an attribute's raw row at ``moment`` (µs), its entity's last
        write being at ``last`` (None: it is created, perhaps again: module doc)."""
        pending = self._times.get(prefix)
        if pending is not None:
            return pending[2] if pending[1] == moment else 0
        if last is not None and last < moment:
            return 0
        # the clock went back or stood still, or an earlier life of the entity wrote rows:
        # rows at this moment may be durable
        taken = -1
        for found, _value in self._engine.scan(_raw_key(prefix, moment, 0)[:-4]):
            taken = max(taken, int.from_bytes(found[-4:], "big"))
        return taken + 1

    def _slots(self, key: bytes) -> dict[str, list[Any]]:
        """The slots at ``key`` as the writes before left them: pending, cached or stored."""
        pending = self._pending.get(key)
        if pending is not None:
            return pending[1]
        recent = self._recent.get(key)
        if recent is not None:
            return recent
        data = self._engine.get(key)
        if data is None:
            return {}
        slots: dict[str, list[Any]] = msgpack.unpackb(data, raw=False, strict_map_key=False)
        self._remember(key, slots)
        return slots

    def _remember(self, key: bytes, slots: dict[str, list[Any]]) -> None:
        recent = self._recent
        recent.pop(key, None)
        recent[key] = slots
        if len(recent) > RECENT_SLOTS:
            del recent[next(iter(recent))]

    def _starts(self, seconds: int) -> tuple[int, int, int, int]:
        """The starts (epoch s) of the minute, hour, day and month holding ``seconds``."""
        day = seconds // 86400
        month = self._months.get(day)
        if month is None:
            if len(self._months) > 1000:
                self._months.clear()
            month = self._months[day] = slot_start(Level.MONTH, seconds)
        return seconds - seconds % 60, seconds - seconds % 3600, day * 86400, month

    def _old(self, prefix: bytes, cutoff: float) -> list[bytes]:
        """The keys under ``prefix`` (an attribute's raw rows, or an entity's slots of one
        level) whose time is before ``cutoff`` (-inf: none), at most PRUNE_MOST."""
        found: list[bytes] = []
        if cutoff == float("-inf"):
            return found
        for key, _value in self._engine.scan(prefix):
            if key_time(key, len(prefix) - 1) >= cutoff or len(found) >= PRUNE_MOST:
                break
            found.append(key)
            self._recent.pop(key, None)
        return found


def _raw_key(prefix: bytes, moment: int, sequence: int) -> bytes:
    return prefix + RAW + moment.to_bytes(8, "big") + sequence.to_bytes(4, "big")


def _micros(seconds: float) -> float:
    return seconds * 1_000_000 if seconds != FOREVER else FOREVER


def _seconds(text: str) -> float | None:
    """A retention: a duration, ``off`` (0) or ``forever`` (inf); None if it is neither."""
    if text == "off":
        return 0.0
    if text == "forever":
        return FOREVER
    match = _DURATION.fullmatch(text)
    return float(match[1]) * _UNITS[match[2]] if match else None
