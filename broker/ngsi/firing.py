"""Which subscriptions a matched batch fires, decided in bulk.

The matchers hand the front a batch of (handle, entity index) pairs; with tens of matches per
update, deciding them one by one in Python costs the connection point more than taking the
update did. :class:`Firing` keeps the front's subscriptions as arrays sorted by handle and
decides with numpy: a *plain* subscription (active, no throttling, no expiry) fires when its
rule does, and a rule (alteration types, condition attributes, notifyOnMetadataChange) is
worked out once per entity of the batch (:meth:`Change.fires`); the others (oneshot,
throttled, expiring, inactive) are decided one by one as Orion says (ngsi-v2.md section 3),
by :func:`fires_one` (which ``silbo replay`` uses for every pair: spark_matcher.decisions).
A geographical subscription (``expression.georel``...) fires only if the entity published,
whole after its update, has its location in the relation asked
(:meth:`~broker.store.geo.GeoFilter.matches`): the matchers checked the selectors, ``q`` and
``mq`` on that same entity, so they match every entity of its type for a ``near`` circle
and the front keeps the few the circle holds. A plain one is decided with the plain ones,
then its pairs kept only if its filter takes the location: the filters of the plain
geographical subscriptions are filed in a spatial index (:class:`~broker.store.geo_index.GeoIndex`),
asked once per entity of the batch, so that an update matched for 10,000 circles is tested
exactly against the few whose box holds it, not against each; the others check their
filter one by one. An entity's location is read once per batch.
Every pair that fires counts in its subscription's ``timesSent`` and ``lastNotification``.

The arrays are made again on the first batch after :meth:`Firing.invalidate` (a subscription
created, changed or deleted); a plain subscription found no longer active when it fires (the
delivery worker's report made it inactive) is left out, and the arrays made again next time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial

import numpy as np
import numpy.typing as npt

from broker.ngsi.change import Alteration, Change, read_change
from broker.ngsi.subscriptions import HttpSubscription
from broker.store.geo import LOCATION_TYPES, GeoFilter, Location, first_location
from broker.store.geo_index import GeoIndex
from broker.wire import client_pb2 as pb
from broker.wire import internal_pb2 as wire
from broker.wire.convert import value_from_wire

__all__ = ["Fired", "Firing", "fires_one"]

Rule = tuple[tuple[Alteration, ...], tuple[str, ...], bool]
_ONE_BY_ONE = -1  # a subscription's rule number when it is decided one by one
_UNKNOWN = -2  # a handle no subscription has (deleted or replaced since it was matched)


@dataclass(frozen=True, slots=True)
class Fired:
    """What fired in a batch: the entities notified (their bytes), and per notification,
    in the batch's order, the subscription's worker number and its entity's position in
    ``entities``; ``counts``: how many notifications each subscription got."""

    entities: list[bytes]
    numbers: list[int]
    indexes: list[int]
    counts: list[tuple[HttpSubscription, int]]


class Firing:
    """The front's subscriptions by matcher handle, as arrays (see the module doc)."""

    def __init__(self, by_handle: Mapping[int, HttpSubscription]) -> None:
        self._by_handle = by_handle
        self._stale = True
        self._handles: npt.NDArray[np.uint64] = np.zeros(0, dtype=np.uint64)
        self._rule_of: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
        self._numbers: npt.NDArray[np.uint32] = np.zeros(0, dtype=np.uint32)
        self._subscriptions: list[HttpSubscription] = []
        self._rules: list[Rule] = []
        # a plain subscription's filter's position in the index (-1: none)
        self._filter_of: npt.NDArray[np.int64] = np.zeros(0, dtype=np.int64)
        self._index = GeoIndex([])

    def invalidate(self) -> None:
        """A subscription was created, changed or deleted: make the arrays again."""
        self._stale = True

    def decide(self, batch: wire.NotificationBatchOut, now: float) -> Fired | None:
        """What a matched batch fires (None if nothing), its bookkeeping done."""
        if self._stale:
            self._make()
        handles = np.frombuffer(batch.handles, dtype="<u8")
        indexes = np.frombuffer(batch.entity_index, dtype="<u4").astype(np.int64)
        if not len(handles) or not len(self._handles):
            return None
        at = np.searchsorted(self._handles, handles)
        at[at >= len(self._handles)] = 0
        rules = np.where(self._handles[at] == handles, self._rule_of[at], _UNKNOWN)
        changes: dict[int, Change] = {}
        locations: dict[int, Location | None] = {}
        fires = self._plain(rules, indexes, batch, changes)
        self._located(at, indexes, batch, fires, locations)
        self._one_by_one(rules, at, indexes, batch, changes, now, fires, locations)
        counts = self._count(at, fires, now)
        if not fires.any():
            return None
        used, entity_of = np.unique(indexes[fires], return_inverse=True)
        return Fired(
            [batch.entities[i] for i in used.tolist()],
            self._numbers[at[fires]].tolist(),
            entity_of.tolist(),
            counts,
        )

    def _make(self) -> None:
        handles = np.fromiter(self._by_handle.keys(), dtype=np.uint64, count=len(self._by_handle))
        order = np.argsort(handles)
        subscriptions = list(self._by_handle.values())
        self._subscriptions = [subscriptions[i] for i in order.tolist()]
        self._handles = handles[order]
        self._numbers = np.array([s.number for s in self._subscriptions], dtype=np.uint32)
        numbering: dict[Rule, int] = {}
        rule_of = []
        filters: list[GeoFilter] = []
        filter_of = []
        for s in self._subscriptions:
            p = s.parsed
            filter_of.append(-1)
            if s.status != "active" or p.throttling or p.expires is not None:
                rule_of.append(_ONE_BY_ONE)
                continue
            if p.geo is not None:
                filter_of[-1] = len(filters)
                filters.append(p.geo)
            rule = (p.alterations, p.condition_attrs, p.notify_on_metadata)
            rule_of.append(numbering.setdefault(rule, len(numbering)))
        self._rule_of = np.array(rule_of, dtype=np.int64)
        self._filter_of = np.array(filter_of, dtype=np.int64)
        self._index = GeoIndex(filters)
        self._rules = list(numbering)
        self._stale = False

    def _plain(
        self,
        rules: npt.NDArray[np.int64],
        indexes: npt.NDArray[np.int64],
        batch: wire.NotificationBatchOut,
        changes: dict[int, Change],
    ) -> npt.NDArray[np.bool_]:
        """Whether each pair of a plain subscription fires (False for the others)."""
        fires = np.zeros(len(rules), dtype=bool)
        plain = rules >= 0
        if not plain.any():
            return fires
        keys = indexes[plain] * len(self._rules) + rules[plain]
        unique, inverse = np.unique(keys, return_inverse=True)
        verdicts = np.zeros(len(unique), dtype=bool)
        for k, key in enumerate(unique.tolist()):
            index, number = divmod(key, len(self._rules))
            alterations, condition, on_metadata = self._rules[number]
            change = _change(batch, index, changes)
            verdicts[k] = change.alteration in alterations and change.fires(condition, on_metadata)
        fires[plain] = verdicts[inverse]
        return fires

    def _located(
        self,
        at: npt.NDArray[np.intp],
        indexes: npt.NDArray[np.int64],
        batch: wire.NotificationBatchOut,
        fires: npt.NDArray[np.bool_],
        locations: dict[int, Location | None],
    ) -> None:
        """Leave out of ``fires`` the pairs of plain geographical subscriptions whose filter
        does not take their entity's location (the index, asked once per entity)."""
        if not len(self._index):
            return
        geo = fires & (self._filter_of[at] >= 0)
        if not geo.any():
            return
        entities = indexes[geo]
        used = np.unique(entities)
        located = [_location(batch, i, locations) for i in used.tolist()]
        where, taken = self._index.matching(located)
        size = len(self._index)
        allowed = used[where] * size + taken
        fires[geo] = np.isin(entities * size + self._filter_of[at[geo]], allowed)

    def _one_by_one(
        self,
        rules: npt.NDArray[np.int64],
        at: npt.NDArray[np.intp],
        indexes: npt.NDArray[np.int64],
        batch: wire.NotificationBatchOut,
        changes: dict[int, Change],
        now: float,
        fires: npt.NDArray[np.bool_],
        locations: dict[int, Location | None],
    ) -> None:
        """Decide the pairs of the other subscriptions, in order (throttling and oneshot
        depend on what fired before), doing their bookkeeping (``locations``: the entities'
        locations read so far, by index in the batch)."""
        for i in np.flatnonzero(rules == _ONE_BY_ONE).tolist():
            index = int(indexes[i])
            fires[i] = fires_one(
                self._subscriptions[at[i]],
                now,
                partial(_change, batch, index, changes),
                partial(_location, batch, index, locations),
            )

    def _count(
        self, at: npt.NDArray[np.intp], fires: npt.NDArray[np.bool_], now: float
    ) -> list[tuple[HttpSubscription, int]]:
        """Each firing subscription and its count; the plain ones' bookkeeping (one found
        inactive is left out of ``fires``)."""
        chosen, counts = np.unique(at[fires], return_counts=True)
        plain = (self._rule_of[chosen] >= 0).tolist()
        subscriptions = self._subscriptions
        out = []
        for position, count, is_plain in zip(chosen.tolist(), counts.tolist(), plain, strict=True):
            subscription = subscriptions[position]
            if is_plain:
                if subscription.status != "active":
                    fires[at == position] = False
                    self._stale = True
                    continue
                subscription.times_sent += count
                subscription.last_notification = now
            out.append((subscription, count))
        return out


