"""What a subscription's filter asks of each attribute, in the form the indexes can use.

The engine does not evaluate filters statement by statement. It reduces each subscription's
filter to one :class:`AttributeConstraint` per top-level attribute: must the attribute be
absent, or present, and if present, within which numeric interval, or satisfying which one
string test. Whatever a constraint cannot say exactly (a ``!=``, a dotted path, metadata, a
second string test on the same attribute) makes the subscription *residual*: the index still
narrows it down safely (it never drops a subscription that could match), and the reference
semantics decide the rest.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import NamedTuple

from broker.query.ast import Filter, Kind, Op, Statement

__all__ = ["AttributeConstraint", "FilterPlan", "Interval", "Presence", "StringTest", "plan"]

_INF = math.inf


class Presence(enum.Enum):
    """What the constraint needs of the attribute's presence."""

    ANY = "any"  # present or absent (only residual statements; not indexed)
    ABSENT = "absent"
    PRESENT = "present"


class Interval(NamedTuple):
    """Numbers ``x`` with ``low < x`` (or ``<=`` unless ``low_open``) and likewise ``high``."""

    low: float = -_INF
    low_open: bool = False
    high: float = _INF
    high_open: bool = False

    def meet(self, other: Interval) -> Interval:
        """The intersection of two intervals."""
        if other.low > self.low or (other.low == self.low and other.low_open):
            low, low_open = other.low, other.low_open
        else:
            low, low_open = self.low, self.low_open
        if other.high < self.high or (other.high == self.high and other.high_open):
            high, high_open = other.high, other.high_open
        else:
            high, high_open = self.high, self.high_open
        return Interval(low, low_open, high, high_open)


@dataclass(frozen=True, slots=True)
class StringTest:
    """One test on a string value: equality to any of ``values``, prefix, suffix, contains,
    or a regex search (``op`` is the statement's operator)."""

    op: Op
    values: tuple[str, ...]


@dataclass(slots=True)
class AttributeConstraint:
    """All that a subscription asks of one attribute, as far as the indexes go."""

    presence: Presence = Presence.PRESENT
    interval: Interval | None = None
    string: StringTest | None = None


@dataclass(slots=True)
class FilterPlan:
    """A filter split into indexable constraints and a residual flag."""

    constraints: dict[str, AttributeConstraint] = field(default_factory=dict)
    residual: bool = False


_EQ, _LT, _LE, _GT, _GE = Op.EQ, Op.LT, Op.LE, Op.GT, Op.GE
_NUMERIC = (Kind.NUMBER, Kind.DATE)


def _interval_of(statement: Statement) -> Interval | None:
    op = statement.op
    bounds = statement.range
    if bounds is not None:
        low, high = bounds.low, bounds.high
        if op is _EQ and low.kind in _NUMERIC and high.kind in _NUMERIC:
            return Interval(low.value, False, high.value, False)  # type: ignore[arg-type]
        return None
    values = statement.values
    if len(values) != 1 or values[0].kind not in _NUMERIC:
        return None
    x: float = values[0].value  # type: ignore[assignment]
    if op is _EQ:
        return Interval(x, False, x, False)
    if op is _LT:
        return Interval(-_INF, False, x, True)
    if op is _LE:
        return Interval(-_INF, False, x, False)
    if op is _GT:
        return Interval(x, True, _INF, False)
    if op is _GE:
        return Interval(x, False, _INF, False)
    return None


def _string_test_of(statement: Statement) -> StringTest | None:
    op = statement.op
    if op is Op.MATCH and statement.pattern is not None:
        return StringTest(op, (statement.pattern,))
    if statement.range is not None or not statement.values:
        return None
    if any(v.kind is not Kind.STRING for v in statement.values):
        return None
    if op is Op.EQ or (op in (Op.PREFIX, Op.SUFFIX, Op.CONTAINS) and len(statement.values) == 1):
        return StringTest(op, tuple(str(v.value) for v in statement.values))
    return None


def plan(filter_: Filter) -> FilterPlan:
    """Reduce a filter to per-attribute constraints (see the module docstring)."""
    result = FilterPlan()
    absent: set[str] = set()
    for statement in filter_.q:
        name = statement.path[0]
        if statement.op is Op.NOT_EXISTS:
            # '!a' is exact; '!a.b' also passes with 'a' absent, so it constrains nothing
            if len(statement.path) == 1:
                absent.add(name)
            else:
                result.residual = True
            continue
        if len(statement.path) > 1:
            result.residual = True
            result.constraints.setdefault(name, AttributeConstraint())
            continue
        constraint = result.constraints.get(name)
        if constraint is None:
            constraint = result.constraints[name] = AttributeConstraint()
        if statement.op is Op.EXISTS:
            continue
        interval = _interval_of(statement)
        if interval is not None:
            constraint.interval = (
                interval if constraint.interval is None else constraint.interval.meet(interval)
            )
            continue
        test = _string_test_of(statement)
        if test is not None and constraint.string is None:
            constraint.string = test
            continue
        result.residual = True
    for statement in filter_.mq:
        name = statement.path[0]
        result.residual = True
        if statement.op is not Op.NOT_EXISTS:  # a metadata test needs its attribute
            result.constraints.setdefault(name, AttributeConstraint())
    for name in absent:
        if name in result.constraints:
            # '!a' together with a test on 'a': leave it to the residual check
            result.constraints.pop(name)
            result.residual = True
        else:
            result.constraints[name] = AttributeConstraint(Presence.ABSENT)
    for constraint in result.constraints.values():
        if constraint.interval is not None and constraint.string is not None:
            constraint.string = None  # a scalar cannot be both; arrays go residual anyway
            result.residual = True
    return result
