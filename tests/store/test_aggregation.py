"""Aggregation groups (broker/store/aggregation.py, aggregation_runtime.py): definitions
checked, the folding of writes into panes against a direct computation over the same
updates (property tests, tumbling and sliding), and two store processes' aggregators run
together over a hierarchy that changes, with a restart, against the direct computation."""

from __future__ import annotations

import functools
import math
import random
import zlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples

from broker.errors import InvalidInput
from broker.model.change import Alteration, Change
from broker.store.aggregation import (
    FUNCTIONS,
    Definition,
    Partial,
    contributions,
    parse_definition,
    window_attributes,
)
from broker.store.aggregation_runtime import Aggregator, DerivedWrite, Version
from broker.store.semantics import Applied, Document

T0 = 1_000_000.0


def definition(window: dict[str, Any], levels: Any = None, **fields: Any) -> Definition:
    body = {
        "id": "g",
        "entities": {"type": "Sensor"},
        "groupBy": levels or {"attribute": "refBuilding", "type": "Building"},
        "attributes": ["temperature"],
        "functions": list(FUNCTIONS),
        "window": window,
        **fields,
    }
    return parse_definition(body, "", None)


def document(entity_id: str, entity_type: str, attributes: dict[str, Any]) -> Document:
    shaped = {
        name: value if isinstance(value, dict) else {"type": "Any", "value": value, "metadata": {}}
        for name, value in attributes.items()
    }
    return Document(entity_id, entity_type, "/", "", shaped, T0, T0)


def written(entity: Document, names: Iterable[str]) -> Applied:
    change = Change(Alteration.CHANGE, requested=frozenset(names))
    return Applied(None, entity, change)


def direct(values: Sequence[tuple[float, float]]) -> dict[str, float]:
    """Every function over (time, value) pairs, computed plainly."""
    numbers = [v for _t, v in values]
    return {
        "count": len(numbers),
        "sum": sum(numbers),
        "min": min(numbers),
        "max": max(numbers),
        "avg": sum(numbers) / len(numbers),
        "last": max(values)[1],
    }


def check(attributes: dict[str, Any], expected: dict[str, float], label: str) -> None:
    for function, value in expected.items():
        got = attributes[f"temperature_{function}_{label}"]["value"]
        assert got == pytest.approx(value), (function, got, value)


# -- definitions --------------------------------------------------------------------------


def test_a_definition_reads_back_as_given() -> None:
    body = {
        "id": "campus-temperature",
        "entities": {"type": "Sensor", "idPattern": "^S", "q": "temperature>-100"},
        "groupBy": [
            {"attribute": "refBuilding", "type": "Building"},
            {"attribute": "refCampus", "type": "Campus"},
        ],
        "attributes": ["temperature"],
        "functions": ["avg", "max"],
        "window": {"type": "sliding", "size": "5m", "slide": "1m"},
    }
    parsed = parse_definition(body, "t", "/a/#")
    assert parsed.to_json() == body
    assert parsed.derived_name("temperature", "avg") == "temperature_avg_5m"
    assert parsed.window.size == 300 and parsed.window.slide == 60
    assert parsed.scope == "/a/#"


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"id": "a b"}, "id must be"),
        ({"functions": ["median"]}, "unknown functions ['median']"),
        ({"functions": []}, "functions must be a list"),
        ({"attributes": ["refBuilding"]}, "also group"),
        ({"window": {"type": "sliding", "size": "5s", "slide": "2s"}}, "whole multiple"),
        ({"window": {"type": "tumbling", "size": "0.5s"}}, "slide by 1 s at least"),
        ({"window": {"type": "hopping", "size": "5s"}}, "tumbling or sliding"),
        ({"window": {"size": "five"}}, "duration such as"),
        ({"groupBy": []}, "groupBy must be"),
        ({"groupBy": {"attribute": "refBuilding"}}, "needs attribute"),
        ({"groupBy": {"attribute": "refBuilding", "type": "Sensor"}}, "type of its own"),
        ({"entities": {"q": "temperature>>"}}, "q"),
        ({"entities": {"idPattern": "("}}, "idPattern"),
        ({"colour": "red"}, "unknown fields ['colour']"),
    ],
)
def test_a_bad_definition_is_refused_with_what_to_fix(change: dict[str, Any], says: str) -> None:
    body = {
        "id": "g",
        "entities": {"type": "Sensor"},
        "groupBy": {"attribute": "refBuilding", "type": "Building"},
        "attributes": ["temperature"],
        "functions": ["avg"],
        "window": {"type": "tumbling", "size": "1s"},
        **change,
    }
    with pytest.raises(InvalidInput) as refused:
        parse_definition(body, "", None)
    assert says in str(refused.value)


