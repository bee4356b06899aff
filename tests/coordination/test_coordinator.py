"""The scale coordinator's failure cases, against a real ZooKeeper with stand-in participants.

The participants are memberships and reports written by the test: each case stops the scale
at a chosen step (before the switch: some matcher not ready; after it: some matcher never
done) and then kills a participant or ends the coordinator's session, and checks the
outcome the coordinator reports, the configuration and what ``/scale`` holds afterwards.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future

import pytest
from kazoo.client import KazooClient

from broker.coordination.configuration import ClusterConfiguration, Configuration
from broker.coordination.coordinator import LOST_AFTER, LOST_BEFORE, ScaleOutcome, scale_matchers
from broker.coordination.membership import Membership
from broker.coordination.scale import (
    OWNER,
    SCALE,
    ScalePlan,
    begin,
    read_plan,
    read_state,
    report,
)
from broker.runtime.peers import ScaleView

Expire = Callable[[KazooClient], None]
TIMEOUT = 30.0  # the scale's; every failure here must end it long before


class Matchers:
    """Stand-in matchers: each registered on its own client (its session is its life)."""

    def __init__(self, connected: Callable[[], KazooClient], count: int) -> None:
        self.clients = [connected() for _ in range(count)]
        self.names = []
        for i, client in enumerate(self.clients):
            member = Membership(client, "matcher", f"127.0.0.1:{7000 + i}").register()
            self.names.append(member.name)

    def kill(self, index: int) -> None:
        """The matcher dies: its session ends, its member znode goes."""
        self.clients[index].stop()
        self.clients[index].close()


@pytest.fixture
def coordinator(connected: Callable[[], KazooClient]) -> KazooClient:
    return connected()


def _form(client: KazooClient, matchers: list[str]) -> None:
    ClusterConfiguration(client).create(Configuration.of(1, matchers))


def _epoch(client: KazooClient) -> int:
    current = ClusterConfiguration(client).read()
    assert current is not None
    return current.epoch


def _scale_in_thread(client: KazooClient, matchers: list[str]) -> Future[ScaleOutcome]:
    """Start ``scale_matchers`` on a thread; returns once its plan is published."""
    result: Future[ScaleOutcome] = Future()

    def run() -> None:
        try:
            result.set_result(scale_matchers(client, matchers, timeout=TIMEOUT))
        except BaseException as exc:
            result.set_exception(exc)

    threading.Thread(target=run, daemon=True).start()
    _until(lambda: client.exists(OWNER) is not None or result.done(), "the plan is published")
    return result


def _until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.02)


def _ready(client: KazooClient, names: list[str]) -> None:
    for name in names:
        report(client, "ready", name, {"moved": 1, "bytes": 10})


@pytest.fixture
def matchers(connected: Callable[[], KazooClient]) -> Iterator[Matchers]:
    yield Matchers(connected, 3)


@pytest.mark.parametrize("which", ["old", "new"])
def test_a_matcher_dying_before_the_switch_rolls_back_at_once(
    coordinator: KazooClient, matchers: Matchers, which: str
) -> None:
    m1, m2, m3 = matchers.names
    _form(coordinator, [m1, m2])
    scale = _scale_in_thread(coordinator, [m1, m2, m3])
    _ready(coordinator, [m1, m2])  # m3 never gets its parts
    matchers.kill(0 if which == "old" else 2)
    outcome = scale.result(timeout=TIMEOUT)
    assert outcome.outcome == "rolled back", outcome
    assert outcome.duration_s < TIMEOUT / 3
    dead = m1 if which == "old" else m3
    assert outcome.message == f"matcher {dead} went away before the switch"
    assert outcome.epoch == 1 and _epoch(coordinator) == 1
    assert read_plan(coordinator) is None


def test_a_participant_dying_after_the_switch_is_named_and_the_scale_completes(
    coordinator: KazooClient, matchers: Matchers
) -> None:
    m1, m2, m3 = matchers.names
    _form(coordinator, [m1, m2, m3])
    scale = _scale_in_thread(coordinator, [m1, m2])  # m3 leaves
    _ready(coordinator, [m1, m2])
    _until(lambda: _epoch(coordinator) == 2, "the switch")
    for name in (m1, m2):
        report(coordinator, "done", name, {"moved": 0})
    matchers.kill(2)  # before it reported done
    outcome = scale.result(timeout=TIMEOUT)
    assert outcome.outcome == "completed", outcome
    assert outcome.duration_s < TIMEOUT / 3
    assert outcome.message == f"{m3} went away during the scale (not waited for)"
    assert outcome.epoch == 2 and outcome.moved_subscriptions == 2
    assert read_plan(coordinator) is None


def test_the_coordinators_session_expiring_before_the_switch_rolls_back(
    coordinator: KazooClient, matchers: Matchers, expire: Expire, client: KazooClient
) -> None:
    m1, m2, m3 = matchers.names
    _form(client, [m1, m2])
    scale = _scale_in_thread(coordinator, [m1, m2, m3])
    plan_before = read_plan(client)
    expire(coordinator)
    outcome = scale.result(timeout=TIMEOUT)
    assert outcome.outcome == "rolled back", outcome
    assert outcome.message == LOST_BEFORE
    assert outcome.epoch == 1 and _epoch(client) == 1
    # The plan stays, stale: nobody follows it, the next scale removes it.
    state = read_state(client)
    assert state.plan == plan_before and state.stale and not state.switched
    assert state.followed is None
    _ready(client, [m1, m2, m3])  # late reports change nothing
    assert _epoch(client) == 1
    again = scale_matchers(coordinator, [m1, m2, m3], timeout=0.5)
    assert again.outcome == "rolled back" and "not ready" in again.message  # begun, though
    assert read_plan(client) is None


def test_the_coordinators_session_expiring_after_the_switch_completes(
    coordinator: KazooClient, matchers: Matchers, expire: Expire, client: KazooClient
) -> None:
    m1, m2, m3 = matchers.names
    _form(client, [m1, m2])
    scale = _scale_in_thread(coordinator, [m1, m2, m3])
    _ready(client, [m1, m2, m3])
    _until(lambda: _epoch(client) == 2, "the switch")
    expire(coordinator)  # m1 and m2 never report done
    outcome = scale.result(timeout=TIMEOUT)
    assert outcome.outcome == "completed", outcome
    assert outcome.message == LOST_AFTER
    assert outcome.epoch == 2
    # Stale but switched: the participants still follow it and finish on their own.
    state = read_state(client)
    assert state.stale and state.switched and state.followed == state.plan


def test_a_coordinator_whose_client_stops_returns_and_the_plan_goes_with_the_session(
    coordinator: KazooClient, matchers: Matchers, client: KazooClient
) -> None:
    m1, m2, m3 = matchers.names
    _form(client, [m1, m2])
    scale = _scale_in_thread(coordinator, [m1, m2, m3])
    coordinator.stop()  # every later call fails: ending the scale must not raise
    outcome = scale.result(timeout=TIMEOUT)
    assert outcome.outcome == "rolled back", outcome
    assert "session ended before the switch" in outcome.message
    assert read_state(client).followed is None


def test_a_stale_plan_is_replaced_by_the_next_scale(
    connected: Callable[[], KazooClient], client: KazooClient
) -> None:
    _form(client, ["m1"])
    dead = connected()
    old = Configuration.of(1, ["m1"])
    stale = ScalePlan.of(old, old.next(["m1", "m2"]))
    begin(dead, stale)
    dead.stop()
    dead.close()
    assert read_state(client).stale
    fresh = ScalePlan.of(old, old.next(["m1", "m3"]))
    begin(client, fresh)
    assert read_state(client).followed == fresh


def test_the_scale_view_follows_a_plan_while_its_owner_lives_or_it_switched(
    connected: Callable[[], KazooClient], client: KazooClient
) -> None:
    _form(client, ["m1"])
    old = Configuration.of(1, ["m1"])

    async def follow() -> None:
        view = ScaleView(client, asyncio.get_running_loop())
        changes: list[tuple[str | None, str | None]] = []
        view.on_change(
            lambda: changes.append(
                (view.plan.id if view.plan else None, view.ended.id if view.ended else None)
            )
        )
        try:
            for switched in (False, True):
                coordinator = connected()
                plan = ScalePlan.of(old, old.next(["m1", "m2"]))
                await asyncio.to_thread(begin, coordinator, plan)
                assert await view.wait_until(lambda: view.plan is not None, 10.0)
                assert view.plan == plan
                if switched:
                    current = ClusterConfiguration(client).read()
                    assert current is not None
                    ClusterConfiguration(client).replace(current, plan.new)
                coordinator.stop()  # the coordinator dies: its owner znode goes
                coordinator.close()
                if switched:  # still followed: the participants finish it on their own
                    await asyncio.sleep(0.5)
                    assert view.plan == plan
                    await asyncio.to_thread(client.delete, SCALE, recursive=True)
                assert await view.wait_until(lambda: view.plan is None, 10.0), (switched, changes)
                assert view.ended == plan
            ids = [c for c in changes if c[0] is not None]
            assert len(ids) == 2 and len(changes) == 4, changes  # one call per change
        finally:
            view.stop()

    asyncio.run(follow())


class _FlakyZooKeeper:
    """A client (at the interface ``report`` uses) whose first writes meet no ZooKeeper."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.created: list[str] = []

    def create(self, path: str, value: bytes) -> None:
        from kazoo.exceptions import ConnectionLoss

        if self.failures:
            self.failures -= 1
            raise ConnectionLoss()
        self.created.append(path)


def test_a_report_is_written_once_zookeeper_answers_again() -> None:
    flaky = _FlakyZooKeeper(failures=3)  # a ZooKeeper restart, seen by a participant
    report(flaky, "done", "m1", {"moved": 0}, patience=5.0)
    assert flaky.created == ["/scale/done/m1"]


def test_a_report_zookeeper_never_takes_fails_after_its_patience() -> None:
    from broker.coordination.errors import ZooKeeperUnavailable

    flaky = _FlakyZooKeeper(failures=1_000)
    started = time.monotonic()
    with pytest.raises(ZooKeeperUnavailable, match="report done for m1"):
        report(flaky, "done", "m1", {"moved": 0}, patience=0.5)
    assert 0.5 <= time.monotonic() - started < 3.0 and not flaky.created
