"""The Python client of a Silbo cluster: publish updates, subscribe, receive notifications.

    from broker.client import Client
    with Client("127.0.0.1:7777") as client:           # or Client.from_state_dir(".silbo")
        sub = client.subscribe(type="Room", q="temperature>25")
        client.publish(ContextUpdate.of("Room1", {"temperature": 30}, entity_type="Room"))
        for notification in sub:                      # blocks; sub.get(timeout=...) too
            print(notification.subscription_id, notification.update)

Two streams per client, opened on first use: a publish stream (batches of entities, each
acknowledged, at most ``window`` batches in flight) and a session stream (subscriptions and
their notifications). Every call that the cluster refuses raises the matching SilboError
(InvalidInput for INVALID_ARGUMENT, NotFound, AlreadyExists, Unavailable).

Reconnection: the client knows one or more connection points. When the one it uses goes
away, it moves to the next: unacknowledged publish batches are sent again, with the same
sequences and this client's incarnation, so a batch the old connection point had already
forwarded is still delivered once (connection points drop the copy), and live
subscriptions are made again under the same ids (notifications for updates published while
no session existed are not delivered).

Planned moves (a connection point leaving in a scale) have neither gap: the connection
point answers publishes with ``moved_to`` once every batch it accepted is delivered, and the
client sends the rest there; a session gets ``Moved``: the client subscribes again at the new
connection point (replace), releases the old session, and hands on what the new session
brings only after the old one ended, so every notification comes once and in order.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import queue
import random
import secrets
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import grpc
import numpy as np

from broker.errors import (
    InvalidInput,
    SilboError,
    Unavailable,
    error_for,
)
from broker.model.identifiers import DEFAULT_SCOPE
from broker.model.subscription import Subscription
from broker.model.update import ContextUpdate
from broker.wire import client_pb2 as pb
from broker.wire import client_pb2_grpc as pb_grpc
from broker.wire.convert import entity_from_update, spec_from_subscription, trusted_update

__all__ = ["Client", "Notification", "SubscriptionHandle"]

_log = logging.getLogger(__name__)

_CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
)
_END = object()
CLOSE_WAIT = 2.0  # seconds a closing client waits for each stream's reader to see its end
_Record = Callable[[pb.SessionAck], None]


def _raise(error: pb.Error) -> None:
    raise error_for(error.code, error.message)


@dataclass(frozen=True, slots=True)
class Notification:
    """One notification: the subscription it is for and the update that matched it."""

    subscription_id: str
    update: ContextUpdate  # publisher and sequence say who published it, in which order


class SubscriptionHandle:
    """A live subscription; iterate it (or call :meth:`get`) for its notifications."""

    def __init__(self, client: Client, subscription_id: str) -> None:
        self.id = subscription_id
        self._client = client
        self._queue: queue.Queue[Notification | object] = queue.Queue()
        self.closed = False

    def get(self, timeout: float | None = None) -> Notification:
        """The next notification; ``queue.Empty`` after ``timeout`` seconds without one."""
        item = self._queue.get(timeout=timeout)
        if item is _END:
            self._queue.put(_END)
            raise StopIteration
        assert isinstance(item, Notification)
        return item

    def __iter__(self) -> Iterator[Notification]:
        while True:
            try:
                yield self.get()
            except StopIteration:
                return

    def unsubscribe(self) -> None:
        """Stop the subscription (its iterator ends)."""
        self._client.unsubscribe(self)

    def _put(self, notification: Notification) -> None:
        self._queue.put(notification)

    def _end(self) -> None:
        self.closed = True
        self._queue.put(_END)


class _Stream:
    """One bidirectional stream fed from a queue, answered on a reader thread."""

    def __init__(
        self,
        name: str,
        on_event: Callable[[_Stream, object], None],
        on_end: Callable[[_Stream, BaseException | None], None],
    ) -> None:
        self._name = name
        self._requests: queue.Queue[object] = queue.Queue()
        self._on_event = on_event
        self._on_end = on_end
        self._call: grpc.RpcContext | None = None
        self._reader: threading.Thread | None = None
        self.closing = False
        self.ended_ok = False  # a stream the server may end (OK) without it being a failure

    def open(self, method: Callable[..., Iterator[object]]) -> None:
        call = method(self._iterate(), wait_for_ready=True)
        self._call = call  # type: ignore[assignment]
        self._reader = threading.Thread(
            target=self._read, args=(call,), name=self._name, daemon=True
        )
        self._reader.start()

    def wait_ended(self, timeout: float) -> None:
        """Wait (``timeout`` seconds at most) for the reader to see the stream end: a call
        still open when the interpreter exits is cancelled by its garbage collection, which
        aborted a CI run's ``silbo subscribe`` (SIGABRT, "Fatal Python error: Aborted")."""
        reader = self._reader
        if reader is not None and reader is not threading.current_thread():
            reader.join(timeout)

    def send(self, request: object) -> None:
        self._requests.put(request)

    def close(self) -> None:
        self.closing = True
        self._requests.put(_END)
        if self._call is not None:
            self._call.cancel()

    def _iterate(self) -> Iterator[object]:
        while True:
            item = self._requests.get()
            if item is _END:
                return
            yield item

    def _read(self, call: Iterator[object]) -> None:
        error: BaseException | None = None
        try:
            for event in call:
                self._on_event(self, event)
        except grpc.RpcError as exc:
            error = exc
        except Exception as exc:  # a bug in a callback must not hang the client silently
            _log.exception("client stream %s failed", self._name)
            error = exc
        self._requests.put(_END)
        if self.closing:
            error = None
        elif error is None and not self.ended_ok:
            error = ConnectionError("stream ended")
        self._on_end(self, error)


