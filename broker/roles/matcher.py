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

Load (broker.runtime.load): the items in and out are the updates matched (every matcher
matches every update, against its share of the subscriptions); a batch is busy while it waits
for ``--max-rate`` tokens, is decoded and matched (sending its partials is not: a full link to
a slow exit point is that exit point's load). ``--max-rate N`` counts an update as ``1/k`` of
an item, ``k`` the matchers of the configuration, since each does ``1/k`` of its matching: a
layer of ``k`` capped matchers serves ``k * N`` updates a second, as ``k`` capped processes
of another layer do.

A matcher scale is followed by a :class:`broker.roles.participant.Participant` (its phases
and their order are that module's doc); the snapshot protocol itself is docs/protocol.md.

Locking (the one lock, ``_lock``, an asyncio lock; there is no other): it is held while a
batch of updates is matched and its partials queued, while an in-band marker is handled,
while a received chunk is added (a piece of ``LOAD_PIECE`` subscriptions per hold) and when
the last part is sent. Subscriptions and unsubscriptions change the engine without it: they
do not await, so the event loop runs them whole between two holds. Parts are packed and
sent *without* it (two matchers sending each other parts would otherwise wait for each
other), and nothing awaits another process while holding it except the sends of partials
and markers, whose queues the exit points drain on their own.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt

from broker.coordination.scale import ScalePlan
from broker.coordination.scale import report as scale_report
from broker.errors import AlreadyExists, NotFound, SilboError, mapping_for
from broker.matching import Engine
from broker.matching.engine import REBUILD_BUDGET
from broker.model.subscription import Subscription
from broker.model.update import ContextUpdate
from broker.partition.parts import TrustedPart, pack_part_pieces
from broker.partition.selector import id_hashes
from broker.roles.matcher_dump import owned_parts
from broker.roles.participant import Participant, Phase
from broker.runtime.handles import connection_point_of
from broker.runtime.link import CHANNEL_OPTIONS, Link, follow_members
from broker.runtime.peers import ConfigurationView, Peers, ScaleView
from broker.runtime.process import ProcessContext
from broker.runtime.token import call_metadata
from broker.serialization import unpack_subscription, unpackb
from broker.wire import client_pb2 as pb
from broker.wire import internal_pb2 as wire
from broker.wire import internal_pb2_grpc as wire_grpc
from broker.wire.convert import trusted_update_from_obj
from broker.wire.streams import COLLECT
from spark_matcher.offload import Offload

__all__ = ["Matcher"]

_log = logging.getLogger(__name__)

EXIT_WAIT = 30.0
COMPACT_AFTER = 0.2  # seconds after the last subscription of a burst
SETTLE_AFTER = 3.0  # seconds after removing what moved away before compacting what stays
READY_COMPILE = 0.5  # seconds a new matcher compiles what it received before it is ready
LOAD_PIECE = 2000  # received subscriptions decoded and added per hold of the lock
DRAIN_SLICE = 1000  # subscriptions that moved away removed per turn of the event loop
# subscriptions per Transfer call (about 6.5 MB of W-IoT); SILBO_TRANSFER_CHUNK sets another
# size (tests make a part take several chunks without filling a matcher with 150,000)
TRANSFER_CHUNK = int(os.environ.get("SILBO_TRANSFER_CHUNK") or 50_000)
_SENDING_PARTS = "scale: sending parts"  # the name of the task that sends a matcher's parts
_NO_HANDLES: npt.NDArray[np.uint64] = np.zeros(0, dtype=np.uint64)


def _grown(array: npt.NDArray[Any], size: int, fill: object) -> npt.NDArray[Any]:
    grown = np.full(size, fill, dtype=array.dtype)
    grown[: len(array)] = array
    return grown


class Matcher(wire_grpc.MatcherServicer):
    """The matcher role (see the module doc)."""

    def __init__(self) -> None:
        self._context: ProcessContext | None = None
        self._engine = Engine()
        self._handles: npt.NDArray[np.uint64] = np.zeros(1024, dtype=np.uint64)
        self._id_hashes: npt.NDArray[np.uint64] = np.zeros(1024, dtype=np.uint64)  # by slot
        self._handle_of: dict[str, int] = {}
        # During a scale, by slot: does the subscription count for the old / the new epoch?
        self._in_old: npt.NDArray[np.bool_] = np.ones(1024, dtype=bool)
        self._in_new: npt.NDArray[np.bool_] = np.ones(1024, dtype=bool)
        self._scaling: Participant | None = None
        # After a scale: the ids that moved away and are still held (masked out of results
        # by _in_new until a slice of _drain removes them)
        self._draining: list[str] = []
        self._pending_parts: list[wire.Part] = []
        self._access_points: Peers | None = None
        self._matchers: Peers | None = None
        self._scale_view: ScaleView | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._exits: Peers | None = None
        self._config: ConfigurationView | None = None
        self._links: dict[int, Link] = {}  # exit point sequence -> link
        self._lock = asyncio.Lock()
        self._compaction: asyncio.TimerHandle | None = None
        self._compacting: asyncio.Task[None] | None = None
        self._connection_points: Peers | None = None
        self._seen_connection_points: set[int] = set()
        self._offload: Offload | None = None  # --spark-offload: large batches go to Spark

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
        self._access_points = Peers(context.zk, "access-point", context.loop)
        self._matchers = Peers(context.zk, "matcher", context.loop)
        self._scale_view = ScaleView(context.zk, context.loop)
        self._scale_view.on_change(self._follow_scale)
        if context.options.spark_offload:
            self._offload = Offload(
                context.options.spark_offload, context.options.spark_master or None
            )
            self._offload.start()

    def _forget_departed(self) -> None:
        """Drop the subscriptions of connection points that left, ``--session-grace`` seconds
        after they left (their sessions are gone).

        A connection point that stops cleanly unsubscribes its sessions itself; one that dies
        cannot, and its member znode disappears when its ZooKeeper session ends. Until the
        grace ends its subscriptions are still matched, so that the exit points keep what they
        would have delivered: a client resuming its session at another connection point
        takes its subscriptions over (same ids, new handles) and gets that (docs/failures.md).
        """
        assert self._connection_points is not None
        live = set(self._connection_points.by_sequence)
        departed = self._seen_connection_points - live
        self._seen_connection_points |= live
        if not departed:
            return
        self._seen_connection_points -= departed
        grace = self._ctx().options.session_grace
        self._ctx().loop.call_later(grace, self._drop_departed, departed)

    def _drop_departed(self, departed: set[int]) -> None:
        """Drop what the connection points ``departed`` still hold (not taken over)."""
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
        for peers in (self._connection_points, self._access_points, self._matchers):
            if peers is not None:
                peers.stop()
        if self._scale_view is not None:
            self._scale_view.stop()
        for watched in (self._config, self._exits):
            if watched is not None:
                watched.stop()
        await asyncio.gather(*(link.close() for link in self._links.values()))

    def _matchers_now(self) -> int:
        """How many matchers share the subscriptions (the configuration's; 1 before one)."""
        current = self._config.current if self._config else None
        return max(1, len(current.matchers)) if current is not None else 1

    def status(self) -> tuple[int, int]:
        current = self._config.current if self._config else None
        return (current.epoch if current else 0), len(self._engine)

    async def Subscriptions(
        self, request: wire.Empty, context: grpc.aio.ServicerContext[wire.Empty, wire.Part]
    ) -> AsyncIterator[wire.Part]:
        """The subscriptions this matcher owns now (see broker.roles.matcher_dump)."""
        current = self._config.current if self._config else None
        async for part in owned_parts(self._engine, self._ctx().name, current):
            yield part

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
                await ctx.load.admit(len(batch.updates.entities) / self._matchers_now())
                async with self._lock:
                    await self._match(sender, batch.updates)
            elif body == "subscriptions":
                yield self._subscribe(batch.subscriptions)
            elif body == "unsubscriptions":
                yield self._unsubscribe(batch.unsubscriptions)
            elif body == "marker":
                async with self._lock:
                    await self._marker(sender, batch.marker)

    def _subscribe(self, subscriptions: wire.Subscriptions) -> wire.RequestAck:
        ids = []
        replaced = []
        try:
            decoded = [
                (p.handle, unpack_subscription(p.subscription)) for p in subscriptions.placements
            ]
            for _handle, subscription in decoded:
                if subscription.id in self._engine and not subscriptions.replace:
                    raise AlreadyExists(f"subscription id {subscription.id!r} is taken")
            for handle, subscription in decoded:
                old = self._handle_of.get(subscription.id, handle)
                self._engine.add(subscription)
                self._remember(subscription.id, handle)
                ids.append(subscription.id)
                replaced.append(0 if old == handle else old)
        except SilboError as exc:
            return self._refusal(subscriptions.request, exc)
        self._ctx().metrics.subscriptions.set(len(self._engine))
        self._schedule_compaction()
        return wire.RequestAck(request=subscriptions.request, ids=ids, replaced=replaced)

    def _schedule_compaction(self, delay: float = COMPACT_AFTER) -> None:
        """Build the indexes of new subscriptions soon, rather than in the first match.

        Otherwise the first updates after a burst of subscriptions pay for building every
        index they touch, a latency spike. One compaction per burst: ``delay`` seconds
        after its last subscription (rebuilding the index while a long registration goes on
        would cost more each time).
        """
        if self._compaction is not None:
            self._compaction.cancel()
        self._compaction = self._ctx().loop.call_later(delay, self._compact)

    def _compact(self) -> None:
        self._compaction = None
        if self._compacting is not None:
            self._compacting.cancel()  # what it built stays built; the new one does the rest
        self._compacting = self._spawn(self._compact_groups())

    async def _compact_groups(self) -> None:
        """Build the indexes one run at a time, matching in between (a large group takes
        seconds to build whole); what is built already is skipped."""
        spent = 0.0
        steps = self._engine.compaction()
        while True:
            started = time.perf_counter()
            done = next(steps, None) is None
            spent += time.perf_counter() - started
            if done:
                break
            await asyncio.sleep(0)
        self._ctx().metrics.stage_seconds.labels(stage="compact").observe(spent)
        # The subscriptions live long: keep them out of the collector's scans, so that a full
        # collection in the middle of matching does not walk the whole index (latency spikes).
        gc.freeze()
        self._compacting = None

    def _spawn(self, work: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = self._ctx().loop.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

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
        """Keep a subscribed subscription's handle by slot, counted for every epoch."""
        self._handle_of[subscription_id] = handle
        slot = self._engine.slot_of(subscription_id)
        if slot is None:
            return
        self._reserve(slot + 1)
        self._handles[slot] = handle
        self._id_hashes[slot] = id_hashes([subscription_id])[0]
        self._in_old[slot] = True
        self._in_new[slot] = True

    def _reserve(self, size: int) -> None:
        """Make the by-slot arrays hold at least ``size`` slots (new ones count for both
        epochs)."""
        if size > len(self._handles):
            size = max(size, 2 * len(self._handles))
            self._handles = _grown(self._handles, size, 0)
            self._id_hashes = _grown(self._id_hashes, size, 0)
            self._in_old = _grown(self._in_old, size, True)
            self._in_new = _grown(self._in_new, size, True)

    # -- matching -----------------------------------------------------------------------

    async def _match_on_spark(
        self, offload: Offload, batch: list[ContextUpdate]
    ) -> list[npt.NDArray[np.int64]] | None:
        """The engine's answer for ``batch``, computed by Spark on a worker thread (None if
        Spark failed: the engine then matches the batch). Outside a scale only: the slots
        count for every epoch."""
        started = time.perf_counter()
        now = time.time()
        version = self._engine.version
        snapshot = None if offload.current(version, now) else self._engine.subscriptions()
        loop = asyncio.get_running_loop()
        try:
            found = await loop.run_in_executor(None, offload.match, version, snapshot, batch, now)
        except Exception:
            _log.exception(
                "Spark failed on a batch of %d updates; the engine matches it", len(batch)
            )
            return None
        slot_of = self._engine.slot_of
        results = []
        for ids in found:
            slots = [slot for i in ids if (slot := slot_of(i)) is not None]
            results.append(np.array(sorted(slots), dtype=np.int64))
        self._ctx().metrics.stage_seconds.labels(stage="spark").observe(
            time.perf_counter() - started
        )
        return results

    async def _match(self, access_point: str, updates: wire.Updates) -> None:
        ctx = self._ctx()
        with ctx.load.working(len(updates.entities)):
            partials = await self._partials(updates)
        ctx.load.output(len(updates.entities))
        gatherers = list(updates.gatherers) or list(self._links)
        await self._await_exit_points(set(gatherers))
        last = updates.first_seq + len(updates.entities) - 1
        for sequence in gatherers:
            link = self._links.get(sequence)
            if link is None:
                continue  # the exit point died: its batches are lost with it
            partial = partials.get(sequence) or wire.Partial()
            partial.access_point = access_point
            partial.first_seq = updates.first_seq
            partial.last_seq = last
            partial.epoch = updates.epoch
            partial.origin = updates.origin
            partial.origin_batch = updates.origin_batch
            partial.incarnation = updates.incarnation
            partial.completer = updates.exit_points[0]  # one publisher per batch
            await link.send(wire.Gather(partial=partial).SerializeToString())

    async def _partials(self, updates: wire.Updates) -> dict[int, wire.Partial]:
        """Match a batch: the partial result for each exit point concerned (by member
        sequence)."""
        ctx = self._ctx()
        started = time.perf_counter()
        batch = [trusted_update_from_obj(obj) for obj in unpackb(updates.matchable)]
        results = None
        offload = self._offload
        if (
            offload is not None
            and self._scaling is None
            and not self._draining
            and offload.wanted(len(batch))
        ):
            results = await self._match_on_spark(offload, batch)
        if results is None:
            results = self._engine.match_batch_slots(batch)
        if self._scaling is not None:  # count each subscription in its epoch only
            plan = self._scaling.plan
            counts = self._in_old if updates.epoch <= plan.old.epoch else self._in_new
            results = [slots[counts[slots]] for slots in results]
        elif self._draining:  # what moved away is still held: leave it out
            counts = self._in_new
            results = [slots[counts[slots]] for slots in results]
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
        return partials

    # -- the scale protocol (docs/protocol.md) ---------------------------------------------

    async def _marker(self, access_point: str, marker: wire.Marker) -> None:
        """A control marker from an access point, in order with its data (the lock is held)."""
        kind = marker.WhichOneof("kind")
        if kind == "start_scale":
            plan = ScalePlan.decode(marker.start_scale.plan)
            scaling = self._scaling_for(plan)
            scaling.started_from.add(access_point)
            _log.info(
                "scale %s: start marker from %s (%s of %s)",
                plan.id,
                access_point,
                sorted(scaling.started_from),
                sorted(self._access_point_names()),
            )
            if not scaling.cut and scaling.started_from >= self._access_point_names():
                await self._split(scaling)
        elif kind == "switch":
            marker.switch.access_point = access_point
            await self._forward(marker, list(self._links))
            current = self._scaling
            if current is None:
                return
            current.switched_from.add(access_point)
            if current.switched_from >= self._access_point_names():
                await self._finish(current)
        elif kind == "fence":
            marker.fence.matcher = self._ctx().name
            await self._forward(marker, list(marker.fence.exit_points))

    async def _forward(self, marker: wire.Marker, exit_points: list[int]) -> None:
        """Pass a marker on to exit points, after every partial result sent them before.

        A switch tells them an access point's old epoch is over on this matcher's channel
        (it names the access point); a fence, that everything this matcher matched before
        it is with them (it names this matcher).
        """
        await self._await_exit_points(set(exit_points))
        payload = wire.Gather(marker=marker).SerializeToString()
        for sequence in exit_points:
            link = self._links.get(sequence)
            if link is not None:
                await link.send(payload)

    def _scaling_for(self, plan: ScalePlan) -> Participant:
        previous = self._scaling
        if previous is None or previous.plan.id != plan.id:
            if previous is not None:  # its end has not reached this matcher's view yet
                self._settle(previous, completed=plan.old.epoch >= previous.plan.new.epoch)
            self._drop_moved(self._draining)  # the new plan starts from a clean engine
            self._draining = []
            scaling = self._scaling = Participant(plan)
            pending, self._pending_parts = self._pending_parts, []
            for part in pending:
                if part.plan == plan.id:
                    self._load_pending(part)
            return scaling
        return previous

    def _access_point_names(self) -> set[str]:
        assert self._access_points is not None
        return set(self._access_points.by_name)

    async def _split(self, scaling: Participant) -> None:
        """Every access point's start marker is in (the cut): send what moves to its owners.

        With replicas each subscription has a preference list per epoch. Its first holder in
        the old epoch sends it to each holder the new epoch adds; every old holder the new
        epoch drops lets it go once the scale is over. The subscriptions stay here, counted
        for the old epoch only, until every access point has switched: matching of old-epoch
        updates goes on undisturbed.
        """
        ctx = self._ctx()
        scaling.advance(Phase.CUT)
        plan = scaling.plan
        if ctx.name not in plan.old.matchers:
            await self._check_ready(scaling)
            return
        # By slot, with the id hashes kept since each subscription came: a million ids
        # hashed and looked up one by one here would stop matching for a second.
        engine = self._engine
        slots = engine.held_slots()
        inactive = engine.inactive()
        hashes = np.concatenate([self._id_hashes[slots], id_hashes([s.id for s in inactive])])
        old, new = plan.old.selector, plan.new.selector
        me = old.owners.index(ctx.name)
        before = old.holder_indices(hashes)
        # the new epoch's holders, as indices into the old owners (-1: a new matcher)
        position = {owner: i for i, owner in enumerate(old.owners)}
        remap = np.array([position.get(owner, -1) for owner in new.owners], dtype=np.intp)
        after = new.holder_indices(hashes)
        leaves = ~(remap[after] == me).any(axis=1)
        where = np.flatnonzero(leaves)
        active = int(np.searchsorted(where, len(slots)))  # where[:active]: active ones
        self._in_new[slots[where[:active]]] = False
        scaling.moved_out = self._ids_at(where, slots, inactive)
        # what this matcher sends: the ids it heads the old list of, to each new holder
        first = before[:, 0] == me
        sends: dict[str, list[str]] = {}
        for column in range(after.shape[1]):
            target = after[:, column]
            gained = ~(before == remap[target][:, None]).any(axis=1)
            rows = np.flatnonzero(first & gained)
            for index in np.unique(target[rows]).tolist():
                chosen = rows[target[rows] == index]
                sends.setdefault(new.owners[index], []).extend(
                    self._ids_at(chosen, slots, inactive)
                )
        leaving = [(engine.get(i), owner) for owner, ids in sends.items() for i in ids]
        sent = sum(map(len, sends.values()))
        _log.info(
            "scale %s: %d subscriptions move away (%d copies to new holders)",
            plan.id,
            len(scaling.moved_out),
            sent,
        )
        ctx.metrics.items_out.labels(kind="moved_subscription").inc(sent)
        # Sent without holding the lock: two matchers sending each other parts would
        # otherwise wait for each other forever. Matching goes on meanwhile.
        self._spawn(
            self._send_parts(scaling, [s for s, _ in leaving], [o for _, o in leaving])
        ).set_name(_SENDING_PARTS)

    def _ids_at(
        self, rows: npt.NDArray[np.intp], slots: npt.NDArray[np.int64], inactive: list[Subscription]
    ) -> list[str]:
        """The ids of ``rows`` of the split's table (held slots first, then inactive ones)."""
        active = int(np.searchsorted(rows, len(slots)))
        return [
            *self._engine.ids(slots[rows[:active]]),
            *(inactive[i - len(slots)].id for i in rows[active:].tolist()),
        ]

    async def _send_parts(
        self, scaling: Participant, leaving: list[Subscription], owners: list[str]
    ) -> None:
        """Pack what leaves (``owners``: the new owner of each) a piece at a time, matching in
        between, and send each new owner its part (an empty one if nothing goes to it), all
        owners at once.

        On the event loop rather than a thread: a packing thread holds the interpreter lock
        for most of every switch interval, and matching would wait for it at every turn.
        """
        ctx = self._ctx()
        plan = scaling.plan
        groups: dict[str, list[Subscription]] = {
            owner: [] for owner in plan.new.selector.owners if owner != ctx.name
        }
        for subscription, owner in zip(leaving, owners, strict=True):
            groups[owner].append(subscription)
        try:
            await asyncio.gather(
                *(self._send_part(plan, owner, group) for owner, group in groups.items())
            )
        except Exception:
            _log.exception("sending the parts of scale %s failed", scaling.plan.id)
            return  # never ready: the coordinator rolls the scale back
        async with self._lock:
            scaling.advance(Phase.SENT)
            await self._check_ready(scaling)

    async def _send_part(self, plan: ScalePlan, owner: str, group: list[Subscription]) -> None:
        """Send ``owner`` its part in chunks of TRANSFER_CHUNK subscriptions, each sent as
        soon as it is packed: the receiver decodes and adds one while this packs the next
        (one chunk, empty, when nothing goes to it). Returns once it took them all in."""
        matchers = self._matchers
        assert matchers is not None
        if not await matchers.wait_until(lambda: owner in matchers.by_name, 30.0):
            raise RuntimeError(f"matcher {owner} is not registered")
        address = matchers.by_name[owner].address
        name = self._ctx().name
        calls: list[asyncio.Future[wire.Empty]] = []
        async with grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS) as channel:
            stub = wire_grpc.MatcherStub(channel)  # type: ignore[no-untyped-call]
            try:
                for start in range(0, max(len(group), 1), TRANSFER_CHUNK):
                    pieces = []
                    chunk = group[start : start + TRANSFER_CHUNK]
                    for piece in pack_part_pieces(owner, chunk, total=len(group)):
                        pieces.append(piece)
                        await asyncio.sleep(0)
                    data = b"".join(pieces)
                    _log.info("sending a chunk of %d bytes to %s", len(data), owner)
                    part = wire.Part(sender=name, epoch=plan.new.epoch, data=data, plan=plan.id)
                    calls.append(
                        asyncio.ensure_future(
                            stub.Transfer(
                                part, wait_for_ready=True, timeout=60.0, metadata=call_metadata()
                            )
                        )
                    )
                await asyncio.gather(*calls)
            finally:
                for call in calls:
                    call.cancel()
        _log.info("sent the part to %s", owner)

    async def Transfer(
        self, part: wire.Part, context: grpc.aio.ServicerContext[wire.Part, wire.Empty]
    ) -> wire.Empty:
        _log.info("a chunk of plan %s arrives from %s", part.plan, part.sender)
        async with self._lock:
            plan = self._scale_view.plan if self._scale_view else None
            if plan is not None and plan.id == part.plan:
                self._scaling_for(plan)
            if self._scaling is None or self._scaling.plan.id != part.plan:
                self._pending_parts.append(part)  # its plan has not reached us yet
                _log.info("scale: part from %s waits for its plan", part.sender)
                return wire.Empty()
        # Decoded and added a piece at a time, matching in between (see _send_parts): what is
        # added counts for the new epoch only, so old-epoch updates match as before. What is
        # decoded and added lives long: frozen at once (see _compact_groups), else each full
        # collection meanwhile would scan all that came before it.
        chunk = TrustedPart(part.data, self._ctx().name)
        for piece in chunk.pieces(LOAD_PIECE):
            async with self._lock:
                if self._scaling is None or self._scaling.plan.id != part.plan:
                    return wire.Empty()  # the plan ended: its rollback drops what was added
                self._add_received(piece)
            gc.freeze()
            await asyncio.sleep(0)
        async with self._lock:
            if self._scaling is None or self._scaling.plan.id != part.plan:
                return wire.Empty()
            self._load(part, chunk)
            await self._check_ready(self._scaling)
        return wire.Empty()

    def _add_received(self, subscriptions: Sequence[Subscription]) -> None:
        """Add subscriptions received in a part, counted for the new epoch only."""
        self._engine.add_many(subscriptions)
        handles = [int(s.subscriber, 16) for s in subscriptions]
        self._handle_of.update(zip([s.id for s in subscriptions], handles, strict=True))
        slot_of = self._engine.slot_of
        slots, held, ids = [], [], []
        for subscription, handle in zip(subscriptions, handles, strict=True):
            slot = slot_of(subscription.id)
            if slot is not None:  # else inactive: never matched
                slots.append(slot)
                held.append(handle)
                ids.append(subscription.id)
        if not slots:
            return
        self._reserve(max(slots) + 1)
        where = np.array(slots, dtype=np.int64)
        self._handles[where] = np.array(held, dtype=np.uint64)
        self._id_hashes[where] = id_hashes(ids)
        self._in_old[where] = False
        self._in_new[where] = True

    def _load_pending(self, part: wire.Part) -> None:
        """Take in a chunk that came before its plan reached this matcher."""
        chunk = TrustedPart(part.data, self._ctx().name)
        for piece in chunk.pieces():
            self._add_received(piece)
        self._load(part, chunk)

    def _load(self, part: wire.Part, chunk: TrustedPart) -> None:
        """Count a received chunk whose subscriptions were added (for the new epoch only);
        the sender's part is in once its chunks add up to the part's total."""
        scaling = self._scaling
        assert scaling is not None
        taken = scaling.received_from.get(part.sender, 0) + chunk.count
        scaling.received_from[part.sender] = taken
        if taken >= chunk.total:
            scaling.parts_from.add(part.sender)
        _log.info(
            "scale %s: %d of %d subscriptions from %s in",
            scaling.plan.id,
            taken,
            chunk.total,
            part.sender,
        )
        scaling.received += chunk.count
        scaling.received_bytes += len(part.data)
        self._ctx().metrics.subscriptions.set(len(self._engine))
        if scaling.parts_from >= set(scaling.plan.old.matchers) - {self._ctx().name}:
            self._schedule_compaction()  # once, after the last part: each would rebuild it all

    async def _check_ready(self, scaling: Participant) -> None:
        ctx = self._ctx()
        plan = scaling.plan
        if scaling.ready or ctx.name not in plan.new.matchers:
            return
        senders = set(plan.old.matchers) - {ctx.name}
        if not scaling.parts_from >= senders:
            return
        if ctx.name in plan.old.matchers and not scaling.sent:
            return
        if not await self._await_serving(plan.new.exit_points):
            return  # never ready: the coordinator rolls the scale back
        if ctx.name not in plan.old.matchers:
            await self._compile_received()
        scaling.advance(Phase.READY)
        _log.info("scale %s: ready", plan.id)
        body = {"moved": scaling.received, "bytes": scaling.received_bytes}
        await self._report("ready", body)

    async def _compile_received(self) -> None:
        """A new matcher, before it reports ready: compile what it received, the largest
        groups first, for up to READY_COMPILE seconds (the scheduled compaction does the
        rest). It matches nothing before the switch, and after it every update waits for
        its result: an index built now is not built in the first matches."""
        steps = self._engine.compaction()
        deadline = time.perf_counter() + READY_COMPILE
        while time.perf_counter() < deadline and next(steps, None) is not None:
            await asyncio.sleep(0)

    async def _finish(self, scaling: Participant) -> None:
        """Every access point switched: drop what moved away, count everything again."""
        self._settle(scaling, completed=True)
        await self._report("done", {"moved": len(scaling.moved_out)})

    async def _report(self, stage: str, body: Mapping[str, float]) -> None:
        """Report a stage of the scale; one ZooKeeper never took is logged (the coordinator
        times out), and never ends the stream whose marker brought it here."""
        ctx = self._ctx()
        try:
            await asyncio.to_thread(scale_report, ctx.zk, stage, ctx.name, body)
        except SilboError as exc:
            _log.error("could not report %s: %s", stage, exc)

    def _follow_scale(self) -> None:
        """The plan changed: a new one may let parts waiting for it in. One that ended (the
        coordinator removed it, or died) whose epoch never became the configuration's was
        rolled back: undo what it did here and send no more of its parts."""
        view = self._scale_view
        plan = view.plan if view else None
        scaling = self._scaling
        if plan is not None:
            if self._pending_parts and scaling is None:
                self._spawn(self._adopt(plan))
            return
        ended = view.ended if view else None
        if ended is not None:  # parts of an ended plan that still wait never count
            self._pending_parts = [p for p in self._pending_parts if p.plan != ended.id]
        if scaling is None:
            return
        current = self._config.current if self._config else None
        if current is not None and current.epoch >= scaling.plan.new.epoch:
            if self._ctx().name not in scaling.plan.old.matchers:
                self._settle(scaling, completed=True)  # a newcomer: it never saw the old epoch
            return  # an old matcher finishes on the access points' switch markers
        self._settle(scaling, completed=False)

    def _settle(self, scaling: Participant, *, completed: bool) -> None:
        """Leave a scale that ended: completed (what moved away goes, everything counts for
        every epoch) or rolled back (what was received goes; parts still on their way are
        stopped, so none reaches a receiver that has rolled back already)."""
        if completed:
            self._draining += scaling.moved_out
        else:
            for task in list(self._tasks):
                if task.get_name() == _SENDING_PARTS:
                    task.cancel()
            ended = scaling.plan.id
            self._pending_parts = [p for p in self._pending_parts if p.plan != ended]
            received = []
            for subscription_id in self._handle_of:  # drop what was received
                slot = self._engine.slot_of(subscription_id)
                if slot is not None and not self._in_old[slot]:
                    received.append(subscription_id)
            self._engine.remove_many(received)
            for subscription_id in received:
                del self._handle_of[subscription_id]
        self._in_old[:] = True
        self._in_new[:] = True
        if self._scaling is scaling:
            self._scaling = None
        self._ctx().metrics.subscriptions.set(len(self._engine))
        if self._draining:
            self._mask_draining()
            self._spawn(self._drain())

    def _mask_draining(self) -> None:
        """Leave the subscriptions that moved away out of every result until they are gone."""
        slot_of = self._engine.slot_of
        slots = [slot_of(i) for i in self._draining]
        held = np.array([s for s in slots if s is not None], dtype=np.int64)
        self._in_old[held] = False
        self._in_new[held] = False

    async def _drain(self) -> None:
        """Remove the subscriptions that moved away a slice at a time, matching in between
        (half a million removed at once would stop matching for seconds).

        Nothing is rebuilt meanwhile, and the compaction that rebuilds the groups from what
        stays comes SETTLE_AFTER seconds later: right after a switch the new matchers build
        their indexes and the backlog is worked off, and dead clauses match no slower than
        they did alive.
        """
        while self._draining:
            await asyncio.sleep(0)
            chunk = self._draining[-DRAIN_SLICE:]
            del self._draining[-DRAIN_SLICE:]
            self._drop_moved(chunk, rebuild_budget=0)
        if self._scaling is None:  # else the plan that started owns the masks
            self._in_old[:] = True
            self._in_new[:] = True
        self._ctx().metrics.subscriptions.set(len(self._engine))
        self._schedule_compaction(SETTLE_AFTER)

    def _drop_moved(self, ids: Sequence[str], rebuild_budget: int = REBUILD_BUDGET) -> None:
        """Remove those of ``ids`` that are still held as moved away (masked out of the new
        epoch: one received again since then counts, and stays)."""
        engine, counts = self._engine, self._in_new
        gone = []
        for subscription_id in ids:
            if subscription_id in engine:
                slot = engine.slot_of(subscription_id)
                if slot is None or not counts[slot]:
                    gone.append(subscription_id)
        engine.remove_many(gone, rebuild_budget)
        for subscription_id in gone:
            self._handle_of.pop(subscription_id, None)

    async def _adopt(self, plan: ScalePlan) -> None:
        """Load the parts that came before ``plan`` reached this matcher (those of another
        epoch belong to a plan that ended: dropped)."""
        async with self._lock:
            if self._scaling is not None:
                return
            pending = [p for p in self._pending_parts if p.plan == plan.id]
            self._pending_parts = pending
            if pending:
                await self._check_ready(self._scaling_for(plan))

    async def _await_exit_points(self, wanted: set[int]) -> None:
        """Link to every exit point of ``wanted`` that is a member (one that is not died)."""
        exits = self._exits
        assert exits is not None
        if wanted <= self._links.keys():
            return
        self._sync_links()

        def linked() -> bool:
            return all(s in self._links or s not in exits.by_sequence for s in wanted)

        if not await exits.wait_until(linked, EXIT_WAIT):
            _log.error("exit points %s never appeared; their results are dropped", wanted)

    async def _await_serving(self, names: tuple[str, ...]) -> bool:
        """Before a configuration naming these exit points goes live: know and link them all
        (their partial results must start with the first batch of the new epoch)."""
        exits = self._exits
        assert exits is not None
        if not await exits.wait_until(lambda: set(names) <= exits.by_name.keys(), EXIT_WAIT):
            missing = sorted(set(names) - exits.by_name.keys())
            _log.error("exit points %s are not registered: not ready", missing)
            return False
        self._sync_links()
        return True

    def _sync_links(self) -> None:
        if self._exits is None:
            return
        ctx = self._ctx()
        hello = wire.Gather(hello=wire.Hello(sender=ctx.name, role="matcher"))
        follow_members(
            self._links,
            self._exits.members,
            method=COLLECT,
            hello=hello.SerializeToString(),
            metrics=ctx.metrics,
        )

    def _ctx(self) -> ProcessContext:
        assert self._context is not None, "the role has not started"
        return self._context
