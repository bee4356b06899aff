"""The NGSI v2 fronts' registry against a real ZooKeeper: what is kept, who owns it, who
adopts an orphan, and what a lost session does."""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kazoo.client import KazooClient

from broker.coordination.errors import CoordinationError
from broker.coordination.http_subscriptions import (
    FRONTS,
    OWNERS,
    STATUS,
    Registry,
    Stored,
    heir,
    release_dead_front,
)

from .conftest import Expire


class _Front:
    """A registry on its own client, its fronts callbacks recorded."""

    def __init__(self, client: KazooClient, loop: asyncio.AbstractEventLoop, name: str) -> None:
        self.seen: list[tuple[dict[str, str], bool]] = []
        self.registry = Registry(client, loop, name, f"127.0.0.1:{1000 + len(name)}", self._seen)

    def _seen(self, fronts: dict[str, str], renewed: bool) -> None:
        self.seen.append((fronts, renewed))


def _stored(subscription_id: str, **status: Any) -> Stored:
    document = {"subject": {"entities": [{"idPattern": ".*"}]}, "notification": {}}
    return Stored(subscription_id, "t1", "/", document, time.time(), dict(status))


async def _until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.02)


def test_a_subscription_is_kept_owned_and_forgotten(
    connected: Callable[[], KazooClient],
) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        front = _Front(connected(), loop, "cp-1")
        registry = front.registry
        await registry.join()
        await _until(lambda: bool(front.seen), "the fronts seen")
        assert front.seen[-1] == ({"cp-1": "127.0.0.1:1004"}, False)
        kept = _stored("a" * 24)
        await registry.create(kept)
        assert await registry.exists(kept.id)
        assert await registry.owner(kept.id) == "cp-1"
        assert await registry.orphans() == []
        await registry.save_status([(kept.id, {"timesSent": 3, "status": "inactive"})])
        read = await registry.read(kept.id)
        assert read is not None
        assert (read.tenant, read.scope, read.document) == ("t1", "/", kept.document)
        assert read.status == {"timesSent": 3, "status": "inactive"}
        gone = "f" * 24  # a subscription deleted meanwhile fails its batch, not the others
        await registry.save_status([(gone, {"timesSent": 9}), (kept.id, {"timesSent": 4})])
        read = await registry.read(kept.id)
        assert read is not None and read.status == {"timesSent": 4}
        assert not await registry.exists(gone) and await registry.read(gone) is None
        assert front.registry._client.exists(f"{STATUS}/{gone}") is None
        with pytest.raises(CoordinationError, match="NodeExists"):  # the id is taken
            await registry.create(kept)
        await registry.release([kept.id])
        assert await registry.orphans() == [kept.id]
        assert await registry.claim(kept.id)
        await registry.remove(kept.id)
        assert not await registry.exists(kept.id)
        assert await registry.read(kept.id) is None
        assert await registry.owner(kept.id) is None
        assert not await registry.claim(kept.id)  # gone: nothing to own
        assert await registry.orphans() == []
        await registry.leave()

    asyncio.run(scenario())


def test_one_front_wins_an_orphan_and_a_lost_session_orphans_what_it_owned(
    connected: Callable[[], KazooClient], expire: Expire
) -> None:
    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        first_client = connected()
        first, second = _Front(first_client, loop, "cp-1"), _Front(connected(), loop, "cp-2")
        for front in (first, second):
            await front.registry.join()
        await _until(lambda: len(second.seen[-1][0]) == 2 if second.seen else False, "both")
        ids = [f"{i:024x}" for i in range(20)]
        for subscription_id in ids:
            await first.registry.create(_stored(subscription_id))
        await first.registry.release(ids)
        wins = await asyncio.gather(*(f.registry.claim(i) for i in ids for f in (first, second)))
        pairs = list(zip(wins[0::2], wins[1::2], strict=True))
        assert all(a != b for a, b in pairs), "exactly one front wins each orphan"
        owned_by_first = [i for i, (a, _b) in zip(ids, pairs, strict=True) if a]
        await asyncio.to_thread(expire, first_client)
        # the lost session took its owner znodes with it, and its fronts entry
        await _until(lambda: any(renewed for _f, renewed in first.seen), "renewed")
        assert sorted(await second.registry.orphans()) == sorted(owned_by_first)
        await _until(lambda: "cp-1" in second.seen[-1][0], "re-announced")
        await first.registry.leave()
        await _until(lambda: "cp-1" not in second.seen[-1][0], "gone from the fronts")

    asyncio.run(scenario())


