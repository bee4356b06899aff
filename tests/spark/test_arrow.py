"""The ``engine`` method's own parts: its line reader, its workers' engines, its edges.

Matching by this method against the reference is in test_matching.py (both methods run
there); here: the fast reader against the checked one (no session), engines kept and
replaced in Spark's Python workers, expiry, and lines that are not updates.
"""

from __future__ import annotations

import gc
import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import given
from strategies import NOW, RandomSource, draw_subscription, draw_update, updates

from broker.matching.engine import Engine
from broker.matching.reference import ReferenceMatcher
from broker.model.subscription import EntitySelector, Subscription
from broker.model.update import ContextUpdate
from broker.partition.selector import RendezvousSelector
from broker.serialization import packb, subscription_to_obj
from spark_matcher import arrow, open_matcher
from spark_matcher.arrow import EngineMatcher, read_update
from spark_matcher.entities import InputError, update_from_json, update_to_json
from spark_matcher.source import read_lines


def _same(a: ContextUpdate, b: ContextUpdate) -> None:
    assert (a.entity_id, a.entity_type, a.tenant, a.service_path) == (
        b.entity_id,
        b.entity_type,
        b.tenant,
        b.service_path,
    )
    assert a.attributes == b.attributes
    for name, attribute in a.attributes.items():
        assert attribute.match_value == b.attributes[name].match_value


@given(updates())
def test_the_fast_reader_reads_what_the_checked_reader_reads(update: ContextUpdate) -> None:
    text = json.dumps(update_to_json(update))
    fast = read_update(text)
    assert fast is not None
    _same(fast, update_from_json(json.loads(text)))


@pytest.mark.parametrize(
    "text",
    [
        "{not json",
        '["a"]',
        '{"type": "T"}',
        '{"id": 5}',
        '{"id": "a", "x": 5}',
        '{"id": "a", "x": {"type": 5, "value": 1}}',
        '{"id": "a", "x": {"type": "DateTime", "value": "yesterday"}}',
        '{"id": "a", "type": 3}',
        '{"id": "a", "x": {"value": 1, "metadata": {"m": 3}}}',
    ],
)
def test_the_fast_reader_leaves_out_what_is_not_an_update(text: str) -> None:
    assert read_update(text) is None


def test_metadata_and_defaults_are_read_as_the_checked_reader_reads_them() -> None:
    body = {
        "id": "a",
        "x": {"value": 1, "metadata": {"unit": {"type": "Text", "value": "C"}}},
        "d": {"type": "DateTime", "value": "2024-03-01T00:00:00Z"},
        "s": {"value": "text"},
    }
    fast = read_update(json.dumps(body))
    assert fast is not None
    _same(fast, update_from_json(body))
    assert fast.entity_type == "Thing" and fast.service_path == "/"


def test_matchers_one_after_another_in_the_same_workers(spark: Any) -> None:
    source = RandomSource(random.Random(77))
    ups = [draw_update(source) for _ in range(120)]
    for round_ in range(3):  # each matcher's engines replace the last in every worker
        subs = [draw_subscription(source, f"r{round_}s{i}") for i in range(300)]
        with EngineMatcher(spark, subs, now=NOW, partitions=round_ + 1) as matcher:
            assert matcher.partitions == round_ + 1
            assert matcher.match(ups) == ReferenceMatcher(subs).match_batch(ups, NOW)


def test_a_cluster_selector_partitions_as_its_matchers(spark: Any) -> None:
    source = RandomSource(random.Random(8))
    subs = [draw_subscription(source, f"s{i}") for i in range(200)]
    ups = [draw_update(source) for _ in range(60)]
    selector = RendezvousSelector(("matcher-b", "matcher-a", "matcher-c"))
    with EngineMatcher(spark, subs, now=NOW, selector=selector) as matcher:
        assert matcher.partitions == 3
        assert matcher.match(ups) == Engine(subs).match_batch(ups, NOW)


