"""The load meter and the --max-rate token bucket (broker.runtime.load), on a fake clock."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from broker.cluster.local import ChildOptions, ClusterSpec
from broker.commands.up import parse_max_rates
from broker.errors import InvalidInput
from broker.runtime.load import Load, TokenBucket, blocked
from broker.runtime.options import ProcessOptions, Role


class FakeClock:
    """A clock that moves only when told (or when the load sleeps on it)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += seconds


class FakeQueue:
    def __init__(self, depth: int, since: float | None) -> None:
        self.depth, self.since = depth, since

    def waiting(self) -> tuple[int, float | None]:
        return self.depth, self.since


def a_load(clock: FakeClock, max_rate: float = 0.0) -> Load:
    return Load(max_rate=max_rate, window=5.0, clock=clock, sleep=clock.sleep)


def test_busy_fraction_and_rates_over_the_window() -> None:
    clock = FakeClock()
    load = a_load(clock)
    for _ in range(5):  # 0.2 s of work on 100 items, then 0.8 s idle, each second
        with load.working(100):
            clock.now += 0.2
        load.output(50)
        clock.now += 0.8
    sample = load.sample()
    assert sample.window == pytest.approx(5.0)
    assert sample.busy_fraction == pytest.approx(0.2)
    assert sample.input_rate == pytest.approx(100)
    assert sample.output_rate == pytest.approx(50)
    assert sample.true_rate == pytest.approx(500)  # 100 items per 0.2 busy seconds
    assert (sample.items_in, sample.items_out) == (500, 250)
    assert sample.busy_seconds == pytest.approx(1.0)


def test_overlapping_batches_count_once_and_busy_never_exceeds_wall_time() -> None:
    clock = FakeClock()
    load = a_load(clock)
    first, second = load.working(10), load.working(10)
    first.__enter__()
    clock.now += 0.5
    second.__enter__()  # another stream's batch, on the same event loop
    clock.now += 0.5
    first.__exit__(None, None, None)
    clock.now += 0.5
    second.__exit__(None, None, None)
    assert load.sample().busy_seconds == pytest.approx(1.5)


def test_a_batch_blocked_on_a_full_outbound_queue_is_not_busy() -> None:
    clock = FakeClock()
    load = a_load(clock)
    with load.working(1):
        clock.now += 0.1
        with blocked():  # the next layer is slow: its load, not ours
            clock.now += 2.0
        clock.now += 0.1
    with blocked():  # outside a batch: nothing to pause
        clock.now += 1.0
    assert load.sample().busy_seconds == pytest.approx(0.2)


def test_a_batch_in_progress_counts_and_old_work_leaves_the_window() -> None:
    clock = FakeClock()
    load = a_load(clock)
    with load.working(1000):
        clock.now += 2.0
    for _ in range(10):  # idle for 10 s, sampled now and then (as the gauges are)
        clock.now += 1.0
        load.sample()
    assert load.sample().busy_fraction == 0.0
    assert load.sample().input_rate == 0.0
    assert load.sample().busy_seconds == pytest.approx(2.0)  # the total stays
    with load.working(10):
        clock.now += 1.0
        sample = load.sample()  # mid-batch: its time so far is busy already
    assert 0.15 < sample.busy_fraction < 0.25
    assert sample.window <= 5.0 + 1.0 + 1e-9


def test_a_young_process_has_rates_over_its_life_so_far() -> None:
    clock = FakeClock()
    load = a_load(clock)
    with load.working(30):
        clock.now += 1.0
    clock.now += 1.0
    sample = load.sample()
    assert sample.window == pytest.approx(2.0)
    assert sample.busy_fraction == pytest.approx(0.5)
    assert sample.input_rate == pytest.approx(15)


def test_queue_depth_and_the_age_of_the_oldest_waiting_message() -> None:
    clock = FakeClock()
    load = a_load(clock)
    empty, behind, newer = FakeQueue(0, None), FakeQueue(3, 97.5), FakeQueue(2, 99.0)
    for queue in (empty, behind, newer):
        load.watch(queue)
    sample = load.sample()
    assert sample.queue_depth == 5
    assert sample.queue_age == pytest.approx(2.5)
    behind.depth, behind.since = 0, None
    assert load.sample().queue_age == pytest.approx(1.0)


