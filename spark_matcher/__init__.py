"""Bulk matching of update batches on Spark (PySpark DataFrames).

Two methods give the same ``(update, subscription)`` rows as the in-process engine:

- ``engine`` (:class:`spark_matcher.arrow.EngineMatcher`): the subscriptions, partitioned
  by the matchers' selector, are broadcast, and every task runs the matchers' own engine on
  Arrow batches of updates; the fastest here.
- ``join`` (:class:`spark_matcher.match.SparkMatcher`): matching expressed relationally,
  updates exploded into keys and joined with the subscriptions' tables (see
  :mod:`spark_matcher.plan`), each candidate pair checked by Spark SQL.

``silbo replay`` (:mod:`spark_matcher.replay`) puts a matcher between two passes of its
own: the updates applied to their entities as the context store applies them
(:mod:`spark_matcher.history`) before, the HTTP front's decision on each match
(:mod:`spark_matcher.decisions`) after.

``silbo backfill`` (:mod:`spark_matcher.backfill`) recomputes the context stores' history
levels and aggregation windows from the archive of their changes
(:mod:`spark_matcher.archive`), with the stores' own folding functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["METHODS", "open_matcher"]

METHODS = ("engine", "join")


def open_matcher(
    spark: Any,
    subscriptions: Sequence[Any],
    *,
    method: str = "engine",
    now: float | None = None,
    partitions: int = 1,
    selector: Any = None,
) -> Any:
    """A matcher of ``method`` over ``subscriptions``: ``match_frame``, ``match``,
    ``release``, ``close``, ``planning_s``, ``valid_until``. ValueError for an unknown
    method."""
    if method == "engine":
        from spark_matcher.arrow import EngineMatcher

        return EngineMatcher(
            spark, subscriptions, now=now, partitions=partitions, selector=selector
        )
    if method == "join":
        from spark_matcher.match import SparkMatcher

        return SparkMatcher(spark, subscriptions, now=now, partitions=partitions, selector=selector)
    raise ValueError(f"unknown method {method!r}; expected one of {', '.join(METHODS)}")
