"""The delivery worker: a process of its own that renders and sends HTTP and MQTT
notifications.

The connection point's event loop only decides which subscriptions fire; this process,
started by :class:`broker.ngsi.notifier.Notifier` (:func:`main`),
does the rest, so sending takes neither the connection point's loop nor its GIL. They talk
over the worker's stdin and stdout in msgpack arrays:

- in: ``["s", number, id, generation, fails, config]`` a subscription created or changed
  (``number``: what the connection point calls it in the pipe; :class:`Config`; ``fails``:
  its failsCounter from now on, or None to keep it), ``["f", number]`` one deleted, ``["n",
  entities, numbers, indexes]`` a batch of notifications: the published entities' bytes,
  and for each notification the subscription's number and its entity's index (both arrays
  of little-endian uint32, as bytes; a fifth element, true, for notifications a dead
  front's exit points kept, replayed to its heir: taken past a subscription's limit);
  ``["i", token]`` a request to be told once nothing
  waits or is in flight; ``["q"]`` a planned stop (:data:`QUIT`), the last message;
- out: ``["r", [[id, generation, last_success, code, last_failure, reason, fails_counter,
  dropped, delivered, retried, gave_up], ...]]`` what happened to subscriptions since the
  last report (times are None if nothing new; the last four are counts since the last
  report: :data:`broker.ngsi.notifier.OUTCOMES`); ``["i", token]`` nothing
  waits or is in flight any more (the report of everything sent comes before it).

A waiting notification is its entity's bytes and a number: the entity is decoded and the
body rendered only when one of its notifications is sent (a dropped one costs neither),
once per (entity, format, attributes chosen), its JSON bytes shared by every subscription
that wants the same. What waits is bounded in a :class:`Backlog`: per subscription and in
all; once it is full in all, the worker reads no more until 1 % of it has left, so what
follows waits in the pipe, and the connection point drops new notifications once too much
waits there: an overloaded worker spends its time sending, not taking notifications in only
to drop them.

How the worker ends depends on why its stdin closed. After ``["q"]`` (the connection point
stops it: :meth:`broker.ngsi.notifier.Notifier.stop`) it ends at once: what waits is
dropped, what is in flight cancelled. Its stdin closing *without* ``["q"]`` means the
connection point died (killed, crashed): the worker then is an orphan whose notifications
nobody else holds, so it reads no more and sends what it holds first (:meth:`Worker.drain`):
each subscription's queue in order, retried as usual, until all of it is sent or given up,
for at most the retry window it was started with plus the longest request timeout of those
subscriptions; what is still unsent then is given up. It reports nothing more (nobody reads
its stdout; a write there would meet a broken pipe), and logs at WARNING what it drains and
how that ended. It runs in a session of its own (the notifier starts it so): a terminal's
Ctrl-C or hangup, sent to the connection point's process group, reaches the connection
point alone, which then stops it with ``["q"]``; a ``kill -9`` of the connection point (or
its exit when fenced) leaves it draining.

Requests go out through :class:`broker.ngsi.http_client.HttpClient` (keep-alive connections
pooled per origin, at most ``concurrency`` requests in flight and ``per_origin`` connections
per origin): a subscription's request line and headers are bytes made once per version of
it, the entity's headers (service, service path, correlator) once per entity, and its body
once per (entity, format, attributes chosen). A notification that fails is sent again
(:mod:`broker.ngsi.retry`) before the next of its subscription, with the same
``Silbo-Notification-Id``: a subscription's notifications keep their order, and one being
retried holds back only its own subscription.

httpCustom's templates (:mod:`broker.ngsi.templates`: ``${...}`` macros, ``payload``,
``json``, ``ngsi``) are compiled once per version of a subscription (:class:`_Custom`); a
subscription without any, every ``http`` one, never looks at them. One whose URL, headers
and ``qs`` hold no macro keeps its request line and headers made once and fills only its
body per notification; one with macros there makes them per notification. The update's
``X-Auth-Token`` (carried in its change, :mod:`broker.ngsi.change`) is one more of the
entity's header lines, made once per entity, left out for a subscription whose own headers
name it.

An mqtt / mqttCustom subscription (``Config.mqtt``) publishes instead, through
:class:`broker.ngsi.mqtt_client.MqttClient` (one connection per broker and user): the same
body (or mqttCustom's template), on its topic (filled per notification when it holds a
macro), with the same queue, order and retries (:meth:`Worker._publish`); no headers, so no
notification id. A broker refusing the connection (user, password), like a topic that
cannot be published to, gives the notification up at once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import sys
import time
import uuid
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import urlencode

import msgpack
import numpy as np

from broker.errors import InvalidInput
from broker.model.subscription import AttrsFormat
from broker.ngsi.change import Change, read_change
from broker.ngsi.channel import Mqtt
from broker.ngsi.entity import Attributes, from_wire, render
from broker.ngsi.http_client import HttpClient, Target, TransportError
from broker.ngsi.mqtt_client import Broker, MqttClient, Refused
from broker.ngsi.retry import DEFAULT_WINDOW, ID_HEADER, Backoff, NotificationIds, retried
from broker.ngsi.templates import (
    Context,
    Json,
    NgsiPatch,
    Text,
    compile_json,
    compile_ngsi,
    compile_text,
    fill_json,
    fill_ngsi,
    fill_text,
)
from broker.wire import client_pb2 as pb

__all__ = ["QUEUE_FULL", "QUIT", "Backlog", "Config", "main"]

_log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")

REPORT_EVERY = 0.05  # seconds between status reports to the connection point
IDLE_POLL = 0.02  # seconds between looks for an idle worker (asked by ["i", token])
READ_SIZE = 1 << 16  # bytes read from the pipe at a time
FULL_WAIT = 0.005  # seconds between looks at a full backlog before reading more
RESUME_AT = 0.99  # a full backlog is read into again once this share of it is left
QUEUE_FULL = "Notification queue is full"  # lastFailureReason of a dropped notification
QUIT = "q"  # the kind of the message that stops the worker as planned (no drain)
UNSENDABLE = "the URL or a header cannot be sent"  # lastFailureReason: given up at once
UNPUBLISHABLE = "the MQTT topic cannot be published to"  # lastFailureReason: given up at once
PUBLISHED = 200  # the code of an MQTT message the broker took (GET shows none for MQTT)
ALTERATION_TYPE = "alterationType"  # the builtin attribute only notifications carry
AUTH_TOKEN = "x-auth-token"  # forwarded from the update unless a subscription's headers name it
_NULL: dict[str, Any] = {"type": "None", "value": None, "metadata": {}}
_WRAPPED = frozenset(f for f in AttrsFormat if not f.value.startswith("simplified"))
# how a wrapped body ends (NGSIv1's legacy: one context response, with its status code)
_ENDS = {AttrsFormat.LEGACY: b',"statusCode":{"code":"200","reasonPhrase":"OK"}}]}'}
# Headers the worker sets itself on every request (a subscription's own are left out).
_OWN_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "fiware-servicepath",
        "fiware-correlator",
        ID_HEADER.lower(),
    }
)


class Backlog(Generic[K, T]):
    """Queues by key, bounded per key (``per_key``: a new item beyond is refused) and in all
    (``total``: the oldest item of the longest queue is dropped to make room). An item pushed
    ``over`` the key's bound (a replay) raises the key's bound by one until one item leaves,
    so that what follows a burst of them is not refused for it."""

    def __init__(self, per_key: int, total: int) -> None:
        self.per_key = per_key
        self.total = total
        self.size = 0
        self._queues: dict[K, deque[T]] = {}
        self._over: dict[K, int] = {}  # items queued over the key's bound, not left yet
        # keys by their queue's length (above 0); dicts, as sets are slow to take any from
        self._by_length: dict[int, dict[K, None]] = {}
        self._longest = 0

    def __len__(self) -> int:
        return self.size

    def length(self, key: K) -> int:
        """How many items ``key`` has queued."""
        queue = self._queues.get(key)
        return len(queue) if queue is not None else 0

    def push(self, key: K, item: T, over: bool = False) -> tuple[bool, K | None]:
        """Queue ``item``: (False if ``key``'s queue is full, the key whose oldest item was
        dropped for room, if one was; ``over``: past ``key``'s limit, within the total)."""
        queue = self._queues.get(key)
        if over:
            self._over[key] = self._over.get(key, 0) + 1
        elif queue is not None and len(queue) >= self.per_key + self._over.get(key, 0):
            return False, None
        evicted = None
        if self.size >= self.total:
            evicted, _none = self._by_length[self._longest].popitem()
            self.pop(evicted)
            queue = self._queues.get(key)
        if queue is None:
            queue = self._queues[key] = deque()
        self._moved(key, len(queue), len(queue) + 1)
        queue.append(item)
        self.size += 1
        return True, evicted

    def pop(self, key: K) -> T | None:
        """The oldest item of ``key``, or None if it has none."""
        queue = self._queues.get(key)
        if not queue:
            self._queues.pop(key, None)
            return None
        self._moved(key, len(queue), len(queue) - 1)
        self.size -= 1
        item = queue.popleft()
        over = self._over.get(key)
        if over is not None:
            if over > 1:
                self._over[key] = over - 1
            else:
                del self._over[key]
        if not queue:
            del self._queues[key]
            self._over.pop(key, None)
        return item

    def clear(self, key: K) -> int:
        """Drop everything ``key`` has queued; how many items."""
        queue = self._queues.pop(key, None)
        self._over.pop(key, None)
        if not queue:
            return 0
        self._moved(key, len(queue), 0)
        self.size -= len(queue)
        return len(queue)

    def _moved(self, key: K, old: int, new: int) -> None:
        by_length = self._by_length
        if old:
            keys = by_length[old]
            keys.pop(key, None)
            if not keys:
                del by_length[old]
        if new:
            at = by_length.get(new)
            if at is None:
                at = by_length[new] = {}
            at[key] = None
            if new > self._longest:
                self._longest = new
        while self._longest and self._longest not in by_length:
            self._longest -= 1


@dataclass(frozen=True, slots=True)
class Config:
    """How one subscription's notifications are rendered and sent (``headers``: those of
    every notification, a header given an empty value being one not sent; the service,
    service path, correlator and X-Auth-Token are added per request).

    httpCustom's templates (:mod:`broker.ngsi.templates`): ``templated`` says that the URL,
    a header value or a ``qs`` value holds a macro, and ``qs`` is then the pairs the worker
    fills and adds to the URL (otherwise they are in ``url`` already); ``body`` is the
    template of the body as the subscription gives it (``["payload", text or None]``,
    ``["json", value]``, ``["ngsi", fragment]``), or None for the normal body."""

    url: str
    method: str
    headers: tuple[tuple[str, str], ...]
    timeout: float
    attrs_format: AttrsFormat
    attrs: tuple[str, ...]
    except_attrs: tuple[str, ...]
    only_changed: bool
    covered: bool
    max_fails_limit: int | None
    retry_window: float | None = None  # seconds; None: the worker's default
    metadata: tuple[str, ...] = ()  # notification.metadata (empty: every user metadata)
    templated: bool = False
    qs: tuple[tuple[str, str], ...] = ()
    body: tuple[str, Any] | None = None
    mqtt: Mqtt | None = None  # an mqtt / mqttCustom subscription's (``url`` is its broker's)

    def to_list(self) -> list[Any]:
        """The config as the pipe carries it."""
        return [
            self.url,
            self.method,
            [list(h) for h in self.headers],
            self.timeout,
            self.attrs_format.value,
            list(self.attrs),
            list(self.except_attrs),
            self.only_changed,
            self.covered,
            self.max_fails_limit,
            self.retry_window,
            list(self.metadata),
            self.templated,
            [list(q) for q in self.qs],
            None if self.body is None else list(self.body),
            None if self.mqtt is None else self.mqtt.to_list(),
        ]

    @classmethod
    def from_list(cls, data: list[Any]) -> Config:
        """The config from the pipe."""
        url, method, headers, timeout, attrs_format, attrs, except_attrs, *rest = data
        only_changed, covered, limit, window, *more = rest
        metadata = tuple(more[0]) if more else ()
        templated, qs, body = more[1:4] if len(more) >= 4 else (False, [], None)
        mqtt = more[4] if len(more) >= 5 else None
        return cls(
            url,
            method,
            tuple((k, v) for k, v in headers),
            timeout,
            AttrsFormat(attrs_format),
            tuple(attrs),
            tuple(except_attrs),
            only_changed,
            covered,
            limit,
            window,
            metadata,
            bool(templated),
            tuple((k, v) for k, v in qs),
            None if body is None else (body[0], body[1]),
            None if mqtt is None else Mqtt.from_list(mqtt),
        )


@dataclass(eq=False, slots=True)
class _Subscription:
    """What the worker keeps of one subscription (``target``: None if its URL or headers
    cannot be sent, ``service``: the Fiware-Service header line its own headers give, sent
    for entities of the default tenant; ``custom``: its templates compiled, None for a
    subscription without any; ``own_token``: its headers name X-Auth-Token, so the update's
    is not forwarded)."""

    id: str
    config: Config
    generation: int
    target: Target | None
    service: bytes
    wrapper: bytes  # the body's start for the wrapped formats
    custom: _Custom | None = None
    own_token: bool = False
    broker: Broker | None = None  # MQTT: where it publishes (None if it cannot)
    topic: Text | None = None  # mqttCustom: its topic compiled, if it holds a macro
    fails_counter: int = 0
    last_success: float | None = None  # these four: since the last report
    last_success_code: int = 0
    last_failure: float | None = None
    last_failure_reason: str = ""
    dropped: int = 0  # these four: counts since the last report
    delivered: int = 0
    retries: int = 0
    gave_up: int = 0
    sending: bool = False
    gone: bool = False  # deleted

    def failed_out(self) -> bool:
        limit = self.config.max_fails_limit
        return limit is not None and self.fails_counter > limit


@dataclass(slots=True)
class _Entity:
    """One published entity of a batch: its bytes, decoded when a notification of it is
    first sent, and the bodies rendered of it so far."""

    data: bytes
    sent: int = 0  # notifications of it so far (Orion's cbnotif)
    decoded: tuple[pb.Entity, Change, Attributes, str] | None = None  # with its correlator
    bodies: dict[tuple[Any, ...], bytes] = field(default_factory=dict)
    # the service line, the X-Auth-Token line, the rest up to cbnotif=
    headers: tuple[bytes, bytes, bytes] | None = None

    def decode(self) -> tuple[pb.Entity, Change, Attributes, str]:
        """The entity, its change, its attributes and its correlator."""
        if self.decoded is None:
            entity = pb.Entity.FromString(self.data)
            change = read_change(self.data, entity)
            correlator = change.correlator or str(uuid.uuid1())
            self.decoded = (entity, change, from_wire(entity), correlator)
        return self.decoded

    def header_lines(self) -> tuple[bytes, bytes, bytes]:
        """Its Fiware-Service line (empty for the default tenant), its X-Auth-Token line
        (empty if the update had none), and its Fiware-ServicePath and Fiware-Correlator
        lines up to the notification's number."""
        if self.headers is None:
            entity, change, _attributes, correlator = self.decode()
            service = b"Fiware-Service: %s\r\n" % entity.tenant.encode() if entity.tenant else b""
            token = change.auth_token
            sendable = token.isascii() and token.isprintable()  # the front checked it
            line = b"X-Auth-Token: %s\r\n" % token.encode() if token and sendable else b""
            rest = b"Fiware-ServicePath: %s\r\nFiware-Correlator: %s; cbnotif=" % (
                entity.service_path.encode(),
                correlator.encode(),
            )
            self.headers = (service, line, rest)
        return self.headers

    def context(self) -> Context:
        """What its notifications' macros are filled from."""
        entity, change, attributes, _correlator = self.decode()
        return Context(
            entity.id,
            entity.type,
            entity.tenant,
            entity.service_path,
            change.auth_token,
            attributes,
        )


_Notification = tuple[_Entity, int]  # one waiting: its entity and its number (Orion's cbnotif)


class Worker:
    """The delivery worker (see the module doc)."""

    def __init__(
        self,
        concurrency: int,
        per_origin: int,
        queue_limit: int,
        total_limit: int,
        retry_window: float = DEFAULT_WINDOW,
    ) -> None:
        self._concurrency = concurrency
        self._retry_window = retry_window
        self._backoff = Backoff()
        self._ids = NotificationIds()
        self._per_origin = per_origin
        self._backlog: Backlog[_Subscription, _Notification] = Backlog(queue_limit, total_limit)
        self._subscriptions: dict[int, _Subscription] = {}  # by the pipe's number
        self._changed: dict[str, _Subscription] = {}  # to report
        self._tasks: set[asyncio.Task[None]] = set()
        self._client: HttpClient | None = None
        self._mqtt = MqttClient()
        self._out: asyncio.WriteTransport | None = None
        self._report_due = False
        self._sending = 0  # subscriptions with a request in flight (drains running)

    async def run(self) -> None:
        """Serve stdin until ``["q"]`` or its end; at an end without ``["q"]`` (the
        connection point died), send what is held first (:meth:`drain`)."""
        loop = asyncio.get_running_loop()
        # a small limit: the reader stops taking from the pipe past twice this, so that what
        # the worker has not read waits in the pipe (and the front drops once it is full)
        reader = asyncio.StreamReader(limit=READ_SIZE)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
        self._out, _protocol = await loop.connect_write_pipe(asyncio.Protocol, sys.stdout.buffer)
        self._client = HttpClient(self._concurrency, self._per_origin)
        try:
            if not await self._serve(reader):
                await self.drain()
        finally:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._client.close()
            await self._mqtt.close()

    async def _serve(self, reader: asyncio.StreamReader) -> bool:
        """Act on what comes down the pipe until ``["q"]`` (True) or its end (False)."""
        unpacker = msgpack.Unpacker(raw=False, max_buffer_size=1 << 30)
        while chunk := await reader.read(READ_SIZE):
            unpacker.feed(chunk)
            for message in unpacker:
                if message[0] == QUIT:
                    return True
                self.handle(message)
            if len(self._backlog) >= self._backlog.total:
                # what follows waits in the pipe until some room is made (not room for
                # one: each read would then drop a chunk's worth of what waits here)
                while len(self._backlog) > self._backlog.total * RESUME_AT:
                    await asyncio.sleep(FULL_WAIT)
        return False  # a message cut short by the connection point's death is not read

    async def drain(self) -> None:
        """Send what is held once the connection point is gone, for at most the worker's
        retry window plus the longest request timeout of the subscriptions holding some (a
        subscription's own longer window is cut there): what is left then is given up when
        :meth:`run` cancels it. Logged at WARNING: what it holds, and how the drain ended."""
        self._stop_reporting()
        holding = [s for s in self._subscriptions.values() if s.sending or self._backlog.length(s)]
        if not holding:
            return
        held = self._held()
        bound = self._retry_window + max(s.config.timeout for s in holding)
        _log.warning(
            "the connection point is gone: sending the %d notifications held for %d "
            "subscriptions (for at most %.1f s)",
            held,
            len(holding),
            bound,
        )
        started = time.monotonic()
        while self._held() and time.monotonic() - started < bound:
            await asyncio.sleep(IDLE_POLL)
        left = self._held()
        subscriptions = self._subscriptions.values()
        _log.warning(
            "the drain after the connection point's death ended in %.1f s: %d sent, %d given "
            "up (%d of them still waiting or unanswered at the bound), %d dropped (their "
            "subscription failed out)",
            time.monotonic() - started,
            sum(s.delivered for s in subscriptions),
            sum(s.gave_up for s in subscriptions) + left,
            left,
            sum(s.dropped for s in subscriptions),
        )

    def _held(self) -> int:
        """Notifications waiting or in flight (a running drain has one request in flight)."""
        return len(self._backlog) + self._sending

    def _stop_reporting(self) -> None:
        """Write no more reports (nobody reads them once the connection point is gone, and a
        write would meet a broken pipe); from here, the subscriptions' counts, set back to
        0, count what :meth:`drain` does."""
        out, self._out = self._out, None
        if out is not None and not out.is_closing():  # closed already if a write met EPIPE
            out.abort()
        self._changed.clear()
        for s in self._subscriptions.values():
            s.dropped = s.delivered = s.retries = s.gave_up = 0

    def handle(self, message: list[Any]) -> None:
        """Act on one message from the connection point."""
        kind = message[0]
        if kind == "n":
            self._notify(message[1], message[2], message[3], len(message) > 4 and message[4])
        elif kind == "s":
            _kind, number, sid, generation, fails, data = message
            config = Config.from_list(data)
            target, service = _target(config) if config.mqtt is None else (None, b"")
            broker, topic = _mqtt_target(config)
            wrapper = (
                b'{"subscriptionId":"%s","originator":"localhost","contextResponses":'
                b'[{"contextElement":' % sid.encode()
                if config.attrs_format is AttrsFormat.LEGACY
                else b'{"subscriptionId":"%s","data":[' % sid.encode()
            )
            custom = _Custom.compile(config)
            own_token = any(k.lower() == AUTH_TOKEN for k, _v in config.headers)
            subscription = self._subscriptions.get(number)
            if subscription is None:
                subscription = self._subscriptions[number] = _Subscription(
                    sid, config, generation, target, service, wrapper, custom, own_token
                )
            else:
                subscription.config, subscription.generation = config, generation
                subscription.target, subscription.service = target, service
                subscription.custom, subscription.own_token = custom, own_token
            subscription.broker, subscription.topic = broker, topic
            if fails is not None:
                subscription.fails_counter = fails
        elif kind == "f":
            gone = self._subscriptions.pop(message[1], None)
            if gone is not None:
                gone.gone = True
                self._backlog.clear(gone)
                self._changed.pop(gone.id, None)
        elif kind == "i":
            task = asyncio.get_running_loop().create_task(self._tell_idle(message[1]))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _tell_idle(self, token: int) -> None:
        """Answer ``["i", token]`` once nothing waits and no request is in flight."""
        while len(self._backlog) or self._sending:
            await asyncio.sleep(IDLE_POLL)
        self._send_report()
        self._tell(["i", token])

    def _notify(
        self, entities: list[bytes], numbers: bytes, indexes: bytes, replayed: bool = False
    ) -> None:
        """Queue a batch of notifications (``replayed``: a dead front's that the exit points
        kept, taken past the per-subscription limit: what they kept is bounded, and it has
        come in one burst)."""
        batch = [_Entity(data) for data in entities]
        pairs = zip(
            np.frombuffer(numbers, "<u4").tolist(),
            np.frombuffer(indexes, "<u4").tolist(),
            strict=True,
        )
        subscriptions, push = self._subscriptions, self._backlog.push
        for number, index in pairs:
            subscription = subscriptions.get(number)
            if subscription is None:
                continue
            one = batch[index]
            one.sent += 1
            accepted, evicted = push(subscription, (one, one.sent), replayed)
            if not accepted:
                self._dropped(subscription, 1)
            if evicted is not None:
                self._dropped(evicted, 1)
            if accepted and not subscription.sending:
                subscription.sending = True
                task = asyncio.get_running_loop().create_task(self._drain(subscription))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)

    async def _drain(self, subscription: _Subscription) -> None:
        self._sending += 1
        try:
            while (notification := self._backlog.pop(subscription)) is not None:
                if subscription.failed_out():
                    # what was queued before it went inactive is not sent
                    count = self._backlog.clear(subscription) + 1
                    self._dropped(subscription, count, failure=False)
                    break
                await self._post(subscription, notification)
        finally:
            subscription.sending = False
            self._sending -= 1

    async def _post(self, subscription: _Subscription, notification: _Notification) -> None:
        """Send one notification, retried while its window lasts (broker.ngsi.retry): its
        end (an answer, or given up) is what the subscription's status shows."""
        one, number = notification
        nid = self._ids.next()
        window = subscription.config.retry_window
        if window is None:
            window = self._retry_window
        deadline = time.monotonic() + window
        attempt = 0
        while not subscription.gone:  # a deleted subscription's retries stop
            attempt += 1
            if subscription.config.mqtt is None:
                status, reason, after, final = await self._attempt(subscription, one, number, nid)
            else:
                status, reason, after, final = await self._publish(subscription, one)
            if status and (not retried(status) or not window):
                # an answer: a success as Orion counts it (no window: 5xx and 429 too)
                subscription.last_success = time.time()
                subscription.last_success_code = status
                subscription.fails_counter = 0
                subscription.delivered += 1
                break
            wait = self._backoff.delay(attempt, after if status in (429, 503) else None)
            if final or time.monotonic() + wait > deadline:
                subscription.last_failure = time.time()
                subscription.last_failure_reason = reason
                subscription.fails_counter += 1
                subscription.gave_up += 1
                break
            subscription.retries += 1
            await asyncio.sleep(wait)
        self._report(subscription)

    async def _attempt(
        self, subscription: _Subscription, one: _Entity, number: int, nid: bytes
    ) -> tuple[int, str, float | None, bool]:
        """One request of a notification: (the answer's status or 0, why it failed, the
        seconds its Retry-After asks for, whether it is given up at once: it cannot be
        sent); the subscription's config as it is now (PATCH)."""
        assert self._client is not None, "the worker has not started"
        config, target, own_service = subscription.config, subscription.target, subscription.service
        custom = subscription.custom
        if custom is None:
            body = _wrapped(subscription, one)
        else:
            try:
                target, own_service, body = custom.render(subscription, one)
            except ValueError as exc:
                _log.debug("a notification of %s cannot be sent: %s", subscription.id, exc)
                return 0, UNSENDABLE, None, True
        service, token, rest = one.header_lines()
        if subscription.own_token:
            token = b""
        extra = b"%s%s%s%d\r\n%s" % (service or own_service, token, rest, number, nid)
        if target is None:
            return 0, UNSENDABLE, None, True
        try:
            data = target.head(extra, len(body)) + body
            status, after = await self._client.exchange(target, data, config.timeout)
        except TransportError as exc:
            return 0, exc.reason, None, False
        return status, f"HTTP {status} answer", after, False

    async def _publish(
        self, subscription: _Subscription, one: _Entity
    ) -> tuple[int, str, float | None, bool]:
        """One publish of a notification to its subscription's MQTT broker, the outcome as
        :meth:`_attempt` gives it (:data:`PUBLISHED` once the broker has the message). A
        broker refusing the connection (its user or password) gives it up at once, as a
        topic that cannot be published to does; failing to reach the broker is retried."""
        config, mqtt, broker = subscription.config, subscription.config.mqtt, subscription.broker
        assert mqtt is not None, "an MQTT subscription"
        custom = subscription.custom
        try:
            if broker is None:
                raise ValueError("the broker's URL cannot be used")
            context = one.context()
            topic = (
                mqtt.topic if subscription.topic is None else fill_text(subscription.topic, context)
            )
            body = (
                _wrapped(subscription, one)
                if custom is None
                else custom.body(subscription, one, context)
            )
            await self._mqtt.publish(broker, topic, body, mqtt.qos, mqtt.retain, config.timeout)
        except ValueError as exc:
            _log.debug("a notification of %s cannot be published: %s", subscription.id, exc)
            return 0, UNPUBLISHABLE, None, True
        except Refused as exc:
            return 0, exc.reason, None, True
        except TransportError as exc:
            return 0, exc.reason, None, False
        return PUBLISHED, "", None, False

    def _dropped(self, subscription: _Subscription, count: int, *, failure: bool = True) -> None:
        """Count notifications dropped: for a full queue (a ``failure``, as Orion counts
        it), or queued before the subscription failed out."""
        subscription.dropped += count
        if failure:
            subscription.fails_counter += count
            subscription.last_failure = time.time()
            subscription.last_failure_reason = QUEUE_FULL
        self._report(subscription)

    def _report(self, subscription: _Subscription) -> None:
        self._changed[subscription.id] = subscription
        if not self._report_due:
            self._report_due = True
            asyncio.get_running_loop().call_later(REPORT_EVERY, self._send_report)

    def _send_report(self) -> None:
        self._report_due = False
        if self._out is None:
            return  # not reporting (any more): the counts stay for drain() to sum
        rows = []
        for s in self._changed.values():
            rows.append(
                [
                    s.id,
                    s.generation,
                    s.last_success,
                    s.last_success_code,
                    s.last_failure,
                    s.last_failure_reason,
                    s.fails_counter,
                    s.dropped,
                    s.delivered,
                    s.retries,
                    s.gave_up,
                ]
            )
            s.last_success = s.last_failure = None
            s.dropped = s.delivered = s.retries = s.gave_up = 0
        self._changed.clear()
        if rows:
            self._tell(["r", rows])

    def _tell(self, message: list[Any]) -> None:
        """Write ``message`` to the connection point, unless its pipe is gone: a write to a
        pipe whose reader died fails (EPIPE; SIGPIPE is ignored in Python) in the transport,
        which then closes itself and is left alone from there."""
        out = self._out
        if out is not None and not out.is_closing():
            out.write(msgpack.packb(message))


