"""The aggregation groups' routes: ``/v2/x/aggregations`` (docs/aggregation.md).

    POST   /v2/x/aggregations          define a group (201, Location)
    GET    /v2/x/aggregations          the tenant's groups (of the service path, if given)
    GET    /v2/x/aggregations/{id}     one group
    PUT    /v2/x/aggregations/{id}     change it (204): it applies from its ``since``
    DELETE /v2/x/aggregations/{id}     remove it (204); its derived entities stay

A group is defined per tenant (``Fiware-Service``) and service path (``Fiware-ServicePath``,
default ``/#``: every one). Definitions are checked here (broker.store.aggregation: 400
with every problem named; 422 for an id the tenant has already; 404 for an unknown one) and
kept in ZooKeeper (broker.coordination.aggregations), where every context store follows
them: the groups run on the store processes, so a cluster without a context store layer
answers 501.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from broker.coordination.aggregations import (
    NO_AGGREGATION,
    AggregationStore,
    Kept,
    Stored,
    since_for,
)
from broker.errors import InvalidInput, NotFound
from broker.ngsi.errors import NotServed
from broker.ngsi.request import json_response, read_json, scope_of, tenant_of
from broker.store.aggregation import ID, Definition, parse_definition
from broker.store.client import LocalEntities
from broker.store.semantics import iso8601

__all__ = ["AGGREGATIONS_PATH", "AggregationRoutes"]

AGGREGATIONS_PATH = "/v2/x/aggregations"
_ONE = AGGREGATIONS_PATH + "/{aid:[^/]+}"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OpenStore = Callable[[], "AggregationStore | None"]  # None: this front has no ZooKeeper


class AggregationRoutes:
    """The handlers of the aggregation routes, over the front's definitions in ZooKeeper
    (``store``) and whether its cluster has a context store layer (``stored``)."""

    def __init__(self, store: OpenStore, stored: Callable[[], bool]) -> None:
        self._store = store
        self._stored = stored

    def routes(self) -> list[tuple[str, str, Handler]]:
        """The table broker.ngsi.routes adds."""
        return [
            ("POST", AGGREGATIONS_PATH, self.create),
            ("GET", AGGREGATIONS_PATH, self.list),
            ("GET", _ONE, self.get),
            ("PUT", _ONE, self.replace),
            ("DELETE", _ONE, self.delete),
        ]

    async def create(self, request: web.Request) -> web.Response:
        store = self._served()
        tenant, scope = tenant_of(request), scope_of(request)
        body = await read_json(request)
        definition = parse_definition(body, tenant, scope)
        await store.create(_kept(definition, 1))
        location = f"{AGGREGATIONS_PATH}/{definition.id}"
        return web.Response(status=201, headers={"Location": location})

    async def list(self, request: web.Request) -> web.Response:
        store = self._served()
        scope = scope_of(request)
        listed = await store.listed(tenant_of(request))
        chosen = [s for s in listed if scope is None or s.current.service_path == scope]
        return json_response([_shown(s) for s in chosen])

    async def get(self, request: web.Request) -> web.Response:
        store = self._served()
        found = await store.read(tenant_of(request), _id_of(request))
        return json_response(_shown(found))

    async def replace(self, request: web.Request) -> web.Response:
        store = self._served()
        tenant, aggregation_id = tenant_of(request), _id_of(request)
        body = await read_json(request)
        if isinstance(body, dict):
            given = body.setdefault("id", aggregation_id)
            if given != aggregation_id:
                raise InvalidInput(f"the body's id {given!r} is not the URL's {aggregation_id!r}")
        old = await store.read(tenant, aggregation_id)
        scope = scope_of(request)
        kept_scope = old.current.service_path if scope is None else scope
        definition = parse_definition(body, tenant, kept_scope)
        await store.replace(_kept(definition, 0))  # its number: the last one's next
        return web.Response(status=204)

    async def delete(self, request: web.Request) -> web.Response:
        store = self._served()
        await store.remove(tenant_of(request), _id_of(request))
        return web.Response(status=204)

    def _served(self) -> AggregationStore:
        store = self._store()
        if store is None:
            raise NotServed("this front keeps no aggregations (it runs without ZooKeeper)")
        if not self._stored():
            raise NotServed(
                "aggregations run on the context store layer, which this cluster does not "
                "have (start one: silbo run context-store)"
            )
        return store


def _id_of(request: web.Request) -> str:
    """The URL's aggregation id; NotFound for one no definition can have."""
    aggregation_id = request.match_info["aid"]
    if not ID.fullmatch(aggregation_id):
        raise NotFound(NO_AGGREGATION)
    return aggregation_id


def _kept(definition: Definition, version: int) -> Kept:
    """A definition to keep, applying from the first pane boundary every store knows it."""
    since = since_for(definition.window.slide)
    return Kept(definition.tenant, definition.scope, definition.to_json(), version, since)


def _shown(stored: Stored) -> dict[str, Any]:
    """One definition as the API answers it: the document, its service path, its version
    and when that applies from, and the previous version's number if it still applies to
    older windows."""
    current = stored.current
    body: dict[str, Any] = dict(current.document)
    body["servicePath"] = current.service_path
    body["version"] = current.version
    body["since"] = iso8601(current.since)
    if stored.previous is not None and time.time() < current.since:
        body["previous"] = stored.previous.version
    return body


def has_store_layer(entities: object) -> bool:
    """Whether a front's entities are the context store layer's (not its own memory)."""
    return not isinstance(entities, LocalEntities)
