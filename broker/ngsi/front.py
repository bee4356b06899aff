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
import contextlib
import logging
import re
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol
from urllib.parse import urlencode

from aiohttp import web
from aiohttp.typedefs import Middleware

from broker.addresses import parse_address
from broker.coordination.aggregations import AggregationStore
from broker.coordination.alerts import AlertStore
from broker.coordination.http_subscriptions import Registry, Stored, heir
from broker.errors import AddressInUse, NotFound, SilboError, Unavailable
from broker.ngsi.allow import AllowList
from broker.ngsi.change import builtins_of, with_change
from broker.ngsi.cors import DEFAULT_MAX_AGE, cors
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
from broker.ngsi.registrations import Registrations, RegistrationStore
from broker.ngsi.request import BODY_TIMEOUT, MAX_BODY, READ_TIMEOUT, checks
from broker.ngsi.retry import DEFAULT_WINDOW
from broker.ngsi.subscriptions import HttpSubscription, Parsed, parse_document
from broker.store.client import EntityStore, LocalEntities
from broker.store.semantics import Applied
from broker.wire import client_pb2 as pb
from broker.wire import internal_pb2 as wire

__all__ = [
    "ORION_VERSION",
    "BrokerPort",
    "FrontOptions",
    "NgsiFront",
    "OnFronts",
    "OpenAggregations",
    "OpenRegistrations",
    "OpenRegistry",
    "application",
    "delivery_config",
]

_log = logging.getLogger(__name__)

_NOT_FOUND = "The requested subscription has not been found. Check id"
_ID = re.compile("[0-9a-f]{24}")  # what create() makes
_WILDCARDS = frozenset({"", "0.0.0.0", "::", "[::]"})
FLUSH_TICK = 1.0  # seconds between looks for statuses to save
RESCAN = 15.0  # seconds between looks for orphans when no front came or went
ADOPT_BATCH = 500  # orphans claimed and placed with the matchers at a time
ORION_VERSION = "3.12.0"  # the Orion release whose API the front follows (clients check it)
MAX_PUBLISH_BATCH = 1_000
MAX_HEAD_LINE = 1 << 20  # bytes of a request line or header line (aiohttp: 8 KiB)
_JSON = "application/json; charset=utf-8"
_CONTENT_TYPES = {"payload": "text/plain; charset=utf-8"}  # by httpCustom's body (JSON else)
DEFAULT_STATUS_FLUSH = 10.0


OnFronts = Callable[[dict[str, str], bool], None]
# a front's registry (broker.coordination.http_subscriptions): given the front's HTTP address
# and what to call when the fronts change
OpenRegistry = Callable[[str, OnFronts], Registry]
# where the registrations are kept (broker.coordination.registrations.RegistrationStore)
OpenRegistrations = Callable[[], RegistrationStore]
# where the aggregation groups are defined (broker.coordination.aggregations)
OpenAggregations = Callable[[], AggregationStore]
# where the alert rules are defined (broker.coordination.alerts)
OpenAlerts = Callable[[], AlertStore]
# what puts the API's routes on the front's application (broker.ngsi.routes.add_routes)
AddRoutes = Callable[[web.Application, "NgsiFront"], None]


class BrokerPort(Protocol):
    """What the front uses of its connection point."""

    @property
    def name(self) -> str:
        """The connection point's member name."""

    async def publish(
        self, entities: Sequence[pb.Entity], publisher: str, first: int
    ) -> Awaitable[int]:
        """Send a batch on (entity i has sequence ``first + i``); SilboError if refused. The
        awaitable returned completes once the batch is delivered (SilboError if never)."""

    async def subscribe(
        self,
        specs: Sequence[pb.SubscriptionSpec],
        *,
        replace: bool,
        placed: Callable[[list[int]], None] | None = None,
        adopt: bool = False,
    ) -> list[int]:
        """Place subscriptions with their matchers; their handles, in order. ``placed`` is
        told the handles before the matchers get them: a notification under a handle can
        then arrive before the acknowledgement (they travel different ways). ``adopt``: they
        are a dead front's, whose deliveries that never reached it are replayed first."""

    async def unsubscribe(self, ids: Sequence[str]) -> None:
        """Remove subscriptions from their matchers."""


