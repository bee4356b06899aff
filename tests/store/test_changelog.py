"""The changelog of a store's partitions (broker.store.changelog): off by default, one record
per change in the write's commit, readable once settled, numbered on across a failover, a
restart, a copy and a trim."""

from __future__ import annotations

import asyncio
import json

import pytest

from broker.store.changelog import CHANGELOG_SPACE, change_row
from broker.store.entities import Entities, MemoryEngine, partition_of
from broker.store.semantics import Mode
from broker.store.wire import Intent


def _write(mode: Mode, entity_id: str = "E1", **attrs: object) -> Intent:
    attributes = {k: {"type": "Number", "value": v, "metadata": {}} for k, v in attrs.items()}
    return Intent(mode, entity_id, "T", "/", "", attributes)


def _changes(entities: Entities, partition: int, after: int = 0) -> list[tuple[int, bytes]]:
    bound = entities.changelog.visible(partition)
    found, _more = entities.read_changes({partition: after}, {partition: bound}, 1000)
    return found[partition]


def _keys(engine: MemoryEngine) -> list[bytes]:
    return [k for k, _v in engine.scan(CHANGELOG_SPACE)]


P = partition_of("", "E1")


def test_off_by_default_a_write_records_no_change() -> None:
    engine = MemoryEngine()
    entities = Entities(engine)
    asyncio.run(entities.apply([_write(Mode.CREATE, t=1), _write(Mode.UPSERT, t=2)]))
    assert _keys(engine) == []
    assert _changes(entities, P) == []


def test_every_change_is_one_record_with_the_archives_row() -> None:
    engine = MemoryEngine()
    entities = Entities(engine, record_changes=True)
    writes = [
        (_write(Mode.CREATE, t=1), 100.0),
        (_write(Mode.UPSERT, t=2), 101.0),
        (_write(Mode.UPSERT, t=2), 102.0),  # changes nothing: an entityUpdate, recorded
        (_write(Mode.UPDATE, "E1", missing=1), 103.0),  # fails: no change, nothing recorded
        (_write(Mode.DELETE_ENTITY), 104.0),
    ]
    for intent, now in writes:
        asyncio.run(entities.apply([intent], now=now))
    rows = [change_row(P, sequence, record) for sequence, record in _changes(entities, P)]
    assert [r.alteration for r in rows] == [
        "entityCreate",
        "entityChange",
        "entityUpdate",
        "entityDelete",
    ]
    assert [r.time for r in rows] == [100_000_000, 101_000_000, 102_000_000, 104_000_000]
    assert [r.sequence for r in rows] == sorted({r.sequence for r in rows})
    assert [r.changed for r in rows] == [["t"], ["t"], [], []]
    assert [r.requested for r in rows] == [["t"], ["t"], ["t"], []]
    first, _change, update, deleted = rows
    assert (first.tenant, first.day, first.partition) == ("", "1970-01-01", P)
    assert (first.entity_id, first.entity_type, first.service_path) == ("E1", "T", "/")
    assert first.date_created == 100_000_000
    assert json.loads(update.entity) == {
        "id": "E1",
        "type": "T",
        "tenant": "",
        "servicePath": "/",
        "t": {"type": "Number", "value": 2, "metadata": {}},
    }
    assert json.loads(deleted.entity)["t"]["value"] == 2  # a delete: the entity as it was


def test_a_change_is_read_only_once_its_write_is_durable_on_the_backups() -> None:
    async def run() -> None:
        entities = Entities(MemoryEngine(), record_changes=True)
        await entities.apply([_write(Mode.CREATE, t=1)], now=10.0)
        shipped = asyncio.Event()
        release = asyncio.Event()

        async def replicate(puts: object, deletes: object) -> None:
            shipped.set()
            await release.wait()

        task = asyncio.create_task(
            entities.apply([_write(Mode.UPSERT, t=2)], now=11.0, replicate=replicate)
        )
        await shipped.wait()
        assert len(_changes(entities, P)) == 1  # committed here, not yet on the backup
        release.set()
        await task
        assert len(_changes(entities, P)) == 2

        async def failing(puts: object, deletes: object) -> None:
            raise RuntimeError("the backup is gone and cannot be fenced")

        with pytest.raises(RuntimeError):
            await entities.apply([_write(Mode.UPSERT, t=3)], now=12.0, replicate=failing)
        assert len(_changes(entities, P)) == 2  # never settled: never read (the store stops)

    asyncio.run(run())


