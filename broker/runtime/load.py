"""A process's load on its data path, measured the same way on every layer (and capped).

What is measured (docs/autoscaling.md, "Load signals"):

- *busy*: the process is busy while at least one of its data-path handlers works on a batch
  (decodes, matches, numbers, merges, serializes) or waits for ``--max-rate`` tokens. A
  handler blocked on a full outbound link (backpressure: the next layer is slow) is not
  working, so a process held back by its downstream does not look saturated. Overlapping
  handlers count once: busy time never exceeds wall time.
- *items in / out*: the data-path items a handler took in and handed on (each role says
  which in its own doc; updates for most).
- the *true rate*: items in per busy second, what the process would take in if it were busy
  all the time (DS2's true processing rate).
- *queue depth / age*: messages waiting on the outbound links, and how long the oldest has
  waited.

Cost: two clock reads and a few additions per batch, one clock read per message queued on a
link; nothing per item. Rates are computed when asked (``Admin.Status``, a Prometheus scrape)
from marks of the totals taken at most every ``window / 5`` seconds.

Capacity emulation: with ``max_rate`` (``silbo run --max-rate N``) :meth:`Load.admit` holds
a batch of ``n`` items for ``n / N`` seconds after the batches before it (a token bucket
without burst), so the process takes in at most ``N`` items a second; the wait counts as
busy, so, like a process that really has that capacity, a process at its cap reports busy
near 1 and one at half its cap busy near 0.5, both a true rate near ``N``.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
import weakref
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

__all__ = ["WINDOW", "Load", "LoadSample", "TokenBucket", "WaitingQueue", "blocked"]

WINDOW = 5.0  # seconds the rates are averaged over
# seconds of --max-rate tokens an idle process may use at once: none, so that every batch
# costs its emulated work time and a process below its cap measures its true rate too
BURST = 0.0

Clock = Callable[[], float]
Sleep = Callable[[float], Awaitable[None]]


class WaitingQueue(Protocol):
    """An outbound queue whose backlog counts in the queue depth and age."""

    def waiting(self) -> tuple[int, float | None]:
        """``(messages waiting, when the oldest was queued, on the load's clock)``."""


@dataclass(frozen=True, slots=True)
class LoadSample:
    """The load over the last ``window`` seconds, and the totals since start (to diff)."""

    window: float  # seconds the rates cover (``WINDOW``, less for a young process)
    busy_fraction: float  # busy seconds / wall seconds, 0 to 1
    input_rate: float  # items in a second
    output_rate: float  # items out a second
    true_rate: float  # items in per busy second (0: not busy in the window)
    queue_depth: int  # messages waiting on the outbound links
    queue_age: float  # seconds the oldest of them has waited (0: none)
    busy_seconds: float  # totals since start
    items_in: int
    items_out: int
    max_rate: float  # the --max-rate cap (0: none)
    held_fraction: float = 0.0  # share of the items in whose publishers were held back
    items_held: int = 0  # total since start


class TokenBucket:
    """At most ``rate`` items a second, with bursts of ``burst`` seconds' worth (GCRA).

    Each reservation moves a virtual clock on by ``items / rate``; the caller waits until
    the virtual clock's lead over the real one is spent. A batch larger than the burst
    waits for its whole share, so batches of any size keep the rate.
    """

    def __init__(self, rate: float, *, burst: float = BURST) -> None:
        if not rate > 0:
            raise ValueError(f"a token bucket needs a positive rate, not {rate}")
        self.rate = rate
        self._burst = burst
        self._virtual = float("-inf")  # when the items reserved so far are served

    def reserve(self, items: float, now: float) -> float:
        """Reserve ``items`` tokens; the seconds to wait before using them."""
        start = max(self._virtual, now - self._burst)
        self._virtual = start + items / self.rate
        return max(0.0, self._virtual - now - self._burst)


class _Span:
    __slots__ = ("load", "paused", "task")

    def __init__(self, load: Load) -> None:
        self.load = load
        self.paused = False
        # a task started inside the span inherits it (contextvars) but does not work in it
        self.task = _current_task()


def _current_task() -> asyncio.Task[object] | None:
    try:
        return asyncio.current_task()
    except RuntimeError:  # no event loop running (a test driving the meter by hand)
        return None


# The span the current task works in (None: it is not handling a data-path batch).
_SPAN: contextvars.ContextVar[_Span | None] = contextvars.ContextVar("silbo_span", default=None)


@contextmanager
def blocked() -> Iterator[None]:
    """Around a wait on backpressure (a full outbound queue): the current task's busy span,
    if any, is paused meanwhile."""
    span = _SPAN.get()
    if span is None or span.paused or span.task is not _current_task():
        yield
        return
    span.paused = True
    span.load._stop()
    try:
        yield
    finally:
        span.paused = False
        span.load._start()


class Load:
    """The busy meter, item counts, outbound queues and optional rate cap of one process.

    Single-threaded: called from the process's event loop only.
    """

    def __init__(
        self,
        *,
        max_rate: float = 0.0,
        window: float = WINDOW,
        clock: Clock = time.monotonic,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        self.max_rate = max_rate
        self.clock = clock
        self._window = window
        self._step = window / 5
        self._sleep = sleep
        self._bucket = TokenBucket(max_rate) if max_rate > 0 else None
        self._working = 0  # handlers working now (not paused)
        self._since = 0.0  # when _working last went from 0 to 1
        self._busy = 0.0  # busy seconds before _since
        self._in = 0
        self._out = 0
        self._held = 0
        now = clock()
        self._marks: deque[tuple[float, float, int, int, int]] = deque([(now, 0.0, 0, 0, 0)])
        self._queues: weakref.WeakSet[WaitingQueue] = weakref.WeakSet()

    # -- the data path ----------------------------------------------------------------------

    async def admit(self, items: float) -> None:
        """Wait until ``--max-rate`` allows ``items`` more (at once when uncapped); the wait
        counts as busy."""
        if self._bucket is None:
            return
        delay = self._bucket.reserve(items, self.clock())
        if delay <= 0:
            return
        with self.working(0):
            await self._sleep(delay)

    @contextmanager
    def working(self, items_in: int) -> Iterator[None]:
        """Around the handling of a batch of ``items_in`` items: busy meanwhile (except while
        :func:`blocked`), the items counted in at the end."""
        span = _Span(self)
        reset = _SPAN.set(span)
        self._start()
        try:
            yield
        finally:
            _SPAN.reset(reset)
            self._in += items_in
            if not span.paused:
                self._stop()

    def held(self, items: int) -> None:
        """Count ``items`` (also counted in) whose publisher had waited for room in its
        publish window: it is offered more than it sends."""
        self._held += items

    def output(self, items: int) -> None:
        """Count ``items`` handed on to the next layer (or to subscribers)."""
        self._out += items

    def watch(self, queue: WaitingQueue) -> None:
        """Count ``queue``'s backlog in the queue depth and age (until it is collected)."""
        self._queues.add(queue)

    # -- reading ----------------------------------------------------------------------------

    def sample(self) -> LoadSample:
        """The load now: rates over the last window, totals since start."""
        now = self.clock()
        busy = self._busy_at(now)
        self._mark(now, busy)
        base = self._marks[0]
        for mark in self._marks:  # the newest mark at least a window old, else the oldest
            if mark[0] > now - self._window:
                break
            base = mark
        while self._marks[0] is not base:
            self._marks.popleft()
        span = now - base[0]
        busy_in = busy - base[1]
        items_in = self._in - base[2]
        depth, oldest = self._waiting()
        return LoadSample(
            window=span,
            busy_fraction=min(1.0, busy_in / span) if span > 0 else 0.0,
            input_rate=items_in / span if span > 0 else 0.0,
            output_rate=(self._out - base[3]) / span if span > 0 else 0.0,
            true_rate=items_in / busy_in if busy_in > 0 else 0.0,
            queue_depth=depth,
            queue_age=max(0.0, now - oldest) if oldest is not None else 0.0,
            busy_seconds=busy,
            items_in=self._in,
            items_out=self._out,
            max_rate=self.max_rate,
            held_fraction=min(1.0, (self._held - base[4]) / items_in) if items_in > 0 else 0.0,
            items_held=self._held,
        )

    # -- the meter --------------------------------------------------------------------------

    def _start(self) -> None:
        if self._working == 0:
            self._since = self.clock()
        self._working += 1

    def _stop(self) -> None:
        self._working -= 1
        if self._working == 0:
            now = self.clock()
            self._busy += now - self._since
            self._mark(now, self._busy)

    def _busy_at(self, now: float) -> float:
        return self._busy + (now - self._since if self._working else 0.0)

    def _mark(self, now: float, busy: float) -> None:
        if now - self._marks[-1][0] >= self._step:
            self._marks.append((now, busy, self._in, self._out, self._held))

    def _waiting(self) -> tuple[int, float | None]:
        depth = 0
        oldest: float | None = None
        for queue in list(self._queues):
            count, since = queue.waiting()
            depth += count
            if since is not None and (oldest is None or since < oldest):
                oldest = since
        return depth, oldest
