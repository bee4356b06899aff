"""Faults at the edge of a real cluster: bad input, malformed bytes, clients that vanish.

- Malformed updates and subscriptions are refused with INVALID_ARGUMENT (InvalidInput in the
  client) and a message naming the problem; the refusing stream stays up, and a refused
  batch or subscribe request changes nothing (all or nothing).
- Bytes that are no protobuf message at all get an INVALID_ARGUMENT answer on the stream,
  which stays up; so do batches the cluster cannot carry (sequences past 2**64 - 1, a
  publisher name or a batch too large), and an empty batch is accepted at once. A Release
  that follows no Moved event is refused: the session's subscriptions stay its own.
- A subscriber killed with SIGKILL mid-stream costs the others nothing, and its
  subscriptions are removed from the matchers; so are those of a client that closes while
  it publishes.
"""

from __future__ import annotations

import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from conftest import StartCluster

from broker.client import Client
from broker.errors import AlreadyExists, InvalidInput, NotFound, SilboError, Unavailable
from broker.model.subscription import EntitySelector, Subscription
from broker.model.update import ContextUpdate
from broker.wire import client_pb2 as pb
from broker.wire.convert import entity_from_update
from integration.conftest import (
    DELIVERY_DEADLINE,
    Published,
    Recorder,
    assert_exact_delivery,
    end_marker,
    subscriptions_held,
    wait_until,
)

ROOMS = (EntitySelector(id_pattern=".*", type="Room"),)


def _room(i: int, temperature: float = 21.0) -> ContextUpdate:
    return ContextUpdate.of(f"Room{i}", {"temperature": temperature}, entity_type="Room")


def _attribute(name: str, value: pb.Value, type_: str = "") -> pb.Attribute:
    return pb.Attribute(name=name, type=type_, value=value)


def held_by(ids: set[str], copies: int = 2) -> dict[str, float]:
    """What ``subscriptions_held`` reports when exactly ``ids`` are subscribed (each held
    by ``copies`` matchers)."""
    return {
        "matcher": len(ids),
        "matcher_copies": copies * len(ids),
        "connection-point": len(ids),
        "access-point": 0,
        "exit-point": 0,
    }


# (what is wrong, the entity, a fragment of the refusal's message)
BAD_ENTITIES = [
    ("'#' in the id", pb.Entity(id="Room#1", type="Room"), "entity id"),
    ("whitespace in the id", pb.Entity(id="Room 1", type="Room"), "entity id"),
    ("an empty id", pb.Entity(id="", type="Room"), "entity id"),
    ("a bad type", pb.Entity(id="Room1", type="Ro?om"), "entity type"),
    ("a bad tenant", pb.Entity(id="Room1", tenant="Upper-Case"), "tenant"),
    ("a relative service path", pb.Entity(id="Room1", service_path="a/b"), "service path"),
    (
        "a NaN",
        pb.Entity(id="Room1", attributes=[_attribute("t", pb.Value(number=float("nan")))]),
        "JSON cannot carry",
    ),
    (
        "JSON that does not parse",
        pb.Entity(id="Room1", attributes=[_attribute("t", pb.Value(json="{oops"))]),
        "not valid JSON",
    ),
    (
        "JSON nested past what the decoder can take",
        pb.Entity(
            id="Room1",
            attributes=[_attribute("t", pb.Value(json="[" * 100_000 + "]" * 100_000))],
        ),
        "nested deeper",
    ),
    (
        "a date that is not one",
        pb.Entity(id="Room1", attributes=[_attribute("d", pb.Value(text="yesterday"), "DateTime")]),
        "ISO 8601",
    ),
    (
        "a reserved attribute name",
        pb.Entity(id="Room1", attributes=[_attribute("id", pb.Value(text="x"))]),
        "reserved",
    ),
    (
        "an attribute given twice",
        pb.Entity(
            id="Room1",
            attributes=[_attribute("t", pb.Value(integer=1)), _attribute("t", pb.Value(integer=2))],
        ),
        "twice",
    ),
]


