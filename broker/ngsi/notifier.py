"""Sending notifications: HTTP requests, bounded, concurrent, and never in the matching path.

:meth:`Notifier.send` only queues: each subscription has its own queue (at most
``queue_limit`` notifications; more are dropped and counted in ``dropped``) drained by one
task at a time, so a subscription's notifications leave in order and a slow or dead receiver
holds back only its own subscription. At most ``concurrency`` requests are in flight in all.

What a request's end does to the subscription (Orion's rules, ngsi-v2.md section 5): any
HTTP answer, 4xx and 5xx included, is a success (``lastSuccess``, ``lastSuccessCode``,
``failsCounter`` back to 0); only a transport error (refused, timeout, DNS) is a failure
(``lastFailure``, ``lastFailureReason``, ``failsCounter`` + 1, and ``inactive`` once it is over
``maxFailsLimit``; what it still had queued is then dropped). There are no retries.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from dataclasses import dataclass

import aiohttp

from broker.ngsi.subscriptions import HttpSubscription

__all__ = ["Notifier", "Request"]

_log = logging.getLogger(__name__)

DEFAULT_CONCURRENCY = 128
DEFAULT_QUEUE_LIMIT = 1_000


@dataclass(frozen=True, slots=True)
class Request:
    """One notification ready to go."""

    method: str
    url: str
    headers: dict[str, str]
    body: bytes
    timeout: float


class Notifier:
    """Per-subscription queues drained by bounded concurrent requests (see the module doc)."""

    def __init__(
        self, *, concurrency: int = DEFAULT_CONCURRENCY, queue_limit: int = DEFAULT_QUEUE_LIMIT
    ) -> None:
        self._limit = asyncio.Semaphore(concurrency)
        self._concurrency = concurrency
        self._queue_limit = queue_limit
        self._queues: dict[HttpSubscription, deque[Request]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._session: aiohttp.ClientSession | None = None
        self.sent = 0
        self.failed = 0

    async def start(self) -> None:
        """Open the HTTP client."""
        connector = aiohttp.TCPConnector(limit=self._concurrency, limit_per_host=0)
        self._session = aiohttp.ClientSession(connector=connector, auto_decompress=False)

    async def stop(self) -> None:
        """Drop what is queued, cancel what is in flight, close the HTTP client."""
        self._queues.clear()
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._session is not None:
            await self._session.close()

    def send(self, subscription: HttpSubscription, request: Request) -> bool:
        """Queue a notification; False (and ``dropped`` + 1) if its queue is full."""
        queue = self._queues.get(subscription)
        if queue is None:
            queue = self._queues[subscription] = deque()
            task = asyncio.get_running_loop().create_task(self._drain(subscription, queue))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if len(queue) >= self._queue_limit:
            subscription.dropped += 1
            return False
        queue.append(request)
        return True

    def forget(self, subscription: HttpSubscription) -> None:
        """Drop what a deleted subscription still had queued."""
        queue = self._queues.get(subscription)
        if queue is not None:
            queue.clear()

    async def _drain(self, subscription: HttpSubscription, queue: deque[Request]) -> None:
        try:
            while queue:
                request = queue.popleft()
                if _failed_out(subscription):
                    subscription.dropped += len(queue) + 1
                    queue.clear()  # what was queued before it went inactive is not sent
                    break
                async with self._limit:
                    await self._post(subscription, request)
        finally:
            if self._queues.get(subscription) is queue:
                del self._queues[subscription]

    async def _post(self, subscription: HttpSubscription, request: Request) -> None:
        assert self._session is not None, "the notifier has not started"
        try:
            async with self._session.request(
                request.method,
                request.url,
                data=request.body,
                headers=request.headers,
                timeout=aiohttp.ClientTimeout(total=request.timeout),
                allow_redirects=False,
            ) as response:
                await response.read()
                status = response.status
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self.failed += 1
            _failed(subscription, _reason(exc))
            return
        self.sent += 1
        subscription.last_success = time.time()
        subscription.last_success_code = status
        subscription.fails_counter = 0


def _failed_out(subscription: HttpSubscription) -> bool:
    limit = subscription.parsed.max_fails_limit
    return limit is not None and subscription.fails_counter > limit


def _failed(subscription: HttpSubscription, reason: str) -> None:
    subscription.last_failure = time.time()
    subscription.last_failure_reason = reason
    subscription.fails_counter += 1
    limit = subscription.parsed.max_fails_limit
    if limit is not None and subscription.fails_counter > limit:
        subscription.status = "inactive"
        _log.info(
            "subscription %s is inactive: %d failed notifications in a row",
            subscription.id,
            subscription.fails_counter,
        )


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError | aiohttp.ServerTimeoutError):
        return "Timeout was reached"
    if isinstance(exc, aiohttp.ClientConnectorError | ConnectionError):
        return "Couldn't connect to server"
    return f"notification failed: {exc.__class__.__name__}"