def _wrapped(subscription: _Subscription, one: _Entity) -> bytes:
    """The normal body of a notification: the rendered entity, wrapped in
    ``{"subscriptionId", "data"}`` unless the format is a simplified one."""
    body = _body(subscription, one)
    return _wrap(subscription, body)


def _wrap(subscription: _Subscription, body: bytes) -> bytes:
    """``body`` (the rendered entity) as the notification's body: in ``{"subscriptionId",
    "data"}`` (or NGSIv1's ``contextResponses``) unless the format is a simplified one."""
    attrs_format = subscription.config.attrs_format
    if attrs_format not in _WRAPPED:
        return body
    return b"%s%s%s" % (subscription.wrapper, body, _ENDS.get(attrs_format, b"]}"))


def _body(subscription: _Subscription, one: _Entity) -> bytes:
    """The rendered entity (the body, unless the format wraps it), rendered once per
    (entity, format, attributes chosen)."""
    config = subscription.config
    entity, change, attributes, _correlator = one.decode()
    attrs: tuple[str, ...] | None = config.attrs or None
    if config.only_changed:
        touched = change.changed | change.meta_changed
        wanted = config.attrs or [a for a in attributes if a not in config.except_attrs]
        attrs = tuple(a for a in wanted if a in touched)
    key = (
        config.attrs_format,
        attrs,
        config.except_attrs,
        config.covered and config.attrs,
        config.metadata,
    )
    data = one.bodies.get(key)
    if data is None:
        rendered = render(
            entity.id,
            entity.type,
            _prepared(attributes, change, config),
            config.attrs_format,
            attrs=attrs,
            except_attrs=config.except_attrs,
        )
        data = one.bodies[key] = json.dumps(rendered, separators=(",", ":")).encode()
    return data


