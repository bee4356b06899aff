"""The indexed matching engine: the subscriptions a matcher holds, and matching against them.

Layout, from an update to its matches:

1. ``tenant -> scope -> (entity id | None, entity type | None) -> ClauseGroup``: an update
   looks up its tenant, the scopes that cover its service path (its own path, ``/#`` and each
   ancestor's ``/x/#``, remembered per path), and in each scope at most four keys — so the
   cost does not grow with subscriptions that cannot match it;
2. inside a group, per-attribute bitset indexes narrow the clauses down (see
   :mod:`broker.matching.clause_group` and :mod:`broker.matching.attribute_index`);
3. the few clauses the indexes cannot decide exactly are checked with the reference semantics.

Each subscription gets a *slot*, a small integer, for as long as it is held. The hot path
works in slots: :meth:`Engine.match_slots` returns a numpy array of them without touching one
Python object per match, and :meth:`Engine.ids` turns slots into subscription ids when they
are needed. :meth:`Engine.match` does both.

Inactive subscriptions are held (so they can be listed and moved) but not indexed. Results
equal :class:`broker.matching.reference.ReferenceMatcher`'s on every input; the property
tests in tests/matching hold the two together.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import numpy.typing as npt

from broker.errors import InvalidSubscription, NotFound
from broker.matching.bitset import decode_many
from broker.matching.clause_group import RUN_LIMIT, Clause, ClauseGroup, CompiledGroup, Matches
from broker.model.identifiers import scopes_covering
from broker.model.subscription import Status, Subscription
from broker.model.update import ContextUpdate

__all__ = ["Engine"]

_Key = tuple[str | None, str | None]
_PATH_CACHE_LIMIT = 4096
_NO_SLOTS: npt.NDArray[np.int64] = np.empty(0, dtype=np.int64)
REBUILD_BUDGET = RUN_LIMIT // 4  # clauses remove_many rebuilds at most (after its first run)


class _TenantIndex:
    """One tenant's groups, by scope and then by (id, type) key."""

    __slots__ = ("_covering", "scopes")

    def __init__(self) -> None:
        self.scopes: dict[str, dict[_Key, ClauseGroup]] = {}
        self._covering: dict[str, list[dict[_Key, ClauseGroup]]] = {}

    def group(self, scope: str, key: _Key) -> ClauseGroup:
        table = self.scopes.get(scope)
        if table is None:
            table = self.scopes[scope] = {}
            self._covering.clear()
        group = table.get(key)
        if group is None:
            group = table[key] = ClauseGroup()
        return group

    def drop_if_empty(self, scope: str, key: _Key) -> None:
        table = self.scopes.get(scope)
        if table is None or len(table[key]) > 0:
            return
        del table[key]
        if not table:
            del self.scopes[scope]
            self._covering.clear()

    def tables_for(self, path: str) -> list[dict[_Key, ClauseGroup]]:
        """The group tables of every scope that covers ``path``."""
        tables = self._covering.get(path)
        if tables is None:
            scopes = self.scopes
            tables = [scopes[s] for s in scopes_covering(path) if s in scopes]
            if len(self._covering) >= _PATH_CACHE_LIMIT:
                self._covering.clear()
            self._covering[path] = tables
        return tables


