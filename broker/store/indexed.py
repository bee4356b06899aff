"""A store's part of an entity query, answered through its index (broker.store.index).

Same answer as :func:`broker.store.query.select` over every document of the tenant (a
property test holds them equal), computed from the index's columns where they answer
exactly, and from the documents elsewhere:

- the tenant's groups the query's types take (exact types, type patterns; no selector:
  every group), and in them the slots alive, unexpired, in the partitions asked and in one of
  the query's service paths: exact, from the columns;
- each ``q`` statement on one attribute (no compound path) with ``==`` (values, numeric
  ranges), ``<``, ``<=``, ``>``, ``>=`` on numbers and dates, ``==`` on strings, ``attr``
  and ``!attr``: exact from the attribute's column, but for the slots whose value the column
  does not hold exactly (arrays, NaN, huge ints: :data:`~broker.store.index.UNSURE`);
- everything else (other operators and literals, compound paths, ``mq``, id selectors and
  patterns, ``orderBy``, a geographical filter: the index keeps no locations) is a
  *residual*: the slots the indexed statements leave are decoded
  and :func:`~broker.store.query.select` runs on them as on a scan.

Without a residual, the unsure slots are decoded and evaluated, the count is the number of
slots left, and the page is their first ``offset + limit`` in creation order: the smallest
dateCreated by a partition of the column, ties broken by (id, type, service path) as
:func:`~broker.store.query.sort_key` does; only those documents are read, and each is checked
with :func:`~broker.store.query.matches` (a write may have changed it since): if one no longer
matches, the part is computed again the residual way.

A query naming only exact ids is not answered here (None): its partitions' prefix scans
read just those documents.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from broker.model.identifiers import scope_matches
from broker.query.ast import Kind, Literal, Op, Statement
from broker.query.regex import compile_pattern, is_match_all
from broker.store.index import (
    ABSENT,
    NUMBER,
    STRING,
    UNSURE,
    Bools,
    Column,
    EntityIndex,
    Fetch,
    Group,
)
from broker.store.query import EntityQuery, Part, matches, select, sort_key
from broker.store.semantics import Document

__all__ = ["indexed_part"]

Scan = Callable[[], Iterator[tuple[bytes, bytes]]]
_KEY_CHUNK = 2000  # keys made per hold of the index's lock
_EMPTY = np.zeros(0, np.int64)

_ORDERINGS = {Op.LT: np.less, Op.LE: np.less_equal, Op.GT: np.greater, Op.GE: np.greater_equal}


@dataclass(slots=True)
class _Found:
    """One group's slots: ``sure`` match, ``maybe`` must be evaluated on their documents."""

    group: Group
    sure: np.ndarray
    maybe: np.ndarray
    columns: dict[str, Column] = field(default_factory=dict)


def indexed_part(
    index: EntityIndex,
    scan: Scan,
    fetch: Fetch,
    query: EntityQuery,
    held: set[int] | None,
    now: float,
) -> Part | None:
    """The store's part of ``query`` (module doc); None if the index does not serve it.

    ``scan``: every committed key and value of the query's tenant (to build its index);
    ``fetch``: the engine's multi-get; ``held``: the partitions asked (None: all)."""
    if query.entity_ids is not None:
        return None
    indexed = [s for s in query.filter.q if _indexable(s)]
    residual = bool(
        query.order_by
        or query.filter.mq
        or query.geo is not None
        or len(indexed) < len(query.filter.q)
        or any(s.id is not None or not _any(s.id_pattern) for s in query.selectors)
    )
    with index.reading():
        groups = [g for g in index.groups(query.tenant, scan) if _takes_type(query, g.entity_type)]
        found = [_Found(g, _EMPTY, _EMPTY) for g in groups]
        for item in found:
            for statement in indexed:
                name = statement.attribute
                item.columns[name] = index.column(item.group, name, fetch)
        partitions = None if held is None else _table(held)
        with index.lock:
            for item in found:
                _narrow(item, indexed, query, partitions, now, residual)
        if not residual:
            part = _exact_part(index, found, fetch, query, now)
            if part is not None:
                return part
            for item in found:  # a page document changed meanwhile: the residual way
                item.maybe = np.union1d(item.sure, item.maybe)
        documents = _documents(index, found, fetch)
        return select(documents, query, now)


def _narrow(
    item: _Found,
    statements: list[Statement],
    query: EntityQuery,
    partitions: Bools | None,
    now: float,
    residual: bool,
) -> None:
    """Fill ``item.sure`` and ``item.maybe`` (lock held)."""
    group = item.group
    n = group.size
    paths = np.array([any(scope_matches(s, p) for s in query.scopes) for p in group.paths])
    live = group.live(now, partitions, paths if len(paths) else np.zeros(1, np.bool_))
    hit = live.copy()
    candidate = live
    for statement in statements:
        holds, unknown = _statement(item.columns[statement.attribute], statement, n)
        hit &= holds
        candidate = candidate & (holds | unknown)
    if residual:
        item.sure, item.maybe = _EMPTY, np.flatnonzero(candidate)
    else:
        item.sure, item.maybe = np.flatnonzero(hit), np.flatnonzero(candidate & ~hit)


