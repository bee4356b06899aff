"""NGSI v2 request parameters read into queries: ``GET /v2/entities``, ``POST /v2/op/query``,
``GET /v2/entities/{id}...`` and ``GET /v2/types``.

Pure functions over the URL parameters (any mapping; aiohttp's ``request.query`` is one),
the JSON body and the ``Fiware-ServicePath`` header; every problem is a typed error the
front answers as Orion does (400 BadRequest unless said otherwise). Sources: Orion's
``doc/manuals/orion-api.md`` ("api" below), its code ("code") and ngsi-v2.md.

- Service paths (ngsi-v2.md "Tenancy and service paths"; code: ``servicePathCheck``): a
  query's ``Fiware-ServicePath`` lists up to 10 comma-separated paths, each exact or a
  subtree ``/a/#``; without the header (or empty) a query covers ``/#``. One trailing ``/``
  is dropped, as Orion does.
- Selectors (api: List Entities, Query operation): ``GET`` takes ``id`` and ``type``
  (comma-separated: every id with every type) or ``idPattern`` / ``typePattern``; an exact
  parameter with its pattern is 400 ("Incompatible parameters"). ``op/query`` takes
  ``entities``, each with ``id`` or ``idPattern`` (exactly one, code: parseEntityObject.cpp
  "nor /id/ nor /idPattern/ present") and at most one of ``type`` / ``typePattern``.
- ``q``, ``mq`` (or ``expression.q`` / ``.mq``): a syntax error is 400 (QuerySyntaxError,
  InvalidRegex).
- ``georel``, ``geometry``, ``coords`` (or ``expression.georel`` / ``.geometry`` /
  ``.coords``): a geographical filter, :mod:`broker.store.geo`; what Orion refuses (one
  without the others, near with another geometry than a point, a polygon not closed...)
  is 400 InvalidGeoQuery, "Invalid query: ...". ``orderBy=geo:distance`` orders a
  ``near`` query by distance (400 without ``georel=near``).
- Paging (code: rest.cpp ``uriArgumentGet``): ``limit`` 1..1000 (default 20) and ``offset``
  from 0, with Orion's descriptions ("Bad pagination limit: /0/ [a value of ZERO is
  unacceptable]", "[max: 1000]", "[must be a decimal number]"); a parameter given empty is
  "Empty right-hand-side for URI param /limit/".
- ``options``: ``count``, ``normalized`` (the default format, named: Orion's
  ``OPT_NORMALIZED``, which filip sends on every read), ``keyValues``, ``values``,
  ``unique``, and the legacy ``dateCreated`` / ``dateModified`` (add those builtin
  attributes to ``attrs``);
  ``skipForwarding`` is accepted and means nothing (Silbo forwards to no context provider).
  Another option is 400. Several formats: keyValues wins over values, values over unique
  (Silbo's choice). ``GET /v2/types`` takes ``count`` and ``values``.
- ``attrs`` and ``metadata``: comma-separated names (a JSON array in ``op/query``), ``*``
  for every user attribute (metadata); see :mod:`broker.store.rendering`.

Silbo's choices where Orion is unclear: an empty ``entities`` list, or a body ``{}``,
selects every entity (the api says every field of the body is optional); unknown URL
parameters are ignored, as Orion does; ``GET /v2/entities/{id}`` ignores ``limit``,
``offset`` and ``orderBy``.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from broker.errors import InvalidInput
from broker.model.identifiers import DEFAULT_SCOPE, check_identifier, check_scope
from broker.store.entity_types import TypesQuery
from broker.store.query import (
    DEFAULT_LIMIT,
    GEO_DISTANCE,
    MAX_LIMIT,
    EntityQuery,
    Format,
    Order,
    Selector,
)

__all__ = [
    "MAX_SCOPES",
    "parse_entity_get",
    "parse_entity_query",
    "parse_query_body",
    "parse_scopes",
    "parse_types_query",
]

MAX_SCOPES = 10  # service paths in one query's header (Orion's limit)

_ALL = "*"
_MAX_DIGITS = 18  # of limit and offset: they fit in 64 bits
_GEO = ("georel", "geometry", "coords")
_ENTITY_OPTIONS = frozenset(
    {
        "count",
        "normalized",
        "keyValues",
        "values",
        "unique",
        "dateCreated",
        "dateModified",
        "skipForwarding",
    }
)
_ONE_ENTITY_OPTIONS = _ENTITY_OPTIONS - {"count"}
_TYPES_OPTIONS = frozenset({"count", "values"})
_BODY_FIELDS = frozenset({"entities", "attrs", "expression", "metadata"})
_SELECTOR_FIELDS = frozenset({"id", "idPattern", "type", "typePattern"})
_EXPRESSION_FIELDS = frozenset({"q", "mq", *_GEO})


# -- parsing ----------------------------------------------------------------------------------


def parse_entity_query(
    params: Mapping[str, str], tenant: str, service_path_header: str | None
) -> EntityQuery:
    """The query of ``GET /v2/entities`` (InvalidInput, 400, for what Orion refuses)."""
    ids = _list(params, "id", "entity id")
    types = _list(params, "type", "entity type")
    id_pattern = _param(params, "idPattern")
    type_pattern = _param(params, "typePattern")
    if ids and id_pattern is not None:
        raise InvalidInput("Incompatible parameters: id, IdPattern")
    if types and type_pattern is not None:
        raise InvalidInput("Incompatible parameters: type, typePattern")
    selectors: tuple[Selector, ...] = ()
    if ids or id_pattern is not None or types or type_pattern is not None:
        id_choices: list[tuple[str | None, str | None]] = [(i, None) for i in ids] or [
            (None, id_pattern)
        ]
        type_choices: list[tuple[str | None, str | None]] = [(t, None) for t in types] or [
            (None, type_pattern)
        ]
        selectors = tuple(
            Selector(i, ip, t, tp)
            for (i, ip), (t, tp) in itertools.product(id_choices, type_choices)
        )
    options = _options(params, _ENTITY_OPTIONS)
    return EntityQuery(
        tenant=tenant,
        scopes=parse_scopes(service_path_header),
        selectors=selectors,
        q=_param(params, "q") or "",
        mq=_param(params, "mq") or "",
        georel=_param(params, "georel") or "",
        geometry=_param(params, "geometry") or "",
        coords=_param(params, "coords") or "",
        attrs=_attrs(_names_param(params, "attrs", "attribute name"), options),
        metadata=_names_param(params, "metadata", "metadata name"),
        order_by=_order_by(params),
        limit=_limit(params),
        offset=_offset(params),
        count="count" in options,
        format=_format(options),
    )


def parse_query_body(
    body: Any, params: Mapping[str, str], tenant: str, service_path_header: str | None
) -> EntityQuery:
    """The query of ``POST /v2/op/query``: the body's ``entities``, ``attrs``,
    ``expression`` and ``metadata``, the URL's ``limit``, ``offset``, ``orderBy`` and
    ``options`` (InvalidInput, 400, for what Orion refuses)."""
    if not isinstance(body, dict):
        raise InvalidInput("the payload must be a JSON object")
    unknown = sorted(set(body) - _BODY_FIELDS)
    if unknown:
        raise InvalidInput(f"Unrecognized field in JSON payload: /{unknown[0]}/")
    entities = body.get("entities", [])
    if not isinstance(entities, list):
        raise InvalidInput("/entities/ must be a JSON array")
    expression = body.get("expression", {})
    if not isinstance(expression, dict):
        raise InvalidInput("/expression/ must be a JSON object")
    unknown = sorted(set(expression) - _EXPRESSION_FIELDS)
    if unknown:
        raise InvalidInput(f"Unrecognized field in /expression/: /{unknown[0]}/")
    options = _options(params, _ENTITY_OPTIONS)
    return EntityQuery(
        tenant=tenant,
        scopes=parse_scopes(service_path_header),
        selectors=tuple(_body_selector(e) for e in entities),
        q=_body_text(expression, "q"),
        mq=_body_text(expression, "mq"),
        georel=_body_text(expression, "georel"),
        geometry=_body_text(expression, "geometry"),
        coords=_body_text(expression, "coords"),
        attrs=_attrs(_body_names(body, "attrs", "attribute name"), options),
        metadata=_body_names(body, "metadata", "metadata name"),
        order_by=_order_by(params),
        limit=_limit(params),
        offset=_offset(params),
        count="count" in options,
        format=_format(options),
    )


def parse_entity_get(
    entity_id: str, params: Mapping[str, str], tenant: str, service_path_header: str | None
) -> EntityQuery:
    """The query of ``GET /v2/entities/{id}`` (and of its ``/attrs...`` routes): the entity
    of that id (and ``type``, if given), at most two of them so that :func:`one` can tell an
    ambiguous id."""
    options = _options(params, _ONE_ENTITY_OPTIONS)
    entity_type = _param(params, "type")
    return EntityQuery(
        tenant=tenant,
        scopes=parse_scopes(service_path_header),
        selectors=(Selector(id=entity_id, type=entity_type),),
        attrs=_attrs(_names_param(params, "attrs", "attribute name"), options),
        metadata=_names_param(params, "metadata", "metadata name"),
        limit=2,
        format=_format(options),
    )


def parse_types_query(
    params: Mapping[str, str],
    tenant: str,
    service_path_header: str | None,
    entity_type: str | None = None,
) -> TypesQuery:
    """The query of ``GET /v2/types`` (``entity_type`` None) or ``GET /v2/types/{type}``."""
    options = _options(params, _TYPES_OPTIONS)
    if entity_type is not None:
        return TypesQuery(
            tenant,
            parse_scopes(service_path_header),
            check_identifier(entity_type, "entity type"),
        )
    return TypesQuery(
        tenant,
        parse_scopes(service_path_header),
        limit=_limit(params),
        offset=_offset(params),
        count="count" in options,
        values="values" in options,
    )


def parse_scopes(header: str | None) -> tuple[str, ...]:
    """The service paths of a query's ``Fiware-ServicePath`` (absent or empty: ``/#``)."""
    text = (header or "").strip()
    if not text:
        return (DEFAULT_SCOPE,)
    items = [item.strip() for item in text.split(",")]
    if len(items) > MAX_SCOPES:
        raise InvalidInput(f"a query takes at most {MAX_SCOPES} service paths, not {len(items)}")
    scopes = []
    for item in items:
        if item != "/" and item.endswith("/"):
            item = item[:-1]  # Orion strips one trailing '/'
        scopes.append(check_scope(item))
    return tuple(dict.fromkeys(scopes))


