"""An in-memory secondary index of one store's documents, for list queries (issue 17).

A list query used to decode and filter every document of its tenant (~13 us each: 1.3 s
over 100k entities). The index lets :mod:`broker.store.indexed` touch only the documents
that can match and decode only the page it returns. It is kept by each store process for
the documents it holds, in memory only (rebuilt from disk when needed), and it never decides
alone: whatever it cannot answer exactly is evaluated on the documents.

Layout: per tenant, per entity type, a :class:`Group` of *slots*, one per document, in
columns (numpy arrays, so that a query over 100k documents is a few vector operations and a
million documents cost tens of MB, not the hundreds a Python object per document would):
whether the slot is alive, the document's partition, service path (a code), dateCreated
(the first key of the default order), dateExpires (allocated only once a document of the
group expires), and its id (bytes in one arena, after a prefix common to the group). Per
attribute a query filters on, a :class:`Column` of each slot's *match value* (what the
``q`` evaluator compares: broker.store.query.match_value) as a kind, a number and a string
code. Slots are appended; a document written again is updated in place, a deleted one is
only marked dead; dead slots are dropped (:meth:`Group.compact`) once they are half of the
group and no reader holds slot numbers.

Building: a tenant is indexed on the first query that needs it (one scan of its
documents), a column on the first query that filters on its attribute (a multi-get of its
group's documents); both run in the query's thread, in chunks, while writes go on. Writes
that commit meanwhile are applied to the index as usual and recorded as *touched*: what the
build read of a touched document is older, and dropped.

Maintenance: :meth:`EntityIndex.committed` after every commit of the engine (the store's
own writes, its backups' replicated ones, snapshot copies, recovery deletes, expiry), in
commit order, with the engine's order within a commit (puts, then deletes);
:meth:`EntityIndex.drop_partitions` when partitions are dropped without deleting their keys
one by one. Locking: one lock guards every structure; the event loop takes it to apply a
commit (microseconds), a query thread to compute its candidates (milliseconds) or to add a
chunk of a build.
"""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from broker.store.query import MISSING, match_value
from broker.store.semantics import Document

__all__ = [
    "ABSENT",
    "NUMBER",
    "OTHER",
    "STRING",
    "UNSURE",
    "Column",
    "DocumentKey",
    "EntityIndex",
    "Group",
]

# Kinds of a match value in a column.
ABSENT: Final = 0  # the attribute is missing (q: only ``!attr`` holds)
NUMBER: Final = 1  # a number exactly held by a float64 (and not NaN)
STRING: Final = 2  # a string, its code in the column's strings
OTHER: Final = 3  # a bool, null or object: no number or string comparison holds
UNSURE: Final = 4  # an array, NaN, an int past 2**53, a string past MAX_STRINGS: evaluate

MAX_STRINGS: Final = 1 << 16  # distinct strings coded per column (more: UNSURE)
COMPACT_AT: Final = 1024  # dead slots a group keeps at least before it is compacted
TAIL: Final = 4096  # slots looked up by a dict before the sorted hash index takes them
CHUNK: Final = 2000  # documents per step of a build (the lock is released between steps)
_EXACT_INT: Final = 1 << 53
_HASH_MASK: Final = 0xFFFFFFFF

Bools = npt.NDArray[np.bool_]
Ints = npt.NDArray[np.int64]


@dataclass(frozen=True, slots=True)
class DocumentKey:
    """A document key's parts, as broker.store.entities lays keys out (the index does not)."""

    partition: int
    tenant: str
    entity_id: str
    service_path: str
    entity_type: str


KeyOf = Callable[[DocumentKey], bytes]
Fetch = Callable[[Sequence[bytes]], list[bytes | None]]


