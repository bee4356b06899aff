"""The delivery worker's HTTP client against real receivers on loopback: raw asyncio servers
that answer exactly as each test says (keep-alive, closing, chunked, slow, garbage)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest

from broker.errors import InvalidSubscription
from broker.ngsi.allow import AllowList
from broker.ngsi.change import Alteration, Change, with_change
from broker.ngsi.entity import to_wire
from broker.ngsi.front import delivery_config
from broker.ngsi.http_client import (
    Broken,
    ConnectFailed,
    HttpClient,
    Target,
    TimedOut,
    check_header,
)
from broker.ngsi.notifier import Notifier
from broker.ngsi.subscriptions import HttpSubscription, parse_document
from ngsi.conftest import free_port

Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter, bytes], Awaitable[bool]]
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


class RawReceiver:
    """A TCP server on loopback that reads each request whole and lets ``answer`` write
    the reply (it returns whether to keep the connection); counts connections and requests."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.connections = 0
        self.open = 0
        self.most_open = 0
        self.requests: list[bytes] = []
        self.port = 0
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> RawReceiver:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *_exc: object) -> None:
        assert self._server is not None
        self._server.close()

    def target(self, path: str = "/n", method: str = "POST") -> Target:
        return Target.parse(f"http://127.0.0.1:{self.port}{path}", method)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                request = head + await reader.readexactly(length)
                self.requests.append(request)
                if not await self.answer(reader, writer, request):
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            self.open -= 1
            writer.close()


def request(target: Target, body: bytes = b"{}") -> bytes:
    return target.head(b"X-Test: 1\r\n", len(body)) + body


async def ok(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter, _got: bytes) -> bool:
    writer.write(OK)
    await writer.drain()
    return True


def test_a_target_is_the_request_line_host_and_headers() -> None:
    target = Target.parse("http://example.com:8080/a b/c?x=1&y=é", "PUT", (("X-Key", "k"),))
    assert target.origin == ("http", "example.com", 8080)
    assert target.prefix == (
        b"PUT /a%20b/c?x=1&y=%C3%A9 HTTP/1.1\r\nHost: example.com:8080\r\nX-Key: k\r\n"
    )
    assert Target.parse("https://[::1]/", "POST").origin == ("https", "::1", 443)
    assert b"Host: [::1]\r\n" in Target.parse("https://[::1]/", "POST").prefix
    assert target.head(b"", 3) == target.prefix + b"Content-Length: 3\r\n\r\n"
    for name, value in (("X\r\nEvil", "1"), ("X-Key", "a\r\nEvil: 1"), ("", "x"), ("A B", "x")):
        with pytest.raises(ValueError):
            check_header(name, value)
    with pytest.raises(ValueError):
        Target.parse("ftp://example.com/", "POST")


def test_a_header_that_would_break_the_request_is_an_invalid_subscription() -> None:
    document = {
        "subject": {"entities": [{"idPattern": ".*"}]},
        "notification": {
            "httpCustom": {"url": "http://127.0.0.1:1/n", "headers": {"X-A": "1\r\nX-B: 2"}}
        },
    }
    with pytest.raises(InvalidSubscription, match="line break"):
        parse_document(document, AllowList.parse())


def test_keep_alive_connections_are_reused_and_bounded_per_origin() -> None:
    async def scenario() -> None:
        async with RawReceiver(ok) as receiver:
            client = HttpClient(limit=16, limit_per_origin=2)
            target = receiver.target()
            for _ in range(5):
                assert await client.request(target, request(target), 5.0) == 200
            assert (receiver.connections, len(receiver.requests)) == (1, 5)
            statuses = await asyncio.gather(
                *(client.request(target, request(target), 5.0) for _ in range(20))
            )
            assert statuses == [200] * 20
            assert receiver.most_open <= 2 and receiver.connections == 2
            assert receiver.requests[0].startswith(b"POST /n HTTP/1.1\r\nHost: 127.0.0.1:")
            assert receiver.requests[0].endswith(b"X-Test: 1\r\nContent-Length: 2\r\n\r\n{}")
            await client.close()

    asyncio.run(scenario())


def test_a_receiver_that_closes_its_connections() -> None:
    async def close_said(_r: asyncio.StreamReader, writer: asyncio.StreamWriter, _g: bytes) -> bool:
        writer.write(b"HTTP/1.1 201 Created\r\nConnection: close\r\nContent-Length: 0\r\n\r\n")
        await writer.drain()
        return False

    async def close_unsaid(
        _r: asyncio.StreamReader, writer: asyncio.StreamWriter, _g: bytes
    ) -> bool:
        writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
        await writer.drain()
        return False  # closes the connection after answering, without saying so

    async def to_close(_r: asyncio.StreamReader, writer: asyncio.StreamWriter, _g: bytes) -> bool:
        writer.write(b"HTTP/1.0 200 OK\r\n\r\nthe body runs to the close")
        await writer.drain()
        return False

    async def scenario() -> None:
        client = HttpClient(limit=16, limit_per_origin=4)
        for answer, status in ((close_said, 201), (close_unsaid, 204), (to_close, 200)):
            async with RawReceiver(answer) as receiver:
                target = receiver.target()
                for _ in range(3):
                    assert await client.request(target, request(target), 5.0) == status
                    await asyncio.sleep(0.01)
                assert (receiver.connections, len(receiver.requests)) == (3, 3)
        await client.close()

    asyncio.run(scenario())