# -- parsing helpers --------------------------------------------------------------------------


def _param(params: Mapping[str, Any], name: str) -> str | None:
    """A URL parameter; present but empty is 400, as in Orion."""
    value = params.get(name)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidInput(f"/{name}/ must be a string")
    if not value:
        raise InvalidInput(f"Empty right-hand-side for URI param /{name}/")
    return value


def _list(params: Mapping[str, str], name: str, what: str) -> list[str]:
    text = _param(params, name)
    if text is None:
        return []
    return list(dict.fromkeys(check_identifier(item.strip(), what) for item in text.split(",")))


def _names_param(params: Mapping[str, str], name: str, what: str) -> tuple[str, ...] | None:
    text = _param(params, name)
    if text is None:
        return None
    return _checked_names([item.strip() for item in text.split(",")], what)


def _checked_names(names: Sequence[Any], what: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(check_identifier(n, what) for n in names))


def _options(params: Mapping[str, str], known: frozenset[str]) -> frozenset[str]:
    text = params.get("options") or ""
    given = {o.strip() for o in text.split(",") if o.strip()}
    unknown = sorted(given - known)
    if unknown:
        raise InvalidInput(f"Invalid value for URL parameter /options/: {unknown[0]}")
    return frozenset(given)


def _format(options: frozenset[str]) -> Format:
    for candidate in (Format.KEY_VALUES, Format.VALUES, Format.UNIQUE):
        if candidate.value in options:
            return candidate
    return Format.NORMALIZED