# -- folding against a direct computation --------------------------------------------------

WINDOWS = [
    {"type": "tumbling", "size": "2s"},
    {"type": "sliding", "size": "3s", "slide": "1s"},
    {"type": "sliding", "size": "4s", "slide": "2s"},
]

updates = st.lists(
    st.tuples(
        st.integers(0, 5),  # sensor
        st.integers(0, 2),  # building
        st.integers(-50, 50),  # value
        st.integers(0, 12_000),  # time, in ms after T0
    ),
    min_size=1,
    max_size=40,
    unique_by=lambda u: u[3],
)


@pytest.mark.parametrize("window", WINDOWS)
@given(updates)
@settings(max_examples=examples(60))
def test_folded_panes_give_what_a_direct_computation_gives(
    window: dict[str, Any], drawn: list[tuple[int, int, int, int]]
) -> None:
    group = definition(window)
    panes: dict[str, dict[float, dict[str, Partial]]] = {}
    for sensor, building, value, ms in drawn:
        sensor_doc = document(
            f"S{sensor}", "Sensor", {"temperature": value, "refBuilding": f"B{building}"}
        )
        change = written(sensor_doc, ["temperature"]).change
        found = contributions(group, sensor_doc, change, T0 + ms / 1000)
        assert len(found) == 1
        one = found[0]
        by_attribute = panes.setdefault(one.key, {}).setdefault(one.pane, {})
        by_attribute[one.attribute] = by_attribute.get(one.attribute, Partial()).merged(one.partial)
    for key, held in panes.items():
        ends = {end for pane in held for end in group.window.ends_with(pane)}
        label, size = group.window.label, group.window.size
        for end in ends:
            inside = [
                (T0 + ms / 1000, float(v))
                for _s, b, v, ms in drawn
                if f"B{b}" == key and end - size <= group.window.pane(T0 + ms / 1000) < end
            ]
            attributes = window_attributes(group, end, held)
            check(attributes, direct(inside), label)
            aggregate = attributes[f"temperature_count_{label}"]["metadata"]["aggregate"]
            assert aggregate["value"]["start"] == end - size


def test_a_write_counts_only_named_numbers_of_selected_entities() -> None:
    group = definition({"type": "tumbling", "size": "1s"})
    sensor = document("S1", "Sensor", {"temperature": 20, "refBuilding": "B1", "humidity": 3})
    assert contributions(group, sensor, written(sensor, ["humidity"]).change, T0) == []
    text = document("S1", "Sensor", {"temperature": "hot", "refBuilding": "B1"})
    assert contributions(group, text, written(text, ["temperature"]).change, T0) == []
    other = document("R1", "Room", {"temperature": 20, "refBuilding": "B1"})
    assert contributions(group, other, written(other, ["temperature"]).change, T0) == []
    orphan = document("S1", "Sensor", {"temperature": 20})
    assert contributions(group, orphan, written(orphan, ["temperature"]).change, T0) == []
    deleted = Change(Alteration.DELETE, requested=frozenset({"temperature"}))
    assert contributions(group, sensor, deleted, T0) == []
    assert len(contributions(group, sensor, written(sensor, ["temperature"]).change, T0)) == 1


# -- two stores' aggregators over a changing hierarchy -------------------------------------

STORES = ("s1", "s2")
TICK = 0.05


