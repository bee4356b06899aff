"""The aggregation groups on a context store process: its loop, reports and derived writes.

The state and its rules are broker.store.aggregation_runtime's :class:`Aggregator`; this
module carries them (docs/aggregation.md):

- the definitions: followed in ZooKeeper (broker.coordination.aggregations), handed to the
  aggregator as versions on every change;
- the writes: the store's ``Apply`` hands over what it applied (:meth:`StoreAggregation.
  observe`), once durable, without the writes sent again (their first sending counted);
  each counts at its own time (when it was applied: event time, not when it is observed);
- every :data:`TICK` seconds: panes closed and made durable (one commit), a report to every
  serving store (``ContextStore.Aggregate``, this one's own taken directly), then the windows
  due written. Panes close up to the time the store gives (``oldest``): the time of the
  oldest write it is applying, if any (observed once durable, it counts at that time or
  later), else the clock; so a write is never later than its pane's close, but when the
  clock goes back.

Derived writes go through a connection point like a gRPC publisher's with ``store`` set
(broker.roles.stored_publish): upserted in the context store (at the primary of the derived
entity's partition, which is this store: an owner writes only the keys it is the primary
of), then the stored entity published with its change, so that the derived entity is read,
notified and aggregated again (a level above) like any other. A window is marked written
only once its publish is acknowledged; a failure (no connection point, a refusal) leaves it
due for the next tick.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from typing import Any, Final

import grpc
from grpc import aio

from broker.coordination.aggregations import DefinitionsWatch, Stored
from broker.errors import SilboError
from broker.ngsi.entity import to_wire
from broker.roles.store_writer import StoreWriter
from broker.runtime.link import CHANNEL_OPTIONS
from broker.runtime.process import ProcessContext
from broker.runtime.token import call_metadata
from broker.store.aggregation_runtime import (
    KEY_SPACE,
    Aggregator,
    DerivedWrite,
    PaneKey,
    Version,
)
from broker.store.engine import Engine, GroupCommitter
from broker.store.entities import partition_of
from broker.store.layout import SERVING, StoreView
from broker.store.semantics import Applied
from broker.store.wire import pack, unpack
from broker.wire import internal_pb2 as wire
from broker.wire import internal_pb2_grpc as wire_grpc

__all__ = ["REPORT_TIMEOUT", "TICK", "StoreAggregation", "storable", "versions_of"]

TICK: Final = 0.1  # seconds between rounds of closing, reporting and writing
REPORT_TIMEOUT: Final = 2.0  # seconds another store may take to take a report
HAND_OVER: Final = 5.0  # seconds a store leaving the layer may take to hand its panes over
PUBLISH_TIMEOUT: Final = 10.0  # seconds a connection point may take to store derived writes

_log = logging.getLogger(__name__)


def versions_of(stored: Stored) -> list[Version]:
    """The versions a kept aggregation applies: its current one, and the one it replaced up
    to the current one's ``since`` (InvalidInput if a document is not a definition)."""
    now, before = stored.current, stored.previous
    versions = [Version.parse(now.document, now.tenant, now.service_path, now.version, now.since)]
    if before is not None:
        versions.append(
            Version.parse(
                before.document,
                before.tenant,
                before.service_path,
                before.version,
                before.since,
                now.since,
            )
        )
    return versions


