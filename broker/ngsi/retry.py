"""When the delivery worker sends a notification again, and how it names one.

A notification is retried while its subscription's retry window (seconds from its first
attempt) lasts: after a transport error (refused, reset, no answer in time) and after an
answer of 408, 429 or 5xx; any other answer ends it (a 4xx is the receiver's answer, a success
as Orion counts it). The wait before the next attempt is the answer's ``Retry-After`` when it
has one (429, 503) and it is longer, otherwise exponential backoff with full jitter: uniform
between 0 and ``min(cap, first * 2 ** (attempt - 1))``. A retry that could not start within
the window is not made: the notification is given up.

Every notification carries :data:`ID_HEADER`, the same on each of its attempts and unique
among notifications (a random prefix per worker and a count), so that a receiver can drop a
repeat (an answer lost after the receiver took the request).
"""

from __future__ import annotations

import itertools
import random
import uuid
from dataclasses import dataclass, field

__all__ = [
    "DEFAULT_WINDOW",
    "ID_HEADER",
    "MAX_WINDOW",
    "Backoff",
    "NotificationIds",
    "retried",
    "window_problem",
]

DEFAULT_WINDOW = 60.0  # seconds a notification is retried for, by default
MAX_WINDOW = 86_400.0  # the longest window a subscription or a cluster may set
ID_HEADER = "Silbo-Notification-Id"


def window_problem(value: object, what: str) -> str | None:
    """What is wrong with ``value`` as a retry window (a number of seconds from 0 to
    :data:`MAX_WINDOW`), or None."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if number and 0 <= value <= MAX_WINDOW:  # type: ignore[operator]
        return None
    return f"{what} must be a number of seconds from 0 to {MAX_WINDOW:.0f}, not {value!r}"


def retried(status: int) -> bool:
    """Whether an answer with ``status`` is retried (408, 429 and 5xx)."""
    return status in (408, 429) or 500 <= status <= 599


@dataclass(slots=True)
class Backoff:
    """Waits between attempts (see the module doc)."""

    first: float = 0.1  # seconds: the bound of the first wait
    cap: float = 10.0  # seconds: the largest bound
    rng: random.Random = field(default_factory=random.Random)

    def delay(self, attempt: int, retry_after: float | None) -> float:
        """Seconds to wait after the ``attempt``-th failed attempt (from 1): never less than
        ``retry_after`` (an answer's Retry-After), and the backoff still grows under a
        ``Retry-After: 0``."""
        jittered = self.rng.uniform(0.0, min(self.cap, self.first * 2 ** min(attempt - 1, 30)))
        return jittered if retry_after is None else max(retry_after, jittered)


class NotificationIds:
    """Ids of notifications: unique within a worker and across workers."""

    def __init__(self) -> None:
        self._prefix = uuid.uuid4().hex[:16].encode()
        self._count = itertools.count(1)

    def next(self) -> bytes:
        """A new id's header line."""
        return b"%s: %s-%x\r\n" % (ID_HEADER.encode(), self._prefix, next(self._count))
