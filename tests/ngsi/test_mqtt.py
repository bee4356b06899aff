"""MQTT notifications against a real mosquitto: the sender alone (broker.ngsi.mqtt_client),
the mqtt / mqttCustom channel's validation, and end to end through a real front.

mosquitto runs once for the session (``mosquitto`` fixture) with two listeners on loopback:
one anonymous, one with a password file (user USER, password PASSWORD); the test of a broker
down then up has one of its own, with persistence, so that a subscriber's session survives
its restart. The tests skip, saying why, only when the mosquitto binary is missing
(``make install`` installs it where it can).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paho.mqtt.client as paho
import pytest
from filip.clients.ngsi_v2 import ContextBrokerClient
from filip.models.base import FiwareHeader
from filip.models.ngsi_v2.base import EntityPattern
from filip.models.ngsi_v2.context import ContextEntity
from filip.models.ngsi_v2.subscriptions import Mqtt, Notification, Subject
from filip.models.ngsi_v2.subscriptions import Subscription as FilipSubscription
from paho.mqtt.enums import CallbackAPIVersion

from broker.errors import InvalidInput
from broker.ngsi.allow import AllowList
from broker.ngsi.http_client import ConnectFailed
from broker.ngsi.mqtt_client import Broker, MqttClient, Refused
from broker.ngsi.subscriptions import parse_document
from ngsi.conftest import WAIT, Front, free_port, tenant
from ngsi.test_notifications import get, publish, subscribe, wait_until

USER, PASSWORD = "silbo", "s3cret"
_BINARY = shutil.which("mosquitto") or next(
    (p for p in ("/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto") if os.path.exists(p)), None
)
_PASSWD = shutil.which("mosquitto_passwd")
needs_mosquitto = pytest.mark.skipif(
    _BINARY is None or _PASSWD is None,
    reason="mosquitto is not installed (make install installs it: apt-get install mosquitto)",
)


class Mosquitto:
    """A real mosquitto on loopback: ``port`` anonymous, ``auth_port`` with a password file
    (``persistent``: sessions and queued messages kept over a restart)."""

    def __init__(self, directory: Path, persistent: bool = False) -> None:
        assert _BINARY is not None and _PASSWD is not None
        self.port, self.auth_port = free_port(), free_port()
        passwords = directory / "passwd"
        subprocess.run([_PASSWD, "-b", "-c", str(passwords), USER, PASSWORD], check=True)
        lines = [
            "per_listener_settings true",
            f"listener {self.port} 127.0.0.1",
            "allow_anonymous true",
            f"listener {self.auth_port} 127.0.0.1",
            "allow_anonymous false",
            f"password_file {passwords}",
        ]
        if os.geteuid() == 0:
            lines.insert(0, "user root")  # else it drops to a user that cannot read the files
        if persistent:
            lines += ["persistence true", f"persistence_location {directory}/"]
        self.config = directory / "mosquitto.conf"
        self.config.write_text("\n".join(lines) + "\n")
        self.log = directory / "mosquitto.log"
        self._process: subprocess.Popen[bytes] | None = None
        self.start()

    def url(self, auth: bool = False) -> str:
        """The broker's URL (of its password listener with ``auth``)."""
        return f"mqtt://127.0.0.1:{self.auth_port if auth else self.port}"

    def start(self) -> None:
        """Start it and wait until both listeners take connections."""
        with self.log.open("ab") as log:
            self._process = subprocess.Popen(
                [str(_BINARY), "-c", str(self.config)], stdout=log, stderr=log
            )
        deadline = time.monotonic() + 10
        for port in (self.port, self.auth_port):
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    if time.monotonic() > deadline or self._process.poll() is not None:
                        raise AssertionError(self.log.read_text()) from None
                    time.sleep(0.02)

    def stop(self) -> None:
        """Stop it (SIGTERM: it saves its persistence first)."""
        if self._process is not None:
            self._process.send_signal(signal.SIGTERM)
            self._process.wait(10)
            self._process = None


@dataclass(frozen=True, slots=True)
class Message:
    """One message a subscriber got."""

    topic: str
    payload: bytes
    qos: int
    retain: bool

    def json(self) -> Any:
        return json.loads(self.payload)


