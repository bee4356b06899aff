"""Evaluate a parsed filter against an entity's attributes: the reference semantics.

A statement looks up its path: the attribute's :attr:`~broker.model.attribute.Attribute.match_value`
(for ``mq``, the metadata's), then one key per further path element, into objects only. A
missing attribute, metadata, key, or a non-object on the way, makes the path *missing*:
``!path`` holds and every other statement fails.

Otherwise the value is compared with the literal only when their types agree: NUMBER and
DATE literals with numbers (``bool`` is not a number here, though Python says it is an
``int``), STRING with strings, BOOL with booleans; a mismatch fails, ``!=`` included. NULL is
the one literal every value is comparable with: ``==null`` holds for null, ``!=null`` for
any present non-null value.

An array value is a set of candidates, one level deep: ``==``, the orderings, ranges, ``~=``
and the string operators hold when some element satisfies them; ``!=`` holds when no element
equals a listed value (or falls in the range), the array being present. See
docs/query-language.md for how this follows Orion.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from broker.query.ast import Filter, Kind, Literal, Op, Statement
from broker.query.regex import compile_pattern

__all__ = ["Attribute", "filter_matches", "statement_matches"]


class _Valued(Protocol):
    @property
    def match_value(self) -> Any: ...


class Attribute(Protocol):
    """What a filter reads of an attribute (broker.model.attribute.Attribute is one): the
    value it compares and the metadata (each with its value) ``mq`` reads."""

    @property
    def match_value(self) -> Any: ...

    @property
    def metadata(self) -> Mapping[str, _Valued]: ...


_MISSING: Any = object()


def filter_matches(f: Filter, attributes: Mapping[str, Attribute]) -> bool:
    """Tell whether every ``q`` and ``mq`` statement of ``f`` holds for ``attributes``."""
    return all(statement_matches(s, attributes) for s in f.q) and all(
        statement_matches(s, attributes, metadata=True) for s in f.mq
    )


def statement_matches(
    stmt: Statement, attributes: Mapping[str, Attribute], *, metadata: bool = False
) -> bool:
    """Tell whether one statement (of ``q``, or with ``metadata`` of ``mq``) holds."""
    value = _lookup(stmt.path, attributes, metadata)
    op = stmt.op
    if op is Op.NOT_EXISTS:
        return value is _MISSING
    if value is _MISSING:
        return False
    if op is Op.EXISTS:
        return True
    if isinstance(value, list):
        if op is Op.NE:
            return not any(_equals(stmt, item) for item in value)
        return any(_holds(stmt, item) for item in value)
    if op is Op.NE:
        return _comparable(stmt, value) and not _equals(stmt, value)
    return _holds(stmt, value)


def _lookup(path: tuple[str, ...], attributes: Mapping[str, Attribute], metadata: bool) -> Any:
    """The value at ``path``, or _MISSING."""
    attribute = attributes.get(path[0])
    if attribute is None:
        return _MISSING
    if metadata:
        item = attribute.metadata.get(path[1])
        if item is None:
            return _MISSING
        value, rest = item.match_value, path[2:]
    else:
        value, rest = attribute.match_value, path[1:]
    for key in rest:
        if not isinstance(value, Mapping):
            return _MISSING
        value = value.get(key, _MISSING)
        if value is _MISSING:
            return _MISSING
    return value


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _same_type(literal: Literal, value: Any) -> bool:
    """Whether ``value`` can be compared with ``literal`` (NULL compares with anything)."""
    kind = literal.kind
    if kind.numeric:
        return _is_number(value)
    if kind is Kind.STRING:
        return isinstance(value, str)
    if kind is Kind.BOOL:
        return isinstance(value, bool)
    return True


def _literal_equals(literal: Literal, value: Any) -> bool:
    if literal.kind is Kind.NULL:
        return value is None
    return _same_type(literal, value) and value == literal.value


def _comparable(stmt: Statement, value: Any) -> bool:
    """Whether ``value`` has the type of the statement's right-hand side."""
    if stmt.range is not None:
        return _same_type(stmt.range.low, value)
    return any(_same_type(literal, value) for literal in stmt.values)


def _equals(stmt: Statement, value: Any) -> bool:
    """``==``: equal to one of the values, or inside the (inclusive) range."""
    if stmt.range is not None:
        low, high = stmt.range.low, stmt.range.high
        if not (_same_type(low, value) and _same_type(high, value)):
            return False
        return bool(low.value <= value <= high.value)
    return any(_literal_equals(literal, value) for literal in stmt.values)


def _holds(stmt: Statement, value: Any) -> bool:
    """Every binary operator but ``!=`` on one (non-array) value."""
    op = stmt.op
    if op is Op.EQ:
        return _equals(stmt, value)
    if op is Op.MATCH:
        return isinstance(value, str) and compile_pattern(stmt.pattern or "")(value) is not None
    literal = stmt.values[0]
    if not _same_type(literal, value) or literal.kind is Kind.NULL:
        return False
    bound: Any = literal.value
    if op is Op.LT:
        return bool(value < bound)
    if op is Op.LE:
        return bool(value <= bound)
    if op is Op.GT:
        return bool(value > bound)
    if op is Op.GE:
        return bool(value >= bound)
    if op is Op.PREFIX:
        return isinstance(value, str) and value.startswith(bound)
    if op is Op.SUFFIX:
        return isinstance(value, str) and value.endswith(bound)
    if op is Op.CONTAINS:
        return isinstance(value, str) and bound in value
    raise AssertionError(f"unhandled operator {op}")  # EXISTS/NOT_EXISTS/NE never get here
