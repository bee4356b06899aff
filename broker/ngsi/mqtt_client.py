"""A publishing MQTT client for the delivery worker: one connection per broker and user,
driven by the worker's event loop.

paho-mqtt speaks the protocol (MQTT 3.1.1); this module runs it on asyncio without a thread
of its own: the socket's readiness calls paho's ``loop_read`` / ``loop_write``, and a tick
every :data:`TICK` seconds its ``loop_misc`` (keep-alive pings, a broker that stopped
answering them). Only the TCP connect and the name lookup, which paho does blocking, run in
the loop's default executor, bounded by the request's timeout.

A connection (:class:`Broker`: host, port, user, password) is opened at the first publish to
it, shared by every subscription that names the same, and closed after :data:`MAX_AGE`
seconds unused (Orion's ``-mqttMaxAge``) or when it fails. :meth:`MqttClient.publish`
returns once the broker has the message: for QoS 0 once it is written, for QoS 1 at its
PUBACK, for QoS 2 at its PUBCOMP.

Errors are the HTTP client's (:mod:`broker.ngsi.http_client`), so the worker treats both
alike: :class:`~broker.ngsi.http_client.ConnectFailed` (refused, unreachable, the name not
resolved), :class:`~broker.ngsi.http_client.TimedOut` (no CONNACK or acknowledgement within
the timeout; the connection is then dropped), :class:`~broker.ngsi.http_client.Broken` (the
connection lost before the acknowledgement), and :class:`Refused`: the broker's CONNACK
refused the connection (bad user name or password, not authorized), which retrying does
not mend. A topic that cannot be published to (empty, or with ``+`` / ``#`` after its
macros were filled) is a ValueError.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import paho.mqtt.client as paho
from paho.mqtt.enums import CallbackAPIVersion, MQTTErrorCode

from broker.ngsi.http_client import Broken, ConnectFailed, TimedOut, TransportError

__all__ = ["DEFAULT_PORT", "MAX_AGE", "Broker", "MqttClient", "Refused"]

_log = logging.getLogger(__name__)

DEFAULT_PORT = 1883
KEEPALIVE = 60  # seconds: an idle connection pings this often (paho's loop_misc)
MAX_AGE = 3600.0  # seconds an unused connection is kept (Orion's -mqttMaxAge default)
TICK = 1.0  # seconds between calls of paho's loop_misc
MAX_INFLIGHT = 1000  # QoS 1 and 2 messages unacknowledged on one connection (paho queues more)


class Refused(TransportError):
    """The broker refused the connection in its CONNACK (not retried)."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.reason = f"MQTT broker refused the connection: {why}"


@dataclass(frozen=True, slots=True)
class Broker:
    """Where an MQTT subscription publishes, and as whom."""

    host: str
    port: int = DEFAULT_PORT
    user: str | None = None
    passwd: str | None = None

    @classmethod
    def parse(cls, url: str, user: str | None = None, passwd: str | None = None) -> Broker:
        """The broker of an ``mqtt://host[:port]`` URL (ValueError otherwise)."""
        parts = urlsplit(url)
        if parts.scheme.lower() != "mqtt" or not parts.hostname:
            raise ValueError(f"{url!r} is not an mqtt://host:port URL")
        return cls(parts.hostname, parts.port or DEFAULT_PORT, user, passwd)


class MqttClient:
    """Publishes to MQTT brokers over connections kept per :class:`Broker`."""

    def __init__(self) -> None:
        self._connections: dict[Broker, _Connection] = {}

    async def publish(
        self, broker: Broker, topic: str, payload: bytes, qos: int, retain: bool, timeout: float
    ) -> None:
        """Publish one message; return once the broker has it (see the module doc)."""
        connection = self._connections.get(broker)
        if connection is None or connection.closed:
            connection = _Connection(broker, asyncio.get_running_loop(), self._forget)
            self._connections[broker] = connection
        await connection.ready(timeout)
        await connection.publish(topic, payload, qos, retain, timeout)

    async def close(self) -> None:
        """Close every connection (a DISCONNECT to the brokers that are still there)."""
        for connection in list(self._connections.values()):
            connection.close()
        self._connections.clear()

    def _forget(self, connection: _Connection) -> None:
        if self._connections.get(connection.broker) is connection:
            del self._connections[connection.broker]


