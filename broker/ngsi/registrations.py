"""NGSI v2 registrations: context providers of some entities' attributes (ngsi-v2.md,
Orion's ``orion-api.md`` "Registration Operations", and its ``parseRegistration.cpp`` for
the error descriptions).

A registration (``POST /v2/registrations``) names a provider (``provider.http.url``; NGSI v2
forwarding, or NGSIv1 with ``legacyForwarding: true``, as the IoT agents' legacy command mode
registers) of ``dataProvided``: entities (``id`` or ``idPattern``, ``type`` or
``typePattern``) and attributes (``attrs``; none: every attribute). It belongs to the
request's tenant (``Fiware-Service``) and service path (``Fiware-ServicePath``, ``/`` when
absent); listing with a service path shows that path's only. ``status`` is ``active`` or
``inactive``, shown ``expired`` once ``expires`` is past; only an active, unexpired
registration forwards (``supportedForwardingMode``: ``all``, ``query``, ``update``, ``none``).

Definitions live in ZooKeeper (:mod:`broker.coordination.registrations`), every front keeping
a copy through a watch, so a registration survives the connection points and every front
forwards alike. ``forwardingInformation`` (``timesSent``, ``lastForwarding``, ``lastSuccess``,
``lastFailure``; shown once the first forwarding was sent: Orion never shows it, and
clients' models that know it, as filip's, want ``lastForwarding`` in it) is counted by
each front in memory and added to ZooKeeper's counters every
``FLUSH_TICK`` seconds and when the front stops; a GET shows ZooKeeper's plus this front's
unflushed counts. Forwarding itself is :mod:`broker.ngsi.forwarding`.

Silbo takes an ``idPattern`` and a ``typePattern`` of any regular expression (Orion only
``.*``, answering 501 for others) and checks the provider's URL against the notification
allow-list (``--notify-allow``), as it makes the front send requests there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from broker.coordination.registrations import NO_REGISTRATION, Kept
from broker.errors import InvalidInput, NotFound, SilboError
from broker.model.attribute import parse_iso8601
from broker.model.identifiers import check_identifier, scope_matches
from broker.ngsi.allow import AllowList
from broker.ngsi.subscriptions import iso
from broker.store.query import Selector

__all__ = [
    "FLUSH_TICK",
    "Registration",
    "RegistrationStore",
    "Registrations",
    "parse_registration",
]

_log = logging.getLogger(__name__)

FLUSH_TICK = 1.0  # seconds between additions of this front's counters to ZooKeeper's
MAX_DESCRIPTION = 1024  # Orion's MAX_DESCRIPTION_LENGTH
_FORBIDDEN = frozenset("<>\"'=;()")  # Orion's forbiddenChars
_ID = re.compile("[0-9a-f]{24}")  # what create() makes
_MODES = frozenset({"all", "none", "query", "update"})
_STATUSES = frozenset({"active", "inactive"})
_TOP = frozenset(
    {"id", "description", "dataProvided", "provider", "status", "expires", "forwardingInformation"}
)
_PATCHED = frozenset({"description", "dataProvided", "provider", "status", "expires"})
_READ_ONLY = frozenset({"id", "forwardingInformation"})
_ENTITY_KEYS = frozenset({"id", "idPattern", "type", "typePattern"})


class RegistrationStore(Protocol):
    """Where the registrations are kept (:class:`broker.coordination.registrations.
    RegistrationStore`)."""

    async def start(self, changed: Any) -> None:
        """Read them all, and tell ``changed`` of each change from then on."""

    def close(self) -> None:
        """Stop watching."""

    async def create(self, kept: Kept) -> None:
        """Keep a new one."""

    async def replace(self, kept: Kept) -> None:
        """Keep a changed one (NotFound if gone)."""

    async def remove(self, registration_id: str) -> None:
        """Forget one."""

    async def read(self, registration_id: str) -> Kept | None:
        """One as kept now."""

    async def counters(self, registration_id: str) -> dict[str, Any]:
        """One's forwarding counters as flushed."""

    async def add_counters(self, deltas: Any) -> None:
        """Add this front's counts."""


