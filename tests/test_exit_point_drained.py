"""An exit-point scale holds the new epoch's batches until the old exit points drained
(docs/protocol.md, "Exit points"). Two ways it let them through early, each seen as
out-of-order notifications by `silbo bench autoscale` around scales of capped, backlogged
exit points: an old exit point reported drained while its last old-epoch batch waited for
its rate after leaving its line (the Flush marker went out before it), and a new exit point
let through an epoch its configuration watch had not brought it yet."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace
from typing import Any, cast

from broker.roles.exit_point import ExitPoint, _Pending

OLD, NEW = 2, 3  # the epochs before and after the scale


class _Capped:
    """The process load of a capped exit point: ``admit`` waits until the test opens it."""

    def __init__(self) -> None:
        self.waiting = asyncio.Event()
        self.opened = asyncio.Event()

    async def admit(self, _items: float) -> None:
        self.waiting.set()
        await self.opened.wait()

    @contextmanager
    def working(self, _items: int) -> Iterator[None]:
        yield

    def output(self, _items: int) -> None:
        pass


def _old_exit_point(load: _Capped, delivered: list[int], reported: list[str]) -> ExitPoint:
    """Exit point E1 of a 1 -> 2 scale to epoch NEW: every switch marker came through, one
    batch of epoch OLD is left on access point A1's line."""
    exit_point = ExitPoint()
    loop = asyncio.get_running_loop()
    member = SimpleNamespace(sequence=1)
    exit_point._context = cast(Any, SimpleNamespace(loop=loop, load=load, name="E1", member=member))
    old = SimpleNamespace(exit_points=("E1",), matchers=("M1",))
    plan = SimpleNamespace(
        id="plan-1", layer="exit-points", old=old, new=SimpleNamespace(epoch=NEW)
    )
    exit_point._scale = cast(Any, SimpleNamespace(plan=plan))
    exit_point._access_points = cast(Any, SimpleNamespace(by_name={"A1": object()}))
    exit_point._matchers = cast(Any, SimpleNamespace(by_name={"M1": object()}))
    exit_point._ended = {"A1": {"M1": NEW}}
    exit_point._pending = {"A1": {10: _Pending(OLD, 10, 0.0, 19, completer=1)}}
    exit_point._next = {"A1": 10}

    async def deliver(pending: _Pending) -> None:
        delivered.append(pending.first_seq)

    async def flush_then_report(plan_id: str) -> None:
        reported.append(plan_id)

    async def nothing(*_args: object) -> None:
        pass

    patches = {
        "_may_deliver": lambda _epoch: True,
        "_complete": lambda _pending: True,
        "_deliver": deliver,
        "_flush_then_report": flush_then_report,
        "_send_completed": nothing,
        "_pass_fences": nothing,
    }
    for name, patch in patches.items():
        setattr(exit_point, name, patch)
    return exit_point


def test_drained_waits_for_the_old_epochs_batch_being_delivered() -> None:
    async def run() -> tuple[list[int], list[str], list[str]]:
        load, delivered, reported = _Capped(), list[int](), list[str]()
        exit_point = _old_exit_point(load, delivered, reported)
        releasing = asyncio.create_task(exit_point._release("A1"))
        await load.waiting.wait()  # the batch left its line; the rate holds it
        exit_point._check_drained()  # a switch marker arrives meanwhile
        await asyncio.sleep(0)
        before = list(reported)
        load.opened.set()
        await releasing
        await asyncio.sleep(0)
        return delivered, before, reported

    delivered, before, after = asyncio.run(run())
    assert before == [], "drained reported before the old epoch's last batch was delivered"
    assert delivered == [10] and after == ["plan-1"]


def test_an_epoch_not_seen_yet_is_held_until_seen_and_then_until_drained() -> None:
    """The matchers' partials of the new epoch can reach a new exit point before its own
    watch brings it the configuration (a loaded machine): the batches wait for it, and then
    for the old exit points' drained reports; they were let through at once."""

    async def run() -> tuple[bool, bool, list[tuple[int, tuple[str, ...] | None]]]:
        exit_point = ExitPoint()
        loop = asyncio.get_running_loop()
        exit_point._context = cast(Any, SimpleNamespace(loop=loop))
        old = SimpleNamespace(exit_points=("E1",))
        history: dict[int, Any] = {OLD: old}
        exit_point._config = cast(Any, SimpleNamespace(history=history))
        awaited: list[tuple[int, tuple[str, ...] | None]] = []

        async def await_drained(epoch: int, previous: tuple[str, ...] | None) -> None:
            awaited.append((epoch, previous))

        exit_point._await_drained = await_drained  # type: ignore[method-assign]
        unseen = exit_point._may_deliver(NEW)
        history[NEW] = SimpleNamespace(exit_points=("E1", "E2"))
        seen = exit_point._may_deliver(NEW)
        await asyncio.sleep(0)
        return unseen, seen, awaited

    unseen, seen, awaited = asyncio.run(run())
    assert (unseen, seen) == (False, False)
    assert awaited == [(NEW, ("E1",))]
