"""The last values: a bounded cache of the entities this front has seen updated.

Silbo is a broker, not a context store. The front keeps, per (tenant, service path, entity
id, entity type), the attributes the latest update left, in a least-recently-used cache
(100,000 entities by default). It is what lets the front

- publish the whole entity (so ``q`` sees every attribute and notifications carry them all),
- tell a create from a change from an update with no change (alteration types),
- answer Orion's 404 / 422 for operations on entities or attributes that do not exist.

An entity the cache has forgotten (evicted, or updated through another connection point)
does not exist for this front: see docs/ngsi.md.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from broker.errors import AlreadyExists, NotFound, SilboError
from broker.model.update import DEFAULT_ENTITY_TYPE
from broker.ngsi.change import Alteration, Change
from broker.ngsi.entity import Attributes
from broker.ngsi.errors import PartialUpdate, TooManyResults, Unprocessable
from broker.store.semantics import Mode  # what an update operation does: one enum for both

__all__ = ["DEFAULT_LIMIT", "Key", "LastValues", "Mode", "Outcome"]

DEFAULT_LIMIT = 100_000

Key = tuple[str, str, str, str]  # tenant, service path, entity id, entity type


@dataclass(frozen=True, slots=True)
class Outcome:
    """What to publish after an operation, and the error to answer if it applied in part."""

    key: Key
    attributes: Attributes
    change: Change
    partial: SilboError | None = None

    @property
    def created(self) -> bool:
        """Tell whether the operation created the entity."""
        return self.change.alteration is Alteration.CREATE


_MUST_EXIST = frozenset(Mode) - {Mode.CREATE, Mode.UPSERT}


class LastValues:
    """The bounded cache (see the module doc). Not thread-safe: one event loop uses it."""

    def __init__(self, limit: int = DEFAULT_LIMIT) -> None:
        self._limit = limit
        self._entities: OrderedDict[Key, Attributes] = OrderedDict()
        self._types: dict[tuple[str, str, str], set[str]] = {}

    def __len__(self) -> int:
        return len(self._entities)

    def get(self, key: Key) -> Attributes | None:
        """The last attributes of an entity, or None if it is not (or no longer) known."""
        return self._entities.get(key)

    def resolve(self, tenant: str, path: str, entity_id: str, entity_type: str | None) -> Key:
        """The key of an entity named by id and, maybe, type (TooManyResults if ambiguous)."""
        if entity_type is not None:
            return (tenant, path, entity_id, entity_type)
        types = self._types.get((tenant, path, entity_id), set())
        if len(types) > 1:
            raise TooManyResults(
                f"there is more than one entity with id {entity_id!r}: name its type (?type=)"
            )
        known = next(iter(types)) if types else DEFAULT_ENTITY_TYPE
        return (tenant, path, entity_id, known)

    def apply(
        self,
        key: Key,
        mode: Mode,
        attributes: Attributes,
        *,
        forced: bool = False,
        correlator: str = "",
    ) -> Outcome:
        """Apply an operation; the whole entity to publish and what changed.

        Raises (nothing applied) AlreadyExists, NotFound, Unprocessable or PartialUpdate as
        Orion answers; an outcome's ``partial`` is set when some of it applied.
        """
        old = self._entities.get(key)
        if old is None and mode in _MUST_EXIST:
            raise NotFound("The requested entity has not been found. Check type and id")
        if old is not None and mode is Mode.CREATE:
            raise AlreadyExists("Already Exists")
        requested = frozenset(attributes)
        if old is None:
            new = dict(attributes)
            change = Change(Alteration.CREATE, requested, frozenset(), requested, correlator)
            self._store(key, new)
            return Outcome(key, new, change)
        if mode is Mode.DELETE_ENTITY:
            self._forget(key)
            return Outcome(key, old, Change(Alteration.DELETE, correlator=correlator))
        new, applied, partial = _applied(old, mode, attributes)
        changed, meta_changed = _difference(old, new)
        if forced:
            changed |= frozenset(applied)
        alteration = Alteration.CHANGE if changed or meta_changed else Alteration.UPDATE
        self._store(key, new)
        change = Change(alteration, changed, meta_changed, requested, correlator)
        return Outcome(key, new, change, partial)

    def _store(self, key: Key, attributes: Attributes) -> None:
        self._entities[key] = attributes
        self._entities.move_to_end(key)
        self._types.setdefault(key[:3], set()).add(key[3])
        while len(self._entities) > self._limit:
            oldest, _attributes = self._entities.popitem(last=False)
            self._untype(oldest)

    def _forget(self, key: Key) -> None:
        del self._entities[key]
        self._untype(key)

    def _untype(self, key: Key) -> None:
        types = self._types.get(key[:3])
        if types is not None:
            types.discard(key[3])
            if not types:
                del self._types[key[:3]]


def _applied(
    old: Attributes, mode: Mode, attributes: Attributes
) -> tuple[Attributes, list[str], SilboError | None]:
    """The new attributes, the names applied, and the error for what was not."""
    present = [a for a in attributes if a in old]
    absent = [a for a in attributes if a not in old]
    partial: SilboError | None = None
    if mode is Mode.REPLACE:
        return dict(attributes), list(attributes), None
    if mode is Mode.APPEND_STRICT and present:
        if not absent:
            raise Unprocessable(f"Attributes already exist: {present}")
        partial = PartialUpdate(f"Some of the attributes already exist: {present}")
        attributes = {a: attributes[a] for a in absent}
    if mode in (Mode.UPDATE, Mode.REPLACE_ATTRIBUTE, Mode.DELETE_ATTRIBUTES) and absent:
        if mode is Mode.REPLACE_ATTRIBUTE or (mode is Mode.DELETE_ATTRIBUTES and not present):
            raise NotFound("The entity does not have such an attribute")
        if not present:
            raise Unprocessable(f"The attributes in the request do not exist: {absent}")
        partial = PartialUpdate(f"Some of the attributes do not exist: {absent}")
        attributes = {a: attributes[a] for a in present}
    new = dict(old)
    if mode is Mode.DELETE_ATTRIBUTES:
        for name in attributes:
            del new[name]
        return new, list(attributes), partial
    for name, attribute in attributes.items():
        if name in old and mode is not Mode.REPLACE_ATTRIBUTE:
            attribute = {
                **attribute,
                "metadata": {**old[name]["metadata"], **attribute["metadata"]},
            }
        new[name] = attribute
    return new, list(attributes), partial


def _difference(old: Attributes, new: Attributes) -> tuple[frozenset[str], frozenset[str]]:
    """(attributes whose type or value differ, or that appeared or went; those whose
    metadata alone differ)."""
    changed: set[str] = set(old.keys() ^ new.keys())
    meta: set[str] = set()
    for name in old.keys() & new.keys():
        a, b = old[name], new[name]
        if a is b:
            continue  # not touched by the operation
        if a["type"] != b["type"] or not _same(a["value"], b["value"]):
            changed.add(name)
        elif a["metadata"] != b["metadata"]:
            meta.add(name)
    return frozenset(changed), frozenset(meta)


def _same(a: object, b: object) -> bool:
    """JSON equality that tells true from 1 (Python's == does not)."""
    return (type(a) is type(b) and a == b) or (
        isinstance(a, int | float)
        and isinstance(b, int | float)
        and not isinstance(a, bool)
        and not isinstance(b, bool)
        and a == b
    )
