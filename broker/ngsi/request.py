"""Reading NGSI v2 requests and answering errors, as Orion does (ngsi-v2.md sections 2 and 5).

The checks every request goes through (:func:`checks`, an aiohttp middleware), in Orion's
order: the Accept header must allow JSON (406); a body must say its length (411), be at most
1 MB (413) and be JSON (or ``text/plain`` where a route takes it, 415). Any SilboError a
handler raises becomes ``{"error", "description"}`` with the status of the one error table
(:func:`broker.errors.mapping_for`); anything else is a logged 500 and the server goes on.
Every answer carries the request's ``Fiware-Correlator`` (a new one if it had none).

Bodies are read by :func:`read_body` only, within limits a client cannot stretch: the whole
body within ``BODY_TIMEOUT`` seconds (408 RequestTimeout, and the connection is closed), at
most ``MAX_BODY`` bytes once decompressed (413, so a gzip bomb stops at 1 MB), a
``Content-Encoding`` that decodes (400 BadRequest), JSON nested at most ``MAX_DEPTH`` levels
(400 ParseError naming the limit) and text in UTF-8 (400 BadRequest).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import orjson
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from broker.errors import InvalidInput, SilboError, mapping_for
from broker.model.identifiers import (
    DEFAULT_SCOPE,
    DEFAULT_SERVICE_PATH,
    check_scope,
    check_service_path,
    check_tenant,
)
from broker.ngsi.errors import (
    ContentLengthRequired,
    MethodNotAllowed,
    NotAcceptable,
    ParseError,
    RequestEntityTooLarge,
    RequestTimeout,
    UnsupportedMediaType,
)

__all__ = [
    "BODY_TIMEOUT",
    "CORRELATOR",
    "MAX_BODY",
    "MAX_DEPTH",
    "READ_TIMEOUT",
    "auth_token_of",
    "checks",
    "correlator_of",
    "error_response",
    "options_of",
    "read_body",
    "read_json",
    "read_text",
    "scope_of",
    "service_path_of",
    "tenant_of",
]

_log = logging.getLogger(__name__)

MAX_BODY = 1 << 20  # Orion's 1 MB
MAX_DEPTH = 64  # levels of JSON nesting in a body (Python's own parser gives up near 1,000)
BODY_TIMEOUT = 30.0  # seconds a client gets to send a whole body (by default)
READ_TIMEOUT = web.AppKey("read_timeout", float)  # the front's own, in its app
CORRELATOR = "Fiware-Correlator"
AUTH_TOKEN = "X-Auth-Token"
_TOKEN = re.compile(r"[\x20-\x7e]{1,4096}")  # what a token forwarded as a header may be
KNOWN_OPTIONS = frozenset(
    {
        "keyValues",
        "values",
        "unique",
        "upsert",
        "append",
        "forcedUpdate",
        "overrideMetadata",
        "flowControl",
        "count",
        "skipForwarding",
        "skipInitialNotification",
    }
)
_CLOSE = "close"  # request key: answer, then close the connection
_BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def dumps(value: Any) -> str:
    """``value`` as JSON text: orjson, or the json module for what orjson refuses (integers
    past 64 bits, non-string keys)."""
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value)


def loads(data: bytes) -> Any:
    """Parsed JSON: orjson, or the json module where orjson refuses (NaN, deep nesting) or
    differs (it reads an integer past 64 bits as a float), so the answers stay the json
    module's."""
    if _LONG_DIGITS.search(data) is None:
        with contextlib.suppress(orjson.JSONDecodeError):
            return orjson.loads(data)
    return json.loads(data)


# 19 digits in a row: perhaps an integer past 64 bits
_LONG_DIGITS = re.compile(rb"\d{19}")


