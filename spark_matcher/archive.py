"""The archive of the changes the context stores applied, as Spark reads it (``silbo
backfill``).

The archiver writes one Parquet row per change a store applied as a partition's primary
(deletes included) under ``ROOT/tenant=T/day=YYYY-MM-DD/type=TYPE/``: Hive-style
directories, their values percent-quoted (``_`` for the default tenant; ``day`` the UTC day
of the change's time), which Spark reads back as the columns ``tenant``, ``day`` and
``type``. Each file's columns (:data:`ARCHIVE_COLUMNS`):

- ``service_path``, ``entity_id``, ``entity_type``: the entity;
- ``time``: the write's time, µs since the epoch (the entity's new ``dateModified``,
  broker.store.history_fold.micros; for a delete, when it was deleted);
- ``partition``, ``sequence``: the store partition of the entity and the change's number in
  that partition's changelog (strictly increasing: ``(time, sequence)`` orders an entity's
  changes as the store applied them, and ``(partition, sequence)`` names a change);
- ``alteration``, ``changed``, ``meta_changed``, ``requested``: its
  :class:`~broker.model.change.Change` (sorted names);
- ``entity``: the entity after the change as JSON, ``{"id", "type", "tenant",
  "servicePath", <attribute>: {"type", "value", "metadata"}...}`` (spark_matcher.history's
  ``Step.row`` text); for a delete, the entity as it was;
- ``date_created``: the entity's ``dateCreated``, µs.

:func:`open_archive` lists its files (once), :func:`read_changes` selects from it (only
the directories of the tenants, days and types asked are read); :func:`any_change` tells
whether there is any. An archiver may deliver a change more than
once: the rows repeating a ``(partition, sequence)`` are the same change, which a reader
takes once. Rows sorted by entity, then time and sequence, hold a change's copies one after
the other; :func:`once` drops the copies there (in the Spark tasks: no shuffle of its own).
:func:`document_of` and :func:`change_of` turn a row back into the model's
:class:`~broker.store.semantics.Document` and :class:`~broker.model.change.Change`, as the
store had them after the write.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, Final

from broker.model.change import Alteration, Change
from broker.store.semantics import Document, expiry_of

__all__ = [
    "ARCHIVE_COLUMNS",
    "ARCHIVE_SCHEMA",
    "DEFAULT_TENANT",
    "any_change",
    "archive_day",
    "attributes_of",
    "change_of",
    "document_of",
    "once",
    "open_archive",
    "read_changes",
]

ARCHIVE_COLUMNS: Final = (
    "service_path STRING, entity_id STRING, entity_type STRING, time BIGINT, partition INT, "
    "sequence BIGINT, alteration STRING, changed ARRAY<STRING>, meta_changed ARRAY<STRING>, "
    "requested ARRAY<STRING>, entity STRING, date_created BIGINT"
)
_DIRECTORIES: Final = "tenant STRING, day STRING, type STRING"  # the partition columns
ARCHIVE_SCHEMA: Final = f"{ARCHIVE_COLUMNS}, {_DIRECTORIES}"
"""The archive's columns as Spark reads its root: a file's, then the directories' (read as
strings: inferred, ``day`` would be a date and a numeric-looking ``type`` a number)."""
DEFAULT_TENANT: Final = "_"  # the directory of the default tenant ("")
_OWN: Final = ("id", "type")  # keys of the entity JSON that are never attributes
_SCOPE: Final = ("tenant", "servicePath")  # ... that are attributes only if shaped as one


def archive_day(micros: int) -> str:
    """The ``day`` directory of a time in µs: its UTC date."""
    return datetime.fromtimestamp(micros // 1_000_000, UTC).strftime("%Y-%m-%d")


def open_archive(spark: Any, root: str) -> Any:
    """The archive under ``root`` (a path or URL Spark reads: ``s3a://bucket/prefix`` for
    the archiver's ``s3://bucket/prefix``, with the hadoop-aws jars, docs/archive.md) as
    written, its files listed once: what :func:`read_changes` and :func:`any_change` select
    from (an AnalysisException with PATH_NOT_FOUND if ``root`` is not there)."""
    return spark.read.schema(ARCHIVE_SCHEMA).parquet(root)


def read_changes(
    archive: Any,
    *,
    tenants: Sequence[str] | None = None,
    since: int | None = None,
    until: int | None = None,
    types: Sequence[str] | None = None,
) -> Any:
    """The changes of an :func:`open_archive`, with their tenant as the model names it
    (``tenant``: ``""`` for the default one), optionally of some ``tenants`` and entity
    ``types`` only, from ``since`` (µs, included) until ``until`` (excluded); a change
    delivered twice is there twice (:func:`once`)."""
    from pyspark.sql import functions as F

    frame = _selected(archive, tenants, since, until, types)
    named = F.when(F.col("tenant") == DEFAULT_TENANT, F.lit("")).otherwise(F.col("tenant"))
    columns = [c.split()[0] for c in ARCHIVE_COLUMNS.split(", ")]
    return frame.select(named.alias("tenant"), *columns)


def any_change(
    archive: Any,
    *,
    tenants: Sequence[str] | None = None,
    since: int | None = None,
    until: int | None = None,
) -> bool:
    """Tell whether :func:`read_changes` would find a change (reading at most one)."""
    return not _selected(archive, tenants, since, until, None).isEmpty()


def once(rows: Iterable[Any]) -> Iterator[Any]:
    """``rows`` without the copies of a change that follow it (the same ``(partition,
    sequence)`` as the row before: rows sorted by entity, time and sequence hold them so)."""
    last = None
    for row in rows:
        named = (row["partition"], row["sequence"])
        if named != last:
            last = named
            yield row


def _selected(
    archive: Any,
    tenants: Sequence[str] | None,
    since: int | None,
    until: int | None,
    types: Sequence[str] | None,
) -> Any:
    """The archive's rows, as written, with the filters of :func:`read_changes` (on the
    directories' columns too: Spark reads only theirs)."""
    from pyspark.sql import functions as F

    frame = archive
    if tenants is not None:
        frame = frame.where(F.col("tenant").isin([t or DEFAULT_TENANT for t in tenants]))
    if types is not None:
        frame = frame.where(F.col("type").isin(list(types)))
    if since is not None:
        frame = frame.where((F.col("day") >= archive_day(since)) & (F.col("time") >= since))
    if until is not None:
        frame = frame.where((F.col("day") <= archive_day(until)) & (F.col("time") < until))
    return frame


def document_of(row: Any) -> Document | None:
    """The entity a row of :func:`read_changes` left (None: the change deleted it); its
    ``dateModified`` is the change's time, in whole µs as archived."""
    if row["alteration"] == Alteration.DELETE.value:
        return None
    attributes = attributes_of(row["entity"])
    return Document(
        row["entity_id"],
        row["entity_type"],
        row["service_path"],
        row["tenant"],
        attributes,
        row["date_created"] / 1_000_000,
        row["time"] / 1_000_000,
        expiry_of(attributes),
    )


def attributes_of(entity: str) -> dict[str, Any]:
    """The attributes of an archived entity's JSON (``{name: {type, value, metadata}}``)."""
    return {
        name: value
        for name, value in json.loads(entity).items()
        if name not in _OWN and (name not in _SCOPE or isinstance(value, dict))
    }


def change_of(row: Any) -> Change:
    """The change a row of :func:`read_changes` records."""
    return Change(
        Alteration(row["alteration"]),
        frozenset(row["changed"] or ()),
        frozenset(row["meta_changed"] or ()),
        frozenset(row["requested"] or ()),
    )
