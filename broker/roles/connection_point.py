"""The connection point: client sessions in, final notifications out.

Publishers stream batches of entities (``ConnectionPoint.Publish``): each batch is validated
whole (an invalid entity refuses the batch with INVALID_ARGUMENT in its ack, and the stream
stays up; so does a batch the internal links could not carry: too many entities or bytes, a
publisher name too long, sequences past 2**64 - 1), normalised, and forwarded to this
connection point's access point as one ``Updates`` message. An empty batch is accepted at
once (nothing to deliver). Subscribers hold a ``Session`` stream: their (un)subscriptions travel
to the access point, and are acknowledged once the owner matcher holds them; notifications
arrive from the exit points (``Delivery.Deliver``) addressed by subscription handle and are
put on the session's stream. A session ending (the client went away) unsubscribes all its
subscriptions, so nothing leaks. A session whose client reads too slowly is ended with
RESOURCE_EXHAUSTED once its queue is full, so it cannot hold the others back.

Load (broker.runtime.load): the items in are the updates published (over gRPC or HTTP), the
items out the updates sent on (the pipeline counts updates on every layer: the autoscaler's
model, broker/autoscale/model.py); busy is validating and packing a batch and splitting a
delivery by session (the notifications' cost is busy time, not items), and waiting for
``--max-rate`` tokens (for updates only), not the client I/O.

The access point is chosen among the serving ones (the configuration's, live) by this
process's registration number (so connection points spread evenly), and chosen again when
it dies. When an access-point scale changes the
choice, the connection point moves its traffic over with a *fence*: publishes and requests
wait while a fence marker travels through the old access point, every matcher and every exit
point; once it is back, everything sent through the old access point has been delivered,
and traffic goes on through the new one (per-publisher order is kept).

When a connection-point scale retires this one, it hands over: publishers are answered
``moved_to`` (after a fence, so their earlier batches are delivered first) and sessions get a
``Moved`` event; a client subscribes again at the new connection point (replace), sends
``Release``, and its old session ends once a fence shows every notification matched before
the take-over was sent on it (docs/protocol.md).

When a connection point dies instead (docs/failures.md), its publishers send again through
another one what was not acknowledged, with their incarnation: the copy of a batch already
delivered is dropped where it arrives (``Seen``, by publisher, incarnation and sequence:
exactly, since a publisher's batches can arrive out of order after a scale of the exit
points moved it). Its
clients resume their sessions at another one (``Subscribe.resume``): once their
subscriptions are placed, a fence, then what the exit points kept for the old handles is put
on the session, before the acknowledgement (broker/roles/session_resume.py).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
import uuid
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import grpc
import numpy as np
from google.protobuf.message import DecodeError, Message

from broker.coordination.aggregations import AggregationStore
from broker.coordination.alerts import AlertStore
from broker.coordination.configuration import Configuration
from broker.coordination.http_subscriptions import Registry
from broker.coordination.membership import Member
from broker.coordination.registrations import RegistrationStore
from broker.coordination.scale import report as scale_report
from broker.errors import (
    InvalidInput,
    InvalidUpdate,
    NotFound,
    SerializationError,
    SilboError,
    Unavailable,
    error_for,
    mapping_for,
)
from broker.model.identifiers import check_tenant
from broker.ngsi.allow import AllowList
from broker.ngsi.front import FrontOptions, NgsiFront
from broker.ngsi.request import dumps
from broker.ngsi.routes import add_routes
from broker.roles import session_resume
from broker.roles.store_client import StoreClient
from broker.roles.stored_publish import through_store
from broker.runtime.answers import answered
from broker.runtime.backup import Outbox, Seen
from broker.runtime.handles import MAX_CONNECTION_POINT, make_handle, sessions_of
from broker.runtime.link import MAX_MESSAGE, Link, LinkState
from broker.runtime.peers import ConfigurationView, Peers, ScaleView
from broker.runtime.process import ProcessContext
from broker.serialization import pack_subscription, packb
from broker.store.client import EntityStore, LocalEntities
from broker.store.layout import read_store_layout
from broker.store.parameters import parse_entity_get, parse_entity_query
from broker.store.query import one
from broker.store.reading import StoreReader
from broker.store.rendering import render, render_page
from broker.wire import client_pb2 as pb
from broker.wire import client_pb2_grpc as pb_grpc
from broker.wire import internal_pb2 as wire
from broker.wire import internal_pb2_grpc as wire_grpc
from broker.wire.convert import normalize_entity, subscription_from_spec
from broker.wire.streams import ROUTE

__all__ = [
    "MAX_BATCH_BYTES",
    "MAX_BATCH_ENTITIES",
    "MAX_PUBLISHER_LENGTH",
    "MAX_ROUTED_BYTES",
    "ConnectionPoint",
]

_log = logging.getLogger(__name__)

MAX_BATCH_ENTITIES = 10_000
MAX_BATCH_BYTES = 16 << 20  # a publish request; the form sent on is up to ~3.5 times larger
MAX_PUBLISHER_LENGTH = 256  # characters: the name travels beside every update of a batch
# What one client request may become on the internal links (they carry MAX_MESSAGE at most,
# and a message too large for them fails the link for every client): room to spare.
MAX_ROUTED_BYTES = MAX_MESSAGE // 2
SESSION_QUEUE = 4096  # notification batches waiting for one slow subscriber
ACCESS_POINT_WAIT = 5.0  # seconds to wait for an access point before refusing
REQUEST_TIMEOUT = 30.0
PLACE_AGAIN_CHUNK = 5_000  # subscriptions per request when placing again after a repair
PLACE_AGAIN_RETRY = 1.0  # seconds before a chunk that failed is tried again
PLACE_AGAIN_PATIENCE = 120.0  # seconds a chunk is tried for
FENCE_TIMEOUT = 30.0  # seconds a fence may take before moving on regardless (logged)
LEAVE_TIMEOUT = 30.0  # seconds the sessions get to move when this connection point leaves
_MAX_SEQUENCE = (1 << 64) - 1  # Updates.sequences are uint64
_M = TypeVar("_M", bound=Message)
_T = TypeVar("_T")


@dataclass(eq=False)
class _FenceWait:
    done: asyncio.Future[None]
    replies: set[int] = field(default_factory=set)  # exit points that answered


@dataclass(eq=False)
class _Session:
    number: int
    # SessionEvent (acknowledgements) or its wire twin SessionEventOut (notifications)
    events: asyncio.Queue[Message | None] = field(
        default_factory=lambda: asyncio.Queue(SESSION_QUEUE)
    )
    subscriptions: dict[str, int] = field(default_factory=dict)  # id -> handle
    placements: dict[str, wire.Placement] = field(default_factory=dict)  # id -> as placed
    next_number: int = 0
    failure: str = ""
    code: grpc.StatusCode = grpc.StatusCode.RESOURCE_EXHAUSTED
    movable: bool = True  # a client's (it can be handed over), not the HTTP front's own
    moved: bool = False  # sent a Moved event: a Release may follow (and only then)


class _Malformed:
    """Stands in for a message whose bytes did not parse (answered with INVALID_ARGUMENT)."""

    def __init__(self, error: SerializationError) -> None:
        self.error = error


def _lenient(message: type[_M]) -> Callable[[bytes], _M]:
    """A deserializer that returns a _Malformed (typed as the message) instead of raising."""

    def parse(data: bytes) -> _M:
        try:
            return message.FromString(data)
        except DecodeError as exc:
            error = SerializationError(f"the bytes received are not a {message.__name__}: {exc}")
            return cast(_M, _Malformed(error))

    return parse


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


def _error(exc: SilboError) -> pb.Error:
    return pb.Error(code=mapping_for(exc).grpc_status, message=str(exc))


def _routable(batch: wire.Batch, advice: str) -> bytes:
    """The bytes of a batch made from one client request, if the links can carry them."""
    data = batch.SerializeToString()
    if len(data) > MAX_ROUTED_BYTES:
        raise InvalidInput(
            f"the request is {len(data)} bytes once routed; at most {MAX_ROUTED_BYTES}: {advice}"
        )
    return data


class ConnectionPoint(pb_grpc.ConnectionPointServicer, wire_grpc.DeliveryServicer):
    """The connection point role (see the module doc)."""

    def __init__(self) -> None:
        self._context: ProcessContext | None = None
        self._access_points: Peers | None = None
        self._link: Link | None = None
        self._sessions: dict[int, _Session] = {}
        self._session_numbers = itertools.count(1)
        self._publishers = itertools.count(1)
        self._requests = itertools.count(1)
        self._pending: dict[int, asyncio.Future[wire.RequestAck]] = {}
        self._number = 0
        self._config: ConfigurationView | None = None
        self._scale: ScaleView | None = None
        self._connection_points: Peers | None = None
        self._exit_points: Peers | None = None  # asked to replay resumed sessions
        self._open = asyncio.Event()  # cleared while traffic moves to another access point
        self._open.set()
        self._moving = False
        self._held_ms = 0.0  # how long the last move held publishes back
        self._fences: dict[int, _FenceWait] = {}
        self._fence_tokens = itertools.count(1)
        self._reported: set[str] = set()  # scale plans this process reported moved for
        self._leaving: list[Member] = []  # where sessions go when this one leaves
        self._publishers_moved = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._finishing: set[asyncio.Task[Any]] = set()  # stored batches run to their end
        self._front: NgsiFront | None = None  # the NGSI v2 HTTP front, with --http-listen
        self.entities: EntityStore = LocalEntities()  # the context store's, once started
        self._reader = StoreReader(lambda: self.entities)
        self._placed_under: Configuration | None = None  # the configuration last followed
        self._stopping = False
        self._outbox = Outbox()  # update batches sent on, kept until delivered
        self._seen = Seen()  # update batches handed over here (copies are dropped)
        self._flushed: dict[str, int] = {}  # exit point: the last Flush token it took
        self._flush_came = asyncio.Condition()

    # -- the role's life ----------------------------------------------------------------

    def add_to(self, server: grpc.aio.Server) -> None:
        wire_grpc.add_DeliveryServicer_to_server(self, server)  # type: ignore[no-untyped-call]

    def add_client_to(self, server: grpc.aio.Server) -> None:
        # The client API by hand rather than through the generated helper: its deserializers
        # must not fail, so that bytes that are no message get an answer on the stream.
        handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
            "Publish": grpc.stream_stream_rpc_method_handler(
                self.Publish,
                request_deserializer=_lenient(pb.PublishRequest),
                response_serializer=pb.PublishAck.SerializeToString,
            ),
            "Session": grpc.stream_stream_rpc_method_handler(
                self.Session,
                request_deserializer=_lenient(pb.SessionRequest),
                response_serializer=_serialize,
            ),
            "Query": grpc.unary_unary_rpc_method_handler(
                self.Query,
                request_deserializer=_lenient(pb.QueryRequest),
                response_serializer=pb.QueryAnswer.SerializeToString,
            ),
        }
        server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler("broker.wire.ConnectionPoint", handlers),)
        )

    async def start(self, context: ProcessContext) -> None:
        self._context = context
        self._number = context.member.sequence
        if self._number > MAX_CONNECTION_POINT:
            raise InvalidInput(
                f"connection point number {self._number} is over {MAX_CONNECTION_POINT}: "
                "this cluster has registered too many; start a fresh cluster name"
            )
        self._access_points = Peers(context.zk, "access-point", context.loop)
        self._access_points.on_change(self._choose_access_point)
        self._config = ConfigurationView(context.zk, context.loop)
        self._config.on_change(self._choose_access_point)
        self._config.on_change(self._follow_repairs)
        self._connection_points = Peers(context.zk, "connection-point", context.loop)
        self._exit_points = Peers(context.zk, "exit-point", context.loop)
        self._scale = ScaleView(context.zk, context.loop)
        self._scale.on_change(self._follow_scale)
        self._choose_access_point()
        self._spawn(self._expire())
        self.entities = await _entities(context) or self.entities
        if context.options.http_listen:
            self._front = await _FrontPort(self).start(context)

    async def stop(self) -> None:
        self._stopping = True
        if self._front is not None:
            await self._front.stop()
        for session in list(self._sessions.values()):
            session.code = grpc.StatusCode.UNAVAILABLE
            self._end(session, "the connection point is stopping")
        watching = (self._access_points, self._config, self._connection_points, self._scale)
        for watched in (*watching, self._exit_points):
            if watched is not None:
                watched.stop()
        self._outbox.fail_all("the connection point is stopping; publish again elsewhere")
        if self._link is not None:
            await self._link.close()
        await self.entities.close()

    def status(self) -> tuple[int, int]:
        return 0, sum(len(s.subscriptions) for s in self._sessions.values())

    # -- reading ---------------------------------------------------------------------------

    async def Query(
        self, request: pb.QueryRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.QueryAnswer:
        """Entities read from the context store, as the HTTP front answers them."""
        try:
            if isinstance(request, _Malformed):
                raise request.error
            tenant = check_tenant(request.tenant.strip().lower())
            params = dict(request.params)
            path = request.service_path or None
            if request.entity_id:
                one_query = parse_entity_get(request.entity_id, params, tenant, path)
                found = one(await self._reader.query(one_query))
                return pb.QueryAnswer(json=dumps(render(found, one_query)), count=1)
            query = parse_entity_query(params, tenant, path)
            page = await self._reader.query(query)
            return pb.QueryAnswer(json=dumps(render_page(page, query)), count=page.count)
        except SilboError as exc:
            code = getattr(grpc.StatusCode, mapping_for(exc).grpc_status)
            await context.abort(code, str(exc))
            raise AssertionError("abort returns no more") from exc

    # -- publishing -----------------------------------------------------------------------

    async def Publish(
        self,
        request_iterator: AsyncIterator[pb.PublishRequest],
        context: grpc.aio.ServicerContext[pb.PublishRequest, pb.PublishAck],
    ) -> AsyncIterator[pb.PublishAck]:
        """Each batch is acknowledged once delivered (docs/failures.md): acknowledgements
        come as batches complete, while later batches are read and sent on."""
        async for ack in answered(functools.partial(self._publishes, request_iterator)):
            yield ack

    async def _publishes(
        self,
        request_iterator: AsyncIterator[pb.PublishRequest],
        acks: asyncio.Queue[pb.PublishAck | None],
    ) -> None:
        ctx = self._ctx()
        default_publisher = f"{ctx.name}/{next(self._publishers)}"
        received = ctx.metrics.items_in.labels(kind="update")
        waiting: set[asyncio.Future[int]] = set()

        def answer(batch: int, delivered: asyncio.Future[int]) -> None:
            waiting.discard(delivered)
            if delivered.cancelled():
                return
            failure = delivered.exception()
            if isinstance(failure, SilboError):
                acks.put_nowait(pb.PublishAck(batch=batch, error=_error(failure)))
            elif failure is None:
                acks.put_nowait(pb.PublishAck(batch=batch, accepted=delivered.result()))

        try:
            async for request in request_iterator:
                ctx.metrics.messages_in.labels(stream="Publish").inc()
                if isinstance(request, _Malformed):
                    acks.put_nowait(pb.PublishAck(error=_error(request.error)))
                    continue
                if self._leaving:
                    await self._publishers_moved.wait()
                    target = self._successor(zlib.crc32(default_publisher.encode()))
                    acks.put_nowait(pb.PublishAck(batch=request.batch, moved_to=target.endpoint))
                    continue
                try:
                    sending = self._send_updates(request, default_publisher)
                    delivered = await (self._to_the_end(sending) if request.store else sending)
                except SilboError as exc:
                    acks.put_nowait(pb.PublishAck(batch=request.batch, error=_error(exc)))
                    continue
                except Exception as exc:  # a bug must cost one batch, never the whole stream
                    _log.exception("publish batch %d failed", request.batch)
                    error = pb.Error(code="INTERNAL", message=f"the batch failed: {exc!r}")
                    acks.put_nowait(pb.PublishAck(batch=request.batch, error=error))
                    continue
                count = len(request.entities)
                received.inc(count)
                ctx.metrics.batch_size.labels(stream="Publish").observe(count)
                waiting.add(delivered)
                delivered.add_done_callback(functools.partial(answer, request.batch))
            if waiting:  # the publisher finished: answer what is on its way first
                await asyncio.wait(set(waiting))
        except grpc.aio.AioRpcError as exc:
            _log.info("a publisher's stream ended: %s", exc.code())
        finally:
            acks.put_nowait(None)

    async def _send_updates(
        self, request: pb.PublishRequest, publisher: str
    ) -> asyncio.Future[int]:
        """Send a publisher's batch on toward the matchers, kept in the outbox; the future
        gives its count once it is delivered (Unavailable if it never is). A batch with
        ``store`` set is upserted in the context store first (broker/roles/stored_publish.py)."""
        if not request.entities:  # nothing to deliver: delivered now
            return _done(0)
        load = self._ctx().load
        count = len(request.entities)
        if request.held_back:
            load.held(count)
        await load.admit(count)
        with load.working(count):
            objs = self._checked(request)
        publisher = request.publisher or publisher
        first = request.first_sequence
        entities: Sequence[pb.Entity] = request.entities
        sequences: Sequence[int] = range(first, first + count)
        refusal = None
        if request.store:
            stored = await through_store(self.entities, request.entities, first)
            entities, sequences, refusal = stored.entities, stored.sequences, stored.refusal()
            objs = [normalize_entity(entity) for entity in entities]
        if entities:
            number = self._outbox.number()
            with load.working(0):
                payload = self._packed(
                    entities, objs, (publisher, request.incarnation), sequences, number
                )
            link = await self._access_point()
            delivered = self._outbox.keep(number, payload, len(entities))
            self._ctx().metrics.retained.set(len(self._outbox))
            await link.send(payload)  # a link that just failed: the outbox sends it again
            load.output(len(entities))
        else:
            delivered = _done(0)
        if request.store:  # the whole batch counts, or the store's refusal answers it
            return asyncio.ensure_future(_answered(delivered, count, refusal))
        return delivered

    async def _send_again(self, link: Link) -> None:
        """The access point died: send every unfinished batch again on ``link``, in order,
        before any new one (publishes wait meanwhile)."""
        self._open.clear()
        try:
            await self._resend(link)
        finally:
            self._open.set()

    async def _resend(self, link: Link) -> None:
        """Send every unfinished batch again on ``link``, in the order first sent."""
        payloads = self._outbox.unfinished()
        for payload in payloads:
            await link.send(payload)
        if payloads:
            _log.warning("sent %d unfinished update batches again", len(payloads))
            self._ctx().metrics.items_out.labels(kind="sent_again").inc(len(payloads))

    async def _expire(self) -> None:
        """Refuse the batches that were not delivered in time (their publishers resend)."""
        while True:
            await asyncio.sleep(1.0)
            expired = self._outbox.expire()
            if expired:
                _log.error("%d update batches not delivered in time: refused", expired)
                self._ctx().metrics.items_out.labels(kind="refused_batch").inc(expired)
            self._ctx().metrics.retained.set(len(self._outbox))

    def _checked(self, request: pb.PublishRequest) -> list[Any]:
        """The batch's entities normalised for matching; InvalidUpdate for a batch the
        internal links could not carry or an invalid entity (the whole batch is refused)."""
        count = len(request.entities)
        if count > MAX_BATCH_ENTITIES:
            raise InvalidUpdate(
                f"a batch holds at most {MAX_BATCH_ENTITIES} entities, this one {count}"
            )
        size = request.ByteSize()
        if size > MAX_BATCH_BYTES:
            raise InvalidUpdate(
                f"a batch is at most {MAX_BATCH_BYTES} bytes, this one {size}; "
                "publish smaller batches"
            )
        if len(request.publisher) > MAX_PUBLISHER_LENGTH:
            raise InvalidUpdate(
                f"publisher is {len(request.publisher)} characters long; "
                f"at most {MAX_PUBLISHER_LENGTH}"
            )
        first = request.first_sequence
        if count and first + count - 1 > _MAX_SEQUENCE:
            raise InvalidUpdate(
                f"the sequences of a batch of {count} from first_sequence {first} pass "
                f"{_MAX_SEQUENCE}, the largest a uint64 holds"
            )
        objs = []
        for i, entity in enumerate(request.entities):
            try:
                objs.append(normalize_entity(entity))
            except InvalidInput as exc:
                raise InvalidUpdate(f"entity {i} ({entity.id!r}): {exc}") from exc
        return objs

    def _packed(
        self,
        entities: Sequence[pb.Entity],
        objs: list[Any],
        publisher: tuple[str, int],
        sequences: Sequence[int],
        number: int,
    ) -> bytes:
        """The routable batch of checked entities (``publisher``: its name and incarnation;
        ``number``: its outbox number)."""
        name, incarnation = publisher
        updates = wire.Updates(
            entities=[entity.SerializeToString() for entity in entities],
            publishers=[name] * len(entities),
            sequences=sequences,
            matchable=packb(objs),
            origin=self._number if number else 0,
            origin_batch=number,
            incarnation=incarnation,
        )
        return _routable(wire.Batch(updates=updates), "publish smaller batches")

    # -- sessions -------------------------------------------------------------------------

    async def Session(
        self,
        request_iterator: AsyncIterator[pb.SessionRequest],
        context: grpc.aio.ServicerContext[pb.SessionRequest, Message],
    ) -> AsyncIterator[Message]:
        session = _Session(next(self._session_numbers) & ((1 << 24) - 1))
        self._sessions[session.number] = session
        if self._leaving:
            self._send_moved(session)
        reader = asyncio.get_running_loop().create_task(self._read(session, request_iterator))
        try:
            while True:
                event = await session.events.get()
                if event is None:
                    break
                yield event
        finally:
            reader.cancel()
            self._sessions.pop(session.number, None)
            self._forget(session)
        if session.failure:
            await context.abort(session.code, session.failure)

    async def _read(
        self, session: _Session, request_iterator: AsyncIterator[pb.SessionRequest]
    ) -> None:
        try:
            async for request in request_iterator:
                if (
                    session.moved
                    and not isinstance(request, _Malformed)
                    and request.WhichOneof("op") == "release"
                ):
                    self._spawn(self._release(session))
                    continue
                ack = await self._serve(session, request)
                await session.events.put(pb.SessionEvent(ack=ack))
        except (asyncio.CancelledError, grpc.aio.AioRpcError):
            pass
        finally:
            self._end(session, "")

    async def _serve(self, session: _Session, request: pb.SessionRequest) -> pb.SessionAck:
        if isinstance(request, _Malformed):
            return pb.SessionAck(error=_error(request.error))
        try:
            op = request.WhichOneof("op")
            if op == "subscribe":
                return await self._subscribe(session, request.request, request.subscribe)
            if op == "unsubscribe":
                return await self._unsubscribe(session, request.request, request.unsubscribe)
            if op == "release":  # its subscriptions would be nobody's, never unsubscribed
                raise InvalidInput("release answers a Moved event; this session was not moved")
            raise InvalidInput("a session request needs subscribe or unsubscribe")
        except SilboError as exc:
            return pb.SessionAck(request=request.request, error=_error(exc))
        except Exception as exc:  # a bug must cost one request, never the whole session
            _log.exception("session request %d failed", request.request)
            error = pb.Error(code="INTERNAL", message=f"the request failed: {exc!r}")
            return pb.SessionAck(request=request.request, error=error)

    async def _subscribe(
        self,
        session: _Session,
        request: int,
        subscribe: pb.Subscribe,
        placed: Callable[[list[int]], None] | None = None,
        adopt: bool = False,
    ) -> pb.SessionAck:
        """Place ``subscribe``'s subscriptions for ``session`` (``placed``: told their handles
        before the matchers can match under them). ``Subscribe.resume`` names old handles whose
        kept deliveries are replayed (a gRPC client resuming its session); ``adopt`` replays
        what never reached the connection point of the handles the placements replaced (the
        HTTP front adopting a dead front's subscriptions: docs/failures.md)."""
        placements = []
        ids: list[str] = []
        handles: list[int] = []
        resume = list(subscribe.resume)
        if resume and len(resume) != len(subscribe.subscriptions):
            raise InvalidInput(
                f"resume names {len(resume)} handles for {len(subscribe.subscriptions)} "
                "subscriptions; give one per subscription (0: none) or none"
            )
        for i, spec in enumerate(subscribe.subscriptions):
            subscription_id = spec.id or uuid.uuid4().hex[:24]
            if subscription_id in ids:
                raise InvalidInput(f"subscription {i}: id {subscription_id!r} is given twice")
            handle = make_handle(self._number, session.number, session.next_number + i)
            try:
                subscription = subscription_from_spec(
                    spec, id=subscription_id, subscriber=f"{handle:016x}"
                )
            except InvalidInput as exc:
                raise InvalidInput(f"subscription {i}: {exc}") from exc
            placements.append(
                wire.Placement(
                    handle=handle, subscription=pack_subscription(subscription), id=subscription_id
                )
            )
            ids.append(subscription_id)
            handles.append(handle)
        if not placements:
            raise InvalidInput("subscribe needs at least one subscription")
        session.next_number += len(placements)
        if placed is not None:  # before the matchers can match under these handles
            placed(handles)
        ack = await self._request(
            lambda number: wire.Batch(
                subscriptions=wire.Subscriptions(
                    request=number, placements=placements, replace=subscribe.replace
                )
            )
        )
        if ack.HasField("error") and ack.error.code:
            self._unsubscribe_quietly(list(ack.ids))  # the owners that took theirs undo it
            return pb.SessionAck(request=request, error=ack.error)
        session.subscriptions.update(zip(ids, handles, strict=True))
        session.placements.update(zip(ids, placements, strict=True))
        if adopt:
            # the ack names each id once, with the handle its placement replaced (0: none)
            olds = zip(ack.replaced, ack.ids, strict=False)
            new_of = {old: session.subscriptions[i] for old, i in olds if old}
            if new_of:
                await self._resume(session, new_of, unreached_only=True)
        elif any(resume):
            new_of = {old: new for old, new in zip(resume, handles, strict=True) if old}
            await self._resume(session, new_of)
        return pb.SessionAck(request=request, ids=ids, handles=handles)

    async def _resume(
        self, session: _Session, new_of: dict[int, int], unreached_only: bool = False
    ) -> None:
        """Put on ``session`` what the exit points kept for the old handles of ``new_of``
        (old handle -> new), once a fence shows it is complete (broker/roles/session_resume.py;
        ``unreached_only``: what never reached the old connection point)."""
        await self._fence(await self._access_point())
        assert self._exit_points is not None
        replayed = 0
        sessions = session_resume.old_sessions(new_of)
        async for batch in session_resume.replayed(
            list(self._exit_points.members), sessions, new_of, unreached_only
        ):
            replayed += len(batch.handles) // 8
            await session.events.put(wire.SessionEventOut(notifications=batch))
        _log.info("resumed %d subscriptions: %d notifications replayed", len(new_of), replayed)
        self._ctx().metrics.items_out.labels(kind="replayed").inc(replayed)

    async def _unsubscribe(
        self, session: _Session, request: int, unsubscribe: pb.Unsubscribe
    ) -> pb.SessionAck:
        ids = list(unsubscribe.ids)
        unknown = [i for i in ids if i not in session.subscriptions]
        if unknown:
            raise NotFound(f"this session holds no subscription {unknown[0]!r}")
        if not ids:
            raise InvalidInput("unsubscribe needs at least one subscription id")
        ack = await self._request(
            lambda number: wire.Batch(unsubscriptions=wire.Unsubscriptions(request=number, ids=ids))
        )
        if ack.HasField("error") and ack.error.code:
            return pb.SessionAck(request=request, error=ack.error)
        handles = [session.subscriptions.pop(i) for i in ids]
        for subscription_id in ids:
            session.placements.pop(subscription_id, None)
        return pb.SessionAck(request=request, ids=ids, handles=handles)

    async def _request(self, build: object) -> wire.RequestAck:
        assert callable(build)
        link = await self._access_point()
        number = next(self._requests)
        data = _routable(build(number), "send fewer subscriptions at a time")
        future: asyncio.Future[wire.RequestAck] = asyncio.get_running_loop().create_future()
        self._pending[number] = future
        try:
            if not await link.send(data):
                raise Unavailable("the access point went away; try again")
            return await asyncio.wait_for(future, REQUEST_TIMEOUT)
        except TimeoutError:
            raise Unavailable(
                f"no acknowledgement from the cluster within {REQUEST_TIMEOUT:.0f} s"
            ) from None
        finally:
            self._pending.pop(number, None)

    def _end(self, session: _Session, failure: str) -> None:
        if session.failure or session.number not in self._sessions:
            return
        session.failure = failure
        while not session.events.empty():
            session.events.get_nowait()
        session.events.put_nowait(None)

    def _forget(self, session: _Session) -> None:
        """Unsubscribe everything a finished session held (nobody is listening any more)."""
        ids = list(session.subscriptions)
        session.subscriptions.clear()
        session.placements.clear()
        self._unsubscribe_quietly(ids)

    def _unsubscribe_quietly(self, ids: list[str]) -> None:
        """Unsubscribe without waiting for (or wanting) an acknowledgement."""
        if not ids or self._link is None:
            return
        batch = wire.Batch(unsubscriptions=wire.Unsubscriptions(request=0, ids=ids))
        asyncio.get_running_loop().create_task(self._link.send(batch.SerializeToString()))

    # -- repairs (docs/failures.md) ---------------------------------------------------------

    def _follow_repairs(self) -> None:
        """A repair removed matchers: place their subscriptions again, with the new selector.

        Each session keeps what it placed; those the dead matchers held are sent again
        (``replace``: placing one twice is harmless) to their new preference lists, so every
        subscription has all its replicas again once the acknowledgement comes (with
        replicas, the surviving holders served it meanwhile).
        """
        current = self._config.current if self._config else None
        if current is None:
            return
        before, self._placed_under = self._placed_under, current
        if before is None or current.epoch <= before.epoch:
            return
        dead = set(before.matchers) - set(current.matchers)
        if not dead.intersection(current.failed):
            return  # a scale: the snapshot protocol moves what changes owner
        orphans = [
            placement
            for session in self._sessions.values()
            for placement, holders in zip(
                session.placements.values(),
                before.selector.holders_of(list(session.placements)),
                strict=True,
            )
            if dead.intersection(holders)
        ]
        if orphans:
            _log.warning(
                "placing again %d subscriptions of the dead matchers %s", len(orphans), dead
            )
            self._spawn(self._place_again(orphans))

    async def _place_again(self, placements: list[wire.Placement]) -> None:
        """Place ``placements`` again, a chunk at a time; a chunk that fails (a holder died
        or a scale ran meanwhile) is tried again every PLACE_AGAIN_RETRY seconds for up to
        PLACE_AGAIN_PATIENCE, with what its sessions still hold: until it is in, some of its
        subscriptions have fewer holders than the replicas say (a second failure would lose
        their matches)."""
        for start in range(0, len(placements), PLACE_AGAIN_CHUNK):
            chunk = placements[start : start + PLACE_AGAIN_CHUNK]
            deadline = time.monotonic() + PLACE_AGAIN_PATIENCE
            while chunk:
                try:
                    ack = await self._request(
                        lambda number, chunk=chunk: wire.Batch(
                            subscriptions=wire.Subscriptions(
                                request=number, placements=chunk, replace=True
                            )
                        )
                    )
                except SilboError as exc:
                    ack = wire.RequestAck(error=pb.Error(code="UNAVAILABLE", message=str(exc)))
                if not (ack.HasField("error") and ack.error.code):
                    break
                if time.monotonic() > deadline:
                    _log.error("placing again %d subscriptions failed: %s", len(chunk), ack.error)
                    self._ctx().metrics.items_out.labels(kind="orphaned_subscription").inc(
                        len(chunk)
                    )
                    break
                _log.warning("placing again %d subscriptions: %s; again", len(chunk), ack.error)
                await asyncio.sleep(PLACE_AGAIN_RETRY)
                held = {
                    i: placement
                    for session in self._sessions.values()
                    for i, placement in session.placements.items()
                }
                # as the sessions hold them now: not what was unsubscribed or replaced since
                chunk = [held[p.id] for p in chunk if p.id in held]

    # -- deliveries from the exit points ------------------------------------------------

    async def Deliver(
        self,
        request_iterator: AsyncIterator[wire.Handoff],
        context: grpc.aio.ServicerContext[wire.Handoff, wire.Empty],
    ) -> wire.Empty:
        ctx = self._ctx()
        received = ctx.metrics.messages_in.labels(stream="Deliver")
        sender = ""
        async for handoff in request_iterator:
            received.inc()
            body = handoff.WhichOneof("body")
            if body == "deliveries":
                with ctx.load.working(0):
                    self._deliver(handoff.deliveries)
            elif body == "completed":
                self._completed(handoff.completed)
            elif body == "hello":
                sender = handoff.hello.sender
            elif body == "marker":
                kind = handoff.marker.WhichOneof("kind")
                if kind == "fence":
                    self._fence_passed(handoff.marker.fence)
                elif kind == "flush" and sender:
                    async with self._flush_came:
                        token = max(self._flushed.get(sender, 0), handoff.marker.flush.token)
                        self._flushed[sender] = token
                        self._flush_came.notify_all()
        return wire.Empty()

    async def Flushed(
        self,
        request: wire.FlushRequest,
        context: grpc.aio.ServicerContext[wire.FlushRequest, wire.Empty],
    ) -> wire.Empty:
        """Answer once ``request.sender``'s Deliver stream brought its Flush marker of
        ``request.token``: every delivery it sent before is in the sessions' queues (the
        call's deadline bounds the wait)."""
        async with self._flush_came:
            await self._flush_came.wait_for(
                lambda: self._flushed.get(request.sender, 0) >= request.token
            )
        return wire.Empty()

    def _completed(self, completed: wire.Completed) -> None:
        """Batches of this connection point were delivered: answer their publishers, and let
        the access point stop keeping them."""
        self._outbox.completed(completed.batches)
        self._ctx().metrics.retained.set(len(self._outbox))
        link = self._link
        if link is not None and link.state is LinkState.OPEN:
            relay = wire.Batch(completed=completed).SerializeToString()
            self._spawn(link.send(relay))

    def _deliver(self, deliveries: wire.Deliveries) -> None:
        publisher = deliveries.publishers[0] if deliveries.publishers else ""
        last = max(deliveries.sequences, default=0)
        if not self._seen.fresh(
            deliveries.origin, publisher, deliveries.origin_batch, deliveries.incarnation, last
        ):
            self._ctx().metrics.items_in.labels(kind="duplicate_batch").inc()
            return  # sent again after a failure, and handed over here before it
        handles = np.frombuffer(deliveries.handles, dtype="<u8")
        entity_index = np.asarray(deliveries.entity_index, dtype=np.int64)
        sessions = sessions_of(handles)
        delivered = self._ctx().metrics.items_out.labels(kind="notification")
        for number in np.unique(sessions).tolist():
            session = self._sessions.get(int(number))
            if session is None or session.failure:
                continue  # the subscriber is gone; its unsubscriptions are on their way
            chosen = sessions == number
            used, index = np.unique(entity_index[chosen], return_inverse=True)
            rows = used.tolist()
            batch = wire.NotificationBatchOut(
                entities=[deliveries.entities[i] for i in rows],
                publishers=[deliveries.publishers[i] for i in rows],
                sequences=[deliveries.sequences[i] for i in rows],
                entity_index=index.astype("<u4").tobytes(),
                handles=handles[chosen].tobytes(),
                incarnation=deliveries.incarnation,
            )
            try:
                session.events.put_nowait(wire.SessionEventOut(notifications=batch))
            except asyncio.QueueFull:
                self._end(session, "the subscriber reads too slowly; its session was ended")
                continue
            delivered.inc(int(chosen.sum()))

    # -- the access point -----------------------------------------------------------------

    def _choose_access_point(self) -> None:
        """Link to this process's access point among the serving ones: at once if there is
        no live link, with a fence (a planned move) if the configuration chose another."""
        serving = self._serving_access_points()
        if not serving or self._moving:
            return  # a move chooses again when it is over
        target = serving[self._number % len(serving)]  # spread by registration order
        link = self._link
        assert self._access_points is not None
        alive = (
            link is not None
            and link.state is LinkState.OPEN
            and link.peer in self._access_points.by_name
        )
        if alive and link is not None and link.peer != target.name:
            if not self._moving:
                self._moving = True
                self._spawn(self._move(target))
            return
        if not alive:
            self._link = self._link_to(target)
            if link is not None and link.state is LinkState.OPEN:
                link.abort()  # dead or hung: a publish blocked on it must not wait
            if link is not None and len(self._outbox):
                self._spawn(self._send_again(self._link))
        self._check_moved()

    def _serving_access_points(self) -> list[Member]:
        assert self._access_points is not None
        current = self._config.current if self._config else None
        by_name = self._access_points.by_name
        if current is None or not current.access_points:
            return list(self._access_points.members)
        return [by_name[n] for n in current.access_points if n in by_name]

    def _link_to(self, target: Member) -> Link:
        ctx = self._ctx()
        link = Link(
            target.name,
            target.address,
            ROUTE,
            ctx.hello(),
            metrics=ctx.metrics,
            streaming_response=True,
            on_response=self._acknowledged,
            on_failure=lambda _link, _exc: self._choose_access_point(),
        )
        link.start()
        return link

    async def _move(self, target: Member) -> None:
        """Move the traffic to ``target``: hold it, fence through the old access point (so
        everything sent there is delivered first), then go on through the new one."""
        started = time.monotonic()
        self._open.clear()
        try:
            old = self._link
            deadline = started + REQUEST_TIMEOUT
            while self._pending and time.monotonic() < deadline:
                await asyncio.sleep(0.005)  # acknowledgements still come through the old one
            if old is not None:
                await self._fence(old)
            self._link = self._link_to(target)
            if old is not None and old.state is not LinkState.OPEN:
                await self._resend(self._link)  # it died during the move: what it had, first
            if old is not None:
                self._spawn(old.close())
            _log.info("moved to access point %s", target.name)
        finally:
            self._held_ms = (time.monotonic() - started) * 1000
            self._moving = False
            self._open.set()
        self._choose_access_point()

    async def _access_point(self) -> Link:
        assert self._access_points is not None
        if not self._open.is_set():
            await asyncio.wait_for(self._open.wait(), REQUEST_TIMEOUT)

        def ready() -> bool:
            return self._link is not None and self._link.state is LinkState.OPEN

        if not ready():
            self._choose_access_point()
            if not await self._access_points.wait_until(ready, ACCESS_POINT_WAIT):
                raise Unavailable(f"no access point reachable within {ACCESS_POINT_WAIT:.0f} s")
        assert self._link is not None
        return self._link

    # -- fences (docs/protocol.md) ----------------------------------------------------------

    async def _fence(self, link: Link) -> None:
        """Return once everything sent on ``link`` before now has been delivered here."""
        token = next(self._fence_tokens)
        wait = _FenceWait(asyncio.get_running_loop().create_future())
        self._fences[token] = wait
        fence = wire.Fence(connection_point=self._number, token=token)
        marker = wire.Batch(marker=wire.Marker(fence=fence))
        try:
            if await link.send(marker.SerializeToString()):
                await asyncio.wait_for(wait.done, FENCE_TIMEOUT)
        except TimeoutError:
            _log.warning("fence %d not back within %.0f s; going on", token, FENCE_TIMEOUT)
        finally:
            self._fences.pop(token, None)

    def _fence_passed(self, fence: wire.Fence) -> None:
        wait = self._fences.get(fence.token)
        if wait is None or wait.done.done():
            return
        wait.replies.add(fence.exit_point)
        if wait.replies >= set(fence.exit_points):
            wait.done.set_result(None)

    # -- scales -----------------------------------------------------------------------------

    def _follow_scale(self) -> None:
        plan = self._scale.plan if self._scale else None
        if plan is None:
            return
        if plan.layer == "connection-points" and self._ctx().name not in plan.connection_points:
            if not self._leaving and plan.id not in self._reported:
                self._reported.add(plan.id)
                self._spawn(self._leave(plan.connection_points))
            return
        self._check_moved()

    def _check_moved(self) -> None:
        """In an access-point scale: report moved once on an access point of the new
        configuration (with how long publishes were held back for it)."""
        plan = self._scale.plan if self._scale else None
        current = self._config.current if self._config else None
        if plan is None or current is None or plan.id in self._reported:
            return
        if plan.layer == "connection-points" or current.epoch < plan.new.epoch:
            return
        link = self._link
        serving = {m.name for m in self._serving_access_points()}
        if self._moving or link is None or link.peer not in serving:
            return
        self._reported.add(plan.id)
        ctx = self._ctx()
        body = {"held_ms": round(self._held_ms, 3) if plan.layer == "access-points" else 0.0}
        self._held_ms = 0.0
        self._spawn(asyncio.to_thread(scale_report, ctx.zk, "moved", ctx.name, body))

    async def _leave(self, staying: tuple[str, ...]) -> None:
        """This connection point leaves: hand publishers and sessions over to ``staying``."""
        peers = self._connection_points
        assert peers is not None
        if not await peers.wait_until(lambda: any(n in peers.by_name for n in staying), 30.0):
            _log.error("none of the connection points %s is registered; not leaving", staying)
            return
        self._leaving = [peers.by_name[n] for n in staying if n in peers.by_name]
        started = time.monotonic()
        link = await self._access_point()
        await self._fence(link)  # every publish accepted so far is delivered
        self._publishers_moved.set()
        held_ms = (time.monotonic() - started) * 1000
        sessions = [s for s in self._sessions.values() if s.movable]
        for session in sessions:
            self._send_moved(session)

        def unmoved() -> list[_Session]:
            return [s for s in self._sessions.values() if s.movable]

        deadline = time.monotonic() + LEAVE_TIMEOUT
        while unmoved() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        if unmoved():
            _log.warning(
                "%d sessions did not move; they end when this process stops", len(unmoved())
            )
        _log.info("left: %d sessions handed over", len(sessions) - len(unmoved()))
        if self._front is not None:
            await self._hand_over_front(self._front, deadline)
        ctx = self._ctx()
        body = {"held_ms": round(held_ms, 3), "sessions": len(sessions)}
        await asyncio.to_thread(scale_report, ctx.zk, "moved", ctx.name, body)

    async def _hand_over_front(self, front: NgsiFront, deadline: float) -> None:
        """The HTTP front's subscriptions go to the staying fronts, as a client's session
        would: they place them under new handles; this one sends what was matched under
        the old handles (everything, once a fence passed) and then stops."""
        try:
            handed = await front.hand_over(max(deadline - time.monotonic(), 1.0))
            await self._fence(await self._access_point())
            while not self._front_port_idle() and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            drained = await front.drain(max(deadline - time.monotonic(), 1.0))
        except SilboError as exc:
            _log.error("the HTTP front's subscriptions were not all handed over: %s", exc)
            return
        _log.info(
            "left: %d HTTP subscriptions handed over, their notifications %s",
            handed,
            "sent" if drained else "not all sent in time",
        )

    def _front_port_idle(self) -> bool:
        """Every notification batch queued for the HTTP front has been taken."""
        return all(s.events.empty() for s in self._sessions.values() if not s.movable)

    def _successor(self, key: int) -> Member:
        return self._leaving[key % len(self._leaving)]

    def _send_moved(self, session: _Session) -> None:
        target = self._successor(session.number)
        moved = pb.Moved(address=target.endpoint, connection_point=target.name)
        session.moved = True
        try:
            session.events.put_nowait(wire.SessionEventOut(moved=moved))
        except asyncio.QueueFull:
            self._end(session, "the subscriber reads too slowly; its session was ended")

    async def _release(self, session: _Session) -> None:
        """The client took the session's subscriptions over elsewhere: end the session once
        every notification matched before that was put on it."""
        session.subscriptions.clear()  # theirs now: not to be unsubscribed at the end
        await self._fence(await self._access_point())
        if session.number in self._sessions and not session.failure:
            await session.events.put(None)  # after what is queued: the stream ends with OK

    async def _to_the_end(self, work: Coroutine[Any, Any, _T]) -> _T:
        """Await ``work`` as a task that runs to its end even if this caller is cancelled:
        a stored batch whose publisher goes away (its stream cancelled) after the store
        took it is still published, or its change would never reach the subscriptions."""
        task = self._ctx().loop.create_task(work)
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)
        task.add_done_callback(_retrieved)
        return await asyncio.shield(task)

    def _spawn(self, work: Coroutine[Any, Any, Any]) -> None:
        task = self._ctx().loop.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _acknowledged(self, data: bytes) -> None:
        ack = wire.RequestAck.FromString(data)
        if ack.refused_batches:  # the access point could not route them: publish again
            reason = f"{ack.error.message}; publish again"
            self._ctx().metrics.items_out.labels(kind="refused_batch").inc(
                self._outbox.refuse(ack.refused_batches, reason)
            )
            return
        future = self._pending.get(ack.request)
        if future is not None and not future.done():
            future.set_result(ack)

    def _ctx(self) -> ProcessContext:
        assert self._context is not None, "the role has not started"
        return self._context


