"""The upstream backup's parts: the outbox (kept until delivered, refused after a timeout)
and the receiver's copy detection (broker.runtime.backup)."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.errors import Unavailable
from broker.runtime.backup import RECENT, Outbox, Seen


def test_a_kept_batch_resolves_with_its_count_once_completed() -> None:
    async def scenario() -> None:
        outbox = Outbox()
        first, second = outbox.number(), outbox.number()
        assert (first, second) == (1, 2)
        done_first = outbox.keep(first, b"one", 3)
        done_second = outbox.keep(second, b"two", 5)
        assert outbox.unfinished() == [b"one", b"two"]
        assert outbox.completed([second, 99]) == 1  # an unknown number is ignored
        assert await done_second == 5 and not done_first.done()
        assert outbox.unfinished() == [b"one"] and len(outbox) == 1
        assert outbox.completed([second]) == 0  # a second report changes nothing

    asyncio.run(scenario())


def test_what_is_not_delivered_in_time_is_refused_never_dropped() -> None:
    async def scenario() -> None:
        outbox = Outbox(timeout=10.0)
        old = outbox.keep(outbox.number(), b"old", 1)
        fresh = outbox.keep(outbox.number(), b"fresh", 1)
        sent = {1: 0.0, 2: 8.0}
        for number, at in sent.items():
            outbox._flights[number].sent = at
        assert outbox.expire(now=10.5) == 1
        with pytest.raises(Unavailable, match="not delivered within 10 s"):
            await old
        assert not fresh.done() and outbox.unfinished() == [b"fresh"]
        outbox.fail_all("stopping")
        with pytest.raises(Unavailable, match="stopping"):
            await fresh
        assert len(outbox) == 0

    asyncio.run(scenario())


def test_a_copy_is_dropped_per_origin_and_publisher() -> None:
    seen = Seen()
    assert seen.fresh(1, "p", 1) and seen.fresh(1, "p", 3)
    assert not seen.fresh(1, "p", 3) and not seen.fresh(1, "p", 1)
    # late, not a copy: an exit point the publisher moved away from handed it over last
    assert seen.fresh(1, "p", 2) and not seen.fresh(1, "p", 2)
    assert seen.fresh(2, "p", 1)  # another origin
    assert seen.fresh(1, "q", 2)  # another publisher of the same origin
    assert seen.fresh(1, "p", 0) and seen.fresh(1, "p", 0)  # unnumbered: always handed over


@given(
    st.lists(st.integers(1, 4), min_size=1, max_size=40),  # publisher of each batch, in order
    st.data(),
)
def test_batches_sent_again_after_a_failure_are_handed_over_exactly_once(
    publishers: list[int], data: st.DataObject
) -> None:
    """A failure cuts the stream after a prefix of what was sent; everything unfinished is
    sent again, in order, then new batches follow: every batch is handed over once."""
    numbers = list(range(1, len(publishers) + 1))
    cut = data.draw(st.integers(0, len(numbers)), label="handed over before the failure")
    # what was delivered but not reported completed yet is sent again too
    reported = data.draw(st.integers(0, cut), label="reported completed before the failure")
    seen = Seen()
    handed = [n for n in numbers[:cut] if seen.fresh(9, f"p{publishers[n - 1]}", n)]
    again = numbers[reported:]
    handed += [n for n in again if seen.fresh(9, f"p{publishers[n - 1]}", n)]
    newer = itertools.count(len(numbers) + 1)
    extra = [next(newer) for _ in range(3)]
    handed += [n for n in extra if seen.fresh(9, "p1", n)]
    assert handed == numbers + extra


def test_a_late_batch_is_fresh_and_old_numbers_count_as_seen() -> None:
    seen = Seen()
    # a scale of the exit points moved the publisher: batch 5 (sequences up to 50) arrives
    # from the new exit point before batch 4 (up to 40) from the old one
    assert seen.fresh(1, "p", 5, incarnation=7, last=50)
    assert seen.fresh(1, "p", 4, incarnation=7, last=40)
    assert not seen.fresh(1, "p", 4, incarnation=7, last=40)
    assert not seen.fresh(2, "p", 9, incarnation=7, last=40)  # its copy, through another one
    for number in range(6, 6 + 2 * RECENT + 1):  # far more than ever in flight
        assert seen.fresh(1, "p", number, incarnation=7, last=number * 10)
    assert not seen.fresh(1, "p", 3, incarnation=7, last=30)  # below what is remembered


def test_a_copy_through_another_origin_is_dropped_by_the_publishers_incarnation() -> None:
    seen = Seen()
    assert seen.fresh(1, "p", 1, incarnation=7, last=10)
    assert not seen.fresh(2, "p", 1, incarnation=7, last=10)  # sent again elsewhere
    assert seen.fresh(2, "p", 2, incarnation=7, last=5)  # never seen: late, not a copy
    assert not seen.fresh(3, "p", 1, incarnation=7, last=5)  # its copy
    assert seen.fresh(2, "p", 3, incarnation=7, last=11)
    assert seen.fresh(2, "p", 4, incarnation=8, last=1)  # the publisher started again
    assert seen.fresh(3, "q", 1, incarnation=7, last=1)  # another publisher
    assert seen.fresh(4, "p", 1, incarnation=0, last=1)  # no incarnation: by origin only


@given(
    st.lists(st.integers(1, 5), min_size=1, max_size=30),  # updates in each batch, in order
    st.data(),
)
def test_batches_a_publisher_sends_again_through_another_origin_are_handed_over_once(
    sizes: list[int], data: st.DataObject
) -> None:
    """The publisher's connection point A dies after sending a prefix of its batches; the
    client sends everything unacknowledged again through B (new origin, new numbers, the
    same sequences) and goes on there. What A sent still arrives, interleaved in any way with
    B's (each path in its own order; what was acknowledged had arrived before A died): every
    update is handed over once, in order."""
    firsts = list(itertools.accumulate([1, *sizes[:-1]]))
    lasts = [first + size - 1 for first, size in zip(firsts, sizes, strict=True)]
    sent_by_a = data.draw(st.integers(0, len(sizes)), label="batches A sent before dying")
    acknowledged = data.draw(st.integers(0, sent_by_a), label="acknowledged by then")
    path_a = [(1, n + 1, lasts[n]) for n in range(sent_by_a)]
    path_b = [(2, i + 1, lasts[n]) for i, n in enumerate(range(acknowledged, len(sizes)))]
    in_flight = [0] * (sent_by_a - acknowledged) + [1] * len(path_b)
    order = [0] * acknowledged + data.draw(st.permutations(in_flight), label="arrival")
    paths = [iter(path_a), iter(path_b)]
    seen = Seen()
    handed: list[int] = []
    for which in order:
        origin, number, last = next(paths[which])
        if seen.fresh(origin, "p", number, incarnation=42, last=last):
            handed.append(last)
    assert handed == lasts
