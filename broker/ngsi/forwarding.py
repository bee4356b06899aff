"""Forwarding to context providers: the queries and updates of registered attributes
(:mod:`broker.ngsi.registrations`) go to their provider, as Orion's context providers do
(Orion's ``context_providers.md`` and ``postQueryContext.cpp``).

Queries (``GET /v2/entities`` and its ``/{id}``, ``/attrs``, ``/attrs/{a}``,
``/attrs/{a}/value`` routes, ``POST /v2/op/query``): for each entity of the page, the
attributes the query wants that an active registration of the request's tenant and service
path provides are asked of its provider (one request per registration, every entity of the
page it provides in it), and the provider's attributes replace the local ones in the answer
(nothing is stored). A single-entity query of an entity the store does not hold asks the
providers of that id, and answers what they know of it. A provider that fails (refused,
timed out after ``FORWARD_TIMEOUT`` s, not 2xx, an answer that is not one) is left out: the
answer is what the others and the store have (404 if nobody has the entity). A list does not
gain entities that only a provider holds (Silbo's limit: the page and its count are the
store's). ``options=skipForwarding`` asks nobody.

Updates (``POST``/``PATCH``/``PUT .../attrs``, ``PUT .../attrs/{a}`` and ``/value``, ``POST
/v2/op/update``, but creations and deletions): the registered attributes go to their provider
instead of the store, the rest to the store. The answer is 204 if everything succeeded; 404
NotFound if only forwarded attributes were sent and every provider failed; 422 PartialUpdate
if some part failed and another succeeded. ``replace`` is forwarded as ``update`` (the
provider holds only the registered attributes).

Requests, by ``POST`` with a JSON body, to the registration's ``provider.http.url`` plus:

- NGSI v2: ``/op/query`` with ``{"entities": [{"id", "type"}], "attrs": [...]}`` (no
  ``attrs``: every attribute), answered by an array of normalized entities; ``/op/update``
  with ``{"actionType", "entities": [normalized entities]}``, answered by any 2xx.
- NGSIv1 (``legacyForwarding``): ``/queryContext`` with ``{"entities": [{"type",
  "isPattern": "false", "id"}], "attributes": [...]}`` and ``/updateContext`` with
  ``{"contextElements": [{"type", "isPattern", "id", "attributes": [{"name", "type",
  "value", "metadatas"}]}], "updateAction": "UPDATE"}`` (``APPEND``, ``APPEND_STRICT``), both
  answered by ``{"contextResponses": [{"contextElement", "statusCode": {"code": "200"}}]}``.

with ``Fiware-Service`` (the tenant) and ``Fiware-ServicePath`` as the request had them,
its ``X-Auth-Token``, and ``Fiware-Correlator: <the request's>; cbfwd=<n>``, as Orion sends.
Each request counts in the registration's ``forwardingInformation``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from broker.model.attribute import default_type
from broker.ngsi.entity import Attributes
from broker.ngsi.registrations import Registration, Registrations
from broker.ngsi.request import auth_token_of, correlator_of, loads, tenant_of
from broker.store.query import EntityQuery, Page
from broker.store.semantics import Document

__all__ = ["FORWARD_TIMEOUT", "Forwarded", "Forwarder"]

_log = logging.getLogger(__name__)

FORWARD_TIMEOUT = 5.0  # seconds a provider may take to answer (Orion's -httpTimeout default)
MAX_ANSWER = 1 << 20  # bytes of a provider's answer read at most
# keys that cannot be attribute names (they hold a NUL): an answer's entity type, and the
# registration of an entity only a provider holds, kept with its attributes meanwhile
_TYPE = "\0type"
_REGISTRATION = "\0registration"
_BUILTINS = frozenset({"dateCreated", "dateModified", "dateExpires", "*"})
_LEGACY_ACTIONS = {"append": "APPEND", "appendStrict": "APPEND_STRICT", "update": "UPDATE"}
_FORWARDED_ACTIONS = {"append": "append", "appendStrict": "appendStrict", "update": "update",
                      "replace": "update"}  # fmt: skip

Named = tuple[str, str | None, Attributes]  # entity id, type (None: any), attributes


@dataclass(slots=True)
class Forwarded:
    """What happened to the forwarded part of an update: requests that succeeded and failed,
    and the first failure's description."""

    succeeded: int = 0
    failed: int = 0
    failure: str = ""

    @property
    def sent(self) -> bool:
        """Whether anything was forwarded."""
        return bool(self.succeeded or self.failed)


