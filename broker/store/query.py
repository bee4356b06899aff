"""Orion's entity queries on stored documents: what matches, in which order, which page.

Pure functions, no I/O. A front parses a request into an :class:`EntityQuery`
(:mod:`broker.store.parameters`) and sends it (:meth:`EntityQuery.to_wire`) to every store
process holding a partition; each answers a :class:`Part` (:func:`select`: its first
``offset + limit`` matching documents in order, and how many match); the front merges the
parts (:func:`merge`) into the :class:`Page` it renders (:mod:`broker.store.rendering`). A
part keeps ``offset + limit`` documents because the page's documents are among the first
``offset + limit`` of whichever part holds them. ``GET /v2/types`` goes the same way
(:mod:`broker.store.entity_types`). Sources: Orion's ``doc/manuals/orion-api.md`` ("api"
below), its code ("code") and ngsi-v2.md.

What matches (api: List Entities, Query operation, Simple Query Language):

- the tenant, then one of the query's service paths, each exact or a subtree ``/a/#``
  (ngsi-v2.md "Tenancy and service paths"; :func:`~broker.model.identifiers.scope_matches`);
- one of the entity selectors (none: every entity): an exact id or an id pattern, an exact
  type or a type pattern; patterns are searched, not anchored, as Orion's;
- ``q`` and ``mq``, parsed and evaluated by broker/query, the same code as subscriptions
  (docs/query-language.md). ``dateCreated`` / ``dateModified`` can be filtered on as
  attributes, and as metadata of each attribute in ``mq`` (api: Builtin Attributes,
  Builtin Metadata: "they can be used in q filters and in orderBy", "in mq filters"); a
  DateTime value compares as its epoch seconds, as Orion stores it;
- ``georel``, ``geometry`` and ``coords``: the entity's location (its first geo-typed
  attribute) in the relation asked, :mod:`broker.store.geo` (api: Geographical Queries); an
  entity without a location never matches a geographical query;
- an expired entity (``dateExpires`` passed) never matches (api: Transient Entities; Orion's
  TTL monitor removes it within a minute, Silbo hides it at once).

Order (api: Ordering Results): ``orderBy`` is a list of ``id``, ``type``, ``dateCreated``,
``dateModified`` or attribute names, each ascending or (``!``) descending; ``geo:distance``
orders by the distance to a ``near`` query's point (400 without ``georel=near``: there is no
point to measure from). Without it the
order is creation order (Orion's default sort is ``creDate``). Ties are broken by
(dateCreated, id, type, service path), so the order is total and the parts merge exactly.
An attribute orders by its value as MongoDB sorts ``attrs.<name>.value`` (Orion hands the
sort to MongoDB): a missing attribute counts as null, and null < numbers < strings <
objects < arrays < booleans, so entities without the attribute come first in ascending order
and last in descending order. Silbo's choice where MongoDB differs: arrays and objects
compare element by element (MongoDB sorts an array by its smallest element ascending, its
largest descending).

Paging (api: Pagination): the page is ``limit`` documents from ``offset`` of the merged
order; the count (``Fiware-Total-Count``) is the sum of the parts' counts.
"""

from __future__ import annotations

import enum
import heapq
import itertools
import math
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.errors import (
    AmbiguousEntity,
    InvalidGeoQuery,
    InvalidInput,
    NotFound,
    SerializationError,
)
from broker.model.attribute import DATE_TYPES, parse_iso8601
from broker.model.identifiers import DEFAULT_SCOPE, check_identifier, scope_matches
from broker.query.ast import Filter
from broker.query.evaluate import filter_matches
from broker.query.parser import parse_filter
from broker.query.regex import compile_pattern, is_match_all
from broker.store.geo import GeoFilter, Location, first_location, parse_geo
from broker.store.semantics import Document

__all__ = [
    "DEFAULT_LIMIT",
    "GEO_DISTANCE",
    "MAX_LIMIT",
    "MISSING",
    "WIRE_VERSION",
    "EntityQuery",
    "Format",
    "Order",
    "Page",
    "Part",
    "Selector",
    "location",
    "match_value",
    "matches",
    "merge",
    "one",
    "select",
    "sort_key",
]

