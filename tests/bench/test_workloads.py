"""The workload generators: deterministic, shaped as workloads.md says, and as selective.

Selectivity is measured with the reference matcher on small samples (the bands are loose:
the samples are small); the indexed engine must agree with it on the same samples.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence

import pytest

from broker.bench import workloads as w
from broker.matching.engine import Engine
from broker.matching.reference import ReferenceMatcher
from broker.model.subscription import Subscription
from broker.model.update import ContextUpdate
from broker.query.ast import Op

NOW = 1_700_000_000.0
_STATION_ID = re.compile(r"urn:ngsi-ld:AirQualityObserved:28079\d{3,}")
_POLLUTANT_NAMES = {p.name for p in w.POLLUTANTS}
_DISTRICT_PATHS = {"/" + d for d in w.DISTRICTS}


def _selectivity(
    subscriptions: Sequence[Subscription], updates: Sequence[ContextUpdate]
) -> tuple[float, list[set[str]]]:
    """The mean share of subscriptions one update matches, and the reference's results."""
    results = ReferenceMatcher(subscriptions).match_batch(updates, NOW)
    matched = sum(len(r) for r in results)
    return matched / len(updates) / len(subscriptions), results


# --- determinism and the registry


@pytest.mark.parametrize("name", sorted(w.WORKLOADS))
def test_same_seed_same_workload(name: str) -> None:
    workload = w.WORKLOADS[name]
    assert workload.subscriptions(200, 7) == workload.subscriptions(200, 7)
    assert workload.updates(100, 7) == workload.updates(100, 7)


@pytest.mark.parametrize("name", sorted(w.WORKLOADS))
def test_other_seed_other_workload(name: str) -> None:
    workload = w.WORKLOADS[name]
    first = [s.q for s in workload.subscriptions(200, 7)]
    assert first != [s.q for s in workload.subscriptions(200, 8)]
    assert workload.updates(50, 7) != workload.updates(50, 8)


def test_registry_names_the_three_workloads() -> None:
    assert set(w.WORKLOADS) == {"iot", "dense", "text"}
    for name, workload in w.WORKLOADS.items():
        assert workload.name == name
        assert workload.default_updates > 0


@pytest.mark.parametrize(
    "generate",
    [w.iot_subscriptions, w.iot_updates, w.dense_subscriptions, w.text_updates],
)
def test_negative_counts_and_seeds_are_refused(generate: Callable[[int, int], object]) -> None:
    with pytest.raises(ValueError):
        generate(-1, 1)
    with pytest.raises(ValueError):
        generate(1, -1)


def test_zero_is_an_empty_workload() -> None:
    assert w.iot_subscriptions(0, 1) == []
    assert w.dense_updates(0, 1) == []


# --- W-IoT


def test_the_city_is_fixed_and_madrid_like() -> None:
    city = w.madrid_stations(1000)
    assert city is w.madrid_stations(1000)
    assert len(city) == 1000
    assert len({s.entity_id for s in city}) == 1000
    assert len({s.name for s in city}) == 1000
    assert {s.service_path for s in city} == _DISTRICT_PATHS
    assert [s.name for s in city].count("Retiro") == 1
    assert 0.15 < sum(s.name.startswith("Plaza") for s in city) / len(city) < 0.4
    sizes = Counter(s.district for s in city)
    assert max(sizes.values()) - min(sizes.values()) < 10
    assert all(_STATION_ID.fullmatch(s.entity_id) for s in city)


def test_iot_updates_have_the_workload_shape() -> None:
    city = {s.entity_id: s for s in w.madrid_stations()}
    for update in w.iot_updates(500, 3):
        assert update.tenant == "madrid"
        assert update.entity_type == "AirQualityObserved"
        station = city[update.entity_id]
        assert update.service_path == station.service_path  # station -> district is fixed
        pollutants = set(update.attributes) - {"dateObserved", "stationName"}
        assert pollutants <= _POLLUTANT_NAMES
        assert 3 <= len(pollutants) <= 8
        for name in pollutants:
            attribute = update.attributes[name]
            assert attribute.type == "Number"
            limit = next(p.high for p in w.POLLUTANTS if p.name == name)
            assert 0 <= attribute.value <= limit
        assert update.attributes["dateObserved"].type == "DateTime"
        assert isinstance(update.attributes["dateObserved"].match_value, float)
        assert update.attributes["stationName"].type == "Text"
        assert update.attributes["stationName"].value == station.name


