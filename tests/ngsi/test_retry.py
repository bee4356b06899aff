"""Retried HTTP notifications (docs/ngsi.md, Retries): the rules of broker.ngsi.retry alone,
then a real front and receiver that refuse, answer 503 / 429 / 400, accept late or stay down;
every notification reaches the receiver once per Silbo-Notification-Id, in order."""

from __future__ import annotations

import asyncio
import random
import socket
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from email.utils import formatdate
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from broker.coordination.embedded import EmbeddedZooKeeper
from broker.ngsi.allow import AllowList
from broker.ngsi.change import Alteration, Change, with_change
from broker.ngsi.delivery import _target
from broker.ngsi.entity import to_wire
from broker.ngsi.front import delivery_config
from broker.ngsi.http_client import retry_after
from broker.ngsi.notifier import Notifier
from broker.ngsi.retry import ID_HEADER, Backoff, NotificationIds, retried, window_problem
from broker.ngsi.subscriptions import HttpSubscription, parse_document
from broker.runtime.options import Role
from ngsi.conftest import (
    Front,
    Notification,
    Receiver,
    free_port,
    plain_subscription,
    started_front,
    tenant,
)
from ngsi.test_notifications import get, http_subscription, publish, subscribe, wait_until

WINDOW = 5.0  # seconds: the cluster's --retry-window in this module


@pytest.fixture(scope="module")
def front(
    zookeeper: EmbeddedZooKeeper, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Front]:
    """A front whose notifications are retried for WINDOW seconds unless a subscription
    says otherwise."""
    with started_front(zookeeper, tmp_path_factory, "retry", retry_window=WINDOW) as served:
        yield served


def test_what_is_retried_and_how_long_a_window_may_be() -> None:
    assert [s for s in (200, 204, 301, 400, 404, 408, 429, 500, 503, 599) if retried(s)] == [
        408,
        429,
        500,
        503,
        599,
    ]
    assert window_problem(0, "w") is None and window_problem(2.5, "w") is None
    for bad in (-1, 86_401, "60", True, None):
        assert window_problem(bad, "w") == (
            f"w must be a number of seconds from 0 to 86400, not {bad!r}"
        )


def test_backoff_is_full_jitter_under_a_doubling_capped_bound_unless_retry_after() -> None:
    backoff = Backoff(first=0.1, cap=1.0, rng=random.Random(7))
    for attempt, bound in ((1, 0.1), (2, 0.2), (3, 0.4), (4, 0.8), (5, 1.0), (60, 1.0)):
        waits = [backoff.delay(attempt, None) for _ in range(200)]
        assert all(0 <= w <= bound for w in waits)
        assert max(waits) > bound * 0.8 and min(waits) < bound * 0.2  # spread over it all
    assert backoff.delay(3, 4.0) == 4.0
    after_zero = [backoff.delay(5, 0.0) for _ in range(200)]  # Retry-After: 0 backs off still
    assert all(0 <= w <= 1.0 for w in after_zero) and max(after_zero) > 0.8


def test_retry_after_is_seconds_or_an_http_date() -> None:
    assert retry_after(b"3") == 3.0
    assert retry_after(b"soon") is None and retry_after(b"-1") is None
    later = retry_after(formatdate(time.time() + 30, usegmt=True).encode())
    assert later is not None and 28 <= later <= 30
    assert retry_after(formatdate(time.time() - 30, usegmt=True).encode()) == 0.0


def test_notification_ids_are_unique_across_workers() -> None:
    a, b = NotificationIds(), NotificationIds()
    lines = [a.next(), a.next(), b.next()]
    assert len(set(lines)) == 3
    assert all(line.startswith(ID_HEADER.encode() + b": ") for line in lines)


def _ids(got: list[Notification]) -> list[str]:
    return [n.headers[ID_HEADER] for n in got]


def _values(got: list[Notification]) -> list[int]:
    return [n.body["data"][0]["x"]["value"] for n in got]


def _delivered(got: list[Notification], answered: list[int]) -> list[Notification]:
    """The requests answered 2xx (``answered``: the status each request got, in order)."""
    return [n for n, status in zip(got, answered, strict=False) if 200 <= status < 300]


def _setup(
    front: Front, receiver: Receiver, window: float, **notification: Any
) -> tuple[dict[str, str], str]:
    h = {"Fiware-Service": tenant()}
    body = http_subscription(receiver.url(), notification={"retryWindow": window, **notification})
    if "httpCustom" in notification:
        del body["notification"]["http"]
    return h, subscribe(front, h, body)