class Subscriber:
    """A paho client subscribed to ``topic`` (QoS 2), in its own thread; records every
    message. ``client_id`` with ``clean``=False keeps its session on the broker."""

    def __init__(
        self, port: int, topic: str = "#", client_id: str = "", clean: bool = True
    ) -> None:
        self.messages: list[Message] = []
        self._changed = threading.Condition()
        self._subscribed = threading.Event()
        self._topic = topic
        self.client = paho.Client(
            CallbackAPIVersion.VERSION2, client_id=client_id, clean_session=clean
        )
        self.client.on_connect = self._on_connect
        self.client.on_subscribe = lambda *_args: self._subscribed.set()
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", port)
        self.client.loop_start()
        assert self._subscribed.wait(10), "not subscribed"

    def _on_connect(self, client: paho.Client, *_args: Any) -> None:
        client.subscribe(self._topic, 2)

    def _on_message(self, _client: paho.Client, _data: Any, message: paho.MQTTMessage) -> None:
        got = Message(message.topic, message.payload, message.qos, bool(message.retain))
        with self._changed:
            self.messages.append(got)
            self._changed.notify_all()

    def wait_for(
        self, count: int, topic: str | None = None, timeout: float = WAIT
    ) -> list[Message]:
        """Wait until ``count`` messages (on ``topic``) have come; those messages."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                got = [m for m in self.messages if topic is None or m.topic == topic]
                if len(got) >= count:
                    return got
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise AssertionError(f"{len(got)} messages on {topic}, not {count}: {got}")
                self._changed.wait(remaining)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture(scope="session")
def mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mosquitto]:
    """One mosquitto for the session."""
    if _BINARY is None or _PASSWD is None:
        pytest.skip(
            "mosquitto is not installed (make install installs it: apt-get install mosquitto)"
        )
    broker = Mosquitto(tmp_path_factory.mktemp("mosquitto"))
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def everything(mosquitto: Mosquitto) -> Iterator[Subscriber]:
    """A subscriber to every topic of the session's mosquitto, for one test."""
    subscriber = Subscriber(mosquitto.port)
    try:
        yield subscriber
    finally:
        subscriber.close()


def _publish(
    broker: Broker, topic: str, payload: bytes, qos: int = 0, retain: bool = False
) -> None:
    async def run() -> None:
        client = MqttClient()
        try:
            await client.publish(broker, topic, payload, qos, retain, 5.0)
        finally:
            await client.close()

    asyncio.run(run())


# -- the sender ------------------------------------------------------------------------------


@needs_mosquitto
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_the_sender_publishes_at_each_qos(
    mosquitto: Mosquitto, everything: Subscriber, qos: int
) -> None:
    topic = f"sender/{uuid.uuid4().hex}"
    _publish(Broker.parse(mosquitto.url()), topic, b'{"a":1}', qos)
    [message] = everything.wait_for(1, topic)
    assert (message.payload, message.qos, message.retain) == (b'{"a":1}', qos, False)


@needs_mosquitto
def test_the_sender_keeps_one_connection_per_broker_and_user(
    mosquitto: Mosquitto, everything: Subscriber
) -> None:
    anonymous = Broker.parse(mosquitto.url())
    authenticated = Broker.parse(mosquitto.url(auth=True), USER, PASSWORD)

    async def run() -> list[object]:
        client = MqttClient()
        seen: list[object] = []
        try:
            for broker in (anonymous, anonymous, authenticated, authenticated):
                await client.publish(broker, "sender/pool", b"x", 1, False, 5.0)
                seen.append(client._connections[broker])
        finally:
            await client.close()
        return seen

    first, again, other, other_again = asyncio.run(run())
    assert first is again and other is other_again and first is not other
    everything.wait_for(2, "sender/pool")  # the anonymous listener's two


@needs_mosquitto
def test_the_sender_is_refused_a_wrong_password(mosquitto: Mosquitto) -> None:
    with pytest.raises(Refused) as refused:
        _publish(Broker.parse(mosquitto.url(auth=True), USER, "wrong"), "sender/x", b"x", 1)
    assert refused.value.reason == "MQTT broker refused the connection: Not authorized"


def test_the_sender_fails_to_connect_to_nothing() -> None:
    with pytest.raises(ConnectFailed):
        _publish(Broker.parse(f"mqtt://127.0.0.1:{free_port()}"), "sender/x", b"x", 1)