class Column:
    """One attribute's match value in every slot of a group (module doc)."""

    def __init__(self, capacity: int) -> None:
        self.kind = np.zeros(capacity, np.int8)
        self.number = np.full(capacity, np.nan)
        self.code: npt.NDArray[np.int32] | None = None  # allocated at the first string
        self.strings: dict[str, int] = {}
        self.touched: set[int] | None = set()  # while building: slots set by writes
        self.ready = threading.Event()

    def grow(self, capacity: int) -> None:
        self.kind = _grown(self.kind, capacity, 0)
        self.number = _grown(self.number, capacity, np.nan)
        if self.code is not None:
            self.code = _grown(self.code, capacity, -1)

    def set(self, slot: int, value: Any) -> None:
        """Record ``value`` (a match value, or MISSING) in ``slot``."""
        kind, number, text = _classified(value)
        if kind == STRING:
            assert text is not None
            code = self.strings.get(text)
            if code is None and len(self.strings) < MAX_STRINGS:
                code = self.strings[text] = len(self.strings)
            if code is None:
                kind = UNSURE
            else:
                if self.code is None:
                    self.code = np.full(len(self.kind), -1, np.int32)
                self.code[slot] = code
        elif self.code is not None:
            self.code[slot] = -1
        self.kind[slot] = kind
        self.number[slot] = number

    def string_code(self, text: str) -> int | None:
        """The code of ``text``, None if no slot holds it."""
        return self.strings.get(text)


