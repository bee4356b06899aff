"""Splitting a matcher's subscriptions into parts and loading them: nothing lost or misplaced."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from typing import Any

import pytest
from strategies import NOW, RandomSource, draw_subscription, draw_update

from broker.errors import InvalidInput, SerializationError
from broker.matching.engine import Engine
from broker.matching.reference import ReferenceMatcher
from broker.model.subscription import (
    AttrsFormat,
    EntitySelector,
    NotificationOptions,
    Status,
    Subscription,
)
from broker.model.update import ContextUpdate
from broker.partition.parts import (
    PART_KIND,
    PART_VERSION,
    TrustedPart,
    load,
    pack_part,
    split,
    split_moved,
    unpack_part,
    unpack_part_pieces,
)
from broker.partition.selector import RendezvousSelector, moved
from broker.serialization import (
    pack_envelope,
    pack_subscriptions,
    subscription_to_obj,
)

# The indexed Engine has the same API; add it to the parametrization once it settles.
Matcher = ReferenceMatcher


def owners(n: int) -> tuple[str, ...]:
    return tuple(f"m{i}" for i in range(n))


def workload(
    count: int = 300, updates: int = 300, seed: int = 7
) -> tuple[list[Subscription], list[ContextUpdate]]:
    source = RandomSource(random.Random(seed))
    subs = [draw_subscription(source, f"sub-{i}") for i in range(count)]
    return subs, [draw_update(source) for _ in range(updates)]


SUBSCRIPTIONS, UPDATES = workload()


def matches(matchers: Iterable[Matcher], update: ContextUpdate) -> set[str]:
    found: set[str] = set()
    for matcher in matchers:
        result = matcher.match(update, NOW)
        assert not found & result  # no subscription is held twice
        found |= result
    return found


def assert_same_matches(original: Matcher, matchers: Iterable[Matcher]) -> None:
    matchers = list(matchers)
    hits = 0
    for update in UPDATES:
        expected = original.match(update, NOW)
        assert matches(matchers, update) == expected
        hits += len(expected)
    assert hits > 0  # the workload does match


@pytest.mark.parametrize("make", [ReferenceMatcher, Engine])
def test_split_and_load_keeps_every_match(make: Callable[[], Matcher]) -> None:
    original = ReferenceMatcher(SUBSCRIPTIONS)
    selector = RendezvousSelector(owners(3))
    parts = split(original, selector)
    assert set(parts) == set(selector.owners)
    loaded: dict[str, Matcher] = {}
    for owner, part in parts.items():
        loaded[owner] = make()
        load(part, loaded[owner], owner=owner)
    assert sum(len(m) for m in loaded.values()) == len(SUBSCRIPTIONS)
    for owner, matcher in loaded.items():
        assert matcher.subscriptions()  # 300 subscriptions among 3: none is empty
        for subscription in matcher.subscriptions():
            assert selector.owner_of(subscription.id) == owner
    assert_same_matches(original, loaded.values())


def test_loaded_subscriptions_equal_the_originals() -> None:
    parts = split(ReferenceMatcher(SUBSCRIPTIONS), RendezvousSelector(owners(3)))
    back = {s.id: s for part in parts.values() for s in unpack_part(part).subscriptions}
    assert back == {s.id: s for s in SUBSCRIPTIONS}


def test_every_owner_gets_a_part_even_when_empty() -> None:
    one = Subscription("only", (EntitySelector(id="x"),))
    selector = RendezvousSelector(owners(5))
    parts = split(ReferenceMatcher([one]), selector)
    assert set(parts) == set(owners(5))
    counts = {owner: load(part, ReferenceMatcher()) for owner, part in parts.items()}
    assert counts == {owner: int(owner == selector.owner_of("only")) for owner in owners(5)}
    assert split(ReferenceMatcher(), selector).keys() == set(owners(5))


def scale(
    state: dict[str, ReferenceMatcher], old: RendezvousSelector, new: RendezvousSelector
) -> tuple[dict[str, ReferenceMatcher], int]:
    """Run the state transfer of one scale operation; return the new state and parts moved."""
    outgoing = {owner: split_moved(state[owner], old, new, owner) for owner in old.owners}
    after = {owner: ReferenceMatcher(state[owner].subscriptions()) for owner in old.owners}
    for owner in new.owners:
        after.setdefault(owner, ReferenceMatcher())
    moved_count = 0
    for sender, parts in outgoing.items():
        assert set(parts) == set(new.owners) - {sender}
        for receiver, part in parts.items():
            for subscription in unpack_part(part, receiver).subscriptions:
                after[sender].remove(subscription.id)
            moved_count += load(part, after[receiver], owner=receiver)
    return {owner: after[owner] for owner in new.owners}, moved_count


@pytest.mark.parametrize(("n", "m"), [(3, 4), (4, 3), (1, 2), (2, 1), (3, 5), (5, 2)])
def test_scaling_moves_only_what_changes_owner(n: int, m: int) -> None:
    old, new = RendezvousSelector(owners(n)), RendezvousSelector(owners(m))
    original = ReferenceMatcher(SUBSCRIPTIONS)
    state = {owner: ReferenceMatcher() for owner in old.owners}
    for owner, part in split(original, old).items():
        load(part, state[owner])
    after, moved_count = scale(state, old, new)
    assert moved_count == len(moved(old, new, [s.id for s in SUBSCRIPTIONS]))
    for owner, matcher in after.items():
        for subscription in matcher.subscriptions():
            assert new.owner_of(subscription.id) == owner
    assert sum(len(m) for m in after.values()) == len(SUBSCRIPTIONS)
    assert_same_matches(original, after.values())


def test_scale_out_sends_only_to_the_new_owner() -> None:
    old, new = RendezvousSelector(owners(3)), RendezvousSelector(owners(4))
    holder = ReferenceMatcher(SUBSCRIPTIONS)
    for owner in old.owners:
        parts = split_moved(holder, old, new, owner)
        counts = {receiver: len(unpack_part(p).subscriptions) for receiver, p in parts.items()}
        assert counts["m3"] > 0
        assert all(count == 0 for receiver, count in counts.items() if receiver != "m3")


def test_split_moved_sends_only_what_self_owned() -> None:
    # A holder of every subscription (a shared snapshot): each owner sends only its own.
    old, new = RendezvousSelector(owners(2)), RendezvousSelector(owners(3))
    holder = ReferenceMatcher(SUBSCRIPTIONS)
    sent = [
        s.id
        for owner in old.owners
        for part in split_moved(holder, old, new, owner).values()
        for s in unpack_part(part).subscriptions
    ]
    assert sorted(sent) == sorted(moved(old, new, [s.id for s in SUBSCRIPTIONS]))


def test_a_new_owner_sends_empty_parts() -> None:
    old, new = RendezvousSelector(owners(2)), RendezvousSelector(owners(3))
    parts = split_moved(ReferenceMatcher(), old, new, "m2")
    assert set(parts) == {"m0", "m1"}
    assert all(unpack_part(part).subscriptions == [] for part in parts.values())


def test_split_moved_needs_an_owner_of_either_selector() -> None:
    old, new = RendezvousSelector(owners(2)), RendezvousSelector(owners(3))
    with pytest.raises(InvalidInput):
        split_moved(ReferenceMatcher(SUBSCRIPTIONS), old, new, "m9")


# -- refusals -------------------------------------------------------------------------------


def test_part_for_another_owner_is_refused_and_loads_nothing() -> None:
    part = pack_part("m1", SUBSCRIPTIONS[:10])
    target = ReferenceMatcher()
    with pytest.raises(SerializationError, match="part is for 'm1', not 'm0'"):
        load(part, target, owner="m0")
    assert len(target) == 0
    assert load(part, target, owner="m1") == 10


def test_truncated_part_is_refused_and_loads_nothing() -> None:
    part = pack_part("m0", SUBSCRIPTIONS[:20])
    target = ReferenceMatcher()
    for end in range(0, len(part), max(1, len(part) // 200)):
        with pytest.raises(SerializationError):
            load(part[:end], target)
    assert len(target) == 0


def test_count_mismatch_is_refused() -> None:
    objs = [subscription_to_obj(s) for s in SUBSCRIPTIONS[:5]]
    part = pack_envelope(PART_KIND, PART_VERSION, ["m0", 6, 6, objs])
    with pytest.raises(SerializationError, match="declares 6 subscriptions but holds 5"):
        load(part, ReferenceMatcher())


# part bodies whose header is wrong (the trusted decode and the checked one both refuse them)
MALFORMED_HEADERS: list[object] = [
    None,
    ["m0", 0, []],  # format version 1's body
    ["m0", 0, 0],
    [0, 0, 0, []],
    ["m0", "0", 0, []],
    ["m0", True, 1, []],
    ["m0", 0, -1, []],
    ["m0", 0, 0, {}],
]


@pytest.mark.parametrize("body", [*MALFORMED_HEADERS, ["m0", 1, 1, [["not", "a", "subscription"]]]])
def test_malformed_part_header_is_refused(body: object) -> None:
    with pytest.raises(SerializationError):
        unpack_part(pack_envelope(PART_KIND, PART_VERSION, body))


def test_other_payloads_are_not_parts() -> None:
    with pytest.raises(SerializationError, match=r"silbo\.part"):
        load(pack_subscriptions(SUBSCRIPTIONS[:3]), ReferenceMatcher())
    future = pack_envelope(PART_KIND, PART_VERSION + 1, ["m0", 0, 0, []])
    with pytest.raises(SerializationError, match="version"):
        load(future, ReferenceMatcher())


def test_bad_subscription_in_a_part_names_its_position() -> None:
    objs = [subscription_to_obj(s) for s in SUBSCRIPTIONS[:3]]
    objs[2][0] = "bad id"
    part = pack_envelope(PART_KIND, PART_VERSION, ["m0", 3, 3, objs])
    target = ReferenceMatcher()
    with pytest.raises(SerializationError, match="subscription 2"):
        load(part, target)
    assert len(target) == 0


# -- the trusted decode of a part from another matcher ----------------------------------------


def trusted(part: bytes, owner: str | None = None, size: int = 7) -> list[Subscription]:
    return [s for piece in unpack_part_pieces(part, owner, size, trusted=True) for s in piece]


UNUSUAL = [
    Subscription(
        "notified",
        (EntitySelector(id_pattern="^Room", type="Room"), EntitySelector(id="Hall")),
        notification=NotificationOptions(
            attrs=("temperature",), attrs_format=AttrsFormat.KEY_VALUES, throttling=2.5
        ),
        expires=1_900_000_000.5,
        subscriber="ff01",
    ),
    Subscription("idle", (EntitySelector(id="x"),), status=Status.INACTIVE, q="a>1", mq="a.m==2"),
    Subscription("big-expiry", (EntitySelector(id="x"),), expires=1 << 70),
]


def test_trusted_decode_equals_the_checked_one() -> None:
    part = pack_part("m0", SUBSCRIPTIONS + UNUSUAL)
    decoded = trusted(part, "m0")
    assert decoded == unpack_part(part, "m0").subscriptions == SUBSCRIPTIONS + UNUSUAL
    for mine, theirs in zip(decoded, SUBSCRIPTIONS + UNUSUAL, strict=True):
        assert mine.filter == theirs.filter


def test_trusted_decode_shares_equal_selectors_and_filters() -> None:
    same = [
        Subscription(f"s{i}", (EntitySelector(id_pattern="^R", type="Room"),), q="t>1")
        for i in range(3)
    ]
    decoded = trusted(pack_part("m0", same))
    assert decoded[0].entities is decoded[2].entities
    assert decoded[0].filter is decoded[2].filter


@pytest.mark.parametrize("size", [1, 1000])
def test_trusted_pieces_hold_at_most_size(size: int) -> None:
    pieces = list(unpack_part_pieces(pack_part("m0", SUBSCRIPTIONS), size=size, trusted=True))
    assert all(len(piece) <= size for piece in pieces)
    assert sum(map(len, pieces)) == len(SUBSCRIPTIONS)


def test_trusted_decode_refuses_a_truncated_part_before_any_piece() -> None:
    part = pack_part("m0", SUBSCRIPTIONS[:20])
    for end in range(0, len(part), max(1, len(part) // 200)):
        with pytest.raises(SerializationError):
            next(unpack_part_pieces(part[:end], trusted=True))


def test_trusted_decode_refuses_trailing_bytes() -> None:
    with pytest.raises(SerializationError, match="more than its envelope"):
        trusted(pack_part("m0", SUBSCRIPTIONS[:3]) + b"\x00")


def test_trusted_decode_checks_owner_and_count() -> None:
    with pytest.raises(SerializationError, match="part is for 'm1', not 'm0'"):
        trusted(pack_part("m1", SUBSCRIPTIONS[:3]), "m0")
    objs = [subscription_to_obj(s) for s in SUBSCRIPTIONS[:5]]
    with pytest.raises(SerializationError, match="declares 6 subscriptions but holds 5"):
        trusted(pack_envelope(PART_KIND, PART_VERSION, ["m0", 6, 6, objs]))


@pytest.mark.parametrize("body", MALFORMED_HEADERS)
def test_trusted_decode_refuses_a_malformed_header(body: object) -> None:
    with pytest.raises(SerializationError):
        trusted(pack_envelope(PART_KIND, PART_VERSION, body))


def test_trusted_decode_refuses_other_payloads() -> None:
    with pytest.raises(SerializationError, match=r"silbo\.part"):
        trusted(pack_subscriptions(SUBSCRIPTIONS[:3]))
    with pytest.raises(SerializationError, match="version"):
        trusted(pack_envelope(PART_KIND, PART_VERSION + 1, ["m0", 0, 0, []]))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        (None, ["not", "a", "subscription"]),
        (1, []),
        (1, [["x", None, None, None, None]]),
        (10, 99),
        (5, "("),
    ],
)
def test_trusted_decode_names_the_position_of_a_malformed_subscription(
    field: int | None, value: object
) -> None:
    objs: list[Any] = [subscription_to_obj(s) for s in SUBSCRIPTIONS[:3]]
    if field is None:
        objs[2] = value
    else:
        objs[2][field] = value
    with pytest.raises(SerializationError, match="subscription 2"):
        trusted(pack_envelope(PART_KIND, PART_VERSION, ["m0", 3, 3, objs]))


def test_a_chunk_says_how_many_the_whole_part_holds() -> None:
    chunk = pack_part("m0", SUBSCRIPTIONS[:5], total=12)
    decoded = unpack_part(chunk, "m0")
    assert (decoded.total, decoded.subscriptions) == (12, SUBSCRIPTIONS[:5])
    reader = TrustedPart(chunk, "m0")
    assert (reader.owner, reader.count, reader.total) == ("m0", 5, 12)
    assert [s for piece in reader.pieces(2) for s in piece] == SUBSCRIPTIONS[:5]
    assert unpack_part(pack_part("m0", SUBSCRIPTIONS[:5])).total == 5
    with pytest.raises(InvalidInput, match="cannot hold"):
        pack_part("m0", SUBSCRIPTIONS[:5], total=4)


def test_a_chunk_holding_more_than_its_total_is_refused() -> None:
    objs = [subscription_to_obj(s) for s in SUBSCRIPTIONS[:3]]
    part = pack_envelope(PART_KIND, PART_VERSION, ["m0", 3, 2, objs])
    with pytest.raises(SerializationError, match="3 of a total of 2"):
        unpack_part(part)
    with pytest.raises(SerializationError, match="3 of a total of 2"):
        trusted(part)