DEFAULT_LIMIT = 20
MAX_LIMIT = 1000
WIRE_VERSION = 2  # 2: the geographical parameters (issue 18)
GEO_DISTANCE = "geo:distance"  # the orderBy field of a near query's distances

MISSING: Any = object()  # match_value of an attribute the document does not have

_NO_ENTITY = "The requested entity has not been found. Check type and id"
_AMBIGUOUS = "More than one matching entity. Please refine your query"


class Format(enum.Enum):
    """How entities are rendered (api: Simplified Entity Representation)."""

    NORMALIZED = "normalized"
    KEY_VALUES = "keyValues"
    VALUES = "values"
    UNIQUE = "unique"


@dataclass(frozen=True, slots=True)
class Selector:
    """Which entities: an exact ``id`` or an ``id_pattern`` (neither: any id), and an exact
    ``type`` or a ``type_pattern`` (neither: any type). Patterns are searched, as Orion's."""

    id: str | None = None
    id_pattern: str | None = None
    type: str | None = None
    type_pattern: str | None = None

    def __post_init__(self) -> None:
        if self.id is not None and self.id_pattern is not None:
            raise InvalidInput("Incompatible parameters: id, IdPattern")
        if self.type is not None and self.type_pattern is not None:
            raise InvalidInput("Incompatible parameters: type, typePattern")
        if self.id is not None:
            object.__setattr__(self, "id", check_identifier(self.id, "entity id"))
        if self.type is not None:
            object.__setattr__(self, "type", check_identifier(self.type, "entity type"))
        for pattern in (self.id_pattern, self.type_pattern):
            if pattern is not None:
                compile_pattern(pattern)

    def matches(self, entity_id: str, entity_type: str) -> bool:
        """Tell whether the selector takes the entity."""
        if self.id is not None and self.id != entity_id:
            return False
        if self.type is not None and self.type != entity_type:
            return False
        return _searched(self.id_pattern, entity_id) and _searched(self.type_pattern, entity_type)


@dataclass(frozen=True, slots=True)
class Order:
    """One ``orderBy`` criterion: ``id``, ``type``, ``dateCreated``, ``dateModified`` or an
    attribute name; ``descending`` when written with ``!``."""

    field: str
    descending: bool = False


