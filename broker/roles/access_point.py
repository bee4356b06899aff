"""The access point: stateless routing from connection points to matchers.

Each connection point holds one ``AccessPoint.Route`` stream to it. On that stream:

- ``Updates`` are numbered (this access point's sequence, one counter for all its inbound
  streams), tagged with the configuration epoch and, per update, the exit point that will
  gather its partial results (a hash of the publisher over the live exit points, so one
  publisher's updates meet at one exit point and stay in order); then the message is
  serialized once and sent to every matcher of the configuration.
- ``Subscriptions`` and ``Unsubscriptions`` are split by owner (the configuration's
  selector) and sent to those matchers only. When every owner has acknowledged, one
  ``RequestAck`` goes back on the connection point's stream.

Numbering and sending happen under one lock, so every matcher's channel carries this access
point's messages in sequence order: the exit points' watermarks depend on it.

Load (broker.runtime.load): the items in and out are the updates routed (once each, however
many matchers get them); a batch is busy while it waits for ``--max-rate`` tokens and while
it is numbered and serialized, not while a full link to a matcher holds it back.

Upstream backup (docs/failures.md): a batch that names its origin connection point is kept
here until that connection point passes on the exit point's word that it was delivered
(``Completed`` on the same stream). When a repair removes the exit point a kept batch was
routed to, the switch to the repaired configuration routes the kept batches of the dead exit
point again, in their order and before anything new, so a publisher's order holds; the
connection points drop what the dead exit point had delivered already. A batch kept longer
than ``RETAIN_LIMIT`` is forgotten (its connection point refused it to its publisher by then).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
import zlib
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass, field
from typing import Any

import grpc

from broker.coordination.configuration import Configuration
from broker.coordination.membership import Member
from broker.runtime.answers import answered
from broker.runtime.link import Link, LinkState
from broker.runtime.peers import ConfigurationView, Peers, ScaleView
from broker.runtime.process import ProcessContext
from broker.wire import client_pb2 as pb
from broker.wire import internal_pb2 as wire
from broker.wire import internal_pb2_grpc as wire_grpc
from broker.wire.streams import MATCH

__all__ = ["AccessPoint"]

_log = logging.getLogger(__name__)

READY_WAIT = 30.0  # seconds to wait for a configuration, its matchers and an exit point
_READY_POLL = 0.02  # seconds between looks while not ready
_STILL_UNREADY = 1.0  # a wait this soon after one ran out goes on from when that one began
UPDATE_WAIT = 5.0  # ... before an update batch is refused (its publisher publishes again)
RETAIN_LIMIT = 120.0  # seconds a batch is kept for sending again, at most
SWEEP_EVERY = 5.0  # seconds between looks for batches kept too long


@dataclass(eq=False)
class _Kept:
    """A routed batch kept until its connection point says it was delivered."""

    batch: wire.Batch
    completer: int  # the exit point (member sequence) it was routed to
    routed: float  # time.monotonic() of its first routing


@dataclass(eq=False)
class _Request:
    replies: asyncio.Queue[wire.RequestAck | None]
    request: int  # the connection point's number
    waiting: set[str]  # matchers yet to acknowledge
    ids: list[str] = field(default_factory=list)
    error: pb.Error | None = None
    replaced: dict[str, int] = field(default_factory=dict)  # id -> the handle it had


class AccessPoint(wire_grpc.AccessPointServicer):
    """The access point role (see the module doc)."""

    def __init__(self) -> None:
        self._context: ProcessContext | None = None
        self._config: ConfigurationView | None = None
        self._matchers: Peers | None = None
        self._exits: Peers | None = None
        self._links: dict[str, Link] = {}  # matcher name -> link
        self._lock = asyncio.Lock()
        self._next_seq = 1
        self._numbers = itertools.count(1)
        self._requests: dict[int, _Request] = {}
        self._exit_of: dict[str, int] = {}  # publisher -> exit point sequence (cache)
        self._gatherers: list[int] = []  # the serving exit points' sequences (cache)
        self._scale: ScaleView | None = None
        self._scale_started = ""  # the plan whose start markers were sent
        self._routed_epoch = 0  # the epoch of the last updates routed
        self._unready_since: float | None = None  # when a wait for readiness began, if one
        self._refused_at = 0.0  # when the last wait for readiness ran out
        self._held: list[tuple[wire.Batch, asyncio.Queue[wire.RequestAck | None]]] = []
        self._tasks: set[asyncio.Task[None]] = set()
        # per inbound stream (a connection point), its batches kept by origin_batch, in order
        self._kept: list[dict[int, _Kept]] = []

    def add_to(self, server: grpc.aio.Server) -> None:
        wire_grpc.add_AccessPointServicer_to_server(self, server)  # type: ignore[no-untyped-call]

    async def start(self, context: ProcessContext) -> None:
        self._context = context
        self._config = ConfigurationView(context.zk, context.loop)
        self._matchers = Peers(context.zk, "matcher", context.loop)
        self._exits = Peers(context.zk, "exit-point", context.loop)
        self._config.on_change(self._sync_links)
        self._matchers.on_change(self._sync_links)
        self._exits.on_change(self._forget_exit_points)
        self._scale = ScaleView(context.zk, context.loop)
        self._scale.on_change(self._sync_links)
        self._scale.on_change(lambda: self._spawn(self._follow_scale()))
        self._config.on_change(lambda: self._spawn(self._follow_configuration()))
        self._sync_links()
        self._spawn(self._sweep())

    async def stop(self) -> None:
        for watched in (self._config, self._matchers, self._exits, self._scale):
            if watched is not None:
                watched.stop()
        await asyncio.gather(*(link.close() for link in self._links.values()))

    def status(self) -> tuple[int, int]:
        current = self._config.current if self._config else None
        return (current.epoch if current else 0), 0

    # -- the inbound stream of one connection point -------------------------------------

    async def Route(
        self,
        request_iterator: AsyncIterator[wire.Batch],
        context: grpc.aio.ServicerContext[wire.Batch, wire.RequestAck],
    ) -> AsyncIterator[wire.RequestAck]:
        async for reply in answered(functools.partial(self._read, request_iterator)):
            yield reply

    async def _read(
        self,
        request_iterator: AsyncIterator[wire.Batch],
        replies: asyncio.Queue[wire.RequestAck | None],
    ) -> None:
        ctx = self._ctx()
        received = ctx.metrics.messages_in.labels(stream="Route")
        kept: dict[int, _Kept] = {}
        self._kept.append(kept)
        try:
            async for batch in request_iterator:
                received.inc()
                body = batch.WhichOneof("body")
                try:
                    if body == "updates":
                        await self._route_updates(batch, kept)
                    elif body == "completed":
                        for number in batch.completed.batches:
                            kept.pop(number, None)
                        ctx.metrics.retained.set(sum(map(len, self._kept)))
                    elif body == "subscriptions":
                        await self._route_subscriptions(batch.subscriptions, replies)
                    elif body == "unsubscriptions":
                        await self._route_unsubscriptions(batch.unsubscriptions, replies)
                    elif body == "marker" and batch.marker.WhichOneof("kind") == "fence":
                        await self._route_fence(batch.marker.fence)
                except _NotReady as exc:
                    self._refuse(batch, str(exc), replies)
        except asyncio.CancelledError:
            pass
        except grpc.aio.AioRpcError as exc:
            _log.info("a connection point's stream ended: %s", exc.code())
        finally:
            self._kept.remove(kept)  # a connection point that moved on sends again itself
            ctx.metrics.retained.set(sum(map(len, self._kept)))
            replies.put_nowait(None)

    async def _route_updates(self, batch: wire.Batch, kept: dict[int, _Kept]) -> None:
        ctx = self._ctx()
        updates = batch.updates
        count = len(updates.entities)
        if not count:
            return  # it would take no sequence number: exit points key batches by theirs
        await ctx.load.admit(count)
        async with self._lock:
            configuration = await self._routing(UPDATE_WAIT)
            with ctx.load.working(count):  # not while a full link to a matcher blocks it
                await self._send_updates(configuration, batch)
            if updates.origin_batch:
                kept[updates.origin_batch] = _Kept(batch, updates.exit_points[0], time.monotonic())
        ctx.load.output(count)
        ctx.metrics.items_in.labels(kind="update").inc(count)
        ctx.metrics.batch_size.labels(stream="Route").observe(count)
        ctx.metrics.retained.set(sum(map(len, self._kept)))

    async def _send_updates(self, configuration: Configuration, batch: wire.Batch) -> None:
        """Number ``batch`` and send it to every matcher of ``configuration`` (the lock is
        held)."""
        updates = batch.updates
        updates.first_seq = self._next_seq
        updates.epoch = configuration.epoch
        updates.exit_points[:] = [self._exit_point(p) for p in updates.publishers]
        updates.gatherers[:] = self._gatherers
        self._next_seq += len(updates.entities)
        payload = batch.SerializeToString()
        for name in configuration.matchers:
            await self._send(name, payload)

    async def _route_again(self, configuration: Configuration) -> None:
        """After a repair: route the kept batches of exit points that are gone again, in
        their order, before anything new (the lock is held)."""
        serving = {m.sequence for m in self._serving_exit_points(configuration)}
        again = 0
        for kept in self._kept:
            for entry in list(kept.values()):
                if entry.completer not in serving:
                    await self._send_updates(configuration, entry.batch)
                    entry.completer = entry.batch.updates.exit_points[0]
                    again += 1
        if again:
            _log.warning("routed %d batches of dead exit points again", again)
            self._ctx().metrics.items_out.labels(kind="routed_again").inc(again)

    async def _sweep(self) -> None:
        """Forget kept batches older than RETAIN_LIMIT (bounded memory)."""
        while True:
            await asyncio.sleep(SWEEP_EVERY)
            oldest = time.monotonic() - RETAIN_LIMIT
            for kept in self._kept:
                for number in [n for n, entry in kept.items() if entry.routed < oldest]:
                    del kept[number]
            self._ctx().metrics.retained.set(sum(map(len, self._kept)))

    async def _route_fence(self, fence: wire.Fence) -> None:
        """A connection point's fence: on to every matcher, in order with the updates.

        Each matcher passes it to the exit points after the partial results of everything
        it matched before; the exit points answer the connection point once those are
        delivered (docs/protocol.md, "Fences"). It gets the matchers and exit points to wait
        for.
        """
        async with self._lock:
            configuration = await self._routing()
            fence.matchers[:] = configuration.matchers
            fence.exit_points[:] = self._gatherers
            marker = wire.Marker(epoch=configuration.epoch, fence=fence)
            payload = wire.Batch(marker=marker).SerializeToString()
            for name in configuration.matchers:
                await self._send(name, payload)

    async def _routing(self, wait: float = READY_WAIT) -> Configuration:
        """The configuration to route under now, switched to if new (the lock is held);
        _NotReady after ``wait`` seconds without one."""
        configuration = await self._ready(wait)
        if configuration.epoch != self._routed_epoch:
            await self._switch(configuration)
        if not self._gatherers:
            self._gatherers = [m.sequence for m in self._serving_exit_points(configuration)]
        return configuration

    async def _route_subscriptions(
        self, subscriptions: wire.Subscriptions, replies: asyncio.Queue[wire.RequestAck | None]
    ) -> None:
        async with self._lock:
            if self._scaling():
                self._held.append((wire.Batch(subscriptions=subscriptions), replies))
                return
            await self._place(await self._ready(), subscriptions, replies)

    async def _route_unsubscriptions(
        self, unsubscriptions: wire.Unsubscriptions, replies: asyncio.Queue[wire.RequestAck | None]
    ) -> None:
        async with self._lock:
            if self._scaling():
                self._held.append((wire.Batch(unsubscriptions=unsubscriptions), replies))
                return
            await self._remove(await self._ready(), unsubscriptions, replies)

    async def _place(
        self,
        configuration: Configuration,
        subscriptions: wire.Subscriptions,
        replies: asyncio.Queue[wire.RequestAck | None],
    ) -> None:
        """Send each subscription to every matcher of its preference list (the lock is
        held); it is placed once they all have it."""
        holders = configuration.selector.holders_of([p.id for p in subscriptions.placements])
        parts: dict[str, list[wire.Placement]] = {}
        for placement, owners in zip(subscriptions.placements, holders, strict=True):
            for owner in owners:
                parts.setdefault(owner, []).append(placement)
        number = self._open(subscriptions.request, replies, set(parts))
        for owner, placements in parts.items():
            message = wire.Batch(
                subscriptions=wire.Subscriptions(
                    request=number, placements=placements, replace=subscriptions.replace
                )
            )
            await self._send(owner, message.SerializeToString())

    async def _remove(
        self,
        configuration: Configuration,
        unsubscriptions: wire.Unsubscriptions,
        replies: asyncio.Queue[wire.RequestAck | None],
    ) -> None:
        """Send each unsubscription to every holder of its id (the lock is held)."""
        holders = configuration.selector.holders_of(list(unsubscriptions.ids))
        parts: dict[str, list[str]] = {}
        for subscription_id, owners in zip(unsubscriptions.ids, holders, strict=True):
            for owner in owners:
                parts.setdefault(owner, []).append(subscription_id)
        number = self._open(unsubscriptions.request, replies, set(parts))
        for owner, ids in parts.items():
            message = wire.Batch(unsubscriptions=wire.Unsubscriptions(request=number, ids=ids))
            await self._send(owner, message.SerializeToString())

    def _refuse(
        self, batch: wire.Batch, reason: str, replies: asyncio.Queue[wire.RequestAck | None]
    ) -> None:
        body = batch.WhichOneof("body")
        self._ctx().metrics.items_out.labels(kind=f"refused_{body}").inc()
        _log.error("refusing %s from a connection point: %s", body, reason)
        request = (
            getattr(batch, body).request if body in ("subscriptions", "unsubscriptions") else 0
        )
        error = pb.Error(code="UNAVAILABLE", message=f"the cluster is not ready: {reason}")
        if request:
            replies.put_nowait(wire.RequestAck(request=request, error=error))
        elif body == "updates" and batch.updates.origin_batch:
            refused = [batch.updates.origin_batch]
            replies.put_nowait(wire.RequestAck(error=error, refused_batches=refused))

    # -- the scale protocol (docs/protocol.md) ---------------------------------------------

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = self._ctx().loop.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            _log.error("scale step failed", exc_info=task.exception())

    def _scaling(self) -> bool:
        """A scale runs and this access point has not switched to its new epoch yet."""
        plan = self._scale.plan if self._scale else None
        return plan is not None and self._routed_epoch < plan.new.epoch

    async def _follow_scale(self) -> None:
        """A plan appeared: send the start marker, in order with the data, to each old matcher.

        From then on new (un)subscriptions are held until this access point switches; updates
        keep flowing to the old matchers, tagged with the old epoch (matching never pauses).
        A plan that disappears before the switch was rolled back: release what was held.
        """
        async with self._lock:
            plan = self._scale.plan if self._scale else None
            if plan is None:
                await self._release_held()
                return
            if plan.layer == "connection-points":
                return  # the configuration stays: nothing to cut
            if plan.id == self._scale_started or self._routed_epoch >= plan.new.epoch:
                return
            self._scale_started = plan.id
            marker = wire.Batch(
                marker=wire.Marker(
                    epoch=plan.new.epoch, start_scale=wire.StartScale(plan=plan.encode())
                )
            ).SerializeToString()
            for name in plan.old.matchers:
                await self._send(name, marker)
            _log.info(
                "scale %s: start markers sent to %d matchers", plan.id, len(plan.old.matchers)
            )

    async def _follow_configuration(self) -> None:
        """The configuration moved to a new epoch: switch now, even if no update flows."""
        async with self._lock:
            current = self._config.current if self._config else None
            if current is None:
                return
            if not self._routed_epoch:
                self._routed_epoch = current.epoch  # the first configuration seen
            elif current.epoch != self._routed_epoch:
                await self._ready()
                await self._switch(current)

    async def _switch(self, configuration: Configuration) -> None:
        """Route under ``configuration`` from now on (the lock is held).

        The matchers of the previous epoch get a switch marker first: after it, nothing of
        the old epoch comes from this access point. Then what was held is routed anew.
        """
        assert self._config is not None
        previous = self._config.history.get(self._routed_epoch)
        if previous is not None and self._routed_epoch:
            marker = wire.Batch(
                marker=wire.Marker(epoch=configuration.epoch, switch=wire.Switch())
            ).SerializeToString()
            for name in previous.matchers:
                await self._send(name, marker)
        self._routed_epoch = configuration.epoch
        self._forget_exit_points()
        _log.info("routing under epoch %d", configuration.epoch)
        if previous is not None and set(configuration.failed) - set(previous.failed):
            self._gatherers = [m.sequence for m in self._serving_exit_points(configuration)]
            await self._route_again(configuration)
        await self._release_held()

    async def _release_held(self) -> None:
        held, self._held = self._held, []
        for batch, replies in held:
            body = batch.WhichOneof("body")
            configuration = await self._ready()
            if body == "subscriptions":
                await self._place(configuration, batch.subscriptions, replies)
            else:
                await self._remove(configuration, batch.unsubscriptions, replies)

    # -- acknowledgements -----------------------------------------------------------------

    def _open(
        self, request: int, replies: asyncio.Queue[wire.RequestAck | None], owners: set[str]
    ) -> int:
        number = next(self._numbers)
        if request:  # request 0 asks for no answer (a session's clean-up)
            self._requests[number] = _Request(replies, request, owners)
        return number

    def _acknowledged(self, matcher: str, data: bytes) -> None:
        ack = wire.RequestAck.FromString(data)
        pending = self._requests.get(ack.request)
        if pending is None:
            return
        pending.waiting.discard(matcher)
        pending.ids.extend(ack.ids)
        for subscription_id, old in zip(ack.ids, ack.replaced, strict=False):
            if old:
                pending.replaced[subscription_id] = old
        if ack.HasField("error") and ack.error.code and pending.error is None:
            pending.error = ack.error
        if pending.waiting:
            return
        del self._requests[ack.request]
        # each holder of a subscription answers for it: one id each
        ids = list(dict.fromkeys(pending.ids))
        replaced = [pending.replaced.get(i, 0) for i in ids]
        reply = wire.RequestAck(request=pending.request, ids=ids, replaced=replaced)
        if pending.error is not None:
            reply.error.CopyFrom(pending.error)
        pending.replies.put_nowait(reply)

    def _matcher_failed(self, link: Link, exc: BaseException) -> None:
        error = pb.Error(code="UNAVAILABLE", message=f"matcher {link.peer} went away: {exc}")
        for number, pending in list(self._requests.items()):
            if link.peer in pending.waiting:
                pending.error = pending.error or error
                pending.waiting.discard(link.peer)
                if not pending.waiting:
                    del self._requests[number]
                    reply = wire.RequestAck(request=pending.request, error=pending.error)
                    pending.replies.put_nowait(reply)
        self._links.pop(link.peer, None)

    # -- matchers and exit points ---------------------------------------------------------

    async def _ready(self, wait: float = READY_WAIT) -> Configuration:
        """The current configuration, once its matchers are linked and an exit point lives
        (_NotReady after ``wait`` seconds)."""
        assert self._config is not None and self._exits is not None

        def ready() -> bool:
            current = self._config.current if self._config else None
            return (
                current is not None
                and all(self._linked(name) for name in current.matchers)
                and bool(self._serving_exit_points(current))
            )

        if not ready():
            self._sync_links()
            current = self._config.current
            # readiness changes with the configuration, the matchers' links and the exit
            # points' registrations (an exit point restarted after a repair left none): each
            # is looked at, not only the configuration's changes (that waited out READY_WAIT).
            # A wait that follows a refusal at once (a batch queued behind the lock) goes on
            # from when the first began: each waiting it out in turn, a publisher behind six
            # of them heard nothing for 30 s
            now = time.monotonic()
            if self._unready_since is None or now - self._refused_at > _STILL_UNREADY:
                self._unready_since = now
                if not ready() and current is not None:
                    _log.info(
                        "waiting for matchers %s (known: %s)",
                        [n for n in current.matchers if not self._linked(n)],
                        sorted(self._matchers.by_name) if self._matchers else [],
                    )
            deadline = self._unready_since + wait
            while not ready():
                if time.monotonic() >= deadline:
                    self._refused_at = time.monotonic()
                    raise _NotReady("no configuration, matcher or exit point ready")
                await asyncio.sleep(_READY_POLL)
        self._unready_since = None
        current = self._config.current
        assert current is not None
        return current

    def _linked(self, name: str) -> bool:
        link = self._links.get(name)
        return link is not None and link.state is LinkState.OPEN

    def _sync_links(self) -> None:
        if self._config is None or self._matchers is None:
            return
        ctx = self._ctx()
        current = self._config.current
        wanted = set(current.matchers) if current else set()
        plan = self._scale.plan if self._scale else None
        if plan is not None:
            wanted |= set(plan.old.matchers) | set(plan.new.matchers)
        for name in wanted:
            member = self._matchers.by_name.get(name)
            if member is None:
                # declared dead: a link opened while it was still a member waits for ready
                # on an address nothing answers; routing into it would never be acknowledged
                self._give_up(name)
                continue
            if self._linked(name):
                continue
            link = Link(
                name,
                member.address,
                MATCH,
                ctx.hello(),
                metrics=ctx.metrics,
                streaming_response=True,
                on_response=functools.partial(self._acknowledged, name),
                on_failure=self._matcher_failed,
            )
            self._links[name] = link
            link.start()
        failed = set(current.failed) if current else set()
        for name in set(self._links) - wanted:
            link = self._links.pop(name)
            if name in failed:
                link.abort()  # a hung matcher must not hold the routing lock
            else:
                ctx.loop.create_task(link.close())

    def _give_up(self, matcher: str) -> None:
        """Abort the link to a matcher no longer a member (its pending requests fail)."""
        link = self._links.get(matcher)
        if link is not None and link.state is LinkState.OPEN:
            _log.warning("matcher %s is gone: its link is given up", matcher)
            link.abort()  # _matcher_failed forgets it

    async def _send(self, matcher: str, payload: bytes) -> None:
        link = self._links.get(matcher)
        if link is None or not await link.send(payload):
            _log.error("matcher %s is not reachable; a message to it is dropped", matcher)

    def _exit_point(self, publisher: str) -> int:
        """The exit point of a publisher's updates: a hash over the serving ones."""
        found = self._exit_of.get(publisher)
        if found is None:
            serving = self._gatherers
            found = serving[zlib.crc32(publisher.encode()) % len(serving)]
            self._exit_of[publisher] = found
        return found

    def _forget_exit_points(self) -> None:
        self._exit_of.clear()
        self._gatherers = []

    def _serving_exit_points(self, configuration: Configuration) -> list[Member]:
        """The live exit points of ``configuration``, in its order (every live one if it
        names none)."""
        assert self._exits is not None
        if not configuration.exit_points:
            return list(self._exits.members)
        by_name = self._exits.by_name
        return [by_name[n] for n in configuration.exit_points if n in by_name]

    def _ctx(self) -> ProcessContext:
        assert self._context is not None, "the role has not started"
        return self._context


class _NotReady(Exception):
    """The cluster has no configuration, or its matchers or exit points are not reachable."""
