"""The delivery worker: a process of its own that renders and sends HTTP notifications.

The connection point's event loop only decides which subscriptions fire; this process,
started by :class:`broker.ngsi.notifier.Notifier` (:func:`main`),
does the rest, so sending takes neither the connection point's loop nor its GIL. They talk
over the worker's stdin and stdout in msgpack arrays:

- in: ``["s", id, generation, reset, config]`` a subscription created or changed
  (:class:`Config`; ``reset``: its failsCounter back to 0), ``["f", id]`` one deleted,
  ``["n", entities, ids, indexes]`` a batch of notifications: the published entities'
  bytes, and for each notification the subscription's id and its entity's index;
- out: ``["r", [[id, generation, last_success, code, last_failure, reason, fails_counter,
  dropped], ...]]`` what happened to subscriptions since the last report (times are None
  if nothing new; ``dropped`` is a count since the last report).

A waiting notification is its entity's bytes and a number: the entity is decoded and the
body rendered only when one of its notifications is sent (a dropped one costs neither), once
per (entity, format, attributes chosen), its JSON bytes shared by every subscription that
wants the same. What waits is bounded in a :class:`Backlog`: per subscription and in all;
while it is full in all, the worker reads no more, so what follows waits in the pipe, and
the connection point drops new notifications once too much waits there: an overloaded
worker spends its time sending, not taking notifications in only to drop them. The worker
ends when its stdin closes.
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

import aiohttp
import msgpack
from yarl import URL

from broker.model.subscription import AttrsFormat
from broker.ngsi.change import Change, read_change
from broker.ngsi.entity import Attributes, from_wire, render
from broker.wire import client_pb2 as pb

__all__ = ["Backlog", "Config", "main"]

_log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")

REPORT_EVERY = 0.01  # seconds between status reports to the connection point
READ_SIZE = 1 << 16  # bytes read from the pipe at a time
FULL_WAIT = 0.005  # seconds between looks at a full backlog before reading more
_NULL: dict[str, Any] = {"type": "None", "value": None, "metadata": {}}
_WRAPPED = frozenset(f for f in AttrsFormat if not f.value.startswith("simplified"))


class Backlog(Generic[K, T]):
    """Queues by key, bounded per key (``per_key``: a new item beyond is refused) and in all
    (``total``: the oldest item of the longest queue is dropped to make room)."""

    def __init__(self, per_key: int, total: int) -> None:
        self.per_key = per_key
        self.total = total
        self.size = 0
        self._queues: dict[K, deque[T]] = {}
        self._by_length: dict[int, set[K]] = {}  # keys by their queue's length (above 0)
        self._longest = 0

    def __len__(self) -> int:
        return self.size

    def length(self, key: K) -> int:
        """How many items ``key`` has queued."""
        queue = self._queues.get(key)
        return len(queue) if queue is not None else 0

    def push(self, key: K, item: T) -> tuple[bool, K | None]:
        """Queue ``item``: (False if ``key``'s queue is full, the key whose oldest item was
        dropped for room, if one was)."""
        if self.length(key) >= self.per_key:
            return False, None
        evicted = None
        if self.size >= self.total:
            evicted = next(iter(self._by_length[self._longest]))
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
        if not queue:
            del self._queues[key]
        return item

    def clear(self, key: K) -> int:
        """Drop everything ``key`` has queued; how many items."""
        queue = self._queues.pop(key, None)
        if not queue:
            return 0
        self._moved(key, len(queue), 0)
        self.size -= len(queue)
        return len(queue)

    def _moved(self, key: K, old: int, new: int) -> None:
        if old:
            keys = self._by_length[old]
            keys.discard(key)
            if not keys:
                del self._by_length[old]
        if new:
            self._by_length.setdefault(new, set()).add(key)
            self._longest = max(self._longest, new)
        while self._longest and self._longest not in self._by_length:
            self._longest -= 1


@dataclass(frozen=True, slots=True)
class Config:
    """How one subscription's notifications are rendered and sent (``headers``: those of
    every notification; the service, service path and correlator are added per request)."""

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
        ]

    @classmethod
    def from_list(cls, data: list[Any]) -> Config:
        """The config from the pipe."""
        url, method, headers, timeout, attrs_format, attrs, except_attrs, *rest = data
        only_changed, covered, limit = rest
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
        )


@dataclass(eq=False, slots=True)
class _Subscription:
    """What the worker keeps of one subscription."""

    id: str
    config: Config
    generation: int
    url: URL
    timeout: aiohttp.ClientTimeout
    fails_counter: int = 0
    last_success: float | None = None  # these four: since the last report
    last_success_code: int = 0
    last_failure: float | None = None
    last_failure_reason: str = ""
    dropped: int = 0  # since the last report
    sending: bool = False

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

    def decode(self) -> tuple[pb.Entity, Change, Attributes, str]:
        """The entity, its change, its attributes and its correlator."""
        if self.decoded is None:
            entity = pb.Entity.FromString(self.data)
            change = read_change(self.data, entity)
            correlator = change.correlator or str(uuid.uuid1())
            self.decoded = (entity, change, from_wire(entity), correlator)
        return self.decoded


@dataclass(frozen=True, slots=True)
class _Notification:
    """One notification waiting: its entity and its number (Orion's cbnotif)."""

    entity: _Entity
    number: int


class Worker:
    """The delivery worker (see the module doc)."""

    def __init__(self, concurrency: int, queue_limit: int, total_limit: int) -> None:
        self._concurrency = concurrency
        self._limit = asyncio.Semaphore(concurrency)
        self._backlog: Backlog[_Subscription, _Notification] = Backlog(queue_limit, total_limit)
        self._subscriptions: dict[str, _Subscription] = {}
        self._changed: dict[str, _Subscription] = {}  # to report
        self._tasks: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None
        self._out: asyncio.WriteTransport | None = None
        self._report_due = False

    async def run(self) -> None:
        """Serve stdin until it closes."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 24)
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin.buffer)
        self._out, _protocol = await loop.connect_write_pipe(asyncio.Protocol, sys.stdout.buffer)
        connector = aiohttp.TCPConnector(limit=self._concurrency, limit_per_host=0)
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)
        unpacker = msgpack.Unpacker(raw=False, max_buffer_size=1 << 30)
        try:
            while chunk := await reader.read(READ_SIZE):
                unpacker.feed(chunk)
                for message in unpacker:
                    self.handle(message)
                while len(self._backlog) >= self._backlog.total:
                    await asyncio.sleep(FULL_WAIT)  # what follows waits in the pipe
        finally:
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)
            await self._session.close()

    def handle(self, message: list[Any]) -> None:
        """Act on one message from the connection point."""
        kind = message[0]
        if kind == "n":
            self._notify(message[1], message[2], message[3])
        elif kind == "s":
            _kind, sid, generation, reset, data = message
            config = Config.from_list(data)
            url, timeout = URL(config.url), aiohttp.ClientTimeout(total=config.timeout)
            subscription = self._subscriptions.get(sid)
            if subscription is None:
                self._subscriptions[sid] = _Subscription(sid, config, generation, url, timeout)
            else:
                subscription.config, subscription.generation = config, generation
                subscription.url, subscription.timeout = url, timeout
                if reset:
                    subscription.fails_counter = 0
        elif kind == "f":
            gone = self._subscriptions.pop(message[1], None)
            if gone is not None:
                self._backlog.clear(gone)
                self._changed.pop(gone.id, None)

    def _notify(self, entities: list[bytes], ids: list[str], indexes: list[int]) -> None:
        batch = [_Entity(data) for data in entities]
        for sid, index in zip(ids, indexes, strict=True):
            subscription = self._subscriptions.get(sid)
            if subscription is None:
                continue
            one = batch[index]
            one.sent += 1
            notification = _Notification(one, one.sent)
            accepted, evicted = self._backlog.push(subscription, notification)
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
        try:
            while (notification := self._backlog.pop(subscription)) is not None:
                if subscription.failed_out():
                    # what was queued before it went inactive is not sent
                    self._dropped(subscription, self._backlog.clear(subscription) + 1)
                    break
                async with self._limit:
                    await self._post(subscription, notification)
        finally:
            subscription.sending = False

    async def _post(self, subscription: _Subscription, notification: _Notification) -> None:
        assert self._session is not None, "the worker has not started"
        config = subscription.config
        entity, _change, _attributes, correlator = notification.entity.decode()
        body = _body(subscription, notification.entity)
        if config.attrs_format in _WRAPPED:
            body = b'{"subscriptionId":"%s","data":[%s]}' % (subscription.id.encode(), body)
        headers = dict(config.headers)
        headers["Fiware-ServicePath"] = entity.service_path
        headers["Fiware-Correlator"] = f"{correlator}; cbnotif={notification.number}"
        if entity.tenant:
            headers["Fiware-Service"] = entity.tenant
        try:
            async with self._session.request(
                config.method,
                subscription.url,
                data=body,
                headers=headers,
                timeout=subscription.timeout,
                allow_redirects=False,
            ) as response:
                await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            subscription.last_failure = time.time()
            subscription.last_failure_reason = _reason(exc)
            subscription.fails_counter += 1
        else:
            subscription.last_success = time.time()
            subscription.last_success_code = status
            subscription.fails_counter = 0
        self._report(subscription)

    def _dropped(self, subscription: _Subscription, count: int) -> None:
        subscription.dropped += count
        self._report(subscription)

    def _report(self, subscription: _Subscription) -> None:
        self._changed[subscription.id] = subscription
        if not self._report_due:
            self._report_due = True
            asyncio.get_running_loop().call_later(REPORT_EVERY, self._send_report)

    def _send_report(self) -> None:
        self._report_due = False
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
                ]
            )
            s.last_success = s.last_failure = None
            s.dropped = 0
        self._changed.clear()
        if rows and self._out is not None and not self._out.is_closing():
            self._out.write(msgpack.packb(["r", rows]))


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
    key = (config.attrs_format, attrs, config.except_attrs, config.covered and config.attrs)
    data = one.bodies.get(key)
    if data is None:
        if config.covered:
            attributes = {**{a: _NULL for a in config.attrs}, **attributes}
        rendered = render(
            entity.id,
            entity.type,
            attributes,
            config.attrs_format,
            attrs=attrs,
            except_attrs=config.except_attrs,
        )
        data = one.bodies[key] = json.dumps(rendered, separators=(",", ":")).encode()
    return data


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
        return "Timeout was reached"
    if isinstance(exc, aiohttp.ClientConnectorError | ConnectionError):
        return "Couldn't connect to server"
    return f"notification failed: {exc.__class__.__name__}"


def main(argv: list[str] | None = None) -> None:
    """Run the worker on stdin and stdout (the connection point starts it)."""
    parser = argparse.ArgumentParser(prog="silbo notification worker")
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--queue-limit", type=int, required=True)
    parser.add_argument("--total-limit", type=int, required=True)
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s delivery %(message)s")
    worker = Worker(args.concurrency, args.queue_limit, args.total_limit)
    asyncio.run(worker.run())