def _prepared(attributes: Attributes, change: Change, config: Config) -> Attributes:
    """The attributes a subscription may notify: with the builtins it names, and those of
    ``covered`` that the entity lacks as null."""
    attributes = _with_builtins(attributes, change, config)
    if config.covered:
        attributes = {**{a: _NULL for a in config.attrs}, **attributes}
    return attributes


def _with_builtins(attributes: Attributes, change: Change, config: Config) -> Attributes:
    """The attributes as a subscription notifies them (Orion's rules): the builtin
    attributes ``dateCreated`` / ``dateModified`` / ``alterationType`` (what the update did:
    entityCreate, entityChange...) when ``notification.attrs`` names them;
    with ``notification.metadata``, only the metadata it names (``*``: every user one) and
    the builtin metadata it names (``dateCreated``, ``dateModified``, ``previousValue``,
    ``actionType``; a user metadata of the same name wins)."""
    out = attributes
    wanted = [a for a in config.attrs if a in change.attributes and a not in attributes]
    if wanted:
        out = {**attributes, **{a: change.attributes[a] for a in wanted}}
    if ALTERATION_TYPE in config.attrs and ALTERATION_TYPE not in attributes:
        alteration: dict[str, Any] = {
            "type": "Text",
            "value": change.alteration.value,
            "metadata": {},
        }
        out = {**out, ALTERATION_TYPE: alteration}
    names = config.metadata
    if not names:
        return out
    every = "*" in names
    chosen: Attributes = {}
    for name, attribute in out.items():
        own = attribute.get("metadata") or {}
        metadata = dict(own) if every else {k: v for k, v in own.items() if k in names}
        for meta, value in (change.metadata.get(name) or {}).items():
            if meta in names and meta not in own:
                metadata[meta] = value
        chosen[name] = {**attribute, "metadata": metadata}
    return chosen


