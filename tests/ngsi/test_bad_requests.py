"""Every kind of bad request gets Orion's error name and status, and the front goes on."""

from __future__ import annotations

import re
from typing import Any

import pytest

from ngsi.conftest import Front, tenant

SUBJECT = {"entities": [{"idPattern": ".*"}]}
HTTP = {"http": {"url": "http://127.0.0.1:9/notify"}}


HUGE = b"1" + b"0" * 400  # an integer no float carries
TEXT = {"Content-Type": "text/plain"}


def _sub(**fields: Any) -> dict[str, Any]:
    return {"subject": SUBJECT, "notification": HTTP, **fields}


# (method, path, JSON body or raw bytes, extra headers) -> (status, error name)
CASES: list[tuple[str, str, Any, dict[str, str], int, str]] = [
    ("POST", "/v2/entities", b"{not json", {}, 400, "ParseError"),
    ("POST", "/v2/entities", b"", {}, 400, "BadRequest"),
    ("POST", "/v2/entities", {"type": "T"}, {}, 400, "BadRequest"),
    ("POST", "/v2/entities", {"id": "a<b"}, {}, 400, "BadRequest"),
    ("POST", "/v2/entities", {"id": "a b"}, {}, 400, "BadRequest"),
    ("POST", "/v2/entities", {"id": "E", "x": {"value": "a;b"}}, {}, 400, "BadRequest"),
    (
        "POST",
        "/v2/entities",
        {"id": "E", "x": {"value": "(a)", "type": "TextUnrestricted"}},
        {},
        201,
        "",
    ),
    ("POST", "/v2/entities", {"id": "E", "x": 3}, {}, 400, "BadRequest"),
    ("POST", "/v2/entities", {"id": "E", "x": {"value": 1, "extra": 2}}, {}, 400, "BadRequest"),
    (
        "POST",
        "/v2/entities",
        {"id": "E", "x": {"value": "no", "type": "DateTime"}},
        {},
        400,
        "BadRequest",
    ),
    ("POST", "/v2/entities?options=bogus", {"id": "E"}, {}, 400, "BadRequest"),
    (
        "POST",
        "/v2/entities",
        {"id": "E"},
        {"Content-Type": "text/xml"},
        415,
        "UnsupportedMediaType",
    ),
    ("POST", "/v2/entities", {"id": "E"}, {"Accept": "text/xml"}, 406, "NotAcceptable"),
    ("POST", "/v2/entities", {"id": "E"}, {"Fiware-Service": "Bad-Tenant!"}, 400, "BadRequest"),
    ("POST", "/v2/entities", {"id": "E"}, {"Fiware-ServicePath": "no-slash"}, 400, "BadRequest"),
    ("PATCH", "/v2/entities/Missing/attrs", {"x": {"value": 1}}, {}, 404, "NotFound"),
    (
        "PUT",
        "/v2/entities/Missing/attrs/x/value",
        b"1",
        {"Content-Type": "text/plain"},
        404,
        "NotFound",
    ),
    (
        "PUT",
        "/v2/entities/E/attrs/x/value",
        b"1",
        {"Content-Type": "application/json"},
        400,
        "BadRequest",
    ),
    ("DELETE", "/v2/entities/Missing/attrs/x", None, {}, 404, "NotFound"),
    (
        "POST",
        "/v2/op/update",
        {"actionType": "explode", "entities": [{"id": "E"}]},
        {},
        400,
        "BadRequest",
    ),
    ("POST", "/v2/op/update", {"actionType": "append", "entities": []}, {}, 400, "BadRequest"),
    ("POST", "/v2/subscriptions", {"notification": HTTP}, {}, 400, "BadRequest"),
    (
        "POST",
        "/v2/subscriptions",
        {"subject": {"entities": []}, "notification": HTTP},
        {},
        400,
        "BadRequest",
    ),
    (
        "POST",
        "/v2/subscriptions",
        {"subject": {"entities": [{"id": "a", "idPattern": "b"}]}, "notification": HTTP},
        {},
        400,
        "BadRequest",
    ),
    (
        "POST",
        "/v2/subscriptions",
        {"subject": {**SUBJECT, "condition": {}}, "notification": HTTP},
        {},
        400,
        "BadRequest",
    ),
    (
        "POST",
        "/v2/subscriptions",
        {"subject": {**SUBJECT, "condition": {"expression": {"q": "t>>"}}}, "notification": HTTP},
        {},
        400,
        "BadRequest",
    ),
    (
        "POST",
        "/v2/subscriptions",
        {"subject": {"entities": [{"idPattern": "("}]}, "notification": HTTP},
        {},
        400,
        "BadRequest",
    ),
    ("POST", "/v2/subscriptions", {"subject": SUBJECT, "notification": {}}, {}, 400, "BadRequest"),
    (
        "POST",
        "/v2/subscriptions",
        {"subject": SUBJECT, "notification": {"http": {"url": "ftp://x/y"}}},
        {},
        400,
        "BadRequest",
    ),
    (
        "POST",
        "/v2/subscriptions",
        {"subject": SUBJECT, "notification": {"http": {"url": "http://10.1.2.3/n"}}},
        {},
        400,
        "BadRequest",
    ),
    (
        "POST",
        "/v2/subscriptions",
        {"subject": SUBJECT, "notification": {**HTTP, "attrs": ["a"], "exceptAttrs": ["b"]}},
        {},
        400,
        "BadRequest",
    ),
    (
        "POST",
        "/v2/subscriptions",
        {"subject": SUBJECT, "notification": {**HTTP, "attrsFormat": "xml"}},
        {},
        400,
        "BadRequest",
    ),
    (
        "POST",
        "/v2/subscriptions",
        {"subject": SUBJECT, "notification": {**HTTP, "maxFailsLimit": 0}},
        {},
        400,
        "BadRequest",
    ),
    ("POST", "/v2/subscriptions", _sub(status="failed"), {}, 400, "BadRequest"),
    ("POST", "/v2/subscriptions", _sub(expires="tomorrow"), {}, 400, "BadRequest"),
    ("POST", "/v2/subscriptions", _sub(throttling=-1), {}, 400, "BadRequest"),
    ("POST", "/v2/subscriptions", _sub(color="red"), {}, 400, "BadRequest"),
    (
        "POST",
        "/v2/subscriptions",
        {"subject": SUBJECT, "notification": {"kafka": {"url": "kafka://x"}}},
        {},
        501,
        "NotImplemented",
    ),
    (
        "POST",
        "/v2/subscriptions",
        {"subject": SUBJECT, "notification": {"mqtt": {"url": "mqtt://x"}}},
        {},
        400,
        "BadRequest",
    ),
    ("GET", "/v2/subscriptions?limit=0", None, {}, 400, "BadRequest"),
    ("GET", "/v2/subscriptions?offset=-1", None, {}, 400, "BadRequest"),
    ("GET", "/v2/subscriptions/000000000000000000000000", None, {}, 404, "NotFound"),
    (
        "PATCH",
        "/v2/subscriptions/000000000000000000000000",
        {"status": "active"},
        {},
        404,
        "NotFound",
    ),
    ("GET", "/v2/entities?limit=1001", None, {}, 400, "BadRequest"),
    ("GET", "/v2/entities?q=temperature>>", None, {}, 400, "BadRequest"),
    ("GET", "/v2/entities?id=a&idPattern=b", None, {}, 400, "BadRequest"),
    ("GET", "/v2/entities/nothing-here", None, {}, 404, "NotFound"),
    ("POST", "/v2/op/query", {"entities": "all"}, {}, 400, "BadRequest"),
    ("POST", "/v2/registrations", {}, {}, 400, "BadRequest"),
    ("GET", "/v2/registrations/000000000000000000000000", None, {}, 404, "NotFound"),
    ("GET", "/v2/nothing/here", None, {}, 400, "BadRequest"),
    ("DELETE", "/v2/subscriptions", None, {}, 405, "MethodNotAlowed"),
    # each was a 500 (found by the OpenAPI fuzz run, tests/ngsi/test_openapi.py, or while
    # describing the API for it)
    ("POST", "/v2/op/update", {"actionType": {}, "entities": [{"id": "E"}]}, {}, 400, "BadRequest"),
    ("POST", "/v2/entities", b'{"id": "E", "x": {"value": %s}}' % HUGE, {}, 400, "BadRequest"),
    ("POST", "/v2/subscriptions", _sub(throttling=10**400), {}, 400, "BadRequest"),
    ("POST", "/v2/subscriptions", _sub(throttling=float("nan")), {}, 400, "BadRequest"),
    ("PUT", "/v2/entities/E/attrs/x/value", b"1" * 5000, TEXT, 400, "BadRequest"),
    ("GET", "/v2/subscriptions?limit=%C2%B2", None, {}, 400, "BadRequest"),  # '²'.isdigit()
    ("GET", "/v2/subscriptions?offset=" + "9" * 5000, None, {}, 400, "BadRequest"),
]


