"""Versioned msgpack encoding of subscriptions and context updates, for state transfer and the wire.

Every payload is an *envelope*, a msgpack array ``[kind, version, body]``:

==============  =======  =================================================
kind            version  body
==============  =======  =================================================
``silbo.sub``   1        one subscription object
``silbo.subs``  1        an array of subscription objects
``silbo.upd``   1        one update object
``silbo.upds``  1        an array of update objects
==============  =======  =================================================

Objects are compact positional arrays (see ``subscription_to_obj`` and ``update_to_obj``),
so a field's name costs nothing on the wire: enums are small integer codes from fixed tables
and a default notification is nil (a minimal subscription packs in 35 bytes). A change of
layout bumps the version. Other
modules embed objects in their own envelopes (``broker.partition.parts`` does) with
:func:`pack_envelope` / :func:`unpack_envelope`.

Exactness: every field round-trips to an equal model object, ints stay ints and floats stay
floats. JSON values may also hold what msgpack has no type for, carried as extension types:
a tuple (``EXT_TUPLE``, else it would come back as a list) and an int outside the 64-bit range
(``EXT_BIGINT``). Strings are packed with ``surrogatepass``, so lone surrogates survive.
Decode with :func:`unpackb` (or pass ``ext_hook=decode_ext`` to msgpack) to get them back.

Errors: anything wrong with a payload (not bytes, too large, truncated, corrupt, another
kind, an unknown version, a field of the wrong type) raises :class:`SerializationError`.
Decoding rebuilds objects through the model constructors, so a payload holding an invalid
subscription or update is caught too; the model's InvalidInput error is wrapped in a
SerializationError (``__cause__`` keeps the original), so callers need catch only one error.
No msgpack, KeyError or TypeError escapes. Packing a model object that msgpack cannot carry
also raises SerializationError.
"""

from __future__ import annotations

import contextlib
import gc
import math
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

import msgpack

from broker.errors import InvalidInput, SerializationError
from broker.model.attribute import Attribute, Metadata
from broker.model.subscription import (
    AttrsFormat,
    EntitySelector,
    NotificationOptions,
    Status,
    Subscription,
)
from broker.model.update import ContextUpdate

__all__ = [
    "ATTRS_FORMAT_CODES",
    "EXT_BIGINT",
    "EXT_TUPLE",
    "FORMAT_VERSION",
    "KIND_SUBSCRIPTION",
    "KIND_SUBSCRIPTIONS",
    "KIND_UPDATE",
    "KIND_UPDATES",
    "MAX_BATCH_SIZE",
    "MAX_ITEM_SIZE",
    "STATUS_CODES",
    "decode_ext",
    "gc_paused",
    "pack_envelope",
    "pack_subscription",
    "pack_subscriptions",
    "pack_update",
    "pack_updates",
    "packb",
    "subscription_from_obj",
    "subscription_to_obj",
    "unpack_envelope",
    "unpack_subscription",
    "unpack_subscriptions",
    "unpack_update",
    "unpack_updates",
    "unpackb",
    "update_from_obj",
    "update_to_obj",
]

FORMAT_VERSION = 1
MAX_ITEM_SIZE = 16 << 20  # one subscription or update (Orion caps a request at 1 MB)
MAX_BATCH_SIZE = 1 << 30  # a batch or a state part

EXT_TUPLE = 1
EXT_BIGINT = 2

# Fixed for format version 1: never renumber, only append.
STATUS_CODES: Mapping[Status, int] = {Status.ACTIVE: 0, Status.INACTIVE: 1, Status.ONESHOT: 2}
ATTRS_FORMAT_CODES: Mapping[AttrsFormat, int] = {
    AttrsFormat.NORMALIZED: 0,
    AttrsFormat.KEY_VALUES: 1,
    AttrsFormat.VALUES: 2,
    AttrsFormat.SIMPLIFIED_NORMALIZED: 3,
    AttrsFormat.SIMPLIFIED_KEY_VALUES: 4,
    AttrsFormat.LEGACY: 5,
}
_STATUSES = {code: status for status, code in STATUS_CODES.items()}
_ATTRS_FORMATS = {code: attrs_format for attrs_format, code in ATTRS_FORMAT_CODES.items()}
_DEFAULT_NOTIFICATION = NotificationOptions()

