"""Orion's entity types on stored documents: ``GET /v2/types`` and ``GET /v2/types/{type}``.

Pure functions, no I/O, the way :mod:`broker.store.query` does entities: each store summarises
the types of its partitions (:func:`types_part`), the front merges the summaries
(:func:`merge_types`) and renders the page (:mod:`broker.store.rendering`). Sources: Orion's
``doc/manuals/orion-api.md`` ("api": List Entity Types, Retrieve entity information for a
given type).

- A type is listed with every attribute name its entities have, each with the attribute
  types used under that name, and how many entities it has. Only the tenant's entities in
  the query's service paths count (``Fiware-ServicePath``, as for entity queries); expired
  ones do not (api: Transient Entities). Builtin attributes are not listed; ``dateExpires``,
  a stored attribute, is.
- Types are ordered by name ("Results are ordered by entity type in alphabetical order");
  ``limit`` (default 20, at most 1000) and ``offset`` cut the list; ``options=count`` gives
  the number of types in ``Fiware-Total-Count``; ``options=values`` gives only the names.
- ``GET /v2/types/{type}`` answers the one type, 404 if no entity has it.

Silbo's choices where the api says nothing: attribute names and their types are listed
sorted. A part holds every type of its store (the total needs them all, and there are few).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.errors import InvalidInput, SerializationError
from broker.model.identifiers import DEFAULT_SCOPE, check_identifier, scope_matches
from broker.store.query import DEFAULT_LIMIT, WIRE_VERSION
from broker.store.semantics import Document

__all__ = ["TypeSummary", "TypesPage", "TypesPart", "TypesQuery", "merge_types", "types_part"]


@dataclass(frozen=True, slots=True)
class TypesQuery:
    """A parsed types query: every type (``entity_type`` None) or one."""

    tenant: str
    scopes: tuple[str, ...] = (DEFAULT_SCOPE,)
    entity_type: str | None = None
    limit: int = DEFAULT_LIMIT
    offset: int = 0
    count: bool = False
    values: bool = False

    def to_wire(self) -> dict[str, Any]:
        """The query as plain data for msgpack."""
        return {
            "v": WIRE_VERSION,
            "tenant": self.tenant,
            "scopes": list(self.scopes),
            "type": self.entity_type,
            "limit": self.limit,
            "offset": self.offset,
            "count": self.count,
            "values": self.values,
        }

    @classmethod
    def from_wire(cls, data: Any) -> TypesQuery:
        """The query :meth:`to_wire` gave (SerializationError if ``data`` is not one)."""
        try:
            if data["v"] != WIRE_VERSION:
                raise SerializationError(f"types query of version {data['v']!r}")
            entity_type = data["type"]
            return cls(
                tenant=str(data["tenant"]),
                scopes=tuple(str(s) for s in data["scopes"]),
                entity_type=None if entity_type is None else check_identifier(entity_type, "type"),
                limit=_whole(data["limit"]),
                offset=_whole(data["offset"]),
                count=bool(data["count"]),
                values=bool(data["values"]),
            )
        except SerializationError:
            raise
        except (KeyError, TypeError, ValueError, InvalidInput) as exc:
            raise SerializationError(f"not a types query: {exc!r}") from exc


@dataclass(frozen=True, slots=True)
class TypeSummary:
    """One type: each attribute name with the attribute types used under it, and how many
    entities have the type."""

    attrs: Mapping[str, frozenset[str]] = field(default_factory=dict)
    count: int = 0

    def merged(self, other: TypeSummary) -> TypeSummary:
        """This summary and ``other`` (of another store) together."""
        attrs = {name: frozenset(types) for name, types in self.attrs.items()}
        for name, types in other.attrs.items():
            attrs[name] = attrs.get(name, frozenset()) | types
        return TypeSummary(attrs, self.count + other.count)


@dataclass(frozen=True, slots=True)
class TypesPart:
    """What one store answers: a summary of each type of its matching entities."""

    types: Mapping[str, TypeSummary]

    def to_wire(self) -> dict[str, Any]:
        """The part as plain data for msgpack."""
        return {
            name: [{a: sorted(t) for a, t in summary.attrs.items()}, summary.count]
            for name, summary in self.types.items()
        }

    @classmethod
    def from_wire(cls, data: Any) -> TypesPart:
        """The part :meth:`to_wire` gave (SerializationError if ``data`` is not one)."""
        try:
            types = {
                str(name): TypeSummary(
                    {str(a): frozenset(str(t) for t in ts) for a, ts in attrs.items()},
                    _whole(count),
                )
                for name, (attrs, count) in data.items()
            }
        except (AttributeError, TypeError, ValueError) as exc:
            raise SerializationError(f"not a types part: {exc!r}") from exc
        return cls(types)


@dataclass(frozen=True, slots=True)
class TypesPage:
    """The answer to a types query: the page's types in name order, and how many in all."""

    types: tuple[tuple[str, TypeSummary], ...]
    count: int


def types_part(documents: Iterable[Document], query: TypesQuery, now: float) -> TypesPart:
    """One store's part: a summary of each type of its documents the query takes."""
    attrs: dict[str, dict[str, set[str]]] = {}
    counts: dict[str, int] = {}
    for document in documents:
        if not _counted(document, query, now):
            continue
        names = attrs.setdefault(document.type, {})
        for name, attribute in document.attributes.items():
            names.setdefault(name, set()).add(attribute["type"])
        counts[document.type] = counts.get(document.type, 0) + 1
    return TypesPart(
        {
            t: TypeSummary({n: frozenset(ts) for n, ts in attrs[t].items()}, counts[t])
            for t in counts
        }
    )


def merge_types(parts: Iterable[TypesPart], query: TypesQuery) -> TypesPage:
    """The page of the query from every store's part: types merged by name, then cut."""
    merged: dict[str, TypeSummary] = {}
    for part in parts:
        for name, summary in part.types.items():
            known = merged.get(name)
            merged[name] = summary if known is None else known.merged(summary)
    names = sorted(merged)
    chosen = names[query.offset : query.offset + query.limit]
    return TypesPage(tuple((n, merged[n]) for n in chosen), len(names))


def _counted(document: Document, query: TypesQuery, now: float) -> bool:
    if document.tenant != query.tenant or document.expired(now):
        return False
    if query.entity_type is not None and document.type != query.entity_type:
        return False
    return any(scope_matches(scope, document.service_path) for scope in query.scopes)


def _whole(value: Any) -> int:
    if type(value) is not int or value < 0:
        raise TypeError(f"expected a whole number, got {value!r}")
    return value
