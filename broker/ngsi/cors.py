"""Cross-Origin Resource Sharing for the HTTP front, as Orion's ``-corsOrigin`` gives it.

Off by default. With an allowed origin (``--cors-origin ORIGIN``, or ``__ALL`` for any), a
request whose ``Origin`` header is that origin (any origin with ``__ALL``) gets, on every
answer (errors included), ``Access-Control-Allow-Origin`` (the origin, or ``*``) and
``Access-Control-Expose-Headers`` (the headers a browser's script may read: Location,
Fiware-Total-Count, Fiware-Correlator). An ``OPTIONS`` request to a served path is a
preflight, answered 200 without a body with ``Access-Control-Allow-Methods`` (the methods
the path serves, and OPTIONS), ``Access-Control-Allow-Headers`` (Orion's list) and
``Access-Control-Max-Age`` (``--cors-max-age`` seconds, default 86400). A request from
another origin, or without ``Origin``, is answered as without CORS: a browser then refuses
the answer to its script, which is what CORS is for. Without the option, ``OPTIONS`` answers
as before (405 MethodNotAlowed).

:func:`cors` is an aiohttp middleware placed before :func:`broker.ngsi.request.checks`, so
that it sees their answers (errors included) and a preflight never reaches them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.typedefs import Middleware
from aiohttp.web_urldispatcher import MatchInfoError

from broker.ngsi.cors_options import ALL_ORIGINS, DEFAULT_MAX_AGE, cors_problems

__all__ = [
    "ALLOW_HEADERS",
    "ALL_ORIGINS",
    "DEFAULT_MAX_AGE",
    "EXPOSE_HEADERS",
    "cors",
    "cors_problems",
]

# what Orion lets a browser send and read (Orion's lib/rest/HttpHeaders.h)
ALLOW_HEADERS = (
    "Content-Type, Fiware-Service, Fiware-Servicepath, Ngsiv2-AttrsFormat, Fiware-Correlator, "
    "X-Forwarded-For, X-Real-IP, X-Auth-Token"
)
EXPOSE_HEADERS = "Location, Fiware-Total-Count, Fiware-Correlator"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def cors(origin: str, max_age: int = DEFAULT_MAX_AGE) -> Middleware:
    """The CORS middleware for ``origin`` (``__ALL``: any; see the module doc)."""
    allowed = "*" if origin == ALL_ORIGINS else origin

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        given = request.headers.get("Origin")
        if not given or (allowed != "*" and given != allowed):
            return await handler(request)
        methods = _preflight_methods(request)
        if methods is not None:
            response: web.StreamResponse = web.Response(status=200)
            response.headers["Access-Control-Allow-Methods"] = methods
            response.headers["Access-Control-Allow-Headers"] = ALLOW_HEADERS
            response.headers["Access-Control-Max-Age"] = str(max_age)
        else:
            response = await handler(request)
        response.headers["Access-Control-Allow-Origin"] = allowed
        response.headers["Access-Control-Expose-Headers"] = EXPOSE_HEADERS
        return response

    return middleware


def _preflight_methods(request: web.Request) -> str | None:
    """The Access-Control-Allow-Methods of an OPTIONS request to a served path (no route
    takes OPTIONS, so the router found the path and only the method was wrong); None for
    any other request."""
    if request.method != "OPTIONS":
        return None
    match = request.match_info
    if not isinstance(match, MatchInfoError):
        return None
    failure = match.http_exception
    if not isinstance(failure, web.HTTPMethodNotAllowed):
        return None  # a path the front does not serve: its usual answer
    methods = sorted(failure.allowed_methods - {"HEAD"})
    return ", ".join([*methods, "OPTIONS"])
