"""STH-Comet's API on the front: an attribute's history, raw or aggregated (docs/history.md).

Routes (STH-Comet 2.x, ``lib/server/sthServer.js``), each also with one trailing '/':

- ``GET /STH/v1/contextEntities/type/{type}/id/{id}/attributes/{attr}``: the NGSIv1
  ``contextResponses`` wrapper around ``values``;
- ``GET /STH/v2/entities/{id}/attrs/{attr}?type=``: ``{"type": "StructuredValue", "value"}``.

``Fiware-Service`` is the tenant and ``Fiware-ServicePath`` the one service path (``/``
when absent), as for the NGSI v2 routes. The query is validated as STH's (joi) schema does,
in its order: ``lastN``, ``hLimit``, ``hOffset`` integers from 0; ``aggrMethod`` one of
``max min sum sum2 occur`` (and Silbo's ``all``); ``aggrPeriod`` one of ``month day hour
minute second``; ``dateFrom``, ``dateTo`` dates (ISO 8601, or epoch ms); ``filetype`` text;
``count`` a boolean; ``type`` (v2, required); nothing else. Then STH's handler
(``sthGetDataHandler``): raw rows for ``lastN``, or ``hLimit`` with ``hOffset``, or
``filetype=csv`` (``hLimit <= lastN <= 100``); else aggregated for ``aggrMethod`` with
``aggrPeriod``; else 400. Errors are STH's: v1 hapi's ``{"statusCode": 400, "error": "Bad
Request", "message"}`` (a schema failure says only "Invalid request query input"), v2
``{"error": "BadRequest", "description"}`` with joi's message.

Answers (``sthDatabase.js``, STH's default data model, collection per entity): raw
``values`` are ``{recvTime, attrType, attrValue}`` oldest first (``count=true`` adds
``Fiware-Total-Count``; ``filetype=csv`` answers CSV, ``attrName,attrType,attrValue,
recvTime``); aggregated ``values`` are one document per origin, ``{"_id": {attrName, origin,
resolution}, "points": [{offset, samples, <aggrMethod>}]}``, points with samples only
(STH's ``filterOutEmpty``). No data is 200 with empty ``values``.
"""

from __future__ import annotations

import csv
import io
import math
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final

from aiohttp import web

from broker.model.attribute import parse_iso8601
from broker.ngsi.request import dumps, json_response, service_path_of, tenant_of
from broker.store.client import EntityStore
from broker.store.entities import partition_of
from broker.store.history_fold import Level, Slot, offset, origin
from broker.store.history_query import HistoryQuery
from broker.store.semantics import iso8601
from broker.store.wire import pack, unpack

__all__ = ["MAX_PAGE_SIZE", "History"]

MAX_PAGE_SIZE: Final = 100  # STH's default maxPageSize
TOTAL_COUNT: Final = "Fiware-Total-Count"
METHODS: Final = ("max", "min", "sum", "sum2", "occur")
SILBO_METHODS: Final = (*METHODS, "all")  # all: every aggregate a slot holds
PERIODS: Final = tuple(level.value for level in reversed(Level))  # month ... second
_NUMBERS: Final = ("lastN", "hLimit", "hOffset")
# STH's schema, in its order (v2 adds ``type``)
_PARAMETERS: Final = (
    *_NUMBERS,
    "aggrMethod",
    "aggrPeriod",
    "dateFrom",
    "dateTo",
    "filetype",
    "count",
)
_KEYS: Final = [*_NUMBERS, "filetype", "aggrMethod", "aggrPeriod", "count"]
_PAGE: Final = "hLimit <= lastN <= config.maxPageSize"
_COMBINATION: Final = (
    "A combination of the following query params is required: lastN, hLimit and hOffset, "
    "filetype, or aggrMethod and aggrPeriod"
)
_SCHEMA_V1: Final = "Invalid request query input"
_NONE: Final = object()  # an aggregate a slot does not hold
_NUMBER: Final = re.compile(r"\s*[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s*")
_V1: Final = "/STH/v1/contextEntities/type/{type:[^/]+}/id/{id:[^/]+}/attributes/{attr:[^/]+}"
_V2: Final = "/STH/v2/entities/{id:[^/]+}/attrs/{attr:[^/]+}"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class _Refused(Exception):
    """A request STH answers 400: ``schema`` if its joi schema refuses it (``message``
    being joi's), else its handler's message."""

    def __init__(self, message: str, *, schema: bool = False) -> None:
        super().__init__(message)
        self.schema = schema


