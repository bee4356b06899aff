"""The entities of one store: writes in order, durable, resolved by id; expiry; the wire."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from broker.errors import AlreadyExists, AmbiguousEntity, InvalidInput, NotFound, SerializationError
from broker.model.change import Alteration
from broker.roles.store_aggregation import storable
from broker.store.engine import GroupCommitter, open_engine
from broker.store.entities import (
    PARTITIONS,
    Entities,
    MemoryEngine,
    document_key,
    new_write_id,
    partition_of,
)
from broker.store.history import HISTORY_SPACE, HistoryOptions
from broker.store.semantics import Mode
from broker.store.wire import (
    Intent,
    applied_of,
    decode_results,
    decode_writes,
    encode_results,
    encode_writes,
    pack,
    result_row,
    unpack,
)


def _attr(value: object, type_: str = "Number") -> dict[str, object]:
    return {"type": type_, "value": value, "metadata": {}}


def _write(
    mode: Mode, entity_id: str = "E1", entity_type: str | None = "T", **attrs: object
) -> Intent:
    return Intent(mode, entity_id, entity_type, "/", "", {k: _attr(v) for k, v in attrs.items()})


def test_writes_apply_in_order_within_one_call() -> None:
    entities = Entities(MemoryEngine())
    results = asyncio.run(
        entities.apply(
            [
                _write(Mode.CREATE, temperature=1),
                _write(Mode.UPDATE, temperature=2),
                _write(Mode.CREATE, temperature=3),
            ]
        )
    )
    assert [r.change.alteration if r.change else None for r in results] == [
        Alteration.CREATE,
        Alteration.CHANGE,
        None,
    ]
    assert isinstance(results[2].error, AlreadyExists)
    (stored,) = entities.documents("", ["E1"])
    assert stored.attributes["temperature"]["value"] == 2


def test_an_entity_deleted_and_created_again_in_one_call_is_stored_as_created() -> None:
    engine = MemoryEngine()
    entities = Entities(engine)
    asyncio.run(entities.apply([_write(Mode.CREATE, temperature=1)]))
    asyncio.run(entities.apply([_write(Mode.DELETE_ENTITY), _write(Mode.CREATE, temperature=5)]))
    # read from the engine again: what the commit wrote, not what the writer holds
    (stored,) = Entities(engine).documents("", ["E1"])
    assert stored.attributes["temperature"]["value"] == 5
    asyncio.run(
        entities.apply([_write(Mode.CREATE, "E2", pressure=1), _write(Mode.DELETE_ENTITY, "E2")])
    )
    assert list(Entities(engine).documents("", ["E2"])) == []


def test_a_write_without_type_finds_the_one_entity_of_its_id() -> None:
    entities = Entities(MemoryEngine())
    asyncio.run(entities.apply([_write(Mode.CREATE, entity_type="Room", t=1)]))
    (result,) = asyncio.run(entities.apply([_write(Mode.UPDATE, entity_type=None, t=5)]))
    assert result.document is not None and result.document.type == "Room"
    (missing,) = asyncio.run(entities.apply([_write(Mode.UPDATE, "E2", None, t=5)]))
    assert isinstance(missing.error, NotFound)
    (created,) = asyncio.run(entities.apply([_write(Mode.UPSERT, "E2", None, t=5)]))
    assert created.document is not None and created.document.type == "Thing"


def test_an_ambiguous_id_is_409_and_changes_nothing() -> None:
    entities = Entities(MemoryEngine())
    asyncio.run(
        entities.apply(
            [_write(Mode.CREATE, entity_type="A", t=1), _write(Mode.CREATE, entity_type="B", t=1)]
        )
    )
    (result,) = asyncio.run(entities.apply([_write(Mode.UPDATE, entity_type=None, t=9)]))
    assert isinstance(result.error, AmbiguousEntity) and result.change is None
    assert sorted(d.attributes["t"]["value"] for d in entities.documents("", ["E1"])) == [1, 1]


def test_batch_append_strict_creates_a_missing_entity() -> None:
    entities = Entities(MemoryEngine())
    intent = Intent(Mode.APPEND_STRICT, "E9", "T", "/", "", {"a": _attr(1)}, upsert=True)
    (made,) = asyncio.run(entities.apply([intent]))
    assert made.change is not None and made.change.alteration is Alteration.CREATE
    (again,) = asyncio.run(entities.apply([intent]))
    assert again.change is None and again.error is not None  # the attribute exists: strict


def test_concurrent_writes_of_one_entity_see_each_other_before_they_commit(
    tmp_path: Path,
) -> None:
    async def run() -> list[int]:
        engine = open_engine("rocksdb", tmp_path / "db")
        committer = GroupCommitter(engine)
        entities = Entities(engine, committer)
        await entities.apply([_write(Mode.CREATE, n=0)])
        increments = [
            Intent(Mode.UPDATE, "E1", "T", "/", "", {"n": _attr({"$inc": 1})}) for _ in range(50)
        ]
        await asyncio.gather(*(entities.apply([i]) for i in increments))
        await committer.close()
        engine.close()
        reopened = Entities(open_engine("rocksdb", tmp_path / "db"))
        return [d.attributes["n"]["value"] for d in reopened.documents("", ["E1"])]

    assert asyncio.run(run()) == [50]  # every $inc applied once, in order, and durable


def test_expired_entities_are_deleted_from_the_index() -> None:
    entities = Entities(MemoryEngine())
    expiring = {"dateExpires": _attr("2030-01-01T00:00:00Z", "DateTime"), "t": _attr(1)}
    asyncio.run(
        entities.apply(
            [
                Intent(Mode.CREATE, "E1", "T", "/", "", expiring),
                Intent(Mode.CREATE, "E2", "T", "/", "", expiring),
                _write(Mode.CREATE, "E3", t=1),
            ]
        )
    )
    renewed = {"dateExpires": _attr("2040-01-01T00:00:00Z", "DateTime")}
    asyncio.run(entities.apply([Intent(Mode.UPDATE, "E2", "T", "/", "", renewed)]))
    before = 1_893_456_000.0 - 1  # 2030-01-01 minus a second
    assert asyncio.run(entities.expire(before)) == 0
    assert asyncio.run(entities.expire(before + 2)) == 1
    assert sorted(d.id for d in entities.documents("")) == ["E2", "E3"]
    assert asyncio.run(entities.expire(2_300_000_000.0)) == 1
    assert sorted(d.id for d in entities.documents("")) == ["E3"]


def test_documents_are_read_by_tenant_and_partition() -> None:
    entities = Entities(MemoryEngine())
    writes = [
        Intent(Mode.CREATE, f"E{i}", "T", "/", tenant, {"t": _attr(i)})
        for i in range(40)
        for tenant in ("", "acme")
    ]
    asyncio.run(entities.apply(writes))
    assert len(list(entities.documents("acme"))) == 40
    some = {partition_of("acme", f"E{i}") for i in range(5)}
    found = {d.id for d in entities.documents("acme", partitions=some)}
    assert found == {f"E{i}" for i in range(40) if partition_of("acme", f"E{i}") in some}
    assert min(some) >= 0 and max(some) < PARTITIONS


def test_identifiers_with_nul_are_refused() -> None:
    with pytest.raises(InvalidInput):
        document_key("", "/", "a\x00b", "T")
    entities = Entities(MemoryEngine())
    (result,) = asyncio.run(entities.apply([_write(Mode.CREATE, "a\x00b", t=1)]))
    assert isinstance(result.error, InvalidInput)


def test_writes_and_results_round_trip_the_wire() -> None:
    intents = [
        _write(Mode.CREATE, t=1),
        Intent(Mode.APPEND_STRICT, "x", None, "/a", "t", {}, True, True, True, "c", True),
    ]
    assert decode_writes(encode_writes(intents)) == intents
    entities = Entities(MemoryEngine())
    results = asyncio.run(entities.apply([*intents[:1], *intents[:1]]))
    decoded = decode_results(encode_results(results))
    assert decoded[0].document == results[0].document
    assert decoded[0].change == results[0].change
    assert isinstance(decoded[1].error, AlreadyExists)
    assert str(decoded[1].error) == str(results[1].error)


def test_another_wire_version_is_refused() -> None:
    assert unpack(pack([1, 2])) == [1, 2]
    import msgpack

    with pytest.raises(SerializationError, match="wire version"):
        unpack(msgpack.packb([99, []]))
    with pytest.raises(SerializationError):
        unpack(b"\xc1")
    with pytest.raises(SerializationError):
        decode_writes(pack([["nonsense"]]))


def test_a_write_sent_again_applies_once_and_answers_its_first_outcome(tmp_path: Path) -> None:
    async def run() -> tuple[list[object], int]:
        engine = open_engine("rocksdb", tmp_path / "db")
        committer = GroupCommitter(engine)
        entities = Entities(engine, committer)
        await entities.apply([_write(Mode.CREATE, n=0)])
        write_id = new_write_id()
        inc = Intent(Mode.UPDATE, "E1", "T", "/", "", {"n": _attr({"$inc": 5})}, write_id=write_id)
        # the second sending arrives while the first is still being committed, the third after
        first, second = await asyncio.gather(entities.apply([inc]), entities.apply([inc]))
        (third,) = await entities.apply([inc])
        await committer.close()
        engine.close()
        reopened = Entities(open_engine("rocksdb", tmp_path / "db"))
        (fourth,) = await reopened.apply([inc])  # after a restart: still known
        (stored,) = reopened.documents("", ["E1"])
        answers = [first[0], second[0], third, fourth]
        values = [a.document.attributes["n"]["value"] for a in answers if a.document]
        return values, stored.attributes["n"]["value"]

    values, stored = asyncio.run(run())
    assert values == [5, 5, 5, 5] and stored == 5


def test_write_outcomes_are_forgotten_after_a_while() -> None:
    entities = Entities(MemoryEngine())
    old = Intent(Mode.CREATE, "A", "T", "/", "", {}, write_id=new_write_id(1000.0))
    new = Intent(Mode.CREATE, "B", "T", "/", "", {}, write_id=new_write_id(5000.0))
    entities.apply_now([old, new])
    assert entities.forget_writes(3000.0) == 1
    (again,) = entities.apply_now([old])
    assert isinstance(again.error, AlreadyExists)  # forgotten: applied anew (and refused)
    (known,) = entities.apply_now([new])
    assert known.change is not None  # still known: the first outcome


def test_write_outcomes_move_with_their_partition() -> None:
    primary = Entities(MemoryEngine())
    primary.apply_now([_write(Mode.CREATE, n=0)])
    inc = Intent(
        Mode.UPDATE, "E1", "T", "/", "", {"n": _attr({"$inc": 5})}, write_id=new_write_id()
    )
    primary.apply_now([inc])
    partition = partition_of("", "E1")
    copy = Entities(MemoryEngine())  # a store that took the partition over (recovery, scale)
    asyncio.run(copy.store(list(primary.partition_items([partition])), []))
    (again,) = copy.apply_now([inc])  # its sender sends it again to the new primary
    assert again.document is not None and again.document.attributes["n"]["value"] == 5
    (stored,) = copy.documents("", ["E1"])
    assert stored.attributes["n"]["value"] == 5  # applied once, not twice
    other = Entities(MemoryEngine())  # what other partitions hold has none of it
    asyncio.run(other.store(list(primary.partition_items([(partition + 1) % PARTITIONS])), []))
    assert list(other.partition_items(range(PARTITIONS))) == []


def test_on_lmdb_a_key_too_long_is_refused_alone_and_the_store_goes_on(tmp_path: Path) -> None:
    """LMDB takes keys of 511 bytes: an entity whose id, type and service path make a longer
    key is refused (400), not a storage failure (it stopped the store); an attribute whose
    history key would be too long keeps no history; the other writes apply."""

    async def run() -> None:
        engine = open_engine("lmdb", tmp_path / "db", durable=False)
        committer = GroupCommitter(engine)
        entities = Entities(engine, committer, history=HistoryOptions(), record_changes=True)
        long_one = Intent(Mode.UPSERT, "E" * 256, "T" * 250, "/", "", {"t": _attr(1)})
        near = Intent(Mode.UPSERT, "F" * 240, "T" * 240, "/", "", {"a" * 200: _attr(1)})
        results = await entities.apply([_write(Mode.CREATE, t=1), long_one, near])
        error = results[1].error
        assert type(error) is InvalidInput and "at most 502" in str(error)  # 400 BadRequest
        assert type(applied_of(result_row(results[1], None, None)).error) is InvalidInput
        assert results[0].error is None and results[2].error is None
        found = {d.id for d in entities.documents("", ["E1", "F" * 240, "E" * 256])}
        assert found == {"E1", "F" * 240}
        recorded = [k for k, _v in engine.scan(HISTORY_SPACE)]
        assert recorded and all(len(k) <= 511 for k in recorded)
        (again,) = await entities.apply([_write(Mode.UPDATE, t=2)])  # it serves on
        assert again.error is None
        await committer.close()
        engine.close()

    asyncio.run(run())


def test_aggregation_records_too_long_for_lmdb_are_left_out_of_the_write(tmp_path: Path) -> None:
    engine = open_engine("lmdb", tmp_path / "db", durable=False)
    short, long_key = (b"g" + b"k" * 100, b"1"), (b"g" + b"k" * 600, b"2")
    kept, dropped = storable([short, long_key], engine.max_key_size)
    assert kept == [short] and dropped == 1
    engine.commit(kept, [])  # what is kept, the engine takes
    assert engine.get(short[0]) == b"1"
    assert storable([short, long_key], None) == ([short, long_key], 0)  # RocksDB: no limit
    engine.close()