def _normalized(attribute: Any) -> dict[str, Any] | None:
    """A provider's attribute as the store keeps one (None if it is not one)."""
    if not isinstance(attribute, dict) or "value" not in attribute:
        return None
    value = attribute["value"]
    kind = attribute.get("type")
    metadata = attribute.get("metadata")
    return {
        "type": kind if isinstance(kind, str) and kind else default_type(value),
        "value": value,
        "metadata": metadata if isinstance(metadata, dict) else {},
    }


def _v2_entities(answer: Any) -> dict[str, dict[str, Any]]:
    """{id: {name: attribute}} of an NGSI v2 ``op/query`` answer (an array of entities)."""
    if not isinstance(answer, list):
        raise ValueError("the provider's op/query answer is not an array")
    out: dict[str, dict[str, Any]] = {}
    for entity in answer:
        if not isinstance(entity, dict) or not isinstance(entity.get("id"), str):
            continue
        attributes = out.setdefault(entity["id"], {})
        for name, body in entity.items():
            normalized = _normalized(body) if name not in ("id", "type") else None
            if normalized is not None:
                attributes[name] = normalized
        if isinstance(entity.get("type"), str):
            attributes.setdefault(_TYPE, {"value": entity["type"]})
    return out


def _legacy_elements(answer: Any) -> list[tuple[dict[str, Any], str]]:
    """(contextElement, status code) of each of an NGSIv1 answer's contextResponses."""
    if not isinstance(answer, dict) or not isinstance(answer.get("contextResponses"), list):
        raise ValueError("the provider's NGSIv1 answer has no contextResponses")
    out = []
    for response in answer["contextResponses"]:
        if not isinstance(response, dict):
            continue
        element = response.get("contextElement")
        status = response.get("statusCode")
        code = str(status.get("code", "")) if isinstance(status, dict) else ""
        out.append((element if isinstance(element, dict) else {}, code))
    return out


def _legacy_entities(answer: Any) -> dict[str, dict[str, Any]]:
    """{id: {name: attribute}} of an NGSIv1 ``queryContext`` answer."""
    out: dict[str, dict[str, Any]] = {}
    for element, code in _legacy_elements(answer):
        if code != "200" or not isinstance(element.get("id"), str):
            continue
        attributes = out.setdefault(element["id"], {})
        for item in element.get("attributes") or []:
            if not isinstance(item, dict) or not isinstance(item.get("name"), str):
                continue
            metadata = {
                m["name"]: {"type": m.get("type", ""), "value": m.get("value")}
                for m in item.get("metadatas") or []
                if isinstance(m, dict) and isinstance(m.get("name"), str)
            }
            body = {"type": item.get("type"), "value": item.get("value"), "metadata": metadata}
            normalized = _normalized(body)
            if normalized is not None:
                attributes[item["name"]] = normalized
        if isinstance(element.get("type"), str) and element["type"]:
            attributes.setdefault(_TYPE, {"value": element["type"]})
    return out


def _legacy_attribute(name: str, attribute: dict[str, Any]) -> dict[str, Any]:
    value = attribute.get("value")
    out: dict[str, Any] = {
        "name": name,
        "type": attribute.get("type") or default_type(value),
        "value": value,
    }
    metadata = attribute.get("metadata") or {}
    if metadata:
        out["metadatas"] = [
            {"name": k, "type": m.get("type") or default_type(m.get("value")),
             "value": m.get("value")}
            for k, m in metadata.items()
        ]  # fmt: skip
    return out


def _v2_attribute(attribute: dict[str, Any]) -> dict[str, Any]:
    value = attribute.get("value")
    out: dict[str, Any] = {"type": attribute.get("type") or default_type(value), "value": value}
    if attribute.get("metadata"):
        out["metadata"] = attribute["metadata"]
    return out


