"""The ``engine`` method: each Spark task runs the matchers' own engine on Arrow batches.

The ``join`` method (:mod:`spark_matcher.match`) expresses matching relationally: it is
exact, but every candidate (update, clause) pair is a row, and W-IoT gives about a thousand
per update. This method ships the subscriptions instead, partitioned by the matchers'
selector, and matches with the same :class:`~broker.matching.engine.Engine` the matchers
run:

1. the subscriptions of each partition are packed (msgpack) into one broadcast;
2. the lines ``(update, text)`` are split among the tasks as the file is; each task reads
   its Arrow batches (``mapInArrow``, a batch at a time, never a row-at-a-time UDF), builds
   the updates (:func:`read_update`), and matches each batch against every partition's
   engine, built once per Python worker and broadcast and kept while the worker lives;
3. a task yields ``(update, matches)`` per update and partition, ``matches`` the numbers
   of the subscriptions matched; the numbers are exploded and joined with the broadcast
   table of subscription ids, giving the same ``(update, subscription)`` rows as the join
   method.

Checking (``validate``) is the join method's: the native checks, then DateTime values,
before the job; a line the tasks still cannot read (a bad date beyond the first
:data:`~spark_matcher.source.MAX_DATES` distinct ones) fails the job with its InputError.
Without checking, lines that are not updates are left out, as the join method leaves them
out.
"""

from __future__ import annotations

import gc
import json
import math
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson

from broker.errors import InvalidInput
from broker.model.attribute import Attribute, default_type
from broker.model.subscription import Subscription
from broker.model.update import DEFAULT_ENTITY_TYPE, ContextUpdate
from broker.partition.selector import RendezvousSelector
from broker.serialization import packb, subscription_to_obj
from spark_matcher.entities import ENTITY_FIELDS, InputError, line_error, update_from_json
from spark_matcher.match import FrameMatcher
from spark_matcher.plan import live, partition_selector

__all__ = ["EngineMatcher", "read_update"]

_MATCHES_SCHEMA = "update BIGINT, matches ARRAY<INT>"
_IDS_SCHEMA = "number INT, subscription STRING"
_BATCH = 2_000  # updates matched by the engine at a time

# Engines built in this Python worker: broadcast token -> one engine (and its slot -> number
# table) per partition. Workers are reused across tasks, so a broadcast is unpacked and
# its engines built once per worker, not once per task.
_ENGINES: dict[str, list[tuple[Any, Any]]] = {}

# Attributes are immutable, and most values repeat (a station's name, a reading's level):
# one Attribute per (type, value) read recently is shared by the updates that hold it.
_SHARED: dict[tuple[Any, type, Any], Attribute] = {}
_SHARED_MAX = 1 << 17


def read_update(text: str) -> ContextUpdate | None:
    """The update of one JSON line, None if the line is not one.

    Lines whose attributes have no metadata are read without checking their identifiers
    again (the input was checked natively, or checking was not asked for); any other line
    is read by :func:`~spark_matcher.entities.update_from_json`."""
    try:
        body = orjson.loads(text)
    except ValueError:  # what orjson refuses (NaN, huge integers) json may still read
        try:
            body = json.loads(text)
        except ValueError:
            return None
    if type(body) is not dict:
        return None
    entity_id = body.get("id")
    if type(entity_id) is not str:
        return None
    try:
        attributes: dict[str, Attribute] = {}
        for name, item in body.items():
            if name in ENTITY_FIELDS:
                continue
            if (
                type(item) is not dict
                or item.get("metadata")
                or len(item) > 2
                or type(item.get("type", "")) is not str
            ):
                return update_from_json(body, strict=False)
            value = item.get("value")
            kind = value.__class__
            if kind is float or kind is str or kind is int:  # most repeat: share them
                key = (item.get("type"), kind, value)
                attribute = _SHARED.get(key)
                if attribute is None:
                    if len(_SHARED) >= _SHARED_MAX:
                        _SHARED.clear()
                    attribute = _SHARED[key] = Attribute.unchecked(
                        key[0] or default_type(value), value
                    )
                attributes[name] = attribute
            else:
                attributes[name] = Attribute.unchecked(
                    item.get("type") or default_type(value), value
                )
        entity_type = body.get("type", DEFAULT_ENTITY_TYPE)
        tenant = body.get("tenant", "")
        path = body.get("servicePath", "/")
        if not (type(entity_type) is str and type(tenant) is str and type(path) is str):
            return update_from_json(body, strict=False)
        return ContextUpdate.unchecked(entity_id, attributes, entity_type, tenant, path)
    except (InvalidInput, InputError):
        return None