class Cluster:
    """Two aggregators as two store processes: writes applied at their entity's owner
    (a fixed partition rule), reports carried between them (some lost on the way, some
    answers lost), derived writes applied back as upserts (as the connection point does;
    some twice, as a correction does) and recorded; each store's engine a dict."""

    def __init__(self, group: Definition, rng: random.Random) -> None:
        self.rng = rng
        self.version = Version(group, 1, T0)
        self.disks: dict[str, dict[bytes, bytes]] = {name: {} for name in STORES}
        self.stores = {name: self._started(name) for name in STORES}
        self.entities: dict[str, dict[str, Any]] = {}
        self.derived: list[DerivedWrite] = []

    def _started(self, name: str) -> Aggregator:
        aggregator = Aggregator(name, self.rng.getrandbits(40) + 1)
        aggregator.load(sorted(self.disks[name].items()))
        aggregator.define([self.version])
        return aggregator

    @staticmethod
    def owner(_tenant: str, entity_id: str) -> str:
        return STORES[zlib.crc32(entity_id.encode()) % 2]

    def owns(self, store: str, tenant: str, entity_id: str) -> bool:
        return self.owner(tenant, entity_id) == store

    def write(self, entity_id: str, kind: str, attributes: dict[str, Any], at: float) -> None:
        merged = self.entities.setdefault(entity_id, {})
        merged.update(attributes)
        entity = document(entity_id, kind, merged)
        self.stores[self.owner("", entity_id)].observe([written(entity, attributes)], at)

    def tick(self, now: float) -> None:
        for name, aggregator in self.stores.items():
            aggregator.close(now)
            self._save(name, *aggregator.durable())
        for aggregator in self.stores.values():
            for target, (report, sent) in aggregator.reports(self.owner, STORES).items():
                fate = self.rng.random()
                if fate < 0.15:
                    continue  # the report is lost
                answer = self.stores[target].receive(report)
                if fate > 0.3:  # else the answer is lost
                    aggregator.answered(target, answer, sent)
        for name, aggregator in self.stores.items():
            writes, settled = aggregator.due(STORES, functools.partial(self.owns, name))
            for one in writes:
                self.derived.append(one)
                self.write(one.entity_id, one.entity_type, one.attributes, now)
                if self.rng.random() < 0.2:  # written again (a correction): replaces
                    self.write(one.entity_id, one.entity_type, one.attributes, now)
            aggregator.written(settled)

    def _save(self, name: str, puts: list[tuple[bytes, bytes]], deletes: list[bytes]) -> None:
        self.disks[name].update(puts)
        for key in deletes:
            self.disks[name].pop(key, None)

    def restart(self, name: str) -> None:
        """A store stopped (it keeps its open panes) and started again."""
        self._save(name, *self.stores[name].durable(everything=True))
        self.stores[name] = self._started(name)

    def results(self) -> dict[tuple[str, float], dict[str, Any]]:
        """The last write of each (derived entity, window end)."""
        return {(w.entity_id, w.end): w.attributes for w in self.derived}


@given(st.integers(0, 2**32))
@settings(max_examples=examples(10))
def test_two_stores_aggregate_a_changing_hierarchy_exactly(seed: int) -> None:
    rng = random.Random(seed)  # a stream of its own: some reports and answers are lost
    group = definition(
        {"type": "tumbling", "size": "1s"},
        [
            {"attribute": "refBuilding", "type": "Building"},
            {"attribute": "refCampus", "type": "Campus"},
        ],
    )
    cluster = Cluster(group, rng)
    campus = {"B0": "C0", "B1": "C0", "B2": "C1"}
    for building, parent in campus.items():
        cluster.write(building, "Building", {"refCampus": parent}, T0)
    readings: list[tuple[str, float, float]] = []  # building, time, value
    moved_at = T0 + 2.5  # B1 moves to C1: windows ending after count it there
    now = T0
    while now < T0 + 5:
        now = round(now + TICK, 6)
        if abs(now - moved_at) < TICK / 2:
            cluster.write("B1", "Building", {"refCampus": "C1"}, now)
        if abs(now - (T0 + 3.2)) < TICK / 2:
            cluster.restart(rng.choice(STORES))  # a stop: its open panes are kept
        for _ in range(rng.randrange(3)):
            sensor, building = f"S{rng.randrange(6)}", f"B{rng.randrange(3)}"
            value = float(rng.randrange(-20, 40))
            cluster.write(sensor, "Sensor", {"temperature": value, "refBuilding": building}, now)
            readings.append((building, now, value))
        cluster.tick(now)
    for _ in range(40):  # no more writes: every window closes
        now = round(now + TICK, 6)
        cluster.tick(now)
    results = cluster.results()
    expected: dict[tuple[str, float], list[tuple[float, float]]] = {}
    for building, at, value in readings:
        end = math.floor(at) + 1.0
        parent = "C1" if building == "B2" or (building == "B1" and end > moved_at) else "C0"
        expected.setdefault((building, end), []).append((at, value))
        expected.setdefault((parent, end), []).append((at, value))
    assert set(results) == set(expected)
    for key, values in expected.items():
        check(results[key], direct(values), "1s")


