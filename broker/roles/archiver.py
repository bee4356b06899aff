"""The archiver: the context stores' changes, moved to Parquet files (``silbo run archiver``).

A small process (one per cluster; ``silbo up --archive PATH|URI`` starts and supervises it)
that every ``--archive-interval`` seconds runs one *batch* (docs/archive.md):

1. **pull**: from each partition's primary (broker.store.layout's view), the changes after
   the archiver's cursor (``ContextStore.Changes``: settled changes only, so none that a
   failover could lose), at most ``--archive-rows`` in all, the stores in parallel; a
   partition without a primary now waits for the next batch;
2. **write**: record the batch as pending in ZooKeeper, then one Parquet file per tenant,
   day and entity type, each whole and durable (broker.archive.files);
3. **commit**: the cursors past the batch's changes, the batch done, in one compare-and-set
   of the state (broker.archive.state);
4. **trim**: each primary deletes the changes archived (``ContextStore.Trim``).

A batch that took ``--archive-rows`` changes is followed by the next at once. What a crash
does: before 3, the batch is still pending: the next archiver (the supervisor restarts it)
deletes its files, whole or not, and takes the same changes again, so the archive holds
every change once; after 3, a trim not done is done by the next batch. An archiver whose
compare-and-set loses (another one wrote the state) exits as fenced (75).

``SILBO_ARCHIVER_FAULT=FILE`` (tests): the first archiver to find no FILE creates it and
kills itself with SIGKILL between its files and its cursors (step 2 and 3).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Final

import grpc
from grpc import aio

from broker.archive import files
from broker.archive.location import ArchiveRoot, open_root
from broker.archive.state import (
    ArchiveConflict,
    ArchiveState,
    Pending,
    create_state,
    read_state,
)
from broker.errors import InvalidInput, SilboError
from broker.extras import require
from broker.runtime.link import CHANNEL_OPTIONS
from broker.runtime.process import EXIT_FENCED, ProcessContext
from broker.runtime.token import call_metadata
from broker.store.changelog import ArchiveRow, change_row
from broker.store.layout import LayoutWatch
from broker.store.wire import pack, unpack
from broker.wire import internal_pb2 as wire
from broker.wire import internal_pb2_grpc as wire_grpc

__all__ = ["FAULT_ENV", "Archiver", "pull_changes"]

FAULT_ENV: Final = "SILBO_ARCHIVER_FAULT"
CALL_TIMEOUT: Final = 30.0  # seconds one call to a store may take

_log = logging.getLogger(__name__)

Changes = list[tuple[int, int, bytes]]  # (partition, sequence, record)


class Archiver:
    """The archiver process's role (see the module doc)."""

    def __init__(self) -> None:
        self._context: ProcessContext | None = None
        self._watch: LayoutWatch | None = None
        self._task: asyncio.Task[None] | None = None
        self._channels: dict[str, aio.Channel] = {}
        self._state: ArchiveState | None = None
        self._root: ArchiveRoot | None = None
        self._trimmed: dict[int, int] = {}  # partition: trimmed up to (this process knows)
        self._turn = 0  # where the next pull starts among the partitions (fairness)
        self._warned = False
        self._stale = False  # the state must be read again before the next batch

    def add_to(self, server: aio.Server) -> None:
        """No service of its own (``Admin`` only, which every process serves)."""

    def status(self) -> tuple[int, int]:
        return 0, 0

    async def start(self, context: ProcessContext) -> None:
        require("archive", "silbo run archiver")
        self._context = context
        options = context.options
        root = self._root = await asyncio.to_thread(open_root, options.archive_root)
        state = await asyncio.to_thread(create_state, context.zk, root.uri, options.cluster)
        self._state = await self._adopt(state)
        self._watch = await asyncio.to_thread(LayoutWatch, context.zk)
        self._task = asyncio.create_task(self._run(), name="archiver")
        _log.info(
            "archiver: archive %s in %s (%s), batch %d, %d partitions archived so far",
            self._state.id,
            root.uri,
            root.kind.value,
            self._state.batch,
            len(self._state.cursors),
        )

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for channel in self._channels.values():
            await channel.close()
        if self._watch is not None:
            self._watch.stop()

    async def _adopt(self, state: ArchiveState) -> ArchiveState:
        """The state, once this root is the archive's (moved there, or refused) and a batch
        a crash left pending is undone."""
        zk = self._zk()
        root = self._archive_root()
        if state.root != root.uri:
            marker = await asyncio.to_thread(files.marker_of, root)
            if marker is None or marker.get("id") != state.id:
                raise InvalidInput(
                    f"cluster {state.cluster} archives to {state.root}, not {root.uri}: give "
                    f"--archive {state.root} (or move that archive to {root.uri} first)"
                )
            state = await asyncio.to_thread(replace(state, root=root.uri).write, zk)
        await asyncio.to_thread(files.claim, root, state.id, state.cluster)
        if state.pending is not None:
            state = await self._abandon(state)
        return state

    async def _abandon(self, state: ArchiveState) -> ArchiveState:
        """Delete the files of the batch ``state`` has pending; the state without it."""
        pending = state.pending
        assert pending is not None
        name = files.file_name(pending.batch, state.id, pending.token)
        gone = await asyncio.to_thread(
            files.remove_batch, self._archive_root(), pending.directories, name
        )
        _log.warning(
            "archiver: batch %d did not complete: its %d files deleted, its changes taken again",
            pending.batch,
            gone,
        )
        return await asyncio.to_thread(state.abandoned().write, self._zk())

    # -- batches ------------------------------------------------------------------------------

    async def _run(self) -> None:
        assert self._context is not None
        interval = self._context.options.archive_interval
        while True:
            try:
                full = await self._batch()
            except ArchiveConflict as exc:
                _log.error("archiver: %s: exiting (fenced)", exc)
                os._exit(EXIT_FENCED)
            except (grpc.aio.AioRpcError, SilboError, OSError) as exc:
                _log.warning("archiver: the batch failed (%s); trying again", exc)
                self._stale = True  # a write to ZooKeeper may have applied or not
                full = False
            if not full:
                await asyncio.sleep(interval)

    async def _batch(self) -> bool:
        """One batch (module doc); whether it was full (more changes wait)."""
        assert self._context is not None and self._state is not None
        if self._stale:  # after a failure, what ZooKeeper holds, not what this process wrote
            found = await asyncio.to_thread(read_state, self._zk())
            if found is None or found.id != self._state.id:
                raise ArchiveConflict("the archive's state was removed or replaced")
            self._state, self._stale = found, False
        state = self._state
        if state.pending is not None:  # a batch failed half-way
            state = self._state = await self._abandon(state)
        self._turn += 1
        changes, full = await self._pull(state.cursors, self._context.options.archive_rows)
        if changes:
            rows = await asyncio.to_thread(lambda: [change_row(*c) for c in changes])
            state = await self._archive(state, rows)
        await self._trim(state.cursors)
        return full

    async def _archive(self, state: ArchiveState, rows: list[ArchiveRow]) -> ArchiveState:
        """Steps 2 and 3 of a batch; the state after it."""
        zk = self._zk()
        batch = state.batch + 1
        token = os.urandom(4).hex()  # this try's: a hung archiver's late files are others
        name = files.file_name(batch, state.id, token)
        root = self._archive_root()
        directories = sorted(
            {files.group_directory(root, r.tenant, r.day, r.entity_type) for r in rows}
        )
        started = time.monotonic()
        state = self._state = await asyncio.to_thread(
            state.begun(Pending(batch, tuple(directories), token)).write, zk
        )
        await asyncio.to_thread(files.write_batch, root, rows, name)
        _fault()
        upto: dict[int, int] = {}
        for row in rows:
            upto[row.partition] = max(upto.get(row.partition, 0), row.sequence)
        state = self._state = await asyncio.to_thread(state.archived(upto, len(rows)).write, zk)
        _log.info(
            "archiver: batch %d: %d changes of %d partitions in %d files (%.2f s)",
            batch,
            len(rows),
            len(upto),
            len(directories),
            time.monotonic() - started,
        )
        return state

    async def _pull(self, cursors: dict[int, int], most: int) -> tuple[Changes, bool]:
        """At most ``most`` settled changes after the cursors, from every primary; whether
        some were left for the next batch."""
        view = self._layout_watch().view
        layout = view.layout
        if layout is None:
            return [], False
        start = self._turn % layout.partitions
        by_primary: dict[str, dict[int, int]] = {}
        for partition in [*range(start, layout.partitions), *range(start)]:
            primary = view.primary(partition)
            if primary is not None and primary in view.addresses:
                by_primary.setdefault(primary, {})[partition] = cursors.get(partition, 0)
        if not by_primary:
            return [], False
        share = max(1, most // len(by_primary))
        pulled = await asyncio.gather(
            *(
                pull_changes(self._stub(view.addresses[store]), asked, share, store)
                for store, asked in by_primary.items()
            )
        )
        changes: Changes = []
        full = False
        for found, more, archiving in pulled:
            changes += found
            full = full or more
            if not archiving and not self._warned:
                self._warned = True
                _log.warning("archiver: a context store does not record changes (--archive on)")
        return changes, full

    async def _trim(self, cursors: dict[int, int]) -> None:
        """Step 4: each primary trims what is archived of its partitions (what fails is
        tried again by the next batch)."""
        view = self._layout_watch().view
        by_primary: dict[str, dict[int, int]] = {}
        for partition, sequence in cursors.items():
            if self._trimmed.get(partition, 0) >= sequence:
                continue
            primary = view.primary(partition)
            if primary is not None and primary in view.addresses:
                by_primary.setdefault(primary, {})[partition] = sequence
        for store, upto in by_primary.items():
            stub = self._stub(view.addresses[store])
            try:
                answer: wire.StoreAnswer = await stub.Trim(
                    wire.StoreRequest(body=pack(upto)),
                    timeout=CALL_TIMEOUT,
                    metadata=call_metadata(),
                )
            except grpc.aio.AioRpcError as exc:
                _log.info("archiver: store %s did not trim (%s)", store, exc.code().name)
                continue
            _gone, unfinished = unpack(answer.body)
            for partition, sequence in upto.items():
                if partition not in unfinished:
                    self._trimmed[partition] = sequence

    # -- helpers ------------------------------------------------------------------------------

    def _stub(self, address: str) -> Any:
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = aio.insecure_channel(
                address, options=CHANNEL_OPTIONS
            )
        return wire_grpc.ContextStoreStub(channel)  # type: ignore[no-untyped-call]

    def _archive_root(self) -> ArchiveRoot:
        assert self._root is not None, "the archiver has not started"
        return self._root

    def _layout_watch(self) -> LayoutWatch:
        assert self._watch is not None, "the archiver has not started"
        return self._watch

    def _zk(self) -> Any:
        assert self._context is not None
        return self._context.zk


async def pull_changes(
    stub: Any, cursors: dict[int, int], most: int, store: str = ""
) -> tuple[Changes, bool, bool]:
    """At most ``most`` changes of these partitions after their cursors from their primary
    (``ContextStore.Changes``, as many calls as it takes); whether some were left, and
    whether the store records changes. A store that fails a call gives what it gave before."""
    found: Changes = []
    asked = dict(cursors)
    archiving = True
    while asked and len(found) < most:
        try:
            answer: wire.StoreAnswer = await stub.Changes(
                wire.StoreRequest(body=pack([asked, most - len(found), False])),
                timeout=CALL_TIMEOUT,
                metadata=call_metadata(),
            )
        except grpc.aio.AioRpcError as exc:
            _log.info("archiver: store %s gave no changes (%s)", store, exc.code().name)
            return found, False, archiving
        archiving, rows, more = unpack(answer.body)
        for partition, changes in rows.items():
            for sequence, record in changes:
                found.append((int(partition), int(sequence), bytes(record)))
        asked = {p: _last(rows.get(p), asked[p]) for p in more}
    return found, bool(asked), archiving


def _last(rows: list[Any] | None, cursor: int) -> int:
    return int(rows[-1][0]) if rows else cursor


def _fault() -> None:
    """The test hook of the module doc: a kill -9 between the files and the cursors."""
    marker = os.environ.get(FAULT_ENV)
    if not marker or os.path.exists(marker):
        return
    Path(marker).write_text(f"{os.getpid()}\n")
    _log.warning("archiver: %s: killed between a batch's files and its cursors", FAULT_ENV)
    os.kill(os.getpid(), signal.SIGKILL)
