"""Hand cases for the indexed engine: its API, incremental changes and compilation."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import examples, subscription_sets, update_lists

from broker.errors import InvalidSubscription, NotFound, QuerySyntaxError
from broker.matching.engine import Engine
from broker.matching.reference import ReferenceMatcher
from broker.model.subscription import EntitySelector, Status, Subscription
from broker.model.update import ContextUpdate

NOW = 1_700_000_000.0
ROOM = (EntitySelector(id_pattern="^Room", type="Room"),)


def sub(sid: str, q: str = "", **kwargs: object) -> Subscription:
    fields: dict[str, object] = {"entities": ROOM} | kwargs
    return Subscription(sid, q=q, **fields)  # type: ignore[arg-type]


def room(temp: object, **kwargs: object) -> ContextUpdate:
    fields: dict[str, object] = {"entity_type": "Room"} | kwargs
    return ContextUpdate.of("Room1", {"temp": temp}, **fields)  # type: ignore[arg-type]


def test_add_match_remove() -> None:
    engine = Engine([sub("hot", "temp>25"), sub("cold", "temp<5"), sub("any")])
    assert engine.match(room(30), NOW) == {"hot", "any"}
    assert engine.match(room(0), NOW) == {"cold", "any"}
    assert engine.remove("hot").id == "hot"
    assert engine.match(room(30), NOW) == {"any"}
    assert len(engine) == 2 and "hot" not in engine


def test_remove_unknown_is_not_found_and_changes_nothing() -> None:
    engine = Engine([sub("a", "temp>1")])
    with pytest.raises(NotFound, match="no subscription 'b'"):
        engine.remove("b")
    assert engine.match(room(2), NOW) == {"a"}
    with pytest.raises(NotFound):
        engine.get("b")


def test_add_replaces_same_id() -> None:
    engine = Engine([sub("a", "temp>10")])
    engine.add(sub("a", "temp<10"))
    assert len(engine) == 1
    assert engine.match(room(20), NOW) == set()
    assert engine.match(room(5), NOW) == {"a"}
    assert engine.get("a").q == "temp<10"


def test_add_rejects_what_is_not_a_subscription() -> None:
    engine = Engine([sub("a")])
    with pytest.raises(InvalidSubscription, match="not a Subscription"):
        engine.add("a")  # type: ignore[arg-type]
    assert engine.match(room(1), NOW) == {"a"}


def test_bad_subscription_never_reaches_the_engine() -> None:
    engine = Engine([sub("a", "temp>1")])
    with pytest.raises(QuerySyntaxError):
        engine.add(sub("b", "temp>>1"))
    assert engine.subscriptions() == [sub("a", "temp>1")]
    assert engine.match(room(2), NOW) == {"a"}


def test_inactive_is_held_but_never_matches() -> None:
    engine = Engine([sub("a", status=Status.INACTIVE), sub("b")])
    assert "a" in engine and len(engine) == 2
    assert engine.match(room(1), NOW) == {"b"}
    engine.add(sub("a"))  # reactivated
    assert engine.match(room(1), NOW) == {"a", "b"}
    engine.remove("a")
    assert engine.match(room(1), NOW) == {"b"}


def test_expiry_is_checked_against_now() -> None:
    engine = Engine([sub("a", expires=NOW + 10)])
    assert engine.match(room(1), NOW) == {"a"}
    assert engine.match(room(1), NOW + 10) == set()


def test_several_selectors_match_once() -> None:
    both = Subscription(
        "both",
        (
            EntitySelector(id="Room1"),
            EntitySelector(id_pattern="Room"),
            EntitySelector(id_pattern=".*"),
        ),
    )
    engine = Engine([both])
    slots = engine.match_slots(room(1), NOW)
    assert len(slots) == 1
    assert engine.ids(slots) == ["both"]
    assert engine.match(room(1), NOW) == {"both"}


def test_slots_are_reused_and_results_stay_right() -> None:
    engine = Engine([sub(f"s{i}", f"temp>{i}") for i in range(10)])
    for i in range(0, 10, 2):
        engine.remove(f"s{i}")
    for i in range(10, 15):
        engine.add(sub(f"s{i}", f"temp>{i}"))
    expected = {f"s{i}" for i in (*range(1, 10, 2), *range(10, 15)) if i < 12}
    assert engine.match(room(12), NOW) == expected


def test_pending_clauses_match_before_and_after_compilation() -> None:
    engine = Engine()
    reference = ReferenceMatcher()
    updates = [room(t) for t in (-5, 0, 3.5, 10, 99, "warm", None, [1, 50])]
    for i in range(400):
        s = sub(f"s{i}", f"temp>{i % 37};temp<={i % 53 + 10}")
        engine.add(s)
        reference.add(s)
        if i % 7 == 0:
            engine.remove(f"s{i // 2}")
            reference.remove(f"s{i // 2}") if f"s{i // 2}" in reference else None
        if i % 50 == 0:
            for update in updates:
                assert engine.match(update, NOW) == reference.match(update, NOW)
    engine.compact()
    assert engine.match_batch(updates, NOW) == reference.match_batch(updates, NOW)


def test_other_tenants_and_paths_are_not_looked_at() -> None:
    engine = Engine(
        [
            sub("madrid", tenant="madrid"),
            sub("default"),
            sub("a", service_path="/a/#"),
            sub("a_exact", service_path="/a"),
        ]
    )
    assert engine.match(room(1, tenant="madrid", service_path="/a"), NOW) == {"madrid"}
    assert engine.match(room(1, service_path="/a/b"), NOW) == {"default", "a"}
    assert engine.match(room(1, service_path="/a"), NOW) == {"default", "a", "a_exact"}
    assert engine.match(room(1, service_path="/a2"), NOW) == {"default"}
    assert engine.match(room(1, tenant="other"), NOW) == set()


def test_iterating_and_listing() -> None:
    subs = [sub("a"), sub("b", status=Status.INACTIVE)]
    engine = Engine(subs)
    assert sorted(s.id for s in engine) == ["a", "b"]
    assert sorted(s.id for s in engine.subscriptions()) == ["a", "b"]


def test_live_changes_keep_few_runs_and_few_pending() -> None:
    """Subscriptions trickling in and out while updates flow: results stay exact, few
    clauses wait unindexed after a match, and a group keeps a logarithmic number of runs."""
    import math
    import random

    from broker.matching.clause_group import ClauseGroup

    rng = random.Random(5)
    engine = Engine()
    reference = ReferenceMatcher()
    live: list[str] = []
    probes = [room(t) for t in (-3, 0, 7.5, 20, 41, 99.5)]
    for step in range(3000):
        if live and rng.random() < 0.3:
            victim = live.pop(rng.randrange(len(live)))
            engine.remove(victim)
            reference.remove(victim)
        else:
            s = sub(f"s{step}", f"temp>{rng.randint(-5, 60)};temp<{rng.randint(0, 110)}")
            engine.add(s)
            reference.add(s)
            live.append(s.id)
        if step % 25 == 0:
            probe = probes[step % len(probes)]
            assert engine.match(probe, NOW) == reference.match(probe, NOW)
            (group,) = [g for table in engine._tenants[""].scopes.values() for g in table.values()]
            assert isinstance(group, ClauseGroup)
            assert group.pending() < 8
            runs = group.runs()
            assert len(runs) <= 2 + math.log(max(len(live), 64) / 64, 4) * 2
            assert sum(runs) + group.pending() == len(live)
    assert engine.match_batch(probes, NOW) == reference.match_batch(probes, NOW)


def test_add_many_adds_in_order_and_replaces_same_id() -> None:
    engine = Engine([sub("a", "temp>10")])
    engine.add_many([sub("a", "temp<10"), sub("b", "temp>20"), sub("b", "temp>30"), sub("c")])
    assert len(engine) == 3
    assert engine.get("a").q == "temp<10" and engine.get("b").q == "temp>30"
    assert engine.match(room(25), NOW) == {"c"}
    assert engine.match(room(35), NOW) == {"b", "c"}
    assert engine.match(room(5), NOW) == {"a", "c"}


def test_add_many_rejects_a_batch_with_a_non_subscription_whole() -> None:
    engine = Engine([sub("a")])
    with pytest.raises(InvalidSubscription, match="not a Subscription"):
        engine.add_many([sub("b"), "c"])  # type: ignore[list-item]
    assert sorted(s.id for s in engine) == ["a"]


def test_remove_many_returns_what_it_removed() -> None:
    engine = Engine([sub("a", "temp>1"), sub("b", "temp>2"), sub("c", status=Status.INACTIVE)])
    removed = engine.remove_many(["a", "c", "a"])
    assert [s.id for s in removed] == ["a", "c"]
    assert engine.match(room(5), NOW) == {"b"}
    assert len(engine) == 1 and engine.slot_of("a") is None


def test_remove_many_with_an_unknown_id_removes_nothing() -> None:
    engine = Engine([sub("a", "temp>1"), sub("b")])
    with pytest.raises(NotFound, match="no subscription 'x'"):
        engine.remove_many(["a", "x"])
    assert engine.match(room(5), NOW) == {"a", "b"}


def test_remove_many_in_slices_keeps_results_exact_and_groups_small() -> None:
    """Half of a compiled group removed a slice at a time, matching between slices: runs are
    rebuilt from their live clauses, results stay the reference's."""
    from broker.matching.clause_group import ClauseGroup

    subs = [sub(f"s{i}", f"temp>{i % 97}", entities=ROOM * (1 + i % 2)) for i in range(2000)]
    engine = Engine()
    engine.add_many(subs)
    engine.compact()
    reference = ReferenceMatcher(subs)
    probes = [room(t) for t in (0, 30, 50.5, 99)]
    doomed = [s.id for s in subs if hash(s.id) % 3]
    for start in range(0, len(doomed), 300):
        chunk = doomed[start : start + 300]
        engine.remove_many(chunk)
        for subscription_id in chunk:
            reference.remove(subscription_id)
        assert engine.match_batch(probes, NOW) == reference.match_batch(probes, NOW)
    (group,) = [g for table in engine._tenants[""].scopes.values() for g in table.values()]
    assert isinstance(group, ClauseGroup)
    assert (
        sum(group.runs()) + group.pending()
        == len(group)
        == 2 * len(engine) - sum(1 for s in engine if len(s.entities) == 1)
    )
    engine.remove_many([s.id for s in engine])
    assert len(engine) == 0 and engine._tenants == {}


