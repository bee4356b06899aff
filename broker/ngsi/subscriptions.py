"""NGSI v2 subscriptions as the HTTP front takes, keeps and shows them (ngsi-v2.md section 3).

:func:`parse_document` validates a subscription body as Orion does and returns a
:class:`Parsed`; a PATCH is the stored document with the sent top-level fields replaced,
validated again whole. :class:`HttpSubscription` is one subscription held by this front:
what the matchers get (:meth:`HttpSubscription.spec`: entities, scope, q, mq, expires), and
what only the front uses (alteration types, condition attributes, the notification fields
and channel, :mod:`broker.ngsi.channel`, the status keeping of section 5). Condition
attributes are not sent to the matchers: the front publishes whole entities, so "carries
the attribute" says nothing; whether a condition attribute *changed* is decided here
(:mod:`broker.ngsi.change`). So is a geographical condition (``expression.georel``,
``geometry``, ``coords``: :mod:`broker.store.geo`, parsed once into :attr:`Parsed.geo`):
the matchers know nothing of locations, and the front has the whole entity after the
update (:mod:`broker.ngsi.firing`).

Status transitions (``status``):

- ``active`` -> ``inactive``: a PATCH, a ``oneshot`` notification sent, or ``failsCounter``
  over ``maxFailsLimit``;
- ``oneshot`` -> ``inactive`` once it has notified; ``inactive`` -> ``active`` by PATCH;
- shown as ``expired`` once ``expires`` is past (whatever it was).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from broker.errors import InvalidInput, InvalidSubscription
from broker.model.attribute import parse_iso8601
from broker.model.identifiers import check_identifier
from broker.model.subscription import (
    MAX_DESCRIPTION_LENGTH,
    AttrsFormat,
    EntitySelector,
    Subscription,
)
from broker.ngsi.allow import AllowList
from broker.ngsi.change import Alteration
from broker.ngsi.channel import CHANNELS, Channel, checked_object, checked_text, parse_channel
from broker.ngsi.errors import NotServed
from broker.ngsi.retry import window_problem
from broker.store.geo import GeoFilter, parse_geo
from broker.wire import client_pb2 as pb
from broker.wire.convert import add_selectors

__all__ = ["Channel", "HttpSubscription", "Parsed", "iso", "merged", "parse_document"]

_TOP = frozenset({"description", "subject", "notification", "expires", "status", "throttling"})
_READ_ONLY = frozenset({"id"})
_SUBJECT = frozenset({"entities", "condition"})
_SELECTOR = frozenset({"id", "idPattern", "type", "typePattern"})
_CONDITION = frozenset(
    {"attrs", "expression", "alterationTypes", "notifyOnMetadataChange", "jexlExpression"}
)
_EXPRESSION = frozenset({"q", "mq", "georel", "geometry", "coords"})
_NOTIFICATION = frozenset(
    {
        "attrs",
        "exceptAttrs",
        "attrsFormat",
        "metadata",
        "onlyChangedAttrs",
        "covered",
        "maxFailsLimit",
        "retryWindow",
        *CHANNELS,
    }
)
_NOTIFICATION_READ_ONLY = frozenset(
    {
        "timesSent",
        "lastNotification",
        "lastSuccess",
        "lastSuccessCode",
        "lastFailure",
        "lastFailureReason",
        "failsCounter",
    }
)
_DEFAULT_ALTERATIONS: tuple[Alteration, ...] = (Alteration.CREATE, Alteration.CHANGE)
# the moments a datetime can show (an ISO 8601 offset takes a date past them)
_FIRST = datetime(1, 1, 1, tzinfo=UTC).timestamp()
_LAST = datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()


def iso(epoch: float) -> str:
    """Orion's timestamps: ISO 8601 in UTC with milliseconds (a moment before year 1 or
    after year 9999, which ``expires`` may name, is shown as that year's first or last)."""
    moment = datetime.fromtimestamp(min(max(epoch, _FIRST), _LAST), UTC)
    return f"{moment.year:04d}-{moment:%m-%dT%H:%M:%S}.{moment.microsecond // 1000:03d}Z"


