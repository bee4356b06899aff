"""Subscriptions and context updates that match each other often, for property tests.

Everything is drawn from small shared vocabularies (tenants, service paths, entity ids and
types, attribute names, values and the literals of ``q`` / ``mq``), so that a random
subscription and a random update of the same tenant match in about a quarter of the pairs,
and the corners (scope boundaries, ``-0.0``, dates written two ways, strings that look like
numbers, dotted and quoted paths, ranges written backwards, expiry exactly at ``NOW``) come
up in every run.

The generators are written once against :class:`Source`, a tiny interface over a source of
randomness, and used two ways:

- as Hypothesis strategies (``subscriptions()``, ``subscription_sets()``, ``updates()``,
  ``update_lists()``, ``variants()``), which shrink towards the first entry of each
  vocabulary, so failures shrink to simple subscriptions;
- with a seeded :class:`random.Random` (``RandomSource``), for large fixed workloads.

Filters are generated as q / mq *text* in the syntax of :mod:`broker.query.ast`, so the
parser is exercised too. Import from tests as ``from strategies import ...`` (pytest puts
``tests/`` on ``sys.path`` because of ``tests/conftest.py``).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from hypothesis import settings
from hypothesis import strategies as st

from broker.model.attribute import Attribute, Metadata, default_type, parse_iso8601
from broker.model.subscription import EntitySelector, Status, Subscription
from broker.model.update import ContextUpdate

__all__ = [
    "ATTRIBUTE_NAMES",
    "ENTITY_IDS",
    "ENTITY_TYPES",
    "ID_PATTERNS",
    "MATCH_STATS",
    "NOW",
    "SCOPES",
    "SERVICE_PATHS",
    "TENANTS",
    "TYPE_PATTERNS",
    "RandomSource",
    "Source",
    "draw_attribute",
    "draw_mq",
    "draw_q",
    "draw_selector",
    "draw_subscription",
    "draw_update",
    "draw_variant",
    "examples",
    "record_match_stats",
    "subscription_sets",
    "subscriptions",
    "update_lists",
    "updates",
    "variants",
]

T = TypeVar("T")

NOW = 1_700_000_000.0  # the fixed clock every matching test passes as ``now``

# -- vocabularies -----------------------------------------------------------------------------
# Each is a tuple with entries repeated by weight: random picks favour the common entries and
# Hypothesis shrinks towards the first. The weights are tuned so that 20-35% of the
# (subscription, update) pairs of one tenant match (tests/conftest.py reports the rates).


def _weights(weights: Mapping[T, int] | Sequence[tuple[T, int]]) -> tuple[T, ...]:
    """The entries repeated by weight, in order."""
    pairs = weights.items() if isinstance(weights, Mapping) else weights
    return tuple(entry for entry, weight in pairs for _ in range(weight))


TENANTS = _weights({"": 6, "madrid": 3, "x_1": 1})
SERVICE_PATHS = _weights({"/": 4, "/a": 3, "/a/b": 2, "/a2": 1, "/b": 1})
SCOPES = _weights({"/#": 30, "/a/#": 3, "/": 3, "/a": 2, "/a/b": 1, "/a/b/#": 1, "/b": 1, "/a2": 1})
ENTITY_IDS = _weights({"Room1": 6, "Room2": 2, "urn:a:1": 2, "r": 1, "Room10": 1})
SELECTOR_IDS = (*ENTITY_IDS, "Room3")  # no update has Room3
ENTITY_TYPES = _weights({"Room": 5, "Thing": 3, "T2": 1})
ID_PATTERNS = _weights(
    {
        ".*": 30,
        "^Room": 3,
        "Room[12]$": 2,
        "1": 2,
        "urn": 1,
        "^r$": 1,
        "oo": 1,
        "^.*$": 1,
        "^$": 1,  # never matches: ids are never empty
    }
)
TYPE_PATTERNS = _weights({".*": 3, "Room|Thing": 3, "^T": 1, "oo": 2, "2$": 1, "^$": 1})

# How likely an update is to carry each attribute ('a.b' is one name: quoted in q).
ATTRIBUTE_PRESENCE = {
    "temp": 0.9,
    "name": 0.75,
    "date": 0.6,
    "pressure": 0.4,
    "flag": 0.35,
    "loc": 0.4,
    "a.b": 0.35,
    "list": 0.35,
}
ATTRIBUTE_NAMES = tuple(ATTRIBUTE_PRESENCE)
CONDITION_NAMES = _weights({"temp": 4, "name": 2} | {n: 1 for n in ATTRIBUTE_NAMES[2:]})
CONDITION_NAMES += ("other",)  # no update has it

# -- attribute values ------------------------------------------------------------------------

NUMBER_VALUES: tuple[Any, ...] = _weights(
    [
        (20, 4),
        (21, 2),
        (20.5, 2),
        (19.5, 2),
        (20.0, 1),
        (0, 1),
        (-0.0, 1),
        (1, 1),
        (-5, 1),
        (100, 1),
        (1e9, 1),
        (1e15, 1),
        (10**20, 1),
        (1577836800, 1),  # the epoch of 2020-01-01T00:00:00Z: equal to a date literal
        (1577836800.5, 1),
    ]
)
STRING_VALUES = _weights(
    {
        "Plaza": 8,
        "abc": 2,
        "Pla": 1,
        "za": 1,
        "a": 1,
        "": 1,
        "C": 1,
        "20": 1,  # strings that read as a number, a date, a bool, a null and a path
        "20.5": 1,
        "2020-01-01T00:00:00Z": 1,
        "true": 1,
        "null": 1,
        "a.b": 1,
        "x_y": 1,
        "PLAZA": 1,
    }
)
BOOL_VALUES = _weights([(True, 3), (False, 2), (None, 1)])
DATE_VALUES = _weights(
    {
        "2020-06-01T12:00:00Z": 4,
        "2020-01-01T00:00:00Z": 2,
        "2020-01-01T01:00:00+01:00": 1,  # the same instant as the one above
        "2020-01-01": 1,
        "2019-12-31T23:59:59Z": 1,
        "2021-06-15T12:00:00Z": 1,
    }
)
DATE_TYPES = _weights({"DateTime": 4, "ISO8601": 1, "Text": 1})
LIST_VALUES: tuple[Any, ...] = _weights(
    [
        ([20, "abc"], 3),
        ([], 1),
        (["Plaza", 20.5], 1),
        ([True, None], 1),
        ([1, 21, 100], 1),
        ([[20]], 1),  # nested: only one level is searched
        ([{"x": 1}], 1),
        (["20", "C"], 1),
    ]
)
DICT_VALUES: tuple[Any, ...] = _weights(
    [
        ({"x": {"y": 20}}, 3),
        ({"x": {"y": 3}}, 1),
        ({"x": 1}, 1),
        ({"x": {"y": "Pla"}}, 1),
        ({"c": "abc"}, 1),
        ({"c": 20, "x": {"y": -0.0}}, 1),
        ({}, 1),
        ({"x": [3, 20]}, 1),
        ({"x": {"y": None}}, 1),
    ]
)
ODD_VALUES: tuple[Any, ...] = (None, True, 0, "abc", [20], {"x": {"y": 3}}, "Plaza")

# -- filter literals, as written in q / mq ---------------------------------------------------

NUMBER_LITERALS = _weights(
    {
        "20": 6,
        "21": 2,
        "20.5": 2,
        "0": 1,
        "-5": 1,
        "100": 1,
        "1e9": 1,
        "-0": 1,
        "20.0": 1,
        "1577836800": 1,
    }
)
DATE_LITERALS = _weights(
    {
        "2020-01-01T00:00:00Z": 3,
        "2020-06-01T12:00:00Z": 3,
        "2021-06-15T12:00:00Z": 1,
        "2020-01-01": 1,
        "2019-12-31T23:59:59Z": 1,
    }
)
STRING_LITERALS = _weights(
    {"Plaza": 4, "Pla": 2, "abc": 2, "a": 1, "za": 1, "C": 1, "x_y": 1, "PLAZA": 1}
)
QUOTED_LITERALS = ("'20'", "'true'", "'Plaza'", "'null'", "'2020-01-01T00:00:00Z'", "'a.b'")
BOOL_LITERALS = ("true", "true", "false")
NULL_LITERALS = ("null",)
REGEXES = _weights(
    {"^Pla": 3, "za$": 2, "a": 2, "[0-9]": 1, "^$": 1, ".*": 1, "A|b": 1, "P.a": 1, "^[a-z]+$": 1}
)
AFFIXES = _weights({"Pla": 3, "za": 2, "a": 2, "2": 1, "20": 1, "2020": 1, "PL": 1})

_ALL_LITERALS = (
    NUMBER_LITERALS
    + DATE_LITERALS
    + STRING_LITERALS
    + QUOTED_LITERALS
    + BOOL_LITERALS
    + NULL_LITERALS
)
_ORDERED_LITERALS = NUMBER_LITERALS + DATE_LITERALS + STRING_LITERALS + QUOTED_LITERALS

# The literals a statement about each attribute usually compares against (the rest of the
# time it takes any literal, to hit type mismatches).
_HOME_LITERALS: dict[str, tuple[str, ...]] = {
    "temp": NUMBER_LITERALS,
    "pressure": NUMBER_LITERALS,
    "name": STRING_LITERALS + QUOTED_LITERALS,
    "flag": BOOL_LITERALS + NULL_LITERALS,
    "loc": NUMBER_LITERALS,
    "date": DATE_LITERALS,
    "a.b": STRING_LITERALS + NUMBER_LITERALS,
    "list": NUMBER_LITERALS + STRING_LITERALS,
}

Q_PATHS: tuple[tuple[str, ...], ...] = _weights(
    {
        ("temp",): 10,
        ("name",): 6,
        ("date",): 4,
        ("pressure",): 2,
        ("flag",): 2,
        ("list",): 2,
        ("loc",): 1,
        ("loc", "x"): 1,
        ("loc", "x", "y"): 2,
        ("a.b",): 2,
        ("a.b", "c"): 1,
        ("temp", "x"): 1,  # a path into a number: never there
        ("missing",): 1,
    }
)
# mq paths: (attribute, metadata name, *path into the metadata value)
MQ_PATHS: tuple[tuple[str, ...], ...] = _weights(
    {
        ("temp", "unit"): 8,
        ("temp", "accuracy"): 3,
        ("date", "ts"): 2,
        ("name", "unit"): 1,
        ("a.b", "unit"): 1,
        ("temp", "info", "x"): 1,
        ("temp", "ts"): 1,
    }
)
_METADATA_LITERALS: dict[str, tuple[str, ...]] = {
    "unit": ("C", "C", "F", "'20'", "20"),
    "accuracy": ("0.5", "0.5", "1", "20", "0"),
    "ts": DATE_LITERALS,
    "info": ("1", "C"),
}

# The operators used on each kind of path (a quarter of statements take any operator).
_NUMERIC_OPERATORS = _weights(
    {"exists": 3, "==": 4, ":": 1, "!=": 2, "<": 2, "<=": 1, ">": 2, ">=": 1}
)
_STRING_OPERATORS = _weights(
    {"exists": 2, "==": 3, "!=": 1, "~=": 3, "=^": 2, "=$": 1, "=*": 2, "<": 1, ">=": 1}
)
_BOOL_OPERATORS = _weights({"exists": 2, "==": 3, ":": 1, "!=": 1, "not_exists": 1})
Q_OPERATORS = _weights(
    {
        "exists": 4,
        "not_exists": 1,
        "==": 4,
        ":": 1,
        "!=": 2,
        "<": 2,
        "<=": 1,
        ">": 2,
        ">=": 1,
        "~=": 2,
        "=^": 1,
        "=$": 1,
        "=*": 1,
    }
)
_PATH_OPERATORS: dict[tuple[str, ...], tuple[str, ...]] = {
    ("temp",): _NUMERIC_OPERATORS,
    ("pressure",): _NUMERIC_OPERATORS,
    ("date",): _NUMERIC_OPERATORS,
    ("loc", "x", "y"): _NUMERIC_OPERATORS,
    ("name",): _STRING_OPERATORS,
    ("a.b",): _STRING_OPERATORS,
    ("flag",): _BOOL_OPERATORS,
}
MQ_OPERATORS = _weights({"exists": 5, "not_exists": 1, "==": 3, "!=": 1, "<": 1, ">": 1, ">=": 1})
_EQ_SHAPES = _weights({"single": 5, "list": 3, "range": 3})
_Q_COUNTS = _weights({0: 8, 1: 5, 2: 2, 3: 1, 4: 1})
_MQ_COUNTS = _weights({0: 9, 1: 2, 2: 1})


# -- the source of randomness ----------------------------------------------------------------


class Source(Protocol):
    """Where the generators get their choices from."""

    def pick(self, options: Sequence[T]) -> T:
        """One of ``options``."""
        ...

    def integer(self, low: int, high: int) -> int:
        """An integer in ``[low, high]``."""
        ...

    def chance(self, probability: float) -> bool:
        """True with the given probability (shrinks to False)."""
        ...

    def real(self, low: float, high: float) -> float:
        """Any float in ``[low, high]``."""
        ...


class RandomSource:
    """A :class:`Source` over a seeded :class:`random.Random`."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def pick(self, options: Sequence[T]) -> T:
        return self._rng.choice(options)

    def integer(self, low: int, high: int) -> int:
        return self._rng.randint(low, high)

    def chance(self, probability: float) -> bool:
        return self._rng.random() < probability

    def real(self, low: float, high: float) -> float:
        return self._rng.uniform(low, high)


