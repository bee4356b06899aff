"""A lean HTTP/1.1 client for the delivery worker: keep-alive connections pooled per origin.

The worker sends one small request per notification and reads nothing of the answer but its
status, so a general client's work per request (header objects, payload registries, tasks,
timers, response objects) is most of its cost. Here a request is bytes the caller builds
(:meth:`Target.head` once per subscription, the per-request headers and the body after it)
and one ``write``; the answer is parsed by an :class:`asyncio.Protocol` only as far as its
status, its framing (``Content-Length``, ``chunked``, or up to the close) and whether the
connection may be kept; its body is read and thrown away.

Connections are pooled per origin (scheme, host, port), idle ones reused last-in first-out
and closed after :data:`KEEP_IDLE` seconds unused or when the server closes them. At most
``limit`` requests are in flight in all and ``limit_per_origin`` connections open per origin;
a caller past either bound waits its turn. https goes through an :class:`ssl.SSLContext`
(the system's certificates unless one is given).

Errors: every failure of a request is a :class:`TransportError` whose ``reason`` is what the
subscription shows as ``lastFailureReason`` (curl's words, as Orion's): :class:`ConnectFailed`
(refused, unreachable, name not resolved, TLS handshake), :class:`TimedOut` (no whole answer
within the request's timeout, connecting included) and :class:`Broken` (the connection
closed or the answer was not HTTP). A request on a reused connection that the server closed
before sending a byte of its answer is sent once more on a new connection, as curl does: the
server had closed an idle connection as the request left.

    TransportError
    +-- ConnectFailed
    +-- TimedOut
    +-- Broken
"""

from __future__ import annotations

import asyncio
import base64
import re
import ssl
import time
from collections import deque
from dataclasses import dataclass, field
from email.utils import parsedate_to_datetime
from typing import cast
from urllib.parse import quote, urlsplit

__all__ = [
    "KEEP_IDLE",
    "Broken",
    "ConnectFailed",
    "HttpClient",
    "Target",
    "TimedOut",
    "TransportError",
    "check_header",
    "retry_after",
]

KEEP_IDLE = 15.0  # seconds an idle connection is kept
MAX_HEAD = 1 << 16  # bytes of an answer's status line and headers
_DEFAULT_PORTS = {"http": 80, "https": 443}
_NO_BODY = frozenset({204, 304})
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")  # a header name (RFC 9110)
_SAFE_PATH = "/%:@!$&'()*+,;=-._~?"  # left as given in a request target (RFC 3986)

Origin = tuple[str, str, int]


class TransportError(Exception):
    """A request got no HTTP answer; ``reason`` says why in curl's words."""

    reason = "notification failed"


class ConnectFailed(TransportError):
    """No connection: refused, unreachable, the name not resolved, or the TLS handshake."""

    reason = "Couldn't connect to server"


class TimedOut(TransportError):
    """No whole answer within the request's timeout (connecting included)."""

    reason = "Timeout was reached"


class Broken(TransportError):
    """The connection closed before the whole answer, or the answer was not HTTP/1.x."""

    reason = "Failure when receiving data from the peer"


