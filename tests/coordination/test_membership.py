"""Membership: processes register, are listed and watched, and re-register after expiry."""

from __future__ import annotations

import json
import os
import queue
import threading
from collections.abc import Callable

import pytest
from kazoo.client import KazooClient

from broker.coordination.client import connect
from broker.coordination.embedded import EmbeddedZooKeeper
from broker.coordination.errors import CoordinationError
from broker.coordination.membership import (
    Member,
    Membership,
    MembershipState,
    members,
    watch_members,
)
from broker.errors import InvalidIdentifier

Expire = Callable[[KazooClient], None]


def test_registered_members_are_listed_by_role_and_leave(client: KazooClient) -> None:
    assert members(client) == []
    matcher = Membership(client, "matcher", "10.0.0.7:7003", pid=42, started=1000.5)
    ap = Membership(client, "ap", "10.0.0.8:7002")
    with matcher, ap:
        registered, state = matcher.member, matcher.state
        assert registered is not None and state is MembershipState.REGISTERED
        assert registered == Member("matcher", "10.0.0.7:7003", 42, 1000.5, registered.name)
        raw, stat = client.get(registered.path)
        assert json.loads(raw) == {
            "role": "matcher",
            "address": "10.0.0.7:7003",
            "pid": 42,
            "started": 1000.5,
        }
        assert stat.ephemeralOwner == client.client_id[0]
        assert [m.role for m in members(client)] == ["ap", "matcher"]
        assert members(client, "matcher") == [registered]
        assert members(client, "ap")[0].pid == os.getpid()
        assert members(client, "ep") == []
    assert members(client) == []
    assert matcher.state is MembershipState.LEFT and matcher.member is None
    matcher.leave()  # idempotent


def test_members_of_a_role_are_in_registration_order(client: KazooClient) -> None:
    joined = [Membership(client, "cp", f"host:{port}") for port in (3, 1, 2)]
    for membership in joined:
        membership.register()
    assert [m.address for m in members(client, "cp")] == ["host:3", "host:1", "host:2"]
    sequences = [m.sequence for m in members(client, "cp")]
    assert sequences == sorted(sequences)


def test_a_member_whose_session_ends_disappears(
    client: KazooClient, connected: Callable[[], KazooClient]
) -> None:
    other = connected()
    Membership(other, "ep", "host:9").register()
    assert len(members(client, "ep")) == 1
    other.stop()
    assert members(client, "ep") == []


def test_the_watch_calls_back_with_each_new_list(
    client: KazooClient, connected: Callable[[], KazooClient]
) -> None:
    seen: queue.Queue[list[str]] = queue.Queue()
    watch = watch_members(client, "matcher", lambda ms: seen.put([m.address for m in ms]))
    assert seen.get(timeout=5) == []
    other = connected()
    first = Membership(other, "matcher", "m1").register()
    assert seen.get(timeout=5) == ["m1"]
    second = Membership(other, "matcher", "m2")
    second.register()
    assert seen.get(timeout=5) == ["m1", "m2"]
    other.delete(first.path)
    assert seen.get(timeout=5) == ["m2"]
    watch.stop()
    second.leave()
    Membership(other, "matcher", "m3").register()
    with pytest.raises(queue.Empty):
        seen.get(timeout=0.3)


def test_an_expired_session_re_registers(client: KazooClient, expire: Expire) -> None:
    states: list[MembershipState] = []
    membership = Membership(client, "matcher", "m1", on_change=states.append)
    before = membership.register()

    expire(client)

    assert membership.wait_for(MembershipState.REGISTERED, timeout=10)
    after = membership.member
    assert after is not None and after.name != before.name and after.sequence > before.sequence
    assert members(client, "matcher") == [after]
    assert client.get(after.path)[1].ephemeralOwner == client.client_id[0]
    assert states[0] is MembershipState.REGISTERED
    assert states[-2:] == [MembershipState.LOST, MembershipState.REGISTERED]
    membership.leave()
    assert members(client) == []


def test_unreadable_member_data_is_skipped(client: KazooClient) -> None:
    client.create("/members/matcher/matcher-bad-", b"not json", sequence=True, makepath=True)
    with Membership(client, "matcher", "m1") as good:
        assert members(client) == [good.member]


def test_misuse_is_a_typed_error(client: KazooClient) -> None:
    with pytest.raises(InvalidIdentifier):
        Membership(client, "a/b", "host:1")
    membership = Membership(client, "ap", "host:1")
    membership.register()
    with pytest.raises(CoordinationError, match="once"):
        membership.register()


def test_leaving_cut_off_from_zookeeper_gives_up_within_the_time_given() -> None:
    """A stopping process whose ZooKeeper is away gives the delete of its registration the
    time it is given (its session's end removes it), not the client's 10-s retry deadline:
    a foreground `silbo up` took 10.6 s to stop after its ZooKeeper was restarted."""
    with EmbeddedZooKeeper() as server:
        client = connect(server.address, cluster="leaving", timeout=10)
        try:
            membership = Membership(client, "matcher", "127.0.0.1:1")
            membership.register()
            server.stop()
            raised: list[BaseException] = []

            def leave() -> None:
                try:
                    membership.leave(within=1.0)
                except BaseException as exc:
                    raised.append(exc)

            leaving = threading.Thread(target=leave, daemon=True)  # it hung, before
            leaving.start()
            leaving.join(timeout=4.0)
            assert not leaving.is_alive(), "leave() did not give up"
            (error,) = raised
            assert isinstance(error, CoordinationError) and "delete member" in str(error)
        finally:
            client.stop()
            client.close()
