"""The exit point: gathers every matcher's partial result for a batch, then delivers.

Each matcher holds one ``ExitPoint.Collect`` stream to it and sends, for every batch of
updates of every access point, one ``Partial`` (empty ones too). A batch is complete when
every matcher of the epoch it was routed under has reported it; complete batches are
delivered in sequence order per access point. Because each matcher's channel is ordered and
every matcher reports every batch, a batch is complete only after all earlier batches of
its access point are, so releasing from the head of the line never skips one.

Delivering a batch merges the partials' subscription handles per update, routes them by
connection point (the top bits of the handle) and sends one ``Deliveries`` message to each
connection point concerned.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
import numpy as np
import numpy.typing as npt

from broker.runtime.handles import connection_points_of
from broker.runtime.link import Link, follow_members
from broker.runtime.peers import ConfigurationView, Peers
from broker.runtime.process import ProcessContext
from broker.wire import internal_pb2 as wire
from broker.wire import internal_pb2_grpc as wire_grpc

__all__ = ["ExitPoint"]

_log = logging.getLogger(__name__)

_DELIVER = "/broker.wire.Delivery/Deliver"


@dataclass(eq=False)
class _Pending:
    """One batch of one access point, as its partials arrive."""

    epoch: int
    first_seq: int
    arrived: float
    reported: set[str] = field(default_factory=set)
    partials: list[wire.Partial] = field(default_factory=list)


class ExitPoint(wire_grpc.ExitPointServicer):
    """The exit point role (see the module doc)."""

    def __init__(self) -> None:
        self._context: ProcessContext | None = None
        self._config: ConfigurationView | None = None
        self._connection_points: Peers | None = None
        self._links: dict[int, Link] = {}  # connection point sequence -> link
        self._pending: dict[str, dict[int, _Pending]] = {}  # access point -> first_seq -> ...
        self._lock = asyncio.Lock()

    def add_to(self, server: grpc.aio.Server) -> None:
        wire_grpc.add_ExitPointServicer_to_server(self, server)  # type: ignore[no-untyped-call]

    async def start(self, context: ProcessContext) -> None:
        self._context = context
        self._config = ConfigurationView(context.zk, context.loop)
        self._connection_points = Peers(context.zk, "connection-point", context.loop)
        self._connection_points.on_change(self._sync_links)
        self._config.on_change(self._release_all)
        self._sync_links()

    async def stop(self) -> None:
        for watched in (self._config, self._connection_points):
            if watched is not None:
                watched.stop()
        await asyncio.gather(*(link.close() for link in self._links.values()))

    def status(self) -> tuple[int, int]:
        current = self._config.current if self._config else None
        return (current.epoch if current else 0), 0

    # -- the inbound stream of one matcher ------------------------------------------------

    async def Collect(
        self,
        request_iterator: AsyncIterator[wire.Gather],
        context: grpc.aio.ServicerContext[wire.Gather, wire.Empty],
    ) -> wire.Empty:
        ctx = self._ctx()
        received = ctx.metrics.messages_in.labels(stream="Collect")
        matcher = ""
        async for gather in request_iterator:
            received.inc()
            body = gather.WhichOneof("body")
            if body == "hello":
                matcher = gather.hello.sender
            elif body == "partial":
                await self._add(matcher, gather.partial)
        return wire.Empty()

    async def _add(self, matcher: str, partial: wire.Partial) -> None:
        line = self._pending.setdefault(partial.access_point, {})
        pending = line.get(partial.first_seq)
        if pending is None:
            pending = line[partial.first_seq] = _Pending(
                partial.epoch, partial.first_seq, time.perf_counter()
            )
        pending.reported.add(matcher)
        if partial.items:
            pending.partials.append(partial)
        await self._release(partial.access_point)

    def _release_all(self) -> None:
        for access_point in list(self._pending):
            self._ctx().loop.create_task(self._release(access_point))

    async def _release(self, access_point: str) -> None:
        async with self._lock:
            line = self._pending.get(access_point)
            while line:
                head = line[next(iter(line))]
                if not self._complete(head):
                    return
                del line[head.first_seq]
                await self._deliver(head)

    def _complete(self, pending: _Pending) -> bool:
        assert self._config is not None
        configuration = self._config.history.get(pending.epoch)
        if configuration is None:
            return False  # this epoch's configuration has not reached us yet
        return pending.reported.issuperset(configuration.matchers)

    # -- delivering -----------------------------------------------------------------------

    async def _deliver(self, pending: _Pending) -> None:
        ctx = self._ctx()
        ctx.metrics.stage_seconds.labels(stage="gather").observe(
            time.perf_counter() - pending.arrived
        )
        if not pending.partials:
            return
        entities: dict[int, tuple[bytes, str, int]] = {}
        items: list[npt.NDArray[np.int64]] = []
        handles: list[npt.NDArray[np.uint64]] = []
        for partial in pending.partials:
            for i, item in enumerate(partial.items):
                if item not in entities:
                    entities[item] = (
                        partial.entities[i],
                        partial.publishers[i],
                        partial.sequences[i],
                    )
            counts = np.asarray(partial.counts, dtype=np.int64)
            items.append(np.repeat(np.asarray(partial.items, dtype=np.int64), counts))
            handles.append(np.frombuffer(partial.handles, dtype="<u8"))
        all_items = np.concatenate(items)
        all_handles = np.concatenate(handles)
        order = np.argsort(all_items, kind="stable")
        all_items, all_handles = all_items[order], all_handles[order]
        targets = connection_points_of(all_handles)
        for target in np.unique(targets).tolist():
            chosen = targets == target
            used, index = np.unique(all_items[chosen], return_inverse=True)
            rows = [entities[i] for i in used.tolist()]
            deliveries = wire.Deliveries(
                entities=[row[0] for row in rows],
                publishers=[row[1] for row in rows],
                sequences=[row[2] for row in rows],
                entity_index=index.tolist(),
                handles=all_handles[chosen].astype("<u8").tobytes(),
            )
            link = self._links.get(int(target))
            if link is None or not await link.send(
                wire.Handoff(deliveries=deliveries).SerializeToString()
            ):
                ctx.metrics.items_out.labels(kind="undeliverable").inc(int(chosen.sum()))
                continue
            ctx.metrics.items_out.labels(kind="notification").inc(int(chosen.sum()))

    def _sync_links(self) -> None:
        if self._connection_points is None:
            return
        ctx = self._ctx()
        hello = wire.Handoff(hello=wire.Hello(sender=ctx.name, role="exit-point"))
        follow_members(
            self._links,
            self._connection_points.members,
            method=_DELIVER,
            hello=hello.SerializeToString(),
            metrics=ctx.metrics,
        )

    def _ctx(self) -> ProcessContext:
        assert self._context is not None, "the role has not started"
        return self._context
