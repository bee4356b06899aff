"""The HTTP front end to end: real processes, a real receiver (Orion's functional cases of
ngsi-v2.md section 6, re-expressed). Tests share one cluster and keep apart by tenant.

"Nothing arrived" is never waited for: each test also holds a *marker* subscription that is
notified of an update published after the one that must stay silent; notifications of one
front are decided in publish order, so once the marker's arrives the silent one was decided.
"""

from __future__ import annotations

import time
from typing import Any

from integration.conftest import subscriptions_held

from broker.client import Client
from broker.model.update import ContextUpdate
from ngsi.conftest import WAIT, Front, Receiver, tenant


def subscribe(front: Front, headers: dict[str, str], body: dict[str, Any]) -> str:
    """Create a subscription; its id (from the Location header)."""
    answer = front.call("POST", "/v2/subscriptions", body, headers=headers)
    assert answer.status == 201, answer
    location = answer.header("Location") or ""
    assert location.startswith("/v2/subscriptions/")
    return location.rsplit("/", 1)[1]


def http_subscription(url: str, entities: list[dict[str, str]] | None = None, **fields: Any) -> Any:
    """A subscription body: ``entities`` (default all), a notification to ``url``."""
    notification = {"http": {"url": url}, **fields.pop("notification", {})}
    return {
        "subject": {"entities": entities or [{"idPattern": ".*"}], **fields.pop("subject", {})},
        "notification": notification,
        **fields,
    }


def publish(
    front: Front, headers: dict[str, str], entity: dict[str, Any], status: int = 204
) -> None:
    """POST /v2/entities?options=upsert, as an IoT agent does."""
    answer = front.call("POST", "/v2/entities?options=upsert", entity, headers=headers)
    assert answer.status == status, answer


def get(front: Front, headers: dict[str, str], subscription_id: str) -> Any:
    """GET one subscription."""
    answer = front.call("GET", f"/v2/subscriptions/{subscription_id}", headers=headers)
    assert answer.status == 200, answer
    return answer.body