def _target(config: Config) -> tuple[Target | None, bytes]:
    """Where a subscription's requests go (None if they cannot be sent), and the
    Fiware-Service line its own headers give."""
    try:
        return _request_target(config.url, config.method, config.headers)
    except ValueError as exc:
        _log.warning("notifications to %s cannot be sent: %s", config.url, exc)
        return None, b""


def _mqtt_target(config: Config) -> tuple[Broker | None, Text | None]:
    """Where an MQTT subscription publishes (None if it cannot), and its topic compiled if
    it holds a macro (mqttCustom: ``templated``); (None, None) for an HTTP one."""
    mqtt = config.mqtt
    if mqtt is None:
        return None, None
    try:
        topic = compile_text(mqtt.topic, "topic") if config.templated else None
        return Broker.parse(config.url, mqtt.user, mqtt.passwd), topic
    except (ValueError, InvalidInput) as exc:
        _log.warning("notifications to %s cannot be published: %s", config.url, exc)
        return None, None


def _request_target(
    url: str, method: str, headers: tuple[tuple[str, str], ...]
) -> tuple[Target, bytes]:
    """The target of a request with these headers (ValueError if it cannot be sent), and
    the Fiware-Service line they give (sent for entities of the default tenant). A header
    with an empty value is not sent (Orion's way to take a header out); those the worker
    sets itself are left out."""
    own = [(k, v) for k, v in headers if v and k.lower() not in _OWN_HEADERS]
    service = [v for k, v in own if k.lower() == "fiware-service"]
    chosen = tuple((k, v) for k, v in own if k.lower() != "fiware-service")
    target = Target.parse(url, method, chosen)
    line = b"Fiware-Service: %s\r\n" % service[-1].encode() if service else b""
    return target, line