def test_503_twice_then_204_is_delivered_once_in_order(front: Front, receiver: Receiver) -> None:
    receiver.status = 204
    receiver.script = [(503, {}, 0.0), (503, {}, 0.0)]
    h, sid = _setup(front, receiver, 30)
    for value in range(3):
        publish(front, h, {"id": "E", "x": {"value": value}})
    got = receiver.wait_for(5)
    time.sleep(0.5)
    assert len(receiver.received()) == 5  # no more than the two retries
    assert _values(got) == [0, 0, 0, 1, 2]  # 1 and 2 waited behind the retried 0
    assert len(set(_ids(got))) == 3 and _ids(got)[0] == _ids(got)[1] == _ids(got)[2]
    assert _values(_delivered(got, [503, 503, 204, 204, 204])) == [0, 1, 2]
    wait_until(lambda: get(front, h, sid)["notification"].get("lastSuccessCode") == 204, "204")
    status = get(front, h, sid)["notification"]
    assert "failsCounter" not in status and "lastFailure" not in status


@pytest.mark.parametrize("code", [503, 429])
def test_retry_after_is_honoured(front: Front, receiver: Receiver, code: int) -> None:
    receiver.status = 204
    receiver.script = [(code, {"Retry-After": "1"}, 0.0), (code, {"Retry-After": "1"}, 0.0)]
    h, sid = _setup(front, receiver, 30)
    publish(front, h, {"id": "E", "x": {"value": 1}})
    got = receiver.wait_for(3)
    gaps = [b - a for a, b in zip(receiver.times, receiver.times[1:], strict=False)]
    assert all(gap >= 0.95 for gap in gaps), gaps  # backoff alone would wait under 0.2 s
    assert len(set(_ids(got))) == 1
    wait_until(lambda: get(front, h, sid)["notification"].get("lastSuccessCode") == 204, "204")


def test_a_400_answer_is_not_retried(front: Front, receiver: Receiver) -> None:
    receiver.status = 400
    h, sid = _setup(front, receiver, 30)
    publish(front, h, {"id": "E", "x": {"value": 1}})
    receiver.wait_for(1)
    wait_until(lambda: get(front, h, sid)["notification"].get("lastSuccessCode") == 400, "400")
    time.sleep(0.5)
    assert len(receiver.received()) == 1
    assert "failsCounter" not in get(front, h, sid)["notification"]


def test_refused_for_2_s_then_accepted_delivers_all_in_order(
    front: Front, receiver: Receiver
) -> None:
    receiver.stop()
    h, sid = _setup(front, receiver, 30)
    other = Receiver()  # another subscription's receiver is not held back
    try:
        h2 = {"Fiware-Service": tenant()}
        subscribe(front, h2, http_subscription(other.url()))
        started = time.monotonic()
        for value in range(5):
            publish(front, h, {"id": "E", "x": {"value": value}})
            publish(front, h2, {"id": "E", "x": {"value": value}})
        # all while the first receiver is still down (its window is 30 s)
        assert _values(other.wait_for(5)) == [0, 1, 2, 3, 4]
    finally:
        other.close()
    time.sleep(max(0.0, 2.0 - (time.monotonic() - started)))
    receiver.start()
    receiver.wait_for(5)
    time.sleep(0.5)  # no more than one request each
    got = receiver.received()
    assert _values(got) == [0, 1, 2, 3, 4] and len(set(_ids(got))) == 5
    wait_until(lambda: get(front, h, sid)["notification"].get("lastSuccessCode") == 200, "200")
    assert "failsCounter" not in get(front, h, sid)["notification"]


@contextmanager
def _slow_to_accept(port: int) -> Iterator[None]:
    """Listen on ``port`` without accepting, the backlog full: connecting times out."""
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(0)
    fillers = []
    try:
        for _ in range(2):  # a backlog of 0 still queues one connection
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            fillers.append(filler)
        yield
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


def test_slow_to_accept_then_accepting_delivers_once_in_order(
    front: Front, receiver: Receiver
) -> None:
    receiver.stop()
    with _slow_to_accept(receiver.port):
        h, sid = _setup(front, receiver, 30, httpCustom={"url": receiver.url(), "timeout": 300})
        for value in range(3):
            publish(front, h, {"id": "E", "x": {"value": value}})
        time.sleep(1.5)  # several connect timeouts
    receiver.start()
    receiver.wait_for(3)
    time.sleep(0.5)
    got = receiver.received()
    assert _values(got) == [0, 1, 2] and len(set(_ids(got))) == 3
    wait_until(lambda: get(front, h, sid)["notification"].get("lastSuccessCode") == 200, "200")
    assert "failsCounter" not in get(front, h, sid)["notification"]


def test_an_answer_past_the_timeout_is_sent_again_with_the_same_id(
    front: Front, receiver: Receiver
) -> None:
    receiver.script = [(200, {}, 1.0)]  # taken, but answered after the 300 ms timeout
    h, _sid = _setup(front, receiver, 30, httpCustom={"url": receiver.url(), "timeout": 300})
    publish(front, h, {"id": "E", "x": {"value": 1}})
    publish(front, h, {"id": "E", "x": {"value": 2}})
    got = receiver.wait_for(3)
    assert _values(got) == [1, 1, 2]
    ids = _ids(got)
    assert ids[0] == ids[1] != ids[2]  # the receiver can drop the repeat by its id
    assert list(dict.fromkeys(ids)) == [ids[0], ids[2]]