class History:
    """STH-Comet's read routes over a front's :class:`EntityStore` (``store`` gives it at
    each request: a front's may be set after its routes)."""

    def __init__(self, store: Callable[[], EntityStore]) -> None:
        self._store = store

    def routes(self) -> list[web.RouteDef]:
        """The two routes, each also with one trailing '/' (GET without HEAD, as the others)."""
        table: list[tuple[str, Handler]] = [(_V1, self.get_v1), (_V2, self.get_v2)]
        return [
            web.route("GET", route, handler, allow_head=False)
            for path, handler in table
            for route in (path, path + "/")
        ]

    async def get_v1(self, request: web.Request) -> web.StreamResponse:
        """``GET /STH/v1/contextEntities/type/{type}/id/{id}/attributes/{attr}``."""
        info = request.match_info
        try:
            given = _validated(request, version=1)
            return await self._answer(request, given, info["type"], version=1)
        except _Refused as exc:
            message = _SCHEMA_V1 if exc.schema else str(exc)
            body: dict[str, Any] = {"statusCode": 400, "error": "Bad Request", "message": message}
            if not exc.schema:
                body["validation"] = {"source": "query", "keys": list(_KEYS)}
            return json_response(body, status=400)

    async def get_v2(self, request: web.Request) -> web.StreamResponse:
        """``GET /STH/v2/entities/{id}/attrs/{attr}?type=``."""
        try:
            given = _validated(request, version=2)
            return await self._answer(request, given, given["type"], version=2)
        except _Refused as exc:
            return json_response({"error": "BadRequest", "description": str(exc)}, status=400)

    async def _answer(
        self, request: web.Request, given: dict[str, Any], entity_type: str, version: int
    ) -> web.StreamResponse:
        """What STH's handler answers to a valid query (module doc)."""
        info = request.match_info
        entity_id, attribute = info["id"], info["attr"]
        last_n, limit, skip = given.get("lastN"), given.get("hLimit"), given.get("hOffset")
        filetype = str(given.get("filetype", "")).lower()
        raw = last_n is not None or (limit is not None and skip is not None) or filetype == "csv"
        method, period = given.get("aggrMethod"), given.get("aggrPeriod")
        if raw:
            if (
                (last_n and last_n > MAX_PAGE_SIZE)
                or (limit and limit > MAX_PAGE_SIZE)
                or (limit and last_n and limit > last_n)
            ):
                raise _Refused(_PAGE)
        elif not (method and period):
            raise _Refused(_COMBINATION)
        query = HistoryQuery(
            tenant_of(request),
            service_path_of(request),
            entity_id,
            entity_type,
            attribute,
            level=None if raw else Level(period),
            last_n=last_n,
            limit=limit or 0,
            offset=skip or 0,
            date_from=given.get("dateFrom"),
            date_to=given.get("dateTo"),
            count=bool(given.get("count")) and raw,
        )
        answer = await self._ask(query)
        if raw:
            rows, total = answer
            headers = {TOTAL_COUNT: str(total)} if total is not None else None
            if filetype == "csv":
                return _csv(attribute, rows, headers)
            values = [
                {"recvTime": _date(t / 1_000_000), "attrType": kind, "attrValue": value}
                for t, kind, value in rows
            ]
            payload = _payload(version, entity_id, entity_type, attribute, values)
            return json_response(payload, headers=headers)
        documents = _documents(attribute, Level(period), str(method), answer)
        return json_response(_payload(version, entity_id, entity_type, attribute, documents))

    async def _ask(self, query: HistoryQuery) -> Any:
        """The store's answer (empty for identifiers no key can hold)."""
        names = (query.entity_id, query.entity_type, query.attribute)
        if any("\x00" in name for name in names):
            return [[], 0 if query.count else None] if query.level is None else []
        body = pack(query.to_wire())
        return unpack(
            await self._store().history(partition_of(query.tenant, query.entity_id), body)
        )


def _validated(request: web.Request, version: int) -> dict[str, Any]:
    """The query's parameters as STH's schema takes them (module doc); _Refused if not."""
    query = request.query
    allowed = [*_PARAMETERS, "type"] if version == 2 else list(_PARAMETERS)
    given: dict[str, Any] = {}
    for name in allowed:
        values = query.getall(name, [])
        if not values:
            continue
        text = values[0] if len(values) == 1 else None  # repeated: an array, for joi
        if name in _NUMBERS:
            given[name] = _whole(name, text)
        elif name in ("aggrMethod", "aggrPeriod"):
            valid = SILBO_METHODS if name == "aggrMethod" else PERIODS
            if text not in valid:
                raise _Refused(f'"{name}" must be one of [{", ".join(valid)}]', schema=True)
            given[name] = text
        elif name in ("dateFrom", "dateTo"):
            given[name] = _ms(name, text)
        elif name == "count":
            if text is None or text.lower() not in ("true", "false"):
                raise _Refused('"count" must be a boolean', schema=True)
            given[name] = text.lower() == "true"
        elif text is None:
            raise _Refused(f'"{name}" must be a string', schema=True)
        elif not text:
            raise _Refused(f'"{name}" is not allowed to be empty', schema=True)
        else:
            given[name] = text
    if version == 2 and "type" not in given:
        raise _Refused('"type" is required', schema=True)
    for name in query:
        if name not in allowed:
            raise _Refused(f'"{name}" is not allowed', schema=True)
    return given


