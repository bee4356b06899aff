"""The matcher: one partition of the subscriptions, matched against every update.

Each access point holds one ``Matcher.Match`` stream to it, on which, in order:

- ``Subscriptions`` / ``Unsubscriptions`` change the engine (an id already held is refused
  with ALREADY_EXISTS, an unknown one with NOT_FOUND) and are acknowledged on the same
  stream once applied;
- ``Updates`` are decoded from their matchable form (validated once, by the connection
  point), matched as one batch, and the result is sent to every exit point as a
  ``Partial``: the matched items of the updates that exit point gathers (subscription
  handles, not ids) and, for all of them, the watermark ``last_seq``. An exit point that
  gathers none of the batch's updates still gets the (empty) partial, which is how it knows
  this matcher has nothing for them.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import AsyncIterator

import grpc
import numpy as np
import numpy.typing as npt

from broker.errors import AlreadyExists, NotFound, SilboError, mapping_for
from broker.matching import Engine
from broker.runtime.handles import connection_point_of
from broker.runtime.link import Link, LinkState
from broker.runtime.peers import ConfigurationView, Peers
from broker.runtime.process import ProcessContext
from broker.serialization import unpack_subscription, unpackb
from broker.wire import client_pb2 as pb
from broker.wire import internal_pb2 as wire
from broker.wire import internal_pb2_grpc as wire_grpc
from broker.wire.convert import trusted_update_from_obj

__all__ = ["Matcher"]

_log = logging.getLogger(__name__)

_COLLECT = "/broker.wire.ExitPoint/Collect"
EXIT_WAIT = 30.0
COMPACT_AFTER = 0.2  # seconds after the last subscription of a burst
_NO_HANDLES: npt.NDArray[np.uint64] = np.zeros(0, dtype=np.uint64)


class Matcher(wire_grpc.MatcherServicer):
    """The matcher role (see the module doc)."""

    def __init__(self) -> None:
        self._context: ProcessContext | None = None
        self._engine = Engine()
        self._handles: npt.NDArray[np.uint64] = np.zeros(1024, dtype=np.uint64)
        self._handle_of: dict[str, int] = {}
        self._exits: Peers | None = None
        self._config: ConfigurationView | None = None
        self._links: dict[int, Link] = {}  # exit point sequence -> link
        self._lock = asyncio.Lock()
        self._compaction: asyncio.TimerHandle | None = None
        self._connection_points: Peers | None = None
        self._seen_connection_points: set[int] = set()

    def add_to(self, server: grpc.aio.Server) -> None:
        wire_grpc.add_MatcherServicer_to_server(self, server)  # type: ignore[no-untyped-call]

    async def start(self, context: ProcessContext) -> None:
        self._context = context
        self._config = ConfigurationView(context.zk, context.loop)
        self._exits = Peers(context.zk, "exit-point", context.loop)
        self._exits.on_change(self._sync_links)
        self._sync_links()
        self._connection_points = Peers(context.zk, "connection-point", context.loop)
        self._connection_points.on_change(self._forget_departed)

    def _forget_departed(self) -> None:
        """Drop the subscriptions of connection points that left (their sessions are gone).

        A connection point that stops cleanly unsubscribes its sessions itself; one that dies
        cannot, and its member znode disappears when its ZooKeeper session ends.
        """
        assert self._connection_points is not None
        live = set(self._connection_points.by_sequence)
        departed = self._seen_connection_points - live
        self._seen_connection_points |= live
        if not departed:
            return
        self._seen_connection_points -= departed
        orphans = [i for i, h in self._handle_of.items() if connection_point_of(h) in departed]
        for subscription_id in orphans:
            self._engine.remove(subscription_id)
            del self._handle_of[subscription_id]
        if orphans:
            _log.warning(
                "dropped %d subscriptions of departed connection points %s",
                len(orphans),
                sorted(departed),
            )
            self._ctx().metrics.subscriptions.set(len(self._engine))

    async def stop(self) -> None:
        if self._connection_points is not None:
            self._connection_points.stop()
        for watched in (self._config, self._exits):
            if watched is not None:
                watched.stop()
        await asyncio.gather(*(link.close() for link in self._links.values()))

    def status(self) -> tuple[int, int]:
        current = self._config.current if self._config else None
        return (current.epoch if current else 0), len(self._engine)

    # -- the inbound stream of one access point -----------------------------------------

    async def Match(
        self,
        request_iterator: AsyncIterator[wire.Batch],
        context: grpc.aio.ServicerContext[wire.Batch, wire.RequestAck],
    ) -> AsyncIterator[wire.RequestAck]:
        ctx = self._ctx()
        received = ctx.metrics.messages_in.labels(stream="Match")
        sender = ""
        async for batch in request_iterator:
            received.inc()
            body = batch.WhichOneof("body")
            if body == "hello":
                sender = batch.hello.sender
            elif body == "updates":
                async with self._lock:
                    await self._match(sender, batch.updates)
            elif body == "subscriptions":
                yield self._subscribe(batch.subscriptions)
            elif body == "unsubscriptions":
                yield self._unsubscribe(batch.unsubscriptions)

    def _subscribe(self, subscriptions: wire.Subscriptions) -> wire.RequestAck:
        ids = []
        try:
            decoded = [
                (p.handle, unpack_subscription(p.subscription)) for p in subscriptions.placements
            ]
            for _handle, subscription in decoded:
                if subscription.id in self._engine and not subscriptions.replace:
                    raise AlreadyExists(f"subscription id {subscription.id!r} is taken")
            for handle, subscription in decoded:
                self._engine.add(subscription)
                self._remember(subscription.id, handle)
                ids.append(subscription.id)
        except SilboError as exc:
            return self._refusal(subscriptions.request, exc)
        self._ctx().metrics.subscriptions.set(len(self._engine))
        self._schedule_compaction()
        return wire.RequestAck(request=subscriptions.request, ids=ids)

    def _schedule_compaction(self) -> None:
        """Build the indexes of new subscriptions soon, rather than in the first match.

        Otherwise the first updates after a burst of subscriptions pay for building every
        index they touch, a latency spike. One compaction per burst (debounced).
        """
        if self._compaction is None:
            self._compaction = self._ctx().loop.call_later(COMPACT_AFTER, self._compact)

    def _compact(self) -> None:
        self._compaction = None
        started = time.perf_counter()
        self._engine.compact()
        self._ctx().metrics.stage_seconds.labels(stage="compact").observe(
            time.perf_counter() - started
        )
        # The subscriptions live long: keep them out of the collector's scans, so that a full
        # collection in the middle of matching does not walk the whole index (latency spikes).
        gc.freeze()

    def _unsubscribe(self, unsubscriptions: wire.Unsubscriptions) -> wire.RequestAck:
        missing = [i for i in unsubscriptions.ids if i not in self._engine]
        for subscription_id in unsubscriptions.ids:
            if subscription_id in self._engine:
                self._engine.remove(subscription_id)
                self._handle_of.pop(subscription_id, None)
        self._ctx().metrics.subscriptions.set(len(self._engine))
        if missing:
            return self._refusal(
                unsubscriptions.request, NotFound(f"no subscription {missing[0]!r}")
            )
        return wire.RequestAck(request=unsubscriptions.request, ids=list(unsubscriptions.ids))

    @staticmethod
    def _refusal(request: int, exc: SilboError) -> wire.RequestAck:
        error = pb.Error(code=mapping_for(exc).grpc_status, message=str(exc))
        return wire.RequestAck(request=request, error=error)

    def _remember(self, subscription_id: str, handle: int) -> None:
        self._handle_of[subscription_id] = handle
        slot = self._engine.slot_of(subscription_id)
        if slot is None:
            return
        if slot >= len(self._handles):
            grown = np.zeros(max(slot + 1, 2 * len(self._handles)), dtype=np.uint64)
            grown[: len(self._handles)] = self._handles
            self._handles = grown
        self._handles[slot] = handle

    # -- matching -----------------------------------------------------------------------

    async def _match(self, access_point: str, updates: wire.Updates) -> None:
        ctx = self._ctx()
        started = time.perf_counter()
        batch = [trusted_update_from_obj(obj) for obj in unpackb(updates.matchable)]
        results = self._engine.match_batch_slots(batch)
        count = len(batch)
        lengths = np.fromiter(map(len, results), dtype=np.int64, count=count)
        items = np.flatnonzero(lengths)
        exit_points = np.asarray(updates.exit_points, dtype=np.int64)[items]
        handles = (
            self._handles[np.concatenate([results[i] for i in items.tolist()])]
            if len(items)
            else _NO_HANDLES
        )
        ends = np.cumsum(lengths[items])
        partials: dict[int, wire.Partial] = {}
        targets = np.unique(exit_points).tolist()
        for target in targets:
            chosen = items if len(targets) == 1 else items[exit_points == target]
            rows = chosen.tolist()
            if len(targets) == 1:
                chosen_handles = handles
            else:
                mask = exit_points == target
                starts = ends - lengths[items]
                chosen_handles = np.concatenate(
                    [
                        handles[a:b]
                        for a, b in zip(starts[mask].tolist(), ends[mask].tolist(), strict=True)
                    ]
                )
            partials[target] = wire.Partial(
                items=rows,
                entities=[updates.entities[i] for i in rows],
                publishers=[updates.publishers[i] for i in rows],
                sequences=[updates.sequences[i] for i in rows],
                counts=lengths[chosen].tolist(),
                handles=chosen_handles.astype("<u8", copy=False).tobytes(),
            )
        ctx.metrics.stage_seconds.labels(stage="match").observe(time.perf_counter() - started)
        ctx.metrics.items_in.labels(kind="update").inc(count)
        ctx.metrics.items_out.labels(kind="match").inc(len(handles))
        await self._await_exit_points(set(partials))
        last = updates.first_seq + count - 1
        for sequence, link in list(self._links.items()):
            partial = partials.get(sequence) or wire.Partial()
            partial.access_point = access_point
            partial.first_seq = updates.first_seq
            partial.last_seq = last
            partial.epoch = updates.epoch
            await link.send(wire.Gather(partial=partial).SerializeToString())

    async def _await_exit_points(self, wanted: set[int]) -> None:
        assert self._exits is not None
        if wanted <= self._links.keys():
            return
        self._sync_links()
        if not await self._exits.wait_until(lambda: wanted <= self._links.keys(), EXIT_WAIT):
            _log.error("exit points %s never appeared; their results are dropped", wanted)

    def _sync_links(self) -> None:
        if self._exits is None:
            return
        ctx = self._ctx()
        hello = wire.Gather(hello=wire.Hello(sender=ctx.name, role="matcher"))
        for member in self._exits.members:
            link = self._links.get(member.sequence)
            if link is not None and link.state is LinkState.OPEN:
                continue
            link = Link(
                member.name,
                member.address,
                _COLLECT,
                hello.SerializeToString(),
                metrics=ctx.metrics,
                streaming_response=False,
            )
            self._links[member.sequence] = link
            link.start()
        gone = set(self._links) - set(self._exits.by_sequence)
        for sequence in gone:
            ctx.loop.create_task(self._links.pop(sequence).close())

    def _ctx(self) -> ProcessContext:
        assert self._context is not None, "the role has not started"
        return self._context