def json_response(
    body: Any, *, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    """A JSON answer, encoded by :func:`dumps`."""
    return web.json_response(body, status=status, headers=headers, dumps=dumps)


def error_response(exc: SilboError) -> web.Response:
    """The NGSI error answer of ``exc``."""
    mapping = mapping_for(exc)
    body = {"error": mapping.ngsi_error, "description": str(exc)}
    # a refusal the client should retry: after a second (a repair takes well under that)
    headers = {"Retry-After": "1"} if mapping.http_status == 503 else None
    return json_response(body, status=mapping.http_status, headers=headers)


def correlator_of(request: web.Request) -> str:
    """The request's correlator (set by the middleware)."""
    value: str = request["correlator"]
    return value


def auth_token_of(request: web.Request) -> str:
    """The request's ``X-Auth-Token``, which Orion forwards on the notifications its update
    causes; empty without one (or for one that is not printable ASCII of at most 4 KiB:
    tokens are, and anything else could not go out as a header as it came)."""
    token = request.headers.get(AUTH_TOKEN, "").strip()
    return token if _TOKEN.fullmatch(token) else ""


@web.middleware
async def checks(request: web.Request, handler: Handler) -> web.StreamResponse:
    """The checks and the error answers of the module doc."""
    correlator = request.headers.get(CORRELATOR) or str(uuid.uuid1())
    request["correlator"] = correlator
    try:
        _check_accept(request)
        _check_body(request)
        response = await handler(request)
    except SilboError as exc:
        response = error_response(exc)
    except web.HTTPMethodNotAllowed as exc:
        response = error_response(MethodNotAllowed(f"method {request.method} is not allowed"))
        response.headers["Allow"] = ", ".join(sorted(exc.allowed_methods))
    except web.HTTPRequestEntityTooLarge:
        response = error_response(RequestEntityTooLarge(f"payload is over {MAX_BODY} bytes"))
    except web.HTTPNotFound:
        response = error_response(
            InvalidInput("Service not found. Check your URL as probably it is wrong.")
        )
    except web.HTTPException as exc:
        response = json_response(
            {"error": exc.reason.replace(" ", ""), "description": exc.text or exc.reason},
            status=exc.status,
        )
    except Exception as exc:  # a bug costs one request, never the server
        _log.exception("%s %s failed", request.method, request.path)
        response = json_response(
            {"error": "InternalServerError", "description": f"the request failed: {exc!r}"},
            status=500,
        )
    response.headers[CORRELATOR] = correlator
    if request.get(_CLOSE):
        response.force_close()
    return response


def _check_accept(request: web.Request) -> None:
    accept = request.headers.get("Accept")
    if not accept:
        return
    types = {part.split(";")[0].strip().lower() for part in accept.split(",")}
    if types & {"application/json", "application/*", "*/*", "text/plain", "text/*"}:
        return
    raise NotAcceptable("no acceptable mime-type in accept header")


def _check_body(request: web.Request) -> None:
    if request.method not in _BODY_METHODS:
        return
    length = request.content_length
    if length is None:
        raise ContentLengthRequired("Zero/No Content-Length in PUT/POST/PATCH request")
    if length > MAX_BODY:
        raise RequestEntityTooLarge(f"payload size: {length}, max size supported: {MAX_BODY}")
    if length == 0:
        return
    content_type = request.content_type.lower()
    if content_type == "application/json":
        return
    if content_type == "text/plain" and request.path.rstrip("/").endswith("/value"):
        return  # PUT .../attrs/{a}/value takes text too
    raise UnsupportedMediaType(f"not supported content type: {request.content_type}")


async def read_body(request: web.Request) -> bytes:
    """The request body, decoded from its Content-Encoding, within the module doc's limits
    (the app's ``READ_TIMEOUT``, BODY_TIMEOUT if it has none)."""
    timeout = request.app.get(READ_TIMEOUT, BODY_TIMEOUT)
    try:
        return await asyncio.wait_for(request.read(), timeout)
    except TimeoutError:
        request[_CLOSE] = True  # what is left of the body must never be read as a request
        raise RequestTimeout(f"the body did not arrive within {timeout:g} s") from None
    except web.HTTPRequestEntityTooLarge:
        raise RequestEntityTooLarge(f"the body is over {MAX_BODY} bytes once decoded") from None
    except (web.HTTPBadRequest, web.RequestPayloadError, HttpProcessingError) as exc:
        request[_CLOSE] = True
        encoding = request.headers.get("Content-Encoding", "identity")
        raise InvalidInput(
            f"the body could not be read as Content-Encoding {encoding}: {exc}"
        ) from None


async def read_text(request: web.Request) -> str:
    """A text/plain body (BadRequest unless it is UTF-8)."""
    data = await read_body(request)
    try:
        return data.decode()
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"the text body is not valid UTF-8 (byte {exc.start})") from None


async def read_json(request: web.Request, *, required: bool = True) -> Any:
    """The JSON body (ParseError if it is not JSON or nested too deep; BadRequest if empty
    and required)."""
    data = await read_body(request)
    if not data.strip():
        if required:
            raise InvalidInput("empty payload")
        return None
    try:
        document = loads(data)
    except (ValueError, UnicodeDecodeError):
        raise ParseError("Errors found in incoming JSON buffer") from None
    except RecursionError:
        document = None
    else:
        # Only a body with enough brackets can be too deep: counting them is cheap.
        if data.count(b"[") + data.count(b"{") <= MAX_DEPTH or depth(document) <= MAX_DEPTH:
            return document
    raise ParseError(f"the JSON body is nested deeper than {MAX_DEPTH} levels")


def depth(document: Any) -> int:
    """How deeply ``document`` (parsed JSON) nests arrays and objects (a scalar: 0)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(document, 0)]
    while stack:
        value, level = stack.pop()
        if isinstance(value, dict):
            value = value.values()
        elif not isinstance(value, list):
            continue
        level += 1
        deepest = max(deepest, level)
        stack.extend((child, level) for child in value)
    return deepest


def options_of(request: web.Request) -> frozenset[str]:
    """The ``options`` URL parameter (comma-separated); BadRequest for an unknown one."""
    given = {o.strip() for o in request.query.get("options", "").split(",") if o.strip()}
    unknown = given - KNOWN_OPTIONS
    if unknown:
        raise InvalidInput(f"Invalid value for URL parameter /options/: {sorted(unknown)[0]}")
    return frozenset(given)


def tenant_of(request: web.Request) -> str:
    """The tenant of ``Fiware-Service`` (lowercased; empty or absent: the default tenant)."""
    return check_tenant(request.headers.get("Fiware-Service", "").strip().lower())


def service_path_of(request: web.Request) -> str:
    """The one service path an update takes (``/`` when absent)."""
    text = request.headers.get("Fiware-ServicePath", "").strip() or DEFAULT_SERVICE_PATH
    if "," in text:
        raise InvalidInput("an update takes one service path, not a list")
    if text != "/" and text.endswith("/"):
        text = text[:-1]
    return check_service_path(text)


def scope_of(request: web.Request) -> str | None:
    """A subscription's scope from ``Fiware-ServicePath`` (None when the header is absent)."""
    text = request.headers.get("Fiware-ServicePath", "").strip()
    if not text:
        return None
    if "," in text:
        raise InvalidInput("a subscription takes one service path, not a list")
    return check_scope(text) if text != DEFAULT_SCOPE else DEFAULT_SCOPE