def test_malformed_updates_are_refused_and_the_publish_stream_stays_up(
    start_cluster: StartCluster,
) -> None:
    cluster = start_cluster(matchers=2)
    recorder = Recorder(cluster.endpoints, "watcher", raw=False)
    try:
        recorder.subscribe(
            [Subscription(id="everything", entities=(EntitySelector(id_pattern=".*"),))]
        )
        # per sequence number (a refused batch uses its numbers too): the update, if accepted
        accepted: list[ContextUpdate | None] = []
        with Client(cluster.endpoints, publisher="careless") as client:
            for what, entity, fragment in BAD_ENTITIES:
                with pytest.raises(InvalidInput, match=fragment) as refused:
                    client.publish(entity)
                assert "entity 0" in str(refused.value), what
                accepted.append(None)
                # the same stream takes the next update
                update = _room(len(accepted), temperature=len(accepted))
                client.publish(update)
                accepted.append(update)
            # a batch with one bad entity is refused whole
            good, bad = _room(100), BAD_ENTITIES[0][1]
            with pytest.raises(InvalidInput, match="entity 1"):
                client.publish_many([good, bad, good], batch_size=10)
            accepted.extend([None, None, None])
            assert client.publish_many([good, end_marker(0, 0)], batch_size=10) == 2
            accepted.append(good)
        recorder.wait_for_markers(["careless"])
        received = [r for r in recorder.received() if r.subscription_id == "everything"]
        assert [(r.sequence, r.entity.id) for r in received] == [
            (sequence, update.entity_id)
            for sequence, update in enumerate(accepted, start=1)
            if update is not None
        ]
    finally:
        recorder.close()


def test_refused_subscription_requests_leave_the_session_usable(
    start_cluster: StartCluster,
) -> None:
    cluster = start_cluster(matchers=2)
    with (
        Client(cluster.endpoints) as client,
        Client(cluster.endpoints) as other,
        Client(cluster.endpoints, publisher="pub") as publisher,
    ):
        with pytest.raises(InvalidInput, match="subscription 0"):
            client.subscribe(id_pattern="(unclosed", type="Room")
        with pytest.raises(InvalidInput, match="entity id"):
            client.subscribe(id="Room 1", type="Room")
        with pytest.raises(InvalidInput, match="tenant"):
            client.subscribe(type="Room", tenant="Not A Tenant")
        with pytest.raises(InvalidInput, match="given twice"):
            client.subscribe_many([Subscription(id="twin", entities=ROOMS)] * 2)
        # the session is still usable
        warm = client.subscribe(subscription_id="warm", type="Room", q="temperature>25")
        with pytest.raises(AlreadyExists, match="warm"):
            client.subscribe(subscription_id="warm", type="Room")
        with pytest.raises(AlreadyExists, match="warm"):
            other.subscribe(subscription_id="warm", type="Thing")
        # all or nothing: "fresh" is dropped again because "warm" is taken
        with pytest.raises(AlreadyExists):
            other.subscribe_many(
                [Subscription(id=f"fresh-{i}", entities=ROOMS) for i in range(8)]
                + [Subscription(id="warm", entities=ROOMS)]
            )
        wait_until(
            lambda: subscriptions_held(cluster) == held_by({"warm"}),
            10,
            "the refused request's other subscriptions are undone",
        )
        with pytest.raises(NotFound, match="nothing-here"):
            client.unsubscribe("nothing-here")
        with pytest.raises(NotFound, match="warm"):
            other.unsubscribe("warm")  # not its subscription
        fresh = other.subscribe(subscription_id="fresh-0", type="Room")
        publisher.publish(_room(1, temperature=30))
        for handle in (warm, fresh):
            notification = handle.get(timeout=DELIVERY_DEADLINE)
            assert (notification.update.entity_id, notification.update.publisher) == (
                "Room1",
                "pub",
            )
        assert subscriptions_held(cluster) == held_by({"warm", "fresh-0"})