@dataclass(frozen=True, slots=True)
class _Custom:
    """A subscription's httpCustom templates, compiled once per version of it: the URL,
    ``qs`` and headers when one of them holds a macro (``url`` None: the subscription's
    target is fixed), and the body's (``kind`` "" for the normal body)."""

    url: Text | None
    qs: tuple[tuple[str, Text], ...]
    headers: tuple[tuple[str, Text], ...]
    kind: str
    payload: Text | None = None  # None with kind "payload": no body at all
    json: Json | None = None
    ngsi: NgsiPatch | None = None

    @classmethod
    def compile(cls, config: Config) -> _Custom | None:
        """The templates of ``config``; None if it has none (a plain subscription, sent as
        before). A template the front took always compiles; one that does not (a config
        from another release) is logged and its subscription sent without templates."""
        if not config.templated and config.body is None:
            return None
        try:
            return cls._compiled(config)
        except InvalidInput as exc:
            _log.warning("the templates of a subscription to %s are ignored: %s", config.url, exc)
            return None

    @classmethod
    def _compiled(cls, config: Config) -> _Custom:
        url: Text | None = None
        qs: tuple[tuple[str, Text], ...] = ()
        headers: tuple[tuple[str, Text], ...] = ()
        if config.templated and config.mqtt is None:
            url = compile_text(config.url, "url")
            qs = tuple((k, compile_text(v, k)) for k, v in config.qs)
            headers = tuple((k, compile_text(v, k)) for k, v in config.headers)
        if config.body is None:
            return cls(url, qs, headers, "")
        kind, source = config.body
        if kind == "payload":
            text = None if source is None else compile_text(source, "payload")
            return cls(url, qs, headers, kind, payload=text)
        if kind == "json":
            return cls(url, qs, headers, kind, json=compile_json(source, "json"))
        return cls(url, qs, headers, "ngsi", ngsi=compile_ngsi(source, "ngsi"))

    def render(self, subscription: _Subscription, one: _Entity) -> tuple[Target, bytes, bytes]:
        """The target, the Fiware-Service line of its own headers and the body of one
        notification of ``one`` (ValueError if the filled URL or a header cannot be sent)."""
        context = one.context()
        if self.url is None:
            target, service = subscription.target, subscription.service
            if target is None:
                raise ValueError("the URL or a header cannot be sent")
        else:
            url = fill_text(self.url, context)
            if self.qs:
                pairs = [(k, fill_text(v, context)) for k, v in self.qs]
                url += ("&" if "?" in url else "?") + urlencode(pairs)
            headers = tuple((k, fill_text(v, context)) for k, v in self.headers)
            target, service = _request_target(url, subscription.config.method, headers)
        return target, service, self.body(subscription, one, context)

    def body(self, subscription: _Subscription, one: _Entity, context: Context) -> bytes:
        """The body of one notification of ``one``."""
        kind = self.kind
        if kind == "payload":
            return b"" if self.payload is None else fill_text(self.payload, context).encode()
        if kind == "json":
            assert self.json is not None, "a json template"
            return _dumps(fill_json(self.json, context))
        if kind == "ngsi":
            assert self.ngsi is not None, "an ngsi template"
            body = _patched(subscription.config, one, self.ngsi, context)
        else:
            body = _body(subscription, one)
        return _wrap(subscription, body)


