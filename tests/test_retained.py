"""What an exit point keeps of its deliveries for sessions resumed elsewhere, and how a
resuming connection point turns it into the new session's notifications."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from broker.roles.session_resume import old_sessions, remapped
from broker.runtime.handles import make_handle
from broker.runtime.retained import Retained
from broker.wire import internal_pb2 as wire


def _deliveries(*notifications: tuple[int, int]) -> wire.Deliveries:
    """Deliveries of (handle, sequence) pairs, one entity per distinct sequence."""
    sequences = sorted({s for _h, s in notifications})
    return wire.Deliveries(
        entities=[f"e{s}".encode() for s in sequences],
        publishers=["p"] * len(sequences),
        sequences=sequences,
        entity_index=[sequences.index(s) for _h, s in notifications],
        handles=np.asarray([h for h, _s in notifications], dtype="<u8").tobytes(),
    )


def _pairs(deliveries: wire.Deliveries | wire.NotificationBatchOut) -> list[tuple[int, int]]:
    handles = np.frombuffer(deliveries.handles, dtype="<u8").tolist()
    index = deliveries.entity_index
    indexes = np.frombuffer(index, dtype="<u4").tolist() if isinstance(index, bytes) else index
    return [(h, deliveries.sequences[i]) for h, i in zip(handles, indexes, strict=True)]


A1, A2, B1 = make_handle(3, 1, 1), make_handle(3, 1, 2), make_handle(3, 2, 1)


def test_a_reachable_connection_points_deliveries_are_kept_for_the_recent_window() -> None:
    kept = Retained(recent=3.0, grace=30.0)
    kept.keep(3, _deliveries((A1, 1)), 10, now=0.0)
    kept.keep(3, _deliveries((A1, 2)), 10, now=2.0)
    kept.sent(3, True, now=2.0)
    kept.keep(3, _deliveries((A1, 3)), 10, now=4.0)  # the first is past the window
    assert [_pairs(d) for d in kept.replay(3, 1)] == [[(A1, 2)], [(A1, 3)]]
    assert kept.size == 20
    kept.sweep(now=10.0)
    assert len(kept) == 0


def test_once_a_send_fails_everything_is_kept_for_the_grace() -> None:
    kept = Retained(recent=3.0, grace=30.0)
    kept.keep(3, _deliveries((A1, 1)), 10, now=0.0)
    kept.sent(3, False, now=0.0)
    for t in range(1, 20):
        kept.keep(3, _deliveries((A1, t + 1)), 10, now=float(t))
        kept.sent(3, False, now=float(t))
    kept.sweep(now=29.0)
    assert len(kept) == 20  # nothing trimmed while unreachable
    kept.sweep(now=31.0)
    assert len(kept) == 0  # the grace is over: forgotten


def test_a_connection_point_reachable_again_is_trimmed_again() -> None:
    kept = Retained(recent=3.0, grace=30.0)
    kept.keep(3, _deliveries((A1, 1)), 10, now=0.0)
    kept.sent(3, False, now=0.0)
    kept.keep(3, _deliveries((A1, 2)), 10, now=10.0)
    kept.sent(3, True, now=10.0)
    kept.sweep(now=11.0)
    assert [_pairs(d) for d in kept.replay(3, 1)] == [[(A1, 2)]]


def test_what_is_kept_is_bounded_in_bytes_the_oldest_dropped() -> None:
    kept = Retained(recent=3.0, grace=30.0, limit=25)
    for s in range(1, 5):
        kept.keep(3, _deliveries((A1, s)), 10, now=0.0)
    assert kept.size == 20 and kept.dropped == 2
    assert [_pairs(d) for d in kept.replay(3, 1)] == [[(A1, 3)], [(A1, 4)]]


def test_a_replay_gives_one_session_of_one_connection_point_in_order() -> None:
    kept = Retained()
    other = make_handle(4, 1, 1)  # another connection point, same session number
    kept.keep(3, _deliveries((A1, 1), (B1, 1), (A2, 1)), 30, now=0.0)
    kept.keep(4, _deliveries((other, 2)), 10, now=0.0)
    kept.keep(3, _deliveries((B1, 3)), 10, now=0.0)
    kept.keep(3, _deliveries((A2, 4), (B1, 4)), 20, now=0.0)
    replay = list(kept.replay(3, 1))
    assert [_pairs(d) for d in replay] == [[(A1, 1), (A2, 1)], [(A2, 4)]]
    assert [list(d.entities) for d in replay] == [[b"e1"], [b"e4"]]
    assert list(kept.replay(5, 1)) == []


def test_replayed_deliveries_take_the_new_handles() -> None:
    new_a1, new_a2 = make_handle(9, 7, 1), make_handle(9, 7, 2)
    batch = remapped(_deliveries((A1, 1), (B1, 2), (A2, 2)), {A1: new_a1, A2: new_a2})
    assert batch is not None and batch.replayed
    assert _pairs(batch) == [(new_a1, 1), (new_a2, 2)]
    assert list(batch.entities) == [b"e1", b"e2"]
    assert remapped(_deliveries((B1, 2)), {A1: new_a1}) is None
    assert old_sessions([A1, A2, B1, 0]) == [(3, 1), (3, 2)]


@given(st.lists(st.tuples(st.integers(1, 3), st.integers(1, 4)), min_size=1, max_size=30))
def test_a_replay_is_every_kept_notification_of_the_session(
    rows: list[tuple[int, int]],
) -> None:
    """Whatever the mix of sessions, the replay of each session is exactly its notifications,
    in the order kept."""
    handles = {1: A1, 2: B1, 3: make_handle(3, 3, 1)}
    kept = Retained()
    messages = [rows[i : i + 3] for i in range(0, len(rows), 3)]
    for message in messages:
        notifications = [(handles[h], s) for h, s in dict.fromkeys(message)]
        kept.keep(3, _deliveries(*notifications), 1, now=0.0)
    for session, handle in ((1, A1), (2, B1)):
        replayed = [pair for d in kept.replay(3, session) for pair in _pairs(d)]
        expected = [
            (handles[h], s)
            for message in messages
            for h, s in dict.fromkeys(message)
            if handles[h] == handle
        ]
        assert replayed == expected