class Forwarder:
    """Sends the forwarded queries and updates (see the module doc)."""

    def __init__(
        self,
        registrations: Callable[[], Registrations | None],
        timeout: float = FORWARD_TIMEOUT,
    ) -> None:
        self._registrations = registrations  # the front's (None: it keeps none)
        self._timeout = timeout
        self._session: aiohttp.ClientSession | None = None
        self._sent = 0  # the cbfwd suffix of the correlators

    async def close(self) -> None:
        """Close the connections to the providers."""
        if self._session is not None:
            await self._session.close()

    # -- queries ----------------------------------------------------------------------------

    async def query(
        self, page: Page, query: EntityQuery, request: web.Request, *, single: bool = False
    ) -> Page:
        """The page with the registered attributes of its entities asked of their providers
        (``single``: a one-entity query, whose entity may be a provider's only)."""
        registrations = self._registrations()
        if registrations is None or not registrations.known or _skipped(request):
            return page
        documents = list(page.documents)
        asks: dict[str, tuple[Registration, list[tuple[int, str, str | None]], set[str]]] = {}
        for index, document in enumerate(documents):
            _plan(registrations, asks, index, document.id, document.type, query)
        missing = single and not documents and len(query.selectors) == 1
        if missing:
            selector = query.selectors[0]
            assert selector.id is not None, "a one-entity query names its id"
            _plan(registrations, asks, -1, selector.id, selector.type, query)
        if not asks:
            return page
        answers = await asyncio.gather(
            *(
                self._ask(registrations, request, r, entities, names)
                for r, entities, names in asks.values()
            )
        )
        found: dict[str, dict[str, Any]] = {}
        for (registration, entities, names), answer in zip(asks.values(), answers, strict=True):
            for index, entity_id, entity_type in entities:
                provided = answer.get(entity_id)
                if provided is None:
                    continue
                wanted = {n: a for n, a in provided.items() if _asked(n, names, registration)}
                if index >= 0:
                    document = documents[index]
                    merged = {**document.attributes, **wanted}
                    documents[index] = dataclasses.replace(document, attributes=merged)
                else:
                    kind = entity_type or registration.type_for(entity_id)
                    kind = kind or str(provided.get(_TYPE, {}).get("value", "Thing"))
                    entry = found.setdefault(entity_id, {_REGISTRATION: registration, _TYPE: kind})
                    entry.update(wanted)
        for entity_id, entry in found.items():
            registration = entry.pop(_REGISTRATION)
            kind = entry.pop(_TYPE)
            documents.append(
                Document(entity_id, kind, registration.service_path, query.tenant, entry, 0.0, 0.0)
            )
        return Page(tuple(documents), page.count + len(found))

    async def _ask(
        self,
        registrations: Registrations,
        request: web.Request,
        registration: Registration,
        entities: list[tuple[int, str, str | None]],
        names: set[str],
    ) -> dict[str, dict[str, Any]]:
        """{id: {name: attribute}} a provider answers ({} if it fails)."""
        seen: dict[str, str | None] = {}
        for _index, entity_id, entity_type in entities:
            seen.setdefault(entity_id, entity_type or registration.type_for(entity_id))
        attrs = sorted(names)
        if registration.legacy:
            body: dict[str, Any] = {
                "entities": [
                    {"type": t or "", "isPattern": "false", "id": i} for i, t in seen.items()
                ],
                "attributes": attrs,
            }
        else:
            body = {"entities": [{"id": i, **({"type": t} if t else {})} for i, t in seen.items()]}
            if attrs:
                body["attrs"] = attrs
        op = "/queryContext" if registration.legacy else "/op/query"
        answer = await self._post(registrations, request, registration, op, body)
        if answer is None:
            return {}
        try:
            return _legacy_entities(answer) if registration.legacy else _v2_entities(answer)
        except ValueError as exc:
            _log.warning("registration %s: %s", registration.id, exc)
            return {}

    # -- updates ----------------------------------------------------------------------------

    async def update(
        self, request: web.Request, action: str, service_path: str, entities: Sequence[Named]
    ) -> tuple[list[Named], Forwarded]:
        """Send the registered attributes of an update's entities to their providers; what
        is left for the store (an entity none of whose attributes are left, but that had
        some, is left out), and what the forwarding did."""
        forwarded = Forwarded()
        registrations = self._registrations()
        if action not in _FORWARDED_ACTIONS or registrations is None or not registrations.known:
            return list(entities), forwarded
        tenant = tenant_of(request)
        sends: dict[str, tuple[Registration, list[tuple[str, str | None, Attributes]]]] = {}
        local: list[Named] = []
        for entity_id, entity_type, attributes in entities:
            providers = registrations.providing(
                "update", tenant, (service_path,), entity_id, entity_type
            )
            kept: Attributes = {}
            parts: dict[str, Attributes] = {}
            for name, attribute in attributes.items():
                owner = next((r for r in providers if not r.attrs or name in r.attrs), None)
                if owner is None:
                    kept[name] = attribute
                    continue
                sends.setdefault(owner.id, (owner, []))
                parts.setdefault(owner.id, {})[name] = attribute
            for registration_id, part in parts.items():
                registration = sends[registration_id][0]
                kind = entity_type or registration.type_for(entity_id)
                sends[registration_id][1].append((entity_id, kind, part))
            if kept or not attributes:
                local.append((entity_id, entity_type, kept))
        if not sends:
            return list(entities), forwarded
        results = await asyncio.gather(
            *(
                self._send(registrations, request, r, _FORWARDED_ACTIONS[action], e)
                for r, e in sends.values()
            )
        )
        for failure in results:
            if failure is None:
                forwarded.succeeded += 1
            else:
                forwarded.failed += 1
                forwarded.failure = forwarded.failure or failure
        return local, forwarded

    async def _send(
        self,
        registrations: Registrations,
        request: web.Request,
        registration: Registration,
        action: str,
        entities: list[tuple[str, str | None, Attributes]],
    ) -> str | None:
        """Send one provider its part of an update: None if it took it, else why not."""
        if registration.legacy:
            body: dict[str, Any] = {
                "contextElements": [
                    {
                        "type": t or "",
                        "isPattern": "false",
                        "id": i,
                        "attributes": [_legacy_attribute(n, a) for n, a in attrs.items()],
                    }
                    for i, t, attrs in entities
                ],
                "updateAction": _LEGACY_ACTIONS[action],
            }
            answer = await self._post(registrations, request, registration, "/updateContext", body)
            if answer is None:
                return f"the context provider {registration.url} did not take the update"
            try:
                codes = [code for _element, code in _legacy_elements(answer)]
            except ValueError as exc:
                return f"the context provider {registration.url} answered: {exc}"
            if not codes or any(code != "200" for code in codes):
                return f"the context provider {registration.url} refused the update ({codes})"
            return None
        body = {
            "actionType": action,
            "entities": [
                {"id": i, **({"type": t} if t else {}),
                 **{n: _v2_attribute(a) for n, a in attrs.items()}}
                for i, t, attrs in entities
            ],
        }  # fmt: skip
        answer = await self._post(
            registrations, request, registration, "/op/update", body, json_answer=False
        )
        if answer is None:
            return f"the context provider {registration.url} did not take the update"
        return None

    # -- plumbing ---------------------------------------------------------------------------

    async def _post(
        self,
        registrations: Registrations,
        request: web.Request,
        registration: Registration,
        op: str,
        body: dict[str, Any],
        *,
        json_answer: bool = True,
    ) -> Any:
        """POST to a provider; its JSON answer (True if ``json_answer`` is off), None if it
        failed (counted either way)."""
        self._sent += 1
        headers = {
            "Content-Type": "application/json",
            "Accept": "application/json",
            "Fiware-Correlator": f"{correlator_of(request)}; cbfwd={self._sent}",
        }
        tenant = tenant_of(request)
        if tenant:
            headers["Fiware-Service"] = tenant
        path = request.headers.get("Fiware-ServicePath", "").strip()
        if path:
            headers["Fiware-ServicePath"] = path
        token = auth_token_of(request)
        if token:
            headers["X-Auth-Token"] = token
        url = registration.url + op
        answer: Any = None
        try:
            async with self._client().post(url, json=body, headers=headers) as got:
                data = await got.content.read(MAX_ANSWER + 1)
                if not 200 <= got.status < 300:
                    raise ValueError(f"answered {got.status}")
                if len(data) > MAX_ANSWER:
                    raise ValueError(f"answered over {MAX_ANSWER} bytes")
                answer = loads(data) if json_answer else True
        except (aiohttp.ClientError, TimeoutError, ValueError, UnicodeDecodeError) as exc:
            _log.info("forwarding to %s (registration %s) failed: %r", url, registration.id, exc)
            registrations.counted(registration.id, succeeded=False)
            return None
        registrations.counted(registration.id, succeeded=True)
        return answer

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self._timeout)
            )
        return self._session


