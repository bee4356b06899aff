"""What an exit point keeps of its deliveries, so that a session can be resumed elsewhere.

A connection point that dies takes with it what it had of its sessions' notifications: the
deliveries queued on its link from the exit point, those in its memory, those on their way
to its clients. A client whose connection point died subscribes again at another one,
resuming the old session (``Subscribe.resume``); meanwhile the matchers keep matching the
old handles (for ``SESSION_GRACE`` after the connection point left; broker/roles/matcher.py),
so the exit points go on producing deliveries for a connection point that is gone.

:class:`Retained` keeps, per connection point, every ``Deliveries`` message the exit point
made for it, in order:

- while the connection point is *reachable* (the last send to it went through), only the
  last ``recent`` seconds of them: enough to cover what was in flight, queued or not yet
  written to its clients when it dies (a client that reads slower than that may lose what
  waited longer: docs/failures.md);
- once a send to it failed (its link went down, or it has none), all of them, for ``grace``
  seconds: what the connection point would have delivered since.

A resuming connection point asks each exit point for the old session's part of it
(:meth:`Retained.replay`), after a fence has shown that every update matched under the old
handles has been delivered here; the client drops what it had received already. Memory is
bounded per connection point (``limit`` bytes; the oldest are dropped past it, counted).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from broker.runtime.handles import sessions_of
from broker.runtime.options import SESSION_GRACE
from broker.wire import internal_pb2 as wire

__all__ = ["LIMIT", "RECENT", "Retained"]

RECENT = 3.0  # seconds of deliveries kept for a reachable connection point
LIMIT = 64 << 20  # bytes kept per connection point


@dataclass(eq=False)
class _Kept:
    """One connection point's deliveries, oldest first."""

    # (when, the deliveries, their size, whether the send went through)
    messages: deque[list[Any]] = field(default_factory=deque)
    size: int = 0  # bytes (serialized) in messages
    unreachable_since: float | None = None  # None: the last send went through


class Retained:
    """Per connection point, the deliveries an exit point made for it (see the module doc)."""

    def __init__(
        self, recent: float = RECENT, grace: float = SESSION_GRACE, limit: int = LIMIT
    ) -> None:
        self.recent = recent
        self.grace = grace
        self.limit = limit
        self.dropped = 0  # messages dropped past the limit
        self._kept: dict[int, _Kept] = {}

    def __len__(self) -> int:
        return sum(len(kept.messages) for kept in self._kept.values())

    @property
    def size(self) -> int:
        """Bytes kept in all."""
        return sum(kept.size for kept in self._kept.values())

    def keep(
        self, connection_point: int, deliveries: wire.Deliveries, size: int, now: float
    ) -> None:
        """Keep ``deliveries`` (``size`` bytes serialized) made for ``connection_point``."""
        kept = self._kept.setdefault(connection_point, _Kept())
        kept.messages.append([now, deliveries, size, False])
        kept.size += size
        while kept.size > self.limit and len(kept.messages) > 1:
            kept.size -= kept.messages.popleft()[2]
            self.dropped += 1
        self._trim(kept, now)

    def sent(self, connection_point: int, reached: bool, now: float) -> None:
        """A send to ``connection_point`` went through (``reached``) or failed."""
        kept = self._kept.get(connection_point)
        if kept is None:
            return
        if kept.messages:
            kept.messages[-1][3] = reached
        if reached:
            kept.unreachable_since = None
        elif kept.unreachable_since is None:
            kept.unreachable_since = now

    def sweep(self, now: float | None = None) -> None:
        """Trim what is older than the connection points' windows; forget those unreachable
        for longer than ``grace``."""
        now = time.monotonic() if now is None else now
        for connection_point, kept in list(self._kept.items()):
            since = kept.unreachable_since
            if since is not None and now - since > self.grace:
                del self._kept[connection_point]
            else:
                self._trim(kept, now)

    def replay(
        self, connection_point: int, session: int, unreached_only: bool = False
    ) -> Iterator[wire.Deliveries]:
        """The deliveries kept for ``session`` of ``connection_point``, in order, each cut
        down to that session's notifications (``unreached_only``: those whose send failed)."""
        kept = self._kept.get(connection_point)
        if kept is None:
            return
        wanted = np.uint64(session)
        for _at, deliveries, _size, reached in list(kept.messages):
            if reached and unreached_only:
                continue
            handles = np.frombuffer(deliveries.handles, dtype="<u8")
            chosen = sessions_of(handles) == wanted
            if chosen.any():
                yield _part(deliveries, handles, chosen)

    def _trim(self, kept: _Kept, now: float) -> None:
        if kept.unreachable_since is not None:
            return  # everything since is wanted
        messages = kept.messages
        while messages and now - messages[0][0] > self.recent:
            kept.size -= messages.popleft()[2]


def _part(
    deliveries: wire.Deliveries, handles: npt.NDArray[np.uint64], chosen: npt.NDArray[np.bool_]
) -> wire.Deliveries:
    """``deliveries`` cut down to the notifications ``chosen``."""
    entity_index = np.asarray(deliveries.entity_index, dtype=np.int64)[chosen]
    used, index = np.unique(entity_index, return_inverse=True)
    rows = used.tolist()
    return wire.Deliveries(
        entities=[deliveries.entities[i] for i in rows],
        publishers=[deliveries.publishers[i] for i in rows],
        sequences=[deliveries.sequences[i] for i in rows],
        entity_index=index.tolist(),
        handles=handles[chosen].tobytes(),
        origin=deliveries.origin,
        origin_batch=deliveries.origin_batch,
        incarnation=deliveries.incarnation,
    )
