"""Versioned msgpack of subscriptions and updates: exact round trips, and clean refusals.

Exactness is checked with ``repr``: unlike ``==`` it tells 1 from 1.0 and True, -0.0 from
0.0 and a tuple from a list, and the model's reprs show every field that is not derived.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import subscriptions, updates

from broker.errors import InvalidIdentifier, SerializationError
from broker.model.attribute import Attribute, Metadata
from broker.model.subscription import (
    AttrsFormat,
    EntitySelector,
    NotificationOptions,
    Status,
    Subscription,
)
from broker.model.update import ContextUpdate
from broker.serialization import (
    FORMAT_VERSION,
    MAX_ITEM_SIZE,
    pack_envelope,
    pack_subscription,
    pack_subscriptions,
    pack_update,
    pack_updates,
    packb,
    subscription_from_obj,
    subscription_to_obj,
    unpack_subscription,
    unpack_subscriptions,
    unpack_update,
    unpack_updates,
    unpackb,
    update_from_obj,
    update_to_obj,
)

FULL_SUBSCRIPTION = Subscription(
    id="sub-full",
    entities=(
        EntitySelector(id_pattern="^Room", type="Room"),
        EntitySelector(id="Car1", type_pattern="Car|Bus"),
        EntitySelector(id="x"),
    ),
    tenant="madrid",
    service_path="/a/b/#",
    condition_attrs=("temp", "name"),
    q="temp>20;name~=^Pla;date<2020-01-01T00:00:00Z",
    mq="temp.accuracy<0.5",
    notification=NotificationOptions(
        attrs=("temp", "name"),
        attrs_format=AttrsFormat.SIMPLIFIED_KEY_VALUES,
        metadata=("accuracy", "dateModified"),
        only_changed_attrs=True,
        covered=True,
        throttling=2,  # an int: it must stay one
        max_fails_limit=3,
    ),
    subscriber="http://example.org/notify?x=1",
    expires=1_700_000_000.25,
    status=Status.ONESHOT,
    description="every field set; ünïcödé and a lone surrogate \ud800",
)

FULL_UPDATE = ContextUpdate(
    entity_id="Room1",
    attributes={
        "temp": Attribute("Number", 21.5, {"accuracy": Metadata("Number", 0.5)}),
        "count": Attribute("Number", 3),
        "zero": Attribute("Number", -0.0),
        "huge": Attribute("Number", 10**30),
        "negative_huge": Attribute("Number", -(2**64)),
        "name": Attribute("Text", "Plaza", {"lang": Metadata("Text", "es"), "n": Metadata("X")}),
        "when": Attribute("DateTime", "2020-01-01T00:00:00Z", {"ts": Metadata("ISO8601", None)}),
        "flag": Attribute("Boolean", True),
        "nothing": Attribute("None", None),
        "loc": Attribute("StructuredValue", {"x": {"y": [1, 2.0, (3, [4])]}, "z": None}),
        "pair": Attribute("StructuredValue", (1, "a", (), [])),
        "list": Attribute("StructuredValue", [True, 1, 1.0, "1", None, {}]),
    },
    entity_type="Room",
    tenant="madrid",
    service_path="/a/b",
    publisher="agent-7",
    sequence=2**70,
)


def assert_exact(a: object, b: object) -> None:
    assert a == b
    assert repr(a) == repr(b)


# -- hand cases -----------------------------------------------------------------------------


def test_full_subscription_round_trips() -> None:
    data = pack_subscription(FULL_SUBSCRIPTION)
    assert_exact(unpack_subscription(data), FULL_SUBSCRIPTION)
    assert type(unpack_subscription(data).notification.throttling) is int


def test_minimal_subscription_round_trips() -> None:
    minimal = Subscription("s0", (EntitySelector(id="x"),))
    assert_exact(unpack_subscription(pack_subscription(minimal)), minimal)


@pytest.mark.parametrize("expires", [None, 0, 1_700_000_000, 1_700_000_000.0, -1.5, 2**80])
def test_expires_keeps_its_type(expires: float | None) -> None:
    s = FULL_SUBSCRIPTION.replace(expires=expires)
    assert_exact(unpack_subscription(pack_subscription(s)), s)


@pytest.mark.parametrize("throttling", [0, 0.0, -0.0])
def test_almost_default_notification_stays_exact(throttling: float) -> None:
    # An exactly default notification is sent as nil; 0 and -0.0 are not the default 0.0.
    notification = NotificationOptions(throttling=throttling)
    s = Subscription("s0", (EntitySelector(id="x"),), notification=notification)
    assert_exact(unpack_subscription(pack_subscription(s)), s)


def test_full_update_round_trips() -> None:
    back = unpack_update(pack_update(FULL_UPDATE))
    assert_exact(back, FULL_UPDATE)
    assert back.attributes["when"].match_value == FULL_UPDATE.attributes["when"].match_value
    assert list(back.attributes) == list(FULL_UPDATE.attributes)  # order kept


def test_batches_round_trip_in_order() -> None:
    subs = [FULL_SUBSCRIPTION.replace(id=f"s{i}") for i in range(50)]
    assert_exact(unpack_subscriptions(pack_subscriptions(iter(subs))), subs)
    ups = [FULL_UPDATE, ContextUpdate.of("e1", {"a": 1}, sequence=1)]
    assert_exact(unpack_updates(pack_updates(ups)), ups)
    assert unpack_subscriptions(pack_subscriptions([])) == []
    assert unpack_updates(pack_updates([])) == []


def test_objects_embed_in_a_bigger_message() -> None:
    message = {"epoch": 3, "subs": [subscription_to_obj(FULL_SUBSCRIPTION)]}
    message["update"] = update_to_obj(FULL_UPDATE)
    back = unpackb(packb(message))
    assert_exact(subscription_from_obj(back["subs"][0]), FULL_SUBSCRIPTION)
    assert_exact(update_from_obj(back["update"]), FULL_UPDATE)


def test_objects_pack_with_plain_msgpack() -> None:
    # Tuples and huge ints are extension types: plain msgpack packs them, decode_ext reads them.
    packed = msgpack.packb(update_to_obj(FULL_UPDATE))
    assert_exact(update_from_obj(unpackb(packed)), FULL_UPDATE)


def test_payload_is_compact() -> None:
    minimal = Subscription("s0", (EntitySelector(id="x"),))
    assert len(pack_subscription(minimal)) < 48
    assert len(pack_update(ContextUpdate.of("e1", {"temp": 20}))) < 64


def test_gc_is_restored_after_batches_even_on_error() -> None:
    assert gc.isenabled()
    unpack_subscriptions(pack_subscriptions([FULL_SUBSCRIPTION]))
    with pytest.raises(SerializationError):
        unpack_subscriptions(pack_subscriptions([FULL_SUBSCRIPTION])[:-3])
    assert gc.isenabled()


# -- property round trips -------------------------------------------------------------------

_IDENTIFIER_CHARS = "".join(chr(c) for c in range(0x21, 0x7F) if chr(c) not in "&?/#<>\"'=;()")
identifiers = st.text(_IDENTIFIER_CHARS, min_size=1, max_size=12)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**100), max_value=2**100)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=4).map(tuple)
        | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=20,
)
types = identifiers.filter(lambda t: t not in ("DateTime", "ISO8601"))
metadata = st.dictionaries(identifiers, st.builds(Metadata, types, json_values), max_size=3)
attributes = st.builds(Attribute, types, json_values, metadata)
attribute_names = identifiers.filter(lambda n: n not in ("id", "type", "*"))
levels = st.from_regex(r"[A-Za-z0-9_]{1,8}", fullmatch=True)
service_paths = st.lists(levels, max_size=4).map(lambda ls: "/" + "/".join(ls))
tenants = st.from_regex(r"[a-z0-9_]{0,10}", fullmatch=True)


@st.composite
def any_updates(draw: st.DrawFn) -> ContextUpdate:
    return ContextUpdate(
        entity_id=draw(identifiers),
        attributes=draw(st.dictionaries(attribute_names, attributes, max_size=5)),
        entity_type=draw(identifiers),
        tenant=draw(tenants),
        service_path=draw(service_paths),
        publisher=draw(st.text(max_size=20)),
        sequence=draw(st.integers(min_value=0) | st.integers(2**63, 2**90)),
    )


@st.composite
def notifications(draw: st.DrawFn) -> NotificationOptions:
    names = st.lists(identifiers, max_size=3).map(tuple)
    attrs = draw(names)
    except_attrs = () if attrs else draw(names)
    return NotificationOptions(
        attrs=attrs,
        except_attrs=except_attrs,
        attrs_format=draw(st.sampled_from(AttrsFormat)),
        metadata=draw(st.lists(st.text(max_size=10), max_size=3).map(tuple)),
        only_changed_attrs=draw(st.booleans()),
        covered=bool(attrs) and draw(st.booleans()),
        throttling=draw(st.integers(0, 10**6) | st.floats(0, 1e9)),
        max_fails_limit=draw(st.none() | st.integers(min_value=1)),
    )


@st.composite
def any_subscriptions(draw: st.DrawFn) -> Subscription:
    base = draw(subscriptions(ids=("s0", "urn:ngsi:Sub:1", "x")))
    return base.replace(
        notification=draw(notifications()),
        subscriber=draw(st.text(max_size=30)),
        description=draw(st.text(max_size=40)),
        expires=draw(st.none() | st.floats(allow_nan=False, allow_infinity=False) | st.integers()),
        status=draw(st.sampled_from(Status)),
    )


@given(any_subscriptions())
def test_any_subscription_round_trips(s: Subscription) -> None:
    assert_exact(unpack_subscription(pack_subscription(s)), s)


@given(st.lists(subscriptions(), max_size=5))
def test_generated_subscription_batches_round_trip(subs: list[Subscription]) -> None:
    assert_exact(unpack_subscriptions(pack_subscriptions(subs)), subs)


@given(any_updates())
def test_any_update_round_trips(u: ContextUpdate) -> None:
    assert_exact(unpack_update(pack_update(u)), u)


@given(st.lists(updates(), max_size=5))
def test_generated_update_batches_round_trip(ups: list[ContextUpdate]) -> None:
    assert_exact(unpack_updates(pack_updates(ups)), ups)


# -- refusals -------------------------------------------------------------------------------


def test_every_truncation_is_refused() -> None:
    cases: list[tuple[bytes, Callable[[bytes], object]]] = [
        (pack_subscription(FULL_SUBSCRIPTION), unpack_subscription),
        (pack_update(FULL_UPDATE), unpack_update),
    ]
    for data, unpack in cases:
        for end in range(len(data)):
            with pytest.raises(SerializationError):
                unpack(data[:end])


def test_truncated_batch_is_refused() -> None:
    data = pack_subscriptions([FULL_SUBSCRIPTION] * 3)
    for end in range(0, len(data), 7):
        with pytest.raises(SerializationError):
            unpack_subscriptions(data[:end])


@given(st.data())
def test_corrupt_bytes_raise_only_serialization_errors(data: st.DataObject) -> None:
    payload = bytearray(pack_subscription(FULL_SUBSCRIPTION))
    for _ in range(data.draw(st.integers(1, 4))):
        payload[data.draw(st.integers(0, len(payload) - 1))] = data.draw(st.integers(0, 255))
    try:
        result = unpack_subscription(bytes(payload))
    except SerializationError:
        return
    assert isinstance(result, Subscription)  # a flip inside a string can still be valid


@given(st.binary(max_size=200))
def test_garbage_raises_only_serialization_errors(garbage: bytes) -> None:
    for unpack in (unpack_subscription, unpack_update, unpack_subscriptions, unpack_updates):
        with pytest.raises(SerializationError):
            unpack(garbage)


@pytest.mark.parametrize("version", [0, 2, FORMAT_VERSION + 100, "1", None, True, 1.0])
def test_unknown_version_is_refused(version: object) -> None:
    data = pack_envelope("silbo.sub", version, subscription_to_obj(FULL_SUBSCRIPTION))  # type: ignore[arg-type]
    with pytest.raises(SerializationError, match="version"):
        unpack_subscription(data)


def test_wrong_kind_is_refused() -> None:
    with pytest.raises(SerializationError, match=r"expected a 'silbo\.upd' payload"):
        unpack_update(pack_subscription(FULL_SUBSCRIPTION))
    with pytest.raises(SerializationError, match=r"silbo\.subs"):
        unpack_subscriptions(pack_subscription(FULL_SUBSCRIPTION))
    with pytest.raises(SerializationError, match="envelope"):
        unpack_subscription(packb({"kind": "silbo.sub"}))


@pytest.mark.parametrize(
    "data",
    [
        "not bytes",
        None,
        b"",
        b"\xc1",  # never used in msgpack
        packb(["silbo.sub", 1, [1]]) + b"\x00",  # trailing data
        b"\x91" * 100_000 + b"\xc0",  # nested too deep
        packb(["silbo.sub", 1, msgpack.ExtType(99, b"")]),
        packb(["silbo.sub", 1, {1: 2}]),  # a non-string map key
        b"\xa2\xff\xfe",  # not UTF-8
    ],
    ids=["str", "none", "empty", "reserved", "trailing", "deep", "ext", "map-key", "utf8"],
)
def test_malformed_payloads_are_refused(data: Any) -> None:
    with pytest.raises(SerializationError):
        unpack_subscription(data)


def test_oversized_payload_is_refused_before_decoding() -> None:
    with pytest.raises(SerializationError, match="at most"):
        unpack_update(b"\x00" * (MAX_ITEM_SIZE + 1))


def _mutated(obj: list[Any], path: tuple[int, ...], value: object) -> list[Any]:
    copy = unpackb(packb(obj))
    target = copy
    for index in path[:-1]:
        target = target[index]
    target[path[-1]] = value
    return copy  # type: ignore[no-any-return]


SUBSCRIPTION_MUTATIONS: list[tuple[tuple[int, ...], object]] = [
    ((0,), 5),  # id
    ((0,), "has space"),
    ((1,), "not a list"),
    ((1,), []),  # no entity selector
    ((1, 0), ["x"]),
    ((1, 0, 0), 3),
    ((2,), None),  # tenant
    ((3,), 3),  # service path
    ((4,), "temp"),  # condition attrs
    ((4,), [1]),
    ((5,), None),  # q
    ((5,), "temp>>"),
    ((6,), 1),  # mq
    ((7,), "default"),  # notification
    ((7,), [1, 2]),
    ((7, 0), ["temp", 3]),
    ((7, 2), "keyValues"),
    ((7, 2), 9),
    ((7, 3), [None]),
    ((7, 4), 1),  # only changed attrs: not a bool
    ((7, 5), "yes"),
    ((7, 6), "fast"),
    ((7, 6), -1),
    ((7, 7), 1.5),
    ((7, 7), True),
    ((8,), 7),  # subscriber
    ((9,), "tomorrow"),  # expires
    ((9,), [1]),
    ((10,), "active"),  # status: a code, not a name
    ((10,), 7),
    ((10,), True),
    ((11,), b"bytes"),  # description
    ((11,), "x" * 2000),
]


@pytest.mark.parametrize(("path", "value"), SUBSCRIPTION_MUTATIONS)
def test_wrong_subscription_fields_are_refused(path: tuple[int, ...], value: object) -> None:
    obj = _mutated(subscription_to_obj(FULL_SUBSCRIPTION), path, value)
    with pytest.raises(SerializationError):
        subscription_from_obj(obj)
    with pytest.raises(SerializationError):
        unpack_subscription(pack_envelope("silbo.sub", FORMAT_VERSION, obj))


UPDATE_MUTATIONS: list[tuple[tuple[int, ...], object]] = [
    ((0,), None),  # entity id
    ((1,), "bad type"),
    ((2,), "UPPER"),  # tenant
    ((3,), "relative"),  # service path
    ((4,), 4),  # publisher
    ((5,), -1),  # sequence
    ((5,), "1"),
    ((5,), 1.0),
    ((6,), {}),  # attributes
    ((6, 0), ["temp"]),
    ((6, 0, 0), "id"),  # a reserved name
    ((6, 0, 1), 12),
    ((6, 0, 2), float("nan")),
    ((6, 0, 3), None),
    ((6, 0, 3, 0), ["accuracy", "Number"]),
    ((6, 0, 3, 0, 0), 1),
    ((6, 1), ["temp", "Number", 1, []]),  # a repeated attribute name
]


@pytest.mark.parametrize(("path", "value"), UPDATE_MUTATIONS)
def test_wrong_update_fields_are_refused(path: tuple[int, ...], value: object) -> None:
    obj = _mutated(update_to_obj(FULL_UPDATE), path, value)
    with pytest.raises(SerializationError):
        update_from_obj(obj)
    with pytest.raises(SerializationError):
        unpack_update(pack_envelope("silbo.upd", FORMAT_VERSION, obj))


def test_model_errors_are_wrapped_with_their_cause() -> None:
    obj = _mutated(subscription_to_obj(FULL_SUBSCRIPTION), (0,), "has space")
    with pytest.raises(SerializationError, match="invalid subscription") as caught:
        subscription_from_obj(obj)
    assert isinstance(caught.value.__cause__, InvalidIdentifier)


def test_batch_errors_name_the_position() -> None:
    good = subscription_to_obj(FULL_SUBSCRIPTION)
    bad = _mutated(good, (5,), None)
    data = pack_envelope("silbo.subs", FORMAT_VERSION, [good, good, bad])
    with pytest.raises(SerializationError, match="subscription 2 of the batch"):
        unpack_subscriptions(data)


def test_unpackable_object_is_refused_when_packing() -> None:
    with pytest.raises(SerializationError):
        packb(object())
