"""The changelog of a store's partitions: every change its writes applied, for the archiver.

With ``--archive on`` (a context store option; ``silbo up --archive PATH`` sets it) each
write a store applies as a partition's primary that has a :class:`~broker.model.change.Change`
(a create, a change, an update that changes nothing, a delete, the expiry of an entity)
adds one key to the write's own commit (:meth:`Changelog.stage`)::

    c, the partition (2 bytes), the sequence (8 bytes, big-endian) -> msgpack
        [time µs, alteration, changed, meta_changed, requested, document]

``document`` is the stored document (broker.store.semantics.Document's bytes) after the
write, or before it for a delete: bytes the write encoded anyway, so a change costs the
store one small msgpack list and one key more; the archiver turns a record into the
archive's row (:func:`change_row`, docs/archive.md). ``time`` is the write's time on the
store's clock for its entity, which never goes back: the entity's new ``dateModified``, or
``max(now, dateModified)`` for a write that changes nothing and for a delete.

The keys are keys of the entity's partition (broker.store.entities.key_partition), so the
changelog is exactly as durable as the entities, replicated to the backups with each write,
copied by a recovery and a store scale, and dropped with a partition a store leaves.

**Sequences** are strictly increasing per partition, across restarts, failovers and scales:
the next one is ``max(highest + 1, the write's time in µs)``, where ``highest`` is the
highest this store assigned, stored, was shipped or copied for the partition (read once from
the last changelog key and the trim mark ``c`` + partition, then kept). Being time-based,
a new primary numbers after a change the old one assigned even when it never received it
(a write that was never answered, lost in a double failure), as long as the clocks of the
two hosts are not further apart than the time between the two writes.

**Visibility**: :meth:`Changelog.visible` is the highest sequence of a partition whose
write is *settled*: durable here and on every live backup (the write was answered, or it
would have been), so the archiver never reads a change that a failover could lose.

**Trim**: once archived, the changes up to a sequence are deleted (:meth:`Changelog.trim`,
through the primary's commits, replicated like writes); the mark ``c`` + partition keeps
the highest sequence trimmed, so a store whose changelog is empty still knows where its
sequences stand.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Final

import msgpack
import orjson

from broker.store.history_fold import micros
from broker.store.semantics import Applied, Document

if TYPE_CHECKING:  # the engine's module loads the storage libraries: only its interface here
    from broker.store.engine import Engine

__all__ = [
    "CHANGELOG_SPACE",
    "TRIM_MOST",
    "ArchiveRow",
    "Changelog",
    "change_key",
    "change_row",
]

CHANGELOG_SPACE: Final = b"c"
TRIM_MOST: Final = 20_000  # changes of one partition deleted by one trim at most


def change_key(partition: int, sequence: int) -> bytes:
    """The key of a partition's change number ``sequence``."""
    return _prefix(partition) + sequence.to_bytes(8, "big")


def _prefix(partition: int) -> bytes:
    return CHANGELOG_SPACE + partition.to_bytes(2, "big")  # also the trim mark's key


@dataclass(frozen=True, slots=True)
class ArchiveRow:
    """One change as the archive holds it (docs/archive.md; /work/archive-schema.md): the
    schema's columns, and the tenant and day its file's directories name."""

    tenant: str
    day: str
    service_path: str
    entity_id: str
    entity_type: str
    time: int
    partition: int
    sequence: int
    alteration: str
    changed: list[str]
    meta_changed: list[str]
    requested: list[str]
    entity: str
    date_created: int


def change_row(partition: int, sequence: int, record: bytes) -> ArchiveRow:
    """The archive's row of a changelog record (SerializationError if it is not one)."""
    moment, alteration, changed, meta_changed, requested, document = msgpack.unpackb(
        record, raw=False
    )
    entity = Document.from_bytes(document)
    text = orjson.dumps(
        {
            "id": entity.id,
            "type": entity.type,
            "tenant": entity.tenant,
            "servicePath": entity.service_path,
            **entity.attributes,
        }
    ).decode()
    day = datetime.fromtimestamp(moment / 1_000_000, UTC).strftime("%Y-%m-%d")
    return ArchiveRow(
        entity.tenant,
        day,
        entity.service_path,
        entity.id,
        entity.type,
        moment,
        partition,
        sequence,
        alteration,
        sorted(changed),
        sorted(meta_changed),
        sorted(requested),
        text,
        micros(entity.date_created),
    )


