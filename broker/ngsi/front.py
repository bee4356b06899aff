"""The NGSI v2 HTTP front of a connection point: its server, publisher and subscriptions.

The front runs in the connection point's event loop and reaches the cluster only through a
:class:`BrokerPort` the connection point gives it: updates are published like a gRPC
publisher's (one publisher per front, ``<member>/http``, so they keep their order), and
subscriptions are placed through one internal session of the connection point, matched by
the matchers like any other; the port hands the session's notification batches to
:meth:`NgsiFront.notify`, which decides (alteration type, condition attributes, status,
throttling, status bookkeeping) and hands what fires to the
:class:`~broker.ngsi.notifier.Notifier`, whose worker process renders and sends the requests.

Concurrent requests are published in batches: each handler queues its entities and waits
for the batch that carries them to be accepted (:class:`_Publisher`).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol
from urllib.parse import urlencode

from aiohttp import web

from broker.errors import NotFound, SilboError
from broker.ngsi.allow import AllowList
from broker.ngsi.cache import DEFAULT_LIMIT, LastValues, Outcome
from broker.ngsi.change import with_change
from broker.ngsi.delivery import Config
from broker.ngsi.entity import to_wire
from broker.ngsi.firing import Firing
from broker.ngsi.notifier import (
    DEFAULT_CONCURRENCY,
    DEFAULT_PER_ORIGIN,
    DEFAULT_QUEUE_LIMIT,
    DEFAULT_TOTAL_LIMIT,
    Notifier,
)
from broker.ngsi.request import MAX_BODY, checks
from broker.ngsi.subscriptions import HttpSubscription, Parsed
from broker.runtime.options import parse_address
from broker.wire import client_pb2 as pb
from broker.wire import internal_pb2 as wire

__all__ = ["ORION_VERSION", "BrokerPort", "FrontOptions", "NgsiFront", "delivery_config"]

_log = logging.getLogger(__name__)

ORION_VERSION = "3.12.0"  # the Orion release whose API the front follows (clients check it)
MAX_PUBLISH_BATCH = 1_000


class BrokerPort(Protocol):
    """What the front uses of its connection point."""

    @property
    def name(self) -> str:
        """The connection point's member name."""

    async def publish(self, entities: Sequence[pb.Entity], publisher: str, first: int) -> None:
        """Publish a batch (entity i has sequence ``first + i``); SilboError if refused."""

    async def subscribe(self, specs: Sequence[pb.SubscriptionSpec], *, replace: bool) -> list[int]:
        """Place subscriptions with their matchers; their handles, in order."""

    async def unsubscribe(self, ids: Sequence[str]) -> None:
        """Remove subscriptions from their matchers."""


@dataclass(frozen=True, slots=True)
class FrontOptions:
    """How the front serves: its address, the allow-list and its bounds."""

    listen: str
    allow: AllowList = field(default_factory=AllowList.parse)
    cache_limit: int = DEFAULT_LIMIT
    concurrency: int = DEFAULT_CONCURRENCY
    per_origin: int = DEFAULT_PER_ORIGIN
    queue_limit: int = DEFAULT_QUEUE_LIMIT
    total_limit: int = DEFAULT_TOTAL_LIMIT


class AddressTaken(SilboError):
    """The HTTP front's address is in use or not this host's."""