@pytest.mark.parametrize(
    ("field", "text"), [("q", "temperature>>25"), ("mq", "temperature.unit==")]
)
def test_a_filter_that_does_not_parse_is_refused_and_the_session_stays_up(
    start_cluster: StartCluster, field: str, text: str
) -> None:
    cluster = start_cluster(matchers=1)
    with Client(cluster.endpoints) as client, Client(cluster.endpoints) as publisher:
        before = client.subscribe(subscription_id="before", type="Room")
        with pytest.raises(InvalidInput, match=r"subscription 0: .*\(column \d+\)"):
            client.subscribe(type="Room", **{field: text})
        assert subscriptions_held(cluster) == held_by({"before"}, copies=1)
        publisher.publish(_room(1))
        assert before.get(timeout=DELIVERY_DEADLINE).update.entity_id == "Room1"


class RawStream:
    """One bidirectional stream of a connection point, carrying bytes as given."""

    def __init__(self, channel: grpc.Channel, method: str) -> None:
        self._requests: queue.Queue[bytes | None] = queue.Queue()
        self._responses: queue.Queue[bytes | grpc.RpcError | None] = queue.Queue()
        call: grpc.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream(method)
        self._call: Iterator[bytes] = call(self._iterate())
        threading.Thread(target=self._read, daemon=True).start()

    def send(self, data: bytes) -> None:
        self._requests.put(data)

    def receive(self, timeout: float = 10.0) -> bytes:
        """The next response's bytes; fails on an error or the end of the stream."""
        response = self._responses.get(timeout=timeout)
        if isinstance(response, grpc.RpcError):
            raise AssertionError(f"the stream failed: {response}")
        assert response is not None, "the stream ended"
        return response

    def close(self) -> None:
        self._requests.put(None)

    def _iterate(self) -> Iterator[bytes]:
        while (data := self._requests.get()) is not None:
            yield data

    def _read(self) -> None:
        try:
            for response in self._call:
                self._responses.put(response)
            self._responses.put(None)
        except grpc.RpcError as exc:
            self._responses.put(exc)


def _good_request(sequence: int) -> bytes:
    entity = pb.Entity(id=f"Room{sequence}", type="Room")
    request = pb.PublishRequest(batch=sequence, publisher="raw", first_sequence=sequence)
    request.entities.append(entity)
    return request.SerializeToString()


# (what is wrong, the bytes)
MALFORMED = [
    ("no protobuf at all", b"\xff\xff\xff\xff"),
    ("a truncated message", _good_request(7)[:-2]),
    ("a string that is not UTF-8", b"\x12\x02\xc3\x28"),
]


def test_malformed_bytes_get_invalid_argument_and_the_streams_stay_up(
    start_cluster: StartCluster,
) -> None:
    cluster = start_cluster(matchers=1)
    recorder = Recorder(cluster.endpoints, "watcher", raw=True)
    try:
        recorder.subscribe([Subscription(id="rooms", entities=ROOMS)])
        with grpc.insecure_channel(cluster.endpoints[0]) as channel:
            publish = RawStream(channel, "/broker.wire.ConnectionPoint/Publish")
            sequence = 1
            for what, garbage in MALFORMED:
                publish.send(garbage)
                ack = pb.PublishAck.FromString(publish.receive())
                assert ack.error.code == "INVALID_ARGUMENT", what
                assert "not a PublishRequest" in ack.error.message, ack.error.message
                assert ack.accepted == 0
                publish.send(_good_request(sequence))
                ack = pb.PublishAck.FromString(publish.receive())
                assert (ack.batch, ack.accepted, ack.error.code) == (sequence, 1, "")
                sequence += 1
            session = RawStream(channel, "/broker.wire.ConnectionPoint/Session")
            for garbage, fragment in (
                (b"\xff\xff\xff\xff", "not a SessionRequest"),
                (
                    pb.SessionRequest(request=9).SerializeToString(),
                    "needs subscribe or unsubscribe",
                ),
            ):
                session.send(garbage)
                event = pb.SessionEvent.FromString(session.receive())
                assert event.ack.error.code == "INVALID_ARGUMENT", event
                assert fragment in event.ack.error.message, event
            subscribe = pb.SessionRequest(request=10)
            subscribe.subscribe.subscriptions.add(id="raw-sub").entities.add(id_pattern=".*")
            session.send(subscribe.SerializeToString())
            event = pb.SessionEvent.FromString(session.receive())
            assert (event.ack.request, list(event.ack.ids), event.ack.error.code) == (
                10,
                ["raw-sub"],
                "",
            )
            # the subscription made on that stream gets what is published next
            publish.send(_good_request(sequence))
            publish.send(_marker_request(sequence + 1))
            for _ in range(2):
                assert pb.PublishAck.FromString(publish.receive()).accepted == 1
            recorder.wait_for_markers(["raw"])
            event = pb.SessionEvent.FromString(session.receive())
            assert [e.id for e in event.notifications.entities] == [f"Room{sequence}"]
            publish.close()
            session.close()
        rooms = [r for r in recorder.received() if r.subscription_id == "rooms"]
        assert [(r.entity.id, r.sequence) for r in rooms] == [
            (f"Room{i}", i) for i in range(1, sequence + 1)
        ]
    finally:
        recorder.close()