class Changelog:
    """The changelog of one store's engine (see the module doc). One event loop stages,
    settles and trims; :meth:`read` and :meth:`count` may run in other threads."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._highest: dict[int, int] = {}  # partition: the highest sequence known
        # partition: the sequences staged and not settled, in order (a dict as ordered set)
        self._unsettled: dict[int, dict[int, None]] = {}

    def stage(
        self,
        partition: int,
        applied: Applied,
        now: float,
        document: bytes,
        puts: list[tuple[bytes, bytes]],
    ) -> int:
        """Add the change ``applied`` made at ``now`` (epoch s) to a commit's ``puts``;
        its sequence, unsettled until :meth:`settle`. ``document``: the stored document
        after the write (before it, for a delete)."""
        change = applied.change
        assert change is not None, "a write that failed changes nothing"
        after = applied.document
        if applied.modified and after is not None:
            moment = micros(after.date_modified)
        else:  # nothing changed, or deleted: dates never go back (semantics.apply)
            before = applied.before
            moment = micros(max(now, before.date_modified) if before is not None else now)
        sequence = max(self._highest_of(partition) + 1, micros(now))
        self._highest[partition] = sequence
        self._unsettled.setdefault(partition, {})[sequence] = None
        record = [
            moment,
            change.alteration.value,
            list(change.changed),
            list(change.meta_changed),
            list(change.requested),
            document,
        ]
        puts.append((change_key(partition, sequence), msgpack.packb(record, use_bin_type=True)))
        return sequence

    def settle(self, changes: Iterable[tuple[int, int]]) -> None:
        """These (partition, sequence) changes' writes are durable here and on the backups."""
        for partition, sequence in changes:
            unsettled = self._unsettled.get(partition)
            if unsettled is not None:
                unsettled.pop(sequence, None)
                if not unsettled:
                    del self._unsettled[partition]

    def observe(self, puts: Iterable[tuple[bytes, bytes]]) -> None:
        """Keys stored another way than :meth:`stage` (shipped by a primary, copied): the
        highest sequences known follow them."""
        for key, value in puts:
            if key[:1] != CHANGELOG_SPACE:
                continue
            partition = int.from_bytes(key[1:3], "big")
            known = self._highest.get(partition)
            if known is not None:  # else read from what is stored when first needed
                self._highest[partition] = max(known, _sequence_of(key, value))

    def visible(self, partition: int) -> int:
        """The highest sequence of ``partition`` that may be read: every change up to it is
        settled (module doc). On the event loop, before the read."""
        unsettled = self._unsettled.get(partition)
        if unsettled:
            return next(iter(unsettled)) - 1
        return self._highest_of(partition)

    def read(self, partition: int, after: int, upto: int, most: int) -> list[tuple[int, bytes]]:
        """At most ``most`` committed changes of ``partition`` after ``after`` and up to
        ``upto`` (:meth:`visible`), as (sequence, record)."""
        found: list[tuple[int, bytes]] = []
        for key, value in self._engine.scan(_prefix(partition), change_key(partition, after)):
            sequence = int.from_bytes(key[3:], "big")
            if sequence > upto or len(found) >= most:
                break
            found.append((sequence, value))
        return found

    def count(self, partition: int, after: int, upto: int) -> tuple[int, int]:
        """How many committed changes of ``partition`` follow ``after`` (up to ``upto``),
        and the time (µs) of the first of them (0: none)."""
        count, oldest = 0, 0
        for key, value in self._engine.scan(_prefix(partition), change_key(partition, after)):
            if int.from_bytes(key[3:], "big") > upto:
                break
            if not count:
                oldest = int(msgpack.unpackb(value, raw=False)[0])
            count += 1
        return count, oldest

    def trim(self, partition: int, upto: int) -> tuple[list[tuple[bytes, bytes]], list[bytes]]:
        """The puts and deletes that trim ``partition``'s changes up to ``upto`` (at most
        TRIM_MOST of them; the mark keeps the highest deleted). Nothing if none is left."""
        gone: list[bytes] = []
        for key, _value in self._engine.scan(_prefix(partition), change_key(partition, 0)):
            if int.from_bytes(key[3:], "big") > upto or len(gone) >= TRIM_MOST:
                break
            gone.append(key)
        if not gone:
            return [], []
        mark = int.from_bytes(gone[-1][3:], "big")
        stored = self._engine.get(_prefix(partition))
        if stored is not None:
            mark = max(mark, int.from_bytes(stored, "big"))
        return [(_prefix(partition), mark.to_bytes(8, "big"))], gone

    def _highest_of(self, partition: int) -> int:
        known = self._highest.get(partition)
        if known is None:
            known = self._stored_highest(partition)
            self._highest[partition] = known
        return known

    def _stored_highest(self, partition: int) -> int:
        """The highest sequence stored for ``partition``: its last change, or its mark."""
        highest = 0
        for key, value in self._engine.scan_back(_prefix(partition)):
            highest = _sequence_of(key, value)
            break
        mark = self._engine.get(_prefix(partition))
        return max(highest, int.from_bytes(mark, "big") if mark is not None else 0)


def _sequence_of(key: bytes, value: bytes) -> int:
    """The sequence a changelog key holds (the mark's: its value)."""
    return int.from_bytes(value if len(key) == 3 else key[3:], "big")
