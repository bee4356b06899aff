"""A content subscription: which updates a subscriber wants, and how it wants them.

A subscription matches an update when all of these hold (the reference matcher in
:mod:`broker.matching.reference` is the executable definition):

1. the tenants are equal and the update's service path is inside the subscription's scope;
2. at least one entity selector matches the update's entity id and type;
3. the condition attributes are empty, or the update carries at least one of them;
4. the filter (q, mq and the SilboPS string operators) holds;
5. the subscription is not ``inactive`` and has not expired.
"""

from __future__ import annotations

import enum
import sys
from dataclasses import dataclass, field

from broker.errors import InvalidSubscription
from broker.model.identifiers import DEFAULT_SCOPE, check_identifier, check_scope, check_tenant
from broker.query.ast import Filter
from broker.query.parser import parse_filter
from broker.query.regex import compile_pattern, is_match_all

__all__ = [
    "MAX_CONDITION_ATTRS",
    "MAX_DESCRIPTION_LENGTH",
    "MAX_SELECTORS",
    "AttrsFormat",
    "EntitySelector",
    "NotificationOptions",
    "Status",
    "Subscription",
]

MAX_SELECTORS = 64
MAX_CONDITION_ATTRS = 256
MAX_DESCRIPTION_LENGTH = 1024


class AttrsFormat(enum.Enum):
    """How a notification renders the entity."""

    NORMALIZED = "normalized"
    KEY_VALUES = "keyValues"
    VALUES = "values"
    SIMPLIFIED_NORMALIZED = "simplifiedNormalized"
    SIMPLIFIED_KEY_VALUES = "simplifiedKeyValues"
    LEGACY = "legacy"  # NGSIv1: {"subscriptionId", "originator", "contextResponses"}


class Status(enum.Enum):
    """A subscription's status. ``oneshot`` becomes ``inactive`` after one notification."""

    ACTIVE = "active"
    INACTIVE = "inactive"
    ONESHOT = "oneshot"


@dataclass(frozen=True, slots=True)
class EntitySelector:
    """Which entities: ``id`` or ``id_pattern`` (exactly one), and optionally ``type`` or
    ``type_pattern`` (at most one; neither means any type). Patterns are searched, not
    anchored, as in Orion."""

    id: str | None = None
    id_pattern: str | None = None
    type: str | None = None
    type_pattern: str | None = None

    def __post_init__(self) -> None:
        if (self.id is None) == (self.id_pattern is None):
            raise InvalidSubscription("an entity selector needs exactly one of id and idPattern")
        if self.type is not None and self.type_pattern is not None:
            raise InvalidSubscription("an entity selector takes type or typePattern, not both")
        if self.id is not None:
            object.__setattr__(self, "id", check_identifier(self.id, "entity id"))
        if self.type is not None:
            object.__setattr__(self, "type", check_identifier(self.type, "entity type"))
        for pattern in (self.id_pattern, self.type_pattern):
            if pattern is not None:
                compile_pattern(pattern)
        if self.id_pattern is not None:
            object.__setattr__(self, "id_pattern", sys.intern(self.id_pattern))
        if self.type_pattern is not None:
            object.__setattr__(self, "type_pattern", sys.intern(self.type_pattern))

    @property
    def any_id(self) -> bool:
        """True when the selector accepts every entity id (``idPattern: .*``)."""
        return self.id_pattern is not None and is_match_all(self.id_pattern)

    @property
    def any_type(self) -> bool:
        """True when the selector accepts every entity type."""
        return self.type is None and (self.type_pattern is None or is_match_all(self.type_pattern))


@dataclass(frozen=True, slots=True)
class NotificationOptions:
    """How notifications are rendered and paced (NGSI v2 ``notification`` fields)."""

    attrs: tuple[str, ...] = ()
    except_attrs: tuple[str, ...] = ()
    attrs_format: AttrsFormat = AttrsFormat.NORMALIZED
    metadata: tuple[str, ...] = ()
    only_changed_attrs: bool = False
    covered: bool = False
    throttling: float = 0.0  # seconds between two notifications; 0 means none
    max_fails_limit: int | None = None

    def __post_init__(self) -> None:
        if self.attrs and self.except_attrs:
            raise InvalidSubscription("notification takes attrs or exceptAttrs, not both")
        for name in (*self.attrs, *self.except_attrs):
            check_identifier(name, "notification attribute")
        if self.covered and not self.attrs:
            raise InvalidSubscription("covered notifications need an explicit attrs list")
        if self.throttling < 0:
            raise InvalidSubscription(f"throttling must not be negative, got {self.throttling}")
        if self.max_fails_limit is not None and self.max_fails_limit < 1:
            raise InvalidSubscription("maxFailsLimit must be at least 1")


@dataclass(frozen=True, slots=True)
class Subscription:
    """A content subscription, validated on construction.

    ``q`` and ``mq`` hold the filter as written; ``filter`` is its parsed form. ``subscriber``
    is an opaque reference to whoever receives the notifications (a session or a URL).
    ``expires`` is epoch seconds, or None for a permanent subscription.
    """

    id: str
    entities: tuple[EntitySelector, ...]
    tenant: str = ""
    service_path: str = DEFAULT_SCOPE
    condition_attrs: tuple[str, ...] = ()
    q: str = ""
    mq: str = ""
    notification: NotificationOptions = NotificationOptions()
    subscriber: str = ""
    expires: float | None = None
    status: Status = Status.ACTIVE
    description: str = ""
    filter: Filter = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "id", check_identifier(self.id, "subscription id"))
        object.__setattr__(self, "tenant", check_tenant(self.tenant))
        object.__setattr__(self, "service_path", check_scope(self.service_path))
        if not isinstance(self.entities, tuple) or not self.entities:
            raise InvalidSubscription("a subscription needs at least one entity selector")
        if len(self.entities) > MAX_SELECTORS:
            raise InvalidSubscription(
                f"a subscription takes at most {MAX_SELECTORS} entity selectors"
            )
        for selector in self.entities:
            if not isinstance(selector, EntitySelector):
                raise InvalidSubscription(f"{selector!r} is not an EntitySelector")
        if len(self.condition_attrs) > MAX_CONDITION_ATTRS:
            raise InvalidSubscription(
                f"a subscription takes at most {MAX_CONDITION_ATTRS} condition attributes"
            )
        object.__setattr__(
            self,
            "condition_attrs",
            tuple(check_identifier(a, "condition attribute") for a in self.condition_attrs),
        )
        if len(self.description) > MAX_DESCRIPTION_LENGTH:
            raise InvalidSubscription(
                f"description is longer than {MAX_DESCRIPTION_LENGTH} characters"
            )
        if self.expires is not None and not isinstance(self.expires, int | float):
            raise InvalidSubscription("expires must be epoch seconds")
        object.__setattr__(self, "filter", parse_filter(self.q, self.mq))

    def replace(self, **changes: object) -> Subscription:
        """A copy with some fields changed (validated again)."""
        fields = {
            name: getattr(self, name) for name in self.__dataclass_fields__ if name != "filter"
        }
        fields.update(changes)
        return Subscription(**fields)