class Group:
    """The slots of one (tenant, entity type) (module doc). Guarded by the index's lock."""

    def __init__(self, tenant: str, entity_type: str) -> None:
        self.tenant = tenant
        self.entity_type = entity_type
        self.size = 0
        self.dead = 0
        capacity = 64
        self.alive = np.zeros(capacity, np.bool_)
        self.created = np.zeros(capacity, np.float64)
        self.expires: npt.NDArray[np.float64] | None = None  # inf: does not expire
        self.partition = np.zeros(capacity, np.uint16)
        self.path = np.zeros(capacity, np.int32)
        self.paths: list[str] = []
        self._path_codes: dict[str, int] = {}
        self.id_prefix = b""
        self._ids = bytearray()  # each slot's id after id_prefix, one after the other
        self._id_end = np.zeros(capacity, np.uint32)
        self._hashes = np.zeros(0, np.uint32)  # sorted; _hash_slots in the same order
        self._hash_slots = np.zeros(0, np.int32)
        self._tail: dict[tuple[bytes, int], int] = {}  # slots not yet in the hash index
        self.columns: dict[str, Column] = {}

    # -- slots --------------------------------------------------------------------------------

    def find(self, entity_id: bytes, path: int) -> int | None:
        """The live slot of an entity (its id, its path code), None if it has none."""
        slot = self._tail.get((entity_id, path))
        if slot is not None:
            return slot
        wanted = hash((entity_id, path)) & _HASH_MASK
        # bisect, not np.searchsorted: that casts the whole array for a Python int (~50 us)
        start = bisect.bisect_left(self._hashes, wanted)
        end = bisect.bisect_right(self._hashes, wanted, start)
        for candidate in self._hash_slots[start:end].tolist():
            if (
                self.alive[candidate]
                and self.path[candidate] == path
                and self.id_of(candidate) == entity_id
            ):
                return int(candidate)
        return None

    def put(self, key: DocumentKey, document: Document) -> int:
        """Insert or update the document's slot; its slot."""
        entity_id = key.entity_id.encode()
        path = self.path_code(key.service_path)
        slot = self.find(entity_id, path)
        if slot is None:
            slot = self._append(entity_id, path, key.partition)
        self.created[slot] = document.date_created
        expires = document.date_expires
        if expires is not None and self.expires is None:
            self.expires = np.full(len(self.alive), math.inf)
        if self.expires is not None:
            self.expires[slot] = math.inf if expires is None else expires
        for name, column in self.columns.items():
            column.set(slot, match_value(document, name))
            if column.touched is not None:
                column.touched.add(slot)
        return slot

    def delete(self, key: DocumentKey) -> None:
        """Mark the document's slot dead, if it has one."""
        slot = self.find(key.entity_id.encode(), self.path_code(key.service_path))
        if slot is not None:
            self.kill(slot)

    def kill(self, slot: int) -> None:
        self.alive[slot] = False
        self.dead += 1
        self._tail.pop((self.id_of(slot), int(self.path[slot])), None)

    def path_code(self, path: str) -> int:
        code = self._path_codes.get(path)
        if code is None:
            code = self._path_codes[path] = len(self.paths)
            self.paths.append(path)
        return code

    def id_of(self, slot: int) -> bytes:
        """The id (UTF-8) of a slot."""
        start = int(self._id_end[slot - 1]) if slot else 0
        return self.id_prefix + bytes(self._ids[start : int(self._id_end[slot])])

    def key_of(self, slot: int) -> DocumentKey:
        return DocumentKey(
            int(self.partition[slot]),
            self.tenant,
            self.id_of(slot).decode(),
            self.paths[int(self.path[slot])],
            self.entity_type,
        )

    def _append(self, entity_id: bytes, path: int, partition: int) -> int:
        slot = self.size
        if slot == len(self.alive):
            self._grow(2 * slot)
        if slot == 0:
            self.id_prefix = entity_id
        elif not entity_id.startswith(self.id_prefix):
            self._shorten_prefix(_common_prefix(self.id_prefix, entity_id))
        self._ids += entity_id[len(self.id_prefix) :]
        self._id_end[slot] = len(self._ids)
        self.alive[slot] = True
        self.partition[slot] = partition
        self.path[slot] = path
        self.size += 1
        self._tail[(entity_id, path)] = slot
        if len(self._tail) > max(TAIL, self.size // 32):
            self._index_tail()
        return slot

    def _grow(self, capacity: int) -> None:
        self.alive = _grown(self.alive, capacity, False)
        self.created = _grown(self.created, capacity, 0.0)
        if self.expires is not None:
            self.expires = _grown(self.expires, capacity, math.inf)
        self.partition = _grown(self.partition, capacity, 0)
        self.path = _grown(self.path, capacity, 0)
        self._id_end = _grown(self._id_end, capacity, 0)
        for column in self.columns.values():
            column.grow(capacity)

    def _shorten_prefix(self, prefix: bytes) -> None:
        """Keep ``prefix`` as the group's id prefix: every stored id gets the rest back."""
        extra = np.frombuffer(self.id_prefix[len(prefix) :], np.uint8)
        n, width = self.size, len(extra)
        ends = self._id_end[:n].astype(np.int64)
        lengths = np.diff(ends, prepend=0)
        old = np.frombuffer(bytes(self._ids), np.uint8)
        out = np.empty(len(old) + n * width, np.uint8)
        owner = np.repeat(np.arange(n), lengths)
        out[np.arange(len(old)) + (owner + 1) * width] = old
        starts = ends - lengths + np.arange(n) * width
        for j in range(width):
            out[starts + j] = extra[j]
        self._ids = bytearray(out.tobytes())
        self._id_end[:n] = (ends + (np.arange(n) + 1) * width).astype(np.uint32)
        self.id_prefix = prefix

    def _index_tail(self) -> None:
        """Move the tail's slots into the sorted hash index (a merge: linear)."""
        items = sorted((hash(k) & _HASH_MASK, s) for k, s in self._tail.items())
        hashes = np.array([h for h, _s in items], np.uint32)
        slots = np.array([s for _h, s in items], np.int32)
        at = np.searchsorted(self._hashes, hashes)
        self._hashes = np.insert(self._hashes, at, hashes)
        self._hash_slots = np.insert(self._hash_slots, at, slots)
        self._tail.clear()

    def compact(self) -> None:
        """Drop the dead slots (every slot number changes)."""
        n = self.size
        keep = self.alive[:n].copy()
        ends = self._id_end[:n].astype(np.int64)
        lengths = np.diff(ends, prepend=0)
        kept_bytes = np.frombuffer(bytes(self._ids), np.uint8)[np.repeat(keep, lengths)]
        self._ids = bytearray(kept_bytes.tobytes())
        renumbered = np.cumsum(keep) - 1
        size = int(keep.sum())
        capacity = max(64, 2 * size)
        self.alive = _grown(self.alive[:n][keep], capacity, False)
        self.created = _grown(self.created[:n][keep], capacity, 0.0)
        if self.expires is not None:
            self.expires = _grown(self.expires[:n][keep], capacity, math.inf)
        self.partition = _grown(self.partition[:n][keep], capacity, 0)
        self.path = _grown(self.path[:n][keep], capacity, 0)
        self._id_end = _grown(np.cumsum(lengths[keep]).astype(np.uint32), capacity, 0)
        for column in self.columns.values():
            column.kind = _grown(column.kind[:n][keep], capacity, 0)
            column.number = _grown(column.number[:n][keep], capacity, np.nan)
            if column.code is not None:
                column.code = _grown(column.code[:n][keep], capacity, -1)
        live = keep[self._hash_slots]
        self._hashes = self._hashes[live]
        self._hash_slots = renumbered[self._hash_slots[live]].astype(np.int32)
        self._tail = {k: int(renumbered[s]) for k, s in self._tail.items()}
        self.size, self.dead = size, 0

    def live(self, now: float, partitions: Bools | None, paths: Bools) -> Bools:
        """The slots alive, not expired at ``now``, in these partitions and paths."""
        n = self.size
        mask = self.alive[:n] & paths[self.path[:n]]
        if partitions is not None:
            mask &= partitions[self.partition[:n]]
        if self.expires is not None:
            mask &= self.expires[:n] > now
        return mask


class _Tenant:
    """The groups of one tenant; while it is built, the keys writes touched."""

    def __init__(self) -> None:
        self.groups: dict[str, Group] = {}
        self.touched: set[bytes] | None = set()
        self.ready = threading.Event()


class EntityIndex:
    """The index of one store's documents (module doc). Thread-safe."""

    def __init__(self, key_of: KeyOf, split: Callable[[bytes], DocumentKey | None]) -> None:
        self.lock = threading.Lock()
        self._key_of = key_of
        self._split = split
        self._tenants: dict[str, _Tenant] = {}
        self._readers = 0  # queries holding slot numbers: no compaction meanwhile

    # -- maintenance --------------------------------------------------------------------------

    def committed(
        self,
        puts: Iterable[tuple[bytes, bytes]],
        deletes: Iterable[bytes],
        documents: Callable[[bytes, bytes], Document | None] | None = None,
    ) -> None:
        """Apply a commit of the engine (puts, then deletes, as the engine does);
        ``documents`` gives the decoded document of a put (key, value) when the caller has
        it (None: it is decoded here)."""
        if not self._tenants:
            return
        changes: list[tuple[bytes, DocumentKey, Document | None]] = []
        for key, value in puts:
            parts = self._split(key)
            if parts is not None and parts.tenant in self._tenants:
                found = documents(key, value) if documents is not None else None
                changes.append((key, parts, found or Document.from_bytes(value)))
        for key in deletes:
            parts = self._split(key)
            if parts is not None and parts.tenant in self._tenants:
                changes.append((key, parts, None))
        if changes:
            with self.lock:
                for key, parts, document in changes:
                    self._change(key, parts, document)

    def _change(self, key: bytes, parts: DocumentKey, document: Document | None) -> None:
        """Lock held."""
        tenant = self._tenants.get(parts.tenant)
        if tenant is None:
            return
        if tenant.touched is not None:
            tenant.touched.add(key)
        group = tenant.groups.get(parts.entity_type)
        if document is not None:
            if group is None:
                group = tenant.groups[parts.entity_type] = Group(parts.tenant, parts.entity_type)
            group.put(parts, document)
        elif group is not None:
            group.delete(parts)
            self._maybe_compact(group)

    def drop_partitions(self, partitions: Iterable[int]) -> None:
        """Forget the documents of these partitions (the store dropped them at once, with a
        range delete, rather than through :meth:`committed`)."""
        table = _partition_table(partitions)
        with self.lock:
            for tenant in self._tenants.values():
                for group in tenant.groups.values():
                    n = group.size
                    for slot in np.flatnonzero(group.alive[:n] & table[group.partition[:n]]):
                        group.kill(int(slot))
                    self._maybe_compact(group)

    def _maybe_compact(self, group: Group) -> None:
        if self._readers == 0 and group.dead > COMPACT_AT and 2 * group.dead > group.size:
            group.compact()

    # -- reads --------------------------------------------------------------------------------

    def groups(self, tenant: str, scan: Callable[[], Iterator[tuple[bytes, bytes]]]) -> list[Group]:
        """The groups of ``tenant``, built first if they are not (``scan``: every committed
        key and value of the tenant). The caller holds :meth:`reading`."""
        self._build_tenant(tenant, scan)
        with self.lock:
            return list(self._tenants[tenant].groups.values())

    def column(self, group: Group, name: str, fetch: Fetch) -> Column:
        """The column of attribute ``name`` in ``group``, built first if it is not
        (``fetch``: the engine's multi-get). The caller holds :meth:`reading`."""
        while True:
            with self.lock:
                column = group.columns.get(name)
                building = column is None
                if column is None:
                    column = group.columns[name] = Column(len(group.alive))
                size = group.size
            if building:
                break
            column.ready.wait()
            if column.touched is None:  # built (else its build failed: build it here)
                return column
        try:
            for start in range(0, size, CHUNK):
                self._fill(group, column, name, range(start, min(size, start + CHUNK)), fetch)
            with self.lock:
                column.touched = None
        except BaseException:
            with self.lock:
                del group.columns[name]
            raise
        finally:
            column.ready.set()
        return column

    def _fill(self, group: Group, column: Column, name: str, slots: range, fetch: Fetch) -> None:
        with self.lock:
            wanted = [s for s in slots if group.alive[s]]
            keys = [self._key_of(group.key_of(s)) for s in wanted]
        values = fetch(keys)
        found = [
            (slot, match_value(Document.from_bytes(value), name))
            for slot, value in zip(wanted, values, strict=True)
            if value is not None  # deleted since: its slot is dead by now
        ]
        with self.lock:
            touched = column.touched or set()
            for slot, value in found:
                if slot not in touched and group.alive[slot]:
                    column.set(slot, value)

    def key(self, group: Group, slot: int) -> bytes:
        """The engine key of a slot's document (the caller holds the lock)."""
        return self._key_of(group.key_of(slot))

    def reading(self) -> _Reading:
        """A context in which slot numbers stay valid (no compaction)."""
        return _Reading(self)

    def _build_tenant(self, tenant: str, scan: Callable[[], Iterator[tuple[bytes, bytes]]]) -> None:
        while True:
            with self.lock:
                known = self._tenants.get(tenant)
                building = known is None
                if known is None:
                    known = self._tenants[tenant] = _Tenant()
            if building:
                break
            known.ready.wait()
            if known.touched is None:  # built (else its build failed: build it here)
                return
        try:
            chunk: list[tuple[bytes, bytes]] = []
            for item in scan():
                chunk.append(item)
                if len(chunk) >= CHUNK:
                    self._add_scanned(known, chunk)
                    chunk = []
            self._add_scanned(known, chunk)
            with self.lock:
                known.touched = None
        except BaseException:
            with self.lock:
                del self._tenants[tenant]
            raise
        finally:
            known.ready.set()

    def _add_scanned(self, tenant: _Tenant, items: list[tuple[bytes, bytes]]) -> None:
        found = []
        for key, value in items:
            parts = self._split(key)
            if parts is not None:
                found.append((key, parts, Document.from_bytes(value)))
        with self.lock:
            touched = tenant.touched or set()
            for key, parts, document in found:
                if key in touched:
                    continue  # a write came after the scan read it
                group = tenant.groups.get(parts.entity_type)
                if group is None:
                    group = tenant.groups[parts.entity_type] = Group(
                        parts.tenant, parts.entity_type
                    )
                group.put(parts, document)


class _Reading:
    """While held, no group is compacted (slot numbers a query keeps stay valid)."""

    def __init__(self, index: EntityIndex) -> None:
        self._index = index

    def __enter__(self) -> None:
        with self._index.lock:
            self._index._readers += 1

    def __exit__(self, *_exc: object) -> None:
        with self._index.lock:
            self._index._readers -= 1


def _classified(value: Any) -> tuple[int, float, str | None]:
    """(kind, number, string) of a match value (module doc: the kinds)."""
    if value is MISSING:
        return ABSENT, math.nan, None
    if isinstance(value, bool) or value is None or isinstance(value, dict):
        return OTHER, math.nan, None
    if isinstance(value, int):
        if -_EXACT_INT <= value <= _EXACT_INT:
            return NUMBER, float(value), None
        return UNSURE, math.nan, None
    if isinstance(value, float):
        return (UNSURE, math.nan, None) if math.isnan(value) else (NUMBER, value, None)
    if isinstance(value, str):
        return STRING, math.nan, value
    return UNSURE, math.nan, None


def _partition_table(partitions: Iterable[int]) -> Bools:
    table = np.zeros(1 << 16, np.bool_)
    table[list(partitions)] = True
    return table


def _grown(array: npt.NDArray[Any], capacity: int, fill: Any) -> npt.NDArray[Any]:
    out = np.full(capacity, fill, array.dtype)
    n = min(len(array), capacity)
    out[:n] = array[:n]
    return out


def _common_prefix(a: bytes, b: bytes) -> bytes:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return a[:n]
