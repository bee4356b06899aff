"""Hostile and broken HTTP input: every case gets a 4xx NGSI error (or a closed connection)
in bounded time, and the front goes on serving (reliability.md, "Security found missing")."""

from __future__ import annotations

import gzip
import json
import socket
import time
import uuid
from collections.abc import Iterator

import pytest

from broker.coordination.embedded import EmbeddedZooKeeper
from broker.model.attribute import MAX_VALUE_DEPTH
from broker.ngsi.request import MAX_BODY, MAX_DEPTH
from ngsi.conftest import Front, started_front

pytestmark = pytest.mark.slow

READ_TIMEOUT = 2.0


@pytest.fixture(scope="module")
def front(
    zookeeper: EmbeddedZooKeeper, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Front]:
    """A front whose clients get READ_TIMEOUT seconds for a request's head or body."""
    with started_front(
        zookeeper, tmp_path_factory, "hostile", http_read_timeout=READ_TIMEOUT
    ) as served:
        yield served


def _exchange(front: Front, head: bytes, body: bytes = b"", wait: float = 15.0) -> bytes:
    """Send ``head`` and ``body`` raw; everything the front answers until it closes or
    ``wait`` seconds pass."""
    with socket.create_connection((front.host, front.port), timeout=wait) as sock:
        sock.sendall(head + body)
        answer = b""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                chunk = sock.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            answer += chunk
            if b"\r\n\r\n" in answer and _complete(answer):
                break
        return answer


def _complete(answer: bytes) -> bool:
    head, _, body = answer.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return len(body) >= int(line.split(b":", 1)[1])
    return False


def _request(method: str, path: str, body: bytes, **headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: silbo", f"Content-Length: {len(body)}"]
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def _status_and_error(answer: bytes) -> tuple[int, str]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)["error"]


def _still_serves(front: Front) -> None:
    entity = f"After{uuid.uuid4().hex[:8]}"
    answer = front.call("POST", "/v2/entities", {"id": entity, "x": {"value": 1}})
    assert answer.status == 201, answer


JSON = {"Content_Type": "application/json"}
NESTED = b'{"id": "E", "x": {"value": ' + b"[" * 100_000 + b"]" * 100_000 + b"}}"
SLIGHTLY_DEEP = b'{"id": "E", "x": {"value": ' + b"[" * MAX_DEPTH + b"]" * MAX_DEPTH + b"}}"


@pytest.mark.parametrize(
    ("method", "path", "body", "headers", "status", "error"),
    [
        ("POST", "/v2/entities", NESTED, JSON, 400, "ParseError"),
        ("POST", "/v2/entities", SLIGHTLY_DEEP, JSON, 400, "ParseError"),
        (
            "POST",
            "/v2/entities",
            b"this is not gzip",
            {**JSON, "Content_Encoding": "gzip"},
            400,
            "BadRequest",
        ),
        (
            "POST",
            "/v2/entities",
            gzip.compress(b'{"id": "E", "x": {"value": "' + b"a" * (8 * MAX_BODY) + b'"}}'),
            {**JSON, "Content_Encoding": "gzip"},
            413,
            "RequestEntityTooLarge",
        ),
        (
            "PUT",
            "/v2/entities/E/attrs/x/value",
            b'"caf\xe9"',
            {"Content_Type": "text/plain"},
            400,
            "BadRequest",
        ),
        ("POST", "/v2/entities", b'{"id": "E\xff", "x": {"value": 1}}', JSON, 400, "ParseError"),
        # past aiohttp's 8 KiB request line: still the routes' NGSI error, not plain text
        ("GET", "/v2/entities?coords=" + "%C3%BA" * 20_000, b"", {}, 400, "BadRequest"),
        (
            "POST",
            "/v2/subscriptions",
            b'{"subject": {"entities": [{"id": "\xc3\x28"}]}}',
            JSON,
            400,
            "ParseError",
        ),
    ],
    ids=[
        "nested",
        "past-depth",
        "bad-gzip",
        "gzip-bomb",
        "latin1-text",
        "utf8-json",
        "long-url",
        "bad-utf8",
    ],
)
def test_refused_with_an_ngsi_error(
    front: Front,
    method: str,
    path: str,
    body: bytes,
    headers: dict[str, str],
    status: int,
    error: str,
) -> None:
    answer = _exchange(front, _request(method, path, body, **headers))
    assert _status_and_error(answer) == (status, error), answer[:400]
    _still_serves(front)