def _whole(name: str, text: str | None) -> int:
    """``lastN`` / ``hLimit`` / ``hOffset``: joi's number().integer().greater(-1)."""
    if text is None or not _NUMBER.fullmatch(text):
        raise _Refused(f'"{name}" must be a number', schema=True)
    number = float(text)
    if not math.isfinite(number):
        raise _Refused(f'"{name}" must be a number', schema=True)
    if not number.is_integer():
        raise _Refused(f'"{name}" must be an integer', schema=True)
    if number <= -1:
        raise _Refused(f'"{name}" must be greater than -1', schema=True)
    if number > 2**53:
        raise _Refused(f'"{name}" must be a safe number', schema=True)
    return int(number)


def _ms(name: str, text: str | None) -> int:
    """A date as joi's date() takes it: epoch ms, or an ISO 8601 date."""
    if text is None:
        raise _Refused(f'"{name}" must be a valid date', schema=True)
    if _NUMBER.fullmatch(text):
        number = float(text)
        if math.isfinite(number) and abs(number) <= 8.64e15:  # JavaScript's range of dates
            return math.floor(number)
    seconds = parse_iso8601(text.strip())
    if seconds is None:
        raise _Refused(f'"{name}" must be a valid date', schema=True)
    return math.floor(seconds * 1000)


def _payload(
    version: int, entity_id: str, entity_type: str, attribute: str, values: list[Any]
) -> dict[str, Any]:
    """STH's wrapper of an answer (``sthServerUtils.getNGSIPayload``)."""
    if version == 2:
        return {"type": "StructuredValue", "value": values}
    element = {
        "attributes": [{"name": attribute, "values": values}],
        "id": entity_id,
        "isPattern": False,
        "type": entity_type,
    }
    status = {"code": "200", "reasonPhrase": "OK"}
    return {"contextResponses": [{"contextElement": element, "statusCode": status}]}


def _documents(attribute: str, level: Level, method: str, slots: list[Any]) -> list[Any]:
    """Slots as STH's aggregated documents: one per origin, its points in offset order."""
    documents: list[dict[str, Any]] = []
    for start, data in slots:
        slot = Slot.from_wire(data)
        base = origin(level, start)
        key = {"attrName": attribute, "origin": _date(base), "resolution": level.value}
        if not documents or documents[-1]["_id"] != key:
            documents.append({"_id": key, "points": []})
        point: dict[str, Any] = {"offset": offset(level, start), "samples": slot.samples}
        wanted = ("sum", "sum2", "min", "max", "occur") if method == "all" else (method,)
        for name in wanted:
            value = _aggregate(slot, name)
            if value is not _NONE:
                point[name] = value
        documents[-1]["points"].append(point)
    return documents


def _aggregate(slot: Slot, name: str) -> Any:
    """One aggregate of a slot as STH renders it (_NONE: the slot has none): a whole number
    without its ``.0``, past a double's range ``null`` (as JavaScript's JSON)."""
    if name == "occur":
        if not slot.occur:
            return _NONE
        return {_escaped(text): count for text, count in slot.occur.items()}
    value: float | None = getattr(slot, name)
    if value is None:
        return _NONE
    if not math.isfinite(value):
        return None
    return int(value) if value.is_integer() and abs(value) < 2**53 else value


def _escaped(text: str) -> str:
    """A text as a key of STH's ``occur`` (MongoDB's keys take no ``$`` or ``.``)."""
    return text.replace("$", "\uff04").replace(".", "\uff0e")


def _date(seconds: float) -> str:
    return iso8601(seconds)


def _csv(attribute: str, rows: list[Any], headers: dict[str, str] | None) -> web.Response:
    """Raw rows as STH's CSV file (``attrName,attrType,attrValue,recvTime``)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["attrName", "attrType", "attrValue", "recvTime"])
    for t, kind, value in rows:
        text = value if isinstance(value, str) else dumps(value)
        writer.writerow([attribute, kind, text, _date(t / 1_000_000)])
    name = f"{attribute}-{int(time.time() * 1000)}.csv"
    disposition = {"Content-Disposition": f"attachment; filename*= utf-8''{_rfc5987(name)}"}
    return web.Response(
        text=out.getvalue(), content_type="text/csv", headers={**(headers or {}), **disposition}
    )


def _rfc5987(text: str) -> str:
    """A file name as an RFC 5987 value (what STH's ``rfc5987-value-chars`` encodes)."""
    keep = re.compile(r"[A-Za-z0-9!#$&+\-.^_`|~]")
    return "".join(
        c if keep.fullmatch(c) else "".join(f"%{b:02X}" for b in c.encode()) for c in text
    )
