"""The context store: one process of the layer that keeps the cluster's entities (issue 17).

It serves ``ContextStore.Apply`` (a front's writes, answered with what each did once it is
durable) and ``ContextStore.Query`` (its partitions' part of an entity or types query), over
:class:`~broker.store.entities.Entities` on the embedded storage of its directory
(``--store-dir``; RocksDB by default, broker.store.engine). It announces itself under
``/stores/<store id>`` (broker.store.layout) and creates the store layout if the cluster has
none. Every second it deletes the entities whose ``dateExpires`` passed (reads never show
them in between) and forgets the outcomes of writes older than ``WRITE_IDS_KEPT``.

Failures (docs/failures.md): a store killed loses nothing it answered (an answer follows the
fsync); its supervisor restarts it on the same directory, and the fronts' writes and reads
of its partitions wait for it (then 503). A storage failure stops the process (exit 1), to be
restarted from what is durable. A store whose ZooKeeper session expired exits (fenced) like
every member, and its ``/stores`` entry goes with the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from pathlib import Path
from typing import Final

import grpc
from grpc import aio

from broker.errors import InvalidInput, SilboError
from broker.runtime.process import ProcessContext
from broker.store.engine import (
    DEFAULT_ENGINE,
    Engine,
    GroupCommitter,
    StorageError,
    open_engine,
)
from broker.store.entities import WRITE_IDS_KEPT, Entities, StoreFailed
from broker.store.layout import (
    LayoutWatch,
    check_store_id,
    create_store_layout,
    read_store_layout,
    register_store,
)
from broker.store.reading import answer_query
from broker.store.wire import decode_writes, encode_results
from broker.wire import internal_pb2 as wire
from broker.wire import internal_pb2_grpc as wire_grpc

__all__ = ["EXPIRY_PERIOD", "ContextStore", "store_identity"]

EXPIRY_PERIOD: Final = 1.0  # seconds between sweeps of expired entities
_ID_FILE: Final = "STORE_ID"

_log = logging.getLogger(__name__)


def store_identity(directory: Path, wanted: str) -> str:
    """The store id of ``directory``: the one it records, else ``wanted`` (default
    ``store-<directory name>``), recorded in it. InvalidInput if ``wanted`` is another."""
    directory.mkdir(parents=True, exist_ok=True)
    recorded = directory / _ID_FILE
    if recorded.exists():
        kept = recorded.read_text().strip()
        if wanted and wanted != kept:
            raise InvalidInput(
                f"{directory} holds store {kept!r}, not {wanted!r}: give the store its own "
                "directory, or leave out --store-id"
            )
        return check_store_id(kept)
    store_id = check_store_id(wanted or f"store-{directory.name}")
    recorded.write_text(store_id + "\n")
    return store_id


class ContextStore(wire_grpc.ContextStoreServicer):
    """One context store process (see the module doc)."""

    def __init__(self) -> None:
        self._context: ProcessContext | None = None
        self._engine: Engine | None = None
        self._committer: GroupCommitter | None = None
        self._entities: Entities | None = None
        self._layout: LayoutWatch | None = None
        self._expiry: asyncio.Task[None] | None = None
        self.store_id = ""

    def add_to(self, server: aio.Server) -> None:
        wire_grpc.add_ContextStoreServicer_to_server(self, server)  # type: ignore[no-untyped-call]

    async def start(self, context: ProcessContext) -> None:
        self._context = context
        options = context.options
        directory = Path(options.store_dir)
        self.store_id = store_identity(directory, options.store_id)
        self._engine = await asyncio.to_thread(
            open_engine, options.store_engine or DEFAULT_ENGINE, directory / "data"
        )
        self._committer = GroupCommitter(self._engine)
        self._entities = Entities(self._engine, self._committer)
        zk = context.zk
        if await asyncio.to_thread(read_store_layout, zk) is None:
            await asyncio.to_thread(create_store_layout, zk, [self.store_id])
        await asyncio.to_thread(
            register_store, zk, self.store_id, context.member.address, context.member.name
        )
        self._layout = await asyncio.to_thread(LayoutWatch, zk)
        layout = self._layout.layout
        if layout is not None and self.store_id not in layout.stores:
            _log.warning(
                "store %s is not in the cluster's store layout (%s): it holds no partition",
                self.store_id,
                ", ".join(layout.stores),
            )
        self._expiry = asyncio.create_task(self._expire(), name="expiry")
        _log.info(
            "context store %s on %s (%s, %d keys)",
            self.store_id,
            directory,
            self._engine.kind,
            await asyncio.to_thread(self._engine.count),
        )

    async def stop(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._expiry
        if self._layout is not None:
            self._layout.stop()
        if self._committer is not None:
            await self._committer.close()
        if self._engine is not None:
            await asyncio.to_thread(self._engine.close)

    def status(self) -> tuple[int, int]:
        layout = self._layout.layout if self._layout is not None else None
        return (layout.version if layout else 0), 0

    # -- the service --------------------------------------------------------------------------

    async def Apply(
        self, request: wire.StoreRequest, context: aio.ServicerContext[object, object]
    ) -> wire.StoreAnswer:
        entities = self._serving()
        try:
            intents = decode_writes(request.body)
        except SilboError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        try:
            results = await entities.apply(intents)
        except StoreFailed as exc:
            self._fail(exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        return wire.StoreAnswer(body=encode_results(results))

    async def Query(
        self, request: wire.StoreRequest, context: aio.ServicerContext[object, object]
    ) -> wire.StoreAnswer:
        entities = self._serving()
        layout = self._layout.layout if self._layout is not None else None
        partitions = layout.partitions_of(self.store_id) if layout is not None else []
        try:
            body = await asyncio.to_thread(
                answer_query, entities, request.body, partitions, time.time()
            )
        except StoreFailed as exc:
            self._fail(exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except InvalidInput as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return wire.StoreAnswer(body=body)

    # -- helpers ------------------------------------------------------------------------------

    def _serving(self) -> Entities:
        assert self._entities is not None, "the store has not started"
        return self._entities

    def _fail(self, exc: BaseException) -> None:
        """The storage failed: stop the process (its supervisor restarts it from disk)."""
        _log.error("context store %s: %s; stopping", self.store_id, exc)
        assert self._context is not None
        self._context.loop.call_later(0.1, _exit_failed)

    async def _expire(self) -> None:
        entities = self._serving()
        while True:
            await asyncio.sleep(EXPIRY_PERIOD)
            try:
                gone = await entities.expire()
                await asyncio.to_thread(entities.forget_writes, time.time() - WRITE_IDS_KEPT)
            except (StoreFailed, StorageError) as exc:
                self._fail(exc)
                return
            if gone:
                _log.info("context store %s: %d expired entities deleted", self.store_id, gone)


def _exit_failed() -> None:
    import os

    os._exit(1)