def test_a_closed_idle_connection_is_replaced_without_a_failure() -> None:
    """The server closes a kept connection just as the next request leaves: it is sent
    again on a new connection (the old one had answered nothing of it)."""

    async def scenario() -> None:
        async with RawReceiver(ok) as receiver:
            client = HttpClient(limit=16, limit_per_origin=1)
            target = receiver.target()
            assert await client.request(target, request(target), 5.0) == 200
            receiver.answer = _drop_first(receiver.answer)
            assert await client.request(target, request(target), 5.0) == 200
            assert receiver.connections == 2
            await client.close()

    asyncio.run(scenario())


def _drop_first(answer: Answer) -> Answer:
    dropped = False

    async def once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, got: bytes) -> bool:
        nonlocal dropped
        if not dropped:
            dropped = True
            return False  # closed without a byte of answer
        return await answer(reader, writer, got)

    return once


def test_chunked_and_interim_answers_are_read_whole() -> None:
    async def chunked(_r: asyncio.StreamReader, writer: asyncio.StreamWriter, _g: bytes) -> bool:
        writer.write(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 202 Accepted\r\n")
        await writer.drain()
        writer.write(b"Transfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhel")
        await writer.drain()
        await asyncio.sleep(0.01)
        writer.write(b"lo\r\n6\r\n world\r\n0\r\nX-Trailer: 1\r\n\r\n")
        await writer.drain()
        return True

    async def scenario() -> None:
        async with RawReceiver(chunked) as receiver:
            client = HttpClient(limit=16, limit_per_origin=4)
            target = receiver.target()
            for _ in range(3):
                assert await client.request(target, request(target), 5.0) == 202
            assert receiver.connections == 1  # the whole answer read: the connection kept
            head = receiver.target(method="HEAD")
            receiver.answer = _head_answer
            assert await client.request(head, request(head), 5.0) == 200
            assert await client.request(head, request(head), 5.0) == 200
            assert receiver.connections == 1
            await client.close()

    asyncio.run(scenario())


async def _head_answer(_r: asyncio.StreamReader, writer: asyncio.StreamWriter, _g: bytes) -> bool:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")  # no body to HEAD
    await writer.drain()
    return True


def test_timeouts_refusals_and_garbage_are_transport_errors() -> None:
    async def slow(_r: asyncio.StreamReader, writer: asyncio.StreamWriter, _g: bytes) -> bool:
        await asyncio.sleep(2.0)
        writer.write(OK)
        return True

    async def garbage(_r: asyncio.StreamReader, writer: asyncio.StreamWriter, _g: bytes) -> bool:
        writer.write(b"SSH-2.0-OpenSSH\r\n\r\n")
        await writer.drain()
        return True

    async def half(_r: asyncio.StreamReader, writer: asyncio.StreamWriter, _g: bytes) -> bool:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc")
        await writer.drain()
        return False

    async def scenario() -> None:
        client = HttpClient(limit=16, limit_per_origin=4)
        async with RawReceiver(slow) as receiver:
            target = receiver.target()
            started = time.monotonic()
            with pytest.raises(TimedOut) as timed_out:
                await client.request(target, request(target), 0.2)
            assert time.monotonic() - started < 1.5
            assert timed_out.value.reason == "Timeout was reached"
            assert client._pools[target.origin].open == 0  # the late answer's connection closed
        refused = Target.parse(f"http://127.0.0.1:{free_port()}/n", "POST")
        with pytest.raises(ConnectFailed) as failed:
            await client.request(refused, request(refused), 5.0)
        assert failed.value.reason == "Couldn't connect to server"
        for answer in (garbage, half):
            async with RawReceiver(answer) as receiver:
                target = receiver.target()
                with pytest.raises(Broken):
                    await client.request(target, request(target), 5.0)
        await client.close()

    asyncio.run(scenario())


def _subscription(sid: str, url: str, timeout_ms: int) -> HttpSubscription:
    parsed = parse_document(
        {
            "subject": {"entities": [{"idPattern": ".*"}]},
            "notification": {"httpCustom": {"url": url, "timeout": timeout_ms}},
        },
        AllowList.parse(),
    )
    return HttpSubscription(sid, "", "/#", parsed)


def test_the_worker_records_refusals_and_timeouts_as_failures() -> None:
    async def slow(_r: asyncio.StreamReader, writer: asyncio.StreamWriter, _g: bytes) -> bool:
        await asyncio.sleep(1.0)
        writer.write(OK)
        return True

    async def scenario() -> None:
        notifier = Notifier(retry_window=0)  # each failure counted at once
        await notifier.start()
        try:
            async with RawReceiver(slow) as receiver:
                refused = _subscription("r" * 24, f"http://127.0.0.1:{free_port()}/n", 1000)
                late = _subscription("s" * 24, f"http://127.0.0.1:{receiver.port}/n", 100)
                for subscription in (refused, late):
                    config = delivery_config(subscription.parsed)
                    notifier.configure(subscription, config, fails=None)
                change = Change(Alteration.CHANGE, frozenset({"x"}))
                entity = to_wire("E", "T", "", "/", {})
                entities = [with_change(entity, change).SerializeToString()]
                for _ in range(2):
                    chosen = [refused, late]
                    notifier.send(entities, [s.number for s in chosen], [0, 0])
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline and (
                    refused.fails_counter,
                    late.fails_counter,
                ) != (2, 2):
                    await asyncio.sleep(0.02)
                assert (refused.fails_counter, late.fails_counter) == (2, 2)
                assert refused.last_failure_reason == "Couldn't connect to server"
                assert late.last_failure_reason == "Timeout was reached"
                assert refused.last_failure is not None and late.last_success is None
        finally:
            await notifier.stop()

    asyncio.run(scenario())