@dataclass(frozen=True, slots=True)
class FrontOptions:
    """How the front serves: its address, the allow-list and its bounds."""

    listen: str
    allow: AllowList = field(default_factory=AllowList.parse)
    advertise: str = ""  # the host other fronts reach this one at, when listening on any
    status_flush: float = DEFAULT_STATUS_FLUSH  # seconds between saves of changed counters
    read_timeout: float = BODY_TIMEOUT  # seconds a client may take over a request head or body
    concurrency: int = DEFAULT_CONCURRENCY
    per_origin: int = DEFAULT_PER_ORIGIN
    queue_limit: int = DEFAULT_QUEUE_LIMIT
    total_limit: int = DEFAULT_TOTAL_LIMIT
    retry_window: float = DEFAULT_WINDOW  # seconds a notification is retried for, by default
    count: Callable[[str, int], None] | None = None  # told notifications' outcomes (metrics)
    cors_origin: str = ""  # the origin CORS allows ("__ALL": any; "": CORS off)
    cors_max_age: int = DEFAULT_MAX_AGE  # seconds a browser may keep a preflight's answer


class NgsiFront:
    """The HTTP front (see the module doc)."""

    def __init__(
        self,
        port: BrokerPort,
        options: FrontOptions,
        registry: OpenRegistry,
        entities: EntityStore | None = None,
        registrations: OpenRegistrations | None = None,
        aggregations: OpenAggregations | None = None,
        alerts: OpenAlerts | None = None,
    ) -> None:
        self.port = port
        self.options = options
        self.allow = options.allow
        self.entities: EntityStore = entities if entities is not None else LocalEntities()
        self.subscriptions: dict[str, HttpSubscription] = {}  # id -> subscription
        self._by_handle: dict[int, HttpSubscription] = {}
        self._firing = Firing(self._by_handle)
        self.notifier = Notifier(
            concurrency=options.concurrency,
            per_origin=options.per_origin,
            queue_limit=options.queue_limit,
            total_limit=options.total_limit,
            retry_window=options.retry_window,
            count=options.count,
        )
        self._publisher = _Publisher(port)
        self._runner: web.AppRunner | None = None
        self.address = ""
        self._open_registry = registry
        self._open_registrations = registrations
        # the aggregation groups' definitions (None: not served, without ZooKeeper)
        self.aggregations = aggregations() if aggregations is not None else None
        # the alert rules (None: not served, without ZooKeeper)
        self.alerts = alerts() if alerts is not None else None
        # the context providers (broker.ngsi.registrations); None: registrations not served
        self.registrations: Registrations | None = None
        self._kept: Registry | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._rescan = asyncio.Event()  # the fronts changed: look for orphans
        self._scanned = 0.0  # when orphans were last looked for (time.monotonic())
        self._reclaim = False  # a new ZooKeeper session: claim what this front holds again
        self._adopting = asyncio.Lock()  # adoption and hand-over never interleave
        self._leaving = False  # handed over: the staying fronts own what it held

    async def start(self, add_routes: AddRoutes) -> str:
        """Serve HTTP with the routes ``add_routes`` adds (broker.ngsi.routes.add_routes: the
        routes import this module, never the other way); the address bound (AddressInUse if
        it cannot). The front joins the other fronts (ZooKeeper) between binding and serving:
        a request it answers can always keep a subscription."""
        host, port = parse_address(self.options.listen, "--http-listen")
        sock = _bind(host, port, self.options.listen)
        app = application(self.options)
        add_routes(app, self)
        # keepalive_timeout also bounds the wait for a request's head (a connection that
        # never completes one is closed), not only the idle time between requests; a long
        # request line or header reaches the routes (answered with NGSI's error JSON), up to
        # MAX_HEAD_LINE bytes, not aiohttp's 8 KiB (a plain-text 400)
        self._runner = web.AppRunner(
            app,
            access_log=None,
            handle_signals=False,
            keepalive_timeout=self.options.read_timeout,
            max_line_size=MAX_HEAD_LINE,
            max_field_size=MAX_HEAD_LINE,
        )
        await self._runner.setup()
        bound = sock.getsockname()[1]
        self.address = f"{host}:{bound}"
        advertised = (self.options.advertise or host) if host in _WILDCARDS else host
        try:
            self._kept = self._open_registry(f"{advertised}:{bound}", self._fronts_changed)
            await self._kept.join()
            if self._open_registrations is not None:
                self.registrations = Registrations(self._open_registrations(), self.allow)
                await self.registrations.start()
            await self.notifier.start()
            self._publisher.start()
            await web.SockSite(self._runner, sock).start()
        except BaseException:
            sock.close()
            if self.registrations is not None:
                await self.registrations.stop()
            await self._runner.cleanup()
            raise
        self._keeper = asyncio.get_running_loop().create_task(self._keep_up())
        _log.info("NGSI v2 HTTP front serving on %s", self.address)
        return self.address

    async def stop(self) -> None:
        """Stop serving; save every status and give the subscriptions up to the other
        fronts (unless handed over already); drop queued notifications."""
        if self._runner is not None:
            await self._runner.cleanup()
        if self._keeper is not None:
            self._keeper.cancel()
            await asyncio.gather(self._keeper, return_exceptions=True)
        if self._kept is not None and not self._leaving:
            try:
                await self.save_statuses(whole=True)
                self._leaving = True
                await self._kept.leave()
                await self._kept.release(list(self.subscriptions))
            except SilboError as exc:
                _log.warning("the HTTP subscriptions were not given up cleanly: %s", exc)
        if self.registrations is not None:
            await self.registrations.stop()
        await self._publisher.stop()
        await self.notifier.stop()
        await self.entities.close()

    def _registry(self) -> Registry:
        assert self._kept is not None, "the front has not started"
        return self._kept

    # -- updates ----------------------------------------------------------------------------

    async def publish(self, applied: Sequence[Applied], auth_token: str = "") -> None:
        """Publish the whole entities of applied writes (in the order given; those that
        changed nothing at all, having failed, are left out). ``auth_token``: the X-Auth-Token
        of the request that made them, carried with each entity's change (it is per update,
        as the correlator is) for the notifications they cause."""
        entities = []
        for one in applied:
            document = one.document if one.document is not None else one.before
            if one.change is None or document is None:
                continue
            entity = to_wire(
                document.id, document.type, document.tenant, document.service_path,
                document.attributes,
            )  # fmt: skip
            entities.append(with_change(entity, one.change, builtins_of(one), auth_token))
        await self._publisher.publish(entities)

    # -- subscriptions ----------------------------------------------------------------------

    async def find(self, tenant: str, subscription_id: str) -> HttpSubscription | str:
        """A subscription of ``tenant``: held here, or the HTTP address of the front that
        holds it; one that no front holds is adopted here. NotFound otherwise (also for
        another tenant's held here)."""
        found = self.subscriptions.get(subscription_id)
        if found is not None:
            return self._of_tenant(found, tenant)
        if not _ID.fullmatch(subscription_id):
            raise NotFound(_NOT_FOUND)  # none was ever made: ids are 24 hexadecimal digits
        registry = self._registry()
        owner = await registry.owner(subscription_id)
        if owner is None or owner == self.port.name:
            if not await registry.exists(subscription_id):
                raise NotFound(_NOT_FOUND)
            if not self._leaving:
                await self._adopt([subscription_id])
            found = self.subscriptions.get(subscription_id)
            if found is not None:
                return self._of_tenant(found, tenant)
            owner = await registry.owner(subscription_id)
            if owner is None or owner == self.port.name:
                if not await registry.exists(subscription_id):
                    raise NotFound(_NOT_FOUND)  # deleted meanwhile
                raise Unavailable(
                    f"subscription {subscription_id} is being taken over by another "
                    "connection point; try again"
                )
        address = registry.fronts.get(owner)
        if not address:
            raise Unavailable(
                f"subscription {subscription_id} is held by connection point {owner}, whose "
                "HTTP front is not known here yet; try again"
            )
        return address

    @staticmethod
    def _of_tenant(subscription: HttpSubscription, tenant: str) -> HttpSubscription:
        if subscription.tenant != tenant:
            raise NotFound(_NOT_FOUND)
        return subscription

    def listed(self, tenant: str, scope: str | None) -> list[HttpSubscription]:
        """This front's subscriptions of ``tenant`` (in ``scope``), oldest first."""
        chosen = [
            s
            for s in self.subscriptions.values()
            if s.tenant == tenant and (scope is None or s.scope == scope)
        ]
        chosen.sort(key=lambda s: (s.created, s.id))
        return chosen

    def peers(self) -> dict[str, str]:
        """The other fronts serving now: member name -> HTTP address."""
        fronts = self._registry().fronts
        return {name: address for name, address in fronts.items() if name != self.port.name}

    async def create(self, tenant: str, scope: str, parsed: Parsed) -> HttpSubscription:
        """Keep a new subscription (ZooKeeper first, so that a crash leaves it to be
        adopted, never half made), then place it with the matchers."""
        if self._leaving:
            raise Unavailable("this connection point is leaving; send the request to another")
        subscription = HttpSubscription(uuid.uuid4().hex[:24], tenant, scope, parsed)
        registry = self._registry()
        await registry.create(_stored(subscription))
        try:
            [handle] = await self.port.subscribe([subscription.spec()], replace=False)
        except BaseException:
            await asyncio.shield(_quietly(registry.remove(subscription.id)))
            raise
        self._hold(subscription, handle, fails=0)
        return subscription

    async def update(
        self, subscription: HttpSubscription, parsed: Parsed, fields: set[str]
    ) -> None:
        """Apply a validated PATCH (the matchers' copy replaced when theirs changed)."""
        old = subscription.parsed
        await self._registry().replace(_stored(subscription, parsed.document))
        subscription.parsed = parsed
        if "status" in fields:
            subscription.status = parsed.status
            subscription.fails_counter = 0
        fails = 0 if "status" in fields else None
        self.notifier.configure(subscription, delivery_config(parsed), fails=fails)
        self._firing.invalidate()
        matchers_see = (old.selectors, old.q, old.mq, old.expires)
        if matchers_see != (parsed.selectors, parsed.q, parsed.mq, parsed.expires):
            old_handle = subscription.handle

            def placed(handles: list[int]) -> None:
                self._by_handle[handles[0]] = subscription  # the old handle still counts too
                self._firing.invalidate()

            [handle] = await self.port.subscribe([subscription.spec()], replace=True, placed=placed)
            self._by_handle.pop(old_handle, None)
            subscription.handle = handle
            self._firing.invalidate()

    async def delete(self, subscription: HttpSubscription) -> None:
        """Remove a subscription from ZooKeeper (first: one left there would be adopted
        again), from this front and from the matchers."""
        await self._registry().remove(subscription.id)
        self._drop(subscription)
        try:
            await self.port.unsubscribe([subscription.id])
        except SilboError as exc:  # what they still match for it finds no subscription here
            _log.warning("subscription %s left with the matchers: %s", subscription.id, exc)

    def _hold(self, subscription: HttpSubscription, handle: int, *, fails: int | None) -> None:
        if not subscription.saved:  # new: its definition says all there is
            subscription.saved = subscription.status_key()
        subscription.handle = handle
        self.subscriptions[subscription.id] = subscription
        self._by_handle[handle] = subscription
        self.notifier.configure(subscription, delivery_config(subscription.parsed), fails=fails)
        self._firing.invalidate()

    def _drop(self, subscription: HttpSubscription) -> None:
        self.subscriptions.pop(subscription.id, None)
        self._by_handle.pop(subscription.handle, None)
        self.notifier.forget(subscription)
        self._firing.invalidate()

    # -- sharing the subscriptions with the other fronts -------------------------------------

    def _fronts_changed(self, fronts: dict[str, str], renewed: bool) -> None:
        """The fronts serving changed (or this one's ZooKeeper session was renewed): adopt
        the orphans that fall to this front."""
        if renewed:
            self._reclaim = True
        self._rescan.set()

    async def _keep_up(self) -> None:
        """Adopt orphans whenever the fronts change (and every ``RESCAN`` seconds, for one
        whose heir died before adopting it); save statuses as they change."""
        last_flush = time.monotonic()
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._rescan.wait(), FLUSH_TICK)
            now = time.monotonic()
            try:
                if self._rescan.is_set() or now - self._scanned > RESCAN:
                    self._rescan.clear()
                    self._scanned = now
                    if self._reclaim:
                        self._reclaim = False
                        await self._claim_own()
                    await self._adopt_orphans()
                whole = now - last_flush >= self.options.status_flush
                if whole:
                    last_flush = now
                await self.save_statuses(whole=whole)
            except SilboError as exc:
                _log.warning("HTTP subscriptions not kept up this time: %s", exc)
            except Exception:  # a bug must not end the adoption of orphans for good
                _log.exception("HTTP subscriptions not kept up this time")

    async def save_statuses(self, *, whole: bool) -> None:
        """Write to ZooKeeper the statuses that changed: every one (``whole``), or only
        those whose ``status`` changed (a oneshot that fired must not fire again elsewhere)."""
        if self._leaving:
            return  # the heirs own them now
        if whole:
            changed = [s for s in self.subscriptions.values() if s.status_key() != s.saved]
        else:  # every second: only the status field, cheap to compare
            changed = [s for s in self.subscriptions.values() if s.status != s.saved[0]]
        if not changed:
            return
        await self._registry().save_status((s.id, s.status_record()) for s in changed)
        for subscription in changed:
            subscription.saved = subscription.status_key()

    async def _claim_own(self) -> None:
        """After a lost ZooKeeper session: claim again what this front holds; what another
        front adopted meanwhile is its own now (the matchers send it there)."""
        registry = self._registry()
        held = list(self.subscriptions.values())
        for start in range(0, len(held), ADOPT_BATCH):
            chunk = held[start : start + ADOPT_BATCH]
            claimed = await asyncio.gather(*(registry.claim(s.id) for s in chunk))
            for subscription, still_ours in zip(chunk, claimed, strict=True):
                if not still_ours:
                    _log.warning("subscription %s was adopted by another front", subscription.id)
                    self._drop(subscription)

    async def _adopt_orphans(self) -> None:
        if self._leaving:
            return
        registry = self._registry()
        fronts = list(registry.fronts)
        if self.port.name not in fronts:
            return  # not seen as serving yet: the others adopt
        orphans = await registry.orphans()
        mine = [i for i in orphans if heir(i, fronts) == self.port.name]
        if mine:
            await self._adopt(mine)

    async def _adopt(self, ids: Sequence[str]) -> None:
        """Take orphans over: claim each, read it, place it with the matchers (replacing the
        copy the dead front placed, which nobody receives any more), and deliver it."""
        async with self._adopting:
            if self._leaving:
                return
            registry = self._registry()
            for start in range(0, len(ids), ADOPT_BATCH):
                chunk = [i for i in ids[start : start + ADOPT_BATCH] if i not in self.subscriptions]
                claimed = await asyncio.gather(*(registry.claim(i) for i in chunk))
                taken = [i for i, won in zip(chunk, claimed, strict=True) if won]
                stored = await asyncio.gather(*(registry.read(i) for i in taken))
                adopted = []
                for subscription_id, kept in zip(taken, stored, strict=True):
                    subscription = self._revive(subscription_id, kept)
                    if subscription is None:
                        await registry.release([subscription_id])
                    else:
                        adopted.append(subscription)
                if not adopted:
                    continue

                def placed(handles: list[int], adopted: list[HttpSubscription] = adopted) -> None:
                    for subscription, handle in zip(adopted, handles, strict=True):
                        self._hold(subscription, handle, fails=subscription.fails_counter)

                try:
                    await self.port.subscribe(
                        [s.spec() for s in adopted], replace=True, placed=placed, adopt=True
                    )
                except SilboError:
                    for subscription in adopted:
                        self._drop(subscription)
                    await registry.release([s.id for s in adopted])
                    raise
                _log.info("adopted %d HTTP subscriptions", len(adopted))

    def _revive(self, subscription_id: str, kept: Stored | None) -> HttpSubscription | None:
        if kept is None:
            return None
        try:
            parsed = parse_document(kept.document, self.allow)
        except SilboError as exc:
            _log.error(
                "subscription %s cannot be taken over here (%s); it waits for another front",
                subscription_id,
                exc,
            )
            return None
        subscription = HttpSubscription(
            subscription_id, kept.tenant, kept.scope, parsed, created=kept.created
        )
        subscription.restore(kept.status)
        return subscription

    async def hand_over(self, timeout: float) -> int:
        """This connection point leaves: save every status, stop being a front, give every
        subscription up, and wait (at most ``timeout`` seconds) until the staying fronts
        adopted them all. Notifications already matched for them still come here and are
        sent (:meth:`drain`). The number handed over."""
        async with self._adopting:
            await self.save_statuses(whole=True)
            self._leaving = True
        registry = self._registry()
        await registry.leave()
        ids = list(self.subscriptions)
        self.subscriptions.clear()  # requests for them go to their new owners
        await registry.release(ids)
        deadline = time.monotonic() + timeout
        waiting = ids
        while waiting and time.monotonic() < deadline:
            owned = await registry.owned()  # by the others: this front claims nothing now
            waiting = [i for i in waiting if i not in owned]
            if waiting:
                await asyncio.sleep(0.05)
        if waiting:
            _log.warning("%d HTTP subscriptions were not adopted in time", len(waiting))
        return len(ids) - len(waiting)

    async def drain(self, timeout: float) -> bool:
        """Wait until what was matched so far left through the notifier."""
        return await self.notifier.idle(timeout)

    # -- notifications ----------------------------------------------------------------------

    def notify(self, batch: wire.NotificationBatchOut) -> None:
        """Decide which subscriptions a batch the matchers matched notifies
        (:class:`~broker.ngsi.firing.Firing`), and hand those to the notifier (never
        blocks)."""
        fired = self._firing.decide(batch, time.time())
        if fired is None:
            return
        if not self.notifier.send(fired.entities, fired.numbers, fired.indexes, batch.replayed):
            for subscription, count in fired.counts:
                self.notifier.dropped(subscription, count)


