"""The plan-building functions, without a SparkSession."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st
from strategies import NOW

from broker.model.subscription import EntitySelector, Status, Subscription
from spark_matcher.plan import (
    MAX_SPLITS,
    SEP,
    bucket,
    build_plan,
    dyadic_cover,
    levels,
    literal_regex,
    partition_selector,
)


def _sub(sid: str, q: str = "", **fields: object) -> Subscription:
    entities = fields.pop("entities", (EntitySelector(id_pattern=".*"),))
    return Subscription(sid, entities, q=q, **fields)  # type: ignore[arg-type]


@given(st.integers(2, 6), st.integers(0, 300), st.data())
def test_cover_is_exact_disjoint_and_within_levels(
    base: int, top: int, data: st.DataObject
) -> None:
    low = data.draw(st.integers(0, top))
    high = data.draw(st.integers(low - 1, top))
    covered: set[int] = set()
    for level, index in dyadic_cover(low, high, base):
        assert level < levels(top, base)
        block = set(range(index * base**level, (index + 1) * base**level))
        assert not block & covered
        covered |= block
    assert covered == set(range(low, high + 1))


def test_cover_of_every_bin_is_one_top_block() -> None:
    assert dyadic_cover(0, 15, 4) == [(2, 0)]
    assert dyadic_cover(0, 255, 4) == [(4, 0)]


def test_bucket_counts_splits_at_or_below_and_folds_negative_zero() -> None:
    splits = [0.0, 10.0, 20.0]
    assert [bucket(splits, v) for v in (-1.0, -0.0, 0.0, 5.0, 10.0, 25.0)] == [0, 1, 1, 1, 2, 3]
    assert bucket(splits, -math.inf) == 0 and bucket(splits, math.inf) == 3


def test_literal_regexes_become_string_tests_and_others_stay_regexes() -> None:
    assert literal_regex("^Plaza") == ("p", "Plaza")
    assert literal_regex("za$") == ("s", "za")
    assert literal_regex("^Retiro$") == ("e", "Retiro")
    assert literal_regex("Castilla") == ("c", "Castilla")
    for pattern in ("^Pl.za", "a|b", "x+", "^$", "\\d", "a\\$", "^", "(a)"):
        assert literal_regex(pattern) is None, pattern


def test_each_clause_is_driven_by_its_most_selective_key() -> None:
    station = EntitySelector(id="urn:s1", type="T")
    plan = build_plan(
        [
            _sub("by-id", "NO2>200", entities=(station,)),
            _sub("by-text", "name=='Retiro';NO2>3"),
            _sub("by-prefix", "name~=^Plaza"),
            _sub(
                "by-number",
                "PM10==50..100",
                entities=(EntitySelector(id_pattern="^urn", type="T"),),
            ),
            _sub("by-type", "name~=^P", entities=(EntitySelector(id_pattern=".*", type="T"),)),
            _sub("by-tenant", "!name"),
        ],
        NOW,
    )
    drivers = {c.subscription: (c.driver, c.attr) for c in plan.clauses}
    assert drivers == {
        "by-id": ("i", None),
        "by-text": ("e", "name"),
        "by-prefix": ("p", "name"),
        "by-number": ("n", "PM10"),
        "by-type": ("t", None),
        "by-tenant": ("*", None),
    }
    text = next(c for c in plan.clauses if c.subscription == "by-text")
    assert f"0{SEP}{SEP}name{SEP}e{SEP}Retiro" in text.keys
    assert f"0{SEP}{SEP}name{SEP}A" in text.keys  # arrays meet every clause they drive
    assert [r.attr for r in text.rest] == ["NO2"]
    by_number = next(c for c in plan.clauses if c.subscription == "by-number")
    assert by_number.id_op == "p" and by_number.id_arg == "urn"
    assert plan.numeric["PM10"] == [50.0, 100.0]
    assert plan.strings["name"] == {"e", "p3"}
    assert not any(c.verify for c in plan.clauses)


def test_residual_filters_and_regexes_are_verified() -> None:
    plan = build_plan(
        [
            _sub("ne", "a!=3"),
            _sub("dotted", "a.b==3"),
            _sub("regex", "a~=x+y"),
            _sub("id-regex", entities=(EntitySelector(id_pattern="^a.c"),)),
            _sub("metadata", mq="a.unit=='C'"),
            _sub("plain", "a>3"),
        ],
        NOW,
    )
    verify = {c.subscription: c.verify for c in plan.clauses}
    assert verify == {
        "ne": True,
        "dotted": True,
        "regex": True,
        "id-regex": True,
        "metadata": True,
        "plain": False,
    }


def test_inactive_and_expired_subscriptions_are_left_out() -> None:
    plan = build_plan(
        [
            _sub("live", expires=NOW + 1),
            _sub("expired", expires=NOW),
            _sub("inactive", status=Status.INACTIVE),
            _sub("oneshot", status=Status.ONESHOT),
        ],
        NOW,
    )
    assert sorted(plan.subscriptions) == ["live", "oneshot"]


def test_partitions_follow_the_matchers_selector() -> None:
    subs = [_sub(f"s{i}") for i in range(200)]
    plan = build_plan(subs, NOW, partitions=3)
    selector = partition_selector(3)
    for clause in plan.clauses:
        assert clause.part == selector.owners.index(selector.owner_of(clause.subscription))
        assert all(key.startswith(f"{clause.part}{SEP}") for key in clause.keys)
    assert {c.part for c in plan.clauses} == {0, 1, 2}


def test_several_selectors_make_several_clauses() -> None:
    two = (EntitySelector(id="a"), EntitySelector(id="b"))
    plan = build_plan([_sub("s", entities=two), _sub("t")], NOW)
    assert [c.subscription for c in plan.clauses] == ["s", "s", "t"]
    assert plan.multi


def test_many_bounds_are_thinned_to_quantiles() -> None:
    subs = [_sub(f"s{i}", f"x>{i}") for i in range(1000)]
    plan = build_plan(subs, NOW)
    splits = plan.numeric["x"]
    assert len(splits) <= MAX_SPLITS and splits == sorted(set(splits))
    for clause in plan.clauses:  # a thinned split list still covers each interval's bins
        assert clause.keys
