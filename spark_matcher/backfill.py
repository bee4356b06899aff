"""The Spark job of ``silbo backfill``: the history levels and the aggregation groups'
windows recomputed from the archive of changes (spark_matcher.archive), as the live
context stores computed them, with their own pure functions.

**History** (:func:`history_frame`): the changes repartitioned by entity and sorted by
``(time, sequence)`` (the order the store applied them); each task folds its entities'
changes with broker.store.history_fold, as the store's write path does
(broker.store.history): each change's samples (``changed_samples`` of its ``changed`` and
its entity), every aggregated one folded into its slot of each stored level (minute, hour,
day), the second level folded from the samples by second and the month level merged from
the day slots, as the store reads them (broker.store.history_query). A row per slot
(:data:`HISTORY_SCHEMA`), its plain form's fields as columns (``occur`` as JSON).

**Aggregation groups** (:func:`window_frames`), level by level:

1. Level 0: each change (not a delete) of a group's tenant gives its
   broker.store.aggregation ``contributions``, at the change's time (the live stores count a
   write at its time too: ``event_time``), for the panes its versions cover.
2. The contributions repartitioned by group key (tenant, group, version, level, service
   path, key) and folded, per pane and attribute, into a ``Partial``: level 0's in the order
   of their changes ``(time, partition, sequence)``, a level above's one per child entity;
   every window holding a pane with values is ``window_attributes`` of its panes: the
   derived entity's attributes, as the store's derived write carries them
   (:data:`WINDOW_SCHEMA`).
3. A level above: each window of the level below is applied, as the upsert the store
   writes (broker.store.semantics ``apply``), at its end, to its derived entity as the
   archive says it was then (its changes up to that time, from the archive's beginning:
   its parent attribute, e.g. ``refCampus``), and that write's contributions at this level
   are folded as in 2.

The archived writes of derived entities (the live windows) are not taken as input of a
level above: the backfill writes those windows itself. A group over another group's
derived entities (not a level of one definition) takes the archived ones.

A change archived twice counts once: its copies sit side by side in each task's sorted
rows (spark_matcher.archive.once). Tasks stream: they hold an entity's open slots, or the
panes of a group key's windows still to come, not whole histories.

What can differ from the live stores: ``sum`` and ``avg`` of a pane folded from several
stores (or, at a level above, several child entities) add the same values in another order
(the last bits of a double); a hierarchy changed between a window's end and the moment its
owner writes it (a fraction of a second) counts it under the new parent live, under the
old one here.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, Final

from broker.model.change import Alteration
from broker.store.aggregation import (
    Contribution,
    Definition,
    Partial,
    contributions,
    window_attributes,
)
from broker.store.aggregation_runtime import Version
from broker.store.history import STORED_LEVELS, recordable
from broker.store.history_fold import (
    Level,
    aggregated,
    changed_samples,
    folded,
    merged,
    micros,
    slot_start,
)
from broker.store.semantics import Document, Mode, Write, apply
from spark_matcher.archive import attributes_of, change_of, document_of, once

__all__ = [
    "HISTORY_SCHEMA",
    "WINDOW_SCHEMA",
    "history_frame",
    "history_slots",
    "pack_versions",
    "window_frames",
]

HISTORY_SCHEMA: Final = (
    "tenant STRING, service_path STRING, entity_id STRING, entity_type STRING, "
    "attribute STRING, level STRING, start BIGINT, samples BIGINT, sum DOUBLE, sum2 DOUBLE, "
    "min DOUBLE, max DOUBLE, occur STRING"
)
"""A history slot: its entity, attribute, level and start (epoch s), and what it holds (a
number's ``sum``... NULL for texts; ``occur`` a JSON object, ``{}`` for numbers)."""

WINDOW_SCHEMA: Final = (
    "tenant STRING, service_path STRING, entity_id STRING, entity_type STRING, "
    "aggregation STRING, version INT, level INT, start DOUBLE, end DOUBLE, attributes STRING"
)
"""A window written: its derived entity, group (id, version, level), bounds (epoch s) and
attributes (JSON: ``{name: {type, value, metadata}}``, as the store's derived write)."""

_CONTRIBUTIONS: Final = (
    "tenant STRING, aggregation STRING, version INT, level INT, service_path STRING, "
    "key STRING, pane DOUBLE, attribute STRING, child STRING, at DOUBLE, time BIGINT, "
    "partition INT, sequence BIGINT, partial STRING"
)
_GROUP: Final = ("tenant", "aggregation", "version", "level", "service_path", "key")
_ENTITY: Final = ("tenant", "service_path", "entity_id", "entity_type")
# a group key's contributions in the order they fold in (a change's copies side by side)
_ORDER: Final = ("pane", "child", "time", "partition", "sequence", "attribute")
_CHANGE, _WINDOW = 0, 1  # kinds of a timeline's rows: the archive's, a window to apply
_MONTH_AFTER: Final = 32 * 86400  # seconds from a month's start into the next month
_SPANS: Final = {Level.SECOND: 1, Level.MINUTE: 60, Level.HOUR: 3600, Level.DAY: 86400}
_FOLDED: Final = (Level.SECOND, *STORED_LEVELS)  # the levels folded sample by sample


# -- history --------------------------------------------------------------------------------


def history_frame(spark: Any, changes: Any, since: float | None, until: float | None) -> Any:
    """The history slots of ``changes`` (spark_matcher.archive.read_changes, from ``since``
    until ``until``, epoch s): only the slots wholly in that range (so every one holds all
    its samples)."""
    ordered = changes.repartition(*_ENTITY).sortWithinPartitions(*_ENTITY, "time", "sequence")
    return spark.createDataFrame(
        ordered.rdd.mapPartitions(functools.partial(history_slots, since=since, until=until)),
        HISTORY_SCHEMA,
    )


def history_slots(
    rows: Iterable[Any], since: float | None = None, until: float | None = None
) -> Iterator[tuple[Any, ...]]:
    """The ``mapPartitions`` function of the history: changes sorted by entity, then by
    ``(time, sequence)``; a :data:`HISTORY_SCHEMA` row per slot wholly from ``since`` until
    ``until`` (epoch s; None: unbounded). Each slot is given once the changes moved past it:
    a task holds an entity's open slots only (one per attribute and level)."""
    for entity, changes in itertools.groupby(rows, key=lambda r: tuple(r[c] for c in _ENTITY)):
        slots = _Slots(entity, since, until)
        for row in once(changes):
            if row["alteration"] == Alteration.DELETE.value or not row["changed"]:
                continue
            attributes = attributes_of(row["entity"])
            seconds = row["time"] // 1_000_000
            for sample in recordable(changed_samples(row["changed"], attributes)):
                value = aggregated(sample)
                if value is not None:
                    yield from slots.fold(sample.attribute, seconds, value)
        yield from slots.closed()


class _Slots:
    """One entity's open slots, folded in time order: per attribute and level, the one of
    the last sample (a month: its days' slots merged, as the store reads them)."""

    def __init__(self, entity: tuple[str, ...], since: float | None, until: float | None):
        self._entity = entity
        self._since = since
        self._until = until
        self._open: dict[tuple[str, Level], tuple[int, list[Any]]] = {}

    def fold(self, attribute: str, seconds: int, value: float | str) -> Iterator[tuple[Any, ...]]:
        """Fold a sample at ``seconds``; the rows of the slots it closes."""
        for level in _FOLDED:
            start = slot_start(level, seconds)
            held = self._open.get((attribute, level))
            if held is not None and held[0] != start:
                yield from self._close(attribute, level)
                held = None
            self._open[(attribute, level)] = (start, folded(held[1] if held else None, value))

    def closed(self) -> Iterator[tuple[Any, ...]]:
        """Close every slot still open (the entity's changes are over); their rows."""
        for attribute, level in [k for k in self._open if k[1] is not Level.MONTH]:
            yield from self._close(attribute, level)
        for attribute, level in list(self._open):
            yield from self._close(attribute, level)

    def _close(self, attribute: str, level: Level) -> Iterator[tuple[Any, ...]]:
        start, slot = self._open.pop((attribute, level))
        if level is Level.DAY:  # merged into its month, as the store's reads merge them
            month = slot_start(Level.MONTH, start)
            held = self._open.get((attribute, Level.MONTH))
            if held is not None and held[0] != month:
                yield from self._close(attribute, Level.MONTH)
                held = None
            self._open[(attribute, Level.MONTH)] = (
                month,
                merged(held[1], slot) if held else slot,
            )
        if _within(level, start, self._since, self._until):
            samples, total, squares, low, high, occur = slot
            yield (
                *self._entity, attribute, level.value, start,
                samples, total, squares, low, high, json.dumps(occur, ensure_ascii=False),
            )  # fmt: skip


def _within(level: Level, start: int, since: float | None, until: float | None) -> bool:
    """Tell whether the slot of ``level`` starting at ``start`` is wholly in the range."""
    if since is not None and start < since:
        return False
    if until is None:
        return True
    span = _SPANS.get(level)
    end = start + span if span is not None else slot_start(Level.MONTH, start + _MONTH_AFTER)
    return end <= until


# -- aggregation groups ---------------------------------------------------------------------


def pack_versions(versions: Sequence[Version]) -> str:
    """The versions as the tasks receive them (JSON: each definition as the API shows it)."""
    definitions = [(v.definition, v) for v in versions]
    return json.dumps(
        [[d.to_json(), d.tenant, d.scope, v.number, v.since, v.until] for d, v in definitions]
    )


@functools.lru_cache(maxsize=4)
def _versions(packed: str) -> dict[tuple[str, str, int], Version]:
    """The versions :func:`pack_versions` packed, by (tenant, id, number)."""
    found = {}
    for document, tenant, scope, number, since, until in json.loads(packed):
        version = Version.parse(document, tenant, scope, number, since, until)
        found[(tenant, version.definition.id, number)] = version
    return found


def window_frames(
    spark: Any,
    changes: Any,
    states: Callable[[Sequence[str], Sequence[str]], Any],
    versions: Sequence[Version],
    kept: list[Any],
) -> list[Any]:
    """The windows (:data:`WINDOW_SCHEMA`) of every level of the ``versions``, one frame
    per level: level 0 from ``changes`` (spark_matcher.archive.read_changes), a level above
    from the level below's windows and ``states(tenants, types)``, the archived changes of
    those tenants' entities of those types up to the end of ``changes``. Each frame is
    persisted and added to ``kept`` (the caller unpersists them once written)."""
    from pyspark import StorageLevel

    packed = pack_versions(versions)
    found = spark.createDataFrame(
        changes.rdd.mapPartitions(functools.partial(level_zero, packed=packed)), _CONTRIBUTIONS
    )
    frames: list[Any] = []
    for level in range(max((len(v.definition.levels) for v in versions), default=0)):
        if level:
            deeper = [v for v in versions if len(v.definition.levels) > level]
            tenants = sorted({v.definition.tenant for v in deeper})
            types = sorted({v.definition.levels[level - 1].type for v in deeper})
            timeline = _timeline(states(tenants, types), frames[-1])
            found = spark.createDataFrame(
                timeline.rdd.mapPartitions(
                    functools.partial(level_above, packed=packed, level=level)
                ),
                _CONTRIBUTIONS,
            )
        windows = spark.createDataFrame(
            found.repartition(*_GROUP)
            .sortWithinPartitions(*_GROUP, *_ORDER)
            .rdd.mapPartitions(functools.partial(windows_of, packed=packed)),
            WINDOW_SCHEMA,
        ).persist(StorageLevel.MEMORY_AND_DISK)
        kept.append(windows)
        frames.append(windows)
    return frames


def _timeline(states: Any, windows: Any) -> Any:
    """The changes of derived entities and the windows to write on them, in time order per
    entity (a change at a window's end before it)."""
    from pyspark.sql import functions as F

    written = windows.select(
        *_ENTITY,
        F.expr("CAST(floor(end * 1000000) AS BIGINT)").alias("time"),
        F.lit(_WINDOW).alias("kind"),
        "aggregation",
        "version",
        "end",
        "attributes",
    )
    changed = states.withColumn("kind", F.lit(_CHANGE))
    both = changed.unionByName(written, allowMissingColumns=True)
    return both.repartition(*_ENTITY).sortWithinPartitions(
        *_ENTITY, "time", "kind", "partition", "sequence", "aggregation", "version"
    )


def level_zero(rows: Iterable[Any], packed: str) -> Iterator[tuple[Any, ...]]:
    """The ``mapPartitions`` function of level 0: archived changes to their contributions
    (rows of the contributions' schema), at each change's time."""
    by_tenant: dict[str, list[Version]] = {}
    for version in _versions(packed).values():
        by_tenant.setdefault(version.definition.tenant, []).append(version)
    for row in rows:
        versions = by_tenant.get(row["tenant"])
        if not versions or row["alteration"] == Alteration.DELETE.value:
            continue
        document, change = document_of(row), change_of(row)
        at = row["time"] / 1_000_000  # the live store's event_time of the write, exactly
        order = (row["time"], row["partition"], row["sequence"])
        for version in versions:
            for found in contributions(version.definition, document, change, at):
                if not found.level and version.covers(found.pane):
                    yield _contribution(version, found, at, order)


def level_above(rows: Iterable[Any], packed: str, level: int) -> Iterator[tuple[Any, ...]]:
    """The ``mapPartitions`` function of a level above 0: each derived entity's timeline
    (:func:`_timeline`), its windows of the level below applied to it in turn; their
    contributions at ``level``."""
    versions = _versions(packed)
    for _entity, timeline in itertools.groupby(rows, key=lambda r: tuple(r[c] for c in _ENTITY)):
        state: Document | None = None
        for row in timeline:  # a change's copies set the state again: no harm
            if row["kind"] == _CHANGE:
                state = document_of(row)
                continue
            version = versions[(row["tenant"], row["aggregation"], row["version"])]
            if len(version.definition.levels) <= level:
                continue
            end = row["end"]
            if state is not None and state.expired(end):
                state = None  # the store had deleted it
            write = Write(
                Mode.UPSERT,
                row["entity_id"],
                row["entity_type"],
                row["service_path"],
                row["tenant"],
                json.loads(row["attributes"]),
            )
            applied = apply(state, write, end)
            if applied.document is None or applied.change is None:
                continue
            state = applied.document
            order = (micros(end), 0, 0)
            for found in contributions(version.definition, state, applied.change, end):
                if found.level == level and version.covers(found.pane):
                    yield _contribution(version, found, end, order)


def _contribution(
    version: Version, found: Contribution, at: float, order: tuple[int, int, int]
) -> tuple[Any, ...]:
    """A row of the contributions' schema."""
    definition = version.definition
    return (
        definition.tenant, definition.id, version.number, found.level, found.service_path,
        found.key, found.pane, found.attribute, found.child, at, *order,
        json.dumps(found.partial.to_wire()),
    )  # fmt: skip


def windows_of(rows: Iterable[Any], packed: str) -> Iterator[tuple[Any, ...]]:
    """The ``mapPartitions`` function of the windows: contributions sorted by group key,
    then pane, child and order; a :data:`WINDOW_SCHEMA` row per window with values, in
    order, each once its panes are all folded (a task holds one window's panes)."""
    versions = _versions(packed)
    for group, found in itertools.groupby(rows, key=lambda r: tuple(r[c] for c in _GROUP)):
        windows = _Windows(versions[group[:3]].definition, group)
        for pane, contributed in itertools.groupby(_once(found), key=lambda r: r["pane"]):
            yield from windows.written(pane)
            windows.add(pane, _folded(contributed, group[3]))
        yield from windows.written(math.inf)


class _Windows:
    """One group key's panes that a window still to come holds, and those windows' ends."""

    def __init__(self, definition: Definition, group: tuple[Any, ...]) -> None:
        self._definition = definition
        self._group = group
        self._panes: dict[float, dict[str, Partial]] = {}
        self._ends: set[float] = set()

    def add(self, pane: float, partials: dict[str, Partial]) -> None:
        """The pane starting at ``pane`` is folded (the next ones start later)."""
        self._panes[pane] = partials
        self._ends.update(self._definition.window.ends_with(pane))

    def written(self, before: float) -> Iterator[tuple[Any, ...]]:
        """The rows of the windows ending by ``before`` (every pane after is to come)."""
        definition, window = self._definition, self._definition.window
        tenant, name, number, level, path, key = self._group
        for end in sorted(e for e in self._ends if e <= before):
            self._ends.discard(end)
            attributes = window_attributes(definition, end, self._panes)
            if attributes:
                yield (
                    tenant, path, key, definition.levels[level].type, name, number, level,
                    end - window.size, end, json.dumps(attributes, ensure_ascii=False),
                )  # fmt: skip
        for old in [p for p in self._panes if p <= before - window.size]:
            del self._panes[old]  # in no window still to come


def _once(rows: Iterable[Any]) -> Iterator[Any]:
    """Contributions without those of a change archived twice (side by side: _ORDER)."""
    last = None
    for row in rows:
        named = tuple(row[c] for c in _ORDER)
        if named != last:
            last = named
            yield row


def _folded(rows: Iterable[Any], level: int) -> dict[str, Partial]:
    """One pane's partials, by attribute, from its contributions: level 0's merged in their
    order; a level above's one per child entity (its latest, as the owner keeps it), merged
    in the children's order."""
    out: dict[str, Partial] = {}
    latest: dict[tuple[str, str], tuple[float, Partial]] = {}
    for row in rows:
        partial = Partial.from_wire(json.loads(row["partial"]))
        attribute = row["attribute"]
        if not level:
            out[attribute] = out.get(attribute, Partial()).merged(partial)
        elif row["at"] >= latest.get((row["child"], attribute), (-math.inf, partial))[0]:
            latest[(row["child"], attribute)] = (row["at"], partial)
    for (_child, attribute), (_at, partial) in sorted(latest.items()):
        out[attribute] = out.get(attribute, Partial()).merged(partial)
    return out
