"""Parts: a matcher's subscriptions split by owner for a scale operation, and loaded back.

In step 2 of the scale protocol a matcher splits its snapshot with the new selector and
streams each *part* to its new owner. A part is one serialized envelope (see
:mod:`broker.serialization`)::

    ["silbo.part", 1, [owner, count, [subscription, ...]]]

``owner`` is who the part is for and ``count`` how many subscriptions it holds, so a part sent
to the wrong matcher, or one that lost subscriptions, is refused with SerializationError (msgpack
already refuses a truncated one). A part is decoded whole before anything is loaded: a bad
part loads nothing.

The functions take the engine through two one-method protocols, so they work with the
indexed :class:`~broker.matching.engine.Engine` and the reference matcher alike.
:func:`pack_part_pieces` and :func:`unpack_part_pieces` do the work of :func:`pack_part` and
:func:`unpack_part` a slice of subscriptions at a time, so that a matcher can go on matching
between slices while it packs or decodes a large part on its event loop.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgpack

from broker.errors import InvalidInput, SerializationError
from broker.model.subscription import Subscription
from broker.partition.selector import Selector
from broker.serialization import (
    gc_paused,
    packb,
    subscription_from_obj,
    subscription_to_obj,
    unpack_envelope,
)

__all__ = [
    "PART_KIND",
    "PART_VERSION",
    "Part",
    "SubscriptionSink",
    "SubscriptionSource",
    "load",
    "pack_part",
    "pack_part_pieces",
    "split",
    "split_moved",
    "unpack_part",
    "unpack_part_pieces",
]

PART_KIND = "silbo.part"
PART_VERSION = 1
PIECE = 1000  # subscriptions packed or decoded per piece


class SubscriptionSource(Protocol):
    """Anything that can list the subscriptions it holds (an engine)."""

    def subscriptions(self) -> Iterable[Subscription]: ...


class SubscriptionSink(Protocol):
    """Anything subscriptions can be added to (an engine)."""

    def add(self, subscription: Subscription) -> None: ...


@dataclass(frozen=True, slots=True)
class Part:
    """A decoded part: who it is for, and its subscriptions."""

    owner: str
    subscriptions: list[Subscription]


def split(holder: SubscriptionSource, selector: Selector) -> dict[str, bytes]:
    """Every subscription of ``holder`` in the part of its owner under ``selector``.

    Every owner of the selector gets an entry, an empty part if it owns nothing here.
    """
    return _pack_groups(_group(list(holder.subscriptions()), selector), selector.owners)


def split_moved(
    holder: SubscriptionSource, old_selector: Selector, new_selector: Selector, self_owner: str
) -> dict[str, bytes]:
    """The subscriptions that leave ``self_owner`` going from ``old_selector`` to the new one.

    A subscription leaves when ``self_owner`` owns it under the old selector and another owner
    does under the new one; subscriptions of ``holder`` that ``self_owner`` did not own under the
    old selector are some other matcher's to send, and are left out. The result has an entry
    for every owner of the new selector except ``self_owner`` (an empty part when nothing
    moves to it), so each receiver can count the parts it expects. InvalidInput if
    ``self_owner`` is in neither selector.
    """
    if self_owner not in old_selector.owners and self_owner not in new_selector.owners:
        raise InvalidInput(f"{self_owner!r} is an owner of neither selector")
    held = list(holder.subscriptions())
    old_owners = old_selector.owners_of([s.id for s in held])
    mine = [s for s, owner in zip(held, old_owners, strict=True) if owner == self_owner]
    groups = _group(mine, new_selector)
    groups.pop(self_owner, None)
    receivers = tuple(owner for owner in new_selector.owners if owner != self_owner)
    return _pack_groups(groups, receivers)


def load(part: bytes, into: SubscriptionSink, owner: str | None = None) -> int:
    """Add every subscription of ``part`` to ``into``; return how many there were.

    With ``owner``, a part meant for another owner is refused. The part is checked whole
    first, so a SerializationError leaves ``into`` untouched.
    """
    subscriptions = unpack_part(part, owner).subscriptions
    for subscription in subscriptions:
        into.add(subscription)
    return len(subscriptions)


def pack_part(owner: str, subscriptions: Sequence[Subscription]) -> bytes:
    """The part for ``owner`` holding ``subscriptions``."""
    return b"".join(pack_part_pieces(owner, subscriptions))


def pack_part_pieces(
    owner: str, subscriptions: Sequence[Subscription], size: int = PIECE
) -> Iterator[bytes]:
    """The bytes of ``pack_part(owner, subscriptions)`` in pieces, each packing at most
    ``size`` subscriptions (the first, the envelope's head)."""
    # [kind, version, [owner, count, [subscription, ...]]]: the last array is written last
    head = msgpack.Packer()
    yield b"".join(
        (
            head.pack_array_header(3),
            packb(PART_KIND),
            packb(PART_VERSION),
            head.pack_array_header(3),
            packb(owner),
            packb(len(subscriptions)),
            head.pack_array_header(len(subscriptions)),
        )
    )
    for start in range(0, len(subscriptions), size):
        with gc_paused():
            piece = b"".join(
                packb(subscription_to_obj(s)) for s in subscriptions[start : start + size]
            )
        yield piece


def unpack_part(part: bytes, owner: str | None = None) -> Part:
    """Decode a part; SerializationError if it is corrupt, inconsistent or (with ``owner``)
    meant for another owner."""
    found_owner, items = _items(part, owner)
    return Part(found_owner, _decode(found_owner, items, 0, len(items)))


def unpack_part_pieces(
    part: bytes, owner: str | None = None, size: int = PIECE
) -> Iterator[list[Subscription]]:
    """The subscriptions of ``unpack_part(part, owner)`` in pieces of at most ``size``.

    The msgpack and the header are checked before the first piece; a SerializationError for
    a bad subscription comes with its piece.
    """
    found_owner, items = _items(part, owner)
    for start in range(0, len(items), size):
        yield _decode(found_owner, items, start, min(start + size, len(items)))


def _items(part: bytes, owner: str | None) -> tuple[str, list[Any]]:
    """A part's owner and its subscriptions, still as msgpack objects."""
    with gc_paused():
        body = unpack_envelope(part, PART_KIND, PART_VERSION)
    found_owner, count, items = _header(body)
    if owner is not None and found_owner != owner:
        raise SerializationError(f"part is for {found_owner!r}, not {owner!r}")
    if count != len(items):
        raise SerializationError(
            f"part for {found_owner!r} declares {count} subscriptions but holds {len(items)}"
        )
    return found_owner, items


def _decode(owner: str, items: list[Any], start: int, end: int) -> list[Subscription]:
    subscriptions = []
    with gc_paused():
        for position in range(start, end):
            try:
                subscriptions.append(subscription_from_obj(items[position]))
            except SerializationError as exc:
                raise SerializationError(
                    f"part for {owner!r}, subscription {position}: {exc}"
                ) from exc
    return subscriptions


def _header(body: Any) -> tuple[str, int, list[Any]]:
    if not isinstance(body, list) or len(body) != 3:
        raise SerializationError("a part must be [owner, count, subscriptions]")
    owner, count, items = body
    if not isinstance(owner, str):
        raise SerializationError(f"a part's owner must be a string, not {type(owner).__name__}")
    if isinstance(count, bool) or not isinstance(count, int):
        raise SerializationError(f"a part's count must be an integer, not {type(count).__name__}")
    if not isinstance(items, list):
        raise SerializationError("a part's subscriptions must be an array")
    return owner, count, items


def _group(subscriptions: list[Subscription], selector: Selector) -> dict[str, list[Subscription]]:
    groups: dict[str, list[Subscription]] = {owner: [] for owner in selector.owners}
    owners = selector.owners_of([s.id for s in subscriptions])
    for subscription, owner in zip(subscriptions, owners, strict=True):
        groups[owner].append(subscription)
    return groups


def _pack_groups(groups: dict[str, list[Subscription]], owners: Iterable[str]) -> dict[str, bytes]:
    return {owner: pack_part(owner, groups.get(owner, [])) for owner in owners}