def wait_until(condition: Any, what: str, timeout: float = WAIT) -> None:
    """Poll until ``condition()`` holds; AssertionError naming ``what`` otherwise."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        time.sleep(0.05)


def by_subscription(receiver: Receiver, subscription_id: str) -> list[Any]:
    """The bodies the receiver got for one subscription (normalized or keyValues)."""
    return [
        n.body
        for n in receiver.received()
        if n.body and n.body.get("subscriptionId") == subscription_id
    ]


def test_a_notification_carries_the_whole_entity_and_orions_headers(
    front: Front, receiver: Receiver
) -> None:
    t = tenant()
    headers = {"Fiware-Service": t, "Fiware-ServicePath": "/floor1", "Fiware-Correlator": "abc"}
    sid = subscribe(
        front,
        {"Fiware-Service": t},
        http_subscription(receiver.url(), [{"id": "R1", "type": "Room"}]),
    )
    answer = front.call(
        "POST",
        "/v2/entities",
        {"id": "R1", "type": "Room", "temperature": {"value": 21}},
        headers=headers,
    )
    assert answer.status == 201
    assert answer.header("Location") == "/v2/entities/R1?type=Room"
    assert answer.header("Fiware-Correlator") == "abc"
    front.call("PATCH", "/v2/entities/R1/attrs", {"humidity": {"value": 40}}, headers=headers)
    answer = front.call(
        "POST", "/v2/entities/R1/attrs", {"humidity": {"value": 41}}, headers=headers
    )
    assert answer.status == 204
    [first, second] = receiver.wait_for(2)
    assert first.body == {
        "subscriptionId": sid,
        "data": [
            {
                "id": "R1",
                "type": "Room",
                "temperature": {"type": "Number", "value": 21, "metadata": {}},
            }
        ],
    }
    assert second.body["data"][0]["humidity"] == {"type": "Number", "value": 41, "metadata": {}}
    assert second.body["data"][0]["temperature"]["value"] == 21  # the whole entity
    assert first.headers["Fiware-Service"] == t
    assert first.headers["Fiware-ServicePath"] == "/floor1"
    assert first.headers["Ngsiv2-AttrsFormat"] == "normalized"
    assert first.headers["Content-Type"] == "application/json; charset=utf-8"
    assert first.headers["Fiware-Correlator"] == "abc; cbnotif=1"
    status = get(front, {"Fiware-Service": t}, sid)
    wait_until(
        lambda: (
            get(front, {"Fiware-Service": t}, sid)["notification"].get("lastSuccessCode") == 200
        ),
        "lastSuccess",
    )
    assert status["notification"]["timesSent"] == 2


def test_q_filter_and_condition_attrs(front: Front, receiver: Receiver) -> None:
    h = {"Fiware-Service": tenant()}
    hot = subscribe(
        front,
        h,
        http_subscription(
            receiver.url("/hot"),
            subject={
                "condition": {"attrs": ["temperature"], "expression": {"q": "temperature>25"}}
            },
        ),
    )
    marker = subscribe(front, h, http_subscription(receiver.url("/all"), [{"id": "M"}]))
    publish(front, h, {"id": "R", "temperature": {"value": 20}})
    publish(front, h, {"id": "R", "temperature": {"value": 30}})
    publish(front, h, {"id": "R", "humidity": {"value": 5}})  # no condition attribute changed
    publish(front, h, {"id": "R", "temperature": {"value": 30}})  # no change at all
    publish(front, h, {"id": "M", "done": {"value": 1}})
    receiver.wait_for(2)
    got = by_subscription(receiver, hot)
    assert [b["data"][0]["temperature"]["value"] for b in got] == [30]
    assert len(by_subscription(receiver, marker)) == 1


def test_attrs_except_attrs_and_formats(front: Front, receiver: Receiver) -> None:
    h = {"Fiware-Service": tenant()}
    only = subscribe(
        front,
        h,
        http_subscription(
            receiver.url(), notification={"attrs": ["b", "a"], "attrsFormat": "keyValues"}
        ),
    )
    but = subscribe(
        front, h, http_subscription(receiver.url(), notification={"exceptAttrs": ["a"]})
    )
    values = subscribe(
        front,
        h,
        http_subscription(
            receiver.url(), notification={"attrs": ["b", "a"], "attrsFormat": "values"}
        ),
    )
    legacy = subscribe(
        front,
        h,
        http_subscription(
            receiver.url(), notification={"attrs": ["b", "a"], "attrsFormat": "legacy"}
        ),
    )
    publish(
        front,
        h,
        {
            "id": "E",
            "type": "T",
            "a": {"value": 1, "metadata": {"unit": {"type": "Text", "value": "m"}}},
            "b": {"value": "x"},
            "c": {"value": True},
        },
    )
    got = receiver.wait_for(4)
    [old] = [n for n in got if n.body["subscriptionId"] == legacy]
    assert old.headers["Ngsiv2-AttrsFormat"] == "legacy"
    assert old.body == {  # NGSIv1, as Orion's legacy notifications
        "subscriptionId": legacy,
        "originator": "localhost",
        "contextResponses": [
            {
                "contextElement": {
                    "type": "T",
                    "isPattern": "false",
                    "id": "E",
                    "attributes": [
                        {"name": "b", "type": "Text", "value": "x"},
                        {
                            "name": "a",
                            "type": "Number",
                            "value": 1,
                            "metadatas": [{"name": "unit", "type": "Text", "value": "m"}],
                        },
                    ],
                },
                "statusCode": {"code": "200", "reasonPhrase": "OK"},
            }
        ],
    }
    assert get(front, h, legacy)["notification"]["attrsFormat"] == "legacy"
    formats = {
        n.body["subscriptionId"]: (n.headers["Ngsiv2-AttrsFormat"], n.body["data"][0])
        for n in got
        if n.body["subscriptionId"] != legacy
    }
    assert formats[only] == ("keyValues", {"id": "E", "type": "T", "b": "x", "a": 1})
    assert formats[but] == (
        "normalized",
        {
            "id": "E",
            "type": "T",
            "b": {"type": "Text", "value": "x", "metadata": {}},
            "c": {"type": "Boolean", "value": True, "metadata": {}},
        },
    )
    assert formats[values] == ("values", ["x", 1])


def test_throttling_drops_what_falls_in_the_window(front: Front, receiver: Receiver) -> None:
    h = {"Fiware-Service": tenant()}
    slow = subscribe(front, h, http_subscription(receiver.url(), throttling=3600))
    every = subscribe(front, h, http_subscription(receiver.url()))
    for value in (1, 2, 3):
        publish(front, h, {"id": "E", "x": {"value": value}})
    wait_until(lambda: len(by_subscription(receiver, every)) == 3, "three notifications")
    assert [b["data"][0]["x"]["value"] for b in by_subscription(receiver, slow)] == [1]
    assert get(front, h, slow)["throttling"] == 3600


def test_oneshot_notifies_once_then_is_inactive(front: Front, receiver: Receiver) -> None:
    h = {"Fiware-Service": tenant()}
    once = subscribe(front, h, http_subscription(receiver.url(), status="oneshot"))
    every = subscribe(front, h, http_subscription(receiver.url()))
    publish(front, h, {"id": "E", "x": {"value": 1}})
    publish(front, h, {"id": "E", "x": {"value": 2}})
    wait_until(lambda: len(by_subscription(receiver, every)) == 2, "two notifications")
    assert len(by_subscription(receiver, once)) == 1
    assert get(front, h, once)["status"] == "inactive"
    answer = front.call("PATCH", f"/v2/subscriptions/{once}", {"status": "oneshot"}, headers=h)
    assert answer.status == 204
    publish(front, h, {"id": "E", "x": {"value": 3}})
    wait_until(lambda: len(by_subscription(receiver, once)) == 2, "the re-armed oneshot")


def test_expired_subscriptions_are_silent(front: Front, receiver: Receiver) -> None:
    h = {"Fiware-Service": tenant()}
    gone = subscribe(front, h, http_subscription(receiver.url(), expires="2001-01-01T00:00:00Z"))
    later = subscribe(
        front, h, http_subscription(receiver.url(), expires="2999-01-01T00:00:00.000Z")
    )
    publish(front, h, {"id": "E", "x": {"value": 1}})
    wait_until(lambda: len(by_subscription(receiver, later)) == 1, "the live subscription")
    assert by_subscription(receiver, gone) == []
    assert get(front, h, gone)["status"] == "expired"
    assert get(front, h, later)["expires"] == "2999-01-01T00:00:00.000Z"


def test_fails_limit_makes_it_inactive(front: Front, receiver: Receiver) -> None:
    h = {"Fiware-Service": tenant()}
    receiver.stop()
    sid = subscribe(
        front,
        h,
        http_subscription(receiver.url(), notification={"maxFailsLimit": 2, "retryWindow": 0}),
    )
    for value in range(4):
        publish(front, h, {"id": "E", "x": {"value": value}})
    wait_until(lambda: get(front, h, sid)["status"] == "inactive", "inactive after 3 failures")
    status = get(front, h, sid)["notification"]
    assert status["failsCounter"] == 3
    assert status["lastFailureReason"] == "Couldn't connect to server"
    assert "lastSuccess" not in status
    receiver.start()
    front.call("PATCH", f"/v2/subscriptions/{sid}", {"status": "active"}, headers=h)
    publish(front, h, {"id": "E", "x": {"value": 99}})
    [got] = receiver.wait_for(1)
    assert got.body["data"][0]["x"]["value"] == 99
    wait_until(lambda: "failsCounter" not in get(front, h, sid)["notification"], "counter reset")


def test_a_4xx_answer_is_a_success(front: Front, receiver: Receiver) -> None:
    h = {"Fiware-Service": tenant()}
    receiver.status = 404
    sid = subscribe(front, h, http_subscription(receiver.url()))
    publish(front, h, {"id": "E", "x": {"value": 1}})
    receiver.wait_for(1)
    wait_until(lambda: get(front, h, sid)["notification"].get("lastSuccessCode") == 404, "code")


def test_tenants_are_isolated(front: Front, receiver: Receiver) -> None:
    a, b = {"Fiware-Service": tenant()}, {"Fiware-Service": tenant()}
    sid = subscribe(front, a, http_subscription(receiver.url()))
    marker = subscribe(front, b, http_subscription(receiver.url()))
    publish(front, b, {"id": "E", "x": {"value": 1}})
    publish(front, a, {"id": "E", "x": {"value": 2}})
    got = receiver.wait_for(2)
    assert {n.body["subscriptionId"]: n.headers["Fiware-Service"] for n in got} == {
        marker: b["Fiware-Service"],
        sid: a["Fiware-Service"],
    }
    assert front.call("GET", f"/v2/subscriptions/{sid}", headers=b).status == 404
    assert [s["id"] for s in front.call("GET", "/v2/subscriptions", headers=b).body] == [marker]
    assert front.call("DELETE", f"/v2/subscriptions/{sid}", headers=b).status == 404


def test_default_tenant_is_an_empty_header(front: Front, receiver: Receiver) -> None:
    sid = subscribe(
        front, {"Fiware-Service": ""}, http_subscription(receiver.url(), [{"id": "DefaultTenant1"}])
    )
    publish(front, {}, {"id": "DefaultTenant1", "x": {"value": 1}})
    [got] = receiver.wait_for(1)
    assert got.body["subscriptionId"] == sid
    assert "Fiware-Service" not in got.headers
    assert front.call("DELETE", f"/v2/subscriptions/{sid}").status == 204


def test_service_path_subtrees(front: Front, receiver: Receiver) -> None:
    t = tenant()
    sid = subscribe(
        front,
        {"Fiware-Service": t, "Fiware-ServicePath": "/a/#"},
        http_subscription(receiver.url("/a")),
    )
    every = subscribe(front, {"Fiware-Service": t}, http_subscription(receiver.url("/all")))
    for path in ("/a2", "/a", "/a/b", "/"):
        publish(
            front, {"Fiware-Service": t, "Fiware-ServicePath": path}, {"id": "E", "x": {"value": 1}}
        )
    wait_until(lambda: len(by_subscription(receiver, every)) == 4, "four notifications")
    paths = [n.headers["Fiware-ServicePath"] for n in receiver.received() if n.path == "/a"]
    assert paths == ["/a", "/a/b"]
    listed = front.call(
        "GET", "/v2/subscriptions", headers={"Fiware-Service": t, "Fiware-ServicePath": "/a/#"}
    )
    assert [s["id"] for s in listed.body] == [sid]


def test_alteration_types_and_delete(front: Front, receiver: Receiver) -> None:
    h = {"Fiware-Service": tenant()}
    kinds = ["entityCreate", "entityUpdate", "entityDelete"]
    sid = subscribe(
        front,
        h,
        http_subscription(receiver.url(), subject={"condition": {"alterationTypes": kinds}}),
    )
    publish(front, h, {"id": "E", "x": {"value": 1}})  # create
    publish(front, h, {"id": "E", "x": {"value": 2}})  # change: not asked for
    publish(front, h, {"id": "E", "x": {"value": 2}})  # update without change
    assert front.call("DELETE", "/v2/entities/E", headers=h).status == 204
    got = receiver.wait_for(3)
    assert [n.body["data"][0]["x"]["value"] for n in got] == [1, 2, 2]
    assert front.call("DELETE", "/v2/entities/E", headers=h).status == 404
    assert get(front, h, sid)["subject"]["condition"]["alterationTypes"] == kinds


def test_batch_update_and_custom_http(front: Front, receiver: Receiver) -> None:
    h = {"Fiware-Service": tenant()}
    custom = {
        "url": receiver.url("/custom"),
        "method": "PUT",
        "headers": {"X-Key": "k"},
        "qs": {"via": "silbo"},
    }
    subscribe(
        front,
        h,
        {"subject": {"entities": [{"idPattern": "^S"}]}, "notification": {"httpCustom": custom}},
    )
    body = {
        "actionType": "append",
        "entities": [{"id": "S1", "t": 1}, {"id": "S2", "t": 2}, {"id": "X", "t": 3}],
    }
    assert front.call("POST", "/v2/op/update?options=keyValues", body, headers=h).status == 204
    got = receiver.wait_for(2)
    assert [(n.method, n.path, n.query, n.headers["X-Key"]) for n in got] == [
        ("PUT", "/custom", {"via": "silbo"}, "k")
    ] * 2
    assert sorted(n.body["data"][0]["id"] for n in got) == ["S1", "S2"]
    update = {"actionType": "update", "entities": [{"id": "S1", "t": 1}, {"id": "Nope", "t": 1}]}
    answer = front.call("POST", "/v2/op/update?options=keyValues", update, headers=h)
    assert (answer.status, answer.body["error"]) == (422, "PartialUpdate")
    nothing = {"actionType": "update", "entities": [{"id": "Nope", "t": 1}]}
    answer = front.call("POST", "/v2/op/update?options=keyValues", nothing, headers=h)
    assert (answer.status, answer.body["error"]) == (404, "NotFound")


def test_subscription_crud_paging_and_count(front: Front, receiver: Receiver) -> None:
    h = {"Fiware-Service": tenant()}
    ids = [
        subscribe(front, h, http_subscription(receiver.url(), description=f"s{i}"))
        for i in range(5)
    ]
    page = front.call("GET", "/v2/subscriptions?limit=2&offset=1&options=count", headers=h)
    assert page.status == 200
    assert [s["id"] for s in page.body] == ids[1:3]
    assert page.header("Fiware-Total-Count") == "5"
    one = get(front, h, ids[0])
    assert one["description"] == "s0"
    assert one["status"] == "active"
    assert one["notification"]["attrsFormat"] == "normalized"
    patched = front.call(
        "PATCH", f"/v2/subscriptions/{ids[0]}", {"description": "new", "throttling": 5}, headers=h
    )
    assert patched.status == 204
    one = get(front, h, ids[0])
    assert (one["description"], one["throttling"]) == ("new", 5)
    assert front.call("DELETE", f"/v2/subscriptions/{ids[0]}", headers=h).status == 204
    answer = front.call("GET", f"/v2/subscriptions/{ids[0]}", headers=h)
    assert (answer.status, answer.body["error"]) == (404, "NotFound")
    assert (
        front.call("GET", "/v2/subscriptions?options=count", headers=h).header("Fiware-Total-Count")
        == "4"
    )


def test_http_and_grpc_share_the_matchers(front: Front, receiver: Receiver) -> None:
    assert front.cluster is not None
    t = tenant()
    h = {"Fiware-Service": t}
    sid = subscribe(front, h, http_subscription(receiver.url(), [{"id": "Shared"}]))
    held = subscriptions_held(front.cluster)
    assert held["matcher"] >= 1 and held["connection-point"] >= 1
    with Client(front.cluster.endpoints) as client:
        grpc = client.subscribe(id_pattern="^Shared$", tenant=t)
        publish(front, h, {"id": "Shared", "x": {"value": 7}})
        notification = grpc.get(timeout=WAIT)
        assert notification.update.attributes["x"].value == 7
        client.publish(ContextUpdate.of("Shared", {"x": 8}, tenant=t))
        got = receiver.wait_for(2)
    assert [n.body["data"][0]["x"]["value"] for n in got] == [7, 8]
    assert {n.body["subscriptionId"] for n in got} == {sid}


def test_only_changed_and_covered(front: Front, receiver: Receiver) -> None:
    h = {"Fiware-Service": tenant()}
    changed = subscribe(
        front, h, http_subscription(receiver.url(), notification={"onlyChangedAttrs": True})
    )
    covered = subscribe(
        front,
        h,
        http_subscription(receiver.url(), notification={"attrs": ["a", "z"], "covered": True}),
    )
    publish(front, h, {"id": "E", "a": {"value": 1}, "b": {"value": 1}})
    publish(front, h, {"id": "E", "a": {"value": 1}, "b": {"value": 2}})
    wait_until(lambda: len(by_subscription(receiver, covered)) == 2, "two covered notifications")
    wait_until(lambda: len(by_subscription(receiver, changed)) == 2, "two changed notifications")
    assert [set(b["data"][0]) - {"id", "type"} for b in by_subscription(receiver, changed)] == [
        {"a", "b"},
        {"b"},
    ]
    last = by_subscription(receiver, covered)[-1]["data"][0]
    assert last["z"] == {"type": "None", "value": None, "metadata": {}}
    assert list(last) == ["id", "type", "a", "z"]


def test_builtin_metadata_and_attributes_when_asked(front: Front, receiver: Receiver) -> None:
    """Orion's builtins: only those `notification.metadata` / `notification.attrs` name; a
    named metadata list filters the user metadata too (``*``: every user one)."""
    h = {"Fiware-Service": tenant()}
    builtins = subscribe(
        front,
        h,
        http_subscription(
            receiver.url(),
            notification={
                "attrs": ["t", "dateCreated", "dateModified", "alterationType"],
                "metadata": ["previousValue", "actionType", "dateModified", "unit"],
            },
        ),
    )
    plain = subscribe(front, h, http_subscription(receiver.url(), notification={"attrs": ["t"]}))
    every = subscribe(
        front,
        h,
        http_subscription(receiver.url(), notification={"attrs": ["t"], "metadata": ["*"]}),
    )
    unit = {"unit": {"type": "Text", "value": "C"}, "accuracy": {"type": "Number", "value": 1}}
    created = {"id": "Room1", "type": "Room", "t": {"value": 20, "metadata": unit}}
    assert front.call("POST", "/v2/entities", created, headers=h).status == 201
    answer = front.call("PATCH", "/v2/entities/Room1/attrs", {"t": {"value": 21}}, headers=h)
    assert answer.status == 204, answer
    for sid in (builtins, plain, every):
        wait_until(lambda sid=sid: len(by_subscription(receiver, sid)) == 2, f"two for {sid}")
    first, second = (b["data"][0] for b in by_subscription(receiver, builtins))
    assert set(first) == {"id", "type", "t", "dateCreated", "dateModified", "alterationType"}
    assert first["dateCreated"]["type"] == "DateTime"
    alterations = [n["alterationType"] for n in (first, second)]
    assert alterations == [
        {"type": "Text", "value": "entityCreate", "metadata": {}},
        {"type": "Text", "value": "entityChange", "metadata": {}},
    ]
    assert first["t"]["metadata"]["actionType"] == {"type": "Text", "value": "append"}
    assert "previousValue" not in first["t"]["metadata"]  # created: nothing before
    metadata = second["t"]["metadata"]
    assert metadata["previousValue"] == {"type": "Number", "value": 20}
    assert metadata["actionType"] == {"type": "Text", "value": "update"}
    assert metadata["dateModified"]["type"] == "DateTime"
    assert metadata["unit"] == {"type": "Text", "value": "C"}
    assert "accuracy" not in metadata  # not named
    assert second["dateModified"]["value"] >= first["dateModified"]["value"]
    for sid, names in ((plain, {"unit", "accuracy"}), (every, {"unit", "accuracy"})):
        last = by_subscription(receiver, sid)[-1]["data"][0]
        assert set(last["t"]["metadata"]) == names  # no builtin unless named


def test_custom_payload_json_and_ngsi_with_macros_and_the_auth_token(
    front: Front, receiver: Receiver
) -> None:
    t = tenant()
    h = {"Fiware-Service": t, "Fiware-ServicePath": "/floor"}
    rooms = [{"idPattern": "^Room"}]

    def custom(fields: dict[str, Any], **notification: Any) -> dict[str, Any]:
        return {
            "subject": {"entities": rooms},
            "notification": {"httpCustom": fields, **notification},
        }

    text = {
        "url": receiver.url("/text/${id}"),
        "qs": {"t": "${temperature}"},
        "headers": {"X-Room": "${type}:${servicePath}", "Content-Type": "text/csv"},
        "payload": "${id},${temperature},${missing},${service},${authToken}",
    }
    typed = {
        "url": receiver.url("/json"),
        "method": "PUT",
        "headers": {"X-Auth-Token": ""},  # Orion's way to stop the token's propagation
        "json": {"room": "${id}", "t": "${temperature}", "label": "T=${temperature}"},
    }
    patch = {"url": receiver.url("/ngsi"), "ngsi": {"id": "${id}-copy", "src": {"value": "${id}"}}}
    sids = [
        subscribe(front, h, custom(text)),
        subscribe(front, h, custom(typed)),
        subscribe(front, h, custom(patch, attrs=["temperature"], attrsFormat="keyValues")),
        subscribe(front, h, http_subscription(receiver.url("/plain"), rooms)),
    ]
    assert get(front, h, sids[0])["notification"]["httpCustom"] == text
    room = {"id": "Room1", "type": "Room", "temperature": {"value": 21.5}}
    answer = front.call(
        "POST", "/v2/entities?options=upsert", room, headers={**h, "X-Auth-Token": "tok-1"}
    )
    assert answer.status == 204, answer
    got = {n.path: n for n in receiver.wait_for(4)}
    assert sorted(got) == ["/json", "/ngsi", "/plain", "/text/Room1"]
    one = got["/text/Room1"]
    assert one.body == f"Room1,21.5,,{t},tok-1"
    assert (one.query, one.headers["X-Room"]) == ({"t": "21.5"}, "Room:/floor")
    assert one.headers["Content-Type"] == "text/csv"
    assert one.headers["Ngsiv2-AttrsFormat"] == "custom"
    assert one.headers["X-Auth-Token"] == "tok-1"
    assert got["/json"].method == "PUT"
    assert got["/json"].body == {"room": "Room1", "t": 21.5, "label": "T=21.5"}
    assert "X-Auth-Token" not in got["/json"].headers
    assert got["/ngsi"].body == {
        "subscriptionId": sids[2],
        "data": [{"id": "Room1-copy", "type": "Room", "temperature": 21.5, "src": "Room1"}],
    }
    assert got["/ngsi"].headers["Ngsiv2-AttrsFormat"] == "keyValues"
    assert got["/plain"].headers["X-Auth-Token"] == "tok-1"
    assert got["/plain"].body["data"][0]["temperature"]["value"] == 21.5


def test_bad_custom_notifications_are_400_with_a_clear_description(front: Front) -> None:
    h = {"Fiware-Service": tenant()}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"payload": "x", "json": {}}, "only one of payload, json or ngsi"),
        ({"payload": "${temperature|toFixed(1)}"}, "JEXL is not supported"),
        ({"json": 3}, "must be a JSON object or array"),
        ({"ngsi": {"a": {"value": 1, "metadata": {"m": {}}}}}, "metadata is not allowed"),
        ({"url": "http://${host}/n"}, "scheme, host or port"),
    ]
    for fields, said in cases:
        body = {
            "subject": {"entities": [{"idPattern": ".*"}]},
            "notification": {"httpCustom": {"url": "http://127.0.0.1:9/n", **fields}},
        }
        answer = front.call("POST", "/v2/subscriptions", body, headers=h)
        assert (answer.status, answer.body["error"]) == (400, "BadRequest"), fields
        assert said in answer.body["description"], answer.body
