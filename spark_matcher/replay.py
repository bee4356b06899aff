"""The Spark job of ``silbo replay``: a file of updates to the notifications the live broker
would have sent, in three passes over its ``(update, text)`` lines.

1. :func:`apply_updates`, the state pass (:mod:`spark_matcher.history`): the lines (after
   the initial entities, if any) repartitioned by entity and sorted by update, each applied
   to its entity as the context store applies it, in Python (``mapPartitions``); a row per
   update (its time, the entity published, its change), kept for the next passes.
2. Matching: the published entities matched by either method's matcher
   (:func:`spark_matcher.open_matcher`), as the matchers match what the front publishes.
3. :func:`notified`, the decision pass (:mod:`spark_matcher.decisions`): the matches joined
   with their update's time and change, repartitioned by subscription and sorted by update,
   decided in order as the front decides (``mapPartitions``).

Every pass scales with the input: only the subscriptions' documents are broadcast, and no
pass collects rows to the driver (but the first bad line's error).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from broker.errors import InvalidInput
from spark_matcher.decisions import DECISION_COLUMNS, FrontSubscription, decided, fronts_of
from spark_matcher.history import STEP_SCHEMA, Clock, steps

__all__ = ["MATCHED_FROM", "apply_updates", "notified"]

MATCHED_FROM = float("-inf")
"""The clock to build a replay's matcher at: it leaves no subscription out for having
expired (the decision pass judges ``expires`` at each update's time)."""

_ENTITY_KEY = (
    "concat_ws(char(1), coalesce(try_variant_get(v, '$.tenant', 'string'), ''), "
    "coalesce(try_variant_get(v, '$.servicePath', 'string'), '/'), "
    "coalesce(try_variant_get(v, '$.id', 'string'), ''), "
    "coalesce(try_variant_get(v, '$.type', 'string'), 'Thing'))"
)


def apply_updates(
    spark: Any,
    lines: Any,
    clock: Clock,
    *,
    initial: Any = None,
    source: str = "<input>",
    initial_source: str = "<initial>",
) -> Any:
    """The state pass: a :data:`~spark_matcher.history.STEP_SCHEMA` row per update of
    ``lines``, each applied after the ``initial`` entities' lines (both ``(update, text)``).
    The frame is persisted (the caller unpersists it); InvalidInput for the first line that
    could not be read, naming its file (``source`` or ``initial_source``) and field."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    rows = lines.select(F.lit(False).alias("initial"), "update", "text")
    if initial is not None:
        rows = initial.select(F.lit(True).alias("initial"), "update", "text").unionByName(rows)
    parsed = rows.select("initial", "update", "text", F.expr("try_parse_json(text)").alias("v"))
    keyed = parsed.select(F.expr(_ENTITY_KEY).alias("entity"), "initial", "update", "text")
    ordered = keyed.repartition("entity").sortWithinPartitions(
        "entity", F.col("initial").desc(), "update"
    )
    stepped = ordered.rdd.mapPartitions(steps(clock, source, initial_source))
    frame = spark.createDataFrame(stepped, STEP_SCHEMA).persist(StorageLevel.MEMORY_AND_DISK)
    bad = frame.where(F.col("problem").isNotNull()).orderBy("update").limit(1).collect()
    if bad:
        frame.unpersist()
        raise InvalidInput(bad[0]["problem"])
    return frame


def notified(
    spark: Any,
    matcher: Any,
    stepped: Any,
    fronts: Mapping[str, FrontSubscription],
    kept: list[Any],
) -> Any:
    """The ``(update, subscription)`` notifications of the steps of :func:`apply_updates`:
    the published entities matched by ``matcher`` (built at :data:`MATCHED_FROM`), then the
    front's decision on each match, with ``fronts`` (the subscriptions with no document
    there notify every match). The frame is persisted; it and the documents' broadcast are
    added to ``kept``, for the caller to unpersist once the frame is written."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    published = stepped.where(F.col("text").isNotNull())
    matches = matcher.match_frame(published.select("update", "text"))
    facts = published.select(*(c for c in DECISION_COLUMNS if c != "subscription"))
    pairs = (
        matches.join(facts, "update")
        .repartition("subscription")
        .sortWithinPartitions("subscription", "update")
        .select(*DECISION_COLUMNS)
    )
    packed = json.dumps([f.packed() for f in fronts.values()]).encode()
    broadcast = spark.sparkContext.broadcast(packed)
    kept.append(broadcast)

    def held() -> Mapping[str, FrontSubscription]:
        return fronts_of(broadcast.value)

    frame = spark.createDataFrame(
        pairs.rdd.mapPartitions(decided(held)), "update BIGINT, subscription STRING"
    )
    # kept, so that sorting it (which samples it first) does not match and decide twice
    frame = frame.persist(StorageLevel.MEMORY_AND_DISK)
    kept.append(frame)
    return frame
