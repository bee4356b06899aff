"""The Spark job: a batch of updates matched against the subscriptions' tables.

One stage, no shuffle on the hot path:

1. each update is exploded into its keys (:func:`update_keys_sql`; numbers are binned by
   Spark's Bucketizer against the plan's splits first);
2. the keys are joined with the key table, then the clause and the filter tables (all
   broadcast; the key already holds the partition, the scope, the tenant and any exact id);
3. each candidate pair is checked exactly by :data:`CHECK_SQL` (entity type and patterns,
   condition attributes, the driving constraint and the rest), and flagged by
   :data:`VERIFY_SQL` when only the reference semantics can settle it;
4. flagged pairs are settled in Python (:func:`_verify`, the reference matcher on the
   executors) and joined back; subscriptions with several clauses are made distinct.

The result is ``(update, subscription)``: one row per match, ``update`` the position of the
update in its input. :class:`SparkMatcher` keeps the tables of one set of subscriptions and
matches any number of batches against them.
"""

from __future__ import annotations

import abc
import json
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from broker.model.subscription import Subscription
from broker.model.update import ContextUpdate
from broker.partition.selector import RendezvousSelector
from broker.serialization import packb, subscription_to_obj
from spark_matcher.plan import BASE, GRAM, SEP, MatchPlan, build_plan
from spark_matcher.source import parse_updates, sql_string, updates_frame

__all__ = ["CHECK_SQL", "VERIFY_SQL", "FrameMatcher", "SparkMatcher", "update_keys_sql"]

_CLAUSE_SCHEMA = (
    "clause INT, subscription STRING, scope STRING, eid STRING, etype STRING, id_op STRING, "
    "id_arg STRING, type_op STRING, type_arg STRING, cond ARRAY<STRING>, fid INT, "
    "verify BOOLEAN"
)
_FILTER_SCHEMA = (
    "fid INT, dkind STRING, sop STRING, sarg STRING, low DOUBLE, low_open BOOLEAN, "
    "high DOUBLE, high_open BOOLEAN, rest ARRAY<STRUCT<attr: STRING, absent: BOOLEAN, "
    "kind: STRING, low: DOUBLE, low_open: BOOLEAN, high: DOUBLE, high_open: BOOLEAN, "
    "op: STRING, vals: ARRAY<STRING>>>"
)
_KEY_SCHEMA = "key STRING, clause INT"
_NAN = "CAST('NaN' AS DOUBLE)"


def _key(kind: str, value: str | None = None) -> str:
    """A struct of the key array: ``kind`` is SQL text, ``value`` the attribute value."""
    if value is None:
        return (
            f"named_struct('key', {kind}, 'kind', CAST(NULL AS STRING), "
            "'num', CAST(NULL AS DOUBLE), 'str', CAST(NULL AS STRING))"
        )
    return (
        f"named_struct('key', {kind}, 'kind', {value}.kind, 'num', {value}.num, 'str', {value}.str)"
    )


