"""The read side of the NGSI v2 API: entities, attributes, types and ``op/query``.

The handlers parse a request into a query (:mod:`broker.store.parameters`), ask a
:class:`Reader` for the page (the store layer's, or :class:`LocalReader` over documents in
memory) and render it (:mod:`broker.store.rendering`). They only raise: the front's
middleware (:func:`broker.ngsi.request.checks`) turns each typed error into Orion's ``{"error",
"description"}`` answer. Sources: Orion's ``doc/manuals/orion-api.md`` ("api" below).

- ``GET /v2/entities`` and ``POST /v2/op/query``: 200 with the page as a JSON array;
  ``options=count`` adds ``Fiware-Total-Count`` (api: List Entities, Query operation).
- ``GET /v2/entities/{id}``, ``.../attrs`` (the same without ``id`` and ``type``),
  ``.../attrs/{name}`` (the attribute): 404 NotFound if no entity, 409 TooManyResults if
  the id without ``type`` names several, 404 "The entity does not have such an attribute".
- ``GET .../attrs/{name}/value`` (api: Get Attribute Value): an object or array is answered
  as JSON, typed ``application/json`` or ``text/plain``, whichever comes first in
  ``Accept`` (``application/json`` for ``*/*`` or no Accept); a string, number, boolean or
  null only as ``text/plain`` (a string within double quotes). An Accept that allows
  neither is 406 NotAcceptable ("accepted MIME types: ...").
- ``GET /v2/types`` and ``GET /v2/types/{type}`` (api: Types): 200, ``Fiware-Total-Count``
  with ``options=count``; 404 for a type no entity has.

With a :class:`Forward` (:class:`broker.ngsi.forwarding.Forwarder`), the entity routes also
ask the context providers of registered attributes, and answer what they say.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol

from aiohttp import web

from broker.model.identifiers import check_identifier
from broker.ngsi.errors import NotAcceptable
from broker.ngsi.request import dumps, json_response, read_json, tenant_of
from broker.store.entity_types import TypesPage, TypesQuery, merge_types, types_part
from broker.store.parameters import (
    parse_entity_get,
    parse_entity_query,
    parse_query_body,
    parse_types_query,
)
from broker.store.query import EntityQuery, Page, merge, one, select
from broker.store.rendering import (
    render,
    render_attribute,
    render_page,
    render_type,
    render_types,
)
from broker.store.semantics import Document

__all__ = ["TOTAL_COUNT", "Forward", "LocalReader", "Reader", "Reads"]

TOTAL_COUNT = "Fiware-Total-Count"
SERVICE_PATH = "Fiware-ServicePath"

_ENTITY = "/v2/entities/{id:[^/]+}"  # any text but '/', as the write routes take
_ATTR = "/attrs/{attr:[^/]+}"
_JSON_TYPES = frozenset({"application/json", "application/*", "*/json", "*/*"})
_TEXT_TYPES = frozenset({"text/plain", "text/*", "*/*"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Reader(Protocol):
    """Where the pages come from: the store layer, or documents in memory."""

    async def query(self, query: EntityQuery) -> Page:
        """The page of an entity query."""

    async def types(self, query: TypesQuery) -> TypesPage:
        """The page of a types query."""


class Forward(Protocol):
    """What asks the context providers (broker.ngsi.forwarding)."""

    async def query(
        self, page: Page, query: EntityQuery, request: web.Request, *, single: bool = False
    ) -> Page:
        """The page with the providers' attributes (``single``: a one-entity query)."""