def test_sequences_go_on_across_a_failover_a_copy_a_trim_and_a_clock_gone_back() -> None:
    async def run() -> None:
        primary_engine, backup_engine = MemoryEngine(), MemoryEngine()
        primary = Entities(primary_engine, record_changes=True)
        backup = Entities(backup_engine, record_changes=True)

        async def ship(puts: list[tuple[bytes, bytes]], deletes: list[bytes]) -> None:
            await backup.store(puts, deletes)

        for i in range(3):
            await primary.apply([_write(Mode.UPSERT, t=i)], now=1000.0 + i, replicate=ship)
        before = [s for s, _r in _changes(primary, P)]
        assert [s for s, _r in _changes(backup, P)] == before
        # the backup becomes primary, its clock 500 s behind: it numbers on all the same
        await backup.apply([_write(Mode.UPSERT, t=9)], now=500.0)
        after = [s for s, _r in _changes(backup, P)]
        assert after[:3] == before and after[3] > before[2]
        # a scale copies the partition to a new store, which numbers on
        copy_engine = MemoryEngine()
        copy = Entities(copy_engine, record_changes=True)
        await copy.store(list(backup.partition_items([P])), [])
        await copy.apply([_write(Mode.UPSERT, t=10)], now=400.0)
        copied = [s for s, _r in _changes(copy, P)]
        assert copied[:4] == after and copied[4] > after[3]
        # trimmed to nothing, then restarted on its storage: the mark keeps the numbering
        gone, unfinished = await copy.trim_changes({P: copied[-1]})
        assert (gone, unfinished, _changes(copy, P)) == (5, [], [])
        restarted = Entities(copy_engine, record_changes=True)
        await restarted.apply([_write(Mode.UPSERT, t=11)], now=300.0)
        assert next(s for s, _r in _changes(restarted, P)) > copied[-1]

    asyncio.run(run())


def test_a_trim_deletes_up_to_a_sequence_on_the_backups_too_and_reads_go_on_after() -> None:
    async def run() -> None:
        backup = Entities(MemoryEngine())

        async def ship(puts: list[tuple[bytes, bytes]], deletes: list[bytes]) -> None:
            await backup.store(puts, deletes)

        primary = Entities(MemoryEngine(), record_changes=True)
        for i in range(5):
            await primary.apply([_write(Mode.UPSERT, t=i)], now=2000.0 + i, replicate=ship)
        sequences = [s for s, _r in _changes(primary, P)]
        assert await primary.trim_changes({P: sequences[2]}, ship) == (3, [])
        assert [s for s, _r in _changes(primary, P)] == sequences[3:]
        assert [s for s, _r in _changes(backup, P)] == sequences[3:]
        assert [s for s, _r in _changes(primary, P, after=sequences[3])] == sequences[4:]
        assert await primary.trim_changes({P: sequences[2]}, ship) == (0, [])

    asyncio.run(run())


def test_a_read_is_bounded_and_says_which_partitions_have_more() -> None:
    entities = Entities(MemoryEngine(), record_changes=True)
    ids = ["E1"]
    for i in range(100):  # three entities of three partitions
        if len(ids) < 3 and partition_of("", f"X{i}") not in {partition_of("", e) for e in ids}:
            ids.append(f"X{i}")
    for step in range(4):
        for entity_id in ids:
            asyncio.run(entities.apply([_write(Mode.UPSERT, entity_id, t=step)]))
    partitions = [partition_of("", e) for e in ids]
    cursors = dict.fromkeys(partitions, 0)
    bounds = {p: entities.changelog.visible(p) for p in partitions}
    found, more = entities.read_changes(cursors, bounds, 6)
    assert [len(found.get(p, [])) for p in partitions] == [4, 2, 0]
    assert more == partitions[1:]
    found, more = entities.read_changes(cursors, bounds, 100)
    assert [len(found[p]) for p in partitions] == [4, 4, 4] and more == []