def _attrs(names: tuple[str, ...] | None, options: frozenset[str]) -> tuple[str, ...] | None:
    """``attrs`` with the builtins the legacy ``options=dateCreated,dateModified`` ask for."""
    dates = tuple(d for d in ("dateCreated", "dateModified") if d in options)
    if not dates:
        return names
    base = names if names is not None else (_ALL,)
    return tuple(dict.fromkeys((*base, *dates)))


def _order_by(params: Mapping[str, str]) -> tuple[Order, ...]:
    text = _param(params, "orderBy")
    if text is None:
        return ()
    orders = []
    for item in text.split(","):
        item = item.strip()
        descending = item.startswith("!")
        name = item[1:] if descending else item
        if name == GEO_DISTANCE:  # not an attribute name: checked with the query's georel
            orders.append(Order(name, descending))
            continue
        orders.append(Order(check_identifier(name, "orderBy field"), descending))
    return tuple(orders)


def _limit(params: Mapping[str, str]) -> int:
    text = _param(params, "limit")
    if text is None:
        return DEFAULT_LIMIT
    if not _digits(text):
        raise InvalidInput(f"Bad pagination limit: /{text}/ [must be a decimal number]")
    limit = int(text)
    if limit > MAX_LIMIT:
        raise InvalidInput(f"Bad pagination limit: /{text}/ [max: {MAX_LIMIT}]")
    if limit == 0:
        raise InvalidInput(f"Bad pagination limit: /{text}/ [a value of ZERO is unacceptable]")
    return limit


def _offset(params: Mapping[str, str]) -> int:
    text = _param(params, "offset")
    if text is None:
        return 0
    if not _digits(text):
        raise InvalidInput(f"Bad pagination offset: /{text}/ [must be a decimal number]")
    return int(text)


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit() and len(text) <= _MAX_DIGITS


def _body_selector(entity: Any) -> Selector:
    if not isinstance(entity, dict):
        raise InvalidInput("entity is not a JSON object")
    unknown = sorted(set(entity) - _SELECTOR_FIELDS)
    if unknown:
        raise InvalidInput(f"no attributes allowed in Entity in this payload: /{unknown[0]}/")
    if "id" in entity and "idPattern" in entity:
        raise InvalidInput("both /id/ and /idPattern/ present")
    if "id" not in entity and "idPattern" not in entity:
        raise InvalidInput("nor /id/ nor /idPattern/ present")
    if "type" in entity and "typePattern" in entity:
        raise InvalidInput("both /type/ and /typePattern/ present")
    values = [entity.get(k) for k in ("id", "idPattern", "type", "typePattern")]
    for name, value in zip(("id", "idPattern", "type", "typePattern"), values, strict=True):
        if value is not None and not isinstance(value, str):
            raise InvalidInput(f"/{name}/ of an entity must be a string")
    return Selector(*values)


def _body_text(expression: Mapping[str, Any], name: str) -> str:
    value = expression.get(name, "")
    if not isinstance(value, str):
        raise InvalidInput(f"/expression/{name}/ must be a string")
    return value


def _body_names(body: Mapping[str, Any], name: str, what: str) -> tuple[str, ...] | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, list):
        raise InvalidInput(f"/{name}/ must be a JSON array of strings")
    return _checked_names(value, what)