@needs_mosquitto
def test_the_sender_keeps_retained_messages(mosquitto: Mosquitto) -> None:
    topic = f"sender/{uuid.uuid4().hex}"
    _publish(Broker.parse(mosquitto.url()), topic, b"kept", 1, retain=True)
    later = Subscriber(mosquitto.port, topic)  # subscribes after the publish
    try:
        [message] = later.wait_for(1, topic)
        assert (message.payload, message.retain) == (b"kept", True)
    finally:
        later.close()


# -- the channel's validation ----------------------------------------------------------------

URL = "mqtt://127.0.0.1:1883"


def _document(kind: str, channel: Any) -> dict[str, Any]:
    return {"subject": {"entities": [{"idPattern": ".*"}]}, "notification": {kind: channel}}


@pytest.mark.parametrize(
    ("kind", "channel", "description"),
    [
        ("mqtt", "mqtt://x", "notification.mqtt must be a JSON object"),
        ("mqtt", {"topic": "a"}, "mandatory mqtt field /url/"),
        ("mqtt", {"url": URL}, "mandatory mqtt field /topic/"),
        ("mqtt", {"url": URL, "topic": ""}, "empty mqtt field /topic/"),
        ("mqtt", {"url": URL, "topic": "a/#"}, "+ and # are not allowed in mqtt field /topic/"),
        ("mqtt", {"url": URL, "topic": "a/+/b"}, "+ and # are not allowed"),
        ("mqtt", {"url": "http://127.0.0.1:1883", "topic": "a"}, "http or https URL cannot"),
        ("mqtt", {"url": "127.0.0.1:1883", "topic": "a"}, "invalid mqtt /url/"),
        ("mqtt", {"url": "mqtt://127.0.0.1:x", "topic": "a"}, "invalid mqtt /url/"),
        ("mqtt", {"url": URL + "/path", "topic": "a"}, "path cannot be used in mqtt url"),
        ("mqtt", {"url": "mqtt://example.com:1883", "topic": "a"}, "allow-list"),
        ("mqtt", {"url": URL, "topic": 7}, "notification.mqtt.topic must be a string"),
        ("mqtt", {"url": URL, "topic": "a", "qos": 3}, "qos field must be an integer in the 0"),
        ("mqtt", {"url": URL, "topic": "a", "qos": "1"}, "qos field must be an integer"),
        ("mqtt", {"url": URL, "topic": "a", "qos": True}, "qos field must be an integer"),
        ("mqtt", {"url": URL, "topic": "a", "retain": "yes"}, "retain must be true or false"),
        ("mqtt", {"url": URL, "topic": "a", "user": "u"}, "user and passwd fields simultaneously"),
        ("mqtt", {"url": URL, "topic": "a", "passwd": "p"}, "user and passwd fields"),
        ("mqtt", {"url": URL, "topic": "a", "user": 1, "passwd": "p"}, "user must be a string"),
        ("mqtt", {"url": URL, "topic": "a", "timeout": 10}, "unrecognized field 'timeout'"),
        ("mqtt", {"url": URL, "topic": "a", "payload": "x"}, "unrecognized field 'payload'"),
        ("mqttCustom", {"url": URL, "topic": "a", "headers": {}}, "unrecognized field 'headers'"),
        ("mqttCustom", {"url": URL, "topic": "a", "payload": "x", "json": {}}, "only one of"),
        ("mqttCustom", {"url": URL, "topic": "${a|b}"}, "JEXL is not supported"),
        ("mqttCustom", {"url": URL, "topic": "a", "json": 3}, "must be a JSON object or array"),
        ("mqttCustom", {"url": URL, "topic": "a", "payload": 3}, "payload must be a string"),
    ],
)
def test_bad_mqtt_channels_are_refused_saying_why(
    kind: str, channel: Any, description: str
) -> None:
    with pytest.raises(InvalidInput) as refused:
        parse_document(_document(kind, channel), AllowList.parse())
    assert description in str(refused.value)


def test_one_channel_only() -> None:
    document = _document("mqtt", {"url": URL, "topic": "a"})
    document["notification"]["http"] = {"url": "http://127.0.0.1:9/n"}
    with pytest.raises(InvalidInput, match="exactly one of http, httpCustom, mqtt and mqttCustom"):
        parse_document(document, AllowList.parse())


