"""The upstream backup's parts: the outbox (kept until delivered, refused after a timeout)
and the receiver's copy detection (broker.runtime.backup)."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from broker.errors import Unavailable
from broker.runtime.backup import Outbox, Seen


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
    assert not seen.fresh(1, "p", 3) and not seen.fresh(1, "p", 2)
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
