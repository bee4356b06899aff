"""What the context store makes of a file of updates (``silbo replay``): each update applied,
in order, to its entity as the live store applies it.

The live broker does not match an update as it was sent. The HTTP front hands each write to
the context store, which applies it to the stored entity with Orion's semantics
(:func:`broker.store.semantics.apply`) and gives back the entity as it is now and the
:class:`~broker.model.change.Change` (the alteration type, the attributes changed); the
front publishes that whole entity with its change (broker.ngsi.front), the matchers match
it, and the front decides on the change (spark_matcher.decisions). A replay does the same
without the processes: every update is an upsert of its entity (Orion's
``POST /v2/entities?options=upsert``, a batch ``append``: what the front turns it into), applied
with that same function to the state the earlier updates of the entity left, starting from
nothing or from the initial entities given.

Times (:class:`Clock`): an update is made at its ``time`` field (epoch seconds, or an ISO
8601 date; ``spark_matcher.entities.time_of``); one without, :data:`STEP` after the start of
the replay for each update before it (update ``n`` at ``start + n * STEP``), so a file
without times reads as updates 1 ms apart from when the replay started; an initial entity
without, at the start. The time is the store's clock for the write (``dateCreated``,
``dateModified``, the entity's expiry) and the front's for the decision.

Entity expiry: an entity whose ``dateExpires`` is past at an update's time is gone, so the
update creates it again (the live store deletes it within a second of its expiry, notifying
nothing; a write in that second would still find it).

:func:`steps` is what a Spark task runs: the rows of its partition sorted by entity, then
initial entities first, then by update; each update's :class:`Step` as a row.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from broker.errors import InvalidInput
from broker.model.change import Change
from broker.store.geo import LOCATION_TYPES
from broker.store.semantics import Applied, Attributes, Document, Key, Mode, Write, apply
from spark_matcher.entities import InputError, time_of, update_from_json

__all__ = ["STEP", "STEP_SCHEMA", "Clock", "EntityStates", "Step", "located", "steps", "upsert_of"]

STEP = 0.001  # seconds between updates that give no time
STEP_SCHEMA = (
    "update BIGINT, time DOUBLE, text STRING, alteration STRING, changed ARRAY<STRING>, "
    "meta_changed ARRAY<STRING>, requested ARRAY<STRING>, located STRING, problem STRING"
)
"""The columns of a step row: the update, its time, the entity published (JSON, NULL if
none), its change, the entity's geographical attributes (JSON, NULL if none: what a
``georel`` subscription reads) and, for a line that could not be read, its InputError's
text (naming the file, the line and the field)."""


@dataclass(frozen=True, slots=True)
class Clock:
    """When each update was made (see the module doc)."""

    start: float

    def time_of(
        self, body: Mapping[str, Any], update: int, initial: bool = False, source: str = "<input>"
    ) -> float:
        """The ``time`` of update (or initial entity) number ``update``, else its time by
        default; InputError for a bad one."""
        given = time_of(body, source, update + 1)
        if given is not None:
            return given
        return self.start if initial else self.start + update * STEP


@dataclass(frozen=True, slots=True)
class Step:
    """What one update did: its time, the entity the front publishes after it (None: none,
    the write failed) and its change."""

    update: int
    time: float
    entity: Document | None
    change: Change | None

    def row(self) -> tuple[Any, ...]:
        """The step as a row of :data:`STEP_SCHEMA`."""
        if self.entity is None or self.change is None:
            return (self.update, self.time, None, None, None, None, None, None, None)
        change, document = self.change, self.entity
        text = json.dumps(
            {
                "id": document.id,
                "type": document.type,
                "tenant": document.tenant,
                "servicePath": document.service_path,
                **document.attributes,
            },
            ensure_ascii=False,
        )
        return (
            self.update,
            self.time,
            text,
            change.alteration.value,
            sorted(change.changed),
            sorted(change.meta_changed),
            sorted(change.requested),
            located(document.attributes),
            None,
        )


def located(attributes: Attributes) -> str | None:
    """The attributes of a geographical type as JSON ``[[type, value, metadata], ...]`` in
    order (what :func:`broker.store.geo.first_location` reads), None if there are none."""
    found = [
        [a["type"], a["value"], a["metadata"]]
        for a in attributes.values()
        if a["type"] in LOCATION_TYPES
    ]
    return json.dumps(found, ensure_ascii=False) if found else None


def upsert_of(body: Mapping[str, Any], source: str = "<input>", line: int = 0) -> Write:
    """The upsert an update line makes, with the HTTP front's reading of its attributes
    (InputError naming the field if it is not valid)."""
    update = update_from_json(body, strict=True, source=source, line=line, timed=True)
    attributes = {
        name: {
            "type": a.type,
            "value": a.value,
            "metadata": {k: {"type": m.type, "value": m.value} for k, m in a.metadata.items()},
        }
        for name, a in update.attributes.items()
    }
    return Write(
        Mode.UPSERT,
        update.entity_id,
        update.entity_type,
        update.service_path,
        update.tenant,
        attributes,
    )


class EntityStates:
    """Entities as the context store holds them, changed one write at a time."""

    def __init__(self) -> None:
        self._held: dict[Key, Document] = {}

    def upsert(self, write: Write, at: float) -> Applied:
        """Apply ``write`` at ``at`` (epoch seconds) as the store does; what it did."""
        key = (write.tenant, write.service_path, write.entity_id, write.entity_type)
        current = self._held.get(key)
        if current is not None and current.expired(at):
            current = None  # the store has deleted it (module doc)
        applied = apply(current, write, at)
        if applied.document is None:
            self._held.pop(key, None)
        else:
            self._held[key] = applied.document
        return applied

    def clear(self) -> None:
        """Forget every entity."""
        self._held.clear()


def steps(clock: Clock, source: str, initial_source: str) -> Callable[..., Iterator[Any]]:
    """The ``mapPartitions`` function of the state pass: rows ``(entity, initial, update,
    text)`` sorted by ``entity`` (a key of the entity, the same for all its rows), then
    initial entities first, then ``update``; a :data:`STEP_SCHEMA` row per update (none for
    an initial entity; one with ``problem`` for a line that cannot be read). The sources
    name the files of the updates and of the initial entities in errors."""

    def run(rows: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
        entities = EntityStates()
        group = None
        for entity, initial, update, text in rows:
            if entity != group:  # every update of one entity is in one run of rows
                entities.clear()
                group = entity
            where = initial_source if initial else source
            try:
                body = json.loads(text)
                if not isinstance(body, dict):
                    raise InputError(where, update + 1, "", "an update must be a JSON object")
                at = clock.time_of(body, update, initial, where)
                write = upsert_of(body, where, update + 1)
            except ValueError as exc:
                problem = str(InputError(where, update + 1, "", f"not JSON: {exc}"))
                yield (update, None, None, None, None, None, None, None, problem)
                continue
            except InvalidInput as exc:
                yield (update, None, None, None, None, None, None, None, str(exc))
                continue
            applied = entities.upsert(write, at)
            if initial:
                continue
            document = applied.document if applied.change is not None else None
            yield Step(update, at, document, applied.change).row()

    return run
