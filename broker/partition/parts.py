"""Parts: a matcher's subscriptions split by owner for a scale operation, and loaded back.

In step 2 of the scale protocol a matcher splits its snapshot with the new selector and
streams each *part* to its new owner, in one or more *chunks* (so that the receiver decodes
the first while the sender packs the next). A chunk is one serialized envelope (see
:mod:`broker.serialization`)::

    ["silbo.part", 2, [owner, count, total, [subscription, ...]]]

``owner`` is who the part is for, ``count`` how many subscriptions the chunk holds and
``total`` how many the whole part holds (the receiver has the part once the counts of its
chunks add up to it; ``total == count`` for a part in one chunk, which every function here
makes unless told otherwise). A chunk sent to the wrong matcher, or one that lost
subscriptions, is refused with SerializationError (msgpack already refuses a truncated one).
A chunk is decoded whole before anything is loaded: a bad one loads nothing.

The functions take the engine through two one-method protocols, so they work with the
indexed :class:`~broker.matching.engine.Engine` and the reference matcher alike.
:func:`pack_part_pieces` and :func:`unpack_part_pieces` do the work of :func:`pack_part` and
:func:`unpack_part` a slice of subscriptions at a time, so that a matcher can go on matching
between slices while it packs or decodes a large part on its event loop.

A matcher receiving a part from another matcher of its cluster decodes it *trusted*
(``unpack_part_pieces(..., trusted=True)``): the sender holds only subscriptions that were
validated when they were subscribed, so each is rebuilt without validating every field again
(entity selectors and filters are built once per distinct value and shared). That is about
four times faster than the checked decode, which a half-million-subscription part needs; the
envelope, the owner, the count and the shape of each subscription are still checked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import msgpack

from broker.errors import InvalidInput, SerializationError
from broker.model.subscription import EntitySelector, NotificationOptions, Subscription
from broker.partition.selector import Selector
from broker.query.ast import Filter
from broker.query.parser import parse_filter
from broker.serialization import (
    STATUS_CODES,
    decode_ext,
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
    "TrustedPart",
    "load",
    "pack_part",
    "pack_part_pieces",
    "split",
    "split_moved",
    "unpack_part",
    "unpack_part_pieces",
]

PART_KIND = "silbo.part"
PART_VERSION = 2  # 1 had no total: [owner, count, [subscription, ...]]
PIECE = 1000  # subscriptions packed or decoded per piece


class SubscriptionSource(Protocol):
    """Anything that can list the subscriptions it holds (an engine)."""

    def subscriptions(self) -> Iterable[Subscription]: ...


class SubscriptionSink(Protocol):
    """Anything subscriptions can be added to (an engine)."""

    def add(self, subscription: Subscription) -> None: ...


@dataclass(frozen=True, slots=True)
class Part:
    """A decoded chunk of a part: who it is for, its subscriptions, and how many the whole
    part holds."""

    owner: str
    subscriptions: list[Subscription]
    total: int


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


def pack_part(owner: str, subscriptions: Sequence[Subscription], total: int | None = None) -> bytes:
    """The part for ``owner`` holding ``subscriptions`` (with ``total``: a chunk of a part of
    that many subscriptions)."""
    return b"".join(pack_part_pieces(owner, subscriptions, total=total))


def pack_part_pieces(
    owner: str,
    subscriptions: Sequence[Subscription],
    size: int = PIECE,
    *,
    total: int | None = None,
) -> Iterator[bytes]:
    """The bytes of ``pack_part(owner, subscriptions, total)`` in pieces, each packing at
    most ``size`` subscriptions (the first, the envelope's head)."""
    total = len(subscriptions) if total is None else total
    if total < len(subscriptions):
        raise InvalidInput(f"a part of {total} subscriptions cannot hold {len(subscriptions)}")
    # [kind, version, [owner, count, total, [subscription, ...]]]: the last array is last
    packer = msgpack.Packer(use_bin_type=True, unicode_errors="surrogatepass")
    yield b"".join(
        (
            packer.pack_array_header(3),
            packb(PART_KIND),
            packb(PART_VERSION),
            packer.pack_array_header(4),
            packb(owner),
            packb(len(subscriptions)),
            packb(total),
            packer.pack_array_header(len(subscriptions)),
        )
    )
    pack = packer.pack  # one packer for all: packb builds one per call
    for start in range(0, len(subscriptions), size):
        with gc_paused():
            try:
                piece = b"".join(
                    [pack(subscription_to_obj(s)) for s in subscriptions[start : start + size]]
                )
            except _PACK_ERRORS as exc:
                raise SerializationError(f"cannot serialize: {exc}") from exc
        yield piece


def unpack_part(part: bytes, owner: str | None = None) -> Part:
    """Decode a part; SerializationError if it is corrupt, inconsistent or (with ``owner``)
    meant for another owner."""
    found_owner, total, items = _items(part, owner)
    return Part(found_owner, _decode(found_owner, items, 0, len(items)), total)


def unpack_part_pieces(
    part: bytes, owner: str | None = None, size: int = PIECE, *, trusted: bool = False
) -> Iterator[list[Subscription]]:
    """The subscriptions of ``unpack_part(part, owner)`` in pieces of at most ``size``.

    The msgpack and the header are checked before the first piece; a SerializationError for
    a bad subscription comes with its piece. ``trusted``: for a part from a matcher of this
    cluster (see the module doc): equal subscriptions, built without validating each again.
    """
    if trusted:
        yield from TrustedPart(part, owner).pieces(size)
        return
    found_owner, _total, items = _items(part, owner)
    for start in range(0, len(items), size):
        yield _decode(found_owner, items, start, min(start + size, len(items)))


def _items(part: bytes, owner: str | None) -> tuple[str, int, list[Any]]:
    """A part's owner, its total and its subscriptions, still as msgpack objects."""
    with gc_paused():
        body = unpack_envelope(part, PART_KIND, PART_VERSION)
    found_owner, count, total, items = _header(body)
    if owner is not None and found_owner != owner:
        raise SerializationError(f"part is for {found_owner!r}, not {owner!r}")
    if count != len(items):
        raise SerializationError(
            f"part for {found_owner!r} declares {count} subscriptions but holds {len(items)}"
        )
    return found_owner, total, items


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


def _setter(name: str) -> Callable[[Subscription, Any], None]:
    setter: Callable[[Subscription, Any], None] = Subscription.__dict__[name].__set__
    return setter


# Slot setters of Subscription: a trusted subscription is built through them, skipping the
# constructor's validation (they cost a third of object.__setattr__).
_SET_ID = _setter("id")
_SET_ENTITIES = _setter("entities")
_SET_TENANT = _setter("tenant")
_SET_SCOPE = _setter("service_path")
_SET_CONDITIONS = _setter("condition_attrs")
_SET_Q = _setter("q")
_SET_MQ = _setter("mq")
_SET_NOTIFICATION = _setter("notification")
_SET_SUBSCRIBER = _setter("subscriber")
_SET_EXPIRES = _setter("expires")
_SET_STATUS = _setter("status")
_SET_DESCRIPTION = _setter("description")
_SET_FILTER = _setter("filter")
_NEW = object.__new__
_DEFAULT_NOTIFICATION = NotificationOptions()
_STATUSES = {code: status for status, code in STATUS_CODES.items()}
_FIELDS = 12  # in a subscription's array (format version 1 of broker.serialization)
# What a malformed part can raise while it is decoded (msgpack's own errors are ValueErrors)
_DECODE_ERRORS = (ValueError, TypeError, KeyError, IndexError, AttributeError, RecursionError)
_PACK_ERRORS = (ValueError, TypeError, OverflowError, RecursionError)


class TrustedPart:
    """A chunk of a part from a matcher of this cluster (see the module doc): its header at
    once (``owner``, ``count``, ``total``), its subscriptions a piece at a time.

    The msgpack is read as a stream: the header is checked and every subscription skipped
    over once (which checks the framing and the count without building anything) before the
    first piece, so a truncated part yields nothing. Arrays come as tuples, so a
    subscription's entity selectors and filter texts serve as keys of the caches that let
    equal ones share one object.
    """

    def __init__(self, part: bytes, owner: str | None) -> None:
        self._part = part
        self._entities: dict[tuple[Any, ...], tuple[EntitySelector, ...]] = {}
        self._filters: dict[tuple[str, str], Filter] = {}
        stream = self._stream()
        try:
            self.owner, self.count, self.total = _stream_header(stream)
            for _ in range(self.count):
                stream.skip()
        except msgpack.OutOfData as exc:
            raise SerializationError("truncated part") from exc
        except _DECODE_ERRORS as exc:
            raise SerializationError(f"corrupt part: {exc}") from exc
        if stream.tell() != len(part):
            raise SerializationError("a part holds more than its envelope")
        if owner is not None and self.owner != owner:
            raise SerializationError(f"part is for {self.owner!r}, not {owner!r}")

    def pieces(self, size: int = PIECE) -> Iterator[list[Subscription]]:
        """The subscriptions, at most ``size`` per piece."""
        stream = self._stream()
        _stream_header(stream)
        subscription = self._subscription
        for start in range(0, self.count, size):
            with gc_paused():
                piece = [
                    subscription(stream.unpack(), p)
                    for p in range(start, min(start + size, self.count))
                ]
            yield piece

    def _stream(self) -> msgpack.Unpacker:
        stream = msgpack.Unpacker(
            raw=False,
            use_list=False,
            ext_hook=decode_ext,
            unicode_errors="surrogatepass",
            max_buffer_size=max(len(self._part), 1),
        )
        stream.feed(self._part)
        return stream

    def _subscription(self, row: Any, position: int) -> Subscription:
        try:
            if type(row) is not tuple or len(row) != _FIELDS:
                raise SerializationError(f"a subscription must be an array of {_FIELDS} fields")
            if row[7] is not None:  # notification options other than the default: rare
                return subscription_from_obj(_as_lists(row))
            return self._build(row)
        except (InvalidInput, *_DECODE_ERRORS) as exc:
            raise SerializationError(
                f"part for {self.owner!r}, subscription {position}: {exc}"
            ) from exc

    def _build(self, row: tuple[Any, ...]) -> Subscription:
        (id_, entities, tenant, scope, conditions, q, mq, _notification, subscriber, expires,
         status, description) = row  # fmt: skip
        selectors = self._entities.get(entities)
        if selectors is None:
            selectors = tuple(EntitySelector(*e) for e in entities)
            if not selectors:
                raise SerializationError("a subscription needs at least one entity selector")
            self._entities[entities] = selectors
        texts = (q, mq)
        filter_ = self._filters.get(texts)
        if filter_ is None:
            filter_ = self._filters[texts] = parse_filter(q, mq)
        subscription = _NEW(Subscription)
        _SET_ID(subscription, id_)
        _SET_ENTITIES(subscription, selectors)
        _SET_TENANT(subscription, tenant)
        _SET_SCOPE(subscription, scope)
        _SET_CONDITIONS(subscription, conditions)
        _SET_Q(subscription, q)
        _SET_MQ(subscription, mq)
        _SET_NOTIFICATION(subscription, _DEFAULT_NOTIFICATION)
        _SET_SUBSCRIBER(subscription, subscriber)
        _SET_EXPIRES(subscription, expires)
        _SET_STATUS(subscription, _STATUSES[status])
        _SET_DESCRIPTION(subscription, description)
        _SET_FILTER(subscription, filter_)
        return subscription


def _as_lists(obj: Any) -> Any:
    """``obj`` with its tuples as lists again (the checked decode reads arrays as lists)."""
    if type(obj) is tuple:
        return [_as_lists(item) for item in obj]
    return obj


def _stream_header(stream: msgpack.Unpacker) -> tuple[str, int, int]:
    """Read a part's envelope up to the array of its subscriptions: (owner, count, total)."""
    if stream.read_array_header() != 3:
        raise SerializationError("not a Silbo payload: no [kind, version, body] envelope")
    kind, version = stream.unpack(), stream.unpack()
    if kind != PART_KIND:
        raise SerializationError(f"expected a {PART_KIND!r} payload, got kind {kind!r}")
    if type(version) is not int or version != PART_VERSION:
        raise SerializationError(
            f"{PART_KIND!r} payload has format version {version!r}; "
            f"this build reads version {PART_VERSION}"
        )
    if stream.read_array_header() != 4:
        raise SerializationError("a part must be [owner, count, total, subscriptions]")
    owner, count, total = stream.unpack(), stream.unpack(), stream.unpack()
    _check_header(owner, count, total)
    held = stream.read_array_header()
    if count != held:
        raise SerializationError(
            f"part for {owner!r} declares {count} subscriptions but holds {held}"
        )
    return owner, count, total


def _header(body: Any) -> tuple[str, int, int, list[Any]]:
    if not isinstance(body, list) or len(body) != 4:
        raise SerializationError("a part must be [owner, count, total, subscriptions]")
    owner, count, total, items = body
    _check_header(owner, count, total)
    if not isinstance(items, list):
        raise SerializationError("a part's subscriptions must be an array")
    return owner, count, total, items


def _check_header(owner: Any, count: Any, total: Any) -> None:
    if not isinstance(owner, str):
        raise SerializationError(f"a part's owner must be a string, not {type(owner).__name__}")
    for name, value in (("count", count), ("total", total)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SerializationError(f"a part's {name} must be a natural number, not {value!r}")
    if total < count:
        raise SerializationError(f"a part's chunk holds {count} of a total of {total}")


def _group(subscriptions: list[Subscription], selector: Selector) -> dict[str, list[Subscription]]:
    groups: dict[str, list[Subscription]] = {owner: [] for owner in selector.owners}
    owners = selector.owners_of([s.id for s in subscriptions])
    for subscription, owner in zip(subscriptions, owners, strict=True):
        groups[owner].append(subscription)
    return groups


def _pack_groups(groups: dict[str, list[Subscription]], owners: Iterable[str]) -> dict[str, bytes]:
    return {owner: pack_part(owner, groups.get(owner, [])) for owner in owners}
