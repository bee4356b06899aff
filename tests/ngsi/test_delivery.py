"""The delivery worker's bounds: its backlog alone, then the worker process behind a
:class:`~broker.ngsi.notifier.Notifier` with a receiver that holds every request; and the
worker process fed on a pipe that closes with or without the quit message (its connection
point stopping it, or dying)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import subprocess
import sys
import time
from typing import Any

import msgpack
import numpy as np
from aiohttp import web

from broker.ngsi.change import Alteration, Change, with_change
from broker.ngsi.delivery import QUIT, Backlog, Config
from broker.ngsi.entity import to_wire
from broker.ngsi.front import delivery_config
from broker.ngsi.notifier import Notifier
from broker.ngsi.retry import ID_HEADER
from ngsi.conftest import Receiver, free_port, plain_subscription

SID = "d" * 24  # the subscription the worker tests hand a worker process
_MAIN = "from broker.ngsi.delivery import main; main()"  # as the notifier starts one


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


def test_a_replay_is_taken_past_a_keys_bound_and_what_follows_it_too() -> None:
    backlog: Backlog[str, int] = Backlog(per_key=2, total=100)
    assert all(backlog.push("a", i, over=True) == (True, None) for i in range(5))
    assert backlog.push("a", 5) == (True, None)  # the bound is 2 past the replay
    assert backlog.push("a", 6) == (True, None)
    assert backlog.push("a", 7) == (False, None)
    assert [backlog.pop("a") for _ in range(5)] == [0, 1, 2, 3, 4]
    assert backlog.length("a") == 2 and backlog.push("a", 8) == (False, None)
    assert backlog.clear("a") == 2 and backlog.push("a", 9) == (True, None)


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


def _worker(window: float) -> subprocess.Popen[bytes]:
    """A delivery worker process on pipes, as the notifier starts it."""
    limits = ["--concurrency=8", "--per-origin=2", "--queue-limit=100", "--total-limit=1000"]
    return subprocess.Popen(
        [sys.executable, "-c", _MAIN, *limits, f"--retry-window={window}"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _feed(worker: subprocess.Popen[bytes], config: Config, count: int, *, quit: bool) -> None:
    """Hand ``worker`` one subscription and ``count`` notifications of it (entity E, x = 0,
    1, ...), then close its pipes as the connection point does: after the quit message
    (a planned stop) or without it, its stdout unread too (it died)."""
    assert worker.stdin is not None and worker.stdout is not None
    change = Change(Alteration.CHANGE, frozenset({"x"}), correlator="c")
    entities = [
        with_change(to_wire("E", "T", "", "/", {"x": _x(i)}), change).SerializeToString()
        for i in range(count)
    ]
    numbers = np.ones(count, dtype="<u4").tobytes()
    indexes = np.arange(count, dtype="<u4").tobytes()
    messages = [["s", 1, SID, 1, None, config.to_list()], ["n", entities, numbers, indexes]]
    for message in [*messages, *([[QUIT]] if quit else [])]:
        worker.stdin.write(msgpack.packb(message))
    worker.stdin.close()
    if not quit:
        worker.stdout.close()


def _ended(worker: subprocess.Popen[bytes], timeout: float) -> str:
    """Wait for ``worker`` to exit 0 within ``timeout`` seconds; what it logged."""
    assert worker.stderr is not None
    assert worker.wait(timeout) == 0
    return worker.stderr.read().decode()


def test_a_worker_whose_connection_point_died_sends_everything_it_holds_in_order(
    receiver: Receiver,
) -> None:
    receiver.status = 204
    receiver.script = [(204, {}, 0.05)] * 10  # slow: the worker holds a queue at the end
    worker = _worker(window=5.0)
    _feed(worker, delivery_config(plain_subscription(SID, receiver.url()).parsed), 10, quit=False)
    log = _ended(worker, timeout=10.0)
    got = receiver.received()
    assert [n.body["data"][0]["x"]["value"] for n in got] == list(range(10))
    assert len({n.headers[ID_HEADER] for n in got}) == 10
    assert "the connection point is gone: sending the" in log, log
    assert "10 sent, 0 given up (0 of them still waiting or unanswered" in log, log
    assert "Traceback" not in log, log  # its reports met a closed pipe: no harm


def test_a_worker_told_to_quit_drops_what_it_holds_at_once(receiver: Receiver) -> None:
    receiver.status = 204
    receiver.script = [(204, {}, 1.0)] * 10  # sending them all would take 10 s
    worker = _worker(window=5.0)
    _feed(worker, delivery_config(plain_subscription(SID, receiver.url()).parsed), 10, quit=True)
    log = _ended(worker, timeout=5.0)
    time.sleep(0.2)
    assert len(receiver.received()) <= 1  # the one in flight, if it had left
    assert "connection point" not in log, log


def test_an_orphaned_worker_gives_up_at_its_window_plus_the_timeout() -> None:
    # refused, and the subscription's own window (30 s) longer than the worker's
    parsed = plain_subscription(SID, f"http://127.0.0.1:{free_port()}/").parsed
    config = dataclasses.replace(delivery_config(parsed), timeout=0.5, retry_window=30.0)
    worker = _worker(window=0.5)
    started = time.monotonic()
    _feed(worker, config, 3, quit=False)
    log = _ended(worker, timeout=10.0)
    assert time.monotonic() - started < 5.0  # 1 s of drain, and the worker's start
    assert "for at most 1.0 s" in log, log
    assert "0 sent, 3 given up (3 of them still waiting or unanswered at the bound)" in log, log
