"""Reading updates into Spark: JSON lines (or Parquet rows) to typed columns, natively.

Spark parses each line as a VARIANT and lays out what matching needs, in the JVM (no Python
per row): ``update`` (0-based position in the input), ``tenant``, ``path``, ``scopes`` (every
subscription scope that covers the path), ``eid``, ``etype`` and ``attrs``, a map from
attribute name to ``(kind, num, str)``. ``kind`` is ``n`` (a number, or a DateTime as epoch
seconds), ``s`` string, ``b`` boolean, ``z`` null, ``o`` object, ``a`` array, or ``x`` (a
value only the reference semantics may judge: it is always verified).

Checking (``validate``): every line is checked natively against the rules of an update
(identifiers, tenant, service path, attribute shape, DateTime values). Lines the native
checks cannot judge exactly (forbidden characters, escapes, metadata, very long or deep
lines, JSON Spark's parser refuses) are read by :func:`spark_matcher.entities.
update_from_json` in Python: there are usually none. The first bad line raises InputError
with the file, the line and the field.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from broker.model.attribute import parse_iso8601
from broker.model.update import ContextUpdate
from spark_matcher.entities import (
    ENTITY_FIELDS,
    TIMED_FIELDS,
    InputError,
    line_error,
    update_from_json,
    write_updates,
)

__all__ = [
    "MAX_DATES",
    "check_dates",
    "check_lines",
    "parse_updates",
    "read_lines",
    "sql_string",
    "updates_frame",
]

_ATTRS_TYPE = "map<string, struct<kind: string, num: double, str: string>>"

MAX_DATES = 50_000  # distinct DateTime texts turned into numbers in the plan; more: verified
_SUSPICIOUS = r"""[<>'=;()]|\\\\["u/]|"metadata"\s*:\s*\{\s*"|[0-9][eE][+]?[0-9]{3}"""
_MAX_NATIVE_LENGTH = 60_000
_MAX_NATIVE_NESTING = 30
_IDENT = r"^[!-~]{1,256}$"
_FORBIDDEN_IN_IDENT = r"[&?/#]"
_TENANT = r"^[a-z0-9_]{0,50}$"
_PATH = r"^/$|^(/[A-Za-z0-9_]{1,50}){1,10}$"


def read_lines(spark: Any, path: str | Path) -> Any:
    """The input file as ``(update, text)``: JSON lines, or Parquet rows made JSON (a
    ``.parquet`` path). ``update`` counts lines from 0 in file order."""
    from pyspark.sql import functions as F

    path = str(path)
    if path.endswith(".parquet"):
        raw = spark.read.parquet(path)
        raw = raw.select(
            F.to_json(F.struct(*[F.col(f"`{c}`") for c in raw.columns])).alias("value")
        )
    else:
        raw = spark.read.text(path)
    ided = raw.select(F.monotonically_increasing_id().alias("mid"), F.col("value").alias("text"))
    part = F.shiftright("mid", 33)
    counts = sorted((row[0], row[1]) for row in ided.groupBy(part.alias("p")).count().collect())
    offsets, total = [], 0
    for p, count in counts:
        offsets += [F.lit(int(p)), F.lit(total)]
        total += count
    if not offsets:
        return ided.select(F.lit(0).cast("long").alias("update"), "text").limit(0)
    start = F.element_at(F.create_map(*offsets), part)
    return ided.select((start + F.col("mid") - F.shiftleft(part, 33)).alias("update"), "text")


def updates_frame(spark: Any, updates: Sequence[ContextUpdate], directory: Path) -> Any:
    """Updates held in memory as ``(update, text)`` lines (written to ``directory``)."""
    path = directory / "updates.jsonl"
    write_updates(updates, path)
    return read_lines(spark, path)


def _sql(expression: str) -> Any:
    from pyspark.sql import functions as F

    return F.expr(expression)


def _attribute(name: str, date_map: str, date_kind: str) -> str:
    """The ``(kind, num, str)`` struct of one attribute of the variant ``v`` (kind NULL when
    the update does not carry it)."""
    at = _at(name)
    whole = f"variant_get(v, {sql_string(at)})"
    value = f"variant_get(v, {sql_string(at + '.value')})"
    schema = f"schema_of_variant({value})"
    is_date = (
        f"(try_variant_get(v, {sql_string(at + '.type')}, 'string') IN ('DateTime', 'ISO8601') "
        f"AND {schema} = 'STRING')"
    )
    kind = (
        f"CASE WHEN {whole} IS NULL THEN CAST(NULL AS STRING) "
        f"WHEN {value} IS NULL OR {schema} = 'VOID' THEN 'z' "
        f"WHEN {is_date} THEN {date_kind} "
        f"WHEN {schema} = 'STRING' THEN 's' WHEN {schema} = 'BOOLEAN' THEN 'b' "
        f"WHEN {schema} LIKE 'OBJECT%' THEN 'o' WHEN {schema} LIKE 'ARRAY%' THEN 'a' "
        "ELSE 'n' END"
    )
    num = (
        f"CASE WHEN {is_date} THEN try_element_at({date_map}, "
        f"try_variant_get({value}, '$', 'string')) "
        f"ELSE try_variant_get({value}, '$', 'double') + CAST(0.0 AS DOUBLE) END"
    )
    text = f"CASE WHEN {schema} = 'STRING' THEN try_variant_get({value}, '$', 'string') END"
    return f"named_struct('kind', {kind}, 'num', {num}, 'str', {text})"


def parse_updates(
    lines: Any,
    *,
    attributes: Sequence[str] = (),
    validate: bool = True,
    strict: bool = True,
    source: str = "<input>",
    cached: list[Any] | None = None,
) -> Any:
    """The parsed updates of ``(update, text)`` lines (see the module docstring), with the
    named ``attributes`` (those the subscriptions refer to) in ``attrs``; with ``validate``,
    InputError for the first bad line. The lines are parsed once and kept (memory, else
    disk) for the passes that follow; the kept frame is added to ``cached`` for the caller
    to unpersist."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    parsed = lines.select("update", _sql("try_parse_json(text)").alias("v")).persist(
        StorageLevel.MEMORY_AND_DISK
    )
    if cached is not None:
        cached.append(parsed)
    if validate:
        check_lines(lines, strict=strict, source=source)
    dates = _dates(parsed, None if validate else attributes, source=source)
    date_map = (
        "map()"
        if not dates
        else "map(" + ", ".join(f"{sql_string(k)}, CAST({v!r} AS DOUBLE)" for k, v in dates) + ")"
    )
    date_kind = "'n'" if dates is not None else "'x'"
    names = sorted(set(attributes))
    structs = {name: _attribute(name, date_map, date_kind) for name in names}
    attrs = (
        "map(" + ", ".join(f"{sql_string(n)}, {e}" for n, e in structs.items()) + ")"
        if names
        else f"CAST(map() AS {_ATTRS_TYPE})"
    )
    complex_ = " OR ".join(f"coalesce({e}.kind IN ('a', 'x'), false)" for e in structs.values())
    path = "coalesce(try_variant_get(v, '$.servicePath', 'string'), '/')"
    scopes = (
        f"CASE WHEN {path} = '/' THEN array('/', '/#') ELSE concat(array({path}, '/#'), "
        f"transform(sequence(1, size(split(substr({path}, 2), '/'))), "
        f"i -> concat('/', array_join(slice(split(substr({path}, 2), '/'), 1, i), '/'), "
        "'/#'))) END"
    )
    return parsed.select(
        "update",
        _sql("coalesce(try_variant_get(v, '$.tenant', 'string'), '')").alias("tenant"),
        _sql(path).alias("path"),
        _sql(scopes).alias("scopes"),
        _sql("try_variant_get(v, '$.id', 'string')").alias("eid"),
        _sql("coalesce(try_variant_get(v, '$.type', 'string'), 'Thing')").alias("etype"),
        _sql(attrs).alias("attrs"),
        _sql(complex_ or "false").alias("complex"),
    ).where(F.col("eid").isNotNull())


def sql_string(text: str) -> str:
    """``text`` as a Spark SQL string literal."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _at(name: str) -> str:
    """The variant path of a top-level key (identifiers never hold a quote)."""
    return "$['" + name + "']"


def _dates(
    parsed: Any, attributes: Sequence[str] | None, *, source: str
) -> list[tuple[str, float]] | None:
    """The epoch of every distinct DateTime text of the named attributes (every attribute,
    for None; then a bad one raises InputError). None when there are too many to inline:
    those values are then verified."""

    def dated(attribute: str, name: str) -> str:
        return (
            f"CASE WHEN try_variant_get({attribute}, '$.type', 'string') IN "
            "('DateTime', 'ISO8601') THEN named_struct('name', "
            f"{name}, 'text', try_variant_get({attribute}, '$.value', 'string')) END"
        )

    if attributes is None:
        every = (
            "explode(filter(map_values(transform_values(try_variant_get(v, '$', "
            f"'map<string, variant>'), (k, a) -> {dated('a', 'k')})), d -> d.text IS NOT NULL))"
        )
    elif attributes:
        named = ", ".join(
            dated(f"variant_get(v, {sql_string(_at(n))})", sql_string(n))
            for n in sorted(set(attributes))
        )
        every = f"explode(filter(array({named}), d -> d.text IS NOT NULL))"
    else:
        return []
    texts = parsed.select("update", _sql(every).alias("d"))
    distinct = texts.groupBy("d.text").agg(
        _sql("min(named_struct('update', update, 'name', d.name))").alias("first")
    )
    rows = distinct.limit(MAX_DATES + 1).collect()
    found: list[tuple[str, float]] = []
    for text, first in sorted(rows, key=lambda r: r[1][0]):
        epoch = parse_iso8601(text)
        if epoch is None:
            if attributes is None:
                reason = f"typed DateTime but {text!r} is not an ISO 8601 date"
                raise InputError(source, first[0] + 1, first[1], reason)
            continue
        found.append((text, epoch))
    return None if len(rows) > MAX_DATES else found


def check_dates(lines: Any, *, source: str = "<input>") -> None:
    """InputError for the first DateTime value of ``(update, text)`` lines that is not an
    ISO 8601 date (among the first :data:`MAX_DATES` distinct texts)."""
    _dates(lines.select("update", _sql("try_parse_json(text)").alias("v")), None, source=source)


def check_lines(
    lines: Any, *, strict: bool = True, source: str = "<input>", timed: bool = False
) -> None:
    """InputError for the first line that is not a valid update (DateTime values apart:
    :func:`check_dates`; ``timed``: ``time`` is the update's time, and only its kind is
    checked here: the text of a date is read later, by its reader)."""
    from pyspark.sql import functions as F

    parsed = lines.select(
        "update",
        "text",
        _sql("try_variant_get(try_parse_json(text), '$', 'map<string, variant>')").alias("m"),
    )
    text = F.col("text")
    nesting = F.length(text) - F.length(F.regexp_replace(text, r"[\[{]", ""))
    suspicious = (
        F.col("m").isNull()
        | (F.length(text) > _MAX_NATIVE_LENGTH)
        | (nesting > _MAX_NATIVE_NESTING)
        | text.rlike(_SUSPICIOUS)
    )
    ident = (
        f"(schema_of_variant(X) = 'STRING' AND variant_get(X, '$', 'string') RLIKE '{_IDENT}' "
        f"AND NOT variant_get(X, '$', 'string') RLIKE '{_FORBIDDEN_IN_IDENT}')"
    )

    def ok(x: str) -> str:
        return ident.replace("X", x)

    attr_problem = (
        "CASE WHEN NOT (k RLIKE '" + _IDENT + "') OR k RLIKE '" + _FORBIDDEN_IN_IDENT + "' "
        "THEN concat(k, ': invalid attribute name') "
        "WHEN k IN ('geo:distance', '*') THEN concat(k, ': attribute name is reserved') "
        "WHEN try_variant_get(a, '$', 'map<string, variant>') IS NULL "
        "THEN concat(k, ': an attribute must be a JSON object') "
        "WHEN size(map_filter(try_variant_get(a, '$', 'map<string, variant>'), "
        "(q, w) -> q NOT IN ('type', 'value', 'metadata'))) > 0 "
        "THEN concat(k, ': unrecognized attribute property') "
        "WHEN variant_get(a, '$.type') IS NOT NULL "
        "AND schema_of_variant(variant_get(a, '$.type')) != 'VOID' "
        "AND NOT " + ok("variant_get(a, '$.type')") + " THEN concat(k, ': invalid attribute type') "
        "WHEN variant_get(a, '$.metadata') IS NOT NULL "
        "AND schema_of_variant(variant_get(a, '$.metadata')) NOT IN ('VOID', 'OBJECT<>') "
        "THEN concat(k, ': metadata must be a JSON object') END"
    )
    time_problem = (
        "WHEN m['time'] IS NOT NULL AND schema_of_variant(m['time']) NOT IN ('STRING', 'VOID') "
        "AND (schema_of_variant(m['time']) = 'BOOLEAN' "
        "OR try_variant_get(m['time'], '$', 'double') IS NULL) "
        "THEN 'time: neither epoch seconds nor an ISO 8601 date' "
        if timed
        else ""
    )
    fields = ", ".join(sql_string(f) for f in sorted(TIMED_FIELDS if timed else ENTITY_FIELDS))
    problem = (
        "CASE WHEN m['id'] IS NULL THEN 'id: entity id is missing' "
        "WHEN NOT " + ok("m['id']") + " THEN 'id: invalid entity id' "
        "WHEN m['type'] IS NOT NULL AND NOT " + ok("m['type']") + " "
        "THEN 'type: invalid entity type' "
        "WHEN m['tenant'] IS NOT NULL AND NOT (schema_of_variant(m['tenant']) = 'STRING' AND "
        "variant_get(m['tenant'], '$', 'string') RLIKE '" + _TENANT + "') "
        "THEN 'tenant: invalid tenant' "
        "WHEN m['servicePath'] IS NOT NULL AND NOT (schema_of_variant(m['servicePath']) = "
        "'STRING' AND variant_get(m['servicePath'], '$', 'string') RLIKE '" + _PATH + "') "
        "THEN 'servicePath: invalid service path' "
        + time_problem
        + "ELSE try_element_at(filter(map_values(transform_values(map_filter(m, (k, a) -> k NOT IN "
        f"({fields})), (k, a) -> " + attr_problem + ")), "
        "p -> p IS NOT NULL), 1) END"
    )
    checked = parsed.where(~suspicious).select("update", _sql(problem).alias("problem"))
    bad = checked.where(F.col("problem").isNotNull()).orderBy("update").limit(1).collect()
    first_native = bad[0][0] if bad else None
    doubtful = parsed.where(suspicious).select("update", "text")
    if first_native is not None:
        doubtful = doubtful.where(F.col("update") < first_native)
    found = doubtful.rdd.mapPartitions(_python_check(strict, timed)).collect()
    if found:
        line, field, reason = min(found)
        raise InputError(source, line + 1, field, reason)
    if bad:
        line, problem_text = bad[0]
        field, _, reason = problem_text.partition(": ")
        # the reference reading words the reason the way every other error is worded
        row = parsed.where(F.col("update") == line).select("text").collect()
        with contextlib.suppress(ValueError):  # not JSON to Python: the native reason stands
            update_from_json(
                json.loads(row[0][0]), strict=strict, source=source, line=line + 1, timed=timed
            )
        raise InputError(source, line + 1, field, reason)


def _python_check(strict: bool, timed: bool) -> Any:
    def check(rows: Iterator[Any]) -> Iterator[tuple[int, str, str]]:
        for row in rows:
            line = row[0]
            error = line_error(row[1], strict=strict, line=line + 1, timed=timed)
            if error is not None:
                yield (line, error.field, error.reason)

    return check