@dataclass(frozen=True, slots=True)
class Target:
    """Where a URL's requests go: its origin, and the request line and headers that every
    request to it with ``method`` starts with (:meth:`head`)."""

    origin: Origin
    prefix: bytes  # request line, Host, and the headers given
    method: str

    @classmethod
    def parse(cls, url: str, method: str, headers: tuple[tuple[str, str], ...] = ()) -> Target:
        """The target of an absolute http(s) URL (ValueError otherwise, or for a header name
        or value that would break the request)."""
        parts = urlsplit(url)
        scheme, host = parts.scheme.lower(), parts.hostname
        if scheme not in _DEFAULT_PORTS or not host:
            raise ValueError(f"{url!r} is not an http(s) URL")
        port = parts.port or _DEFAULT_PORTS[scheme]
        shown = f"[{host}]" if ":" in host else host
        if parts.port and parts.port != _DEFAULT_PORTS[scheme]:
            shown += f":{port}"
        path = quote(parts.path or "/", safe=_SAFE_PATH)
        if parts.query:
            path += "?" + quote(parts.query, safe=_SAFE_PATH)
        lines = [f"{method} {path} HTTP/1.1", f"Host: {shown}"]
        if parts.username is not None:
            secret = f"{parts.username}:{parts.password or ''}".encode()
            lines.append(f"Authorization: Basic {base64.b64encode(secret).decode()}")
        for name, value in headers:
            check_header(name, value)
            lines.append(f"{name}: {value}")
        prefix = ("\r\n".join(lines) + "\r\n").encode()
        return cls((scheme, host, port), prefix, method)

    def head(self, extra: bytes, length: int) -> bytes:
        """The request's head: the prefix, ``extra`` (whole header lines) and the length."""
        return b"%s%sContent-Length: %d\r\n\r\n" % (self.prefix, extra, length)


def retry_after(value: bytes) -> float | None:
    """The seconds a ``Retry-After`` value asks to wait from now (RFC 9110: a number of
    seconds or an HTTP date; never below 0), or None if it is neither."""
    text = value.decode("latin-1").strip()
    if text.isdigit():
        return float(text)
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, when.timestamp() - time.time())


def check_header(name: str, value: str) -> None:
    """Raise ValueError unless ``name: value`` can be sent as one header line."""
    if not _TOKEN.fullmatch(name):
        raise ValueError(f"header name {name!r} is not an HTTP token")
    if any(c in value for c in "\r\n\0"):
        raise ValueError(f"header {name!r} has a line break or NUL in its value")


class HttpClient:
    """Sends requests on pooled keep-alive connections (see the module doc)."""

    def __init__(
        self, limit: int, limit_per_origin: int, ssl_context: ssl.SSLContext | None = None
    ) -> None:
        self._slots = asyncio.Semaphore(limit)
        self._limit = limit
        self._per_origin = limit_per_origin
        self._ssl = ssl_context
        self._pools: dict[Origin, _Pool] = {}
        self._idle = 0  # idle connections in all pools
        self._closed = False

    async def request(self, target: Target, data: bytes, timeout: float) -> int:
        """Send ``data`` (head and body) to ``target``; the answer's status
        (TransportError if there is none within ``timeout`` seconds)."""
        status, _retry_after = await self.exchange(target, data, timeout)
        return status

    async def exchange(
        self, target: Target, data: bytes, timeout: float
    ) -> tuple[int, float | None]:
        """As :meth:`request`; with the seconds the answer's ``Retry-After`` asks to wait
        (None without one, or with one that is not a number of seconds or an HTTP date)."""
        async with self._slots:
            pool = self._pools.get(target.origin)
            if pool is None:
                pool = self._pools[target.origin] = _Pool(target.origin)
            try:
                async with asyncio.timeout(timeout):
                    return await self._exchange(pool, target, data)
            except TimeoutError:
                raise TimedOut() from None

    async def close(self) -> None:
        """Close every connection (requests in flight end with Broken)."""
        self._closed = True
        for pool in self._pools.values():
            for connection in pool.idle:
                connection.close()
            pool.idle.clear()
            for waiter in pool.waiters:
                if not waiter.done():
                    waiter.cancel()
        self._idle = 0

    async def _exchange(self, pool: _Pool, target: Target, data: bytes) -> tuple[int, float | None]:
        connection = await self._acquire(pool)
        keep = False
        try:
            try:
                status, keep = await connection.exchange(data, target.method)
            except Broken:
                if not (connection.reused and connection.silent):
                    raise
                connection.close()
                connection = await self._connect(pool)  # the old one's slot passes on
                status, keep = await connection.exchange(data, target.method)
            return status, connection.retry_after
        finally:
            self._release(pool, connection, keep)

    async def _acquire(self, pool: _Pool) -> _Connection:
        """An idle connection of ``pool``, or a new one (one of its slots taken)."""
        while True:
            now = time.monotonic()
            while pool.idle:
                connection = pool.idle.pop()
                self._idle -= 1
                if connection.usable and now - connection.idle_since < KEEP_IDLE:
                    connection.reused = True
                    return connection
                connection.close()
                pool.open -= 1
            if pool.open < self._per_origin:
                pool.open += 1
                try:
                    return await self._connect(pool)
                except BaseException:
                    pool.open -= 1
                    self._wake(pool)
                    raise
            waiter = asyncio.get_running_loop().create_future()
            pool.waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake(pool)  # woken and cancelled at once: pass the turn on
                raise
            finally:
                if waiter in pool.waiters:
                    pool.waiters.remove(waiter)

    async def _connect(self, pool: _Pool) -> _Connection:
        scheme, host, port = pool.origin
        loop = asyncio.get_running_loop()
        context = None
        if scheme == "https":
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            context = self._ssl
        try:
            _transport, connection = await loop.create_connection(
                _Connection, host, port, ssl=context, server_hostname=host if context else None
            )
        except OSError as exc:  # ssl.SSLError and socket.gaierror included
            raise ConnectFailed(str(exc)) from exc
        return connection

    def _release(self, pool: _Pool, connection: _Connection, keep: bool) -> None:
        if keep and connection.usable and not self._closed and self._idle < self._limit:
            connection.idle_since = time.monotonic()
            pool.idle.append(connection)
            self._idle += 1
        else:
            connection.close()
            pool.open -= 1
        self._wake(pool)

    def _wake(self, pool: _Pool) -> None:
        while pool.waiters:
            waiter = pool.waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return


