"""Sending notifications: handed to a delivery worker process, never in the matching path.

:meth:`Notifier.send` only writes a batch down a pipe to the worker
(:mod:`broker.ngsi.delivery`), which renders the bodies and sends the requests; the
connection point's event loop and GIL stay for taking updates. The worker keeps one queue
per subscription (at most ``queue_limit`` notifications; more are dropped) drained by one
request at a time, so a subscription's notifications leave in order and a slow or dead
receiver holds back only its own subscription; at most ``concurrency`` requests are in
flight in all, on at most ``per_origin`` keep-alive connections per origin (scheme, host,
port; :mod:`broker.ngsi.http_client`), and at most ``total_limit`` notifications wait in
all: past it, the oldest notification of the subscription with the most waiting is dropped.
Once that many wait, the worker reads nothing more from the pipe until 1 % of them have
left; once ``buffer_limit`` bytes wait there, new notifications are dropped here (the
cheapest place). Every drop is counted in the subscription's ``dropped`` and as a failure
(``failsCounter`` + 1, ``lastFailureReason`` "Notification queue is full").

A notification that meets a transport error (refused, reset, timeout, DNS, the connection
closed before the whole answer) or an answer of 408, 429 or 5xx is sent again while its
retry window lasts (:mod:`broker.ngsi.retry`; ``retry_window`` seconds, or its
subscription's ``notification.retryWindow``). What its end does to the subscription
(Orion's rules, ngsi-v2.md section 5): an HTTP answer not retried, 4xx included, is a success
(``lastSuccess``, ``lastSuccessCode``, ``failsCounter`` back to 0); giving up (the window
passed) is a failure (``lastFailure``, ``lastFailureReason``, ``failsCounter`` + 1, and
``inactive`` once it is over ``maxFailsLimit``; what it still had queued is then dropped).
With a window of 0 nothing is retried, and a 5xx or 429 answer is a success, as in Orion.
The worker
reports these every 50 ms; :meth:`Notifier.configure` numbers each version of a
subscription it sends, and a report about an older version (before a PATCH) changes its
times but not its ``failsCounter`` or status.

:meth:`Notifier.stop` sends the worker ``["q"]`` before closing its stdin: it ends at once,
dropping what waits. A worker whose stdin ends without it outlives its dead connection
point for a while, to send what it holds (:meth:`broker.ngsi.delivery.Worker.drain`); its
reports then go nowhere. A worker that dies is started again (what it held is lost).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import msgpack
import numpy as np

from broker.ngsi.delivery import QUEUE_FULL, QUIT, Config
from broker.ngsi.retry import DEFAULT_WINDOW
from broker.ngsi.subscriptions import HttpSubscription

__all__ = [
    "DEFAULT_BUFFER_LIMIT",
    "DEFAULT_CONCURRENCY",
    "DEFAULT_PER_ORIGIN",
    "DEFAULT_QUEUE_LIMIT",
    "DEFAULT_TOTAL_LIMIT",
    "OUTCOMES",
    "Notifier",
]

_log = logging.getLogger(__name__)

DEFAULT_CONCURRENCY = 128  # requests in flight
DEFAULT_PER_ORIGIN = 32  # connections open to one origin
DEFAULT_QUEUE_LIMIT = 1_000  # notifications waiting, per subscription
DEFAULT_TOTAL_LIMIT = 100_000  # notifications waiting, in all
DEFAULT_BUFFER_LIMIT = 1 << 20  # bytes waiting in the pipe to the worker
# what the worker counts of notifications, as its reports give them (metrics' outcome label)
OUTCOMES = ("dropped", "delivered", "retried", "gave_up")


class Notifier:
    """The connection point's side of the delivery worker (see the module doc)."""

    def __init__(
        self,
        *,
        concurrency: int = DEFAULT_CONCURRENCY,
        per_origin: int = DEFAULT_PER_ORIGIN,
        queue_limit: int = DEFAULT_QUEUE_LIMIT,
        total_limit: int = DEFAULT_TOTAL_LIMIT,
        buffer_limit: int = DEFAULT_BUFFER_LIMIT,
        retry_window: float = DEFAULT_WINDOW,
        count: Callable[[str, int], None] | None = None,
    ) -> None:
        self._arguments = [
            f"--concurrency={concurrency}",
            f"--per-origin={per_origin}",
            f"--queue-limit={queue_limit}",
            f"--total-limit={total_limit}",
            f"--retry-window={retry_window}",
            f"--log-level={logging.getLevelName(logging.getLogger().getEffectiveLevel())}",
        ]
        self._buffer_limit = buffer_limit
        self._count = count  # told each outcome's count (metrics): see OUTCOMES
        self._subscriptions: dict[str, HttpSubscription] = {}
        self._configs: dict[str, Config] = {}
        self._numbers = itertools.count(1)
        self._process: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._stopping = False
        self._idle: dict[int, asyncio.Future[None]] = {}  # idle() calls waiting, by token

    async def start(self) -> None:
        """Start the worker, in a session of its own: a signal meant for the connection
        point's process group (a terminal's Ctrl-C or hangup) does not reach it, the
        connection point stops it (:meth:`stop`); and when the connection point dies, it
        outlives it to send what it holds (broker.ngsi.delivery). Nothing of ours signals a
        connection point's group: ``silbo down``, the supervisor and the liveness watch
        signal its pid alone."""
        self._process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            "from broker.ngsi.delivery import main; main()",
            *self._arguments,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
        self._reader = asyncio.get_running_loop().create_task(self._read(self._process))
        for sid, subscription in self._subscriptions.items():  # a restarted worker
            config = self._configs[sid].to_list()
            fails = subscription.fails_counter
            self._write(["s", subscription.number, sid, subscription.generation, fails, config])

    async def stop(self) -> None:
        """Stop the worker: what is queued is dropped, what is in flight cancelled. The quit
        message says so: its stdin closing without one means the connection point died, and
        it would send what it holds first."""
        self._stopping = True
        process = self._process
        if process is None:
            return
        assert process.stdin is not None
        self._write([QUIT])
        process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 5.0)
        except TimeoutError:
            process.kill()
            await process.wait()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)

    def configure(
        self, subscription: HttpSubscription, config: Config, *, fails: int | None
    ) -> None:
        """Hand the worker a new or changed subscription (``fails``: its failsCounter from
        now on; None keeps the worker's)."""
        subscription.generation += 1
        if not subscription.number:
            subscription.number = next(self._numbers)
        self._subscriptions[subscription.id] = subscription
        self._configs[subscription.id] = config
        self._write(
            [
                "s",
                subscription.number,
                subscription.id,
                subscription.generation,
                fails,
                config.to_list(),
            ]
        )

    async def idle(self, timeout: float) -> bool:
        """Wait until the worker has nothing waiting or in flight (and has reported what it
        sent); False if that did not happen within ``timeout`` seconds."""
        token = next(self._numbers)
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._idle[token] = done
        try:
            if not self._write(["i", token]):
                return False
            await asyncio.wait_for(done, timeout)
            return True
        except TimeoutError:
            return False
        finally:
            self._idle.pop(token, None)

    def forget(self, subscription: HttpSubscription) -> None:
        """Drop a deleted subscription and what it still had queued."""
        self._subscriptions.pop(subscription.id, None)
        self._configs.pop(subscription.id, None)
        self._write(["f", subscription.number])

    def send(
        self,
        entities: Sequence[bytes],
        numbers: list[int],
        indexes: list[int],
        replayed: bool = False,
    ) -> bool:
        """Queue notifications: to the subscription numbered ``numbers[i]`` (its
        ``number``), of entity ``entities[indexes[i]]``; False if the worker is too far
        behind (nothing queued: the caller counts them in ``dropped``). ``replayed``: a dead
        front's, kept by the exit points (docs/failures.md): written whatever waits in the
        pipe, and taken by the worker past a subscription's limit (they are bounded, and
        come in one burst when the subscriptions are adopted)."""
        message: list[Any] = [
            "n",
            list(entities),
            np.array(numbers, dtype="<u4").tobytes(),
            np.array(indexes, dtype="<u4").tobytes(),
        ]
        if replayed:
            message.append(True)
        return self._write(message)

    def _write(self, message: list[Any]) -> bool:
        process = self._process
        if process is None or process.stdin is None or process.stdin.is_closing():
            return False
        if (
            message[0] == "n"
            and len(message) == 4
            and process.stdin.transport.get_write_buffer_size() > self._buffer_limit
        ):
            return False
        process.stdin.write(msgpack.packb(message))
        return True

    async def _read(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        unpacker = msgpack.Unpacker(raw=False, max_buffer_size=1 << 30)
        while chunk := await process.stdout.read(1 << 20):
            unpacker.feed(chunk)
            for kind, body in unpacker:
                if kind == "i":
                    waiting = self._idle.get(body)
                    if waiting is not None and not waiting.done():
                        waiting.set_result(None)
                else:
                    self._reported(body)
        if not self._stopping:
            _log.error("the notification worker ended (%s); starting another", await process.wait())
            await self.start()

    def dropped(self, subscription: HttpSubscription, count: int) -> None:
        """Count ``count`` notifications dropped before the worker (its pipe was full): a
        failure each, as the worker counts those its queues drop."""
        subscription.dropped += count
        subscription.fails_counter += count
        subscription.last_failure = time.time()
        subscription.last_failure_reason = QUEUE_FULL
        self._counted("dropped", count)
        _fail_out(subscription)

    def _counted(self, outcome: str, count: int) -> None:
        if count and self._count is not None:
            self._count(outcome, count)

    def _reported(self, rows: list[list[Any]]) -> None:
        for row in rows:
            sid, generation, success, code, failure, reason, fails, *counts = row
            for outcome, count in zip(OUTCOMES, counts, strict=True):
                self._counted(outcome, count)
            subscription = self._subscriptions.get(sid)
            if subscription is None:
                continue  # deleted since
            if success is not None:
                subscription.last_success = success
                subscription.last_success_code = code
            if failure is not None:
                subscription.last_failure = failure
                subscription.last_failure_reason = reason
            subscription.dropped += counts[0]
            if generation != subscription.generation:
                continue  # a PATCH since: its failsCounter and status stand
            subscription.fails_counter = fails
            _fail_out(subscription)


def _fail_out(subscription: HttpSubscription) -> None:
    """Make ``subscription`` inactive once its failsCounter is over its maxFailsLimit."""
    fails, limit = subscription.fails_counter, subscription.parsed.max_fails_limit
    if limit is not None and fails > limit and subscription.status != "inactive":
        subscription.status = "inactive"
        _log.info(
            "subscription %s is inactive: %d failed notifications in a row", subscription.id, fails
        )