def _batch(publisher: str, first: int, count: int, text: str = "") -> pb.PublishRequest:
    request = pb.PublishRequest(batch=first, publisher=publisher, first_sequence=first)
    for i in range(count):
        entity = request.entities.add(id=f"Room{i}", type="Room")
        if text:
            entity.attributes.add(name="note", value=pb.Value(text=text))
    return request


# (what is wrong, the batch, a fragment of the refusal); found by tests/integration/
# test_grpc_fuzz.py: the first killed the connection point (a 1 GB internal message, sent
# again and again), the second ended the publish stream without an answer
UNROUTABLE = [
    (
        "a 100,000-character publisher on 10,000 updates",
        _batch("p" * 100_000, 1, 10_000),
        "publisher is 100000 characters long",
    ),
    ("sequences past 2**64 - 1", _batch("raw", (1 << 64) - 1, 2), "first_sequence"),
    ("17 MB of updates", _batch("raw", 1, 17, "x" * (1 << 20)), "publish smaller batches"),
]


def test_batches_the_cluster_cannot_carry_are_refused_and_the_stream_stays_up(
    start_cluster: StartCluster,
) -> None:
    cluster = start_cluster(matchers=1)
    with grpc.insecure_channel(cluster.endpoints[0]) as channel:
        publish = RawStream(channel, "/broker.wire.ConnectionPoint/Publish")
        for what, request, fragment in UNROUTABLE:
            publish.send(request.SerializeToString())
            ack = pb.PublishAck.FromString(publish.receive())
            assert (ack.batch, ack.accepted, ack.error.code) == (
                request.batch,
                0,
                "INVALID_ARGUMENT",
            ), what
            assert fragment in ack.error.message, ack.error.message
        # an empty batch has nothing to deliver: accepted at once (it waited 60 s, refused)
        publish.send(pb.PublishRequest(batch=5, publisher="raw").SerializeToString())
        ack = pb.PublishAck.FromString(publish.receive(timeout=5.0))
        assert (ack.batch, ack.accepted, ack.error.code) == (5, 0, "")
        publish.send(_good_request(7))
        ack = pb.PublishAck.FromString(publish.receive())
        assert (ack.batch, ack.accepted, ack.error.code) == (7, 1, "")
        publish.close()
    assert not cluster.poll(), "a broker process died"