def _exact_part(
    index: EntityIndex, found: list[_Found], fetch: Fetch, query: EntityQuery, now: float
) -> Part | None:
    """The part without a residual (module doc); None if a page document changed."""
    extra = [d for d in _documents(index, found, fetch) if matches(d, query, now)]
    count = sum(len(item.sure) for item in found) + len(extra)
    window = query.window
    if window == 0:
        return Part((), count)
    with index.lock:
        keys = _first_keys(index, found, window)
    documents = [Document.from_bytes(v) for v in fetch(keys) if v is not None]
    if len(documents) < len(keys) or not all(matches(d, query, now) for d in documents):
        return None

    def key(document: Document) -> tuple[object, ...]:
        return sort_key(document, query)

    ordered = heapq.merge(documents, sorted(extra, key=key), key=key)
    return Part(tuple(itertools.islice(ordered, window)), count)


def _first_keys(index: EntityIndex, found: list[_Found], window: int) -> list[bytes]:
    """The keys of the first ``window`` sure slots in creation order (lock held)."""
    created = np.concatenate([item.group.created[item.sure] for item in found] or [_EMPTY])
    owners = np.concatenate(
        [np.full(len(item.sure), i) for i, item in enumerate(found)] or [_EMPTY]
    )
    slots = np.concatenate([item.sure for item in found] or [_EMPTY])
    if len(created) > window:
        bound = np.partition(created, window - 1)[window - 1]
        taken = created <= bound
        created, owners, slots = created[taken], owners[taken], slots[taken]
    ranked = []
    for moment, owner, slot in zip(created.tolist(), owners.tolist(), slots.tolist(), strict=True):
        group = found[owner].group
        key = group.key_of(slot)
        order = (moment, key.entity_id, key.entity_type, key.service_path)
        ranked.append((order, slot, owner))
    ranked.sort()
    return [index.key(found[owner].group, slot) for _order, slot, owner in ranked[:window]]


def _documents(index: EntityIndex, found: list[_Found], fetch: Fetch) -> Iterator[Document]:
    """The documents of the ``maybe`` slots, read in chunks."""
    for item in found:
        slots = item.maybe.tolist()
        for start in range(0, len(slots), _KEY_CHUNK):
            with index.lock:
                keys = [index.key(item.group, s) for s in slots[start : start + _KEY_CHUNK]]
            for value in fetch(keys):
                if value is not None:
                    yield Document.from_bytes(value)


def _statement(column: Column, statement: Statement, n: int) -> tuple[Bools, Bools]:
    """(slots where ``statement`` holds, slots the column cannot tell) (lock held)."""
    kind = column.kind[:n]
    op = statement.op
    if op is Op.EXISTS:
        return kind != ABSENT, np.zeros(n, np.bool_)
    if op is Op.NOT_EXISTS:
        return kind == ABSENT, np.zeros(n, np.bool_)
    number = column.number[:n]
    unknown = kind == UNSURE
    is_number = kind == NUMBER
    if op in _ORDERINGS:
        bound = _number(statement.values[0])
        return is_number & _ORDERINGS[op](number, bound), unknown
    if statement.range is not None:
        low, high = _number(statement.range.low), _number(statement.range.high)
        return is_number & (number >= low) & (number <= high), unknown
    holds = np.zeros(n, np.bool_)
    for literal in statement.values:
        if literal.kind.numeric:
            holds |= is_number & (number == _number(literal))
        else:
            code = column.string_code(str(literal.value))
            if code is not None and column.code is not None:
                holds |= (kind == STRING) & (column.code[:n] == code)
    return holds, unknown


def _number(literal: Literal) -> float:
    assert isinstance(literal.value, float | int), literal
    return float(literal.value)


def _indexable(statement: Statement) -> bool:
    """Whether a column answers ``statement`` (module doc)."""
    if len(statement.path) != 1:
        return False
    op = statement.op
    if op in (Op.EXISTS, Op.NOT_EXISTS):
        return True
    if op in _ORDERINGS:
        return statement.values[0].kind.numeric
    if op is not Op.EQ:
        return False
    if statement.range is not None:
        return statement.range.low.kind.numeric and statement.range.high.kind.numeric
    return all(v.kind.numeric or v.kind is Kind.STRING for v in statement.values)


def _takes_type(query: EntityQuery, entity_type: str) -> bool:
    if not query.selectors:
        return True
    for selector in query.selectors:
        if selector.type is not None:
            if selector.type == entity_type:
                return True
        elif _any(selector.type_pattern) or (
            selector.type_pattern is not None
            and compile_pattern(selector.type_pattern)(entity_type) is not None
        ):
            return True
    return False


def _any(pattern: str | None) -> bool:
    """Whether an id or type pattern takes everything (or there is none)."""
    return pattern is None or is_match_all(pattern)


def _table(partitions: set[int]) -> Bools:
    table = np.zeros(1 << 16, np.bool_)
    table[list(partitions)] = True
    return table