# -- the NGSI v2 HTTP front's view of its connection point (broker.ngsi.BrokerPort) ---------


class _FrontPort:
    """What the HTTP front uses of its connection point: publishing like a gRPC publisher,
    and one session of its own holding the front's subscriptions, whose notification batches
    go to the front instead of a gRPC stream."""

    def __init__(self, connection_point: ConnectionPoint) -> None:
        self._cp = connection_point
        number = next(connection_point._session_numbers) & ((1 << 24) - 1)
        self._session = _Session(number, movable=False)
        self._requests = itertools.count(1)

    @property
    def name(self) -> str:
        return self._cp._ctx().name

    async def start(self, context: ProcessContext) -> NgsiFront:
        options = context.options
        front = NgsiFront(
            self,
            FrontOptions(
                options.http_listen,
                allow=AllowList.parse(options.notify_allow),
                advertise=context.member.address.rsplit(":", 1)[0],
                status_flush=options.status_flush,
                read_timeout=options.http_read_timeout,
                retry_window=options.retry_window,
                count=lambda outcome, n: context.metrics.notifications.labels(outcome).inc(n),
                cors_origin=options.cors_origin,
                cors_max_age=options.cors_max_age,
            ),
            lambda http, on_fronts: Registry(context.zk, context.loop, self.name, http, on_fronts),
            self._cp.entities,
            lambda: RegistrationStore(context.zk, context.loop),
            lambda: AggregationStore(context.zk, context.loop),
            lambda: AlertStore(context.zk, context.loop),
        )
        self._cp._sessions[self._session.number] = self._session
        self._cp._spawn(self._consume(front))
        await front.start(add_routes)
        return front

    async def _consume(self, front: NgsiFront) -> None:
        while True:
            event = await self._session.events.get()
            if event is None:
                if self._session.failure and not self._cp._stopping:
                    _log.error("the HTTP front's session ended: %s", self._session.failure)
                return
            if isinstance(event, wire.SessionEventOut) and event.HasField("notifications"):
                front.notify(event.notifications)

    async def publish(
        self, entities: Sequence[pb.Entity], publisher: str, first: int
    ) -> Awaitable[int]:
        request = pb.PublishRequest(publisher=publisher, first_sequence=first, entities=entities)
        delivered = await self._cp._send_updates(request, publisher)
        self._cp._ctx().metrics.items_in.labels(kind="update").inc(len(entities))
        return delivered

    async def subscribe(
        self,
        specs: Sequence[pb.SubscriptionSpec],
        *,
        replace: bool,
        placed: Callable[[list[int]], None] | None = None,
        adopt: bool = False,
    ) -> list[int]:
        subscribe = pb.Subscribe(subscriptions=specs, replace=replace)
        number = next(self._requests)
        ack = await self._cp._subscribe(self._session, number, subscribe, placed, adopt)
        _raise_for(ack)
        return list(ack.handles)

    async def unsubscribe(self, ids: Sequence[str]) -> None:
        unsubscribe = pb.Unsubscribe(ids=ids)
        _raise_for(await self._cp._unsubscribe(self._session, next(self._requests), unsubscribe))


