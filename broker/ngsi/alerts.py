"""The alert rules' routes: ``/v2/x/alerts`` (docs/alerts.md).

    POST   /v2/x/alerts          define a rule (201, Location)
    GET    /v2/x/alerts          the tenant's rules (of the service path, if given)
    GET    /v2/x/alerts/{id}     one rule
    PUT    /v2/x/alerts/{id}     change it (204): it applies from the next write
    DELETE /v2/x/alerts/{id}     remove it (204); its alert entities stay

A rule is defined per tenant (``Fiware-Service``) and service path (``Fiware-ServicePath``,
default ``/#``: every one). Rules are checked here (broker.store.alerting: 400 with every
problem named; 422 for an id the tenant has already; 404 for an unknown one) and kept in
ZooKeeper (broker.coordination.alerts), where every context store follows them: the rules
run on the store processes, so a cluster without a context store layer answers 501.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from broker.coordination.alerts import NO_ALERT, AlertStore, KeptRule
from broker.errors import InvalidInput, NotFound
from broker.ngsi.errors import NotServed
from broker.ngsi.request import json_response, read_json, scope_of, tenant_of
from broker.store.alerting import ID, parse_rule
from broker.store.semantics import iso8601

__all__ = ["ALERTS_PATH", "AlertRoutes"]

ALERTS_PATH = "/v2/x/alerts"
_ONE = ALERTS_PATH + "/{alid:[^/]+}"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OpenStore = Callable[[], "AlertStore | None"]  # None: this front has no ZooKeeper


class AlertRoutes:
    """The handlers of the alert routes, over the front's rules in ZooKeeper (``store``)
    and whether its cluster has a context store layer (``stored``)."""

    def __init__(self, store: OpenStore, stored: Callable[[], bool]) -> None:
        self._store = store
        self._stored = stored

    def routes(self) -> list[tuple[str, str, Handler]]:
        """The table broker.ngsi.routes adds."""
        return [
            ("POST", ALERTS_PATH, self.create),
            ("GET", ALERTS_PATH, self.list),
            ("GET", _ONE, self.get),
            ("PUT", _ONE, self.replace),
            ("DELETE", _ONE, self.delete),
        ]

    async def create(self, request: web.Request) -> web.Response:
        store = self._served()
        tenant, scope = tenant_of(request), scope_of(request)
        rule = parse_rule(await read_json(request), tenant, scope)
        await store.create(tenant, rule.scope, rule.to_json())
        return web.Response(status=201, headers={"Location": f"{ALERTS_PATH}/{rule.id}"})

    async def list(self, request: web.Request) -> web.Response:
        store = self._served()
        scope = scope_of(request)
        listed = await store.listed(tenant_of(request))
        return json_response([_shown(k) for k in listed if scope in (None, k.service_path)])

    async def get(self, request: web.Request) -> web.Response:
        store = self._served()
        return json_response(_shown(await store.read(tenant_of(request), _id_of(request))))

    async def replace(self, request: web.Request) -> web.Response:
        store = self._served()
        tenant, rule_id = tenant_of(request), _id_of(request)
        body = await read_json(request)
        if isinstance(body, dict):
            given = body.setdefault("id", rule_id)
            if given != rule_id:
                raise InvalidInput(f"the body's id {given!r} is not the URL's {rule_id!r}")
        old = await store.read(tenant, rule_id)
        scope = scope_of(request)
        rule = parse_rule(body, tenant, old.service_path if scope is None else scope)
        await store.replace(tenant, rule.scope, rule.to_json())
        return web.Response(status=204)

    async def delete(self, request: web.Request) -> web.Response:
        store = self._served()
        await store.remove(tenant_of(request), _id_of(request))
        return web.Response(status=204)

    def _served(self) -> AlertStore:
        store = self._store()
        if store is None:
            raise NotServed("this front keeps no alert rules (it runs without ZooKeeper)")
        if not self._stored():
            raise NotServed(
                "alert rules run on the context store layer, which this cluster does not "
                "have (start one: silbo run context-store)"
            )
        return store


def _id_of(request: web.Request) -> str:
    """The URL's rule id; NotFound for one no rule can have."""
    rule_id = request.match_info["alid"]
    if not ID.fullmatch(rule_id):
        raise NotFound(NO_ALERT)
    return rule_id


def _shown(kept: KeptRule) -> dict[str, Any]:
    """One rule as the API answers it: the document, its service path, its version and
    when it was last changed."""
    body: dict[str, Any] = dict(kept.document)
    body["servicePath"] = kept.service_path
    body["version"] = kept.version
    body["modified"] = iso8601(kept.modified)
    return body
