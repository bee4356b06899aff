"""What the HTTP front notifies of a replay's matches (``silbo replay``): its decision at
notification time, pair by pair, in update order per subscription.

The matchers match the entity published after each update (spark_matcher.history); the
front that holds the subscription then decides whether the match notifies
(:mod:`broker.ngsi.firing`): the alteration type (``alterationTypes``, by default
entityCreate and entityChange) and the condition attributes (``condition.attrs``, with
``notifyOnMetadataChange``) against the update's change, the status (``inactive`` never
notifies; ``oneshot`` once, then it is inactive), the throttling (a match within
``throttling`` seconds of the last notification is dropped), ``expires``, and a
geographical condition (``georel``) against the entity's location. A replay decides with
the front's own function, :func:`broker.ngsi.firing.fires_one`, at each update's time: the
pairs of one subscription in update order, since throttling and oneshot depend on what
notified before. Spark puts each subscription's pairs in one partition, sorted by update,
and :func:`decided` goes through them.

A subscription starts as its document defines it (``status`` included), having notified
nothing: the ``timesSent`` and ``lastNotification`` of a listing are not taken, and a listed
``expired`` status reads as active (``expires`` decides). A matched subscription with no
document (a gRPC subscriber's, with ``--state-dir``: its client gets every match) notifies
every match. Not replayed: what a notification carries (``attrs``, ``onlyChangedAttrs``...:
the content, not whether it is sent) and what delivery does (``maxFailsLimit`` making a
subscription inactive after failures depends on the receivers).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from broker.model.change import Alteration, Change
from broker.model.subscription import Subscription
from broker.ngsi.allow import AllowList
from broker.ngsi.firing import fires_one
from broker.ngsi.subscriptions import HttpSubscription, parse_document
from broker.store.geo import Location, first_location
from broker.wire.convert import subscription_from_spec

__all__ = ["DECISION_COLUMNS", "FrontSubscription", "decided", "fronts_of"]

DECISION_COLUMNS = (
    "subscription",
    "update",
    "time",
    "alteration",
    "changed",
    "meta_changed",
    "requested",
    "located",
)
"""The columns of a row :func:`decided` takes: a match, with its update's step."""

_ANY_URL = AllowList.parse(["*"])  # a replay sends nothing: every notification URL is fine


@dataclass(frozen=True, slots=True)
class FrontSubscription:
    """A subscription as the HTTP front holds it: its tenant, scope and document."""

    id: str
    tenant: str
    scope: str
    document: Mapping[str, Any]

    def __post_init__(self) -> None:
        if self.document.get("status") == "expired":  # as listed: expires decides
            object.__setattr__(
                self, "document", {k: v for k, v in self.document.items() if k != "status"}
            )

    def held(self) -> HttpSubscription:
        """The subscription as the front holds it when created (InvalidInput if the
        document is not valid)."""
        parsed = parse_document(dict(self.document), _ANY_URL)
        return HttpSubscription(self.id, self.tenant, self.scope, parsed)

    def matched(self) -> Subscription:
        """What the front places with the matchers (InvalidInput if not valid)."""
        spec = self.held().spec()
        return subscription_from_spec(spec, id=self.id, subscriber="0")

    def packed(self) -> list[Any]:
        """The subscription as JSON (read back by :func:`fronts_of`)."""
        return [self.id, self.tenant, self.scope, self.document]


def fronts_of(data: bytes) -> dict[str, FrontSubscription]:
    """The subscriptions of ``json.dumps([s.packed() ...])``, by id."""
    return {row[0]: FrontSubscription(*row) for row in json.loads(data)}


def decided(
    fronts: Callable[[], Mapping[str, FrontSubscription]],
) -> Callable[[Iterable[Any]], Iterator[tuple[int, str]]]:
    """The ``mapPartitions`` function of the decision pass: rows of
    :data:`DECISION_COLUMNS` sorted by subscription, then update, to the ``(update,
    subscription)`` pairs that notify. ``fronts`` gives the front's subscriptions (called
    once, when a row needs them)."""

    def run(rows: Iterable[Any]) -> Iterator[tuple[int, str]]:
        held: Mapping[str, FrontSubscription] | None = None
        last_id: str | None = None
        current: HttpSubscription | None = None
        for subscription_id, update, at, alteration, changed, meta, requested, located in rows:
            if subscription_id != last_id:
                if held is None:
                    held = fronts()
                last_id = subscription_id
                front = held.get(subscription_id)
                current = None if front is None else front.held()
            if current is None or fires_one(
                current,
                at,
                partial(_change, alteration, changed, meta, requested),
                partial(_location, located),
            ):
                yield (update, subscription_id)

    return run


def _change(
    alteration: str, changed: Iterable[str], meta: Iterable[str], requested: Iterable[str]
) -> Change:
    return Change(Alteration(alteration), frozenset(changed), frozenset(meta), frozenset(requested))


def _location(located: str | None) -> Location | None:
    return None if located is None else first_location(json.loads(located))