class _Connection:
    """One connection to a broker: paho's client driven by the event loop.

    States: opening (``ready`` runs the TCP connect, then waits for the CONNACK) -> open ->
    closed (failed, refused, idle past MAX_AGE, or closed by the client); a closed one is
    forgotten by the client, whose next publish opens another."""

    def __init__(
        self,
        broker: Broker,
        loop: asyncio.AbstractEventLoop,
        forget: Callable[[_Connection], None],
    ) -> None:
        self.broker = broker
        self.closed = False
        self._loop = loop
        self._forget = forget
        client = paho.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"silbo-{uuid.uuid4().hex[:16]}",
            protocol=paho.MQTTv311,
        )
        if broker.user is not None:
            client.username_pw_set(broker.user, broker.passwd)
        client.max_inflight_messages_set(MAX_INFLIGHT)
        client.on_connect = self._on_connect
        client.on_disconnect = self._on_disconnect
        client.on_publish = self._on_publish
        self._client = client
        self._socket: Any = None
        self._opening: asyncio.Task[None] | None = None
        self._acknowledged: asyncio.Future[None] = loop.create_future()  # the CONNACK
        self._pending: dict[int, asyncio.Future[None]] = {}  # by message id
        self._tick: asyncio.TimerHandle | None = None
        self._used = time.monotonic()

    async def ready(self, timeout: float) -> None:
        """Wait until the connection is open (the first caller opens it); the error of its
        opening otherwise, to every caller waiting for it."""
        if self._opening is None:
            self._opening = self._loop.create_task(self._open(timeout))
        await asyncio.shield(self._opening)

    async def publish(
        self, topic: str, payload: bytes, qos: int, retain: bool, timeout: float
    ) -> None:
        """Publish on the open connection; return once the broker has the message."""
        self._used = time.monotonic()
        if self.closed:
            raise Broken("the MQTT connection was lost")
        info = self._client.publish(topic, payload, qos, retain)  # ValueError: a bad topic
        if info.rc != MQTTErrorCode.MQTT_ERR_SUCCESS:
            self._fail(Broken(f"the MQTT connection was lost: {paho.error_string(info.rc)}"))
            raise Broken("the MQTT connection was lost")
        if info.is_published():
            return
        done = self._pending[info.mid] = self._loop.create_future()
        try:
            await asyncio.wait_for(done, timeout)
        except TimeoutError:
            # a broker that does not acknowledge in time is given up: the next attempt
            # connects again (a half-open connection would hold every message back)
            self._fail(TimedOut())
            raise TimedOut() from None
        finally:
            self._pending.pop(info.mid, None)

    def close(self) -> None:
        """Send a DISCONNECT if it can be written now, and close the socket."""
        if self._socket is not None and not self.closed:
            self._client.disconnect()
            self._client.loop_write()
        self._fail(Broken("the MQTT connection was closed"))

    async def _open(self, timeout: float) -> None:
        client = self._client
        client.connect_timeout = max(timeout, 0.001)
        connect = self._loop.run_in_executor(
            None, client.connect, self.broker.host, self.broker.port, KEEPALIVE
        )
        try:
            await asyncio.wait_for(asyncio.shield(connect), timeout)
        except TimeoutError:  # ours, or paho's own connect_timeout
            connect.add_done_callback(self._connected_late)
            self._fail(TimedOut())
            raise TimedOut() from None
        except OSError as exc:  # refused, unreachable, the name not resolved
            self._fail(ConnectFailed())
            raise ConnectFailed(str(exc)) from exc
        # the CONNECT is written (paho writes it at once while no socket callbacks are
        # set); from here the loop drives the socket
        self._socket = client.socket()
        client.on_socket_close = self._on_socket_close
        client.on_socket_register_write = self._on_register_write
        client.on_socket_unregister_write = self._on_unregister_write
        self._loop.add_reader(self._socket, client.loop_read)
        if client.want_write():
            self._loop.add_writer(self._socket, client.loop_write)
        self._tick = self._loop.call_later(TICK, self._ticked)
        try:
            await asyncio.wait_for(asyncio.shield(self._acknowledged), timeout)
        except TimeoutError:
            self._fail(TimedOut())
            raise TimedOut() from None

    def _ticked(self) -> None:
        if self.closed:
            return
        if time.monotonic() - self._used > MAX_AGE and not self._pending:
            _log.debug("closing the unused MQTT connection to %s", self.broker.host)
            self.close()
            return
        self._client.loop_misc()
        self._tick = self._loop.call_later(TICK, self._ticked)

    def _connected_late(self, connect: asyncio.Future[Any]) -> None:
        """Close the socket of a connect that ended after its timeout."""
        if not connect.cancelled() and connect.exception() is None:
            sock = self._client.socket()
            if sock is not None:
                sock.close()

    def _fail(self, error: TransportError) -> None:
        """Close the connection: every caller waiting on it gets ``error``. The socket is
        closed once paho's callback that may have called this has returned."""
        if self.closed:
            return
        self.closed = True
        self._forget(self)
        if self._tick is not None:
            self._tick.cancel()
        if not self._acknowledged.done():
            self._acknowledged.set_exception(error)
            self._acknowledged.exception()  # retrieved: nobody may be waiting any more
        for waiting in self._pending.values():
            if not waiting.done():
                waiting.set_exception(error)
        sock, self._socket = self._socket, None
        if sock is not None:
            self._on_socket_close(None, None, sock)
            self._loop.call_soon(sock.close)

    # paho's callbacks, all called on the loop (from loop_read, loop_write or loop_misc)

    def _on_connect(self, _client: Any, _data: Any, _flags: Any, code: Any, _props: Any) -> None:
        if code.is_failure:
            self._fail(Refused(str(code)))
        elif not self._acknowledged.done():
            self._acknowledged.set_result(None)

    def _on_disconnect(self, _client: Any, _data: Any, _flags: Any, code: Any, _props: Any) -> None:
        self._fail(Broken(f"the MQTT connection was lost: {code}"))

    def _on_publish(self, _client: Any, _data: Any, mid: int, _code: Any, _props: Any) -> None:
        waiting = self._pending.get(mid)
        if waiting is not None and not waiting.done():
            waiting.set_result(None)

    def _on_socket_close(self, _client: Any, _data: Any, sock: Any) -> None:
        if sock.fileno() != -1:
            self._loop.remove_reader(sock)
            self._loop.remove_writer(sock)

    def _on_register_write(self, _client: Any, _data: Any, sock: Any) -> None:
        self._loop.add_writer(sock, self._client.loop_write)

    def _on_unregister_write(self, _client: Any, _data: Any, sock: Any) -> None:
        self._loop.remove_writer(sock)