def application(options: FrontOptions) -> web.Application:
    """The front's aiohttp application, without its routes: the request checks, behind
    CORS when ``options`` turn it on (broker.ngsi.cors)."""
    middlewares: list[Middleware] = [checks]
    if options.cors_origin:
        middlewares.insert(0, cors(options.cors_origin, options.cors_max_age))
    app = web.Application(middlewares=middlewares, client_max_size=MAX_BODY + 1)
    app[READ_TIMEOUT] = options.read_timeout
    return app


def _bind(host: str, port: int, listen: str) -> socket.socket:
    """A listening socket on ``host:port`` (not shared: a taken port is AddressInUse)."""
    try:
        family, kind, proto, _name, address = socket.getaddrinfo(
            host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise AddressInUse(f"cannot serve HTTP on {listen}: {exc.strerror or exc}") from exc
    try:
        # Rebinding at once after a stop, while its connections sit in TIME_WAIT; two live
        # listeners still cannot share the port (that would take SO_REUSEPORT).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(1024)
    except OSError as exc:
        sock.close()
        raise AddressInUse(
            f"cannot serve HTTP on {listen}: {exc.strerror or exc} (pick another with "
            "--http-listen HOST:PORT, or port 0 for any)"
        ) from exc
    return sock


def _stored(subscription: HttpSubscription, document: dict[str, Any] | None = None) -> Stored:
    """What ZooKeeper keeps of a subscription's definition."""
    return Stored(
        subscription.id,
        subscription.tenant,
        subscription.scope,
        document if document is not None else subscription.parsed.document,
        subscription.created,
        {},
    )


async def _quietly(work: Awaitable[None]) -> None:
    try:
        await work
    except SilboError as exc:
        _log.warning("%s", exc)


def delivery_config(parsed: Parsed) -> Config:
    """How the delivery worker renders and sends a subscription's notifications.

    The headers, as Orion sends them: ``Content-Type`` (``text/plain`` for a ``payload``,
    none for ``payload: null``, JSON otherwise), ``Accept`` and ``User-Agent``, which
    httpCustom's headers may replace (or take out, with an empty value); then
    ``Ngsiv2-AttrsFormat`` (``custom`` for a ``payload`` or ``json`` body), which they
    cannot."""
    channel = parsed.channel
    kind = channel.body[0] if channel.body is not None else ""
    headers = _headers(
        {
            "Content-Type": _CONTENT_TYPES.get(kind, _JSON),
            "Accept": "application/json",
            "User-Agent": f"orion/{ORION_VERSION} silbo",
        },
        channel.headers,
    )
    if kind == "payload" and channel.body is not None and channel.body[1] is None:
        headers = [(k, v) for k, v in headers if k.lower() != "content-type"]  # no body
    headers = [(k, v) for k, v in headers if k.lower() != "ngsiv2-attrsformat"]
    custom = kind in ("payload", "json")
    headers.append(("Ngsiv2-AttrsFormat", "custom" if custom else parsed.attrs_format.value))
    templated = channel.templated()
    url = channel.url
    if channel.qs and not templated:
        url += ("&" if "?" in url else "?") + urlencode(channel.qs)
    return Config(
        url,
        channel.method,
        tuple(headers),
        channel.timeout,
        parsed.attrs_format,
        parsed.attrs,
        parsed.except_attrs,
        parsed.only_changed,
        parsed.covered,
        parsed.max_fails_limit,
        parsed.retry_window,
        parsed.metadata,
        templated,
        channel.qs if templated else (),
        channel.body,
        channel.mqtt,
    )


def _headers(defaults: dict[str, str], given: tuple[tuple[str, str], ...]) -> list[tuple[str, str]]:
    """The defaults with the given headers over them (names compared case-insensitively; a
    given empty value is kept, and means the header is not sent)."""
    merged = {k.lower(): (k, v) for k, v in defaults.items()}
    for name, value in given:
        merged[name.lower()] = (name, value)
    return list(merged.values())


class _Publisher:
    """Publishes what concurrent requests queue, in batches, in the order queued."""

    def __init__(self, port: BrokerPort) -> None:
        self._port = port
        self._queue: asyncio.Queue[tuple[list[pb.Entity], asyncio.Future[None]]] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self._answering: set[asyncio.Task[None]] = set()
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
        """Return once the batch carrying ``entities`` is delivered (its error otherwise)."""
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
                delivered = await self._port.publish(entities, self._name, first)
            except Exception as exc:
                _settle(waiting, exc)
                continue
            # the next batch goes out while this one is on its way (order is kept by sending)
            self._spawn(self._answer(waiting, delivered))

    async def _answer(
        self,
        waiting: list[tuple[list[pb.Entity], asyncio.Future[None]]],
        delivered: Awaitable[int],
    ) -> None:
        try:
            await delivered
        except Exception as exc:
            _settle(waiting, exc)
        else:
            _settle(waiting, None)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)


def _settle(
    waiting: list[tuple[list[pb.Entity], asyncio.Future[None]]], failure: Exception | None
) -> None:
    for _batch, done in waiting:
        if done.done():
            continue
        if failure is None:
            done.set_result(None)
        else:
            done.set_exception(failure)