@pytest.mark.parametrize(
    ("depth", "status"), [(MAX_VALUE_DEPTH, 201), (MAX_VALUE_DEPTH + 2, 400), (MAX_DEPTH - 2, 400)]
)
def test_a_value_nested_within_the_limits(front: Front, depth: int, status: int) -> None:
    """Up to MAX_VALUE_DEPTH an attribute value is taken; deeper (still within the body's
    limit) it is a BadRequest that names the value's limit."""
    value = b"[" * depth + b"]" * depth
    body = b'{"id": "Deep%s", "x": {"value": %s}}' % (uuid.uuid4().hex[:6].encode(), value)
    answer = _exchange(front, _request("POST", "/v2/entities", body, **JSON))
    assert answer.startswith(b"HTTP/1.1 %d" % status), answer[:300]
    if status == 400:
        assert _status_and_error(answer) == (400, "BadRequest")


def test_gzip_body_is_read(front: Front) -> None:
    body = gzip.compress(b'{"id": "Zipped%s", "x": {"value": 1}}' % uuid.uuid4().hex[:6].encode())
    answer = _exchange(
        front, _request("POST", "/v2/entities", body, **JSON, Content_Encoding="gzip")
    )
    assert answer.startswith(b"HTTP/1.1 201"), answer[:300]


def test_a_body_that_never_completes_is_answered_408_and_closed(front: Front) -> None:
    started = time.monotonic()
    head = b"POST /v2/entities HTTP/1.1\r\nHost: silbo\r\nContent-Type: application/json\r\n"
    answer = _exchange(front, head + b'Content-Length: 100\r\n\r\n{"id": ', wait=4 * READ_TIMEOUT)
    took = time.monotonic() - started
    assert _status_and_error(answer) == (408, "RequestTimeout"), answer[:300]
    assert READ_TIMEOUT * 0.9 <= took < 3 * READ_TIMEOUT
    _still_serves(front)


def test_a_head_that_never_completes_is_closed(front: Front) -> None:
    started = time.monotonic()
    answer = _exchange(front, b"POST /v2/entities HTTP/1.1\r\nHost: sil", wait=6 * READ_TIMEOUT)
    assert answer == b""  # closed without a word: there is no request to answer
    assert time.monotonic() - started < 4 * READ_TIMEOUT
    _still_serves(front)


def test_many_hostile_connections_at_once_leave_it_serving(front: Front) -> None:
    """Twenty connections holding half a body each do not stop a normal request."""
    socks = []
    try:
        for _ in range(20):
            sock = socket.create_connection((front.host, front.port), timeout=10)
            sock.sendall(_request("POST", "/v2/entities", b"", **JSON)[:-4] + b"\r\n")
            sock.sendall(b"Content-Length: 10\r\n\r\n{")
            socks.append(sock)
        _still_serves(front)
    finally:
        for sock in socks:
            sock.close()


def test_the_port_binds_again_at_once_after_a_stop(front: Front) -> None:
    """A front restarted right after traffic binds its port although the old connections
    sit in TIME_WAIT (SO_REUSEADDR)."""
    from broker.ngsi.front import _bind

    listener = _bind("127.0.0.1", 0, "127.0.0.1:0")
    port = listener.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    served, _ = listener.accept()
    served.close()  # the server side closes first: its end goes to TIME_WAIT
    client.close()
    listener.close()
    again = _bind("127.0.0.1", port, f"127.0.0.1:{port}")
    again.close()
