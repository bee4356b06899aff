"""Alert rules (broker/store/alerting.py, alert_log.py): the hysteresis state machine
against a direct reading of its rules (property tests, with and without ``for``, through
restarts of the state), rules checked (every problem in one 400), and the store's alert
log over real entity writes: states and transitions in the writes' own commits, published
in order only once durable, and a failover that goes on from the copied state without
losing or repeating a transition."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

from broker.errors import InvalidInput, mapping_for
from broker.model.change import Alteration, Change
from broker.ngsi.entity import to_wire
from broker.store.alert_log import OUTBOX_SPACE, STATE_SPACE, AlertLog, Outgoing, sorted_out
from broker.store.alerting import (
    AlertState,
    Condition,
    Rule,
    Transition,
    alert_attributes,
    number_of,
    parse_rule,
    step,
)
from broker.store.entities import Entities, MemoryEngine, partition_of
from broker.store.semantics import Applied, Document, Mode
from broker.store.wire import Intent

T0 = 1_000_000.0
RULE = {
    "id": "hot",
    "entities": {"type": "Room"},
    "attribute": "temperature",
    "condition": {"above": 30, "clearBelow": 28},
}

Series = Sequence[tuple[float, float]]  # (time, value)


# -- the state machine against the rules read directly ---------------------------------------


def reference(condition: Condition, series: Series) -> list[tuple[int, bool, float, float]]:
    """The transitions (index, raised, value, threshold) a series makes, from the rules as
    docs/alerts.md states them: raised at a value past the raise threshold whose run of
    such values (back to the first of them) lasted ``for`` or more; cleared at a value past
    the clear threshold, once raised."""

    def over(value: float) -> bool:
        return value > condition.threshold if condition.above else value < condition.threshold

    def back(value: float) -> bool:
        return value < condition.clear if condition.above else value > condition.clear

    found: list[tuple[int, bool, float, float]] = []
    raised = False
    for index, (at, value) in enumerate(series):
        if raised:
            if back(value):
                raised = False
                found.append((index, False, value, condition.clear))
            continue
        if not over(value):
            continue
        first = index  # the first value of the run of values past the raise threshold
        while first > 0 and over(series[first - 1][1]):
            first -= 1
        if at - series[first][0] >= condition.hold:
            raised = True
            found.append((index, True, value, condition.threshold))
    return found


def machine(
    condition: Condition, series: Series, restarts: frozenset[int] = frozenset()
) -> list[tuple[int, bool, float, float]]:
    """The transitions :func:`step` makes, the state sent through its wire form (as the
    store keeps it) before the values at ``restarts``."""
    state = AlertState()
    found = []
    for index, (at, value) in enumerate(series):
        if index in restarts:
            state = AlertState.from_wire(msgpack.unpackb(msgpack.packb(state.to_wire())))
        state, transition = step(condition, state, value, at)
        if transition is not None:
            found.append((index, transition.raised, transition.value, transition.threshold))
            assert transition.number == len(found) == state.transitions
            assert transition.at == at
    return found


@st.composite
def conditions(draw: st.DrawFn) -> Condition:
    above = draw(st.booleans())
    threshold = draw(st.integers(-3, 3))
    band = draw(st.sampled_from([0, 0, 1, 2]))
    hold = draw(st.sampled_from([0.0, 0.0, 1.0, 2.5]))
    return Condition(above, threshold, threshold - band if above else threshold + band, hold)


@st.composite
def serieses(draw: st.DrawFn) -> list[tuple[float, float]]:
    gaps = draw(st.lists(st.sampled_from([0.0, 0.5, 1.0, 2.0]), min_size=1, max_size=40))
    values = draw(
        st.lists(
            st.integers(-5, 5) | st.sampled_from([0.5, -0.5, 2.5]),
            min_size=len(gaps),
            max_size=len(gaps),
        )
    )
    times = [T0 + sum(gaps[: i + 1]) for i in range(len(gaps))]
    return list(zip(times, values, strict=True))


@settings(max_examples=examples(400), deadline=None)
@given(condition=conditions(), series=serieses(), data=st.data())
def test_the_state_machine_makes_exactly_the_transitions_of_the_rules(
    condition: Condition, series: list[tuple[float, float]], data: st.DataObject
) -> None:
    restarts = data.draw(st.frozensets(st.integers(0, len(series) - 1)))
    expected = reference(condition, series)
    assert machine(condition, series, restarts) == expected
    # raised and cleared alternate, starting raised: never twice the same
    assert [raised for _i, raised, *_r in expected] == [i % 2 == 0 for i in range(len(expected))]


def test_hysteresis_holds_a_wavering_value_and_for_waits() -> None:
    condition = Condition(True, 30, 28)
    series = [(T0 + i, v) for i, v in enumerate([29, 31, 29, 30.5, 28, 27.9, 31, 31])]
    assert [(i, r) for i, r, *_ in machine(condition, series)] == [(1, True), (5, False), (6, True)]
    held = Condition(True, 30, 30, hold=2.0)  # no band: exactly 30 changes nothing
    series = [(T0 + i, v) for i, v in enumerate([31, 32, 30, 31, 31, 33, 30, 29.5])]
    assert [(i, r) for i, r, *_ in machine(held, series)] == [(5, True), (7, False)]


# -- rules ----------------------------------------------------------------------------------


def test_a_rule_reads_back_as_given() -> None:
    body = {
        **RULE,
        "description": "rooms too hot",
        "condition": {"above": 30, "clearBelow": 28, "for": "10s"},
        "severity": "critical",
        "alert": {"type": "RoomAlert", "id": "A-{rule}-{type}-{id}"},
    }
    rule = parse_rule(body, "t", "/b/#")
    shown = rule.to_json()
    assert shown["condition"] == {"above": 30, "clearBelow": 28, "for": 10.0}
    assert parse_rule(shown, "t", "/b/#") == rule
    assert rule.alert_id_of("R1", "Room") == "A-hot-Room-R1"
    plain = parse_rule({**RULE, "condition": {"below": 5}}, "t", None)
    assert (plain.condition, plain.scope) == (Condition(False, 5, 5), "/#")
    assert plain.alert_id_of("R1", "Room") == "Alert:hot:R1"
    assert plain.alert_id_of("R" * 256, "Room") is None  # too long an id raises nothing


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"id": "a b"}, "id must be 1 to 64"),
        ({"attribute": 3}, "attribute must name"),
        ({"condition": {"above": 1, "below": 2}}, "one of above"),
        ({"condition": {}}, "one of above"),
        ({"condition": {"above": True}}, "condition.above must be a number"),
        ({"condition": {"above": 3, "clearBelow": 4}}, "must not be over above"),
        ({"condition": {"below": 3, "clearAbove": 2}}, "must not be under below"),
        ({"condition": {"below": 3, "clearBelow": 2}}, "clearBelow goes with above"),
        ({"condition": {"above": 3, "for": "1x"}}, "'1x'"),
        ({"condition": {"above": 3, "for": "2d"}}, "1 d at most"),
        ({"condition": {"above": 3, "when": 1}}, "unknown condition fields ['when']"),
        ({"condition": 3}, "condition must be an object"),
        ({"severity": "very bad"}, "severity must be"),
        ({"alert": {"id": "Alert:{id}"}}, "must name {rule} and {id}"),
        ({"alert": {"id": "A:{rule}:{id}:{room}"}}, "names ['room']"),
        ({"alert": {"id": "A:{rule}:{id}}"}}, "must make an identifier"),
        ({"alert": {"type": "Room"}}, "the alerts' own"),
        ({"alert": {"kind": "x"}}, "alert must be an object"),
        ({"entities": {"q": 3}}, "entities.q"),
        ({"entities": {"idPattern": "("}}, "entities (idPattern, q)"),
        ({"colour": "red"}, "unknown fields ['colour']"),
    ],
)
def test_a_bad_rule_is_a_400_with_what_to_fix(change: dict[str, Any], says: str) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_rule({**RULE, **change}, "t", None)
    assert says in str(refused.value)
    assert mapping_for(refused.value).http_status == 400


def test_every_problem_of_a_rule_is_named_at_once() -> None:
    bad = {
        "id": "",
        "attribute": "",
        "condition": {"above": "hot", "for": "soon"},
        "severity": "",
        "alert": {"id": "{id}"},
        "extra": 1,
    }
    with pytest.raises(InvalidInput) as refused:
        parse_rule(bad, "t", None)
    said = str(refused.value)
    for part in ("unknown fields ['extra']", "id must", "attribute must", "condition.above",
                 "condition.for", "severity must", "alert.id must name"):  # fmt: skip
        assert part in said, (part, said)


def test_an_alert_entity_carries_its_transition_number() -> None:
    assert number_of({"transition": {"type": "Number", "value": 3, "metadata": {}}}) == 3
    assert number_of({"status": {"type": "Text", "value": "raised"}}) == 0


# -- the store's alert log over real writes --------------------------------------------------


def store(rules: Sequence[dict[str, Any]] = (RULE,)) -> Entities:
    engine = MemoryEngine()
    log = AlertLog(engine)
    log.define(parse_rule(body, "", None) for body in rules)
    return Entities(engine, alerts=log)


def write(entities: Entities, entity_id: str, value: Any, entity_type: str = "Room") -> None:
    attributes = {"temperature": {"type": "Number", "value": value, "metadata": {}}}
    intent = Intent(Mode.UPSERT, entity_id, entity_type, attributes=attributes)
    (applied,) = asyncio.run(entities.apply([intent]))
    assert applied.error is None


def statuses(log: AlertLog) -> list[tuple[str, str, int]]:
    return [(e.entity_id, e.attributes["status"]["value"], e.number) for e in log.outbox(_all)]


def _all(_partition: int) -> bool:
    return True


def test_the_writes_keep_the_state_and_the_transitions_in_their_commits() -> None:
    entities = store()
    log = entities.alerts
    assert log is not None
    for value in (29, 31, 32, 29, 27, 31):
        write(entities, "R1", value)
    write(entities, "R2", 35)
    write(entities, "A1", 99, entity_type="Thing")  # not selected
    outbox = sorted(log.outbox(_all), key=lambda e: (e.entity_id, e.number))
    assert sorted(statuses(log), key=lambda s: (s[0], s[2])) == [
        ("Alert:hot:R1", "raised", 1),
        ("Alert:hot:R1", "cleared", 2),
        ("Alert:hot:R1", "raised", 3),
        ("Alert:hot:R2", "raised", 1),
    ]
    assert all(e.sure for e in outbox)
    first = outbox[0].attributes
    assert (first["value"]["value"], first["threshold"]["value"]) == (31, 30)
    assert first["refEntity"]["value"] == "R1" and "raisedAt" in first
    assert (outbox[1].attributes["threshold"]["value"], "clearedAt" in outbox[1].attributes) == (
        28,
        True,
    )
    engine = entities._engine
    states = dict(engine.scan(STATE_SPACE))
    assert len(states) == 2
    kept = [AlertState.from_wire(msgpack.unpackb(v)) for v in states.values()]
    assert sorted((s.raised, s.transitions) for s in kept) == [(True, 1), (True, 3)]
    # published: deleted, and the next round has nothing
    engine.commit([], [e.key for e in outbox])
    log.sent(e.key for e in outbox)
    assert log.outbox(_all) == []


def test_an_entry_leaves_only_once_its_write_is_durable_and_in_order() -> None:
    entities = store()
    log = entities.alerts
    assert log is not None
    write(entities, "R1", 31)
    (durable,) = log.outbox(_all)
    # a second transition staged (committed, say, but not yet replicated): neither it nor
    # any later entry of that alert leaves before it is released
    engine = entities._engine
    key, data = next(engine.scan(b"d"))
    room = Document.from_bytes(data)
    cooler = {**room.attributes, "temperature": {"type": "Number", "value": 20, "metadata": {}}}
    change = Change(Alteration.CHANGE, requested=frozenset({"temperature"}))
    applied = Applied(room, replace(room, attributes=cooler), change)
    puts: list[tuple[bytes, bytes]] = []
    ticket = log.stage(key, applied, T0 + 5, puts)
    assert ticket is not None and len(puts) == 2  # the state and the outbox entry
    engine.commit(puts, [])
    assert [e.number for e in log.outbox(_all)] == [1]
    engine.commit([], [durable.key])
    assert log.outbox(_all) == []
    log.release(ticket)
    assert [e.number for e in log.outbox(_all)] == [2]
    assert log.outbox(lambda p: p != partition_of("", "R1")) == []  # not this store's


def test_only_named_numbers_of_selected_entities_move_an_alert() -> None:
    entities = store([RULE, {**RULE, "id": "any", "entities": {}}])
    write(entities, "R1", "hot")  # not a number
    write(entities, "R1", True)
    other = Intent(
        Mode.UPSERT, "R1", "Room", attributes={"humidity": {"type": "Number", "value": 99}}
    )
    asyncio.run(entities.apply([other]))  # the rule's attribute not named
    log = entities.alerts
    assert log is not None and log.outbox(_all) == []
    write(entities, "R1", 31)
    # the rule over every entity takes the room, never its own alerts
    write(entities, "Alert:any:R1", 50, entity_type="Alert")
    assert sorted(e.entity_id for e in log.outbox(_all)) == ["Alert:any:R1", "Alert:hot:R1"]
    asyncio.run(entities.apply([Intent(Mode.DELETE_ENTITY, "R1", "Room")]))
    assert len(log.outbox(_all)) == 2


def test_a_failover_goes_on_from_the_copied_state() -> None:
    # the primary raised R1's alert and died before publishing it; the backup holds what
    # the primary shipped (the writes' commits, states and outbox included); it publishes
    # the raise (unsure: it may have gone out) and clears from the state, raising nothing
    # twice
    primary = store()
    for value in (31, 33):
        write(primary, "R1", value)
    backup = store()
    items = list(primary.partition_items([partition_of("", "R1")]))
    asyncio.run(backup.store(items, []))
    log = backup.alerts
    assert log is not None
    (found,) = log.outbox(_all)
    assert (found.number, found.sure) == (1, False)
    write(backup, "R1", 35)
    write(backup, "R1", 20)
    assert [(e.number, e.sure) for e in log.outbox(_all)] == [(1, False), (2, True)]
    assert len(list(backup._engine.scan(OUTBOX_SPACE))) == 2


def test_a_changed_rule_goes_on_from_the_kept_state() -> None:
    entities = store()
    write(entities, "R1", 31)
    log = entities.alerts
    assert log is not None
    log.define([parse_rule({**RULE, "condition": {"above": 40, "clearBelow": 35}}, "", None)])
    write(entities, "R1", 36)  # raised still: 36 is in the new band
    write(entities, "R1", 34)
    assert [(e.attributes["status"]["value"], e.number) for e in log.outbox(_all)] == [
        ("raised", 1),
        ("cleared", 2),
    ]
    log.define([])
    write(entities, "R1", 50)
    assert len(log.outbox(_all)) == 2 and not log.active


def test_transitions_render_as_the_alert_entity() -> None:
    rule: Rule = parse_rule({**RULE, "severity": "critical"}, "", None)
    room = Document("R1", "Room", "/", "", {}, T0, T0)
    raised = alert_attributes(rule, room, Transition(1, True, 31, 30, T0))
    assert {k: v["value"] for k, v in raised.items() if k != "refEntity"} == {
        "status": "raised",
        "severity": "critical",
        "rule": "hot",
        "attribute": "temperature",
        "value": 31,
        "threshold": 30,
        "transition": 1,
        "raisedAt": "1970-01-12T13:46:40.000Z",
    }
    assert raised["refEntity"]["metadata"]["entityType"]["value"] == "Room"
    published = to_wire("Alert:hot:R1", "Alert", "", "/", raised)  # what the store sends
    assert {a.name for a in published.attributes} == set(raised)


def test_an_unsure_entry_its_alert_lacks_waits_and_holds_the_later_ones() -> None:
    # after a failover: R1's transitions 2 (unsure) and 3 (staged here), R2's 1 (unsure)
    def entry(entity: bytes, number: int, sure: bool) -> Outgoing:
        key = OUTBOX_SPACE + entity + b"\x00hot\x00" + number.to_bytes(8, "big")
        return Outgoing(key, "", "/", f"A:{entity.decode()}", "Alert", {}, number, sure)

    r1_2, r1_3, r2_1 = entry(b"R1", 2, False), entry(b"R1", 3, True), entry(b"R2", 1, False)
    entries = [r1_2, r1_3, r2_1]
    since: dict[bytes, float] = {}
    # R2's alert carries its transition 1 already: done, unpublished; R1's lacks 2: it may
    # be on its way, so 2 and 3 wait
    assert sorted_out(entries, {r2_1.key}, since, T0, 6.0) == ([], [r2_1])
    assert sorted_out([r1_2, r1_3], set(), since, T0 + 5.9, 6.0) == ([], [])
    # still not carried once it has waited: published, then the later one
    assert sorted_out([r1_2, r1_3], set(), since, T0 + 6.0, 6.0) == ([r1_2, r1_3],) * 2
    # carried meanwhile (its publish arrived): done, and the later one goes
    assert sorted_out([r1_2, r1_3], {r1_2.key}, {}, T0, 6.0) == ([r1_3], [r1_2, r1_3])
