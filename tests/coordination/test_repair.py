"""Repair on a real ZooKeeper: a configuration naming a dead member is replaced by the next
epoch without it, which remembers it in ``failed`` (broker.coordination.repair)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from kazoo.client import KazooClient

from broker.coordination.configuration import (
    FAILED_KEPT,
    ClusterConfiguration,
    Configuration,
)
from broker.coordination.errors import InvalidConfiguration
from broker.coordination.membership import Membership
from broker.coordination.repair import Repairer, declare_dead, repair_once
from broker.coordination.scale import ScalePlan, begin, finish


def _register(client: KazooClient, role: str) -> Membership:
    membership = Membership(client, role, "127.0.0.1:1")
    membership.register()
    return membership


def _name(membership: Membership) -> str:
    assert membership.member is not None
    return membership.member.name


def _formed(client: KazooClient) -> tuple[list[Membership], list[Membership], list[Membership]]:
    matchers = [_register(client, "matcher") for _ in range(3)]
    exits = [_register(client, "exit-point") for _ in range(2)]
    access = [_register(client, "access-point") for _ in range(2)]
    ClusterConfiguration(client).create(
        Configuration.of(
            1,
            [_name(m) for m in matchers],
            exit_points=[_name(e) for e in exits],
            access_points=[_name(a) for a in access],
        )
    )
    return matchers, exits, access


def _current(client: KazooClient) -> Configuration:
    found = ClusterConfiguration(client).read()
    assert found is not None
    return found.configuration


def test_nothing_to_repair_while_every_member_lives(client: KazooClient) -> None:
    _formed(client)
    assert repair_once(client) is None
    assert _current(client).epoch == 1


def test_a_dead_member_of_each_layer_is_removed_and_remembered(client: KazooClient) -> None:
    matchers, exits, access = _formed(client)
    dead = [matchers[1], exits[0], access[1]]
    names = [_name(m) for m in dead]
    for membership in dead:
        assert membership.member is not None
        assert declare_dead(client, membership.member.role, membership.member.name)
    assert not declare_dead(client, "matcher", names[0])  # gone already
    repaired = repair_once(client)
    assert repaired is not None and repaired.epoch == 2
    assert sorted(repaired.removed) == sorted(names)
    current = _current(client)
    assert current.matchers == (_name(matchers[0]), _name(matchers[2]))
    assert set(current.selector.owners) == set(current.matchers)
    assert current.exit_points == (_name(exits[1]),)
    assert current.access_points == (_name(access[0]),)
    assert set(current.failed) == set(names)
    assert repair_once(client) is None  # done: nothing names the dead any more


def test_a_matchers_selector_is_kept_when_only_an_exit_point_died(client: KazooClient) -> None:
    _matchers, exits, _access = _formed(client)
    before = _current(client)
    dead = _name(exits[1])
    exits[1].leave()
    assert repair_once(client) is not None
    after = _current(client)
    assert after.selector == before.selector and after.matchers == before.matchers
    assert after.failed == (dead,)


def test_no_repair_leaves_a_cluster_without_matchers(client: KazooClient) -> None:
    matchers, _exits, _access = _formed(client)
    for membership in matchers:
        membership.leave()
    assert repair_once(client) is None
    assert _current(client).epoch == 1


def test_a_followed_scale_is_waited_for_and_a_stale_one_is_not(
    client: KazooClient, connected: Callable[[], KazooClient]
) -> None:
    matchers, _exits, _access = _formed(client)
    current = _current(client)
    plan = ScalePlan.of(current, current.next(current.matchers[:2]))
    coordinator = connected()
    begin(coordinator, plan)
    matchers[0].leave()
    assert repair_once(client) is None  # the scale ends first
    finish(coordinator, plan.id)
    assert repair_once(client) is not None


def test_failed_members_cannot_serve_and_are_kept_bounded() -> None:
    with pytest.raises(InvalidConfiguration, match="failed members serve"):
        Configuration(1, ("m1",), Configuration.of(1, ["m1"]).selector, failed=("m1",))
    configuration = Configuration.of(1, ["m1"])
    for i in range(FAILED_KEPT + 10):
        configuration = configuration.next(failed=[f"dead{i}"])
    assert len(configuration.failed) == FAILED_KEPT
    assert configuration.failed[-1] == f"dead{FAILED_KEPT + 9}"
    decoded = Configuration.decode(configuration.encode())
    assert decoded == configuration


def test_the_elected_repairer_repairs_on_its_own(
    client: KazooClient, connected: Callable[[], KazooClient]
) -> None:
    matchers, _exits, _access = _formed(client)
    repairers = [Repairer(connected(), f"r{i}") for i in range(2)]
    for repairer in repairers:
        repairer.start()
    try:
        dead = _name(matchers[2])
        matchers[2].leave()
        deadline = time.monotonic() + 10
        while dead not in _current(client).failed and time.monotonic() < deadline:
            time.sleep(0.05)
        assert dead in _current(client).failed
        assert sum(len(r.repairs) for r in repairers) == 1  # one repair, by the elected one
    finally:
        for repairer in repairers:
            repairer.stop()