@functools.cache
def _integers(low: int, high: int) -> st.SearchStrategy[int]:
    # Strategies are cached: building one per draw costs more than the draw itself.
    return st.integers(low, high)


@functools.cache
def _floats(low: float, high: float) -> st.SearchStrategy[float]:
    return st.floats(low, high, allow_nan=False)


class _DrawSource:
    """A :class:`Source` over Hypothesis' ``draw``: every choice shrinks towards the first."""

    def __init__(self, draw: st.DrawFn) -> None:
        self._draw = draw

    def pick(self, options: Sequence[T]) -> T:
        return options[self._draw(_integers(0, len(options) - 1))]

    def integer(self, low: int, high: int) -> int:
        return self._draw(_integers(low, high))

    def chance(self, probability: float) -> bool:
        return self._draw(_integers(0, 999)) >= round((1 - probability) * 1000)

    def real(self, low: float, high: float) -> float:
        return self._draw(_floats(low, high))


# -- updates ---------------------------------------------------------------------------------


def draw_number(source: Source) -> Any:
    """A number, usually from the vocabulary (thresholds and their neighbours)."""
    if source.chance(0.08):
        return source.real(-200.0, 200.0)
    return source.pick(NUMBER_VALUES)


def draw_value(source: Source, name: str) -> tuple[str | None, Any]:
    """An attribute's ``(type, value)``: usually of the attribute's home kind, else any.

    A None type means the type Orion infers from the value.
    """
    home = name if source.chance(0.85) else source.pick((*ATTRIBUTE_NAMES, "odd"))
    if home in ("temp", "pressure"):
        return None, draw_number(source)
    if home == "name":
        return None, source.pick(STRING_VALUES)
    if home == "flag":
        return None, source.pick(BOOL_VALUES)
    if home == "date":
        if source.chance(0.05):
            return "DateTime", None
        return source.pick(DATE_TYPES), source.pick(DATE_VALUES)
    if home == "list":
        return None, source.pick(LIST_VALUES)
    if home == "loc":
        return None, source.pick(DICT_VALUES)
    if home == "a.b":
        return None, source.pick(STRING_VALUES[:8] + DICT_VALUES[4:8])
    return source.pick((None, "Custom")), source.pick(ODD_VALUES)


