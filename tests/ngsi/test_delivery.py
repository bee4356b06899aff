"""The delivery worker's bounds: its backlog alone, then the worker process behind a
:class:`~broker.ngsi.notifier.Notifier` with a receiver that holds every request."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

from aiohttp import web

from broker.ngsi.change import Alteration, Change, with_change
from broker.ngsi.delivery import Backlog
from broker.ngsi.entity import to_wire
from broker.ngsi.front import delivery_config
from broker.ngsi.notifier import Notifier
from ngsi.conftest import free_port, plain_subscription


def test_backlog_refuses_past_a_keys_bound_and_drops_the_longests_oldest_past_the_total() -> None:
    backlog: Backlog[str, int] = Backlog(per_key=3, total=5)
    assert [backlog.push("a", i) for i in range(4)] == [(True, None)] * 3 + [(False, None)]
    assert backlog.push("b", 10) == (True, None)
    assert backlog.push("b", 11) == (True, None)  # 5 in all now
    assert backlog.push("c", 20) == (True, "a")  # a has the most: its oldest (0) goes
    assert backlog.push("c", 21)[1] in ("a", "b")  # a and b have 2 each: either loses one
    assert len(backlog) == 5
    assert backlog.length("a") + backlog.length("b") == 3
    assert [backlog.pop("c"), backlog.pop("c"), backlog.pop("c")] == [20, 21, None]
    assert backlog.clear("b") + backlog.clear("a") == 3
    assert len(backlog) == 0 and backlog.pop("a") is None
    assert backlog.push("a", 4) == (True, None)


def test_the_worker_bounds_what_waits_in_all_and_counts_what_it_drops() -> None:
    got: list[tuple[str, Any]] = []

    async def scenario() -> None:
        release = asyncio.Event()

        async def held(request: web.Request) -> web.Response:
            got.append((request.headers["Fiware-Correlator"], json.loads(await request.read())))
            await release.wait()
            return web.Response(status=204)

        app = web.Application()
        app.router.add_post("/{name}", held)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        notifier = Notifier(total_limit=10)
        await notifier.start()
        try:
            a = plain_subscription("a" * 24, f"http://127.0.0.1:{port}/a")
            b = plain_subscription("b" * 24, f"http://127.0.0.1:{port}/b")
            for subscription in (a, b):
                notifier.configure(subscription, delivery_config(subscription.parsed), fails=None)
            change = Change(Alteration.CHANGE, frozenset({"x"}), correlator="c")
            entities = [
                with_change(
                    to_wire(f"E{i}", "T", "", "/", {"x": _x(i)}), change
                ).SerializeToString()
                for i in range(15)
            ]
            # one batch: 15 for a (10 wait, 5 dropped), then 3 for b (3 more of a's dropped)
            chosen = [a] * 15 + [b] * 3
            notifier.send(entities, [s.number for s in chosen], [*range(15), 0, 1, 2])
            deadline = time.monotonic() + 10
            while (a.dropped, len(got)) != (8, 2) and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert (a.dropped, b.dropped) == (8, 0)
            release.set()
            while len(got) < 10 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            while a.last_success is None or b.last_success is None:
                await asyncio.sleep(0.02)
            assert a.last_success_code == b.last_success_code == 204
            assert a.to_json(time.time())["notification"]["droppedNotifications"] == 8
        finally:
            release.set()
            await notifier.stop()
            await runner.cleanup()

    asyncio.run(scenario())
    bodies = {(body["subscriptionId"][0], body["data"][0]["id"]) for _c, body in got}
    # a's oldest went: E0 to E4 for its own E10 to E14, E5 to E7 for b's three
    assert bodies == {("a", f"E{i}") for i in range(8, 15)} | {("b", f"E{i}") for i in range(3)}
    assert len(got) == 10
    numbers = {body["data"][0]["id"]: c for c, body in got if body["subscriptionId"][0] == "b"}
    assert numbers["E0"] == "c; cbnotif=2"  # a's went first (and was dropped)


def _x(i: int) -> dict[str, Any]:
    return {"type": "Number", "value": i, "metadata": {}}
