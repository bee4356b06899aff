"""The Spark matcher finds exactly what the reference matcher and the engine find, by
either method (``engine`` and ``join``: the ``method`` fixture runs a test once each).

One local SparkSession serves every test (the ``spark`` fixture); each test is one or a few
Spark jobs, so the random inputs are batched: many subscriptions and updates per job.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from strategies import (
    NOW,
    RandomSource,
    draw_subscription,
    draw_update,
    subscription_sets,
    update_lists,
)

from broker.bench.workloads.iot import iot_subscriptions, iot_updates
from broker.matching.engine import Engine
from broker.matching.reference import ReferenceMatcher
from broker.model.subscription import EntitySelector, Subscription
from broker.model.update import ContextUpdate
from spark_matcher import METHODS, open_matcher
from spark_matcher.entities import InputError
from spark_matcher.match import SparkMatcher
from spark_matcher.source import read_lines


@pytest.fixture(params=METHODS, scope="module")
def method(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def _differences(
    found: Sequence[set[str]], expected: Sequence[set[str]]
) -> list[tuple[int, list[str], list[str]]]:
    return [
        (i, sorted(f - e), sorted(e - f))
        for i, (f, e) in enumerate(zip(found, expected, strict=True))
        if f != e
    ]


def _check(
    spark: Any,
    method: str,
    subs: Sequence[Subscription],
    ups: Sequence[ContextUpdate],
    **kw: Any,
) -> int:
    with open_matcher(spark, subs, method=method, now=NOW, **kw) as matcher:
        found = matcher.match(ups)
    expected = ReferenceMatcher(subs).match_batch(ups, NOW)
    assert _differences(found, expected) == []  # (update, extra, missing)
    return sum(map(len, expected))


def test_a_large_random_workload_matches_as_the_reference(spark: Any, method: str) -> None:
    source = RandomSource(random.Random(20261122))
    subs = [draw_subscription(source, f"s{i}") for i in range(1000)]
    ups = [draw_update(source) for _ in range(200)]
    assert _check(spark, method, subs, ups) > 10_000  # the corners are exercised, not skipped


@settings(
    max_examples=2,  # 8-15 s each on Spark; the large random workload above has the breadth
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(subscription_sets(max_size=40), update_lists(max_size=15))
def test_random_sets_match_as_the_reference(
    spark: Any, method: str, subs: list[Subscription], ups: list[ContextUpdate]
) -> None:
    _check(spark, method, subs, ups)


def test_partitioned_subscriptions_match_the_same(spark: Any, method: str) -> None:
    source = RandomSource(random.Random(5))
    subs = [draw_subscription(source, f"s{i}") for i in range(250)]
    ups = [draw_update(source) for _ in range(80)]
    _check(spark, method, subs, ups, partitions=3)


def test_the_iot_workload_matches_as_the_engine(spark: Any, method: str) -> None:
    subs = iot_subscriptions(2000, seed=3)
    ups = iot_updates(300, seed=4)
    engine = Engine(subs)
    expected = engine.match_batch(ups, NOW)
    with open_matcher(spark, subs, method=method, now=NOW) as matcher:
        if isinstance(matcher, SparkMatcher):
            assert not any(c.verify for c in matcher.plan.clauses)  # all decided in the JVM
        found = matcher.match(ups)
    assert _differences(found, expected) == []
    assert sum(map(len, expected)) > 400


def test_batches_reuse_the_tables(spark: Any, method: str) -> None:
    subs = iot_subscriptions(500, seed=1)
    reference = ReferenceMatcher(subs)
    with open_matcher(spark, subs, method=method, now=NOW) as matcher:
        for seed in (1, 2):
            ups = iot_updates(50, seed=seed)
            assert matcher.match(ups) == reference.match_batch(ups, NOW)
        assert matcher.match([]) == []


def _lines(tmp_path: Path, rows: Sequence[object]) -> Path:
    path = tmp_path / "updates.jsonl"
    path.write_text(
        "".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows)
    )
    return path


_GOOD = {"id": "a", "type": "T", "x": {"type": "Number", "value": 1}}


_BAD = [
    ("{not json", "", "not JSON"),
    ('["a"]', "", "JSON object"),
    ({"type": "T"}, "id", "missing"),
    ({"id": "a&b"}, "id", "forbidden"),
    ({"id": "a", "type": ""}, "type", "empty"),
    ({"id": "a", "tenant": "A"}, "tenant", "lowercase"),
    ({"id": "a", "servicePath": "/a b"}, "servicePath", "level"),
    ({"id": "a", "bad name": {"value": 1}}, "bad name", "whitespace"),
    ({"id": "a", "*": {"value": 1}}, "*", "reserved"),
    ({"id": "a", "x": 5}, "x", "JSON object"),
    ({"id": "a", "x": {"value": 1, "units": 2}}, "x", "unrecognized"),
    ({"id": "a", "x": {"type": "a/b", "value": 1}}, "x", "forbidden"),
    ({"id": "a", "x": {"type": "DateTime", "value": "2024-13-01"}}, "x", "ISO 8601"),
    ({"id": "a", "x": {"value": "a=b"}}, "x", "Invalid characters"),
    ({"id": "a", "x": {"value": 1, "metadata": 4}}, "x", "metadata"),
]
# Both methods check lines with the same code (source.check_lines); the join method reads
# dates its own way. Every bad line goes through the engine method, and through the join
# method one of each kind (the line, the entity, an attribute, a date): each case is a few
# Spark jobs, and the rest would test the same code again.
_JOIN_BAD = {"not JSON", "missing", "JSON object", "ISO 8601"}


@pytest.mark.parametrize(
    ("method", "bad", "field", "words"),
    [("engine", *case) for case in _BAD]
    + [("join", *case) for case in _BAD if case[2] in _JOIN_BAD and case[0] != '["a"]'],
)
def test_a_bad_line_is_named_with_its_field(
    spark: Any, method: str, tmp_path: Path, bad: object, field: str, words: str
) -> None:
    path = _lines(tmp_path, [_GOOD, _GOOD, bad, _GOOD])
    with open_matcher(spark, [], method=method, now=NOW) as matcher:
        frame = read_lines(spark, path)
        with pytest.raises(InputError) as caught:
            matcher.match_frame(frame, validate=True, source=str(path)).collect()
    error = caught.value
    assert (error.line, error.field) == (3, field), str(error)
    assert words in error.reason, str(error)
    assert str(error).startswith(f"{path}: line 3: ")


def test_a_valid_file_with_every_kind_of_value_passes_the_checks(
    spark: Any, method: str, tmp_path: Path
) -> None:
    rows = [
        _GOOD,
        {"id": "b", "s": {"value": "text"}, "n": {"value": None}, "t": {"value": True}},
        {
            "id": "c",
            "o": {"value": {"k": [1, 2]}},
            "d": {"type": "DateTime", "value": "2024-03-01"},
        },
        {"id": "d", "m": {"value": 1, "metadata": {"unit": {"type": "Text", "value": "C"}}}},
        {"id": "e", "u": {"type": "TextUnrestricted", "value": "<b>"}, "tenant": "t1"},
    ]
    path = _lines(tmp_path, rows)
    subs = [Subscription("all", (EntitySelector(id_pattern=".*"),))]
    with open_matcher(spark, subs, method=method, now=NOW) as matcher:
        frame = read_lines(spark, path)
        found = matcher.match_frame(frame, validate=True, source=str(path)).collect()
    assert sorted((row[0], row[1]) for row in found) == [(i, "all") for i in range(4)]
