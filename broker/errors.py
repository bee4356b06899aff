"""Every error Silbo raises, under one root, and how each maps to gRPC and NGSI v2.

The tree::

    SilboError
    ├── InvalidInput            a user sent something malformed (gRPC INVALID_ARGUMENT, HTTP 400)
    │   ├── InvalidIdentifier   an entity id, type, attribute name, tenant or path breaks the rules
    │   ├── InvalidValue        an attribute value is too deep, too long or not JSON
    │   ├── QuerySyntaxError    a q / mq filter does not parse (carries the column)
    │   ├── InvalidRegex        a pattern does not compile, or is too large
    │   ├── InvalidSubscription a subscription is empty or contradictory
    │   ├── InvalidUpdate       a context update is malformed
    │   └── SerializationError  a msgpack payload is corrupt or of an unknown version
    ├── NotFound                the named subscription or entity does not exist (NOT_FOUND, 404)
    ├── AlreadyExists           the id is taken (ALREADY_EXISTS, 422)
    ├── Unprocessable           a well-formed write that cannot apply (FAILED_PRECONDITION,
    │                           422 Unprocessable)
    ├── PartialUpdate           a write that applied only in part (FAILED_PRECONDITION,
    │                           422 PartialUpdate)
    ├── Unavailable             the cluster cannot serve the request now: no access point,
    │                           no acknowledgement in time (UNAVAILABLE, 503); retry later
    ├── AddressInUse            an address Silbo was told to listen on is taken, or not this
    │                           host's (a gRPC, HTTP, metrics or ZooKeeper port)
    └── MissingExtra            a command needs an optional part not installed (silbo[spark], ...)

Foreign exceptions are translated at the boundary where they enter (``raise X(...) from exc``);
the rest of the code only ever sees these. One table maps each class to its gRPC status, HTTP
status and NGSI error (:func:`mapping_for`), and back from a status to a class
(:func:`error_for`, for what arrives in an acknowledgement).

Unprocessable and PartialUpdate are NGSI v2 write outcomes, raised by the HTTP front and the
context store; they live here so the store need not import the front, and are left out of
:data:`__all__` (which the ``broker`` package exports whole): :mod:`broker.ngsi.errors` is
where they are public.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "AddressInUse",
    "AlreadyExists",
    "ErrorMapping",
    "InvalidIdentifier",
    "InvalidInput",
    "InvalidRegex",
    "InvalidSubscription",
    "InvalidUpdate",
    "InvalidValue",
    "MissingExtra",
    "NotFound",
    "QuerySyntaxError",
    "SerializationError",
    "SilboError",
    "Unavailable",
    "error_for",
    "mapping_for",
    "register_mapping",
]


class SilboError(Exception):
    """Root of every error Silbo raises on purpose."""


class InvalidInput(SilboError):
    """The caller sent something malformed; nothing was changed."""


class InvalidIdentifier(InvalidInput):
    """An identifier (entity id or type, attribute name, tenant, service path) is not valid."""


class InvalidValue(InvalidInput):
    """An attribute or metadata value is not acceptable (too deep, too long, not JSON)."""


class QuerySyntaxError(InvalidInput):
    """A q or mq filter expression does not parse.

    ``column`` is 1-based and points at the character where the problem was found.
    """

    def __init__(self, message: str, *, expression: str, column: int) -> None:
        super().__init__(f"{message} (column {column})")
        self.expression = expression
        self.column = column
        self.reason = message


class InvalidRegex(InvalidInput):
    """A regular expression does not compile, or exceeds the size limits."""


class InvalidSubscription(InvalidInput):
    """A subscription is empty, contradictory or otherwise unusable."""


class InvalidUpdate(InvalidInput):
    """A context update is malformed."""


class SerializationError(InvalidInput):
    """A serialized payload is corrupt, truncated or of an unsupported version."""


class NotFound(SilboError):
    """The named subscription or entity does not exist."""


class AlreadyExists(SilboError):
    """An object with that id already exists."""


class Unprocessable(SilboError):
    """The request is well formed but cannot apply (e.g. every attribute already exists)."""


class PartialUpdate(SilboError):
    """The request applied to some of what it named, not all."""


class Unavailable(SilboError):
    """The cluster cannot serve the request now (a peer is missing or did not answer)."""


class AddressInUse(SilboError):
    """An address Silbo was told to listen on is taken, or not one of this host's."""

    def __init__(self, message: str, *, port: int | None = None) -> None:
        super().__init__(message)
        self.port = port


