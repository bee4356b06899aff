"""Fuzzing the client port of a real cluster: whatever a client sends, it gets an answer.

Three kinds of input go to ``ConnectionPoint.Session`` and ``ConnectionPoint.Publish`` as raw
bytes (a channel with identity serializers), a session first and, while it is open, a
publisher:

- arbitrary bytes;
- structurally valid messages, drawn valid (tests/strategies.py) and then given one or two
  hostile fields: huge, empty, non-ASCII or control-character names, NaN and infinities,
  JSON nested a million deep, fields repeated by the thousand, sequences at the uint64 edge
  or going backwards, filters and patterns that do not parse or would backtrack, unknown
  fields;
- valid messages with bytes flipped, inserted, deleted, duplicated or cut.

The properties, for every example:

- every message is answered (a PublishAck, or a SessionEvent carrying a SessionAck) within
  :data:`ANSWER_DEADLINE`, accepted or refused with a typed code (INVALID_ARGUMENT,
  NOT_FOUND, ALREADY_EXISTS, RESOURCE_EXHAUSTED), never INTERNAL or UNKNOWN; or the stream
  ends with INVALID_ARGUMENT or RESOURCE_EXHAUSTED (a Release ends a session with OK: what
  follows it need not be answered);
- once the client half-closes, the stream ends: OK, or one of those two codes;
- no process of the cluster has exited.

After each test, a client that subscribed before any fuzzing still gets the notification of
an ordinary publish, and its subscription is the only one left. One cluster serves the whole
module.
"""

from __future__ import annotations

import math
import queue
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import grpc
import pytest
from google.protobuf.message import Message
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from strategies import examples, subscriptions, updates

from broker.client import Client, SubscriptionHandle
from broker.cluster import ClusterSpec, LocalCluster
from broker.coordination.embedded import EmbeddedZooKeeper
from broker.model.attribute import MAX_STRING_LENGTH
from broker.model.update import ContextUpdate
from broker.wire import client_pb2 as pb
from broker.wire.convert import entity_from_update, spec_from_subscription
from integration.conftest import subscriptions_held, wait_until

# one worker under pytest-xdist, so that the module's one cluster serves all three tests
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("grpc-fuzz")]

PUBLISH = "/broker.wire.ConnectionPoint/Publish"
SESSION = "/broker.wire.ConnectionPoint/Session"
ANSWER_DEADLINE = 10.0  # seconds for the answers to one stream's messages, and for its end
MESSAGE_LIMIT = 4 << 20  # gRPC's default message size: the largest a client usually sends
CANARY_TENANT = "fuzzcanary"  # no generated subscription or update uses this tenant
MANY_TENANT = "fuzzmany"  # nor this one, for the requests of thousands of subscriptions
TYPED_ERRORS = frozenset({"INVALID_ARGUMENT", "NOT_FOUND", "ALREADY_EXISTS", "RESOURCE_EXHAUSTED"})
REFUSING_ENDS = frozenset({grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED})
ONLY_THE_CANARY = {
    "matcher": 1,
    "matcher_copies": 1,
    "connection-point": 1,
    "access-point": 0,
    "exit-point": 0,
}
_CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", 64 << 20),
    ("grpc.max_send_message_length", 64 << 20),
)


