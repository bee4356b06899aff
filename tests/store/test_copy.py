"""What a store copies when partitions arrive to it (broker.roles.store_copy): a partition
that arrives again is copied, not kept stale, whether the store never saw the settled layout
that took it away or a primary still on the older layout shipped it a write after it left
(both lost an acknowledged ``$inc`` on CI: 1 -> 2 -> 1 stores)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from broker.roles.store_copy import Copier
from broker.store.entities import Entities, MemoryEngine, document_key, partition_of
from broker.store.layout import Registration, StoreLayout, StoreView
from broker.store.semantics import Document
from broker.store.wire import pack

FIRST = StoreLayout(1, ("store-1",))
OUT = FIRST.transition(("store-1", "store-2"))  # version 2
SETTLED = OUT.settled()  # version 3: store-1 never sees it (a watch reports the newest)
BACK = SETTLED.transition(("store-1",))  # version 4: what store-2 held comes back


def _document(entity_id: str, n: int) -> tuple[bytes, bytes]:
    attributes = {"n": {"type": "Number", "value": n, "metadata": {}}}
    document = Document(entity_id, "T", "/", "", attributes, 1.0, 1.0, None, {})
    return document_key("", "/", entity_id, "T"), document.to_bytes()


def _an_id_in(partitions: list[int]) -> str:
    return next(f"E{i}" for i in range(10_000) if partition_of("", f"E{i}") in partitions)


@pytest.mark.parametrize("seen", [False, True], ids=["settled-unseen", "late-shipment"])
def test_a_partition_that_arrives_again_is_copied_again(seen: bool) -> None:
    arriving = BACK.arriving_of("store-1")
    assert arriving  # store-2's partitions come back to store-1
    entity = _an_id_in(arriving)
    stale_key, stale = _document(entity, 4)  # what store-1 kept when its partition left
    _key, fresh = _document(entity, 5)  # written on store-2 meanwhile
    gone_id = next(
        f"G{i}" for i in range(10_000) if partition_of("", f"G{i}") == partition_of("", entity)
    )
    gone_key, gone = _document(gone_id, 1)  # deleted on store-2 meanwhile
    asked: list[bytes] = []

    async def stream(store: str, body: bytes) -> AsyncIterator[bytes]:
        assert store == "store-2"
        asked.append(body)
        yield pack([(stale_key, fresh)])

    async def run() -> None:
        entities = Entities(MemoryEngine())
        copier = Copier("store-1", "here", entities, stream)
        copier.start_whole(FIRST)
        if seen:  # it drops the partition, then a write in flight on store-2 ships it one key
            await entities.store([(gone_key, gone)], [])
            await copier.drop_left(SETTLED)
            await entities.store([(gone_key, gone)], [])
            await copier.receive([(stale_key, stale)], [])
        else:
            await entities.store([(stale_key, stale), (gone_key, gone)], [])
        assert copier.arriving(BACK) == arriving
        assert not copier.whole & set(arriving)  # what is shipped now is recorded
        registrations = {
            "store-1": Registration("here", layout=BACK.version, missing=frozenset(arriving)),
            "store-2": Registration("there", layout=BACK.version),
        }
        view = StoreView(BACK, registrations, frozenset(registrations))
        assert await copier.copy(view, arriving) == {"store-2": arriving}
        held = dict(entities.partition_items([partition_of("", entity)]))
        assert held == {stale_key: fresh}
        assert copier.arriving(BACK) == []  # copied for this transition: whole
        assert set(arriving) <= copier.whole

    asyncio.run(run())
    assert len(asked) == 1


def test_a_partition_that_stays_is_not_copied() -> None:
    async def stream(store: str, body: bytes) -> AsyncIterator[bytes]:
        raise AssertionError(f"nothing to copy from {store}")
        yield b""  # pragma: no cover

    copier = Copier("store-1", "here", Entities(MemoryEngine()), stream)
    copier.start_whole(FIRST)
    assert copier.arriving(OUT) == []  # store-1 keeps what it holds when store-2 joins
    assert copier.whole == set(FIRST.partitions_of("store-1"))