def _plan(
    registrations: Registrations,
    asks: dict[str, tuple[Registration, list[tuple[int, str, str | None]], set[str]]],
    index: int,
    entity_id: str,
    entity_type: str | None,
    query: EntityQuery,
) -> None:
    """Add to ``asks`` what to ask which provider of one entity."""
    wanted = None if query.attrs is None or "*" in query.attrs else set(query.attrs)
    claimed: set[str] = set()
    for registration in registrations.providing(
        "query", query.tenant, query.scopes, entity_id, entity_type
    ):
        provided = set(registration.attrs)
        if not provided:  # every attribute: what is wanted and not claimed yet
            names = set() if wanted is None else wanted - _BUILTINS - claimed
            if wanted is not None and not names:
                continue
        else:
            names = provided - claimed if wanted is None else (provided & wanted) - claimed
            if not names:
                continue
        _registration, entities, asked = asks.setdefault(registration.id, (registration, [], set()))
        entities.append((index, entity_id, entity_type))
        asked.update(names)
        claimed.update(names)
        if not provided:
            return  # one provider of every attribute answers for the rest


def _asked(name: str, names: set[str], registration: Registration) -> bool:
    """Whether a provider's attribute is one it was asked (and registered) for."""
    if name.startswith("\0"):
        return False
    if registration.attrs and name not in registration.attrs:
        return False
    return not names or name in names


def _skipped(request: web.Request) -> bool:
    options = request.query.get("options", "")
    return "skipForwarding" in {o.strip() for o in options.split(",")}