def _engines(token: str, broadcast: Any) -> list[tuple[Any, Any]]:
    """The engines of a broadcast (named by ``token``) in this worker: (engine, slot ->
    subscription number)."""
    import numpy as np

    from broker.matching.engine import Engine
    from broker.serialization import subscription_from_obj, unpackb

    held = _ENGINES.get(token)
    if held is not None:
        return held
    if _ENGINES:  # one set of subscriptions at a time per worker
        _ENGINES.clear()
        gc.unfreeze()
        gc.collect()
    held = []
    gc.disable()  # nothing built here is garbage: no collection while building
    try:
        for packed in broadcast.value:
            numbers, objs = unpackb(packed, max_size=len(packed))
            subscriptions = [subscription_from_obj(obj) for obj in objs]
            engine = Engine()
            engine.add_many(subscriptions)
            engine.compact()
            slots = np.array([engine.slot_of(s.id) for s in subscriptions], dtype=np.int64)
            table = np.full(int(slots.max()) + 1 if len(slots) else 0, -1, dtype=np.int32)
            table[slots] = np.asarray(numbers, dtype=np.int32)
            held.append((engine, table))
    finally:
        # what was built lives as long as the worker: keep collections from scanning it
        # again and again (as a matcher process does after its start-up)
        gc.freeze()
        gc.enable()
    _ENGINES[token] = held
    return held


def _match_batches(token: str, broadcast: Any, now: float, source: str | None) -> Any:
    """The ``mapInArrow`` function: Arrow batches of ``(update, text)`` to ``(update,
    matches)``. With a ``source`` (the lines were checked), a line that still cannot be
    read fails the task with its InputError."""

    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import numpy as np
        import pyarrow as pa

        engines = _engines(token, broadcast)
        for batch in batches:
            numbers = batch.column(0).to_numpy(zero_copy_only=False)
            texts = batch.column(1).to_pylist()
            for start in range(0, len(texts), _BATCH):
                kept: list[int] = []
                updates: list[ContextUpdate] = []
                for i in range(start, min(start + _BATCH, len(texts))):
                    text = texts[i]
                    update = read_update(text) if text is not None else None
                    if update is not None:
                        kept.append(i)
                        updates.append(update)
                    elif source is not None:
                        _fail(source, int(numbers[i]), text)
                if not updates:
                    continue
                kept_numbers = pa.array(numbers[kept], type=pa.int64())
                for engine, table in engines:  # a row per update and partition
                    found = engine.match_batch_slots(updates, now)
                    lengths = np.fromiter(map(len, found), dtype=np.int32, count=len(found))
                    offsets = np.zeros(len(found) + 1, dtype=np.int32)
                    np.cumsum(lengths, out=offsets[1:])
                    values = table[np.concatenate(found)]
                    yield pa.RecordBatch.from_arrays(
                        [kept_numbers, pa.ListArray.from_arrays(offsets, values)],
                        names=["update", "matches"],
                    )

    return run


def _fail(source: str, number: int, text: str | None) -> None:
    """Raise the InputError of a line the fast reader could not read."""
    error = line_error(text or "", source=source, line=number + 1)
    raise error or InputError(source, number + 1, "", "not an update")


class EngineMatcher(FrameMatcher):
    """One set of subscriptions, partitioned and broadcast, matched by the engine in every
    task. The same interface as :class:`spark_matcher.match.SparkMatcher`."""

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
        self._F = F
        self.now = time.time() if now is None else now
        started = time.perf_counter()
        selector = selector or partition_selector(partitions)
        held = [s for s in subscriptions if live(s, self.now)]
        self.valid_until = min((s.expires for s in held if s.expires is not None), default=math.inf)
        index = {name: i for i, name in enumerate(selector.owners)}
        parts: list[tuple[list[int], list[Any]]] = [([], []) for _ in selector.owners]
        owners = selector.owners_of([s.id for s in held]) if held else []
        for number, (subscription, owner) in enumerate(zip(held, owners, strict=True)):
            numbers, objs = parts[index[owner]]
            numbers.append(number)
            objs.append(subscription_to_obj(subscription))
        self.partitions = len(parts)
        self.subscriptions = len(held)
        self._broadcast = spark.sparkContext.broadcast([packb(part) for part in parts])
        self._token = uuid.uuid4().hex
        self._directory = tempfile.TemporaryDirectory(prefix="silbo-spark-")
        where = Path(self._directory.name) / "ids.jsonl"
        with where.open("w", encoding="utf-8") as out:
            for number, subscription in enumerate(held):
                out.write(json.dumps({"number": number, "subscription": subscription.id}))
                out.write("\n")
        self._ids = spark.read.schema(_IDS_SCHEMA).json(str(where)).cache()
        self._ids.count()
        self.planning_s = time.perf_counter() - started

    def release(self) -> None:
        """Nothing is kept between batches."""

    def close(self) -> None:
        """Drop the broadcast, the id table and the files behind them."""
        self.release()
        self._ids.unpersist()
        self._broadcast.unpersist()
        self._directory.cleanup()

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
        expired by then; with ``validate``, InputError for the first bad line."""
        from spark_matcher.source import check_dates, check_lines

        F = self._F
        now = self.now if now is None else now
        if now >= self.valid_until:
            raise ValueError("a subscription has expired since the tables were built")
        if validate:
            check_lines(lines, source=source)
            check_dates(lines, source=source)
        matched = lines.select("update", "text").mapInArrow(
            _match_batches(self._token, self._broadcast, now, source if validate else None),
            _MATCHES_SCHEMA,
        )
        numbers = matched.select("update", F.explode("matches").alias("number"))
        return numbers.join(F.broadcast(self._ids), "number").select("update", "subscription")
