"""Tenant-scoped documents in a real ZooKeeper (broker.coordination.documents: the aggregation
groups' and the alert rules' records): kept, changed by compare-and-set, listed per tenant,
followed by a watch, and what is not a record left out, never a failure."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from kazoo.client import KazooClient

from broker.coordination.documents import Documents, DocumentsWatch, Kind, kept_documents
from broker.coordination.errors import CorruptCoordinationData
from broker.errors import AlreadyExists, NotFound

pytestmark = pytest.mark.slow


def _decode(path: str, data: bytes) -> dict[str, Any]:
    try:
        body = json.loads(data)
        return {"id": str(body["id"]), "n": int(body["n"])}
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptCoordinationData(f"{path} is no note: {exc!r}") from exc


NOTES: Kind[dict[str, Any]] = Kind(
    "/notes",
    "note",
    "The requested note has not been found",
    _decode,
    lambda record: json.dumps(record).encode(),
    lambda record: record["id"],
)


def test_records_are_kept_changed_listed_and_removed_per_tenant(client: KazooClient) -> None:
    async def scenario() -> None:
        notes = Documents(NOTES, client, asyncio.get_running_loop())
        await notes.create("t1", "b", {"id": "b", "n": 1})
        await notes.create("t1", "a", {"id": "a", "n": 1})
        await notes.create("t2", "a", {"id": "a", "n": 7})
        with pytest.raises(AlreadyExists, match="note 'a' exists already"):
            await notes.create("t1", "a", {"id": "a", "n": 2})
        assert [r["id"] for r in await notes.listed("t1")] == ["a", "b"]
        assert await notes.listed("t3") == []

        # two changes at once: each applies over the other's (compare-and-set)
        def bump(old: dict[str, Any]) -> dict[str, Any]:
            return {**old, "n": old["n"] + 1}

        await asyncio.gather(*(notes.change("t1", "a", bump) for _ in range(5)))
        assert (await notes.read("t1", "a"))["n"] == 6
        assert (await notes.read("t2", "a"))["n"] == 7
        await notes.remove("t1", "a")
        for missing in (
            notes.read("t1", "a"),
            notes.remove("t1", "a"),
            notes.change("t1", "a", bump),
        ):
            with pytest.raises(NotFound, match="The requested note has not been found"):
                await missing

    asyncio.run(scenario())


def test_a_watch_tells_every_record_and_leaves_out_what_is_not_one(client: KazooClient) -> None:
    client.ensure_path("/notes")
    client.create("/notes/t1~a", json.dumps({"id": "a", "n": 1}).encode())
    client.create("/notes/t1~bad", b"{not json")
    seen: list[dict[str, Any]] = []

    async def scenario() -> None:
        loop = asyncio.get_running_loop()

        def changed(known: dict[str, Any]) -> None:
            seen.append(known)

        watch = DocumentsWatch(NOTES, client, loop, changed)
        try:
            while not seen:
                await asyncio.sleep(0.02)
            assert seen[0] == {"t1~a": {"id": "a", "n": 1}}  # all at once, the bad one left out
            client.create("/notes/t2~c", json.dumps({"id": "c", "n": 3}).encode())
            while "t2~c" not in seen[-1]:
                await asyncio.sleep(0.02)
            client.delete("/notes/t1~a")
            while "t1~a" in seen[-1]:
                await asyncio.sleep(0.02)
        finally:
            watch.stop()

    asyncio.run(asyncio.wait_for(scenario(), 20))
    found, unreadable = kept_documents(NOTES, client)
    assert found == {"t2~c": {"id": "c", "n": 3}} and list(unreadable) == ["t1~bad"]