class NgsiFront:
    """The HTTP front (see the module doc)."""

    def __init__(self, port: BrokerPort, options: FrontOptions) -> None:
        self.port = port
        self.options = options
        self.allow = options.allow
        self.cache = LastValues(options.cache_limit)
        self.subscriptions: dict[str, HttpSubscription] = {}  # id -> subscription
        self._by_handle: dict[int, HttpSubscription] = {}
        self._firing = Firing(self._by_handle)
        self.notifier = Notifier(
            concurrency=options.concurrency,
            per_origin=options.per_origin,
            queue_limit=options.queue_limit,
            total_limit=options.total_limit,
        )
        self._publisher = _Publisher(port)
        self._runner: web.AppRunner | None = None
        self.address = ""

    async def start(self) -> str:
        """Serve HTTP; the address bound (AddressTaken if it cannot)."""
        from broker.ngsi.routes import add_routes  # routes import this module

        host, port = parse_address(self.options.listen, "--http-listen")
        app = web.Application(middlewares=[checks], client_max_size=MAX_BODY + 1)
        add_routes(app, self)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        site = web.TCPSite(self._runner, host, port, reuse_address=False)
        try:
            await site.start()
        except OSError as exc:
            await self._runner.cleanup()
            raise AddressTaken(
                f"cannot serve HTTP on {self.options.listen}: {exc.strerror or exc} (pick "
                "another with --http-listen HOST:PORT, or port 0 for any)"
            ) from exc
        await self.notifier.start()
        self._publisher.start()
        addresses = self._runner.addresses
        self.address = f"{host}:{addresses[0][1] if addresses else port}"
        _log.info("NGSI v2 HTTP front serving on %s", self.address)
        return self.address

    async def stop(self) -> None:
        """Stop serving, drop queued notifications."""
        if self._runner is not None:
            await self._runner.cleanup()
        await self._publisher.stop()
        await self.notifier.stop()

    # -- updates ----------------------------------------------------------------------------

    async def publish(self, outcomes: Sequence[Outcome]) -> None:
        """Publish the whole entities of applied operations (in the order given)."""
        entities = []
        for outcome in outcomes:
            tenant, path, entity_id, entity_type = outcome.key
            entity = to_wire(entity_id, entity_type, tenant, path, outcome.attributes)
            entities.append(with_change(entity, outcome.change))
        await self._publisher.publish(entities)

    # -- subscriptions ----------------------------------------------------------------------

    def get(self, tenant: str, subscription_id: str) -> HttpSubscription:
        """A subscription of ``tenant`` (NotFound otherwise, also for another tenant's)."""
        found = self.subscriptions.get(subscription_id)
        if found is None or found.tenant != tenant:
            raise NotFound("The requested subscription has not been found. Check id")
        return found

    async def create(self, tenant: str, scope: str, parsed: Parsed) -> HttpSubscription:
        """Place a new subscription with the matchers and keep it."""
        subscription = HttpSubscription(uuid.uuid4().hex[:24], tenant, scope, parsed)
        [handle] = await self.port.subscribe([subscription.spec()], replace=False)
        subscription.handle = handle
        self.subscriptions[subscription.id] = subscription
        self._by_handle[handle] = subscription
        self.notifier.configure(subscription, delivery_config(parsed), reset=False)
        self._firing.invalidate()
        return subscription

    async def update(
        self, subscription: HttpSubscription, parsed: Parsed, fields: set[str]
    ) -> None:
        """Apply a validated PATCH (the matchers' copy replaced when theirs changed)."""
        old = subscription.parsed
        subscription.parsed = parsed
        if "status" in fields:
            subscription.status = parsed.status
            subscription.fails_counter = 0
        self.notifier.configure(subscription, delivery_config(parsed), reset="status" in fields)
        self._firing.invalidate()
        matchers_see = (old.selectors, old.q, old.mq, old.expires)
        if matchers_see != (parsed.selectors, parsed.q, parsed.mq, parsed.expires):
            [handle] = await self.port.subscribe([subscription.spec()], replace=True)
            self._by_handle.pop(subscription.handle, None)
            subscription.handle = handle
            self._by_handle[handle] = subscription
            self._firing.invalidate()

    async def delete(self, subscription: HttpSubscription) -> None:
        """Remove a subscription from the matchers and from this front."""
        await self.port.unsubscribe([subscription.id])
        self.subscriptions.pop(subscription.id, None)
        self._by_handle.pop(subscription.handle, None)
        self.notifier.forget(subscription)
        self._firing.invalidate()

    # -- notifications ----------------------------------------------------------------------

    def notify(self, batch: wire.NotificationBatchOut) -> None:
        """Decide which subscriptions a batch the matchers matched notifies
        (:class:`~broker.ngsi.firing.Firing`), and hand those to the notifier (never
        blocks)."""
        fired = self._firing.decide(batch, time.time())
        if fired is None:
            return
        if not self.notifier.send(fired.entities, fired.numbers, fired.indexes):
            for subscription, count in fired.counts:
                subscription.dropped += count


def delivery_config(parsed: Parsed) -> Config:
    """How the delivery worker renders and sends a subscription's notifications."""
    channel = parsed.channel
    headers = dict(channel.headers)
    headers.update(
        {
            "Content-Type": "application/json; charset=utf-8",
            "Accept": "application/json",
            "User-Agent": f"orion/{ORION_VERSION} silbo",
            "Ngsiv2-AttrsFormat": parsed.attrs_format.value,
        }
    )
    url = channel.url
    if channel.qs:
        url += ("&" if "?" in url else "?") + urlencode(channel.qs)
    return Config(
        url,
        channel.method,
        tuple(headers.items()),
        channel.timeout,
        parsed.attrs_format,
        parsed.attrs,
        parsed.except_attrs,
        parsed.only_changed,
        parsed.covered,
        parsed.max_fails_limit,
    )


class _Publisher:
    """Publishes what concurrent requests queue, in batches, in the order queued."""

    def __init__(self, port: BrokerPort) -> None:
        self._port = port
        self._queue: asyncio.Queue[tuple[list[pb.Entity], asyncio.Future[None]]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._sequence = 1
        self._name = ""

    def start(self) -> None:
        self._name = f"{self._port.name}/http"
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def publish(self, entities: list[pb.Entity]) -> None:
        """Return once the batch carrying ``entities`` is accepted (its error otherwise)."""
        if not entities:
            return
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._queue.put_nowait((entities, done))
        await done

    async def _run(self) -> None:
        while True:
            waiting = [await self._queue.get()]
            count = len(waiting[0][0])
            while count < MAX_PUBLISH_BATCH and not self._queue.empty():
                waiting.append(self._queue.get_nowait())
                count += len(waiting[-1][0])
            entities = [e for batch, _done in waiting for e in batch]
            first = self._sequence
            self._sequence += len(entities)
            try:
                await self._port.publish(entities, self._name, first)
            except Exception as exc:
                for _batch, done in waiting:
                    if not done.done():
                        done.set_exception(exc)
                continue
            for _batch, done in waiting:
                if not done.done():
                    done.set_result(None)