KIND_SUBSCRIPTION = "silbo.sub"
KIND_SUBSCRIPTIONS = "silbo.subs"
KIND_UPDATE = "silbo.upd"
KIND_UPDATES = "silbo.upds"

_SUBSCRIPTION_FIELDS = 12
_NOTIFICATION_FIELDS = 8
_UPDATE_FIELDS = 7
_INT64_MIN = -(1 << 63)
_UINT64_LIMIT = 1 << 64

# Foreign exceptions a malformed payload can raise while decoding (UnicodeDecodeError,
# msgpack's ExtraData, FormatError and StackError are ValueErrors).
_DECODE_ERRORS = (
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    AttributeError,
    OverflowError,
    RecursionError,
    msgpack.UnpackException,
)
_PACK_ERRORS = (ValueError, TypeError, OverflowError, RecursionError, msgpack.PackException)

_T = TypeVar("_T")


# -- the codec --------------------------------------------------------------------------


def packb(obj: Any) -> bytes:
    """Pack a msgpack-able object (as built by the ``*_to_obj`` converters) into bytes."""
    try:
        packed: bytes = msgpack.packb(obj, use_bin_type=True, unicode_errors="surrogatepass")
    except _PACK_ERRORS as exc:
        raise SerializationError(f"cannot serialize: {exc}") from exc
    return packed


def unpackb(data: object, max_size: int = MAX_BATCH_SIZE) -> Any:
    """Unpack bytes that :func:`packb` made; SerializationError if they are not a payload.

    Payloads over ``max_size`` bytes are refused before decoding; msgpack itself bounds every
    declared length by the size of the data, so a corrupt header cannot make it allocate more.
    """
    if not isinstance(data, bytes | bytearray | memoryview):
        raise SerializationError(f"a payload must be bytes, not {type(data).__name__}")
    if len(data) > max_size:
        raise SerializationError(f"payload is {len(data)} bytes; at most {max_size} accepted")
    try:
        return msgpack.unpackb(data, raw=False, ext_hook=decode_ext, unicode_errors="surrogatepass")
    except SerializationError:
        raise
    except _DECODE_ERRORS as exc:
        raise SerializationError(f"corrupt or truncated payload: {exc}") from exc


def decode_ext(code: int, data: bytes) -> Any:
    """msgpack ``ext_hook`` for the extension types of this format."""
    if code == EXT_TUPLE:
        items = msgpack.unpackb(
            data, raw=False, ext_hook=decode_ext, unicode_errors="surrogatepass"
        )
        if not isinstance(items, list):
            raise SerializationError("a tuple extension must hold an array")
        return tuple(items)
    if code == EXT_BIGINT:
        return int.from_bytes(data, "big", signed=True)
    raise SerializationError(f"unknown msgpack extension type {code}")


def pack_envelope(kind: str, version: int, body: Any) -> bytes:
    """Pack ``body`` in an envelope ``[kind, version, body]``."""
    return packb([kind, version, body])


def unpack_envelope(data: object, kind: str, version: int, max_size: int = MAX_BATCH_SIZE) -> Any:
    """The body of an envelope of this kind and version; SerializationError otherwise."""
    envelope = unpackb(data, max_size)
    if not isinstance(envelope, list) or len(envelope) != 3:
        raise SerializationError("not a Silbo payload: no [kind, version, body] envelope")
    found_kind, found_version, body = envelope
    if found_kind != kind:
        raise SerializationError(f"expected a {kind!r} payload, got kind {found_kind!r}")
    if type(found_version) is not int or found_version != version:  # True == 1, but is not
        raise SerializationError(
            f"{kind!r} payload has format version {found_version!r}; "
            f"this build reads version {version}"
        )
    return body


# -- subscriptions ----------------------------------------------------------------------


def pack_subscription(subscription: Subscription) -> bytes:
    """One subscription as bytes."""
    return pack_envelope(KIND_SUBSCRIPTION, FORMAT_VERSION, subscription_to_obj(subscription))


def unpack_subscription(data: object) -> Subscription:
    """The subscription ``pack_subscription`` made; SerializationError if it is not one."""
    body = unpack_envelope(data, KIND_SUBSCRIPTION, FORMAT_VERSION, MAX_ITEM_SIZE)
    return subscription_from_obj(body)


