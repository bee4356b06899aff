"""Queries across the store layer: each store answers its part, the front merges them.

A front's :class:`StoreReader` sends an entity query (broker.store.query) to every store
(:meth:`~broker.store.client.EntityStore.parts`) as ``["entities", query]``; each store
runs :func:`answer_query` over the documents of the partitions it holds (through its index,
broker.store.indexed; only the partitions of the query's ids, when it names ids: one prefix
scan each) and answers its
first ``offset + limit`` documents and its count; the front merges the parts in the query's
order and cuts the page (:func:`broker.store.query.merge`). Types queries go the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from broker.errors import InvalidInput
from broker.store.entities import Entities, partition_of
from broker.store.entity_types import TypesPage, TypesPart, TypesQuery, merge_types, types_part
from broker.store.indexed import indexed_part
from broker.store.query import EntityQuery, Page, Part, merge, select
from broker.store.semantics import Document
from broker.store.wire import pack, unpack

if TYPE_CHECKING:  # the stores a front reads from; broker.store.client uses this module
    from broker.store.client import EntityStore

__all__ = [
    "ENTITIES",
    "TYPES",
    "StoreReader",
    "answer_query",
    "entities_part",
    "query_body",
    "read_query_body",
]

ENTITIES = "entities"
TYPES = "types"


def query_body(kind: str, query: Any, partitions: Iterable[int] | None) -> bytes:
    """A ``Query`` body: the kind (entities, types), the query, the partitions asked
    (None: every partition the store is the primary of)."""
    return pack([kind, query, None if partitions is None else sorted(set(partitions))])


def read_query_body(body: bytes) -> tuple[str, Any, set[int] | None]:
    """What :func:`query_body` wrote (InvalidInput / SerializationError if it is not one)."""
    data = unpack(body)
    if not isinstance(data, list) or len(data) != 3 or not isinstance(data[0], str):
        raise InvalidInput("a context store query is [kind, query, partitions]")
    kind, query, partitions = data
    try:
        return kind, query, None if partitions is None else {int(p) for p in partitions}
    except (TypeError, ValueError) as exc:
        raise InvalidInput(f"a context store query's partitions: {exc}") from exc


def answer_query(
    entities: Entities, kind: str, data: Any, partitions: Iterable[int] | None, now: float
) -> bytes:
    """A store's answer to a query, over these partitions (None: all it holds)."""
    held = None if partitions is None else set(partitions)
    if kind == TYPES:
        types = TypesQuery.from_wire(data)
        return pack(types_part(entities.documents(types.tenant, None, held), types, now).to_wire())
    if kind != ENTITIES:
        raise InvalidInput(f"a context store query of kind {kind!r}")
    return pack(entities_part(entities, EntityQuery.from_wire(data), held, now).to_wire())


def entities_part(
    entities: Entities, query: EntityQuery, held: set[int] | None, now: float
) -> Part:
    """A store's part of an entity query over ``held`` (None: all): through the index, or
    for a query of exact ids their prefix scans."""
    part = indexed_part(
        entities.index,
        lambda: entities.tenant_items(query.tenant),
        entities.fetch,
        query,
        held,
        now,
    )
    if part is None:
        part = select(_documents(entities, query, held), query, now)
    return part


def _documents(entities: Entities, query: EntityQuery, held: set[int] | None) -> Iterator[Document]:
    ids = query.entity_ids
    if ids is not None:
        if held is not None:
            ids = frozenset(i for i in ids if partition_of(query.tenant, i) in held)
        return entities.documents(query.tenant, ids)
    return entities.documents(query.tenant, None, held)


class StoreReader:
    """The reads of a front, over its :class:`EntityStore` (broker.ngsi.reads' Reader);
    ``store`` gives it at each read (a front's may be set after its routes)."""

    def __init__(self, store: Callable[[], EntityStore]) -> None:
        self._get = store

    @property
    def _store(self) -> EntityStore:
        return self._get()

    async def query(self, query: EntityQuery) -> Page:
        """The page of an entity query, merged from every store's part."""
        ids = query.entity_ids
        partitions = None if ids is None else {partition_of(query.tenant, i) for i in ids}
        answers = await self._store.parts(ENTITIES, query.to_wire(), partitions)
        return merge((Part.from_wire(unpack(a)) for a in answers), query)

    async def types(self, query: TypesQuery) -> TypesPage:
        """The page of a types query, merged from every store's part."""
        answers = await self._store.parts(TYPES, query.to_wire(), None)
        return merge_types((TypesPart.from_wire(unpack(a)) for a in answers), query)
