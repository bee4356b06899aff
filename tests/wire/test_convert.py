"""Wire <-> model conversions: lossless round trips, and the same verdicts as the model."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import subscriptions, updates

from broker.errors import InvalidInput
from broker.model.update import ContextUpdate
from broker.serialization import packb, unpackb
from broker.wire import client_pb2 as pb
from broker.wire.convert import (
    entity_from_update,
    normalize_entity,
    spec_from_subscription,
    subscription_from_spec,
    trusted_update,
    trusted_update_from_obj,
    update_from_entity,
    value_from_wire,
    value_to_wire,
)


def _plain(update: ContextUpdate) -> ContextUpdate:
    return dataclasses.replace(update, publisher="", sequence=0)


@given(updates())
def test_an_update_survives_the_wire_every_way(update: ContextUpdate) -> None:
    entity = pb.Entity.FromString(entity_from_update(update).SerializeToString())
    assert update_from_entity(entity) == _plain(update)
    assert trusted_update(entity) == _plain(update)
    obj = unpackb(packb(normalize_entity(entity)))
    decoded = trusted_update_from_obj(obj)
    assert decoded == _plain(update)
    for name, attribute in decoded.attributes.items():
        assert attribute.match_value == update.attributes[name].match_value


@given(subscriptions())
def test_a_subscription_survives_the_wire(subscription: object) -> None:
    from broker.model.subscription import NotificationOptions, Subscription

    assert isinstance(subscription, Subscription)
    spec = pb.SubscriptionSpec.FromString(spec_from_subscription(subscription).SerializeToString())
    back = subscription_from_spec(spec, id=subscription.id, subscriber=subscription.subscriber)
    expected = subscription.replace(
        notification=NotificationOptions(attrs=subscription.notification.attrs),
        status=back.status,
    )
    assert back == expected


@pytest.mark.parametrize(
    "value", [None, True, False, 0, -7, 2**62, 1.5, -0.0, "", "text", [1, "a"], {"k": [None]}]
)
def test_values_round_trip(value: object) -> None:
    wire = pb.Value()
    value_to_wire(value, wire)
    back = value_from_wire(pb.Value.FromString(wire.SerializeToString()))
    assert back == value and type(back) is type(value)


# JSON nested past what json.loads can decode (RecursionError, not ValueError)
DEEP_JSON = "[" * 100_000 + "]" * 100_000


def _entity(**fields: object) -> pb.Entity:
    entity = pb.Entity(id="Room1", type="Room")
    for key, value in fields.items():
        setattr(entity, key, value)
    return entity


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda e: setattr(e, "id", "bad id"), "whitespace"),
        (lambda e: setattr(e, "id", "a#b"), "forbidden"),
        (lambda e: setattr(e, "id", ""), "empty"),
        (lambda e: setattr(e, "tenant", "UPPER"), "tenant"),
        (lambda e: setattr(e, "service_path", "relative"), "absolute"),
        (lambda e: e.attributes.add(name="id", value=pb.Value(number=1)), "reserved"),
        (lambda e: e.attributes.add(name="a b", value=pb.Value(number=1)), "attribute name"),
        (
            lambda e: e.attributes.add(name="t", type="DateTime", value=pb.Value(text="soon")),
            "ISO 8601",
        ),
        (lambda e: e.attributes.add(name="j", value=pb.Value(json="{bad")), "JSON"),
        (lambda e: e.attributes.add(name="j", value=pb.Value(json="3")), "objects and arrays"),
        (lambda e: e.attributes.add(name="n", value=pb.Value(number=float("nan"))), "nan"),
        (lambda e: e.attributes.add(name="j", value=pb.Value(json=DEEP_JSON)), "nested deeper"),
        (
            lambda e: e.attributes.add(
                name="j", metadata=[pb.Metadata(name="m", value=pb.Value(json=DEEP_JSON))]
            ),
            "nested deeper",
        ),
    ],
)
def test_the_check_refuses_what_the_model_refuses(mutate: object, message: str) -> None:
    entity = _entity()
    assert callable(mutate)
    mutate(entity)
    with pytest.raises(InvalidInput, match=message):
        normalize_entity(entity)
    with pytest.raises(InvalidInput):
        update_from_entity(entity)


def test_a_repeated_attribute_is_refused() -> None:
    entity = _entity()
    entity.attributes.add(name="t", value=pb.Value(number=1))
    entity.attributes.add(name="t", value=pb.Value(number=2))
    with pytest.raises(InvalidInput, match="twice"):
        normalize_entity(entity)


@given(st.text(max_size=20))
def test_the_check_agrees_with_the_model_on_any_entity_id(entity_id: str) -> None:
    entity = _entity(id=entity_id)
    try:
        expected = update_from_entity(entity)
    except InvalidInput:
        with pytest.raises(InvalidInput):
            normalize_entity(entity)
    else:
        assert trusted_update_from_obj(normalize_entity(entity)) == expected


def test_defaults_are_filled_in() -> None:
    entity = pb.Entity(id="x")
    entity.attributes.add(name="n", value=pb.Value(integer=3))
    obj = normalize_entity(entity)
    assert (entity.type, entity.service_path, entity.attributes[0].type) == ("Thing", "/", "Number")
    assert trusted_update_from_obj(obj) == ContextUpdate.of("x", {"n": 3})
