"""What a context store holds whole, and how it copies the partitions it misses.

A store holds a partition *whole* once it has every acknowledged write of it: from its
start if it is in sync and the partition does not arrive to it in a transition of the store
layout (broker.store.layout), else once it copied it. A copy asks the partition's primary
for a ``Snapshot`` (the primary first ships it every new write of the partition, then makes
sure the writes in flight are committed, then streams a scan); what primaries ship while a
partition is not whole is recorded and wins over the copy; keys the primary no longer has
are deleted. It is the same for a store that recovers (every partition it holds) and one
that a scale gives partitions (those that arrive to it).

A partition a store no longer holds once a layout settles (no ``previous``: the scale
completed, or was rolled back) is dropped: every key of it deleted.

A partition that arrives to a store in a transition is copied for that transition, whatever
the store held of it before: the store may never have seen the settled layout that took the
partition away (a watch reports the newest layout, not each one), and what it kept since is
stale. It counts as whole again only once copied for this layout version. What was shipped
of it before (a primary still on an older layout ships a write in flight after the store
dropped the partition) is forgotten then: the copy's scan has it, or newer.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Sequence

from broker.store.entities import Entities, key_partition
from broker.store.layout import StoreLayout, StoreView
from broker.store.wire import pack, unpack

__all__ = ["Copier", "NotYet"]

_log = logging.getLogger(__name__)

Stream = Callable[[str, bytes], AsyncIterator[bytes]]  # (store, request body): answer bodies


class NotYet(Exception):
    """A copy cannot go on yet (a partition has no primary to copy from)."""


class Copier:
    """The partitions one store holds whole, the shipments it took for the others, and its
    copies and drops (see the module doc). One event loop uses it."""

    def __init__(self, store_id: str, address: str, entities: Entities, stream: Stream) -> None:
        self._store_id = store_id
        self._address = address
        self._entities = entities
        self._stream = stream
        self.whole: set[int] = set()
        self._copied_for: dict[int, int] = {}  # partition: the layout version it was copied for
        self._shipped: dict[int, set[bytes]] = {}  # not whole: keys a primary shipped
        self._lock = asyncio.Lock()  # copies and shipments of partitions not whole, in turn
        self._settled_version = 0  # the last settled layout whose partitions were dropped
        self.copied = (0, 0)  # keys and bytes copied since the last reset

    def start_whole(self, layout: StoreLayout | None) -> None:
        """An in-sync store starts: it holds whole what it holds, but what arrives to it."""
        if layout is not None:
            arriving = set(layout.arriving_of(self._store_id))
            self.whole = set(layout.partitions_of(self._store_id)) - arriving

    def arriving(self, layout: StoreLayout) -> list[int]:
        """The partitions that arrive here in ``layout`` and were not copied for it yet; they
        are no longer whole (module doc), so what primaries ship of them from now on is
        recorded and wins over their copy."""
        arriving = layout.arriving_of(self._store_id)
        wanted = [p for p in arriving if self._copied_for.get(p) != layout.version]
        self.whole.difference_update(wanted)
        for partition in wanted:  # shipped before the copy asks: its scan has it, or newer
            self._shipped.pop(partition, None)
        return wanted

    async def receive(self, puts: list[tuple[bytes, bytes]], deletes: list[bytes]) -> None:
        """Store a primary's shipment; keys of partitions not whole are recorded first."""
        keys = [k for k, _v in puts] + deletes
        if all(key_partition(k) in self.whole or key_partition(k) is None for k in keys):
            await self._entities.store(puts, deletes)
            return
        async with self._lock:
            for key in keys:
                partition = key_partition(key)
                if partition is not None and partition not in self.whole:
                    self._shipped.setdefault(partition, set()).add(key)
            await self._entities.store(puts, deletes)

    async def copy(self, view: StoreView, partitions: Iterable[int]) -> dict[str, list[int]]:
        """Copy these partitions from their primaries; the partitions copied, by primary.
        NotYet if one has no primary (other than this store)."""
        by_primary: dict[str, list[int]] = {}
        for partition in sorted(set(partitions) - self.whole):
            primary = view.primary(partition)
            if primary is None or primary == self._store_id:
                raise NotYet(f"partition {partition} has no primary to copy from")
            by_primary.setdefault(primary, []).append(partition)
        version = view.layout.version if view.layout is not None else 0
        for primary, wanted in by_primary.items():
            await self._copy_from(primary, wanted, version)
        return by_primary

    async def _copy_from(self, primary: str, partitions: list[int], version: int) -> None:
        seen: set[bytes] = set()
        size = 0
        body = pack([self._store_id, self._address, partitions])
        async for chunk in self._stream(primary, body):
            items = [(bytes(k), bytes(v)) for k, v in unpack(chunk)]
            seen.update(k for k, _v in items)
            size += sum(len(k) + len(v) for k, v in items)
            async with self._lock:
                shipped = self._shipped_of(partitions)
                await self._entities.store([(k, v) for k, v in items if k not in shipped], [])
        local = await asyncio.to_thread(keys_of, self._entities, partitions)
        async with self._lock:
            shipped = self._shipped_of(partitions)
            gone = [k for k in local if k not in seen and k not in shipped]
            await self._entities.store([], gone)
            for partition in partitions:
                self._shipped.pop(partition, None)
                self.whole.add(partition)
                self._copied_for[partition] = version
        self.copied = (self.copied[0] + len(seen), self.copied[1] + size)
        _log.info(
            "store %s copied %d partitions from %s (%d keys, %d bytes, %d stale removed)",
            self._store_id,
            len(partitions),
            primary,
            len(seen),
            size,
            len(gone),
        )

    def _shipped_of(self, partitions: Sequence[int]) -> set[bytes]:
        return set().union(*(self._shipped.get(p, set()) for p in partitions))

    async def drop_left(self, layout: StoreLayout) -> int:
        """Once per settled layout: delete the partitions this store does not hold in it;
        how many keys went."""
        if layout.previous or layout.version <= self._settled_version:
            return 0
        self._settled_version = layout.version
        held = set(layout.partitions_of(self._store_id))
        left = [p for p in range(layout.partitions) if p not in held]
        async with self._lock:
            self.whole &= held
            for partition in left:
                self._shipped.pop(partition, None)
            keys = await asyncio.to_thread(keys_of, self._entities, left)
            if keys:
                await self._entities.store([], keys)
        if keys:
            _log.info(
                "store %s dropped %d keys of the partitions it left (layout %d)",
                self._store_id,
                len(keys),
                layout.version,
            )
        return len(keys)


def keys_of(entities: Entities, partitions: list[int]) -> list[bytes]:
    """The keys of these partitions (documents, write outcomes, history, changelog, expiry
    index)."""
    return [key for key, _value in entities.partition_items(partitions)]
