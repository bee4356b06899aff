"""Upstream backup of updates: what a connection point keeps until it is delivered, and how a
connection point tells a batch it was handed already (docs/failures.md).

A connection point numbers every batch of updates it takes from a publisher (``origin_batch``,
with ``origin`` its member sequence) and keeps it in its :class:`Outbox` until the batch's
exit point reports it delivered (``Completed``); only then is the publisher acknowledged. If
its access point dies, it sends everything unfinished again, in order, before anything new.
(The access point does the same for the batches of an exit point that died.) A batch sent
twice may reach a connection point twice: :class:`Seen` drops the second copy. A publisher's
batches from one origin arrive in the order they were numbered (one exit point delivers them,
in order; a batch sent again goes before anything newer), so one number per (origin,
publisher), the highest handed over, tells a copy from a new batch.

A batch that is not delivered within the outbox's ``timeout`` is refused to its publisher
(``Unavailable``: publish again), never dropped silently.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from dataclasses import dataclass

from broker.errors import Unavailable

__all__ = ["DELIVERY_TIMEOUT", "Outbox", "Seen"]

DELIVERY_TIMEOUT = 60.0  # seconds a batch may take to be delivered before it is refused


@dataclass(eq=False)
class _Flight:
    payload: bytes  # the serialized wire.Batch, ready to send again
    count: int  # updates in it
    sent: float  # time.monotonic() of the first send
    done: asyncio.Future[int]  # the count once delivered; Unavailable if given up


class Outbox:
    """The batches a connection point sent on that are not delivered yet, in sending order."""

    def __init__(self, timeout: float = DELIVERY_TIMEOUT) -> None:
        self.timeout = timeout
        self._flights: dict[int, _Flight] = {}
        self._numbers = 0

    def __len__(self) -> int:
        return len(self._flights)

    def number(self) -> int:
        """The number of the next batch (``Updates.origin_batch``; never 0)."""
        self._numbers += 1
        return self._numbers

    def keep(self, number: int, payload: bytes, count: int) -> asyncio.Future[int]:
        """Keep batch ``number`` until :meth:`completed`; its future gives ``count`` then."""
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._flights[number] = _Flight(payload, count, time.monotonic(), done)
        return done

    def completed(self, numbers: Iterable[int]) -> int:
        """Batches delivered: forget them and resolve their futures; how many were kept."""
        found = 0
        for number in numbers:
            flight = self._flights.pop(number, None)
            if flight is not None:
                found += 1
                if not flight.done.done():
                    flight.done.set_result(flight.count)
        return found

    def unfinished(self) -> list[bytes]:
        """What to send again, in the order first sent."""
        return [flight.payload for flight in self._flights.values()]

    def expire(self, now: float | None = None) -> int:
        """Refuse (and forget) the batches older than ``timeout``; how many."""
        now = time.monotonic() if now is None else now
        expired = [n for n, f in self._flights.items() if now - f.sent > self.timeout]
        for number in expired:
            flight = self._flights.pop(number)
            if not flight.done.done():
                flight.done.set_exception(
                    Unavailable(
                        f"the update batch was not delivered within {self.timeout:g} s "
                        "(a failure in the cluster); publish it again"
                    )
                )
        return len(expired)

    def refuse(self, numbers: Iterable[int], reason: str) -> int:
        """Batches the access point refused: refuse them to their publishers (and forget
        them); how many were kept."""
        found = 0
        for number in numbers:
            flight = self._flights.pop(number, None)
            if flight is not None:
                found += 1
                if not flight.done.done():
                    flight.done.set_exception(Unavailable(reason))
        return found

    def fail_all(self, reason: str) -> None:
        """Refuse every kept batch (the connection point is stopping)."""
        for flight in self._flights.values():
            if not flight.done.done():
                flight.done.set_exception(Unavailable(reason))
        self._flights.clear()


RECENT = 1024  # numbers remembered per key: more than any publisher has in flight


class _Recent:
    """The last ``RECENT`` to ``2 * RECENT`` numbers seen of one key, and the floor below
    which every number counts as seen (the highest one forgotten)."""

    __slots__ = ("floor", "numbers")

    def __init__(self) -> None:
        self.floor = 0
        self.numbers: set[int] = set()

    def first_time(self, number: int) -> bool:
        """True (and remembered) if ``number`` was not seen before."""
        if number <= self.floor or number in self.numbers:
            return False
        self.numbers.add(number)
        if len(self.numbers) > 2 * RECENT:  # forget the oldest half at once (amortized)
            ordered = sorted(self.numbers)
            self.floor = ordered[-RECENT - 1]
            self.numbers = set(ordered[-RECENT:])
        return True


class Seen:
    """Per (origin, publisher), the batch numbers handed over here; per (publisher,
    incarnation), the highest sequences of the batches handed over.

    The first tells a copy that one connection point sent again after a failure behind it.
    The second tells a copy that the publisher itself sent again through another connection
    point after its first one died: that copy has a new origin and number, but the same
    batch, so the same highest sequence.

    Exact, not a high-water mark: a publisher's batches can arrive out of order, when a
    scale of the exit points moves the publisher to another exit point and the one it
    leaves is slower to hand over its last batch (each sends on its own stream); a late
    batch is new, and is handed over. Each key remembers its last ``RECENT`` numbers (far
    more than a publisher has in flight); a number below those counts as seen.
    """

    def __init__(self) -> None:
        self._batches: dict[tuple[int, str], _Recent] = {}
        self._sequences: dict[tuple[str, int], _Recent] = {}

    def __len__(self) -> int:
        return len(self._batches) + len(self._sequences)

    def fresh(
        self, origin: int, publisher: str, batch: int, incarnation: int = 0, last: int = 0
    ) -> bool:
        """True (and remembered) the first time a batch comes; False for a copy. A batch
        that carries no number (0) is fresh by its origin; one whose publisher gave no
        incarnation (0) is fresh by its sequences (``last``: its highest)."""
        if batch and not self._batches.setdefault((origin, publisher), _Recent()).first_time(batch):
            return False
        if incarnation:
            run = self._sequences.setdefault((publisher, incarnation), _Recent())
            if not run.first_time(last):
                return False
        return True
