"""The NGSI v2 routes the front serves (ngsi-v2.md sections 2 and 3), and those it refuses.

Writes go to the entity store (broker.store.client: the context store layer, or the front's
own memory without one), which applies Orion's semantics and answers what each did; the
front then publishes the whole entity with its change and answers once it is delivered.
Reads (broker.ngsi.reads) ask the same store, and so does STH-Comet's history API
(broker.ngsi.history). Subscriptions are the broker's own.
Registrations (broker.ngsi.registrations) are kept in ZooKeeper; the attributes they register
are read from and written to their context providers (broker.ngsi.forwarding).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any
from urllib.parse import quote

import aiohttp
from aiohttp import web

from broker.errors import InvalidInput, InvalidUpdate, NotFound, SilboError, Unavailable
from broker.model.attribute import check_value
from broker.model.identifiers import DEFAULT_SCOPE, check_identifier
from broker.model.update import DEFAULT_ENTITY_TYPE
from broker.ngsi.aggregations import AggregationRoutes, has_store_layer
from broker.ngsi.alerts import AlertRoutes
from broker.ngsi.entity import (
    Attributes,
    check_text,
    parse_attribute,
    parse_attributes,
    parse_entity,
    parse_text_value,
)
from broker.ngsi.errors import NotServed, PartialUpdate
from broker.ngsi.forwarding import Forwarded, Forwarder
from broker.ngsi.front import ORION_VERSION, NgsiFront
from broker.ngsi.history import History
from broker.ngsi.reads import Reads
from broker.ngsi.registrations import Registrations
from broker.ngsi.request import (
    auth_token_of,
    correlator_of,
    json_response,
    options_of,
    read_body,
    read_json,
    read_text,
    scope_of,
    service_path_of,
    tenant_of,
)
from broker.ngsi.subscriptions import merged, parse_document
from broker.store.parameters import parse_entity_get
from broker.store.query import one
from broker.store.reading import StoreReader
from broker.store.semantics import Applied, Mode
from broker.store.wire import Intent

Named = tuple[str, str, str, str | None]  # tenant, service path, entity id, type (None: any)

__all__ = ["CREATED", "HOPS", "LOCAL_ONLY", "add_routes"]

_log = logging.getLogger(__name__)

# headers between fronts (a client that sends them gets what a front gets, nothing more)
LOCAL_ONLY = "Silbo-Local-Only"  # list this front's subscriptions only
CREATED = "Silbo-Created"  # with LOCAL_ONLY: the listed subscriptions' [created, id] pairs
HOPS = "Silbo-Hops"  # how many fronts passed the request on
MAX_HOPS = 2
FORWARD_TIMEOUT = 10.0  # seconds another front may take to answer
_PASSED_ON = frozenset(
    {"fiware-service", "fiware-servicepath", "content-type", "accept", "fiware-correlator"}
)
_ANSWER_HEADERS = frozenset({"Content-Type", "Location", "Fiware-Total-Count"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

MAX_LIMIT = 1000
DEFAULT_LIMIT = 20
_MAX_DIGITS = 18  # of a number in a URL or a header (so it fits in 64 bits)
_ACTIONS = {
    "append": "append",
    "APPEND": "append",
    "appendStrict": "appendStrict",
    "APPEND_STRICT": "appendStrict",
    "update": "update",
    "UPDATE": "update",
    "delete": "delete",
    "DELETE": "delete",
    "replace": "replace",
    "REPLACE": "replace",
}
# Path parameters take any text but '/': aiohttp's default also refuses '{' and '}', which
# identifiers may hold.
_ENTITY = "/v2/entities/{id:[^/]+}"
_ATTR = "/attrs/{attr:[^/]+}"
_SUBSCRIPTION = "/v2/subscriptions/{sid:[^/]+}"
_REGISTRATION = "/v2/registrations/{rid:[^/]+}"
_NO_ENTITY = "The requested entity has not been found. Check type and id"
_FORWARDED_ACTIONS = {  # the batch action of a write's mode, as forwarded to providers
    Mode.APPEND: "append",
    Mode.UPSERT: "append",
    Mode.APPEND_STRICT: "appendStrict",
    Mode.UPDATE: "update",
    Mode.REPLACE: "replace",
    Mode.REPLACE_ATTRIBUTE: "update",
}


def add_routes(app: web.Application, front: NgsiFront) -> None:
    """Add every route (each also with one trailing '/', as Orion strips it)."""
    routes = _Routes(front)
    table: list[tuple[str, str, Handler]] = [
        ("GET", "/version", routes.version),
        ("GET", "/statistics", routes.statistics),
        ("DELETE", "/statistics", routes.reset_statistics),
        ("GET", "/v2", routes.entry_points),
        ("GET", "/v2/openapi.json", routes.openapi),
        ("POST", "/v2/entities", routes.create_entity),
        ("POST", _ENTITY + "/attrs", routes.append_attributes),
        ("PATCH", _ENTITY + "/attrs", routes.update_attributes),
        ("PUT", _ENTITY + "/attrs", routes.replace_attributes),
        ("PUT", _ENTITY + _ATTR, routes.replace_attribute),
        ("PUT", _ENTITY + _ATTR + "/value", routes.replace_value),
        ("DELETE", _ENTITY, routes.delete_entity),
        ("DELETE", _ENTITY + _ATTR, routes.delete_attribute),
        ("POST", "/v2/op/update", routes.batch_update),
        ("POST", "/v2/op/notify", routes.batch_notify),
        ("POST", "/v2/subscriptions", routes.create_subscription),
        ("GET", "/v2/subscriptions", routes.list_subscriptions),
        ("GET", _SUBSCRIPTION, routes.get_subscription),
        ("PATCH", _SUBSCRIPTION, routes.patch_subscription),
        ("DELETE", _SUBSCRIPTION, routes.delete_subscription),
        ("POST", "/v2/registrations", routes.create_registration),
        ("GET", "/v2/registrations", routes.list_registrations),
        ("GET", _REGISTRATION, routes.get_registration),
        ("PATCH", _REGISTRATION, routes.patch_registration),
        ("DELETE", _REGISTRATION, routes.delete_registration),
    ]
    table += AggregationRoutes(
        lambda: front.aggregations, lambda: has_store_layer(front.entities)
    ).routes()
    table += AlertRoutes(lambda: front.alerts, lambda: has_store_layer(front.entities)).routes()
    for method, path, handler in table:
        app.router.add_route(method, path, handler)
        app.router.add_route(method, path + "/", handler)
    app.router.add_routes(Reads(routes.reader, routes.forwarder).routes())
    app.router.add_routes(History(lambda: front.entities).routes())
    app.on_cleanup.append(routes.close)


@functools.cache
def _openapi() -> bytes:
    """The description ``GET /v2/openapi.json`` serves (scripts/gen_openapi_json.py writes it
    from docs/openapi.yaml), read once."""
    return (resources.files("broker.ngsi") / "openapi.json").read_bytes()


def _uptime(seconds: int) -> str:
    """Orion's uptime text: ``0 d, 1 h, 2 m, 3 s``."""
    minutes, s = divmod(seconds, 60)
    hours, m = divmod(minutes, 60)
    days, h = divmod(hours, 24)
    return f"{days} d, {h} h, {m} m, {s} s"