@dataclass(frozen=True, slots=True)
class EntityQuery:
    """A parsed entity query (see the module doc for each field's rules).

    ``scopes``: service paths, exact or ``/a/#``; ``selectors``: any of them (none: every
    entity); ``q`` / ``mq``: the texts, parsed into :attr:`filter`; ``georel`` /
    ``geometry`` / ``coords``: the texts (all empty: no geographical filter), parsed into
    :attr:`geo`; ``attrs`` / ``metadata``: None for every user one; ``order_by``: empty for
    creation order.
    """

    tenant: str
    scopes: tuple[str, ...] = (DEFAULT_SCOPE,)
    selectors: tuple[Selector, ...] = ()
    q: str = ""
    mq: str = ""
    georel: str = ""
    geometry: str = ""
    coords: str = ""
    attrs: tuple[str, ...] | None = None
    metadata: tuple[str, ...] | None = None
    order_by: tuple[Order, ...] = ()
    limit: int = DEFAULT_LIMIT
    offset: int = 0
    count: bool = False
    format: Format = Format.NORMALIZED
    filter: Filter = field(init=False, repr=False, compare=False)
    geo: GeoFilter | None = field(init=False, repr=False, compare=False)
    _by_id: Mapping[str, tuple[Selector, ...]] = field(init=False, repr=False, compare=False)
    _patterns: tuple[Selector, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "filter", parse_filter(self.q, self.mq))
        geo = parse_geo(self.georel or None, self.geometry or None, self.coords or None)
        object.__setattr__(self, "geo", geo)
        if any(o.field == GEO_DISTANCE for o in self.order_by) and (geo is None or not geo.near):
            raise InvalidGeoQuery("orderBy=geo:distance needs a georel=near query")
        by_id: dict[str, list[Selector]] = {}
        for selector in self.selectors:
            if selector.id is not None:
                by_id.setdefault(selector.id, []).append(selector)
        object.__setattr__(self, "_by_id", {i: tuple(s) for i, s in by_id.items()})
        patterns = tuple(s for s in self.selectors if s.id is None)
        object.__setattr__(self, "_patterns", patterns)

    @property
    def window(self) -> int:
        """How many documents a part keeps: ``offset + limit``."""
        return self.offset + self.limit

    @property
    def entity_ids(self) -> frozenset[str] | None:
        """The exact ids the query is limited to (None: any id may match), so that a front
        asks only the partitions holding them."""
        if not self.selectors or self._patterns:
            return None
        return frozenset(self._by_id)

    def selects(self, entity_id: str, entity_type: str) -> bool:
        """Tell whether one of the selectors (or, with none, the query) takes the entity."""
        if not self.selectors:
            return True
        exact = self._by_id.get(entity_id, ())
        return any(s.matches(entity_id, entity_type) for s in (*exact, *self._patterns))

    def to_wire(self) -> dict[str, Any]:
        """The query as plain data for msgpack (the store parses ``q`` / ``mq`` again)."""
        return {
            "v": WIRE_VERSION,
            "tenant": self.tenant,
            "scopes": list(self.scopes),
            "selectors": [[s.id, s.id_pattern, s.type, s.type_pattern] for s in self.selectors],
            "q": self.q,
            "mq": self.mq,
            "geo": [self.georel, self.geometry, self.coords],
            "attrs": None if self.attrs is None else list(self.attrs),
            "metadata": None if self.metadata is None else list(self.metadata),
            "order_by": [[o.field, o.descending] for o in self.order_by],
            "limit": self.limit,
            "offset": self.offset,
            "count": self.count,
            "format": self.format.value,
        }

    @classmethod
    def from_wire(cls, data: Any) -> EntityQuery:
        """The query :meth:`to_wire` gave (SerializationError if ``data`` is not one)."""
        try:
            if data["v"] != WIRE_VERSION:
                raise SerializationError(f"entity query of version {data['v']!r}")
            georel, geometry, coords = _texts(data["geo"], 3)
            return cls(
                tenant=_text(data["tenant"]),
                scopes=tuple(_text(s) for s in data["scopes"]),
                selectors=tuple(Selector(*_optional_texts(s, 4)) for s in data["selectors"]),
                q=_text(data["q"]),
                mq=_text(data["mq"]),
                georel=georel,
                geometry=geometry,
                coords=coords,
                attrs=_names(data["attrs"]),
                metadata=_names(data["metadata"]),
                order_by=tuple(Order(_text(f), bool(d)) for f, d in data["order_by"]),
                limit=_whole(data["limit"]),
                offset=_whole(data["offset"]),
                count=bool(data["count"]),
                format=Format(data["format"]),
            )
        except SerializationError:
            raise
        except (KeyError, TypeError, ValueError, InvalidInput) as exc:
            raise SerializationError(f"not an entity query: {exc!r}") from exc


@dataclass(frozen=True, slots=True)
class Part:
    """What one store answers: its first ``offset + limit`` matching documents, in order,
    and how many of its documents match."""

    documents: tuple[Document, ...]
    count: int

    def to_wire(self) -> dict[str, Any]:
        """The part as plain data for msgpack (documents as their stored bytes)."""
        return {"documents": [d.to_bytes() for d in self.documents], "count": self.count}

    @classmethod
    def from_wire(cls, data: Any) -> Part:
        """The part :meth:`to_wire` gave (SerializationError if ``data`` is not one)."""
        try:
            documents = tuple(Document.from_bytes(bytes(d)) for d in data["documents"])
            return cls(documents, _whole(data["count"]))
        except (KeyError, TypeError, ValueError) as exc:
            raise SerializationError(f"not a query part: {exc!r}") from exc


@dataclass(frozen=True, slots=True)
class Page:
    """The answer to a query: the page's documents, in order, and how many match in all."""

    documents: tuple[Document, ...]
    count: int


# -- matching, ordering, paging ----------------------------------------------------------------