def pack_subscriptions(subscriptions: Iterable[Subscription]) -> bytes:
    """A batch of subscriptions as bytes."""
    with gc_paused():
        body = [subscription_to_obj(s) for s in subscriptions]
        return pack_envelope(KIND_SUBSCRIPTIONS, FORMAT_VERSION, body)


def unpack_subscriptions(data: object) -> list[Subscription]:
    """The batch ``pack_subscriptions`` made, in order."""
    with gc_paused():
        body = unpack_envelope(data, KIND_SUBSCRIPTIONS, FORMAT_VERSION)
        return _from_obj_list(body, subscription_from_obj, "subscription")


def subscription_to_obj(s: Subscription) -> list[Any]:
    """A subscription as a compact msgpack-able array (layout of format version 1).

    ``[id, entities, tenant, scope, condition_attrs, q, mq, notification, subscriber, expires,
    status, description]``; each entity selector ``[id, id_pattern, type, type_pattern]``;
    notification nil when it is exactly the default, else ``[attrs, except_attrs, format,
    metadata, only_changed_attrs, covered, throttling, max_fails_limit]``. Enums are small
    integers from fixed tables (``STATUS_CODES``, ``ATTRS_FORMAT_CODES``).
    """
    return [
        s.id,
        [[e.id, e.id_pattern, e.type, e.type_pattern] for e in s.entities],
        s.tenant,
        s.service_path,
        list(s.condition_attrs),
        s.q,
        s.mq,
        _notification_to_obj(s.notification),
        s.subscriber,
        _encode_value(s.expires),
        STATUS_CODES[s.status],
        s.description,
    ]


def _notification_to_obj(n: NotificationOptions) -> list[Any] | None:
    if (
        n == _DEFAULT_NOTIFICATION
        and n.only_changed_attrs is False
        and n.covered is False
        and type(n.throttling) is float
        and math.copysign(1.0, n.throttling) > 0  # -0.0 == 0.0, yet is not the default
    ):
        return None
    return [
        list(n.attrs),
        list(n.except_attrs),
        ATTRS_FORMAT_CODES[n.attrs_format],
        list(n.metadata),
        n.only_changed_attrs,
        n.covered,
        _encode_value(n.throttling),
        _encode_value(n.max_fails_limit),
    ]


def subscription_from_obj(obj: Any) -> Subscription:
    """The subscription an array from ``subscription_to_obj`` describes (validated)."""
    try:
        return _subscription(obj)
    except SerializationError:
        raise
    except InvalidInput as exc:
        raise SerializationError(f"payload holds an invalid subscription: {exc}") from exc
    except _DECODE_ERRORS as exc:
        raise SerializationError(f"malformed subscription: {exc!r}") from exc


def _subscription(obj: Any) -> Subscription:
    (id_, entities, tenant, scope, conditions, q, mq, notification, subscriber, expires,
     status, description) = _array(obj, _SUBSCRIPTION_FIELDS, "subscription")  # fmt: skip
    return Subscription(
        id=_str(id_, "subscription id"),
        entities=tuple(_entity_selector(e) for e in _list(entities, "entities")),
        tenant=_str(tenant, "tenant"),
        service_path=_str(scope, "service path"),
        condition_attrs=_str_tuple(conditions, "condition attributes"),
        q=_str(q, "q"),
        mq=_str(mq, "mq"),
        notification=_notification(notification),
        subscriber=_str(subscriber, "subscriber"),
        expires=None if expires is None else _number(expires, "expires"),
        status=_enum(_STATUSES, status, "status code"),
        description=_str(description, "description"),
    )


def _entity_selector(obj: Any) -> EntitySelector:
    fields = _array(obj, 4, "entity selector")
    for item in fields:
        if item is not None and type(item) is not str:
            raise SerializationError(
                f"an entity selector field must be a string or nil, not {type(item).__name__}"
            )
    return EntitySelector(*fields)


