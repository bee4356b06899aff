"""The selector: which matcher owns each subscription, by rendezvous hashing.

Rendezvous (highest-random-weight) hashing gives every (subscription id, owner) pair a
pseudo-random 64-bit weight; the owner with the highest weight owns the id. Adding an owner
moves to it exactly the ids it now wins (about ``1/(n+1)`` of them) and moves nothing else;
removing an owner moves only the ids it owned. So a scale operation ships only what moves.

The weights are fixed by this module and must never change silently: every process (and
every version of it) must agree on the owner of every id. They are::

    h(id)    = first 8 bytes of blake2b(utf-8(id), person=b"silbo-sub"), little-endian
    h(owner) = first 8 bytes of blake2b(utf-8(owner), person=b"silbo-owner"), little-endian
    weight   = splitmix64_finalizer(h(id) XOR h(owner))            (uint64 arithmetic)

Ties (probability about 2**-64) go to the owner whose name sorts first. The selector is a
function of the *set* of owners: owners are kept sorted, and two selectors with the same
owners are equal. The pinned table in tests/partition/test_selector.py breaks if any of
this changes.

Replicas: with ``replicas = r`` each id is held by its *preference list*, the ``r`` owners
of highest weight, best first (all owners when there are fewer than ``r``); the first is the
``owner_of``. Removing an owner changes only the lists it was on (the next owner by weight
joins each), so a failure moves no state: every list keeps its surviving members.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from broker.errors import InvalidInput, SerializationError

__all__ = [
    "SELECTOR_KIND",
    "SELECTOR_VERSION",
    "RendezvousSelector",
    "Selector",
    "id_hashes",
    "moved",
]

SELECTOR_KIND = "rendezvous"
SELECTOR_VERSION = 1

_MASK = (1 << 64) - 1
_C1 = 0xBF58476D1CE4E5B9
_C2 = 0x94D049BB133111EB
_ID_PERSON = b"silbo-sub"
_OWNER_PERSON = b"silbo-owner"

_U64 = npt.NDArray[np.uint64]


class Selector(Protocol):
    """What the rest of the broker needs from a selector."""

    @property
    def owners(self) -> tuple[str, ...]: ...

    def owner_of(self, subscription_id: str) -> str: ...

    def owners_of(self, subscription_ids: Sequence[str]) -> list[str]: ...

    def holders_of(self, subscription_ids: Sequence[str]) -> list[tuple[str, ...]]: ...


@dataclass(frozen=True, slots=True)
class RendezvousSelector:
    """Maps subscription ids to owners (matcher names) by highest-random-weight hashing.

    Raises InvalidInput when ``owners`` is empty, has duplicates or has a name that is not
    a non-empty string, or when ``replicas`` is not a positive integer.
    """

    owners: tuple[str, ...]
    replicas: int = 1  # how many owners hold each id (see the module doc)
    _owner_hashes: tuple[int, ...] = field(init=False, repr=False, compare=False)
    _owner_array: _U64 = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        owners = _check_owners(self.owners)
        replicas = self.replicas
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
            raise InvalidInput(f"replicas must be a positive integer, not {replicas!r}")
        hashes = tuple(_hash(owner, _OWNER_PERSON) for owner in owners)
        object.__setattr__(self, "owners", owners)
        object.__setattr__(self, "_owner_hashes", hashes)
        object.__setattr__(self, "_owner_array", np.array(hashes, dtype=np.uint64))

    def owner_of(self, subscription_id: str) -> str:
        """The owner of one subscription id."""
        key = _hash(subscription_id, _ID_PERSON)
        best_index, best_weight = 0, -1
        for index, owner_hash in enumerate(self._owner_hashes):
            weight = _mix(key ^ owner_hash)
            if weight > best_weight:
                best_index, best_weight = index, weight
        return self.owners[best_index]

    def owners_of(self, subscription_ids: Sequence[str]) -> list[str]:
        """The owner of each id, in order (vectorised; the same answers as ``owner_of``)."""
        owners = self.owners
        return [owners[i] for i in self.owner_indices(id_hashes(subscription_ids)).tolist()]

    def owner_indices(self, hashes: _U64) -> npt.NDArray[np.intp]:
        """For each id hash (from :func:`id_hashes`), the index of its owner in ``owners``."""
        owner_array = self._owner_array
        best = _mix_array(hashes ^ owner_array[0])
        indices = np.zeros(len(hashes), dtype=np.intp)
        for index in range(1, len(owner_array)):
            weights = _mix_array(hashes ^ owner_array[index])
            indices[weights > best] = index  # strict: a tie stays with the earlier name
            np.maximum(best, weights, out=best)
        return indices

    @property
    def width(self) -> int:
        """How many owners hold each id: ``replicas``, or every owner when there are fewer."""
        return min(self.replicas, len(self.owners))

    def holders_of(self, subscription_ids: Sequence[str]) -> list[tuple[str, ...]]:
        """The preference list of each id, best first (the first is its ``owner_of``)."""
        owners = self.owners
        rows = self.holder_indices(id_hashes(subscription_ids)).tolist()
        return [tuple(owners[i] for i in row) for row in rows]

    def holder_indices(self, hashes: _U64) -> npt.NDArray[np.intp]:
        """For each id hash, the indices in ``owners`` of its preference list, best first:
        an array of shape ``(len(hashes), width)`` whose first column is ``owner_indices``."""
        if self.width == 1:
            return self.owner_indices(hashes)[:, None]
        weights = np.empty((len(hashes), len(self._owner_array)), dtype=np.uint64)
        for index, owner_hash in enumerate(self._owner_array):
            weights[:, index] = _mix_array(hashes ^ owner_hash)
        # ~w sorts the heaviest first; a stable sort keeps a tie with the earlier name
        order = np.argsort(~weights, axis=1, kind="stable")
        return order[:, : self.width].astype(np.intp, copy=False)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able description, for storing the configuration in ZooKeeper."""
        return {
            "kind": SELECTOR_KIND,
            "version": SELECTOR_VERSION,
            "owners": list(self.owners),
            "replicas": self.replicas,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RendezvousSelector:
        """The selector ``to_dict`` described; SerializationError if the data is malformed."""
        if not isinstance(data, Mapping):
            raise SerializationError(f"a selector must be a mapping, not {type(data).__name__}")
        if data.get("kind") != SELECTOR_KIND:
            raise SerializationError(f"not a {SELECTOR_KIND} selector: kind {data.get('kind')!r}")
        if data.get("version") != SELECTOR_VERSION:
            raise SerializationError(
                f"{SELECTOR_KIND} selector version {data.get('version')!r} is not supported "
                f"(this build reads version {SELECTOR_VERSION})"
            )
        owners = data.get("owners")
        if not isinstance(owners, list | tuple):
            raise SerializationError("a selector's owners must be a list of names")
        try:
            return cls(tuple(owners), data.get("replicas", 1))
        except SerializationError:
            raise
        except InvalidInput as exc:
            raise SerializationError(f"stored selector is invalid: {exc}") from exc


def moved(old: RendezvousSelector, new: RendezvousSelector, ids: Sequence[str]) -> list[str]:
    """The ids (in their given order) whose owner under ``new`` differs from under ``old``."""
    hashes = id_hashes(ids)
    old_index = old.owner_indices(hashes)
    # Translate new owner indices into old ones; owners absent from ``old`` become -1.
    position = {owner: i for i, owner in enumerate(old.owners)}
    remap = np.array([position.get(owner, -1) for owner in new.owners], dtype=np.intp)
    changed = remap[new.owner_indices(hashes)] != old_index
    return [ids[i] for i in np.flatnonzero(changed).tolist()]


def id_hashes(subscription_ids: Sequence[str]) -> _U64:
    """The 64-bit hash of each subscription id, as a uint64 array."""
    # Copying a personalised hasher is faster than building one per id.
    base = hashlib.blake2b(digest_size=8, person=_ID_PERSON)
    digests = bytearray()
    for subscription_id in subscription_ids:
        hasher = base.copy()
        hasher.update(subscription_id.encode("utf-8", "surrogatepass"))
        digests += hasher.digest()
    return np.frombuffer(digests, dtype="<u8").astype(np.uint64)


def _check_owners(owners: object) -> tuple[str, ...]:
    if not isinstance(owners, tuple):
        raise InvalidInput(f"a selector's owners must be a tuple, not {type(owners).__name__}")
    if not owners:
        raise InvalidInput("a selector needs at least one owner")
    for owner in owners:
        if not isinstance(owner, str) or not owner:
            raise InvalidInput(f"a selector's owner must be a non-empty string, not {owner!r}")
    if len(set(owners)) != len(owners):
        duplicates = sorted({o for o in owners if owners.count(o) > 1})
        raise InvalidInput(f"a selector's owners must be distinct; repeated: {duplicates}")
    return tuple(sorted(owners))


def _hash(text: str, person: bytes) -> int:
    data = text.encode("utf-8", "surrogatepass")
    digest = hashlib.blake2b(data, digest_size=8, person=person).digest()
    return int.from_bytes(digest, "little")


def _mix(z: int) -> int:
    """The splitmix64 finalizer on a Python int (must equal :func:`_mix_array`)."""
    z = ((z ^ (z >> 30)) * _C1) & _MASK
    z = ((z ^ (z >> 27)) * _C2) & _MASK
    return z ^ (z >> 31)


def _mix_array(z: _U64) -> _U64:
    """The splitmix64 finalizer on a uint64 array, in place (uint64 wraps on overflow)."""
    z ^= z >> np.uint64(30)
    z *= np.uint64(_C1)
    z ^= z >> np.uint64(27)
    z *= np.uint64(_C2)
    z ^= z >> np.uint64(31)
    return z
