"""The indexed engine finds exactly the subscriptions the reference matcher finds.

Three ways of holding the two together, all with the fixed clock ``NOW``:

- random subscription sets (1-60) and updates (1-20), matched one by one and in batches;
- a state machine interleaving add, remove, replace-with-changes, compact and match, checking
  a fixed set of probe updates after every step;
- a large fixed-seed workload (3,000 subscriptions, 500 updates).

The data come from ``tests/strategies.py``, tuned so that a good share of pairs match; the
terminal summary reports the rates each test saw.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from strategies import (
    NOW,
    RandomSource,
    draw_subscription,
    draw_update,
    examples,
    record_match_stats,
    subscription_sets,
    subscriptions,
    update_lists,
    updates,
    variants,
)

from broker.errors import NotFound
from broker.matching import clause_group
from broker.matching.clause_group import ClauseGroup
from broker.matching.engine import Engine
from broker.matching.reference import ReferenceMatcher
from broker.model.subscription import Subscription
from broker.model.update import ContextUpdate

_POOL = tuple(f"s{i}" for i in range(12))  # the stateful test's ids: re-adds replace


def _assert_same(
    found: Sequence[set[str]],
    expected: Sequence[set[str]],
    updates: Sequence[ContextUpdate],
    subscriptions: Iterable[Subscription],
) -> None:
    """Fail with the differing subscriptions spelled out."""
    assert len(found) == len(expected)
    by_id = {s.id: s for s in subscriptions}
    for update, got, want in zip(updates, found, expected, strict=True):
        if got != want:
            lines = [f"engine and reference differ on {update!r}"]
            lines += [f"  missing {by_id[i]!r}" for i in sorted(want - got)]
            lines += [f"  extra {by_id.get(i, i)!r}" for i in sorted(got - want)]
            raise AssertionError("\n".join(lines))


def _observe(
    test: str,
    subscriptions: Sequence[Subscription],
    updates: Sequence[ContextUpdate],
    matches: Sequence[set[str]],
) -> None:
    """Record the match rates, and show them in Hypothesis' statistics.

    (No ``target()``: with an example database it saves every improving example, which
    made each case several times slower.)
    """
    non_empty, pair_rate = record_match_stats(test, subscriptions, updates, matches)
    event("updates with a match", _bucket(non_empty))
    event("same-tenant pairs that match", _bucket(pair_rate))


def _bucket(rate: float) -> str:
    if rate == 0:
        return "none"
    if rate == 1:
        return "all"
    low = int(rate * 5) * 20
    return f"{low}-{low + 20}%"


@settings(max_examples=examples(500))
@given(subscriptions=subscription_sets(1, 60), updates=update_lists(1, 20))
def test_match_agrees_with_reference(
    subscriptions: list[Subscription], updates: list[ContextUpdate]
) -> None:
    engine = Engine(subscriptions)
    reference = ReferenceMatcher(subscriptions)

    expected = [reference.match(u, NOW) for u in updates]
    found = [engine.match(u, NOW) for u in updates]

    _assert_same(found, expected, updates, subscriptions)
    _observe("match", subscriptions, updates, expected)


@settings(max_examples=examples(400))
@given(subscriptions=subscription_sets(1, 60), updates=update_lists(1, 20))
def test_match_batch_agrees_with_reference_after_compact(
    subscriptions: list[Subscription], updates: list[ContextUpdate]
) -> None:
    engine = Engine()
    for subscription in subscriptions:
        engine.add(subscription)
    engine.compact()
    reference = ReferenceMatcher(subscriptions)

    expected = reference.match_batch(updates, NOW)
    found = engine.match_batch(updates, NOW)

    assert len(engine) == len(reference)
    _assert_same(found, expected, updates, subscriptions)
    _observe("match_batch after compact", subscriptions, updates, expected)


class EngineAgainstReference(RuleBasedStateMachine):
    """Adds, removes, replaces and compacts; the engine must agree with the reference."""

    def __init__(self) -> None:
        super().__init__()
        self.engine = Engine()
        self.reference = ReferenceMatcher()
        self.probes: list[ContextUpdate] = []

    @initialize(probes=update_lists(3, 8))
    def choose_probes(self, probes: list[ContextUpdate]) -> None:
        self.probes = probes

    @rule(subscription=subscriptions(ids=_POOL))
    def add(self, subscription: Subscription) -> None:
        self.engine.add(subscription)
        self.reference.add(subscription)

    @precondition(lambda self: len(self.reference) > 0)
    @rule(data=st.data())
    def replace_with_changes(self, data: st.DataObject) -> None:
        held = {s.id: s for s in self.reference.subscriptions()}
        old = held[data.draw(st.sampled_from(sorted(held)), label="id")]
        new = data.draw(variants(old), label="variant")
        self.engine.add(new)
        self.reference.add(new)

    @rule(subscription_id=st.sampled_from(_POOL))
    def remove(self, subscription_id: str) -> None:
        if subscription_id in self.reference:
            assert self.engine.remove(subscription_id) == self.reference.remove(subscription_id)
        else:
            with pytest.raises(NotFound):
                self.engine.remove(subscription_id)
            with pytest.raises(NotFound):
                self.reference.remove(subscription_id)

    @rule()
    def compact(self) -> None:
        self.engine.compact()

    @rule(update=updates())
    def match(self, update: ContextUpdate) -> None:
        expected = self.reference.match(update, NOW)
        _assert_same(
            [self.engine.match(update, NOW)], [expected], [update], self.reference.subscriptions()
        )

    @rule(batch=update_lists(0, 5))
    def match_batch(self, batch: list[ContextUpdate]) -> None:
        expected = self.reference.match_batch(batch, NOW)
        found = self.engine.match_batch(batch, NOW)
        _assert_same(found, expected, batch, self.reference.subscriptions())

    @invariant()
    def agrees_on_probes(self) -> None:
        assert len(self.engine) == len(self.reference)
        held = self.reference.subscriptions()
        expected = self.reference.match_batch(self.probes, NOW)
        found = [self.engine.match(probe, NOW) for probe in self.probes]
        _assert_same(found, expected, self.probes, held)
        record_match_stats("stateful probes", held, self.probes, expected)


TestEngineAgainstReference = EngineAgainstReference.TestCase
TestEngineAgainstReference.settings = settings(max_examples=examples(300), stateful_step_count=40)


class SmallRunsAgainstReference(EngineAgainstReference):
    """The same with runs of at most 3 clauses, plus bulk adds and removals and compaction
    stopped part way: the engine splits, merges and rebuilds runs all the time."""

    LIMIT = 3

    def __init__(self) -> None:
        self._saved_limit = clause_group.RUN_LIMIT
        clause_group.RUN_LIMIT = self.LIMIT
        super().__init__()

    def teardown(self) -> None:
        clause_group.RUN_LIMIT = self._saved_limit

    @rule(batch=st.lists(subscriptions(ids=_POOL), max_size=8))
    def add_many(self, batch: list[Subscription]) -> None:
        self.engine.add_many(batch)
        for subscription in batch:
            self.reference.add(subscription)

    @rule(ids=st.lists(st.sampled_from(_POOL), max_size=8))
    def remove_many(self, ids: list[str]) -> None:
        held = [i for i in dict.fromkeys(ids) if i in self.reference]
        assert [s.id for s in self.engine.remove_many(held)] == held
        for subscription_id in held:
            self.reference.remove(subscription_id)

    @rule(steps=st.integers(1, 3))
    def compaction_steps(self, steps: int) -> None:
        for built in (b for _, b in zip(range(steps), self.engine.compaction(), strict=False)):
            assert built <= self.LIMIT

    @rule()
    def compact(self) -> None:
        self.engine.compact()
        assert not any(group.dirty() for group in self._groups())

    @invariant()
    def runs_stay_small(self) -> None:
        for group in self._groups():
            assert all(live <= self.LIMIT for live in group.runs())
            assert group.pending() < self.LIMIT

    def _groups(self) -> list[ClauseGroup]:
        return [
            group
            for tenant in self.engine._tenants.values()
            for table in tenant.scopes.values()
            for group in table.values()
        ]


TestSmallRunsAgainstReference = SmallRunsAgainstReference.TestCase
TestSmallRunsAgainstReference.settings = settings(
    max_examples=examples(200), stateful_step_count=40
)


def test_large_fixed_seed_workload() -> None:
    source = RandomSource(random.Random(20240611))
    subscriptions = [draw_subscription(source, f"big{i}") for i in range(3000)]
    updates = [draw_update(source) for _ in range(500)]
    engine = Engine(subscriptions)
    reference = ReferenceMatcher(subscriptions)

    expected = reference.match_batch(updates, NOW)
    _assert_same(engine.match_batch(updates, NOW), expected, updates, subscriptions)
    engine.compact()
    _assert_same([engine.match(u, NOW) for u in updates], expected, updates, subscriptions)

    non_empty, _ = record_match_stats("large fixed seed", subscriptions, updates, expected)
    assert sum(len(m) for m in expected) / len(updates) > 1, "the workload barely matches"
    assert non_empty > 0.5, "too many updates match nothing"