def test_iot_no2_readings_are_realistic() -> None:
    values = sorted(
        u.attributes["NO2"].value for u in w.iot_updates(2000, 5) if "NO2" in u.attributes
    )
    median = values[len(values) // 2]
    assert 25 < median < 45  # Madrid hourly NO2 is tens of µg/m3
    assert values[-1] <= 400


def test_iot_subscriptions_mix_the_four_kinds() -> None:
    subscriptions = w.iot_subscriptions(2000, 4)
    kinds = Counter(s.description for s in subscriptions)
    assert set(kinds) >= {
        "station_alert",
        "district_range",
        "type_threshold",
        "name_equals",
        "name_prefix",
        "name_word",
    }
    assert 0.3 < kinds["station_alert"] / 2000 < 0.5
    assert 0.25 < kinds["district_range"] / 2000 < 0.45
    for subscription in subscriptions:
        assert subscription.tenant == "madrid"
        selector = subscription.entities[0]
        assert selector.type == "AirQualityObserved"
        if subscription.description == "station_alert":
            assert _STATION_ID.fullmatch(selector.id or "")
            assert subscription.filter.q[0].op is Op.GT
        elif subscription.description == "district_range":
            assert selector.id_pattern is not None
            assert subscription.service_path in _DISTRICT_PATHS
            assert subscription.filter.q[0].range is not None
        else:
            assert subscription.service_path == "/#"
    texts = [s.q for s in subscriptions if s.description == "name_equals"]
    names = {s.name for s in w.madrid_stations()}
    assert all(q.removeprefix("stationName=='").removesuffix("'") in names for q in texts)


def test_iot_one_update_matches_about_half_a_percent() -> None:
    subscriptions = w.iot_subscriptions(2000, 11)
    updates = w.iot_updates(300, 12)
    share, results = _selectivity(subscriptions, updates)
    assert 0.001 <= share <= 0.01, f"one update matches {share:.3%} of the subscriptions"
    assert Engine(subscriptions).match_batch(updates, NOW) == results


# --- W-dense


def test_dense_subscriptions_are_k_ranges_of_width_w() -> None:
    for subscription in w.dense_subscriptions(300, 2):
        selector = subscription.entities[0]
        assert selector.id_pattern == ".*" and selector.type is None
        statements = subscription.filter.q
        assert len(statements) == 10
        assert len({s.attribute for s in statements}) == 10
        for statement in statements:
            assert statement.attribute in w.DENSE_ATTRIBUTES
            assert statement.op is Op.EQ and statement.range is not None
            low, high = statement.range.low.value, statement.range.high.value
            assert isinstance(low, float) and isinstance(high, float)
            assert high - low == 500_000
            assert low >= 0 and high <= w.DENSE_DOMAIN


def test_dense_ranges_are_placed_uniformly() -> None:
    lows = [
        s.range.low.value
        for sub in w.dense_subscriptions(500, 3)
        for s in sub.filter.q
        if s.range is not None and isinstance(s.range.low.value, float)
    ]
    assert len(lows) == 5000
    assert 0.45 < sum(low < 250_000 for low in lows) / len(lows) < 0.55
    attributes = Counter(s.attribute for sub in w.dense_subscriptions(500, 3) for s in sub.filter.q)
    assert min(attributes.values()) > 150  # each of 20 attributes ~250 times


def test_dense_events_carry_all_twenty_values() -> None:
    for update in w.dense_updates(200, 4):
        assert tuple(update.attributes) == w.DENSE_ATTRIBUTES
        assert all(0 <= a.value < w.DENSE_DOMAIN for a in update.attributes.values())


def test_dense_skew_favours_the_first_attributes() -> None:
    skewed = Counter(
        s.attribute for sub in w.dense_subscriptions(300, 5, skew=1.5) for s in sub.filter.q
    )
    assert skewed["a0"] > 2 * skewed["a19"]
    values = [a.value for u in w.dense_updates(300, 5, skew=1.5) for a in u.attributes.values()]
    assert sum(v < 500_000 for v in values) / len(values) > 0.6


def test_dense_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError):
        w.dense_subscriptions(1, 1, k=21)
    with pytest.raises(ValueError):
        w.dense_subscriptions(1, 1, width=0.0)


def test_dense_one_event_matches_about_one_in_1024() -> None:
    subscriptions = w.dense_subscriptions(1000, 21)
    updates = w.dense_updates(300, 22)
    share, results = _selectivity(subscriptions, updates)
    assert 0.6 / 1024 < share < 1.6 / 1024, f"one event matches {share * 1024:.2f}/1024"
    assert Engine(subscriptions).match_batch(updates, NOW) == results


# --- W-text


def test_text_workload_shape() -> None:
    for update in w.text_updates(300, 6):
        assert update.entity_type in w.TEXT_TYPES
        assert update.entity_id.startswith(f"urn:ngsi-ld:{update.entity_type}:")
        assert tuple(update.attributes) == w.TEXT_ATTRIBUTES
        for attribute in update.attributes.values():
            assert attribute.type == "Text"
            assert 2 <= len(attribute.value) <= 60
    string_ops = {Op.PREFIX, Op.SUFFIX, Op.CONTAINS, Op.MATCH}
    subscriptions = w.text_subscriptions(1000, 6)
    ops = Counter(s.filter.q[0].op for s in subscriptions)
    assert set(ops) == string_ops
    for subscription in subscriptions:
        assert subscription.entities[0].type in w.TEXT_TYPES
        assert len(subscription.filter.q) == 1
        assert subscription.filter.q[0].attribute in w.TEXT_ATTRIBUTES


def test_text_matches_are_rare_but_not_absent() -> None:
    subscriptions = w.text_subscriptions(2000, 31)
    updates = w.text_updates(200, 32)
    share, results = _selectivity(subscriptions, updates)
    assert 0.001 <= share <= 0.015, f"one event matches {share:.3%} of the subscriptions"
    assert sum(1 for r in results if r) > 0.9 * len(updates)
    assert Engine(subscriptions).match_batch(updates, NOW) == results