class MissingExtra(SilboError):
    """A command needs an optional part of Silbo that is not installed (an extra)."""


@dataclass(frozen=True, slots=True)
class ErrorMapping:
    """How one error class is reported on each wire."""

    grpc_status: str  # a grpc.StatusCode name; kept as text so the model imports no gRPC
    http_status: int
    ngsi_error: str


# The one table. Subclasses inherit their nearest ancestor's row.
_TABLE: dict[type[SilboError], ErrorMapping] = {
    SilboError: ErrorMapping("INTERNAL", 500, "InternalServerError"),
    InvalidInput: ErrorMapping("INVALID_ARGUMENT", 400, "BadRequest"),
    QuerySyntaxError: ErrorMapping("INVALID_ARGUMENT", 400, "BadRequest"),
    SerializationError: ErrorMapping("INVALID_ARGUMENT", 400, "ParseError"),
    NotFound: ErrorMapping("NOT_FOUND", 404, "NotFound"),
    AlreadyExists: ErrorMapping("ALREADY_EXISTS", 422, "Unprocessable"),
    Unprocessable: ErrorMapping("FAILED_PRECONDITION", 422, "Unprocessable"),
    PartialUpdate: ErrorMapping("FAILED_PRECONDITION", 422, "PartialUpdate"),
    Unavailable: ErrorMapping("UNAVAILABLE", 503, "ServiceUnavailable"),
}


def register_mapping(error_class: type[SilboError], mapping: ErrorMapping) -> None:
    """Add the row of an error class defined outside this module (the table stays one).

    Used by layers whose errors cannot live here because they wrap a foreign library
    (broker.coordination.errors wraps kazoo's).
    """
    _TABLE[error_class] = mapping


def mapping_for(error: BaseException) -> ErrorMapping:
    """Return the wire mapping of ``error`` (unknown exceptions are internal errors)."""
    for cls in type(error).__mro__:
        row = _TABLE.get(cls)
        if row is not None:
            return row
    return _TABLE[SilboError]


# What an acknowledgement's status code stands for, where it arrives (the inverse of the table).
_BY_STATUS: dict[str, type[SilboError]] = {
    "INVALID_ARGUMENT": InvalidInput,
    "NOT_FOUND": NotFound,
    "ALREADY_EXISTS": AlreadyExists,
    "UNAVAILABLE": Unavailable,
}


def error_for(code: str, message: str, default: type[SilboError] = SilboError) -> SilboError:
    """The error a gRPC status name in an acknowledgement stands for (``default`` for the
    others): the one place a status turns back into an exception."""
    return _BY_STATUS.get(code, default)(message)


# -- read errors of the context store (broker.store.query), kept out of __all__ like
# Unprocessable: the NGSI v2 front is where they are public.


class AmbiguousEntity(SilboError):
    """An entity id given without a type names several entities (NGSI 409 TooManyResults)."""


class InvalidGeoQuery(InvalidInput):
    """A geographical query (``georel``, ``geometry``, ``coords``) Orion refuses (400
    BadRequest, "Invalid query: ..."; broker.store.geo)."""


class NotSupportedQuery(SilboError):
    """A query Silbo cannot resolve (NGSI 422 NotSupportedQuery, what Orion's API names for a
    geographical query an implementation cannot resolve). Raised by nothing since Silbo
    serves geographical queries (issue 18, broker.store.geo); kept for the table's sake."""


register_mapping(AmbiguousEntity, ErrorMapping("FAILED_PRECONDITION", 409, "TooManyResults"))
register_mapping(NotSupportedQuery, ErrorMapping("UNIMPLEMENTED", 422, "NotSupportedQuery"))
