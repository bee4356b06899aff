"""The exit point: gathers every matcher's partial result for a batch, then delivers.

Each matcher holds one ``ExitPoint.Collect`` stream to it and sends, for every batch of
updates of every access point, one ``Partial`` (empty ones too). A batch is complete when
every matcher of the epoch it was routed under has reported it; complete batches are
delivered in sequence order per access point: an access point's batches cover consecutive
sequence ranges, and the exit point releases only the batch that starts where the last one
released ended. (Arrival order is not enough: during a matcher scale the new matchers
report only new-epoch batches, which can reach the exit point before any matcher has
reported an older, old-epoch one.)

Delivering a batch merges the partials' subscription handles per update, routes them by
connection point (the top bits of the handle) and sends one ``Deliveries`` message to each
connection point concerned.

Load (broker.runtime.load): the items in are the updates of the batches this exit point
gathers (its publishers' batches: it is their ``completer``; once each, however many matchers
reported them), the items out the same updates once their notifications are sent on (the
pipeline counts updates on every layer). Every exit point also receives the
(empty) partials of the other exit points' batches, to keep each access point's order: their
handling counts as busy time but not as items, nor against ``--max-rate``, so ``k`` capped
exit points serve ``k`` times the cap when the publishers spread over them. A batch is busy
while it waits for ``--max-rate`` tokens and while its partials are merged and its
deliveries serialized, not while a full link to a connection point holds it back.

Markers from the matchers (docs/protocol.md):

- a *switch* says an access point's old epoch is over on that matcher's channel. In an
  exit-point scale, an exit point of the old configuration reports *drained* once every
  access point's old epoch is over on every matcher's channel, it has delivered all of it,
  and every connection point confirmed it took those deliveries (a ``Flush`` marker on each
  Deliver stream, then ``Delivery.Flushed``); an exit point holds back the batches of the
  new epoch until every exit point of the old one drained, so that a publisher whose
  updates change exit point keeps its order.
- a *fence* from a connection point: once every matcher's fence is in and every batch those
  matchers reported before it is delivered, the connection point is told (a ``Handoff``
  marker after those deliveries on its stream).

Replicas: with ``r`` replicas every subscription is held by ``r`` matchers, so the partial
results of all but ``r - 1`` of an epoch's matchers cover every subscription. A batch that
misses fewer than ``r`` of them is complete once it has waited ``STRAGGLER_GRACE``: a hung or
slow matcher (or one that died and is not repaired yet) delays delivery by that much, and
loses nothing. The matchers a batch went out without are *suspects*: later batches that miss
only suspects go out at once, until a suspect reports in time again. Partials of the same
subscription from two holders are merged (one notification per update and subscription); a
partial that comes after its batch went out is dropped.

Failures (docs/failures.md): members a repair removed are in the configuration's
``failed``. A batch needs the partial results of its epoch's *live* matchers only (without
replicas the dead one's matches for batches in flight are lost with it), and a fence the
copies of the live ones. The line of a dead access point is closed ``LINE_GRACE`` seconds
after its repair (what the matchers had of it has reached us by then): its complete batches
are delivered, the incomplete ones (some matcher never got them) dropped and counted as
lost. Every delivery is also kept for a while per connection point (the last seconds; all
since it became unreachable, for ``--session-grace``), so that a client whose connection
point died can resume its session at another one, which asks for it (``Replay``:
broker/runtime/retained.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
import numpy.typing as npt
from kazoo.exceptions import KazooException

from broker.coordination.membership import MEMBERS
from broker.coordination.scale import read_plan, reports
from broker.coordination.scale import report as scale_report
from broker.errors import SilboError
from broker.runtime.handles import connection_points_of
from broker.runtime.link import CHANNEL_OPTIONS, Link, follow_members
from broker.runtime.peers import ConfigurationView, Peers, ScaleView
from broker.runtime.process import ProcessContext
from broker.runtime.retained import Retained
from broker.runtime.token import call_metadata
from broker.wire import internal_pb2 as wire
from broker.wire import internal_pb2_grpc as wire_grpc
from broker.wire.streams import DELIVER

__all__ = ["ExitPoint"]

_log = logging.getLogger(__name__)

DRAIN_FALLBACK = 1.0  # seconds between looks at the drained reports when no watch fires
LINE_GRACE = 2.0  # seconds after a dead access point's repair before its line is closed
STRAGGLER_GRACE = 1.0  # seconds a batch waits for a matcher its replicas can stand in for
ORIGIN_WAIT = 10.0  # seconds to wait for a link to a connection point to report completions
FLUSH_WAIT = 5.0  # seconds a connection point may take to confirm a drained exit point's flush


@dataclass(eq=False)
class _Fence:
    """A connection point's fence as the matchers' copies of it arrive."""

    connection_point: int
    fence: wire.Fence  # the first copy
    arrived: set[str] = field(default_factory=set)
    waits: list[tuple[str, int]] = field(default_factory=list)  # (access point, first_seq)


@dataclass(eq=False)
class _Pending:
    """One batch of one access point, as its partials arrive."""

    epoch: int
    first_seq: int
    arrived: float
    last_seq: int
    origin: int = 0  # the connection point that took the batch in (0: none to tell)
    origin_batch: int = 0
    completer: int = 0  # the exit point that tells it the batch is delivered
    incarnation: int = 0  # the publisher's (Updates.incarnation)
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
        self._next: dict[str, int] = {}  # access point -> the first_seq to release next
        # access point -> the epoch of its batch taken off the line and being delivered (a
        # capped exit point waits for its rate meanwhile, a full link for room)
        self._delivering: dict[str, int] = {}
        self._lock = asyncio.Lock()
        self._access_points: Peers | None = None
        self._matchers: Peers | None = None
        self._scale: ScaleView | None = None
        self._ended: dict[str, dict[str, int]] = {}  # access point -> matcher -> new epoch
        self._fences: dict[tuple[int, int], _Fence] = {}
        self._cleared: set[int] = set()  # epochs whose batches may go out
        self._clearing: set[int] = set()  # epochs being waited for
        self._drained: set[str] = set()  # the plans this exit point reported drained for
        self._failed: frozenset[str] = frozenset()  # members repairs removed
        self._closing: set[str] = set()  # dead access points whose lines close soon
        self._tasks: set[asyncio.Task[None]] = set()
        self._timers: dict[str, asyncio.TimerHandle] = {}  # access point -> straggler wait
        self._suspects: set[str] = set()  # matchers batches went out without (see the doc)
        self._retained = Retained()  # for sessions resumed elsewhere (the module doc)
        self._sweeper: asyncio.Task[None] | None = None
        self._flush_tokens = itertools.count(1)

    def add_to(self, server: grpc.aio.Server) -> None:
        wire_grpc.add_ExitPointServicer_to_server(self, server)  # type: ignore[no-untyped-call]

    async def start(self, context: ProcessContext) -> None:
        self._context = context
        self._config = ConfigurationView(context.zk, context.loop)
        self._connection_points = Peers(context.zk, "connection-point", context.loop)
        self._connection_points.on_change(self._sync_links)
        self._config.on_change(self._follow_failures)
        self._config.on_change(self._release_all)
        self._access_points = Peers(context.zk, "access-point", context.loop)
        self._access_points.on_change(self._check_drained)  # a dead one is not waited for
        self._matchers = Peers(context.zk, "matcher", context.loop)
        self._matchers.on_change(self._check_drained)  # a dead one is not waited for
        self._scale = ScaleView(context.zk, context.loop)
        self._scale.on_change(self._check_drained)
        self._retained.grace = context.options.session_grace
        self._sync_links()
        self._sweeper = context.loop.create_task(self._sweep_retained())

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
        for watched in (
            self._config,
            self._connection_points,
            self._access_points,
            self._matchers,
            self._scale,
        ):
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
            elif body == "marker":
                marker = gather.marker
                kind = marker.WhichOneof("kind")
                if kind == "switch":
                    access_point = marker.switch.access_point
                    self._ended.setdefault(access_point, {})[matcher] = marker.epoch
                    self._check_drained()
                elif kind == "fence":
                    await self._add_fence(matcher, marker.fence)
        return wire.Empty()

    async def _add(self, matcher: str, partial: wire.Partial) -> None:
        if partial.first_seq < self._next.get(partial.access_point, partial.first_seq):
            self._ctx().metrics.items_in.labels(kind="late_partial").inc()
            return  # its batch went out without it (its replicas stood in)
        if matcher in self._suspects:
            self._suspects.discard(matcher)
            _log.info("matcher %s reports in time again", matcher)
        line = self._pending.setdefault(partial.access_point, {})
        self._next.setdefault(partial.access_point, partial.first_seq)
        pending = line.get(partial.first_seq)
        if pending is None:
            pending = line[partial.first_seq] = _Pending(
                partial.epoch,
                partial.first_seq,
                time.perf_counter(),
                partial.last_seq,
                partial.origin,
                partial.origin_batch,
                partial.completer,
                partial.incarnation,
            )
        pending.reported.add(matcher)
        if partial.items:
            pending.partials.append(partial)
        await self._release(partial.access_point)

    def _release_all(self) -> None:
        for access_point in list(self._pending):
            self._ctx().loop.create_task(self._release(access_point))

    async def _release(self, access_point: str) -> None:
        load = self._ctx().load
        async with self._lock:
            line = self._pending.get(access_point)
            completed: dict[int, list[int]] = {}
            while line:
                head = line.get(self._next[access_point])
                if head is None or not self._may_deliver(head.epoch):
                    break
                if not self._complete(head):
                    self._wait_for_stragglers(access_point, head)
                    break
                del line[head.first_seq]
                self._next[access_point] = head.last_seq + 1
                updates = head.last_seq - head.first_seq + 1
                if head.completer != self._ctx().member.sequence:
                    updates = 0  # another exit point's batch: only its order passes here
                self._delivering[access_point] = head.epoch
                try:
                    await load.admit(updates)
                    with load.working(updates):
                        await self._deliver(head)
                finally:
                    del self._delivering[access_point]
                load.output(updates)
                self._note_completed(head, completed)
            await self._send_completed(completed)
            await self._pass_fences()
        self._check_drained()

    def _note_completed(self, pending: _Pending, completed: dict[int, list[int]]) -> None:
        if pending.origin_batch and pending.completer == self._ctx().member.sequence:
            completed.setdefault(pending.origin, []).append(pending.origin_batch)

    async def _send_completed(self, completed: dict[int, list[int]]) -> None:
        """Tell each origin connection point which of its batches are delivered (after the
        deliveries: on its own stream they come first)."""
        for origin, batches in completed.items():
            message = wire.Handoff(completed=wire.Completed(batches=batches)).SerializeToString()
            link = self._links.get(origin)
            if link is not None:
                await link.send(message)
            else:  # a connection point that registered a moment ago: not linked yet
                self._spawn(self._send_completed_later(origin, message))

    async def _send_completed_later(self, origin: int, message: bytes) -> None:
        peers = self._connection_points
        assert peers is not None
        self._sync_links()
        if await peers.wait_until(lambda: origin in self._links, ORIGIN_WAIT):
            await self._links[origin].send(message)
        else:
            _log.warning("connection point %d is gone: its completions are dropped", origin)

    def _complete(self, pending: _Pending) -> bool:
        missing = self._missing(pending)
        if missing is None:
            return False  # this epoch's configuration has not reached us yet
        if not missing:
            return True
        if len(missing) >= self._replicas(pending):
            return False
        if missing <= self._suspects:
            return True
        if time.perf_counter() - pending.arrived < STRAGGLER_GRACE:
            return False
        _log.warning("delivering without %s (late by %.1f s)", sorted(missing), STRAGGLER_GRACE)
        self._suspects |= missing
        return True

    def _missing(self, pending: _Pending) -> set[str] | None:
        """The live matchers of the batch's epoch that have not reported it."""
        assert self._config is not None
        configuration = self._config.history.get(pending.epoch)
        if configuration is None:
            return None
        return set(configuration.matchers) - self._failed - pending.reported

    def _replicas(self, pending: _Pending) -> int:
        assert self._config is not None
        configuration = self._config.history.get(pending.epoch)
        return configuration.selector.width if configuration is not None else 1

    def _wait_for_stragglers(self, access_point: str, head: _Pending) -> None:
        """Look at the line again when its head may go out without its stragglers."""
        missing = self._missing(head)
        if not missing or len(missing) >= self._replicas(head) or access_point in self._timers:
            return
        delay = max(0.0, head.arrived + STRAGGLER_GRACE - time.perf_counter())

        def again() -> None:
            del self._timers[access_point]
            self._spawn(self._release(access_point))

        self._timers[access_point] = self._ctx().loop.call_later(delay + 0.001, again)

    # -- failures -------------------------------------------------------------------------

    def _follow_failures(self) -> None:
        """A repair removed members: stop waiting for them (see the module doc)."""
        current = self._config.current if self._config else None
        if current is None or not current.failed:
            return
        self._failed = frozenset(current.failed)
        for access_point in self._failed.intersection(self._pending) - self._closing:
            self._closing.add(access_point)
            self._spawn(self._close_line(access_point))

    async def _close_line(self, access_point: str) -> None:
        await asyncio.sleep(LINE_GRACE)
        ctx = self._ctx()
        async with self._lock:
            line = self._pending.pop(access_point, {})
            self._next.pop(access_point, None)
            lost = resent = 0
            completed: dict[int, list[int]] = {}
            whole = True  # deliver the complete batches up to the first incomplete one only
            for first_seq in sorted(line):
                pending = line[first_seq]
                whole = whole and self._complete(pending)
                if whole:
                    await self._deliver(pending)
                    self._note_completed(pending, completed)
                elif pending.origin_batch:
                    resent += 1  # its connection point sends it again
                else:
                    lost += sum(len(p.items) for p in pending.partials)
            await self._send_completed(completed)
            await self._pass_fences()
        if line:
            _log.warning(
                "closed the line of dead access point %s: %d batches, %d left to their "
                "connection points to send again, %d updates with matches lost",
                access_point,
                len(line),
                resent,
                lost,
            )
            ctx.metrics.items_out.labels(kind="lost").inc(lost)

    # -- exit-point scales ------------------------------------------------------------------

    def _may_deliver(self, epoch: int) -> bool:
        """May batches of ``epoch`` go out? Not while it changed the exit points and one of
        the previous epoch's has not drained (a moved publisher's earlier updates are there)."""
        if epoch in self._cleared:
            return True
        assert self._config is not None
        configuration = self._config.history.get(epoch)
        if configuration is None:
            # the matchers' partials came before this process saw the epoch (its watch lags
            # on a loaded machine): not known to change nothing. Looked at again when the
            # configuration comes (it releases every line)
            return False
        previous = self._config.history.get(epoch - 1)
        if previous is not None and configuration.exit_points == previous.exit_points:
            self._cleared.add(epoch)
            return True
        if epoch not in self._clearing:
            self._clearing.add(epoch)
            old = previous.exit_points if previous is not None else None
            self._spawn(self._await_drained(epoch, old))
        return False

    async def _await_drained(self, epoch: int, previous: tuple[str, ...] | None) -> None:
        """Wait until the exit points of the epoch before ``epoch`` drained (or died, or the
        scale is over), then let ``epoch``'s batches go out. ``previous``: those exit
        points, None when this process did not see that epoch (the first it saw, or the
        watch skipped it): the scale's plan names them."""
        ctx = self._ctx()
        zk, loop = ctx.zk, ctx.loop
        changed = asyncio.Event()

        def watcher(_event: object) -> None:  # kazoo's thread
            loop.call_soon_threadsafe(changed.set)

        def drained() -> bool:
            plan = read_plan(zk)
            if plan is None or plan.new.epoch != epoch:
                return True
            old = previous if previous is not None else plan.old.exit_points
            if old == plan.new.exit_points:
                return True  # not an exit-point scale
            live = set(zk.get_children(f"{MEMBERS}/exit-point", watch=watcher))
            return set(old) & live <= set(reports(zk, "drained", watch=watcher))

        assert self._scale is not None
        self._scale.on_change(changed.set)  # the plan ended
        try:
            while True:
                changed.clear()  # the reads watch what they read
                try:
                    if await asyncio.to_thread(drained):
                        break
                except (SilboError, KazooException) as exc:  # ZooKeeper away: look again
                    _log.warning("epoch %d: the drained reports could not be read: %s", epoch, exc)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), DRAIN_FALLBACK)
        finally:
            self._scale.off_change(changed.set)
        _log.info("epoch %d: the previous exit points drained; delivering", epoch)
        self._cleared.add(epoch)
        self._clearing.discard(epoch)
        self._release_all()

    def _check_drained(self) -> None:
        """Report drained once this exit point delivered all of the old epoch of an
        exit-point scale (every live access point's switch came through every live matcher:
        a member whose registration is gone, hung past its session or dead, sends nothing
        more, and waiting for it would hold the scale, and the repair behind it, to its
        timeout)."""
        plan = self._scale.plan if self._scale else None
        ctx = self._ctx()
        if plan is None or plan.layer != "exit-points" or plan.id in self._drained:
            return
        if plan.old.exit_points and ctx.name not in plan.old.exit_points:
            return
        epoch = plan.new.epoch
        assert self._access_points is not None
        assert self._matchers is not None
        live = set(self._matchers.by_name) - self._failed
        for access_point in self._access_points.by_name:
            ended = self._ended.get(access_point, {})
            if any(ended.get(m, 0) < epoch for m in plan.old.matchers if m in live):
                return
        # A dead access point's line is left out: its repair waits for this scale, and what
        # the line holds is its connection points' to send again (after the repair it closes).
        lines = [line for ap, line in self._pending.items() if ap in self._access_points.by_name]
        if any(p.epoch < epoch for line in lines for p in line.values()):
            return
        # nor one taken off its line and not yet on the links: the Flush marker would go out
        # before it, and the new exit point of a moved publisher deliver before it
        if any(e < epoch for e in self._delivering.values()):
            return
        self._drained.add(plan.id)
        self._spawn(self._flush_then_report(plan.id))

    async def _flush_then_report(self, plan_id: str) -> None:
        """Report drained once every connection point took what this exit point sent it:
        a Flush marker after the deliveries on each link, then ``Delivery.Flushed`` until
        the connection point took it. Queued on a link is not arrived: the new exit point
        of a moved publisher delivers on its own stream, which could reach a connection
        point first (its notifications before the old exit point's, out of order). A
        connection point that does not confirm within :data:`FLUSH_WAIT` (dead, or its
        link failed: sessions resume elsewhere from what is retained) is not waited for."""
        ctx = self._ctx()
        token = next(self._flush_tokens)
        marker = wire.Handoff(marker=wire.Marker(flush=wire.Flush(token=token)))
        data = marker.SerializeToString()
        started = time.monotonic()
        links = [link for link in list(self._links.values()) if await link.send(data)]
        confirmed = await asyncio.gather(*(self._confirmed(link, token) for link in links))
        _log.info(
            "scale %s: drained (%d of %d connection points confirmed in %.0f ms)",
            plan_id,
            sum(confirmed),
            len(links),
            (time.monotonic() - started) * 1000,
        )
        await asyncio.to_thread(scale_report, ctx.zk, "drained", ctx.name, {})

    async def _confirmed(self, link: Link, token: int) -> bool:
        """Whether the connection point of ``link`` took its Flush marker ``token``."""
        request = wire.FlushRequest(sender=self._ctx().name, token=token)
        async with grpc.aio.insecure_channel(link.address, options=CHANNEL_OPTIONS) as channel:
            stub = wire_grpc.DeliveryStub(channel)  # type: ignore[no-untyped-call]
            try:
                await stub.Flushed(request, timeout=FLUSH_WAIT, metadata=call_metadata())
            except grpc.aio.AioRpcError as exc:
                _log.warning(
                    "connection point %s did not confirm the flush (%s): not waited for",
                    link.peer,
                    exc.code().name,
                )
                return False
        return True

    # -- fences ---------------------------------------------------------------------------

    async def _add_fence(self, matcher: str, copy: wire.Fence) -> None:
        """One matcher's copy of a fence: wait for every batch it reported before it."""
        async with self._lock:
            key = (copy.connection_point, copy.token)
            fence = self._fences.setdefault(key, _Fence(key[0], copy))
            fence.arrived.add(matcher)
            for access_point, line in self._pending.items():
                reported = [seq for seq, p in line.items() if matcher in p.reported]
                if reported:
                    fence.waits.append((access_point, max(reported)))
            await self._pass_fences()

    async def _pass_fences(self) -> None:
        """Answer the fences whose batches are all delivered (the lock is held)."""
        for key, fence in list(self._fences.items()):
            if not fence.arrived >= set(fence.fence.matchers) - self._failed:
                continue
            if any(seq in self._pending.get(ap, {}) for ap, seq in fence.waits):
                continue
            del self._fences[key]
            answer = wire.Fence(
                connection_point=key[0],
                token=key[1],
                exit_points=fence.fence.exit_points,
                exit_point=self._ctx().member.sequence,
            )
            marker = wire.Marker(fence=answer)
            link = self._links.get(fence.connection_point)
            if link is not None:
                await link.send(wire.Handoff(marker=marker).SerializeToString())

    def _spawn(self, work: Coroutine[Any, Any, Any]) -> None:
        task = self._ctx().loop.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

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
        if len(pending.partials) > 1:  # replicas: one (update, subscription) pair each
            order = np.lexsort((all_handles, all_items))
            all_items, all_handles = all_items[order], all_handles[order]
            fresh = np.ones(len(all_items), dtype=bool)
            fresh[1:] = (all_items[1:] != all_items[:-1]) | (all_handles[1:] != all_handles[:-1])
            all_items, all_handles = all_items[fresh], all_handles[fresh]
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
                origin=pending.origin,
                origin_batch=pending.origin_batch,
                incarnation=pending.incarnation,
            )
            data = wire.Handoff(deliveries=deliveries).SerializeToString()
            self._retained.keep(int(target), deliveries, len(data), time.monotonic())
            link = self._links.get(int(target))
            reached = link is not None and await link.send(data)
            self._retained.sent(int(target), reached, time.monotonic())
            if not reached:  # kept: a client resuming its session elsewhere gets it
                ctx.metrics.items_out.labels(kind="undeliverable").inc(int(chosen.sum()))
                continue
            ctx.metrics.items_out.labels(kind="notification").inc(int(chosen.sum()))

    # -- sessions resumed elsewhere (broker/runtime/retained.py) ----------------------------

    async def Replay(
        self,
        request: wire.ReplayRequest,
        context: grpc.aio.ServicerContext[wire.ReplayRequest, wire.Deliveries],
    ) -> AsyncIterator[wire.Deliveries]:
        """What was kept for one session of a connection point, in order."""
        replayed = 0
        for deliveries in self._retained.replay(
            request.connection_point, request.session, request.unreached_only
        ):
            replayed += len(deliveries.entity_index)
            yield deliveries
        _log.info(
            "replayed %d notifications of session %d of connection point %d",
            replayed,
            request.session,
            request.connection_point,
        )
        self._ctx().metrics.items_out.labels(kind="replayed").inc(replayed)

    async def _sweep_retained(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            self._retained.sweep()
            self._ctx().metrics.retained.set(len(self._retained))

    def _sync_links(self) -> None:
        if self._connection_points is None:
            return
        ctx = self._ctx()
        hello = wire.Handoff(hello=wire.Hello(sender=ctx.name, role="exit-point"))
        follow_members(
            self._links,
            self._connection_points.members,
            method=DELIVER,
            hello=hello.SerializeToString(),
            metrics=ctx.metrics,
        )

    def _ctx(self) -> ProcessContext:
        assert self._context is not None, "the role has not started"
        return self._context