def update_keys_sql(plan: MatchPlan) -> str:
    """The SQL array of ``(key, kind, num, str)`` an update row carries: its entity keys and
    one or more keys per driving attribute it holds (see :mod:`spark_matcher.plan`).

    Refers to the columns ``tenant``, ``eid``, ``etype``, ``attrs`` and, for the i-th
    numeric driving attribute, ``b<i>`` (its bin)."""
    sep = sql_string(SEP)
    head = f"concat(tenant, {sep}"
    parts = [
        _key(f"{head}, 'i{SEP}', eid)"),
        _key(f"{head}, 't{SEP}', etype)"),
        _key(f"{head}, '*')"),
    ]
    terms = [f"array({', '.join(parts)})"]
    numeric = sorted(plan.numeric)
    levels = plan.levels
    for name in sorted(set(plan.numeric) | set(plan.strings)):
        v = f"try_element_at(attrs, {sql_string(name)})"
        base = f"{head}, {sql_string(name + SEP)}"
        array_key = _key(f"{base}, 'A')", v)
        cases = [f"WHEN {v}.kind = 'a' THEN array({array_key})"]
        if name in plan.numeric:
            b = f"b{numeric.index(name)}"
            count = levels[name]
            cases.append(
                f"WHEN {v}.kind = 'n' THEN transform(sequence(0, {count - 1}), l -> "
                + _key(
                    f"{base}, 'n', l, {sep}, CAST(floor({b} / pow({BASE}, l)) AS BIGINT))",
                    v,
                )
                + ")"
            )
        kinds = plan.strings.get(name, set())
        if kinds:
            s = f"{v}.str"
            pieces = []
            if "e" in kinds:
                equal = _key(f"{base}, {sql_string('e' + SEP)}, {s})", v)
                pieces.append(f"array({equal})")
            for op in ("p", "s"):
                for length in range(1, GRAM + 1):
                    if f"{op}{length}" not in kinds:
                        continue
                    cut = f"substr({s}, 1, {length})" if op == "p" else f"right({s}, {length})"
                    key = _key(f"{base}, {sql_string(f'{op}{length}{SEP}')}, {cut})", v)
                    pieces.append(
                        f"CASE WHEN length({s}) >= {length} THEN array({key}) ELSE array() END"
                    )
            if "c" in kinds:
                grams = (
                    f"array_distinct(transform(sequence(1, length({s}) - {GRAM - 1}), "
                    f"i -> substr({s}, i, {GRAM})))"
                )
                key = _key(f"{base}, {sql_string('c' + SEP)}, g)", v)
                pieces.append(
                    f"CASE WHEN length({s}) >= {GRAM} THEN transform({grams}, g -> {key}) "
                    "ELSE array() END"
                )
            cases.append(f"WHEN {v}.kind = 's' THEN concat({', '.join(pieces)})")
        terms.append(f"CASE {' '.join(cases)} ELSE array() END")
    keys = f"concat({', '.join(terms)})"
    # once plain (clauses scoped /#) and once per other scope covering the path
    tags = f"concat(array(''), transform(filter(scopes, s -> s != '/#'), s -> concat(s, {sep})))"
    heads = (
        f"transform({tags}, t -> concat('0{SEP}', t))"
        if plan.partitions == 1
        else f"flatten(transform(sequence(0, {plan.partitions - 1}), p -> "
        f"transform({tags}, t -> concat(p, {sep}, t))))"
    )
    return (
        f"flatten(transform({heads}, h -> transform({keys}, k -> named_struct('key', "
        "concat(h, k.key), 'kind', k.kind, 'num', k.num, 'str', k.str))))"
    )


def _string_test(op: str, value: str, arg: str, values: str) -> str:
    return (
        f"CASE {op} WHEN 'e' THEN array_contains({values}, {value}) "
        f"WHEN 'p' THEN startswith({value}, {arg}) WHEN 's' THEN endswith({value}, {arg}) "
        f"WHEN 'c' THEN contains({value}, {arg}) ELSE true END"
    )


def _interval(num: str, low: str, low_open: str, high: str, high_open: str) -> str:
    return (
        f"(({num} > {low} OR (NOT {low_open} AND {num} = {low})) AND "
        f"({num} < {high} OR (NOT {high_open} AND {num} = {high})))"
    )


def _selector_test(op: str, arg: str, value: str) -> str:
    return (
        f"({op} IS NULL OR CASE {op} WHEN 'e' THEN {value} = {arg} "
        f"WHEN 'p' THEN startswith({value}, {arg}) WHEN 's' THEN endswith({value}, {arg}) "
        f"WHEN 'c' THEN contains({value}, {arg}) ELSE true END)"
    )


_REST_SQL = (
    "forall(rest, r -> CASE WHEN r.absent THEN try_element_at(attrs, r.attr).kind IS NULL "
    "WHEN try_element_at(attrs, r.attr).kind IS NULL THEN false "
    "WHEN r.kind IS NULL OR try_element_at(attrs, r.attr).kind IN ('a', 'x') THEN true "
    "WHEN r.kind = 'n' THEN try_element_at(attrs, r.attr).kind = 'n' AND "
    + _interval("try_element_at(attrs, r.attr).num", "r.low", "r.low_open", "r.high", "r.high_open")
    + " WHEN try_element_at(attrs, r.attr).kind != 's' THEN false ELSE "
    + _string_test(
        "r.op",
        "try_element_at(attrs, r.attr).str",
        "try_element_at(r.vals, 1)",
        "r.vals",
    )
    + " END)"
)

# The key already holds the partition, the scope, the tenant and (driver i) the entity id.
CHECK_SQL = (
    "(c_etype IS NULL OR c_etype = etype) "
    f"AND {_selector_test('id_op', 'id_arg', 'eid')} "
    f"AND {_selector_test('type_op', 'type_arg', 'etype')} "
    "AND (size(cond) = 0 OR exists(cond, a -> try_element_at(attrs, a).kind IS NOT NULL)) "
    "AND (dkind IS NULL OR coalesce(k.kind, '') IN ('a', 'x') OR "
    "CASE dkind WHEN 'n' THEN k.kind = 'n' AND "
    + _interval("k.num", "low", "low_open", "high", "high_open")
    + " ELSE "
    + _string_test("sop", "k.str", "sarg", "array(sarg)").replace(
        "WHEN 'e' THEN array_contains(array(sarg), k.str)", "WHEN 'e' THEN true"
    )
    + " END) "
    f"AND (size(rest) = 0 OR {_REST_SQL})"
)
"""The exact test of a candidate (update, clause) pair."""

