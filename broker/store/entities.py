"""The entities of one store: writes applied with Orion's semantics, made durable, and read.

What a context store process does with its :class:`~broker.store.engine.Engine` (and what a
front without a store layer does in memory, over :class:`MemoryEngine`): :meth:`Entities.apply`
takes a front's writes (:class:`~broker.store.wire.Intent`), reads each entity, applies
:func:`broker.store.semantics.apply`, and commits the new documents through the group
committer; :meth:`Entities.documents` gives the stored documents a query reads.

Keys: ``d``, the partition (two bytes, big-endian), then tenant NUL id NUL service path NUL
type (UTF-8; an identifier cannot hold NUL). The partition is :func:`partition_of` (tenant,
id), so one entity id's every type and service path is in one partition, found with one
prefix scan (that is how a write without a type finds its entity, and how Orion's 409 for
an ambiguous id is told), and a partition is one contiguous range of keys (a scale copies
ranges, docs/context-store.md).

Writes sent again: a front gives each write an id (:func:`new_write_id`) and sends it again,
with the same id, when it cannot know whether the store applied it (the call failed after
it left). The store keeps each write's outcome under ``w``, its entity's partition and its
id, in the write's own commit, for :data:`WRITE_IDS_KEPT` seconds: a write id it knows is
answered with the first outcome, never applied twice (``$inc`` is not idempotent). The
outcomes are keys of their partition, so they move with it (recovery, a scale) and a new
primary knows them too.

History (broker.store.history, when recorded): each write's raw rows and level slots are
staged with it, in its commit, under ``h``, the partition and the document key's parts:
keys of the entity's partition too, so they are replicated, copied and dropped with it.

Alert rules (broker.store.alert_log, when given one): the state of each (rule, entity) a
write moves, and the transitions to publish, are staged with it too, in its commit, under
``a`` and ``o``, the partition and the document key's parts: keys of the partition as well.

Changelog (broker.store.changelog, when recorded: ``--archive on``): each write with a change
adds a record under ``c``, the partition and its sequence, in its commit: keys of the
partition too. A change is readable by the archiver once its write is settled (durable
here and on the backups).

Order and concurrency: writes are applied one at a time on the event loop, in the order
they arrive; their commits are grouped (one fsync for many writes). A write reads the
entity as the writes before it left it, committed or not (:attr:`Entities._pending`), so two
writes of one entity in one group apply in order; a write is answered only once its commit
is durable. A failed commit leaves the pending documents of its writes unknown: the store
stops serving (:class:`StoreFailed`) and is restarted from what is durable.
"""

from __future__ import annotations

import asyncio
import bisect
import os
import time
import zlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

import msgpack

from broker.errors import (
    AmbiguousEntity,
    InvalidIdentifier,
    InvalidInput,
    NotFound,
    SilboError,
    Unavailable,
)
from broker.model.update import DEFAULT_ENTITY_TYPE
from broker.store.alert_log import OUTBOX_SPACE, STATE_SPACE, AlertLog
from broker.store.changelog import CHANGELOG_SPACE, TRIM_MOST, Changelog
from broker.store.engine import Engine, GroupCommitter, StorageError
from broker.store.history import HISTORY_SPACE, HistoryLog, HistoryOptions
from broker.store.history_query import HistoryQuery, answer_history
from broker.store.index import DocumentKey, EntityIndex
from broker.store.semantics import Applied, Document, Mode, apply
from broker.store.wire import Intent, applied_of, result_row

__all__ = [
    "PARTITIONS",
    "WRITE_IDS_KEPT",
    "Entities",
    "MemoryEngine",
    "StoreFailed",
    "document_key",
    "key_partition",
    "new_write_id",
    "partition_of",
]

RECENT_DOCUMENTS: Final = 4096  # decoded documents kept (a hot entity is not decoded again)
WRITE_IDS_KEPT: Final = 120.0  # seconds a write's outcome is kept for a sender's retry
PARTITIONS: Final = 256  # fixed: a store layout divides these among the store processes
_DOCUMENTS: Final = b"d"
_EXPIRY: Final = b"x"
_WRITES: Final = b"w"  # w, partition, write id (8 bytes of ms, 8 random): the outcome
# keys that begin with their partition
_PARTITIONED: Final = (
    _DOCUMENTS,
    _WRITES,
    HISTORY_SPACE,
    STATE_SPACE,
    OUTBOX_SPACE,
    CHANGELOG_SPACE,
)
_SEP: Final = b"\x00"
_NO_ENTITY: Final = "The requested entity has not been found. Check type and id"