def _notification(obj: Any) -> NotificationOptions:
    if obj is None:
        return _DEFAULT_NOTIFICATION  # immutable, so shared
    (attrs, except_attrs, attrs_format, metadata, only_changed, covered, throttling,
     max_fails) = _array(obj, _NOTIFICATION_FIELDS, "notification options")  # fmt: skip
    if max_fails is not None and (type(max_fails) is bool or not isinstance(max_fails, int)):
        raise SerializationError(f"maxFailsLimit must be an integer or nil, not {max_fails!r}")
    return NotificationOptions(
        attrs=_str_tuple(attrs, "notification attrs"),
        except_attrs=_str_tuple(except_attrs, "notification exceptAttrs"),
        attrs_format=_enum(_ATTRS_FORMATS, attrs_format, "attrsFormat code"),
        metadata=_str_tuple(metadata, "notification metadata"),
        only_changed_attrs=_bool(only_changed, "onlyChangedAttrs"),
        covered=_bool(covered, "covered"),
        throttling=_number(throttling, "throttling"),
        max_fails_limit=max_fails,
    )


# -- updates ----------------------------------------------------------------------------


def pack_update(update: ContextUpdate) -> bytes:
    """One context update as bytes."""
    return pack_envelope(KIND_UPDATE, FORMAT_VERSION, update_to_obj(update))


def unpack_update(data: object) -> ContextUpdate:
    """The update ``pack_update`` made; SerializationError if it is not one."""
    return update_from_obj(unpack_envelope(data, KIND_UPDATE, FORMAT_VERSION, MAX_ITEM_SIZE))


def pack_updates(updates: Iterable[ContextUpdate]) -> bytes:
    """A batch of context updates as bytes."""
    with gc_paused():
        body = [update_to_obj(u) for u in updates]
        return pack_envelope(KIND_UPDATES, FORMAT_VERSION, body)


def unpack_updates(data: object) -> list[ContextUpdate]:
    """The batch ``pack_updates`` made, in order."""
    with gc_paused():
        body = unpack_envelope(data, KIND_UPDATES, FORMAT_VERSION)
        return _from_obj_list(body, update_from_obj, "update")


def update_to_obj(u: ContextUpdate) -> list[Any]:
    """A context update as a compact msgpack-able array (layout of format version 1).

    ``[entity_id, entity_type, tenant, service_path, publisher, sequence, attributes]``, each
    attribute ``[name, type, value, [[metadata name, type, value], ...]]``.
    """
    return [
        u.entity_id,
        u.entity_type,
        u.tenant,
        u.service_path,
        u.publisher,
        _encode_value(u.sequence),
        [
            [
                name,
                a.type,
                _encode_value(a.value),
                [[key, m.type, _encode_value(m.value)] for key, m in a.metadata.items()],
            ]
            for name, a in u.attributes.items()
        ],
    ]


def update_from_obj(obj: Any) -> ContextUpdate:
    """The context update an array from ``update_to_obj`` describes (validated)."""
    try:
        return _update(obj)
    except SerializationError:
        raise
    except InvalidInput as exc:
        raise SerializationError(f"payload holds an invalid update: {exc}") from exc
    except _DECODE_ERRORS as exc:
        raise SerializationError(f"malformed update: {exc!r}") from exc


def _update(obj: Any) -> ContextUpdate:
    entity_id, entity_type, tenant, path, publisher, sequence, attributes = _array(
        obj, _UPDATE_FIELDS, "update"
    )
    return ContextUpdate(
        entity_id=_str(entity_id, "entity id"),
        attributes=_named(attributes, _attribute, "attribute"),
        entity_type=_str(entity_type, "entity type"),
        tenant=_str(tenant, "tenant"),
        service_path=_str(path, "service path"),
        publisher=_str(publisher, "publisher"),
        sequence=sequence,
    )


def _attribute(obj: Any) -> tuple[str, Attribute]:
    name, type_, value, metadata = _array(obj, 4, "attribute")
    attribute = Attribute(
        _str(type_, "attribute type"), value, _named(metadata, _metadata, "metadata")
    )
    return _str(name, "attribute name"), attribute


def _metadata(obj: Any) -> tuple[str, Metadata]:
    name, type_, value = _array(obj, 3, "metadata")
    return _str(name, "metadata name"), Metadata(_str(type_, "metadata type"), value)


# -- helpers ----------------------------------------------------------------------------