def matches(document: Document, query: EntityQuery, now: float) -> bool:
    """Tell whether the query takes ``document`` at ``now`` (an expired one: never)."""
    if document.tenant != query.tenant or document.expired(now):
        return False
    if not any(scope_matches(scope, document.service_path) for scope in query.scopes):
        return False
    if not query.selects(document.id, document.type):
        return False
    if not (query.filter.empty or filter_matches(query.filter, _Viewed(document))):
        return False
    return query.geo is None or query.geo.matches(location(document))


def location(document: Document) -> Location | None:
    """The document's location: its first geo-typed attribute (broker.store.geo)."""
    return first_location(
        (a["type"], a["value"], a.get("metadata")) for a in document.attributes.values()
    )


def match_value(document: Document, name: str) -> Any:
    """What a ``q`` statement on attribute ``name`` compares in ``document`` (a DateTime as
    its epoch seconds, the builtin dates when the document has no attribute of their name),
    or MISSING: the evaluator's view of it (broker.store.index keeps it in columns)."""
    attribute = document.attributes.get(name)
    if attribute is not None:
        return _comparable(attribute["type"], attribute["value"])
    if name == "dateCreated":
        return document.date_created
    if name == "dateModified":
        return document.date_modified
    return MISSING


def sort_key(document: Document, query: EntityQuery) -> tuple[Any, ...]:
    """The key that orders ``document`` in the query's results (total: ties broken by
    dateCreated, id, type and service path)."""
    key: list[Any] = []
    for order in query.order_by:
        value = _sortable(document, order.field, query.geo)
        key.append(_Descending(value) if order.descending else value)
    key.extend((document.date_created, document.id, document.type, document.service_path))
    return tuple(key)


def select(documents: Iterable[Document], query: EntityQuery, now: float) -> Part:
    """One store's part: its first ``offset + limit`` matching documents, and the count.

    The documents stream through: only the ``offset + limit`` first ones are held (a scan
    of a million entities must not hold every match: the store's heap would keep it)."""
    counted = 0

    def matching() -> Iterator[Document]:
        nonlocal counted
        for document in documents:
            if matches(document, query, now):
                counted += 1
                yield document

    stream = matching()
    first = heapq.nsmallest(query.window, stream, key=lambda d: sort_key(d, query))
    for _document in stream:  # a window of 0 (a count only): nsmallest reads none
        pass
    return Part(tuple(first), counted)


def merge(parts: Iterable[Part], query: EntityQuery) -> Page:
    """The page of the query from every store's part: merged in order, then cut."""
    parts = list(parts)
    merged = heapq.merge(*(p.documents for p in parts), key=lambda d: sort_key(d, query))
    page = itertools.islice(merged, query.offset, query.window)
    return Page(tuple(page), sum(p.count for p in parts))


def one(found: Page | Iterable[Document]) -> Document:
    """The one entity a single-entity query found: NotFound (404) if none, AmbiguousEntity
    (409 TooManyResults) if the id names several (without a type)."""
    documents = found.documents if isinstance(found, Page) else tuple(found)
    if not documents:
        raise NotFound(_NO_ENTITY)
    if len(documents) > 1:
        raise AmbiguousEntity(_AMBIGUOUS)
    return documents[0]


# -- wire helpers ------------------------------------------------------------------------------


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"expected a string, got {value!r}")
    return value


def _texts(values: Any, n: int) -> list[str]:
    if not isinstance(values, list | tuple) or len(values) != n:
        raise TypeError(f"expected {n} items, got {values!r}")
    return [_text(v) for v in values]


def _optional_texts(values: Any, n: int) -> list[str | None]:
    if not isinstance(values, list | tuple) or len(values) != n:
        raise TypeError(f"expected {n} items, got {values!r}")
    return [None if v is None else _text(v) for v in values]


def _names(values: Any) -> tuple[str, ...] | None:
    return None if values is None else tuple(_text(v) for v in values)


def _whole(value: Any) -> int:
    if type(value) is not int or value < 0:
        raise TypeError(f"expected a whole number, got {value!r}")
    return value


# -- matching and ordering helpers --------------------------------------------------------------