Replicate = Callable[[list[tuple[bytes, bytes]], list[bytes]], Awaitable[None]]


class StoreFailed(Unavailable):
    """The store's storage failed; it serves nothing more (its process restarts)."""


def new_write_id(now: float | None = None) -> bytes:
    """A fresh write id: the time in ms (8 bytes, so ids sort by age), then 8 random bytes."""
    moment = time.time() if now is None else now
    return int(moment * 1000).to_bytes(8, "big") + os.urandom(8)


def key_partition(key: bytes) -> int | None:
    """The partition of a document, write-outcome, history, changelog or expiry-index key
    (None: a key of every partition)."""
    if key[:1] in _PARTITIONED:
        return int.from_bytes(key[1:3], "big")
    if key[:1] == _EXPIRY:
        return int.from_bytes(key[10:12], "big")
    return None


def partition_of(tenant: str, entity_id: str) -> int:
    """The partition of an entity: a stable hash of its tenant and id."""
    return zlib.crc32(f"{tenant}\x00{entity_id}".encode()) % PARTITIONS


def _encoded(*parts: str) -> bytes:
    out = []
    for part in parts:
        if "\x00" in part:
            raise InvalidIdentifier(f"an identifier holds a NUL character: {part!r}")
        out.append(part.encode("utf-8"))
    return _SEP.join(out)


def _partition_prefix(partition: int) -> bytes:
    return _DOCUMENTS + partition.to_bytes(2, "big")


def _id_prefix(tenant: str, entity_id: str, service_path: str) -> bytes:
    """The keys of one id in one service path: one per type."""
    return (
        _partition_prefix(partition_of(tenant, entity_id))
        + _encoded(tenant, entity_id, service_path)
        + _SEP
    )


def document_key(tenant: str, service_path: str, entity_id: str, entity_type: str) -> bytes:
    """The storage key of one entity (module doc)."""
    return _id_prefix(tenant, entity_id, service_path) + _encoded(entity_type)


def _key_of(parts: DocumentKey) -> bytes:
    """The storage key of a document, from its parts (the index keeps parts, not keys)."""
    return _partition_prefix(parts.partition) + _encoded(
        parts.tenant, parts.entity_id, parts.service_path, parts.entity_type
    )


def _split_key(key: bytes) -> DocumentKey | None:
    """The parts of a document key (None: another kind of key)."""
    if key[:1] != _DOCUMENTS:
        return None
    parts = key[3:].split(_SEP)
    if len(parts) != 4:
        return None
    tenant, entity_id, path, entity_type = (p.decode("utf-8") for p in parts)
    return DocumentKey(int.from_bytes(key[1:3], "big"), tenant, entity_id, path, entity_type)


def _outcome_key(intent: Intent) -> bytes:
    """Where a write's outcome is kept: under its entity's partition (module doc)."""
    partition = partition_of(intent.tenant, intent.entity_id)
    return _WRITES + partition.to_bytes(2, "big") + intent.write_id


_EXPIRY_EXTRA = len(_EXPIRY) + 8  # what an expiry index key adds to its document's key


def _expiry_key(expires: float, key: bytes) -> bytes:
    return _EXPIRY + max(0, int(expires * 1000)).to_bytes(8, "big") + key


@dataclass
class _Staged:
    """Writes applied, to be committed: their results and what the commit holds."""

    results: list[Applied] = field(default_factory=list)
    puts: list[tuple[bytes, bytes]] = field(default_factory=list)
    deletes: list[bytes] = field(default_factory=list)
    tickets: list[tuple[bytes, int]] = field(default_factory=list)  # pending documents held
    ids: list[bytes] = field(default_factory=list)  # write ids applied here
    rows: list[list[Any]] = field(default_factory=list)  # the answer of each result
    waits: list[asyncio.Event] = field(default_factory=list)  # write ids applied by others
    fresh: list[int] = field(default_factory=list)  # results applied here, not known before
    alert_tickets: list[int] = field(default_factory=list)  # alert states pending (AlertLog)
    changes: list[tuple[int, int]] = field(default_factory=list)  # (partition, sequence) staged

    def put(self, key: bytes, value: bytes) -> None:
        """Stage ``key``'s new value. A commit writes its puts, then its deletes, so a key
        is never in both: the last staged of a key's writes is the one committed (a batch
        may delete an entity and create it again)."""
        if key in self.deletes:
            self.deletes.remove(key)
        self.puts.append((key, value))

    def delete(self, key: bytes) -> None:
        """Stage ``key``'s deletion (see :meth:`put`)."""
        self.puts[:] = [(k, v) for k, v in self.puts if k != key]
        self.deletes.append(key)