def _bad(description: str) -> InvalidInput:
    return InvalidInput(description)


def _text(value: Any, description: str) -> str:
    if not isinstance(value, str):
        raise _bad(description)
    return value


def _entities(value: Any) -> list[dict[str, str]]:
    if not isinstance(value, list) or not value:
        raise _bad("/entities/ must be a non-empty JSON array")
    out = []
    for item in value:
        if not isinstance(item, dict):
            raise _bad("/entities/ vector item is not a JSON object")
        unknown = set(item) - _ENTITY_KEYS
        if unknown:
            raise _bad(f"/entities/ vector item: unrecognized field /{sorted(unknown)[0]}/")
        entity = {
            k: _text(v, f"/entities/ field /{k}/ must be a JSON string") for k, v in item.items()
        }
        if ("id" in entity) == ("idPattern" in entity):
            raise _bad("/entities/ vector item must have one of /id/ and /idPattern/")
        if "type" in entity and "typePattern" in entity:
            raise _bad("/entities/ vector item cannot have both /type/ and /typePattern/")
        for key in ("id", "type"):
            if key in entity:
                check_identifier(entity[key], f"entity {key}")
        _selector(entity)  # the patterns compile
        out.append(entity)
    return out


def _selector(entity: Mapping[str, str]) -> Selector:
    return Selector(
        id=entity.get("id"),
        id_pattern=entity.get("idPattern"),
        type=entity.get("type"),
        type_pattern=entity.get("typePattern"),
    )