@dataclass(eq=False, slots=True)
class _Pool:
    """One origin's connections: the idle ones (the latest last) and how many are open."""

    origin: Origin
    open: int = 0
    idle: list[_Connection] = field(default_factory=list)
    waiters: deque[asyncio.Future[None]] = field(default_factory=deque)


# What the answer's parser is reading.
_HEAD, _LENGTH, _CHUNK_SIZE, _CHUNK_DATA, _TRAILER, _TO_CLOSE, _DONE = range(7)


class _Connection(asyncio.Protocol):
    """One connection: sends a request, parses its answer (one request at a time)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.usable = True  # open, and nothing unexpected came on it
        self.reused = False
        self.silent = True  # no byte of the current answer yet
        self.idle_since = 0.0
        self.retry_after: float | None = None  # of the last answer
        self._waiter: asyncio.Future[tuple[int, bool]] | None = None
        self._buffer = bytearray()
        self._state = _DONE
        self._method = ""
        self._status = 0
        self._keep = True
        self._remaining = 0

    # -- the caller's side ------------------------------------------------------------------

    async def exchange(self, data: bytes, method: str) -> tuple[int, bool]:
        """Send a request; (the answer's status, whether the connection may be kept)."""
        if not self.usable or self.transport is None:
            raise Broken("the connection is closed")
        self._waiter = asyncio.get_running_loop().create_future()
        self._method = method
        self._state, self.silent = _HEAD, True
        self.transport.write(data)
        try:
            return await self._waiter
        finally:
            self._waiter = None

    def close(self) -> None:
        """Close the connection at once."""
        self.usable = False
        if self.transport is not None:
            self.transport.abort()

    # -- the protocol's side ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        if self._waiter is None or self._waiter.done():
            self.close()  # nothing was asked: the server is confused
            return
        self.silent = False
        self._buffer += data
        try:
            self._parse()
        except Broken as exc:
            self.close()
            self._fail(exc)

    def eof_received(self) -> bool:
        self.usable = False
        if self._state == _TO_CLOSE:
            self._finish()
        return False  # close the transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.usable = False
        if self._state == _TO_CLOSE:
            self._finish()
        else:
            self._fail(Broken(f"the server closed the connection ({exc or 'end of stream'})"))

    # -- parsing the answer -----------------------------------------------------------------

    def _parse(self) -> None:
        buffer = self._buffer
        while True:
            state = self._state
            if state == _HEAD:
                end = buffer.find(b"\r\n\r\n")
                if end < 0:
                    if len(buffer) > MAX_HEAD:
                        raise Broken("the answer's head is too long")
                    return
                head = bytes(buffer[:end])
                del buffer[: end + 4]
                self._read_head(head)
            elif state == _LENGTH:
                taken = min(len(buffer), self._remaining)
                del buffer[:taken]
                self._remaining -= taken
                if self._remaining:
                    return
                self._finish()
            elif state == _CHUNK_SIZE:
                end = buffer.find(b"\r\n")
                if end < 0:
                    if len(buffer) > MAX_HEAD:
                        raise Broken("a chunk size line is too long")
                    return
                text = bytes(buffer[:end]).split(b";", 1)[0].strip()
                del buffer[: end + 2]
                try:
                    size = int(text, 16)
                except ValueError:
                    raise Broken(f"bad chunk size {text[:20]!r}") from None
                if size < 0:
                    raise Broken("negative chunk size")
                self._remaining = size + 2  # and its CRLF
                self._state = _CHUNK_DATA if size else _TRAILER
            elif state == _CHUNK_DATA:
                taken = min(len(buffer), self._remaining)
                del buffer[:taken]
                self._remaining -= taken
                if self._remaining:
                    return
                self._state = _CHUNK_SIZE
            elif state == _TRAILER:
                end = buffer.find(b"\r\n")
                if end < 0:
                    if len(buffer) > MAX_HEAD:
                        raise Broken("the trailer is too long")
                    return
                del buffer[: end + 2]
                if end == 0:
                    self._finish()
            elif state == _TO_CLOSE:
                buffer.clear()
                return
            else:  # _DONE: bytes after the answer, none asked for
                if buffer:
                    self.usable = False
                    buffer.clear()
                return

    def _read_head(self, head: bytes) -> None:
        lines = head.split(b"\r\n")
        status_line = lines[0].split(None, 2)
        if len(status_line) < 2 or not status_line[0].startswith(b"HTTP/1."):
            raise Broken(f"not an HTTP/1.x answer: {lines[0][:40]!r}")
        try:
            status = int(status_line[1])
        except ValueError:
            raise Broken(f"bad status {status_line[1][:10]!r}") from None
        if 100 <= status < 200 and status != 101:
            return  # an interim answer (100 Continue): the real one follows
        keep = status_line[0] == b"HTTP/1.1"
        self.retry_after = None
        length: int | None = None
        chunked = False
        for line in lines[1:]:
            name, _, value = line.partition(b":")
            name = name.strip().lower()
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    raise Broken(f"bad Content-Length {value[:20]!r}") from None
                if length < 0:
                    raise Broken("negative Content-Length")
            elif name == b"transfer-encoding":
                chunked = value.strip().lower().endswith(b"chunked")
            elif name == b"retry-after":
                self.retry_after = retry_after(value.strip())
            elif name == b"connection":
                tokens = {t.strip() for t in value.lower().split(b",")}
                if b"close" in tokens:
                    keep = False
                elif b"keep-alive" in tokens:
                    keep = True
        self._status, self._keep = status, keep
        if self._method == "HEAD" or status in _NO_BODY:
            self._finish()
        elif chunked:
            self._state = _CHUNK_SIZE
        elif length is not None:
            self._remaining = length
            self._state = _LENGTH
            if not length:
                self._finish()
        else:
            self._keep = False
            self._state = _TO_CLOSE

    def _finish(self) -> None:
        self._state = _DONE
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result((self._status, self._keep and self.usable))

    def _fail(self, exc: TransportError) -> None:
        self._state = _DONE
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)