def _dumps(value: Any) -> bytes:
    """Compact JSON, UTF-8."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def _patched(config: Config, one: _Entity, patch: NgsiPatch, context: Context) -> bytes:
    """The entity of an ``ngsi`` notification (unwrapped): the notified entity as the
    subscription chooses its attributes, then the template's id, type and attributes
    over it (those it names are always sent), in the subscription's format."""
    entity, change, attributes, _correlator = one.decode()
    attrs: tuple[str, ...] | None = config.attrs or None
    if config.only_changed:
        touched = change.changed | change.meta_changed
        wanted = config.attrs or [a for a in attributes if a not in config.except_attrs]
        attrs = tuple(a for a in wanted if a in touched)
    chosen = render(
        entity.id,
        entity.type,
        _prepared(attributes, change, config),
        AttrsFormat.NORMALIZED,
        attrs=attrs,
        except_attrs=config.except_attrs,
    )
    entity_id, entity_type, added = fill_ngsi(patch, context)
    merged = {k: v for k, v in chosen.items() if k not in ("id", "type")}
    merged.update(added)
    rendered = render(
        entity_id if entity_id is not None else entity.id,
        entity_type if entity_type is not None else entity.type,
        merged,
        config.attrs_format,
    )
    return _dumps(rendered)


def main(argv: list[str] | None = None) -> None:
    """Run the worker on stdin and stdout (the connection point starts it)."""
    parser = argparse.ArgumentParser(prog="silbo notification worker")
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--per-origin", type=int, required=True)
    parser.add_argument("--queue-limit", type=int, required=True)
    parser.add_argument("--total-limit", type=int, required=True)
    parser.add_argument("--retry-window", type=float, default=DEFAULT_WINDOW)
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s delivery %(message)s")
    worker = Worker(
        args.concurrency, args.per_origin, args.queue_limit, args.total_limit, args.retry_window
    )
    asyncio.run(worker.run())
