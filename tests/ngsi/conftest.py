"""Helpers of the NGSI v2 front's tests: a real HTTP notification receiver, an HTTP caller,
and one cluster with the HTTP front for the whole module (tests keep apart by tenant).

Imported by the test modules as ``from ngsi.conftest import ...``.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from broker.cluster import ClusterSpec, LocalCluster
from broker.coordination.embedded import EmbeddedZooKeeper
from broker.coordination.membership import Member
from broker.ngsi.allow import AllowList
from broker.ngsi.subscriptions import HttpSubscription, parse_document
from broker.runtime.options import Role

__all__ = [
    "Answer",
    "Front",
    "Notification",
    "Receiver",
    "free_port",
    "fronts_of",
    "plain_subscription",
    "started_front",
    "started_fronts",
    "tenant",
]

WAIT = 20.0  # seconds for a notification to arrive


def free_port() -> int:
    """A TCP port free on loopback now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def tenant() -> str:
    """A fresh tenant: what keeps the tests sharing a cluster apart."""
    return f"t{uuid.uuid4().hex[:12]}"


def plain_subscription(sid: str, url: str) -> HttpSubscription:
    """An HTTP subscription to ``url`` of every entity, as the front keeps it (for tests of
    the notifier alone)."""
    parsed = parse_document(
        {"subject": {"entities": [{"idPattern": ".*"}]}, "notification": {"http": {"url": url}}},
        AllowList.parse(),
    )
    return HttpSubscription(sid, "", "/#", parsed)


@dataclass(frozen=True, slots=True)
class Notification:
    """One request the receiver got."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: Any


@dataclass(frozen=True, slots=True)
class Answer:
    """One answer of the front."""

    status: int
    headers: dict[str, str]
    body: Any

    def header(self, name: str) -> str | None:
        """A header, case-insensitively."""
        for key, value in self.headers.items():
            if key.lower() == name.lower():
                return value
        return None


class Receiver:
    """An HTTP notification receiver on loopback, in a thread; records every request (and
    when it came). ``script`` is answered first, one entry per request in order: (status,
    headers, seconds to wait before answering); then every request gets ``status``."""

    def __init__(self) -> None:
        self.port = free_port()
        self.status = 200
        self.script: list[tuple[int, dict[str, str], float]] = []
        self.times: list[float] = []  # time.monotonic() of each request
        self._got: list[Notification] = []
        self._changed = threading.Condition()
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.start()

    def url(self, path: str = "/notify") -> str:
        """The URL of ``path`` on this receiver."""
        return f"http://127.0.0.1:{self.port}{path}"

    def start(self) -> None:
        """Listen (again) on the receiver's port."""
        asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)

    def stop(self) -> None:
        """Stop listening: notifications to it fail with a refused connection."""
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
            self._runner = None

    def close(self) -> None:
        """Stop listening and end the thread."""
        self.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    def received(self) -> list[Notification]:
        """Everything received so far, in arrival order."""
        with self._changed:
            return list(self._got)

    def wait_for(self, count: int, timeout: float = WAIT) -> list[Notification]:
        """Wait until at least ``count`` requests have arrived; all of them."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while len(self._got) < count:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(
                        f"{len(self._got)} notifications within {timeout:.0f} s, not {count}: "
                        f"{self._got}"
                    )
                self._changed.wait(remaining)
            return list(self._got)

    async def _start(self) -> None:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _handle(self, request: web.Request) -> web.Response:
        data = await request.read()
        try:
            body = json.loads(data) if data else None
        except ValueError:  # a custom notification's text payload
            body = data.decode()
        got = Notification(
            request.method, request.path, dict(request.query), dict(request.headers), body
        )
        with self._changed:
            self._got.append(got)
            self.times.append(time.monotonic())
            self._changed.notify_all()
            status, headers, delay = self.script.pop(0) if self.script else (self.status, {}, 0)
        if delay:
            await asyncio.sleep(delay)
        return web.Response(status=status, headers=headers)


class Front:
    """Calls to one NGSI v2 front over plain http.client (so requests can be malformed)."""

    def __init__(self, address: str, cluster: LocalCluster | None = None) -> None:
        self.cluster = cluster
        self.host, port = address.rsplit(":", 1)
        self.port = int(port)

    def wait_serving(self, timeout: float = 30.0) -> None:
        """Wait until the front answers (a connection point serves HTTP once registered)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self.call("GET", "/version").status == 200:
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise
            time.sleep(0.05)

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        headers: dict[str, str] | None = None,
        raw: bytes | None = None,
        content_type: str = "application/json",
    ) -> Answer:
        """One request; ``body`` is sent as JSON, ``raw`` as it is."""
        connection = http.client.HTTPConnection(self.host, self.port, timeout=30)
        try:
            sent = dict(headers or {})
            data = raw if raw is not None else None if body is None else json.dumps(body).encode()
            if data is not None:
                sent.setdefault("Content-Type", content_type)
                sent.setdefault("Content-Length", str(len(data)))
            elif method in ("POST", "PUT", "PATCH"):
                sent.setdefault("Content-Length", "0")
            connection.putrequest(method, path, skip_accept_encoding=True)
            for key, value in sent.items():
                connection.putheader(key, value)
            connection.endheaders(data)
            response = connection.getresponse()
            payload = response.read()
            parsed = json.loads(payload) if payload else None
            return Answer(response.status, dict(response.getheaders()), parsed)
        finally:
            connection.close()


def fronts_of(cluster: LocalCluster, members: list[Member] | None = None) -> list[Front]:
    """The HTTP fronts of ``members`` (by default every connection point of ``cluster``, by
    registration order), each serving."""
    chosen = cluster.members_of(Role.CONNECTION_POINT) if members is None else members
    fronts = [Front(cluster.http_endpoint(m.name), cluster) for m in chosen]
    assert all(f.port for f in fronts), "a connection point without an HTTP front"
    for front in fronts:
        front.wait_serving()
    return fronts


@contextmanager
def started_fronts(
    zookeeper: EmbeddedZooKeeper,
    tmp_path_factory: pytest.TempPathFactory,
    prefix: str,
    **fields: Any,
) -> Iterator[list[Front]]:
    """A cluster on ``zookeeper`` (``fields``: more of its ClusterSpec), each of its
    connection points serving HTTP, serving; stopped on leaving. On any free port: a port
    picked free beforehand can be taken by another test's process before the front binds it
    (a CI run lost nine tests' fixtures so)."""
    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    spec = ClusterSpec(
        zk=zookeeper.address,
        cluster=name,
        grpc_port=0,
        http_port=0,
        state_dir=Path(tmp_path_factory.mktemp(name)),
        **fields,
    )
    cluster = LocalCluster(spec)
    cluster.start()
    try:
        yield fronts_of(cluster)
    finally:
        cluster.stop()


@contextmanager
def started_front(
    zookeeper: EmbeddedZooKeeper,
    tmp_path_factory: pytest.TempPathFactory,
    prefix: str,
    **fields: Any,
) -> Iterator[Front]:
    """:func:`started_fronts`, its first front."""
    with started_fronts(zookeeper, tmp_path_factory, prefix, **fields) as served:
        yield served[0]


@pytest.fixture(scope="module")
def front(
    zookeeper: EmbeddedZooKeeper, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Front]:
    """One cluster for the module, its connection point serving HTTP on a free port."""
    with started_front(zookeeper, tmp_path_factory, "ngsi") as served:
        yield served


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A notification receiver for one test."""
    server = Receiver()
    try:
        yield server
    finally:
        server.close()
