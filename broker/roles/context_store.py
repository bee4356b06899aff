"""The context store: one process of the layer that keeps the cluster's entities (issue 17).

It serves ``ContextStore.Apply`` (a front's writes, answered with what each did once it is
durable), ``ContextStore.Query`` (its partitions' part of an entity or types query) and
``ContextStore.History`` (an attribute's history: broker.store.history, recorded in the
writes' commits with ``--history on``), over :class:`~broker.store.entities.Entities` on
the embedded storage of its directory (``--store-dir``; RocksDB by default,
broker.store.engine). It announces itself under ``/stores/<store id>`` (broker.store.layout)
and creates the store layout if the cluster has none. Every second it deletes the entities
whose ``dateExpires`` passed in the partitions it is the primary of (reads never show them in
between) and forgets the outcomes of writes older than ``WRITE_IDS_KEPT``; and it deletes
the history past its retention of one partition it is the primary of (the next one each
time: every partition in about four minutes).

Replicas (broker.store.layout has the rules): each partition is held by ``replicas``
stores; its primary applies its writes and answers its reads. A write is answered once it
is durable here and on every other live holder (``Replicate``: the new states, shipped in
order by one :class:`_Shipper` per backup, one call in flight, many writes per call). A
backup that does not take them within :data:`SHIP_TIMEOUT` is removed from the in-sync set
and its registration deleted (its process stops, restarts, and recovers), and so is an
in-sync holder that is not live, before the write is answered: no store in the in-sync set
ever misses an acknowledged write, so the next primary has them all. The other way round,
each in-sync holder probes the primaries of its partitions (``Admin.Status`` every
:data:`PROBE_PERIOD`) and fences one that fails :data:`PROBE_FAILURES` probes in a row:
its partitions fail over in about a second after a kill -9 or a SIGSTOP. Fencing is one
ZooKeeper transaction that needs the fencer in sync, so of two stores fencing each other
only one does, and one that cannot fence stops. A store that starts out
of sync is *recovering*: it copies its partitions from their primaries (``Snapshot``; their
new writes come to it meanwhile, and win over the copy: broker.roles.store_copy), joins the
in-sync set, takes back the partitions it ranks first for (``Yield``: the old primary stops
writing them and lets its writes in flight finish) and serves. A scale of the store layer
(broker.roles.store_scaling) is followed the same way: the partitions that arrive to a serving
store in a transition layout are copied, taken back where it ranks first, and cleared from
its registration's missing ones; those it no longer holds once a layout settles are
dropped.

The changelog (broker.store.changelog, ``--archive on``): every change its writes apply is
recorded in their commits; ``Changes`` gives the archiver (broker.roles.archiver) the settled
changes of the partitions it is the primary of after the archiver's cursors, or counts them
(``silbo archive status``), and ``Trim`` deletes what was archived, replicated as writes.

Aggregation groups (broker.roles.store_aggregation, docs/aggregation.md): the writes ``Apply``
applied are folded into the groups' panes, at the time they were applied (their panes close
only once no write of an earlier time is being applied); ``Aggregate`` takes the other
stores' reports.

Alert rules (broker.roles.store_alerts, docs/alerts.md): the writes ``Apply`` applies keep
the rules' states and the transitions to publish in their own commits
(broker.store.alert_log); the transitions of the partitions this store is the primary of
are published as alert entities, then deleted.

Load (broker.runtime.load): the items in and out are the entities written and the queries
answered; a write is busy until it is durable here and on the backups (its replication
included), a query while it is answered (on a worker thread), both after waiting for
``--max-rate`` tokens.

Failures (docs/failures.md): a store killed loses nothing it answered. Its partitions' next
holder serves them at once (the fronts retry on it); with one replica, they wait for the
store to be restarted on its directory (then 503). A storage failure stops the process
(exit 1), to be restarted from what is durable. A store whose registration is gone (its
ZooKeeper session expired, or a primary removed it) exits (fenced).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any, Final, TypeVar

import grpc
from grpc import aio
from kazoo.recipe.watchers import DataWatch

from broker.errors import InvalidInput, SilboError
from broker.roles.store_aggregation import StoreAggregation
from broker.roles.store_alerts import StoreAlerts
from broker.roles.store_copy import Copier, NotYet
from broker.runtime.link import CHANNEL_OPTIONS
from broker.runtime.load import Load
from broker.runtime.process import EXIT_FENCED, ProcessContext
from broker.runtime.token import call_metadata
from broker.store.alert_log import AlertLog
from broker.store.engine import (
    DEFAULT_ENGINE,
    Engine,
    GroupCommitter,
    StorageError,
    open_engine,
)
from broker.store.entities import (
    PARTITIONS,
    WRITE_IDS_KEPT,
    Entities,
    StoreFailed,
    key_partition,
    partition_of,
)
from broker.store.history import HistoryOptions
from broker.store.history_query import HistoryQuery
from broker.store.layout import (
    RECOVERING,
    SERVING,
    STORES,
    LayoutWatch,
    Registration,
    StoreView,
    check_store_id,
    create_store_layout,
    fence_store,
    join_in_sync,
    read_store_layout,
    register_store,
    set_store_state,
)
from broker.store.reading import answer_query, read_query_body
from broker.store.wire import decode_writes, encode_results, pack, unpack
from broker.wire import internal_pb2 as wire
from broker.wire import internal_pb2_grpc as wire_grpc

__all__ = ["EXPIRY_PERIOD", "SHIP_TIMEOUT", "ContextStore", "store_identity"]

T = TypeVar("T")  # what a read on a worker thread gives
EXPIRY_PERIOD: Final = 1.0  # seconds between sweeps of expired entities
SHIP_TIMEOUT: Final = 3.0  # seconds a backup may take to store a shipment
SNAPSHOT_CHUNK: Final = 2000  # keys per Snapshot message
PROBE_PERIOD: Final = 0.25  # seconds between probes of the primaries of partitions held here
PROBE_TIMEOUT: Final = 1.0  # seconds a probe may take
PROBE_FAILURES: Final = 2  # probes failed in a row before the primary is fenced
YIELD_HOLD: Final = 10.0  # seconds a yielded partition stays refused without the view agreeing
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
        self._watch: LayoutWatch | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._shippers: dict[str, _Shipper] = {}
        # a store copying partitions from here: its address, those partitions
        self._copying: dict[str, tuple[str, frozenset[int]]] = {}
        self._copier: Copier | None = None
        self._layout_changed = asyncio.Event()
        self._registration = Registration("")
        self._yielded: dict[int, float] = {}  # partition given back: until when it is refused
        self._in_flight: dict[int, set[int]] = {}  # applies running: their partitions
        self._applying: dict[int, float] = {}  # applies running: their writes' time
        self._settled = asyncio.Event()
        self._stopping = False  # stop() began: the committer closes under calls in flight
        self._numbers = iter(range(1, 1 << 62))
        self._aggregation: StoreAggregation | None = None
        self._alerts: StoreAlerts | None = None
        self.store_id = ""
        self.state = RECOVERING

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
        history = HistoryOptions.parse(options.history_retention)
        self._entities = Entities(
            self._engine,
            self._committer,
            history,
            record_history=options.history,
            alerts=AlertLog(self._engine),
            record_changes=options.archive,
        )
        zk = context.zk
        if await asyncio.to_thread(read_store_layout, zk) is None:
            await asyncio.to_thread(create_store_layout, zk, [self.store_id])
        self._watch = await asyncio.to_thread(LayoutWatch, zk, self._on_layout_change)
        in_sync = await asyncio.to_thread(zk.exists, f"/store-sync/{self.store_id}")
        self.state = SERVING if in_sync else RECOVERING
        layout = self._view().layout
        self._copier = Copier(self.store_id, context.member.address, self._entities, self._stream)
        if in_sync:
            self._copier.start_whole(layout)
        self._registration = Registration(
            context.member.address,
            context.member.name,
            self.state,
            layout.version if layout else 0,
            frozenset(layout.arriving_of(self.store_id) if layout else ()),
        )
        await asyncio.to_thread(register_store, zk, self.store_id, self._registration)
        DataWatch(zk, f"{STORES}/{self.store_id}", self._registration_changed)
        if layout is not None and self.store_id not in layout.stores:
            _log.warning(
                "store %s is not in the cluster's store layout (%s): it holds no partition",
                self.store_id,
                ", ".join(layout.stores),
            )
        self._tasks.append(asyncio.create_task(self._sweep(), name="expiry"))
        self._tasks.append(asyncio.create_task(self._probe(), name="probe"))
        if self.state == RECOVERING:
            self._tasks.append(asyncio.create_task(self._recover(), name="recovery"))
        self._tasks.append(asyncio.create_task(self._follow(), name="scale"))
        await self._start_aggregation()
        await self._start_alerts()
        _log.info(
            "context store %s on %s (%s, %d keys): %s",
            self.store_id,
            directory,
            self._engine.kind,
            await asyncio.to_thread(self._engine.count),
            self.state,
        )

    async def stop(self) -> None:
        self._stopping = True
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._aggregation is not None:
            layout = self._watch.layout if self._watch is not None else None
            leaving = layout is not None and self.store_id not in (*layout.stores, *layout.previous)
            await self._aggregation.stop(leaving=leaving)
        if self._alerts is not None:
            await self._alerts.stop()
        for shipper in self._shippers.values():
            await shipper.close()
        if self._watch is not None:
            self._watch.stop()
        if self._committer is not None:
            await self._committer.close()
        if self._engine is not None:
            await asyncio.to_thread(self._engine.close)

    def status(self) -> tuple[int, int]:
        layout = self._watch.layout if self._watch is not None else None
        return (layout.version if layout else 0), 0

    # -- writes -------------------------------------------------------------------------------

    async def Apply(
        self, request: wire.StoreRequest, context: aio.ServicerContext[object, object]
    ) -> wire.StoreAnswer:
        entities = self._serving()
        try:
            intents = decode_writes(request.body)
        except SilboError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        view = self._view()
        partitions = {partition_of(i.tenant, i.entity_id) for i in intents}
        for partition in partitions:
            if not self._primary_of(view, partition):
                await context.abort(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"store {self.store_id} is not the primary of partition {partition} "
                    f"(it is {view.primary(partition)})",
                )
        number = next(self._numbers)
        self._in_flight[number] = partitions
        rows: list[list[Any]] = []
        fresh: list[int] = []
        load = self._load()
        try:
            await load.admit(len(intents))
            now = self._applying[number] = time.time()  # the writes' time (aggregation)
            with load.working(len(intents)):
                results = await entities.apply(
                    intents,
                    now=now,
                    replicate=lambda puts, deletes: self._replicate(view, puts, deletes),
                    rows=rows,
                    fresh=fresh,
                )
            load.output(len(intents))
            self._aggregate(results, fresh, now)
            if self._alerts is not None:
                self._alerts.observe()
        except StoreFailed as exc:
            self._fail(exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except SilboError as exc:  # the in-sync set could not be changed: we cannot answer
            self._fail(exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        finally:
            del self._in_flight[number]
            self._applying.pop(number, None)
            self._settled.set()
        return wire.StoreAnswer(body=encode_results(results, rows))

    # -- aggregation groups (broker.roles.store_aggregation) -----------------------------------

    async def _start_aggregation(self) -> None:
        assert self._context is not None and self._engine is not None
        assert self._committer is not None
        self._aggregation = StoreAggregation(
            self.store_id,
            self._engine,
            self._committer,
            self._context,
            self._view,
            lambda: self.state == SERVING,
            lambda: min(self._applying.values(), default=None),
        )
        await self._aggregation.start()

    async def _start_alerts(self) -> None:
        assert self._context is not None and self._entities is not None
        assert self._entities.alerts is not None

        def mine() -> Callable[[int], bool]:
            view = self._view()
            return lambda partition: self._primary_of(view, partition)

        async def durable(puts: list[tuple[bytes, bytes]], deletes: list[bytes]) -> None:
            assert self._committer is not None
            view = self._view()
            await asyncio.gather(
                self._committer.write(puts, deletes), self._replicate(view, puts, deletes)
            )

        self._alerts = StoreAlerts(
            self.store_id,
            self._entities.alerts,
            self._context,
            mine,
            lambda: self.state == SERVING,
            durable,
        )
        await self._alerts.start()

    def _aggregate(self, results: list[Any], fresh: list[int], now: float) -> None:
        """Count the writes just applied (at ``now``) in the aggregation groups that take
        them."""
        if self._aggregation is not None:
            self._aggregation.observe(results, fresh, now)

    async def Aggregate(
        self, request: wire.StoreRequest, context: aio.ServicerContext[object, object]
    ) -> wire.StoreAnswer:
        """Another store's aggregation report (its marks and panes); what was written."""
        if self._aggregation is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "the store has not started")
        try:
            body = self._aggregation.receive(request.body)
        except (SilboError, KeyError, TypeError, ValueError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not a report: {exc!r}")
        return wire.StoreAnswer(body=body)

    def _primary_of(self, view: StoreView, partition: int) -> bool:
        if view.primary(partition) != self.store_id:
            return False
        until = self._yielded.get(partition)
        if until is None:
            return True
        if time.monotonic() < until:
            return False
        del self._yielded[partition]
        return True

    async def _replicate(
        self, view: StoreView, puts: list[tuple[bytes, bytes]], deletes: list[bytes]
    ) -> None:
        """Make a write's new states durable on every other live holder of their partitions;
        remove from the in-sync set the holders that are not live (module doc)."""
        layout = view.layout
        if layout is None:
            return
        touched = {key_partition(k) for k, _v in puts} | {key_partition(k) for k in deletes}
        targets: dict[int | None, list[str]] = {}
        stale: set[str] = set()
        for partition in touched - {None}:
            assert partition is not None
            backups = view.backups(partition, self.store_id)
            backups += [
                s for s, (_a, ps) in self._copying.items() if partition in ps and s not in backups
            ]
            targets[partition] = backups
            stale.update(
                s
                for s in layout.holders(partition)
                if s != self.store_id and s in view.in_sync and s not in view.registrations
            )
        targets[None] = sorted(set().union(*targets.values()))  # keys of every partition
        by_store: dict[str, tuple[list[tuple[bytes, bytes]], list[bytes]]] = {}
        for key, value in puts:
            for store in targets[key_partition(key)]:
                by_store.setdefault(store, ([], []))[0].append((key, value))
        for key in deletes:
            for store in targets[key_partition(key)]:
                by_store.setdefault(store, ([], []))[1].append(key)
        for store in stale:  # a dead in-sync holder would miss this write: out of the set
            await self.fence(store, "is not live")
        await asyncio.gather(
            *(self._shipper(store).send(p, d) for store, (p, d) in by_store.items())
        )

    def _shipper(self, store: str) -> _Shipper:
        shipper = self._shippers.get(store)
        if shipper is None:
            shipper = self._shippers[store] = _Shipper(self, store)
        return shipper

    def address_of(self, store: str) -> str | None:
        """Where ``store`` serves, as this store knows it."""
        copying = self._copying.get(store)
        return self._view().addresses.get(store) or (copying[0] if copying else None)

    async def fence(self, store: str, why: str) -> None:
        """Take ``store`` out of the in-sync set and delete its registration (it stops);
        if this store is itself out of sync, it stops instead (module doc)."""
        _log.warning("store %s %s: fencing it", store, why)
        fenced = await asyncio.to_thread(fence_store, self._zk(), self.store_id, store)
        self._copying.pop(store, None)
        if not fenced:
            _log.error("context store %s is out of sync: it cannot fence; exiting", self.store_id)
            os._exit(EXIT_FENCED)

    async def Replicate(
        self, request: wire.StoreRequest, context: aio.ServicerContext[object, object]
    ) -> wire.StoreAnswer:
        entities = self._serving()
        try:
            puts, deletes = unpack(request.body)
            puts = [(bytes(k), bytes(v)) for k, v in puts]
            deletes = [bytes(k) for k in deletes]
        except (SilboError, ValueError, TypeError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not a shipment: {exc}")
        del entities  # the copier stores them (they win over a copy in progress)
        try:
            await self._copy_state().receive(puts, deletes)
        except StoreFailed as exc:
            self._fail(exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        return wire.StoreAnswer()

    # -- recovery -----------------------------------------------------------------------------

    async def Snapshot(
        self, request: wire.StoreRequest, context: aio.ServicerContext[object, object]
    ) -> AsyncIterator[wire.StoreAnswer]:
        entities = self._serving()
        try:
            store, address, partitions = unpack(request.body)
            wanted = [int(p) for p in partitions]
        except (SilboError, ValueError, TypeError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not a snapshot request: {exc}")
        copying = self._copying.get(str(store), ("", frozenset()))[1] | frozenset(wanted)
        self._copying[str(store)] = (str(address), copying)  # writes go to it from now on...
        await self._barrier(set(wanted))  # ...and those in flight before are committed
        chunk: list[tuple[bytes, bytes]] = []
        for item in await asyncio.to_thread(lambda: list(entities.partition_items(wanted))):
            chunk.append(item)
            if len(chunk) >= SNAPSHOT_CHUNK:
                yield wire.StoreAnswer(body=pack(chunk))
                chunk = []
        yield wire.StoreAnswer(body=pack(chunk))

    async def Yield(
        self, request: wire.StoreRequest, context: aio.ServicerContext[object, object]
    ) -> wire.StoreAnswer:
        try:
            store, partitions, *version = unpack(request.body)
            wanted = {int(p) for p in partitions}
            layout_version = int(version[0]) if version else 0
        except (SilboError, ValueError, TypeError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not a yield request: {exc}")
        if not await self._layout_reached(layout_version):  # it ships by that layout then
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, f"store layout {layout_version} not seen yet"
            )
        until = time.monotonic() + YIELD_HOLD
        for partition in wanted:
            self._yielded[partition] = until
        await self._barrier(wanted)
        self._copying.pop(str(store), None)
        return wire.StoreAnswer()

    async def _barrier(self, partitions: set[int]) -> None:
        """Wait until every apply running now on these partitions has ended."""
        running = {n for n, touched in self._in_flight.items() if touched & partitions}
        while running & set(self._in_flight):
            self._settled.clear()
            await self._settled.wait()

    async def _recover(self) -> None:
        """Copy every partition held here from its primary, then serve (module doc)."""
        await asyncio.sleep(0.2)  # the gRPC server starts after start() returns
        copier = self._copy_state()
        while True:
            view = self._view()
            layout = view.layout
            try:
                if layout is None:
                    raise NotYet("no store layout")
                copied = await copier.copy(view, layout.partitions_of(self.store_id))
                break
            except (grpc.aio.AioRpcError, SilboError, NotYet) as exc:
                _log.info("store %s: recovery waits (%s)", self.store_id, exc)
                await asyncio.sleep(0.5)
        await asyncio.to_thread(join_in_sync, self._zk(), self.store_id)
        await self._take_over(copied, layout.version)
        self.state = SERVING
        await self._announce(layout.version)
        _log.info("context store %s recovered: serving", self.store_id)

    async def _follow(self) -> None:
        """Follow the store layout's scales (module doc): copy what arrives here in a
        transition, drop what is left once it settles."""
        copier = self._copy_state()
        while True:
            await self._layout_changed.wait()
            self._layout_changed.clear()
            view = self._view()
            layout = view.layout
            self._release_yields(view)
            if layout is None or self.state != SERVING:
                continue
            try:
                await copier.drop_left(layout)
                arriving = copier.arriving(layout)
                if not arriving and self._registration.layout == layout.version:
                    continue
                copied = await copier.copy(view, arriving)
                if self._view().layout != layout:
                    self._layout_changed.set()  # moved on meanwhile: look again
                    continue
                await self._take_over(copied, layout.version)
                await self._announce(layout.version)
            except (grpc.aio.AioRpcError, NotYet) as exc:
                _log.info(
                    "store %s: copy for layout %d waits (%s)", self.store_id, layout.version, exc
                )
                await asyncio.sleep(0.5)
                self._layout_changed.set()
            except (StoreFailed, StorageError, SilboError) as exc:
                self._fail(exc)
                return

    async def _take_over(self, copied: dict[str, list[int]], version: int) -> None:
        """Tell each primary copied from that the copy is over; those of partitions this
        store is about to be the primary of yield them first (their writes in flight end)."""
        view = self._view()
        mine = replace(self._registration, state=SERVING, layout=version, missing=frozenset())
        after = replace(
            view,
            registrations={**view.registrations, self.store_id: mine},
            in_sync=view.in_sync | {self.store_id},
        )
        for primary, partitions in copied.items():
            taken = [p for p in partitions if after.primary(p) == self.store_id]
            with contextlib.suppress(grpc.aio.AioRpcError, NotYet):
                await self._call(primary, "Yield", pack([self.store_id, taken, version]))

    async def _announce(self, version: int) -> None:
        """Register as serving, missing nothing of layout ``version``."""
        copier = self._copy_state()
        self._registration = replace(
            self._registration,
            state=SERVING,
            layout=version,
            missing=frozenset(),
            copied=copier.copied,
        )
        await asyncio.to_thread(set_store_state, self._zk(), self.store_id, self._registration)

    async def _layout_reached(self, version: int, wait: float = 5.0) -> bool:
        """Whether this store's view reaches layout ``version`` within ``wait`` seconds."""
        deadline = time.monotonic() + wait
        while True:
            layout = self._view().layout
            if version <= (layout.version if layout else 0):
                return True
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.05)

    def _release_yields(self, view: StoreView) -> None:
        """A yielded partition whose primary is another store in the view is no longer held
        back: the view agrees, and a later return here must not wait for YIELD_HOLD."""
        for partition in list(self._yielded):
            if view.primary(partition) != self.store_id:
                del self._yielded[partition]

    async def _stream(self, store: str, body: bytes) -> AsyncIterator[bytes]:
        address = self.address_of(store)
        if address is None:
            raise NotYet(f"store {store} is not live")
        async with aio.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
            stub = wire_grpc.ContextStoreStub(channel)  # type: ignore[no-untyped-call]
            call = stub.Snapshot(wire.StoreRequest(body=body), metadata=call_metadata())
            async for answer in call:
                yield answer.body

    async def _call(self, store: str, method: str, body: bytes) -> bytes:
        address = self.address_of(store)
        if address is None:
            raise NotYet(f"store {store} is not live")
        async with aio.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
            stub = wire_grpc.ContextStoreStub(channel)  # type: ignore[no-untyped-call]
            answer: wire.StoreAnswer = await getattr(stub, method)(
                wire.StoreRequest(body=body), timeout=30.0, metadata=call_metadata()
            )
            return answer.body

    # -- reads --------------------------------------------------------------------------------

    async def Query(
        self, request: wire.StoreRequest, context: aio.ServicerContext[object, object]
    ) -> wire.StoreAnswer:
        entities = self._serving()
        view = self._view()
        try:
            kind, query, asked = read_query_body(request.body)
        except SilboError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not a query: {exc}")
        mine = {p for p in range(_partition_count(view)) if view.primary(p) == self.store_id}
        if asked is not None and asked - mine:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"store {self.store_id} is not the primary of partitions {sorted(asked - mine)}",
            )
        partitions = mine if asked is None else asked
        body = await self._read(
            context, lambda: answer_query(entities, kind, query, partitions, time.time())
        )
        return wire.StoreAnswer(body=body)

    async def History(
        self, request: wire.StoreRequest, context: aio.ServicerContext[object, object]
    ) -> wire.StoreAnswer:
        entities = self._serving()
        try:
            query = HistoryQuery.from_wire(unpack(request.body))
        except SilboError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not a history query: {exc}")
        partition = partition_of(query.tenant, query.entity_id)
        if not self._primary_of(self._view(), partition):
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"store {self.store_id} is not the primary of partition {partition}",
            )
        answer = await self._read(context, lambda: entities.read_history(query))
        return wire.StoreAnswer(body=pack(answer))

    # -- the changelog (broker.store.changelog) ------------------------------------------------

    async def Changes(
        self, request: wire.StoreRequest, context: aio.ServicerContext[object, object]
    ) -> wire.StoreAnswer:
        """``[{partition: cursor}, most, count]``: ``[archiving, {partition: [[sequence,
        record], ...]}, [partitions with more]]``, or with ``count`` ``[archiving,
        {partition: [changes, oldest µs]}, []]``."""
        entities = self._serving()
        try:
            asked, most, count = unpack(request.body)
            cursors = {_partition(p): int(after) for p, after in asked.items()}
            most = int(most)
        except (SilboError, ValueError, TypeError, AttributeError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not a changes request: {exc}")
        await self._check_primary(context, cursors)
        changelog = entities.changelog
        bounds = {p: changelog.visible(p) for p in cursors}  # on the loop: what is settled
        if count:
            counted = await self._read(
                context,
                lambda: {p: list(changelog.count(p, a, bounds[p])) for p, a in cursors.items()},
            )
            return wire.StoreAnswer(body=pack([self._archiving(), counted, []]))
        found, more = await self._read(
            context, lambda: entities.read_changes(cursors, bounds, most)
        )
        rows = {p: [list(row) for row in changes] for p, changes in found.items()}
        return wire.StoreAnswer(body=pack([self._archiving(), rows, more]))

    async def Trim(
        self, request: wire.StoreRequest, context: aio.ServicerContext[object, object]
    ) -> wire.StoreAnswer:
        """``{partition: sequence}``: the changes up to each deleted; ``[how many went,
        [partitions with more to trim]]``."""
        entities = self._serving()
        try:
            upto = {_partition(p): int(sequence) for p, sequence in unpack(request.body).items()}
        except (SilboError, ValueError, TypeError, AttributeError) as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"not a trim request: {exc}")
        view = await self._check_primary(context, upto)
        number = next(self._numbers)
        self._in_flight[number] = set(upto)  # a Yield waits for it, as for a write
        try:
            gone, unfinished = await entities.trim_changes(
                upto, lambda puts, deletes: self._replicate(view, puts, deletes)
            )
        except (StoreFailed, SilboError) as exc:
            self._fail(exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        finally:
            del self._in_flight[number]
            self._settled.set()
        return wire.StoreAnswer(body=pack([gone, unfinished]))

    async def _check_primary(
        self, context: aio.ServicerContext[object, object], partitions: Iterable[int]
    ) -> StoreView:
        """The view, if this store is the primary of every one of ``partitions`` (else
        FAILED_PRECONDITION: the caller asks the primary of the time)."""
        view = self._view()
        others = sorted(p for p in partitions if not self._primary_of(view, p))
        if others:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"store {self.store_id} is not the primary of partitions {others}",
            )
        return view

    def _archiving(self) -> bool:
        assert self._context is not None
        return self._context.options.archive

    async def _read(self, context: aio.ServicerContext[object, object], read: Callable[[], T]) -> T:
        """One read on a worker thread, counted as one item of load; a failed storage is
        UNAVAILABLE (and stops the store), a bad query INVALID_ARGUMENT."""
        load = self._load()
        try:
            await load.admit(1)
            with load.working(1):
                answer = await asyncio.to_thread(read)
            load.output(1)
        except StoreFailed as exc:
            self._fail(exc)
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except InvalidInput as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return answer

    # -- helpers ------------------------------------------------------------------------------

    def _serving(self) -> Entities:
        assert self._entities is not None, "the store has not started"
        return self._entities

    def _copy_state(self) -> Copier:
        assert self._copier is not None, "the store has not started"
        return self._copier

    def _view(self) -> StoreView:
        assert self._watch is not None, "the store has not started"
        return self._watch.view

    def _zk(self) -> Any:
        assert self._context is not None
        return self._context.zk

    def _load(self) -> Load:
        assert self._context is not None
        return self._context.load

    def _on_layout_change(self) -> None:  # kazoo's thread
        assert self._context is not None
        self._context.loop.call_soon_threadsafe(self._layout_changed.set)

    def _registration_changed(self, data: bytes | None, _stat: object) -> bool | None:
        if data is None and self._context is not None:  # kazoo's thread
            _log.error(
                "context store %s: its registration is gone (fenced): exiting", self.store_id
            )
            os._exit(EXIT_FENCED)
        return None

    def _fail(self, exc: BaseException) -> None:
        """The storage (or the coordination a write needs) failed: stop the process (its
        supervisor restarts it from disk). A call in flight while the store stops fails
        on the closed committer: it is refused (nothing of it acknowledged), not a failure
        (a store scaled in exited 1)."""
        if self._stopping:
            _log.info("context store %s: %s while stopping", self.store_id, exc)
            return
        _log.error("context store %s: %s; stopping", self.store_id, exc, exc_info=exc)
        assert self._context is not None
        self._context.loop.call_later(0.1, os._exit, 1)

    async def _sweep(self) -> None:
        entities = self._serving()
        turn = 0  # the partition whose history is swept next
        while True:
            await asyncio.sleep(EXPIRY_PERIOD)
            try:
                await asyncio.to_thread(entities.forget_writes, time.time() - WRITE_IDS_KEPT)
                if self.state != SERVING:
                    continue
                view = self._view()

                async def replicate(
                    puts: list[tuple[bytes, bytes]], deletes: list[bytes], v: StoreView = view
                ) -> None:
                    await self._replicate(v, puts, deletes)

                count = _partition_count(view)
                gone = await entities.expire(
                    partitions={p for p in range(count) if self._primary_of(view, p)},
                    replicate=replicate,
                )
                turn = (turn + 1) % PARTITIONS
                if turn < count and self._primary_of(view, turn):
                    await entities.forget_history(turn, replicate=replicate)
            except (StoreFailed, StorageError, SilboError) as exc:
                self._fail(exc)
                return
            if gone:
                _log.info("context store %s: %d expired entities deleted", self.store_id, gone)

    async def _probe(self) -> None:
        """Probe the primaries of the partitions held here; fence one that fails
        PROBE_FAILURES probes in a row, so that its partitions fail over (module doc)."""
        failures: dict[str, int] = {}
        channels: dict[str, aio.Channel] = {}
        while True:
            await asyncio.sleep(PROBE_PERIOD)
            view = self._view()
            layout = view.layout
            if self.state != SERVING or layout is None or self.store_id not in view.in_sync:
                continue
            held = layout.partitions_of(self.store_id)
            primaries = {view.primary(p) for p in held}
            targets = sorted(t for t in primaries if t is not None and t != self.store_id)
            answers = await asyncio.gather(
                *(self._alive(t, view.addresses.get(t), channels) for t in targets)
            )
            for target, alive in zip(targets, answers, strict=True):
                failures[target] = 0 if alive else failures.get(target, 0) + 1
                if failures[target] >= PROBE_FAILURES:
                    failures.pop(target)
                    await self.fence(target, f"failed {PROBE_FAILURES} probes")

    async def _alive(
        self, store: str, address: str | None, channels: dict[str, aio.Channel]
    ) -> bool:
        if address is None:
            return True  # not registered: no primary in anyone's view
        channel = channels.get(address)
        if channel is None:
            channel = channels[address] = aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        stub = wire_grpc.AdminStub(channel)  # type: ignore[no-untyped-call]
        try:
            await stub.Status(wire.StatusRequest(), timeout=PROBE_TIMEOUT, metadata=call_metadata())
            return True
        except grpc.aio.AioRpcError as exc:
            _log.info("store %s did not answer a probe: %s", store, exc.code().name)
            return False


class _Shipper:
    """The writes shipped to one backup, in order: one call in flight, all that waited in
    the next (module doc)."""

    def __init__(self, owner: ContextStore, store: str) -> None:
        self._owner = owner
        self._store = store
        self._queue: list[tuple[list[Any], list[bytes], asyncio.Future[None]]] = []
        self._wake = asyncio.Event()
        self._task = asyncio.create_task(self._run(), name=f"ship-{store}")
        self._channel: aio.Channel | None = None
        self._address = ""

    async def send(self, puts: list[tuple[bytes, bytes]], deletes: list[bytes]) -> None:
        """Return once the backup stored these (or was fenced)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.append((puts, deletes, done))
        self._wake.set()
        await done

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        if self._channel is not None:
            await self._channel.close()

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            waiting, self._queue = self._queue, []
            if not waiting:
                continue
            puts = [item for p, _d, _f in waiting for item in p]
            deletes = [key for _p, d, _f in waiting for key in d]
            try:
                await self._ship(puts, deletes)
            except Exception as exc:
                try:
                    await self._owner.fence(self._store, f"did not store a shipment ({exc!r})")
                except Exception as fenced:
                    for _p, _d, done in waiting:
                        if not done.done():
                            done.set_exception(SilboError(f"cannot fence {self._store}: {fenced}"))
                    continue
            for _p, _d, done in waiting:
                if not done.done():
                    done.set_result(None)

    async def _ship(self, puts: list[tuple[bytes, bytes]], deletes: list[bytes]) -> None:
        address = self._owner.address_of(self._store)
        if address is None:
            raise SilboError("it is not live")
        if self._channel is None or address != self._address:
            if self._channel is not None:
                await self._channel.close()
            self._channel = aio.insecure_channel(address, options=CHANNEL_OPTIONS)
            self._address = address
        stub = wire_grpc.ContextStoreStub(self._channel)  # type: ignore[no-untyped-call]
        await stub.Replicate(
            wire.StoreRequest(body=pack([puts, deletes])),
            timeout=SHIP_TIMEOUT,
            metadata=call_metadata(),
        )


def _partition(value: Any) -> int:
    """A partition number of a request (ValueError if it is none)."""
    partition = int(value)
    if not 0 <= partition < PARTITIONS:
        raise ValueError(f"no partition {partition}")
    return partition


def _partition_count(view: StoreView) -> int:
    return view.layout.partitions if view.layout is not None else 0
