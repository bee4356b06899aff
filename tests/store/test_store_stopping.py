"""A context store that stops: a call still in flight meets the closed group committer; it is
refused, not taken for a storage failure (a store scaled in exited 1 after its hand-over)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from broker.roles.context_store import ContextStore
from broker.store.engine import StorageError


def test_a_storage_failure_stops_the_store_but_not_once_it_is_stopping() -> None:
    async def run() -> list[tuple[Any, ...]]:
        store = ContextStore()
        exits: list[tuple[Any, ...]] = []
        loop = SimpleNamespace(call_later=lambda *call: exits.append(call))
        store._context = cast(Any, SimpleNamespace(loop=loop))
        store._fail(StorageError("the disk is gone"))
        assert len(exits) == 1  # os._exit(1) scheduled: its supervisor restarts it
        await store.stop()  # nothing started here: it only stops
        store._fail(StorageError("the group committer is closed"))
        return exits

    assert len(asyncio.run(run())) == 1
