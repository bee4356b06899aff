"""How a front reaches the entities: an :class:`EntityStore`.

The context store layer is one (broker.roles.store_client's ``StoreClient``: writes routed
by partition, durable before they are answered, 503 when a store does not serve);
:class:`LocalEntities` is the other: a front's own entities in memory, for a cluster
without a store layer (no ``/store-layout``: ``silbo run connection-point`` alone), one
front's view, lost when it stops, as before the store existed (docs/ngsi.md).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from broker.store.entities import Entities, MemoryEngine
from broker.store.history import HistoryOptions
from broker.store.history_query import HistoryQuery
from broker.store.reading import answer_query
from broker.store.semantics import Applied
from broker.store.wire import Intent, pack, unpack

__all__ = ["EntityStore", "LocalEntities"]


class EntityStore(Protocol):
    """Where a front's writes go (and its reads: broker.ngsi.reads)."""

    async def apply(self, intents: Sequence[Intent]) -> list[Applied]:
        """Apply the writes; one result each, in order, once durable."""
        ...

    async def parts(self, kind: str, query: Any, partitions: Iterable[int] | None) -> list[bytes]:
        """Every answer to a query (broker.store.reading: its kind and wire form) that
        together cover ``partitions`` (None: every partition), each partition once."""
        ...

    async def history(self, partition: int, body: bytes) -> bytes:
        """The answer to a history query (broker.store.history_query, packed) of an entity of
        ``partition``."""
        ...

    async def close(self) -> None:
        """Release what it holds."""
        ...


class LocalEntities:
    """A front's entities in its own memory (see the module doc)."""

    def __init__(self, history: HistoryOptions | None = None) -> None:
        self.entities = Entities(MemoryEngine(), history=history)

    async def apply(self, intents: Sequence[Intent]) -> list[Applied]:
        """Apply the writes in memory."""
        return await self.entities.apply(intents)

    async def parts(self, kind: str, query: Any, partitions: Iterable[int] | None) -> list[bytes]:
        """The one part: every entity this front holds (in those partitions)."""
        return [answer_query(self.entities, kind, query, partitions, time.time())]

    async def history(self, partition: int, body: bytes) -> bytes:
        """The history this front's own writes recorded."""
        del partition  # every partition is here
        return pack(self.entities.read_history(HistoryQuery.from_wire(unpack(body))))

    async def close(self) -> None:
        """Nothing to release."""