def _data_provided(value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad("/dataProvided/ must be a JSON object")
    if not value:
        raise _bad("/dataProvided/ is empty")
    unknown = set(value) - {"entities", "attrs", "expression"}
    if unknown:
        raise _bad(f"/dataProvided/: unrecognized field /{sorted(unknown)[0]}/")
    if "expression" in value:
        raise _bad("/dataProvided/expression/ is not supported (no geographical registrations)")
    if "entities" not in value:
        raise _bad("/dataProvided/ must contain a field /entities/")
    out: dict[str, Any] = {"entities": _entities(value["entities"])}
    attrs = value.get("attrs", [])
    if not isinstance(attrs, list):
        raise _bad("/attrs/ must be a JSON array")
    names = []
    for name in attrs:
        names.append(
            check_identifier(_text(name, "/attrs/ items must be JSON strings"), "attribute name")
        )
    out["attrs"] = list(dict.fromkeys(names))
    return out


def _provider(value: Any, allow: AllowList) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _bad("/provider/ must be a JSON object")
    if not value:
        raise _bad("/provider/ empty")
    unknown = set(value) - {"http", "supportedForwardingMode", "legacyForwarding"}
    if unknown:
        raise _bad(f"/provider/: unrecognized field /{sorted(unknown)[0]}/")
    if "http" not in value:
        raise _bad("/provider/ must contain a field /http/")
    http = value["http"]
    if not isinstance(http, dict):
        raise _bad("/http/ must be a JSON object")
    if "url" not in http:
        raise _bad("/http/ must contain a field /url/")
    url = _text(http["url"], "/url/ field of /http/ must be a JSON string")
    if not url:
        raise _bad("/url/ field of /http/ cannot be the empty string")
    allow.check_url(url, "/url/ field of /http/")
    mode = value.get("supportedForwardingMode", "all")
    if not isinstance(mode, str):
        raise _bad("/supportedForwardingMode/ must be a JSON string")
    if mode not in _MODES:
        raise _bad("invalid value of /supportedForwardingMode/")
    legacy = value.get("legacyForwarding", False)
    if not isinstance(legacy, bool):
        raise _bad("the field /legacyForwarding/ must be a boolean")
    return {
        "http": {"url": url.rstrip("/")},
        "supportedForwardingMode": mode,
        "legacyForwarding": legacy,
    }


def parse_registration(body: Any, allow: AllowList) -> dict[str, Any]:
    """A registration's definition from a request body, validated and normalized
    (BadRequest with Orion's descriptions otherwise); ``id`` and ``forwardingInformation``
    are ignored, as Orion does."""
    if not isinstance(body, dict):
        raise _bad("not a JSON object")
    if not body:
        raise _bad("empty payload")
    unknown = set(body) - _TOP
    if unknown:
        raise _bad(f"unrecognized field /{sorted(unknown)[0]}/")
    document: dict[str, Any] = {}
    if "description" in body:
        description = _text(body["description"], "invalid description")
        if len(description) > MAX_DESCRIPTION:
            raise _bad("max description length exceeded")
        if _FORBIDDEN.intersection(description):
            raise _bad("forbidden characters in description")
        document["description"] = description
    if "dataProvided" not in body:
        raise _bad("the field /dataProvided/ is missing in payload")
    document["dataProvided"] = _data_provided(body["dataProvided"])
    if "provider" not in body:
        raise _bad("the field /provider/ is missing in payload")
    document["provider"] = _provider(body["provider"], allow)
    if "expires" in body:
        expires = _text(body["expires"], "the field /expires/ must be a JSON string")
        if expires:
            if parse_iso8601(expires) is None:
                raise _bad("the field /expires/ has an invalid format")
            document["expires"] = expires
    status = body.get("status", "active")
    if not isinstance(status, str):
        raise _bad("/status/ must be a string")
    if status not in _STATUSES:
        raise _bad("invalid value for /status/")
    document["status"] = status
    return document


@dataclass(slots=True)
class Counts:
    """Forwarding counters: ``timesSent`` and the epoch times of the last of each."""

    times_sent: int = 0
    last_forwarding: float | None = None
    last_success: float | None = None
    last_failure: float | None = None

    def to_record(self) -> dict[str, Any]:
        """What ZooKeeper keeps (and adds) of them."""
        out: dict[str, Any] = {"timesSent": self.times_sent}
        for key, value in (
            ("lastForwarding", self.last_forwarding),
            ("lastSuccess", self.last_success),
            ("lastFailure", self.last_failure),
        ):
            if value is not None:
                out[key] = value
        return out

    def add(self, record: Mapping[str, Any]) -> Counts:
        """These counts and a record's together."""

        def latest(mine: float | None, key: str) -> float | None:
            theirs = record.get(key)
            if theirs is None:
                return mine
            return float(theirs) if mine is None else max(mine, float(theirs))

        return Counts(
            self.times_sent + int(record.get("timesSent", 0)),
            latest(self.last_forwarding, "lastForwarding"),
            latest(self.last_success, "lastSuccess"),
            latest(self.last_failure, "lastFailure"),
        )


@dataclass(frozen=True, slots=True)
class Registration:
    """One registration (see the module doc), parsed for matching."""

    id: str
    tenant: str
    service_path: str
    document: dict[str, Any]
    created: float
    selectors: tuple[Selector, ...] = field(init=False)
    expires: float | None = field(init=False)

    def __post_init__(self) -> None:
        entities = self.document["dataProvided"]["entities"]
        object.__setattr__(self, "selectors", tuple(_selector(e) for e in entities))
        text = self.document.get("expires")
        object.__setattr__(self, "expires", None if text is None else parse_iso8601(text))

    @classmethod
    def of(cls, kept: Kept) -> Registration:
        """The registration ZooKeeper keeps."""
        return cls(kept.id, kept.tenant, kept.service_path, kept.document, kept.created)

    def kept(self) -> Kept:
        """What ZooKeeper keeps of it."""
        return Kept(self.id, self.tenant, self.service_path, self.document, self.created)

    @property
    def url(self) -> str:
        """The provider's base URL (no trailing '/')."""
        return str(self.document["provider"]["http"]["url"])

    @property
    def legacy(self) -> bool:
        """Whether it forwards NGSIv1 (``queryContext``, ``updateContext``)."""
        return bool(self.document["provider"]["legacyForwarding"])

    @property
    def attrs(self) -> tuple[str, ...]:
        """The attributes it provides (empty: every attribute)."""
        return tuple(self.document["dataProvided"]["attrs"])

    def status(self, now: float) -> str:
        """The status GET shows: ``expired`` once ``expires`` is past."""
        if self.expires is not None and self.expires <= now:
            return "expired"
        return str(self.document["status"])

    def forwards(self, kind: str, now: float) -> bool:
        """Whether it forwards requests of ``kind`` (``query`` or ``update``) now."""
        mode = self.document["provider"]["supportedForwardingMode"]
        return self.status(now) == "active" and mode in ("all", kind)

    def provides(self, entity_id: str, entity_type: str | None) -> bool:
        """Whether it names the entity (a type of None: any type it names)."""
        for selector in self.selectors:
            if entity_type is None:
                if _id_matches(selector, entity_id):
                    return True
            elif selector.matches(entity_id, entity_type):
                return True
        return False

    def type_for(self, entity_id: str) -> str | None:
        """The exact type it names for an entity id (None if only patterns or none)."""
        for selector in self.selectors:
            if _id_matches(selector, entity_id) and selector.type is not None:
                return selector.type
        return None

    def to_json(self, counts: Counts, now: float) -> dict[str, Any]:
        """The registration as GET shows it."""
        doc = self.document
        out: dict[str, Any] = {"id": self.id}
        if "description" in doc:
            out["description"] = doc["description"]
        out["dataProvided"] = {
            "entities": [dict(e) for e in doc["dataProvided"]["entities"]],
            "attrs": list(doc["dataProvided"]["attrs"]),
        }
        out["provider"] = {
            "http": {"url": self.url},
            "supportedForwardingMode": doc["provider"]["supportedForwardingMode"],
            "legacyForwarding": self.legacy,
        }
        out["status"] = self.status(now)
        if self.expires is not None:
            out["expires"] = iso(self.expires)
        information: dict[str, Any] = {"timesSent": counts.times_sent}
        for key, value in (
            ("lastForwarding", counts.last_forwarding),
            ("lastSuccess", counts.last_success),
            ("lastFailure", counts.last_failure),
        ):
            if value is not None:
                information[key] = iso(value)
        if counts.times_sent:  # none before the first forwarding (filip's model needs a date)
            out["forwardingInformation"] = information
        return out


def _id_matches(selector: Selector, entity_id: str) -> bool:
    """Whether a selector takes an entity id, whatever the type."""
    if selector.id is not None:
        return selector.id == entity_id
    return Selector(id_pattern=selector.id_pattern).matches(entity_id, "")


class Registrations:
    """The front's registrations: a copy of ZooKeeper's kept up by a watch, the operations of
    the API, and this front's forwarding counts (see the module doc)."""

    def __init__(self, store: RegistrationStore, allow: AllowList) -> None:
        self._store = store
        self._allow = allow
        self.known: dict[str, Registration] = {}  # id -> registration, as the watch tells
        self._pending: dict[str, Counts] = {}  # counted here, not yet added to ZooKeeper's
        self._flusher: asyncio.Task[None] | None = None

    async def start(self) -> None:
        """Read every registration (and watch them), and flush counts from now on."""
        await self._store.start(self._changed)
        self._flusher = asyncio.get_running_loop().create_task(self._flush_often())

    async def stop(self) -> None:
        """Flush the counts and stop watching."""
        if self._flusher is not None:
            self._flusher.cancel()
            await asyncio.gather(self._flusher, return_exceptions=True)
        try:
            await self.flush()
        except SilboError as exc:
            _log.warning("the forwarding counters were not saved: %s", exc)
        self._store.close()

    def _changed(self, registration_id: str, kept: Kept | None) -> None:
        if kept is None:
            self.known.pop(registration_id, None)
            return
        try:
            self.known[registration_id] = Registration.of(kept)
        except (SilboError, KeyError, TypeError) as exc:
            _log.error("registration %s is not used: %r", registration_id, exc)

    # -- the API ----------------------------------------------------------------------------

    async def create(self, tenant: str, service_path: str, body: Any) -> Registration:
        """Keep a new registration."""
        document = parse_registration(body, self._allow)
        registration = Registration(
            uuid.uuid4().hex[:24], tenant, service_path, document, time.time()
        )
        await self._store.create(registration.kept())
        self.known[registration.id] = registration  # the watch tells the same, later
        return registration

    async def find(self, tenant: str, registration_id: str) -> Registration:
        """A registration of ``tenant``, as ZooKeeper keeps it now (NotFound otherwise)."""
        if not _ID.fullmatch(registration_id):
            raise NotFound(NO_REGISTRATION)
        kept = await self._store.read(registration_id)
        if kept is None or kept.tenant != tenant:
            raise NotFound(NO_REGISTRATION)
        return Registration.of(kept)

    async def counts(self, registration: Registration) -> Counts:
        """A registration's counters: ZooKeeper's and this front's unflushed ones."""
        stored = await self._store.counters(registration.id)
        return self._pending.get(registration.id, Counts()).add(stored)

    async def patch(self, registration: Registration, body: Any) -> None:
        """Apply a PATCH: the top-level fields sent replace the stored ones."""
        if not isinstance(body, dict) or not body:
            raise InvalidInput("a registration PATCH needs a non-empty JSON object")
        unknown = set(body) - _PATCHED - _READ_ONLY
        if unknown:
            raise InvalidInput(f"unrecognized field /{sorted(unknown)[0]}/ in a PATCH")
        # a client sending back what it read (filip) sends the read-only fields too: ignored
        body = {k: v for k, v in body.items() if k not in _READ_ONLY}
        if not body:
            raise InvalidInput("a registration PATCH needs a field to change")
        document = parse_registration({**registration.document, **body}, self._allow)
        if "expires" in body and body["expires"] == "":
            document.pop("expires", None)
        changed = Registration(
            registration.id, registration.tenant, registration.service_path, document,
            registration.created,
        )  # fmt: skip
        await self._store.replace(changed.kept())
        self.known[changed.id] = changed

    async def delete(self, registration: Registration) -> None:
        """Forget a registration."""
        await self._store.remove(registration.id)
        self.known.pop(registration.id, None)
        self._pending.pop(registration.id, None)

    def listed(self, tenant: str, service_path: str | None) -> list[Registration]:
        """The registrations of ``tenant`` (of one service path, if given), oldest first."""
        chosen = [
            r
            for r in self.known.values()
            if r.tenant == tenant and (service_path is None or r.service_path == service_path)
        ]
        chosen.sort(key=lambda r: (r.created, r.id))
        return chosen

    # -- forwarding -------------------------------------------------------------------------

    def providing(
        self,
        kind: str,
        tenant: str,
        scopes: tuple[str, ...],
        entity_id: str,
        entity_type: str | None,
    ) -> list[Registration]:
        """The registrations that forward ``kind`` requests about an entity of a service
        path one of ``scopes`` takes, oldest first (the first that provides an attribute is
        the one asked, as Orion)."""
        now = time.time()
        chosen = [
            r
            for r in self.known.values()
            if r.tenant == tenant
            and any(scope_matches(scope, r.service_path) for scope in scopes)
            and r.forwards(kind, now)
            and r.provides(entity_id, entity_type)
        ]
        chosen.sort(key=lambda r: (r.created, r.id))
        return chosen

    def counted(self, registration_id: str, succeeded: bool) -> None:
        """Count one forwarding to a registration's provider."""
        now = time.time()
        counts = self._pending.setdefault(registration_id, Counts())
        counts.times_sent += 1
        counts.last_forwarding = now
        if succeeded:
            counts.last_success = now
        else:
            counts.last_failure = now

    async def flush(self) -> None:
        """Add this front's counts to ZooKeeper's."""
        if not self._pending:
            return
        pending, self._pending = self._pending, {}
        try:
            await self._store.add_counters((i, c.to_record()) for i, c in pending.items())
        except BaseException:
            for registration_id, counts in pending.items():  # counted again next time
                self._pending[registration_id] = self._pending.get(registration_id, Counts()).add(
                    counts.to_record()
                )
            raise

    async def _flush_often(self) -> None:
        while True:
            await asyncio.sleep(FLUSH_TICK)
            with contextlib.suppress(SilboError):
                await self.flush()