@pytest.mark.parametrize(
    ("method", "path", "body", "headers", "status", "error"),
    CASES,
    ids=[f"{c[0]} {c[1]} {c[4]} {i}" for i, c in enumerate(CASES)],
)
def test_bad_request(
    front: Front,
    method: str,
    path: str,
    body: Any,
    headers: dict[str, str],
    status: int,
    error: str,
) -> None:
    headers = {"Fiware-Service": tenant(), **headers}
    if isinstance(body, bytes):
        answer = front.call(method, path, raw=body, headers=headers)
    else:
        answer = front.call(method, path, body, headers=headers)
    assert answer.status == status, answer
    if error:
        assert answer.body["error"] == error, answer
        assert answer.body["description"]
    assert front.call("GET", "/version").status == 200  # still serving


def test_missing_content_length_is_411(front: Front) -> None:
    import http.client

    connection = http.client.HTTPConnection(front.host, front.port, timeout=30)
    connection.putrequest("POST", "/v2/entities")
    connection.putheader("Content-Type", "application/json")
    connection.putheader("Transfer-Encoding", "chunked")
    connection.endheaders()
    connection.send(b"2\r\n{}\r\n0\r\n\r\n")
    response = connection.getresponse()
    assert response.status == 411
    connection.close()


def test_a_body_over_one_megabyte_is_413(front: Front) -> None:
    big = b'{"id": "E", "x": {"value": "' + b"a" * (1 << 20) + b'"}}'
    answer = front.call("POST", "/v2/entities", raw=big)
    assert (answer.status, answer.body["error"]) == (413, "RequestEntityTooLarge")


