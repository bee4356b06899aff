"""A group of clauses that share tenant, scope, exact entity id and exact entity type.

A *clause* is one entity selector of a subscription; a subscription with three selectors
has three clauses and matches when any of them does. The engine hashes an update straight to
the few groups whose shared key it satisfies; inside a group, bitsets over the clause
positions narrow the clauses down attribute by attribute (the counting algorithm, done with
bitwise AND instead of counters).

Clauses are compiled in *runs* (see :class:`ClauseGroup`), so that adding and removing
subscriptions while matching never costs a rebuild of a large group at once, and never
leaves more than a few dozen clauses to be checked one by one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from broker.matching.attribute_index import AttributeIndex, IntervalColumns, StringIndex
from broker.matching.bitset import from_positions, position_array, positions
from broker.matching.constraint import AttributeConstraint, FilterPlan, StringTest, plan
from broker.matching.reference import subscription_matches
from broker.model.subscription import EntitySelector, Subscription
from broker.model.update import ContextUpdate
from broker.query.ast import Filter, Op
from broker.query.regex import is_match_all

__all__ = ["RUN_LIMIT", "Clause", "ClauseGroup", "CompiledGroup", "Matches"]

_PENDING_LIMIT = 8  # clauses checked one by one before they are compiled into a run


class Clause(NamedTuple):
    """One entity selector of a subscription; ``slot`` is the subscription's engine number.

    A named tuple: a bulk load builds one per clause, and a tuple is the cheapest to build.
    """

    subscription: Subscription
    selector: EntitySelector
    slot: int


@dataclass(slots=True)
class Matches:
    """Where groups put the slots of one update's matching clauses: whole arrays, one by one,
    or (when matching a batch) large bitsets left in ``deferred`` to decode with the batch."""

    arrays: list[npt.NDArray[np.int64]] = field(default_factory=list)
    slots: list[int] = field(default_factory=list)
    deferred: list[tuple[CompiledGroup, int, int]] | None = None  # (group, update index, bits)
    index: int = 0

    def add_bits(self, compiled: CompiledGroup, bits: int) -> None:
        """Add the clauses of ``bits`` (positions in ``compiled``)."""
        if self.deferred is not None and bits.bit_length() > _DEFER_BITS:
            self.deferred.append((compiled, self.index, bits))
        else:
            self.arrays.append(compiled.slots[position_array(bits)])


_DEFER_BITS = 256


class _PatternIndex:
    """Regex selectors on the entity id or type: the clauses a value lets through."""

    __slots__ = ("_free", "_patterns")

    def __init__(self, patterns: dict[str, list[int]], size: int) -> None:
        entries = [
            (position, StringTest(Op.MATCH, (pattern,)))
            for pattern, where in patterns.items()
            for position in where
        ]
        self._patterns = StringIndex(entries, size)  # remembers the answer per value
        constrained = [position for position, _ in entries]
        self._free = ((1 << size) - 1) & ~from_positions(constrained, size)

    def lookup(self, value: str) -> int:
        return self._free | self._patterns.lookup(value)


class CompiledGroup:
    """The indexes of a group over clause positions 0..size-1."""

    __slots__ = (
        "attributes",
        "cells",
        "condition_free",
        "conditions",
        "exact",
        "id_patterns",
        "size",
        "slots",
        "subscriptions",
        "type_patterns",
    )

    def __init__(self, clauses: list[Clause]) -> None:
        size = self.size = len(clauses)
        everyone = (1 << size) - 1
        self.subscriptions = [c.subscription for c in clauses]
        self.slots = np.array([c.slot for c in clauses], dtype=np.int64)
        plans: dict[int, FilterPlan] = {}
        by_attribute: dict[str, list[tuple[int, AttributeConstraint]]] = {}
        conditions: dict[str, list[int]] = {}
        condition_free: list[int] = []
        id_patterns: dict[str, list[int]] = {}
        type_patterns: dict[str, list[int]] = {}
        residual: list[int] = []
        for position, clause in enumerate(clauses):
            subscription, selector = clause.subscription, clause.selector
            filter_plan = _plan_of(subscription.filter, plans)
            if filter_plan.residual or subscription.expires is not None:
                residual.append(position)
            for name, constraint in filter_plan.constraints.items():
                entries = by_attribute.get(name)
                if entries is None:
                    entries = by_attribute[name] = []
                entries.append((position, constraint))
            if subscription.condition_attrs:
                for name in set(subscription.condition_attrs):
                    conditions.setdefault(name, []).append(position)
            else:
                condition_free.append(position)
            if selector.id is None and not is_match_all(selector.id_pattern or ""):
                id_patterns.setdefault(selector.id_pattern or "", []).append(position)
            pattern = selector.type_pattern
            if selector.type is None and pattern is not None and not is_match_all(pattern):
                type_patterns.setdefault(pattern, []).append(position)
        self.exact = everyone & ~from_positions(residual, size)
        self.conditions = {n: from_positions(p, size) for n, p in conditions.items()}
        self.condition_free = from_positions(condition_free, size) if conditions else everyone
        self.id_patterns = _PatternIndex(id_patterns, size) if id_patterns else None
        self.type_patterns = _PatternIndex(type_patterns, size) if type_patterns else None
        indexes = []
        celled: dict[str, IntervalColumns] = {}
        for name, entries in by_attribute.items():
            constrained = from_positions([p for p, _ in entries], size)
            index = AttributeIndex(name, entries, everyone & ~constrained, size)
            indexes.append((len(entries), index))
            if not index.exact and index.intervals is not None:
                celled[name] = index.intervals
            index.intervals = None
        # most constrained attributes first: they prune the most, and an empty set stops early
        indexes.sort(key=lambda item: -item[0])
        self.attributes = [index for _, index in indexes]
        # the intervals of every clause on the attributes whose quantile cells can leave a
        # clause undecided, one row per clause, to settle those clauses all at once
        self.cells: _CellIntervals | None = None
        if celled:
            self.cells = _CellIntervals(celled, size)

    def match(self, update: ContextUpdate, candidates: int, now: float, out: Matches) -> None:
        """Add the slots of the matching clauses among ``candidates`` to ``out``."""
        attributes = update.attributes
        if self.conditions:
            bits = self.condition_free
            conditions = self.conditions
            for name in attributes:
                bits |= conditions.get(name, 0)
            candidates &= bits
        if self.id_patterns is not None and candidates:
            candidates &= self.id_patterns.lookup(update.entity_id)
        if self.type_patterns is not None and candidates:
            candidates &= self.type_patterns.lookup(update.entity_type)
        sure = candidates
        compound = False  # an array or object value: "contains" semantics, left to the check
        for index in self.attributes:
            if not candidates:
                return
            attribute = attributes.get(index.name)
            if attribute is not None and type(attribute.match_value) in _COMPOUND:
                compound = True
            possible, certain = index.lookup(attribute)
            candidates &= possible
            sure &= certain
        if not candidates:
            return
        sure &= self.exact
        slots = self.slots
        if sure:
            out.add_bits(self, sure)
        uncertain = candidates & ~sure
        if not uncertain:
            return
        found = out.slots
        cells = self.cells
        if cells is not None and not compound:
            # exact clauses are undecided only where a cell cut through an interval
            undecided = uncertain & self.exact
            if undecided:
                settled = cells.settle(position_array(undecided), attributes)
                if settled is not None:
                    uncertain ^= undecided
                    out.arrays.append(slots[settled])
        if uncertain:
            subscriptions = self.subscriptions
            for p in positions(uncertain):
                if subscription_matches(subscriptions[p], update, now):
                    found.append(int(slots[p]))


_COMPOUND = (list, dict)


class _CellIntervals:
    """Each clause's interval on the attributes cut into quantile cells, as matrices."""

    __slots__ = ("_high", "_high_open", "_low", "_low_open", "_names")

    def __init__(self, columns: dict[str, IntervalColumns], size: int) -> None:
        self._names = sorted(columns)
        shape = (size, len(self._names))
        self._low = np.full(shape, -math.inf)
        self._high = np.full(shape, math.inf)
        self._low_open = np.zeros(shape, dtype=np.bool_)
        self._high_open = np.zeros(shape, dtype=np.bool_)
        for column, name in enumerate(self._names):
            where, low, low_open, high, high_open = columns[name]
            self._low[where, column] = low
            self._high[where, column] = high
            self._low_open[where, column] = low_open
            self._high_open[where, column] = high_open

    def settle(
        self, clauses: npt.NDArray[np.int64], attributes: Any
    ) -> npt.NDArray[np.int64] | None:
        """The positions among ``clauses`` whose intervals all hold, or None when a value
        cannot be compared as a float (a huge integer): then the caller checks exactly."""
        values = []
        for name in self._names:
            attribute = attributes.get(name)
            x = attribute.match_value if attribute is not None else None
            if type(x) is int and abs(x) > _EXACT_INT:
                return None
            # absent or not a number: constrained clauses are not candidates, others pass
            values.append(x if type(x) is float or type(x) is int else 0.0)
        x_row = np.array(values, dtype=np.float64)
        low, high = self._low[clauses], self._high[clauses]
        above = (low < x_row) | ((low == x_row) & ~self._low_open[clauses])
        below = (high > x_row) | ((high == x_row) & ~self._high_open[clauses])
        result: npt.NDArray[np.int64] = clauses[(above & below).all(axis=1)]
        return result


