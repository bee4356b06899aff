"""The rules for names: entity ids and types, attribute names, tenants and service paths.

They follow Orion (ngsi-v2.md section 1 and "Tenancy and service paths"):

- identifiers (entity id and type, attribute and metadata names and types): 1-256 printable
  ASCII characters, no whitespace, none of ``& ? / #`` and none of ``< > " ' = ; ( )``;
- a tenant (Fiware-Service) is ``''`` (the default tenant) or at most 50 characters of
  lowercase letters, digits and ``_``;
- a service path is absolute, at most 10 levels of 1-50 characters of letters, digits or
  ``_``. An update has exactly one path (``/`` by default). A subscription's *scope* is either
  an exact path, or ``/a/b/#`` meaning ``/a/b`` and everything below it (``/#`` is everything).
"""

from __future__ import annotations

import re
import sys

from broker.errors import InvalidIdentifier

__all__ = [
    "DEFAULT_SCOPE",
    "DEFAULT_SERVICE_PATH",
    "MAX_IDENTIFIER_LENGTH",
    "MAX_PATH_LEVELS",
    "MAX_TENANT_LENGTH",
    "check_identifier",
    "check_scope",
    "check_service_path",
    "check_tenant",
    "scope_matches",
    "scopes_covering",
]

MAX_IDENTIFIER_LENGTH = 256
MAX_TENANT_LENGTH = 50
MAX_PATH_LEVELS = 10
MAX_PATH_LEVEL_LENGTH = 50
DEFAULT_SERVICE_PATH = "/"
DEFAULT_SCOPE = "/#"

_IDENTIFIER = re.compile(r"[\x21-\x7e]{1,256}")
_FORBIDDEN = frozenset("&?/#<>\"'=;()")
_TENANT = re.compile(r"[a-z0-9_]{1,50}")
_LEVEL = re.compile(r"[A-Za-z0-9_]{1,50}")


_VALID: dict[str, str] = {}  # identifiers found valid (interned): they repeat a lot
_VALID_LIMIT = 1 << 16


def check_identifier(value: object, what: str) -> str:
    """Return ``value`` (interned) if it is a valid identifier, else raise InvalidIdentifier.

    Texts found valid are remembered (at most :data:`_VALID_LIMIT` at a time): names, types
    and ids repeat in every request."""
    if type(value) is str:
        known = _VALID.get(value)
        if known is not None:
            return known
    if not isinstance(value, str):
        raise InvalidIdentifier(f"{what} must be a string, not {type(value).__name__}")
    if not _IDENTIFIER.fullmatch(value):
        if not value:
            raise InvalidIdentifier(f"{what} must not be empty")
        if len(value) > MAX_IDENTIFIER_LENGTH:
            raise InvalidIdentifier(
                f"{what} is {len(value)} characters long; at most {MAX_IDENTIFIER_LENGTH}"
            )
        raise InvalidIdentifier(f"{what} {value!r} has whitespace or non-printable characters")
    bad = _FORBIDDEN.intersection(value)
    if bad:
        raise InvalidIdentifier(
            f"{what} {value!r} has forbidden characters: {' '.join(sorted(bad))}"
        )
    interned = sys.intern(value)
    if len(_VALID) >= _VALID_LIMIT:
        _VALID.clear()
    _VALID[interned] = interned
    return interned


def check_tenant(value: object) -> str:
    """Return the tenant if valid: '' (default) or 1-50 of [a-z0-9_]."""
    if not isinstance(value, str):
        raise InvalidIdentifier(f"tenant must be a string, not {type(value).__name__}")
    if value and not _TENANT.fullmatch(value):
        raise InvalidIdentifier(
            f"tenant {value!r} must be at most {MAX_TENANT_LENGTH} lowercase letters, digits or '_'"
        )
    return sys.intern(value)


def _check_levels(levels: list[str], text: str) -> None:
    if len(levels) > MAX_PATH_LEVELS:
        raise InvalidIdentifier(
            f"service path {text!r} has {len(levels)} levels; at most {MAX_PATH_LEVELS}"
        )
    for level in levels:
        if not _LEVEL.fullmatch(level):
            raise InvalidIdentifier(
                f"service path {text!r}: level {level!r} must be 1-{MAX_PATH_LEVEL_LENGTH} "
                "letters, digits or '_'"
            )


def check_service_path(value: object) -> str:
    """Return the (exact) service path of an update if valid: '/' or '/a/b'."""
    if not isinstance(value, str):
        raise InvalidIdentifier(f"service path must be a string, not {type(value).__name__}")
    if not value.startswith("/"):
        raise InvalidIdentifier(f"service path {value!r} must be absolute (start with '/')")
    if value != "/":
        _check_levels(value[1:].split("/"), value)
    return sys.intern(value)


def check_scope(value: object) -> str:
    """Return a subscription scope if valid: an exact path, or '/a/#' (a subtree), or '/#'."""
    if not isinstance(value, str):
        raise InvalidIdentifier(f"service path must be a string, not {type(value).__name__}")
    if value == DEFAULT_SCOPE:
        return DEFAULT_SCOPE
    if value.endswith("/#"):
        check_service_path(value[:-2])
        return sys.intern(value)
    if "#" in value:
        raise InvalidIdentifier(f"service path {value!r}: '#' may only end the path, as '/#'")
    return check_service_path(value)


def scope_matches(scope: str, path: str) -> bool:
    """Tell whether an update at ``path`` is inside the subscription scope ``scope``.

    ``/a/#`` covers ``/a`` and ``/a/...`` but not ``/a2``; ``/#`` covers everything; any
    other scope must equal the path.
    """
    if scope.endswith("#"):
        base = scope[:-2]  # '/a/#' -> '/a', '/#' -> ''
        return path == base or path.startswith(base + "/") or base == ""
    return scope == path


def scopes_covering(path: str) -> tuple[str, ...]:
    """Every scope that covers ``path``: the path itself and each ancestor's subtree scope.

    ``scopes_covering('/a/b')`` is ``('/a/b', '/#', '/a/#', '/a/b/#')``.
    """
    if path == "/":
        return ("/", "/#")
    levels = path[1:].split("/")
    scopes = [path, "/#"]
    prefix = ""
    for level in levels:
        prefix += "/" + level
        scopes.append(prefix + "/#")
    return tuple(scopes)