def test_a_release_without_a_move_is_refused_and_leaks_nothing(
    start_cluster: StartCluster,
) -> None:
    # A Release hands a session's subscriptions to whoever took them over after a Moved
    # event; without one, they were nobody's and stayed on the matchers for good (found by
    # tests/integration/test_grpc_fuzz.py).
    cluster = start_cluster(matchers=1)
    with grpc.insecure_channel(cluster.endpoints[0]) as channel:
        session = RawStream(channel, "/broker.wire.ConnectionPoint/Session")
        subscribe = pb.SessionRequest(request=1)
        subscribe.subscribe.subscriptions.add(id="kept").entities.add(id_pattern=".*")
        session.send(subscribe.SerializeToString())
        assert list(pb.SessionEvent.FromString(session.receive()).ack.ids) == ["kept"]
        session.send(pb.SessionRequest(request=2, release=pb.Release()).SerializeToString())
        ack = pb.SessionEvent.FromString(session.receive()).ack
        assert (ack.request, ack.error.code) == (2, "INVALID_ARGUMENT")
        assert "Moved" in ack.error.message, ack.error.message
        assert subscriptions_held(cluster) == held_by({"kept"}, copies=1)
        session.close()
        wait_until(
            lambda: subscriptions_held(cluster) == held_by(set(), copies=1),
            10,
            "the ended session's subscription is removed",
        )


def _marker_request(sequence: int) -> bytes:
    request = pb.PublishRequest(batch=sequence, publisher="raw", first_sequence=sequence)
    request.entities.append(entity_from_update(end_marker(0, 0)))
    return request.SerializeToString()


# -- clients that vanish ------------------------------------------------------------------

_CHILD = """
import sys
from broker.client import Client

client = Client(sys.argv[1], timeout=30)
handles = [
    client.subscribe(subscription_id=f"child-{i}", type="Room", q=f"temperature>{i}")
    for i in range(int(sys.argv[2]))
]
print("ready", flush=True)
handles[0].get(timeout=60)
print("receiving", flush=True)
for _notification in handles[0]:
    pass
"""


def _lines(process: subprocess.Popen[str]) -> queue.Queue[str]:
    lines: queue.Queue[str] = queue.Queue()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            lines.put(line.strip())
        lines.put("<end of output>")

    threading.Thread(target=read, daemon=True).start()
    return lines


