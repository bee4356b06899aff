"""The decision pass of ``silbo replay`` (spark_matcher.decisions), without Spark: the front's
decision on each match of a subscription, in update order, at the update's time."""

from __future__ import annotations

import json
from typing import Any

import pytest

from broker.errors import InvalidInput
from spark_matcher.decisions import FrontSubscription, decided, fronts_of

URL = "http://127.0.0.1:1/n"
Changed = tuple[str, list[str], list[str], list[str]]  # alteration, changed, meta, requested
CREATE: Changed = ("entityCreate", ["a"], [], ["a"])
CHANGE_A: Changed = ("entityChange", ["a"], [], ["a"])
CHANGE_B: Changed = ("entityChange", ["b"], [], ["b"])
META_A: Changed = ("entityChange", [], ["a"], ["a"])
UPDATE_A: Changed = ("entityUpdate", [], [], ["a"])


def _front(sid: str, **document: Any) -> FrontSubscription:
    body = {
        "subject": {"entities": [{"idPattern": ".*"}], **document.pop("subject", {})},
        "notification": {"http": {"url": URL}},
        **document,
    }
    return FrontSubscription(sid, "", "/#", body)


def _notified(
    front: FrontSubscription | None,
    changes: list[Changed],
    times: list[float] | None = None,
    located: str | None = None,
) -> list[int]:
    """The updates (numbered in order, one per change) whose match of ``front`` notifies."""
    fronts = {} if front is None else {front.id: front}
    sid = "s" if front is None else front.id
    at = times or [1000.0 + n for n in range(len(changes))]
    rows = [(sid, n, at[n], *change, located) for n, change in enumerate(changes)]
    return [update for update, _ in decided(lambda: fronts)(rows)]


def test_the_default_alteration_types_are_create_and_change() -> None:
    assert _notified(_front("s"), [CREATE, UPDATE_A, CHANGE_A, META_A]) == [0, 2, 3]
    everything = _front("s", subject={"condition": {"alterationTypes": ["entityUpdate"]}})
    assert _notified(everything, [CREATE, UPDATE_A, CHANGE_A]) == [1]


def test_condition_attributes_and_metadata_changes() -> None:
    on_a = _front("s", subject={"condition": {"attrs": ["a"]}})
    assert _notified(on_a, [CREATE, CHANGE_B, CHANGE_A, META_A]) == [0, 2, 3]
    no_metadata = _front("s", subject={"condition": {"notifyOnMetadataChange": False}})
    assert _notified(no_metadata, [CHANGE_A, META_A]) == [0]
    updates_of_a = _front(
        "s", subject={"condition": {"attrs": ["a"], "alterationTypes": ["entityUpdate"]}}
    )
    assert _notified(updates_of_a, [UPDATE_A, ("entityUpdate", [], [], ["b"])]) == [0]


def test_oneshot_inactive_and_throttled_subscriptions() -> None:
    changes = [CHANGE_A] * 4
    assert _notified(_front("s", status="oneshot"), changes) == [0]
    assert _notified(_front("s", status="inactive"), changes) == []
    throttled = _front("s", throttling=10)
    assert _notified(throttled, changes, [0.0, 9.9, 10.0, 15.0]) == [0, 2]
    # a match that does not notify does not restart the window
    assert _notified(_front("s", status="oneshot"), [CHANGE_B, *changes]) == [0]
    on_a_once = _front("s", status="oneshot", subject={"condition": {"attrs": ["a"]}})
    assert _notified(on_a_once, [CHANGE_B, CHANGE_A, CHANGE_A]) == [1]


def test_expiry_is_judged_at_each_updates_time() -> None:
    expiring = _front("s", expires="2030-01-01T00:00:00.000Z")
    at = [1.8e9, 1893455999.9, 1893456000.0, 1.9e9]
    assert _notified(expiring, [CHANGE_A] * 4, at) == [0, 1]
    assert _front("s", expires="2030-01-01T00:00:00.000Z", status="expired").held().status == (
        "active"
    )  # as a listing shows it once past


def test_a_geographical_condition_takes_the_entitys_location() -> None:
    near = _front(
        "s",
        subject={
            "condition": {
                "expression": {
                    "georel": "near;maxDistance:1000",
                    "geometry": "point",
                    "coords": "40.4,-3.7",
                }
            }
        },
    )
    here = json.dumps([["geo:point", "40.4,-3.7", {}]])
    there = json.dumps([["geo:point", "41.4,2.2", {}]])
    assert _notified(near, [CHANGE_A], located=here) == [0]
    assert _notified(near, [CHANGE_A], located=there) == []
    assert _notified(near, [CHANGE_A], located=None) == []


def test_a_subscription_the_front_does_not_hold_notifies_every_match() -> None:
    assert _notified(None, [CREATE, UPDATE_A, CHANGE_A]) == [0, 1, 2]


def test_subscriptions_in_one_partition_are_decided_apart() -> None:
    a, b = _front("a", status="oneshot"), _front("b", throttling=100)
    rows = [
        ("a", 0, 1.0, *CHANGE_A, None),
        ("a", 3, 4.0, *CHANGE_A, None),
        ("b", 1, 2.0, *CHANGE_A, None),
        ("b", 2, 3.0, *CHANGE_A, None),
        ("c", 2, 3.0, *UPDATE_A, None),
    ]
    packed = json.dumps([a.packed(), b.packed()]).encode()
    assert list(decided(lambda: fronts_of(packed))(rows)) == [(0, "a"), (1, "b"), (2, "c")]


def test_an_invalid_document_is_invalid_input() -> None:
    with pytest.raises(InvalidInput):
        _front("s", status="sleepy").matched()