def test_an_mqtt_channel_is_shown_as_orion_shows_it() -> None:
    given = {"url": URL, "topic": "${id}", "user": USER, "passwd": PASSWORD, "json": {"a": 1}}
    parsed = parse_document(_document("mqttCustom", given), AllowList.parse())
    assert parsed.channel.shown(given) == {
        "url": URL,
        "topic": "${id}",
        "qos": 0,
        "retain": False,
        "user": USER,
        "passwd": "*****",
        "json": {"a": 1},
    }
    assert parsed.channel.kind == "mqttCustom" and parsed.channel.templated()
    plain = parse_document(_document("mqtt", {"url": URL, "topic": "${id}"}), AllowList.parse())
    assert not plain.channel.templated()  # mqtt sends a ${...} as it is, as Orion does


# -- end to end ------------------------------------------------------------------------------


def _mqtt_subscription(kind: str, channel: dict[str, Any], **notification: Any) -> Any:
    return {
        "subject": {"entities": [{"idPattern": ".*"}]},
        "notification": {kind: channel, **notification},
    }


@needs_mosquitto
@pytest.mark.parametrize("qos", [0, 1, 2])
def test_mqtt_notifications_carry_the_notification_json(
    front: Front, mosquitto: Mosquitto, everything: Subscriber, qos: int
) -> None:
    t = tenant()
    h = {"Fiware-Service": t}
    topic = f"{t}/rooms"
    channel = {"url": mosquitto.url(), "topic": topic, "qos": qos}
    sid = subscribe(front, h, _mqtt_subscription("mqtt", channel))
    publish(front, h, {"id": "R1", "type": "Room", "temperature": {"value": 21.5}})
    [message] = everything.wait_for(1, topic)
    assert message.qos == qos
    assert message.json() == {
        "subscriptionId": sid,
        "data": [
            {
                "id": "R1",
                "type": "Room",
                "temperature": {"type": "Number", "value": 21.5, "metadata": {}},
            }
        ],
    }
    wait_until(lambda: "lastSuccess" in get(front, h, sid)["notification"], "lastSuccess")
    shown = get(front, h, sid)["notification"]
    assert shown["mqtt"] == {"url": mosquitto.url(), "topic": topic, "qos": qos, "retain": False}
    assert shown["timesSent"] == 1 and "lastSuccessCode" not in shown
    assert "failsCounter" not in shown


@needs_mosquitto
def test_mqtt_custom_fills_macros_in_topic_and_payload(
    front: Front, mosquitto: Mosquitto, everything: Subscriber
) -> None:
    t = tenant()
    h = {"Fiware-Service": t}
    text = {"url": mosquitto.url(), "topic": "${service}/text/${id}", "payload": "t=${temperature}"}
    as_json = {
        "url": mosquitto.url(),
        "topic": "${service}/json/${type}",
        "qos": 1,
        "retain": True,
        "json": {"room": "${id}", "t": "${temperature}"},
    }
    subscribe(front, h, _mqtt_subscription("mqttCustom", text))
    sid = subscribe(front, h, _mqtt_subscription("mqttCustom", as_json))
    publish(front, h, {"id": "R7", "type": "Room", "temperature": {"value": 19}})
    [plain] = everything.wait_for(1, f"{t}/text/R7")
    assert plain.payload == b"t=19"
    [structured] = everything.wait_for(1, f"{t}/json/Room")
    assert structured.json() == {"room": "R7", "t": 19}
    later = Subscriber(mosquitto.port, f"{t}/json/Room")  # the retained message
    try:
        assert later.wait_for(1)[0].retain
    finally:
        later.close()
    assert get(front, h, sid)["notification"]["mqttCustom"] == {**as_json, "retain": True}


