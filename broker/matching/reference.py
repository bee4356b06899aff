"""The reference matcher: every subscription evaluated against every update, plainly.

It is slow on purpose and obviously correct: it is the oracle the indexed engine (and the
Spark matcher) are tested against, and the executable definition of what "matches" means.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

from broker.errors import NotFound
from broker.model.identifiers import scope_matches
from broker.model.subscription import EntitySelector, Status, Subscription
from broker.model.update import ContextUpdate
from broker.query.evaluate import filter_matches
from broker.query.regex import compile_pattern, is_match_all

__all__ = ["ReferenceMatcher", "selector_matches", "subscription_matches"]


def selector_matches(selector: EntitySelector, entity_id: str, entity_type: str) -> bool:
    """Tell whether one entity selector accepts the entity (patterns are searched)."""
    if selector.id is not None:
        if selector.id != entity_id:
            return False
    elif not is_match_all(selector.id_pattern or "") and (
        compile_pattern(selector.id_pattern or "")(entity_id) is None
    ):
        return False
    if selector.type is not None:
        return selector.type == entity_type
    if selector.type_pattern is not None:
        return compile_pattern(selector.type_pattern)(entity_type) is not None
    return True


def subscription_matches(
    subscription: Subscription, update: ContextUpdate, now: float | None = None
) -> bool:
    """Tell whether ``subscription`` matches ``update`` (the definition of matching)."""
    if subscription.status is Status.INACTIVE:
        return False
    expires = subscription.expires
    if expires is not None and expires <= (time.time() if now is None else now):
        return False
    if subscription.tenant != update.tenant:
        return False
    if not scope_matches(subscription.service_path, update.service_path):
        return False
    if not any(
        selector_matches(s, update.entity_id, update.entity_type) for s in subscription.entities
    ):
        return False
    if subscription.condition_attrs and not any(
        name in update.attributes for name in subscription.condition_attrs
    ):
        return False
    return filter_matches(subscription.filter, update.attributes)


class ReferenceMatcher:
    """Holds subscriptions in a dict and scans all of them for every update."""

    def __init__(self, subscriptions: Iterable[Subscription] = ()) -> None:
        self._subscriptions: dict[str, Subscription] = {}
        for subscription in subscriptions:
            self.add(subscription)

    def __len__(self) -> int:
        return len(self._subscriptions)

    def __contains__(self, subscription_id: object) -> bool:
        return subscription_id in self._subscriptions

    def add(self, subscription: Subscription) -> None:
        """Add a subscription, replacing any with the same id."""
        self._subscriptions[subscription.id] = subscription

    def remove(self, subscription_id: str) -> Subscription:
        """Remove and return a subscription; NotFound if there is none with that id."""
        try:
            return self._subscriptions.pop(subscription_id)
        except KeyError:
            raise NotFound(f"no subscription {subscription_id!r}") from None

    def subscriptions(self) -> list[Subscription]:
        """Every subscription held."""
        return list(self._subscriptions.values())

    def match(self, update: ContextUpdate, now: float | None = None) -> set[str]:
        """The ids of every subscription that matches ``update``."""
        now = time.time() if now is None else now
        return {s.id for s in self._subscriptions.values() if subscription_matches(s, update, now)}

    def match_batch(
        self, updates: Sequence[ContextUpdate], now: float | None = None
    ) -> list[set[str]]:
        """``match`` for each update, in order."""
        now = time.time() if now is None else now
        return [self.match(update, now) for update in updates]