def test_a_subscriber_killed_mid_stream_leaves_the_others_unaffected_and_leaks_nothing(
    start_cluster: StartCluster,
) -> None:
    cluster = start_cluster(matchers=2)
    survivor = Recorder(cluster.endpoints, "survivor", raw=True)
    child = subprocess.Popen(
        [sys.executable, "-c", _CHILD, cluster.endpoints[0], "40"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        lines = _lines(child)
        survivor.subscribe(
            [
                Subscription(id="warm", entities=ROOMS, q="temperature>20"),
                Subscription(id="all", entities=ROOMS),
            ]
        )
        assert lines.get(timeout=DELIVERY_DEADLINE) == "ready"
        held = subscriptions_held(cluster)
        assert held["matcher"] == held["connection-point"] == 3 + 40

        published: list[ContextUpdate] = []
        stop = threading.Event()
        errors: list[BaseException] = []

        def publish() -> None:
            try:
                with Client(cluster.endpoints, publisher="steady") as client:
                    i = 0
                    while not stop.is_set():
                        batch = [_room(i + k, temperature=(i + k) % 50) for k in range(20)]
                        published.extend(batch)  # before sending: sequences follow the list
                        client.publish_many(batch, batch_size=20)
                        i += 20
                    marker = end_marker(0, len(published))
                    published.append(marker)
                    client.publish(marker)
            except BaseException as exc:
                errors.append(exc)

        publisher = threading.Thread(target=publish, daemon=True)
        publisher.start()
        assert lines.get(timeout=DELIVERY_DEADLINE) == "receiving"
        at_kill = len(published)
        child.send_signal(signal.SIGKILL)
        assert child.wait(timeout=10) == -signal.SIGKILL
        # updates keep flowing after the kill
        wait_until(lambda: len(published) >= at_kill + 400, 20, "publishing after the kill")
        stop.set()
        publisher.join(DELIVERY_DEADLINE)
        assert not publisher.is_alive() and not errors, errors
        survivor.wait_for_markers(["steady"])
        count = assert_exact_delivery(survivor, [Published("steady", published)])
        assert count > 500
        wait_until(
            lambda: subscriptions_held(cluster) == held_by({"warm", "all", "survivor-end"}),
            10,
            "the killed subscriber's 40 subscriptions are removed",
        )
        assert not cluster.poll(), "a broker process died"
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        survivor.close()


def test_a_client_closed_while_it_publishes_leaks_nothing(start_cluster: StartCluster) -> None:
    cluster = start_cluster(matchers=2)
    with Client(cluster.endpoints) as stays:
        stays_handle = stays.subscribe(subscription_id="stays", type="Room")
        leaving = Client(cluster.endpoints, timeout=3)
        for i in range(25):
            leaving.subscribe(subscription_id=f"leaving-{i}", type="Room", q=f"temperature>{i}")
        assert subscriptions_held(cluster)["matcher"] == 26
        sent = threading.Event()
        outcome: list[BaseException | int] = []

        def updates() -> Iterator[ContextUpdate]:
            for i in range(1_000_000):
                if i == 2_000:
                    sent.set()
                yield _room(i, temperature=i % 40)

        def publish() -> None:
            try:
                outcome.append(leaving.publish_many(updates(), batch_size=100))
            except BaseException as exc:
                outcome.append(exc)

        thread = threading.Thread(target=publish, daemon=True)
        thread.start()
        assert sent.wait(DELIVERY_DEADLINE)
        leaving.close()
        thread.join(10)
        assert not thread.is_alive()
        assert len(outcome) == 1 and isinstance(outcome[0], SilboError | TimeoutError), outcome
        wait_until(
            lambda: subscriptions_held(cluster) == held_by({"stays"}),
            10,
            "the closed client's subscriptions are removed",
        )
        # the cluster still serves the client that stayed
        with Client(cluster.endpoints, publisher="later") as later:
            later.publish(_room(1, temperature=30))
        deadline = time.monotonic() + DELIVERY_DEADLINE
        while (
            stays_handle.get(timeout=max(0.0, deadline - time.monotonic())).update.publisher
            != "later"
        ):
            pass  # what "leaving" published before it closed
    assert not cluster.poll(), "a broker process died"


# -- the client's own handling of a connection point that never answers -------------------


class SilentConnectionPoint:
    """A gRPC server that takes publish batches and never acknowledges them."""

    def __init__(self) -> None:
        self.received = threading.Event()
        self._server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        handler = grpc.stream_stream_rpc_method_handler(
            self._publish,
            request_deserializer=pb.PublishRequest.FromString,
            response_serializer=pb.PublishAck.SerializeToString,
        )
        self._server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    "broker.wire.ConnectionPoint", {"Publish": handler}
                ),
            )
        )
        self.address = f"127.0.0.1:{self._server.add_insecure_port('127.0.0.1:0')}"
        self._server.start()

    def _publish(
        self, requests: Iterator[pb.PublishRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.PublishAck]:
        for _request in requests:
            self.received.set()
        yield from ()

    def stop(self) -> None:
        self._server.stop(grace=0)


@pytest.fixture
def silent() -> Iterator[SilentConnectionPoint]:
    server = SilentConnectionPoint()
    yield server
    server.stop()


def test_an_unacknowledged_publish_is_unavailable(silent: SilentConnectionPoint) -> None:
    with Client(silent.address, timeout=1) as client, pytest.raises(Unavailable):
        client.publish(_room(1))


def test_closing_a_client_ends_a_publish_waiting_for_its_ack(
    silent: SilentConnectionPoint,
) -> None:
    client = Client(silent.address, timeout=4)
    outcome: list[BaseException | None] = []

    def publish() -> None:
        try:
            client.publish(_room(1))
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=publish, daemon=True)
    thread.start()
    assert silent.received.wait(10)
    started = time.monotonic()
    client.close()
    thread.join(1.0)
    assert not thread.is_alive(), (
        f"publish still waiting {time.monotonic() - started:.1f} s after close"
    )
    assert len(outcome) == 1 and isinstance(outcome[0], SilboError), outcome