class Engine:
    """Holds subscriptions in indexes and matches updates against them."""

    def __init__(self, subscriptions: Iterable[Subscription] = ()) -> None:
        self._subscriptions: dict[str, Subscription] = {}
        self._tenants: dict[str, _TenantIndex] = {}
        self._slot_of: dict[str, int] = {}
        self._ids: list[str] = []  # slot -> subscription id ("" while the slot is free)
        self._free_slots: list[int] = []
        self._multi_clause = 0  # subscriptions with several clauses: results need de-duplicating
        self._version = 0  # counts changes: equal versions hold equal subscriptions
        for subscription in subscriptions:
            self.add(subscription)

    def __len__(self) -> int:
        return len(self._subscriptions)

    @property
    def version(self) -> int:
        """A number that changes whenever a subscription is added or removed."""
        return self._version

    def __contains__(self, subscription_id: object) -> bool:
        return subscription_id in self._subscriptions

    def __iter__(self) -> Iterator[Subscription]:
        return iter(self._subscriptions.values())

    def get(self, subscription_id: str) -> Subscription:
        """The subscription with that id; NotFound if there is none."""
        try:
            return self._subscriptions[subscription_id]
        except KeyError:
            raise NotFound(f"no subscription {subscription_id!r}") from None

    def slot_of(self, subscription_id: str) -> int | None:
        """The slot a held, active subscription occupies (None for inactive or unknown ones)."""
        return self._slot_of.get(subscription_id)

    def subscriptions(self) -> list[Subscription]:
        """Every subscription held."""
        return list(self._subscriptions.values())

    def held_slots(self) -> npt.NDArray[np.int64]:
        """The slots of every held, active subscription, ascending (:meth:`ids` names them)."""
        taken: npt.NDArray[np.bool_] = np.array(self._ids, dtype=object) != ""
        return np.flatnonzero(taken).astype(np.int64)

    def inactive(self) -> list[Subscription]:
        """The held subscriptions that have no slot (inactive ones)."""
        if len(self._slot_of) == len(self._subscriptions):
            return []
        slot_of = self._slot_of
        return [s for s in self._subscriptions.values() if s.id not in slot_of]

    def add(self, subscription: Subscription) -> None:
        """Add a subscription, replacing any with the same id."""
        self._version += 1
        if not isinstance(subscription, Subscription):
            raise InvalidSubscription(f"{subscription!r} is not a Subscription")
        if subscription.id in self._subscriptions:
            self.remove(subscription.id)
        self._subscriptions[subscription.id] = subscription
        if subscription.status is Status.INACTIVE:
            return
        if self._free_slots:
            slot = self._free_slots.pop()
            self._ids[slot] = subscription.id
        else:
            slot = len(self._ids)
            self._ids.append(subscription.id)
        self._slot_of[subscription.id] = slot
        if len(subscription.entities) > 1:
            self._multi_clause += 1
        tenant = self._tenants.get(subscription.tenant)
        if tenant is None:
            tenant = self._tenants[subscription.tenant] = _TenantIndex()
        for selector in subscription.entities:
            group = tenant.group(subscription.service_path, (selector.id, selector.type))
            group.add(Clause(subscription, selector, slot))

    def add_many(self, subscriptions: Iterable[Subscription]) -> None:
        """``add`` for each subscription, in order, with each group visited once.

        InvalidSubscription, with nothing added, if one of them is not a Subscription.
        """
        self._version += 1
        batch = list(subscriptions)
        for subscription in batch:
            if not isinstance(subscription, Subscription):
                raise InvalidSubscription(f"{subscription!r} is not a Subscription")
        held = self._subscriptions
        slot_of, ids, free = self._slot_of, self._ids, self._free_slots
        by_group: dict[tuple[str, str, _Key], list[Clause]] = {}
        for subscription in batch:
            subscription_id = subscription.id
            if subscription_id in held:
                self._flush_clauses(by_group)  # the one replaced may have clauses waiting
                by_group = {}
                self.remove(subscription_id)
            held[subscription_id] = subscription
            if subscription.status is Status.INACTIVE:
                continue
            if free:
                slot = free.pop()
                ids[slot] = subscription_id
            else:
                slot = len(ids)
                ids.append(subscription_id)
            slot_of[subscription_id] = slot
            entities = subscription.entities
            if len(entities) > 1:
                self._multi_clause += 1
            tenant, scope = subscription.tenant, subscription.service_path
            for selector in entities:
                where = (tenant, scope, (selector.id, selector.type))
                clauses = by_group.get(where)
                if clauses is None:
                    clauses = by_group[where] = []
                clauses.append(Clause(subscription, selector, slot))
        self._flush_clauses(by_group)

    def _flush_clauses(self, by_group: dict[tuple[str, str, _Key], list[Clause]]) -> None:
        for (tenant_name, scope, key), clauses in by_group.items():
            tenant = self._tenants.get(tenant_name)
            if tenant is None:
                tenant = self._tenants[tenant_name] = _TenantIndex()
            tenant.group(scope, key).add_many(clauses)

    def remove(self, subscription_id: str) -> Subscription:
        """Remove and return a subscription; NotFound if there is none with that id."""
        self._version += 1
        subscription = self._subscriptions.pop(subscription_id, None)
        if subscription is None:
            raise NotFound(f"no subscription {subscription_id!r}")
        slot = self._slot_of.pop(subscription_id, None)
        if slot is None:  # inactive: never indexed
            return subscription
        self._ids[slot] = ""
        self._free_slots.append(slot)
        if len(subscription.entities) > 1:
            self._multi_clause -= 1
        tenant = self._tenants.get(subscription.tenant)
        if tenant is not None:
            for key in _keys(subscription):
                table = tenant.scopes.get(subscription.service_path)
                group = table.get(key) if table is not None else None
                if group is not None:
                    group.remove(subscription_id)
                    tenant.drop_if_empty(subscription.service_path, key)
            if not tenant.scopes:
                del self._tenants[subscription.tenant]
        return subscription

    def remove_many(
        self, subscription_ids: Iterable[str], rebuild_budget: int = REBUILD_BUDGET
    ) -> list[Subscription]:
        """Remove and return the subscriptions with these ids (each once), with each group
        changed once; NotFound, with nothing removed, if one of them is not held.

        The runs this leaves more than half dead are rebuilt up to ``rebuild_budget``
        clauses (beyond the first run; none with 0); the rest by later calls or
        ``compaction``. Removing a slice at a time from many groups, whose runs all fill
        with dead clauses at the same pace, would otherwise rebuild them all in one slice.
        Dead clauses cost matching what they cost alive: rebuilding can wait.
        """
        self._version += 1
        wanted = list(dict.fromkeys(subscription_ids))
        held = self._subscriptions
        for subscription_id in wanted:
            if subscription_id not in held:
                raise NotFound(f"no subscription {subscription_id!r}")
        removed = []
        slot_of, ids, free = self._slot_of, self._ids, self._free_slots
        by_group: dict[tuple[str, str, _Key], list[str]] = {}
        for subscription_id in wanted:
            subscription = held.pop(subscription_id)
            removed.append(subscription)
            slot = slot_of.pop(subscription_id, None)
            if slot is None:  # inactive: never indexed
                continue
            ids[slot] = ""
            free.append(slot)
            entities = subscription.entities
            if len(entities) > 1:
                self._multi_clause -= 1
            tenant_of, scope_of = subscription.tenant, subscription.service_path
            keys = (
                _keys(subscription) if len(entities) > 1 else ((entities[0].id, entities[0].type),)
            )
            for key in keys:
                where = (tenant_of, scope_of, key)
                group_ids = by_group.get(where)
                if group_ids is None:
                    group_ids = by_group[where] = []
                group_ids.append(subscription_id)
        budget = rebuild_budget
        for (tenant_name, scope, key), group_ids in by_group.items():
            tenant = self._tenants.get(tenant_name)
            table = tenant.scopes.get(scope) if tenant is not None else None
            group = table.get(key) if table is not None else None
            if tenant is not None and group is not None:
                group.remove_many(group_ids)
                if budget > 0:
                    budget -= group.rebuild_dead(budget)
                tenant.drop_if_empty(scope, key)
        for tenant_name in {name for name, _, _ in by_group}:
            tenant = self._tenants.get(tenant_name)
            if tenant is not None and not tenant.scopes:
                del self._tenants[tenant_name]
        return removed

    def compaction(self) -> Iterator[int]:
        """``compact``, a step at a time: each step builds one run of a group (at most
        ``RUN_LIMIT`` clauses, see :class:`ClauseGroup`) and yields how many clauses it
        compiled; the largest groups first (updates reach them most often).

        Matching, adding and removing may go on between steps; the groups to build are
        those of the first step's time (groups added later wait for their first match).
        """
        groups = [
            group
            for tenant in self._tenants.values()
            for table in tenant.scopes.values()
            for group in table.values()
            if group.dirty()
        ]
        groups.sort(key=len, reverse=True)
        for group in groups:
            yield from group.compaction()

    def compact(self) -> None:
        """Build every index now (otherwise groups build lazily when they first match)."""
        for _ in self.compaction():
            pass

    def match(self, update: ContextUpdate, now: float | None = None) -> set[str]:
        """The ids of every subscription that matches ``update``."""
        ids = self._ids
        slots = self.match_slots(update, now)
        return {ids[slot] for slot in slots.tolist()}

    def match_batch(
        self, updates: Sequence[ContextUpdate], now: float | None = None
    ) -> list[set[str]]:
        """``match`` for each update, in order."""
        ids = self._ids
        return [
            {ids[slot] for slot in slots.tolist()} for slots in self.match_batch_slots(updates, now)
        ]

    def match_slots(self, update: ContextUpdate, now: float | None = None) -> npt.NDArray[np.int64]:
        """The slots of every subscription that matches ``update`` (no duplicates)."""
        out = Matches()
        self._collect(update, time.time() if now is None else now, out)
        return self._result(out)

    def match_batch_slots(
        self, updates: Sequence[ContextUpdate], now: float | None = None
    ) -> list[npt.NDArray[np.int64]]:
        """``match_slots`` for each update, in order.

        Large bitsets are decoded once per group for the whole batch, which is what makes
        matching in batches faster than one by one.
        """
        now = time.time() if now is None else now
        deferred: list[tuple[CompiledGroup, int, int]] = []
        outs = [Matches(deferred=deferred, index=i) for i in range(len(updates))]
        collect = self._collect
        for update, out in zip(updates, outs, strict=True):
            collect(update, now, out)
        by_group: dict[int, tuple[CompiledGroup, list[int], list[int]]] = {}
        for compiled, index, bits in deferred:
            entry = by_group.get(id(compiled))
            if entry is None:
                entry = by_group[id(compiled)] = (compiled, [], [])
            entry[1].append(index)
            entry[2].append(bits)
        for compiled, indexes, sets in by_group.values():
            positions, bounds = decode_many(sets, compiled.size)
            slots = compiled.slots[positions]
            for i, index in enumerate(indexes):
                outs[index].arrays.append(slots[bounds[i] : bounds[i + 1]])
        result = self._result
        return [result(out) for out in outs]

    def ids(self, slots: npt.NDArray[np.int64]) -> list[str]:
        """The subscription ids of slots returned by the last matches."""
        ids = self._ids
        return [ids[slot] for slot in slots.tolist()]

    def _collect(self, update: ContextUpdate, now: float, out: Matches) -> None:
        tenant = self._tenants.get(update.tenant)
        if tenant is None:
            return
        entity_id, entity_type = update.entity_id, update.entity_type
        keys = ((entity_id, entity_type), (entity_id, None), (None, entity_type), (None, None))
        for table in tenant.tables_for(update.service_path):
            for key in keys:
                group = table.get(key)
                if group is not None:
                    group.match(update, now, out)

    def _result(self, out: Matches) -> npt.NDArray[np.int64]:
        arrays = out.arrays
        if out.slots:
            arrays.append(np.array(out.slots, dtype=np.int64))
        if not arrays:
            return _NO_SLOTS
        result = arrays[0] if len(arrays) == 1 else np.concatenate(arrays)
        if self._multi_clause and len(result) > 1:
            result = np.unique(result)
        return result


def _keys(subscription: Subscription) -> Iterable[_Key]:
    return {(s.id, s.type) for s in subscription.entities}
