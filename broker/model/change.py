"""What an update changed in its entity, and which subscriptions that fires.

Orion fires a subscription only on some *alteration types* (ngsi-v2.md section 3): an entity
created, changed (a value or metadata differs, or ``forcedUpdate``), updated (nothing
differs) or deleted; and, for a change, only when a ``condition.attrs`` attribute changed.
Whoever holds the last values (the HTTP front's cache, the context store) works out a
:class:`Change`; :mod:`broker.ngsi.change` carries it inside the published entity to the
front that sends the notifications.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Alteration", "Change"]


class Alteration(enum.Enum):
    """Orion's alteration types; the value is the name subscriptions use."""

    CREATE = "entityCreate"
    CHANGE = "entityChange"
    UPDATE = "entityUpdate"
    DELETE = "entityDelete"


@dataclass(frozen=True, slots=True)
class Change:
    """How one update altered its entity.

    ``changed``: attributes whose value or type changed (or were added or deleted);
    ``meta_changed``: attributes whose metadata alone changed; ``requested``: attributes the
    request named; ``correlator``: the request's Fiware-Correlator; ``auth_token``: its
    X-Auth-Token (empty without one; the front that takes the update adds it when it
    publishes, it never goes to the store); ``metadata``: the
    builtin metadata (``dateCreated``, ``dateModified``, ``previousValue``, ``actionType``)
    of each attribute and ``attributes`` the builtin attributes (``dateCreated``,
    ``dateModified``) of the entity, as the context store computed them, for the
    notifications that ask for them (empty when unknown: a gRPC publisher's update).
    """

    alteration: Alteration
    changed: frozenset[str] = frozenset()
    meta_changed: frozenset[str] = frozenset()
    requested: frozenset[str] = frozenset()
    correlator: str = ""
    auth_token: str = field(default="", compare=False)
    metadata: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, compare=False)
    attributes: Mapping[str, Any] = field(default_factory=dict, compare=False)

    def fires(self, condition: Iterable[str], notify_on_metadata: bool) -> bool:
        """Tell whether a subscription with these condition attributes fires on it."""
        condition = tuple(condition)
        if self.alteration is Alteration.DELETE:
            return True
        if self.alteration is Alteration.UPDATE:
            return not condition or any(a in self.requested for a in condition)
        touched = self.changed | self.meta_changed if notify_on_metadata else self.changed
        if not touched:
            return False
        return not condition or any(a in touched for a in condition)
