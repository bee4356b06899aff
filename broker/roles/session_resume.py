"""Resuming a client session whose connection point died (docs/failures.md).

A client whose session ended with its connection point's failure opens a session at another
connection point and subscribes again under the same ids (``replace``), naming the handle
each subscription had in the old session (``Subscribe.resume``). The matchers went on
matching the old handles meanwhile (broker/roles/matcher.py ``SESSION_GRACE``), and the exit
points kept what they made for the dead connection point (broker/runtime/retained.py). Once
the new placements are in, the connection point sends a fence through its access point:
when it is back, every update any matcher matched under an old handle (before it took the
new one) has been delivered by the exit points, so what they kept is complete. It then asks
each exit point for the old session's part (``ExitPoint.Replay``), turns the old handles into
the new ones, and puts the result on the session as ``replayed`` batches before the
subscribe's acknowledgement. The client drops what it had received before the failure (its
per-publisher sequences) and holds the new session's own notifications until the
acknowledgement, so that each comes once and in per-publisher order.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Iterable, Mapping

import grpc
import numpy as np

from broker.coordination.membership import Member
from broker.runtime.handles import connection_point_of, session_of
from broker.runtime.link import CHANNEL_OPTIONS
from broker.runtime.token import call_metadata
from broker.wire import internal_pb2 as wire
from broker.wire import internal_pb2_grpc as wire_grpc

__all__ = ["REPLAY_TIMEOUT", "old_sessions", "remapped", "replayed"]

_log = logging.getLogger(__name__)

REPLAY_TIMEOUT = 30.0  # seconds one exit point may take to send what it kept


def old_sessions(handles: Iterable[int]) -> list[tuple[int, int]]:
    """The (connection point, session) pairs the old ``handles`` belonged to."""
    return sorted({(connection_point_of(h), session_of(h)) for h in handles if h})


async def replayed(
    exit_points: Iterable[Member],
    sessions: list[tuple[int, int]],
    new_of: Mapping[int, int],
    unreached_only: bool = False,
) -> AsyncIterator[wire.NotificationBatchOut]:
    """What each exit point kept for the old ``sessions``, with the old handles turned into
    the new ones (``new_of``; a notification for any other handle is left out;
    ``unreached_only``: only what never reached the old connection point). An exit point
    that cannot be reached is logged and skipped: what it kept is lost."""
    for member in exit_points:
        try:
            async with grpc.aio.insecure_channel(member.address, options=CHANNEL_OPTIONS) as ch:
                stub = wire_grpc.ExitPointStub(ch)  # type: ignore[no-untyped-call]
                for connection_point, session in sessions:
                    request = wire.ReplayRequest(
                        connection_point=connection_point,
                        session=session,
                        unreached_only=unreached_only,
                    )
                    call = stub.Replay(request, timeout=REPLAY_TIMEOUT, metadata=call_metadata())
                    async for deliveries in call:
                        batch = remapped(deliveries, new_of)
                        if batch is not None:
                            yield batch
        except grpc.aio.AioRpcError as exc:
            _log.error("exit point %s could not replay a session: %s", member.name, exc.code())


def remapped(
    deliveries: wire.Deliveries, new_of: Mapping[int, int]
) -> wire.NotificationBatchOut | None:
    """``deliveries`` of old handles as a replayed batch under the new ones (None: none of
    its handles was resumed)."""
    old = np.frombuffer(deliveries.handles, dtype="<u8").tolist()
    rows = [i for i, handle in enumerate(old) if handle in new_of]
    if not rows:
        return None
    entity_index = np.asarray(deliveries.entity_index, dtype=np.int64)[rows]
    used, index = np.unique(entity_index, return_inverse=True)
    kept = used.tolist()
    handles = np.asarray([new_of[old[i]] for i in rows], dtype="<u8")
    return wire.NotificationBatchOut(
        entities=[deliveries.entities[i] for i in kept],
        publishers=[deliveries.publishers[i] for i in kept],
        sequences=[deliveries.sequences[i] for i in kept],
        entity_index=index.astype("<u4").tobytes(),
        handles=handles.tobytes(),
        replayed=True,
        incarnation=deliveries.incarnation,
    )