def _location(entity_id: str, entity_type: str) -> str:
    return f"/v2/entities/{quote(entity_id, safe='')}?type={quote(entity_type, safe='')}"


class _Routes:
    def __init__(self, front: NgsiFront) -> None:
        self.front = front
        self.reader = StoreReader(lambda: front.entities)
        self.forwarder = Forwarder(lambda: front.registrations)
        self._session: aiohttp.ClientSession | None = None  # to the other fronts
        self._started = self._measuring = time.monotonic()  # uptime; statistics since

    # -- about -------------------------------------------------------------------------------

    async def version(self, request: web.Request) -> web.Response:
        return json_response(
            {
                "orion": {
                    "version": ORION_VERSION,
                    "uptime": _uptime(int(time.monotonic() - self._started)),
                    "git_hash": "silbo",
                    "compile_time": "",
                    "compiled_by": "silbo",
                    "compiled_in": "",
                    "release_date": "",
                    "machine": "",
                    "doc": "docs/ngsi.md",
                    "libversions": {},
                },
                "silbo": {"front": self.front.address, "connection_point": self.front.port.name},
            }
        )

    async def statistics(self, request: web.Request) -> web.Response:
        """Orion's ``GET /statistics`` without its ``-statCounters`` options: the uptime and
        the seconds since the statistics were last reset."""
        now = time.monotonic()
        return json_response(
            {
                "uptime_in_secs": int(now - self._started),
                "measuring_interval_in_secs": int(now - self._measuring),
            }
        )

    async def reset_statistics(self, request: web.Request) -> web.Response:
        self._measuring = time.monotonic()
        return json_response({"message": "All statistics counter reset"})

    async def entry_points(self, request: web.Request) -> web.Response:
        return json_response(
            {
                "entities_url": "/v2/entities",
                "types_url": "/v2/types",
                "subscriptions_url": "/v2/subscriptions",
                "registrations_url": "/v2/registrations",
            }
        )

    async def openapi(self, request: web.Request) -> web.Response:
        """This API's OpenAPI description (docs/openapi.yaml, shipped as JSON)."""
        return web.Response(body=_openapi(), content_type="application/json")

    # -- updates -----------------------------------------------------------------------------

    def _named(self, request: web.Request, entity_id: str) -> Named:
        """(tenant, service path, id, type or None) of the entity a request's path names."""
        check_identifier(entity_id, "entity id")
        entity_type = request.query.get("type")
        if entity_type is not None:
            check_identifier(entity_type, "entity type")
        return tenant_of(request), service_path_of(request), entity_id, entity_type

    def _intent(
        self,
        request: web.Request,
        named: Named,
        mode: Mode,
        attributes: Attributes,
        *,
        value_only: bool = False,
        upsert: bool = False,
    ) -> Intent:
        options = options_of(request)
        tenant, path, entity_id, entity_type = named
        return Intent(
            mode,
            entity_id,
            entity_type,
            path,
            tenant,
            attributes,
            override_metadata="overrideMetadata" in options,
            forced_update="forcedUpdate" in options,
            value_only=value_only,
            correlator=correlator_of(request),
            upsert=upsert,
        )

    async def _apply(self, request: web.Request, intent: Intent) -> Applied:
        """Apply one write at the store, publish what it did (with the request's
        X-Auth-Token, for its notifications), answer its error if any."""
        (applied,) = await self.front.entities.apply([intent])
        if applied.change is None:
            assert applied.error is not None, "a write without change failed"
            raise applied.error
        await self.front.publish([applied], auth_token_of(request))
        if applied.error is not None:
            raise applied.error
        return applied

    async def create_entity(self, request: web.Request) -> web.Response:
        options = options_of(request)
        body = await read_json(request)
        entity_id, entity_type, attributes = parse_entity(body, key_values="keyValues" in options)
        named = (tenant_of(request), service_path_of(request), entity_id, entity_type)
        upsert = "upsert" in options
        mode = Mode.UPSERT if upsert else Mode.CREATE
        await self._apply(request, self._intent(request, named, mode, attributes))
        status = 204 if upsert else 201
        return web.Response(status=status, headers={"Location": _location(entity_id, entity_type)})

    async def _write(
        self,
        request: web.Request,
        named: Named,
        mode: Mode,
        attributes: Attributes,
        *,
        value_only: bool = False,
    ) -> None:
        """Apply a write of one entity's attributes: the registered ones go to their context
        providers, the others to the store (broker.ngsi.forwarding)."""
        _tenant, path, entity_id, entity_type = named
        local, forwarded = await self.forwarder.update(
            request, _FORWARDED_ACTIONS[mode], path, [(entity_id, entity_type, attributes)]
        )
        if not forwarded.sent:
            await self._apply(
                request, self._intent(request, named, mode, attributes, value_only=value_only)
            )
            return
        failure = None
        if local:
            intent = self._intent(request, named, mode, local[0][2], value_only=value_only)
            try:
                await self._apply(request, intent)
            except SilboError as exc:
                failure = exc
        _answer_forwarded(forwarded, bool(local), failure)

    async def _attributes(self, request: web.Request, mode: Mode) -> web.Response:
        options = options_of(request)
        body = await read_json(request)
        attributes = parse_attributes(body, key_values="keyValues" in options)
        named = self._named(request, request.match_info["id"])
        await self._write(request, named, mode, attributes)
        return web.Response(status=204)

    async def append_attributes(self, request: web.Request) -> web.Response:
        strict = "append" in options_of(request)
        return await self._attributes(request, Mode.APPEND_STRICT if strict else Mode.APPEND)

    async def update_attributes(self, request: web.Request) -> web.Response:
        return await self._attributes(request, Mode.UPDATE)

    async def replace_attributes(self, request: web.Request) -> web.Response:
        return await self._attributes(request, Mode.REPLACE)

    async def replace_attribute(self, request: web.Request) -> web.Response:
        options_of(request)
        body = await read_json(request)
        name = request.match_info["attr"]
        attribute = parse_attribute(name, body, key_values=False)
        named = self._named(request, request.match_info["id"])
        await self._write(request, named, Mode.REPLACE_ATTRIBUTE, {name: attribute})
        return web.Response(status=204)

    async def replace_value(self, request: web.Request) -> web.Response:
        """PUT .../attrs/{a}/value: the value alone (type and metadata kept, at the store)."""
        options_of(request)
        name = request.match_info["attr"]
        check_identifier(name, "attribute name")
        if request.content_type == "text/plain":
            value: Any = parse_text_value(await read_text(request))
        else:
            value = await read_json(request)
            if not isinstance(value, dict | list):
                raise InvalidUpdate(
                    "a JSON attribute value must be an object or an array; send text/plain "
                    "for strings, numbers, booleans and null"
                )
        named = self._named(request, request.match_info["id"])
        check_value(value, f"attribute {name!r} value")
        try:
            check_text(value, f"attribute {name!r} value")
        except InvalidInput:
            if await self._type_of(named, name) != "TextUnrestricted":
                raise
        attribute = {"type": None, "value": value, "metadata": {}}
        await self._write(
            request, named, Mode.REPLACE_ATTRIBUTE, {name: attribute}, value_only=True
        )
        return web.Response(status=204)

    async def _type_of(self, named: Named, name: str) -> str | None:
        """The type of an entity's attribute, if it has that attribute."""
        tenant, path, entity_id, entity_type = named
        query = parse_entity_get(
            entity_id, {"type": entity_type} if entity_type else {}, tenant, path
        )
        document = one(await self.reader.query(query))
        attribute = document.attributes.get(name)
        return None if attribute is None else str(attribute["type"])

    async def delete_entity(self, request: web.Request) -> web.Response:
        named = self._named(request, request.match_info["id"])
        await self._apply(request, self._intent(request, named, Mode.DELETE_ENTITY, {}))
        return web.Response(status=204)

    async def delete_attribute(self, request: web.Request) -> web.Response:
        name = request.match_info["attr"]
        check_identifier(name, "attribute name")
        named = self._named(request, request.match_info["id"])
        await self._apply(request, self._intent(request, named, Mode.DELETE_ATTRIBUTES, {name: {}}))
        return web.Response(status=204)

    async def batch_update(self, request: web.Request) -> web.Response:
        options = options_of(request)
        body = await read_json(request)
        if not isinstance(body, dict) or set(body) - {"actionType", "entities"}:
            raise InvalidUpdate("the payload must be an object of actionType and entities")
        action_type = body.get("actionType")
        action = _ACTIONS.get(action_type) if isinstance(action_type, str) else None
        if action is None:
            raise InvalidUpdate(f"actionType {body.get('actionType')!r} is not known")
        entities = body.get("entities")
        if not isinstance(entities, list) or not entities:
            raise InvalidUpdate("entities must be a non-empty array")
        key_values = "keyValues" in options
        parsed = [_batch_entity(e, key_values) for e in entities]
        await self._batch(request, action, parsed)
        return web.Response(status=204)

    async def batch_notify(self, request: web.Request) -> web.Response:
        options = options_of(request)
        body = await read_json(request)
        if not isinstance(body, dict) or not isinstance(body.get("data"), list):
            raise InvalidUpdate("the payload must be a notification: subscriptionId and data")
        key_values = "keyValues" in options
        parsed = [_batch_entity(e, key_values) for e in body["data"]]
        await self._batch(request, "append", parsed)
        return web.Response(status=200)

    async def _batch(
        self,
        request: web.Request,
        action: str,
        entities: list[tuple[str, str | None, Attributes]],
    ) -> None:
        """Send the registered attributes to their context providers, apply the rest."""
        local, forwarded = await self.forwarder.update(
            request, action, service_path_of(request), entities
        )
        if not forwarded.sent:
            await self._batch_local(request, action, entities)
            return
        failure = None
        if local:
            try:
                await self._batch_local(request, action, local)
            except SilboError as exc:
                failure = exc
        _answer_forwarded(forwarded, bool(local), failure)

    async def _batch_local(
        self,
        request: web.Request,
        action: str,
        entities: list[tuple[str, str | None, Attributes]],
    ) -> None:
        """Apply every entity's write; publish what applied; answer as Orion does."""
        tenant, path = tenant_of(request), service_path_of(request)
        intents = []
        for entity_id, entity_type, attributes in entities:
            named: Named
            if action in ("append", "appendStrict"):
                named = (tenant, path, entity_id, entity_type or DEFAULT_ENTITY_TYPE)
                mode = Mode.UPSERT if action == "append" else Mode.APPEND_STRICT
                intents.append(self._intent(request, named, mode, attributes, upsert=True))
            else:
                mode = {
                    "update": Mode.UPDATE,
                    "replace": Mode.REPLACE,
                    "delete": Mode.DELETE_ATTRIBUTES if attributes else Mode.DELETE_ENTITY,
                }[action]
                named = (tenant, path, entity_id, entity_type)
                intents.append(self._intent(request, named, mode, attributes))
        results = await self.front.entities.apply(intents)
        applied = [r for r in results if r.change is not None]
        errors = [r.error for r in results if r.error is not None]
        await self.front.publish(applied, auth_token_of(request))
        if not errors:
            return
        refused = [e for e in errors if isinstance(e, InvalidInput)]
        if refused:  # the client's fault (a bad dateExpires...): 400, as Orion
            raise refused[0]
        if not applied:  # Orion's update coverage: a failure on attributes wins over 404s
            if all(isinstance(e, NotFound) for e in errors):
                raise NotFound(f"{len(errors)} of {len(entities)} entities: {errors[0]}")
            raise next(e for e in errors if not isinstance(e, NotFound))
        raise PartialUpdate(f"{len(errors)} of {len(entities)} entities failed: {errors[0]}")

    # -- registrations -----------------------------------------------------------------------

    def _registrations(self) -> Registrations:
        registrations = self.front.registrations
        if registrations is None:
            raise NotServed("this front keeps no registrations (it runs without ZooKeeper)")
        return registrations

    async def create_registration(self, request: web.Request) -> web.Response:
        options_of(request)
        registrations = self._registrations()
        body = await read_json(request)
        registration = await registrations.create(
            tenant_of(request), service_path_of(request), body
        )
        return web.Response(
            status=201, headers={"Location": f"/v2/registrations/{registration.id}"}
        )

    async def list_registrations(self, request: web.Request) -> web.Response:
        """The tenant's registrations (of the service path, if the request names one),
        oldest first."""
        options = options_of(request)
        registrations = self._registrations()
        limit = _whole(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
        offset = _whole(request, "offset", 0, 0, None)
        given = request.headers.get("Fiware-ServicePath", "").strip()
        path = service_path_of(request) if given else None
        listed = registrations.listed(tenant_of(request), path)
        now = _now()
        page = [
            r.to_json(await registrations.counts(r), now) for r in listed[offset : offset + limit]
        ]
        headers = {"Fiware-Total-Count": str(len(listed))} if "count" in options else {}
        return json_response(page, headers=headers)

    async def get_registration(self, request: web.Request) -> web.Response:
        registrations = self._registrations()
        found = await registrations.find(tenant_of(request), request.match_info["rid"])
        return json_response(found.to_json(await registrations.counts(found), _now()))

    async def patch_registration(self, request: web.Request) -> web.Response:
        options_of(request)
        registrations = self._registrations()
        found = await registrations.find(tenant_of(request), request.match_info["rid"])
        await registrations.patch(found, await read_json(request))
        return web.Response(status=204)

    async def delete_registration(self, request: web.Request) -> web.Response:
        registrations = self._registrations()
        found = await registrations.find(tenant_of(request), request.match_info["rid"])
        await registrations.delete(found)
        return web.Response(status=204)

    # -- subscriptions -----------------------------------------------------------------------

    async def create_subscription(self, request: web.Request) -> web.Response:
        options_of(request)
        tenant = tenant_of(request)
        scope = scope_of(request) or DEFAULT_SCOPE
        parsed = parse_document(await read_json(request), self.front.allow)
        subscription = await self.front.create(tenant, scope, parsed)
        return web.Response(
            status=201, headers={"Location": f"/v2/subscriptions/{subscription.id}"}
        )

    async def list_subscriptions(self, request: web.Request) -> web.Response:
        """Every front's subscriptions of the tenant, oldest first: this front's, and those
        the other fronts answer for themselves (``LOCAL_ONLY``), merged by creation time."""
        options = options_of(request)
        tenant = tenant_of(request)
        scope = scope_of(request)
        limit = _whole(request, "limit", DEFAULT_LIMIT, 1, MAX_LIMIT)
        offset = _whole(request, "offset", 0, 0, None)
        now = _now()
        mine = self.front.listed(tenant, scope)
        if request.headers.get(LOCAL_ONLY):
            chosen = mine[offset : offset + limit]
            headers = {
                "Fiware-Total-Count": str(len(mine)),
                CREATED: json.dumps([[s.created, s.id] for s in chosen]),
            }
            return json_response([s.to_json(now) for s in chosen], headers=headers)
        rows: list[tuple[float, str, dict[str, Any]]] = [
            (s.created, s.id, s.to_json(now)) for s in mine[: offset + limit]
        ]
        total = len(mine)
        peers = self.front.peers()
        answers = await asyncio.gather(
            *(self._listed_at(address, request, offset + limit) for address in peers.values())
        )
        for count, listed in answers:
            total += count
            rows.extend(listed)
        rows.sort(key=lambda row: (row[0], row[1]))
        page = [row[2] for row in rows[offset : offset + limit]]
        headers = {"Fiware-Total-Count": str(total)} if "count" in options else {}
        return json_response(page, headers=headers)

    async def _listed_at(
        self, address: str, request: web.Request, first: int
    ) -> tuple[int, list[tuple[float, str, dict[str, Any]]]]:
        """Another front's first ``first`` subscriptions of the request's tenant and scope
        (nothing if it does not answer: it is going away, and its subscriptions will be
        adopted)."""
        headers = _passed_on(request)
        headers[LOCAL_ONLY] = "1"
        url = f"http://{address}/v2/subscriptions?limit={min(first, MAX_LIMIT)}"
        rows: list[tuple[float, str, dict[str, Any]]] = []
        count = 0
        try:
            offset = 0
            while offset < first:  # a page holds at most MAX_LIMIT
                async with self._client().get(f"{url}&offset={offset}", headers=headers) as got:
                    if got.status != 200:
                        raise Unavailable(f"the front at {address} answered {got.status}")
                    body = await got.json()
                    created = json.loads(got.headers.get(CREATED, "[]"))
                    count = int(got.headers.get("Fiware-Total-Count", "0"))
                rows.extend((float(c), str(i), b) for (c, i), b in zip(created, body, strict=True))
                offset += MAX_LIMIT
                if offset >= count:
                    break
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            _log.warning("the HTTP front at %s did not list its subscriptions: %r", address, exc)
            return 0, []
        return count, rows[:first]

    async def get_subscription(self, request: web.Request) -> web.StreamResponse:
        found = await self.front.find(tenant_of(request), request.match_info["sid"])
        if isinstance(found, str):
            return await self._forward(request, found)
        return json_response(found.to_json(_now()))

    async def patch_subscription(self, request: web.Request) -> web.StreamResponse:
        options_of(request)
        found = await self.front.find(tenant_of(request), request.match_info["sid"])
        if isinstance(found, str):
            return await self._forward(request, found)
        patch = await read_json(request)
        document = merged(found.parsed.document, patch)
        parsed = parse_document(document, self.front.allow)
        await self.front.update(found, parsed, set(patch))
        return web.Response(status=204)

    async def delete_subscription(self, request: web.Request) -> web.StreamResponse:
        found = await self.front.find(tenant_of(request), request.match_info["sid"])
        if isinstance(found, str):
            return await self._forward(request, found)
        await self.front.delete(found)
        return web.Response(status=204)

    async def _forward(self, request: web.Request, address: str) -> web.StreamResponse:
        """Pass a request on to the front that holds the subscription, and its answer back."""
        hops = request.headers.get(HOPS, "0")
        if not _digits(hops) or int(hops) >= MAX_HOPS:
            raise Unavailable("the subscription is moving between connection points; try again")
        headers = _passed_on(request)
        headers[HOPS] = str(int(hops) + 1)
        url = f"http://{address}{request.path_qs}"
        try:
            async with self._client().request(
                request.method, url, data=await read_body(request), headers=headers
            ) as answer:
                body = await answer.read()
                kept = {k: v for k, v in answer.headers.items() if k in _ANSWER_HEADERS}
                return web.Response(status=answer.status, body=body, headers=kept)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise Unavailable(
                f"the connection point holding the subscription ({address}) did not answer: "
                f"{exc!r}; try again"
            ) from None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=FORWARD_TIMEOUT)
            )
        return self._session

    async def close(self, _app: web.Application) -> None:
        """Close the connections to the other fronts and to the context providers."""
        if self._session is not None:
            await self._session.close()
        await self.forwarder.close()