@needs_mosquitto
def test_mqtt_user_and_passwd(front: Front, mosquitto: Mosquitto) -> None:
    t = tenant()
    h = {"Fiware-Service": t}
    topic = f"{t}/secured"
    listener = Subscriber(mosquitto.port, topic)  # anonymous: listeners share topics
    try:
        right = {"url": mosquitto.url(auth=True), "topic": topic, "user": USER, "passwd": PASSWORD}
        wrong = {**right, "passwd": "wrong"}
        good = subscribe(front, h, _mqtt_subscription("mqtt", right))
        bad = subscribe(front, h, _mqtt_subscription("mqtt", wrong))
        publish(front, h, {"id": "R1", "type": "Room", "temperature": {"value": 1}})
        listener.wait_for(1)
        wait_until(lambda: get(front, h, bad)["notification"].get("failsCounter") == 1, "a fail")
        failed = get(front, h, bad)["notification"]
        assert failed["lastFailureReason"] == "MQTT broker refused the connection: Not authorized"
        assert failed["mqtt"]["passwd"] == "*****" and failed["mqtt"]["user"] == USER
        publish(front, h, {"id": "R1", "type": "Room", "temperature": {"value": 2}})
        listener.wait_for(2)
        wait_until(lambda: get(front, h, bad)["notification"].get("failsCounter") == 2, "2 fails")
        assert "failsCounter" not in get(front, h, good)["notification"]
        assert PASSWORD not in json.dumps(front.call("GET", "/v2/subscriptions", headers=h).body)
    finally:
        listener.close()


@needs_mosquitto
def test_a_broker_down_then_up_gets_the_notifications_in_order(
    front: Front, tmp_path: Path
) -> None:
    broker = Mosquitto(tmp_path, persistent=True)
    t = tenant()
    h = {"Fiware-Service": t}
    topic = f"{t}/later"
    # a subscriber whose session (and what is queued for it) outlives the broker's restart
    Subscriber(broker.port, topic, client_id=f"keep-{t}", clean=False).close()
    broker.stop()
    try:
        channel = {"url": broker.url(), "topic": topic, "qos": 1}
        sid = subscribe(front, h, _mqtt_subscription("mqtt", channel))
        for value in (1, 2, 3):
            publish(front, h, {"id": "R1", "type": "Room", "n": {"value": value}})
        wait_until(lambda: get(front, h, sid)["notification"].get("timesSent") == 3, "3 sent")
        time.sleep(0.5)  # the first attempts meet a refused connection
        broker.start()
        back = Subscriber(broker.port, topic, client_id=f"keep-{t}", clean=False)
        try:
            got = back.wait_for(3, topic)
            assert [m.json()["data"][0]["n"]["value"] for m in got] == [1, 2, 3]
        finally:
            back.close()
        wait_until(lambda: "lastSuccess" in get(front, h, sid)["notification"], "lastSuccess")
        assert "failsCounter" not in get(front, h, sid)["notification"]
    finally:
        broker.stop()


def test_a_bad_mqtt_subscription_is_400(front: Front) -> None:
    body = _mqtt_subscription("mqtt", {"url": URL, "topic": "a", "qos": 5})
    answer = front.call("POST", "/v2/subscriptions", body)
    assert answer.status == 400
    assert answer.body["error"] == "BadRequest"
    assert "mqtt qos field must be an integer in the 0 to 2 range" in answer.body["description"]


@needs_mosquitto
def test_filip_makes_an_mqtt_subscription(
    front: Front, mosquitto: Mosquitto, everything: Subscriber
) -> None:
    """FIWARE's Python client (filip), unchanged: an MQTT subscription it creates and reads
    back, and the notification it causes on the broker."""
    t = tenant()
    topic = f"{t}/filip"
    header = FiwareHeader(service=t, service_path="/")
    with ContextBrokerClient(url=f"http://{front.host}:{front.port}", fiware_header=header) as cb:
        subscription = FilipSubscription(
            description="filip over MQTT",
            subject=Subject(entities=[EntityPattern(idPattern=".*")]),
            notification=Notification(mqtt=Mqtt(url=mosquitto.url(), topic=topic, qos=1)),
        )
        sid = cb.post_subscription(subscription)
        cb.post_entity(ContextEntity(id="F1", type="Room", t={"type": "Number", "value": 3}))
        [message] = everything.wait_for(1, topic)
        assert message.json()["subscriptionId"] == sid
        assert message.json()["data"][0]["t"]["value"] == 3
        read = cb.get_subscription(sid)
        assert read.notification.mqtt is not None
        assert (read.notification.mqtt.topic, read.notification.mqtt.qos) == (topic, 1)
        cb.delete_subscription(sid)