class Entities:
    """The entities of one engine (module doc), and their history (broker.store.history):
    with ``history`` its writes record it if ``record_history``, and :meth:`forget_history`
    ages out what is stored, recorded or not; with ``alerts`` its writes keep the alert
    rules' states (broker.store.alert_log); and their changelog (broker.store.changelog),
    recorded if ``record_changes``, read and trimmed either way. One event loop uses it."""

    def __init__(
        self,
        engine: Engine,
        committer: GroupCommitter | None = None,
        history: HistoryOptions | None = None,
        *,
        record_history: bool = True,
        alerts: AlertLog | None = None,
        record_changes: bool = False,
    ) -> None:
        self._engine = engine
        self._committer = committer
        # key: (ticket, value, document), for writes applied but not committed yet
        self._pending: dict[bytes, tuple[int, bytes | None, Document | None]] = {}
        # committed documents recently read or written: key -> (value, document)
        self._recent: OrderedDict[bytes, tuple[bytes, Document]] = OrderedDict()
        self._pending_ids: dict[bytes, set[bytes]] = {}  # id prefix: its pending keys
        self._ticket = 0
        # write ids applied but not yet durable: their outcome, set once durable
        self._staged: dict[bytes, tuple[Applied, list[Any], asyncio.Event]] = {}
        self._failed: BaseException | None = None
        # what list queries read (broker.store.indexed), kept by every commit below
        self.index = EntityIndex(_key_of, _split_key)
        self.history = HistoryLog(engine, history) if history is not None else None
        self._recording = self.history if record_history else None
        self.alerts = alerts  # the alert rules' states, kept in the writes' commits
        self.changelog = Changelog(engine)
        self._record_changes = record_changes

    # -- writes ------------------------------------------------------------------------------

    async def apply(
        self,
        intents: Sequence[Intent],
        now: float | None = None,
        replicate: Replicate | None = None,
        rows: list[list[Any]] | None = None,
        fresh: list[int] | None = None,
    ) -> list[Applied]:
        """Apply the writes in order; each one's result once every change is durable, here
        and wherever ``replicate`` makes it durable (the backups; awaited with the commit).
        ``fresh`` is given the indexes of the writes this call applied (not those sent
        again, answered with their first outcome).

        A write that fails (NotFound, Unprocessable, 409...) has its error in its result and
        changes nothing; the others apply. Raises StoreFailed if the storage failed, and
        what ``replicate`` raises.
        """
        staged = self._stage(intents, now)
        if staged.puts or staged.deletes:
            durable = False
            try:
                if replicate is not None:
                    await asyncio.gather(
                        self._commit(staged), replicate(staged.puts, staged.deletes)
                    )
                else:
                    await self._commit(staged)
                durable = True
            finally:
                self._settle(staged, durable=durable)
        else:
            self._settle(staged)
        for event in staged.waits:  # a write sent again while its first sending commits
            await event.wait()
        self._check_serving()
        if rows is not None:  # the answer rows (wire.result_row), encoded once
            rows.extend(staged.rows)
        if fresh is not None:
            fresh.extend(staged.fresh)
        return staged.results

    async def _commit(self, staged: _Staged) -> None:
        try:
            if self._committer is not None:
                await self._committer.write(staged.puts, staged.deletes)
            else:
                self._engine.commit(staged.puts, staged.deletes)
        except (StorageError, OSError) as exc:
            self._failed = exc
            raise StoreFailed(f"the context store's storage failed: {exc}") from exc
        self.index.committed(staged.puts, staged.deletes, self._held_document)

    def _held_document(self, key: bytes, value: bytes) -> Document | None:
        """The decoded document a pending write holds for ``value`` (not a later one's)."""
        held = self._pending.get(key)
        return held[2] if held is not None and held[1] is value else None

    async def store(self, puts: Sequence[tuple[bytes, bytes]], deletes: Sequence[bytes]) -> None:
        """Make what a primary shipped durable here (a backup's writes: states, not requests,
        so a backup applies nothing and cannot diverge)."""
        self._check_serving()
        if self.history is not None:
            self.history.forget([*(k for k, _v in puts), *deletes])
        self.changelog.observe(puts)
        await self._commit(_Staged(puts=list(puts), deletes=list(deletes)))

    def apply_now(self, intents: Sequence[Intent], now: float | None = None) -> list[Applied]:
        """:meth:`apply`, at once, for entities without a group committer (in memory)."""
        if self._committer is not None:
            raise RuntimeError("apply_now is for entities without a group committer")
        staged = self._stage(intents, now)
        durable = False
        try:
            self._engine.commit(staged.puts, staged.deletes)
            self.index.committed(staged.puts, staged.deletes, self._held_document)
            durable = True
        finally:
            self._settle(staged, durable=durable)
        return staged.results

    def _settle(self, staged: _Staged, *, durable: bool = True) -> None:
        """The commit of ``staged`` ended: release its pending documents and write ids; its
        changes are readable if it is ``durable`` (else the store fails: they never are)."""
        if durable:
            self.changelog.settle(staged.changes)
        for key, ticket in staged.tickets:
            self._release(key, ticket)
            if self.history is not None:
                self.history.release(ticket)
        for write_id in staged.ids:
            self._staged.pop(write_id)[2].set()
        if self.alerts is not None:
            for ticket in staged.alert_tickets:
                self.alerts.release(ticket)

    def _stage(self, intents: Sequence[Intent], now: float | None) -> _Staged:
        """Apply the writes to what is stored or pending: the results, what to commit, the
        pending entries the commit releases."""
        self._check_serving()
        moment = time.time() if now is None else now
        staged = _Staged()
        for intent in intents:
            if intent.write_id:
                known = self._known(intent, staged)
                if known is not None:  # sent again: the first outcome, not a second one
                    staged.results.append(known[0])
                    staged.rows.append(known[1])
                    continue
            applied, key, was_bytes = self._apply_one(intent, moment)
            staged.fresh.append(len(staged.results))
            staged.results.append(applied)
            if self.alerts is not None and key is not None:
                alerted = self.alerts.stage(key, applied, moment, staged.puts)
                if alerted is not None:
                    staged.alert_tickets.append(alerted)
            document = applied.document
            if document is None:
                value = None
            elif applied.modified:
                value = document.to_bytes()
            else:
                value = was_bytes if document is applied.before else document.to_bytes()
            row = result_row(applied, value, was_bytes)
            staged.rows.append(row)
            if self._record_changes and applied.change is not None and key is not None:
                stored = value if value is not None else was_bytes
                if stored is not None:
                    partition = int.from_bytes(key[1:3], "big")
                    sequence = self.changelog.stage(partition, applied, moment, stored, staged.puts)
                    staged.changes.append((partition, sequence))
            if intent.write_id:
                self._staged[intent.write_id] = (applied, row, asyncio.Event())
                staged.ids.append(intent.write_id)
                staged.puts.append((_outcome_key(intent), msgpack.packb(row)))
            if applied.modified and key is not None:
                ticket = self._hold(key, value, document)
                staged.tickets.append((key, ticket))
                if self._recording is not None:
                    self._recording.stage(key, applied, ticket, staged.puts, staged.deletes)
                if value is None:
                    staged.delete(key)
                else:
                    staged.put(key, value)
                was = applied.before.date_expires if applied.before is not None else None
                will = document.date_expires if document is not None else None
                if was != will:  # the expiry index follows (committed with the document)
                    if was is not None:
                        staged.delete(_expiry_key(was, key))
                    if will is not None:
                        staged.put(_expiry_key(will, key), b"")
        return staged

    def _known(self, intent: Intent, staging: _Staged) -> tuple[Applied, list[Any]] | None:
        """The outcome of a write applied before under the intent's write id (staged or
        durable), and its answer row."""
        staged = self._staged.get(intent.write_id)
        if staged is not None:
            staging.waits.append(staged[2])
            return staged[0], staged[1]
        data = self._engine.get(_outcome_key(intent))
        if data is None:
            return None
        row = msgpack.unpackb(data, raw=False, strict_map_key=False)
        return applied_of(row), row

    def forget_writes(self, before: float, most: int = 50_000) -> int:
        """Drop the outcomes kept of (at most ``most``) writes sent before ``before`` (epoch
        seconds: a write id begins with its sending time in ms); how many went."""
        cutoff = max(0, int(before * 1000)).to_bytes(8, "big")
        old: list[bytes] = []
        for partition in range(PARTITIONS):  # each partition's outcomes are in time order
            for key, _value in self._engine.scan(_WRITES + partition.to_bytes(2, "big")):
                if key[3:11] >= cutoff or len(old) >= most:
                    break
                old.append(key)
        if old:
            self._engine.commit([], old)
        return len(old)

    def read_history(self, query: HistoryQuery) -> list[Any]:
        """The committed history of one attribute (broker.store.history_query's answer)."""
        self._check_serving()
        key = document_key(query.tenant, query.service_path, query.entity_id, query.entity_type)
        return answer_history(self._engine, key, query)

    async def forget_history(
        self, partition: int, now: float | None = None, replicate: Replicate | None = None
    ) -> int:
        """Delete the history of a partition past its retention (the store's sweep, for the
        attributes no longer written); how many keys went. Deletes are writes (``replicate``d)."""
        self._check_serving()
        if self.history is None:
            return 0
        moment = time.time() if now is None else now
        prefix = HISTORY_SPACE + partition.to_bytes(2, "big")
        gone = await asyncio.to_thread(self.history.expired, prefix, moment)
        if gone:
            self.history.forget(gone)
            staged = _Staged(deletes=gone)
            if replicate is not None:
                await asyncio.gather(self._commit(staged), replicate([], gone))
            else:
                await self._commit(staged)
        return len(gone)

    def read_changes(
        self, cursors: dict[int, int], bounds: dict[int, int], most: int
    ) -> tuple[dict[int, list[tuple[int, bytes]]], list[int]]:
        """The committed changes of each partition after its cursor, up to its bound
        (:meth:`Changelog.visible`, taken on the event loop), at most ``most`` in all, the
        partitions in the order given; and the partitions that may have more."""
        self._check_serving()
        found: dict[int, list[tuple[int, bytes]]] = {}
        more: list[int] = []
        left = most
        for partition, after in cursors.items():
            if left <= 0:
                more.append(partition)
                continue
            rows = self.changelog.read(partition, after, bounds[partition], left)
            found[partition] = rows
            left -= len(rows)
            if left <= 0 and rows and rows[-1][0] < bounds[partition]:
                more.append(partition)
        return found, more

    async def trim_changes(
        self, upto: dict[int, int], replicate: Replicate | None = None
    ) -> tuple[int, list[int]]:
        """Delete each partition's changes up to its sequence (TRIM_MOST at most each); how
        many went, and the partitions that have more to trim. Deletes are writes
        (``replicate``d)."""
        self._check_serving()
        puts: list[tuple[bytes, bytes]] = []
        gone: list[bytes] = []
        unfinished: list[int] = []
        for partition, sequence in upto.items():
            marked, deleted = await asyncio.to_thread(self.changelog.trim, partition, sequence)
            puts += marked
            gone += deleted
            if len(deleted) >= TRIM_MOST:
                unfinished.append(partition)
        if gone:
            staged = _Staged(puts=puts, deletes=gone)
            if replicate is not None:
                await asyncio.gather(self._commit(staged), replicate(puts, gone))
            else:
                await self._commit(staged)
        return len(gone), unfinished

    def _apply_one(self, intent: Intent, now: float) -> tuple[Applied, bytes | None, bytes | None]:
        """What the write does, its document's key, and the document's bytes before it."""
        try:
            entity_type = intent.entity_type
            if entity_type is None:
                entity_type = self._resolve(intent)
            key = document_key(intent.tenant, intent.service_path, intent.entity_id, entity_type)
            self._check_fits(key)
        except SilboError as exc:
            return Applied(None, None, None, error=exc), None, None
        data, current = self._read_raw(key)
        write = intent.resolved(entity_type)
        if current is None and intent.upsert and write.mode is not Mode.UPSERT:
            write = replace(write, mode=Mode.CREATE)
        return apply(current, write, now), key, data

    def _check_fits(self, key: bytes) -> None:
        """InvalidInput (400) if the engine cannot store a document under ``key`` with its
        expiry index entry (LMDB: 511 bytes; the id, type and service path make the key)."""
        limit = self._engine.max_key_size
        if limit is not None and len(key) + _EXPIRY_EXTRA > limit:
            raise InvalidInput(
                f"the entity's id, type and service path take {len(key)} bytes as a storage "
                f"key; this store's engine ({self._engine.kind}) takes at most "
                f"{limit - _EXPIRY_EXTRA}"
            )

    def _resolve(self, intent: Intent) -> str:
        """The type of the one entity the write names by id (module doc)."""
        types = self.types_of(intent.tenant, intent.service_path, intent.entity_id)
        if len(types) > 1:
            raise AmbiguousEntity(
                f"there is more than one entity with id {intent.entity_id!r}: name its type "
                "(?type=)"
            )
        if types:
            return types[0]
        if intent.mode in (Mode.CREATE, Mode.UPSERT):
            return DEFAULT_ENTITY_TYPE
        raise NotFound(_NO_ENTITY)

    def types_of(self, tenant: str, service_path: str, entity_id: str) -> list[str]:
        """The types of the entities with this id in this service path (pending writes
        included), sorted."""
        prefix = _id_prefix(tenant, entity_id, service_path)
        keys = {k for k, _v in self._engine.scan(prefix)}
        for key in self._pending_ids.get(prefix, ()):
            if self._pending[key][1] is None:
                keys.discard(key)
            else:
                keys.add(key)
        return sorted(k[len(prefix) :].decode("utf-8") for k in keys)

    def _read(self, key: bytes) -> Document | None:
        return self._read_raw(key)[1]

    def _read_raw(self, key: bytes) -> tuple[bytes | None, Document | None]:
        """The value and document of ``key``: pending, recently decoded, or read."""
        held = self._pending.get(key)
        if held is not None:
            return held[1], held[2]
        data = self._engine.get(key)
        if data is None:
            return None, None
        recent = self._recent.get(key)
        if recent is not None and recent[0] == data:
            self._recent.move_to_end(key)
            return data, recent[1]
        document = Document.from_bytes(data)
        self._remember(key, data, document)
        return data, document

    def _remember(self, key: bytes, data: bytes, document: Document) -> None:
        self._recent[key] = (data, document)
        self._recent.move_to_end(key)
        if len(self._recent) > RECENT_DOCUMENTS:
            self._recent.popitem(last=False)

    def _hold(self, key: bytes, value: bytes | None, document: Document | None) -> int:
        self._ticket += 1
        self._pending[key] = (self._ticket, value, document)
        self._pending_ids.setdefault(key[: key.rindex(_SEP) + 1], set()).add(key)
        return self._ticket

    def _release(self, key: bytes, ticket: int) -> None:
        held = self._pending.get(key)
        if held is None or held[0] != ticket:
            return  # a later write of the key holds it
        del self._pending[key]
        if held[1] is not None and held[2] is not None:
            self._remember(key, held[1], held[2])
        prefix = key[: key.rindex(_SEP) + 1]
        keys = self._pending_ids[prefix]
        keys.discard(key)
        if not keys:
            del self._pending_ids[prefix]

    def _check_serving(self) -> None:
        if self._failed is not None:
            raise StoreFailed(f"the context store's storage failed: {self._failed}")

    # -- reads -------------------------------------------------------------------------------

    def documents(
        self,
        tenant: str,
        entity_ids: Iterable[str] | None = None,
        partitions: Iterable[int] | None = None,
    ) -> Iterator[Document]:
        """The committed documents of a tenant (of those ids only, if given), in the given
        partitions (default: all), partition by partition."""
        self._check_serving()
        if entity_ids is not None:
            wanted = None if partitions is None else set(partitions)
            for entity_id in sorted(set(entity_ids)):
                if wanted is not None and partition_of(tenant, entity_id) not in wanted:
                    continue
                prefix = (
                    _partition_prefix(partition_of(tenant, entity_id))
                    + _encoded(tenant, entity_id)
                    + _SEP
                )
                for _key, value in self._engine.scan(prefix):
                    yield Document.from_bytes(value)
            return
        tenant_part = _encoded(tenant) + _SEP
        for partition in range(PARTITIONS) if partitions is None else sorted(set(partitions)):
            for _key, value in self._engine.scan(_partition_prefix(partition) + tenant_part):
                yield Document.from_bytes(value)

    def tenant_items(self, tenant: str) -> Iterator[tuple[bytes, bytes]]:
        """The committed keys and values of a tenant's documents, in every partition (what
        the index of the tenant is built from)."""
        self._check_serving()
        tenant_part = _encoded(tenant) + _SEP
        for partition in range(PARTITIONS):
            yield from self._engine.scan(_partition_prefix(partition) + tenant_part)

    def fetch(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """The committed values of ``keys``, in order (one multi-get)."""
        self._check_serving()
        return self._engine.get_many(keys)

    def partition_items(self, partitions: Iterable[int]) -> Iterator[tuple[bytes, bytes]]:
        """The committed keys and values of these partitions' documents, write outcomes,
        history, alert states, changelog and expiry index (what a recovering backup
        copies)."""
        wanted = set(partitions)
        for partition in sorted(wanted):
            for space in _PARTITIONED:
                yield from self._engine.scan(space + partition.to_bytes(2, "big"))
        for key, value in self._engine.scan(_EXPIRY):
            if key_partition(key) in wanted:
                yield key, value

    async def expire(
        self,
        now: float | None = None,
        most: int = 10_000,
        partitions: set[int] | None = None,
        replicate: Replicate | None = None,
    ) -> int:
        """Delete (at most ``most`` of) the entities whose ``dateExpires`` passed, in these
        partitions (None: all); how many went. The expiry index (``x``, the date in ms, the
        document's key) is read up to now; the deletes are writes (``replicate``d)."""
        self._check_serving()
        moment = time.time() if now is None else now
        due: list[bytes] = []
        for index_key, _value in self._engine.scan(_EXPIRY):
            if int.from_bytes(index_key[1:9], "big") > moment * 1000 or len(due) >= most:
                break
            if partitions is None or key_partition(index_key) in partitions:
                due.append(index_key[9:])
        intents = []
        for key in due:
            current = self._read(key)  # a pending write may have renewed it
            if current is not None and current.expired(moment):
                intents.append(
                    Intent(
                        Mode.DELETE_ENTITY,
                        current.id,
                        current.type,
                        current.service_path,
                        current.tenant,
                    )
                )
        if not intents:
            return 0
        results = await self.apply(intents, moment, replicate)
        return sum(1 for result in results if result.modified)


class MemoryEngine:
    """An :class:`Engine` in memory (not durable): the entities of a front that has no
    context store layer to use, and of unit tests. Not thread-safe."""

    kind = "memory"
    max_key_size: int | None = None

    def __init__(self) -> None:
        self._values: dict[bytes, bytes] = {}
        self._keys: list[bytes] = []  # sorted

    def get(self, key: bytes) -> bytes | None:
        """The value under ``key``, or None."""
        return self._values.get(key)

    def get_many(self, keys: Iterable[bytes]) -> list[bytes | None]:
        """The values of ``keys``, in order."""
        return [self._values.get(k) for k in keys]

    def commit(self, puts: Iterable[tuple[bytes, bytes]], deletes: Iterable[bytes]) -> None:
        """Apply ``puts`` then ``deletes``."""
        for key, value in puts:
            if key not in self._values:
                bisect.insort(self._keys, key)
            self._values[key] = value
        for key in deletes:
            if self._values.pop(key, None) is not None:
                del self._keys[bisect.bisect_left(self._keys, key)]

    def scan(
        self, prefix: bytes, start_after: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """The pairs under ``prefix`` after ``start_after``, in key order (a snapshot)."""
        start = prefix if start_after is None or start_after < prefix else start_after
        index = bisect.bisect_left(self._keys, start)
        found = []
        while index < len(self._keys) and self._keys[index].startswith(prefix):
            key = self._keys[index]
            if key != start_after:
                found.append((key, self._values[key]))
            index += 1
        return iter(found)

    def scan_back(
        self, prefix: bytes, before: bytes | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """The pairs under ``prefix`` before ``before``, in reverse key order (a snapshot)."""
        end = bisect.bisect_left(self._keys, before) if before is not None else len(self._keys)
        found = []
        for key in reversed(self._keys[bisect.bisect_left(self._keys, prefix) : end]):
            if key.startswith(prefix):
                found.append((key, self._values[key]))
        return iter(found)

    def count(self) -> int:
        """How many keys are stored."""
        return len(self._values)

    def close(self) -> None:
        """Nothing to release."""