class LocalReader:
    """A :class:`Reader` over the documents a callable gives: one part, selected and
    merged as the store layer's parts are (for tests, and a single partition)."""

    def __init__(
        self,
        documents: Callable[[], Iterable[Document]],
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._documents = documents
        self._clock = clock

    async def query(self, query: EntityQuery) -> Page:
        """The page of an entity query over the documents."""
        return merge([select(self._documents(), query, self._clock())], query)

    async def types(self, query: TypesQuery) -> TypesPage:
        """The page of a types query over the documents."""
        return merge_types([types_part(self._documents(), query, self._clock())], query)


class Reads:
    """The read routes, over a :class:`Reader` (and a :class:`Forward`, if given)."""

    def __init__(self, reader: Reader, forward: Forward | None = None) -> None:
        self.reader = reader
        self.forward = forward

    def routes(self) -> list[web.RouteDef]:
        """Every read route, each also with one trailing '/' (Orion strips it); a GET
        without HEAD, as broker.ngsi.routes registers its routes (aiohttp's ``add_get``
        would add one)."""
        table: list[tuple[str, str, Handler]] = [
            ("GET", "/v2/entities", self.list_entities),
            ("GET", _ENTITY, self.get_entity),
            ("GET", _ENTITY + "/attrs", self.get_attributes),
            ("GET", _ENTITY + _ATTR, self.get_attribute),
            ("GET", _ENTITY + _ATTR + "/value", self.get_value),
            ("GET", "/v2/types", self.list_types),
            ("GET", "/v2/types/{type:[^/]+}", self.get_type),
            ("POST", "/v2/op/query", self.query),
        ]
        return [
            web.route(method, route, handler, **({"allow_head": False} if method == "GET" else {}))
            for method, path, handler in table
            for route in (path, path + "/")
        ]

    async def list_entities(self, request: web.Request) -> web.Response:
        """``GET /v2/entities``."""
        query = parse_entity_query(
            request.query, tenant_of(request), request.headers.get(SERVICE_PATH)
        )
        return await self._page(query, request)

    async def query(self, request: web.Request) -> web.Response:
        """``POST /v2/op/query``."""
        body = await read_json(request)
        query = parse_query_body(
            body, request.query, tenant_of(request), request.headers.get(SERVICE_PATH)
        )
        return await self._page(query, request)

    async def get_entity(self, request: web.Request) -> web.Response:
        """``GET /v2/entities/{id}``."""
        document, query = await self._one(request)
        return json_response(render(document, query))

    async def get_attributes(self, request: web.Request) -> web.Response:
        """``GET /v2/entities/{id}/attrs``: the entity without ``id`` and ``type``."""
        document, query = await self._one(request)
        return json_response(render(document, query, with_id=False))

    async def get_attribute(self, request: web.Request) -> web.Response:
        """``GET /v2/entities/{id}/attrs/{attr}``."""
        name = check_identifier(request.match_info["attr"], "attribute name")
        document, query = await self._one(request)
        return json_response(render_attribute(document, name, query))

    async def get_value(self, request: web.Request) -> web.Response:
        """``GET /v2/entities/{id}/attrs/{attr}/value``: JSON or text, as Accept allows."""
        name = check_identifier(request.match_info["attr"], "attribute name")
        document, query = await self._one(request)
        value = render_attribute(document, name, query)["value"]
        return _value_response(value, request.headers.get("Accept"))

    async def list_types(self, request: web.Request) -> web.Response:
        """``GET /v2/types``."""
        query = parse_types_query(
            request.query, tenant_of(request), request.headers.get(SERVICE_PATH)
        )
        page = await self.reader.types(query)
        headers = {TOTAL_COUNT: str(page.count)} if query.count else None
        return json_response(render_types(page, query), headers=headers)

    async def get_type(self, request: web.Request) -> web.Response:
        """``GET /v2/types/{type}``."""
        query = parse_types_query(
            request.query,
            tenant_of(request),
            request.headers.get(SERVICE_PATH),
            request.match_info["type"],
        )
        return json_response(render_type(await self.reader.types(query)))

    async def _page(self, query: EntityQuery, request: web.Request) -> web.Response:
        page = await self.reader.query(query)
        if self.forward is not None:
            page = await self.forward.query(page, query, request)
        headers = {TOTAL_COUNT: str(page.count)} if query.count else None
        return json_response(render_page(page, query), headers=headers)

    async def _one(self, request: web.Request) -> tuple[Document, EntityQuery]:
        query = parse_entity_get(
            request.match_info["id"],
            request.query,
            tenant_of(request),
            request.headers.get(SERVICE_PATH),
        )
        page = await self.reader.query(query)
        if self.forward is not None:
            page = await self.forward.query(page, query, request, single=True)
        return one(page), query


def _value_response(value: Any, accept: str | None) -> web.Response:
    """An attribute value as Orion answers it (module doc)."""
    wanted = [part.split(";")[0].strip().lower() for part in (accept or "*/*").split(",")]
    if isinstance(value, dict | list):
        for media in wanted:
            if media in _JSON_TYPES:
                return json_response(value)
            if media in _TEXT_TYPES:
                return web.Response(text=dumps(value), content_type="text/plain")
        raise NotAcceptable("accepted MIME types: application/json, text/plain")
    if not _TEXT_TYPES.intersection(wanted):
        raise NotAcceptable("accepted MIME types: text/plain")
    text = f'"{value}"' if isinstance(value, str) else dumps(value)
    return web.Response(text=text, content_type="text/plain")