def test_a_matcher_refuses_a_clock_past_an_expiry(spark: Any) -> None:
    subs = [
        Subscription("soon", (EntitySelector(id_pattern=".*"),), expires=NOW + 10),
        Subscription("gone", (EntitySelector(id_pattern=".*"),), expires=NOW - 10),
    ]
    ups = [ContextUpdate.of("a", {"x": 1})]
    with EngineMatcher(spark, subs, now=NOW) as matcher:
        assert matcher.subscriptions == 1 and matcher.valid_until == NOW + 10
        assert matcher.match(ups) == [{"soon"}]
        with pytest.raises(ValueError, match="expired"):
            matcher.match(ups, now=NOW + 11)


def test_lines_that_are_not_updates_match_nothing_by_either_method(
    spark: Any, tmp_path: Path
) -> None:
    path = tmp_path / "updates.jsonl"
    rows = [
        json.dumps({"id": "a", "x": {"value": 1}}),
        "{not json",
        json.dumps({"type": "T", "x": {"value": 1}}),
        "",
        json.dumps({"id": "b", "type": "T", "x": {"value": 2}}),
    ]
    path.write_text("\n".join(rows) + "\n")
    subs = [Subscription("all", (EntitySelector(id_pattern=".*"),))]
    found = {}
    for method in ("engine", "join"):
        with open_matcher(spark, subs, method=method, now=NOW) as matcher:
            rows_found = matcher.match_frame(read_lines(spark, path)).collect()
        found[method] = sorted((row[0], row[1]) for row in rows_found)
    assert found["engine"] == found["join"] == [(0, "all"), (4, "all")]


def test_an_unknown_method_is_refused(spark: Any) -> None:
    with pytest.raises(ValueError, match="unknown method 'fast'"):
        open_matcher(spark, [], method="fast")


@pytest.fixture
def worker_engines() -> Any:
    """The test process as a Spark worker: its engines dropped (and unfrozen) after."""
    yield
    arrow._ENGINES.clear()
    gc.unfreeze()


class _Broadcast:
    def __init__(self, subscriptions: list[Subscription]) -> None:
        objs = [subscription_to_obj(s) for s in subscriptions]
        self.value = [packb((list(range(len(subscriptions))), objs))]


def test_a_checked_batch_fails_on_a_line_it_cannot_read(worker_engines: Any) -> None:
    subs = [Subscription("all", (EntitySelector(id_pattern=".*"),))]
    good = json.dumps({"id": "a", "x": {"value": 1}})
    bad = json.dumps({"id": "b", "x": {"type": "DateTime", "value": "yesterday"}})
    batch = pa.RecordBatch.from_arrays(
        [pa.array([0, 1], pa.int64()), pa.array([good, bad])], names=["update", "text"]
    )
    unchecked = list(arrow._match_batches("t1", _Broadcast(subs), NOW, None)(iter([batch])))
    assert [b.to_pylist() for b in unchecked] == [[{"update": 0, "matches": [0]}]]
    with pytest.raises(InputError) as caught:
        list(arrow._match_batches("t1", _Broadcast(subs), NOW, "in.jsonl")(iter([batch])))
    assert (caught.value.source, caught.value.line, caught.value.field) == ("in.jsonl", 2, "x")
    assert "ISO 8601" in caught.value.reason


def test_shared_attributes_keep_each_value_as_written() -> None:
    values = [1, 1.0, True, "1", 1, 1.0, None, [1], {"a": 1}]
    for value in values:  # equal values of other kinds never share an attribute
        update = read_update(json.dumps({"id": "a", "x": {"value": value}}))
        assert update is not None
        read = update.attributes["x"]
        assert read.value == value and type(read.value) is type(value)
        assert read == update_from_json({"id": "a", "x": {"value": value}}).attributes["x"]
    typed = read_update(json.dumps({"id": "a", "x": {"type": "Score", "value": 1}}))
    assert typed is not None and typed.attributes["x"].type == "Score"