def test_no_step_builds_more_than_one_run(monkeypatch: pytest.MonkeyPatch) -> None:
    """A large group loaded, compacted and half removed a slice at a time: no add or
    compaction step builds more than one run of RUN_LIMIT clauses, no removal more than
    REBUILD_BUDGET plus one half-dead run (the bounds on how long a matcher stops
    matching), and results stay the reference's throughout."""
    from broker.matching import clause_group
    from broker.matching import engine as engine_module

    monkeypatch.setattr(clause_group, "RUN_LIMIT", 50)
    monkeypatch.setattr(engine_module, "REBUILD_BUDGET", 25)
    subs = [sub(f"s{i}", f"temp>{i % 89}") for i in range(1010)]
    engine, reference = Engine(), ReferenceMatcher(subs)
    probes = [room(t) for t in (0, 30, 50.5, 99)]
    for start in range(0, len(subs), 120):
        engine.add_many(subs[start : start + 120])
    (group,) = [g for table in engine._tenants[""].scopes.values() for g in table.values()]
    assert group.runs() == [50] * 20 and group.pending() == 10
    assert engine.match_batch(probes, NOW) == reference.match_batch(probes, NOW)
    assert all(built <= 50 for built in engine.compaction())
    assert group.runs() == [*[50] * 20, 10]
    doomed = [s.id for s in subs if hash(s.id) % 2]
    for start in range(0, len(doomed), 40):
        before = {id(run) for run in group._runs}
        engine.remove_many(doomed[start : start + 40])
        for subscription_id in doomed[start : start + 40]:
            reference.remove(subscription_id)
        assert sum(run.live for run in group._runs if id(run) not in before) <= 50
        assert engine.match_batch(probes, NOW) == reference.match_batch(probes, NOW)
    assert all(built <= 50 for built in engine.compaction())
    assert sum(group.runs()) == len(group) == len(reference)
    assert all(a + b > 50 for a, b in itertools.pairwise(group.runs()))
    assert engine.match_batch(probes, NOW) == reference.match_batch(probes, NOW)