def draw_metadata(source: Source) -> dict[str, Metadata]:
    """Zero to two metadata items, from a vocabulary that the mq literals overlap."""
    items: dict[str, Metadata] = {}
    for _ in range(source.pick((1, 1, 2, 2, 0))):
        name = source.pick(("unit",) * 4 + ("accuracy", "accuracy", "ts", "info"))
        if name == "unit":
            items[name] = Metadata("Text", source.pick(("C", "C", "C", "F", "20")))
        elif name == "accuracy":
            items[name] = Metadata("Number", source.pick((0.5, 0.5, 1, 20, -0.0)))
        elif name == "ts":
            items[name] = Metadata(source.pick(DATE_TYPES), source.pick(DATE_VALUES))
        else:
            items[name] = Metadata("StructuredValue", {"x": source.pick((1, "C", 0.5))})
    return items


def draw_attribute(source: Source, name: str) -> Attribute:
    """An attribute for ``name``, with a value and perhaps metadata."""
    type_, value = draw_value(source, name)
    return Attribute(type_ or default_type(value), value, draw_metadata(source))


def draw_update(source: Source) -> ContextUpdate:
    """A context update drawn from the shared vocabularies."""
    attributes: dict[str, Attribute] = {}
    if not source.chance(0.03):  # now and then an update with no attributes at all
        for name, presence in ATTRIBUTE_PRESENCE.items():
            if source.chance(presence):
                attributes[name] = draw_attribute(source, name)
    return ContextUpdate(
        source.pick(ENTITY_IDS),
        attributes,
        entity_type=source.pick(ENTITY_TYPES),
        tenant=source.pick(TENANTS),
        service_path=source.pick(SERVICE_PATHS),
    )