class _GcPause:
    """Counts nested pauses across threads; the collector runs again when the last ends."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._depth = 0
        self._was_enabled = False

    def enter(self) -> None:
        with self._lock:
            if self._depth == 0:
                self._was_enabled = gc.isenabled()
                gc.disable()
            self._depth += 1

    def exit(self) -> None:
        with self._lock:
            self._depth -= 1
            if self._depth == 0 and self._was_enabled:
                gc.enable()


_GC_PAUSE = _GcPause()


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause the cyclic garbage collector while a batch is (de)coded.

    Building a million small lists and model objects otherwise triggers a collection every
    few hundred allocations, each scanning the growing batch: it makes decoding 100k
    subscriptions several times slower. The objects built hold no cycles, so nothing is
    lost by collecting later.
    """
    _GC_PAUSE.enter()
    try:
        yield
    finally:
        _GC_PAUSE.exit()


def _from_obj_list(body: Any, convert: Callable[[Any], _T], what: str) -> list[_T]:
    """Convert each object of a batch body, naming the position of the first bad one."""
    items = _list(body, f"{what} batch")
    result = []
    for position, item in enumerate(items):
        try:
            result.append(convert(item))
        except SerializationError as exc:
            raise SerializationError(f"{what} {position} of the batch: {exc}") from exc
    return result


def _encode_value(value: Any) -> Any:
    """A JSON value with what msgpack cannot carry exactly (tuples, huge ints) as extensions."""
    kind = type(value)
    if kind is str or kind is float or kind is bool or value is None:
        return value
    if kind is int:
        if _INT64_MIN <= value < _UINT64_LIMIT:
            return value
        size = (value.bit_length() + 8) // 8  # room for the sign bit
        return msgpack.ExtType(EXT_BIGINT, value.to_bytes(size, "big", signed=True))
    if isinstance(value, tuple):
        return msgpack.ExtType(EXT_TUPLE, packb([_encode_value(item) for item in value]))
    if isinstance(value, list):
        return [_encode_value(item) for item in value]
    if isinstance(value, Mapping):
        return {key: _encode_value(item) for key, item in value.items()}
    for base in (bool, int, float, str):  # subclasses (IntEnum, numpy float64, ...)
        if isinstance(value, base):
            return _encode_value(base(value))
    return value  # not JSON: the model rejects it, or packing fails with a clear message


def _array(obj: Any, length: int, what: str) -> list[Any]:
    if not isinstance(obj, list) or len(obj) != length:
        got = f"an array of {len(obj)}" if isinstance(obj, list) else type(obj).__name__
        raise SerializationError(f"a {what} must be an array of {length} fields, got {got}")
    return obj


def _list(obj: Any, what: str) -> list[Any]:
    if not isinstance(obj, list):
        raise SerializationError(f"{what} must be an array, not {type(obj).__name__}")
    return obj


def _str(obj: Any, what: str) -> str:
    if type(obj) is not str:
        raise SerializationError(f"{what} must be a string, not {type(obj).__name__}")
    return obj


def _str_tuple(obj: Any, what: str) -> tuple[str, ...]:
    if obj == [] and type(obj) is list:
        return ()
    return tuple(_str(item, what) for item in _list(obj, what))


def _bool(obj: Any, what: str) -> bool:
    if not isinstance(obj, bool):
        raise SerializationError(f"{what} must be a boolean, not {type(obj).__name__}")
    return obj


def _number(obj: Any, what: str) -> float:
    if isinstance(obj, bool) or not isinstance(obj, int | float):
        raise SerializationError(f"{what} must be a number, not {type(obj).__name__}")
    return obj


_E = TypeVar("_E", Status, AttrsFormat)


def _enum(members: Mapping[int, _E], obj: Any, what: str) -> _E:
    member = members.get(obj) if type(obj) is int else None
    if member is None:
        raise SerializationError(f"unknown {what} {obj!r}")
    return member


def _named(obj: Any, convert: Callable[[Any], tuple[str, _T]], what: str) -> dict[str, _T]:
    if obj == [] and type(obj) is list:
        return {}
    items = [convert(item) for item in _list(obj, f"{what} list")]
    result = dict(items)
    if len(result) != len(items):
        raise SerializationError(f"a {what} name is repeated")
    return result