def test_a_changed_definition_applies_from_its_since() -> None:
    # version 1 (avg) until T0 + 2, version 2 (max, grouped by floor) from then: every
    # window is one version's, whole; the old one's last window is still written
    old = definition({"type": "tumbling", "size": "1s"}, functions=["avg"])
    new = definition(
        {"type": "tumbling", "size": "1s"},
        {"attribute": "refFloor", "type": "Floor"},
        functions=["max"],
    )
    store = Aggregator("s1", 1)
    store.define([Version(old, 1, T0, T0 + 2), Version(new, 2, T0 + 2)])
    derived: list[DerivedWrite] = []
    for step in range(1, 81):  # 4 s in steps of 0.05 s
        now = T0 + step * 0.05
        sensor = document(
            "S1", "Sensor", {"temperature": float(step), "refBuilding": "B1", "refFloor": "F1"}
        )
        store.observe([written(sensor, ["temperature"])], now)
        store.close(now)
        for target, (report, sent) in store.reports(lambda _t, _i: "s1", ["s1"]).items():
            store.answered(target, store.receive(report), sent)
        writes, settled = store.due(["s1"], lambda _t, _i: True)
        derived += writes
        store.written(settled)
    shown = [(w.entity_id, w.end - T0, sorted(w.attributes)) for w in derived]
    assert shown == [
        ("B1", 1.0, ["temperature_avg_1s"]),
        ("B1", 2.0, ["temperature_avg_1s"]),
        ("F1", 3.0, ["temperature_max_1s"]),
    ]
    assert derived[1].attributes["temperature_avg_1s"]["value"] == sum(range(20, 40)) / 20
    assert derived[2].attributes["temperature_max_1s"]["value"] == 59.0


def exchange(source: Aggregator, owner: Aggregator) -> None:
    """Two rounds of reports from ``source`` to ``owner`` (its marks count from the second:
    it knows the owner's incarnation then)."""
    for _ in range(2):
        for target, (report, sent) in source.reports(
            lambda _t, _e: owner.store_id, [owner.store_id]
        ).items():
            source.answered(target, owner.receive(report), sent)


def counting(*names: str) -> list[Aggregator]:
    """Store processes' aggregators with one group: a count of temperatures by building
    (1 s tumbling windows)."""
    group = definition({"type": "tumbling", "size": "1s"}, functions=["count"])
    stores = [Aggregator(name, number) for number, name in enumerate(names, 1)]
    for store in stores:
        store.define([Version(group, 1, T0)])
    return stores


def counts(writes: Iterable[DerivedWrite]) -> list[tuple[str, Any]]:
    """Each derived write's entity and count (of a group counting ``temperature``)."""
    return [(w.entity_id, w.attributes["temperature_count_1s"]["value"]) for w in writes]


def one_round(
    stores: dict[str, Aggregator],
    now: float,
    owner_of: Callable[[str, str], str],
    serving: list[str],
    primary: Callable[[str, str, str], bool],
    down: str = "",
) -> list[DerivedWrite]:
    """A round at each of ``stores``: close, reports to the ``serving`` stores and ``down``
    (still registered, its reports fail; the others no longer wait for its marks), then the
    windows each writes (``primary(store, tenant, key)``: whether it sees itself primary)."""
    found = []
    for store in stores.values():
        store.close(now)
        targets = [*serving, down] if down else serving
        for target, (report, sent) in store.reports(owner_of, targets).items():
            if target != down:
                store.answered(target, stores[target].receive(report), sent)
    for name, store in stores.items():
        writes, settled = store.due(serving, functools.partial(primary, name))
        store.written(settled)
        found += writes
    return found