def _settings(count: int) -> settings:
    return settings(
        max_examples=examples(count),
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# -- one cluster for the module, and a subscriber that tells whether it still serves ---------


@pytest.fixture(scope="module")
def cluster(
    zookeeper: EmbeddedZooKeeper, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LocalCluster]:
    """A cluster (one process per role) on the session's ZooKeeper, for the whole module."""
    name = f"fuzz-{uuid.uuid4().hex[:10]}"
    spec = ClusterSpec(
        zk=zookeeper.address,
        cluster=name,
        grpc_port=0,
        matchers=1,
        replicas=1,
        state_dir=Path(tmp_path_factory.mktemp("fuzz")) / name,
    )
    started = LocalCluster(spec)
    started.start()
    try:
        yield started
    finally:
        started.stop()


@dataclass
class Canary:
    """A client subscribed before the fuzzing: :meth:`check` publishes and waits for it."""

    cluster: LocalCluster
    client: Client
    handle: SubscriptionHandle
    published: int = 0

    def check(self) -> None:
        """Assert every process lives, no subscription but the canary's is left (the
        fuzzing sessions ended), and an ordinary publish reaches the subscriber."""
        _alive(self.cluster)
        wait_until(
            lambda: subscriptions_held(self.cluster) == ONLY_THE_CANARY,
            ANSWER_DEADLINE,
            "the subscriptions of the ended sessions are removed",
        )
        self.published += 1
        update = ContextUpdate.of(
            "canary", {"n": self.published}, entity_type="Canary", tenant=CANARY_TENANT
        )
        with Client(self.cluster.endpoints, publisher="canary", timeout=ANSWER_DEADLINE) as pub:
            pub.publish(update)
        deadline = time.monotonic() + ANSWER_DEADLINE
        while True:
            notification = self.handle.get(timeout=max(0.0, deadline - time.monotonic()))
            if notification.update.attributes["n"].value == self.published:
                return


@pytest.fixture(scope="module")
def canary(cluster: LocalCluster) -> Iterator[Canary]:
    client = Client(cluster.endpoints, timeout=ANSWER_DEADLINE)
    try:
        handle = client.subscribe(
            subscription_id=f"canary-{uuid.uuid4().hex}", type="Canary", tenant=CANARY_TENANT
        )
        watch = Canary(cluster, client, handle)
        watch.check()
        yield watch
    finally:
        client.close()


@pytest.fixture(scope="module")
def channel(cluster: LocalCluster) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(cluster.endpoints[0], options=_CHANNEL_OPTIONS) as opened:
        yield opened


def _alive(cluster: LocalCluster) -> None:
    assert not cluster.poll(), f"a broker process exited: {cluster.poll()}"


# -- raw streams and the properties ----------------------------------------------------------


class Ended(NamedTuple):
    """How a stream ended."""

    code: grpc.StatusCode
    details: str


class RawStream:
    """One stream of the client port carrying bytes both ways, read on a thread."""

    def __init__(self, channel: grpc.Channel, method: str) -> None:
        self._requests: queue.Queue[bytes | None] = queue.Queue()
        self._responses: queue.Queue[bytes | Ended] = queue.Queue()
        call: grpc.StreamStreamMultiCallable[bytes, bytes] = channel.stream_stream(
            method, request_serializer=None, response_deserializer=None
        )
        self._call: Iterator[bytes] = call(self._iterate())
        threading.Thread(target=self._read, daemon=True).start()

    def send(self, data: bytes) -> None:
        self._requests.put(data)

    def next(self, deadline: float) -> bytes | Ended | None:
        """The next response, how the stream ended, or None at ``deadline``."""
        try:
            return self._responses.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            return None

    def half_close(self) -> None:
        self._requests.put(None)

    def cancel(self) -> None:
        self._call.cancel()  # type: ignore[attr-defined]

    def _iterate(self) -> Iterator[bytes]:
        while (data := self._requests.get()) is not None:
            yield data

    def _read(self) -> None:
        try:
            for response in self._call:
                self._responses.put(response)
            self._responses.put(Ended(grpc.StatusCode.OK, ""))
        except grpc.RpcError as exc:
            self._responses.put(Ended(exc.code(), exc.details() or ""))


def _releases(data: bytes) -> bool:
    try:
        op: str | None = pb.SessionRequest.FromString(data).WhichOneof("op")
    except Exception:
        return False
    return op == "release"


@dataclass
class Exchange:
    """Messages sent on one stream, and what it answered."""

    method: str
    stream: RawStream
    wanted: int  # answers owed: a session owes none for a Release and what follows it
    errors: list[pb.Error] = field(default_factory=list)  # of every answer, set or not
    ended: Ended | None = None

    @classmethod
    def start(cls, channel: grpc.Channel, method: str, messages: Sequence[bytes]) -> Exchange:
        """Open a stream and send ``messages`` on it."""
        wanted = len(messages)
        if method == SESSION:
            wanted = next((i for i, data in enumerate(messages) if _releases(data)), wanted)
        exchange = cls(method, RawStream(channel, method), wanted)
        for data in messages:
            exchange.stream.send(data)
        return exchange

    def answered(self) -> None:
        """Wait until every message is answered, or the stream ended."""
        deadline = time.monotonic() + ANSWER_DEADLINE
        while self.ended is None and len(self.errors) < self.wanted:
            self._take(deadline, f"{len(self.errors)} of {self.wanted} answers")

    def finish(self) -> None:
        """Half-close, read to the end, and check the properties (module doc)."""
        try:
            self.answered()
            self.stream.half_close()
            deadline = time.monotonic() + ANSWER_DEADLINE
            while self.ended is None:
                self._take(deadline, "no end after the client half-closed")
        finally:
            self.stream.cancel()
        self._check()

    def _take(self, deadline: float, missing: str) -> None:
        response = self.stream.next(deadline)
        if response is None:
            raise AssertionError(f"{self.method}: {missing} within {ANSWER_DEADLINE:.0f} s")
        if isinstance(response, Ended):
            self.ended = response
        elif self.method == PUBLISH:
            self.errors.append(pb.PublishAck.FromString(response).error)
        else:
            event = pb.SessionEvent.FromString(response)  # notifications are read, not counted
            if event.HasField("ack"):
                self.errors.append(event.ack.error)

    def _check(self) -> None:
        assert self.ended is not None
        for error in self.errors:
            assert not error.code or error.code in TYPED_ERRORS, (
                f"{self.method} answered {error.code}: {error.message}"
            )
        code, details = self.ended
        assert code is grpc.StatusCode.OK or code in REFUSING_ENDS, (
            f"{self.method} ended with {code.name}: {details}"
        )
        if len(self.errors) < self.wanted:
            assert code in REFUSING_ENDS, (
                f"{self.method} ended with {code.name} ({details!r}) after answering "
                f"{len(self.errors)} of {self.wanted} messages"
            )


def _converse(
    cluster: LocalCluster,
    channel: grpc.Channel,
    requests: Sequence[bytes],
    publishes: Sequence[bytes],
) -> None:
    """A session's requests, then (while the session is open, so that what it subscribed
    may match) a publisher's batches; both checked; every process still alive."""
    session = Exchange.start(channel, SESSION, requests)
    try:
        session.answered()
        Exchange.start(channel, PUBLISH, publishes).finish()
    except BaseException:
        session.stream.cancel()
        raise
    session.finish()
    _alive(cluster)


# -- strategies: hostile values ----------------------------------------------------------------

CONTROL = "".join(map(chr, range(32))) + "\x7f\x85\u2028\u2029"
TEXT_CORNERS = (
    "",
    " ",
    "\x00",
    "\t\n\r",
    "Room 1",
    "Room#1",
    "a/b",
    "/",
    "#",
    "/#",
    "..",
    "%00",
    "ü",
    "\u202etxet",
    "\ufeff",
    "\U0001d54f",
    "é" * 256,
    "a" * 256,
    "a" * 257,
    "x" * 5_000,
    "id",
    "type",
    "*",
    "geo:distance",
    "dateModified",
    "DateTime",
)
# names, types, ids, texts: the corners, any text, control characters, sometimes a huge one
texts = st.one_of(
    st.sampled_from(TEXT_CORNERS),
    st.text(max_size=30),
    st.text(alphabet=CONTROL, max_size=8),
    st.sampled_from((1_000, 100_000, MAX_STRING_LENGTH + 1)).map(lambda n: "x" * n),
)
tenants = st.one_of(st.sampled_from(("T", "a" * 51, "t-1", "t\x00", "t_1 ", "ñ")), texts)
paths = st.one_of(
    st.sampled_from(
        ("a", "//", "/a/", "/a//b", "/#", "/a/#", "/#/a", "/a#", "/a b", "/" + "a" * 51)
    ),
    st.sampled_from(("/" + "/".join("a" * 11), "/a" * 10, "/a" * 10_000)),
    texts,
)
JSON_CORNERS = (
    "",
    "{",
    "[1,]",
    "null",
    "1",
    '"s"',
    "[NaN]",
    "[Infinity]",
    "[-Infinity]",
    "[1e999]",
    "[-0]",
    "[" + "9" * 5_000 + "]",
    "[" + "9" * 100 + "]",
    '{"\\ud800":1}',
    '["\\udfff"]',
    '{"a":1,"a":2}',
    "[1] [2]",
    "\x00",
    "[\x00]",
    '{"a":' * 33 + "1" + "}" * 33,
    '{"a":' * 32 + "1" + "}" * 32,
)
# nested deep first (Hypothesis draws the first branch most), then the corners
json_texts = st.one_of(
    st.sampled_from((100_000, 33, 1_000_000, 1_000, 32)).map(lambda d: "[" * d + "]" * d),
    st.sampled_from((200_000, 33, 10_000)).map(lambda d: '{"a":' * d + "1" + "}" * d),
    st.sampled_from(JSON_CORNERS),
    st.text(max_size=30),
)
FLOAT_CORNERS = (math.nan, math.inf, -math.inf, -0.0, 5e-324, 1.7976931348623157e308)
DATE_CORNERS = (
    "2020-01-01T00:00:00Z",
    "2020-13-45T99:99:99Z",
    "0000-01-01",
    "9999-12-31T23:59:59-23:59",
    "0001-01-01T00:00:00+23:59",
    "2020-01-01T00:00:00+99:00",
    "+999999999-01-01",
    "2020-01-01T00:00:00." + "9" * 5_000 + "Z",
    "1" * 5_000,
)


@st.composite
def values(draw: st.DrawFn) -> pb.Value:
    kind = draw(st.sampled_from(("number", "integer", "text", "date", "json", "bool", "null")))
    if kind == "number":
        return pb.Value(number=draw(st.one_of(st.sampled_from(FLOAT_CORNERS), st.floats())))
    if kind == "integer":
        return pb.Value(integer=draw(st.integers(-(1 << 63), (1 << 63) - 1)))
    if kind == "text":
        return pb.Value(text=draw(texts))
    if kind == "date":
        return pb.Value(text=draw(st.one_of(st.sampled_from(DATE_CORNERS), texts)))
    if kind == "json":
        return pb.Value(json=draw(json_texts))
    if kind == "bool":
        return pb.Value(boolean=draw(st.booleans()))
    return draw(st.sampled_from((pb.Value(null=True), pb.Value())))


attribute_types = st.one_of(st.sampled_from(("DateTime", "ISO8601", "Number", "Text")), texts)
SEQUENCES = (0, 1, (1 << 63) - 1, 1 << 63, (1 << 64) - 10_000, (1 << 64) - 2, (1 << 64) - 1)
sequences = st.one_of(st.sampled_from(SEQUENCES), st.integers(0, (1 << 64) - 1))


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


@st.composite
def unknown_fields(draw: st.DrawFn) -> bytes:
    """Fields no message of the protocol has (numbers from 100 on), of every wire type."""
    out = b""
    for _ in range(draw(st.integers(1, 3))):
        number = draw(st.integers(100, (1 << 29) - 1))
        kind = draw(st.sampled_from((0, 1, 2, 5)))
        out += _varint(number << 3 | kind)
        if kind == 0:
            out += _varint(draw(st.integers(0, (1 << 64) - 1)))
        elif kind == 1:
            out += draw(st.binary(min_size=8, max_size=8))
        elif kind == 5:
            out += draw(st.binary(min_size=4, max_size=4))
        else:
            payload = draw(st.binary(max_size=64))
            out += _varint(len(payload)) + payload
    return out


def _fits(item: Message, count: int) -> bool:
    """Whether ``count`` copies of ``item`` stay within the message limit."""
    return item.ByteSize() * count < MESSAGE_LIMIT


def _hostile_fields(draw: st.DrawFn, fields: Sequence[str]) -> set[str]:
    """Which of ``fields`` to make hostile, the others staying valid: one, sometimes two
    (more would mostly test the first check that fails)."""
    hostile = {draw(st.sampled_from(fields))}
    if draw(st.integers(0, 3)) == 0:
        hostile.add(draw(st.sampled_from(fields)))
    return hostile


# -- strategies: publishes --------------------------------------------------------------------

# Hypothesis draws the first entry most: the richest comes first.
ENTITY_FIELDS = (
    "value",
    "json",
    "id",
    "type",
    "tenant",
    "service_path",
    "attribute name",
    "attribute type",
    "date",
    "metadata",
    "attributes",
    "unknown",
)


def _some_attribute(draw: st.DrawFn, entity: pb.Entity) -> pb.Attribute:
    if not entity.attributes:
        return entity.attributes.add(name="temp", value=pb.Value(number=21.0))
    return entity.attributes[draw(st.integers(0, len(entity.attributes) - 1))]


@st.composite
def hostile_entities(draw: st.DrawFn) -> pb.Entity:
    """A valid entity with one or two hostile fields."""
    entity = entity_from_update(draw(updates()))
    for name in sorted(_hostile_fields(draw, ENTITY_FIELDS)):
        if name in ("id", "type"):
            setattr(entity, name, draw(texts))
        elif name == "tenant":
            entity.tenant = draw(tenants)
        elif name == "service_path":
            entity.service_path = draw(paths)
        elif name == "attribute name":
            _some_attribute(draw, entity).name = draw(texts)
        elif name == "attribute type":
            _some_attribute(draw, entity).type = draw(attribute_types)
        elif name == "value":
            _some_attribute(draw, entity).value.CopyFrom(draw(values()))
        elif name == "json":
            _some_attribute(draw, entity).value.CopyFrom(pb.Value(json=draw(json_texts)))
        elif name == "date":
            attribute = _some_attribute(draw, entity)
            attribute.type = draw(st.sampled_from(("DateTime", "ISO8601")))
            attribute.value.CopyFrom(draw(st.one_of(values(), st.just(pb.Value(text="")))))
        elif name == "metadata":
            attribute = _some_attribute(draw, entity)
            meta = attribute.metadata.add(name=draw(texts), type=draw(attribute_types))
            meta.value.CopyFrom(draw(values()))
        elif name == "attributes":  # thousands, or the same name twice
            count = draw(st.sampled_from((2, 1_000, 50_000)))
            if count == 2:
                twin = _some_attribute(draw, entity)
                entity.attributes.add().CopyFrom(twin)
            else:
                entity.attributes.extend(
                    pb.Attribute(name=f"a{i}", value=pb.Value(integer=i)) for i in range(count)
                )
        else:
            entity.MergeFromString(draw(unknown_fields()))
    return entity


valid_entities = updates().map(entity_from_update)


@st.composite
def publish_requests(draw: st.DrawFn, publisher: str) -> pb.PublishRequest:
    """A batch with hostile entities, a hostile size, or hostile sequence numbers (first
    sequences are drawn at random otherwise, so they repeat and go backwards)."""
    hostile = _hostile_fields(draw, ("entities", "entities", "count", "sequence"))
    first = draw(sequences if "sequence" in hostile else st.integers(1, 1_000))
    request = pb.PublishRequest(batch=draw(sequences), publisher=publisher, first_sequence=first)
    entity = draw(
        hostile_entities() if "entities" in hostile else updates().map(entity_from_update)
    )
    if "count" in hostile:
        count = draw(st.sampled_from((0, 1_000, 10_000, 10_001)))
        if not _fits(entity, count):
            entity = pb.Entity(id="Room1", type="Room")
        request.entities.extend([entity] * count)
    else:
        request.entities.append(entity)
        request.entities.extend(draw(st.lists(updates().map(entity_from_update), max_size=2)))
    return request


@st.composite
def serialized(draw: st.DrawFn, message: st.SearchStrategy[Message]) -> bytes:
    """A message's bytes within the message limit, sometimes with unknown fields after it."""
    data = draw(message).SerializeToString()
    if draw(st.integers(0, 4)) == 0:
        data += draw(unknown_fields())
    assume(len(data) < MESSAGE_LIMIT)
    return data


@st.composite
def hostile_publishes(draw: st.DrawFn) -> list[bytes]:
    publisher = draw(st.one_of(st.just("fuzz"), texts))
    return draw(st.lists(serialized(publish_requests(publisher)), min_size=1, max_size=4))


# -- strategies: session requests ---------------------------------------------------------------

SPEC_FIELDS = (
    "q",
    "id",
    "tenant",
    "service_path",
    "condition_attrs",
    "mq",
    "description",
    "expires",
    "attrs",
    "selectors",
    "selector",
    "id_pattern",
    "type_pattern",
    "unknown",
)
PATTERN_CORNERS = (
    "",
    "(",
    ")",
    "[",
    "\\",
    "*",
    "a{1001}",
    "a{1000}{1000}",
    "(a+)+$",
    "(a|aa)*b",
    "(.*a){30}",
    "(?=a)",
    "(?!a)b",
    "(a)\\1",
    "(?P<n>a)(?P=n)",
    "\\C",
    "\\p{Greek}",
    "\\p{Nope}",
    "[[:alpha:]]",
    "[[:nope:]]",
    "[z-a]",
    "\x00",
    "(?i)room",
    "((((((((((a))))))))))" * 20,
    "." * 1_024,
    "." * 1_025,
    "(" * 10_000,
    ".{0,1000}.{0,1000}.{0,1000}",
    "\\x{110000}",
    "\U0010ffff",
)
patterns = st.one_of(st.sampled_from(PATTERN_CORNERS), texts)
FILTER_CORNERS = (
    "temperature>>25",
    "temperature.unit==",
    "a==1..2..3",
    "a==" + "1," * 1_000,
    "a==" + "1," * 255 + "1",
    ";" * 5_000,
    "'" * 3,
    "'unclosed",
    "!" * 100,
    "a" + ".b" * 5_000,
    "a~=(",
    "a~=(a+)+$",
    "a~=\\1",
    "a~=" + "." * 2_000,
    "a=^",
    "a=$'",
    "a=*''",
    "a<=2020-13-45T99:99:99Z",
    "a>=9999-12-31T23:59:59-23:59",
    "a>=" + "9" * 1_000,
    "a==" + "9" * 5_000,
    "a==1e999",
    "a==-1e999..1e999",
    "a==nan",
    "a==inf",
    "a:'x';" * 65,
    "a==" + "(" * 100,
    "x" * 4_097,
    "\x00==\x00",
    "a.'b.c'.d==1",
    "a==\u0661\u0662",
    "a==\U0001d7d9",
    "a.b.c.d.e.f.g.h.i.j.k==1",
)
filters = st.one_of(st.sampled_from(FILTER_CORNERS), texts)
EXPIRIES = (math.nan, math.inf, -math.inf, -1.0, 1e308, 5e-324, -1e308, 2.0**63, 253402300800.0)


@st.composite
def hostile_specs(draw: st.DrawFn) -> pb.SubscriptionSpec:
    """A valid subscription with one or two hostile fields."""
    spec = spec_from_subscription(draw(subscriptions()))
    spec.id = ""  # the connection point names it: no clash with other examples' sessions
    selector = spec.entities[0]
    for name in sorted(_hostile_fields(draw, SPEC_FIELDS)):
        if name in ("id", "description"):
            setattr(spec, name, draw(texts))
        elif name == "tenant":
            spec.tenant = draw(tenants)
        elif name == "service_path":
            spec.service_path = draw(paths)
        elif name in ("condition_attrs", "attrs"):
            getattr(spec, name).extend(draw(st.lists(texts, min_size=1, max_size=3)))
        elif name in ("q", "mq"):
            setattr(spec, name, draw(filters))
        elif name == "expires":
            spec.expires = draw(st.sampled_from(EXPIRIES))
        elif name == "selectors":  # none, or hundreds
            copy = pb.EntitySelector()
            copy.CopyFrom(selector)
            del spec.entities[:]
            spec.entities.extend([copy] * draw(st.sampled_from((0, 200))))
        elif name == "selector":  # every field set, or ids and types that break the rules
            selector.id = draw(st.one_of(st.just("Room1"), texts))
            selector.type = draw(st.one_of(st.just("Room"), texts))
            selector.id_pattern = draw(st.one_of(st.just(""), patterns))
            selector.type_pattern = draw(st.one_of(st.just(""), patterns))
        elif name == "id_pattern":
            selector.id = ""
            selector.id_pattern = draw(patterns)
        elif name == "type_pattern":
            selector.type = ""
            selector.type_pattern = draw(patterns)
        else:
            spec.MergeFromString(draw(unknown_fields()))
    return spec


valid_specs = subscriptions().map(spec_from_subscription)


@st.composite
def session_requests(draw: st.DrawFn) -> pb.SessionRequest:
    """Mostly a subscribe of valid and hostile specs; sometimes thousands of specs, an
    unsubscribe of ids it does not hold, no op at all, or (rarely) a Release."""
    request = pb.SessionRequest(request=draw(sequences))
    op = draw(st.sampled_from(("subscribe",) * 6 + ("many", "unsubscribe", "none", "release")))
    if op == "subscribe":  # at most one hostile spec among valid ones
        request.subscribe.replace = draw(st.booleans())
        count = draw(st.integers(1, 3))
        hostile = draw(st.integers(-1, count - 1))  # -1: none
        for i in range(count):
            spec = draw(hostile_specs() if i == hostile else valid_specs)
            if spec.id == "s0":
                spec.id = ""
            request.subscribe.subscriptions.append(spec)
    elif op == "many":
        count = draw(st.sampled_from((0, 5_000)))
        spec = draw(hostile_specs())
        if not _fits(spec, count):
            spec = pb.SubscriptionSpec(entities=[pb.EntitySelector(id_pattern=".*")])
        # a tenant no update has: thousands of subscriptions that all match each update
        # of a batch of thousands would be a load test (millions of notifications)
        spec.tenant = MANY_TENANT
        request.subscribe.subscriptions.extend([spec] * count)
    elif op == "unsubscribe":
        request.unsubscribe.ids.extend(draw(st.lists(texts, max_size=3)))
    elif op == "release":
        request.release.SetInParent()
    return request


@st.composite
def hostile_sessions(draw: st.DrawFn) -> list[bytes]:
    return draw(st.lists(serialized(session_requests()), min_size=1, max_size=4))


# -- strategies: mutated valid messages ----------------------------------------------------


def _valid_publish(i: int, first: int) -> bytes:
    request = pb.PublishRequest(batch=i, publisher="mutant", first_sequence=first)
    entity = request.entities.add(id=f"Room{i}", type="Room", tenant="t_1", service_path="/a/b")
    entity.attributes.add(name="temperature", value=pb.Value(number=30.5))
    attribute = entity.attributes.add(name="seen", type="DateTime")
    attribute.value.text = "2020-01-01T00:00:00Z"
    attribute.metadata.add(name="unit", value=pb.Value(text="CEL"))
    entity.attributes.add(name="shape", value=pb.Value(json='{"a":[1,2,{"b":null}]}'))
    request.entities.add(id=f"Thing{i}", attributes=[pb.Attribute(name="n", value=pb.Value())])
    return request.SerializeToString()


def _valid_session(i: int) -> bytes:
    request = pb.SessionRequest(request=i)
    spec = request.subscribe.subscriptions.add(
        id=f"mutant-{i}",
        tenant="t_1",
        service_path="/a/#",
        condition_attrs=["temperature"],
        q="temperature>25;seen>=2020-01-01T00:00:00Z",
        mq="temperature.unit==CEL",
        attrs=["temperature"],
        expires=4e9,
    )
    spec.entities.add(id_pattern="^Room[0-9]+$", type="Room")
    spec.entities.add(id="Thing1", type_pattern="Th.*")
    return request.SerializeToString()


VALID_PUBLISHES = tuple(_valid_publish(i, first) for i, first in ((1, 1), (2, 3), (3, 1 << 40)))
VALID_SESSIONS = (
    *(_valid_session(i) for i in (1, 2)),
    pb.SessionRequest(request=3, unsubscribe=pb.Unsubscribe(ids=["mutant-1"])).SerializeToString(),
)


@st.composite
def mutated(draw: st.DrawFn, originals: Sequence[bytes]) -> bytes:
    """One of ``originals`` with 1-4 bytes flipped, set, inserted, deleted, duplicated or cut."""
    data = bytearray(draw(st.sampled_from(originals)))
    for _ in range(draw(st.integers(1, 4))):
        at = draw(st.integers(0, len(data)))
        how = draw(st.sampled_from(("flip", "set", "insert", "delete", "duplicate", "cut")))
        if how in ("flip", "set") and at < len(data):
            byte = draw(st.integers(0, 255))
            data[at] = data[at] ^ (1 << (byte % 8)) if how == "flip" else byte
        elif how == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif how == "delete":
            del data[at : at + draw(st.integers(1, 8))]
        elif how == "duplicate":
            data[at:at] = data[at : at + draw(st.integers(1, 32))]
        elif how == "cut":
            del data[at:]
    return bytes(data)


# -- the tests ---------------------------------------------------------------------------------


def test_arbitrary_bytes_are_answered(
    cluster: LocalCluster, channel: grpc.Channel, canary: Canary
) -> None:
    @_settings(100)
    @given(
        requests=st.lists(st.binary(max_size=200), min_size=1, max_size=4),
        publishes=st.lists(st.binary(max_size=200), min_size=1, max_size=4),
    )
    def fuzz(requests: list[bytes], publishes: list[bytes]) -> None:
        _converse(cluster, channel, requests, publishes)

    fuzz()
    canary.check()


def test_hostile_field_values_are_answered(
    cluster: LocalCluster, channel: grpc.Channel, canary: Canary
) -> None:
    @_settings(120)
    @given(requests=hostile_sessions(), publishes=hostile_publishes())
    def fuzz(requests: list[bytes], publishes: list[bytes]) -> None:
        _converse(cluster, channel, requests, publishes)

    fuzz()
    canary.check()


def test_mutated_messages_are_answered(
    cluster: LocalCluster, channel: grpc.Channel, canary: Canary
) -> None:
    @_settings(150)
    @given(
        requests=st.lists(mutated(VALID_SESSIONS), min_size=1, max_size=4),
        publishes=st.lists(mutated(VALID_PUBLISHES), min_size=1, max_size=4),
    )
    def fuzz(requests: list[bytes], publishes: list[bytes]) -> None:
        _converse(cluster, channel, requests, publishes)

    fuzz()
    canary.check()
