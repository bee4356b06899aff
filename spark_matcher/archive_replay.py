"""The archive as a replay's steps (``silbo replay --archive``): no update is applied again.

The archive (docs/archive.md) holds every change the context stores applied, each with the
entity as the front published it and its change: the row of a replay's state pass
(:data:`spark_matcher.history.STEP_SCHEMA`) is already there. :func:`archived_steps` reads
the Parquet files with Spark (spark_matcher.archive: partition discovery gives ``tenant``,
``day`` and ``type``;
``--tenant``, ``--from`` and ``--to`` prune the directories), drops the rows a crash may have
left twice (by partition and sequence: the archiver's own protocol leaves none), orders
them by (time, partition, sequence), the order the stores applied them in for each entity,
and numbers them from 0 in that order: a row's ``update`` is its position in the selection.

What the live broker does not notify is not published here either: a delete of an entity
whose ``dateExpires`` had passed is taken as the store's expiry (the store deletes expired
entities itself, notifying nothing).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from datetime import UTC, datetime
from typing import Any

from broker.model.attribute import DATE_TYPES, parse_iso8601
from spark_matcher.archive import ARCHIVE_SCHEMA, DEFAULT_TENANT
from spark_matcher.history import STEP_SCHEMA, located

__all__ = ["archived_steps"]

_STEP_COLUMNS = ("alteration", "changed", "meta_changed", "requested", "entity")
_BUILTIN = ("id", "type", "tenant", "servicePath")
_DELETE = "entityDelete"


def archived_steps(
    spark: Any,
    root: str,
    *,
    tenant: str | None = None,
    since: float | None = None,
    until: float | None = None,
) -> Any:
    """A :data:`STEP_SCHEMA` row per archived change under ``root`` (of ``tenant``; from
    ``since`` included to ``until`` excluded, epoch seconds), numbered in the archive's
    order (module doc). The frame is persisted (the caller unpersists it)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    frame = spark.read.schema(ARCHIVE_SCHEMA).option("basePath", root).parquet(root)
    if tenant is not None:
        frame = frame.where(
            (F.col("tenant") == (tenant or DEFAULT_TENANT))
            & (F.get_json_object("entity", "$.tenant") == tenant)
        )
    if since is not None:
        frame = frame.where((F.col("day") >= _day(since)) & (F.col("time") >= _micros(since)))
    if until is not None:
        frame = frame.where((F.col("day") <= _day(until)) & (F.col("time") < _micros(until)))
    ordered = (
        frame.dropDuplicates(["partition", "sequence"])
        .select("time", "partition", "sequence", *_STEP_COLUMNS)
        .orderBy("time", "partition", "sequence")
    )
    stepped = ordered.rdd.zipWithIndex().mapPartitions(_steps)
    return spark.createDataFrame(stepped, STEP_SCHEMA).persist(StorageLevel.MEMORY_AND_DISK)


def _steps(rows: Iterable[Any]) -> Iterator[tuple[Any, ...]]:
    """Numbered archive rows to step rows (the ``mapPartitions`` function)."""
    for row, update in rows:
        moment = row["time"] / 1_000_000
        text = row["entity"]
        attributes = {k: v for k, v in json.loads(text).items() if k not in _BUILTIN}
        if row["alteration"] == _DELETE and _expired(attributes, moment):
            text = None  # the store's expiry: not published
        yield (
            update,
            moment,
            text,
            row["alteration"],
            list(row["changed"]),
            list(row["meta_changed"]),
            list(row["requested"]),
            located(attributes) if text is not None else None,
            None,
        )


def _expired(attributes: dict[str, Any], moment: float) -> bool:
    """Whether the entity's ``dateExpires`` had passed at ``moment``."""
    expires = attributes.get("dateExpires")
    if not isinstance(expires, dict) or expires.get("type") not in DATE_TYPES:
        return False
    value = expires.get("value")
    epoch = parse_iso8601(value) if isinstance(value, str) else None
    return epoch is not None and epoch <= moment


def _day(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%d")


def _micros(seconds: float) -> int:
    return round(seconds * 1_000_000)