VERIFY_SQL = (
    "verify OR coalesce(k.kind, '') IN ('a', 'x') OR (size(rest) > 0 AND "
    "exists(rest, r -> coalesce(try_element_at(attrs, r.attr).kind, '') IN ('a', 'x')))"
)
"""Whether the pair must be settled by the reference semantics."""


def _write_rows(rows: Any, path: Path) -> None:
    with path.open("w", encoding="utf-8") as out:
        for row in rows:
            out.write(json.dumps(row, ensure_ascii=False))
            out.write("\n")


def _verify(subscriptions: Any, now: float) -> Any:
    """The reference matcher on flagged pairs ``(update, subscription, text)``."""

    def settle(rows: Iterator[Any]) -> Iterator[tuple[int, str]]:
        from broker.matching.reference import subscription_matches
        from broker.serialization import subscription_from_obj, unpackb
        from spark_matcher.entities import update_from_json

        packed: dict[str, Any] | None = None
        held: dict[str, Subscription] = {}
        last: tuple[int, ContextUpdate] | None = None
        for row in rows:
            number, subscription_id, text = row[0], row[1], row[2]
            if packed is None:
                packed = unpackb(subscriptions.value, max_size=len(subscriptions.value))
            subscription = held.get(subscription_id)
            if subscription is None:
                subscription = held[subscription_id] = subscription_from_obj(
                    packed[subscription_id]
                )
            if last is None or last[0] != number:
                last = (number, update_from_json(json.loads(text), strict=False))
            if subscription_matches(subscription, last[1], now):
                yield (number, subscription_id)

    return settle


class FrameMatcher(abc.ABC):
    """What both methods' matchers share: a context manager, and :meth:`match` (updates in
    memory) over their ``match_frame`` (lines in a DataFrame)."""

    _spark: Any

    @abc.abstractmethod
    def match_frame(
        self,
        lines: Any,
        *,
        validate: bool = False,
        source: str = "<input>",
        now: float | None = None,
    ) -> Any:
        """The matches of ``(update, text)`` lines as ``(update, subscription)`` rows."""

    @abc.abstractmethod
    def close(self) -> None:
        """Drop everything the matcher holds."""

    @abc.abstractmethod
    def release(self) -> None:
        """Drop what the batches matched so far keep cached."""

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def match(self, updates: Sequence[ContextUpdate], now: float | None = None) -> list[set[str]]:
        """The ids of the subscriptions each update matches, in order (collected)."""
        result: list[set[str]] = [set() for _ in updates]
        if not updates:
            return result
        with tempfile.TemporaryDirectory(prefix="silbo-batch-") as directory:
            lines = updates_frame(self._spark, updates, Path(directory))
            try:
                for number, subscription_id in self.match_frame(lines, now=now).collect():
                    result[number].add(subscription_id)
            finally:
                self.release()
        return result


