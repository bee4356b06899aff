"""An outbound link: one long-lived, ordered gRPC stream to one peer, fed from a bounded queue.

Payloads are serialized messages (bytes): a sender that fans one message out to several
peers serializes it once. The first message on every stream is the sender's Hello. The
queue bounds what waits for the peer (``send`` blocks when it is full: backpressure flows
back to whoever feeds the link); gRPC's own flow control bounds what is in flight. The
queue's backlog (how many wait, since when) counts in the process's load
(broker.runtime.load); a sender blocked on a full queue is not busy meanwhile.

States::

    NEW --start()--> OPEN --close()--> CLOSED            (queued payloads sent first)
                      |
                      +-- the stream fails --> FAILED    (on_failure called once; payloads
                      |                                   still queued are dropped)
                      +-- abort() -----------> FAILED    (the peer is dead or fenced: as a
                                                          failure, and blocked senders are
                                                          released)
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import grpc

from broker.coordination.membership import Member
from broker.runtime.load import blocked
from broker.runtime.metrics import ProcessMetrics
from broker.runtime.token import call_metadata

__all__ = ["CHANNEL_OPTIONS", "SERVER_OPTIONS", "Link", "LinkState", "follow_members"]

_log = logging.getLogger(__name__)

MAX_MESSAGE = 64 << 20
KEEPALIVE_MS = 10_000
CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", MAX_MESSAGE),
    ("grpc.max_send_message_length", MAX_MESSAGE),
    ("grpc.keepalive_time_ms", KEEPALIVE_MS),
    ("grpc.keepalive_timeout_ms", 5_000),
    # an idle stream (no data for minutes) is still pinged: allow it
    ("grpc.http2.max_pings_without_data", 0),
)
# A server must accept those pings on a stream that carries no data: by default it allows
# one every 5 minutes and ends the connection (GOAWAY "too_many_pings") after a few more, so
# internal streams died after minutes without traffic.
SERVER_OPTIONS = (
    *CHANNEL_OPTIONS,
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_MS // 2),
    ("grpc.http2.max_ping_strikes", 0),
)
_CLOSE = object()
_CLOSE_POLL = 0.05  # seconds between looks at the channel while a close waits


class LinkState(enum.Enum):
    """Where a :class:`Link` is (transitions in the module doc)."""

    NEW = "new"
    OPEN = "open"
    CLOSED = "closed"
    FAILED = "failed"


class Link:
    """A stream to ``address`` calling ``method`` (``/package.Service/Method``).

    ``streaming_response``: the method answers with a stream (each response's bytes go to
    ``on_response``); otherwise it answers once, when the stream ends.
    """

    def __init__(
        self,
        peer: str,
        address: str,
        method: str,
        hello: bytes,
        *,
        metrics: ProcessMetrics,
        streaming_response: bool,
        on_response: Callable[[bytes], None] | None = None,
        on_failure: Callable[[Link, BaseException], None] | None = None,
        capacity: int = 64,
    ) -> None:
        self.peer = peer
        self.address = address
        self._method = method
        self._hello = hello
        self._metrics = metrics
        self._streaming = streaming_response
        self._on_response = on_response
        self._on_failure = on_failure
        self._queue: asyncio.Queue[object] = asyncio.Queue(capacity)
        self._state = LinkState.NEW
        self._task: asyncio.Task[None] | None = None
        self._channel: grpc.aio.Channel | None = None
        self._depth = metrics.queue_depth.labels(link=f"{method.rsplit('/', 1)[-1]}:{peer}")
        self._sent = metrics.messages_out.labels(stream=method.rsplit("/", 1)[-1])
        self._clock = metrics.load.clock
        self._queued: deque[float] = deque()  # when each queued payload was queued
        metrics.load.watch(self)

    @property
    def state(self) -> LinkState:
        """The current state."""
        return self._state

    def start(self) -> None:
        """Open the stream (in the background; the peer may still be starting)."""
        if self._state is not LinkState.NEW:
            raise RuntimeError(f"link to {self.peer} is {self._state.value}")
        self._state = LinkState.OPEN
        self._task = asyncio.get_running_loop().create_task(self._run(), name=f"link-{self.peer}")

    async def send(self, payload: bytes) -> bool:
        """Queue one serialized message; False (and nothing queued) if the link is down."""
        if self._state is not LinkState.OPEN:
            return False
        if self._queue.full():
            with blocked():  # backpressure: the peer is slow, this process is not busy
                await self._queue.put(payload)
        else:
            self._queue.put_nowait(payload)
        if self.state is not LinkState.FAILED:  # else abort() or a failure emptied the queue
            self._queued.append(self._clock())
        self._depth.set(self._queue.qsize())
        return True

    def waiting(self) -> tuple[int, float | None]:
        """``(payloads queued, when the oldest was queued)`` (broker.runtime.load)."""
        queued = self._queued
        return len(queued), (queued[0] if queued else None)

    async def close(self, timeout: float = 5.0) -> None:
        """Send what is queued, end the stream, and wait (at most ``timeout`` s) for the peer."""
        if self._state is LinkState.OPEN:
            self._state = LinkState.CLOSED
            try:
                self._queue.put_nowait(_CLOSE)
            except asyncio.QueueFull:
                try:
                    await asyncio.wait_for(self._queue.put(_CLOSE), timeout)
                except TimeoutError:  # the peer takes nothing: what is queued is given up
                    _log.warning("link to %s: the peer took nothing for %g s", self.peer, timeout)
                    timeout = 0.0
        if self._task is not None:
            try:
                if not await self._ended_within(timeout):
                    self._task.cancel()
            except asyncio.CancelledError:
                # abort() cancelled the stream meanwhile (a repair gave the peer up while
                # this process stops): closed all the same; a cancel of ours goes on
                current = asyncio.current_task()
                if not self._task.cancelled() or (current is not None and current.cancelling()):
                    raise
        if self._channel is not None:
            await self._channel.close()

    async def _ended_within(self, timeout: float) -> bool:
        """Whether the stream ended within ``timeout`` s. Not waited for once the channel
        cannot connect: the stream waits for a peer that is gone (its process stopped
        meanwhile, as every process of a cluster stopping at once), and nothing queued can
        reach it; a close waited its whole timeout for it."""
        assert self._task is not None
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not self._task.done():
            remaining = deadline - loop.time()
            channel = self._channel
            if remaining <= 0 or (
                channel is not None
                and channel.get_state() is grpc.ChannelConnectivity.TRANSIENT_FAILURE
            ):
                return False
            await asyncio.wait({self._task}, timeout=min(_CLOSE_POLL, remaining))
        return True

    def abort(self) -> None:
        """Give the peer up now (a repair removed it): drop what is queued, release senders
        blocked on a full queue (their ``send`` returns), cancel the stream."""
        was_open = self._state is LinkState.OPEN
        self._state = LinkState.FAILED
        if self._task is not None:
            self._task.cancel()
        while not self._queue.empty():  # each slot freed lets one blocked put through
            self._queue.get_nowait()
        self._queued.clear()
        self._depth.set(0)
        if was_open and self._on_failure is not None:
            self._on_failure(self, ConnectionAbortedError(f"{self.peer} was given up"))

    async def _requests(self) -> AsyncIterator[bytes]:
        yield self._hello
        while True:
            item = await self._queue.get()
            self._depth.set(self._queue.qsize())
            if self._queued:
                self._queued.popleft()
            if item is _CLOSE:
                return
            assert isinstance(item, bytes)
            self._sent.inc()
            yield item

    async def _run(self) -> None:
        self._channel = grpc.aio.insecure_channel(self.address, options=CHANNEL_OPTIONS)
        try:
            requests: Any = self._requests()
            if self._streaming:
                call: Any = self._channel.stream_stream(self._method)(
                    requests, wait_for_ready=True, metadata=call_metadata()
                )
                async for response in call:
                    if self._on_response is not None:
                        assert isinstance(response, bytes)
                        self._on_response(response)
            else:
                await self._channel.stream_unary(self._method)(
                    requests, wait_for_ready=True, metadata=call_metadata()
                )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._fail(exc)
        else:
            if self._state is LinkState.OPEN:  # the peer ended the stream on its own
                self._fail(ConnectionError(f"{self.peer} ended the stream"))

    def _fail(self, exc: BaseException) -> None:
        was_open = self._state is LinkState.OPEN
        self._state = LinkState.FAILED
        _log.warning("link to %s (%s) failed: %s", self.peer, self.address, exc)
        while not self._queue.empty():
            self._queue.get_nowait()
        self._queued.clear()
        self._depth.set(0)
        if was_open and self._on_failure is not None:
            self._on_failure(self, exc)


def follow_members(
    links: dict[int, Link],
    members: Sequence[Member],
    *,
    method: str,
    hello: bytes,
    metrics: ProcessMetrics,
) -> None:
    """Keep one open link (answered once, at its end) per live member, keyed by its sequence.

    Opens a link to each member without an open one, and gives up (``abort``) the links of
    members gone.
    """
    for member in members:
        link = links.get(member.sequence)
        if link is not None and link.state is LinkState.OPEN:
            continue
        link = Link(
            member.name,
            member.address,
            method,
            hello,
            metrics=metrics,
            streaming_response=False,
        )
        links[member.sequence] = link
        link.start()
    live = {member.sequence for member in members}
    for sequence in set(links) - live:
        # Gone: it left (it had drained what concerned it) or died, or hangs fenced with a
        # full queue: a sender blocked on it must not wait for a keepalive to fail.
        links.pop(sequence).abort()