def _strings(value: Any, what: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidSubscription(f"{what} must be an array of strings")
    return tuple(value)


def _bool(value: Any, what: str) -> bool:
    if not isinstance(value, bool):
        raise InvalidSubscription(f"{what} must be true or false")
    return value


@dataclass(frozen=True, slots=True)
class Parsed:
    """A validated subscription document and what the front derives from it."""

    document: dict[str, Any]
    selectors: tuple[EntitySelector, ...]
    condition_attrs: tuple[str, ...]
    q: str
    mq: str
    alterations: tuple[Alteration, ...]
    notify_on_metadata: bool
    channel: Channel
    attrs: tuple[str, ...]
    except_attrs: tuple[str, ...]
    attrs_format: AttrsFormat
    only_changed: bool
    covered: bool
    max_fails_limit: int | None
    expires: float | None
    status: str
    throttling: float
    retry_window: float | None = None  # seconds (Silbo's own); None: the cluster's
    metadata: tuple[str, ...] = ()  # notification.metadata: the metadata notified
    # subject.condition.expression's georel, geometry and coords, parsed once: checked by
    # the front on the whole entity after the update (broker.ngsi.firing), the matchers
    # knowing nothing of locations
    geo: GeoFilter | None = None


def _retry_window(value: Any) -> float | None:
    if value is None:
        return None
    problem = window_problem(value, "notification.retryWindow")
    if problem is not None:
        raise InvalidSubscription(problem)
    return float(value)


def _selectors(entities: Any) -> tuple[EntitySelector, ...]:
    if not isinstance(entities, list) or not entities:
        raise InvalidSubscription("subject.entities must be a non-empty array")
    selectors = []
    for i, item in enumerate(entities):
        item = checked_object(item, f"subject.entities[{i}]", _SELECTOR)
        for key, value in item.items():
            checked_text(value, f"subject.entities[{i}].{key}")
        selectors.append(
            EntitySelector(
                id=item.get("id"),
                id_pattern=item.get("idPattern"),
                type=item.get("type"),
                type_pattern=item.get("typePattern"),
            )
        )
    return tuple(selectors)


Condition = tuple[tuple[str, ...], str, str, tuple[Alteration, ...], bool, GeoFilter | None]


def _condition(value: Any) -> Condition:
    if value is None:
        return (), "", "", _DEFAULT_ALTERATIONS, True, None
    condition = checked_object(value, "subject.condition", _CONDITION)
    if not condition:
        raise InvalidSubscription("subject.condition must not be empty")
    if "jexlExpression" in condition:
        raise NotServed("jexlExpression is not served by Silbo")
    attrs = _strings(condition.get("attrs", []), "subject.condition.attrs")
    for name in attrs:
        check_identifier(name, "condition attribute")
    q = mq = ""
    geo = None
    if "expression" in condition:
        expression = checked_object(
            condition["expression"], "subject.condition.expression", _EXPRESSION
        )
        q, mq, georel, geometry, coords = (
            checked_text(expression.get(k, ""), f"subject.condition.expression.{k}")
            for k in ("q", "mq", "georel", "geometry", "coords")
        )
        geo = parse_geo(georel or None, geometry or None, coords or None)
    alterations = _DEFAULT_ALTERATIONS
    if "alterationTypes" in condition:
        names = _strings(condition["alterationTypes"], "subject.condition.alterationTypes")
        known = {a.value: a for a in Alteration}
        for name in names:
            if name not in known:
                raise InvalidSubscription(f"unknown alterationType {name!r}")
        alterations = tuple(known[n] for n in names) or _DEFAULT_ALTERATIONS
    on_metadata = _bool(
        condition.get("notifyOnMetadataChange", True), "subject.condition.notifyOnMetadataChange"
    )
    return attrs, q, mq, alterations, on_metadata, geo


def parse_document(body: Any, allow: AllowList) -> Parsed:
    """Validate a whole subscription document (InvalidInput or NotServed otherwise)."""
    document = checked_object(body, "the subscription", _TOP | _READ_ONLY)
    document = {k: v for k, v in document.items() if k not in _READ_ONLY}
    description = checked_text(document.get("description", ""), "description")
    if len(description) > MAX_DESCRIPTION_LENGTH:
        raise InvalidSubscription(f"description is longer than {MAX_DESCRIPTION_LENGTH} characters")
    if "subject" not in document:
        raise InvalidSubscription("subject is missing")
    subject = checked_object(document["subject"], "subject", _SUBJECT)
    if "entities" not in subject:
        raise InvalidSubscription("subject.entities is missing")
    selectors = _selectors(subject["entities"])
    condition_attrs, q, mq, alterations, on_metadata, geo = _condition(subject.get("condition"))
    if "notification" not in document:
        raise InvalidSubscription("notification is missing")
    notification = checked_object(
        document["notification"], "notification", _NOTIFICATION | _NOTIFICATION_READ_ONLY
    )
    channel = parse_channel(notification, allow)
    attrs = _strings(notification.get("attrs", []), "notification.attrs")
    except_attrs = _strings(notification.get("exceptAttrs", []), "notification.exceptAttrs")
    if "attrs" in notification and "exceptAttrs" in notification:
        raise InvalidSubscription("notification takes attrs or exceptAttrs, not both")
    formats = {f.value: f for f in AttrsFormat}
    format_name = checked_text(
        notification.get("attrsFormat", "normalized"), "notification.attrsFormat"
    )
    if format_name not in formats:
        raise InvalidSubscription(f"notification.attrsFormat {format_name!r} is not known")
    covered = _bool(notification.get("covered", False), "notification.covered")
    if covered and not attrs:
        raise InvalidSubscription("covered notifications need an explicit notification.attrs")
    limit = notification.get("maxFailsLimit")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidSubscription("notification.maxFailsLimit must be a whole number above 0")
    metadata = _strings(notification.get("metadata", []), "notification.metadata")
    expires = None
    if "expires" in document:
        text = checked_text(document["expires"], "expires")
        expires = parse_iso8601(text)
        if expires is None:
            raise InvalidSubscription(f"expires {text!r} is not an ISO 8601 date")
    status = checked_text(document.get("status", "active"), "status")
    if status not in ("active", "inactive", "oneshot"):
        raise InvalidSubscription(f"status {status!r} must be active, inactive or oneshot")
    throttling = document.get("throttling", 0)
    number = isinstance(throttling, int | float) and not isinstance(throttling, bool)
    if not number or not 0 <= throttling <= sys.float_info.max:  # NaN and 1e400 too
        raise InvalidSubscription("throttling must be a finite number of seconds, not negative")
    # the matchers' view, validated by the model (q and mq parse, patterns compile)
    Subscription("check", selectors, q=q, mq=mq)
    return Parsed(
        document,
        selectors,
        condition_attrs,
        q,
        mq,
        alterations,
        on_metadata,
        channel,
        attrs,
        except_attrs,
        formats[format_name],
        _bool(notification.get("onlyChangedAttrs", False), "notification.onlyChangedAttrs"),
        covered,
        limit,
        expires,
        status,
        float(throttling),
        _retry_window(notification.get("retryWindow")),
        metadata,
        geo,
    )


def merged(document: Mapping[str, Any], patch: Any) -> dict[str, Any]:
    """A PATCH applied: the top-level fields sent replace the stored ones."""
    if not isinstance(patch, dict) or not patch:
        raise InvalidInput("a subscription PATCH needs a non-empty JSON object")
    unknown = set(patch) - _TOP
    if unknown:
        raise InvalidSubscription(f"unrecognized field {sorted(unknown)[0]!r}")
    return {**document, **patch}


@dataclass(eq=False, slots=True)
class HttpSubscription:
    """One subscription held by this front, with its delivery status (see the module doc)."""

    id: str
    tenant: str
    scope: str
    parsed: Parsed
    handle: int = 0
    status: str = "active"
    times_sent: int = 0
    last_notification: float | None = None
    last_success: float | None = None
    last_success_code: int | None = None
    last_failure: float | None = None
    last_failure_reason: str = ""
    fails_counter: int = 0
    dropped: int = 0  # notifications dropped for a full queue (not Orion's)
    generation: int = 0  # the version of it the delivery worker has (broker.ngsi.notifier)
    number: int = 0  # what the delivery worker calls it (broker.ngsi.notifier)
    created: float = field(default_factory=time.time)
    saved: tuple[Any, ...] = ()  # the status as last written to ZooKeeper

    def __post_init__(self) -> None:
        self.status = self.parsed.status

    def status_record(self) -> dict[str, Any]:
        """What is kept of its status in ZooKeeper (so another front can take it over)."""
        return {
            "status": self.status,
            "timesSent": self.times_sent,
            "lastNotification": self.last_notification,
            "lastSuccess": self.last_success,
            "lastSuccessCode": self.last_success_code,
            "lastFailure": self.last_failure,
            "lastFailureReason": self.last_failure_reason,
            "failsCounter": self.fails_counter,
            "dropped": self.dropped,
        }

    def restore(self, record: Mapping[str, Any]) -> None:
        """Take a status kept by :meth:`status_record` (an empty one changes nothing)."""
        if not record:
            return
        self.status = str(record.get("status", self.status))
        self.times_sent = int(record.get("timesSent", 0))
        self.last_notification = record.get("lastNotification")
        self.last_success = record.get("lastSuccess")
        self.last_success_code = record.get("lastSuccessCode")
        self.last_failure = record.get("lastFailure")
        self.last_failure_reason = str(record.get("lastFailureReason", ""))
        self.fails_counter = int(record.get("failsCounter", 0))
        self.dropped = int(record.get("dropped", 0))
        self.saved = self.status_key()

    def status_key(self) -> tuple[Any, ...]:
        """Changes whenever the kept status would (compared with ``saved``)."""
        return (
            self.status,
            self.times_sent,
            self.last_success,
            self.last_failure,
            self.fails_counter,
            self.dropped,
        )

    def spec(self) -> pb.SubscriptionSpec:
        """What the matchers get (condition attributes excluded: see the module doc)."""
        p = self.parsed
        spec = pb.SubscriptionSpec(
            id=self.id,
            tenant=self.tenant,
            service_path=self.scope,
            q=p.q,
            mq=p.mq,
            expires=p.expires or 0.0,
        )
        add_selectors(spec, p.selectors)
        return spec

    def expired(self, now: float) -> bool:
        """Tell whether ``expires`` is past."""
        return self.parsed.expires is not None and self.parsed.expires <= now

    def shown_status(self, now: float) -> str:
        """The status GET shows (``expired`` once past ``expires``)."""
        return "expired" if self.expired(now) else self.status

    def to_json(self, now: float) -> dict[str, Any]:
        """The subscription as GET /v2/subscriptions shows it (Orion's shape)."""
        p = self.parsed
        doc = p.document
        out: dict[str, Any] = {"id": self.id}
        if doc.get("description"):
            out["description"] = doc["description"]
        condition: dict[str, Any] = {
            "attrs": list(p.condition_attrs),
            "notifyOnMetadataChange": p.notify_on_metadata,
        }
        given = doc["subject"].get("condition") or {}
        if "expression" in given:
            condition["expression"] = given["expression"]
        if "alterationTypes" in given:
            condition["alterationTypes"] = given["alterationTypes"]
        out["subject"] = {"entities": doc["subject"]["entities"], "condition": condition}
        notification: dict[str, Any] = {}
        if p.except_attrs:
            notification["exceptAttrs"] = list(p.except_attrs)
        else:
            notification["attrs"] = list(p.attrs)
        notification["onlyChangedAttrs"] = p.only_changed
        notification["attrsFormat"] = p.attrs_format.value
        channel = p.channel.kind
        notification[channel] = p.channel.shown(doc["notification"][channel])
        if "metadata" in doc["notification"]:
            notification["metadata"] = doc["notification"]["metadata"]
        notification["covered"] = p.covered
        if p.max_fails_limit is not None:
            notification["maxFailsLimit"] = p.max_fails_limit
        if p.retry_window is not None:
            notification["retryWindow"] = doc["notification"]["retryWindow"]
        if self.times_sent:
            notification["timesSent"] = self.times_sent
        if self.last_notification is not None:
            notification["lastNotification"] = iso(self.last_notification)
        if self.last_failure is not None:
            notification["lastFailure"] = iso(self.last_failure)
            notification["lastFailureReason"] = self.last_failure_reason
        if self.last_success is not None:
            notification["lastSuccess"] = iso(self.last_success)
            if p.channel.mqtt is None:  # MQTT has no answer's code (Orion shows none)
                notification["lastSuccessCode"] = self.last_success_code
        if self.fails_counter:
            notification["failsCounter"] = self.fails_counter
        if self.dropped:
            notification["droppedNotifications"] = self.dropped
        out["notification"] = notification
        if "expires" in doc:
            out["expires"] = iso(p.expires or 0.0)
        out["status"] = self.shown_status(now)
        if p.throttling:
            out["throttling"] = doc["throttling"]
        return out