def test_owner_znodes_are_ephemeral(
    connected: Callable[[], KazooClient], client: KazooClient
) -> None:
    async def scenario() -> None:
        owner_client = connected()
        front = _Front(owner_client, asyncio.get_running_loop(), "cp-9")
        await front.registry.join()
        await front.registry.create(_stored("b" * 24))
        owner_client.stop()
        assert client.get_children(OWNERS) == []

    asyncio.run(scenario())


def test_a_dead_fronts_claims_are_released_at_once_and_only_its_own(
    connected: Callable[[], KazooClient], client: KazooClient
) -> None:
    """The supervisor saw a front's process exit: its claims and its fronts entry go now,
    not after its session timeout, so the others adopt its subscriptions at once."""

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        dead, live = _Front(connected(), loop, "cp-dead"), _Front(connected(), loop, "cp-live")
        for front in (dead, live):
            await front.registry.join()
        await dead.registry.create(_stored("d" * 24))
        await dead.registry.create(_stored("e" * 24))
        await live.registry.create(_stored("f" * 24))
        await _until(lambda: len(live.seen[-1][0]) == 2 if live.seen else False, "both")
        # what a live front scanning on the fronts change would find: every claim gone
        # already (the entry goes last; first, a scan found some claims still there)
        watcher = connected()
        claims_when_gone: list[int] = []

        def fronts_changed(fronts: list[str]) -> bool:
            if "cp-dead" not in fronts and not claims_when_gone:
                owners = [watcher.get(f"{OWNERS}/{i}")[0] for i in watcher.get_children(OWNERS)]
                claims_when_gone.append(sum(b"cp-dead" in data for data in owners))
            return not claims_when_gone

        watcher.ChildrenWatch(FRONTS, fronts_changed)
        assert release_dead_front(client, "cp-dead") == 2  # its session still lives
        await _until(lambda: bool(claims_when_gone), "the watch saw it gone")
        assert claims_when_gone == [0]
        assert sorted(await live.registry.orphans()) == ["d" * 24, "e" * 24]
        assert await live.registry.owner("f" * 24) == "cp-live"
        await _until(lambda: "cp-dead" not in live.seen[-1][0], "gone from the fronts")
        assert release_dead_front(client, "cp-gone") == 0

    asyncio.run(scenario())


@given(
    st.lists(st.text("0123456789abcdef", min_size=24, max_size=24), min_size=1, unique=True),
    st.lists(st.text("abcdefgh-0123", min_size=1, max_size=12), min_size=1, unique=True),
)
def test_the_heir_is_one_of_the_fronts_whatever_their_order(
    ids: list[str], fronts: list[str]
) -> None:
    for subscription_id in ids:
        chosen = heir(subscription_id, fronts)
        assert chosen in fronts
        assert heir(subscription_id, list(reversed(fronts))) == chosen
        # a front leaving moves only what it held
        others = [f for f in fronts if f != chosen]
        for gone in others:
            rest = [f for f in fronts if f != gone]
            assert heir(subscription_id, rest) == chosen
    assert heir("a" * 24, []) is None


def test_a_dead_fronts_subscriptions_spread_over_the_others() -> None:
    fronts = [f"connection-point-{i}" for i in range(4)]
    counts = collections.Counter(heir(f"{i:024x}", fronts) for i in range(4000))
    assert set(counts) == set(fronts)
    assert min(counts.values()) > 800  # an even share is 1,000