def _retrieved(task: asyncio.Task[Any]) -> None:
    """Take a finished task's outcome, which nobody may await any more (its caller went)."""
    if not task.cancelled() and task.exception() is not None:
        _log.info("a stored batch whose publisher went away failed: %s", task.exception())


def _done(count: int) -> asyncio.Future[int]:
    done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    done.set_result(count)
    return done


async def _answered(delivered: Awaitable[int], count: int, refusal: SilboError | None) -> int:
    """A stored batch's answer once what it published is delivered: all ``count`` accepted,
    or the store's refusal of some (the rest were stored and published)."""
    await delivered
    if refusal is not None:
        raise refusal
    return count


def _raise_for(ack: pb.SessionAck) -> None:
    if ack.HasField("error") and ack.error.code:
        raise error_for(ack.error.code, ack.error.message, Unavailable)


async def _entities(context: ProcessContext) -> EntityStore | None:
    """The context store layer, if the cluster has one (None: the front keeps its own)."""
    if await asyncio.to_thread(read_store_layout, context.zk) is None:
        _log.warning(
            "this cluster has no context store layer: the NGSI front keeps the entities it "
            "is sent in its own memory (start one: silbo run context-store)"
        )
        return None
    return await asyncio.to_thread(StoreClient, context.zk, context.loop)