def test_the_token_bucket_keeps_its_rate_for_batches_of_any_size() -> None:
    bucket = TokenBucket(200, burst=0.05)
    assert bucket.reserve(10, 0.0) == 0.0  # within the burst: at once
    now, waited = 0.0, 0.0
    for _ in range(100):  # a backlog of 50-item batches
        delay = bucket.reserve(50, now)
        waited += delay
        now += delay
    assert (100 * 50 + 10) / now == pytest.approx(200, rel=0.02)
    assert bucket.reserve(1000, now + 60) == pytest.approx(5.0 - 0.05 - 0.05)
    with pytest.raises(ValueError):
        TokenBucket(0)


def test_a_capped_process_under_backlog_is_busy_and_its_true_rate_is_its_cap() -> None:
    clock = FakeClock()
    load = a_load(clock, max_rate=200)

    async def backlog() -> None:
        for _ in range(200):  # 20-item batches, 1 ms of real work each: capacity 20000/s
            await load.admit(20)
            with load.working(20):
                clock.now += 0.001

    asyncio.run(backlog())
    sample = load.sample()
    assert sample.busy_fraction == pytest.approx(1.0, abs=0.02)
    assert sample.true_rate == pytest.approx(200, rel=0.05)
    assert sample.input_rate == pytest.approx(200, rel=0.05)
    assert sample.max_rate == 200


def test_a_capped_process_below_its_cap_is_busy_for_its_share_of_the_cap() -> None:
    clock = FakeClock()
    load = a_load(clock, max_rate=200)

    async def half_load() -> None:
        for _ in range(100):  # 10-item batches every 0.1 s: 100 items/s, half the cap
            started = clock.now
            await load.admit(10)
            with load.working(10):
                pass
            clock.now = started + 0.1

    asyncio.run(half_load())
    sample = load.sample()
    assert sample.busy_fraction == pytest.approx(0.5, abs=0.02)
    assert sample.true_rate == pytest.approx(200, rel=0.05)  # what it could serve
    assert sample.input_rate == pytest.approx(100, rel=0.05)


def test_an_uncapped_process_admits_at_once() -> None:
    clock = FakeClock()
    load = a_load(clock)
    asyncio.run(load.admit(10**9))
    assert clock.now == 100.0 and load.sample().busy_seconds == 0.0


@pytest.mark.parametrize("rate", [-1.0, math.inf, math.nan])
def test_a_bad_max_rate_is_refused(rate: float) -> None:
    with pytest.raises(InvalidInput, match="--max-rate must be a number of items a second"):
        ProcessOptions(Role.MATCHER, zk="h:1", max_rate=rate)


def test_up_passes_each_layer_its_max_rate(tmp_path: Path) -> None:
    rates = parse_max_rates(["matcher=200", "exit-point=1e3"])
    spec = ClusterSpec(max_rates=rates, state_dir=tmp_path)
    options = ChildOptions.from_dict(ChildOptions.of(spec).to_dict())  # via cluster.json
    assert options.arguments(Role.MATCHER, 1)[-2:] == ["--max-rate", "200"]
    assert options.arguments(Role.EXIT_POINT, 1)[-2:] == ["--max-rate", "1000"]
    assert "--max-rate" not in options.arguments(Role.ACCESS_POINT, 1)


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        (["matcher"], "must be LAYER=N"),
        (["matcher=fast"], "must be LAYER=N"),
        (["matchers=10"], "no layer 'matchers'"),
        (["matcher=-5"], "must be a number of items a second"),
        (["matcher=1", "matcher=2"], "given twice"),
    ],
)
def test_bad_max_rates_for_up_are_refused(values: list[str], problem: str) -> None:
    with pytest.raises(InvalidInput, match=problem):
        ClusterSpec(max_rates=parse_max_rates(values))


def test_a_task_started_inside_a_batch_does_not_pause_it() -> None:
    clock = FakeClock()
    load = a_load(clock)

    async def blocked_elsewhere() -> None:
        with blocked():  # inherits the batch's context, but is not the batch
            clock.now += 1.0

    async def batch() -> None:
        with load.working(1):
            await asyncio.create_task(blocked_elsewhere())
            clock.now += 0.5

    asyncio.run(batch())
    assert load.sample().busy_seconds == pytest.approx(1.5)