# -- filters ---------------------------------------------------------------------------------


def render_path(path: Sequence[str]) -> str:
    """A path as written in q / mq: elements holding a dot are single-quoted."""
    return ".".join(f"'{p}'" if "." in p else p for p in path)


def _literal(source: Source, home: Sequence[str], pool: Sequence[str]) -> str:
    return source.pick(home) if source.chance(0.85) else source.pick(pool)


def _kind_pool(source: Source, home: Sequence[str]) -> tuple[str, ...]:
    """Literals of one kind (a list or a range takes one kind): usually the home kind."""
    pools = (NUMBER_LITERALS, STRING_LITERALS + QUOTED_LITERALS, DATE_LITERALS)
    if source.chance(0.75):
        for pool in pools:
            if home[0] in pool:
                return pool
    return source.pick(pools)


def _right_side(source: Source, op: str, home: Sequence[str]) -> str:
    if op in ("==", ":", "!="):
        shape = source.pick(_EQ_SHAPES)
        if shape == "single":
            return _literal(source, home, _ALL_LITERALS)
        pool = _kind_pool(source, home)
        if shape == "list":
            return ",".join(source.pick(pool) for _ in range(source.integer(2, 3)))
        ends = [source.pick(pool), source.pick(pool)]
        if source.chance(0.8):  # usually low..high, sometimes backwards
            ends.sort(key=_order_key)
        return "..".join(ends)
    if op in ("<", "<=", ">", ">="):
        ordered = tuple(h for h in home if h in _ORDERED_LITERALS) or _ORDERED_LITERALS
        return _literal(source, ordered, _ORDERED_LITERALS)
    if op == "~=":
        return source.pick(REGEXES)
    return source.pick(AFFIXES)  # =^ =$ =*