@pytest.mark.parametrize("hand_over", [True, False])
def test_a_store_leaving_the_layer_hands_its_open_panes_over(hand_over: bool) -> None:
    # "z" applied two values in a window still open, then leaves the store layer (a
    # scale-in: it is never started again): closed at once and reported, they are in the
    # window its owner "a" writes; without the hand-over they were lost with the process
    group = definition({"type": "tumbling", "size": "1s"})
    owner, leaving = Aggregator("a", 1), Aggregator("z", 2)
    for aggregator in (owner, leaving):
        aggregator.define([Version(group, 1, T0)])
    for value in (3.0, 4.0):
        sensor = document("S1", "Sensor", {"temperature": value, "refBuilding": "B1"})
        leaving.observe([written(sensor, ["temperature"])], T0 + 0.3)
    leaving.close(T0 + 0.5)
    assert leaving.unsent(lambda _t, _e: "a") == 0  # open: nothing to send yet
    if hand_over:
        leaving.close_all()
        assert leaving.unsent(lambda _t, _e: "a") == 1
        exchange(leaving, owner)
        assert leaving.unsent(lambda _t, _e: "a") == 0
    owner.close(T0 + 1.2)
    exchange(owner, owner)
    owner.forget_marks(["a"])  # "z" stopped: only the serving owner's marks count
    writes, settled = owner.due(["a"], lambda _t, _e: True)
    owner.written(settled)
    if hand_over:
        (window,) = writes
        check(window.attributes, direct([(T0 + 0.3, 3.0), (T0 + 0.3, 4.0)]), "1s")
    else:
        assert writes == []  # the window had no value but z's: nothing written, 2 lost


def test_marks_of_a_source_no_longer_serving_are_forgotten() -> None:
    group = definition({"type": "tumbling", "size": "1s"})
    owner, other = Aggregator("a", 1), Aggregator("b", 2)
    for aggregator in (owner, other):
        aggregator.define([Version(group, 1, T0)])
    other.close_all()  # a hand-over leaves its marks past all time
    exchange(other, owner)
    owner.close(T0 + 5.2)
    exchange(owner, owner)
    assert owner.due(["a", "b"], lambda _t, _e: True)[1].advance  # b's infinite mark counts
    owner.forget_marks(["a"])  # b left, then came back with the same id: no mark of it yet
    assert not owner.due(["a", "b"], lambda _t, _e: True)[1].advance


def test_a_write_behind_the_marks_is_written_again_not_lost() -> None:
    # a write whose time the marks passed (the store's clock went back) in a pane the
    # source never held: its window was written without it, so it is written again with it
    group = definition({"type": "tumbling", "size": "1s"}, functions=["count"])
    store = Aggregator("s1", 1)
    store.define([Version(group, 1, T0)])
    derived: list[DerivedWrite] = []

    def tick(now: float) -> None:
        store.close(now)
        for target, (report, sent) in store.reports(lambda _t, _i: "s1", ["s1"]).items():
            store.answered(target, store.receive(report), sent)
        writes, settled = store.due(["s1"], lambda _t, _i: True)
        derived.extend(writes)
        store.written(settled)

    def sensor(building: str) -> Applied:
        attributes = {"temperature": 1.0, "refBuilding": building}
        return written(document("S1", "Sensor", attributes), ["temperature"])

    store.observe([sensor("B1")], T0 + 0.5)
    tick(T0 + 1.4)  # the owner learns the source's marks from its second report on
    tick(T0 + 1.5)
    store.observe([sensor("B1"), sensor("B2")], T0 + 0.7)
    tick(T0 + 1.6)
    counts = [w.attributes["temperature_count_1s"]["value"] for w in derived]
    shown = [(w.entity_id, w.end - T0, c) for w, c in zip(derived, counts, strict=True)]
    assert shown == [("B1", 1.0, 1), ("B1", 1.0, 2), ("B2", 1.0, 1)]