def fires_one(
    subscription: HttpSubscription,
    now: float,
    change: Callable[[], Change],
    location: Callable[[], Location | None],
) -> bool:
    """Whether one matched pair of ``subscription`` fires at ``now``, its bookkeeping done if
    it does (``timesSent``, ``lastNotification``, a ``oneshot`` made ``inactive``). Pairs of
    one subscription are decided in order: throttling and oneshot depend on what fired
    before. ``change`` and ``location`` give the entity's change and location, read only
    when needed. For a plain subscription it decides what :class:`Firing` decides in bulk
    (``silbo replay`` decides every pair with it: spark_matcher.decisions)."""
    p = subscription.parsed
    if subscription.status not in ("active", "oneshot") or subscription.expired(now):
        return False
    last = subscription.last_notification
    if p.throttling and last is not None and now - last < p.throttling:
        return False
    changed = change()
    if changed.alteration not in p.alterations:
        return False
    if not changed.fires(p.condition_attrs, p.notify_on_metadata):
        return False
    if p.geo is not None and not p.geo.matches(location()):
        return False
    subscription.times_sent += 1
    subscription.last_notification = now
    if subscription.status == "oneshot":
        subscription.status = "inactive"
    return True


def _location(
    batch: wire.NotificationBatchOut, index: int, locations: dict[int, Location | None]
) -> Location | None:
    """The location of the batch's entity ``index`` (its first geo-typed attribute)."""
    if index not in locations:
        entity = pb.Entity.FromString(batch.entities[index])
        locations[index] = first_location(
            (
                a.type,
                value_from_wire(a.value),
                {m.name: value_from_wire(m.value) for m in a.metadata},
            )
            for a in entity.attributes
            if a.type in LOCATION_TYPES  # the others' values are not decoded
        )
    return locations[index]


def _change(batch: wire.NotificationBatchOut, index: int, changes: dict[int, Change]) -> Change:
    change = changes.get(index)
    if change is None:
        change = changes[index] = read_change(batch.entities[index])
    return change