def _order_key(text: str) -> tuple[float, str]:
    """Sorts literals of one kind: numbers and dates by value, strings by text."""
    if text.startswith("'"):
        return 0.0, text.strip("'")
    try:
        return float(text), ""
    except ValueError:
        epoch = parse_iso8601(text)
        return (epoch, "") if epoch is not None else (0.0, text)


def _statement(
    source: Source, path: tuple[str, ...], operators: Sequence[str], home: Sequence[str]
) -> str:
    if source.chance(0.75):
        operators = _PATH_OPERATORS.get(path, operators)
    op = source.pick(operators)
    written = render_path(path)
    if op == "exists":
        return written
    if op == "not_exists":
        return "!" + written
    return written + op + _right_side(source, op, home)


def draw_q(source: Source) -> str:
    """A q filter: zero to four statements (existence, comparisons, regex, affixes)."""
    statements = []
    for _ in range(source.pick(_Q_COUNTS)):
        path = source.pick(Q_PATHS)
        home = _HOME_LITERALS.get(path[0], _ALL_LITERALS)
        statements.append(_statement(source, path, Q_OPERATORS, home))
    return _join(source, statements)


def draw_mq(source: Source) -> str:
    """An mq filter: zero to two statements on metadata."""
    statements = []
    for _ in range(source.pick(_MQ_COUNTS)):
        path = source.pick(MQ_PATHS)
        home = _METADATA_LITERALS[path[1]]
        statements.append(_statement(source, path, MQ_OPERATORS, home))
    return _join(source, statements)


def _join(source: Source, statements: list[str]) -> str:
    text = ";".join(statements)
    if text and source.chance(0.1):
        text += ";"  # a trailing ';' is allowed
    return text


# -- subscriptions ---------------------------------------------------------------------------


def draw_selector(source: Source) -> EntitySelector:
    """An entity selector: an id or an id pattern, and perhaps a type or a type pattern."""
    if source.chance(0.15):
        id_, id_pattern = source.pick(SELECTOR_IDS), None
    else:
        id_, id_pattern = None, source.pick(ID_PATTERNS)
    kind = source.pick(("any",) * 8 + ("type", "type", "pattern"))
    type_ = source.pick(ENTITY_TYPES) if kind == "type" else None
    type_pattern = source.pick(TYPE_PATTERNS) if kind == "pattern" else None
    return EntitySelector(id=id_, id_pattern=id_pattern, type=type_, type_pattern=type_pattern)


def draw_selectors(source: Source) -> tuple[EntitySelector, ...]:
    """One to three selectors (any of them may match)."""
    return tuple(draw_selector(source) for _ in range(source.pick((1, 1, 1, 1, 1, 2, 2, 3))))