def test_compaction_builds_one_run_per_step_and_skips_built_ones() -> None:
    engine = Engine([sub("a", "temp>1"), sub("b", service_path="/x"), sub("c", tenant="t")])
    assert sorted(engine.compaction()) == [1, 1, 1]
    assert list(engine.compaction()) == []
    engine.add(sub("d", "temp<0", service_path="/x"))
    assert list(engine.compaction()) == [2]
    assert engine.match(room(-1, service_path="/x"), NOW) == {"b", "d"}


@settings(max_examples=examples(300))
@given(
    subscriptions=subscription_sets(1, 60),
    updates=update_lists(1, 10),
    data=st.data(),
)
def test_bulk_changes_agree_with_reference(
    subscriptions: list[Subscription], updates: list[ContextUpdate], data: st.DataObject
) -> None:
    """add_many and remove_many in random slices, between compactions stopped part way:
    the engine matches what the reference matcher does after the same changes."""
    engine = Engine()
    reference = ReferenceMatcher()
    cut = data.draw(st.integers(0, len(subscriptions)), label="first add_many")
    for batch in (subscriptions[:cut], subscriptions[cut:]):
        engine.add_many(batch)
        for subscription in batch:
            reference.add(subscription)
        steps = data.draw(st.integers(0, 3), label="compaction steps")
        for _, _ in zip(range(steps), engine.compaction(), strict=False):
            pass
    doomed = data.draw(st.lists(st.sampled_from([s.id for s in subscriptions])), label="doomed")
    while doomed:
        size = data.draw(st.integers(1, len(doomed)), label="slice")
        chunk, doomed = doomed[:size], doomed[size:]
        held = [i for i in dict.fromkeys(chunk) if i in reference]
        assert [s.id for s in engine.remove_many(held)] == held
        for subscription_id in held:
            reference.remove(subscription_id)
        assert engine.match_batch(updates, NOW) == reference.match_batch(updates, NOW)
    assert len(engine) == len(reference)
    assert engine.match_batch(updates, NOW) == reference.match_batch(updates, NOW)