def test_already_exists_and_strict_append(front: Front) -> None:
    h = {"Fiware-Service": tenant()}
    assert (
        front.call("POST", "/v2/entities", {"id": "E", "a": {"value": 1}}, headers=h).status == 201
    )
    answer = front.call("POST", "/v2/entities", {"id": "E"}, headers=h)
    assert (answer.status, answer.body["error"]) == (422, "Unprocessable")
    answer = front.call(
        "POST", "/v2/entities/E/attrs?options=append", {"a": {"value": 2}}, headers=h
    )
    assert (answer.status, answer.body["error"]) == (422, "Unprocessable")
    both = {"a": {"value": 2}, "b": {"value": 2}}
    answer = front.call("POST", "/v2/entities/E/attrs?options=append,forcedUpdate", both, headers=h)
    assert (answer.status, answer.body["error"]) == (422, "PartialUpdate")
    answer = front.call("PATCH", "/v2/entities/E/attrs", {"zz": {"value": 2}}, headers=h)
    assert (answer.status, answer.body["error"]) == (422, "Unprocessable")
    answer = front.call(
        "PUT",
        "/v2/entities/E/attrs/a/value",
        raw=b'"text"',
        headers={**h, "Content-Type": "text/plain"},
    )
    assert answer.status == 204
    assert front.call("GET", "/v2/").status == 200  # one trailing slash is fine


def test_an_expiry_past_the_calendar_still_lists(front: Front) -> None:
    """An ``expires`` whose offset takes it before year 1 (or after 9999) in UTC made every
    listing of its tenant a 500 (found by the OpenAPI fuzz run)."""
    h = {"Fiware-Service": tenant()}
    for expires in ("0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"):
        answer = front.call("POST", "/v2/subscriptions", _sub(expires=expires), headers=h)
        assert answer.status == 201, answer
    answer = front.call("GET", "/v2/subscriptions", headers=h)
    assert answer.status == 200, answer
    shown = sorted(s["expires"] for s in answer.body)
    assert shown == ["0001-01-01T00:00:00.000Z", "9999-12-31T23:59:59.000Z"]


def test_an_id_with_braces_is_addressed_by_its_path(front: Front) -> None:
    """Identifiers may hold '{' and '}'; the routes' path parameters took neither (400
    "Service not found" for an entity the front had created)."""
    h = {"Fiware-Service": tenant()}
    answer = front.call("POST", "/v2/entities", {"id": "a{b}", "x": {"value": 1}}, headers=h)
    assert answer.status == 201, answer
    path = "/v2/entities/a%7Bb%7D"
    assert front.call("PATCH", path + "/attrs", {"x": {"value": 2}}, headers=h).status == 204
    assert front.call("DELETE", path + "/attrs/x", headers=h).status == 204
    assert front.call("DELETE", path, headers=h).status == 204


def test_statistics_and_the_version_show_the_uptime_as_orion(front: Front) -> None:
    """``GET /statistics`` (Orion without -statCounters) and ``DELETE`` starting the
    measuring interval again; ``/version`` gives the uptime as Orion writes it."""
    answer = front.call("GET", "/statistics")
    assert answer.status == 200, answer
    assert set(answer.body) == {"uptime_in_secs", "measuring_interval_in_secs"}
    assert answer.body["uptime_in_secs"] >= answer.body["measuring_interval_in_secs"] >= 0
    reset = front.call("DELETE", "/statistics")
    assert reset.status == 200 and reset.body == {"message": "All statistics counter reset"}
    assert front.call("GET", "/statistics").body["measuring_interval_in_secs"] == 0
    uptime = front.call("GET", "/version").body["orion"]["uptime"]
    assert re.fullmatch(r"\d+ d, \d+ h, \d+ m, \d+ s", uptime), uptime