class Client:
    """A connection to a Silbo cluster through one of its connection points."""

    def __init__(
        self,
        targets: str | Sequence[str],
        *,
        publisher: str | None = None,
        timeout: float = 30.0,
        window: int = 16,
        on_batch: Callable[[pb.NotificationBatch, dict[int, str]], None] | None = None,
        store: bool = False,
    ) -> None:
        """``targets``: ``HOST:PORT`` of connection points (a list, or comma-separated).

        ``on_batch`` (optional) receives every raw NotificationBatch with the handle-to-id
        map, instead of the per-subscription queues (for high-rate consumers).

        ``store``: publish through the context store: each update is upserted there (readers
        see it) and the whole stored entity is published with what changed, as an NGSI write
        is (``PublishRequest.store``); an update that changed nothing notifies nobody.
        """
        names = targets.split(",") if isinstance(targets, str) else list(targets)
        self._targets = [t.strip() for t in names if t.strip()]
        if not self._targets:
            raise InvalidInput("a client needs at least one connection point address")
        self.publisher = publisher or f"client-{uuid.uuid4().hex[:12]}"
        # this run's incarnation: with it, a batch sent again through another connection
        # point after a failure is delivered once (PublishRequest.incarnation)
        self.incarnation = secrets.randbits(63) or 1
        self._timeout = timeout
        self._window = threading.Semaphore(window)
        self._on_batch = on_batch
        self._store = store
        self._lock = threading.RLock()
        self._target = 0
        self._publish: _Stream | None = None
        self._session: _Stream | None = None
        self._next_sequence = 1
        self._batches = itertools.count(1)
        self._unacked: dict[int, tuple[pb.PublishRequest, Future[int]]] = {}
        self._requests = itertools.count(1)
        # request -> (its answer, what to record under the lock when it succeeds)
        self._waiting: dict[int, tuple[Future[pb.SessionAck], _Record | None]] = {}
        self._handles: dict[int, str] = {}
        self._subscriptions: dict[str, tuple[SubscriptionHandle, pb.SubscriptionSpec]] = {}
        self._draining: _Stream | None = None  # the old session of a hand-over
        self._held: list[pb.NotificationBatch] = []  # the new session's meanwhile
        # resuming a session after its connection point failed: what the new one brings
        # until the subscribe is acknowledged (None: not resuming); per (publisher,
        # incarnation) the highest sequence received, to drop what a replay repeats; and what
        # had been received when the last resume was handed on, below which a publisher with
        # an incarnation sends only copies (sent again through another connection point)
        self._resumed: list[pb.NotificationBatch] | None = None
        self._received: dict[tuple[str, int], int] = {}
        self._floor: dict[tuple[str, int], int] = {}
        self._channels: dict[str, grpc.Channel] = {}
        self._closed = False

    @classmethod
    def from_state_dir(cls, state_dir: str | Path = ".silbo", **options: object) -> Client:
        """A client of the cluster that ``silbo up`` described in ``STATE_DIR/cluster.json``
        (starting at a connection point chosen at random, the others as failover)."""
        path = Path(state_dir) / "cluster.json"
        try:
            described = json.loads(path.read_text())
            endpoints = described["endpoints"]
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise InvalidInput(f"no running cluster described in {path}: {exc}") from exc
        if described.get("status", "running") != "running" or not endpoints:
            raise Unavailable(f"the cluster described in {path} is not serving yet")
        first = random.randrange(len(endpoints))  # clients spread over the connection points
        return cls(endpoints[first:] + endpoints[:first], **options)  # type: ignore[arg-type]

    @property
    def target(self) -> str:
        """The connection point in use."""
        return self._targets[self._target]

    # -- reading ------------------------------------------------------------------------

    def get_entity(
        self,
        entity_id: str,
        *,
        entity_type: str | None = None,
        tenant: str = "",
        service_path: str = "",
        timeout: float = 30.0,
        **params: str,
    ) -> dict[str, object]:
        """One entity as ``GET /v2/entities/{id}`` answers it (``params``: attrs, metadata,
        options...). NotFound if there is none; InvalidInput (409's ambiguity, a bad
        parameter) or Unavailable as the cluster answers."""
        if entity_type is not None:
            params["type"] = entity_type
        answer = self._query(entity_id, tenant, service_path, params, timeout)
        found: dict[str, object] = json.loads(answer.json)
        return found

    def query(
        self,
        *,
        tenant: str = "",
        service_path: str = "",
        timeout: float = 30.0,
        **params: str,
    ) -> tuple[list[dict[str, object]], int]:
        """The entities ``GET /v2/entities`` answers with these parameters (``id``, ``type``,
        ``idPattern``, ``q``, ``orderBy``, ``limit``, ``offset``, ``options``...), and how
        many match in all."""
        answer = self._query("", tenant, service_path, params, timeout)
        found: list[dict[str, object]] = json.loads(answer.json)
        return found, int(answer.count)

    def _query(
        self, entity_id: str, tenant: str, path: str, params: dict[str, str], timeout: float
    ) -> pb.QueryAnswer:
        self._check_open()
        request = pb.QueryRequest(
            tenant=tenant, service_path=path, entity_id=entity_id, params=params
        )
        for attempt in range(len(self._targets) + 1):
            with self._lock:
                target = self._target
                stub = pb_grpc.ConnectionPointStub(self._connect())  # type: ignore[no-untyped-call]
            try:
                answer: pb.QueryAnswer = stub.Query(request, timeout=timeout)
                return answer
            except grpc.RpcError as exc:
                code = exc.code()
                details = str(exc.details())
                if code is grpc.StatusCode.UNAVAILABLE and attempt < len(self._targets):
                    with self._lock:
                        self._move(target)  # that connection point is gone: the next one
                    continue
                raise error_for(code.name, details) from None
        raise Unavailable("no connection point answered the query")

    # -- publishing -----------------------------------------------------------------------

    def publish(self, update: ContextUpdate | pb.Entity) -> None:
        """Publish one update and wait until the connection point accepted it."""
        self.publish_many([update], batch_size=1)

    def publish_many(
        self, updates: Iterable[ContextUpdate | pb.Entity], *, batch_size: int = 500
    ) -> int:
        """Publish updates in batches, in order; returns how many were accepted.

        At most ``window`` batches are in flight; the first refused batch raises (earlier
        ones are published, later ones are not sent).
        """
        futures: list[Future[int]] = []
        batch: list[pb.Entity] = []
        for update in updates:
            batch.append(update if isinstance(update, pb.Entity) else entity_from_update(update))
            if len(batch) >= batch_size:
                futures.append(self._send_batch(batch))
                batch = []
                self._check_done(futures)
        if batch:
            futures.append(self._send_batch(batch))
        return self._accepted(futures)

    def publish_requests(self, requests: Iterable[pb.PublishRequest]) -> int:
        """Publish prepared requests (publisher and sequences already set); accepted count."""
        futures = []
        for request in requests:
            futures.append(self._send_request(request))
            self._check_done(futures)
        return self._accepted(futures)

    def _accepted(self, futures: list[Future[int]]) -> int:
        deadline = time.monotonic() + self._timeout
        try:
            return sum(f.result(timeout=max(0.0, deadline - time.monotonic())) for f in futures)
        except TimeoutError:
            raise Unavailable(
                f"no publish acknowledgement from {self.target} within {self._timeout:g} s"
            ) from None

    def _check_done(self, futures: list[Future[int]]) -> None:
        for future in futures:
            if future.done():
                future.result()  # raises the first refusal early

    def _send_batch(self, entities: list[pb.Entity]) -> Future[int]:
        with self._lock:
            request = pb.PublishRequest(
                publisher=self.publisher,
                first_sequence=self._next_sequence,
                entities=entities,
                store=self._store,
                incarnation=self.incarnation,
            )
            self._next_sequence += len(entities)
        return self._send_request(request)

    def _send_request(self, request: pb.PublishRequest) -> Future[int]:
        if not self._window.acquire(blocking=False):  # the broker takes less than is offered
            request.held_back = True
            if not self._window.acquire(timeout=self._timeout):
                raise Unavailable(f"no publish acknowledgement within {self._timeout:.0f} s")
        future: Future[int] = Future()
        with self._lock:
            stream = self._publisher()
            request.batch = next(self._batches)
            self._unacked[request.batch] = (request, future)
            stream.send(request)
        return future

    def _publisher(self) -> _Stream:
        with self._lock:
            self._check_open()
            if self._publish is None:
                target = self._target
                stream = _Stream(
                    "silbo-publish",
                    self._publish_ack,
                    lambda stream, error: self._publish_ended(stream, error, target),
                )
                stream.open(pb_grpc.ConnectionPointStub(self._connect()).Publish)  # type: ignore[no-untyped-call]
                self._publish = stream
                for request, _future in self._unacked.values():  # resend, in order
                    stream.send(request)
            return self._publish

    def _publish_ack(self, stream: _Stream, event: object) -> None:
        assert isinstance(event, pb.PublishAck)
        if event.moved_to:
            self._publish_moved(stream, event.moved_to)
            return
        with self._lock:
            entry = self._unacked.pop(event.batch, None)
        if entry is None:
            return
        self._window.release()
        if event.HasField("error") and event.error.code:
            try:
                _raise(event.error)
            except SilboError as exc:
                entry[1].set_exception(exc)
        else:
            entry[1].set_result(event.accepted)

    def _publish_moved(self, stream: _Stream, address: str) -> None:
        """The connection point leaves and delivered every batch it accepted: send the
        unacknowledged ones, in order, to ``address`` (the first such answer moves)."""
        with self._lock:
            if stream is not self._publish or self._closed:
                return  # later answers of the stream already left
            _log.info("publishing moves from %s to %s", self.target, address)
            self._publish = None
            stream.close()
            self._switch_to(address)
            self._publisher()

    def _publish_ended(self, stream: _Stream, error: BaseException | None, target: int) -> None:
        with self._lock:
            if stream is not self._publish:
                return  # a stream already replaced
            self._publish = None
            if error is None or self._closed:
                return
            _log.warning("publish stream to %s ended (%s); moving on", self.target, error)
            self._move(target)
            if self._unacked:
                self._publisher()

    # -- subscribing ----------------------------------------------------------------------

    def subscribe(
        self,
        *,
        id: str | None = None,
        id_pattern: str | None = None,
        type: str | None = None,
        type_pattern: str | None = None,
        condition_attrs: Sequence[str] = (),
        q: str = "",
        mq: str = "",
        tenant: str = "",
        service_path: str = DEFAULT_SCOPE,
        attrs: Sequence[str] = (),
        subscription_id: str = "",
        description: str = "",
    ) -> SubscriptionHandle:
        """Subscribe; returns once the owner matcher holds the subscription."""
        if id is None and id_pattern is None:
            id_pattern = ".*"
        spec = pb.SubscriptionSpec(
            id=subscription_id,
            tenant=tenant,
            service_path=service_path,
            condition_attrs=list(condition_attrs),
            q=q,
            mq=mq,
            attrs=list(attrs),
            description=description,
        )
        spec.entities.add(
            id=id or "",
            id_pattern=id_pattern or "",
            type=type or "",
            type_pattern=type_pattern or "",
        )
        return self.subscribe_many([spec])[0]

    def subscribe_many(
        self, subscriptions: Sequence[pb.SubscriptionSpec | Subscription], *, chunk: int = 2000
    ) -> list[SubscriptionHandle]:
        """Subscribe to many at once (in chunks); all-or-nothing per chunk."""
        specs = [
            s if isinstance(s, pb.SubscriptionSpec) else spec_from_subscription(s)
            for s in subscriptions
        ]
        handles: list[SubscriptionHandle] = []
        for start in range(0, len(specs), chunk):
            part = specs[start : start + chunk]

            def record(ack: pb.SessionAck, part: list[pb.SubscriptionSpec] = part) -> None:
                for spec, subscription_id, handle in zip(part, ack.ids, ack.handles, strict=True):
                    kept = pb.SubscriptionSpec()
                    kept.CopyFrom(spec)
                    kept.id = subscription_id
                    subscription = SubscriptionHandle(self, subscription_id)
                    self._subscriptions[subscription_id] = (subscription, kept)
                    self._handles[handle] = subscription_id
                    handles.append(subscription)

            self._ask(pb.SessionRequest(subscribe=pb.Subscribe(subscriptions=part)), record)
        return handles

    def unsubscribe(self, subscription: SubscriptionHandle | str) -> None:
        """Stop a subscription of this client; NotFound if it holds none with that id."""
        subscription_id = subscription if isinstance(subscription, str) else subscription.id
        ended: list[SubscriptionHandle] = []

        def record(_ack: pb.SessionAck) -> None:
            entry = self._subscriptions.pop(subscription_id, None)
            self._handles = {h: i for h, i in self._handles.items() if i != subscription_id}
            if entry is not None:
                ended.append(entry[0])

        self._ask(pb.SessionRequest(unsubscribe=pb.Unsubscribe(ids=[subscription_id])), record)
        for handle in ended:
            handle._end()

    def _ask(self, request: pb.SessionRequest, record: _Record | None = None) -> pb.SessionAck:
        """Send a session request and wait for its answer; ``record`` (if given) runs under
        the lock as the successful answer arrives, before anyone else sees the session's
        state (a hand-over takes the subscriptions over only once every answer due is
        recorded)."""
        future: Future[pb.SessionAck] = Future()
        with self._lock:
            request.request = next(self._requests)
            self._waiting[request.request] = (future, record)
            self._sessions().send(request)
        try:
            ack = future.result(timeout=self._timeout)
        except TimeoutError:
            raise Unavailable(
                f"no answer from {self.target} within {self._timeout:.0f} s"
            ) from None
        if ack.HasField("error") and ack.error.code:
            _raise(ack.error)
        return ack

    def _sessions(self) -> _Stream:
        with self._lock:
            self._check_open()
            if self._session is None:
                target = self._target
                stream = _Stream(
                    "silbo-session",
                    self._session_event,
                    lambda stream, error: self._session_ended(stream, error, target),
                )
                stream.open(pb_grpc.ConnectionPointStub(self._connect()).Session)  # type: ignore[no-untyped-call]
                self._session = stream
            return self._session

    def _session_event(self, stream: _Stream, event: object) -> None:
        assert isinstance(event, pb.SessionEvent)
        if event.HasField("ack"):
            with self._lock:
                waiting = self._waiting.pop(event.ack.request, None)
                refused = event.ack.HasField("error") and bool(event.ack.error.code)
                if waiting is not None and waiting[1] is not None and not refused:
                    waiting[1](event.ack)
            if waiting is not None:
                waiting[0].set_result(event.ack)
            return
        if event.HasField("moved"):
            threading.Thread(
                target=self._hand_over, args=(stream, event.moved.address), daemon=True
            ).start()
            return
        with self._lock:
            if self._resumed is not None and stream is self._session:
                self._resumed.append(event.notifications)  # once the replay is all in
                return
            if self._draining is not None and stream is not self._draining:
                self._held.append(event.notifications)  # after the old session's, in order
                return
        self._hand_on(event.notifications)

    def _hand_on(self, batch: pb.NotificationBatch) -> None:
        """Hand ``batch`` on, less the copies a resume's floor tells (see ``_floor``)."""
        floor, incarnation = self._floor, batch.incarnation
        if floor and incarnation and any((p, incarnation) in floor for p in set(batch.publishers)):
            above = _above(floor, incarnation)
            kept = _rows(batch, above)
            for publisher, sequence in zip(batch.publishers, batch.sequences, strict=True):
                if above(0, publisher, sequence):  # it goes on above: no copy can follow
                    floor.pop((publisher, incarnation), None)
            if kept is None:
                return
            batch = kept
        self._notify(batch)

    def _notify(self, batch: pb.NotificationBatch) -> None:
        received, incarnation = self._received, batch.incarnation
        publishers = set(batch.publishers)
        if len(publishers) == 1:  # as a connection point sends them: one publisher's batch
            key = (publishers.pop(), incarnation)
            received[key] = max(received.get(key, 0), max(batch.sequences))
        else:
            for publisher, sequence in zip(batch.publishers, batch.sequences, strict=True):
                if sequence > received.get((publisher, incarnation), 0):
                    received[publisher, incarnation] = sequence
        if self._on_batch is not None:
            self._on_batch(batch, self._handles)
            return
        updates = [
            trusted_update(entity, publisher, sequence)
            for entity, publisher, sequence in zip(
                batch.entities, batch.publishers, batch.sequences, strict=True
            )
        ]
        indexes = np.frombuffer(batch.entity_index, dtype="<u4").tolist()
        handles = np.frombuffer(batch.handles, dtype="<u8").tolist()
        for index, handle in zip(indexes, handles, strict=True):
            subscription_id = self._handles.get(handle)
            entry = self._subscriptions.get(subscription_id) if subscription_id else None
            if entry is not None:
                entry[0]._put(Notification(subscription_id or "", updates[index]))

    def _hand_over(self, old: _Stream, address: str) -> None:
        """The connection point of ``old`` leaves: take the subscriptions over at ``address``
        (same ids, replace), release the old session, and deliver what the new one brings
        only after the old one ended (it ends once everything matched before is sent)."""
        with self._lock:
            if old is not self._session or self._closed:
                return
            _log.info("session moves from %s to %s", self.target, address)
            old.ended_ok = True
            self._draining = old
            self._session = None
            self._switch_to(address)
            asked = [future for future, _record in self._waiting.values()]
        for future in asked:  # answers still due on the old session come first
            with contextlib.suppress(Exception):
                future.result(timeout=self._timeout)
        with self._lock:
            live = list(self._subscriptions.values())
        if live:
            specs = [spec for _handle, spec in live]
            try:
                ack = self._ask(
                    pb.SessionRequest(subscribe=pb.Subscribe(subscriptions=specs, replace=True))
                )
            except SilboError as exc:
                _log.error("could not take the subscriptions over at %s: %s", address, exc)
                old.close()
                return
            with self._lock:
                self._handles.update(zip(ack.handles, ack.ids, strict=True))
        else:
            self._sessions()
        old.send(pb.SessionRequest(release=pb.Release()))

    def _session_ended(self, stream: _Stream, error: BaseException | None, target: int) -> None:
        with self._lock:
            if stream is self._draining:
                self._drained()
                return
            if stream is not self._session:
                return
            self._session = None
            for future, _record in self._waiting.values():
                future.set_exception(Unavailable(f"the session with {self.target} ended"))
            self._waiting.clear()
            if error is None or self._closed:
                return
            _log.warning("session with %s ended (%s); moving on", self.target, error)
            self._move(target)
            live = list(self._subscriptions.values())
        if live:
            threading.Thread(target=self._resubscribe, args=(live,), daemon=True).start()

    def _drained(self) -> None:
        """The old session of a hand-over ended: what the new one brought meanwhile follows
        (the caller holds the lock)."""
        self._draining = None
        held, self._held = self._held, []
        for batch in held:
            self._notify(batch)

    def _resubscribe(self, live: list[tuple[SubscriptionHandle, pb.SubscriptionSpec]]) -> None:
        """Subscribe again after the session's connection point failed, resuming the old
        session: the new connection point replays what the exit points kept for its handles
        (broker/roles/session_resume.py), and the replay and the new session's own
        notifications are handed on once the subscribe is acknowledged, what was received
        before dropped."""
        with self._lock:
            old_handle = {i: h for h, i in self._handles.items()}
            self._resumed = []
        try:
            specs = [s for _h, s in live]
            resume = [old_handle.get(s.id, 0) for s in specs]
            ack = self._ask(
                pb.SessionRequest(
                    subscribe=pb.Subscribe(subscriptions=specs, replace=True, resume=resume)
                )
            )
        except SilboError as exc:
            _log.error("could not subscribe again after moving: %s", exc)
            with self._lock:
                self._resumed = None
            for handle, _spec in live:
                handle._end()
            return
        with self._lock:
            self._handles = dict(zip(ack.handles, ack.ids, strict=True))
            self._hand_on_resumed()

    def _hand_on_resumed(self) -> None:
        """The resumed session is acknowledged: hand on the replay, less what was received
        before the failure, then what the new session brought meanwhile, less what was
        received before and what the replay gave (an update matched under both handles around
        the take-over, or a copy its publisher sent again through another connection point);
        the caller holds the lock.

        Per (publisher, incarnation) a session delivers a publisher's batches whole and in
        order, and so does a replay, so what was received is every update up to the highest
        sequence received. After the replay that stays the *floor* of the publishers with an
        incarnation: their copies may come later still (whenever the publisher sends them
        again), and are dropped until the publisher's sequences pass it. Without an
        incarnation a publisher that starts its sequences again under the same name is not
        told from one sending copies: only what the resume brings is filtered for it."""
        held, self._resumed = self._resumed or [], None
        for batch in held:
            if batch.replayed:  # the exit points may keep two copies (a publisher's resend)
                fresh = _rows(batch, _above(self._received, batch.incarnation))
                if fresh is not None:
                    self._notify(fresh)
        after = dict(self._received)  # the replay came whole and in order too
        self._floor = {key: sequence for key, sequence in after.items() if key[1]}
        for batch in held:
            if not batch.replayed:
                rest = _rows(batch, _above(after, batch.incarnation))
                if rest is not None:
                    self._hand_on(rest)

    # -- connection -----------------------------------------------------------------------

    def _connect(self) -> grpc.Channel:
        channel = self._channels.get(self.target)
        if channel is None:
            channel = grpc.insecure_channel(self.target, options=_CHANNEL_OPTIONS)
            self._channels[self.target] = channel
        return channel

    def _move(self, failed: int) -> None:
        """Use the next connection point after ``failed`` (the caller holds the lock).

        Both streams notice a connection point going away; only the first moves on.
        """
        if failed != self._target:
            return
        channel = self._channels.pop(self.target, None)
        if channel is not None:
            channel.close()
        self._target = (self._target + 1) % len(self._targets)

    def _switch_to(self, address: str) -> None:
        """Use ``address`` from now on (a planned move; the caller holds the lock)."""
        if address not in self._targets:
            self._targets.append(address)
        self._target = self._targets.index(address)

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidInput("the client is closed")

    def close(self) -> None:
        """Close both streams; live subscriptions end (the cluster drops them)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            streams = [s for s in (self._publish, self._session) if s is not None]
            unacked = [future for _request, future in self._unacked.values()]
            self._unacked.clear()
        for future in unacked:  # a publish waiting for these must not wait out its timeout
            if not future.done():
                future.set_exception(InvalidInput("the client was closed before the ack came"))
            self._window.release()
        with self._lock:
            subscriptions = [h for h, _s in self._subscriptions.values()]
        for stream in streams:
            stream.close()
        for handle in subscriptions:
            handle._end()
        for stream in streams:
            stream.wait_ended(CLOSE_WAIT)
        for channel in list(self._channels.values()):
            channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def _notifications(batch: pb.NotificationBatch) -> Iterator[tuple[int, str, int]]:
    """(handle, publisher, sequence) of each notification of ``batch``."""
    indexes = np.frombuffer(batch.entity_index, dtype="<u4").tolist()
    handles = np.frombuffer(batch.handles, dtype="<u8").tolist()
    for index, handle in zip(indexes, handles, strict=True):
        yield handle, batch.publishers[index], batch.sequences[index]


def _rows(
    batch: pb.NotificationBatch, keep: Callable[[int, str, int], bool]
) -> pb.NotificationBatch | None:
    """``batch`` with only the notifications ``keep`` (handle, publisher, sequence) holds
    (None: none)."""
    chosen = [i for i, n in enumerate(_notifications(batch)) if keep(*n)]
    if not chosen:
        return None
    if len(chosen) == len(batch.handles) // 8:
        return batch
    entity_index = np.frombuffer(batch.entity_index, dtype="<u4")[chosen]
    used, index = np.unique(entity_index, return_inverse=True)
    rows = used.tolist()
    return pb.NotificationBatch(
        entities=[batch.entities[i] for i in rows],
        publishers=[batch.publishers[i] for i in rows],
        sequences=[batch.sequences[i] for i in rows],
        entity_index=index.astype("<u4").tobytes(),
        handles=np.frombuffer(batch.handles, dtype="<u8")[chosen].tobytes(),
        replayed=batch.replayed,
        incarnation=batch.incarnation,
    )


def _above(floor: dict[tuple[str, int], int], incarnation: int) -> Callable[[int, str, int], bool]:
    """Whether a notification of a batch of ``incarnation`` is above ``floor`` (per
    (publisher, incarnation), the highest sequence received)."""

    def above(_handle: int, publisher: str, sequence: int) -> bool:
        return sequence > floor.get((publisher, incarnation), 0)

    return above