def _answer_forwarded(forwarded: Forwarded, local: bool, failure: SilboError | None) -> None:
    """Answer a write part of which went to context providers, as Orion does: nothing if
    every part succeeded; NotFound (or the store's error) if none did; PartialUpdate else."""
    if forwarded.failed == 0 and failure is None:
        return
    if forwarded.succeeded == 0 and (not local or failure is not None):
        if failure is not None:
            raise failure
        raise NotFound(f"{_NO_ENTITY} ({forwarded.failure})")
    description = forwarded.failure if forwarded.failed else str(failure)
    raise PartialUpdate(f"some attributes were not updated: {description}")


def _passed_on(request: web.Request) -> dict[str, str]:
    """The request's headers another front needs to answer it the same."""
    return {k: v for k, v in request.headers.items() if k.lower() in _PASSED_ON}


def _batch_entity(body: Any, key_values: bool) -> tuple[str, str | None, Attributes]:
    if not isinstance(body, dict):
        raise InvalidUpdate("each entity must be a JSON object")
    entity_type = body.get("type")
    entity_id, _default_type, attributes = parse_entity(body, key_values=key_values)
    return entity_id, (None if entity_type is None else _default_type), attributes


def _whole(request: web.Request, name: str, default: int, low: int, high: int | None) -> int:
    text = request.query.get(name)
    if text is None:
        return default
    number = int(text) if _digits(text) else -1
    if number < low or (high is not None and number > high):
        bound = f"from {low} to {high}" if high is not None else f"at least {low}"
        raise InvalidInput(f"Bad pagination limit: /{name}/ must be a whole number {bound}")
    return number


def _digits(text: str) -> bool:
    """Whether int() reads ``text`` as a whole number written in ASCII digits (str.isdigit
    also takes digits int() refuses, such as superscripts; int() refuses over 4300 digits)."""
    return text.isascii() and text.isdigit() and len(text) <= _MAX_DIGITS


def _now() -> float:
    import time

    return time.time()
