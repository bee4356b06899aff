"""Subscription handles: 64-bit numbers that route a notification to its subscriber.

A connection point gives each subscription it accepts a handle::

    bits 63..48  the connection point's member sequence number (unique in the cluster)
    bits 47..24  the session's number on that connection point
    bits 23..0   the subscription's number in that session

Matchers keep the handle beside each subscription and report handles, not ids; the exit
point routes by the top bits and the connection point by the middle ones, on whole arrays.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from broker.errors import InvalidInput

__all__ = [
    "MAX_CONNECTION_POINT",
    "connection_point_of",
    "connection_points_of",
    "make_handle",
    "session_of",
    "sessions_of",
]

MAX_CONNECTION_POINT = (1 << 16) - 1
_MASK24 = (1 << 24) - 1

Handles = npt.NDArray[np.uint64]


def make_handle(connection_point: int, session: int, number: int) -> int:
    """The handle of subscription ``number`` of ``session`` on ``connection_point``."""
    if not 0 <= connection_point <= MAX_CONNECTION_POINT:
        raise InvalidInput(f"connection point number {connection_point} does not fit 16 bits")
    return (connection_point << 48) | ((session & _MASK24) << 24) | (number & _MASK24)


def connection_point_of(handle: int) -> int:
    """The connection point of one handle."""
    return handle >> 48


def connection_points_of(handles: Handles) -> Handles:
    """The connection point of each handle."""
    return handles >> np.uint64(48)


def session_of(handle: int) -> int:
    """The session number of one handle (on its connection point)."""
    return (handle >> 24) & _MASK24


def sessions_of(handles: Handles) -> Handles:
    """The session number of each handle (on its connection point)."""
    return (handles >> np.uint64(24)) & np.uint64(_MASK24)