_EXACT_INT = 1 << 53


def _plan_of(filter_: Filter, plans: dict[int, FilterPlan]) -> FilterPlan:
    # filters parsed from the same text are one object (the parser caches them)
    key = id(filter_)
    found = plans.get(key)
    if found is None:
        found = plans[key] = plan(filter_)
    return found


class _Run:
    """Clauses compiled together: their positions in the group, the indexes, which are alive."""

    __slots__ = ("alive", "compiled", "dead", "positions")

    def __init__(self, positions: list[int], clauses: list[Clause]) -> None:
        self.positions = np.array(positions, dtype=np.int64)  # ascending group positions
        self.compiled = CompiledGroup(clauses)
        self.alive = (1 << len(clauses)) - 1  # over positions within the run
        self.dead = 0

    @property
    def live(self) -> int:
        return len(self.positions) - self.dead

    def kill(self, position: int) -> bool:
        """Mark the clause at a group position dead; False when the run does not hold it."""
        local = int(np.searchsorted(self.positions, position))
        if local < len(self.positions) and self.positions[local] == position:
            self.alive &= ~(1 << local)
            self.dead += 1
            return True
        return False

    def kill_many(self, doomed: npt.NDArray[np.int64]) -> None:
        """Mark dead the clauses of the run among the group positions ``doomed`` (ascending)."""
        own = self.positions
        local = np.searchsorted(own, doomed)
        inside = local < len(own)
        local = local[inside]
        local = local[own[local] == doomed[inside]]
        if len(local):
            self.alive &= ~from_positions(local, len(own))
            self.dead += len(local)