def _searched(pattern: str | None, text: str) -> bool:
    return pattern is None or is_match_all(pattern) or compile_pattern(pattern)(text) is not None


def _comparable(type_: Any, value: Any) -> Any:
    """What a filter or a sort compares: a DateTime's epoch seconds, else the value."""
    if type_ in DATE_TYPES and isinstance(value, str):
        epoch = parse_iso8601(value)
        if epoch is not None:
            return epoch
    return value


class _Valued:
    """A metadata as the filter reads it."""

    __slots__ = ("match_value",)

    def __init__(self, match_value: Any) -> None:
        self.match_value = match_value


class _AttributeView:
    """A stored attribute as the filter reads it (metadata, with the builtin dates, made
    only when ``mq`` asks)."""

    __slots__ = ("_dates", "_metadata", "match_value")

    def __init__(
        self, match_value: Any, metadata: Mapping[str, Any], dates: tuple[float, float]
    ) -> None:
        self.match_value = match_value
        self._metadata = metadata
        self._dates = dates

    @property
    def metadata(self) -> Mapping[str, _Valued]:
        """Every metadata (and the builtin dateCreated / dateModified) with its value."""
        created, modified = self._dates
        out = {"dateCreated": _Valued(created), "dateModified": _Valued(modified)}
        for name, item in self._metadata.items():
            out[name] = _Valued(_comparable(item.get("type"), item.get("value")))
        return out


class _Viewed(Mapping[str, _AttributeView]):
    """A document's attributes as the filter reads them, with the builtin dates."""

    __slots__ = ("_document",)

    def __init__(self, document: Document) -> None:
        self._document = document

    def __getitem__(self, name: str) -> _AttributeView:
        document = self._document
        attribute = document.attributes.get(name)
        if attribute is not None:
            value = _comparable(attribute["type"], attribute["value"])
            return _AttributeView(value, attribute["metadata"], document.dates(name))
        if name == "dateCreated":
            return _AttributeView(document.date_created, {}, (0.0, 0.0))
        if name == "dateModified":
            return _AttributeView(document.date_modified, {}, (0.0, 0.0))
        raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        yield from self._document.attributes
        yield from ("dateCreated", "dateModified")

    def __len__(self) -> int:
        return len(self._document.attributes) + 2


def _sortable(document: Document, name: str, geo: GeoFilter | None) -> tuple[Any, ...]:
    """An ``orderBy`` field of the document, as a key MongoDB's order gives (``geo:distance``:
    its distance to a near query's point; a document the query takes has a location)."""
    if name == GEO_DISTANCE and geo is not None:
        found = location(document)
        return (1, geo.distance(found)) if found is not None else (0,)
    if name == "id":
        return (2, document.id)
    if name == "type":
        return (2, document.type)
    attribute = document.attributes.get(name)
    if attribute is not None:
        return _rank(_comparable(attribute["type"], attribute["value"]))
    if name == "dateCreated":
        return (1, document.date_created)
    if name == "dateModified":
        return (1, document.date_modified)
    if name == "servicePath":
        return (2, document.service_path)
    return (0,)  # missing: as null


def _rank(value: Any) -> tuple[Any, ...]:
    """MongoDB's order of types: null < numbers < strings < objects < arrays < booleans."""
    if value is None:
        return (0,)
    if isinstance(value, bool):
        return (5, value)
    if isinstance(value, int | float):
        # NaN compares with nothing (a sort over it would depend on the input's order):
        # MongoDB puts it before every other number, -Infinity included
        return (1, -math.inf, 0) if value != value else (1, value, 1)
    if isinstance(value, str):
        return (2, value)
    if isinstance(value, dict):
        return (3, tuple((k, _rank(v)) for k, v in value.items()))
    if isinstance(value, list):
        return (4, tuple(_rank(v) for v in value))
    return (6, repr(value))


class _Descending:
    """A sort key component in reverse order."""

    __slots__ = ("key",)

    def __init__(self, key: tuple[Any, ...]) -> None:
        self.key = key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Descending) and self.key == other.key

    def __lt__(self, other: _Descending) -> bool:
        return bool(other.key < self.key)

    def __hash__(self) -> int:
        return hash(self.key)
