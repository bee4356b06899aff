"""The errors only the HTTP front raises, added to the one table of :mod:`broker.errors`.

Each carries Orion's error name and status code (ngsi-v2.md section 5)::

    SilboError
    ├── InvalidInput
    │   └── ParseError              the body is not JSON (400 ParseError)
    ├── ContentLengthRequired       a body without Content-Length (411)
    ├── RequestEntityTooLarge       a body over 1 MB (413)
    ├── RequestTimeout              a body that did not arrive in time (408)
    ├── UnsupportedMediaType        a body that is neither JSON nor, where allowed, text (415)
    ├── NotAcceptable               an Accept header that excludes JSON (406)
    ├── MethodNotAllowed            a known path with the wrong method (405 MethodNotAlowed)
    ├── TooManyResults              an id without type names several entities (409)
    └── NotServed                   an operation Silbo does not serve (501 NotImplemented)

Unprocessable (422) and PartialUpdate (422), which the context store raises too, are defined
in :mod:`broker.errors` and re-exported here.
"""

from __future__ import annotations

from broker.errors import (
    ErrorMapping,
    InvalidInput,
    PartialUpdate,
    SilboError,
    Unprocessable,
    register_mapping,
)

__all__ = [
    "ContentLengthRequired",
    "MethodNotAllowed",
    "NotAcceptable",
    "NotServed",
    "ParseError",
    "PartialUpdate",
    "RequestEntityTooLarge",
    "RequestTimeout",
    "TooManyResults",
    "Unprocessable",
    "UnsupportedMediaType",
]


class ParseError(InvalidInput):
    """The request body is not valid JSON."""


class ContentLengthRequired(SilboError):
    """A request with a body did not say its length."""


class RequestEntityTooLarge(SilboError):
    """A request body is larger than the front accepts."""


class RequestTimeout(SilboError):
    """A request body did not arrive within the front's read timeout."""


class UnsupportedMediaType(SilboError):
    """A request body's Content-Type is not one the route accepts."""


class NotAcceptable(SilboError):
    """The Accept header allows no type the front answers with."""


class MethodNotAllowed(SilboError):
    """The path exists, not with this method."""


class TooManyResults(SilboError):
    """An entity id given without a type names several entities."""


class NotServed(SilboError):
    """An NGSI v2 operation Silbo does not serve (it is a broker, not a context store)."""


register_mapping(ParseError, ErrorMapping("INVALID_ARGUMENT", 400, "ParseError"))
register_mapping(
    ContentLengthRequired, ErrorMapping("INVALID_ARGUMENT", 411, "ContentLengthRequired")
)
register_mapping(
    RequestEntityTooLarge, ErrorMapping("RESOURCE_EXHAUSTED", 413, "RequestEntityTooLarge")
)
register_mapping(RequestTimeout, ErrorMapping("DEADLINE_EXCEEDED", 408, "RequestTimeout"))
register_mapping(
    UnsupportedMediaType, ErrorMapping("INVALID_ARGUMENT", 415, "UnsupportedMediaType")
)
register_mapping(NotAcceptable, ErrorMapping("INVALID_ARGUMENT", 406, "NotAcceptable"))
register_mapping(MethodNotAllowed, ErrorMapping("UNIMPLEMENTED", 405, "MethodNotAlowed"))
register_mapping(TooManyResults, ErrorMapping("FAILED_PRECONDITION", 409, "TooManyResults"))
register_mapping(NotServed, ErrorMapping("UNIMPLEMENTED", 501, "NotImplemented"))
