"""What a client hands on when it resumes a session whose connection point died: the replay
less what it had received, then the new session's own less what it has by then, and later
copies its publisher sends again dropped (broker/client.py, docs/failures.md)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from broker.client import Client
from broker.wire import client_pb2 as pb


def _batch(
    sequences: list[int], *, incarnation: int = 5, replayed: bool = False, publisher: str = "p"
) -> pb.NotificationBatch:
    """One notification (handle 1) per sequence."""
    return pb.NotificationBatch(
        entities=[pb.Entity(id=f"e{s}") for s in sequences],
        publishers=[publisher] * len(sequences),
        sequences=sequences,
        entity_index=np.arange(len(sequences), dtype="<u4").tobytes(),
        handles=np.ones(len(sequences), dtype="<u8").tobytes(),
        replayed=replayed,
        incarnation=incarnation,
    )


class _Recording:
    def __init__(self) -> None:
        self.sequences: list[tuple[str, int]] = []
        self.client = Client("127.0.0.1:1", on_batch=self.on_batch)  # never connects

    def on_batch(self, batch: pb.NotificationBatch, _handles: dict[int, str]) -> None:
        self.sequences += list(zip(batch.publishers, batch.sequences, strict=True))

    def live(self, batch: pb.NotificationBatch) -> None:
        self.client._hand_on(batch)

    def resume(self, held: list[pb.NotificationBatch]) -> None:
        self.client._resumed = held
        self.client._hand_on_resumed()


def test_a_resume_hands_on_each_update_once_in_order() -> None:
    r = _Recording()
    r.live(_batch([1, 2, 3]))
    r.resume([_batch([2, 3, 4, 5], replayed=True)])
    # the publisher sends 3 to 5 again through another connection point, which never saw
    # them (the dead one did): they reach the new session after the resume
    r.live(_batch([3, 4]))
    r.live(_batch([5, 6]))
    r.live(_batch([7]))
    r.live(_batch([1], incarnation=9))  # the publisher started again: a new incarnation
    assert r.sequences == [("p", s) for s in range(1, 8)] + [("p", 1)]


def test_what_the_new_session_brought_before_the_ack_follows_the_replay() -> None:
    r = _Recording()
    r.live(_batch([1, 2]))
    r.resume([_batch([4, 5]), _batch([2, 3, 4], replayed=True), _batch([6])])
    r.live(_batch([7]))
    assert r.sequences == [("p", s) for s in range(1, 8)]


def test_a_replay_holding_the_publishers_copy_too_hands_it_on_once() -> None:
    """The publisher sent a batch again while the matchers still matched the old handles:
    the exit points kept both copies, and the replay has both (each path in its order)."""
    r = _Recording()
    r.live(_batch([1]))
    r.resume(
        [
            _batch([2, 3], replayed=True),  # the original
            _batch([4, 5], replayed=True),
            _batch([2, 3], replayed=True),  # the copy, through the other connection point
            _batch([4, 5], replayed=True),
            _batch([6], replayed=True),
        ]
    )
    assert r.sequences == [("p", s) for s in range(1, 7)]


def test_without_an_incarnation_only_what_the_resume_brings_is_filtered() -> None:
    r = _Recording()
    r.live(_batch([1, 2], incarnation=0))
    r.resume([_batch([2, 3], incarnation=0, replayed=True), _batch([3, 4], incarnation=0)])
    r.live(_batch([1], incarnation=0))  # a publisher that started again under the same name
    assert r.sequences == [("p", s) for s in (1, 2, 3, 4, 1)]


@given(st.integers(0, 12), st.integers(0, 12), st.integers(1, 12), st.data())
def test_whatever_the_overlaps_every_update_is_handed_on_once_in_order(
    received: int, replay_from: int, replay_to: int, data: st.DataObject
) -> None:
    """The client received 1..received; the exit points replay a range from at most
    received + 1 (what they kept) to at least received (what the dead connection point had,
    handed on or not), and the copies of a resend by the publisher; the new session brings
    the rest, from anywhere it overlaps
    (the publisher's copies through the new connection point: its own copy detection keeps
    that stream rising), in batches, some of them before the ack."""
    replay_to = max(replay_to, received)
    replay_from = min(replay_from, received + 1, replay_to)
    live_from = data.draw(st.integers(1, replay_to + 1), label="the new session's first")
    total = replay_to + data.draw(st.integers(0, 5), label="more after")
    r = _Recording()
    if received:
        r.live(_batch(list(range(1, received + 1))))
    live = list(range(live_from, total + 1))
    cuts = sorted(data.draw(st.lists(st.integers(0, len(live)), max_size=3), label="cuts"))
    batches = [live[a:b] for a, b in zip([0, *cuts], [*cuts, len(live)], strict=True)]
    batches = [b for b in batches if b]
    before_ack = data.draw(st.integers(0, len(batches)), label="batches before the ack")
    replay = [[s] for s in range(max(replay_from, 1), replay_to + 1)]
    # the publisher's copies, sent again while the old handles were still matched: kept too,
    # each path in its order, the two interleaved
    copy_from = data.draw(st.integers(1, received + 1), label="the copies' first")
    copies = [[s] for s in range(copy_from, replay_to + 1)]
    kept_order = data.draw(st.permutations([0] * len(replay) + [1] * len(copies)), label="kept")
    paths = [iter(replay), iter(copies)]
    kept = [_batch(next(paths[w]), replayed=True) for w in kept_order]
    own = [_batch(b) for b in batches[:before_ack]]
    mix = data.draw(st.permutations([0] * len(kept) + [1] * len(own)), label="arrival")
    sources = [iter(kept), iter(own)]
    held = [next(sources[w]) for w in mix]
    r.resume(held)
    for b in batches[before_ack:]:
        r.live(_batch(b))
    assert r.sequences == [("p", s) for s in range(1, total + 1)]