def test_a_pane_its_first_owner_did_not_take_is_a_correction_for_the_next_owner() -> None:
    # "s" closes a pane of B1, owned by "x": the report to x fails (x is leaving the layer)
    # while the same round's marks reach "y", which so writes the window's other keys up
    # to its end; then B1's partition moves to y. y wrote that window already (for every
    # key it owned then), so the pane must come to it as a correction, or it is lost
    source, x, y = counting("s", "x", "y")
    serving = ["s", "y"]
    owners = {"B1": "x", "B2": "y"}

    def owner_of(_tenant: str, building: str) -> str:
        return owners[building]

    def owns(store: str, tenant: str, building: str) -> bool:
        return owner_of(tenant, building) == store

    def round_of(now: float, down: str = "") -> list[DerivedWrite]:
        return one_round({"s": source, "y": y}, now, owner_of, serving, owns, down)

    # x answered s once (s knows its incarnation), then leaves
    for target, (report, sent) in source.reports(owner_of, ["x"]).items():
        source.answered(target, x.receive(report), sent)
    round_of(T0 + 0.2)
    round_of(T0 + 0.3)
    for building in ("B1", "B2"):
        sensor = document("S1", "Sensor", {"temperature": 1.0, "refBuilding": building})
        source.observe([written(sensor, ["temperature"])], T0 + 0.5)
    assert [w.entity_id for w in round_of(T0 + 1.2, down="x")] == ["B2"]  # y wrote B2
    owners["B1"] = "y"  # x left: B1's partition is y's now
    writes = round_of(T0 + 1.3)
    assert counts(writes) == [("B1", 1)]


def test_a_window_due_while_no_store_saw_itself_its_primary_is_written_once_one_does() -> None:
    # B1's partition moves from "x" to "y" and their views cross for a round: x already
    # sees y as its primary, y still sees x. The source (with the new view) sent the pane
    # to y; neither wrote the window, both passed its end; once y sees itself the primary
    # it writes it
    x, y = counting("x", "y")
    stores = {"x": x, "y": y}
    sees = {"x": "y", "y": "x"}  # who each sees as B1's primary

    def primary_here(name: str, _tenant: str, _building: str) -> bool:
        return sees[name] == name

    def round_of(now: float) -> list[DerivedWrite]:  # the sources see y as the owner
        return one_round(stores, now, lambda _t, _b: "y", ["x", "y"], primary_here)

    round_of(T0 + 0.2)
    round_of(T0 + 0.3)
    sensor = document("S1", "Sensor", {"temperature": 1.0, "refBuilding": "B1"})
    x.observe([written(sensor, ["temperature"])], T0 + 0.5)  # x applied it (the sensor's)
    assert round_of(T0 + 1.2) == []  # due, but written by neither
    sees["y"] = "y"  # y's view catches up
    writes = round_of(T0 + 1.3)
    assert counts(writes) == [("B1", 1)]


def test_a_pane_of_a_store_the_owner_did_not_count_yet_corrects_its_window() -> None:
    # "n" joined the layer and applied a write as a primary before its owner "y" saw it
    # serving: y wrote the window without n's pane; the pane, sent once y counts n, is a
    # correction (y wrote the window in this life, the sources all still hold theirs)
    y, new = counting("y", "n")
    for value in (1.0, 2.0):
        sensor = document(f"S{value}", "Sensor", {"temperature": value, "refBuilding": "B1"})
        (y if value == 1.0 else new).observe([written(sensor, ["temperature"])], T0 + 0.5)
    derived: list[DerivedWrite] = []

    def round_of(now: float, serving: list[str]) -> None:
        for store in (y, new)[: len(serving)]:
            store.close(now)
            for target, (report, sent) in store.reports(lambda _t, _b: "y", serving).items():
                if target == "y":
                    store.answered(target, y.receive(report), sent)
        writes, settled = y.due(serving, lambda _t, _b: True)
        y.written(settled)
        derived.extend(writes)

    round_of(T0 + 0.2, ["y"])
    round_of(T0 + 1.2, ["y"])  # written with y's value alone
    for now in (T0 + 1.3, T0 + 1.4):
        round_of(now, ["y", "n"])
    assert counts(derived) == [("B1", 1), ("B1", 2)]