def test_held_slots_and_inactive_list_what_is_held() -> None:
    engine = Engine([sub("a"), sub("b", status=Status.INACTIVE), sub("c"), sub("d")])
    engine.remove("c")
    slots = engine.held_slots()
    assert slots.tolist() == sorted(slots.tolist())
    assert sorted(engine.ids(slots)) == ["a", "d"]
    assert [s.id for s in engine.inactive()] == ["b"]
    assert Engine([sub("a")]).inactive() == []


def test_remove_many_without_a_rebuild_budget_only_kills() -> None:
    subs = [sub(f"s{i}", f"temp>{i % 89}") for i in range(300)]
    engine, reference = Engine(subs), ReferenceMatcher(subs)
    engine.compact()
    (group,) = [g for table in engine._tenants[""].scopes.values() for g in table.values()]
    (run,) = group._runs
    doomed = [s.id for s in subs[:250]]
    engine.remove_many(doomed, rebuild_budget=0)
    for subscription_id in doomed:
        reference.remove(subscription_id)
    assert group._runs == [run] and group.runs() == [50] and group.dirty()
    probes = [room(t) for t in (0, 30, 99)]
    assert engine.match_batch(probes, NOW) == reference.match_batch(probes, NOW)
    engine.compact()
    assert group._runs != [run] and group.runs() == [50]
    assert engine.match_batch(probes, NOW) == reference.match_batch(probes, NOW)