def draw_condition_attrs(source: Source) -> tuple[str, ...]:
    """Usually none (any attribute); otherwise one to three names."""
    if not source.chance(0.25):
        return ()
    names = (source.pick(CONDITION_NAMES) for _ in range(source.integer(1, 3)))
    return tuple(dict.fromkeys(names))


def draw_status(source: Source) -> Status:
    """Mostly active."""
    return source.pick((Status.ACTIVE,) * 14 + (Status.ONESHOT, Status.INACTIVE))


def draw_expires(source: Source) -> float | None:
    """Usually permanent, else around :data:`NOW` (exactly ``NOW`` has expired)."""
    if not source.chance(0.08):
        return None
    return NOW + source.pick((3600.0, 1.0, 0.0, -1.0, -3600.0))


def draw_subscription(source: Source, subscription_id: str) -> Subscription:
    """A subscription drawn from the shared vocabularies."""
    return Subscription(
        id=subscription_id,
        entities=draw_selectors(source),
        tenant=source.pick(TENANTS),
        service_path=source.pick(SCOPES),
        condition_attrs=draw_condition_attrs(source),
        q=draw_q(source),
        mq=draw_mq(source),
        expires=draw_expires(source),
        status=draw_status(source),
    )


def draw_variant(source: Source, subscription: Subscription) -> Subscription:
    """The subscription with one to three of its matching-relevant fields drawn again."""
    redraw: dict[str, Callable[[], object]] = {
        "q": lambda: draw_q(source),
        "service_path": lambda: source.pick(SCOPES),
        "entities": lambda: draw_selectors(source),
        "status": lambda: draw_status(source),
        "condition_attrs": lambda: draw_condition_attrs(source),
        "mq": lambda: draw_mq(source),
        "expires": lambda: draw_expires(source),
        "tenant": lambda: source.pick(TENANTS),
    }
    fields = tuple(redraw)
    changes = {}
    for _ in range(source.integer(1, 3)):
        field = source.pick(fields)
        changes[field] = redraw[field]()
    return subscription.replace(**changes)


# -- Hypothesis strategies -------------------------------------------------------------------


@st.composite
def subscriptions(draw: st.DrawFn, ids: Sequence[str] = ("s0",)) -> Subscription:
    """One subscription, its id one of ``ids``."""
    source = _DrawSource(draw)
    return draw_subscription(source, source.pick(ids))


@st.composite
def subscription_sets(draw: st.DrawFn, min_size: int = 1, max_size: int = 60) -> list[Subscription]:
    """Subscriptions with unique ids ``s0``, ``s1``, ..."""
    source = _DrawSource(draw)
    count = draw(st.integers(min_size, max_size))
    return [draw_subscription(source, f"s{i}") for i in range(count)]


@st.composite
def updates(draw: st.DrawFn) -> ContextUpdate:
    """One context update."""
    return draw_update(_DrawSource(draw))


def update_lists(min_size: int = 1, max_size: int = 20) -> st.SearchStrategy[list[ContextUpdate]]:
    """A list of context updates."""
    return st.lists(updates(), min_size=min_size, max_size=max_size)


@st.composite
def variants(draw: st.DrawFn, subscription: Subscription) -> Subscription:
    """``subscription`` with some fields drawn again (same id)."""
    return draw_variant(_DrawSource(draw), subscription)


# -- test budget and statistics --------------------------------------------------------------


def examples(count: int) -> int:
    """``count`` scaled by the loaded Hypothesis profile (the ``ci`` profile keeps it)."""
    return max(5, count * settings().max_examples // 100)


# test name -> [updates, updates with a match, same-tenant pairs, matching pairs]
MATCH_STATS: dict[str, list[int]] = {}


def record_match_stats(
    test: str,
    subscriptions: Sequence[Subscription],
    updates: Sequence[ContextUpdate],
    matches: Sequence[set[str]],
) -> tuple[float, float]:
    """Add to ``test``'s statistics; return this case's (non-empty update rate, pair rate)."""
    per_tenant: dict[str, int] = {}
    for subscription in subscriptions:
        per_tenant[subscription.tenant] = per_tenant.get(subscription.tenant, 0) + 1
    pairs = sum(per_tenant.get(update.tenant, 0) for update in updates)
    matched = sum(len(found) for found in matches)
    non_empty = sum(1 for found in matches if found)
    totals = MATCH_STATS.setdefault(test, [0, 0, 0, 0])
    for i, amount in enumerate((len(updates), non_empty, pairs, matched)):
        totals[i] += amount
    return non_empty / max(1, len(updates)), matched / max(1, pairs)
