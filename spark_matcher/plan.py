"""The subscriptions as tables: what the Spark job joins updates against (no Spark here).

Matching is the counting algorithm turned into one equi-join. Each *clause* (one entity
selector of a subscription) picks a *driver*: the most selective thing it asks for that can
be a join key. Every update is exploded into the keys it carries, the keys are joined with
the clauses' keys, and each candidate (update, clause) pair is then checked exactly against
the rest of the clause, column by column. Drivers, most selective first:

=========  ======================================  ==========================================
driver     clause key                              update keys
=========  ======================================  ==========================================
``i``      the exact entity id                     its entity id
``e``      each value of ``attr=='text'``          each string attribute's value
``p``/``s`` the first / last (up to) 3 characters  the first / last 1-3 characters
           of a prefix / suffix test               of each string attribute
``c``      the first 3 characters of a contains    every 3-character piece of the string
``n``      the blocks of bins covering an interval the bin's block at every level
``t``      the exact entity type                   its entity type
``*``      (the tenant only)                       (every update of the tenant)
=========  ======================================  ==========================================

Numbers are binned by the clauses' own bounds (``splits``), so a bin never straddles a
bound that many clauses share. Bins are grouped in blocks of ``BASE`` per level (a segment
tree of fan-out 4): an interval is cut into at most ``2 * (BASE - 1)`` blocks per level, and
a number carries one key per level (its bin's block), so each pair meets exactly once.
An update whose driving attribute holds an array meets all the clauses that attribute
drives (key ``A``), and those pairs are checked by the reference semantics.

Exactness: the join plus the column checks decide exactly what :mod:`broker.matching.
constraint` decides exactly. What it leaves *residual* (``!=``, dotted paths, metadata, a
second string test, a regex that is not a plain literal, arrays) is flagged ``verify``: the
pair passed every cheaper test and is settled in Python by the reference matcher, the
regex coming last.

Every key starts with the partition (the matcher that owns the subscription under the
matchers' selector), the scope unless it is ``/#`` (an update carries its keys once plain
and once for each other scope that covers its path, so a clause meets only updates inside
its scope) and the tenant, joined by ``SEP``.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from broker.matching.constraint import AttributeConstraint, Interval, Presence, plan
from broker.model.identifiers import DEFAULT_SCOPE
from broker.model.subscription import Status, Subscription
from broker.partition.selector import RendezvousSelector
from broker.query.ast import Op
from broker.query.regex import is_match_all

__all__ = [
    "BASE",
    "MAX_SPLITS",
    "SEP",
    "ClausePlan",
    "MatchPlan",
    "Rest",
    "bucket",
    "build_plan",
    "dyadic_cover",
    "levels",
    "literal_regex",
    "live",
    "partition_selector",
]

SEP = "\x1f"  # never in an identifier (printable ASCII only), so keys cannot collide
MAX_SPLITS = 255  # bounds per attribute: 256 bins, 5 levels
BASE = 4  # bins per block of the next level of a numeric cover
GRAM = 3  # characters in a prefix / suffix / contains key

_METACHARACTERS = frozenset(".[]()*+?{}|\\^$")
_INF = math.inf


def literal_regex(pattern: str) -> tuple[str, str] | None:
    """A regex that is a plain literal, as a string test: ``("p", lit)`` for ``^lit``,
    ``("s", lit)`` for ``lit$``, ``("e", lit)`` for ``^lit$``, ``("c", lit)`` for ``lit``;
    None when the pattern needs a regex engine (RE2's ``^``/``$`` anchor the whole text)."""
    body, start, end = pattern, False, False
    if body.startswith("^"):
        body, start = body[1:], True
    if body.endswith("$") and not body.endswith("\\$"):
        body, end = body[:-1], True
    if not body or not _METACHARACTERS.isdisjoint(body) or not body.isprintable():
        return None
    if start and end:
        return ("e", body)
    if start:
        return ("p", body)
    if end:
        return ("s", body)
    return ("c", body)


def bucket(splits: Sequence[float], value: float) -> int:
    """The bin of ``value``: how many splits are <= it (as Spark's Bucketizer numbers them)."""
    return bisect.bisect_right(splits, value + 0.0)


def dyadic_cover(low: int, high: int, base: int = 4) -> list[tuple[int, int]]:
    """The blocks ``(level, index)`` that cover bins ``low..high`` exactly, at most
    ``2 * (base - 1)`` per level; block ``(l, j)`` holds bins ``j * base**l`` to
    ``(j + 1) * base**l - 1``, so a bin ``i`` lies in block ``i // base**l`` of each level."""
    blocks = []
    level = 0
    while low <= high:
        while low % base and low <= high:
            blocks.append((level, low))
            low += 1
        while (high + 1) % base and low <= high:
            blocks.append((level, high))
            high -= 1
        if low > high:
            break
        low //= base
        high = (high + 1) // base - 1
        level += 1
    return blocks


def levels(splits: int, base: int = 4) -> int:
    """How many levels a cover of bins ``0..splits`` (or any part of it) can use."""
    top = 0
    while base ** (top + 1) <= splits + 1:
        top += 1
    return top + 1


def partition_selector(partitions: int) -> RendezvousSelector:
    """The matchers' selector over ``partitions`` owners named ``p0``, ``p1``, ..."""
    if partitions < 1:
        raise ValueError(f"partitions must be at least 1, got {partitions}")
    return RendezvousSelector(tuple(f"p{i}" for i in range(partitions)))


@dataclass(frozen=True, slots=True)
class Rest:
    """A constraint the join does not drive, checked on the candidate pair.

    ``kind`` is None (presence only), ``"n"`` (``low``..``high`` with open flags) or ``"s"``
    (``op`` one of ``e p s c``, or ``r`` for a regex settled by the verify step)."""

    attr: str
    absent: bool = False
    kind: str | None = None
    low: float = -_INF
    low_open: bool = False
    high: float = _INF
    high_open: bool = False
    op: str | None = None
    values: tuple[str, ...] = ()


@dataclass(slots=True)
class FilterPart:
    """What one filter asks of a clause, given whether the clause's selector names an exact
    entity id or type (that decides the driver): a row of the filter table, shared by every
    clause with the same filter and selector shape.

    ``suffixes`` are the clause keys after the partition and the tenant (for an attribute
    driver; entity drivers make their keys from the selector)."""

    fid: int
    driver: str  # i e p s c n t *
    attr: str | None  # the driving attribute (e p s c n)
    interval: Interval | None  # n
    text: tuple[str, ...]  # e: the values; p s c: the argument
    rest: tuple[Rest, ...]
    verify: bool
    suffixes: list[str] = field(default_factory=list)

    def row(self) -> dict[str, Any]:
        """The filter as a JSON-able row of the filter table."""
        iv = self.interval or Interval()
        driver = self.driver
        return {
            "fid": self.fid,
            "dkind": "n" if driver == "n" else ("s" if self.attr is not None else None),
            "sop": driver if driver in ("e", "p", "s", "c") else None,
            "sarg": self.text[0] if driver in ("p", "s", "c") else None,
            "low": iv.low,
            "low_open": iv.low_open,
            "high": iv.high,
            "high_open": iv.high_open,
            "rest": [
                {
                    "attr": r.attr,
                    "absent": r.absent,
                    "kind": r.kind,
                    "low": r.low,
                    "low_open": r.low_open,
                    "high": r.high,
                    "high_open": r.high_open,
                    "op": r.op,
                    "vals": list(r.values),
                }
                for r in self.rest
            ],
        }


@dataclass(slots=True)
class ClausePlan:
    """One clause as a row of the clause table (see the module docstring for the driver)."""

    clause: int
    subscription: str
    part: int
    tenant: str
    scope: str
    eid: str | None
    etype: str | None
    id_op: str | None  # e p s c, r (regex: verify), None (any)
    id_arg: str | None
    type_op: str | None
    type_arg: str | None
    cond: tuple[str, ...]
    filter: FilterPart
    verify: bool

    @property
    def driver(self) -> str:
        """How the clause meets updates (see the module docstring)."""
        return self.filter.driver

    @property
    def attr(self) -> str | None:
        """The driving attribute, if an attribute drives."""
        return self.filter.attr

    @property
    def rest(self) -> tuple[Rest, ...]:
        """The constraints checked on each candidate pair."""
        return self.filter.rest

    @property
    def keys(self) -> list[str]:
        """The clause's keys in the key table."""
        scope = "" if self.scope == DEFAULT_SCOPE else self.scope + SEP
        head = f"{self.part}{SEP}{scope}{self.tenant}{SEP}"
        driver = self.filter.driver
        if driver == "i":
            return [f"{head}i{SEP}{self.eid}"]
        if driver == "t":
            return [f"{head}t{SEP}{self.etype}"]
        if driver == "*":
            return [f"{head}*"]
        return [head + suffix for suffix in self.filter.suffixes]

    def row(self) -> dict[str, Any]:
        """The clause as a JSON-able row of the clause table."""
        return {
            "clause": self.clause,
            "subscription": self.subscription,
            "scope": self.scope,
            "eid": self.eid,
            "etype": self.etype,
            "id_op": self.id_op,
            "id_arg": self.id_arg,
            "type_op": self.type_op,
            "type_arg": self.type_arg,
            "cond": list(self.cond),
            "fid": self.filter.fid,
            "verify": self.verify,
        }


@dataclass(slots=True)
class MatchPlan:
    """Everything the Spark job needs from the subscriptions.

    ``numeric`` maps each attribute that drives clauses by number to its splits; ``strings``
    maps each attribute that drives clauses by text to the key kinds it needs (``e``,
    ``p1``-``p3``, ``s1``-``s3``, ``c``); ``multi`` is True when some subscription has several
    clauses (a pair can then be found twice and results are made distinct)."""

    clauses: list[ClausePlan]
    filters: list[FilterPart]
    partitions: int
    numeric: dict[str, list[float]]
    strings: dict[str, set[str]]
    multi: bool
    subscriptions: dict[str, Subscription]
    valid_until: float = math.inf  # the first expiry among the held: the plan is stale then

    def key_rows(self) -> Iterable[dict[str, Any]]:
        """The key table: one row per (key, clause)."""
        for clause in self.clauses:
            for key in clause.keys:
                yield {"key": key, "clause": clause.clause}

    @property
    def attributes(self) -> list[str]:
        """Every attribute a clause looks at (driving, checked or a condition)."""
        names = {f.attr for f in self.filters if f.attr is not None}
        names.update(r.attr for f in self.filters for r in f.rest)
        names.update(a for c in self.clauses for a in c.cond)
        return sorted(names)

    @property
    def levels(self) -> dict[str, int]:
        """The number of cover levels of each numeric driving attribute."""
        return {name: levels(len(splits), BASE) for name, splits in self.numeric.items()}


def _selector_test(pattern: str | None) -> tuple[str | None, str | None]:
    if pattern is None or is_match_all(pattern):
        return None, None
    literal = literal_regex(pattern)
    if literal is None:
        return "r", pattern
    return literal


def _string_test(constraint: AttributeConstraint) -> tuple[str, tuple[str, ...]] | None:
    test = constraint.string
    if test is None:
        return None
    if test.op is Op.EQ:
        return "e", tuple(sorted(set(test.values)))
    if test.op is Op.MATCH:
        literal = literal_regex(test.values[0])
        return ("r", test.values) if literal is None else (literal[0], (literal[1],))
    op = {Op.PREFIX: "p", Op.SUFFIX: "s", Op.CONTAINS: "c"}[test.op]
    return op, test.values


def _driver_rank(kind: str, text: tuple[str, ...]) -> int:
    """Lower is more selective."""
    if kind == "e":
        return 1
    if kind in ("p", "s") and len(text[0]) >= GRAM:
        return 2
    if kind == "c" and len(text[0]) >= GRAM:
        return 3
    if kind == "n":
        return 4
    if kind in ("p", "s"):
        return 6
    return 99  # a short contains or a regex cannot drive


def build_plan(
    subscriptions: Iterable[Subscription],
    now: float,
    partitions: int = 1,
    selector: RendezvousSelector | None = None,
) -> MatchPlan:
    """The tables for matching at time ``now`` (inactive and expired subscriptions left out).

    The partition of a subscription is its owner's index under ``selector`` (by default the
    matchers' selector over ``partitions`` owners). Filters are planned once per distinct
    text (and selector shape), so many subscriptions sharing filters plan quickly.
    """
    selector = selector or partition_selector(partitions)
    owners = {name: index for index, name in enumerate(selector.owners)}
    held = [s for s in subscriptions if live(s, now)]
    parts = selector.owners_of([s.id for s in held]) if held else []
    clauses: list[ClausePlan] = []
    filters: dict[tuple[str, str, bool, bool], FilterPart] = {}
    tests: dict[str | None, tuple[str | None, str | None]] = {}
    multi = False
    for subscription, owner in zip(held, parts, strict=True):
        multi = multi or len(subscription.entities) > 1
        cond = tuple(dict.fromkeys(subscription.condition_attrs))
        for selector_ in subscription.entities:
            shape = (subscription.q, subscription.mq, selector_.id is not None,
                     selector_.type is not None)  # fmt: skip
            part = filters.get(shape)
            if part is None:
                part = filters[shape] = _filter_part(len(filters), subscription, *shape[2:])
            id_pattern = selector_.id_pattern if selector_.id is None else None
            type_pattern = selector_.type_pattern if selector_.type is None else None
            id_test = tests.get(id_pattern) or tests.setdefault(
                id_pattern, _selector_test(id_pattern)
            )
            type_test = tests.get(type_pattern) or tests.setdefault(
                type_pattern, _selector_test(type_pattern)
            )
            clauses.append(
                ClausePlan(
                    clause=len(clauses),
                    subscription=subscription.id,
                    part=owners[owner],
                    tenant=subscription.tenant,
                    scope=subscription.service_path,
                    eid=selector_.id,
                    etype=selector_.type,
                    id_op=id_test[0],
                    id_arg=id_test[1],
                    type_op=type_test[0],
                    type_arg=type_test[1],
                    cond=cond,
                    filter=part,
                    verify=part.verify or id_test[0] == "r" or type_test[0] == "r",
                )
            )
    bounds: dict[str, list[float]] = {}
    counts: dict[int, int] = {}
    for clause in clauses:
        counts[clause.filter.fid] = counts.get(clause.filter.fid, 0) + 1
    for part in filters.values():
        if part.driver == "n" and part.attr is not None and part.interval is not None:
            found = bounds.setdefault(part.attr, [])
            for bound in (part.interval.low, part.interval.high):
                if math.isfinite(bound):
                    found += [bound + 0.0] * counts.get(part.fid, 0)
    numeric = {name: _splits(found) for name, found in bounds.items()}
    strings: dict[str, set[str]] = {}
    for part in filters.values():
        _add_suffixes(part, numeric, strings)
    expiries = [s.expires for s in held if s.expires is not None]
    return MatchPlan(
        clauses,
        list(filters.values()),
        len(selector.owners),
        numeric,
        strings,
        multi,
        {s.id: s for s in held},
        min(expiries, default=math.inf),
    )


def live(subscription: Subscription, now: float) -> bool:
    """Whether ``subscription`` is matched at ``now`` (active and not expired)."""
    if subscription.status is Status.INACTIVE:
        return False
    return subscription.expires is None or subscription.expires > now


def _splits(bounds: list[float]) -> list[float]:
    distinct = sorted(set(bounds))
    if len(distinct) <= MAX_SPLITS:
        return distinct
    # keep the bounds many clauses use: quantiles of all bounds, by count
    ordered = sorted(bounds)
    step = len(ordered) / MAX_SPLITS
    return sorted({ordered[int(i * step)] for i in range(MAX_SPLITS)})


def _filter_part(fid: int, subscription: Subscription, has_id: bool, has_type: bool) -> FilterPart:
    filter_plan = plan(subscription.filter)
    verify = bool(filter_plan.residual)
    # the best driving constraint
    _Candidate = tuple[int, str, str, tuple[str, ...], Interval | None]
    best: _Candidate | None = None
    candidate: _Candidate
    no_text: tuple[str, ...] = ()
    rests: dict[str, Rest] = {}
    for name, constraint in filter_plan.constraints.items():
        if constraint.presence is Presence.ABSENT:
            rests[name] = Rest(name, absent=True)
            continue
        test = _string_test(constraint)
        if constraint.interval is not None:
            iv = constraint.interval
            rests[name] = Rest(name, kind="n", low=iv.low, low_open=iv.low_open, high=iv.high,
                               high_open=iv.high_open)  # fmt: skip
            candidate = (_driver_rank("n", no_text), "n", name, no_text, iv)
        elif test is not None:
            op, values = test
            verify = verify or op == "r"
            rests[name] = Rest(name, kind="s", op=op, values=values)
            candidate = (_driver_rank(op, values), op, name, values, None)
        else:
            rests[name] = Rest(name)
            continue
        if candidate[0] < 99 and (best is None or candidate[0] < best[0]):
            best = candidate
    driver: str
    attr: str | None
    text: tuple[str, ...]
    interval: Interval | None
    if has_id:
        driver, attr, text, interval = "i", None, no_text, None
    elif best is not None and best[0] <= 4:
        _, driver, attr, text, interval = best
    elif has_type:
        driver, attr, text, interval = "t", None, no_text, None
    elif best is not None:
        _, driver, attr, text, interval = best
    else:
        driver, attr, text, interval = "*", None, no_text, None
    if attr is not None:
        rests.pop(attr)
    return FilterPart(
        fid=fid,
        driver=driver,
        attr=attr,
        interval=interval,
        text=text,
        rest=tuple(rests.values()),
        verify=verify,
    )


def _add_suffixes(
    part: FilterPart, numeric: dict[str, list[float]], strings: dict[str, set[str]]
) -> None:
    driver, attr = part.driver, part.attr
    if attr is None:
        return
    base = f"{attr}{SEP}"
    suffixes = [f"{base}A"]
    if driver == "n":
        assert part.interval is not None
        splits = numeric[attr]
        low = bucket(splits, part.interval.low)
        high = bucket(splits, part.interval.high)
        suffixes += [
            f"{base}n{level}{SEP}{index}" for level, index in dyadic_cover(low, high, BASE)
        ]
    else:
        kinds = strings.setdefault(attr, set())
        argument = part.text[0]
        if driver == "e":
            kinds.add("e")
            suffixes += [f"{base}e{SEP}{value}" for value in part.text]
        elif driver == "c":
            kinds.add("c")
            suffixes.append(f"{base}c{SEP}{argument[:GRAM]}")
        else:  # p or s
            gram = argument[:GRAM] if driver == "p" else argument[-GRAM:]
            kinds.add(f"{driver}{len(gram)}")
            suffixes.append(f"{base}{driver}{len(gram)}{SEP}{gram}")
    part.suffixes = suffixes