def _outcomes(front: Front) -> dict[str, float]:
    """The connection point's silbo_http_notifications_total, by outcome."""
    assert front.cluster is not None
    [member] = front.cluster.members_of(Role.CONNECTION_POINT)
    with urllib.request.urlopen(f"http://{member.metrics}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        sample.labels["outcome"]: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "silbo_http_notifications_total"
    }


def test_down_past_the_window_is_given_up_and_counted(front: Front, receiver: Receiver) -> None:
    receiver.stop()
    before = _outcomes(front)
    h, sid = _setup(front, receiver, 1, maxFailsLimit=5)
    for value in range(2):
        publish(front, h, {"id": "E", "x": {"value": value}})
    wait_until(
        lambda: get(front, h, sid)["notification"].get("failsCounter") == 2, "two given up", 10
    )
    after = _outcomes(front)
    assert after["gave_up"] - before.get("gave_up", 0) == 2  # the only give-ups of the module
    assert after["retried"] - before.get("retried", 0) >= 2
    status = get(front, h, sid)["notification"]
    assert status["lastFailureReason"] == "Couldn't connect to server"
    assert get(front, h, sid)["status"] == "active"
    receiver.start()
    publish(front, h, {"id": "E", "x": {"value": 9}})
    assert _values(receiver.wait_for(1)) == [9]  # the two given up are not sent any more
    wait_until(lambda: "failsCounter" not in get(front, h, sid)["notification"], "reset")


def test_the_clusters_window_is_a_subscriptions_default(front: Front, receiver: Receiver) -> None:
    receiver.stop()
    h = {"Fiware-Service": tenant()}
    sid = subscribe(front, h, http_subscription(receiver.url()))
    assert "retryWindow" not in get(front, h, sid)["notification"]
    started = time.monotonic()
    publish(front, h, {"id": "E", "x": {"value": 1}})
    wait_until(lambda: get(front, h, sid)["notification"].get("failsCounter") == 1, "given up")
    # given up once a retry would start past WINDOW s (60 s without --retry-window)
    assert time.monotonic() - started <= WINDOW + 3.0


def test_retry_window_is_validated_and_shown(front: Front, receiver: Receiver) -> None:
    h, sid = _setup(front, receiver, 2.5)
    assert get(front, h, sid)["notification"]["retryWindow"] == 2.5
    body = http_subscription(receiver.url(), notification={"retryWindow": -1})
    answer = front.call("POST", "/v2/subscriptions", body, headers=h)
    assert answer.status == 400, answer
    assert answer.body["description"] == (
        "notification.retryWindow must be a number of seconds from 0 to 86400, not -1"
    )
    patched = {"notification": {"http": {"url": receiver.url()}, "retryWindow": 0}}
    answer = front.call("PATCH", f"/v2/subscriptions/{sid}", patched, headers=h)
    assert answer.status == 204, answer
    assert get(front, h, sid)["notification"]["retryWindow"] == 0


def test_the_worker_counts_retries_give_ups_and_overflow_as_failures() -> None:
    counted: dict[str, int] = {}

    def count(outcome: str, n: int) -> None:
        counted[outcome] = counted.get(outcome, 0) + n

    async def scenario() -> HttpSubscription:
        notifier = Notifier(queue_limit=2, retry_window=0.5, count=count)
        await notifier.start()
        try:
            down = plain_subscription("d" * 24, f"http://127.0.0.1:{free_port()}/n")
            notifier.configure(down, delivery_config(down.parsed), fails=None)
            change = Change(Alteration.CHANGE, frozenset({"x"}))
            entities = [with_change(to_wire("E", "T", "", "/", {}), change).SerializeToString()]
            # one batch, read before any is sent: two queued, three refused by the full queue
            notifier.send(entities, [down.number] * 5, [0] * 5)
            deadline = time.monotonic() + 10
            while counted.get("gave_up", 0) < 2 and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            assert await notifier.idle(5)
            return down
        finally:
            await notifier.stop()

    down = asyncio.run(scenario())
    assert counted["gave_up"] == 2 and counted["dropped"] == 3 and counted["retried"] >= 2
    assert "delivered" not in counted
    assert (down.dropped, down.fails_counter) == (3, 5)
    assert down.last_failure_reason == "Couldn't connect to server"  # the last to end


def test_a_subscription_cannot_set_the_notification_id_header() -> None:
    url = f"http://127.0.0.1:{free_port()}/n"
    document = {
        "subject": {"entities": [{"idPattern": ".*"}]},
        "notification": {"httpCustom": {"url": url, "headers": {ID_HEADER: "mine", "X-A": "b"}}},
    }
    target, _service = _target(delivery_config(parse_document(document, AllowList.parse())))
    assert target is not None
    head = target.head(b"", 0).lower()
    assert b"x-a: b" in head and ID_HEADER.lower().encode() not in head