class SparkMatcher(FrameMatcher):
    """One set of subscriptions, as tables in a SparkSession, matched against batches.

    ``now`` fixes the clock for expiry (default: when the matcher is built); ``partitions``
    or ``selector`` partition the subscriptions as the matchers do.
    """

    def __init__(
        self,
        spark: Any,
        subscriptions: Sequence[Subscription],
        *,
        now: float | None = None,
        partitions: int = 1,
        selector: RendezvousSelector | None = None,
    ) -> None:
        from pyspark.sql import functions as F

        self._spark = spark
        self.now = time.time() if now is None else now
        started = time.perf_counter()
        self.plan = build_plan(subscriptions, self.now, partitions, selector)
        self._directory = tempfile.TemporaryDirectory(prefix="silbo-spark-")
        where = Path(self._directory.name)
        _write_rows((c.row() for c in self.plan.clauses), where / "clauses.jsonl")
        _write_rows((f.row() for f in self.plan.filters), where / "filters.jsonl")
        _write_rows(self.plan.key_rows(), where / "keys.jsonl")
        reader = spark.read.option("allowNonNumericNumbers", "true")
        clauses = reader.schema(_CLAUSE_SCHEMA).json(str(where / "clauses.jsonl"))
        clauses = clauses.withColumnRenamed("eid", "c_eid").withColumnRenamed("etype", "c_etype")
        self._filters = reader.schema(_FILTER_SCHEMA).json(str(where / "filters.jsonl")).cache()
        keys = spark.read.schema(_KEY_SCHEMA).json(str(where / "keys.jsonl"))
        # Narrow tables joined one after the other beat one wide table (measured: the wide
        # rows are copied for every candidate). Clauses the reference semantics must settle
        # are matched in a pass of their own.
        verified = F.col("verify")
        self._sure = (
            keys.join(clauses.where(~verified).select("clause"), "clause").cache(),
            clauses.where(~verified).cache(),
        )
        self._verified = None
        if any(c.verify for c in self.plan.clauses):
            self._verified = (
                keys.join(clauses.where(verified).select("clause"), "clause").cache(),
                clauses.where(verified).cache(),
            )
        for table in (*self._sure, *(self._verified or ()), self._filters):
            table.count()
        self._cached: list[Any] = []
        packed = packb({i: subscription_to_obj(s) for i, s in self.plan.subscriptions.items()})
        self._subscriptions = spark.sparkContext.broadcast(packed)
        self._F = F
        self.planning_s = time.perf_counter() - started

    @property
    def valid_until(self) -> float:
        """The first expiry among the subscriptions held: build a new matcher then."""
        return self.plan.valid_until

    def close(self) -> None:
        """Drop the cached tables and the files behind them."""
        self.release()
        for table in (*self._sure, *(self._verified or ()), self._filters):
            table.unpersist()
        self._subscriptions.unpersist()
        self._directory.cleanup()

    def release(self) -> None:
        """Drop what the batches matched so far keep cached (their parsed updates)."""
        for frame in self._cached:
            frame.unpersist()
        self._cached.clear()

    def match_frame(
        self,
        lines: Any,
        *,
        validate: bool = False,
        source: str = "<input>",
        now: float | None = None,
    ) -> Any:
        """The matches of ``(update, text)`` lines as ``(update, subscription)`` rows, at
        ``now`` (default: the matcher's clock); ValueError when a subscription held has
        expired by then (build a new matcher)."""
        F = self._F
        now = self.now if now is None else now
        if now >= self.plan.valid_until:
            raise ValueError("a subscription has expired since the tables were built")
        updates = parse_updates(
            lines,
            attributes=self.plan.attributes,
            validate=validate,
            source=source,
            cached=self._cached,
        )
        numeric = sorted(self.plan.numeric)
        binned = [n for n in numeric if self.plan.numeric[n]]
        for index, name in enumerate(numeric):
            v = f"try_element_at(attrs, {sql_string(name)})"
            value = f"CASE WHEN {v}.kind = 'n' THEN coalesce({v}.num, {_NAN}) ELSE {_NAN} END"
            updates = updates.withColumn(
                f"n{index}" if name in binned else f"b{index}",
                F.expr(value) if name in binned else F.lit(0.0),
            )
        if binned:
            from pyspark.ml.feature import Bucketizer

            inf = float("inf")
            updates = Bucketizer(
                splitsArray=[[-inf, *self.plan.numeric[n], inf] for n in binned],
                inputCols=[f"n{numeric.index(n)}" for n in binned],
                outputCols=[f"b{numeric.index(n)}" for n in binned],
                handleInvalid="keep",
            ).transform(updates)
        sure = self._candidates(updates, *self._sure)
        flagged = self._candidates(updates.where("complex"), *self._sure).where("verify")
        if self._verified is not None:
            flagged = flagged.unionByName(self._candidates(updates, *self._verified))
        result = (
            sure.where(~F.col("verify"))
            .select("update", "subscription")
            .unionByName(self._settle(flagged.select("update", "subscription"), lines, now))
        )
        return result.distinct() if self.plan.multi else result

    def _candidates(self, updates: Any, keys: Any, clauses: Any) -> Any:
        """The pairs of ``updates`` and clauses that pass the exact checks, with ``verify``."""
        F = self._F
        keyed = updates.select(
            "update",
            "eid",
            "etype",
            "attrs",
            F.expr(f"explode({update_keys_sql(self.plan)})").alias("k"),
        )
        joined = (
            keyed.join(F.broadcast(keys), keyed["k.key"] == keys["key"])
            .join(F.broadcast(clauses), "clause")
            .join(F.broadcast(self._filters), "fid")
        )
        return joined.where(F.expr(CHECK_SQL)).select(
            "update", "subscription", F.expr(VERIFY_SQL).alias("verify")
        )

    def _settle(self, flagged: Any, lines: Any, now: float) -> Any:
        F = self._F
        pairs = flagged.join(lines, "update").select("update", "subscription", "text")
        pairs = pairs.repartition(F.col("update")).sortWithinPartitions("update")
        rdd = pairs.rdd.mapPartitions(_verify(self._subscriptions, now))
        return self._spark.createDataFrame(rdd, "update BIGINT, subscription STRING")