class StoreAggregation:
    """One context store's part of the aggregation groups (see the module doc)."""

    def __init__(
        self,
        store_id: str,
        engine: Engine,
        committer: GroupCommitter,
        context: ProcessContext,
        view: Callable[[], StoreView],
        serving: Callable[[], bool],
        oldest: Callable[[], float | None],
    ) -> None:
        """``oldest``: the time of the oldest write the store is applying (None: none is)."""
        self._engine = engine
        self._oldest = oldest
        self._committer = committer
        self._context = context
        self._view = view
        self._serving = serving
        self.aggregator = Aggregator(store_id, int.from_bytes(os.urandom(6), "big") or 1)
        self._oversize_logged = -math.inf  # when records too long for the engine were logged
        self._watch: DefinitionsWatch | None = None
        self._task: asyncio.Task[None] | None = None
        self._channels: dict[str, aio.Channel] = {}  # address -> channel
        self._writer = StoreWriter(
            context.zk, f"aggregation-{self.aggregator.store_id}", PUBLISH_TIMEOUT
        )
        self._defined_once = asyncio.Event()  # the definitions were read (not before)

    async def start(self) -> None:
        """Take back the panes kept, follow the definitions, start the loop."""
        kept = await asyncio.to_thread(lambda: list(self._engine.scan(KEY_SPACE)))
        self.aggregator.load(kept)
        loop = self._context.loop
        self._watch = await asyncio.to_thread(
            DefinitionsWatch, self._context.zk, loop, self._defined
        )
        self._task = asyncio.create_task(self._run(), name="aggregation")

    async def stop(self, leaving: bool = False) -> None:
        """Stop the loop; keep every pane, the open ones too (a restart goes on with them).
        ``leaving``: this store left the store layer (a scale-in) and is not started again,
        so its panes are handed over to their owners first (:meth:`_hand_over`)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if leaving and self.aggregator.pane_count():
            await self._hand_over()
        if self._watch is not None:
            self._watch.stop()
        puts, deletes = self.aggregator.durable(everything=True)
        puts = self._storable(puts)
        if puts or deletes:
            with contextlib.suppress(SilboError):
                await self._committer.write(puts, deletes)
        for channel in self._channels.values():
            await channel.close()
        await self._writer.close()

    def _storable(self, puts: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
        """The pane records the engine takes: one whose key is too long (LMDB: 511 bytes; a
        long group id, service path and group key) is kept in memory only, and logged (once
        a minute at most), rather than failing every round's write (docs/context-store.md)."""
        kept, dropped = storable(puts, self._engine.max_key_size)
        if dropped and time.monotonic() >= self._oversize_logged + 60.0:
            self._oversize_logged = time.monotonic()
            _log.warning(
                "%d aggregation records have keys over %s bytes: kept in memory only (lost "
                "on a restart of store %s)",
                dropped,
                self._engine.max_key_size,
                self.aggregator.store_id,
            )
        return kept

    async def _hand_over(self) -> None:
        """Close every pane (this store applies nothing more) and report them until each
        owner took them, within :data:`HAND_OVER` seconds: the owners write the windows
        with them (again, as a correction, if they wrote them already). Without it a store
        scaled in took the values it had applied in the open windows with it."""
        aggregator = self.aggregator
        aggregator.close_all()
        view = self._view()

        def owner_of(tenant: str, entity_id: str) -> str | None:
            return view.primary(partition_of(tenant, entity_id))

        deadline = time.monotonic() + HAND_OVER
        while aggregator.unsent(owner_of) and time.monotonic() < deadline:
            serving = sorted(s for s, r in view.registrations.items() if r.state == SERVING)
            reports = aggregator.reports(owner_of, serving)
            await asyncio.gather(
                *(self._report(store, view, body, sent) for store, (body, sent) in reports.items())
            )
            if aggregator.unsent(owner_of):
                await asyncio.sleep(TICK)
                view = self._view()
        left = aggregator.unsent(owner_of)
        if left:
            _log.warning("aggregation: %d panes not handed over before stopping", left)

    def observe(self, applied: Sequence[Applied], fresh: Sequence[int], now: float) -> None:
        """Count the writes of one ``Apply``, applied at ``now`` (``fresh``: the indexes of
        those applied by it, not answered from an earlier sending)."""
        if self.aggregator.active:
            self.aggregator.observe((applied[i] for i in fresh), now)

    def receive(self, body: bytes) -> bytes:
        """Take another store's report (``ContextStore.Aggregate``); the answer."""
        return pack(self.aggregator.receive(unpack(body)))

    # -- the loop -------------------------------------------------------------------------

    def _defined(self, known: dict[str, Stored]) -> None:
        versions = []
        for name, stored in known.items():
            try:
                versions += versions_of(stored)
            except SilboError as exc:
                _log.error("aggregation %s is not used: %s", name, exc)
        self.aggregator.define(versions)
        self._defined_once.set()

    async def _run(self) -> None:
        await self._defined_once.wait()  # panes kept of groups not yet read are not sent
        while True:
            await asyncio.sleep(TICK)
            if not self.aggregator.active or not self._serving():
                continue
            try:
                await self._tick()
            except (SilboError, grpc.RpcError, OSError) as exc:
                _log.warning("aggregation round failed (again next round): %s", exc)
            except Exception:  # a bug must not stop the groups for good: logged, again
                _log.exception("aggregation round failed (again next round)")

    async def _tick(self) -> None:
        aggregator = self.aggregator
        now, oldest = time.time(), self._oldest()
        aggregator.close(now if oldest is None else min(now, oldest))
        puts, deletes = aggregator.durable()
        puts = self._storable(puts)
        if puts or deletes:
            await self._committer.write(puts, deletes)
        view = self._view()
        serving = sorted(s for s, r in view.registrations.items() if r.state == SERVING)
        aggregator.forget_marks(serving)

        def owner_of(tenant: str, entity_id: str) -> str | None:
            return view.primary(partition_of(tenant, entity_id))

        reports = aggregator.reports(owner_of, serving)
        await asyncio.gather(
            *(self._report(store, view, body, sent) for store, (body, sent) in reports.items())
        )
        writes, settled = aggregator.due(
            serving, lambda tenant, entity_id: owner_of(tenant, entity_id) == aggregator.store_id
        )
        if not writes:
            aggregator.written(settled)
            return
        try:
            await self._publish(writes)
        except (SilboError, OSError) as exc:
            aggregator.failed(settled)
            _log.warning("derived entities not written (again next round): %s", exc)
            return
        aggregator.written(settled)

    async def _report(
        self, store: str, view: StoreView, body: dict[str, Any], sent: list[PaneKey]
    ) -> None:
        aggregator = self.aggregator
        if store == aggregator.store_id:
            aggregator.answered(store, aggregator.receive(body), sent)
            return
        address = view.addresses.get(store)
        if address is None:
            return
        channel = self._channels.get(address)
        if channel is None:
            channel = self._channels[address] = aio.insecure_channel(
                address, options=CHANNEL_OPTIONS
            )
        stub = wire_grpc.ContextStoreStub(channel)  # type: ignore[no-untyped-call]
        try:
            answer: wire.StoreAnswer = await stub.Aggregate(
                wire.StoreRequest(body=pack(body)),
                timeout=REPORT_TIMEOUT,
                metadata=call_metadata(),
            )
        except grpc.aio.AioRpcError as exc:
            _log.info("store %s took no aggregation report (%s)", store, exc.code().name)
            return
        aggregator.answered(store, unpack(answer.body), sent)

    async def _publish(self, writes: list[DerivedWrite]) -> None:
        """Upsert the derived entities through a connection point, in order."""
        entities = [
            to_wire(w.entity_id, w.entity_type, w.tenant, w.service_path, w.attributes)
            for w in writes
        ]
        await self._writer.write(entities)


def storable(
    puts: list[tuple[bytes, bytes]], limit: int | None
) -> tuple[list[tuple[bytes, bytes]], int]:
    """The records an engine taking keys of at most ``limit`` bytes (None: any) can store,
    and how many it cannot."""
    if limit is None:
        return puts, 0
    kept = [(k, v) for k, v in puts if len(k) <= limit]
    return kept, len(puts) - len(kept)