# Clauses a run holds at most. Building one takes 4-10 us a clause (0.3-0.6 s for a full
# run); matching visits every run, ~7 us each, so smaller runs would cost matching (timed
# ad hoc on 1M W-IoT subscriptions: 40 % slower at 16,384, 3 % at 65,536; docs/matching.md).
RUN_LIMIT = 65536


class ClauseGroup:
    """The clauses under one (tenant, scope, entity id, entity type) key.

    Clauses live in *runs*, each compiled on its own (log-structured, like an LSM tree):
    new clauses wait in *pending*, checked one by one, until the next match finds at least
    8 of them and compiles them into a new run; a run is merged with the one before it as
    soon as it holds a quarter of its clauses. So a live broker that keeps receiving
    subscriptions checks at most 7 clauses one by one after a match, visits a handful of
    runs, and rebuilds each clause only a logarithmic number of times. Removing clears a
    bit; a run whose clauses are half dead is rebuilt from the live ones.

    No run holds more than :data:`RUN_LIMIT` clauses: a compaction step builds one run,
    :meth:`rebuild_dead` rebuilds within a budget, and adding compiles a run as soon as
    RUN_LIMIT clauses are pending (so no match finds more to compile). A matcher that adds
    or removes half a million subscriptions a slice at a time, or compacts a group of a
    quarter of a million a step at a time (:meth:`compaction`), so never stops matching for
    much longer than one run takes to build (a whole group used to be rebuilt at once: 2.3 s
    for the largest of 1M W-IoT subscriptions). Positions only grow; the clauses are kept by
    position in a dict, so removed ones leave no holes to renumber.
    """

    __slots__ = ("_clauses", "_next", "_pending", "_positions", "_runs")

    def __init__(self) -> None:
        self._clauses: dict[int, Clause] = {}  # live clauses by group position
        self._next = 0  # the position of the next clause added
        self._positions: dict[str, list[int]] = {}  # subscription id -> group positions
        self._runs: list[_Run] = []  # disjoint, ascending positions
        self._pending: list[int] = []  # positions not in any run yet, ascending, after the runs'

    def __len__(self) -> int:
        return len(self._clauses)

    def add(self, clause: Clause) -> None:
        """Add a clause (pending until the next match that finds enough to compile)."""
        position = self._next
        self._next += 1
        self._clauses[position] = clause
        self._positions.setdefault(clause.subscription.id, []).append(position)
        self._pending.append(position)
        self._build_full_runs()

    def add_many(self, clauses: Sequence[Clause]) -> None:
        """``add`` for each clause, in order."""
        start = self._next
        self._next += len(clauses)
        self._clauses.update(zip(range(start, self._next), clauses, strict=True))
        positions = self._positions
        for position, clause in enumerate(clauses, start):
            found = positions.get(clause.subscription.id)
            if found is None:
                positions[clause.subscription.id] = [position]
            else:
                found.append(position)
        self._pending.extend(range(start, self._next))
        self._build_full_runs()

    def remove(self, subscription_id: str) -> None:
        """Remove every clause of the subscription."""
        for position in self._positions.pop(subscription_id, ()):
            del self._clauses[position]
            if self._pending and position >= self._pending[0]:
                self._pending.remove(position)
                continue
            for index, run in enumerate(self._runs):
                if run.kill(position):
                    if run.dead * 2 > len(run.positions):
                        self._rebuild(index)
                    break

    def remove_many(self, subscription_ids: Iterable[str]) -> None:
        """``remove`` for each subscription, rebuilding nothing: runs left more than half
        dead wait for :meth:`rebuild_dead` or :meth:`compaction` (removing from many groups
        at once would otherwise rebuild many runs at once)."""
        removed: list[int] = []
        positions = self._positions
        for subscription_id in subscription_ids:
            removed.extend(positions.pop(subscription_id, ()))
        if not removed:
            return
        clauses = self._clauses
        for position in removed:
            del clauses[position]
        if self._pending:
            self._pending = [p for p in self._pending if p in clauses]
        doomed = np.array(sorted(removed), dtype=np.int64)
        for run in self._runs:
            run.kill_many(doomed)
        self._runs = [run for run in self._runs if run.live]

    def rebuild_dead(self, budget: int) -> int:
        """Rebuild the runs more than half dead from their live clauses, the first one in any
        case and the others while the clauses built stay within ``budget``; return how many
        clauses were built."""
        built = 0
        for index in reversed(range(len(self._runs))):  # a rebuild may drop its run
            run = self._runs[index]
            if run.dead * 2 > len(run.positions) and (built == 0 or built + run.live <= budget):
                built += run.live
                self._rebuild(index)
        return built

    def dirty(self) -> bool:
        """True when :meth:`compaction` has a step to take."""
        return bool(self._pending) or self._mergeable() is not None

    def compaction(self) -> Iterator[int]:
        """Compile the group a run at a time: each step builds one run of at most RUN_LIMIT
        clauses and yields how many it compiled, until no clause is pending, no run holds a
        dead clause and no two neighbouring runs would fit in one.

        Matching, adding and removing may go on between steps.
        """
        while True:
            built = self._compact_step()
            if built is None:
                return
            yield built

    def compile(self) -> None:
        """Compile every live clause into runs now (:meth:`compaction` in one go)."""
        for _ in self.compaction():
            pass

    def match(self, update: ContextUpdate, now: float, out: Matches) -> None:
        """Add the slots of every matching clause to ``out``."""
        if len(self._pending) >= _PENDING_LIMIT:
            self._flush()
        for run in self._runs:
            if run.alive:
                run.compiled.match(update, run.alive, now, out)
        if self._pending:
            clauses = self._clauses
            for position in self._pending:
                clause = clauses[position]
                if subscription_matches(clause.subscription, update, now):
                    out.slots.append(clause.slot)

    def runs(self) -> list[int]:
        """The number of live clauses in each run, oldest first (for tests and stats)."""
        return [run.live for run in self._runs]

    def pending(self) -> int:
        """How many clauses are checked one by one."""
        return len(self._pending)

    def _flush(self) -> None:
        positions = self._pending
        self._pending = []
        self._runs.append(self._run_of(positions))
        runs = self._runs
        while (
            len(runs) >= 2
            and runs[-1].live * 4 >= runs[-2].live
            and runs[-1].live + runs[-2].live <= RUN_LIMIT
        ):
            last = runs.pop()
            runs[-1] = self._run_of([*self._live_positions(runs[-1]), *self._live_positions(last)])

    def _build_full_runs(self) -> None:
        """Compile pending clauses into runs of RUN_LIMIT while that many wait (a bulk
        load), so that no match ever has more than RUN_LIMIT of them to compile."""
        while len(self._pending) >= RUN_LIMIT:
            self._runs.append(self._run_of(self._pending[:RUN_LIMIT]))
            del self._pending[:RUN_LIMIT]

    def _compact_step(self) -> int | None:
        """Build one run: the first runs that hold dead clauses or fit together, merged with
        their neighbours while they fit in one; else the pending clauses, with the last run
        if they fit together. None when there is nothing to do."""
        runs = self._runs
        first = self._mergeable()
        if first is not None:
            end, size = first + 1, runs[first].live
            while end < len(runs) and size + runs[end].live <= RUN_LIMIT:
                size += runs[end].live
                end += 1
            live = [p for run in runs[first:end] for p in self._live_positions(run)]
            runs[first:end] = [self._run_of(live)] if live else []
            return len(live)
        if not self._pending:
            return None
        last = runs[-1] if runs and runs[-1].live + len(self._pending) <= RUN_LIMIT else None
        taken = self._pending[: RUN_LIMIT - (last.live if last is not None else 0)]
        del self._pending[: len(taken)]
        if last is not None:
            runs[-1] = self._run_of([*self._live_positions(last), *taken])
            return last.live + len(taken)
        runs.append(self._run_of(taken))
        return len(taken)

    def _mergeable(self) -> int | None:
        """The first run that holds dead clauses or fits in one with the next, if any."""
        runs = self._runs
        for index, run in enumerate(runs):
            if run.dead or (index + 1 < len(runs) and run.live + runs[index + 1].live <= RUN_LIMIT):
                return index
        return None

    def _rebuild(self, index: int) -> None:
        live = self._live_positions(self._runs[index])
        if live:
            self._runs[index] = self._run_of(live)
        else:
            del self._runs[index]

    def _live_positions(self, run: _Run) -> list[int]:
        clauses = self._clauses
        return [p for p in run.positions.tolist() if p in clauses]

    def _run_of(self, positions: list[int]) -> _Run:
        """A run of the clauses at ``positions``, which must all be live."""
        clauses = self._clauses
        try:
            chosen = [clauses[p] for p in positions]
        except KeyError:
            raise AssertionError("a run was asked to hold a removed clause") from None
        return _Run(positions, chosen)
